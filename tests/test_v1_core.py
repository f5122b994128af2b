"""The compiled V1 core (replay/v1/_core.c) against the Python step-by-step path (the oracle the
golden scenarios S1-S20 and the vLLM oracle pin down): identical steps, requests, events, stalls
and TBT on Hypothesis workloads over every knob the core reads, with the C block pool's
accounting invariants checked after each run (free + used = total, no block owned twice, the
cache map only points at hashed blocks); real-trace heads; eligibility and progress."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_helpers import assert_identical, make_engine, run_both_with
from replay import loop
from replay.prefix import UniqueBlockKeys
from replay.state import Status
from replay.v1 import core
from replay.v1.scheduler import V1Scheduler
from replay_helpers import tiny_spec
from test_replay_loop import assert_same, workloads



def test_core_is_built():
    """`pip install -e .` (make test / make report) compiles it; without it kvcap still runs,
    on the Python loop, but these tests would check nothing."""
    assert core._core is not None


def _engine(spec, arrival, prompt, output, hashes, priority=None):
    return make_engine(V1Scheduler, spec, arrival, prompt, output, hashes, priority)


def run_both(spec, arrival, prompt, output, hashes=None, priority=None):
    return run_both_with(core, V1Scheduler, spec, arrival, prompt, output, hashes, priority)


@st.composite
def core_specs(draw):
    chunked = draw(st.booleans())
    kw = dict(num_gpu_blocks=draw(st.integers(6, 48)),
              max_num_seqs=draw(st.integers(1, 8)),
              enable_chunked_prefill=chunked,
              enable_prefix_caching=draw(st.booleans()),
              preemption_mode=draw(st.sampled_from(["recompute", "none", "swap"])),
              policy=draw(st.sampled_from(["fcfs", "priority"])),
              num_cpu_blocks=draw(st.sampled_from([0, 3, 8, 24])),
              long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 16])),
              scheduler_reserve_full_isl=draw(st.booleans()),
              watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
              max_num_active_seqs=draw(st.sampled_from([None, None, 2])),
              max_num_batched_tokens=draw(st.sampled_from([64, 24, 9] if chunked else [64])))
    return tiny_spec(**kw)


# KVCAP_CORE_EXAMPLES=N runs a longer differential fuzz (e.g. 5000 before touching the core).
@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=core_specs())
def test_core_equals_python_step_by_step(w, spec):
    arrival, prompt, output, prio, hashes = w
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    # Every request ends exactly once.
    assert np.all(np.isin(fast.state.status, [Status.FINISHED, Status.REJECTED]))


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_core_preempts_swaps_and_rehits(policy, mode):
    """A pool a few requests wide under a burst: preemptions (recompute: re-admissions that hit
    the victim's still-cached blocks; swap: host copies loaded back, a host tier small enough to
    evict), stalls; identical to Python, invariants hold."""
    rng = np.random.default_rng(3)
    n = 60
    arrival = np.sort(rng.uniform(0, 0.5, n))
    prompt = rng.integers(10, 40, n)
    output = rng.integers(10, 40, n)
    prio = rng.integers(0, 3, n)
    hashes = [list(rng.integers(0, 2, (p + 7) // 8)) for p in prompt]
    spec = tiny_spec(num_gpu_blocks=40, max_num_seqs=8, preemption_mode=mode, policy=policy,
                     num_cpu_blocks=12)
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_same(fast, slow)
    st_ = fast.state
    kinds = set(fast.events["kind"])
    assert len(fast.stalls["row"]) > 0
    if mode == "recompute":
        assert st_.num_recomputes.sum() > 0 and st_.num_swaps.sum() == 0
        once = st_.num_recomputes == 1   # recomputed = computed at preemption - hit at resume
        assert np.any(st_.recomputed_tokens[once] < st_.computed_at_preemption[once])
    else:
        assert {"preempt_swap", "swap_in"} <= kinds
        assert fast.steps["cpu_blocks_used"].max() == 12          # the tier filled up
        assert fast.steps["evicted_blocks"].max() > 0
        assert "swap" in set(fast.stalls["mode"])


def test_progress_is_reported_at_step_multiples():
    rng = np.random.default_rng(0)
    n = 200
    arrival = np.cumsum(rng.exponential(0.02, n))
    prompt, output = rng.integers(5, 30, n), rng.integers(5, 30, n)
    spec = tiny_spec(num_gpu_blocks=200, max_num_seqs=16, max_model_len=64)
    calls = []
    state, sched, ex = _engine(spec, arrival, prompt, output, None)
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block,
                   on_progress=lambda t, done: calls.append((t, done)), progress_every_steps=100)
    assert len(calls) == raw.num_steps // 100
    ts = [c[0] for c in calls]
    assert ts == sorted(ts) and all(0 < d <= n for _, d in calls)
    # Each report is the end time of its 100th step.
    ends = raw.steps["start_s"] + raw.steps["duration_s"]
    assert ts[0] == ends[99]


def test_ineligible_configs_run_the_python_loop(monkeypatch):
    spec = tiny_spec()
    arrival, prompt, output = [0.0, 0.1], np.array([10, 12]), np.array([5, 6])
    from replay.prefix import TokenBlockKeys
    from replay.v0.scheduler import V0Scheduler
    state, sched, ex = _engine(spec, arrival, prompt, output, None)
    assert core.ineligible(V0Scheduler(spec, state, UniqueBlockKeys()), ex) == "not the V1 scheduler"
    tokens = V1Scheduler(spec, state, TokenBlockKeys(block_size=4, tokens=lambda r: []))
    assert core.ineligible(tokens, ex) == "block keys TokenBlockKeys"
    state, sched, ex = _engine(spec, arrival, prompt, output, None)
    assert core.ineligible(sched, object()) == "not the cost-model executor"
    monkeypatch.setenv("KVCAP_CORE", "python")
    assert core.ineligible(sched, ex) == "KVCAP_CORE=python"
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert sched.kv is not None                     # the Python scheduler really ran
    monkeypatch.delenv("KVCAP_CORE")
    state, sched, ex = _engine(spec, arrival, prompt, output, None)
    raw2 = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert sched.kv is None                         # the core ran and retired the Python one
    assert_same(raw, raw2)


def test_core_rejects_unsorted_arrivals():
    spec = tiny_spec()
    state, sched, ex = _engine(spec, [0.2, 0.1], np.array([4, 4]), np.array([2, 2]), None)
    with pytest.raises(ValueError, match="sorted by arrival_s"):
        core.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
