"""Regression cases for the OffloadingConnector rules the reference corrected against real vLLM
0.33 (#16 (a): R1-R4, C1, C2, C4, the async caching rule N1, and N3-N6), each a small random scenario
whose expected lines real vLLM produced (tests/data/oracle_v1/, written by
tools/oracle_fuzz/make_v1_cases.py from tools/oracle_fuzz/gen_v1.py seeds): every step must match
on both implementations (chunks compared by content), and the first-admission counters must be
vLLM's (`cpu_hit_tokens` = the external hit, `cached_prompt_tokens` = local + external, C2)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle_driver import chunks_by_content, compare, drive, load_case, v1_implementations

DATA = Path(__file__).resolve().parent / "data" / "oracle_v1"
CASES = sorted(p.stem for p in DATA.glob("*.jsonl"))
IMPLEMENTATIONS = v1_implementations()


def load(name: str) -> tuple[dict, list[dict]]:
    return load_case(DATA / f"{name}.jsonl")


def test_cases_exist():
    assert len(CASES) >= 10


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", CASES)
def test_offloading_rule_matches_real_vllm(name: str, impl: str) -> None:
    head, want = load(name)
    sc = head["scenario"]
    counters = {}
    got = drive(IMPLEMENTATIONS[impl], sc, "v1",
                inspect=lambda st, ids: counters.update(
                    {rid: (int(st.cached_prompt_tokens[i]), int(st.cpu_hit_tokens[i]))
                     for i, rid in enumerate(ids)}))
    canon = chunks_by_content(sc)
    diffs = compare([canon(x) for x in got], [canon(x) for x in want], "v1")
    assert not diffs, f"{head['rule']}: {head['about']}\n" + "\n".join(diffs[:12])
    first: dict[str, tuple[int, int]] = {}
    for line in want:
        for rid, (gpu, cpu) in line.get("cpu_hit", {}).items():
            first.setdefault(rid, (gpu + cpu, cpu))
    assert {rid: counters[rid] for rid in first} == first
