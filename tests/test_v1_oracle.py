"""Parity with real vLLM 0.33 V1: every oracle scenario S13-S20 (../shared/oracle/expected; each
names its loop, S13_async the 0.33 AsyncScheduler's),
driven the way oracle.py drives vLLM, must match step for step, on both implementations: the
Python reference scheduler and the compiled core stepped through the same contract
(`replay.compiled.StepCore`, token-id prefix keys precomputed and handed to C)."""
from __future__ import annotations

import pytest

from replay.compiled import StepCore
from replay.v1 import V1Scheduler
from tests.oracle_driver import V1_SCENARIOS, compare, drive, load

IMPLEMENTATIONS = {"reference": V1Scheduler,
                   "compiled": lambda spec, state, keys: StepCore("v1", spec, state, keys)}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", V1_SCENARIOS)
def test_v1_matches_real_vllm(name: str, impl: str) -> None:
    sc, want = load(name)
    got = drive(IMPLEMENTATIONS[impl], sc, "v1")
    diffs = compare(got, want, "v1")
    assert not diffs, "\n".join(diffs[:20])
