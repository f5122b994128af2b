"""The CPU tier of vLLM 0.33's OffloadingConnector: `CPUOffloadingManager` and its eviction
policies (`v1/kv_offload/cpu/manager.py`, `policies/lru.py`, `policies/arc.py`), rule for rule:
which chunks the tier holds, whether their store has completed (a chunk whose store is in flight
is "pending": not evictable, and a lookup that reaches it is deferred), which loads pin them, the
all-or-nothing `prepare_store` (oracle README F15) and its `store_threshold` offer counts
(`OfferCounts`: 0.33 counts every offer, O1_threshold), what each request has seen of the tier (the
manager's per-request access record) and the order of eviction, `LruPolicy` (F6) or `ArcPolicy`
(F8). A chunk is named by its offload key: with one GPU block per chunk, the block's prefix key,
so a later request with the same prefix finds it; its position in a request is its chunk index.
The connector (replay/engine/v1/offload.py) drives it. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True, kw_only=True)
class Access:
    """What one request has done with the tier, kept across its preemptions until it finishes
    (vLLM `_RequestCacheAccess` plus the LRU policy's `_RequestRank`)."""
    # LRU: the request's rank, taken the first time the policy sees it (its first recorded
    # access or insertion), shared by all its chunks (`_get_request_rank`).
    rank: int | None = None
    # Keys it has recorded (`seen_keys`), with their chunk index (the offload key position).
    seen: dict[int, int] = field(default_factory=dict)
    inserted: set[int] = field(default_factory=set)
    # Ready chunks it loaded or re-offered, but not ones it inserted itself (`reused_keys`).
    reused: set[int] = field(default_factory=set)
    # Keys already reported to ARC as store misses (`store_miss_keys`: one ghost hit each).
    store_miss: set[int] = field(default_factory=set)
    # 0.34: keys it has counted toward the store threshold (`counted_keys`: each once).
    counted: set[int] = field(default_factory=set)


# ------------------------------------------------------------------------------ eviction policies
class LruPolicy:
    """0.33's `LRUCachePolicy`: each chunk has a rank (hi, lo), next victim = lowest. A chunk a
    request stores or first sees takes (request rank, -position), so a request's chunks go tail
    first (O3) and share one rank across the steps it runs; a first sighting only ever raises a
    rank (`on_request_access`: `if self._ranks[key] >= rank: continue`). When the request's finish
    is processed every chunk it saw still in the tier takes a fresh rank (next, 0), tail first
    (`on_request_finished`, O7 step 3). Evictable chunks (ready, unpinned) sit in a min-heap with
    lazy invalidation, as vLLM's."""

    def __init__(self) -> None:
        self.rank: dict[int, tuple[int, int]] = {}
        self.next_rank = 0
        self.evictable: set[int] = set()
        self.heap: list[tuple[tuple[int, int], int]] = []

    def request_rank(self, acc: Access) -> int:
        if acc.rank is None:
            self.next_rank += 1
            acc.rank = self.next_rank
        return acc.rank

    def _set(self, key: int, rank: tuple[int, int]) -> None:
        self.rank[key] = rank
        if key in self.evictable:
            self._push(key)

    def _push(self, key: int) -> None:
        heapq.heappush(self.heap, (self.rank[key], key))
        if len(self.heap) >= max(64, 2 * len(self.evictable)):
            # Drop the stale entries (vLLM `_maybe_compact_heap`).
            self.heap = [(self.rank[k], k) for k in self.evictable]
            heapq.heapify(self.heap)

    def insert(self, key: int, idx: int, acc: Access) -> None:
        self.rank[key] = (self.request_rank(acc), -(idx + 1))

    def on_request_access(self, keys: list[tuple[int, int]], acc: Access) -> None:
        r = self.request_rank(acc)     # taken even when none of the keys is in the tier
        for key, idx in keys:
            old = self.rank.get(key)
            if old is not None and old < (r, -(idx + 1)):
                self._set(key, (r, -(idx + 1)))

    def on_request_finished(self, keys_head_first: list[int]) -> None:
        for key in reversed(keys_head_first):
            if key in self.rank:
                self.next_rank += 1
                self._set(key, (self.next_rank, 0))

    def mark_evictable(self, key: int) -> None:
        self.evictable.add(key)
        self._push(key)

    def mark_non_evictable(self, key: int) -> None:
        self.evictable.discard(key)

    def remove(self, key: int) -> None:
        del self.rank[key]
        self.evictable.discard(key)

    def _current(self, entry) -> bool:
        rank, key = entry
        return key in self.evictable and self.rank.get(key) == rank

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        """The n lowest-ranked evictable chunks outside `protected`, or None (nothing changes)."""
        selected, deferred, keys = [], [], set()
        while self.heap and len(selected) < n:
            entry = heapq.heappop(self.heap)
            if not self._current(entry) or entry[1] in keys:
                continue
            if entry[1] in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            keys.add(entry[1])
        for entry in deferred + (selected if len(selected) < n else []):
            heapq.heappush(self.heap, entry)
        if len(selected) < n:
            return None
        out = [key for _, key in selected]
        for key in out:
            self.remove(key)
        return out

    def order(self) -> list[int]:
        """The evictable chunks, next victim first (the oracle's `cpu_lru_end`)."""
        return sorted(self.evictable, key=self.rank.__getitem__)


class ArcPolicy:
    """0.33's `ARCCachePolicy`: new chunks enter T1 (and leave the ghost lists); a store miss on a
    ghost key adapts `target_t1` once per request, before the insertion, even when the store then
    fails (B1: up by max(1, |B2|/|B1|), B2: down by max(1, |B1|/|B2|), the ghost moves to its list's
    MRU end); when a request's finish is processed, tail first, the ready chunks it reused move to
    T2 (or to T2's MRU end) and those it only inserted move to their list's MRU end (F8); eviction
    takes T1's LRU evictable chunk while |T1| (as the selection goes) >= int(target_t1), else T2's,
    else T1's; evicted keys become ghosts, each ghost list trimmed to the capacity."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.target_t1 = 0.0

    def insert(self, key: int) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_store_miss(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.b1:
                self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)),
                                     self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def on_request_finished(self, keys_head_first: list[int], acc: Access) -> None:
        only_inserted = acc.inserted - acc.reused
        for key in reversed(keys_head_first):
            if key in only_inserted:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in acc.reused and key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in acc.reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[int], can_evict) -> list[int] | None:
        ok = lambda k: can_evict(k) and k not in protected  # noqa: E731
        t1 = (k for k in self.t1 if ok(k))
        t2 = (k for k in self.t2 if ok(k))
        size_t1, picked = len(self.t1), []
        for _ in range(n):
            key = next(t1, None) if size_t1 >= int(self.target_t1) else None
            from_t1 = key is not None
            if key is None:
                key = next(t2, None)
            if key is None:
                key, from_t1 = next(t1, None), True
                if key is None:
                    return None
            size_t1 -= from_t1
            picked.append((key, from_t1))
        for key, from_t1 in picked:
            del (self.t1 if from_t1 else self.t2)[key]
            (self.b1 if from_t1 else self.b2)[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return [k for k, _ in picked]


# ----------------------------------------------------------------------- the store threshold
class OfferCounts:
    """The `store_threshold` tracker (`CPUOffloadingManager.counts`, `_record_accesses`): how
    many times each offload key has been offered for storing. An offer first counts again the
    keys already tracked, in order (each moves to the most recent end), then tracks its new keys
    at 1; a new key that finds the tracker full drops the least recently offered key outside
    this offer, or is not tracked when every tracked key is in the offer. 0.33 counts every offer;
    0.34 passes the keys the offering request has counted before (`counted_keys`), which move to
    the most recent end without counting again."""

    def __init__(self, *, threshold: int, max_keys: int) -> None:
        self.threshold = threshold
        self.max_keys = max_keys
        self.counts: OrderedDict[int, int] = OrderedDict()

    def offer(self, keys: list[int], counted: set[int] = frozenset()) -> list[bool]:
        """Count one offer; for each key, whether it has now been offered `threshold` times."""
        counts = self.counts
        protected = set()
        for k in keys:
            if k in counts:
                counts.move_to_end(k)
                if k not in counted:
                    counts[k] += 1
                protected.add(k)
        unprotected = len(counts) - len(protected)
        for k in keys:
            if k in counts:
                continue
            if len(counts) >= self.max_keys:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[k] = 1
        return [counts.get(k, 0) >= self.threshold for k in keys]


# ------------------------------------------------------------------------------------ the tier
class CpuTier:
    """The CPU offloading manager: which chunks exist, whether their store has completed, which
    loads pin them, each request's access record, and the policy that orders them."""

    def __init__(self, *, capacity: int, policy: str, store_threshold: int = 0,
                 tracker_size: int = 64_000, once_per_request: bool = False) -> None:
        self.capacity = capacity
        # 0.34: each key counts once per request toward the store threshold.
        self.once_per_request = once_per_request
        # Offers counted only from a threshold of 2 on (vLLM: `counts` is None below).
        self.offers = (OfferCounts(threshold=store_threshold, max_keys=tracker_size)
                       if store_threshold >= 2 else None)
        self.ready: dict[int, bool] = {}     # key -> store completed (False: pending)
        self.num_pending = 0
        self.pins: dict[int, int] = {}       # key -> loads in flight
        self.lru = LruPolicy() if policy == "lru" else None
        self.arc = ArcPolicy(capacity) if policy == "arc" else None

    @property
    def num_used(self) -> int:
        return len(self.ready)

    def can_evict(self, key: int) -> bool:
        return self.ready[key] and not self.pins.get(key)

    def _record(self, acc: Access, keys: list[tuple[int, int]], reused: list[int]) -> None:
        """`_record_request_cache_access`: the keys the request sees for the first time go to the
        policy (LRU raises their rank); ready chunks it reuses are remembered for its finish."""
        new = [(k, i) for k, i in keys if k not in acc.seen]
        for k, i in new:
            acc.seen[k] = i
        if new and self.lru is not None:
            self.lru.on_request_access(new, acc)
        acc.reused.update(k for k in reused if k not in acc.inserted)

    def prepare_store(self, acc: Access, keys: list[int], idxs: list[int]) -> \
            tuple[list[int], list[int]] | None:
        """An offer of chunks (key, index): the ones not in the tier are stored if all of them fit
        after evicting ready, unpinned chunks outside the offer in policy order (F15). Ready
        chunks of the offer count as reused; pending ones (another request's store in flight) are
        neither stored nor recorded. The request's access is recorded before the fit is known,
        so a failed store still ranks what it offered (and ARC adapts to its ghost hits).
        With a store threshold the offer is counted first, and only the missing chunks offered
        often enough are stored (and recorded); ready ones count as reused whatever their count,
        and the whole offer stays protected from the evictions.
        Returns (keys stored, keys evicted), or None when the store is dropped."""
        new = [k for k in keys if k not in self.ready]
        ready = [k for k in keys if self.ready.get(k)]
        if self.offers is not None:
            counted = acc.counted if self.once_per_request else frozenset()
            keep = dict(zip(keys, self.offers.offer(keys, counted)))
            new = [k for k in new if keep[k]]
            if self.once_per_request:
                acc.counted.update(keys)
        if self.arc is not None:
            misses = [k for k in new if k not in acc.store_miss]
            self.arc.on_store_miss(misses)
            acc.store_miss.update(misses)
        recorded = set(new) | set(ready)
        self._record(acc, [(k, i) for k, i in zip(keys, idxs) if k in recorded], ready)
        if not new:
            return [], []
        need = len(new) - (self.capacity - len(self.ready))
        evicted: list[int] = []
        if need > 0:
            if self.lru is not None:
                evicted = self.lru.evict(need, set(keys))
            else:
                evicted = self.arc.evict(need, set(keys), self.can_evict)
            if evicted is None:
                return None
            for k in evicted:
                del self.ready[k]
        idx_of = dict(zip(keys, idxs))
        for k in new:
            self.ready[k] = False
            if self.lru is not None:
                self.lru.insert(k, idx_of[k], acc)
            else:
                self.arc.insert(k)
        self.num_pending += len(new)
        acc.inserted.update(new)
        return new, evicted

    def complete_store(self, keys) -> None:
        for k in keys:
            if k in self.ready and not self.ready[k]:
                self.ready[k] = True
                self.num_pending -= 1
                if self.lru is not None:
                    self.lru.mark_evictable(k)

    def prepare_load(self, acc: Access, keys: list[int], idxs: list[int]) -> None:
        """Pin the chunks a load reads (they are ready: the lookup said so) and record them as
        reused."""
        for k in keys:
            self.pins[k] = self.pins.get(k, 0) + 1
            if self.lru is not None:
                self.lru.mark_non_evictable(k)
        self._record(acc, list(zip(keys, idxs)), keys)

    def complete_load(self, keys) -> None:
        for k in keys:
            self.pins[k] -= 1
            if not self.pins[k]:
                del self.pins[k]
                if self.lru is not None:
                    self.lru.mark_evictable(k)

    def on_request_finished(self, acc: Access) -> None:
        """Commit a finished request's recency (F6, F8): every key it recorded, head first."""
        keys = sorted(acc.seen, key=acc.seen.__getitem__)
        if self.lru is not None:
            self.lru.on_request_finished(keys)
        else:
            self.arc.on_request_finished(keys, acc)

    def lru_order(self) -> list[int]:
        return self.lru.order()

    def arc_state(self) -> dict:
        a = self.arc
        return {"t1": list(a.t1), "t2": list(a.t2), "b1": len(a.b1), "b2": len(a.b2),
                "target_t1": a.target_t1}
