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
