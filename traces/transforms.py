"""Trace transforms: rate scale, time window, surge overlay, priority / tenant mapping.

Each takes a canonical trace and returns a new one (inputs are never modified); every result is
again canonical: sorted by arrival (stable), arrival_s from its first request, unique request ids.
Random transforms take a seed and are deterministic. Must not import replay/ or capacity/.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from traces.schema import SCHEMA, TraceError


def _rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def scale_rate(df: pl.DataFrame, factor: float) -> pl.DataFrame:
    """factor x the request rate: times divided by factor (2.0 = same requests in half the time)."""
    if not (factor > 0 and np.isfinite(factor)):
        raise TraceError(f"rate scale factor must be a finite number > 0 (2 = twice the rate), "
                         f"got {factor}")
    return df.with_columns(pl.col("arrival_s") / factor)


def time_window(df: pl.DataFrame, start_s: float, end_s: float | None = None) -> pl.DataFrame:
    """Requests with start_s <= arrival_s < end_s, times made relative to the window's first request."""
    if not np.isfinite(start_s) or (end_s is not None and np.isnan(end_s)):
        raise TraceError(f"time window: start {start_s} / end {end_s} s must be numbers")
    out = df.filter((pl.col("arrival_s") >= start_s)
                    & (pl.col("arrival_s") < (end_s if end_s is not None else float("inf"))))
    if len(out) == 0:
        raise TraceError(f"no requests in the window [{start_s}, {end_s}) s")
    return out.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())


def overlay_surge(df: pl.DataFrame, *, start_s: float, duration_s: float, extra_factor: float = 1.0,
                  seed: int = 0, tenant: str | None = None) -> pl.DataFrame:
    """Add extra_factor x (requests in the window) extra requests, uniformly in [start_s, start_s +
    duration_s); their lengths, priority, tenant and prefix hashes are copied from requests of the
    same window drawn with replacement (extra_factor 1.0 doubles the traffic there). New ids follow
    the largest existing id; at equal times original requests come first. `tenant` relabels the
    extra requests (e.g. "surge") when given."""
    if not all(np.isfinite(v) for v in (start_s, duration_s, extra_factor)) or extra_factor > 1e3:
        raise TraceError(f"surge: start {start_s} s, duration {duration_s} s and factor "
                         f"{extra_factor} must be finite numbers (factor at most 1000)")
    end_s = start_s + duration_s
    window = df.filter((pl.col("arrival_s") >= start_s) & (pl.col("arrival_s") < end_s))
    if len(window) == 0 or duration_s <= 0 or extra_factor < 0:
        raise TraceError(f"surge window [{start_s}, {end_s}) s holds no requests to sample from")
    rng = _rng(seed)
    n_extra = int(round(extra_factor * len(window)))
    picks = window[rng.integers(0, len(window), n_extra)]
    times = np.sort(rng.uniform(start_s, end_s, n_extra))
    first_id = int(df["request_id"].max()) + 1
    extra = picks.with_columns(arrival_s=pl.Series(times),
                               request_id=pl.int_range(first_id, first_id + n_extra, dtype=pl.Int64))
    if tenant is not None:
        extra = extra.with_columns(tenant=pl.lit(tenant, dtype=pl.Utf8))
    out = pl.concat([df, extra.select(df.columns)]).sort("arrival_s", maintain_order=True)
    return out.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())


def priority_from_column(df: pl.DataFrame, column: str, mapping: Mapping[object, int],
                         default: int = 0) -> pl.DataFrame:
    """priority = mapping[value of column] (e.g. {"batch": 1} on tenant), default for others."""
    if column not in df.columns:
        raise TraceError(f"column {column!r} not in the trace; columns: {', '.join(df.columns)}")
    expr = pl.col(column).replace_strict(dict(mapping), default=default, return_dtype=pl.Int32)
    return df.with_columns(priority=expr)


def priority_by_length(df: pl.DataFrame, *, prompt_tokens_at_least: Sequence[int],
                       priorities: Sequence[int], tenants: Sequence[str] | None = None) -> pl.DataFrame:
    """Length classes: class k holds prompts with thresholds[k-1] <= prompt < thresholds[k] (class 0
    below the first threshold); class k gets priorities[k] (and tenants[k] when given)."""
    bounds = list(prompt_tokens_at_least)
    if len(priorities) != len(bounds) + 1 or (tenants is not None and len(tenants) != len(priorities)):
        raise TraceError("give one priority (and tenant) per length class: len(thresholds) + 1")
    if bounds != sorted(bounds):
        raise TraceError(f"length thresholds must increase, got {bounds}")
    cls = np.searchsorted(np.asarray(bounds), df["prompt_tokens"].to_numpy(), side="right")
    out = df.with_columns(priority=pl.Series(np.asarray(priorities, np.int32)[cls]))
    if tenants is not None:
        out = out.with_columns(tenant=pl.Series(np.asarray(tenants, dtype=object)[cls], dtype=pl.Utf8))
    return out


def priority_random_share(df: pl.DataFrame, *, share: float, priority: int = 1,
                          tenant: str | None = None, seed: int = 0) -> pl.DataFrame:
    """A seeded random `share` of requests (exactly round(share x n)) gets `priority` (and `tenant`)."""
    if not 0.0 <= share <= 1.0:
        raise TraceError(f"share must be in [0, 1], got {share}")
    n = len(df)
    chosen = np.zeros(n, bool)
    chosen[_rng(seed).choice(n, int(round(share * n)), replace=False)] = True
    mask = pl.Series(chosen)
    out = df.with_columns(priority=pl.when(mask).then(pl.lit(priority, pl.Int32)).otherwise(pl.col("priority")))
    if tenant is not None:
        out = out.with_columns(tenant=pl.when(mask).then(pl.lit(tenant, pl.Utf8)).otherwise(pl.col("tenant")))
    return out.cast(SCHEMA)


def jitter_arrivals(df: pl.DataFrame, *, seed: int, fraction: float = 0.5) -> pl.DataFrame:
    """The same requests with each arrival moved by a uniform offset of at most `fraction` of the
    mean inter-arrival gap (then re-sorted, stable): another sample of the same traffic, used to
    measure how much a metric moves for reasons no configuration causes (capacity's noise)."""
    if not 0 <= fraction <= 10:
        raise TraceError(f"jitter fraction must be in [0, 10], got {fraction}")
    n = len(df)
    if n < 2:
        return df
    t = df["arrival_s"].to_numpy()
    gap = float(t[-1] - t[0]) / (n - 1)
    moved = np.maximum(t + _rng(seed).uniform(-fraction * gap, fraction * gap, n), 0.0)
    out = df.with_columns(pl.Series("arrival_s", moved)).sort("arrival_s", maintain_order=True)
    return out.with_columns(pl.col("arrival_s") - pl.col("arrival_s").first())
