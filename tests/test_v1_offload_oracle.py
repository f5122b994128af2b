"""Parity with real vLLM 0.33's CPU KV offloading (the native OffloadingConnector driven inside
the V1 scheduler, ../shared/oracle scenarios O1-O9, README §7 F1-F15): every step's schedule and
every connector decision (lookups, hits, loads, stores, evictions, flushes, completions, the tier's
LRU/ARC state) must match, on both implementations. The compiled case is skipped while the
compiled V1 core does not model offloading (`replay.compiled.has_offloading`)."""
from __future__ import annotations

from collections import Counter

import pytest

from replay import compiled
from replay.compiled import StepCore
from replay.v1 import V1Scheduler
from tests.oracle_driver import OFFLOAD_SCENARIOS, compare, drive, load

IMPLEMENTATIONS = {"reference": V1Scheduler,
                   "compiled": lambda spec, state, keys: StepCore("v1", spec, state, keys)}
# F13: real vLLM processes the requests that finished in one step in the iteration order of a
# set of request ids, which depends on PYTHONHASHSEED (the oracle pins 0); kvcap processes them
# in trace order (docs/design.md). In these two lines R1 and R2 finished together and seed 0
# ranks R2 first; trace order ranks R1 first: the same chunks, R1's and R2's ranks swapped.
HASH_SEED_ORDER = {("O7", 8, "cpu_lru_end"), ("O7_slow", 10, "cpu_lru_end")}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OFFLOAD_SCENARIOS)
def test_offloading_matches_real_vllm(name: str, impl: str) -> None:
    sc, want = load(name)
    if impl == "compiled" and "kv_offloading" in sc and not compiled.has_offloading("v1"):
        pytest.skip("the compiled V1 core does not model CPU KV offloading yet "
                    "(replay.compiled.has_offloading)")
    got = drive(IMPLEMENTATIONS[impl], sc, "v1")
    exempt = {(s, f) for n, s, f in HASH_SEED_ORDER if n == name}
    diffs = [d for d in compare(got, want, "v1")
             if not d.startswith("step ")
             or (int(d.split()[1]), d.split()[2].rstrip(":")) not in exempt]
    assert not diffs, "\n".join(diffs[:20])
    for step, field in exempt:
        g, w = got[step - 1][field], want[step - 1][field]
        assert g != w and Counter(g) == Counter(w), (step, field, g, w)
