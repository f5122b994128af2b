"""The CPU tier of vLLM 0.33's OffloadingConnector (`CPUOffloadingManager` and its eviction
policies, `v1/kv_offload/cpu/`): which chunks the tier holds, whether their store has completed
(a chunk whose store is in flight is "pending": not evictable, and a lookup that reaches it is
deferred), which loads pin them, the all-or-nothing `prepare_store` (oracle README F15), and the
order of eviction, `LruPolicy` (F6) or `ArcPolicy` (F8). A chunk is named by its offload key:
with one GPU block per chunk, the block's prefix key, so a later request with the same prefix
finds it. The connector (replay/v1/offload.py) drives it. Must not import traces/, capacity/ or
torch.
"""
from __future__ import annotations

from collections import OrderedDict


# ------------------------------------------------------------------------------ eviction policies
class LruPolicy:
    """0.33's LRU over whole requests (F6): a request gets one rank when it first touches the tier
    (load, store or re-offer) and every chunk it touches takes that rank; chunks of one rank go
    tail first (higher chunk index first), so a partial eviction keeps a prompt's head (O3). A
    finished request's chunks all take a fresh rank when its finish is processed (O7 step 3)."""

    def __init__(self) -> None:
        self.rank_of: dict[int, int] = {}
        # rank -> {key: chunk index}
        self.groups: dict[int, dict[int, int]] = {}

    def place(self, key: int, idx: int, rank: int) -> None:
        old = self.rank_of.get(key)
        if old == rank:
            return
        if old is not None:
            self._drop(key, old)
        self.rank_of[key] = rank
        self.groups.setdefault(rank, {})[key] = idx

    def _drop(self, key: int, rank: int) -> None:
        g = self.groups[rank]
        del g[key]
        if not g:
            del self.groups[rank]

    def remove(self, key: int) -> None:
        self._drop(key, self.rank_of.pop(key))

    def _in_order(self):
        """Every chunk, next victim first (groups sorted as they are reached: an eviction
        usually needs only the oldest)."""
        for rank in sorted(self.groups):
            g = self.groups[rank]
            yield from sorted(g, key=g.__getitem__, reverse=True)

    def order(self) -> list[int]:
        return list(self._in_order())

    def victims(self, n: int, can_evict) -> list[int] | None:
        out: list[int] = []
        for k in self._in_order():
            if can_evict(k):
                out.append(k)
                if len(out) == n:
                    return out
        return None


class ArcPolicy:
    """0.33's ARC (F8): new chunks enter T1 (a key in ghost list B1 raises `target_t1`, one in B2
    lowers it, and the chunk still enters T1: O5_arc_prefix step 9); a chunk moves to T2 when a
    request that loaded or re-offered it finishes; eviction takes T1's least recently used chunk
    while T1 holds at least `target_t1` chunks, else T2's; evicted keys become ghosts."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.target_t1 = 0.0

    def insert(self, key: int) -> None:
        if key in self.b1:
            self.target_t1 = min(self.target_t1 + max(1.0, len(self.b2) / len(self.b1)),
                                 float(self.capacity))
            del self.b1[key]
        elif key in self.b2:
            self.target_t1 = max(self.target_t1 - max(1.0, len(self.b1) / len(self.b2)), 0.0)
            del self.b2[key]
        self.t1[key] = None

    def promote(self, keys: list[int], to_t2: set[int]) -> None:
        """A finished request's chunks: those it loaded or re-offered go to T2, the others are
        touched where they are."""
        for k in reversed(keys):
            if k in to_t2 and k in self.t1:
                del self.t1[k]
                self.t2[k] = None
            else:
                (self.t1 if k in self.t1 else self.t2).move_to_end(k)

    def remove(self, key: int) -> None:
        """Evicted: the key becomes a ghost of its list (each ghost list holds at most
        `capacity` keys, oldest dropped first)."""
        src, ghost = (self.t1, self.b1) if key in self.t1 else (self.t2, self.b2)
        del src[key]
        ghost[key] = None
        if len(ghost) > self.capacity:
            ghost.popitem(last=False)

    def victims(self, n: int, can_evict) -> list[int] | None:
        t1 = [k for k in self.t1 if can_evict(k)]
        t2 = [k for k in self.t2 if can_evict(k)]
        size_t1, out = len(self.t1), []
        while len(out) < n:
            if t1 and (size_t1 >= self.target_t1 or not t2):
                out.append(t1.pop(0))
                size_t1 -= 1
            elif t2:
                out.append(t2.pop(0))
            else:
                return None
        return out


# ------------------------------------------------------------------------------------ the tier
class CpuTier:
    """The CPU offloading manager: which chunks exist, whether their store has completed, which
    loads pin them, and the policy that orders them."""

    def __init__(self, *, capacity: int, policy: str) -> None:
        self.capacity = capacity
        self.ready: dict[int, bool] = {}     # key -> store completed (False: pending)
        self.num_pending = 0
        self.pins: dict[int, int] = {}       # key -> loads in flight
        self.idx: dict[int, int] = {}        # key -> chunk index (LRU order within a rank)
        self.lru = LruPolicy() if policy == "lru" else None
        self.arc = ArcPolicy(capacity) if policy == "arc" else None

    @property
    def num_used(self) -> int:
        return len(self.ready)

    def complete_store(self, keys) -> None:
        for k in keys:
            if k in self.ready and not self.ready[k]:
                self.ready[k] = True
                self.num_pending -= 1

    def can_evict(self, key: int) -> bool:
        return self.ready[key] and not self.pins.get(key)

    def touch(self, keys: list[int], rank: int) -> None:
        """A request (of `rank`) reuses, stores or loads these chunks (chunk order). ARC moves
        nothing until the request finishes (O5_arc_prefix step 3: a load leaves T1 as it is)."""
        if self.lru is not None:
            for k in keys:
                self.lru.place(k, self.idx[k], rank)

    def prepare_store(self, keys: list[int], idxs: list[int], protected: set[int],
                      rank: int) -> list[int] | None:
        """Room for every new chunk or none (F15): evict ready, unpinned chunks outside
        `protected` (the chunks offered with them) in policy order. Returns the evicted keys, or
        None when the store is dropped (nothing changes)."""
        need = len(keys) - (self.capacity - len(self.ready))
        evicted: list[int] = []
        if need > 0:
            policy = self.lru if self.lru is not None else self.arc
            evicted = policy.victims(need, lambda k: k not in protected and self.can_evict(k))
            if evicted is None:
                return None
            for k in evicted:
                policy.remove(k)
                del self.ready[k]
                del self.idx[k]
        self.num_pending += len(keys)
        for k, i in zip(keys, idxs):
            self.ready[k] = False
            self.idx[k] = i
            if self.lru is not None:
                self.lru.place(k, i, rank)
            else:
                self.arc.insert(k)
        return evicted

    def finish(self, keys: list[int], rank: int, reused: set[int]) -> None:
        """Commit a finished request's recency (F6, F8): its chunks still in the tier."""
        keys = [k for k in keys if k in self.ready]
        if self.lru is not None:
            for k in keys:
                self.lru.place(k, self.idx[k], rank)
        else:
            self.arc.promote(keys, reused)

    def lru_order(self) -> list[int]:
        """The evictable chunks, next victim first (the oracle's `cpu_lru_end`)."""
        return [k for k in self.lru.order() if self.can_evict(k)]

    def arc_state(self) -> dict:
        a = self.arc
        return {"t1": list(a.t1), "t2": list(a.t2), "b1": len(a.b1), "b2": len(a.b2),
                "target_t1": a.target_t1}
