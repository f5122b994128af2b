"""The capacity plan end to end (issue 14, done-when): an overloaded trace gets "overloaded", a
sustainable-load figure and no flags; a sustainable one gets flags that, replayed, reproduce the
recommended row exactly, and the same headroom from the report and `kvcap headroom`."""
import json

import pytest

from capacity.analyses.flags import NotExpressible, apply_flags, vllm_flags
from capacity.analyses.search import search_scale
from replay.config import EngineConfig, resolve

from capacity_helpers import conv800, kvcap, kvcap_json  # noqa: F401 (conv800: a fixture)

# 1400 blocks: the recommended row still preempts a little (the drill-down test needs stalls).
BASE = ["--scheduler", "v0", "--num-gpu-blocks-override", "1400"]
SLO = ["--slo-ttft-p99", "3", "--slo-tbt-p99", "0.2", "--preemption-budget", "any"]


@pytest.fixture(scope="module")
def report(conv800, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    doc = kvcap_json("report", conv800, "-o", out, *BASE, *SLO, "--max-num-seqs-grid", "16,32,64",
                     "--workers", "2")
    return out, doc


def test_report_contract_keys(report):
    out, doc = report
    summary = json.loads((out / "summary.json").read_text())
    for d in (doc, summary):
        assert d["sustainable"] is True and d["offered_rps"] > 0 and d["served_rps"] > 0
        assert d["headroom_rate_scale"] is not None
        rec = d["recommendation"]
        assert rec["flags"] and all(isinstance(f, str) for f in rec["flags"])
        assert {"ttft_p99_s", "tbt_p99_s", "preemptions"} <= set(rec["expected"])
    assert summary["recommendation"] == doc["recommendation"]
    for k in ("verdict", "binding_constraint", "capacity_rps", "replicas", "departures", "noise"):
        assert summary[k] == doc[k], k
    assert doc["verdict"] in ("misses", "fits")
    assert doc["capacity_rps"] == pytest.approx(doc["headroom_rate_scale"] * doc["offered_rps"])
    assert doc["replicas"]["count"] >= 1 and doc["replicas"]["router"] == "lor"
    # An alert rule only for a plan that fits (its preemption is peak-only by definition).
    assert (out / "kvcap-preemption-rules.yml").exists() == (doc["verdict"] == "fits")


def test_printed_flags_replay_the_recommended_row_exactly(conv800, report):
    out, doc = report
    rec = doc["recommendation"]
    run = kvcap_json("replay", conv800, *BASE, *rec["flags"], "--db", out / "check.duckdb")
    exp = rec["expected"]
    assert run["ttft_p99_s"] == exp["ttft_p99_s"]
    assert run["tbt_p99_s"] == exp["tbt_p99_s"]
    assert run["preemptions_recompute"] + run["preemptions_swap"] == exp["preemptions"]
    html = (out / "index.html").read_text()
    for flag in rec["flags"]:
        assert flag in html
    # The tuning row of the recommended value is that replay too.
    # The tuning row of the recommended value (when tuned) is that replay too.
    tn = doc["tuning"]
    for row in [c for c in tn["candidates"] if c["max_num_seqs"] == doc["recommended_max_num_seqs"]
                and c["max_num_batched_tokens"] == tn["candidates"][0]["max_num_batched_tokens"]]:
        assert (row["ttft_p99_s"], row["tbt_p99_s"], row["preemptions"]) == \
            (exp["ttft_p99_s"], exp["tbt_p99_s"], exp["preemptions"])


def test_report_headroom_and_plan_give_one_capacity_and_replica_count(conv800, report):
    """Same inputs, same plan: `headroom` and `plan` are views of the report's procedure."""
    _, doc = report
    h = kvcap_json("headroom", conv800, *BASE, *SLO, "--max-num-seqs-grid", "16,32,64",
                   "--workers", "2")
    assert h["headroom_rate_scale"] == doc["headroom_rate_scale"]
    assert (h["capacity_rps"], h["replicas"]["count"], h["replicas_needed"]) == \
        (doc["capacity_rps"], doc["replicas"]["count"], doc["replicas"]["count"])


def test_overloaded_trace_gets_overloaded_a_sustainable_load_and_no_flags(conv800, tmp_path):
    # 350 blocks: the engine serves about half of conv800's rate — the trace at twice its
    # sustainable rate.
    doc = kvcap_json("report", conv800, "-o", tmp_path, "--num-gpu-blocks-override", "350",
                     "--block-size", "16",
                     *SLO, "--max-num-seqs-grid", "32,64", "--workers", "2")
    rec = doc["recommendation"]
    assert doc["sustainable"] is False and rec["flags"] == [] and rec["expected"] is None
    assert doc["verdict"] == "overloaded"
    # "Sustainable" (the queue drains) is never the capacity (SLOs and budget).
    assert doc["capacity_rps"] is None or doc["capacity_rps"] <= doc["sustainable_rps"]
    k = rec["sustainable_rate_scale"]
    assert 0.4 <= k <= 0.6, k
    assert rec["headline"].startswith("overloaded: serves")
    assert "the queue drains up to ≈" in rec["headline"]
    assert doc["served_rps"] < 0.6 * doc["offered_rps"]
    assert not (tmp_path / "kvcap-preemption-rules.yml").exists()
    assert doc["recommended_swap_space_gib"] is None
    html = (tmp_path / "index.html").read_text()
    assert "overloaded: serves" in html and "No flags" in html
    # The figure is a searched one: replaying at it keeps up, at its failing bound it does not.
    s = doc["sustainable_load"]
    assert s["failed_at"] / s["scale"] <= 1.05 + 1e-9


@pytest.mark.parametrize("cfg", [
    EngineConfig(), EngineConfig(scheduler="v0"), EngineConfig(enable_prefix_caching=False),
    EngineConfig(scheduler="v0", preemption_mode="swap", swap_space=2.5),
    EngineConfig(kv_offloading_size=24.0, tensor_parallel_size=2),
    EngineConfig(kv_offloading_size=8.0, kv_offloading_eviction_policy="arc",
                 offload_prompt_only=False, async_scheduling=False),
    EngineConfig(kv_offloading_size=8.0, kv_offloading_store_threshold=2),
    EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, scheduling_policy="priority"),
])
def test_flags_round_trip_to_the_same_engine(cfg):
    back = apply_flags(EngineConfig(scheduler=cfg.scheduler, model=cfg.model,
                                    tensor_parallel_size=cfg.tensor_parallel_size), vllm_flags(cfg))
    assert resolve(back).spec == resolve(cfg).spec
    assert back.preemption_mode == cfg.preemption_mode
    assert back.kv_offloading_size == cfg.kv_offloading_size


def test_v1_flags_spell_the_cpu_tier_and_the_loop_as_vllm_033():
    flags = vllm_flags(EngineConfig(kv_offloading_size=24.0, tensor_parallel_size=2))
    # the size is in total over the TP group, as vLLM's flag; async is 0.33's default loop
    assert " ".join(flags).endswith("--async-scheduling --kv-offloading-size 24 "
                                    "--kv-offloading-backend native")
    assert "--swap-space" not in flags and "--preemption-mode" not in flags
    assert "--kv-offloading-size" not in vllm_flags(EngineConfig())
    # a base that ran a CPU tier loses it when the flags do not name one
    assert apply_flags(EngineConfig(kv_offloading_size=8.0), vllm_flags(EngineConfig())
                       ).kv_offloading_size is None


def test_queue_only_has_no_flags():
    with pytest.raises(NotExpressible):
        vllm_flags(EngineConfig(preemption_mode="none"))


def test_search_brackets_the_threshold_to_its_precision():
    for edge in (0.37, 1.0, 1.3, 2.9, 7.0):
        s = search_scale(lambda x: x <= edge)
        assert s.scale <= edge < s.failed_at and s.failed_at / s.scale <= 1.05 + 1e-9
        assert len(s.probes) <= 12
    top = search_scale(lambda x: True)
    assert top.capped and top.scale == 8.0
    from capacity.analyses.search import run_searches
    fast = run_searches(["x"], lambda todo: [s <= 0.52 for _, s in todo], guesses={"x": 0.5})["x"]
    slow = search_scale(lambda x: x <= 0.52)
    assert fast.scale <= 0.52 < fast.failed_at and len(fast.probes) < len(slow.probes)


def test_report_drills_into_the_worst_stalled_requests_batches(report):
    """Issue 20: the stalls section shows one request's batches around its stalls."""
    out, doc = report
    assert doc["recommendation"]["expected"]["preemptions"] > 0
    html = (out / "index.html").read_text()
    assert "Drill-down, request " in html and "preempted (in order)" in html
    assert html.count(">preempted<") >= 1 and html.count(">resumed<") >= 1
