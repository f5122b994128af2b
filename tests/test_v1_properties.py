"""Property tests of the V1 scheduler over random small traces and tiny pools (all preemption
modes, both policies, chunked prefill on/off, prefix caching on/off with shared prefixes):
block accounting, every request ending exactly once, token conservation. (The compiled core is
compared with this reference in test_v1_core.py.)"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.prefix import TraceBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status
from replay.engine.v1 import V1Scheduler

BS = 4
MAX_STEPS = 4000


@st.composite
def cases(draw):
    n = draw(st.integers(1, 10))
    prompt = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    steps = sorted(draw(st.lists(st.integers(1, 25), min_size=n, max_size=n)))
    prio = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    hashes = None
    if draw(st.booleans()):
        # A small alphabet of 8-token hashes so requests really share prefix blocks.
        hashes = [draw(st.lists(st.integers(0, 1), min_size=(p + 7) // 8, max_size=(p + 7) // 8))
                  for p in prompt]
    chunked = draw(st.booleans())
    spec = SchedulerSpec(
        block_size=BS, num_gpu_blocks=draw(st.integers(4, 24)),
        num_cpu_blocks=0, max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.integers(8, 48)), max_model_len=draw(st.integers(16, 48)),
        enable_chunked_prefill=chunked, enable_prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        preemption_mode=draw(st.sampled_from(["recompute", "none"])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 6])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1])))
    return spec, np.array(prompt), np.array(output), np.array(steps), np.array(prio), hashes


def build(case):
    spec, prompt, output, steps, prio, hashes = case
    state = RequestState(arrival_s=steps + np.arange(len(steps)) * 1e-6, prompt_len=prompt,
                         output_len=output, priority=prio)
    keys = TraceBlockKeys(block_size=BS, prompt_len=prompt,
                          prefix_hashes=hashes or [None] * len(prompt), hash_block_tokens=8)
    return V1Scheduler(spec, state, keys), state


def check_blocks(s: V1Scheduler) -> None:
    pool = s.kv.pool
    owners = np.zeros(pool.num_blocks, np.int64)
    for row, table in s.kv.tables.items():
        assert len(set(table)) == len(table), "a block twice in one table"
        assert 0 not in table, "the null block was handed out"
        assert s.state.status[row] == Status.RUNNING
        np.add.at(owners, table, 1)
    assert list(owners) == [0] + pool.ref[1:], "ref counts do not match the block tables"
    free = set(pool.free_queue)
    assert len(free) == pool.num_free and 0 not in free
    assert all(pool.ref[b] == 0 for b in free)
    assert pool.num_free + pool.num_used == pool.num_blocks - 1
    assert sum(1 for b in range(1, pool.num_blocks) if pool.ref[b] > 0) == pool.num_used
    assert set(s.kv.tables) == set(s.running)
    for key, b in pool.cached.items():
        assert pool.key_of[b] == key


def simulate(case, *, check: bool = False):
    """Drive a scheduler step by step (arrivals at their step, before schedule). Returns the
    per-step trace and the end state."""
    s, state = build(case)
    arrive = case[3]
    scheduled = np.zeros(state.n, np.int64)
    ended: list[int] = []
    used: list[int] = []
    step = 0
    while step < MAX_STEPS:
        step += 1
        for row in np.flatnonzero(arrive == step).tolist():
            s.add_request(row)
        if step > arrive.max() and not s.has_unfinished():
            break
        plan = s.schedule()
        ended.extend(r.row for r in plan.rejected)
        np.add.at(scheduled, plan.rows, plan.num_new_tokens)
        out = s.update(plan)
        ended.extend(out.finished.tolist())
        used.append(s.gpu_blocks_used())
        if check:
            check_blocks(s)
    return s, state, scheduled, ended, used


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(case=cases())
def test_accounting_termination_and_conservation(case):
    s, state, scheduled, ended, _ = simulate(case, check=True)
    assert not s.has_unfinished(), "the loop did not terminate"
    # Every request ends exactly once.
    assert sorted(ended) == list(range(state.n))
    assert np.all(np.isin(state.status, [Status.FINISHED, Status.REJECTED]))
    assert s.gpu_blocks_used() == 0
    if s.spec.preemption_mode == "none":
        assert state.num_preemptions.sum() == 0
    fin = state.status == Status.FINISHED
    spec = s.spec
    # Stopped at output_len or max_model_len.
    np.testing.assert_array_equal(state.num_output[fin], np.minimum(
        state.output_len[fin], spec.max_model_len - state.prompt_len[fin]))
    # Token conservation: what was computed = prompt + output - 1 - first hit + recompute.
    expect = (state.prompt_len + state.num_output - 1 - state.cached_prompt_tokens
              + state.recomputed_tokens)
    np.testing.assert_array_equal(scheduled[fin], expect[fin])
