"""The V1 fast path: detect and apply runs of steady decode steps in bulk (DESIGN §5).

A step is steady when every running request decodes exactly one token, none is preempted, no
waiting request is admitted and nobody finishes before the run's last step. `advance_steady(k)`
must leave exactly the state k calls of schedule() + update() would: the same blocks popped from
the free-queue head in the same order (by step, then running order), the same keys registered, the
same counters, finishing requests freed in running order at step k. Work is O(batch) numpy per
call plus O(1) Python per new block. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from replay.plan import SteadyRun
from replay.state import Status

if TYPE_CHECKING:
    from replay.v1.scheduler import V1Scheduler

_I64 = np.int64


def _new_blocks(c: np.ndarray, held: np.ndarray, k: int, bs: int) -> int:
    """New blocks the running rows need for k more decode steps (slots c+1 .. c+k)."""
    return int(np.maximum(-(-(c + k) // bs) - held, 0).sum())


def max_steady_steps(s: V1Scheduler) -> int:
    running = s.running
    spec, st = s.spec, s.state
    nb = len(running)
    if nb == 0 or s._arrived or nb > spec.max_num_batched_tokens:
        return 0
    idx = np.fromiter(running, _I64, nb)
    c = st.num_computed[idx]
    nt = st.prompt_len[idx] + st.num_output[idx]
    if not np.array_equal(c, nt - 1) or s.prefilling[idx].any():
        return 0
    # Steps until the first finish (finishing in the last step of the run is allowed).
    kmax = int(np.minimum(st.output_len[idx] - st.num_output[idx],
                          spec.max_model_len - nt).min())
    if kmax < 1:
        return 0
    if len(s.waiting):
        left = spec.max_num_batched_tokens - nb
        if left > 0 and nb < s.max_active:
            thr = spec.long_prefill_token_threshold if nb + len(s.waiting) > 1 else 0
            # An admission that fails now keeps failing: free blocks only shrink and the head's
            # hits can only be evicted (its need drops by one block exactly when free does).
            if s._admission(s.waiting.peek(), left, thr) is not None:
                return 0
    held = s.kv.held[idx]
    free = s.kv.pool.num_free
    bs = s.block_size
    if _new_blocks(c, held, 1, bs) > free:
        return 0
    if _new_blocks(c, held, kmax, bs) <= free:
        return kmax
    lo, hi = 1, kmax   # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _new_blocks(c, held, mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def _attach(blocks: list[int], n_new: np.ndarray, held: np.ndarray, c0: np.ndarray, bs: int,
            tables: list[list[int]]) -> np.ndarray:
    """Append the popped `blocks` (in pop order) to the rows' tables; returns each block's step.

    Row i takes its m-th new block (m = 1..n_i) in step j = (held_i + m - 1) * bs - c0_i + 1;
    step-by-step pops them by step, then running order."""
    if n_new.max() == 1:
        # Usual case (runs shorter than a block): one block per growing row, no repeats.
        ev_row = np.flatnonzero(n_new)
        ev_step = held[ev_row] * bs - c0[ev_row] + 1
        order = np.argsort(ev_step, kind="stable")      # by step, then running order
        for i, b in zip(ev_row[order].tolist(), blocks):
            tables[i].append(b)
        return ev_step[order]
    total = len(blocks)
    ev_row = np.repeat(np.arange(len(n_new), dtype=_I64), n_new)
    first = np.cumsum(n_new) - n_new
    m = np.arange(total, dtype=_I64) - np.repeat(first, n_new) + 1
    ev_step = (held[ev_row] + m - 1) * bs - c0[ev_row] + 1
    order = np.lexsort((ev_row, ev_step))
    ev_row = ev_row[order]
    # Each row's blocks in step order (a stable sort by row keeps it): one extend per row.
    by_row = np.asarray(blocks, _I64)[np.argsort(ev_row, kind="stable")].tolist()
    grow = np.flatnonzero(n_new)
    pos = 0
    for i, n in zip(grow.tolist(), n_new[grow].tolist()):
        tables[i].extend(by_row[pos:pos + n])
        pos += n
    return ev_step[order]


def advance_steady(s: V1Scheduler, k: int) -> SteadyRun:
    st, kv, bs = s.state, s.kv, s.block_size
    running = list(s.running)
    nb = len(running)
    idx = np.fromiter(running, _I64, nb)
    c0 = st.num_computed[idx]      # fancy indexing copies
    tables = kv.tables
    held = kv.held[idx]
    used0 = kv.pool.num_used

    n_new = np.maximum(-(-(c0 + k) // bs) - held, 0)
    total = int(n_new.sum())
    per_step = np.zeros(k, _I64)
    if total:
        blocks = kv.pool.pop_new(total)
        ev_step = _attach(blocks, n_new, held, c0, bs, [tables[r] for r in running])
        kv.held[idx] += n_new
        per_step = np.bincount(ev_step - 1, minlength=k)[:k]

    # Counters first: keys of newly full blocks may depend on the generated tokens.
    st.num_computed[idx] += k
    st.num_output[idx] += k
    s._last_rows = idx
    if kv.pool.enable_caching:
        kv.register_rows(idx, st.num_computed[idx] // bs)

    nt = st.prompt_len[idx] + st.num_output[idx]
    done = (st.num_output[idx] >= st.output_len[idx]) | (nt >= s.spec.max_model_len)
    finished = idx[done]
    used = used0 + np.cumsum(per_step)
    if finished.size:
        for r in finished.tolist():
            s._release(r)
        st.status[finished] = Status.FINISHED
        gone = set(finished.tolist())
        s.running = [r for r in s.running if r not in gone]
        used[-1] = kv.pool.num_used
    return SteadyRun(rows=idx, num_computed_tokens=c0, num_steps=k, gpu_blocks_used=used,
                     finished=finished)
