"""The V1 fast path: detect and apply runs of steady decode steps in bulk (DESIGN §5).

A step is steady when every running request decodes exactly one token, none is preempted, no
waiting request is admitted and nobody finishes before the run's last step. `advance_steady(k)`
must leave exactly the state k calls of schedule() + update() would: the same blocks popped from
the free-queue head in the same order (by step, then running order), the same keys registered, the
same counters, finishing requests freed in running order at step k.

Batches are small (tens of rows) and runs short, so per-call overhead dominates: the running set's
numbers live in a `_Ctx` of plain Python lists, built once after each `schedule()` and carried
across consecutive runs (a run moves every row by the same k, so only an offset changes). Per run
the work is O(batch) C-level list scans plus O(1) Python per new or newly full block.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from replay.plan import SteadyRun
from replay.state import Status

if TYPE_CHECKING:
    from replay.v1.scheduler import V1Scheduler

_I64 = np.int64


class _Ctx:
    """The running set between two schedule() calls, as of `spent` steady steps after it was
    built. Per row i (running order), in steps counted from the build: `nxt[i]` is the step that
    pops its next block, `full[i]` the step after which its next block is full (registered), and
    `left[i]` the step it finishes in."""

    __slots__ = ("rows", "idx", "c0", "c0_np", "nxt", "full", "left", "kmin", "spent",
                 "head_blocked")

    def __init__(self, s: V1Scheduler) -> None:
        rows = list(s.running)
        idx = np.fromiter(rows, _I64, len(rows))
        bs, L = s.block_size, s.spec.max_model_len
        c0_np = s.state.num_computed[idx]
        c0 = c0_np.tolist()
        held = s.kv.held[idx].tolist()
        nc = s.kv.num_cached[idx].tolist()
        prompt, out_len = s._prompt, s._out_len
        self.rows, self.idx, self.c0, self.c0_np = rows, idx, c0, c0_np
        # A decoding row holds tokens c + 1 (one not yet computed): see `max_steady_steps`.
        self.left = [min(out_len[r] - (c + 1 - prompt[r]), L - c - 1) for r, c in zip(rows, c0)]
        self.nxt = [h * bs - c + 1 for h, c in zip(held, c0)]
        self.full = [(n + 1) * bs - c for n, c in zip(nc, c0)]
        self.kmin = min(self.left) if rows else 0
        self.spent = 0
        self.head_blocked = False     # the waiting head was checked and cannot be admitted

    def new_blocks(self, k: int, bs: int) -> int:
        """Blocks the rows pop in the next k steps."""
        lim = self.spent + k
        return sum(1 + (lim - x) // bs for x in self.nxt if x <= lim)


def _ctx(s: V1Scheduler) -> _Ctx:
    if s._ctx is None:
        s._ctx = _Ctx(s)
    return s._ctx


def max_steady_steps(s: V1Scheduler) -> int:
    running = s.running
    spec = s.spec
    nb = len(running)
    # Every running request that is not in its (re-)prefill has computed all but its last token
    # (a decode schedules exactly one token, never capped), so "no prefill" means "all decode".
    if nb == 0 or s._arrived or s._prefill_rows or nb > spec.max_num_batched_tokens:
        return 0
    ctx = _ctx(s)
    # Steps until the first finish (finishing in the last step of the run is allowed).
    kmax = ctx.kmin - ctx.spent
    if kmax < 1:
        return 0
    if len(s.waiting) and not ctx.head_blocked:
        left = spec.max_num_batched_tokens - nb
        if left > 0 and nb < s.max_active:
            thr = spec.long_prefill_token_threshold if nb + len(s.waiting) > 1 else 0
            # An admission that fails now keeps failing: free blocks only shrink and the head's
            # hits can only be evicted (its need drops by one block exactly when free does).
            if s._admission(s.waiting.peek(), left, thr) is not None:
                return 0
        ctx.head_blocked = True
    free = s.kv.pool.num_free
    bs = s.block_size
    # A row pops at most k // bs + 1 blocks in k steps: with room for that, no count is needed.
    if nb * (kmax // bs + 1) <= free:
        return kmax
    if ctx.new_blocks(1, bs) > free:
        return 0
    if ctx.new_blocks(kmax, bs) <= free:
        return kmax
    lo, hi = 1, kmax   # lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ctx.new_blocks(mid, bs) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def _grow(ctx: _Ctx, lim: int, bs: int) -> tuple[list[int], list[int]]:
    """(sort key step * nb + row position of every block popped by step `lim`, in pop order;
    the positions of the rows that grow). Advances those rows' `nxt`."""
    nxt, nb, base = ctx.nxt, len(ctx.rows), ctx.spent
    grow = [i for i, x in enumerate(nxt) if x <= lim]
    ev: list[int] = []
    for i in grow:
        x = nxt[i]
        while x <= lim:
            ev.append((x - base) * nb + i)
            x += bs
        nxt[i] = x
    ev.sort()           # by step, then running order: the step-by-step pop order
    return ev, grow


def advance_steady(s: V1Scheduler, k: int) -> SteadyRun:
    st, kv, bs = s.state, s.kv, s.block_size
    ctx = _ctx(s)
    rows, idx, nb = ctx.rows, ctx.idx, len(ctx.rows)
    used0 = kv.pool.num_used
    c_before = ctx.c0_np + ctx.spent if ctx.spent else ctx.c0_np
    lim = ctx.spent + k

    ev, grow = _grow(ctx, lim, bs)
    if ev:
        blocks = kv.pool.pop_new(len(ev))
        tables = kv.tables
        for e, b in zip(ev, blocks):
            tables[rows[e % nb]].append(b)
        held = kv.held
        for i in grow:
            held[rows[i]] = len(tables[rows[i]])
        per_step = [0] * k
        for e in ev:
            per_step[e // nb - 1] += 1
        used = np.fromiter(accumulate(per_step, initial=used0), _I64, k + 1)[1:]
    else:
        used = np.full(k, used0, _I64)

    # Counters first: keys of newly full blocks may depend on the generated tokens.
    st.num_computed[idx] += k
    st.num_output[idx] += k
    ctx.spent = lim
    s._last_rows = idx
    if kv.pool.enable_caching:
        _register(s, ctx, lim, bs)

    if ctx.kmin == lim:
        left = ctx.left
        fin = [r for r, x in zip(rows, left) if x == lim]
        for r in fin:
            s._release(r)
        finished = np.array(fin, _I64)
        st.status[finished] = Status.FINISHED
        gone = set(fin)
        s.running = [r for r in s.running if r not in gone]
        s._ctx = None
        used[-1] = kv.pool.num_used
    else:
        finished = np.zeros(0, _I64)
    return SteadyRun(rows=idx, num_computed_tokens=c_before, num_steps=k, gpu_blocks_used=used,
                     finished=finished)


def _register(s: V1Scheduler, ctx: _Ctx, lim: int, bs: int) -> None:
    """Register the blocks that became full by step `lim` (`register_rows` for those rows)."""
    full = ctx.full
    grow = [i for i, x in enumerate(full) if x <= lim]
    if not grow:
        return
    rows, c0 = ctx.rows, ctx.c0
    spans = []
    for i in grow:
        n_full = (c0[i] + lim) // bs
        spans.append((rows[i], n_full))
        full[i] = (n_full + 1) * bs - c0[i]
    s.kv.register_spans(spans)
