"""The V1 GPU block pool: block ids, reference counts, the free queue and the prefix-cache map.

Mirrors vLLM 0.33 `vllm/v1/core/block_pool.py` + `kv_cache_utils.FreeKVCacheBlockQueue` (reference
B3, B5): block 0 is the null block and never handed out; allocation pops the head of the free queue;
a freed request's blocks come back tail first, unhashed ones prepended (reused first, ≥0.27) and
hashed ones appended (LRU); a cached block stays in the free queue with its key until it is popped
for reuse (lazy eviction); touching a free hit block takes it out of the middle of the queue.

The free queue is an `OrderedDict` used as an O(1) doubly linked list. Owns no request state.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK = 0


class BlockPool:
    __slots__ = ("num_blocks", "enable_caching", "ref", "free_queue", "key_of", "cached", "dups")

    def __init__(self, *, num_blocks: int, enable_caching: bool) -> None:
        # vLLM's own count, null block included.
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        # block -> its key, for hashed (registered) blocks only.
        self.key_of: dict[int, int] = {}
        # key -> the block a lookup returns (the first registered with that key).
        self.cached: dict[int, int] = {}
        # key -> further blocks with the same content, in registration order. Two requests that
        # compute the same block in one step keep two copies (vLLM does not de-duplicate).
        self.dups: dict[int, list[int]] = {}

    # ---------------------------------------------------------------- gauges
    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_used(self) -> int:
        """Referenced blocks (cached but unreferenced blocks count as free, as in vLLM)."""
        return self.num_blocks - 1 - len(self.free_queue)

    def usage(self) -> float:
        """vLLM 0.33 `get_usage`: the null block is not in the denominator."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self.free_queue) / usable

    # ---------------------------------------------------------------- cache map
    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def register(self, blocks: Sequence[int], keys: Sequence[int]) -> None:
        """Give full blocks their keys (`cache_full_blocks`)."""
        cached = self.cached
        if cached.keys().isdisjoint(keys):
            # Common case: fresh content; one C-level update instead of a loop.
            cached.update(zip(keys, blocks))
            self.key_of.update(zip(blocks, keys))
            return
        for b, k in zip(blocks, keys):
            first = cached.get(k)
            if first is None:
                cached[k] = b
            elif first != b and b not in self.dups.get(k, ()):
                self.dups.setdefault(k, []).append(b)
            self.key_of[b] = k

    def _evict(self, block: int) -> None:
        """Drop a reused block's key from the cache (`_maybe_evict_cached_block`)."""
        k = self.key_of.pop(block, None)
        if k is None:
            return
        more = self.dups.get(k)
        if self.cached.get(k) == block:
            if more:
                self.cached[k] = more.pop(0)
                if not more:
                    del self.dups[k]
            else:
                del self.cached[k]
        elif more is not None and block in more:
            more.remove(block)
            if not more:
                del self.dups[k]

    # ---------------------------------------------------------------- allocation
    def pop_new(self, n: int) -> list[int]:
        """Pop n blocks from the free-queue head (`get_new_blocks`); caller checked the count."""
        if n <= 0:
            return []
        popitem = self.free_queue.popitem
        out = [popitem(last=False)[0] for _ in range(n)]
        ref = self.ref
        if self.key_of:
            evict, key_of = self._evict, self.key_of
            for b in out:
                ref[b] = 1
                if b in key_of:
                    evict(b)
        else:
            for b in out:
                ref[b] = 1
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix hit takes a reference; a hit sitting in the free queue leaves it."""
        ref, fq = self.ref, self.free_queue
        for b in blocks:
            if ref[b] == 0:
                del fq[b]
            ref[b] += 1

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """Hit blocks that are currently free: touching them consumes free capacity."""
        ref = self.ref
        return sum(1 for b in blocks if ref[b] == 0)

    def free(self, blocks: Sequence[int]) -> None:
        """Release one request's blocks (`free_blocks(reversed(req_blocks))`)."""
        ref, key_of, caching = self.ref, self.key_of, self.enable_caching
        first: list[int] = []   # no key: reused first (prepended, LIFO)
        last: list[int] = []    # key: kept for prefix hits as long as possible (appended, LRU)
        for b in reversed(blocks):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if caching and b in key_of:
                    last.append(b)
                else:
                    first.append(b)
        fq = self.free_queue
        if first:
            move = fq.move_to_end
            for b in reversed(first):
                fq[b] = None
                move(b, last=False)
        if last:
            fq.update(dict.fromkeys(last))

    def free_order(self) -> list[int]:
        return list(self.free_queue)
