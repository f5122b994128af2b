"""Parity with real vLLM V1, 0.33 and 0.34: every oracle scenario without a connector that each
release has an output for (../shared/oracle/expected for 0.33: S13-S20*; expected-034 for 0.34:
the same and C1-C3, README §8; each scenario names its loop, S13_async the AsyncScheduler's),
driven the way oracle.py drives vLLM, must match step for step, on both implementations: the
Python reference scheduler and the compiled core stepped through the same contract
(`replay.engine.compiled.StepCore`, token-id prefix keys precomputed and handed to C)."""
from __future__ import annotations

import pytest

from tests.oracle_driver import (KNOBS_034, V1_034_ONLY, build, compare, drive, load,
                                 v1_implementations, v1_scenarios)

IMPLEMENTATIONS = v1_implementations()
CASES = [(v, n) for v in ("0.33", "0.34") for n in v1_scenarios(v)]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("version,name", CASES)
def test_v1_matches_real_vllm(version: str, name: str, impl: str) -> None:
    sc, want = load(name, version)
    got = drive(IMPLEMENTATIONS[impl], sc, "v1", arrival_ties="equal")
    diffs = compare(got, want, "v1")
    assert not diffs, "\n".join(diffs[:20])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", V1_034_ONLY)
def test_the_cache_aware_reorder_probes_as_real_vllm_034(name: str, impl: str) -> None:
    """Both implementations record each call of the reorder as the oracle's spy prints it: the
    usage it saw, the prefix-cache probes it made and the queue order around it."""
    sc, want = load(name, "0.34")
    got = drive(IMPLEMENTATIONS[impl], sc, "v1", arrival_ties="equal")
    diffs = [f"step {w['step']}: got {g.get('cache_aware')}, want {w['cache_aware']}"
             for g, w in zip(got, want) if g.get("cache_aware") != w["cache_aware"]]
    assert not diffs, "\n".join(diffs[:10])


@pytest.mark.parametrize("name", V1_034_ONLY)
def test_034_knobs_are_a_config_error_on_033(name: str) -> None:
    """0.33 has no cache-aware admission: the oracle answers config_error, kvcap a ValueError
    naming the knob."""
    sc, _ = load(name, "0.34")
    assert any(k in sc for k in KNOBS_034)
    with pytest.raises(ValueError, match="cache_aware_admission_window.*0.34"):
        build({**sc, "vllm_version": "0.33"}, "v1")
