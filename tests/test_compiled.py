"""What both compiled cores share (replay/compiled.py, replay/kvcore.h): progress reports at step
multiples, the KVCAP_CORE switch (the Python loop really runs, with the same tables), the core
retiring the Python scheduler, and the sorted-input check. Scheduler-specific behaviour is in
test_v1_core.py / test_v0_core.py."""
from __future__ import annotations

import numpy as np
import pytest

from core_helpers import make_engine
from replay import loop
from replay.v0 import core as v0_core
from replay.v0.scheduler import V0Scheduler
from replay.v1 import core as v1_core
from replay.v1.scheduler import V1Scheduler
from replay_helpers import tiny_spec
from test_replay_loop import assert_same

# (core, scheduler class, the scheduler attribute the core retires, progress-test spec knobs)
CORES = [pytest.param(v1_core, V1Scheduler, "kv", {}, id="v1"),
         pytest.param(v0_core, V0Scheduler, "bm", {"enable_chunked_prefill": False}, id="v0")]


@pytest.mark.parametrize("core,cls,attr,knobs", CORES)
def test_progress_is_reported_at_step_multiples(core, cls, attr, knobs):
    rng = np.random.default_rng(0)
    n = 200
    arrival = np.cumsum(rng.exponential(0.02, n))
    prompt, output = rng.integers(5, 30, n), rng.integers(5, 30, n)
    spec = tiny_spec(num_gpu_blocks=200, max_num_seqs=16, max_model_len=64, **knobs)
    calls = []
    state, sched, ex = make_engine(cls, spec, arrival, prompt, output, None)
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block,
                   on_progress=lambda t, done: calls.append((t, done)), progress_every_steps=100)
    assert getattr(sched, attr) is None                  # the core ran
    assert len(calls) == raw.num_steps // 100
    ts = [c[0] for c in calls]
    assert ts == sorted(ts) and all(0 < d <= n for _, d in calls)
    # Each report is the end time of its 100th step.
    ends = raw.steps["start_s"] + raw.steps["duration_s"]
    assert ts[0] == ends[99]


@pytest.mark.parametrize("core,cls,attr,knobs", CORES)
def test_kvcap_core_python_runs_the_python_loop(core, cls, attr, knobs, monkeypatch):
    spec = tiny_spec()
    arrival, prompt, output = [0.0, 0.1], np.array([10, 12]), np.array([5, 6])
    state, sched, ex = make_engine(cls, spec, arrival, prompt, output, None)
    assert core.ineligible(sched, object()) == "not the cost-model executor"
    monkeypatch.setenv("KVCAP_CORE", "python")
    assert core.ineligible(sched, ex) == "KVCAP_CORE=python"
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert getattr(sched, attr) is not None              # the Python scheduler really ran
    monkeypatch.delenv("KVCAP_CORE")
    state, sched, ex = make_engine(cls, spec, arrival, prompt, output, None)
    raw2 = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert getattr(sched, attr) is None                  # the core ran and retired the Python one
    assert core.ineligible(sched, ex) == "the scheduler has already run"
    assert_same(raw, raw2)


@pytest.mark.parametrize("core,cls,attr,knobs", CORES)
def test_core_rejects_unsorted_arrivals(core, cls, attr, knobs):
    spec = tiny_spec()
    state, sched, ex = make_engine(cls, spec, [0.2, 0.1], np.array([4, 4]), np.array([2, 2]), None)
    with pytest.raises(ValueError, match="sorted by arrival_s"):
        core.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
