"""The capacity plan: one procedure, one frozen `Plan` that every command renders (docs/planning.md).

Inputs: trace, deployment (the engine config), SLOs, preemption budget, precision, router, the
load to plan for. Steps, each only when the previous allows it:
1. replay the baseline; an engine that cannot keep up is *overloaded*: its sustainable load (the
   queue drains — a weaker number, labelled so), its capacity (SLOs and budget), what binds and
   the replicas, and no flags, no host-tier size, no alert rule;
2. the noise: the baseline replayed on jittered copies of the trace, each metric's spread
   (capacity/analyses/noise.py); no advice departs from vLLM's default below it;
3. the host tier (V0 swap sizing, V1 offload knee) and the preemption modes, judged against the
   noise; then max-num-seqs by margin, kept at vLLM's default unless another value's margin wins
   by more than the threshold;
4. what binds (capacity/analyses/binding.py); a prefill chunk that binds TBT searches a smaller
   `--max-num-batched-tokens`, kept only when it wins;
5. the recommended configuration's flags (`flags.vllm_flags`), *their* replay (the expected
   numbers), its capacity (the largest load meeting the SLOs and the budget, searched to the
   precision), what binds it, and the replicas by fleet replay (N meets, N - 1 fails);
6. the verdict: `fits` (SLOs and budget hold at today's load), `misses` (stable, but a target
   fails: which, by how much) or `overloaded`. Only a fitting plan gets an alert rule and a
   host-tier size.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass

import polars as pl

from capacity.analyses.binding import Binding, decode_bound, diagnose
from capacity.analyses.classify import AlertRule, Classification, alert_rule, classify
from capacity.analyses.criteria import Budget, evaluate
from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.flags import apply_flags, drop_words, dropped_flags, vllm_flags
from capacity.analyses.headroom import (Headroom, LoadPoint, headroom, ok, point_reducer, probe,
                                        search_loads, sustainable_load)
from capacity.analyses.migration import Migration, migration
from capacity.analyses.modes import OFFLOAD, ModeComparison, compare_modes, variant_reducer
from capacity.analyses.noise import Noise, gain, measure_noise
from capacity.analyses.offload import OffloadSizing, size_offload
from capacity.analyses.planner import Planner
from capacity.analyses.rejections import Rejections, rejections, too_long
from capacity.analyses.replicas import Replicas, min_replicas
from capacity.analyses.search import ScaleSearch
from capacity.analyses.sizing import SwapSizing, size_swap
from capacity.analyses.stability import Stability, stability
from capacity.analyses.stalls import StallBatches, drill_steps, stall_batches
from capacity.analyses.sweep import Job, default_workers, in_worker, prewarm
from capacity.analyses.tuning import Tuning, tune
from capacity.analyses.versions import run_engine_words, step_time_words, step_times
from capacity.analyses.whatifs import WhatIf, what_ifs
from replay.config import EngineConfig, resolve
from replay.results.tables import RunResult
from replay.run import replay

VERDICTS = ("overloaded", "misses", "fits")


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """What the recommended flags replay to (the recommended row)."""
    run_id: str
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    preemptions: int
    # Prefill tokens recomputed after preemption over all prefill tokens computed.
    recompute_tax: float = 0.0
    throughput_rps: float
    goodput_rps: float
    slo_share: float
    meets_slo: bool             # fleet P99 TTFT and TBT within the SLOs
    within_budget: bool         # preemption within the budget
    breaks: str                 # "" or what fails, with the numbers

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class Departure:
    """One setting the plan changes from vLLM's default, with the win that justified it."""
    knob: str
    default: object
    recommended: object
    objective: str
    gain: float                 # relative
    threshold: float            # relative: the noise (or the search precision) it had to beat

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    verdict: str                           # overloaded | misses | fits
    sustainable: bool
    offered_rps: float
    served_rps: float
    sustainable_rate_scale: float | None   # overloaded baselines: the searched sustainable scale
    headroom_rate_scale: float | None      # the recommended configuration's capacity (× today)
    capacity_rps: float | None             # per replica, SLOs and budget met
    precision: float
    flags: tuple[str, ...]                 # `vllm serve` arguments; () when overloaded
    # The deployment's flags the recommendation takes away (flags.dropped_flags): a CPU tier it
    # drops has no vLLM flag that turns it off.
    drop_flags: tuple[str, ...] = ()
    expected: Expected | None
    config: EngineConfig | None
    headline: str
    lines: tuple[str, ...]                 # the rest, in words (what the flags cannot say too)

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "sustainable": self.sustainable,
                "offered_rps": self.offered_rps, "served_rps": self.served_rps,
                "sustainable_rate_scale": self.sustainable_rate_scale,
                "headroom_rate_scale": self.headroom_rate_scale,
                "capacity_rps": self.capacity_rps, "precision": self.precision,
                "flags": list(self.flags), "drop_flags": list(self.drop_flags),
                "expected": self.expected.as_dict() if self.expected else None,
                "headline": self.headline, "lines": list(self.lines)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    baseline: RunResult
    stability: Stability
    sustainable_load: ScaleSearch | None
    noise: Noise | None
    sizing: SwapSizing | None               # V0's swap pool (V1 plans: None)
    offload: OffloadSizing | None           # V1's CPU tier (V0 plans: None)
    migration: Migration | None             # both engines' host tier, side by side
    modes: ModeComparison | None
    tuning: Tuning | None
    headroom: Headroom | None               # of the recommended flags (overloaded: of the given)
    binding: Binding | None
    replicas: Replicas | None
    departures: tuple[Departure, ...]
    # Settings measured against the recommended flags but never made flags (capacity/analyses/
    # whatifs.py): the LCF victim (in no release), 0.34's cache-aware admission.
    what_ifs: tuple[WhatIf, ...] = ()
    recommended_run: RunResult | None
    # The recommended replay's worst-stalled request, its batches around each stall (None when
    # nothing stalled or the baseline is overloaded).
    stall_drill: StallBatches | None
    classification: Classification | None   # preemption of the recommended replay
    alert: AlertRule | None                  # only for a fitting plan
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    budget: Budget
    recommendation: Recommendation
    # The requests the engine never runs (prompt too long, KV larger than the pool): in no
    # percentile, so the headline says how many (None: none).
    rejections: Rejections | None = None
    # What priced the steps (versions.step_times): "measured", "calibration" or "roofline".
    step_times: str | None = None

    @property
    def verdict(self) -> str:
        return self.recommendation.verdict

    @property
    def capacity_rps(self) -> float | None:
        return self.recommendation.capacity_rps

    def contract(self) -> dict:
        """The keys scripts rely on, identical in `report --json`, summary.json, `plan --json`
        and `headroom --json`."""
        rec = self.recommendation
        run = self.baseline.run
        return {"verdict": rec.verdict, "headline": rec.headline,
                # The vLLM release every replay of the plan ran, and its KV block size.
                "vllm_version": run.get("vllm_version"), "block_size": run.get("block_size"),
                "binding_constraint": self.binding.constraint if self.binding else None,
                "binding": self.binding.as_dict() if self.binding else None,
                "capacity_rps": rec.capacity_rps, "capacity_rate_scale": rec.headroom_rate_scale,
                "headroom_rate_scale": rec.headroom_rate_scale,
                "sustainable": rec.sustainable,
                "sustainable_rps": (rec.offered_rps * rec.sustainable_rate_scale
                                    if rec.sustainable_rate_scale else
                                    rec.served_rps if rec.sustainable else None),
                "offered_rps": rec.offered_rps, "served_rps": rec.served_rps,
                "replicas": self.replicas.as_dict() if self.replicas else None,
                "noise": self.noise.as_dict() if self.noise else None,
                "departures": [d.as_dict() for d in self.departures],
                "what_ifs": [w.as_dict() for w in self.what_ifs],
                "slo": {"ttft_p99_s": self.slo_ttft_p99_s, "tbt_p99_s": self.slo_tbt_p99_s},
                "budget": budget_words(self.budget),
                "rejected": self.rejections.as_dict() if self.rejections else None,
                "step_times": self.step_times}


def budget_words(b: Budget) -> str:
    parts = [x for x in ("peak-only" if b.peak_only else "",
                         f"at most {b.max_minutes_share:.0%} of minutes"
                         if b.max_minutes_share is not None else "",
                         f"at most {b.max_per_minute:g} per minute"
                         if b.max_per_minute is not None else "") if x]
    return ", ".join(parts) or "any"


# The plan sizes V1's CPU tier only where the compiled core replays the connector: a sweep on
# the Python reference takes minutes per point on a real trace (`kvcap size-offload` still runs
# there when asked).
NOT_SIZED = ("not sized in the plan — this build replays CPU offloading on the Python reference "
             "only (tens of times slower); `kvcap size-offload` sizes it there")


def fast_offloading() -> bool:
    from replay.engine.compiled import has_offloading
    return has_offloading("v1")


def default_grid(max_num_seqs: int) -> list[int]:
    """Candidates around the engine's max_num_seqs: its 1/8, 1/4, 1/2 and itself."""
    return sorted({max(1, max_num_seqs // d) for d in (8, 4, 2, 1)})


@dataclass(frozen=True, slots=True, kw_only=True)
class _Targets:
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    budget: Budget
    precision: float

    @property
    def slo(self) -> dict:
        return dict(slo_ttft_p99_s=self.slo_ttft_p99_s, slo_tbt_p99_s=self.slo_tbt_p99_s)

    @property
    def search(self) -> dict:
        return dict(**self.slo, budget=self.budget, precision=self.precision)


def floor_trace(trace: pl.DataFrame, max_model_len: int | None = None,
                max_prompt_tokens: int | None = None) -> pl.DataFrame:
    """The trace's p99-length prompt (nearest rank) alone, cold (no prefix hashes), two output
    tokens: its TTFT is the least any load gives the p99 of TTFT (binding.py). The p99 of the
    prompts the engine accepts: a prompt too long for `max_model_len`, or for the whole KV pool
    (`max_prompt_tokens`: lone_prompt_limit), is rejected, never in a TTFT percentile
    (capacity/analyses/rejections.py says so on its own)."""
    trace = _accepted(trace, max_model_len, max_prompt_tokens)
    lengths = trace["prompt_tokens"].sort()
    p99 = int(lengths[max(1, math.ceil(0.99 * len(lengths))) - 1])
    return _alone(trace.filter(pl.col("prompt_tokens") == p99).head(1), output_tokens=2)


def _accepted(trace: pl.DataFrame, max_model_len: int | None,
              max_prompt_tokens: int | None = None) -> pl.DataFrame:
    """The requests whose prompt fits `max_model_len` and, alone, the KV pool (the whole trace
    when none does)."""
    prompt = pl.col("prompt_tokens")
    keep = pl.lit(True)
    if max_model_len is not None:
        keep &= ~too_long(prompt, max_model_len)
    if max_prompt_tokens is not None:
        keep &= prompt <= max_prompt_tokens
    kept = trace.filter(keep)
    return kept if kept.height else trace


def lone_prompt_limit(eng) -> int:
    """The longest prompt a lone request with three output tokens is sure to be admitted with:
    its KV within the GPU pool less one block (V1 admits at most num_gpu_blocks - 1) and V0's 1%
    watermark. A floor above it is rejected by the pool and never runs: found off the corpus,
    Llama-3.1-70B on 4 L40S with 2,500 blocks rejected Mooncake's p99 prompt, so the floor
    measured nothing while a lone long prompt took 80 s beside a 2 s SLO."""
    blocks = eng.num_gpu_blocks
    held = blocks - 1 - (int(eng.spec.v0_watermark * blocks) if eng.config.scheduler == "v0"
                         else 0)
    return max(0, held * eng.block_size - 3)


def _alone(row: pl.DataFrame, *, output_tokens: int) -> pl.DataFrame:
    """`row` as a trace of its own: at t = 0, cold (no prefix hashes), `output_tokens` long."""
    return row.with_columns(
        pl.lit(0.0).alias("arrival_s"),
        pl.lit(output_tokens, dtype=row["output_tokens"].dtype).alias("output_tokens"),
        pl.lit(None, dtype=row["prefix_hashes"].dtype).alias("prefix_hashes"))


def _floor(trace, config, planner: Planner, t: _Targets) -> tuple[LoadPoint, int]:
    eng = resolve(config)
    ft = floor_trace(trace, eng.spec.max_model_len, lone_prompt_limit(eng))
    return (probe(ft, config, planner, rate_scale=1.0, budget=t.budget, label="floor", **t.slo),
            int(ft["prompt_tokens"][0]))


def decode_floor_trace(trace: pl.DataFrame, max_model_len: int | None = None) -> pl.DataFrame:
    """The trace's shortest prompt (of those the engine accepts) alone, cold, three output
    tokens: its token gaps are lone decode steps, the least TBT any load gives (binding.py)."""
    trace = _accepted(trace, max_model_len)
    return _alone(trace.filter(pl.col("prompt_tokens") == trace["prompt_tokens"].min()).head(1),
                  output_tokens=3)


# prefill_chunk's knob where chunked prefill is off (V0's default on some engines): found off the
# corpus, Mistral-7B on an H200 (V0) was told "a smaller --max-num-batched-tokens" beside "chunked
# prefill is off: the chunk is the whole prompt".
CHUNKING_OFF_KNOB = ("--enable-chunked-prefill (off here: each prompt is prefilled whole in one "
                     "step, stalling every decode beside it), then a smaller "
                     "--max-num-batched-tokens")


def _diagnose(pts, floor, rate: ScaleSearch, t: _Targets, trace=None, config=None,
              planner=None) -> Binding:
    point, tokens = floor
    b = diagnose(tuple(p for p in pts if not p.surge), point, floor_prompt_tokens=tokens,
                 scale=rate.scale, failed_at=rate.failed_at, **t.slo)
    if b.constraint == "long_prompt_prefill" and trace is not None:
        b = dataclasses.replace(b, knob=b.knob + "; " + _tp_what_if(trace, config, planner, t))
    if b.constraint == "prefill_chunk" and config is not None \
            and not resolve(config).spec.enable_chunked_prefill:
        # There is no chunk to shorten: each prompt is prefilled whole, in one step.
        b = dataclasses.replace(b, knob=CHUNKING_OFF_KNOB)
    if b.constraint == "prefill_chunk" and trace is not None:
        # TBT binds without preemption: a smaller chunk helps only above the decode floor.
        p, tokens = _decode_floor(trace, config, planner, t)
        b = decode_bound(b, p, prompt_tokens=tokens, slo_tbt_p99_s=t.slo_tbt_p99_s)
        if b.constraint == "decode_step":
            b = dataclasses.replace(b, knob=b.knob + "; " + _tp_what_if(trace, config, planner,
                                                                         t, decode=True))
    return b


# Every catalog GPU ships in 8-GPU nodes (HGX/DGX boards; 8-way PCIe servers for the L40S).
# vLLM runs tensor parallelism within a node (pipeline parallelism across nodes), and kvcap's
# step times know no inter-node link: the roofline would price TP 16's all-reduce at NVLink
# speed. So the what-if stops at one node.
NODE_GPUS = 8


def _tp_what_if(trace, config: EngineConfig, planner: Planner, t: _Targets, *,
                decode: bool = False) -> str:
    """The knob that addresses a floor, measured: the floor (the p99-length prompt's TTFT, or
    with `decode` the shortest prompt's decode step) as deployed and at 2x, 4x, 8x the tensor
    parallelism (the same GPU and model) within one node, the smallest that meets the SLO.
    Where the deployment's steps are priced by measured tables, a TP without a shipped profile
    is named and never replayed: the roofline it would fall back to leaves out what the measured
    tables show (on PCIe GPUs an all-reduce that grows with TP), so its number is no claim
    beside them."""
    from replay.timing.executors import has_measured_timing
    what, slo, metric, floor = (
        ("one decode step of the shortest prompt alone", t.slo_tbt_p99_s, "tbt_p99_s",
         _decode_floor) if decode else
        ("the p99-length prompt alone", t.slo_ttft_p99_s, "ttft_p99_s", _floor))
    which = "TBT" if decode else "TTFT"
    eng = resolve(config)
    measured = has_measured_timing(eng, config.calibration)
    now = getattr(floor(trace, config, planner, t)[0], metric)
    tried, unmeasured = [f"TP {config.tensor_parallel_size} (as deployed): {_s(now)}"], []
    beyond = [str(k * config.tensor_parallel_size) for k in (2, 4, 8)
              if k * config.tensor_parallel_size > NODE_GPUS]

    def takes(met: bool = False) -> str:
        return f"measured: {what} takes " + ", ".join(tried + (
            [f"TP {', '.join(unmeasured)}: not measured (no step-time profile of "
             f"{eng.model.name} on {eng.gpu.name} there)"] if unmeasured else []) + (
            [f"TP {', '.join(beyond)}: beyond one {NODE_GPUS}-GPU node (vLLM keeps tensor "
             f"parallelism within a node; not modelled)"] if beyond and not met else []))

    for tp in (2, 4, 8):
        tp *= config.tensor_parallel_size
        if tp > NODE_GPUS:
            break
        # A calibration was measured at the deployment's TP: the others use shipped tables.
        cfg = _valid(config, tensor_parallel_size=tp, calibration=None)
        if cfg is None:
            break
        if measured and not has_measured_timing(resolve(cfg)):
            unmeasured.append(str(tp))
            continue
        v = getattr(floor(trace, cfg, planner, t)[0], metric)
        tried.append(f"TP {tp}: {_s(v)}")
        if v is not None and v <= slo:
            return f"{takes(met=True)}: --tensor-parallel-size {tp} meets the {which} SLO"
    return (takes() + ("; no measured TP of this GPU and model" if unmeasured else
                       "; no TP within one node" if beyond else
                       "; no TP this GPU and model allow") + f" meets the {which} SLO: "
            + ("a looser TBT SLO, or a faster GPU" if decode else
               "an SLO per prompt-length class, or a faster GPU"))


def _decode_floor(trace, config, planner: Planner, t: _Targets) -> tuple[LoadPoint, int]:
    dt = decode_floor_trace(trace, resolve(config).spec.max_model_len)
    return (probe(dt, config, planner, rate_scale=1.0, budget=t.budget, label="decode floor",
                  **t.slo), int(dt["prompt_tokens"][0]))


def _capacity(trace, config, planner: Planner, t: _Targets, *, guess: float | None = None,
              label: str = "capacity") -> tuple[ScaleSearch, tuple[LoadPoint, ...], Binding]:
    """The largest load meeting the SLOs and the budget, its probes, and what binds it."""
    guesses = {"c": guess} if guess else None
    rate, pts = search_loads(trace, {"c": config}, planner, passes=ok, guesses=guesses,
                             label=label, **t.search)["c"]
    return rate, pts, _diagnose(pts, _floor(trace, config, planner, t), rate, t, trace, config,
                                planner)


def _replicas(trace, config, planner, t: _Targets, rate: ScaleSearch, binding: Binding, *,
              router: str, max_replicas: int, target_peak_scale: float, on_fleet) -> Replicas:
    return min_replicas(trace, config, planner, capacity_scale=rate.scale, budget=t.budget,
                        router=router, max_replicas=max_replicas,
                        target_peak_scale=target_peak_scale, on_fleet=on_fleet,
                        replicas_help=binding.replicas_help, why_not=binding.evidence, **t.slo)


def _rps(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f} req/s"


def _capacity_words(rate: ScaleSearch, offered: float, binding: Binding | None = None) -> str:
    if rate.scale is None:
        c = binding.constraint if binding is not None else None
        why = ("the long prompts' own prefill misses the TTFT SLO at any load"
               if c == "long_prompt_prefill" else
               "one decode step alone misses the TBT SLO at any load" if c == "decode_step" else
               "bursts of simultaneous arrivals keep their shape at any rate; a fleet spreads "
               "them")
        return (f"capacity: none — one replica misses the SLOs or the budget even at "
                f"×{rate.failed_at:g} of this traffic ({why})")
    return f"capacity {_rps(rate.scale * offered)} per replica ({rate.words()})"


def _overloaded(trace, config, base: RunResult, st: Stability, planner: Planner, t: _Targets, *,
                router: str, max_replicas: int, target_peak_scale: float, on_fleet) -> Plan:
    served = st.served_rps / st.offered_rps if st.offered_rps else None
    # Scored as the capacity search scores (whether it keeps up does not depend on it): the
    # capacity search's probes at the same scales, its first guess included, are these replays.
    sus, _ = sustainable_load(trace, config, planner, precision=t.precision, served_share=served,
                              **t.slo, budget=t.budget)
    rate, pts, binding = _capacity(trace, config, planner, t, guess=sus.scale, label="capacity")
    reps = _replicas(trace, config, planner, t, rate, binding, router=router,
                     max_replicas=max_replicas, target_peak_scale=target_peak_scale,
                     on_fleet=on_fleet)
    k = sus.scale
    load = (f"the queue drains up to ≈ {_rps(st.offered_rps * k)} (×{k:.2f}; sustainable, "
            f"not the SLOs)" if k else f"the queue grows even at ×{sus.failed_at:g} of this trace")
    rej = rejections(base.tables()["requests"], resolve(config))
    run = base.run
    # An engine that stops (V0 out of swap space) serves nothing after: that, not the queue, is
    # what `kvcap replay` calls it, and the first thing to fix.
    stop = (f"the engine aborts at {_s(run.get('abort_s'))} simulated"
            + (f" ({run['abort_reason']})" if run.get("abort_reason") else "")
            + " — a larger --swap-space, or --preemption-mode recompute; "
            if run.get("status") == "aborted" else "")
    head = (f"overloaded: {stop}{st.serves()}; {load}; "
            f"{_capacity_words(rate, st.offered_rps, binding)}; "
            + (f"needs {reps.count} replicas ({router} router) to fit" if reps.count
               else reps.explanation) + (f"; {rej.short()}" if rej else ""))
    lines = [f"replayed on {run_engine_words(base.run)}", step_time_words(config),
             *([rej.words()] if rej else []),
             f"binding constraint: {binding.constraint or 'none'} — {binding.evidence}; the knob: "
             f"{binding.knob or '—'}",
             f"replicas: {reps.explanation}",
             f"evidence: {st.evidence}",
             "no flags, no host-tier size and no alert rule are derived from an overloaded run"]
    hr = Headroom(rate=rate, surge=None, surge_window_s=None, points=pts,
                  target_peak_scale=target_peak_scale, replicas_needed=reps.count,
                  slo_ttft_p99_s=t.slo_ttft_p99_s, slo_tbt_p99_s=t.slo_tbt_p99_s,
                  explanation=_capacity_words(rate, st.offered_rps, binding))
    rec = Recommendation(verdict="overloaded", sustainable=False, offered_rps=st.offered_rps,
                         served_rps=st.served_rps, sustainable_rate_scale=k,
                         headroom_rate_scale=rate.scale,
                         capacity_rps=rate.scale * st.offered_rps if rate.scale else None,
                         precision=t.precision, flags=(), expected=None, config=None,
                         headline=head, lines=tuple(lines))
    return Plan(baseline=base, stability=st, sustainable_load=sus, noise=None, sizing=None,
                offload=None, migration=None, modes=None, tuning=None, headroom=hr,
                binding=binding, replicas=reps, departures=(), what_ifs=(), recommended_run=None,
                stall_drill=None, classification=None, alert=None, budget=t.budget,
                slo_ttft_p99_s=t.slo_ttft_p99_s, slo_tbt_p99_s=t.slo_tbt_p99_s,
                recommendation=rec, rejections=rej, step_times=step_times(config))


def _host_tier_and_modes(trace, config, base, planner, t: _Targets, noise: Noise):
    sizing = offload = None
    if config.scheduler == "v1":
        if fast_offloading():
            # The baseline is the sweep's size-0 point unless it already runs a CPU tier.
            offload = size_offload(trace, config, planner=planner,
                                   baseline=None if config.kv_offloading_size else base.tables())
        modes = compare_modes(trace, config, planner=planner, **t.slo, noise=noise,
                              kv_offloading_size_gib=(offload.recommended_kv_offloading_size_gib
                                                      if offload else None),
                              include_host_tier=offload is not None and offload.needed)
    else:
        try:
            sizing = size_swap(trace, config, planner=planner, baseline=base.tables())
        except ValueError:
            sizing = None         # V0 cannot swap under priority scheduling (reference G/D4)
        modes = compare_modes(trace, config, planner=planner, **t.slo, noise=noise,
                              swap_space_gib=sizing.recommended_swap_space_gib
                              if sizing is not None and sizing.needed else None)
    return sizing, offload, modes


def _has_host_tier(config: EngineConfig) -> bool:
    """A replay the mode comparison may ask of its host-tier variant (V1's CPU offloading, V0's
    swap): asking it of the others would only cost them (the mode's summary keeps every TBT)."""
    return bool(config.kv_offloading_size) if config.scheduler == "v1" else \
        config.preemption_mode == "swap"


def _margin_of(trace, config, planner, t: _Targets) -> float | None:
    rate, _ = search_loads(trace, {"c": config}, planner, passes=ok, label="headroom",
                           **t.search)["c"]
    return rate.scale


def _margin_gain(default: float | None, new: float | None) -> float:
    if new is None:
        return 0.0
    if default is None:
        return math.inf                   # the default fails at every load searched
    return gain(default, new, higher_is_better=True)


def _choose_seqs(trace, mode_cfg, tn: Tuning, planner, t: _Targets,
                 noise: Noise) -> tuple[EngineConfig, Departure | None, str]:
    """The tuned max-num-seqs only when its margin beats vLLM's default's by more than the
    threshold; otherwise the default, said so."""
    default = resolve(mode_cfg).spec.max_num_seqs
    if tn.recommended is None or tn.recommended.max_num_seqs == default:
        return mode_cfg, None, tn.explanation
    m_new = tn.margin.scale if tn.margin else None
    m_def = next((m.scale if m else None for c, m in zip(tn.candidates, tn.margins)
                  if c.max_num_seqs == default), None)
    if m_def is None:
        m_def = _margin_of(trace, mode_cfg, planner, t)
    g, thr = _margin_gain(m_def, m_new), noise.threshold("margin")
    if g > thr:
        cfg = tn.recommended_config
        return cfg, Departure(knob="--max-num-seqs", default=default,
                              recommended=tn.recommended.max_num_seqs,
                              objective="capacity (margin × today's rate)",
                              gain=g if math.isfinite(g) else 1.0, threshold=thr), tn.explanation
    return mode_cfg, None, (
        f"vLLM's default {default} stays: max_num_seqs={tn.recommended.max_num_seqs}'s margin "
        f"{'—' if m_new is None else f'×{m_new:.2f}'} against the default's "
        f"{'—' if m_def is None else f'×{m_def:.2f}'} is within the search precision "
        f"(threshold {thr:.0%})")


def _batched_tokens(trace, cfg: EngineConfig, planner, t: _Targets, noise: Noise,
                    m_now: float | None) -> tuple[EngineConfig, Departure | None, str]:
    """A TBT bound by the prefill chunk: smaller --max-num-batched-tokens, searched by margin.
    With chunked prefill off (V0's default up to a 32k context) there is no chunk to shorten:
    each prompt is prefilled whole in one step, so the candidates turn chunked prefill on, at the
    engine's own chunked default and at smaller chunks."""
    spec = resolve(cfg).spec
    chunking = not spec.enable_chunked_prefill
    mbt = spec.max_num_batched_tokens
    base = dataclasses.replace(cfg, enable_chunked_prefill=True, max_num_batched_tokens=None) \
        if chunking else cfg
    top = resolve(base).spec.max_num_batched_tokens if chunking else mbt
    # vLLM refuses a step budget below --max-num-seqs where that is set (V0 always sets it):
    # found off the corpus, --max-num-seqs 512 --max-num-batched-tokens 2048 crashed the plan.
    cands = {v: c for v in (top // d for d in ((1, 2, 4, 8) if chunking else (2, 4, 8, 16)))
             if v >= max(256, spec.block_size)
             and (c := _valid(base, max_num_batched_tokens=v)) is not None}
    values = list(cands)
    if not values:
        return cfg, None, (f"chunked prefill is off, and no chunk of {top} tokens or less is "
                           f"allowed beside --max-num-seqs {spec.max_num_seqs}" if chunking else
                           f"--max-num-batched-tokens {mbt} is already small")
    found = search_loads(trace, cands, planner, passes=ok, label="batched tokens", **t.search)
    margins = {v: found[v][0].scale for v in values}
    best = max(values, key=lambda v: (margins[v] or 0.0, v))
    g, thr = _margin_gain(m_now, margins[best]), noise.threshold("margin")
    tried = ", ".join(f"{v}: {'—' if margins[v] is None else f'×{margins[v]:.2f}'}" for v in values)
    now = '—' if m_now is None else f'×{m_now:.2f}'
    won = margins[best] is not None and g > thr
    if chunking:
        if won:
            return cands[best], Departure(
                knob="--enable-chunked-prefill", default=f"off, --max-num-batched-tokens {mbt}",
                recommended=f"on, --max-num-batched-tokens {best}",
                objective="capacity (margin × today's rate)",
                gain=g if math.isfinite(g) else 1.0, threshold=thr), (
                f"--enable-chunked-prefill with --max-num-batched-tokens {best}: chunked prefill "
                f"is off here, so each prompt is prefilled whole in one step, stalling every "
                f"decode beside it; chunked, margins {tried} against {now} unchunked")
        return cfg, None, (f"chunked prefill is off (each prompt is prefilled whole); turning it "
                           f"on does not win beyond the threshold ({tried}; unchunked {now})")
    if won:
        return cands[best], Departure(knob="--max-num-batched-tokens", default=mbt,
                                      recommended=best, objective="capacity (margin × today's rate)",
                                      gain=g if math.isfinite(g) else 1.0, threshold=thr), (
            f"--max-num-batched-tokens {best} (from {mbt}) shortens the prefill chunk that binds "
            f"TBT: margins {tried} against {now}")
    return cfg, None, (f"a smaller --max-num-batched-tokens does not win beyond the threshold "
                       f"({tried}; now {now})")


def _valid(config: EngineConfig, **changes) -> EngineConfig | None:
    """`config` with `changes`, or None where vLLM would refuse the result."""
    try:
        return dataclasses.replace(config, **changes)
    except ValueError:
        return None


def _mode_departure(modes: ModeComparison) -> list[Departure]:
    if modes.departure is None:
        return []
    metric, g, thr = modes.departure
    knob = {"swap": "--preemption-mode", "recompute+cpu-offload": "--kv-offloading-size",
            "recompute": "--enable-prefix-caching",
            "recompute+prefix-cache": "--enable-prefix-caching"}.get(modes.recommended, "mode")
    return [Departure(knob=knob, default=modes.default_variant, recommended=modes.recommended,
                      objective=metric, gain=g, threshold=thr)]


def make_plan(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
              slo_ttft_p99_s: float = DEFAULTS.slo_ttft_p99_s,
              slo_tbt_p99_s: float = DEFAULTS.slo_tbt_p99_s, budget: Budget = Budget(),
              grid: list[int] | None = None, precision: float = DEFAULTS.precision,
              model_name: str | None = None, router: str = DEFAULTS.router,
              max_replicas: int = DEFAULTS.max_replicas, target_peak_scale: float = 1.0,
              noise_seeds: int = DEFAULTS.noise_seeds, surge: bool = True,
              on_fleet=None, on_baseline=None) -> Plan:
    """The plan (module docstring). `on_fleet` sees every fleet the replica search replays;
    `on_baseline` the baseline replay, as soon as it is made (the report renders its charts
    meanwhile)."""
    t = _Targets(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget,
                 precision=precision)
    rkw = dict(router=router, max_replicas=max_replicas, target_peak_scale=target_peak_scale,
               on_fleet=on_fleet)
    # The pools the plan will use (the searches', and the one-worker pool its fleets and the
    # drill-down replay in) start while the baseline replays here.
    prewarm(planner.workers or default_workers(), "replay.run", "capacity.analyses.planner",
            "capacity.analyses.headroom")
    prewarm(1, "replay.run", "capacity.analyses.replicas", "capacity.analyses.plan")
    base = planner.replay(trace, config, "report baseline")
    if on_baseline is not None:
        on_baseline(base)
    st = stability(base.tables())
    if not st.sustainable:
        return _overloaded(trace, config, base, st, planner, t, **rkw)
    noise = measure_noise(trace, config, planner, seeds=noise_seeds, precision=precision)
    # The configuration the plan recommends is one of the ×1 replays the host tier, the modes and
    # the tuning make, and its capacity search probes it at ×1 again; the mode comparison asks
    # again of the replay that sized the host tier. A summary replay keeps no tables, so those
    # replays answer the later questions as they are made: each replay is made once (issue 36).
    def at_x1(job: Job) -> bool:                 # this trace at ×1, this scheduler (no twin)
        return job.trace is trace and job.config.scheduler == config.scheduler

    with planner.asking_too(
            (point_reducer(1.0, False, t.slo_ttft_p99_s, t.slo_tbt_p99_s, budget), at_x1),
            (variant_reducer(config, OFFLOAD if config.scheduler == "v1" else "swap", **t.slo),
             lambda job: at_x1(job) and _has_host_tier(job.config))):
        sizing, offload, modes = _host_tier_and_modes(trace, config, base, planner, t, noise)
        moved = migration(trace, config, planner, sizing=sizing, offload=offload)
        mode_cfg = modes.config if modes.config.preemption_mode != "none" else config
        tn = tune(trace, mode_cfg, budget=budget, planner=planner, precision=precision,
                  max_num_seqs_grid=grid or default_grid(resolve(mode_cfg).spec.max_num_seqs),
                  **t.slo)
        chosen, seqs_dep, seqs_words = _choose_seqs(trace, mode_cfg, tn, planner, t, noise)
    departures = _mode_departure(modes) + ([seqs_dep] if seqs_dep else [])
    rate, pts, binding = _capacity(trace, chosen, planner, t, label="headroom")
    mbt_words, mbt_what = "", "max-num-batched-tokens"
    if binding.constraint == "prefill_chunk":
        if not resolve(chosen).spec.enable_chunked_prefill:
            mbt_what = "chunked prefill"
        chosen, mbt_dep, mbt_words = _batched_tokens(trace, chosen, planner, t, noise, rate.scale)
        departures += [mbt_dep] if mbt_dep else []
    flags = vllm_flags(chosen)
    drop = dropped_flags(config, chosen)
    cfg = apply_flags(config, flags)            # what a user who follows the flags runs
    run = planner.replay(trace, cfg, "recommended")
    tables = run.tables()
    c = evaluate(tables, slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s, budget=budget)
    expected = Expected(run_id=run.run_id, ttft_p99_s=c.ttft_p99_s, tbt_p99_s=c.tbt_p99_s,
                        preemptions=c.preemptions, recompute_tax=c.recomputed_share,
                        throughput_rps=c.throughput_rps,
                        goodput_rps=c.goodput_rps, slo_share=c.slo_share, meets_slo=c.meets_slo,
                        within_budget=c.within_budget, breaks=c.breaks)
    whatifs = what_ifs(trace, cfg, tables, planner, noise)
    hr = headroom(trace, cfg, planner, budget=budget, precision=precision, surge=surge, **t.slo)
    rate, pts = hr.rate, hr.points
    binding = _diagnose(pts, _floor(trace, cfg, planner, t), rate, t, trace, cfg, planner)
    reps = _replicas(trace, cfg, planner, t, rate, binding, **rkw)
    hr = dataclasses.replace(hr, replicas_needed=reps.count, target_peak_scale=target_peak_scale)
    fits = c.feasible
    drill = None
    window = drill_steps(tables)
    if window is not None:
        # The same replay once more, keeping the batches of the steps around the worst stalls
        # only (identical otherwise; every batch is one row per request per step), in a worker
        # of its own: its tables never reach this process.
        drill = in_worker(drill_of, trace, cfg, window)
    verdict = classify(tables)
    rule = alert_rule(tables, model_name=model_name) if fits else None
    offered = st.offered_rps
    cap = rate.scale * offered if rate.scale else None
    rej = rejections(tables["requests"], resolve(cfg))
    lines = [f"replayed on {run_engine_words(run.run)}", step_time_words(config),
             *([rej.words()] if rej else []),
             f"preemption mode: {modes.recommended} — {modes.reason}"]
    if modes.queue_only_note:
        lines.append(modes.queue_only_note)
    lines.append(_host_tier_line(chosen, sizing, offload, modes, fits)
                 + (f"; {drop_words(config, drop)}" if drop else ""))
    lines.append(f"max-num-seqs: {seqs_words}")
    if mbt_words:
        lines.append(f"{mbt_what}: {mbt_words}")
    lines.append(f"binding constraint: {binding.constraint or 'none within the search'} — "
                 f"{binding.evidence}" + (f"; the knob: {binding.knob}" if binding.knob else ""))
    lines.append(f"{_capacity_words(rate, offered, binding)}: {hr.explanation}")
    lines.append(f"replicas: {reps.explanation}")
    lines.append(f"preemption is {verdict.verdict} with these flags: {verdict.evidence}")
    lines.append(f"recompute tax: {c.recomputed_share:.1%} of prefill tokens are recomputed "
                 "after preemption with these flags")
    lines += [f"what-if (not a flag): {w.words}" for w in whatifs]
    nums = (f"TTFT p99 {_s(c.ttft_p99_s)}, TBT p99 {_s(c.tbt_p99_s)}, {c.preemptions:,} "
            f"preemptions")
    reps_words = (f"needs {reps.count} replica{'s' if reps.count != 1 else ''} ({router} router)"
                  if reps.count else "no replica count fixes it")
    if fits:
        head = (f"fits: the flags below meet the SLOs and the preemption budget at today's "
                f"{offered:,.2f} req/s ({nums}); {_capacity_words(rate, offered, binding)}; "
                f"{reps_words}")
    elif c.sustainable:
        head = (f"misses: stable ({st.serves()}), but "
                f"with the flags below {c.breaks} ({c.preemptions:,} preemptions); binding: "
                f"{binding.constraint or '—'}; {_capacity_words(rate, offered, binding)}; "
                f"{reps_words}")
    else:
        # The flags won on capacity (a margin below ×1), yet at ×1 one replica of them falls
        # behind where the deployment as given kept up: "stable" would describe the wrong run.
        head = (f"misses: with the flags below {c.breaks} ({c.preemptions:,} preemptions): one "
                f"replica falls behind today's traffic, where the deployment as given keeps up "
                f"({st.serves()})"
                + (" but carries less traffic within the SLOs" if departures else "")
                + f"; binding: {binding.constraint or '—'}; "
                f"{_capacity_words(rate, offered, binding)}; {reps_words}")
    if rej:
        head += f"; {rej.short()}"
    rec = Recommendation(verdict="fits" if fits else "misses", sustainable=True,
                         offered_rps=offered, served_rps=st.served_rps,
                         sustainable_rate_scale=None, headroom_rate_scale=rate.scale,
                         capacity_rps=cap, precision=precision, flags=flags, drop_flags=drop,
                         expected=expected,
                         config=cfg, headline=head, lines=tuple(lines))
    return Plan(baseline=base, stability=st, sustainable_load=None, noise=noise, sizing=sizing,
                offload=offload, migration=moved, modes=modes, tuning=tn, headroom=hr,
                binding=binding, replicas=reps, departures=tuple(departures), what_ifs=whatifs,
                recommended_run=run, stall_drill=drill, classification=verdict, alert=rule,
                slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget,
                recommendation=rec, rejections=rej, step_times=step_times(config))


def drill_of(trace: pl.DataFrame, config: EngineConfig, window: tuple[int, int]):
    """The drill-down of a replay (stalls.stall_batches), replayed with the batches of `window`
    (its steps spilled to files past a million steps: only their step numbers and starts are
    read)."""
    return stall_batches(replay(trace, config, record_batches=window,
                                spill_dir=tempfile.gettempdir()).tables())


def _host_tier_line(chosen: EngineConfig, sizing: SwapSizing | None,
                    offload: OffloadSizing | None, modes: ModeComparison, fits: bool) -> str:
    if chosen.scheduler == "v1" and offload is None:
        return f"CPU offloading: {NOT_SIZED}"
    if offload is not None:                  # V1: CPU KV offloading
        if chosen.kv_offloading_size:
            return (f"CPU offloading ({offload.engine_words()}): {offload.words()}"
                    + ("" if fits else "; the plan misses its targets, so this size is the mode "
                       "comparison's, not a sizing to provision"))
        if not offload.needed:
            return f"CPU offloading: not needed — {offload.knee.reason}"
        return (f"CPU offloading: not used — the mode comparison keeps {modes.recommended} "
                f"(a tier of {offload.recommended_kv_offloading_size_gib:g} GiB, the sweep's "
                f"knee: {offload.gain_words()})")
    if sizing is None:
        return ("host swap tier: not sized — V0 cannot swap under priority scheduling (real vLLM "
                "crashes: the victim is swapped out but re-queued as waiting)")
    if chosen.preemption_mode == "swap":
        return f"host tier: {sizing.words()}"
    return "host swap tier: " + ("not needed: no request is ever swapped out at this load"
                                 if not sizing.needed else f"not used (mode {modes.recommended})")


def _s(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v * 1000:,.0f} ms" if v < 1 else f"{v:,.2f} s"
