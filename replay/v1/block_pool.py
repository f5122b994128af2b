"""The V1 GPU block pool: block ids, reference counts, the free queue and the prefix-cache map.

Mirrors vLLM 0.33 `vllm/v1/core/block_pool.py` + `kv_cache_utils.FreeKVCacheBlockQueue` (reference
B3, B5): block 0 is the null block and never handed out; allocation pops the head of the free queue;
a freed request's blocks come back tail first, unhashed ones prepended (reused first, ≥0.27) and
hashed ones appended (LRU); a cached block stays in the free queue with its key until it is popped
for reuse (lazy eviction); touching a free hit block takes it out of the middle of the queue.

Every operation works on whole runs of blocks at C speed (a replay moves millions of blocks):
reference counts and block keys are numpy arrays, and the free queue is a numpy ring buffer
`_buf[_head:_tail]` in queue order, where a block taken out of the middle (a prefix hit) leaves a
hole (0: the null block is never free) that pops skip. The key -> block map is a dict updated and
pruned in bulk. Keys that only their own request can hit (negative: `replay.prefix.unique_key`)
enter it lazily: registering one only marks the block, and `publish` enters a request's marked
blocks when it is preempted, the only time anything can look them up (its own re-admission);
entering them then, in life order, leaves the map exactly as eager registration would for every
key that is ever looked up, without a dict insert and delete per block of every request. Pops and registrations of a few blocks (most decode steps) take a scalar path,
since a numpy call costs more than a handful of per-block Python operations. Owns no request state. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

NULL_BLOCK = 0
_HOLE = NULL_BLOCK  # the null block is never free, so its id marks a hole in the ring
_I64 = np.int64
_FEW = 8   # up to this many blocks, per-block scalar work is cheaper than numpy calls


class BlockPool:
    __slots__ = ("num_blocks", "enable_caching", "_ref", "_key", "_hashed", "_lazy", "cached", "dups",
                 "_buf", "_pos", "_head", "_tail", "_holes", "_num_free")

    def __init__(self, *, num_blocks: int, enable_caching: bool) -> None:
        # vLLM's own count, null block included.
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref = np.zeros(num_blocks, _I64)
        # Per block: its key, valid where `_hashed` (registered and not yet evicted).
        self._key = np.zeros(num_blocks, _I64)
        self._hashed = np.zeros(num_blocks, bool)
        # Hashed with a request-unique key that is not in `cached` (not published yet).
        self._lazy = np.zeros(num_blocks, bool)
        # key -> the block a lookup returns (the first registered with that key).
        self.cached: dict[int, int] = {}
        # key -> further blocks with the same content, in registration order. Two requests that
        # compute the same block in one step keep two copies (vLLM does not de-duplicate).
        self.dups: dict[int, list[int]] = {}
        # The ring has room for a whole pool's worth of pushes on either side before it recentres.
        self._buf = np.zeros(4 * num_blocks + 4, _I64)
        self._pos = np.zeros(num_blocks, _I64)         # index in _buf of each free block
        self._head = self._tail = 0
        self._holes = 0
        self._num_free = 0
        self._recentre(np.arange(1, num_blocks, dtype=_I64))

    # ---------------------------------------------------------------- gauges
    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_used(self) -> int:
        """Referenced blocks (cached but unreferenced blocks count as free, as in vLLM)."""
        return self.num_blocks - 1 - self._num_free

    def usage(self) -> float:
        """vLLM 0.33 `get_usage`: the null block is not in the denominator."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - self._num_free / usable

    # ---------------------------------------------------------------- views (tests, snapshots)
    @property
    def free_queue(self) -> list[int]:
        """The free queue, head first (a copy)."""
        return self.free_order()

    @property
    def ref(self) -> list[int]:
        """Reference count of every block (a copy)."""
        return self._ref.tolist()

    @property
    def key_of(self) -> dict[int, int]:
        """block -> its key, for hashed (registered) blocks only (a copy)."""
        blocks = np.flatnonzero(self._hashed)
        return dict(zip(blocks.tolist(), self._key[blocks].tolist()))

    def free_order(self) -> list[int]:
        live = self._buf[self._head:self._tail]
        return live[live != _HOLE].tolist()

    # ---------------------------------------------------------------- cache map
    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def register(self, blocks: Sequence[int], keys: Sequence[int]) -> None:
        """Give full blocks their keys (`cache_full_blocks`)."""
        cached = self.cached
        if cached.keys().isdisjoint(keys):
            # Common case: fresh content; one C-level update instead of a loop.
            cached.update(zip(keys, blocks))
            if len(blocks) <= _FEW:
                key, hashed = self._key, self._hashed
                for b, k in zip(blocks, keys):
                    key[b] = k
                    hashed[b] = True
                return
            idx = np.asarray(blocks, _I64)
            self._key[idx] = keys
            self._hashed[idx] = True
            return
        dups, key, hashed = self.dups, self._key, self._hashed
        for b, k in zip(blocks, keys):
            first = cached.get(k)
            if first is None:
                cached[k] = b
            elif first != b and b not in dups.get(k, ()):
                dups.setdefault(k, []).append(b)
            key[b] = k
            hashed[b] = True

    def register_unique(self, blocks: Sequence[int], keys: Sequence[int]) -> None:
        """Give full blocks request-unique keys (negative) without entering them in `cached`."""
        if len(blocks) <= _FEW:
            key, hashed, lazy = self._key, self._hashed, self._lazy
            for b, k in zip(blocks, keys):
                key[b] = k
                hashed[b] = True
                lazy[b] = True
            return
        idx = np.asarray(blocks, _I64)
        self._key[idx] = keys
        self._hashed[idx] = True
        self._lazy[idx] = True

    def publish(self, blocks: Sequence[int], keys: Sequence[int]) -> None:
        """Enter the lazily registered ones among a request's `blocks` (with their `keys`, in
        table order) into the cache map, as `register` would have when they were registered."""
        lazy = self._lazy
        todo = [(b, k) for b, k in zip(blocks, keys) if lazy[b]]
        if not todo:
            return
        cached, dups = self.cached, self.dups
        for b, k in todo:
            lazy[b] = False
            first = cached.get(k)
            if first is None:
                cached[k] = b
            elif first != b and b not in dups.get(k, ()):
                dups.setdefault(k, []).append(b)

    def _evict(self, blocks: np.ndarray) -> None:
        """Drop reused blocks' keys from the cache, in pop order (`_maybe_evict_cached_block`)."""
        hit = blocks[self._hashed[blocks]]
        if not len(hit):
            return
        self._hashed[hit] = False
        lazy = self._lazy[hit]
        if lazy.any():
            self._lazy[hit] = False
            hit = hit[~lazy]     # never entered in the map: nothing to drop
            if not len(hit):
                return
        self._drop_keys(hit.tolist(), self._key[hit].tolist())

    def _evict_few(self, blocks: list[int]) -> None:
        """`_evict` for a handful of blocks: scalar reads beat numpy's per-call overhead."""
        hashed, key, lazy = self._hashed, self._key, self._lazy
        hit = []
        for b in blocks:
            if hashed[b]:
                hashed[b] = False
                if lazy[b]:
                    lazy[b] = False      # never entered in the map: nothing to drop
                else:
                    hit.append(b)
        if hit:
            self._drop_keys(hit, [int(key[b]) for b in hit])

    def _drop_keys(self, hit: list[int], keys: list[int]) -> None:
        """Remove evicted blocks `hit` (with their `keys`) from the cache map, in order."""
        dups = self.dups
        if not dups or dups.keys().isdisjoint(keys):
            # No copies: each key's cached block is this very block.
            deque(map(self.cached.__delitem__, keys), maxlen=0)
            return
        cached = self.cached
        for b, k in zip(hit, keys):
            more = dups.get(k)
            if cached.get(k) == b:
                if more:
                    cached[k] = more.pop(0)
                    if not more:
                        del dups[k]
                else:
                    del cached[k]
            elif more is not None and b in more:
                more.remove(b)
                if not more:
                    del dups[k]

    # ---------------------------------------------------------------- allocation
    def pop_new(self, n: int) -> list[int]:
        """Pop n blocks from the free-queue head (`get_new_blocks`); caller checked the count."""
        if n <= 0:
            return []
        buf, h = self._buf, self._head
        if n <= _FEW:
            out = buf[h:h + n].tolist()
            if not self._holes or _HOLE not in out:
                self._head = h + n
                self._num_free -= n
                ref = self._ref
                for b in out:
                    ref[b] = 1
                if self.enable_caching:
                    self._evict_few(out)
                return out
        if self._holes:
            window = buf[h:h + n + self._holes]
            live = np.flatnonzero(window)[:n]
            out = window[live]
            used = int(live[-1]) + 1
            self._holes -= used - n
        else:
            out = buf[h:h + n].copy()
            used = n
        self._head = h + used
        self._num_free -= n
        self._ref[out] = 1
        if self.enable_caching:
            self._evict(out)
        return out.tolist()

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix hit takes a reference; a hit sitting in the free queue leaves it."""
        idx = np.fromiter(blocks, _I64)
        ref = self._ref
        free = idx[ref[idx] == 0]
        if len(free):
            self._buf[self._pos[free]] = _HOLE
            self._holes += len(free)
            self._num_free -= len(free)
            if self._holes > max(self._num_free, 1024):
                self._recentre()     # keep pops' scans short (amortised: holes >= free blocks)
        ref[idx] += 1

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """Hit blocks that are currently free: touching them consumes free capacity."""
        idx = np.fromiter(blocks, _I64)
        return int(np.count_nonzero(self._ref[idx] == 0))

    def free(self, blocks: Sequence[int]) -> None:
        """Release one request's blocks (`free_blocks(reversed(req_blocks))`)."""
        idx = np.asarray(blocks, _I64)[::-1]
        r = self._ref[idx] - 1
        self._ref[idx] = r
        zero = idx[r == 0]
        if not len(zero):
            return
        # With caching off nothing is ever registered, so every block is unhashed.
        hashed = self._hashed[zero]
        self._prepend(zero[~hashed])       # no key: reused first (LIFO)
        self._append(zero[hashed])         # key: kept for prefix hits as long as possible (LRU)

    # ---------------------------------------------------------------- the ring
    def _prepend(self, blocks: np.ndarray) -> None:
        """Put `blocks` at the head, in this order (blocks[0] becomes the head)."""
        k = len(blocks)
        if not k:
            return
        if self._head < k:
            self._recentre()
        h = self._head - k
        self._buf[h:self._head] = blocks
        self._pos[blocks] = np.arange(h, self._head)
        self._head = h
        self._num_free += k

    def _append(self, blocks: np.ndarray) -> None:
        k = len(blocks)
        if not k:
            return
        if self._tail + k > len(self._buf):
            self._recentre()
        t = self._tail
        self._buf[t:t + k] = blocks
        self._pos[blocks] = np.arange(t, t + k)
        self._tail = t + k
        self._num_free += k

    def _recentre(self, live: np.ndarray | None = None) -> None:
        """Move the free blocks (holes dropped) to the middle of the ring."""
        if live is None:
            seg = self._buf[self._head:self._tail]
            live = seg[seg != _HOLE]
        n = len(live)
        h = (len(self._buf) - n) // 2
        self._buf[:] = _HOLE
        self._buf[h:h + n] = live
        self._pos[live] = np.arange(h, h + n)
        self._head, self._tail = h, h + n
        self._holes = 0
        self._num_free = n
