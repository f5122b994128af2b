"""The compiled V0 core (replay/engine/v0/_core.c) against the Python reference (the oracle the
golden scenarios S1-S12 and the vLLM oracle pin down): identical steps, requests, events, stalls,
TBT and abort outcome on Hypothesis workloads over every V0 knob (default and chunked paths,
prefix caching, recompute / swap / queue-only, FCFS / priority, swap-full abort or fallback,
tiny GPU and host pools), with the C block pools' accounting invariants checked after each run;
deterministic runs that force swap-out / swap-in, an abort, a fallback, priority preemption and
kvcap's documented departures from vLLM; eligibility."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_helpers import assert_identical, make_engine, run_both_with, run_compiled, run_stepped
from replay.engine import compiled, loop
from replay.engine.state import Status
from replay.engine.v0.scheduler import V0Scheduler
from replay_helpers import tiny_spec
from test_replay_loop import workloads


def test_core_is_built():
    """`pip install -e .` compiles it; without it kvcap still runs, on the Python loop, but these
    tests would check nothing."""
    assert compiled.CORES["v0"] is not None


def run_both(spec, arrival, prompt, output, hashes=None, priority=None):
    return run_both_with("v0", spec, arrival, prompt, output, hashes, priority)


@st.composite
def v0_specs(draw):
    chunked = draw(st.booleans())
    mode = draw(st.sampled_from(["recompute", "swap", "none"]))
    # V0 refuses priority + swap (the scheduler raises; replay/config.py too).
    policy = "fcfs" if mode == "swap" else draw(st.sampled_from(["fcfs", "priority"]))
    max_len = draw(st.sampled_from([64, 64, 40, 32]))   # 32: some prompts exceed it
    kw = dict(block_size=draw(st.sampled_from([4, 4, 2, 8])),
              num_gpu_blocks=draw(st.integers(4, 40)),
              num_cpu_blocks=draw(st.sampled_from([0, 1, 3, 6, 12, 40])),
              max_num_seqs=draw(st.integers(1, 8)),
              max_model_len=max_len,
              enable_chunked_prefill=chunked,
              enable_prefix_caching=draw(st.booleans()),
              preemption_mode=mode, policy=policy,
              on_swap_full=draw(st.sampled_from(["abort", "recompute"])),
              v0_watermark=draw(st.sampled_from([0.01, 0.01, 0.0, 0.1])),
              # Chunking off: V0 rejects prompts over the budget, so keep it near max_model_len
              # sometimes and below it others.
              max_num_batched_tokens=draw(st.sampled_from([64, 24, 9, 4] if chunked
                                                          else [max_len, 64, 30])))
    return tiny_spec(**kw)


# KVCAP_CORE_EXAMPLES=N runs a longer differential fuzz (e.g. 5000 before touching the core).
@settings(max_examples=int(os.environ.get("KVCAP_CORE_EXAMPLES", 600)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=v0_specs())
def test_core_equals_reference(w, spec):
    arrival, prompt, output, prio, hashes = w
    fast, slow = run_both(spec, arrival, prompt, output, hashes, prio)
    assert_identical(fast, slow)
    # (Not every request need end: a budget below one block with prefix caching chunks to 0
    # tokens, and the loop gives up, leaving them unfinished, on both paths.)


def run_python_with_reasons(spec, arrival, prompt, output, hashes=None, priority=None):
    """The Python reference run plus what its plans carried that the tables do not keep: the
    rejection reasons (which departure fired) and the priority preemptions."""
    state, keys, ex = make_engine("v0", spec, arrival, prompt, output, hashes, priority)
    sched = V0Scheduler(spec, state, keys)
    reasons, by_priority = [], []
    schedule = sched.schedule

    def recording():
        plan = schedule()
        reasons.extend(r.reason for r in plan.rejected)
        by_priority.extend(p.row for p in plan.preempted if p.by_priority)
        return plan

    sched.schedule = recording
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    return raw, reasons, by_priority


def _burst(seed, n=40):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 0.3, n))
    prompt = rng.integers(6, 40, n)
    output = rng.integers(8, 40, n)
    hashes = [list(rng.integers(0, 2, (p + 7) // 8)) for p in prompt]
    return arrival, prompt, output, rng.integers(0, 3, n), hashes


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_swap_out_and_swap_in(chunked, caching):
    """A GPU pool a few requests wide and a roomy host pool: victims go out and come back (their
    stalls are swap stalls, the evicted-KV series rises), identical to Python."""
    arrival, prompt, output, _, hashes = _burst(1)
    spec = tiny_spec(num_gpu_blocks=24, num_cpu_blocks=200, max_num_seqs=8, preemption_mode="swap",
                     enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                     max_num_batched_tokens=64 if not chunked else 16)
    fast, slow = run_both(spec, arrival, prompt, output, hashes if caching else None)
    assert_identical(fast, slow)
    assert fast.status == "completed"
    assert {"preempt_swap", "swap_in"} <= set(fast.events["kind"])
    assert fast.steps["swap_out_blocks"].sum() > 0 and fast.steps["swap_in_blocks"].sum() > 0
    assert fast.steps["num_swapped"].max() > 0 and fast.steps["evicted_blocks"].max() > 0
    assert "swap" in fast.stalls["mode"]
    assert fast.state.num_swaps.sum() > 0 and fast.state.num_recomputes.sum() == 0


def test_swap_full_aborts_the_run():
    """A host pool too small for a victim with on_swap_full="abort": the run stops at that step
    (vLLM V0's RuntimeError), requests inside the engine are aborted, later ones never arrive."""
    arrival, prompt, output, _, _ = _burst(2)
    spec = tiny_spec(num_gpu_blocks=24, num_cpu_blocks=3, max_num_seqs=8, preemption_mode="swap",
                     on_swap_full="abort", enable_prefix_caching=False)
    fast, slow = run_both(spec, arrival, prompt, output)
    assert_identical(fast, slow)
    assert fast.status == "aborted"
    assert fast.abort_reason.startswith("Aborted due to the lack of CPU swap space: request row ")
    assert fast.events["kind"][-1] == "swap_full_abort"
    assert fast.abort_s == fast.events["t_s"][-1]
    s = fast.state.status
    assert np.any(s == Status.ABORTED)
    assert not np.any((s == Status.WAITING) | (s == Status.RUNNING) | (s == Status.SWAPPED))


def test_swap_full_falls_back_to_recompute():
    arrival, prompt, output, _, _ = _burst(2)
    spec = tiny_spec(num_gpu_blocks=24, num_cpu_blocks=3, max_num_seqs=8, preemption_mode="swap",
                     on_swap_full="recompute", enable_prefix_caching=False)
    fast, slow = run_both(spec, arrival, prompt, output)
    assert_identical(fast, slow)
    assert fast.status == "completed"
    kinds = fast.events["kind"]
    assert "swap_full_fallback" in kinds
    # Each fallback event is followed by the recompute preemption of the same row.
    for i, k in enumerate(kinds):
        if k == "swap_full_fallback":
            assert kinds[i + 1] == "preempt_recompute"
            assert fast.events["row"][i + 1] == fast.events["row"][i]
    assert fast.state.num_recomputes.sum() > 0


def test_priority_preemption():
    """Default path (chunking off), policy priority: urgent arrivals preempt worse-priority running
    requests (`_schedule_priority_preemption`), identical to Python."""
    n = 30
    rng = np.random.default_rng(4)
    arrival = np.sort(rng.uniform(0, 0.2, n))
    prompt = rng.integers(10, 30, n)
    output = rng.integers(20, 40, n)
    prio = np.where(np.arange(n) < 6, 2, rng.integers(0, 2, n))    # the first ones are the worst
    spec = tiny_spec(num_gpu_blocks=30, max_num_seqs=6, policy="priority",
                     enable_chunked_prefill=False, enable_prefix_caching=False)
    fast, slow = run_both(spec, arrival, prompt, output, priority=prio)
    assert_identical(fast, slow)
    assert fast.state.num_preemptions[:6].sum() > 0
    _, _, by_priority = run_python_with_reasons(spec, arrival, prompt, output, priority=prio)
    assert by_priority and set(prio[by_priority]) == {2}


def test_queue_only_mode_never_preempts():
    arrival, prompt, output, _, hashes = _burst(5)
    for chunked in (False, True):
        spec = tiny_spec(num_gpu_blocks=30, max_num_seqs=8, preemption_mode="none",
                         enable_chunked_prefill=chunked)
        fast, slow = run_both(spec, arrival, prompt, output, hashes)
        assert_identical(fast, slow)
        assert fast.state.num_preemptions.sum() == 0
        assert np.all(fast.state.status == Status.FINISHED)


# --------------------------------------------------------------- kvcap's departures (docs/design.md)
SWAP_SMALL = dict(block_size=4, num_cpu_blocks=28, max_num_seqs=2, max_num_batched_tokens=12,
                  enable_chunked_prefill=True, enable_prefix_caching=False, preemption_mode="swap",
                  on_swap_full="recompute")


def test_livelock_rejected_after_five_self_preemptions():
    """(1) A chunked prompt whose blocks fill the GPU pool with a partial last block self-preempts
    forever in vLLM V0; kvcap rejects it after 5 identical self-preemptions."""
    spec = tiny_spec(**{**SWAP_SMALL, "num_gpu_blocks": 11, "num_cpu_blocks": 20})
    arrival = [0.004077630868175636, 0.009566196302860014, 0.0401182080567265]
    prompt, output = np.array([11, 34, 28]), np.array([26, 25, 26])
    fast, slow = run_both(spec, arrival, prompt, output)
    assert_identical(fast, slow)
    _, reasons, _ = run_python_with_reasons(spec, arrival, prompt, output)
    assert any("preempted itself 5 times in a row" in r for r in reasons), reasons
    assert Status.REJECTED in fast.state.status


def test_swapped_prefill_over_budget_and_infeasible_swap_in():
    """(2) A swapped request whose remaining prefill exceeds max_num_batched_tokens is rejected
    (V0 keeps it swapped forever); (3) a swap-in that can never fit drops the request without
    freeing its host blocks (the leak is real: the host pool stays partly used to the end)."""
    spec = tiny_spec(**{**SWAP_SMALL, "num_gpu_blocks": 12})
    arrival = [0.010172762033807481, 0.013115667022092476, 0.014020437899301998,
               0.03751823363150263]
    prompt, output = np.array([21, 21, 8, 39]), np.array([22, 28, 4, 22])
    fast, slow = run_both(spec, arrival, prompt, output)
    assert_identical(fast, slow)
    _, reasons, _ = run_python_with_reasons(spec, arrival, prompt, output)
    assert any(r.startswith("swapped prefill needs") for r in reasons), reasons
    assert "swap-in can never fit the GPU pool" in reasons
    assert fast.steps["cpu_blocks_used"][-1] > 0


def test_swapped_mid_prefill_victim_with_prefix_caching():
    """(4) Chunked + prefix caching + swap of a mid-prefill victim: vLLM V0 asserts (its
    remembered hit is below the computed tokens); kvcap swaps it back without a prefix hit."""
    spec = tiny_spec(num_gpu_blocks=8, num_cpu_blocks=40, max_num_seqs=4, max_num_batched_tokens=16,
                     enable_chunked_prefill=True, enable_prefix_caching=True,
                     preemption_mode="swap", on_swap_full="recompute")
    arrival = [0.001579028495463425, 0.006520552045407336, 0.01186614516226629,
               0.012750976220473631, 0.040531483609929704, 0.04242049596610298,
               0.04597290307743928]
    prompt = np.array([7, 14, 16, 30, 5, 38, 8])
    output = np.array([29, 2, 23, 18, 15, 19, 11])
    hashes = [[0] * ((p + 7) // 8) for p in prompt]
    seen = []
    num_new = V0Scheduler._num_new_tokens

    def spy(self, row, budget, chunking, swapped=False):
        if swapped and self.in_prefill[row]:
            seen.append((int(self.state.num_computed[row]),
                         self.bm.get_num_cached_tokens(row, self._seq_len(row), True)))
        return num_new(self, row, budget, chunking, swapped)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(V0Scheduler, "_num_new_tokens", spy)
        fast, slow = run_both(spec, arrival, prompt, output, hashes)
    assert_identical(fast, slow)
    assert any(0 < hit < computed for computed, hit in seen), seen
    assert "swap_in" in fast.events["kind"]


def test_stale_evictor_entry_is_skipped_by_both_paths():
    """vLLM's LRUEvictor keeps stale heap entries and checks only the last-access time: when a
    block re-enters the evictor under a new key with the same time (-1.0: blocks released by a
    swap-out), a stale entry of its old key counts as live and vLLM 0.10.1.1 trips the sanity
    asserts of `_maybe_allocate_evicted_block`. kvcap departs (docs/design.md): the entry must
    carry the block's current key too. This workload hit it (KeyError) before the fix; both
    paths now finish it, identically."""
    spec = tiny_spec(num_gpu_blocks=11, num_cpu_blocks=15, max_num_seqs=4, max_num_batched_tokens=12,
                     enable_chunked_prefill=True, enable_prefix_caching=True,
                     preemption_mode="swap", on_swap_full="recompute")
    arrival = [0.001974697459656766, 0.03260237747791447, 0.04260791921704606,
               0.04414814368713815, 0.04614724455800339]
    prompt, output = np.array([39, 8, 28, 8, 17]), np.array([27, 15, 2, 29, 23])
    hashes = [[1, 1, 1, 0, 1], [1], [1, 1, 0, 1], [0], [1, 1, 0]]
    fast, slow = run_both(spec, arrival, prompt, output, hashes)
    assert_identical(fast, slow)
    assert fast.status == "completed"
    # Row 0 can never fit this pool (rejected); the others finish.
    assert fast.state.status.tolist() == [Status.REJECTED] + [Status.FINISHED] * 4
    assert fast.state.num_swaps.sum() > 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), spec=v0_specs())
def test_per_step_contract_equals_run_to_end(w, spec):
    """The core stepped through `StepCore` by the reference loop == the core run in C."""
    arrival, prompt, output, prio, hashes = w
    assert_identical(run_stepped("v0", spec, arrival, prompt, output, hashes, prio),
                     run_compiled("v0", spec, arrival, prompt, output, hashes, prio))
