"""Properties of the V0 scheduler over random small traces and tiny pools (Hypothesis): block
accounting, exactly-once endings, token conservation (the compiled core is compared
with this reference in test_v0_core.py)."""
from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from replay.engine.prefix import TokenBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status
from replay.engine.v0 import V0Scheduler

MAX_STEPS = 3000
ENDED = (Status.FINISHED, Status.REJECTED, Status.ABORTED)


@hst.composite
def cases(draw):
    bs = draw(hst.sampled_from([2, 4]))
    chunked = draw(hst.booleans())
    max_len = draw(hst.sampled_from([12, 16, 24]))
    mode = draw(hst.sampled_from(["recompute", "swap", "none"]))
    policy = "fcfs" if mode == "swap" else draw(hst.sampled_from(["fcfs", "priority"]))
    spec = SchedulerSpec(
        block_size=bs, num_gpu_blocks=draw(hst.integers(2, 12)),
        num_cpu_blocks=draw(hst.integers(1, 10)), max_num_seqs=draw(hst.integers(1, 4)),
        max_num_batched_tokens=(draw(hst.sampled_from([4, 8, 16])) if chunked
                                else draw(hst.sampled_from([max_len, 64]))),
        max_model_len=max_len, enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(hst.booleans()), policy=policy, preemption_mode=mode,
        on_swap_full=draw(hst.sampled_from(["abort", "recompute"])))
    n = draw(hst.integers(1, 7))
    # Prompts drawn from a 3-block alphabet so prefix caching has something to share.
    alphabet = [[100 * (a + 1) + j for j in range(bs)] for a in range(3)]
    prompts, arrivals = [], []
    for _ in range(n):
        p = draw(hst.integers(1, max_len + 2))
        blocks = draw(hst.lists(hst.integers(0, 2), min_size=-(-p // bs), max_size=-(-p // bs)))
        prompts.append([t for b in blocks for t in alphabet[b]][:p])
        arrivals.append(draw(hst.integers(1, 8)))
    outputs = draw(hst.lists(hst.integers(1, 9), min_size=n, max_size=n))
    priority = draw(hst.lists(hst.integers(0, 2), min_size=n, max_size=n))
    return spec, prompts, arrivals, outputs, priority


def _make(case):
    spec, prompts, arrivals, outputs, priority = case
    state = RequestState(arrival_s=np.array(arrivals, float) + np.arange(len(arrivals)) * 1e-6,
                         prompt_len=[len(p) for p in prompts], output_len=outputs,
                         priority=priority if spec.policy == "priority" else None)

    def tokens(row):
        return prompts[row] + [10_000 + 100 * row + k for k in range(int(state.num_output[row]))]

    sched = V0Scheduler(spec, state, TokenBlockKeys(block_size=spec.block_size, tokens=tokens))
    return sched, state


def _check_blocks(sched: V0Scheduler) -> None:
    """Every block is exactly one of: free, evictable, or referenced by as many tables as its ref
    count; running rows hold GPU blocks only, swapped rows host blocks only."""
    bm = sched.bm
    owners = Counter(b for ids in bm.tables.values() for b in ids)
    for pool in (bm.gpu, bm.cpu):
        free = list(pool.free_ids)
        evict = list(pool.evictor.table)
        assert len(set(free)) == len(free) and not set(free) & set(evict)
        assert pool.num_free() + pool.num_used() == pool.num_blocks
        for i in range(pool.num_blocks):
            b = pool.first_id + i
            assert pool.ref[i] == owners.get(b, 0), (b, pool.ref[i], owners.get(b, 0))
            assert (pool.ref[i] == 0) == (b in free or b in pool.evictor)
    for ids in bm.tables.values():
        assert len(set(ids)) == len(ids)
        if not bm.caching:
            assert all(owners[b] == 1 for b in ids)
    g = bm.num_gpu_blocks
    for row in sched.running:
        assert all(b < g for b in bm.tables[row])
    for row in sched.swapped:
        assert all(b >= g for b in bm.tables[row])


def _run(case, *, check: bool = False):
    """Drive the case; returns (scheduler, state, per-step GPU blocks used, tokens per row)."""
    spec, prompts, arrivals, outputs, priority = case
    sched, state = _make(case)
    n = state.n
    ends = Counter()
    tokens = np.zeros(n, dtype=np.int64)
    used: list[int] = []
    step, last_arrival = 1, max(arrivals)
    while step <= MAX_STEPS:
        for row in range(n):
            if arrivals[row] == step:
                sched.add_request(row)
        if step > last_arrival and not sched.has_unfinished():
            break
        plan = sched.schedule()
        ends.update(r.row for r in plan.rejected)
        if plan.abort is not None:
            break
        if check:
            _check_blocks(sched)
        np.add.at(tokens, plan.rows, plan.num_new_tokens)
        out = sched.update(plan)
        ends.update(out.finished.tolist())
        used.append(sched.gpu_blocks_used())
        if check:
            _check_blocks(sched)
        step += 1
    assert step <= MAX_STEPS, "the loop must terminate"
    assert all(c == 1 for c in ends.values()), ends
    return sched, state, used, tokens, ends


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_block_accounting_and_endings(case) -> None:
    sched, state, _, tokens, ends = _run(case, check=True)
    aborted = any(state.status == Status.ABORTED)
    for row in range(state.n):
        status = int(state.status[row])
        # After a swap-full abort, requests that had not arrived yet stay with the replay loop.
        assert status in ENDED or (aborted and status == Status.PENDING), (row, status)
        if status in (Status.FINISHED, Status.REJECTED):
            assert ends[row] == 1
        if status == Status.FINISHED:
            # Tokens conserved: prompt + output - 1, minus the first prefix hit, plus recompute.
            want = (state.prompt_len[row] + state.num_output[row] - 1
                    - state.cached_prompt_tokens[row] + state.recomputed_tokens[row])
            assert tokens[row] == want, (row, tokens[row], want)
    if case[0].preemption_mode == "none":
        assert state.num_preemptions.sum() == 0
    if not aborted:
        assert not sched.has_unfinished()
