"""Shared by the compiled-core tests (test_v1_core.py, test_v0_core.py, test_compiled.py): tiny
engines and the differential run (the compiled core with its block-pool invariant check vs the
Python reference), compared with the first divergence named."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from replay.engine import compiled, loop
from replay.engine.divergence import first_divergence
from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.engine.state import RequestState
from replay.run import make_scheduler
from replay_helpers import tiny_cost_model

NAMES = ("compiled", "reference")


def both_implementations(module_name: str):
    """An autouse fixture that runs every test of `module_name` on both implementations; the
    module's global IMPL names the one under test (its helpers build the scheduler from it)."""
    module = sys.modules[module_name]

    @pytest.fixture(params=["reference", "compiled"], autouse=True)
    def implementation(request):
        module.IMPL = request.param
        yield request.param
        module.IMPL = "reference"
    return implementation


def make_engine(engine, spec, arrival, prompt, output, hashes, priority=None):
    """(state, keys, cost model) for a tiny workload; hashes: trace prefix hashes (8 tokens
    each) or None."""
    state = RequestState(arrival_s=np.asarray(arrival, float), prompt_len=prompt, output_len=output,
                         priority=priority)
    keys = (UniqueBlockKeys() if hashes is None else
            TraceBlockKeys(block_size=spec.block_size, prompt_len=prompt, prefix_hashes=hashes,
                           hash_block_tokens=8))
    # Priced as the engine loop runs: async scheduling overlaps the step overhead (both sides).
    return state, keys, tiny_cost_model(block_size=spec.block_size,
                                        async_scheduling=spec.async_scheduling)


def run_compiled(engine, spec, arrival, prompt, output, hashes=None, priority=None, **kw):
    state, keys, ex = make_engine(engine, spec, arrival, prompt, output, hashes, priority)
    assert compiled.unavailable(engine, ex, keys, state) is None
    return compiled.run(engine, state, spec, ex, keys, kv_bytes_per_block=spec.kv_bytes_per_block,
                        check=True, **kw)


def run_reference(engine, spec, arrival, prompt, output, hashes=None, priority=None, **kw):
    state, keys, ex = make_engine(engine, spec, arrival, prompt, output, hashes, priority)
    sched = make_scheduler(engine, spec, state, keys)
    return loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block, **kw)


def run_both_with(engine, spec, arrival, prompt, output, hashes=None, priority=None):
    """(compiled core with invariant checks, Python reference) on fresh engines."""
    return (run_compiled(engine, spec, arrival, prompt, output, hashes, priority),
            run_reference(engine, spec, arrival, prompt, output, hashes, priority))


def assert_identical(fast, slow):
    """Every table, TBT samples in the same order and weights, the preemption scratch, the abort
    and the clock; a failure names the first divergence (step, request, field, both values)."""
    where = first_divergence(fast, slow, NAMES)
    assert where is None, where


def run_stepped(engine, spec, arrival, prompt, output, hashes=None, priority=None):
    """The compiled core stepped from Python through the per-step contract (`StepCore`), driven by
    the reference loop: must equal `run_compiled` (the same core run to the end in C)."""
    from replay.engine.compiled import StepCore
    state, keys, ex = make_engine(engine, spec, arrival, prompt, output, hashes, priority)
    return loop.run(state, StepCore(engine, spec, state, keys), ex,
                    kv_bytes_per_block=spec.kv_bytes_per_block)
