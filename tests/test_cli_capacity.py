"""The capacity commands from the command line: JSON contracts (DESIGN §7) and the tuner's checks."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
SMALL_POOL = ["--num-gpu-blocks-override", "500"]


@pytest.fixture(scope="module")
def conv800(tmp_path_factory):
    from traces.loaders import load_trace, write_trace
    path = tmp_path_factory.mktemp("t") / "conv800.parquet"
    write_trace(load_trace(CONV).head(800), path)
    return path


def kvcap_json(*args):
    res = subprocess.run([KVCAP, *map(str, args), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_size_swap_json_keys(conv800, tmp_path):
    out = kvcap_json("size-swap", conv800, "--scheduler", "v0", *SMALL_POOL, "--db", tmp_path / "k.duckdb")
    assert {"peak_swapped_gib", "peak_swapped_requests", "recommended_swap_space_gib",
            "recommended_kv_offloading_size_gib"} <= out.keys()
    assert out["peak_swapped_gib"] > 0 and out["recommended_swap_space_gib"] >= out["peak_swapped_gib"]
    assert out["verify"]["swap_full_events"] == 0


def test_compare_modes_json(conv800):
    out = kvcap_json("compare-modes", conv800, *SMALL_POOL)
    variants = [m["variant"] for m in out["modes"]]
    assert variants == ["swap", "recompute+prefix-cache", "recompute", "queue-only"]
    assert out["recommended"] in variants and out["reason"]
    queue = out["modes"][-1]
    assert queue["preemptions"] == 0          # queue-only never evicts


def test_tune_choice_meets_slo_and_next_larger_breaks_or_ties(conv800):
    out = kvcap_json("tune", conv800, "--num-gpu-blocks-override", "1800",
                     "--max-num-seqs-grid", "4,8,16,32,64",
                     "--slo-ttft-p99", "3", "--slo-tbt-p99", "0.2", "--preemption-budget", "any",
                     "--workers", "2")
    assert {"recommended_max_num_seqs", "candidates"} <= out.keys()
    cands = sorted(out["candidates"], key=lambda c: c["max_num_seqs"])
    assert len(cands) == 5
    rec = out["recommended_max_num_seqs"]
    assert rec is not None, out["explanation"]
    chosen = next(c for c in cands if c["max_num_seqs"] == rec)
    # The choice meets the SLOs in its own replay.
    assert chosen["feasible"] and chosen["ttft_p99_s"] <= 3 and chosen["tbt_p99_s"] <= 0.2
    larger = [c for c in cands if c["max_num_seqs"] > rec]
    if larger:
        nxt = larger[0]
        tied = nxt["feasible"] and nxt["goodput_rps"] >= chosen["goodput_rps"] * 0.99
        assert (not nxt["feasible"]) or tied, (nxt, out["explanation"])
        assert ("breaks" in out["explanation"]) or ("tied" in out["explanation"]) or not nxt["feasible"]
    assert out["flags"] == [f"--max-num-seqs {rec}", f"--max-num-batched-tokens {chosen['max_num_batched_tokens']}"]


def test_headroom_json(conv800):
    out = kvcap_json("headroom", conv800, *SMALL_POOL, "--slo-ttft-p99", "3", "--slo-tbt-p99",
                     "0.2", "--scales", "1,2", "--workers", "1", "--target-peak", "3")
    assert {"max_ok_scale", "replicas_needed", "points", "explanation"} <= out.keys()
    assert [p["rate_scale"] for p in out["points"]] == [1.0, 2.0, 1.0]
    assert out["points"][-1]["surge"] is True


def test_alerts_write_loadable_rules(conv800, tmp_path):
    rules = tmp_path / "rules.yml"
    out = kvcap_json("alerts", conv800, *SMALL_POOL, "-o", rules)
    assert out["verdict"] in ("none", "peak-only", "structural")
    doc = yaml.safe_load(rules.read_text())
    exprs = [r["expr"] for r in doc["groups"][0]["rules"]]
    assert f"increase(vllm:num_preemptions_total[5m]) > {out['threshold']}" in exprs
