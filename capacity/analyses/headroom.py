"""Sustainable load and SLO headroom of a configuration, by search on the rate scale.

Two questions, one search (capacity/analyses/search.py) each:
- *sustainable load*: the largest multiple of the trace's rate at which the engine keeps up
  (capacity/analyses/stability.py) — asked of an overloaded baseline;
- *headroom*: the largest multiple at which the engine keeps up, meets the SLOs (fleet P99 TTFT
  and TBT) and stays within the preemption budget — asked of the recommended configuration. The
  same search, on the same configuration, gives the same number in the report, `kvcap headroom`,
  `kvcap tune` (the margin of each candidate) and the notebooks.
Each probe is one replay of the trace with its arrival times divided by the scale (and, for the
flash-crowd search, of the trace with one window's traffic multiplied instead). Replicas for a
target peak = ceil(target / headroom).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Hashable

import polars as pl

from capacity.analyses.planner import Planner
from capacity.analyses.search import PRECISION, ScaleSearch, run_searches
from capacity.analyses.stability import stability
from capacity.analyses.sweep import Job
from capacity.analyses.criteria import Budget, evaluate
from replay.config import EngineConfig
from traces.transforms import overlay_surge, scale_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPoint:
    rate_scale: float
    surge: bool
    run_id: str
    requests: int
    offered_rps: float
    served_rps: float
    sustainable: bool
    throughput_rps: float
    goodput_rps: float
    slo_share: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    preemptions: int
    verdict: str
    meets_slo: bool
    within_budget: bool
    ok: bool                 # sustainable, SLOs met, preemption within budget, completed
    breaks: str


def load_point(tables: dict[str, pl.DataFrame], *, rate_scale: float, surge: bool,
               slo_ttft_p99_s: float, slo_tbt_p99_s: float, budget: Budget) -> LoadPoint:
    st = stability(tables)
    c = evaluate(tables, slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s, budget=budget)
    return LoadPoint(rate_scale=rate_scale, surge=surge, run_id=c.run_id, requests=st.requests,
                     offered_rps=st.offered_rps, served_rps=st.served_rps,
                     sustainable=st.sustainable, throughput_rps=c.throughput_rps,
                     goodput_rps=c.goodput_rps, slo_share=c.slo_share, ttft_p99_s=c.ttft_p99_s,
                     tbt_p99_s=c.tbt_p99_s, preemptions=c.preemptions,
                     verdict=c.preemption_verdict, meets_slo=c.meets_slo,
                     within_budget=c.within_budget, ok=st.sustainable and c.feasible,
                     breaks=c.breaks)     # says "overloaded (serves X of Y req/s)" too


def surge_window(trace: pl.DataFrame, start_s: float | None = None,
                 duration_s: float = 300.0) -> tuple[float, float]:
    """The flash crowd's window: `start_s`, by default half the trace's span; or, where no request
    arrives in the default window (a sparse trace: found off the corpus, Azure code slowed to
    ×0.1 had none there, and the surge had nothing to copy), from the next arrival after it."""
    span = float(trace["arrival_s"].max() or 0.0)

    def window(start: float) -> tuple[float, float]:
        return start, min(duration_s, max(span - start, 1.0))
    if start_s is not None:
        return window(start_s)
    start, duration = window(span / 2)
    arrivals = trace["arrival_s"]
    if not ((arrivals >= start) & (arrivals < start + duration)).any():
        return window(float(arrivals.filter(arrivals >= start).min()))
    return start, duration


def _load(trace: pl.DataFrame, scale: float, surge: tuple[float, float] | None) -> pl.DataFrame:
    if scale == 1.0:
        return trace
    if surge is None:
        return scale_rate(trace, scale)
    return overlay_surge(trace, start_s=surge[0], duration_s=surge[1], extra_factor=scale - 1.0)


def search_loads(trace: pl.DataFrame, configs: dict[Hashable, EngineConfig], planner: Planner, *,
                 passes: Callable[[LoadPoint], bool], slo_ttft_p99_s: float, slo_tbt_p99_s: float,
                 budget: Budget, precision: float = PRECISION, surge: tuple[float, float] | None = None,
                 guesses: dict | None = None, label: str = "load",
                 ) -> dict[Hashable, tuple[ScaleSearch, tuple[LoadPoint, ...]]]:
    """One search per config, in lock-step (each round's replays run in parallel)."""
    points: dict[Hashable, list[LoadPoint]] = {k: [] for k in configs}

    def evaluate_round(todo):
        jobs = [Job(trace=_load(trace, s, surge), config=configs[k],
                    label=f"{label} {'flash crowd ' if surge else ''}x{s:g}",
                    trace_name=planner.trace_name) for k, s in todo]
        # Each probe is reduced to its LoadPoint where it was replayed: no tables kept.
        reducers = [point_reducer(s, surge is not None, slo_ttft_p99_s, slo_tbt_p99_s, budget)
                    for _, s in todo]
        out = []
        for (k, s), p in zip(todo, planner.map_shared(jobs, reducers)):
            points[k].append(p)
            out.append(passes(p))
        return out

    found = run_searches(list(configs), evaluate_round, precision=precision,
                         guesses=guesses)
    return {k: (found[k], tuple(sorted(points[k], key=lambda p: p.rate_scale))) for k in configs}


def probe(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *, rate_scale: float,
          slo_ttft_p99_s: float, slo_tbt_p99_s: float, budget: Budget,
          label: str = "load") -> LoadPoint:
    """One load point: the trace at `rate_scale` under `config` (the same replay a search's
    probe at that scale is, so it is shared through the planner's memo)."""
    job = Job(trace=_load(trace, rate_scale, None), config=config,
              label=f"{label} x{rate_scale:g}", trace_name=planner.trace_name)
    return planner.map([job], point_reducer(rate_scale, False, slo_ttft_p99_s, slo_tbt_p99_s,
                                             budget))[0]


def point_reducer(rate_scale: float, surge: bool, slo_ttft_p99_s: float, slo_tbt_p99_s: float,
                  budget: Budget):
    """The question a load search asks of its probe at `rate_scale` (the plan asks the ×1
    probe's of its earlier replays up front: capacity/analyses/plan.py)."""
    from capacity.analyses.planner import SCORE_SPEC, reducer
    return reducer(load_point, spec=SCORE_SPEC, rate_scale=rate_scale, surge=surge,
                   slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget)


def ok(p: LoadPoint) -> bool:
    return p.ok


def keeps_up(p: LoadPoint) -> bool:
    return p.sustainable


@dataclass(frozen=True, slots=True, kw_only=True)
class Headroom:
    rate: ScaleSearch                  # headroom_rate_scale = rate.scale
    surge: ScaleSearch | None          # the largest multiple of one window's traffic
    surge_window_s: tuple[float, float] | None
    points: tuple[LoadPoint, ...]
    target_peak_scale: float | None
    replicas_needed: int | None
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    explanation: str

    @property
    def headroom_rate_scale(self) -> float | None:
        return self.rate.scale

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dataclasses.asdict(p) for p in self.points])

    def as_dict(self) -> dict:
        return {"headroom_rate_scale": self.rate.scale, "precision": self.rate.precision,
                "fails_at_rate_scale": self.rate.failed_at,
                "surge_scale": self.surge.scale if self.surge else None,
                "surge_window_s": list(self.surge_window_s) if self.surge_window_s else None,
                "target_peak_scale": self.target_peak_scale,
                "replicas_needed": self.replicas_needed, "explanation": self.explanation,
                "search": self.rate.as_dict(),
                "points": [dataclasses.asdict(p) for p in self.points]}


def headroom(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *, slo_ttft_p99_s: float,
             slo_tbt_p99_s: float, budget: Budget = Budget(), precision: float = PRECISION,
             surge: bool = True, surge_start_s: float | None = None, surge_duration_s: float = 300.0,
             target_peak_scale: float | None = None) -> Headroom:
    kw = dict(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget,
              precision=precision, label="headroom")
    rate, pts = search_loads(trace, {"c": config}, planner, passes=ok, **kw)["c"]
    window = surge_window(trace, surge_start_s, surge_duration_s) if surge else None
    srch = None
    if window is not None and rate.scale is not None and rate.scale >= 1.0:
        srch, spts = search_loads(trace, {"c": config}, planner, passes=ok, surge=window, **kw)["c"]
        pts = pts + spts
    replicas = None
    if target_peak_scale is not None and rate.scale:
        replicas = max(1, math.ceil(target_peak_scale / rate.scale - 1e-9))
    if rate.scale is None:
        why = "even a fraction of today's traffic misses the SLOs or the preemption budget"
    elif rate.scale < 1.0:
        why = (f"today's traffic already misses the SLOs or the budget; it fits up to "
               f"{rate.words()} of it")
    else:
        first_fail = next((p for p in pts if not p.surge and p.rate_scale == rate.failed_at), None)
        why = (f"this configuration absorbs {rate.words()} today's traffic within the SLOs and "
               f"the preemption budget"
               + (f"; beyond it: {first_fail.breaks}" if first_fail and first_fail.breaks else ""))
    if srch is not None:
        why += (f"; a flash crowd of {window[1]:,.0f} s at t = {window[0]:,.0f} s is absorbed up to "
                f"{srch.words()} that window's traffic")
    if replicas is not None:
        why += f"; a peak of ×{target_peak_scale:g} needs {replicas} replicas"
    return Headroom(rate=rate, surge=srch, surge_window_s=window, points=pts,
                    target_peak_scale=target_peak_scale, replicas_needed=replicas,
                    slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, explanation=why)


def sustainable_load(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
                     served_share: float | None = None, precision: float = PRECISION,
                     slo_ttft_p99_s: float = math.inf, slo_tbt_p99_s: float = math.inf,
                     budget: Budget = Budget(peak_only=False),
                     ) -> tuple[ScaleSearch, tuple[LoadPoint, ...]]:
    """The largest rate scale at which `config` keeps up. `served_share` (served / offered rate
    of the baseline) is the first guess below 1: an overloaded engine serves at its capacity.
    Whether it keeps up does not depend on the SLOs and the budget; they score the points (a
    capacity search with the same ones reuses these replays)."""
    guesses = {"c": served_share} if served_share else None
    return search_loads(trace, {"c": config}, planner, passes=keeps_up,
                        slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s,
                        budget=budget, precision=precision, guesses=guesses,
                        label="sustainable load")["c"]
