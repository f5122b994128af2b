"""The host-memory KV offload tier of kvcap's V1 "swap" mode (reference B8).

vLLM V1 has no swap; its closest feature is a CPU offload connector: a second-tier prefix cache
in host memory that evicts LRU and never blocks or aborts the engine. kvcap stores a preempted
request's full blocks here (so a resume can load them back instead of recomputing). Keys are the
same block keys as the GPU prefix cache. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class HostTier:
    __slots__ = ("num_blocks", "_lru", "_free")

    def __init__(self, *, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        # key -> host block id, least recently used first.
        self._lru: OrderedDict[int, int] = OrderedDict()
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...

    @property
    def num_used(self) -> int:
        return len(self._lru)

    def lookup(self, key: int) -> int | None:
        return self._lru.get(key)

    def store(self, gpu_blocks: Sequence[int], keys: Sequence[int]) -> list[tuple[int, int]]:
        """Copy full blocks out, prefix kept longest: at most `num_blocks` leading blocks are
        stored, the tail first so that the prefix ends up most recently used. Returns the
        (gpu_block, host_block) copies made (blocks already in the tier are only touched)."""
        n = min(len(keys), self.num_blocks)
        lru, free = self._lru, self._free
        copies: list[tuple[int, int]] = []
        for i in range(n - 1, -1, -1):
            k = keys[i]
            if k in lru:
                lru.move_to_end(k)
                continue
            host = free.pop() if free else lru.popitem(last=False)[1]
            lru[k] = host
            copies.append((gpu_blocks[i], host))
        return copies

    def load(self, keys: Sequence[int]) -> list[int]:
        """Host blocks of `keys` (all present), marked recently used."""
        lru = self._lru
        out = []
        for k in keys:
            lru.move_to_end(k)
            out.append(lru[k])
        return out
