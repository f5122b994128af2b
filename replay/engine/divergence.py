"""Where two replays of the same trace first differ (the differential checks: compiled core vs
reference in the Hypothesis tests, a replay vs a saved baseline in bench/check_identical.py).

`first_divergence` names the earliest step at which any per-step column, event or stall differs,
or else the request (trace row) whose per-request outcome differs first, with the field and both
values; None when the runs are identical (NaNs equal). Numpy only.
"""
from __future__ import annotations

import numpy as np

from replay.engine.raw import RawRun

_REQUEST_FIELDS = ("first_scheduled_s", "first_token_s", "finish_s", "max_tbt_s")
_STATE_FIELDS = ("status", "num_computed", "num_output", "num_preemptions", "num_swaps",
                 "num_recomputes", "recomputed_tokens", "cached_prompt_tokens",
                 "computed_at_preemption", "cpu_hit_tokens")


def _neq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise a != b with NaN == NaN."""
    d = a != b
    if a.dtype.kind == "f":
        d &= ~(np.isnan(a) & np.isnan(b))
    return d


def first_index(a, b) -> int | None:
    """First position where two sequences differ (a length difference counts at the shorter
    length); None when equal."""
    a, b = np.asarray(a), np.asarray(b)
    m = min(len(a), len(b))
    if a.dtype == object or b.dtype == object:
        d = next((i for i in range(m) if a[i] != b[i]), None)
    else:
        idx = np.flatnonzero(_neq(a[:m], b[:m]))
        d = int(idx[0]) if len(idx) else None
    if d is None and len(a) != len(b):
        d = m
    return d


def _at(seq, i):
    return seq[i] if i < len(seq) else "<missing>"


def first_divergence(a: RawRun, b: RawRun, names: tuple[str, str] = ("a", "b")) -> str | None:
    """A one-line description of the first difference between `a` and `b`, or None."""
    na, nb = names
    found: list[tuple[int, str]] = []        # (step, description) candidates
    for k in a.steps:
        i = first_index(a.steps[k], b.steps[k])
        if i is not None:
            found.append((i, f"step {i}: steps.{k} {na}={_at(a.steps[k], i)} "
                             f"{nb}={_at(b.steps[k], i)}"))
    ea, eb = a.events, b.events
    cols = list(ea)
    n = min(len(ea.get("step", [])), len(eb.get("step", [])))
    for j in range(max(len(ea.get("step", [])), len(eb.get("step", [])))):
        if j >= n or any(ea[c][j] != eb[c][j] for c in cols):
            step = ea["step"][j] if j < len(ea["step"]) else eb["step"][j]
            row = ea["row"][j] if j < len(ea["row"]) else eb["row"][j]
            c = next((c for c in cols if j >= n or ea[c][j] != eb[c][j]), "length")
            found.append((int(step), f"step {step}: event {j} (request row {row}) {c} "
                                     f"{na}={_at(ea[c], j)} {nb}={_at(eb[c], j)}"))
            break
    if found:
        return min(found, key=lambda x: x[0])[1]
    for k in a.stalls:
        j = first_index(a.stalls[k], b.stalls[k])
        if j is not None:
            row = _at(a.stalls["row"], j)
            return (f"stall {j} (request row {row}): {k} {na}={_at(a.stalls[k], j)} "
                    f"{nb}={_at(b.stalls[k], j)}")
    per_row = [(k, getattr(a, k), getattr(b, k)) for k in _REQUEST_FIELDS]
    per_row += [(k, getattr(a.state, k), getattr(b.state, k)) for k in _STATE_FIELDS]
    rows = [(i, k, x, y) for k, x, y in per_row if (i := first_index(x, y)) is not None]
    if rows:
        i, k, x, y = min(rows, key=lambda r: r[0])
        return f"request row {i}: {k} {na}={_at(x, i)} {nb}={_at(y, i)}"
    for k in ("tbt_values", "tbt_weights"):
        j = first_index(getattr(a, k), getattr(b, k))
        if j is not None:
            return f"TBT sample {j}: {k} {na}={_at(getattr(a, k), j)} {nb}={_at(getattr(b, k), j)}"
    for k in ("status", "abort_s", "abort_reason", "sim_seconds", "num_steps"):
        if getattr(a, k) != getattr(b, k):
            return f"run {k}: {na}={getattr(a, k)!r} {nb}={getattr(b, k)!r}"
    return None


def first_table_divergence(got, want, table: str, names: tuple[str, str] = ("got", "want")
                           ) -> str | None:
    """The first differing row and column of two result tables (polars DataFrames with the same
    columns, rows in table order), or None; `bench/check_identical.py` uses it."""
    na, nb = names
    if got.columns != want.columns:
        return f"{table}: columns {na}={got.columns} {nb}={want.columns}"
    best = None
    for c in got.columns:
        x, y = got[c].to_numpy(), want[c].to_numpy()
        i = first_index(x, y)
        if i is not None and (best is None or i < best[0]):
            best = (i, c, _at(x, i), _at(y, i))
    if best is None:
        return None
    i, c, x, y = best
    where = ", ".join(f"{k}={want[k][i]}" for k in ("step", "request_id") if k in want.columns
                      and i < want.height)
    return f"{table} row {i}{' (' + where + ')' if where else ''}: {c} {na}={x} {nb}={y}"
