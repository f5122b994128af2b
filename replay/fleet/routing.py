"""The routers of a fleet replay that need no replica state (replay/fleet/run.py has lor).

- `rr`: round robin, the i-th request (arrival order) goes to replica i mod N;
- `prefix`: affinity by consistent hashing (`VNODES` points per replica on a 64-bit ring) of the
  request's session key: its first prefix hash past the hashes every request of the trace shares
  (Mooncake's conversation trace opens every request with hash 0, a common system prompt, so the
  key is `hash_ids[1]`, the conversation), else its tenant, else its request id. Adding a replica
  moves only the keys its ring points take over. `balance_note` says when the keys cannot spread
  the trace (one key for most requests).
Must not import traces/, capacity/ or duckdb.
"""
from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np
import polars as pl

Router = Literal["rr", "lor", "prefix"]
ROUTERS: tuple[str, ...] = ("rr", "lor", "prefix")
VNODES = 64                       # ring points per replica (load spread of consistent hashing)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fixed, well-spread 64-bit hash (the same in every process)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def shared_prefix_len(trace: pl.DataFrame) -> int:
    """How many leading prefix hashes every request with hashes has in common (0 without)."""
    ph = trace["prefix_hashes"].drop_nulls()
    ph = ph.filter(ph.list.len() > 0)
    if ph.len() < 2:
        return 0
    k, n = 0, int(ph.list.len().min())
    while k < n and ph.list.get(k).n_unique() == 1:
        k += 1
    return k


def session_keys(trace: pl.DataFrame) -> np.ndarray:
    """Each request's affinity key (uint64): its first prefix hash past the trace's shared ones
    (its last hash when it has no other), else tenant, else request id."""
    n = trace.height
    rid = trace["request_id"].to_numpy().astype(np.uint64)
    keys = _mix64(rid ^ np.uint64(0x5EED))
    tenant = trace["tenant"]
    if tenant.null_count() < n:
        names = tenant.fill_null("").to_list()
        digest = {t: int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
                  for t in set(names)}
        have = tenant.is_not_null().to_numpy()
        keys = np.where(have, np.array([digest[t] for t in names], dtype=np.uint64), keys)
    ph = trace["prefix_hashes"]
    if ph.null_count() < n:
        skip = shared_prefix_len(trace)
        first = ph.list.get(skip, null_on_oob=True).fill_null(ph.list.last()) if skip else ph.list.first()
        have = first.is_not_null().to_numpy()
        keys = np.where(have, first.fill_null(0).to_numpy().astype(np.uint64), keys)
    return keys


def ring_assign(keys: np.ndarray, replicas: int, vnodes: int = VNODES) -> np.ndarray:
    """Consistent hashing: each key goes to the owner of the first ring point at or after its
    hash (wrapping). Adding a replica moves only the keys its points take over."""
    owner = np.repeat(np.arange(replicas, dtype=np.int64), vnodes)
    points = _mix64((owner.astype(np.uint64) << np.uint64(32))
                    | np.tile(np.arange(vnodes, dtype=np.uint64), replicas))
    order = np.argsort(points, kind="stable")
    points, owner = points[order], owner[order]
    # Keys hash with a salt: unsalted, key k < vnodes hashed onto replica 0's own point k (small
    # Mooncake hash ids all went to replica 0).
    idx = np.searchsorted(points, _mix64(keys ^ np.uint64(0x9E3779B97F4A7C15)), side="left") % len(points)
    return owner[idx]


def static_assignment(trace: pl.DataFrame, replicas: int, router: str) -> np.ndarray:
    """rr / prefix: the replica of every row (arrival order), from the trace alone."""
    if router == "rr":
        return np.arange(trace.height, dtype=np.int64) % replicas
    if router == "prefix":
        return ring_assign(session_keys(trace), replicas)
    raise ValueError(f"router {router!r} depends on replica state; it has no static assignment")


def balance_note(trace: pl.DataFrame, replicas: int, assignment: np.ndarray) -> str | None:
    """One line when `prefix` affinity cannot spread this trace over the replicas (one replica
    gets most requests: too few distinct session keys, or one key holds most requests); None
    when it spreads it."""
    n = len(assignment)
    if replicas < 2 or n < 2:
        return None
    counts = np.bincount(assignment, minlength=replicas)
    top = int(counts.max())
    if top <= min(0.75, 2.0 / replicas) * n:
        return None
    keys = session_keys(trace)
    distinct, per_key = np.unique(keys, return_counts=True)
    skip = shared_prefix_len(trace) if trace["prefix_hashes"].null_count() < trace.height else 0
    what = (f"the first prefix hash past the {skip} every request shares" if skip
            else "the first prefix hash, tenant or request id")
    return (f"--router prefix: replica {int(counts.argmax())} gets {top:,} of {n:,} requests: the "
            f"trace has {len(distinct):,} distinct session keys ({what}), the largest holding "
            f"{int(per_key.max()):,} requests, so prefix affinity cannot spread it over {replicas} "
            "replicas; --router lor balances by load")
