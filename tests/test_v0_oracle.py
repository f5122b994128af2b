"""Real vLLM 0.10.1.1 parity: every V0 oracle scenario (shared/oracle, S1-S12 variants) driven
through both implementations, the reference `V0Scheduler` and the compiled V0 core stepped through
the same contract (`replay.engine.compiled.StepCore`, token-id keys precomputed and handed to C), must
reproduce `expected/*.jsonl` line for line (reference G)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from replay.engine.compiled import StepCore
from replay.engine.v0 import V0Scheduler
from tests.oracle_driver import ORACLE, V0_SCENARIOS, build, compare, drive


class VllmChunkView:
    """Shows a plan as vLLM prints it: V0's `token_chunk_size` includes the prefix-cache hit taken
    in that step, while kvcap's `num_new_tokens` counts only computed tokens (the hit is in
    `num_computed_tokens`). Delegates everything else to the scheduler."""

    def __init__(self, sched) -> None:
        self._sched = sched
        self._plan = None

    def schedule(self):
        plan = self._sched.schedule()
        self._plan = plan
        if len(plan.rows) == 0:
            return plan
        hit = plan.num_computed_tokens - self._sched.state.num_computed[plan.rows]
        return dataclasses.replace(plan, num_new_tokens=plan.num_new_tokens + hit)

    def update(self, plan):
        # vLLM frees finished requests in running-queue order (what kvcap reports) but the oracle
        # lists them in batch order.
        out = self._sched.update(self._plan)
        pos = {r: i for i, r in enumerate(self._plan.rows.tolist())}
        order = sorted(out.finished.tolist(), key=pos.__getitem__)
        return dataclasses.replace(out, finished=np.array(order, dtype=np.int64))

    def __getattr__(self, name):
        return getattr(self._sched, name)


def _load(name: str) -> tuple[dict, list[dict]]:
    sc = json.loads((ORACLE / "scenarios" / f"{name}.json").read_text())
    want = [json.loads(line) for line in
            (ORACLE / "expected" / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    return sc, want


IMPLEMENTATIONS = {"reference": V0Scheduler,
                   "compiled": lambda spec, state, keys: StepCore("v0", spec, state, keys)}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", V0_SCENARIOS)
def test_v0_matches_real_vllm(name: str, impl: str) -> None:
    sc, want = _load(name)
    make = IMPLEMENTATIONS[impl]
    if name == "S12_swap":
        spec, state, _, keys = build(sc, "v0")
        with pytest.raises(ValueError, match="priority.*swap"):
            make(spec, state, keys)
        return
    got = drive(lambda spec, state, keys: VllmChunkView(make(spec, state, keys)), sc, "v0")
    diffs = compare(got, want, "v0")
    assert not diffs, "\n".join(diffs[:20])
