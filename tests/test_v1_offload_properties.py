"""Property tests of the V1 reference scheduler with vLLM 0.33's CPU KV offloading on, over random
small traces with shared prefixes, tiny GPU pools and tiny CPU tiers (LRU and ARC, prompt-only
or not, 1- or 2-step transfers, synchronous and async loops): GPU block accounting, CPU tier
accounting (chunks free + used = the tier, every chunk in exactly one place of its policy, pins
only on chunks in the tier), every request ending exactly once, token conservation with CPU hits,
and the engine going quiet (no transfer left in flight) at the end."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.prefix import TraceBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status
from replay.engine.v1 import V1Scheduler
from tests.test_v1_properties import BS, MAX_STEPS


@st.composite
def cases(draw):
    n = draw(st.integers(1, 10))
    prompt = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    steps = sorted(draw(st.lists(st.integers(1, 25), min_size=n, max_size=n)))
    # A small alphabet of 8-token hashes so requests really share prefix blocks.
    hashes = [draw(st.lists(st.integers(0, 1), min_size=(p + 7) // 8, max_size=(p + 7) // 8))
              for p in prompt]
    spec = SchedulerSpec(
        block_size=BS, num_gpu_blocks=draw(st.integers(4, 24)),
        num_cpu_blocks=draw(st.integers(1, 12)), max_num_seqs=draw(st.integers(1, 5)),
        max_num_batched_tokens=draw(st.integers(8, 48)), max_model_len=draw(st.integers(16, 48)),
        enable_chunked_prefill=draw(st.booleans()), enable_prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        async_scheduling=draw(st.booleans()), kv_offloading=True,
        offload_prompt_only=draw(st.booleans()),
        offload_eviction_policy=draw(st.sampled_from(["lru", "arc"])),
        offload_transfer_steps=draw(st.sampled_from([1, 1, 2])))
    prio = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return spec, np.array(prompt), np.array(output), np.array(steps), np.array(prio), hashes


def build(case):
    spec, prompt, output, steps, prio, hashes = case
    state = RequestState(arrival_s=steps + np.arange(len(steps)) * 1e-6, prompt_len=prompt,
                         output_len=output, priority=prio)
    keys = TraceBlockKeys(block_size=BS, prompt_len=prompt, prefix_hashes=hashes,
                          hash_block_tokens=8)
    return V1Scheduler(spec, state, keys), state


def check(s: V1Scheduler) -> None:
    pool = s.kv.pool
    owners = np.zeros(pool.num_blocks, np.int64)
    for row, table in s.kv.tables.items():
        assert len(set(table)) == len(table) and 0 not in table
        np.add.at(owners, table, 1)
    assert list(owners) == [0] + pool.ref[1:], "ref counts do not match the block tables"
    assert pool.num_free + pool.num_used == pool.num_blocks - 1
    # Blocks are held by running requests and by waiting ones whose CPU load came in.
    assert set(s.kv.tables) == set(s.running) | set(s.loading)
    assert not set(s.running) & set(s.loading)
    tier = s.conn.tier
    keys = set(tier.ready)
    assert tier.num_used == len(keys) <= tier.capacity
    assert s.snapshot()["free_cpu"] + tier.num_used == tier.capacity
    assert tier.num_pending == sum(not r for r in tier.ready.values())
    assert set(tier.pins) <= keys and min(tier.pins.values(), default=1) > 0
    if tier.lru is not None:
        assert set(tier.lru.rank) == keys, "a chunk without a rank, or a rank without a chunk"
        assert tier.lru.evictable == {k for k in keys if tier.can_evict(k)}
    else:
        a = tier.arc
        assert not set(a.t1) & set(a.t2) and set(a.t1) | set(a.t2) == keys
        assert not (set(a.b1) | set(a.b2)) & keys and 0 <= a.target_t1 <= tier.capacity


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(case=cases())
def test_offloading_accounting_termination_and_conservation(case):
    s, state = build(case)
    arrive = case[3]
    scheduled = np.zeros(state.n, np.int64)
    ended: list[int] = []
    loads = stores = 0
    for step in range(1, MAX_STEPS + 1):
        for row in np.flatnonzero(arrive == step).tolist():
            s.add_request(row)
        if step > arrive.max() and not s.has_unfinished():
            break
        plan = s.schedule()
        ended.extend(r.row for r in plan.rejected)
        np.add.at(scheduled, plan.rows, plan.num_new_tokens)
        loads += len(plan.offload.loads)
        stores += len(plan.offload.stores)
        out = s.update(plan)
        ended.extend(out.finished.tolist())
        check(s)
    assert not s.has_unfinished(), "the loop did not terminate"
    assert not s.conn.busy() and s.conn.tier.num_pending == 0 and not s.conn.tier.pins
    assert sorted(ended) == list(range(state.n))
    assert np.all(np.isin(state.status, [Status.FINISHED, Status.REJECTED]))
    assert s.gpu_blocks_used() == 0
    fin = state.status == Status.FINISHED
    np.testing.assert_array_equal(state.num_output[fin], np.minimum(
        state.output_len[fin], s.spec.max_model_len - state.prompt_len[fin]))
    # What was computed = prompt + output - 1 - first hit (GPU and CPU; a whole-prompt hit, as
    # vLLM counts it, still recomputes the last prompt token, F5) + recompute.
    expect = (state.prompt_len + state.num_output - 1
              - np.minimum(state.cached_prompt_tokens, state.prompt_len - 1)
              + state.recomputed_tokens)
    np.testing.assert_array_equal(scheduled[fin], expect[fin])
    assert np.all(state.cpu_hit_tokens <= state.cached_prompt_tokens)
    # A CPU hit only comes from a store (and takes a load).
    assert stores > 0 or (loads == 0 and state.cpu_hit_tokens.sum() == 0)
