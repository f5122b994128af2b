"""Value checks and assembly of the canonical trace (DESIGN §3) from columns read by a loader.

Owns the rules: lengths present, finite, whole and > 0 (and fit Int32); priorities whole; request ids
unique; prefix hashes non-null and >= 0; arrival times non-decreasing. Checks are vectorised polars
expressions; only the first offending row is located, to name its line. Rows are never dropped or
repaired here. Ordering: a format that promises sorted input (Azure, Mooncake, BurstGPT, Vidur,
kvcap) must be sorted, else the first decreasing line is an error; other inputs are sorted by time,
stably (ties keep file order), and the number of rows that moved is returned.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from traces.schema import HASH_BLOCK_TOKENS, SCHEMA
from traces.sources import Source

INT32_MAX = 2**31 - 1


def _first(df: pl.DataFrame, mask: pl.Series) -> int:
    """0-based source row of the first True in mask."""
    return int(df["_row"][int(mask.arg_max())])


def check_whole_numbers(src: Source, df: pl.DataFrame, column: str, *, positive: bool) -> None:
    """Raise on the first null, NaN, infinite, fractional, out-of-range (or <= 0) value."""
    col = df[column].cast(pl.Float64)
    checks = [(col.is_null(), lambda v: "missing value"),
              (col.is_nan(), lambda v: "value is NaN"),
              (col.is_infinite(), lambda v: f"value {v} is infinite"),
              (col != col.floor(), lambda v: f"value {v} is not a whole number of tokens")]
    if positive:
        checks.append((col <= 0, lambda v: f"value {v:g} must be > 0"))
    checks.append((col.abs() > INT32_MAX, lambda v: f"value {v:g} does not fit in 32 bits"))
    for mask, what in checks:
        mask = mask.fill_null(False)
        if mask.any():
            i = int(mask.arg_max())
            raise src.error(int(df["_row"][i]), column, what(col[i]))


def check_order(src: Source, arrival_s: pl.Series, df: pl.DataFrame, column: str,
                *, sorted_input: bool) -> pl.Series | None:
    """None when already sorted; else (only for unsorted formats) the stable sorting permutation."""
    decreasing = (arrival_s.diff() < 0).fill_null(False)
    if not decreasing.any():
        return None
    if sorted_input:
        i = int(decreasing.arg_max())
        raise src.error(int(df["_row"][i]), column,
                        f"timestamp decreases ({df[column][i]} after {df[column][i - 1]}); "
                        "this format is sorted by time, so the file is damaged or not this format")
    return pl.Series(np.argsort(arrival_s.to_numpy(), kind="stable"))


def check_unique_ids(src: Source, df: pl.DataFrame, column: str) -> None:
    ids = df[column]
    if ids.null_count():
        raise src.error(_first(df, ids.is_null()), column, "missing request id")
    dup = ~ids.is_first_distinct()  # the second occurrence is the bad line
    if dup.any():
        raise src.error(_first(df, dup), column, f"request id {ids[int(dup.arg_max())]} is not unique")


def check_hashes(src: Source, df: pl.DataFrame, column: str) -> None:
    lists = df[column]
    bad = lists.list.eval(pl.element().is_null()).list.any().fill_null(False)
    if bad.any():
        raise src.error(_first(df, bad), column, "null inside the list of prefix hashes")


def granularity(src: Source, df: pl.DataFrame) -> pl.Expr:
    """kvcap Parquet's `hash_block_tokens` column: one whole number >= 1 in every row."""
    col = df[HASH_BLOCK_TOKENS]
    bad = (col.is_null() | (col < 1) | (col != col[0])).fill_null(True)
    if bad.any():
        raise src.error(_first(df, bad), HASH_BLOCK_TOKENS,
                        f"value {col[int(bad.arg_max())]} is not the trace's one number of tokens "
                        "per prefix hash (a whole number >= 1)")
    return pl.lit(int(col[0]), pl.Int32).alias(HASH_BLOCK_TOKENS)


def assemble(df: pl.DataFrame, arrival_s: pl.Series, present: dict[str, str]) -> pl.DataFrame:
    """The canonical frame (exact column order and dtypes) from checked source columns."""
    def pick(field: str, default: pl.Expr) -> pl.Expr:
        col = present.get(field)
        return (pl.col(col) if col is not None else default).cast(SCHEMA[field]).alias(field)

    return df.with_columns(arrival_s.alias("__arrival")).select(
        pick("request_id", pl.col("_row")),
        pl.col("__arrival").cast(pl.Float64).alias("arrival_s"),
        pick("prompt_tokens", pl.lit(None)),
        pick("output_tokens", pl.lit(None)),
        pick("priority", pl.lit(0)),
        pick("tenant", pl.lit(None)),
        pick("prefix_hashes", pl.lit(None)),
    )
