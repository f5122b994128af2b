"""Where the stub keeps V1's CPU offloading tier: which host block holds which chunk, and when each
planned transfer is copied.

The scheduler's connector (replay/engine/v1/offload.py) decides what the tier holds by offload key;
the stub turns its plans into copies through `PagedKV`'s host pool (one chunk = one block):
- evicted keys free their host block, then each store's keys take one (so the tier never holds
  more than its capacity, the pool's size);
- a store planned in step s covers tokens that step s computes, so it is copied at the start of
  step s+1 (vLLM's worker submits it then); a store of a flushed row (F9: its blocks are handed
  out again this step, or it was preempted) covers tokens computed earlier and is copied before
  this step's forward pass, which waits for it;
- a load reads the host blocks its keys name, copied before this step's forward pass; the request
  computes only once the scheduler saw the load complete, a later step, which waits for it.

A load of a key the tier never stored, a store over a key it still holds, or an eviction of one it
does not hold is an engine bug and raises `StubIntegrityError`. A chunk loaded with the wrong
content fails the fingerprint check of the request that reads it.

Must not import traces/, capacity/, polars or duckdb (the GPU machine has torch + numpy only).
"""
from __future__ import annotations

import numpy as np

from replay.engine.plan import OffloadPlan
from replay.stub.kv import StubIntegrityError

_NO_PAIRS = np.zeros((0, 2), np.int64)


class OffloadCopies:
    """The tier's key -> host block map and the stores waiting for the next step."""

    def __init__(self, num_host_blocks: int) -> None:
        self.block_of: dict[int, int] = {}
        self.free = list(range(num_host_blocks - 1, -1, -1))     # pop() hands out 0, 1, 2, ...
        self._next_step: list[np.ndarray] = []
        # What the replay made the stub copy (tests and the GPU check read them).
        self.num_store_blocks = self.num_load_blocks = self.num_evicted = self.num_flushes = 0

    def plan(self, off: OffloadPlan, step: int,
             rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """This step's (gpu, host) store pairs, (host, gpu) load pairs, and whether the forward
        pass waits for them: a flush, or (never with vLLM's asynchronous loads, but then the
        copies must come first) a loaded request among the step's scheduled `rows`."""
        stores, self._next_step = self._next_step, []
        for k in off.evicted:
            b = self.block_of.pop(k, None)
            if b is None:
                raise StubIntegrityError(f"step {step}: the offload tier evicts key {k}, which "
                                         f"it does not hold")
            self.free.append(b)
        flushed = set(off.flushed)
        for t in off.stores:
            gpu = np.asarray(t.gpu_blocks, np.int64)
            pairs = np.column_stack((gpu, self._place(t.keys, t.row, step)))
            (stores if t.row in flushed else self._next_step).append(pairs)
        loads = [np.column_stack((self._find(t.keys, t.row, step),
                                  np.asarray(t.gpu_blocks, np.int64))) for t in off.loads]
        s = np.concatenate(stores) if stores else _NO_PAIRS
        ld = np.concatenate(loads) if loads else _NO_PAIRS
        self.num_store_blocks += len(s)
        self.num_load_blocks += len(ld)
        self.num_evicted += len(off.evicted)
        self.num_flushes += bool(flushed)
        wait = bool(flushed) or bool(off.loads and np.isin([t.row for t in off.loads], rows).any())
        return s, ld, wait

    def _place(self, keys, row: int, step: int) -> np.ndarray:
        out = np.empty(len(keys), np.int64)
        for i, k in enumerate(keys):
            if k in self.block_of:
                raise StubIntegrityError(f"step {step}: request row {row} stores offload key {k}, "
                                         f"which the tier already holds")
            if not self.free:
                raise StubIntegrityError(f"step {step}: request row {row} stores offload key {k} "
                                         f"into a full tier ({len(self.block_of)} chunks)")
            out[i] = self.block_of[k] = self.free.pop()
        return out

    def _find(self, keys, row: int, step: int) -> np.ndarray:
        out = np.empty(len(keys), np.int64)
        for i, k in enumerate(keys):
            b = self.block_of.get(k)
            if b is None:
                raise StubIntegrityError(f"step {step}: request row {row} loads offload key {k}, "
                                         f"which the tier never stored")
            out[i] = b
        return out
