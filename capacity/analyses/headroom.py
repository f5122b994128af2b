"""Surge headroom: how much more traffic fits before preemption becomes structural.

The trace is replayed at increasing `--rate-scale` factors (and once with a flash-crowd overlay:
the traffic of a window doubled within it), each classified (capacity/classify.py) and checked
against the SLOs. The headroom is the largest factor that stays within the SLOs with preemption
none or peak-only; replicas for a target peak = ceil(target factor / headroom).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import polars as pl

from capacity.analyses.classify import classify
from capacity.analyses.sweep import Job, run_jobs
from capacity.analyses.tuning import Budget, evaluate
from replay.config import EngineConfig
from traces.transforms import overlay_surge, scale_rate

DEFAULT_SCALES = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPoint:
    label: str
    rate_scale: float
    surge: bool
    run_id: str
    requests: int
    throughput_rps: float
    preemptions_per_min: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    verdict: str
    meets_slo: bool
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Headroom:
    points: tuple[LoadPoint, ...]
    max_ok_scale: float | None
    target_peak_scale: float | None
    replicas_needed: int | None
    explanation: str

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dataclasses.asdict(p) for p in self.points])

    def as_dict(self) -> dict:
        return {"max_ok_scale": self.max_ok_scale, "target_peak_scale": self.target_peak_scale,
                "replicas_needed": self.replicas_needed, "explanation": self.explanation,
                "points": [dataclasses.asdict(p) for p in self.points]}


def headroom(trace: pl.DataFrame, config: EngineConfig, *, slo_ttft_p99_s: float,
             slo_tbt_p99_s: float, scales: tuple[float, ...] = DEFAULT_SCALES,
             surge_start_s: float | None = None, surge_duration_s: float = 300.0,
             target_peak_scale: float | None = None, workers: int | None = None,
             keep_runs: list | None = None, on_done=None, memo: dict | None = None) -> Headroom:
    traces, labels, meta = [], [], []
    for s in scales:
        traces.append(scale_rate(trace, s) if s != 1.0 else trace)
        labels.append(f"headroom x{s:g}")
        meta.append((s, False))
    span = float(trace["arrival_s"].max() or 0.0)
    if span > 0:
        start = surge_start_s if surge_start_s is not None else span / 2
        dur = min(surge_duration_s, max(span - start, 1.0))
        traces.append(overlay_surge(trace, start_s=start, duration_s=dur, extra_factor=1.0))
        labels.append(f"headroom flash crowd at {start:.0f} s")
        meta.append((1.0, True))
    runs = run_jobs([Job(trace=tr, config=config, label=label) for tr, label in zip(traces, labels)],
                    workers=workers, on_done=on_done, memo=memo)
    if keep_runs is not None:
        keep_runs.extend(runs)
    budget = Budget(peak_only=False)   # judged by the classification below
    points = []
    for (scale, surge), label, r in zip(meta, labels, runs):
        tables = r.tables()
        c = evaluate(tables, slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s, budget=budget)
        verdict = classify(tables).verdict
        points.append(LoadPoint(label=label, rate_scale=scale, surge=surge, run_id=r.run_id,
                                requests=tables["requests"].height,
                                throughput_rps=c.throughput_rps,
                                preemptions_per_min=c.preemptions_per_min,
                                ttft_p99_s=c.ttft_p99_s, tbt_p99_s=c.tbt_p99_s, verdict=verdict,
                                meets_slo=c.meets_slo,
                                ok=c.meets_slo and verdict in ("none", "peak-only")))
    steady = [p for p in points if not p.surge]
    ok_scales = [p.rate_scale for p in sorted(steady, key=lambda p: p.rate_scale)
                 if p.ok]
    # Headroom = the largest factor below the first failure (not a lucky point above it).
    max_ok = None
    for p in sorted(steady, key=lambda p: p.rate_scale):
        if not p.ok:
            break
        max_ok = p.rate_scale
    replicas = None
    if target_peak_scale is not None and max_ok:
        replicas = max(1, math.ceil(target_peak_scale / max_ok - 1e-9))
    if max_ok is None:
        why = ("even today's traffic breaks the SLOs or preempts structurally: add capacity first"
               if ok_scales == [] else "the first scale already fails")
    else:
        fails = [p for p in sorted(steady, key=lambda p: p.rate_scale) if p.rate_scale > max_ok]
        nxt = (f"; at x{fails[0].rate_scale:g} preemption is {fails[0].verdict}"
               f"{'' if fails[0].meets_slo else ' and the SLOs break'}" if fails else "")
        why = f"this deployment absorbs x{max_ok:g} today's traffic within the SLOs{nxt}"
    surge_pts = [p for p in points if p.surge]
    if surge_pts:
        sp = surge_pts[0]
        why += (f"; a flash crowd (traffic doubled for a window) "
                f"{'stays within' if sp.ok else 'breaks'} the SLOs ({sp.verdict} preemption)")
    if replicas is not None:
        why += f"; a peak of x{target_peak_scale:g} needs {replicas} replicas"
    return Headroom(points=tuple(points), max_ok_scale=max_ok, target_peak_scale=target_peak_scale,
                    replicas_needed=replicas, explanation=why)

