"""The V0 fast path: runs of steady decode steps advanced in bulk (DESIGN §5).

A step is steady when it decodes exactly the current running set, one token each, in running
order, and nothing else happens: no admission, rejection, preemption, swap or finish (a finish in
the last step of a run is allowed). `max_steady_steps` proves how many of the next steps are steady
*assuming no request arrives or is aborted meanwhile* (the replay loop caps the run at its next
arrival); `advance_steady` applies them, replaying block allocations and prefix-cache
registrations as events in exactly the order the step-by-step path would. A run may end early
(`SteadyRun.num_steps` < asked) when a filled block turns out to be cached already, since that
frees a block; this is known only once the block's tokens are.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from replay.plan import SteadyRun
from replay.state import Status
from replay.v0.block_manager import AllocStatus

if TYPE_CHECKING:
    from replay.v0.scheduler import V0Scheduler


def _decode_rows(s: V0Scheduler) -> np.ndarray | None:
    """The running rows when every one of them decodes, else None."""
    rows = np.fromiter(s.running, dtype=np.int64, count=len(s.running))
    if len(rows) == 0 or s.in_prefill[rows].any():
        return None
    return rows


def _head_stays_blocked(s: V0Scheduler, num_running: int) -> tuple[bool, bool]:
    """(blocked, blocked_by_memory_only) for the waiting head in a steady step.

    The head's admission inputs that change during a steady run are the free GPU blocks, and they
    only shrink (queue-only mode: free minus reserved stays constant), so LATER stays LATER."""
    if not s.waiting:
        return True, False
    spec = s.spec
    head = s.waiting[0]
    chunk_is_zero = False
    if spec.enable_chunked_prefill:
        remaining = spec.max_num_batched_tokens - num_running
        if remaining <= 0:
            return True, False      # vLLM skips the prefill phase outright
        # With caching the chunk rounds down to whole blocks; 0 tokens stop admission, but only
        # after the NEVER check below has run.
        chunk_is_zero = spec.enable_prefix_caching and remaining < spec.block_size
    elif s._seq_len(head) > min(spec.max_model_len, spec.max_num_batched_tokens):
        return False, False         # would be rejected
    status = s._can_admit(head)
    if status is AllocStatus.NEVER:
        return False, False
    if status is AllocStatus.LATER:
        return True, not (chunk_is_zero or num_running + 1 > spec.max_num_seqs)
    return chunk_is_zero or num_running + 1 > spec.max_num_seqs, False


def _priority_is_quiet(s: V0Scheduler, rows: np.ndarray) -> bool:
    """Priority preemption (default path) changes nothing: both queues are already sorted and no
    running request is worse than the waiting head (else it would be preempted)."""
    keys = [s._priority_key(int(r)) for r in rows]
    if any(a > b for a, b in zip(keys, keys[1:])):
        return False
    wkeys = [s._priority_key(r) for r in s.waiting]
    if any(a > b for a, b in zip(wkeys, wkeys[1:])):
        return False
    return not wkeys or s.spec.preemption_mode == "none" or keys[-1] <= wkeys[0]


def _allocs_through(full: np.ndarray, k: int, b: int) -> np.ndarray:
    """Blocks each row allocates in steps 1..k: one whenever its stored tokens sit on a block
    boundary before an append (tables are tight, so the tail block is then full)."""
    return (full + k - 1) // b - (full - 1) // b


def max_steady_steps(s: V0Scheduler) -> int:
    spec = s.spec
    if s._aborted or s.swapped or s._pending_rejections:
        return 0
    rows = _decode_rows(s)
    if rows is None:
        return 0
    st = s.state
    if spec.enable_chunked_prefill:
        budget = spec.max_num_batched_tokens
        need = spec.block_size if spec.enable_prefix_caching else 1
        if budget - (len(rows) - 1) < need:
            return 0                # the running phase would stop early on the token budget
    elif spec.policy == "priority" and not _priority_is_quiet(s, rows):
        return 0
    blocked, _ = _head_stays_blocked(s, len(rows))
    if not blocked:
        return 0
    nout = st.num_output[rows].tolist()
    row_list = rows.tolist()
    prompt, out_len = s._prompt, s._out_len
    # Steps until each row finishes (output length or max_model_len); finishing at step k is fine.
    k_max = min(min(out_len[r] - o for r, o in zip(row_list, nout)),
                spec.max_model_len - max(prompt[r] + o for r, o in zip(row_list, nout)))
    if k_max < 1:
        return 0
    b = spec.block_size
    free0 = s.bm.num_free_gpu()
    # A row allocates at most k // b + 1 blocks in k steps: with room for that, no count is needed.
    if free0 - len(row_list) * (k_max // b + 1) >= 1:
        return k_max
    # Step (1-based) of each row's first allocation: its stored tokens sit on a block boundary.
    first = [(-(prompt[r] + o - 1)) % b + 1 for r, o in zip(row_list, nout)]

    def fits(k: int) -> bool:
        # D1: the last row's check in step k sees every allocation before it; free only shrinks.
        total = sum((k - j) // b + 1 for j in first if j <= k)
        last = int((k - first[-1]) % b == 0)
        return free0 - total + last >= 1

    if not fits(1):
        return 0
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _completions(rows: np.ndarray, full: np.ndarray, k: int, b: int):
    """(step, position, block index) of every block a row fills in steps 1..k, in step order."""
    first = (full // b) + 1                       # first block count reached after `full` tokens
    last = (full + k) // b
    counts = np.maximum(last - first + 1, 0)
    pos = np.repeat(np.arange(len(rows)), counts)
    offs = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    num_blocks = np.repeat(first, counts) + offs   # full blocks once this one completes
    step = num_blocks * b - full[pos]
    return step, pos, num_blocks - 1


def advance_steady(s: V0Scheduler, num_steps: int) -> SteadyRun:
    assert num_steps >= 1
    if not s.spec.enable_prefix_caching:
        return _advance_uncached(s, num_steps)
    return _advance_cached(s, num_steps)


def _advance_uncached(s: V0Scheduler, k: int) -> SteadyRun:
    """Without prefix caching a step's only block events are allocations from the free list
    (never a cached twin), so the run always completes; plain Python per row."""
    spec, st, bm = s.spec, s.state, s.bm
    row_list = list(s.running)
    rows = np.fromiter(row_list, dtype=np.int64, count=len(row_list))
    b, nb = spec.block_size, len(row_list)
    nout = st.num_output[rows].tolist()
    prompt = s._prompt
    full = [prompt[r] + o - 1 for r, o in zip(row_list, nout)]
    computed_before = st.num_computed[rows]
    used0 = bm.gpu.num_used()
    # Allocation events as step * nb + position: sorted, the step-by-step order.
    ev = [j * nb + p for p, f in enumerate(full) for j in range((-f) % b + 1, k + 1, b)]
    if ev:
        ev.sort()
        tables = bm.tables
        blocks = bm.gpu.allocate_many(len(ev))
        per_step = [0] * k
        for e, blk in zip(ev, blocks):
            tables[row_list[e % nb]].append(blk)
            per_step[e // nb - 1] += 1
        if spec.preemption_mode == "none":
            s._reserved_blocks -= len(ev)
        used = np.fromiter(accumulate(per_step, initial=used0), np.int64, k + 1)[1:]
    else:
        used = np.full(k, used0, np.int64)
    st.num_computed[rows] += k
    st.num_output[rows] += k
    nfs = bm.num_full_slots
    for row, f in zip(row_list, full):
        nfs[row] = f + k
    s.num_steps += k
    out_len, L = s._out_len, spec.max_model_len
    fin = [r for r, o, f in zip(row_list, nout, full)
           if o + k >= out_len[r] or f + 1 + k >= L]
    if fin:
        _free_finished(s, fin)
        used[-1] = bm.gpu.num_used()
    return SteadyRun(rows=rows, num_computed_tokens=computed_before, num_steps=k,
                     gpu_blocks_used=used, finished=np.array(fin, dtype=np.int64))


def _free_finished(s: V0Scheduler, fin: list[int]) -> None:
    """Finishes happen only in the last step; free them in running order as `update` does."""
    s.state.status[fin] = Status.FINISHED
    for row in fin:
        s._release_reservation(row)
        s.bm.free(row)
    done_set = set(fin)
    s.running = type(s.running)(r for r in s.running if r not in done_set)


def _advance_cached(s: V0Scheduler, k: int) -> SteadyRun:
    spec, st, bm = s.spec, s.state, s.bm
    rows = np.fromiter(s.running, dtype=np.int64, count=len(s.running))
    b = spec.block_size
    seq_len = st.prompt_len[rows] + st.num_output[rows]
    full = seq_len - 1
    computed_before = st.num_computed[rows].copy()
    used0 = bm.gpu.num_used()
    # Allocation events (before the append) and, with caching, completion events (after it), in
    # the step-by-step order: step, then running position, then allocate before register.
    a_counts = _allocs_through(full, k, b)
    a_pos = np.repeat(np.arange(len(rows)), a_counts)
    first_boundary = -(-full // b) * b             # first t >= full with t % b == 0
    a_offs = np.arange(a_counts.sum()) - np.repeat(np.cumsum(a_counts) - a_counts, a_counts)
    a_step = np.repeat(first_boundary, a_counts) + a_offs * b - full[a_pos] + 1
    if spec.enable_prefix_caching:
        c_step, c_pos, c_blk = _completions(rows, full, k, b)
    else:
        c_step = c_pos = c_blk = np.zeros(0, dtype=np.int64)
    ev_step = np.concatenate([a_step, c_step])
    ev_pos = np.concatenate([a_pos, c_pos])
    ev_kind = np.concatenate([np.zeros(len(a_step), np.int64), np.ones(len(c_step), np.int64)])
    ev_blk = np.concatenate([np.zeros(len(a_step), np.int64), c_blk])
    order = np.lexsort((ev_kind, ev_pos, ev_step))
    delta = np.zeros(k + 1, dtype=np.int64)        # blocks in use added in each step
    # Outputs first: a block's key may only be asked for once its tokens are known.
    st.num_computed[rows] += k
    st.num_output[rows] += k
    gpu, tables, keys = bm.gpu, bm.tables, bm.keys
    row_list = rows.tolist()
    stop = k
    for j, p, kind, kb in zip(ev_step[order].tolist(), ev_pos[order].tolist(),
                              ev_kind[order].tolist(), ev_blk[order].tolist()):
        if j > stop:
            break
        row = row_list[p]
        if kind == 0:
            before = gpu.num_free()
            tables[row].append(gpu.allocate_new())
            delta[j] += before - gpu.num_free()
            if spec.preemption_mode == "none":
                s._reserved_blocks -= 1
        else:
            before = gpu.num_free()
            old = tables[row][kb]
            tables[row][kb] = gpu.promote(old, keys.key(row, kb))
            delta[j] += before - gpu.num_free()
            if tables[row][kb] != old:
                # The block switched to a cached twin and freed one: that could unblock the
                # waiting head, so the run ends with this step (the loop asks again).
                stop = j
    if stop < k:
        st.num_computed[rows] -= k - stop
        st.num_output[rows] -= k - stop
        k = stop
        delta = delta[:k + 1]
    for p, row in enumerate(row_list):
        bm.num_full_slots[row] = int(full[p]) + k
    s.num_steps += k
    if spec.enable_prefix_caching:
        now = float(s.num_steps)
        for row in row_list:
            bm.last_access[row] = now
        bm.mark_computed()
    used = used0 + np.cumsum(delta[1:])
    # Finishes happen only in the last step; free them in running order as `update` does.
    new_len = seq_len + k
    done = (st.num_output[rows] >= st.output_len[rows]) | (new_len >= spec.max_model_len)
    finished = rows[done]
    if len(finished):
        st.status[finished] = Status.FINISHED
        for row in finished.tolist():
            s._release_reservation(row)
            bm.free(row)
        done_set = set(finished.tolist())
        s.running = type(s.running)(r for r in s.running if r not in done_set)
        used[-1] = bm.gpu.num_used()
    return SteadyRun(rows=rows, num_computed_tokens=computed_before, num_steps=k,
                     gpu_blocks_used=used, finished=finished)
