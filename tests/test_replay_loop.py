"""The replay loop: compiled core == Python reference (differential), token conservation, Little's law,
every request ends exactly once, determinism. Engines: both schedulers, all preemption modes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.engine.divergence import first_divergence
from replay.engine.state import Status
from replay_helpers import run_tiny, tiny_spec

# V1 has no swap preemption (its host tier is CPU KV offloading: tests/test_v1_offload_*).
MODES = [("v0", "recompute"), ("v0", "swap"), ("v0", "none"), ("v1", "recompute"), ("v1", "none")]


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 14))
    gaps = draw(st.lists(st.floats(0, 0.2), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    prio = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    shared = draw(st.booleans())
    hashes = None
    if shared:
        # prefixes from a small alphabet so requests really share blocks (8 tokens per hash)
        hashes = [draw(st.lists(st.integers(0, 2), min_size=(p + 7) // 8, max_size=(p + 7) // 8))
                  for p in prompt]
    return (np.cumsum(gaps), np.array(prompt), np.array(output), np.array(prio), hashes)


def spec_for(engine, mode, data):
    chunked = data.draw(st.booleans()) if engine == "v0" else True
    kw = dict(num_gpu_blocks=data.draw(st.integers(12, 40)),
              num_cpu_blocks=data.draw(st.integers(0, 24)),
              max_num_seqs=data.draw(st.integers(1, 6)),
              enable_chunked_prefill=chunked,
              enable_prefix_caching=data.draw(st.booleans()),
              preemption_mode=mode,
              on_swap_full=data.draw(st.sampled_from(["abort", "recompute"])))
    if not chunked:
        kw["max_num_batched_tokens"] = 64   # >= max_model_len when chunking is off (V0)
    if mode != "swap":
        kw["policy"] = data.draw(st.sampled_from(["fcfs", "priority"]))
    return tiny_spec(**kw)


def assert_same(a, b):
    """The two runs are identical; a failure names the first divergence (step, request, field,
    both values)."""
    where = first_divergence(a, b, (a.implementation, b.implementation))
    assert where is None, where
    assert a.status == b.status and a.num_steps == b.num_steps
    for k in a.steps:
        np.testing.assert_array_equal(a.steps[k], b.steps[k], err_msg=k)
    for k in ("first_scheduled_s", "first_token_s", "finish_s", "max_tbt_s"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    for k in ("status", "num_computed", "num_output", "num_preemptions", "num_swaps",
              "num_recomputes", "recomputed_tokens", "cached_prompt_tokens"):
        np.testing.assert_array_equal(getattr(a.state, k), getattr(b.state, k), err_msg=k)
    assert a.events == b.events
    assert a.stalls == b.stalls
    # Fleet TBT distribution: same multiset of samples.
    ea = np.repeat(a.tbt_values, a.tbt_weights)
    eb = np.repeat(b.tbt_values, b.tbt_weights)
    np.testing.assert_array_equal(np.sort(ea), np.sort(eb))


@pytest.mark.parametrize("engine,mode", MODES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), data=st.data())
def test_compiled_equals_reference(engine, mode, w, data):
    arrival, prompt, output, prio, hashes = w
    spec = spec_for(engine, mode, data)
    fast = run_tiny(engine, spec, arrival, prompt, output, priority=prio, prefix_hashes=hashes,
                    implementation="compiled")
    slow = run_tiny(engine, spec, arrival, prompt, output, priority=prio, prefix_hashes=hashes,
                    implementation="reference")
    assert_same(fast, slow)
    # Every request ends exactly once: a terminal status, or (only after an abort) not arrived.
    s = fast.state.status
    if fast.status == "completed":
        assert np.all(np.isin(s, [Status.FINISHED, Status.REJECTED])), s
    else:
        assert np.all(np.isin(s, [Status.FINISHED, Status.REJECTED, Status.ABORTED, Status.PENDING]))
    fin = s == Status.FINISHED
    assert np.all(fast.state.num_output[fin] == np.minimum(
        output[fin], spec.max_model_len - prompt[fin]))
    # Token conservation (finished-only runs): all computed tokens are accounted for.
    if fast.status == "completed" and not np.any(s == Status.REJECTED):
        st_ = fast.state
        computed = int(fast.steps["num_prefill_tokens"].sum() + fast.steps["num_decode_tokens"].sum())
        expect = int((st_.prompt_len + st_.num_output - 1 - st_.cached_prompt_tokens
                      + st_.recomputed_tokens).sum())
        assert computed == expect


def test_littles_law_on_a_steady_poisson_load():
    rng = np.random.default_rng(7)
    n = 600
    arrival = np.cumsum(rng.exponential(0.05, n))
    prompt = rng.integers(8, 60, n)
    output = rng.integers(5, 80, n)
    spec = tiny_spec(num_gpu_blocks=400, max_num_seqs=32, max_num_batched_tokens=256,
                     max_model_len=256)
    raw = run_tiny("v1", spec, arrival, prompt, output)
    assert np.all(raw.state.status == Status.FINISHED)
    # L = lambda * W: the time-average number in the engine equals arrival rate x mean time in it.
    steps = raw.steps
    area = float(((steps["num_running"] + steps["num_waiting"]) * steps["duration_s"]).sum())
    horizon = float(steps["start_s"][-1] + steps["duration_s"][-1] - steps["start_s"][0])
    L = area / horizon
    W = float(np.mean(raw.finish_s - arrival))
    lam = n / horizon
    assert L == pytest.approx(lam * W, rel=0.05)
