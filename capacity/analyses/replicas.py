"""The fewest replicas whose fleet replay meets the SLOs and the budget (docs/planning.md).

Start at the linear estimate ceil(target / capacity) (one replica's capacity as a multiple of the
trace's rate). If that fleet passes, step down 1, 2, 4, ... replicas until one fails; if it fails,
step up 1, 2, 4, ... replicas until one passes; then bisect. The answer N passed its own fleet
replay and N - 1 failed its own (0 replicas serve nothing: fails). The search stops there: no
probe above a passing N, none below a failing N - 1. It assumes more replicas never hurt, as the
load search assumes more load never helps; every probe is kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from capacity.analyses.criteria import Budget
from capacity.analyses.fleet import FleetScore, run_fleet, score
from capacity.analyses.planner import Planner
from replay.config import EngineConfig
from traces.transforms import scale_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class Replicas:
    count: int | None                   # None: none up to max_replicas, or replicas cannot help
    router: str
    target_peak_scale: float            # the load planned for, × the trace's rate
    linear_estimate: int | None
    meets: FleetScore | None            # the fleet replay of `count`
    one_fewer: FleetScore | None        # the fleet replay of count - 1 (None when count is 1)
    probes: tuple[tuple[int, bool, str], ...]
    explanation: str

    def as_dict(self) -> dict:
        def brief(s: FleetScore | None) -> dict | None:
            return None if s is None else {
                "replicas": s.replicas, "fleet_id": s.fleet_id, "ok": s.ok,
                "ttft_p99_s": s.candidate.ttft_p99_s, "tbt_p99_s": s.candidate.tbt_p99_s,
                "preemptions": s.candidate.preemptions, "breaks": s.candidate.breaks}
        return {"count": self.count, "router": self.router,
                "target_peak_scale": self.target_peak_scale,
                "linear_estimate": self.linear_estimate, "meets": brief(self.meets),
                "one_fewer": brief(self.one_fewer),
                "probes": [{"replicas": n, "ok": o, "breaks": b} for n, o, b in self.probes],
                "explanation": self.explanation}


def fleet_score(trace: pl.DataFrame, config: EngineConfig, replicas: int, router: str,
                trace_name: str, kw: dict) -> FleetScore:
    """One fleet replay, scored (runs in a worker: its replicas replay in that process, their
    steps and TBT samples spilled to files past a million steps)."""
    fleet = run_fleet(trace, config, replicas=replicas, router=router,
                      planner=Planner(workers=1, trace_name=trace_name, spill=True))
    return score(fleet, **kw)


def min_replicas(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
                 capacity_scale: float | None, slo_ttft_p99_s: float, slo_tbt_p99_s: float,
                 budget: Budget, router: str, max_replicas: int, target_peak_scale: float = 1.0,
                 replicas_help: bool = True, why_not: str = "", on_fleet=None) -> Replicas:
    load = trace if target_peak_scale == 1.0 else scale_rate(trace, target_peak_scale)
    linear = (None if not capacity_scale else
              max(1, math.ceil(target_peak_scale / capacity_scale - 1e-9)))
    if not replicas_help:
        return Replicas(count=None, router=router, target_peak_scale=target_peak_scale,
                        linear_estimate=linear, meets=None, one_fewer=None, probes=(),
                        explanation=f"no number of replicas fixes it: {why_not}")
    scores: dict[int, FleetScore] = {}

    kw = dict(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget)
    keep = on_fleet is not None or getattr(planner, "keep_tables", False)

    def passes(n: int) -> bool:
        if n not in scores:
            if keep:
                fleet = run_fleet(load, config, replicas=n, router=router, planner=planner)
                if on_fleet is not None:
                    on_fleet(fleet)
                scores[n] = score(fleet, **kw)
            else:
                # Scored in a worker of its own: a fleet's tables (every replica's steps) never
                # reach this process.
                from capacity.analyses.sweep import in_worker
                scores[n] = in_worker(fleet_score, load, config, n, router, planner.trace_name, kw)
        return scores[n].ok

    n = max(1, min(linear or 2, max_replicas))
    hi = lo = None                        # smallest passing, largest failing
    if passes(n):
        hi, lo, step = n, 0, 1
        while hi - step >= 1:             # gallop down: n - 1, then 2, 4, ... fewer
            if not passes(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
        while hi - lo > 1:                # lo fails (0 serves nothing), hi passes
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    else:
        lo, step = n, 1
        while hi is None and lo < max_replicas:
            cand = min(lo + step, max_replicas)
            if passes(cand):
                hi = cand
            else:
                lo, step = cand, step * 2
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    probes = tuple((k, s.ok, s.candidate.breaks) for k, s in sorted(scores.items()))
    peak = f" at ×{target_peak_scale:g} of today's traffic" if target_peak_scale != 1.0 else ""
    if hi is None:
        return Replicas(count=None, router=router, target_peak_scale=target_peak_scale,
                        linear_estimate=linear, meets=None, one_fewer=scores.get(lo),
                        probes=probes, explanation=(
                            f"no replica count up to {max_replicas} ({router} router) is enough"
                            f"{peak}" + (f": {lo} miss: {scores[lo].candidate.breaks}"
                                         if lo in scores else "")))
    below = scores.get(hi - 1)
    why = (f"{hi} replica{'s' if hi > 1 else ''} ({router} router) "
           f"{'meet' if hi > 1 else 'meets'} the SLOs and the budget"
           f"{peak}" + (f"; {hi - 1} miss: {below.candidate.breaks}" if below else "")
           + (f"; the linear estimate (×{target_peak_scale:g} ÷ one replica's capacity "
              f"×{capacity_scale:.3g}) says {linear}; the count is the fleet replays', which "
              f"route every request" if linear is not None and linear != hi else ""))
    return Replicas(count=hi, router=router, target_peak_scale=target_peak_scale,
                    linear_estimate=linear, meets=scores[hi], one_fewer=below, probes=probes,
                    explanation=why)
