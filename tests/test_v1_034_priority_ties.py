"""The priority victim among running requests with equal (priority, arrival_time) (issue 32: a
trace-driven case with a full offloading tier picked another victim than vLLM at its step 578).

vLLM (0.33 and 0.34 alike) preempts `max(self.running, key=lambda r: (r.priority,
r.arrival_time))`: among equal keys the FIRST in running-list order, and a request joins
`running` when the waiting loop admits it, a CPU-loaded one once its load is done (it waits in
kv_holding_waiting until then). kvcap used to take the later trace row, which is what vLLM does
when the times are receipt stamps (distinct, in trace order: replays, tests/test_ties.py), but
not when vLLM was handed equal times. `SchedulerSpec.arrival_ties` says which: "equal" follows
running order. The expected lines in tests/data/oracle_ties/ are real vLLM's, run with
../shared/oracle/oracle.py on vllm 0.33.0 and 0.34.0 (byte-identical on both)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle_driver import chunks_by_content, compare, drive, load_case, v1_implementations

DATA = Path(__file__).resolve().parent / "data" / "oracle_ties"
CASES = sorted(p.stem for p in DATA.glob("*.jsonl"))
IMPLEMENTATIONS = v1_implementations()


def load(name: str) -> tuple[dict, list[dict]]:
    return load_case(DATA / f"{name}.jsonl")


def victims(lines: list[dict]) -> list[tuple[int, str]]:
    return [(x["step"], p[0]) for x in lines for p in x["preempted"]]


@pytest.mark.parametrize("version", ["0.33", "0.34"])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CASES)
def test_equal_times_victim_is_first_in_running_order(name: str, impl: str, version: str):
    head, want = load(name)
    sc = {**head["scenario"], "vllm_version": version}
    canon = chunks_by_content(sc)
    got = drive(IMPLEMENTATIONS[impl], sc, "v1", arrival_ties="equal")
    diffs = compare([canon(x) for x in got], [canon(x) for x in want], "v1")
    assert not diffs, f"{head['about']}\n" + "\n".join(diffs[:12])


def test_running_order_decides_the_victim():
    """The two cases differ only in the CPU tier, which makes L1 join `running` after L2: the
    victim follows running order, not the trace."""
    (_, loaded), (_, plain) = (load("T2_loaded_request_joins_running_at_admission"),
                               load("T2_nocpu_equal_times_first_in_running_order"))
    assert victims(loaded) == [(8, "L2")] and loaded[7]["running"] == ["L1", "H"]
    assert victims(plain) == [(8, "L1")]
    assert loaded[3]["running"] == ["L2", "L1"] and plain[3]["running"] == ["L1", "L2"]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_trace_ties_keep_receipt_order(impl: str):
    """The same case read as a trace's ties (the default, `trace_order`): vLLM's receipt times
    would rank L2 (the later row) as the worse one, so L2 is the victim."""
    head, _ = load("T1_equal_times_first_in_running_order")
    got = drive(IMPLEMENTATIONS[impl], head["scenario"], "v1")
    assert victims(got)[0] == (6, "L2")
