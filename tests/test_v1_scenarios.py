"""Reference scenarios S13-S20 (shared/reference/vllm-scheduler.md §E, as corrected by §G and the
oracle runs) as readable golden tests of the V1 scheduler: exact admissions, victims, block ids
and queue orders. Each test drives the oracle scenario file and names what it pins down."""
from __future__ import annotations

from replay.engine.compiled import StepCore
from replay.engine.v1 import V1Scheduler
from core_helpers import both_implementations
from tests.oracle_driver import drive, load


IMPL = "reference"


implementation = both_implementations(__name__)


def run(name: str, **overrides) -> tuple[dict[int, dict], object]:
    """Per-step lines (by step number) and the scheduler, after driving scenario `name` on the
    implementation under test."""
    sc, _ = load(name)
    sc.update(overrides)
    made: list = []

    def make(spec, state, keys):
        made.append(V1Scheduler(spec, state, keys) if IMPL == "reference"
                    else StepCore("v1", spec, state, keys))
        return made[-1]

    return {line["step"]: line for line in drive(make, sc, "v1")}, made[0]


def batch(line: dict) -> list[tuple[str, int, str]]:
    return [tuple(x) for x in line["scheduled"]]


def test_S13_preempt_newest():
    """S13 (test_preempt_during_execution; budget 160 per G/D6): R0 and R1 (prompt 80) fill all 10
    usable blocks; R0's first decode needs a 6th block, so the tail R1 is preempted (5 blocks
    freed, front of waiting) and R0 takes R1's last block. R1 resumes with 81 tokens on R0's
    freed blocks, tail first (caching off: every freed block is prepended)."""
    s, _ = run("S13")
    assert batch(s[1]) == [("R0", 80, "new"), ("R1", 80, "new")]
    assert s[1]["blocks"] == {"R0": [1, 2, 3, 4, 5], "R1": [6, 7, 8, 9, 10]}
    assert s[2]["preempted"] == [["R1", "recompute"]]
    assert (s[2]["waiting"], s[2]["running"]) == (["R1"], ["R0"])
    assert s[2]["blocks"] == {"R0": [1, 2, 3, 4, 5, 10]}
    assert s[2]["free_gpu"] == 4
    assert batch(s[4]) == [("R1", 81, "resumed")]
    assert s[4]["blocks"] == {"R1": [10, 5, 4, 3, 2, 1]}


def test_S13b_tail_preempts_itself():
    """S13b (G/D6): with budget 100 R1 gets a 20-token first chunk; its next chunk finds no
    blocks and R1, being the tail, preempts itself."""
    s, _ = run("S13b")
    assert batch(s[1]) == [("R0", 80, "new"), ("R1", 20, "new")]
    assert batch(s[2]) == [("R0", 1, "running")]
    assert s[2]["preempted"] == [["R1", "recompute"]]
    assert s[2]["blocks"] == {"R0": [1, 2, 3, 4, 5, 8]}


def test_S14_priority_victim():
    """S14 (test_priority_scheduling_preemption_and_resumption_when_out_of_kv): High needs a 3rd
    block; the victim is max(priority, arrival) = Low, already scheduled in this step, so it is
    un-scheduled. High takes Low's partial block 2 (prepended). Low resumes with 32 tokens: a
    16-token hit on block 1 and 16 computed."""
    s, _ = run("S14")
    assert batch(s[2]) == [("Low", 1, "running"), ("High", 32, "new")]
    assert batch(s[3]) == [("High", 1, "running")]
    assert s[3]["preempted"] == [["Low", "recompute"]]
    assert (s[3]["waiting"], s[3]["running"]) == (["Low"], ["High"])
    assert s[3]["blocks"] == {"High": [3, 4, 2]}
    assert batch(s[5]) == [("Low", 16, "resumed")]
    assert s[5]["computed"] == {"Low": 32}
    assert s[5]["blocks"] == {"Low": [1, 2]}


def test_S15_long_prefill_cap():
    """S15 (test_schedule_concurrent_partial_requests): threshold 400, budget 1024, three
    800-token prompts: 400/400/224, 400/400/224, then 1/1/352."""
    s, _ = run("S15")
    assert [n for _, n, _ in batch(s[1])] == [400, 400, 224]
    assert [n for _, n, _ in batch(s[2])] == [400, 400, 224]
    assert [n for _, n, _ in batch(s[3])] == [1, 1, 352]


def test_S15_single_request_ignores_the_cap():
    """0.33: the long-prefill cap is skipped when only one request exists."""
    sc, _ = load("S15")
    s, _ = run("S15", requests=sc["requests"][:1])
    assert batch(s[1]) == [("0", 800, "new")]


def test_S16_priority_admission_order():
    """S16 (test_priority_scheduling_with_limited_slots): priorities [3,1,2,0], seqs 2: admitted 3
    then 1; waiting [2, 0]; after both finish 2 and 0 reuse their cached blocks' slots."""
    s, _ = run("S16")
    assert batch(s[1]) == [("3", 10, "new"), ("1", 10, "new")]
    assert s[1]["waiting"] == ["2", "0"]
    assert batch(s[4]) == [("2", 10, "new"), ("0", 10, "new")]
    assert s[4]["blocks"] == {"2": [2], "0": [1]}


def test_S16b_arrival_time_tiebreak():
    """S16b: equal priorities are admitted by arrival time (1, 2, 0), not submission order."""
    s, _ = run("S16b")
    assert [batch(s[k])[0][0] for k in (1, 3, 5)] == ["1", "2", "0"]


def test_S17_free_queue_lru_order():
    """S17 (test_evict, ≥0.27 variant): R0 (87 tokens, blocks 1-6, 6 partial) then R1 (48, blocks
    7-9) are freed; the partial block 6 is prepended, hashed blocks appended tail first:
    [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]. R2 = R0's first 35 tokens hits [1, 2] and gets block 6."""
    s, sched = run("S17", requests=load("S17")[0]["requests"][:2])
    assert s[1]["free_gpu_end"] == 10
    assert sched.snapshot()["free_queue"] == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    s, _ = run("S17")
    assert batch(s[2]) == [("R2", 3, "new")]
    assert s[2]["blocks"] == {"R2": [1, 2, 6]}
    assert s[2]["free_gpu"] == 7


def test_S18_hits_are_never_self_evicted():
    """S18 (test_computed_blocks_not_evicted): R2 (tokens 0..31) hits only R0's block 1 (R1's block
    has another parent) and its one new block is block 2, evicting R1's entry, not its own hit."""
    s, _ = run("S18")
    assert s[1]["blocks"] == {"R0": [1], "R1": [2]}
    assert batch(s[2]) == [("R2", 16, "new")]
    assert s[2]["blocks"] == {"R2": [1, 2]}


def test_S19_full_isl_gate():
    """S19 (≥0.20 scheduler_reserve_full_isl): R1 (96 tokens = 6 blocks) waits while R0 holds 5 of
    10 usable blocks, and is admitted only after R0 finishes; no preemption."""
    s, _ = run("S19")
    assert all(s[k]["waiting"] == ["R1"] for k in range(4, 11))
    assert s[10]["finished"] == ["R0"]
    assert batch(s[11]) == [("R1", 32, "new")]
    assert s[11]["blocks"] == {"R1": [5, 4]}
    assert not any(line["preempted"] for line in s.values())


def test_S19_watermark_keeps_a_block_free():
    """S19 with watermark 0.1: admission also needs int(0.1 * 11) = 1 extra free block, but only
    while something else runs; R1 still gets in once R0 is gone."""
    s, _ = run("S19", watermark=0.1)
    assert batch(s[11]) == [("R1", 32, "new")]


def test_S19b_first_chunk_admission_thrashes():
    """S19b (gate off, 0.10-like): R1 is admitted on a 31-token first chunk, its later chunks run
    out of blocks and R1, the tail, preempts itself, re-hitting nothing (caching off)."""
    s, _ = run("S19b")
    assert batch(s[4]) == [("R0", 1, "running"), ("R1", 31, "new")]
    assert s[6]["preempted"] == [["R1", "recompute"]]
    assert batch(s[7]) == [("R0", 1, "running"), ("R1", 31, "resumed")]
    assert s[7]["blocks"]["R1"] == [9, 8]


def test_S20_chunked_on_packs_the_budget():
    """S20 (test_schedule_order, chunked on): step 1 admits 800 + a 224-token chunk."""
    s, _ = run("S20")
    assert batch(s[1]) == [("0", 800, "new"), ("1", 224, "new")]
    assert s[1]["waiting"] == ["2", "3"]


def test_S20_off_does_not_jump_ahead():
    """S20_off (chunked off, 0.33): only the first 800 fits; the second breaks the waiting loop, the
    short ones behind it do not jump ahead."""
    s, _ = run("S20_off")
    assert batch(s[1]) == [("0", 800, "new")]
    assert s[1]["waiting"] == ["1", "2", "3"]
    assert batch(s[2]) == [("0", 1, "running"), ("1", 800, "new"), ("2", 10, "new")]


def test_S13_async_finishes_and_frees_a_step_late():
    """S13_async (0.33's AsyncScheduler, lag 1): the same preemption as S13 at step 2, but R0's
    last token (sampled at step 3) is applied at step 4, a step that schedules nothing because R0
    needs no more work and R1 cannot fit until R0's blocks are freed; R1 resumes at step 5."""
    lines, _ = run("S13_async")
    assert lines[2]["preempted"] == [["R1", "recompute"]]
    assert batch(lines[3]) == [("R0", 1, "running")] and lines[3]["finished"] == []
    assert lines[4]["scheduled"] == [] and lines[4]["finished"] == ["R0"]
    assert lines[4]["free_gpu"] == 4 and lines[4]["free_gpu_end"] == 10
    assert batch(lines[5]) == [("R1", 81, "resumed")]
    assert lines[7]["scheduled"] == [] and lines[7]["finished"] == ["R1"]


def test_async_loop_is_the_sync_one_shifted_for_a_lone_request():
    """One request alone: the same batches and token steps; async adds one empty step at the end
    (its last token is applied then), so it finishes one step later in steps, not in tokens."""
    sync, _ = run("S15", requests=[{"id": "A", "arrival_step": 1, "prompt_tokens": 30,
                                    "output_tokens": 4}], max_num_batched_tokens=64)
    asy, _ = run("S15", requests=[{"id": "A", "arrival_step": 1, "prompt_tokens": 30,
                                   "output_tokens": 4}], max_num_batched_tokens=64,
                 async_scheduling=True)
    assert len(asy) == len(sync) + 1
    assert [batch(sync[s]) for s in sync] == [batch(asy[s]) for s in sync]
    last = max(asy)
    assert asy[last]["scheduled"] == [] and asy[last]["finished"] == ["A"]
    assert sync[max(sync)]["finished"] == ["A"]
