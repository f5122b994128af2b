"""Shared by the compiled-core tests (test_v1_core.py, test_v0_core.py): tiny engines and the
differential run (the core with its block-pool invariant check vs the Python step-by-step path)."""
from __future__ import annotations

import numpy as np

from replay import loop
from replay.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.state import RequestState
from replay_helpers import tiny_cost_model
from test_replay_loop import assert_same


def make_engine(scheduler_cls, spec, arrival, prompt, output, hashes, priority=None):
    """(state, scheduler, cost model) for a tiny workload; hashes: trace prefix hashes (8 tokens
    each) or None."""
    state = RequestState(arrival_s=np.asarray(arrival, float), prompt_len=prompt, output_len=output,
                         priority=priority)
    keys = (UniqueBlockKeys() if hashes is None else
            TraceBlockKeys(block_size=spec.block_size, prompt_len=prompt, prefix_hashes=hashes,
                           hash_block_tokens=8))
    return state, scheduler_cls(spec, state, keys), tiny_cost_model(block_size=spec.block_size)


def run_both_with(core, scheduler_cls, spec, arrival, prompt, output, hashes=None, priority=None):
    """(compiled core with invariant checks, Python step by step) on fresh engines."""
    state, sched, ex = make_engine(scheduler_cls, spec, arrival, prompt, output, hashes, priority)
    assert core.ineligible(sched, ex) is None, core.ineligible(sched, ex)
    fast = core.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block, check=True)
    state, sched, ex = make_engine(scheduler_cls, spec, arrival, prompt, output, hashes, priority)
    slow = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block,
                    step_by_step=True)
    return fast, slow


def assert_identical(fast, slow):
    """The tables of `assert_same`, plus TBT samples in the same order and weights (not only the
    same multiset), the preemption scratch, the abort and the clock."""
    assert_same(fast, slow)
    np.testing.assert_array_equal(fast.tbt_values, slow.tbt_values)
    np.testing.assert_array_equal(fast.tbt_weights, slow.tbt_weights)
    np.testing.assert_array_equal(fast.state.computed_at_preemption,
                                  slow.state.computed_at_preemption)
    assert (fast.abort_s, fast.abort_reason) == (slow.abort_s, slow.abort_reason)
    assert (fast.sim_seconds, fast.num_steps) == (slow.sim_seconds, slow.num_steps)
