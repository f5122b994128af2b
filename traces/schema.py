"""The canonical trace: one polars DataFrame, one row per request (DESIGN §3).

Owns the column names and dtypes every loader produces and every consumer reads.
Must not import replay/ or capacity/.
"""
from __future__ import annotations

import polars as pl

SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64(),
    "arrival_s": pl.Float64(),
    "prompt_tokens": pl.Int32(),
    "output_tokens": pl.Int32(),
    "priority": pl.Int32(),
    "tenant": pl.Utf8(),
    "prefix_hashes": pl.List(pl.UInt64()),
}

COLUMNS: tuple[str, ...] = tuple(SCHEMA)

# Tokens covered by one entry of `prefix_hashes` when a trace does not say otherwise
# (Mooncake's `hash_ids` are per 512 prompt tokens).
DEFAULT_HASH_BLOCK_TOKENS = 512
# The trace's own granularity, when it is not the default: an optional Int32 column holding one
# value (a column, not a side value, so it travels with the frame through sorts, slices, surges,
# Parquet and worker processes). Set by the loader (`hash_block_tokens=`, kvcap Parquet).
HASH_BLOCK_TOKENS = "hash_block_tokens"


class TraceError(ValueError):
    """Bad input: the message names the file, the line (or row) and the column.

    The message is made printable: a value echoed from a file may hold a newline or a terminal
    escape code, which must not reach the user's terminal raw (nor break the one-line rule)."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


def printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (`\\x1b`, `\\n`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def check_hash_block_tokens(n: object, where: str = "hash_block_tokens") -> int:
    """`n` as tokens per prefix hash (a whole number >= 1), else a one-line TraceError."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < 2**31:
        raise TraceError(f"{where}: {n!r} is not a whole number of tokens from 1 to {2**31 - 1}; it is how many "
                         f"prompt tokens one prefix hash stands for (Mooncake: "
                         f"{DEFAULT_HASH_BLOCK_TOKENS})")
    return n


def with_hash_block_tokens(df: pl.DataFrame, n: int) -> pl.DataFrame:
    """`df` whose prefix hashes each stand for `n` prompt tokens."""
    check_hash_block_tokens(n)
    return df.with_columns(pl.lit(n, pl.Int32).alias(HASH_BLOCK_TOKENS))


def has_prefix_hashes(df: pl.DataFrame) -> bool:
    """Whether any request of `df` carries prefix hashes."""
    return df["prefix_hashes"].null_count() < df.height


def hash_block_tokens(df: pl.DataFrame) -> int:
    """How many prompt tokens one of `df`'s prefix hashes stands for."""
    if HASH_BLOCK_TOKENS not in df.columns or df.height == 0:
        return DEFAULT_HASH_BLOCK_TOKENS
    col = df[HASH_BLOCK_TOKENS]
    lo, hi = col.min(), col.max()
    if lo != hi or col.null_count():
        raise TraceError(f"{HASH_BLOCK_TOKENS}: the trace mixes prefix granularities "
                         f"({lo} to {hi} tokens per hash); replay traces of one granularity")
    return check_hash_block_tokens(int(lo))
