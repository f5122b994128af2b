"""Exact nearest-rank quantiles (docs/metrics.md): the q-quantile of n sorted samples is the
ceil(q*n)-th one; weighted samples use the same rule over cumulative weights. Here (not in
capacity/) so that a replay can reduce its own TBT samples as they stream out of the core
(replay/results/summary.py) with the very function the analyses use on whole tables.
numpy only.
"""
from __future__ import annotations

import math

import numpy as np


def nearest_rank(values, q: float, weights=None) -> float | None:
    """Nearest-rank q-quantile (0 < q <= 1); None when there are no samples."""
    return nearest_ranks(values, (q,), weights)[0]


def nearest_ranks(values, qs, weights=None) -> list[float | None]:
    """`nearest_rank` for each q of `qs`, sorting weighted samples once (a replay's `tbt` table
    has one sample per step: the sort is most of the summary)."""
    v = np.asarray(values, dtype=np.float64)
    if weights is None:
        v = v[~np.isnan(v)]
        if len(v) == 0:
            return [None for _ in qs]
        ks = [max(1, math.ceil(q * len(v))) for q in qs]
        part = np.partition(v, sorted({k - 1 for k in ks}))
        return [float(part[k - 1]) for k in ks]
    w = np.asarray(weights, dtype=np.int64)
    if len(v) == 0 or w.sum() == 0:
        return [None for _ in qs]
    # Any order that sorts v gives the same answer (equal values are interchangeable), so the
    # faster unstable sort.
    order = np.argsort(v)
    cw = np.cumsum(w[order])
    ks = np.array([max(1, math.ceil(q * int(cw[-1]))) for q in qs], dtype=np.int64)
    return [float(x) for x in v[order[np.searchsorted(cw, ks, "left")]]]


def nearest_rank_chunked(chunks, q: float, *, limit: int = 1 << 22, bins: int = 1 << 16
                         ) -> float | None:
    """`nearest_rank(values, q, weights)` over weighted samples too many to sort at once (a
    spilled `tbt` table): `chunks()` yields (values, weights) array pairs and is read a few times.
    Each pass narrows the value range holding the ceil(q*W)-th weight with a histogram until at
    most `limit` samples are left, which are sorted: exact, memory O(limit + bins)."""
    total, n, lo, hi = 0, 0, math.inf, -math.inf
    for v, w in chunks():
        if len(v):
            total, n = total + int(w.sum()), n + len(v)
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    if total == 0:
        return None
    k = max(1, math.ceil(q * total))
    below = 0                               # weight of the samples under lo

    def inside(v, w):
        m = (v >= lo) & (v <= hi)
        return v[m], w[m]

    while n > limit and lo < hi:
        scale = bins / (hi - lo)
        idx = lambda v: np.minimum(((v - lo) * scale).astype(np.int64), bins - 1)  # noqa: E731
        hw = np.zeros(bins, np.int64)
        for v, w in chunks():
            v, w = inside(v, w)
            hw += np.rint(np.bincount(idx(v), w, bins)).astype(np.int64)
        cum = below + np.cumsum(hw)
        b = int(np.searchsorted(cum, k, "left"))
        below = int(cum[b - 1]) if b else below
        # idx is monotone: the samples of bin b are exactly those in [their min, their max].
        nlo, nhi, n = math.inf, -math.inf, 0
        for v, w in chunks():
            v = inside(v, w)[0]
            v = v[idx(v) == b]
            if len(v):
                n, nlo, nhi = n + len(v), min(nlo, float(v.min())), max(nhi, float(v.max()))
        lo, hi = nlo, nhi
    if lo == hi:
        return float(lo)
    parts = [inside(v, w) for v, w in chunks()]
    v = np.concatenate([p[0] for p in parts])
    w = np.concatenate([p[1] for p in parts])
    order = np.argsort(v, kind="stable")
    cw = below + np.cumsum(w[order])
    return float(v[order][np.searchsorted(cw, k, "left")])
