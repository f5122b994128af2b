"""Stall attribution and priority interference on small constructed runs."""
import polars as pl

from capacity.analyses.planner import Planner
from capacity.analyses.priority import interference
from capacity.analyses.stalls import attribute_stalls
from replay.config import EngineConfig
from replay.run import replay
from traces.synth import synthesize

MIX = dict(duration_s=90, rate_rps=3.0, batch_job_interval_s=30, batch_job_requests=40)


def test_every_preemption_stall_is_attributed_and_slow_steps_are_separate():
    trace = synthesize("flash-crowd", duration_s=120, rate_rps=4.0, surge_start_s=40, ramp_s=10,
                       hold_s=30, decay_s=20)
    res = replay(trace, EngineConfig(num_gpu_blocks_override=700))
    tables = res.tables()
    a = attribute_stalls(tables, threshold_s=0.05)
    assert tables["stalls"].height > 0 and a.stalls.height == tables["stalls"].height
    # a stall spans its preemption: last token before <= preempted_s < resumed_s
    assert (a.stalls["resumed_s"] > a.stalls["preempted_s"]).all()
    assert (a.stalls["stall_s"] >= a.stalls["recovery_s"]).all()
    assert a.preemption_spikes == int((a.stalls["stall_s"] > 0.05).sum())
    # slow steps are steps longer than the threshold that carried decodes
    assert (a.slow_steps["duration_s"] > 0.05).all() and (a.slow_steps["num_decode_tokens"] > 0).all()
    assert set(a.slow_steps["cause"].unique()) <= {"host KV traffic in the step (swap / CPU offloading)",
                                                    "prefill batched with decodes",
                                                    "large decode batch / long contexts"}


def test_priority_interference_batch_yields_and_queue_only_never_preempts():
    trace = synthesize("priority-mix", **MIX)
    i = interference(trace, EngineConfig(num_gpu_blocks_override=900), planner=Planner(workers=1))
    t = i.by_class
    assert set(t["variant"]) == {"shared (preemption)", "shared (queue-only)", "interactive alone"}
    shared = t.filter(pl.col("variant") == "shared (preemption)")
    batch = shared.filter(pl.col("priority") > 0)["preemptions"].sum()
    inter = shared.filter(pl.col("priority") == 0)["preemptions"].sum()
    assert batch >= inter        # the worst priority is the victim (B4 / A7)
    assert t.filter(pl.col("variant") == "shared (queue-only)")["preemptions"].sum() == 0
    assert "interactive TTFT p99" in i.summary


def test_priority_interference_of_a_cpu_offloading_recommendation_runs():
    """Issue 31: the report exited 2 whenever its mode comparison picked CPU offloading — the
    queue-only variant kept the tier ("preemption_mode: 'none' with kv_offloading_size")."""
    trace = synthesize("priority-mix", **MIX)
    i = interference(trace, EngineConfig(num_gpu_blocks_override=900, kv_offloading_size=4.0),
                     planner=Planner(workers=1))
    assert set(i.by_class["variant"]) == {"shared (preemption)", "shared (queue-only)",
                                          "interactive alone"}


def test_v0_swap_engine_is_analysed_with_recompute_and_says_so():
    trace = synthesize("priority-mix", **MIX)
    cfg = EngineConfig(scheduler="v0", preemption_mode="swap", num_gpu_blocks_override=900)
    i = interference(trace, cfg, planner=Planner(workers=1))
    assert i.summary.startswith("V0 cannot run priority scheduling with swap")


def test_stall_drill_down_shows_the_batches_around_a_requests_stalls():
    """Issue 20: the worst-stalled request's batches from the step before its preemption to the
    step after its resume, read from the `batches` table."""
    import pytest

    from capacity.analyses.stalls import stall_batches
    trace = synthesize("flash-crowd", duration_s=120, rate_rps=4.0, surge_start_s=40, ramp_s=10,
                       hold_s=30, decay_s=20)
    tables = replay(trace, EngineConfig(num_gpu_blocks_override=700), record_batches=True).tables()
    with pytest.raises(ValueError, match="record-batches"):
        stall_batches({k: v for k, v in tables.items() if k != "batches"})
    d = stall_batches(tables)
    worst = tables["stalls"].sort("stall_s", descending=True)["request_id"][0]
    assert d.request_id == worst
    ps = d.per_step
    first = ps.filter(pl.col("stall") == 1)
    assert first["phase"].to_list() == ["before", "preempted", "resumed", "after"]
    pre = first.row(1, named=True)
    assert worst in pre["preempted"] and pre["this_kind"] is None    # not in its victim step
    assert first.row(2, named=True)["this_kind"] == "resumed"
    # Every row of a shown step is that step's whole batch, in batch order.
    b = tables["batches"]
    for step in ps["step"].to_list():
        want = b.filter(pl.col("step") == step).sort("seq")["request_id"].to_list()
        got = d.rows.filter((pl.col("step") == step) & (pl.col("stall") == 1)
                            )["request_id"].to_list()
        assert got in ([], want)
    assert d.rows.filter(pl.col("this"))["request_id"].unique().to_list() == [worst]
