"""The compiled V1 core (replay/engine/v1/_core.c) against the Python reference (the oracle the
golden scenarios S1-S20 and the vLLM oracle pin down): identical steps, requests, events, stalls
and TBT on Hypothesis workloads over every knob the core reads, with the C block pool's
accounting invariants checked after each run (free + used = total, no block owned twice, the
cache map only points at hashed blocks), with and without CPU KV offloading; real-trace heads;
eligibility and progress."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_helpers import assert_identical, run_both_with, run_compiled, run_stepped
from replay.engine import compiled
from replay.engine.state import Status
from replay_helpers import run_tiny, tiny_spec
from test_replay_loop import workloads



def test_core_is_built():
    """`pip install -e .` (make test / make report) compiles it; without it kvcap still runs,
    on the Python loop, but these tests would check nothing."""
    assert compiled.CORES["v1"] is not None


def run_both(spec, arrival, prompt, output, hashes=None, priority=None):
    return run_both_with("v1", spec, arrival, prompt, output, hashes, priority)


@st.composite
def core_specs(draw):
    chunked = draw(st.booleans())
    kw = dict(num_gpu_blocks=draw(st.integers(6, 48)),
              max_num_seqs=draw(st.integers(1, 8)),
              enable_chunked_prefill=chunked,
              enable_prefix_caching=draw(st.booleans()),
              preemption_mode=draw(st.sampled_from(["recompute", "none"])),
              policy=draw(st.sampled_from(["fcfs", "priority"])),
              long_prefill_token_threshold=draw(st.sampled_from([0, 0, 5, 16])),
              scheduler_reserve_full_isl=draw(st.booleans()),
              watermark=draw(st.sampled_from([0.0, 0.0, 0.1])),
              max_num_active_seqs=draw(st.sampled_from([None, None, 2])),
              async_scheduling=draw(st.booleans()),
              max_num_batched_tokens=draw(st.sampled_from([64, 24, 9] if chunked else [64])))
    return tiny_spec(**kw)


# KVCAP_CORE_EXAMPLES=N runs a longer differential fuzz (e.g. 5000 before touching the core).
@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=core_specs())
def test_core_equals_reference(w, spec):
    arrival, prompt, output, prio, hashes = w
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    # Every request ends exactly once.
    assert np.all(np.isin(fast.state.status, [Status.FINISHED, Status.REJECTED]))


@st.composite
def offload_specs(draw):
    """core_specs with vLLM 0.33's CPU KV offloading on (recompute preemption, as the config
    requires): both eviction policies, prompt-only on/off, a store threshold (with a tracker
    small enough to drop counts) or none, transfers in steps (1, 2: the oracle's emulation) or
    in time over a slow or a fast host link (0)."""
    spec = draw(core_specs())
    return tiny_spec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                        "preemption_mode": "recompute", "kv_offloading": True,
                        "num_cpu_blocks": draw(st.sampled_from([1, 3, 8, 24])),
                        "offload_eviction_policy": draw(st.sampled_from(["lru", "arc"])),
                        "offload_prompt_only": draw(st.booleans()),
                        "offload_store_threshold": draw(st.sampled_from([0, 0, 2, 3])),
                        "offload_store_tracker_size": draw(st.sampled_from([64_000, 3, 8])),
                        "offload_transfer_steps": draw(st.sampled_from([0, 1, 2])),
                        "offload_host_link_bytes_per_s": draw(st.sampled_from([1e8, 1e10]))})


@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=offload_specs())
def test_offloading_core_equals_reference(w, spec):
    """The differential test with the OffloadingConnector on (#16: both implementations follow
    real vLLM 0.33 rule for rule, tools/oracle_fuzz/): sync and async, LRU and ARC, prompt-only
    on and off, transfers in steps or in time; a failure names the first divergence."""
    arrival, prompt, output, prio, hashes = w
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    assert np.all(np.isin(fast.state.status, [Status.FINISHED, Status.REJECTED]))


@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 150)) // 2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=offload_specs())
def test_offloading_per_step_contract_equals_run_to_end(w, spec):
    """With the OffloadingConnector: the core stepped through `StepCore` by the reference loop
    (replay/engine/loop.py: its clock told, offload events and columns, idle jumps to the next
    transfer) == the core run to the end in C (kvcore.h's copy of that bookkeeping), with the
    block pool's invariants checked; every request ends; the tier never exceeds its chunks."""
    arrival, prompt, output, prio, hashes = w
    stepped = run_stepped("v1", spec, arrival, prompt, output, hashes, prio)
    fast = run_compiled("v1", spec, arrival, prompt, output, hashes, prio)
    assert_identical(stepped, fast)
    assert np.all(np.isin(fast.state.status, [Status.FINISHED, Status.REJECTED]))
    assert fast.steps["cpu_blocks_used"].max(initial=0) <= spec.num_cpu_blocks
    kinds = np.array(fast.events["kind"], dtype=object)
    blocks = np.array(fast.events["blocks"], dtype=np.int64)
    for kind, col in (("offload_store", "offload_store_blocks"), ("offload_load", "offload_load_blocks")):
        assert blocks[kinds == kind].sum() == fast.steps[col].sum()
    assert np.all(fast.state.cpu_hit_tokens <= fast.state.cached_prompt_tokens)


@pytest.mark.parametrize("implementation", ["compiled", "reference"])
def test_v1_refuses_swap_preemption(implementation):
    """V1 has no swap (its host tier is CPU KV offloading): a spec asking for it is an error on
    both implementations, not a silent recompute."""
    with pytest.raises(ValueError, match="V1 has no swap preemption"):
        run_tiny("v1", tiny_spec(preemption_mode="swap"), [0.0], np.array([8]), np.array([2]),
                 implementation=implementation)


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_core_preempts_and_rehits(policy):
    """A pool a few requests wide under a burst: preemptions (re-admissions that hit the
    victim's still-cached blocks), stalls; identical to Python, invariants hold."""
    rng = np.random.default_rng(3)
    n = 60
    arrival = np.sort(rng.uniform(0, 0.5, n))
    prompt = rng.integers(10, 40, n)
    output = rng.integers(10, 40, n)
    prio = rng.integers(0, 3, n)
    hashes = [list(rng.integers(0, 2, (p + 7) // 8)) for p in prompt]
    spec = tiny_spec(num_gpu_blocks=40, max_num_seqs=8, policy=policy)
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    st_ = fast.state
    assert len(fast.stalls["row"]) > 0
    assert st_.num_recomputes.sum() > 0 and st_.num_swaps.sum() == 0
    once = st_.num_recomputes == 1   # recomputed = computed at preemption - hit at resume
    assert np.any(st_.recomputed_tokens[once] < st_.computed_at_preemption[once])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=core_specs())
def test_per_step_contract_equals_run_to_end(w, spec):
    """The core stepped through `StepCore` by the reference loop == the core run in C."""
    arrival, prompt, output, prio, hashes = w
    assert_identical(run_stepped("v1", spec, arrival, prompt, output, hashes, prio),
                     run_compiled("v1", spec, arrival, prompt, output, hashes, prio))


@st.composite
def abort_scenarios(draw):
    """Small oracle-format V1 scenarios (tests/oracle_driver.py) with client aborts at random
    steps: with and without CPU KV offloading, sync and async, prompts from a small block
    alphabet (prefix and CPU hits), tight pools (preemption, loads in flight when the abort
    comes)."""
    bs = draw(st.sampled_from([2, 4]))
    max_len = draw(st.sampled_from([16, 24, 32]))
    chunked = draw(st.booleans())
    G = draw(st.integers(4, 16))
    sc = {"block_size": bs, "num_gpu_blocks": G, "max_num_seqs": draw(st.integers(1, 4)),
          "max_num_batched_tokens": draw(st.sampled_from([4, 8, 16, 32]) if chunked
                                         else st.sampled_from([max_len, 64])),
          "max_model_len": max_len, "chunked_prefill": chunked,
          # Mostly off: a repeated prompt then misses the GPU and hits the CPU tier (a load).
          "prefix_caching": draw(st.sampled_from([False, False, True])),
          "policy": draw(st.sampled_from(["fcfs", "priority"])),
          "async_scheduling": draw(st.booleans()), "max_steps": 100}
    if draw(st.booleans()):
        sc["kv_offloading"] = {"num_cpu_blocks": draw(st.integers(1, 12)),
                               "eviction_policy": draw(st.sampled_from(["lru", "arc"])),
                               "offload_prompt_only": draw(st.booleans()),
                               "store_threshold": draw(st.sampled_from([0, 0, 2])),
                               "transfer_steps": draw(st.sampled_from([1, 2, 2]))}
    alphabet = [[1000 + a * 100 + j for j in range(bs)] for a in range(3)]
    n = draw(st.integers(1, 6))
    arrivals = sorted(draw(st.lists(st.integers(1, 10), min_size=n, max_size=n)))
    reqs = []
    for i, arrival in enumerate(arrivals):
        blocks = draw(st.lists(st.integers(0, 2), min_size=1, max_size=max_len // bs - 1))
        toks = [t for b in blocks for t in alphabet[b]][:draw(st.integers(1, max_len - 2))]
        if reqs and draw(st.integers(0, 2)) > 0:
            # An earlier prompt again: a CPU hit once the GPU has lost it (a load to abort).
            toks = list(reqs[draw(st.integers(0, len(reqs) - 1))]["prompt_token_ids"])
        r = {"id": f"r{i}", "arrival_step": arrival, "prompt_token_ids": toks,
             "output_tokens": draw(st.integers(1, 8)), "priority": draw(st.integers(0, 2))}
        if draw(st.integers(0, 9)) < 6:
            r["abort_step"] = arrival + draw(st.integers(0, 6))
        reqs.append(r)
    sc["requests"] = reqs
    return sc


@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 300)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sc=abort_scenarios())
def test_client_aborts_core_equals_reference(sc):
    """Client aborts (the oracle hook `abort_request`) on the compiled core step by step ==
    the reference: every line the oracle driver prints (schedule, queues, block tables, the
    connector's decisions and the tier), the request counters at the end, the C block pool's
    invariants; with offloading also aborts while the step is in flight (async) or the CPU load
    is (frees deferred, C4)."""
    from replay.engine.compiled import StepCore
    from replay.engine.v1 import V1Scheduler
    from tests.oracle_driver import drive
    states, cores = {}, []

    def compiled_core(spec, state, keys):
        cores.append(StepCore("v1", spec, state, keys))
        return cores[-1]
    fields = ("status", "num_computed", "num_output", "num_preemptions", "cached_prompt_tokens",
              "cpu_hit_tokens", "recomputed_tokens")
    keep = lambda name: lambda state, ids: states.update(  # noqa: E731
        {name: {f: getattr(state, f).tolist() for f in fields}})
    ref = drive(V1Scheduler, sc, "v1", inspect=keep("reference"))
    got = drive(compiled_core, sc, "v1", inspect=keep("compiled"))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g == r, {k: (g.get(k), r.get(k)) for k in set(g) | set(r) if g.get(k) != r.get(k)}
    assert states["compiled"] == states["reference"]
    compiled.CORES["v1"].check(cores[0]._core)
