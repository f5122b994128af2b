"""`kvcap size-offload` (issue 16 item 6) on real replays: the JSON contract, the refusals, and on
a Mooncake conversation head (prefix hashes) a curve whose recommendation a separate
`kvcap replay --kv-offloading-size` confirms: the same CPU hits and TTFT p99, within the
tolerance of the best, and the next smaller swept size not."""
import json

import pytest

from capacity.analyses.offload import not_replayable
from capacity_helpers import ROOT, kvcap, kvcap_json

# Needs an engine that replays the OffloadingConnector (issue 16 lands it in stages).
pytestmark = pytest.mark.skipif(not_replayable() is not None,
                                reason=f"CPU KV offloading not replayable: {not_replayable()}")

MOONCAKE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
# A head of the Mooncake conversation trace at a third of its rate on a small GPU pool (7,000
# blocks = 112k tokens): sessions come back after the GPU cache has evicted their prefixes, so the
# CPU tier has hits to give. Measured: a few seconds for the whole sweep.
HEAD = 300
POOL = ["--num-gpu-blocks-override", "7000", "--rate-scale", "0.3"]
SIZES = "0,4,8,16,32"


@pytest.fixture(scope="module")
def mooncake_head(tmp_path_factory):
    from traces.loaders import load_trace, write_trace
    path = tmp_path_factory.mktemp("moon") / "moon.parquet"
    write_trace(load_trace(MOONCAKE).head(HEAD), path)
    return path


@pytest.fixture(scope="module")
def sweep(mooncake_head, tmp_path_factory):
    chart = tmp_path_factory.mktemp("chart") / "curve.png"
    out = kvcap_json("size-offload", mooncake_head, *POOL, "--sizes", SIZES, "-o", chart,
                     "--workers", "2")
    return out, chart


def test_json_contract_engine_and_loop(sweep):
    out, chart = sweep
    assert {"points", "recommended_kv_offloading_size_gib", "tolerance"} <= out.keys()
    assert out["tolerance"] == 0.05
    assert (out["engine"], out["scheduler_loop"]) == ("v1", "async")
    sizes = [p["kv_offloading_size_gib"] for p in out["points"]]
    assert sizes == [float(s) for s in SIZES.split(",")]
    for p in out["points"]:
        assert {"kv_offloading_size_gib", "cpu_hit_tokens", "recomputed_prefill_tokens",
                "ttft_p99_s", "tbt_p99_s", "ttft_p50_s", "preemption_stalls"} <= p.keys()
    assert out["points"][0]["cpu_hit_tokens"] == 0        # size 0: no connector
    assert out["recommended_kv_offloading_size_gib"] in sizes
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_mooncake_curve_and_its_recommendation_confirmed_by_a_replay(sweep, mooncake_head):
    out, _ = sweep
    pts = out["points"]
    # a real curve: the CPU tier gives hits, and they grow with its size
    hits = [p["cpu_hit_tokens"] for p in pts]
    assert hits[-1] > 0 and hits == sorted(hits), hits
    rec = out["recommended_kv_offloading_size_gib"]
    assert rec > 0, out["reason"]
    i = [p["kv_offloading_size_gib"] for p in pts].index(rec)
    best_work = min(p["prefill_tokens"] for p in pts)
    best_ttft = min(p["ttft_p99_s"] for p in pts)
    tol = out["tolerance"]

    def within(p):
        return (p["prefill_tokens"] <= best_work * (1 + tol)
                and p["ttft_p99_s"] <= best_ttft * (1 + tol))
    assert within(pts[i]) and not any(within(p) for p in pts[:i])     # the knee
    # an independent replay at the recommended size: the flags say the same
    assert out["flags"] == ["--kv-offloading-size", f"{rec:g}", "--kv-offloading-backend", "native"]
    run = kvcap_json("replay", mooncake_head, *POOL, *out["flags"])
    assert run["cpu_hit_tokens"] == pts[i]["cpu_hit_tokens"]
    assert run["ttft_p99_s"] == pytest.approx(pts[i]["ttft_p99_s"])
    assert run["ttft_p99_s"] <= best_ttft * (1 + tol)


def test_v0_and_v1_swap_and_bad_flags_are_one_line_errors(mooncake_head):
    err = kvcap("size-offload", mooncake_head, "--scheduler", "v0", rc=2).stderr
    assert err.count("\n") == 1 and "size-swap" in err
    for args, flag in ((("--sizes", "4,x"), "--sizes"), (("--sizes", "-1"), "--sizes"),
                       (("--tolerance", "1.5"), "--tolerance"), (("-o", "curve.gif"), "-o")):
        err = kvcap("size-offload", mooncake_head, *args, rc=2).stderr
        assert err.count("\n") == 1 and flag in err, err


def test_text_output_names_the_engine_and_marks_the_knee(mooncake_head):
    text = kvcap("size-offload", mooncake_head, *POOL, "--sizes", "0,16").stdout
    assert "vLLM V1 (0.33), async scheduling loop" in text and "recommendation:" in text
    assert " *" in text


def test_summary_json_of_the_sweep_is_plain_json(sweep):
    json.dumps(sweep[0], allow_nan=False)
