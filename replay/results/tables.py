"""Turn a RawRun into the result tables of DESIGN §6 (polars), plus kvcap's extra tables.

Tables: `runs` (one row), `requests` (every trace row exactly once), `steps` (one row per engine
step), `events`, `stalls` (one row per preemption stall: the TBT sample spanning a preemption) and
`tbt` (fleet TBT samples as value + weight, exact percentiles without one row per token), and with
`record_batches` `batches` (one row per request scheduled in a step, in batch order).
Must not import capacity/, duckdb or torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import polars as pl

from replay.engine.raw import BATCH_KINDS, ColumnChunks, ColumnSpill, RawRun
from replay.engine.state import Status
from replay.results.summary import StepSummary, TbtSummary

_STATUS_NAME = {int(Status.FINISHED): "finished", int(Status.REJECTED): "rejected",
                int(Status.ABORTED): "aborted"}


class SpilledTable:
    """A result table whose columns stay in spill files (`replay.engine.raw.ColumnSpill`) until the
    store inserts it `batches()` at a time: the steps and TBT samples of a long run (or in the
    chunks a sink was handed, `replay.engine.raw.ColumnChunks`). Reads like
    a DataFrame as far as its readers go: `height`, `columns`, `table[name].max()/.sum()`
    (streamed), `table[name].to_numpy()` and `frame()` (whole, in memory)."""

    def __init__(self, spill: ColumnSpill | ColumnChunks, run_id: str, *, numbered: bool) -> None:
        self.spill, self.run_id, self.numbered = spill, run_id, numbered

    @property
    def height(self) -> int:
        return self.spill.n

    @property
    def columns(self) -> list[str]:
        return ["run_id", *(["step"] if self.numbered else []), *self.spill.dtypes]

    def batches(self, rows: int = 1 << 20, *, run_id: bool = True) -> Iterator[pl.DataFrame]:
        """The table `rows` rows at a time (without the constant `run_id` column if asked).
        Keeps no batch itself between two: a caller that drops each batch before asking for
        the next holds one in memory, not two."""
        start = 0
        for cols in self.spill.chunks(rows):
            frame = self._frame(cols, start, run_id)
            start += frame.height
            yield frame

    def _frame(self, cols: dict[str, np.ndarray], start: int, run_id: bool) -> pl.DataFrame:
        return chunk_frame(cols, start, numbered=self.numbered,
                           run_id=self.run_id if run_id else None)

    def frame(self) -> pl.DataFrame:
        return pl.concat(list(self.batches()))

    def select(self, *names: str) -> pl.DataFrame:
        """Only these columns, whole, in memory (`DataFrame.select` of column names): what an
        analysis of a long run reads of it (three of the steps table's 18 columns: a sixth of
        its memory), in the dtypes the in-memory table has."""
        cols: dict[str, object] = {}
        for name in _flat(names):
            if name == "run_id":
                cols[name] = _run_ids(self.run_id, self.height)
            elif name == "step" and self.numbered:
                cols[name] = np.arange(1, self.height + 1, dtype=np.int64)
            elif name in self.spill.dtypes:
                cols[name] = self.spill.column(name)
            else:
                raise pl.exceptions.ColumnNotFoundError(name)
        return pl.DataFrame(cols)

    def __getitem__(self, name: str) -> "_SpilledColumn":
        return _SpilledColumn(self.spill, name)


def _flat(names) -> list[str]:
    """`select`'s arguments as DataFrame.select takes them: names, or lists of names."""
    return [n for group in names for n in ([group] if isinstance(group, str) else group)]


@dataclass(frozen=True, slots=True)
class _SpilledColumn:
    spill: ColumnSpill | ColumnChunks
    name: str

    def _parts(self) -> Iterator[np.ndarray]:
        return (c[self.name] for c in self.spill.chunks())

    def max(self):
        return max((p.max().item() for p in self._parts() if len(p)), default=None)

    def sum(self):
        return sum(p.sum().item() for p in self._parts())

    def to_numpy(self) -> np.ndarray:
        return self.spill.column(self.name)

    def cast(self, _dtype) -> "_SpilledColumn":
        """`table[name].cast(pl.Int64).sum()` as on a DataFrame: numpy sums integer columns
        in 64 bits already."""
        return self


class StackedTable:
    """Tables of one kind one after another (a fleet's replicas' `steps` or `tbt`), each in
    memory or spilled, with a constant column per part (`replica`), read as a SpilledTable is:
    `height`, `columns`, `table[name].max()/.sum()/.to_numpy()`, `select(...)` (those columns,
    stacked), `spill.chunks()` and `frame()` (whole). Nothing is copied until a column is asked
    for: scoring a fleet reads three step columns, not a stacked copy of every replica's steps."""

    def __init__(self, parts: list, *, column: str, values: list[int]) -> None:
        self.parts, self.column, self.values = parts, column, values

    @property
    def height(self) -> int:
        return sum(p.height for p in self.parts)

    @property
    def columns(self) -> list[str]:
        return [*self.parts[0].columns, self.column]

    @property
    def spill(self) -> "StackedTable":
        return self                 # tbt_percentiles reads `table.spill.chunks()`

    def chunks(self, rows: int = 1 << 20) -> Iterator[dict[str, np.ndarray]]:
        for p in self.parts:
            if isinstance(p, pl.DataFrame):
                yield {c: p[c].to_numpy() for c in p.columns if c != "run_id"}
            else:
                yield from p.spill.chunks(rows)

    def _part(self, p, v: int, names: list[str]) -> pl.DataFrame:
        own = [n for n in names if n != self.column]
        return p.select(own).with_columns(pl.lit(v, pl.Int32).alias(self.column)).select(names)

    def select(self, *names: str) -> pl.DataFrame:
        names = _flat(names)
        return pl.concat([self._part(p, v, names) for p, v in zip(self.parts, self.values)],
                         how="vertical_relaxed")

    def frame(self) -> pl.DataFrame:
        return self.select(self.columns)

    def __getitem__(self, name: str) -> "_StackedColumn":
        return _StackedColumn(self, name)


@dataclass(frozen=True, slots=True)
class _StackedColumn:
    table: StackedTable
    name: str

    def max(self):
        found = [p[self.name].max() for p in self.table.parts if p.height]
        found = [x for x in found if x is not None]
        return max(found) if found else None

    def sum(self):
        total = 0
        for p in self.table.parts:
            col = p[self.name]
            if isinstance(col, pl.Series) and col.dtype.is_integer():
                col = col.cast(pl.Int64)            # Int32 sums wrap in polars
            total += col.sum() or 0
        return total

    def cast(self, _dtype) -> "_StackedColumn":
        return self

    def to_numpy(self) -> np.ndarray:
        return np.concatenate([p[self.name].to_numpy() for p in self.table.parts])


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    run: dict
    requests: pl.DataFrame
    # A summary replay (replay/results/summary.py) keeps StepSummary / TbtSummary instead.
    steps: pl.DataFrame | SpilledTable | StepSummary
    events: pl.DataFrame
    stalls: pl.DataFrame
    tbt: pl.DataFrame | SpilledTable | TbtSummary
    # Only when the replay recorded batches (`kvcap replay --record-batches`).
    batches: pl.DataFrame | None = None

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def recompute_tax(self) -> float | None:
        """The run's recompute tax (`recompute_tax`): a full run's tables or a summary's."""
        return recompute_tax(self.requests, self.steps)

    def tables(self) -> dict[str, pl.DataFrame]:
        out = {"runs": pl.DataFrame([self.run]), "requests": self.requests, "steps": self.steps,
               "events": self.events, "stalls": self.stalls, "tbt": self.tbt}
        if self.batches is not None:
            out["batches"] = self.batches
        return out


def chunk_frame(cols: dict[str, np.ndarray], start: int, *, numbered: bool,
                run_id: str | None = None) -> pl.DataFrame:
    """Rows start.. of the `steps` (`numbered`: its 1-based `step` column) or `tbt` table from
    one chunk of its columns (no copy), with the `run_id` column if one is given."""
    n = len(next(iter(cols.values())))
    head = {"run_id": _run_ids(run_id, n)} if run_id is not None else {}
    if numbered:
        head["step"] = np.arange(start + 1, start + n + 1, dtype=np.int64)
    return pl.DataFrame({**head, **cols})


def recompute_tax(requests: pl.DataFrame, steps) -> float | None:
    """The prefill work preemption wasted: tokens computed again at positions a request had
    computed before it was preempted (`requests.recomputed_tokens`: a prefix-cache hit or a CPU
    load at the resume is not computed again, so not counted) over every prefill token the run
    computed, the recomputed ones included (`steps.num_prefill_tokens`: first prefills and
    re-prefills). 0.0 without preemption; None when nothing was prefilled. `steps` is the steps
    table, spilled or not, or a summary replay's StepSummary (it keeps integer sums)."""
    prefill = int(steps["num_prefill_tokens"].sum() or 0)
    if prefill == 0:
        return None
    return int(requests["recomputed_tokens"].sum() or 0) / prefill


def request_status(status: np.ndarray) -> np.ndarray:
    names = np.full(len(status), "unfinished", dtype=object)
    for code, name in _STATUS_NAME.items():
        names[status == code] = name
    return names


def _run_ids(run_id: str, n: int) -> pl.Series:
    """The run id repeated n times (a million-step run: no Python list of n references)."""
    return pl.repeat(run_id, n, dtype=pl.Utf8, eager=True)


def build_tables(raw: RawRun, trace: pl.DataFrame, run_id: str) -> dict[str, pl.DataFrame]:
    st = raw.state
    rid = trace["request_id"].to_numpy()
    requests = pl.DataFrame({
        "run_id": _run_ids(run_id, st.n),
        "request_id": trace["request_id"],
        "arrival_s": trace["arrival_s"],
        "priority": trace["priority"],
        "tenant": trace["tenant"],
        "prompt_tokens": trace["prompt_tokens"],
        "output_tokens": trace["output_tokens"],
        "first_scheduled_s": raw.first_scheduled_s,
        "first_token_s": raw.first_token_s,
        "finish_s": raw.finish_s,
        "status": pl.Series(request_status(st.status).tolist(), dtype=pl.Utf8),
        "num_preemptions": st.num_preemptions,
        "num_swaps": st.num_swaps,
        "num_recomputes": st.num_recomputes,
        "recomputed_tokens": st.recomputed_tokens,
        "cached_prompt_tokens": st.cached_prompt_tokens,
        "output_tokens_done": st.num_output,
        "max_tbt_s": np.where(st.num_output > 1, raw.max_tbt_s, np.nan),
        # At first admission, as vLLM's prefix-cache (GPU) and external-hit (CPU connector)
        # counters count them.
        "gpu_hit_tokens": st.cached_prompt_tokens - st.cpu_hit_tokens,
        "cpu_hit_tokens": st.cpu_hit_tokens,
    }).with_columns(pl.col(c).fill_nan(None) for c in
                    ("first_scheduled_s", "first_token_s", "finish_s", "max_tbt_s"))
    s = raw.steps
    if raw.spilled:
        steps = SpilledTable(raw.spilled["steps"], run_id, numbered=True)
    else:
        n = len(s["start_s"])           # 0 for a summary replay (run.py replaces the table)
        steps = pl.DataFrame({"run_id": _run_ids(run_id, n),
                              "step": np.arange(1, n + 1, dtype=np.int64), **s})
    ev = raw.events
    events = pl.DataFrame({
        "run_id": _run_ids(run_id, len(ev["t_s"])),
        "t_s": pl.Series(ev["t_s"], dtype=pl.Float64),
        "step": pl.Series(ev["step"], dtype=pl.Int64) + 1,
        "request_id": pl.Series(rid[np.asarray(ev["row"], dtype=np.int64)], dtype=pl.Int64),
        "kind": pl.Series(ev["kind"], dtype=pl.Utf8),
        "blocks": pl.Series(ev["blocks"], dtype=pl.Int64),
        "bytes": pl.Series(ev["bytes"], dtype=pl.Int64),
    })
    # Order within the step: both loops append a step's events in the order the scheduler
    # applied them (rejections, then preemption victims as chosen, then loads).
    events = events.with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int32).over("step"))
    sl = raw.stalls
    stalls = pl.DataFrame({
        "run_id": _run_ids(run_id, len(sl["row"])),
        "request_id": pl.Series(rid[np.asarray(sl["row"], dtype=np.int64)], dtype=pl.Int64),
        "preempted_s": pl.Series(sl["preempted_s"], dtype=pl.Float64),
        "resumed_s": pl.Series(sl["resumed_s"], dtype=pl.Float64),
        "stall_s": pl.Series(sl["stall_s"], dtype=pl.Float64),
        "mode": pl.Series(sl["mode"], dtype=pl.Utf8),
    })
    if raw.spilled:
        tbt = SpilledTable(raw.spilled["tbt"], run_id, numbered=False)
    else:
        tbt = pl.DataFrame({"run_id": _run_ids(run_id, len(raw.tbt_values)),
                            "tbt_s": raw.tbt_values, "weight": raw.tbt_weights})
    out = {"requests": requests, "steps": steps, "events": events, "stalls": stalls, "tbt": tbt}
    if raw.batches is not None:
        out["batches"] = batch_table(raw.batches, rid, run_id)
    return out


_KINDS = pl.Series(BATCH_KINDS, dtype=pl.Enum(list(BATCH_KINDS)))


def batch_table(b: dict[str, np.ndarray], rid: np.ndarray, run_id: str) -> pl.DataFrame:
    """`batches`: one row per request scheduled in a step; `seq` is its place in the batch."""
    step = b["step"]
    n = len(step)
    # Rows of one step are contiguous and in batch order: seq restarts where the step changes.
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]]) if n else np.zeros(0, np.int64)
    seq = np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return pl.DataFrame({
        "run_id": _run_ids(run_id, n),
        "step": step + 1,
        "seq": seq.astype(np.int32),
        "request_id": pl.Series(rid[b["row"]], dtype=pl.Int64),
        "num_new_tokens": b["num_new_tokens"],
        "num_computed_tokens": b["num_computed_tokens"],
        # An Enum gathered from the codes (no string per row: a long replay has millions).
        "kind": _KINDS.gather(b["kind"].astype(np.uint32)),
    })
