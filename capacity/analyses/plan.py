"""The capacity plan: every analysis in order, and the one Recommendation rendered everywhere.

Order (each step only when the previous allows it):
1. replay the baseline and classify its stability; an overloaded baseline gets its sustainable
   load (search) and the nearest fixes, and nothing else: no flags, no swap size, no alert rule;
2. the host tier: V0's swap sizing (the pool the swap mode would need), V1's CPU offloading
   sizing (the knee of the `--kv-offloading-size` curve), and the other engine's answer beside it
   (migration.py); then the preemption modes (the swap / offload variant with that tier);
3. max-num-seqs tuning on the chosen mode, by margin;
4. the recommended configuration = the chosen mode with the chosen max-num-seqs; its flags are
   `flags.vllm_flags`, and *the replay of those flags* (parsed back by `flags.apply_flags`) gives
   the expected metrics, the headroom search and the alert rule.
The report, the CLI tables, summary.json and the printed `vllm serve` flags all render
`Plan.recommendation`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from capacity.analyses.classify import AlertRule, Classification, alert_rule, classify
from capacity.analyses.criteria import Budget, evaluate
from capacity.analyses.flags import apply_flags, vllm_flags
from capacity.analyses.headroom import Headroom, headroom, sustainable_load
from capacity.analyses.migration import Migration, migration
from capacity.analyses.modes import ModeComparison, compare_modes
from capacity.analyses.offload import OffloadSizing, size_offload
from capacity.analyses.planner import Planner
from capacity.analyses.search import PRECISION, ScaleSearch
from capacity.analyses.sizing import SwapSizing, size_swap
from capacity.analyses.stability import Stability, stability
from capacity.analyses.stalls import StallBatches, stall_batches
from capacity.analyses.tuning import Tuning, tune
from replay.config import EngineConfig, resolve
from replay.results import RunResult
from replay.run import replay


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """What the recommended flags replay to (the recommended row)."""
    run_id: str
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    preemptions: int
    throughput_rps: float
    goodput_rps: float
    slo_share: float
    meets_slo: bool

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    sustainable: bool
    offered_rps: float
    served_rps: float
    sustainable_rate_scale: float | None   # overloaded baselines: the searched sustainable scale
    headroom_rate_scale: float | None      # the recommended configuration's headroom
    precision: float
    flags: tuple[str, ...]                 # `vllm serve` arguments; () when not sustainable
    expected: Expected | None
    config: EngineConfig | None
    headline: str
    lines: tuple[str, ...]                 # the rest, in words (what the flags cannot say too)

    def as_dict(self) -> dict:
        return {"sustainable": self.sustainable, "offered_rps": self.offered_rps,
                "served_rps": self.served_rps,
                "sustainable_rate_scale": self.sustainable_rate_scale,
                "headroom_rate_scale": self.headroom_rate_scale, "precision": self.precision,
                "flags": list(self.flags),
                "expected": self.expected.as_dict() if self.expected else None,
                "headline": self.headline, "lines": list(self.lines)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    baseline: RunResult
    stability: Stability
    sustainable_load: ScaleSearch | None
    sizing: SwapSizing | None               # V0's swap pool (V1 plans: None)
    offload: OffloadSizing | None           # V1's CPU tier (V0 plans: None)
    migration: Migration | None             # both engines' host tier, side by side
    modes: ModeComparison | None
    tuning: Tuning | None
    headroom: Headroom | None
    recommended_run: RunResult | None
    # The recommended replay's worst-stalled request, its batches around each stall (None when
    # nothing stalled or the baseline is overloaded).
    stall_drill: StallBatches | None
    classification: Classification | None   # preemption of the recommended replay
    alert: AlertRule | None                  # None when the baseline is overloaded
    recommendation: Recommendation


def default_grid(max_num_seqs: int) -> list[int]:
    """Candidates around the engine's max_num_seqs: its 1/8, 1/4, 1/2 and itself."""
    return sorted({max(1, max_num_seqs // d) for d in (8, 4, 2, 1)})


def _overloaded(trace, config, base: RunResult, st: Stability, planner: Planner, *, slo_ttft_p99_s,
                slo_tbt_p99_s, budget, grid, precision) -> Plan:
    search, _ = sustainable_load(trace, config, planner, precision=precision,
                                 served_share=st.served_rps / st.offered_rps if st.offered_rps else None)
    k = search.scale
    tn = tune(trace, config, max_num_seqs_grid=grid or default_grid(resolve(config).spec.max_num_seqs),
              slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget,
              planner=planner, precision=precision)
    fixes = []
    if k:
        fixes.append(f"rate-limit this replica to about {st.offered_rps * k:,.2f} req/s, or run "
                     f"{math.ceil(1 / k - 1e-9)} replicas for this traffic")
    if tn.recommended is not None:
        fixes.append(f"--max-num-seqs {tn.recommended.max_num_seqs} keeps up and meets the SLOs at "
                     f"this rate (margin {tn.margin.words()}): re-run the report with it")
    fixes.append("a larger KV pool: more GPUs (--tensor-parallel-size), an fp8 KV cache "
                 "(--kv-cache-dtype fp8) or a smaller model")
    load = (f"sustainable load ≈ {st.offered_rps * k:,.2f} req/s (×{k:.2f} of this trace, "
            f"precision {precision:.0%})" if k else
            f"not sustainable even at ×{search.failed_at:g} of this trace")
    head = f"overloaded: serves {st.served_rps:,.2f} of {st.offered_rps:,.2f} req/s; {load}"
    rec = Recommendation(sustainable=False, offered_rps=st.offered_rps, served_rps=st.served_rps,
                         sustainable_rate_scale=k, headroom_rate_scale=None, precision=precision,
                         flags=(), expected=None, config=None, headline=head,
                         lines=tuple([f"the nearest fixes are: " + "; ".join(fixes),
                                      f"evidence: {st.evidence}",
                                      "no flags, no swap size and no alert rule are derived from "
                                      "an overloaded run"]))
    return Plan(baseline=base, stability=st, sustainable_load=search, sizing=None, offload=None,
                migration=None, modes=None,
                tuning=tn, headroom=None, recommended_run=None, stall_drill=None, classification=None, alert=None,
                recommendation=rec)


def make_plan(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
              slo_ttft_p99_s: float, slo_tbt_p99_s: float, budget: Budget = Budget(),
              grid: list[int] | None = None, precision: float = PRECISION,
              model_name: str | None = None) -> Plan:
    base = planner.replay(trace, config, "report baseline")
    base_tables = base.tables()
    st = stability(base_tables)
    kw = dict(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s)
    if not st.sustainable:
        return _overloaded(trace, config, base, st, planner, budget=budget, grid=grid,
                           precision=precision, **kw)
    sizing = offload = None
    if config.scheduler == "v1":
        from capacity.analyses.offload import not_replayable
        if not_replayable() is None:
            # The baseline is the sweep's size-0 point unless it already runs a CPU tier.
            offload = size_offload(trace, config, planner=planner,
                                   baseline=None if config.kv_offloading_size else base_tables)
        modes = compare_modes(trace, config, planner=planner, **kw,
                              kv_offloading_size_gib=(offload.recommended_kv_offloading_size_gib
                                                      if offload else None),
                              include_host_tier=offload is not None and offload.needed)
    else:
        sizing = size_swap(trace, config, planner=planner, baseline=base_tables)
        modes = compare_modes(trace, config, planner=planner, **kw,
                              swap_space_gib=sizing.recommended_swap_space_gib if sizing.needed
                              else None)
    moved = migration(trace, config, planner, sizing=sizing, offload=offload)
    mode_cfg = modes.config
    if mode_cfg.preemption_mode == "none":      # never recommended (modes.py); kept safe here
        mode_cfg = config
    tn = tune(trace, mode_cfg, budget=budget, planner=planner, precision=precision,
              max_num_seqs_grid=grid or default_grid(resolve(mode_cfg).spec.max_num_seqs), **kw)
    chosen = tn.recommended_config or mode_cfg
    flags = vllm_flags(chosen)
    cfg = apply_flags(config, flags)            # what a user who follows the flags runs
    run = planner.replay(trace, cfg, "recommended")
    tables = run.tables()
    c = evaluate(tables, slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s, budget=budget)
    expected = Expected(run_id=run.run_id, ttft_p99_s=c.ttft_p99_s, tbt_p99_s=c.tbt_p99_s,
                        preemptions=c.preemptions, throughput_rps=c.throughput_rps,
                        goodput_rps=c.goodput_rps, slo_share=c.slo_share, meets_slo=c.meets_slo)
    hr = headroom(trace, cfg, planner, budget=budget, precision=precision, **kw)
    drill = None
    if run.stalls.height:
        # The same replay once more, keeping its batches (identical otherwise; the planner's
        # replays do not record them: one row per request per step).
        drill = stall_batches(replay(trace, cfg, record_batches=True).tables())
    verdict = classify(tables)
    rule = alert_rule(tables, model_name=model_name)
    lines = [f"preemption mode: {modes.recommended} — {modes.reason}"]
    if modes.queue_only_note:
        lines.append(modes.queue_only_note)
    lines.append(_host_tier_line(chosen, sizing, offload, modes))
    lines.append(f"max-num-seqs: {tn.explanation}")
    lines.append(f"headroom: {hr.explanation}")
    lines.append(f"preemption is {verdict.verdict} with these flags: {verdict.evidence}")
    ok = "meet" if c.meets_slo else "MISS"
    head = (f"sustainable: serves {st.served_rps:,.2f} of {st.offered_rps:,.2f} req/s offered; "
            f"the flags below {ok} the SLOs (TTFT p99 {_s(c.ttft_p99_s)}, TBT p99 "
            f"{_s(c.tbt_p99_s)}, {c.preemptions:,} preemptions) with headroom "
            f"{hr.rate.words()}")
    rec = Recommendation(sustainable=True, offered_rps=st.offered_rps, served_rps=st.served_rps,
                         sustainable_rate_scale=None, headroom_rate_scale=hr.rate.scale,
                         precision=precision, flags=flags, expected=expected, config=cfg,
                         headline=head, lines=tuple(lines))
    return Plan(baseline=base, stability=st, sustainable_load=None, sizing=sizing, offload=offload,
                migration=moved, modes=modes,
                tuning=tn, headroom=hr, recommended_run=run, stall_drill=drill,
                classification=verdict, alert=rule,
                recommendation=rec)


def _host_tier_line(chosen: EngineConfig, sizing: SwapSizing | None,
                    offload: OffloadSizing | None, modes: ModeComparison) -> str:
    if chosen.scheduler == "v1" and offload is None:
        from capacity.analyses.offload import not_replayable
        return f"CPU offloading: not sized — this build cannot replay it yet ({not_replayable()})"
    if offload is not None:                  # V1: CPU KV offloading
        if chosen.kv_offloading_size:
            return f"CPU offloading ({offload.engine_words()}): {offload.words()}"
        if not offload.needed:
            return f"CPU offloading: not needed — {offload.knee.reason}"
        return (f"CPU offloading: not used (mode {modes.recommended}); sized alone it would be "
                f"--kv-offloading-size {offload.recommended_kv_offloading_size_gib:g} GiB")
    if chosen.preemption_mode == "swap":
        return f"host tier: {sizing.words()}"
    return "host swap tier: " + ("not needed: no request is ever swapped out at this load"
                                 if not sizing.needed else f"not used (mode {modes.recommended})")


def _s(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v * 1000:,.0f} ms" if v < 1 else f"{v:,.2f} s"
