"""The V1 KV cache manager: per-request block tables over one `BlockPool` (reference B3, B5).

Mirrors vLLM 0.33 `KVCacheManager` + `FullAttentionManager` for one full-attention group:
`get_computed_blocks` (longest run of cached full blocks, at most `num_tokens - 1` tokens),
`allocate_slots` (the `need` formula with hit blocks that are currently free, the
`scheduler_reserve_full_isl` gate and the watermark) and registering full blocks in the prefix cache
at scheduling time. Owns the block tables; the scheduler owns the queues and the request counters.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from replay.engine.prefix import BlockKeys
from replay.engine.spec import cdiv
from replay.engine.v1.block_pool import BlockPool


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """What `allocate_slots` needs to know about a request that is not yet running."""
    # GPU prefix-cache hit blocks (touched on success).
    hit_blocks: tuple[int, ...] = ()
    # Full sequence (vLLM `request.num_tokens`) for the full-ISL gate.
    num_tokens: int = 0
    full_sequence_must_fit: bool = False
    watermark_blocks: int = 0
    # Blocks the CPU offloading tier loads (the connector's external hit): they take new GPU
    # blocks but count as computed.
    num_loaded_blocks: int = 0
    # Free blocks the admission must leave to others (vLLM `reserved_blocks`: what in-flight
    # prefills still need, for an async CPU load).
    reserved_blocks: int = 0


class KVCacheManager:
    __slots__ = ("pool", "block_size", "max_model_len", "keys", "tables", "held", "num_cached")

    def __init__(self, *, num_rows: int, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool, keys: BlockKeys) -> None:
        self.pool = BlockPool(num_blocks=num_blocks, enable_caching=enable_caching)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.keys = keys
        # row -> block ids in token order (only rows that hold blocks).
        self.tables: dict[int, list[int]] = {}
        # Per row: blocks held (the table's length) and how many leading blocks of the table are
        # registered in the cache.
        self.held = [0] * num_rows
        self.num_cached = [0] * num_rows

    # ---------------------------------------------------------------- lookup
    def get_computed_blocks(self, row: int, num_tokens: int) -> list[int]:
        """Longest run of cached full blocks from block 0, capped at `num_tokens - 1` tokens (the
        last token is always recomputed for its logits)."""
        if not self.pool.enable_caching:
            return []
        max_blocks = (num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return []
        hits: list[int] = []
        for k in range(max_blocks):
            b = self.pool.lookup(self.keys.key(row, k))
            if b is None:
                break
            hits.append(b)
        return hits

    # ---------------------------------------------------------------- allocation
    def num_blocks_needed(self, row: int, num_new_tokens: int, adm: Admission) -> int | None:
        """Blocks `allocate_slots` would take for an admission (None when it would fail)."""
        pool = self.pool
        free = pool.num_free
        hits = adm.hit_blocks
        nh = len(hits) + adm.num_loaded_blocks
        evictable = pool.num_evictable(hits) if hits else 0
        total_computed = min(nh * self.block_size, self.max_model_len)
        if adm.full_sequence_must_fit:
            full = min(adm.num_tokens, self.max_model_len)
            need_full = max(cdiv(full, self.block_size) - len(hits), 0) + evictable
            if need_full + adm.watermark_blocks > free:
                return None
        slots = min(total_computed + num_new_tokens, self.max_model_len)
        need = max(cdiv(slots, self.block_size) - len(hits), 0) + evictable
        if need + adm.watermark_blocks > free - adm.reserved_blocks:
            return None
        return need

    def grow(self, row: int, num_new_tokens: int, num_computed: int,
             num_tokens: int) -> list[int] | None:
        """`allocate_slots` for a running request (no prefix hit, no full-ISL gate, no
        watermark; the scheduler keeps its tokens below max_model_len): None (and no change)
        when the new blocks do not fit; else the new blocks."""
        pool, bs = self.pool, self.block_size
        end = num_computed + num_new_tokens
        need = cdiv(end, bs) - self.held[row]
        new: list[int] = []
        if need > 0:
            if need > pool.num_free:
                return None
            new = pool.pop_new(need)
            self.tables[row].extend(new)
            self.held[row] += need
        # (cache_blocks inlined: this runs for every running request in every step)
        if pool.enable_caching:
            n_full = (end if end < num_tokens else num_tokens) // bs
            nc = self.num_cached[row]
            if nc < n_full:
                pool.register(self.tables[row][nc:n_full], self.keys.keys(row, nc, n_full))
                self.num_cached[row] = n_full
        return new

    def allocate_slots(self, row: int, num_new_tokens: int, num_tokens: int,
                       adm: Admission, *, delay_cache: bool = False) -> list[int] | None:
        """Admit `row`: touch its hits (they head its new table), give it slots for
        `num_new_tokens` tokens after them; None (and no change) if they do not fit. Returns the
        newly popped blocks (the CPU load's blocks first, in table order). `delay_cache`: blocks a
        CPU load will fill are registered once the load is done (vLLM `delay_cache_blocks`)."""
        if self.num_blocks_needed(row, num_new_tokens, adm) is None:
            return None
        pool = self.pool
        hits = adm.hit_blocks
        if hits:
            pool.touch(hits)
        table = self.tables[row] = list(hits)
        self.num_cached[row] = len(hits)
        self.held[row] = len(hits)
        computed = (len(hits) + adm.num_loaded_blocks) * self.block_size
        slots = min(computed + num_new_tokens, self.max_model_len)
        n_new = cdiv(slots, self.block_size) - len(table)
        new = pool.pop_new(n_new) if n_new > 0 else []
        if new:
            table.extend(new)
            self.held[row] += len(new)
        if not delay_cache:
            self.cache_blocks(row, min(computed + num_new_tokens, num_tokens))
        return new

    def extend_held(self, row: int, num_new_tokens: int, num_computed: int, num_tokens: int,
                    adm: Admission) -> list[int] | None:
        """`allocate_slots` for a waiting request that already holds blocks (its CPU load is done,
        vLLM's kv_holding_waiting): the full-ISL gate and the watermark as at any admission, its
        held blocks count as allocated. None (and no change) if the slots do not fit."""
        pool, held = self.pool, self.held[row]
        free = pool.num_free
        if adm.full_sequence_must_fit:
            whole = cdiv(min(adm.num_tokens, self.max_model_len), self.block_size)
            need_full = max(whole - held, 0)
            if need_full + adm.watermark_blocks > free:
                return None
        end = min(num_computed + num_new_tokens, self.max_model_len)
        need = max(cdiv(end, self.block_size) - held, 0)
        if need + adm.watermark_blocks > free:
            return None
        new = pool.pop_new(need)
        self.tables[row].extend(new)
        self.held[row] += need
        self.cache_blocks(row, min(num_computed + num_new_tokens, num_tokens))
        return new

    def cache_blocks(self, row: int, num_tokens: int) -> None:
        """Register the full blocks covered by `num_tokens` (done when scheduled, not computed)."""
        if not self.pool.enable_caching:
            return
        nc, n_full = self.num_cached[row], num_tokens // self.block_size
        if nc < n_full:
            self.pool.register(self.tables[row][nc:n_full], self.keys.keys(row, nc, n_full))
            self.num_cached[row] = n_full

    def free(self, row: int) -> list[int]:
        """Release a request's blocks, tail first. Returns its table."""
        table = self.tables.pop(row, [])
        self.num_cached[row] = 0
        self.held[row] = 0
        if table:
            self.pool.free(table)
        return table
