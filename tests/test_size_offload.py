"""`kvcap size-offload` (issue 16 item 6) on real replays: the JSON contract, the refusals, a
curve on a small trace whose sessions come back after the GPU cache lost them, and on a Mooncake
conversation head (prefix hashes) a curve whose recommendation a separate `kvcap replay
--kv-offloading-size` confirms: the same CPU hits and TTFT p99, within the tolerance of the best,
and the next smaller swept size not."""
import json

import pytest

from capacity_helpers import ROOT, kvcap, kvcap_json
from replay.engine.compiled import has_offloading

MOONCAKE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
# A head of the Mooncake conversation trace at a fifth of its rate on a small GPU pool (7,000
# blocks = 112k tokens). Its sessions come back a median 461 requests later (~3M prompt tokens):
# only a tier of hundreds of GiB (Llama-3.1-8B: 128 KiB per token) holds them until then.
# Measured (compiled core, under load): the knee at 512 GiB, 256 GiB short of it; ~15 s.
HEAD = 600
POOL = ["--num-gpu-blocks-override", "7000", "--rate-scale", "0.2"]
SIZES = "0,256,512,1024"
# On the Python reference the Mooncake sweep takes minutes: it runs where the compiled core has
# the connector.
compiled_only = pytest.mark.skipif(not has_offloading("v1"),
                                   reason="the compiled V1 core does not replay offloading yet")
# The small trace: 40 sessions of 2,048 prompt tokens (4 Mooncake hash blocks) in turn, so a
# session comes back 40 requests (10 GiB of KV) later; the GPU pool holds 4 GiB.
SMALL = ["--num-gpu-blocks-override", "2000"]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    rows = [{"timestamp": 400 * i, "input_length": 2048, "output_length": 8,
             "hash_ids": [0, *(1 + 3 * (i % 40) + k for k in range(3))]} for i in range(200)]
    path = tmp_path_factory.mktemp("sessions") / "sessions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def mooncake_head(tmp_path_factory):
    from traces.loaders import load_trace, write_trace
    path = tmp_path_factory.mktemp("moon") / "moon.parquet"
    write_trace(load_trace(MOONCAKE).head(HEAD), path)
    return path


@pytest.fixture(scope="module")
def sweep(mooncake_head, tmp_path_factory):
    # A host with 2 TiB of RAM for this GPU: the H100 reference (256 GiB per GPU) could not pin
    # these sizes, and the knee would be capped (test_a_knee_the_host_cannot_pin_is_capped).
    return kvcap_json("size-offload", mooncake_head, *POOL, "--sizes", SIZES, "--workers", "2",
                      "--host-ram-gib", "2048")


@pytest.fixture(scope="module")
def small(sessions, tmp_path_factory):
    chart = tmp_path_factory.mktemp("chart") / "curve.png"
    out = kvcap_json("size-offload", sessions, *SMALL, "--sizes", "0,4,16", "-o", chart,
                     "--workers", "2")
    return out, chart


def test_json_contract_engine_and_loop_and_a_curve(small):
    out, chart = small
    assert {"points", "recommended_kv_offloading_size_gib", "tolerance"} <= out.keys()
    assert out["tolerance"] == 0.05
    assert (out["engine"], out["scheduler_loop"]) == ("v1", "async")
    assert [p["kv_offloading_size_gib"] for p in out["points"]] == [0.0, 4.0, 16.0]
    for p in out["points"]:
        assert {"kv_offloading_size_gib", "cpu_hit_tokens", "recomputed_prefill_tokens",
                "ttft_p99_s", "tbt_p99_s", "ttft_p50_s", "preemption_stalls"} <= p.keys()
    hits = [p["cpu_hit_tokens"] for p in out["points"]]
    # no connector: no CPU hits; 16 GiB holds the 40 sessions (10 GiB) until they come back,
    # 4 GiB does not
    assert hits[0] == 0 and hits[2] > hits[1] and hits[2] > 0
    assert out["points"][2]["prefill_tokens"] < out["points"][0]["prefill_tokens"]
    assert out["recommended_kv_offloading_size_gib"] == 16.0, out["reason"]
    assert out["flags"] == ["--kv-offloading-size", "16", "--kv-offloading-backend", "native"]
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    json.dumps(out, allow_nan=False)


@compiled_only
def test_mooncake_curve_and_its_recommendation_confirmed_by_a_replay(sweep, mooncake_head,
                                                                     tmp_path):
    out = sweep
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
    run = kvcap_json("replay", mooncake_head, *POOL, *out["flags"], "--db", tmp_path / "r.duckdb")
    assert run["cpu_hit_tokens"] == pts[i]["cpu_hit_tokens"]
    assert run["ttft_p99_s"] == pytest.approx(pts[i]["ttft_p99_s"])
    assert run["ttft_p99_s"] <= best_ttft * (1 + tol)


def test_a_knee_the_host_cannot_pin_is_capped(sessions):
    # The same curve as `small` (knee 16 GiB) on a host of 20 GiB: 16 GiB would pin more than 70%
    # of it, so the recommendation is the knee among 0-4 GiB and names the 16-GiB knee.
    out = kvcap_json("size-offload", sessions, *SMALL, "--sizes", "0,4,16", "--workers", "2",
                     "--host-ram-gib", "20")
    assert out["unconstrained_kv_offloading_size_gib"] == 16.0
    assert out["recommended_kv_offloading_size_gib"] in (0.0, 4.0)
    assert out["host_ram_verdict"] != "error" and "16 GiB" in out["reason"], out["reason"]


def test_v0_and_bad_flags_are_one_line_errors(sessions):
    err = kvcap("size-offload", sessions, "--scheduler", "v0", rc=2).stderr
    assert err.count("\n") == 1 and "size-swap" in err
    for args, flag in ((("--sizes", "4,x"), "--sizes"), (("--sizes", "-1"), "--sizes"),
                       (("--tolerance", "1.5"), "--tolerance"), (("-o", "curve.gif"), "-o")):
        err = kvcap("size-offload", sessions, *args, rc=2).stderr
        assert err.count("\n") == 1 and flag in err, err


def test_text_output_names_the_engine_and_marks_the_knee(sessions):
    text = kvcap("size-offload", sessions, *SMALL, "--sizes", "0,16").stdout
    assert "vLLM 0.34 (V1, 64-token blocks), async scheduling (the default)" in text and "recommendation:" in text
    assert "16 *" in text
