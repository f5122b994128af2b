"""The V1 GPU block pool: block ids, reference counts, the free queue and the prefix-cache map.

Mirrors vLLM 0.33 `vllm/v1/core/block_pool.py` + `kv_cache_utils.FreeKVCacheBlockQueue` (reference
B3, B5): block 0 is the null block and never handed out; allocation pops the head of the free queue;
a freed request's blocks come back tail first, unhashed ones prepended (reused first, >=0.27) and
hashed ones appended (LRU); a cached block stays in the free queue with its key until it is popped
for reuse (lazy eviction, `_maybe_evict_cached_block`); touching a free hit block takes it out of the
middle of the queue. The free queue is an insertion-ordered dict (vLLM: a doubly linked list): O(1)
pops at the head, removal from the middle, appends and prepends.
Owns no request state. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

NULL_BLOCK = 0


class BlockPool:
    __slots__ = ("num_blocks", "enable_caching", "_ref", "_key", "cached", "dups", "_free")

    def __init__(self, *, num_blocks: int, enable_caching: bool) -> None:
        # vLLM's own count, null block included.
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        # block -> its key, for registered blocks not yet evicted (vLLM `block.block_hash`).
        self._key: dict[int, int] = {}
        # key -> the block a lookup returns (the first registered with that key).
        self.cached: dict[int, int] = {}
        # key -> further blocks with the same content, in registration order. Two requests that
        # compute the same block in one step keep two copies (vLLM does not de-duplicate).
        self.dups: dict[int, list[int]] = {}
        # The free queue, head first: every block but the null block, in id order.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    # ---------------------------------------------------------------- gauges
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Referenced blocks (cached but unreferenced blocks count as free, as in vLLM)."""
        return self.num_blocks - 1 - len(self._free)

    def usage(self) -> float:
        """vLLM 0.33 `get_usage`: the null block is not in the denominator."""
        usable = self.num_blocks - 1
        return 0.0 if usable == 0 else 1.0 - len(self._free) / usable

    # ---------------------------------------------------------------- views (tests, snapshots)
    @property
    def free_queue(self) -> list[int]:
        """The free queue, head first (a copy)."""
        return list(self._free)

    @property
    def ref(self) -> list[int]:
        """Reference count of every block (a copy)."""
        return list(self._ref)

    @property
    def key_of(self) -> dict[int, int]:
        """block -> its key, for hashed (registered) blocks only (a copy)."""
        return dict(self._key)

    # ---------------------------------------------------------------- cache map
    def lookup(self, key: int) -> int | None:
        return self.cached.get(key)

    def register(self, blocks: Sequence[int], keys: Sequence[int]) -> None:
        """Give full blocks their keys (`cache_full_blocks`)."""
        cached, dups = self.cached, self.dups
        for b, k in zip(blocks, keys):
            first = cached.get(k)
            if first is None:
                cached[k] = b
            elif first != b and b not in dups.get(k, ()):
                dups.setdefault(k, []).append(b)
            self._key[b] = k

    def _evict(self, b: int) -> None:
        """Drop a reused block's key from the cache (`_maybe_evict_cached_block`)."""
        k = self._key.pop(b, None)
        if k is None:
            return
        more = self.dups.get(k)
        if self.cached.get(k) == b:
            if more:
                self.cached[k] = more.pop(0)
                if not more:
                    del self.dups[k]
            else:
                del self.cached[k]
        elif more is not None and b in more:
            more.remove(b)
            if not more:
                del self.dups[k]

    # ---------------------------------------------------------------- allocation
    def pop_new(self, n: int) -> list[int]:
        """Pop n blocks from the free-queue head (`get_new_blocks`); caller checked the count."""
        out = []
        for _ in range(max(n, 0)):
            b, _ = self._free.popitem(last=False)
            self._ref[b] = 1
            if self.enable_caching:
                self._evict(b)
            out.append(b)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix hit takes a reference; a hit sitting in the free queue leaves it."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """Hit blocks that are currently free: touching them consumes free capacity."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def free(self, blocks: Sequence[int]) -> None:
        """Release one request's blocks (`free_blocks(reversed(req_blocks))`): the blocks that
        reach ref 0 without a key go to the head (tail block first), those with a key to the end
        (tail block first), so a cached prefix stays hit-able as long as possible."""
        unhashed: list[int] = []
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if b in self._key:
                    self._free[b] = None
                else:
                    unhashed.append(b)
        for b in reversed(unhashed):       # unhashed[0] ends at the head
            self._free[b] = None
            self._free.move_to_end(b, last=False)
