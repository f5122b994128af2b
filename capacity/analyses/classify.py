"""Is a run's preemption none, peak-only or structural? And the alert rule that tells them apart.

Windows are fixed `window_s` bins of simulated time. A window's load is its request arrivals.
- none: no preemption at all.
- structural: preemption in more than `structural_share` of the windows (most of the time).
- peak-only: every window with preemption is among the highest-load windows (load at or above the
  `peak_quantile` of window loads, or adjacent to such a window: queues drain after a burst), and
  after each preemption episode the windowed P99 TBT returns to its baseline (the P99 TBT over
  preemption-free windows, times `recovery_factor`) within `recovery_s`.
- otherwise structural (preemption outside the peaks, or the engine does not recover).

The alert threshold for `increase(vllm:num_preemptions_total[5m])` is taken from a replay of
normal traffic: the largest 5-minute preemption count seen there, plus a margin, so normal peaks
never fire it and a structural gap does. vLLM V0's counter excludes priority-triggered preemptions
(reference D1); the threshold is counted the same way.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import yaml

from capacity.analyses.metrics import nearest_rank
from replay.results.summary import StepSummary


@dataclass(frozen=True, slots=True, kw_only=True)
class Classification:
    verdict: str                       # "none" | "peak-only" | "structural"
    window_s: float
    windows: int
    windows_with_preemption: int
    preempted_windows_share: float
    outside_peak_windows: int          # preempted windows that are not (next to) peak windows
    peak_load_threshold: float         # arrivals per window at the peak quantile
    baseline_tbt_p99_s: float | None
    worst_recovery_s: float | None     # longest time for windowed P99 TBT to return to baseline
    recovery_s: float
    evidence: str
    per_window: pl.DataFrame | None = None


def windows(tables: dict[str, pl.DataFrame], window_s: float) -> pl.DataFrame:
    """Per window: arrivals, preemptions, and P99 of the TBT samples ending in it (approximated
    per window from the steps: decode steps' durations weighted by their decode tokens)."""
    req, ev, steps = tables["requests"], tables["events"], tables["steps"]
    if isinstance(steps, StepSummary):      # a summary replay kept exactly these as it ran
        step_end, p99 = steps.end_s, steps.window_tbt_p99[window_s]
    else:
        # In memory or spilled (a report's own replays): the three columns read, not the table.
        steps = steps.select("start_s", "duration_s", "num_decode_tokens")
        step_end = (steps["start_s"] + steps["duration_s"]).max() if steps.height else None
        tbt = (steps.filter(pl.col("num_decode_tokens") > 0)
               .group_by(w=(pl.col("start_s") // window_s).cast(pl.Int64))
               .agg(pl.col("duration_s"), pl.col("num_decode_tokens")))
        p99 = {w: nearest_rank(d, 0.99, k) for w, d, k in tbt.iter_rows()}
    end = float(max(req["arrival_s"].max() or 0.0, step_end if step_end is not None else 0.0))
    n = max(1, math.ceil(end / window_s))
    base = pl.DataFrame({"w": np.arange(n, dtype=np.int64)})
    arr = req.group_by(w=(pl.col("arrival_s") // window_s).cast(pl.Int64)).agg(arrivals=pl.len())
    pre = (ev.filter(pl.col("kind").str.starts_with("preempt_"))
           .group_by(w=(pl.col("t_s") // window_s).cast(pl.Int64)).agg(preemptions=pl.len()))
    out = (base.join(arr, on="w", how="left").join(pre, on="w", how="left")
           .fill_null(0).with_columns(tbt_p99_s=pl.col("w").replace_strict(p99, default=None,
                                                                           return_dtype=pl.Float64)))
    return out.with_columns(t_s=pl.col("w") * window_s).sort("w")


def classify(tables: dict[str, pl.DataFrame], *, window_s: float = 60.0,
             peak_quantile: float = 0.8, structural_share: float = 0.5,
             recovery_factor: float = 1.5, recovery_s: float = 300.0) -> Classification:
    per = windows(tables, window_s)
    pre = per["preemptions"].to_numpy()
    load = per["arrivals"].to_numpy().astype(float)
    tbt = per["tbt_p99_s"].to_numpy()
    n = len(per)
    hit = pre > 0
    share = float(hit.sum()) / n
    thr = float(np.quantile(load, peak_quantile)) if n else 0.0
    peak = load >= thr
    near_peak = peak | np.r_[False, peak[:-1]] | np.r_[peak[1:], False]
    outside = int((hit & ~near_peak).sum())
    quiet = ~hit & ~np.isnan(tbt)
    baseline = float(np.nanquantile(tbt[quiet], 0.99)) if quiet.any() else None
    worst = None
    if hit.any() and baseline is not None:
        worst = 0.0
        ends = np.flatnonzero(hit & ~np.r_[hit[1:], False])         # last window of each episode
        for e in ends:
            after = np.flatnonzero(~np.isnan(tbt[e + 1:]) & (tbt[e + 1:] <= baseline * recovery_factor))
            rec = (after[0] + 1) * window_s if len(after) else (n - e) * window_s
            worst = max(worst, float(rec))
    common = dict(window_s=window_s, windows=n, windows_with_preemption=int(hit.sum()),
                  preempted_windows_share=share, outside_peak_windows=outside,
                  peak_load_threshold=thr, baseline_tbt_p99_s=baseline, worst_recovery_s=worst,
                  recovery_s=recovery_s, per_window=per)
    if not hit.any():
        return Classification(verdict="none", evidence="no preemption in any window", **common)
    if share > structural_share:
        return Classification(verdict="structural", evidence=(
            f"preemption in {share:.0%} of {window_s:g}-s windows (> {structural_share:.0%}): the "
            f"load does not fit this configuration; add GPUs or rate-limit"), **common)
    recovered = worst is not None and worst <= recovery_s
    if outside == 0 and recovered:
        return Classification(verdict="peak-only", evidence=(
            f"preemption in {int(hit.sum())} of {n} windows, all at or next to the highest-load "
            f"windows (≥ {thr:.0f} arrivals per {window_s:g} s); P99 TBT back within "
            f"{recovery_factor:g}× its baseline {baseline * 1000:.0f} ms at most {worst:.0f} s "
            f"after each episode (limit {recovery_s:.0f} s)"), **common)
    why = (f"{outside} preempted windows are outside the peaks" if outside
           else "no window without preemption has decode steps: no TBT baseline to recover to"
           if worst is None
           else f"P99 TBT takes {worst:.0f} s to recover (limit {recovery_s:.0f} s)")
    return Classification(verdict="structural", evidence=(
        f"preemption in {share:.0%} of windows and {why}"), **common)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRule:
    threshold: int                 # fire when increase(...[5m]) > threshold
    normal_max_5m: int             # the largest 5-minute count in the normal replay
    for_duration: str
    yaml: str


def alert_rule(tables: dict[str, pl.DataFrame], *, margin: float = 0.5, for_duration: str = "10m",
               model_name: str | None = None, include_priority: bool = False) -> AlertRule:
    """Prometheus alerting rules from a replay of normal traffic, written with PyYAML
    (`safe_dump`) so that any model name gives valid YAML."""
    ev = tables["events"].filter(pl.col("kind").str.starts_with("preempt_"))
    t = np.sort(ev["t_s"].to_numpy())
    # Largest count in any 5-minute sliding window (what increase(...[5m]) can show).
    if len(t):
        right = np.searchsorted(t, t + 300.0, "left")
        normal = int((right - np.arange(len(t))).max())
    else:
        normal = 0
    threshold = max(1, math.ceil(normal * (1 + margin)))
    sel = f"{{model_name={promql_string(model_name)}}}" if model_name is not None else ""
    metric = f"vllm:num_preemptions_total{sel}"
    doc = {"groups": [{"name": "kvcap-preemption", "rules": [
        {"alert": "VllmPreemptionStructural",
         "expr": f"increase({metric}[5m]) > {threshold}",
         "for": for_duration,
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "vLLM preempts more than normal peaks do ({{ $value | humanize }} in 5m)",
             "description": (f"A replay of normal traffic (kvcap) peaks at {normal} preemptions "
                             f"per 5 minutes; more than {threshold} for {for_duration} means a "
                             f"structural KV capacity gap: add GPUs, lower --max-num-seqs or "
                             f"rate-limit.")}},
        {"alert": "VllmPreemptionPeak",
         "expr": f"increase({metric}[5m]) > 0",
         "for": "0m",
         "labels": {"severity": "info"},
         "annotations": {
             "summary": "vLLM is preempting (expected at traffic peaks)",
             "description": (f"Preemption at peaks is normal; the structural alert fires above "
                             f"{threshold} per 5 minutes.")}}]}]}
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)
    return AlertRule(threshold=threshold, normal_max_5m=normal, for_duration=for_duration, yaml=text)


def promql_string(value: str) -> str:
    """A PromQL string literal for `value`: double-quoted with Go's escapes (backslash, quote,
    newline, tab, control characters), so that a label value can never end the selector early."""
    return json.dumps(value, ensure_ascii=False)
