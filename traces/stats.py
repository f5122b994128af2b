"""`trace_info`: the statistics `kvcap trace info` prints (definitions as in ../shared/traces/README.md).

- Percentiles: nearest rank, the value at 1-based rank ceil(p/100 * n) of the sorted values.
- Minute bins: floor((t - t_first) / 60 s), aligned to the first request; `mean_rpm` is requests per
  bin over all bins up to the last request (so a 57.3-minute trace has 58 bins); `peak_rps` uses
  1-second bins the same way. `mean_rps` is requests / duration_s.
- `peak_60s`: the most requests in any window [t, t + 60 s) that starts at a request.
- Prefix reuse (rows with `prefix_hashes`): a block reference is "seen" when an earlier request
  referenced the same hash; the covered prefix of a request is its leading run of seen blocks, each
  worth `hash_block_tokens` prompt tokens (the last block only what remains of the prompt).
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from traces.schema import has_prefix_hashes, hash_block_tokens

PERCENTILES = (50, 90, 99)


def nearest_rank(sorted_values: np.ndarray, p: int) -> float:
    """Nearest-rank percentile of already sorted values (integer arithmetic for the rank)."""
    n = len(sorted_values)
    rank = max(1, -(-p * n // 100))
    return sorted_values[rank - 1].item()


def length_summary(values: np.ndarray) -> dict[str, float]:
    s = np.sort(values)
    out = {"mean": float(s.mean())}
    out.update({f"p{p}": nearest_rank(s, p) for p in PERCENTILES})
    out.update({"max": s[-1].item(), "min": s[0].item()})
    return out


def trace_info(df: pl.DataFrame) -> dict:
    """Summary of a canonical trace as a JSON-ready dict (keys of DESIGN §7 and more)."""
    n = len(df)
    if n == 0:
        return {"requests": 0}
    t = df["arrival_s"].to_numpy()
    t = t - t[0]
    prompt = df["prompt_tokens"].to_numpy().astype(np.int64)
    output = df["output_tokens"].to_numpy().astype(np.int64)
    duration_s = float(t[-1])
    minute = np.floor(t / 60.0).astype(np.int64)
    # Bins that hold requests only (a far-future timestamp must not size an array by the span).
    minutes, per_min = np.unique(minute, return_counts=True)
    tokens_per_min = _sum_by_bin(minute, minutes, prompt + output)
    per_s = np.unique(np.floor(t).astype(np.int64), return_counts=True)[1]
    num_minutes = int(minute[-1]) + 1  # every minute up to the last request, empty ones included
    window_ends = np.searchsorted(t, t + 60.0, side="left")
    info = {
        "requests": n,
        "duration_s": duration_s,
        "mean_rps": n / duration_s if duration_s > 0 else None,
        "mean_rpm": n / num_minutes,
        "peak_rpm": int(per_min.max()),
        "peak_rpm_minute": int(minutes[per_min.argmax()]),
        "peak_60s": int((window_ends - np.arange(n)).max()),
        "peak_rps": int(per_s.max()),
        "peak_tokens_per_min": int(tokens_per_min.max()),
        "peak_tokens_minute": int(minutes[tokens_per_min.argmax()]),
        "prompt_tokens": length_summary(prompt),
        "output_tokens": length_summary(output),
        "priorities": _counts(df, "priority"),
        "tenants": _counts(df, "tenant"),
        "prefix": prefix_reuse(df),
    }
    return info


def _sum_by_bin(bins: np.ndarray, unique_bins: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Sum of `weights` per entry of `unique_bins` (bins sorted, as arrival times are)."""
    idx = np.searchsorted(unique_bins, bins)
    return np.bincount(idx, weights=weights, minlength=len(unique_bins))


def _counts(df: pl.DataFrame, column: str) -> dict[str, int]:
    counts = df[column].drop_nulls().value_counts(sort=True)
    return {str(k): int(v) for k, v in counts.iter_rows()}


def prefix_reuse(df: pl.DataFrame) -> dict | None:
    """Block references, unique blocks, % references seen earlier, % prompt tokens in a seen prefix
    (each hash standing for the trace's `hash_block_tokens` tokens)."""
    if not has_prefix_hashes(df):
        return None
    hbt = hash_block_tokens(df)
    blocks = (df.select(pl.int_range(pl.len()).alias("row"), "prompt_tokens", "prefix_hashes")
              .explode("prefix_hashes").drop_nulls("prefix_hashes")
              .with_columns(pos=pl.int_range(pl.len()).over("row"))
              # seen: the first request that used this hash came strictly before this one
              .with_columns(seen=(pl.col("row").min().over("prefix_hashes") < pl.col("row")))
              .with_columns(lead=pl.col("seen").cast(pl.Int8).cum_min().over("row")))
    block_tokens = pl.min_horizontal(pl.lit(hbt, pl.Int64),
                                     pl.col("prompt_tokens").cast(pl.Int64) - pl.col("pos") * hbt)
    agg = blocks.select(refs=pl.len(), unique=pl.col("prefix_hashes").n_unique(),
                        seen=pl.col("seen").sum(),
                        covered=(block_tokens.clip(lower_bound=0) * pl.col("lead")).sum()).row(0, named=True)
    rows_with = df.filter(pl.col("prefix_hashes").is_not_null())
    total_prompt = int(rows_with["prompt_tokens"].cast(pl.Int64).sum())
    return {
        "hash_block_tokens": hbt,
        "requests_with_hashes": len(rows_with),
        "block_refs": int(agg["refs"]),
        "unique_blocks": int(agg["unique"]),
        "refs_seen_pct": 100.0 * agg["seen"] / agg["refs"] if agg["refs"] else 0.0,
        "prefix_covered_pct": 100.0 * int(agg["covered"]) / total_prompt if total_prompt else 0.0,
    }
