"""Golden tests, one per reference scenario S1-S12 (shared/reference/vllm-scheduler.md §E, with
the corrections in §G). Each drives the oracle scenario file through both implementations (the
reference `V0Scheduler` and the compiled core through `StepCore`) and asserts the admissions,
victims, modes, block ids and queue orders the scenario states."""
from __future__ import annotations

import json

import pytest

from replay.engine.compiled import StepCore
from replay.engine.v0 import V0Scheduler, preemption_warning
from core_helpers import both_implementations
from tests.oracle_driver import ORACLE, build, drive
from tests.test_v0_oracle import VllmChunkView

IMPL = "reference"


implementation = both_implementations(__name__)


def make(spec, state, keys):
    """The scheduler under test."""
    return V0Scheduler(spec, state, keys) if IMPL == "reference" else StepCore("v0", spec, state, keys)


def run(name: str) -> list[dict]:
    sc = json.loads((ORACLE / "scenarios" / f"{name}.json").read_text())
    return drive(lambda spec, state, keys: VllmChunkView(make(spec, state, keys)), sc, "v0")


def test_S1_basic() -> None:
    """S1: four prompts of 4 prefill together (16 tokens), then decode taking a second block each;
    with 0 free blocks the next decode step preempts the tail request 3 (G/D1)."""
    s = run("S1")
    assert s[0]["scheduled"] == [[r, 4, "prefill"] for r in "0123"]
    assert s[0]["num_batched_tokens"] == 16 and s[0]["blocks"] == {"0": [0], "1": [1], "2": [2],
                                                                   "3": [3]}
    assert s[1]["scheduled"] == [[r, 1, "decode"] for r in "0123"] and s[1]["free_gpu"] == 0
    assert s[1]["blocks"] == {"0": [0, 4], "1": [1, 5], "2": [2, 6], "3": [3, 7]}
    assert s[2]["preempted"] == [["3", "recompute"]] and s[2]["waiting"] == ["3"]


def test_S2_prefill_before_decode() -> None:
    """S2: B (prompt 30) arrives while A decodes; step 2 schedules only B's prefill."""
    s = run("S2")
    assert s[0]["scheduled"] == [["A", 1, "prefill"]]
    assert s[1]["scheduled"] == [["B", 30, "prefill"]]


def test_S3_recompute_preemption() -> None:
    """S3: G=2; at step 2 the tail B is recompute-preempted and only A decodes; after A's abort B
    re-prefills 5 tokens (4 prompt + 1 generated)."""
    s = run("S3")
    assert s[1]["preempted"] == [["B", "recompute"]] and s[1]["scheduled"] == [["A", 1, "decode"]]
    assert s[1]["preempted_metric"] == 1 and s[1]["swap_out"] == []
    assert s[2]["scheduled"] == [["B", 5, "prefill"]]


def test_S4_max_num_seqs() -> None:
    """S4: with request 0 running and seqs=2, only request 1 is admitted next to it."""
    s = run("S4")
    step3 = s[2]
    assert step3["scheduled"] == [["1", 4, "prefill"]] and step3["waiting"] == ["2"]
    assert step3["running"] == ["0", "1"]


def test_S5_victim_order_and_self_preemption() -> None:
    """S5: 0 decodes; 1 cannot append, so the tail 2 is preempted, then 1 preempts itself: preempted
    [2, 1] by recompute, waiting front [1, 2]."""
    s = run("S5")
    step7 = s[6]
    assert step7["scheduled"] == [["0", 1, "decode"]]
    assert step7["preempted"] == [["2", "recompute"], ["1", "recompute"]]
    assert step7["waiting"] == ["1", "2"] and step7["running"] == ["0"]


def test_S6_swap_aborts_when_host_pool_is_short() -> None:
    """S6 (G/D2): swap mode, G=C=2: B is swapped out at step 2 (GPU block 1 -> host block 0); at step
    3 A, alone with 0 free blocks, must swap itself out, needs 2 host blocks with 1 free: abort."""
    s = run("S6")
    assert s[1]["preempted"] == [["B", "swap"]] and s[1]["swap_out"] == [[1, 0]]
    assert s[1]["blocks"]["B"] == [2] and s[1]["free_cpu"] == 1
    assert s[2]["abort_victim"] == "A" and s[2]["waiting"] == ["X"] and s[2]["swapped"] == ["B"]


def test_S6b_swap_and_return() -> None:
    """S6b: with G=3, B swaps out at step 2, X is not admitted while `swapped` is non-empty, and B
    swaps back in once A has finished."""
    s = run("S6b")
    assert s[1]["preempted"] == [["B", "swap"]]
    blocked = [x for x in s if x["swapped"] == ["B"] and "X" in x["waiting"]]
    assert blocked and all(x["scheduled"] == [] or x["scheduled"][0][0] == "A" for x in blocked)
    back = next(x for x in s if x["swap_in"])
    assert back["scheduled"][0][:2] == ["B", 1] and back["swapped"] == []
    assert s.index(back) > next(i for i, x in enumerate(s) if "A" in x["finished"])


def test_S6_abort_swap_out_check_counts_one_more_block() -> None:
    """S6_abort (G/D3): C=1 and B holds 1 block, but the check wants 2: abort at step 2."""
    s = run("S6_abort")
    assert s[1]["abort_victim"] == "B"


def test_S7_chunked_packing() -> None:
    """S7: step 1 A 60 + B 4; step 2 batch [C 7, B 56, A 1]; D waits."""
    s = run("S7")
    assert s[0]["scheduled"] == [["A", 60, "prefill"], ["B", 4, "prefill"]]
    assert s[1]["scheduled"] == [["C", 7, "prefill"], ["B", 56, "prefill"], ["A", 1, "decode"]]
    assert s[1]["waiting"] == ["D"]


def test_S8_chunked_decodes_first() -> None:
    """S8: budget 2: A decode + B chunk 1, C waits (seqs=2); after A's abort B decodes + C chunk."""
    s = run("S8")
    assert s[1]["scheduled"] == [["B", 1, "prefill"], ["A", 1, "decode"]]
    assert s[1]["waiting"] == ["C"]
    assert s[3]["scheduled"] == [["A", 1, "decode"], ["B", 1, "decode"]]
    assert s[4]["scheduled"] == [["C", 1, "prefill"], ["B", 1, "decode"]]


def test_S9_chunked_prefill_never_preempted_mid_prompt() -> None:
    """S9 (G/D5): both 30-token chunks run; the first decode preempts the request itself; its
    re-prefill needs 16 > 15 blocks, so it is dropped (ignored) and never re-run."""
    s = run("S9")
    assert [x["scheduled"] for x in s[:2]] == [[["A", 30, "prefill"]]] * 2
    assert s[2]["preempted"] == [["A", "recompute"]]
    assert s[3]["ignored"] == ["A"] and s[3]["waiting"] == []


def test_S11_prefix_cache_aware_budget() -> None:
    """S11: with caching B and C share A's first block and are admitted together (8 tokens each,
    4 charged); without caching only B fits the budget of 12. A does not decode in that step."""
    on, off = run("S11"), run("S11_nocache")
    assert on[2]["scheduled"] == [["B", 8, "prefill"], ["C", 8, "prefill"]]
    assert on[2]["blocks"]["B"][0] == on[2]["blocks"]["C"][0] == on[2]["blocks"]["A"][0] == 0
    assert off[2]["scheduled"] == [["B", 8, "prefill"]]


def test_S11_hit_is_context_not_work() -> None:
    """kvcap's plan counts a prefix hit as context: B and C compute 4 new tokens each."""
    sc = json.loads((ORACLE / "scenarios" / "S11.json").read_text())
    spec, state, _, keys = build(sc, "v0")
    sched = make(spec, state, keys)
    for step in (1, 2, 3):
        for row, r in enumerate(sc["requests"]):
            if r["arrival_step"] == step:
                sched.add_request(row)
        plan = sched.schedule()
        if step < 3:
            sched.update(plan)
    assert plan.num_new_tokens.tolist() == [4, 4]
    assert plan.num_computed_tokens.tolist() == [4, 4]
    assert state.cached_prompt_tokens[[1, 2]].tolist() == [4, 4]


def test_S12_priority_preemption() -> None:
    """S12: seqs=2 full; H (prio 0) waits, so L2 (sorted tail) is priority-preempted by recompute:
    waiting [H, L2], preempted_metric 0 but the cumulative counter 1; H is admitted next step."""
    s = run("S12")
    step3 = s[2]
    assert step3["preempted"] == [["L2", "recompute", "priority"]]
    assert step3["waiting"] == ["H", "L2"] and step3["preempted_metric"] == 0
    assert step3["cum_preemptions"] == 1
    assert s[3]["scheduled"] == [["H", 4, "prefill"]]
    assert s[4]["running"] == ["H", "L1"]          # D7: running re-sorted by priority


def test_S12_swap_is_refused() -> None:
    """S12_swap (G/D4): priority + swap crashes vLLM V0; kvcap refuses the configuration."""
    sc = json.loads((ORACLE / "scenarios" / "S12_swap.json").read_text())
    spec, state, _, keys = build(sc, "v0")
    with pytest.raises(ValueError, match="policy='priority'.*preemption_mode='swap'"):
        make(spec, state, keys)


def test_preemption_warning_rate_limit() -> None:
    """A5: logged for the 1st, 51st, 101st... preemption, with the count including this one."""
    text = preemption_warning("7", "recompute", 1)
    assert text == ("Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode because there "
                    "is not enough KV cache space. This can affect the end-to-end performance. "
                    "Increase gpu_memory_utilization or tensor_parallel_size to provide more KV "
                    "cache memory. total_num_cumulative_preemption=1")
    assert preemption_warning("7", "swap", 2) is None
    assert preemption_warning("9", "swap", 51).endswith("total_num_cumulative_preemption=51")
    assert "PreemptionMode.SWAP" in preemption_warning("9", "swap", 101)


def _scenario(**kw) -> dict:
    base = {"block_size": 4, "num_gpu_blocks": 64, "num_cpu_blocks": 64, "max_num_seqs": 8,
            "max_num_batched_tokens": 64, "max_model_len": 64, "chunked_prefill": False,
            "prefix_caching": False, "policy": "fcfs", "preemption_mode": None}
    base.update(kw)
    return base


def _drive(sc: dict) -> list[dict]:
    return drive(lambda spec, state, keys: VllmChunkView(make(spec, state, keys)), sc, "v0")


def test_S10_prompt_limits() -> None:
    """S10 (test_prompt_limit, test_prompt_limit_exceed, test_prefill_schedule_no_block_manager_capacity):
    chunked budget 32 / max_len 64 schedules a 48-token prompt as 32 then 16; a prompt over
    max_model_len is ignored (chunked or not); LATER keeps all three waiting requests waiting;
    NEVER drops all three."""
    req = lambda i, p, step=1: {"id": str(i), "arrival_step": step, "prompt_tokens": p,  # noqa: E731
                                "output_tokens": 2, "priority": 0}
    s = _drive(_scenario(chunked_prefill=True, max_num_batched_tokens=32, requests=[req(0, 48)]))
    assert [x["scheduled"] for x in s[:2]] == [[["0", 32, "prefill"]], [["0", 16, "prefill"]]]
    s = _drive(_scenario(chunked_prefill=True, max_num_batched_tokens=32, max_model_len=32,
                         requests=[req(0, 48)]))
    assert s[0]["ignored"] == ["0"] and s[0]["scheduled"] == []
    s = _drive(_scenario(max_num_batched_tokens=30, max_model_len=30, requests=[req(0, 60)]))
    assert s[0]["ignored"] == ["0"]
    # LATER: one running request holds 15 of 16 blocks; three 8-token prompts (2 blocks each) wait.
    s = _drive(_scenario(num_gpu_blocks=16, requests=[
        {"id": "big", "arrival_step": 1, "prompt_tokens": 60, "output_tokens": 3, "priority": 0},
        req(1, 8, 2), req(2, 8, 2), req(3, 8, 2)]))
    assert s[1]["waiting"] == ["1", "2", "3"] and s[1]["ignored"] == []
    assert all(x[0] == "big" for x in s[1]["scheduled"])
    # NEVER: prompts needing more blocks than the whole pool are dropped, all three.
    s = _drive(_scenario(num_gpu_blocks=4, requests=[req(1, 20), req(2, 20), req(3, 20)]))
    assert sorted(s[0]["ignored"]) == ["1", "2", "3"] and s[0]["waiting"] == []
