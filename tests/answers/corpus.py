"""The scenarios of the invariant corpus: (trace recipe, engine flags, SLOs, expected regime).

Each trace is small (a few minutes of traffic, a few hundred to a few thousand requests) and is
generated on demand into a cache folder (`trace_path`), never into the repository: the synthetic
ones by traces.synth, the public ones (../shared/traces) as a time window, optionally rate-scaled.
The load of a scenario is baked into its trace (rate / rate scale), so every command runs at 1x.

Regimes (how the rate and pool size were chosen; measured with the default step-time profiles):
healthy (well inside capacity), marginal (near the knee), overloaded (the queue grows),
kv (a small `--num-gpu-blocks-override`: preemption), long-prompt (the longest prompts' own prefill
misses the TTFT SLO even at near-zero load), chunk (the TBT SLO is below the step time of a full
prefill chunk), decode (the TBT SLO is below one decode step of the shortest prompt alone). Only
long-prompt, chunk and decode carry a diagnosis the invariants check (binding_fix).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PUBLIC_DIR = Path(os.environ.get("KVCAP_PUBLIC_TRACES", REPO.parent / "shared" / "traces"))
AZ_CONV, AZ_CODE, MOONCAKE = ("AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv",
                              "conversation_trace.jsonl")
PUBLIC = (AZ_CONV, AZ_CODE, MOONCAKE)
REGIMES = ("healthy", "marginal", "overloaded", "kv", "long-prompt", "chunk", "decode")


@dataclass(frozen=True, slots=True)
class TraceRecipe:
    """A synthetic scenario of traces.synth (`source` = its name, `rate` in req/s) or a window
    [start_s, start_s + duration_s) of a public trace (`source` = its file, `rate` = rate scale)."""
    source: str
    rate: float
    duration_s: float
    lengths: str = "azure-conv"      # synthetic only
    start_s: float = 0.0             # public only
    params: tuple[tuple[str, float], ...] = ()
    seed: int = 0

    @property
    def public(self) -> bool:
        return self.source in PUBLIC

    @property
    def has_prefix_hashes(self) -> bool:
        return self.source == MOONCAKE

    @property
    def has_priorities(self) -> bool:
        return self.source == "priority-mix"

    @property
    def key(self) -> str:
        text = repr(self)
        stem = re.sub(r"[^a-z0-9]+", "-", f"{self.source.split('.')[0]}-{self.rate:g}".lower())
        return f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    def describe(self) -> str:
        extra = "".join(f", {k}={v:g}" for k, v in self.params)
        if self.public:
            scale = f" x{self.rate:g}" if self.rate != 1 else ""
            return f"{self.source.split('.')[0]} [{self.start_s:g}, {self.start_s + self.duration_s:g}) s{scale}"
        return f"{self.source} {self.rate:g} req/s {self.duration_s:g} s, {self.lengths}{extra}"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    trace: TraceRecipe
    engine: tuple[str, ...] = ()
    slo_ttft_s: float = 5.0
    slo_tbt_s: float = 0.2
    budget: str = "peak-only"
    regime: str = "healthy"
    slice: bool = False              # part of the default pytest run

    def __post_init__(self):
        assert self.regime in REGIMES, self.regime

    @property
    def scheduler(self) -> str:
        return flag_value(self.engine, "--scheduler") or "v1"

    @property
    def slo_flags(self) -> tuple[str, ...]:
        return ("--slo-ttft-p99", f"{self.slo_ttft_s:g}", "--slo-tbt-p99", f"{self.slo_tbt_s:g}",
                "--preemption-budget", self.budget)

    def describe(self) -> str:
        return (f"{self.trace.describe()}; {' '.join(self.engine) or '(defaults)'}; "
                f"SLO {self.slo_ttft_s:g} s / {self.slo_tbt_s:g} s, {self.budget}")


def flag_value(argv: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The last value given to `flag` in an argv list (None when absent)."""
    value = None
    for i, tok in enumerate(argv[:-1]):
        if tok == flag:
            value = argv[i + 1]
    return value


# ------------------------------------------------------------------------------------------ corpus
def _synth(source: str, rate: float, duration_s: float = 300.0, lengths: str = "azure-conv",
           seed: int = 0, **params: float) -> TraceRecipe:
    return TraceRecipe(source, rate, duration_s, lengths=lengths, seed=seed,
                       params=tuple(sorted(params.items())))


def _public(source: str, start_s: float, duration_s: float, scale: float = 1.0) -> TraceRecipe:
    return TraceRecipe(source, scale, duration_s, lengths="", start_s=start_s)


V0 = ("--scheduler", "v0")
SWAP = ("--scheduler", "v0", "--preemption-mode", "swap")
B70 = ("--model", "llama-3.1-70b", "--tensor-parallel-size", "4")
TP4 = ("--tensor-parallel-size", "4")
PRIO = ("--scheduling-policy", "priority")


def _prio(rate: float) -> TraceRecipe:
    """Interactive Poisson traffic plus a batch job of 30 long requests every ~100 s."""
    return _synth("priority-mix", rate, 300, batch_job_interval_s=100.0, batch_job_requests=30)


def _blocks(n: int) -> tuple[str, ...]:
    """A pool of n 16-token blocks (V0, vLLM 0.33)."""
    return ("--num-gpu-blocks-override", str(n))


def _kv(n: int) -> tuple[str, ...]:
    """The KV of n 16-token blocks on vLLM 0.34, whose blocks hold 64 tokens."""
    return ("--num-gpu-blocks-override", str(n // 4))


V033 = ("--vllm-version", "0.33")


S = Scenario
SCENARIOS: tuple[Scenario, ...] = (
    # ---- synthetic, V1, Llama-3.1-8B on one H100 (conv lengths: ~24 req/s before TTFT blows up)
    S("conv-v1-8b-healthy", _synth("poisson", 4, 180), slice=True),
    S("conv-v1-8b-marginal", _synth("poisson", 22, 240), regime="marginal"),
    S("conv-v1-8b-overloaded", _synth("poisson", 36, 180), regime="overloaded"),
    S("lognormal-v1-8b-healthy", _synth("poisson", 10, 240, lengths="lognormal")),
    S("gamma-conv-v1-8b-bursty", _synth("gamma", 12, 300, cv=4.0), regime="marginal"),
    S("flash-conv-v1-8b-surge", _synth("flash-crowd", 12, 420, surge_start_s=120.0), regime="marginal"),
    S("diurnal-conv-v1-8b", _synth("diurnal", 8, 480, period_s=480.0)),
    S("code-v1-8b-healthy", _synth("poisson", 3, 300, lengths="azure-code")),
    S("code-v1-8b-marginal", _synth("poisson", 10, 240, lengths="azure-code"), regime="marginal"),
    S("code-v1-8b-overloaded", _synth("poisson", 32, 180, lengths="azure-code"), regime="overloaded"),
    S("conv-v1-8b-tp4-healthy", _synth("poisson", 20, 180), TP4),
    # ---- KV-bound (small pools: preemption)
    S("conv-v1-8b-kv", _synth("poisson", 5, 300), _kv(1000), regime="kv"),
    S("conv-v1-8b-kv-tight", _synth("poisson", 4, 300), _kv(700), regime="kv"),
    S("conv-v1-8b-kv-any", _synth("poisson", 5, 300), _kv(1000), budget="any", regime="kv"),
    S("code-v1-8b-kv", _synth("poisson", 3, 300, lengths="azure-code"), _kv(1200), regime="kv"),
    S("conv-v0-8b-kv", _synth("poisson", 4, 180), V0 + _blocks(1000), regime="kv", slice=True),
    S("conv-v0-8b-kv-swap", _synth("poisson", 5, 300), SWAP + _blocks(1000), regime="kv"),
    S("conv-v0-8b-kv-swap-small", _synth("poisson", 5, 300),
      SWAP + _blocks(1000) + ("--swap-space", "0.1", "--on-swap-full", "recompute"), regime="kv"),
    # ---- vLLM 0.33 (16-token blocks, 0.92 of the memory), selectable beside the default 0.34
    S("conv-v1-033-8b-healthy", _synth("poisson", 4, 180), V033),
    S("conv-v1-033-8b-kv", _synth("poisson", 5, 300), V033 + _blocks(1000), regime="kv"),
    # ---- V0
    S("conv-v0-8b-healthy", _synth("poisson", 6, 240), V0),
    S("conv-v0-8b-marginal", _synth("poisson", 20, 240), V0, regime="marginal"),
    S("conv-v0-8b-overloaded", _synth("poisson", 36, 180), V0, regime="overloaded"),
    S("code-v0-8b-swap", _synth("poisson", 3, 300, lengths="azure-code"), SWAP),
    # ---- priorities (priority-mix: interactive + batch jobs)
    S("prio-v1-8b-priority", _prio(4), PRIO),
    S("prio-v1-8b-fcfs", _prio(6)),
    S("prio-v1-8b-priority-kv", _prio(4), PRIO + _kv(3500), regime="kv"),
    S("prio-v0-8b-priority", _prio(4), V0 + PRIO),
    # ---- Llama-3.1-70B, TP 4 (a full 8,192-token chunk takes ~0.3-0.7 s)
    S("conv-v1-70b-healthy", _synth("poisson", 2, 300), B70, slo_tbt_s=0.5),
    S("conv-v1-70b-chunk", _synth("poisson", 4, 300), B70, regime="chunk"),
    S("conv-v1-70b-overloaded", _synth("poisson", 12, 180), B70, slo_tbt_s=1.0, regime="overloaded"),
    S("conv-v0-70b-chunk", _synth("poisson", 4, 300), V0 + B70, regime="chunk"),
    S("code-v1-70b-long-prompt", _synth("poisson", 0.5, 300, lengths="azure-code"), B70,
      slo_ttft_s=0.5, slo_tbt_s=1.0, regime="long-prompt"),
    S("conv-v1-70b-kv", _synth("poisson", 2, 300), B70 + _kv(1000), slo_tbt_s=0.5, regime="kv"),
    # ---- long-prompt-bound and chunk-bound on 8B
    S("code-v1-8b-long-prompt", _synth("poisson", 0.5, 300, lengths="azure-code"),
      slo_ttft_s=0.15, regime="long-prompt"),
    S("code-v0-8b-long-prompt", _synth("poisson", 0.5, 300, lengths="azure-code"), V0,
      slo_ttft_s=0.15, regime="long-prompt"),
    S("code-v1-8b-chunk", _synth("poisson", 5, 240, lengths="azure-code"), slo_tbt_s=0.05,
      regime="chunk"),
    S("conv-v1-8b-chunk", _synth("poisson", 15, 180), slo_tbt_s=0.06, regime="chunk"),
    # a deployment whose --max-num-seqs 512 sits above 2048/8: the chunk search must stay at or
    # above it (it tried 256, which vLLM refuses, and crashed)
    S("conv-v1-8b-chunk-seqs512", _synth("poisson", 5, 240),
      ("--max-num-seqs", "512", "--max-num-batched-tokens", "2048"), slo_tbt_s=0.02,
      regime="chunk"),
    # V0 on Mistral-7B's 32k context: chunked prefill off by default, so whole prompts stall
    # every decode beside them; the search turns it on (×0.02 unchunked, ×0.52 at 1,024 tokens)
    S("gamma-code-v0-mistral-h200-unchunked", _synth("gamma", 12, 240, lengths="azure-code",
                                                     seed=3, cv=3.0),
      SWAP + ("--model", "mistral-7b", "--gpu", "h200", "--swap-space", "64"), slo_ttft_s=1.0,
      slo_tbt_s=0.05, budget="any", regime="chunk"),
    # ---- decode-bound: Llama-3.1-70B's lone decode step on 4 H100s takes ~14 ms (8 GPUs: ~9)
    S("conv-v1-70b-decode", _synth("poisson", 2, 240), B70, slo_tbt_s=0.012, regime="decode"),
    # no measured profile (the source has bf16 KV only on A100): the analytic roofline prices
    # the steps, and the plan says so (`step_times`)
    S("conv-v1-8b-a100-fp8-roofline", _synth("poisson", 4, 180),
      ("--gpu", "a100-80gb", "--kv-cache-dtype", "fp8")),
    # the offload sweep's knee stays at its smallest size, so the sweep halves it: never below
    # one 16 MiB offload chunk (it went to 0.011 GiB, which the engine refuses, and crashed)
    S("gamma-lognormal-v1-qwen32-b200-noprefix", _synth("gamma", 12, 240, lengths="lognormal",
                                                       cv=3.0, seed=63),
      ("--model", "qwen3-32b", "--gpu", "b200", "--tensor-parallel-size", "2",
       "--no-enable-prefix-caching") + _blocks(2500), slo_ttft_s=2.0, slo_tbt_s=0.1, budget="any"),
    # ---- public traces: Azure conv / code (no prefix hashes), Mooncake (prefix hashes)
    S("azconv-v1-8b-healthy", _public(AZ_CONV, 600, 180), slice=True),
    S("azconv-v1-8b-marginal", _public(AZ_CONV, 600, 180, scale=4.0), regime="marginal"),
    S("azconv-v1-70b-chunk", _public(AZ_CONV, 600, 300), B70, regime="chunk"),
    S("azconv-v0-8b-kv", _public(AZ_CONV, 600, 300), V0 + _blocks(1000), slo_ttft_s=10.0,
      regime="kv"),
    S("azcode-v1-8b-burst", _public(AZ_CODE, 780, 300), regime="marginal"),
    # slowed to ×0.1, no request arrives in the default flash-crowd window (half the span on):
    # report, plan and headroom stopped with "surge window … holds no requests to sample from"
    S("azcode-v1-8b-sparse", _public(AZ_CODE, 1200, 120, scale=0.1), slo_ttft_s=2.0,
      slo_tbt_s=0.1),
    S("azcode-v1-8b-kv", _public(AZ_CODE, 1800, 300), _kv(2000), regime="kv"),
    S("azcode-v0-8b-swap", _public(AZ_CODE, 1800, 300), SWAP + _blocks(2000), regime="kv"),
    S("moon-v1-8b-overloaded", _public(MOONCAKE, 600, 180), regime="overloaded"),
    S("moon-v1-8b-long-prompt", _public(MOONCAKE, 600, 240, scale=0.1), slo_ttft_s=3.0,
      slo_tbt_s=0.5, regime="long-prompt"),
    S("moon-v1-8b-tp4", _public(MOONCAKE, 600, 240, scale=0.1), TP4),
    S("moon-v1-8b-kv", _public(MOONCAKE, 600, 240, scale=0.3), _kv(8000), slo_ttft_s=60.0,
      slo_tbt_s=0.5, regime="kv"),
    S("moon-v0-8b-kv", _public(MOONCAKE, 600, 240, scale=0.3), V0 + _blocks(8000),
      slo_ttft_s=60.0, slo_tbt_s=0.5, regime="kv"),
    # a pool smaller than most requests: V0 rejects 61% of them, and swap would stall the engine
    # (a victim that can never swap back in); the lor fleets of the replica search step such a core
    S("moon-v0-mistral-a100-tiny-pool", _public(MOONCAKE, 2400, 240, scale=0.1),
      V0 + ("--model", "mistral-7b", "--gpu", "a100-80gb") + _blocks(300), budget="0.1",
      regime="kv"),
    # V0 swap whose victim needs more host blocks than --swap-space holds: the engine aborts
    S("moon-v0-qwen32-h200-swap-aborts", _public(MOONCAKE, 1200, 120, scale=0.2),
      SWAP + ("--model", "qwen3-32b", "--gpu", "h200") + _blocks(1200), budget="any",
      regime="overloaded"),
    # the deployment already runs a CPU tier (the plan may drop it: `drop_flags`)
    S("moon-v1-8b-kv-tier-given", _public(MOONCAKE, 600, 240, scale=0.3),
      _kv(8000) + ("--kv-offloading-size", "8"), slo_ttft_s=60.0, slo_tbt_s=0.5, regime="kv"),
    # vLLM 0.34's cache-aware admission given on a trace without prefix hashes: compare-modes'
    # prefix-off variant must take the window with the cache (report crashed on it)
    S("azconv-v1-8b-admission-window", _public(AZ_CONV, 600, 300),
      _kv(2000) + ("--cache-aware-admission-window", "16"), regime="kv"),
    # ---- other models: Mooncake's longest prompts exceed their context, and vLLM rejects them
    #      (Qwen3-32B: 40,960 tokens, 39 of 835 requests; Mistral-7B: 32,768, 56 of 794)
    S("moon-v0-qwen32-tp2-rejects", _public(MOONCAKE, 1200, 240, scale=0.2),
      V0 + ("--model", "qwen3-32b", "--tensor-parallel-size", "2"), slo_ttft_s=30.0,
      slo_tbt_s=0.5),
    S("moon-v1-mistral-rejects", _public(MOONCAKE, 600, 240, scale=0.1), ("--model", "mistral-7b"),
      slo_ttft_s=10.0, slo_tbt_s=0.3),
    # the flags win on capacity (a smaller chunk: margin ×0.88 against ×0.59), yet one replica of
    # them falls behind today's traffic, which the deployment as given keeps up with
    S("flash-lognormal-v1-qwen32-b200-tp2", _synth("flash-crowd", 12, 240, lengths="lognormal",
                                                    seed=28, surge_start_s=60.0),
      ("--model", "qwen3-32b", "--gpu", "b200", "--tensor-parallel-size", "2"), slo_ttft_s=2.0,
      slo_tbt_s=0.1, budget="0.1", regime="marginal"),
)
BY_NAME = {s.name: s for s in SCENARIOS}
assert len(BY_NAME) == len(SCENARIOS), "scenario names must be unique"


def select(only: list[str] | None = None, substring: str | None = None,
           slice_only: bool = False) -> list[Scenario]:
    out = list(SCENARIOS)
    if only:
        unknown = [n for n in only if n not in BY_NAME]
        if unknown:
            raise KeyError(f"unknown scenario(s): {', '.join(unknown)}")
        out = [BY_NAME[n] for n in only]
    if substring:
        out = [s for s in out if substring in s.name]
    if slice_only:
        out = [s for s in out if s.slice]
    return out


# ------------------------------------------------------------------------------------------ traces
def trace_path(recipe: TraceRecipe, folder: Path) -> Path:
    """The recipe's trace as canonical Parquet under `folder` (generated once; atomic write)."""
    path = Path(folder) / f"{recipe.key}.parquet"
    if path.exists():
        return path
    from traces.loaders import load_trace, write_trace
    from traces.synth import synthesize
    from traces.transforms import scale_rate, time_window
    if recipe.public:
        df = time_window(load_trace(PUBLIC_DIR / recipe.source), recipe.start_s,
                         recipe.start_s + recipe.duration_s)
        if recipe.rate != 1:
            df = scale_rate(df, recipe.rate)
    else:
        df = synthesize(recipe.source, rate_rps=recipe.rate, duration_s=recipe.duration_s,
                        lengths=recipe.lengths, seed=recipe.seed, **dict(recipe.params))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_trace(df, path)
    return path
