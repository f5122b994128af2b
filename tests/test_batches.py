"""Per-step batch records (`kvcap replay --record-batches`, table `batches`): for the oracle
scenarios the batches a whole replay records equal real vLLM's `scheduled` field step by step, on
both implementations; the compiled core records exactly what the reference does; recording
changes no other table; `events.seq` orders a step's events as the scheduler applied them."""
from __future__ import annotations

import numpy as np
import pytest

from core_helpers import both_implementations, run_compiled, run_reference
from replay.engine.raw import BATCH_KINDS
from replay.engine.state import RequestState
from replay.run import run_engine
from replay.timing.cost_model import CostConstants, CostModel
from replay_helpers import TINY_SHAPE, tiny_spec
from tests.oracle_driver import V0_SCENARIOS, V1_SCENARIOS, build, load

IMPL = "reference"
implementation = both_implementations(__name__)

# Every step costs exactly 1 s (the other terms are ~1e-20 s, below the last bit of 1.0): with
# arrivals at `arrival_step`, the loop's step k starts at time k, the oracle's step k.
ONE_SECOND_STEPS = CostModel(
    shape=TINY_SHAPE, tp=1, kv_bytes_per_token=0, kv_bytes_per_block=0,
    constants=CostConstants(flops_per_s=1e30, hbm_bytes_per_s=1e30, host_link_bytes_per_s=1e30,
                            interconnect_bytes_per_s=1e30, overhead_s=1.0))

# Scenarios a trace replay cannot express: client aborts, arrival times that are not in file
# order (S16b: the oracle overrides the tie-break times).
NOT_A_TRACE = {"S3": "client abort", "S8": "client abort", "S16b": "arrival_time out of file order",
               "S12_swap": "kvcap refuses V0 priority + swap, which crashes vLLM (D4)"}


def oracle_batches(engine: str, name: str):
    """(replayed {step: [[id, new tokens, kind], ...]}, oracle {step: scheduled}, last step)."""
    sc, want = load(name)
    spec, state, ids, keys = build(sc, engine, arrival_at_step=True)
    raw = run_engine(engine, spec, state, keys, ONE_SECOND_STEPS, kv_bytes_per_block=0,
                     implementation=IMPL, record_batches=True)
    b = raw.batches
    start = raw.steps["start_s"][b["step"]]
    got: dict[int, list] = {}
    # Steps at which each row was preempted (in that step's schedule, before its batch).
    pre: dict[int, list] = {}
    for st, row, kind in zip(raw.events["step"], raw.events["row"], raw.events["kind"]):
        if kind.startswith("preempt_"):
            pre.setdefault(row, []).append(st)
    prev_step: dict[int, int] = {}
    for st, t, row, n, c, k in zip(b["step"].tolist(), start.tolist(), b["row"].tolist(),
                                   b["num_new_tokens"].tolist(),
                                   b["num_computed_tokens"].tolist(), b["kind"].tolist()):
        kind = BATCH_KINDS[k]
        last = prev_step.get(row, -1)
        fresh = last < 0 or any(last < p <= st for p in pre.get(row, ()))
        prev_step[row] = st
        if kind == "prefill" and fresh:
            # V0's token_chunk_size also counts the prefix-cache hit taken in this step (the
            # first chunk of a (re-)prefill), which kvcap keeps in num_computed_tokens.
            n += c
        got.setdefault(int(round(t)), []).append([ids[row], int(n), kind])
    lines = [w for w in want if "scheduled" in w]
    last = lines[-1]["step"] if lines else 0
    return ({s: v for s, v in got.items() if s <= last},
            {w["step"]: w["scheduled"] for w in lines if w["scheduled"]}, last)


@pytest.mark.parametrize("engine,name", [("v0", n) for n in V0_SCENARIOS] +
                         [("v1", n) for n in V1_SCENARIOS])
def test_batches_equal_real_vllm_scheduled(engine: str, name: str) -> None:
    if name in NOT_A_TRACE:
        pytest.skip(NOT_A_TRACE[name])
    got, want, last = oracle_batches(engine, name)
    assert last > 0
    diffs = [f"step {s}: replay {got.get(s)}, vLLM {want.get(s)}"
             for s in sorted(set(got) | set(want)) if got.get(s) != want.get(s)]
    assert not diffs, "\n".join(diffs[:10])


def _workload(seed: int, n: int = 40):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 2, n))
    prompt = rng.integers(1, 60, n)
    output = rng.integers(1, 40, n)
    hashes = [list(rng.integers(0, 3, int(-(-p // 8)))) for p in prompt]
    return arrival, prompt, output, hashes, rng.integers(0, 3, n)


@pytest.mark.parametrize("engine", ["v0", "v1"])
@pytest.mark.parametrize("seed", range(4))
def test_compiled_records_what_the_reference_records(engine: str, seed: int) -> None:
    arrival, prompt, output, hashes, prio = _workload(seed)
    spec = tiny_spec(num_gpu_blocks=24, policy="priority" if seed % 2 else "fcfs",
                     preemption_mode="swap" if seed == 2 and engine == "v0" else "recompute")
    fast = run_compiled(engine, spec, arrival, prompt, output, hashes, prio, record_batches=True)
    slow = run_reference(engine, spec, arrival, prompt, output, hashes, prio, record_batches=True)
    assert fast.batches.keys() == slow.batches.keys()
    for k in fast.batches:
        np.testing.assert_array_equal(fast.batches[k], slow.batches[k], err_msg=k)
    # One record per scheduled request per step: the token sums are the steps' token counts.
    per_step = np.bincount(fast.batches["step"], fast.batches["num_new_tokens"],
                           minlength=fast.num_steps)
    np.testing.assert_array_equal(
        per_step, fast.steps["num_prefill_tokens"] + fast.steps["num_decode_tokens"])
    assert (fast.num_steps and len(fast.batches["step"])
            and np.all(np.diff(fast.batches["step"]) >= 0))


def test_recording_changes_no_other_table() -> None:
    from core_helpers import assert_identical
    arrival, prompt, output, hashes, prio = _workload(7)
    spec = tiny_spec(num_gpu_blocks=20)
    run = run_compiled if IMPL == "compiled" else run_reference
    with_b = run("v1", spec, arrival, prompt, output, hashes, prio, record_batches=True)
    without = run("v1", spec, arrival, prompt, output, hashes, prio)
    assert without.batches is None and with_b.batches is not None
    assert_identical(with_b, without)


def test_events_seq_orders_victims_as_real_vllm_chose_them() -> None:
    """S5 (V0, two victims in one step) and S19b (V1, repeated self-preemption): the
    preemption events of each step, ordered by seq, are vLLM's `preempted` list."""
    import polars as pl

    from replay.results.tables import build_tables
    for engine, name in (("v0", "S5"), ("v1", "S19b"), ("v1", "S13b")):
        sc, want = load(name)
        spec, state, ids, keys = build(sc, engine, arrival_at_step=True)
        raw = run_engine(engine, spec, state, keys, ONE_SECOND_STEPS, kv_bytes_per_block=0,
                         implementation=IMPL)
        n = state.n
        trace = pl.DataFrame({"request_id": np.arange(n), "arrival_s": state.arrival_s,
                              "priority": state.priority, "tenant": [None] * n,
                              "prompt_tokens": state.prompt_len, "output_tokens": state.output_len})
        ev = build_tables(raw, trace, "r")["events"].filter(
            pl.col("kind").str.starts_with("preempt_")).sort("step", "seq")
        start = raw.steps["start_s"]
        got: dict[int, list] = {}
        for step, rid in zip(ev["step"].to_list(), ev["request_id"].to_list()):
            got.setdefault(int(round(start[step - 1])), []).append(ids[rid])
        expect = {w["step"]: [p[0] for p in w["preempted"]] for w in want if w.get("preempted")}
        assert expect and max(map(len, expect.values())) >= (2 if name == "S5" else 1)
        assert got == expect, name


@pytest.mark.parametrize("engine", ["v1", "v0"])
def test_a_step_window_records_exactly_those_steps_batches(engine: str) -> None:
    """The report's drill-down replays with `record_batches=(first, last)`: the same rows as the
    full recording restricted to those steps, on both implementations, and no others."""
    import polars as pl

    from capacity.analyses.stalls import drill_steps, stall_batches
    from replay.config import EngineConfig
    from replay.run import replay
    from traces.synth import synthesize
    trace = synthesize("flash-crowd", duration_s=120, rate_rps=4.0, surge_start_s=40, ramp_s=10,
                       hold_s=30, decay_s=20)
    cfg = EngineConfig(scheduler=engine, num_gpu_blocks_override=600)
    full = replay(trace, cfg, record_batches=True).tables()
    window = drill_steps(full)
    assert window is not None and window[1] - window[0] < full["steps"].height / 10
    cut = full["batches"].filter(pl.col("step").is_between(*window)).drop("run_id")
    for impl in ("compiled", "reference"):
        part = replay(trace, cfg, record_batches=window, implementation=impl).tables()
        assert part["batches"].drop("run_id").equals(cut), (engine, impl)
    drill_full, drill_part = stall_batches(full), stall_batches(part)
    assert drill_part.per_step.equals(drill_full.per_step)
