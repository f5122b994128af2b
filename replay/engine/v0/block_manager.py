"""vLLM V0's block space manager (`SelfAttnBlockSpaceManager`, 0.10.1.1), reference A2, A8, G/D1, D3.

Owns the block table of every request holding KV (on the GPU or, when swapped, in the host pool),
the GPU and host `BlockPool`s, the admission / append / swap checks (OK / LATER / NEVER) and the
prefix-cache lookups (`get_num_cached_tokens` with vLLM's memo and bisect). Token contents are
represented only by `replay.engine.prefix` block keys. Does not own queues or request progress.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from enum import Enum

import numpy as np

from replay.engine.prefix import BlockKeys
from replay.engine.spec import SchedulerSpec, cdiv
from replay.engine.v0.block_pool import BlockPool


class AllocStatus(Enum):
    OK = "ok"
    LATER = "later"
    NEVER = "never"


def blocks_touched_by_append(num_full_slots: int, num_new_tokens: int, block_size: int) -> int:
    """vLLM's worst case: the block holding the next slot counts as touched even when it has room,
    so one unseen token always touches 1 block (G/D1); 0 new tokens touch 0 or 1 (partial tail)."""
    first_chunk = block_size - num_full_slots % block_size
    return 1 + cdiv(num_new_tokens - first_chunk, block_size)


class BlockManagerV0:
    def __init__(self, spec: SchedulerSpec, keys: BlockKeys) -> None:
        self.block_size = spec.block_size
        self.caching = spec.enable_prefix_caching
        self.keys = keys
        self.num_gpu_blocks = spec.num_gpu_blocks
        self.num_cpu_blocks = spec.num_cpu_blocks
        self.watermark_blocks = int(spec.v0_watermark * spec.num_gpu_blocks)
        self.gpu = BlockPool(first_id=0, num_blocks=spec.num_gpu_blocks, caching=self.caching)
        self.cpu = BlockPool(first_id=spec.num_gpu_blocks, num_blocks=spec.num_cpu_blocks,
                             caching=self.caching)
        # row -> block ids (GPU ids, or host ids while swapped); row -> tokens stored in the table.
        self.tables: dict[int, list[int]] = {}
        self.num_full_slots: dict[int, int] = {}
        # row -> last step the request was scheduled (vLLM `LastAccessBlocksTracker`, caching only).
        self.last_access: dict[int, float] = {}
        # row -> prefix-hit tokens remembered while the request is in prefill
        # (vLLM `ComputedBlocksTracker._seq_id_to_num_tokens_computed`).
        self.cached_tokens_memo: dict[int, int] = {}

    # ---------------------------------------------------------------- counts
    def num_free_gpu(self) -> int:
        return self.gpu.num_free()

    def num_free_cpu(self) -> int:
        return self.cpu.num_free()

    def _key(self, row: int, k: int) -> int | None:
        return self.keys.key(row, k) if self.caching else None

    # ---------------------------------------------------------------- admission
    def can_allocate(self, num_tokens: int) -> AllocStatus:
        """Whole-sequence admission with the 1 % watermark; prefix hits are not subtracted (A2)."""
        required = cdiv(num_tokens, self.block_size)
        if self.num_gpu_blocks - required < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.gpu.num_free() - required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, row: int, num_tokens: int) -> None:
        """Blocks for every known token: full blocks may hit the cache, the tail is fresh."""
        assert row not in self.tables
        b = self.block_size
        if not self.caching:
            ids = self.gpu.allocate_many(cdiv(num_tokens, b))
        else:
            ids = [self.gpu.allocate_full(self.keys.key(row, k)) for k in range(num_tokens // b)]
            if num_tokens % b:
                ids.append(self.gpu.allocate_new())
        self.tables[row] = ids
        self.num_full_slots[row] = num_tokens

    # ---------------------------------------------------------------- decode growth
    def can_append_slots(self, row: int, seq_len: int) -> bool:
        touched = blocks_touched_by_append(self.num_full_slots[row],
                                           seq_len - self.num_full_slots[row], self.block_size)
        return touched <= self.gpu.num_free()

    def append_slots(self, row: int, seq_len: int) -> None:
        """Store the unseen tokens; new blocks come first, then full blocks get registered."""
        b = self.block_size
        ids = self.tables[row]
        full = self.num_full_slots[row]
        num_new = seq_len - full
        empty = len(ids) * b - full
        if empty < num_new:
            n = cdiv(num_new - empty, b)
            ids.extend(self.gpu.allocate_many(n) if not self.caching
                       else [self.gpu.allocate_new() for _ in range(n)])
        if self.caching:
            for k in range(full // b, seq_len // b):
                ids[k] = self.gpu.promote(ids[k], self.keys.key(row, k))
        self.num_full_slots[row] = seq_len

    # ---------------------------------------------------------------- free
    def free(self, row: int) -> None:
        """Release the table (GPU or host). With caching, blocks first get the request's last
        access time, and full blocks go to the evictor in table order."""
        ids = self.tables.pop(row, None)
        last = self.last_access.pop(row, None)
        self.cached_tokens_memo.pop(row, None)
        if ids is None:
            return
        full = self.num_full_slots.pop(row) // self.block_size
        on_gpu = not ids or ids[0] < self.num_gpu_blocks
        pool = self.gpu if on_gpu else self.cpu
        if self.caching and last is not None and on_gpu:
            for block_id in ids:
                pool.mark_accessed(block_id, last)
        self._release(pool, row, ids, full)

    def _release(self, pool: BlockPool, row: int, ids: list[int], num_full: int) -> None:
        if not self.caching:
            pool.free_many(ids)
            return
        b = self.block_size
        for k, block_id in enumerate(ids):
            key = self._key(row, k) if k < num_full else None
            pool.free(block_id, key, (k + 1) * b)

    # ---------------------------------------------------------------- swap
    def _can_swap(self, row: int, seq_len: int, dst: BlockPool, watermark: int) -> tuple[AllocStatus, int]:
        """Blocks the destination must have: the append worst case plus the full blocks it does
        not already hold live (D3: one more than the swap itself occupies)."""
        ids = self.tables[row]
        full = self.num_full_slots[row]
        needed = blocks_touched_by_append(full, seq_len - full, self.block_size)
        num_full = full // self.block_size
        if self.caching:
            needed += sum(not dst.is_cached_live(self.keys.key(row, k)) for k in range(num_full))
        else:
            needed += min(num_full, len(ids))
        if dst.num_blocks < needed:
            return AllocStatus.NEVER, needed
        if dst.num_free() - needed >= watermark:
            return AllocStatus.OK, needed
        return AllocStatus.LATER, needed

    def can_swap_out(self, row: int, seq_len: int) -> tuple[AllocStatus, int]:
        return self._can_swap(row, seq_len, self.cpu, 0)

    def can_swap_in(self, row: int, seq_len: int) -> AllocStatus:
        return self._can_swap(row, seq_len, self.gpu, self.watermark_blocks)[0]

    def _swap(self, row: int, src: BlockPool, dst: BlockPool) -> np.ndarray:
        """Free every block on `src` first, then allocate each on `dst` (full blocks may hit the
        destination's cache). Returns (src, dst) physical id pairs in table order."""
        ids = self.tables[row]
        num_full = self.num_full_slots[row] // self.block_size
        self._release(src, row, ids, num_full)
        if not self.caching:
            new_ids = dst.allocate_many(len(ids))
        else:
            new_ids = [dst.allocate_full(self.keys.key(row, k)) if k < num_full
                       else dst.allocate_new() for k in range(len(ids))]
        self.tables[row] = new_ids
        pairs: dict[int, int] = {}
        for s, d in zip(ids, new_ids):
            pairs[src.physical(s)] = dst.physical(d)
        return np.array(list(pairs.items()), dtype=np.int64).reshape(-1, 2)

    def swap_out(self, row: int) -> np.ndarray:
        return self._swap(row, self.gpu, self.cpu)

    def swap_in(self, row: int) -> np.ndarray:
        return self._swap(row, self.cpu, self.gpu)

    # ---------------------------------------------------------------- prefix cache
    def touch(self, row: int, now: float) -> None:
        """The request was scheduled at `now` (its blocks get this time when freed)."""
        if self.caching:
            self.last_access[row] = now

    def mark_computed(self) -> None:
        if self.caching:
            self.gpu.mark_computed()

    def forget_cached_tokens(self, row: int) -> None:
        self.cached_tokens_memo.pop(row, None)

    def get_num_cached_tokens(self, row: int, seq_len: int, in_prefill: bool) -> int:
        """Tokens of the leading computed cached blocks. vLLM finds them by bisecting on "cached
        and computed" (exact only when that is monotone, as it copies), and remembers the answer
        while the request is in prefill."""
        if not self.caching:
            return 0
        memo = self.cached_tokens_memo.get(row)
        if memo is not None and in_prefill:
            return memo
        gpu, keys = self.gpu, self.keys

        def hit(k: int) -> bool:
            block_id = gpu.cached.get(keys.key(row, k))
            return block_id is not None and gpu.is_computed(block_id)

        lo, hi = 0, seq_len // self.block_size
        while lo < hi:
            mid = (lo + hi) // 2
            if hit(mid):
                lo = mid + 1
            else:
                hi = mid
        tokens = lo * self.block_size
        self.cached_tokens_memo[row] = tokens
        return tokens
