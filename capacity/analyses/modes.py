"""The preemption choices on the same trace (issue: compare-modes).

V0 (0.10): swap (host pool of the configured --swap-space), recompute with prefix caching on,
recompute with prefix caching off, and none (queue only). V1 (0.33) has no swap: its choices are
recompute with prefix caching on, off, queue-only, and recompute with CPU KV offloading of a given
size (`--kv-offloading-size`, the OffloadingConnector: a write-through second prefix cache that a
preempted or later request reloads prompt blocks from; capacity/analyses/offload.py sizes it).
For each: recomputed tokens and their share of all prefill work, swapped / offloaded GiB and
host-link seconds, CPU-hit tokens, TTFT / TBT p99 for preempted requests and for all, throughput,
high-priority TTFT; then one sentence of recommendation with its reason.

The stated criterion: the preempted requests' P99 stall (their worst inter-token gap), then fleet
TBT p99, TTFT p99, throughput; a host tier must pay for its host memory against recompute with
prefix caching: V0's swap must shorten the stalls by at least 5%; V1's CPU offloading must shorten
the stalls or TTFT p99 by at least 5% (a prefix cache's gain is mostly TTFT) without raising
either, or TBT p99, by more than 5%. Only modes vLLM can be configured for are recommended (each
maps to flags, capacity/analyses/flags.py); queue-only is reported in words when it is no worse on
every criterion, never dropped, never put in the flags.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.metrics import GIB, nearest_rank, request_latencies, summary
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
from capacity.units import seconds
from replay.config import EngineConfig, resolve

VARIANTS = (
    ("swap", dict(preemption_mode="swap", on_swap_full="recompute")),
    ("recompute+prefix-cache", dict(preemption_mode="recompute", enable_prefix_caching=True)),
    ("recompute", dict(preemption_mode="recompute", enable_prefix_caching=False)),
    ("queue-only", dict(preemption_mode="none")),
)
OFFLOAD = "recompute+cpu-offload"
# V1: no swap; the host tier is the offloading connector (its size set by variant_config).
VARIANTS_V1 = (
    (OFFLOAD, dict(preemption_mode="recompute")),
    ("recompute+prefix-cache", dict(preemption_mode="recompute", enable_prefix_caching=True,
                                    kv_offloading_size=None)),
    # 0.34's cache-aware admission orders by prefix-cache hit: it goes with the cache.
    ("recompute", dict(preemption_mode="recompute", enable_prefix_caching=False,
                       kv_offloading_size=None, cache_aware_admission_window=0)),
    ("queue-only", dict(preemption_mode="none", kv_offloading_size=None)),
)
# A host tier must buy at least this much (relative) to be recommended.
HOST_TIER_GAIN = 0.05


def variants(scheduler: str) -> tuple:
    return VARIANTS_V1 if scheduler == "v1" else VARIANTS


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeResult:
    variant: str
    run_id: str
    status: str
    abort_s: float | None
    preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    prefill_tokens: int
    recomputed_share: float
    swapped_gib: float               # V0: KV swapped out to the host
    offloaded_gib: float             # V1: KV written through to the CPU tier
    host_tier_gib: float             # the host tier replayed (V0 per GPU, V1 in total); 0: none
    cpu_hit_tokens: int              # V1: prompt tokens loaded from the CPU tier
    host_link_s: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    ttft_p99_preempted_s: float | None
    max_tbt_p99_preempted_s: float | None
    high_priority_ttft_p99_s: float | None
    throughput_rps: float
    output_tokens_per_s: float
    swap_full_fallbacks: int
    meets_slo: bool | None         # fleet P99 TTFT and TBT within the SLOs (None: no SLOs given)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeComparison:
    results: tuple[ModeResult, ...]
    recommended: str
    reason: str
    config: EngineConfig            # the recommended variant's engine (flags.vllm_flags spells it)
    queue_only_note: str            # "" or why queue-only would be better, in words
    scheduler: str = "v1"           # the engine every variant replayed
    scheduler_loop: str = "sync"    # and its loop ("async" | "sync")
    vllm_version: str | None = None  # the release ("0.10.1.1" | "0.33" | "0.34")
    block_size: int | None = None
    default_variant: str = "recompute+prefix-cache"   # vLLM's default for this engine
    # (objective, relative gain, threshold) that justified leaving the default; None: it stayed.
    departure: tuple[str, float, float] | None = None

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dataclasses.asdict(r) for r in self.results])

    def engine_words(self) -> str:
        from capacity.analyses.versions import engine_words
        return engine_words(self.scheduler, self.vllm_version, self.scheduler_loop,
                            self.block_size)

    def as_dict(self) -> dict:
        return {"engine": self.scheduler, "scheduler_loop": self.scheduler_loop,
                "engine_words": self.engine_words(),
                "recommended": self.recommended, "reason": self.reason,
                "queue_only_note": self.queue_only_note,
                "default": self.default_variant,
                "departure": (None if self.departure is None else
                              dict(zip(("objective", "gain", "threshold"), self.departure))),
                "modes": [dataclasses.asdict(r) for r in self.results]}


def mode_result(variant: str, tables: dict[str, pl.DataFrame], host_link_bytes_per_s: float,
                slo_ttft_p99_s: float | None = None, slo_tbt_p99_s: float | None = None) -> ModeResult:
    s = summary(tables)
    meets = None
    if slo_ttft_p99_s is not None and slo_tbt_p99_s is not None:
        meets = (s["ttft_p99_s"] is not None and s["ttft_p99_s"] <= slo_ttft_p99_s
                 and s["tbt_p99_s"] is not None and s["tbt_p99_s"] <= slo_tbt_p99_s
                 and s["status"] == "completed")
    run = tables["runs"].row(0, named=True)
    req = request_latencies(tables["requests"])
    steps = tables["steps"]
    bpb = run["kv_bytes_per_block"]
    prefill = int(steps["num_prefill_tokens"].sum() or 0)
    swap_blocks = _sum(steps, "swap_out_blocks") + _sum(steps, "swap_in_blocks")
    stored = _sum(steps, "offload_store_blocks")
    host_blocks = swap_blocks + stored + _sum(steps, "offload_load_blocks")
    cfg = tables["runs"]["config_json"][0] if "config_json" in tables["runs"].columns else None
    tier = _host_tier_gib(cfg)
    pre = req.filter(pl.col("num_preemptions") > 0)
    top = req.filter(pl.col("priority") == req["priority"].min()) if req.height else req
    return ModeResult(
        variant=variant, run_id=run["run_id"], status=run["status"], abort_s=run["abort_s"],
        preemptions=s["preemptions_recompute"] + s["preemptions_swap"],
        preempted_requests=s["preempted_requests"], recomputed_tokens=s["recomputed_tokens"],
        prefill_tokens=prefill, recomputed_share=s["recompute_tax"],
        swapped_gib=_sum(steps, "swap_out_blocks") * bpb / GIB, offloaded_gib=stored * bpb / GIB,
        host_tier_gib=tier, cpu_hit_tokens=_sum(req, "cpu_hit_tokens"),
        host_link_s=host_blocks * bpb / host_link_bytes_per_s,
        ttft_p99_s=s["ttft_p99_s"], tbt_p99_s=s["tbt_p99_s"],
        ttft_p99_preempted_s=nearest_rank(pre["ttft_s"].to_numpy(), 0.99),
        max_tbt_p99_preempted_s=nearest_rank(pre["max_tbt_s"].to_numpy(), 0.99),
        high_priority_ttft_p99_s=nearest_rank(top["ttft_s"].to_numpy(), 0.99),
        throughput_rps=s["throughput_rps"], output_tokens_per_s=s["output_tokens_per_s"],
        swap_full_fallbacks=s["swap_full_fallbacks"], meets_slo=meets)


def mode_and_loop(tables: dict, **kw) -> tuple[ModeResult, bool]:
    """`mode_result` and whether the run was the async loop: what a summary replay sends back."""
    return mode_result(tables=tables, **kw), bool(
        tables["runs"].row(0, named=True).get("async_scheduling"))


def mode_reducer(variant: str, host_link_bytes_per_s: float, slo_ttft_p99_s=None,
                 slo_tbt_p99_s=None):
    from capacity.analyses.planner import reducer
    return reducer(mode_and_loop, variant=variant, host_link_bytes_per_s=host_link_bytes_per_s,
                   slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s)


def variant_reducer(config: EngineConfig, variant: str, slo_ttft_p99_s=None, slo_tbt_p99_s=None):
    """The reducer `compare_modes` asks of `variant`'s replay under `config` (the plan asks the
    host-tier variant's ahead of the replays that size the tier: `Planner.asking_too`)."""
    return mode_reducer(variant, resolve(config).gpu.host_link_bandwidth_bytes_per_s,
                        slo_ttft_p99_s, slo_tbt_p99_s)


def _sum(df: pl.DataFrame, name: str) -> int:
    return int(df[name].cast(pl.Int64).sum() or 0) if name in df.columns else 0


def _host_tier_gib(config_json: str | None) -> float:
    """The host tier a run replayed, from its stored config: V1's --kv-offloading-size (total),
    V0's --swap-space (per GPU) in swap mode; 0 without one."""
    import json
    if not config_json:
        return 0.0
    c = json.loads(config_json)
    if c.get("scheduler") == "v1":
        return float(c.get("kv_offloading_size") or 0.0)
    return float(c["swap_space"]) if c.get("preemption_mode") == "swap" else 0.0


def _ms(x: float | None) -> str:
    return seconds(x)


# Served throughputs within this fraction are the same: they differ by when the last requests end.
THROUGHPUT_TIE = 1e-3


def _no_worse(q: ModeResult, best: ModeResult) -> bool:
    """Queue-only loses nothing on any stated criterion (it has no preemption stalls)."""
    return (q.status == "completed" and q.ttft_p99_s is not None and best.ttft_p99_s is not None
            and q.ttft_p99_s <= best.ttft_p99_s and (q.tbt_p99_s or 0.0) <= (best.tbt_p99_s or 0.0)
            and q.throughput_rps >= best.throughput_rps * (1 - THROUGHPUT_TIE))


def _queue_note(q: ModeResult | None, best: ModeResult) -> str:
    if q is not None and _no_worse(q, best):
        return (f"admitting only what fits (queue-only, no preemption) would keep TTFT p99 at "
                f"{_ms(q.ttft_p99_s)} (vs {_ms(best.ttft_p99_s)}) without preemption stalls, but "
                f"vLLM has no flag for it; the nearest vLLM setting is a --max-num-seqs small "
                f"enough that the KV cache never runs out (see the tuning)")
    if q is not None and q.ttft_p99_s is not None and best.ttft_p99_s is not None:
        return "queue-only would avoid the stalls but " + _queue_costs(q, best)
    return ""


def _queue_costs(q: ModeResult, best: ModeResult) -> str:
    """What queue-only loses against the recommended mode (it is worse on at least one)."""
    if q.status != "completed":
        return f"does not complete the trace ({q.status})"
    costs = []
    if q.ttft_p99_s > best.ttft_p99_s:
        costs.append(f"raise TTFT p99 from {_ms(best.ttft_p99_s)} to {_ms(q.ttft_p99_s)}")
    if (q.tbt_p99_s or 0.0) > (best.tbt_p99_s or 0.0):
        costs.append(f"raise TBT p99 from {_ms(best.tbt_p99_s)} to {_ms(q.tbt_p99_s)}")
    if q.throughput_rps < best.throughput_rps * (1 - THROUGHPUT_TIE):
        costs.append(f"serve {best.throughput_rps - q.throughput_rps:.2g} req/s less "
                     f"({q.throughput_rps:.3f} vs {best.throughput_rps:.3f})")
    return " and ".join(costs)


def _slo_miss(results: list[ModeResult]) -> str:
    if all(r.meets_slo is False for r in results):
        return ("; every mode misses the SLOs with these batch limits at this load, so the mode "
                "is not the fix (the plan's binding constraint says what is)")
    return ""


def _gain(base: float | None, new: float | None) -> float:
    """Relative reduction from `base` to `new` (0 when either is missing or base is 0)."""
    if not base or new is None:
        return 0.0
    return (base - new) / base


# The objectives a mode is judged on, each lower-is-better: the preempted requests' P99 stall
# (what a preemption mode changes), then TTFT p99 (what a prefix cache changes), then TBT p99.
OBJECTIVES = (("max_tbt_p99_preempted_s", "the preempted requests' P99 stall"),
              ("ttft_p99_s", "TTFT p99"), ("tbt_p99_s", "TBT p99"))


def _threshold(noise, metric: str, host_tier: bool) -> float:
    # Without a measured noise, the floor: no advice on a difference below it.
    t = noise.threshold(metric) if noise is not None else DEFAULTS.noise_floor
    return max(t, HOST_TIER_GAIN) if host_tier else t


def _beats(c: ModeResult, d: ModeResult, noise, host_tier: bool) -> tuple[str, float, float] | None:
    """(objective, gain, threshold) when `c` wins an objective against the default `d` by more
    than its threshold (and by > 1 ms) without losing any objective by more than its threshold;
    None otherwise."""
    if c.status != "completed":
        return None
    # A mode that finishes fewer requests wins nothing, however fast the ones it finishes (V0
    # swap on a pool smaller than a request: a victim that can never swap back in stalls the
    # engine where recompute drops it).
    if _gain(d.throughput_rps, c.throughput_rps) > _threshold(noise, "throughput_rps", False):
        return None
    wins = []
    for metric, _ in OBJECTIVES:
        a, b = getattr(d, metric), getattr(c, metric)
        t = _threshold(noise, metric, host_tier)
        g = _gain(a, b)
        if g < -t:
            return None                 # worse beyond the noise on one objective
        if g > t and (a or 0.0) - (b or 0.0) > 0.001:
            wins.append((metric, g, t))
    return wins[0] if wins else None


def _words(metric: str) -> str:
    return dict(OBJECTIVES)[metric]


def recommend(results: list[ModeResult], default_variant: str, *, noise=None,
              prefix_data: bool = True) -> tuple[str, str, str, tuple | None]:
    """(recommended variant, reason, queue-only note, (objective, gain, threshold) or None).

    vLLM's default mode stays unless another mode vLLM can run wins one objective by more than
    its noise threshold (a host tier: by at least HOST_TIER_GAIN too) and loses none beyond it.
    Without prefix information in the trace, turning prefix caching off is never advised: the
    replay cannot show what the cache would have saved."""
    by = {r.variant: r for r in results}
    d = by[default_variant]
    q = by.get("queue-only")
    slo_miss = _slo_miss([r for r in results if r.variant != "queue-only"])
    others = [r for r in results if r.variant not in ("queue-only", default_variant)
              and not (r.variant == "recompute" and not prefix_data)]
    if all(r.preemptions == 0 for r in results if r.variant != "queue-only"):
        return default_variant, ("no preemption happens under any mode at this load, so vLLM's "
                                 "default stays and no host memory is spent" + slo_miss), "", None
    wins = [(r, w) for r in others if (w := _beats(r, d, noise, r.variant in ("swap", OFFLOAD)))]
    if not wins:
        shown = ", ".join(f"{r.variant} {_ms(r.max_tbt_p99_preempted_s)}" for r in others)
        why = (f"vLLM's default ({default_variant}) stays: no other mode wins the preempted "
               f"requests' P99 stall, TTFT p99 or TBT p99 by more than the noise without losing "
               f"another (stall P99 {_ms(d.max_tbt_p99_preempted_s)}"
               + (f"; {shown}" if shown else "") + ")")
        if not prefix_data and "recompute" in by:
            why += ("; the trace carries no prefix hashes, so turning prefix caching off is "
                    "never advised from it")
        return default_variant, why + slo_miss, _queue_note(q, d), None
    best, (metric, g, t) = max(wins, key=lambda rw: rw[1][1])
    a, b = getattr(d, metric), getattr(best, metric)
    if best.variant == OFFLOAD:
        why = (f"CPU offloading of {best.host_tier_gib:g} GiB (--kv-offloading-size) cuts "
               f"{_words(metric)} from {_ms(a)} to {_ms(b)} ({g:.0%}, above the {t:.0%} that the "
               f"noise and its host memory ask) against {default_variant}")
    elif best.variant == "swap":
        why = (f"swap cuts {_words(metric)} from {_ms(a)} to {_ms(b)} ({g:.0%}, above the {t:.0%} "
               f"that the noise and its host memory ask) against {default_variant}, for "
               f"{best.swapped_gib:.1f} GiB over the host link")
    else:
        why = (f"{best.variant} cuts {_words(metric)} from {_ms(a)} to {_ms(b)} ({g:.0%}, above "
               f"the noise threshold {t:.0%}) against vLLM's default {default_variant}")
    return best.variant, why + slo_miss, _queue_note(q, best), (metric, g, t)


def default_offload_gib(config: EngineConfig) -> float:
    """The CPU tier compare-modes replays when no size is given: --kv-offloading-size if set,
    else as large as the GPU KV pool (total over TP; a write-through tier smaller than that
    mostly holds copies of what the GPU still caches)."""
    from capacity.analyses.offload import nice_gib
    if getattr(config, "kv_offloading_size", None):
        return float(config.kv_offloading_size)
    eng = resolve(dataclasses.replace(config, preemption_mode="recompute"))
    return nice_gib(eng.num_gpu_blocks * eng.kv_bytes_per_block * config.tensor_parallel_size / GIB)


def variant_config(config: EngineConfig, variant: str, swap_space_gib: float | None = None,
                   kv_offloading_size_gib: float | None = None) -> EngineConfig:
    """The engine a variant replays: V0's swap variant with the host tier `swap_space_gib` (the
    sized recommendation) and the configured behaviour when it is full; V1's offload variant with
    a CPU tier of `kv_offloading_size_gib` (default: `default_offload_gib`)."""
    changes = dict(variants(config.scheduler))[variant]
    if variant == "swap":
        changes = dict(preemption_mode="swap", swap_space=swap_space_gib or config.swap_space,
                       num_cpu_blocks_override=None)
    elif variant == OFFLOAD:
        changes = dict(changes, num_cpu_blocks_override=None,
                       kv_offloading_size=kv_offloading_size_gib or default_offload_gib(config))
    return dataclasses.replace(config, **changes)


def compare_modes(trace: pl.DataFrame, config: EngineConfig, *, planner: Planner | None = None,
                  swap_space_gib: float | None = None, kv_offloading_size_gib: float | None = None,
                  include_host_tier: bool = True, slo_ttft_p99_s: float | None = None,
                  slo_tbt_p99_s: float | None = None, noise=None) -> ModeComparison:
    """`include_host_tier=False` leaves the swap / offload variant out (a sizing found that no
    host tier helps at this load). `noise` (capacity.analyses.noise.Noise): the thresholds a
    mode must clear to replace vLLM's default; None: any strict gain does."""
    from traces.schema import has_prefix_hashes
    planner = planner or Planner()
    # V0 cannot swap under priority scheduling (real vLLM crashes: reference G/D4).
    no_swap = config.scheduler == "v0" and resolve(config).spec.policy == "priority"
    names = [n for n, _ in variants(config.scheduler)
             if (include_host_tier or n not in ("swap", OFFLOAD)) and not (no_swap and n == "swap")]
    cfgs = {name: variant_config(config, name, swap_space_gib, kv_offloading_size_gib)
            for name in names}
    out = planner.map([Job(trace=trace, config=c, label=f"compare-modes {name}",
                           trace_name=planner.trace_name) for name, c in cfgs.items()],
                      [variant_reducer(config, name, slo_ttft_p99_s, slo_tbt_p99_s)
                       for name in cfgs])
    results = [r for r, _ in out]
    default = ("recompute+prefix-cache" if resolve(config).spec.enable_prefix_caching
               else "recompute")
    rec, reason, note, dep = recommend(results, default, noise=noise,
                                       prefix_data=has_prefix_hashes(trace))
    return ModeComparison(results=tuple(results), recommended=rec, reason=reason,
                          config=cfgs[rec], queue_only_note=note, scheduler=config.scheduler,
                          scheduler_loop="async" if out[0][1] else "sync",
                          vllm_version=resolve(config).vllm_version,
                          block_size=resolve(config).block_size,
                          default_variant=default, departure=dep)
