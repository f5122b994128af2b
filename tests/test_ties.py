"""Arrival ties follow trace order everywhere (issue 16, item 3): real vLLM stamps `arrival_time`
on receipt, so requests a trace gives one timestamp reach the scheduler with distinct times in
trace order. kvcap replaying the tie must decide as vLLM did with the distinct times: the oracle
scenarios (expected/ = real vLLM, default times `arrival_step + 1e-6 * index`) driven with every
request of a step at exactly the same time give the same lines, on both implementations."""
from __future__ import annotations

import pytest

from core_helpers import both_implementations
from replay.engine.compiled import StepCore
from replay.engine.v0 import V0Scheduler
from replay.engine.v1 import V1Scheduler
from tests.oracle_driver import V0_SCENARIOS, V1_SCENARIOS, compare, drive, load

IMPL = "reference"
implementation = both_implementations(__name__)


def make(engine: str):
    def build(spec, state, keys):
        if IMPL == "compiled":
            return StepCore(engine, spec, state, keys)
        return (V1Scheduler if engine == "v1" else V0Scheduler)(spec, state, keys)
    return build


def tied(sc: dict) -> dict:
    """The scenario with every request of a step arriving at one time (the step number)."""
    return {**sc, "requests": [{**r, "arrival_time": float(r["arrival_step"])}
                               for r in sc["requests"]]}


@pytest.mark.parametrize("engine,name", [("v1", n) for n in V1_SCENARIOS] +
                         [("v0", n) for n in V0_SCENARIOS if n != "S12_swap"])
def test_tied_arrivals_decide_as_real_vllm_did_with_receipt_times(engine, name):
    sc, want = load(name)
    if any(r.get("arrival_time") is not None for r in sc["requests"]):
        pytest.skip("the scenario sets its own arrival times")
    build = make(engine)
    if engine == "v0":
        # V0's printed chunk includes the prefix hit taken in the step (test_v0_oracle).
        from tests.test_v0_oracle import VllmChunkView
        build = lambda spec, state, keys: VllmChunkView(make(engine)(spec, state, keys))  # noqa: E731
    got = drive(build, tied(sc), engine)
    diffs = compare(got, want, engine)
    assert not diffs, "\n".join(diffs[:10])


def test_v1_priority_victim_among_tied_requests_is_the_later_trace_row():
    """Two equal-priority requests arriving together, then a high-priority one that needs their
    blocks: vLLM (arrival L1 < L2 by receipt) preempts L2; with the tie kvcap must too."""
    sc = {"block_size": 4, "num_gpu_blocks": 7, "max_num_seqs": 4, "max_num_batched_tokens": 64,
          "max_model_len": 64, "chunked_prefill": True, "prefix_caching": False,
          "policy": "priority",
          "requests": [{"id": "L1", "arrival_step": 1, "prompt_tokens": 8, "output_tokens": 8,
                        "priority": 5},
                       {"id": "L2", "arrival_step": 1, "prompt_tokens": 8, "output_tokens": 8,
                        "priority": 5},
                       {"id": "H", "arrival_step": 3, "prompt_tokens": 8, "output_tokens": 2,
                        "priority": 0}]}
    lines = drive(make("v1"), tied(sc), "v1")
    distinct = drive(make("v1"), sc, "v1")
    victims = [p[0] for line in lines for p in line["preempted"]]
    assert victims and victims[0] == "L2"
    assert lines == distinct


class _Capped:
    """A scheduler that fails after `limit` steps instead of running forever (a livelock would
    otherwise hang the suite and grow memory without bound)."""

    def __init__(self, inner, limit: int):
        self._inner, self._left = inner, limit

    def schedule(self):
        self._left -= 1
        assert self._left >= 0, "no end in sight: requests keep preempting each other"
        return self._inner.schedule()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_tied_equal_priority_requests_do_not_preempt_each_other_forever():
    """Found by the Hypothesis differential test (it hung main's suite): rows 0 and 1 share
    priority and arrival time and cannot both be resident at full length. With the victim picked
    by position among ties, each preempted the other at every chunk, forever; with ties in trace
    order row 1 (the later receipt) is always the victim, as in vLLM, and all finish."""
    import numpy as np

    from core_helpers import make_engine
    from replay.engine import loop
    from replay_helpers import tiny_spec
    spec = tiny_spec(num_gpu_blocks=14, num_cpu_blocks=3, max_num_seqs=5, max_num_batched_tokens=9,
                     enable_chunked_prefill=True, enable_prefix_caching=False, policy="priority",
                     preemption_mode="recompute", long_prefill_token_threshold=5, watermark=0.0,
                     max_num_active_seqs=2)
    arrival = np.array([1.17549435e-38] * 3 + [1e-06, 0.182775276])
    state, keys, ex = make_engine("v1", spec, arrival, np.array([30, 20, 29, 26, 7]),
                                  np.array([16, 28, 15, 23, 16]), None, np.array([2, 2, 0, 0, 1]))
    sched = _Capped(make("v1")(spec, state, keys), limit=2_000)
    raw = loop.run(state, sched, ex, kv_bytes_per_block=spec.kv_bytes_per_block)
    assert raw.status != "aborted" and len(raw.finish_s) == 5 and not np.isnan(raw.finish_s).any()
    if IMPL == "compiled":     # and run to the end in C (where the old code ran out of memory)
        from replay.engine import compiled

        def stop(_t, step):
            assert step <= 2_000, "no end in sight: requests keep preempting each other"
        state, keys, ex = make_engine("v1", spec, arrival, np.array([30, 20, 29, 26, 7]),
                                      np.array([16, 28, 15, 23, 16]), None, np.array([2, 2, 0, 0, 1]))
        fast = compiled.run("v1", state, spec, ex, keys, kv_bytes_per_block=spec.kv_bytes_per_block,
                            on_progress=stop, progress_every_steps=500, check=True)
        assert not np.isnan(fast.finish_s).any()
