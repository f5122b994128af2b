"""What a replay produces, before replay/results/tables.py turns it into tables: `RawRun`, the
per-step columns and the event kinds. A leaf module (numpy and replay.engine.state only) so the
reference loop (replay/engine/loop.py), the compiled-core adapter (replay/engine/compiled.py),
engine selection (replay/run.py) and the results all import it without importing each other; the C
cores index `EVENT_KINDS` (replay/engine/kvcore.h `EV_*`) and fill `STEP_COLUMNS` in this order.
Must not import anything else from replay/ (import-linter contract in pyproject.toml).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Iterator, Literal

import numpy as np

from replay.engine.state import RequestState

STEP_COLUMNS = {
    "start_s": np.float64, "duration_s": np.float64, "num_running": np.int32,
    "num_waiting": np.int32, "num_swapped": np.int32, "num_prefill_tokens": np.int64,
    "num_decode_tokens": np.int64, "gpu_blocks_used": np.int64, "cpu_blocks_used": np.int64,
    "swap_out_blocks": np.int32, "swap_in_blocks": np.int32, "num_preempted": np.int32,
    # Requests preempted in swap mode and not yet resumed, and their KV blocks (per GPU): the
    # concurrently evicted KV the host tier must hold (size-swap's demand series).
    "evicted_requests": np.int32, "evicted_blocks": np.int64,
    # V1 CPU KV offloading (the OffloadingConnector; cpu_blocks_used is then the tier's chunks
    # holding data, evictable ones included): GPU blocks whose store / load was issued this step.
    "offload_store_blocks": np.int64, "offload_load_blocks": np.int64,
}
# Step columns a compiled core may not fill yet (it then cannot run offloading:
# replay.engine.compiled.unavailable), read back as zeros.
OFFLOAD_STEP_COLUMNS = ("offload_store_blocks", "offload_load_blocks")

EVENT_KINDS = ("preempt_recompute", "preempt_swap", "swap_in", "swap_full_fallback",
               "swap_full_abort", "reject",
               # One per request and step whose CPU offload store / load was issued (blocks, bytes).
               "offload_store", "offload_load")

# `batches.kind`, as vLLM's scheduler output names a scheduled request: V1 `scheduled_new_reqs`
# (first admission), resumed (admitted again after a preemption; 0.33's Model Runner V2 lists
# them among the new ones, oracle README F14) and running (`scheduled_cached_reqs`); V0 the
# sequence group's prefill or decode. The C cores index it (replay/engine/kvcore.h `BK_*`).
BATCH_KINDS = ("new", "resumed", "running", "prefill", "decode")
BATCH_COLUMNS = {"step": np.int64, "row": np.int64, "num_new_tokens": np.int64,
                 "num_computed_tokens": np.int64, "kind": np.int8}

Implementation = Literal["compiled", "reference"]
TBT_COLUMNS = {"tbt_s": np.float64, "weight": np.int64}


class ColumnSpill:
    """Columns appended chunk by chunk to one raw file per column in a temporary folder, so a
    long replay's step and TBT columns (84 + ~16 B per step: gigabytes for 10M requests) never
    sit in memory whole; the store reads them back in batches. Read with `np.fromfile` (not a
    memory map: mapped pages would count in the process's resident set). The folder goes when
    the object does (or at exit)."""

    def __init__(self, dtypes: dict[str, type], folder: str | None = None) -> None:
        self.dtypes = {k: np.dtype(t) for k, t in dtypes.items()}
        self.dir = tempfile.mkdtemp(prefix="kvcap-spill-", dir=folder)
        self._remove = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self.n = 0

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def append(self, cols: dict[str, np.ndarray]) -> None:
        lens = {len(cols[k]) for k in self.dtypes}
        if len(lens) != 1:
            raise ValueError(f"spill: columns of unequal length {sorted(lens)}")
        for k, dt in self.dtypes.items():
            with open(self._path(k), "ab") as f:
                np.ascontiguousarray(cols[k], dtype=dt).tofile(f)
        self.n += lens.pop()

    def chunks(self, rows: int = 1 << 20) -> Iterator[dict[str, np.ndarray]]:
        """The columns `rows` rows at a time, in order."""
        for start in range(0, self.n, rows):
            count = min(rows, self.n - start)
            yield {k: np.fromfile(self._path(k), dtype=dt, count=count, offset=start * dt.itemsize)
                   for k, dt in self.dtypes.items()}

    def column(self, name: str) -> np.ndarray:
        """One whole column in memory."""
        return np.fromfile(self._path(name), dtype=self.dtypes[name], count=self.n)

    def close(self) -> None:
        self._remove()


class ColumnChunks:
    """ColumnSpill's interface over columns kept in memory as the chunks they were drained in: a
    compiled run whose steps went to a sink chunk by chunk (`kvcap replay`'s store writer) keeps
    them so, without copying them into one array (`chunks()` yields them as they came)."""

    def __init__(self, dtypes: dict[str, type]) -> None:
        self.dtypes = {k: np.dtype(t) for k, t in dtypes.items()}
        self.pieces: list[dict[str, np.ndarray]] = []
        self.n = 0

    def append(self, cols: dict[str, np.ndarray]) -> None:
        lens = {len(cols[k]) for k in self.dtypes}
        if len(lens) != 1:
            raise ValueError(f"chunks: columns of unequal length {sorted(lens)}")
        self.pieces.append({k: np.asarray(cols[k], dtype=dt) for k, dt in self.dtypes.items()})
        self.n += lens.pop()

    def chunks(self, rows: int = 1 << 20) -> Iterator[dict[str, np.ndarray]]:
        """The chunks as they were appended (`rows` is ColumnSpill's: here they are in memory
        already)."""
        return iter(self.pieces)

    def column(self, name: str) -> np.ndarray:
        return np.concatenate([p[name] for p in self.pieces] or [np.zeros(0, self.dtypes[name])])

    def close(self) -> None:
        self.pieces = []


@dataclass(slots=True, kw_only=True)
class RawRun:
    """Everything a replay produced, as numpy columns (replay/results/tables.py makes the tables)."""
    state: RequestState
    steps: dict[str, np.ndarray]
    # Per request (trace row).
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    max_tbt_s: np.ndarray
    # Events: parallel lists (eventful steps only, so plain lists are cheap).
    events: dict[str, list] = field(default_factory=dict)
    # Preemption stalls: the TBT sample that spans a preemption.
    stalls: dict[str, list] = field(default_factory=dict)
    # Fleet TBT samples as (value, weight): the rows that also sampled in the previous step share
    # one gap value, so a step adds one weighted sample plus the few rows that did not
    # (memory O(steps), not O(tokens)).
    tbt_values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tbt_weights: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    status: str = "completed"          # "completed" | "aborted"
    abort_s: float | None = None
    abort_reason: str | None = None
    sim_seconds: float = 0.0
    num_steps: int = 0
    # Which implementation produced it (recorded in the `runs` table).
    implementation: Implementation = "reference"
    # A long compiled run asked to spill keeps its steps and TBT samples on disk instead of in
    # `steps` / `tbt_values` + `tbt_weights` (those stay empty): {"steps": ..., "tbt": ...};
    # a run that handed them to a sink keeps them as its chunks (in memory, or on disk too when
    # it also spills).
    spilled: dict[str, ColumnSpill | ColumnChunks] | None = None
    # Per-step batch records (`record_batches=True` only, else None): BATCH_COLUMNS, one entry
    # per scheduled request per step in batch order; step is 0-based as in `events`.
    batches: dict[str, np.ndarray] | None = None


def abort_reason(row: int, needed: int, free: int) -> str:
    """vLLM V0's RuntimeError text when a swap victim does not fit the host pool (both
    implementations word it the same)."""
    return (f"Aborted due to the lack of CPU swap space: request row {row} needs {needed} CPU "
            f"blocks, {free} free")
