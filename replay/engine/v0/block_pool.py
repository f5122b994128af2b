"""One device's pool of KV blocks with vLLM V0's exact id order (`vllm/core/block/naive_block.py`,
`prefix_caching_block.py`, `evictor.py` in 0.10.1.1).

Owns: the free list, ref counts, and — with prefix caching — the key -> block map, the per-block
tracker (active / last access / computed) and the LRU evictor. Block ids are vLLM's global ids
(GPU 0..G-1, host G..G+C-1). Knows nothing of requests or block tables (`block_manager.py`).
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

import heapq
from collections import deque


class LruEvictor:
    """Cached blocks nobody references, evicted by (last access, deepest first, block id).

    Mirrors vLLM's `LRUEvictor`: a heap with lazy deletion. An entry is live only while the block is
    in the table with the same last-access time; the heap is rebuilt when it grows past 50x the
    table, which is what makes ties and stale entries resolve exactly as in vLLM."""

    __slots__ = ("table", "heap")
    _CLEANUP_FACTOR = 50

    def __init__(self) -> None:
        # block id -> [last_accessed, num_hashed_tokens, key]
        self.table: dict[int, list] = {}
        self.heap: list[tuple[float, int, int, int]] = []

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.table

    def __len__(self) -> int:
        return len(self.table)

    def add(self, block_id: int, key: int, num_hashed_tokens: int, last_accessed: float) -> None:
        self.table[block_id] = [last_accessed, num_hashed_tokens, key]
        heapq.heappush(self.heap, (last_accessed, -num_hashed_tokens, block_id, key))
        if len(self.heap) > self._CLEANUP_FACTOR * len(self.table):
            self.heap = [(t, -n, b, k) for b, (t, n, k) in self.table.items()]
            heapq.heapify(self.heap)

    def remove(self, block_id: int) -> None:
        del self.table[block_id]

    def evict(self) -> tuple[int, int]:
        """(block id, key) of the victim; the caller drops the key from its cache map.

        Departure from vLLM (docs/design.md): an entry is live only if its key is the block's
        current key too. vLLM checks the last-access time alone, so when a block re-enters the
        evictor under a new key with the same time as a stale entry of its old key (blocks freed by
        a swap-out all get -1), it returns the old key and trips the sanity asserts of
        `_maybe_allocate_evicted_block`; kvcap skips the stale entry and continues."""
        while self.heap:
            last, _, block_id, key = heapq.heappop(self.heap)
            entry = self.table.get(block_id)
            if entry is not None and entry[0] == last and entry[2] == key:
                del self.table[block_id]
                return block_id, key
        raise RuntimeError("evictor is empty")


class BlockPool:
    """Free list + ref counts (+ prefix cache when `caching`) of one device.

    Allocation pops the front of the free list, a freed block goes back to the front (LIFO), as in
    vLLM's `NaiveBlockAllocator`. With caching, a block whose ref count drops to 0 while it holds a
    full, keyed block goes to the evictor instead and still counts as free."""

    __slots__ = ("first_id", "num_blocks", "caching", "free_ids", "ref", "cached", "evictor",
                 "active", "last_accessed", "computed", "touched")

    def __init__(self, *, first_id: int, num_blocks: int, caching: bool) -> None:
        self.first_id = first_id
        self.num_blocks = num_blocks
        self.caching = caching
        self.free_ids: deque[int] = deque(range(first_id, first_id + num_blocks))
        self.ref = [0] * num_blocks
        self.cached: dict[int, int] = {}     # key -> block id
        self.evictor = LruEvictor()
        # Block tracker (vLLM `BlockTracker`), indexed by id - first_id.
        self.active = [False] * num_blocks
        self.last_accessed = [-1.0] * num_blocks
        self.computed = [False] * num_blocks
        # Blocks registered in the cache since the last `mark_computed` (vLLM `_touched_blocks`).
        self.touched: set[int] = set()

    # ---------------------------------------------------------------- counts
    def num_free(self) -> int:
        return len(self.free_ids) + len(self.evictor)

    def num_used(self) -> int:
        return self.num_blocks - self.num_free()

    def physical(self, block_id: int) -> int:
        """Id within this device (what vLLM's swap mappings carry)."""
        return block_id - self.first_id

    # ---------------------------------------------------------------- tracker
    def _track(self, block_id: int, computed: bool) -> None:
        i = block_id - self.first_id
        self.active[i] = True
        self.last_accessed[i] = -1.0
        self.computed[i] = computed

    def _untrack(self, block_id: int) -> None:
        i = block_id - self.first_id
        self.active[i] = False
        self.last_accessed[i] = -1.0
        self.computed[i] = False

    def is_computed(self, block_id: int) -> bool:
        i = block_id - self.first_id
        return self.computed[i] if self.active[i] else block_id in self.evictor

    def mark_computed(self) -> None:
        """vLLM marks every newly cached block computed once a batch is built."""
        for block_id in self.touched:
            self.computed[block_id - self.first_id] = True
        self.touched.clear()

    def mark_accessed(self, block_id: int, now: float) -> None:
        i = block_id - self.first_id
        if self.active[i]:
            self.last_accessed[i] = now
        elif block_id in self.evictor:
            self.evictor.table[block_id][0] = now

    # ---------------------------------------------------------------- allocate / free
    def allocate_new(self) -> int:
        """A fresh mutable block: the free list first, else evict the LRU cached block."""
        if self.free_ids:
            block_id = self.free_ids.popleft()
        elif self.caching and len(self.evictor):
            block_id, key = self.evictor.evict()
            del self.cached[key]
        else:
            raise RuntimeError("no free block")
        self.ref[block_id - self.first_id] += 1
        if self.caching:
            self._track(block_id, computed=False)
        return block_id

    def allocate_many(self, n: int) -> list[int]:
        """`allocate_new()` n times without caching (the free list is the only source), in one call."""
        assert not self.caching
        if n > len(self.free_ids):
            raise RuntimeError("no free block")
        pop = self.free_ids.popleft
        ids = [pop() for _ in range(n)]
        ref, f = self.ref, self.first_id
        for b in ids:
            ref[b - f] += 1
        return ids

    def free_many(self, ids: list[int]) -> None:
        """`free(b, None, ...)` for each block in order without caching, in one call: without a
        cache no block is shared, so each goes back to the front of the free list."""
        assert not self.caching
        ref, f, back = self.ref, self.first_id, self.free_ids.appendleft
        for b in ids:
            i = b - f
            ref[i] -= 1
            if ref[i] == 0:
                back(b)

    def allocate_full(self, key: int) -> int:
        """A block for a full, keyed chunk of tokens: a cache hit shares the cached block."""
        if not self.caching:
            return self.allocate_new()
        block_id = self.cached.get(key)
        if block_id is not None:
            self._incr_cached(block_id)
            return block_id
        block_id = self.allocate_new()
        self.cached[key] = block_id
        self.touched.add(block_id)
        return block_id

    def promote(self, block_id: int, key: int) -> int:
        """A mutable block just became full: register it, or switch to the cached twin."""
        if not self.caching:
            return block_id
        twin = self.cached.get(key)
        if twin is None:
            self.cached[key] = block_id
            self.touched.add(block_id)
            return block_id
        self._free_hashless(block_id)
        self._incr_cached(twin)
        return twin

    def _incr_cached(self, block_id: int) -> None:
        i = block_id - self.first_id
        self.ref[i] += 1
        if self.ref[i] == 1:
            if block_id in self.evictor:
                self.evictor.remove(block_id)
            self._track(block_id, computed=True)

    def free(self, block_id: int, key: int | None, num_hashed_tokens: int) -> None:
        """Drop one reference; `key` is the block's content key when it is full (caching)."""
        if self.caching and key is not None:
            i = block_id - self.first_id
            self.ref[i] -= 1
            if self.ref[i] == 0:
                self.evictor.add(block_id, key, num_hashed_tokens, self.last_accessed[i])
                self._untrack(block_id)
            return
        self._free_hashless(block_id)

    def _free_hashless(self, block_id: int) -> None:
        i = block_id - self.first_id
        if self.caching and self.ref[i] == 1:
            self._untrack(block_id)
        self.ref[i] -= 1
        if self.ref[i] == 0:
            self.free_ids.appendleft(block_id)

    def is_cached_live(self, key: int) -> bool:
        """The key is cached here on a block somebody references (not only in the evictor)."""
        block_id = self.cached.get(key)
        return block_id is not None and block_id not in self.evictor
