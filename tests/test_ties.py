"""Arrival ties follow trace order everywhere (issue 16, item 3): real vLLM stamps `arrival_time`
on receipt, so requests a trace gives one timestamp reach the scheduler with distinct times in
trace order. kvcap replaying the tie must decide as vLLM did with the distinct times: the oracle
scenarios (expected/ = real vLLM, default times `arrival_step + 1e-6 * index`) driven with every
request of a step at exactly the same time give the same lines, on both implementations."""
from __future__ import annotations

import pytest

from core_helpers import both_implementations
from replay.compiled import StepCore
from replay.v0 import V0Scheduler
from replay.v1 import V1Scheduler
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
