"""Prometheus samples (promparse.SAMPLE_SCHEMA) -> values per fixed window (`prom_windows`).

Windows are `[k * window_s, (k + 1) * window_s)` on the epoch clock, per series (source file, server,
metric, labels). A sample's increase is counted in the window it falls in:
- counters: increase since the previous sample of the series; a decrease is a reset (the process
  restarted), after which the counter counted up from 0, so the increase is the new value (as
  Prometheus' `increase()`). Stats `increase` and `rate_per_s` (= increase / the seconds it covers).
  A window holding only a series' first sample has no increase (NULL), not 0.
What a window's values cover is exact: `from_s` .. `to_s` (epoch seconds), from the sample before
its first one (counters, histograms; gauges: its first sample) to its last sample. Scrapes at
aligned times cover the interval before the window start: comparisons use from_s / to_s.
- gauges: `mean`, `max`, `last` of the samples in the window.
- histograms: bucket increases (resets as for counters) -> `p50`, `p90`, `p99` by Prometheus'
  `histogram_quantile` (linear inside the bucket; the +Inf bucket answers the highest finite bound),
  `count` (observations in the window) and `mean` (increase of _sum / increase of _count).
Per window and series, not per request: no Python loop over samples.
Must not import duckdb, altair or replay.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl

WINDOW_SCHEMA = {
    "source_file": pl.Utf8, "server": pl.Utf8, "metric": pl.Utf8, "type": pl.Utf8, "labels": pl.Utf8,
    "engine": pl.Utf8, "model_name": pl.Utf8, "window_start": pl.Datetime("us"), "window_start_s": pl.Float64,
    "window_s": pl.Float64, "from_s": pl.Float64, "to_s": pl.Float64, "stat": pl.Utf8, "value": pl.Float64,
    "samples": pl.Int64,
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
SERIES = ["source_file", "server", "metric", "labels"]
_META = ["type", "engine", "model_name"]


def with_increments(df: pl.DataFrame) -> pl.DataFrame:
    """`inc`: increase since the previous sample of the same series (reset -> the new value)."""
    key = [*SERIES, "part", "le"]
    d = pl.col("value").diff().over(key)
    return df.sort([*key, "epoch_s"], nulls_last=True).with_columns(
        inc=pl.when(d < 0).then(pl.col("value")).otherwise(d), prev_s=pl.col("epoch_s").shift(1).over(key))


def windows(samples: pl.DataFrame, window_s: float) -> pl.DataFrame:
    if not window_s > 0:
        raise ValueError(f"window_s: must be > 0 seconds, got {window_s!r}")
    if samples.height == 0:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    df = with_increments(samples).with_columns(
        window_start_s=(pl.col("epoch_s") / window_s).floor() * window_s)
    w = [*SERIES, *_META, "window_start_s"]
    parts = []
    counters = df.filter(pl.col("type") == "counter")
    if counters.height:
        c = counters.group_by(w).agg(
            increase=pl.when(pl.col("inc").is_not_null().any()).then(pl.col("inc").sum()),
            samples=pl.len(), from_s=pl.col("prev_s").min(), to_s=pl.col("epoch_s").max())
        parts.append(c.unpivot(index=[*w, "samples", "from_s", "to_s"], on=["increase"], variable_name="stat"))
        parts.append(c.select(*w, "samples", "from_s", "to_s", stat=pl.lit("rate_per_s"),
                              value=pl.col("increase") / (pl.col("to_s") - pl.col("from_s"))))
    gauges = df.filter(pl.col("type") == "gauge")
    if gauges.height:
        g = gauges.sort("epoch_s").group_by(w).agg(
            mean=pl.col("value").mean(), max=pl.col("value").max(), last=pl.col("value").last(), samples=pl.len(),
            from_s=pl.col("epoch_s").min(), to_s=pl.col("epoch_s").max())
        parts.append(g.unpivot(index=[*w, "samples", "from_s", "to_s"], on=["mean", "max", "last"],
                               variable_name="stat"))
    hist = df.filter(pl.col("type") == "histogram")
    if hist.height:
        parts.append(_histogram_windows(hist, w))
    out = pl.concat([p.select(*w, pl.col("samples").cast(pl.Int64), pl.col("from_s").cast(pl.Float64),
                              pl.col("to_s").cast(pl.Float64), "stat", pl.col("value").cast(pl.Float64))
                     for p in parts])
    out = out.with_columns(window_s=pl.lit(float(window_s)),
                           window_start=(pl.col("window_start_s") * 1e6).cast(pl.Int64).cast(pl.Datetime("us")))
    return out.select([pl.col(c).cast(t) for c, t in WINDOW_SCHEMA.items()]).sort(
        "source_file", "server", "metric", "labels", "window_start_s", "stat")


def _histogram_windows(hist: pl.DataFrame, w: list[str]) -> pl.DataFrame:
    buckets = (hist.filter(pl.col("part") == "bucket").group_by([*w, "le"])
               .agg(inc=pl.col("inc").sum(), any_inc=pl.col("inc").is_not_null().any(), n=pl.len(),
                    from_s=pl.col("prev_s").min(), to_s=pl.col("epoch_s").max())
               .filter(pl.col("any_inc")).sort("le")
               .group_by(w).agg(pl.col("le"), pl.col("inc"), n=pl.col("n").max(), from_s=pl.col("from_s").min(),
                                to_s=pl.col("to_s").max()))
    rows = []
    for r in buckets.iter_rows(named=True):
        for stat, q in QUANTILES.items():
            rows.append({**{k: r[k] for k in w}, "stat": stat, "value": histogram_quantile(q, r["le"], r["inc"]),
                         "samples": r["n"], "from_s": r["from_s"], "to_s": r["to_s"]})
    q = pl.DataFrame(rows, schema={**{k: hist.schema.get(k, pl.Float64) for k in w}, "stat": pl.Utf8,
                                   "value": pl.Float64, "samples": pl.Int64, "from_s": pl.Float64,
                                   "to_s": pl.Float64}) if rows else None
    sc = (hist.filter(pl.col("part").is_in(["sum", "count"])).group_by([*w, "part"])
          .agg(inc=pl.when(pl.col("inc").is_not_null().any()).then(pl.col("inc").sum()), samples=pl.len(),
               from_s=pl.col("prev_s").min(), to_s=pl.col("epoch_s").max())
          .pivot(on="part", index=w, values=["inc", "samples", "from_s", "to_s"]))
    out = [] if q is None else [q]
    if sc.height and "inc_count" in sc.columns:
        mean = (pl.when(pl.col("inc_count") > 0).then(pl.col("inc_sum") / pl.col("inc_count"))
                if "inc_sum" in sc.columns else pl.lit(None, dtype=pl.Float64))
        span = dict(samples=pl.col("samples_count"), from_s=pl.col("from_s_count"), to_s=pl.col("to_s_count"))
        out.append(sc.select(*w, stat=pl.lit("count"), value=pl.col("inc_count"), **span))
        out.append(sc.select(*w, stat=pl.lit("mean"), value=mean, **span))
    return pl.concat([o.select(*w, "stat", pl.col("value").cast(pl.Float64), pl.col("samples").cast(pl.Int64),
                               pl.col("from_s").cast(pl.Float64), pl.col("to_s").cast(pl.Float64)) for o in out])


def histogram_quantile(q: float, le: list[float], counts: list[float]) -> float | None:
    """Prometheus' histogram_quantile over one window: `le` sorted bucket bounds (+Inf last),
    `counts` cumulative increases. None when the window saw no observation."""
    le_a, c = np.asarray(le, dtype=np.float64), np.maximum.accumulate(np.asarray(counts, dtype=np.float64))
    if len(c) == 0 or not math.isinf(le_a[-1]) or c[-1] <= 0:
        return None
    rank = q * c[-1]
    i = int(np.searchsorted(c, rank, side="left"))
    if i >= len(le_a) - 1:                    # in the +Inf bucket: the highest finite bound
        return float(le_a[-2]) if len(le_a) > 1 else None
    lower = 0.0 if i == 0 else float(le_a[i - 1])
    below = 0.0 if i == 0 else float(c[i - 1])
    inside = float(c[i]) - below
    if i == 0 and le_a[0] <= 0:
        return float(le_a[0])
    return lower + (float(le_a[i]) - lower) * ((rank - below) / inside if inside > 0 else 1.0)
