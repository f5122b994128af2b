"""`kvcap calibrate --device cpu --quick` writes a profile that the cost model and `kvcap replay
--calibration` accept; the fit recovers known constants from synthetic timings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replay.calibration.stub_fit import fit_constants, grid
from replay.timing.catalog import get_gpu
from replay.timing.executors import catalog_constants

ROOT = Path(__file__).resolve().parents[1]
KVCAP = Path(sys.executable).with_name("kvcap")


def test_fit_recovers_constants_from_exact_roofline_timings():
    rng = np.random.default_rng(1)
    flops = rng.uniform(1e9, 1e13, 40)
    nbytes = rng.uniform(1e8, 1e10, 40)
    swap = np.where(np.arange(40) % 5 == 0, rng.uniform(1e6, 1e9, 40), 0.0)
    t = 0.004 + np.maximum(flops / 5e14, nbytes / 3e12)
    swap_t = swap / 4e10
    got = fit_constants(flops, nbytes, swap, t + swap_t, swap_t, flops / 5e14 > 1e9)
    assert got["overhead_s"] == pytest.approx(0.004, rel=1e-3)
    assert got["flops_per_s"] == pytest.approx(5e14, rel=1e-3)
    assert got["hbm_bytes_per_s"] == pytest.approx(3e12, rel=1e-3)
    assert got["host_link_bytes_per_s"] == pytest.approx(4e10, rel=1e-3)


def test_grid_covers_every_family():
    fams = {s.family for s in grid(quick=True, max_model_len=8192)}
    assert fams == {"prefill", "chunk", "decode", "mixed", "swap_out", "swap_in"}


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "cpu.json"
    # A CPU's timings fit the GPU cost model badly (and vary with the load): accept any error
    # here, this fixture is about the profile format; the refusal is tested below.
    res = subprocess.run([str(KVCAP), "calibrate", "--device", "cpu", "--quick", "-o", str(out),
                          "--json", "--max-error-pct", "1000"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["profile"] == str(out)
    return out


def test_a_calibration_worse_than_the_limit_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "cpu.json"
    res = subprocess.run([str(KVCAP), "calibrate", "--device", "cpu", "--quick", "-o", str(out),
                          "--max-error-pct", "1e-9"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1, res.stderr
    assert "held-out step-time error is" in res.stderr and "no profile written" in res.stderr
    assert not out.exists()


def test_calibrate_cpu_quick_writes_a_profile_the_cost_model_accepts(profile):
    data = json.loads(profile.read_text())
    assert set(data) >= {"constants", "device", "model", "shape", "fit", "measurements"}
    assert data["device"]["type"] == "cpu" and data["shape"]["kind"] == "tiny"
    consts = catalog_constants(get_gpu("h100")).with_profile(profile)
    for k in ("overhead_s", "flops_per_s", "hbm_bytes_per_s", "host_link_bytes_per_s"):
        v = getattr(consts, k)
        assert np.isfinite(v) and v > 0 or (k == "overhead_s" and v >= 0), (k, v)
    assert data["fit"]["num_heldout"] > 0 and np.isfinite(data["fit"]["mape_heldout_pct"])
    assert any(m["heldout"] for m in data["measurements"])


def test_replay_accepts_the_profile(profile, tmp_path):
    trace = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
    if not trace.exists():
        pytest.skip("shared Azure trace not present")
    small = tmp_path / "conv.csv"
    small.write_text("".join(trace.read_text().splitlines(keepends=True)[:31]))
    res = subprocess.run([str(KVCAP), "replay", str(small), "--calibration", str(profile),
                          "--db", str(tmp_path / "k.duckdb"), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "completed" and out["requests_finished"] == 30


# What the GPU machine lacks: polars, duckdb and Altair are not installed there, and its Python
# (3.12) cannot load the cores compiled here. The check must run without them.
_DEVICE_LACKS = ("polars", "duckdb", "altair", "vl_convert", "capacity",
                 "replay.engine.v0._core", "replay.engine.v1._core")


# A small Llama-style model with grouped KV heads, its real shape on the stub ("full", the GPU's
# path: 8 query heads over 2 KV heads, head_dim 32) so the CPU can run it.
_SMALL_GQA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 8192,
              "torch_dtype": "bfloat16", "head_dim": 32}


@pytest.mark.parametrize("shape", ["tiny", "full"])
def test_gpu_check_script_runs_on_the_cpu_with_only_what_the_gpu_machine_has(tmp_path, shape):
    trace = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
    if not trace.exists():
        pytest.skip("shared Azure trace not present")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nfor m in %r:\n    sys.modules[m] = None\n" % (_DEVICE_LACKS,))
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = tmp_path / "out"
    args, n_off, model = ["--requests", "12"], 80, "llama-3.1-8b"
    if shape == "full":
        (tmp_path / "small").mkdir()
        (tmp_path / "small" / "config.json").write_text(json.dumps(_SMALL_GQA))
        # A pool and a tier sized for a CPU (its blocks are 32 KiB); the tier still evicts.
        args += ["--stub-shape", "full", "--model", str(tmp_path / "small"),
                 "--gpu-memory-utilization", "0.02", "--offload-requests", "20",
                 "--kv-offloading-size", "0.002"]
        n_off, model = 20, "small"
    res = subprocess.run(["bash", str(ROOT / "bench" / "gpu_calibrate.sh"), str(out),
                          "--device", "cpu", "--quick", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["gpu_catalog"] == "h200" and results["stub_shape"] == shape
    assert (out / f"profile-h200-{model}.json").is_file()
    bw = results["bandwidth"]
    assert all(bw[f"{k}_gb_per_s"] > 0 for k in ("swap_out", "swap_in", "offload_store",
                                                  "offload_load", "pinned_d2h", "pinned_h2d"))
    rp = results["replay"]
    assert rp["integrity"]["passed"] and rp["integrity"]["steps_checked"] == rp["measured"]["num_steps"]
    assert rp["measured"]["requests_finished"] == 12
    for name in ("calibrated", "shipped"):
        assert rp[f"{name}_model"]["requests_finished"] == 12
        e = rp["step_errors"][name]["all"]
        assert e["steps"] == rp["measured"]["num_steps"] - 5
        assert 0 <= e["mean_abs_pct"] <= e["p95_abs_pct"] or e["steps"] < 20
    t = rp["timing"]       # on the CPU every step is the host's time, so every step is gapless
    assert t["gapless_steps"] == t["steps"] == rp["measured"]["num_steps"] - 5
    assert results["calibration_fit"]["gapless_pct"] == 100.0
    wb = rp["step_errors"]["shipped"]["decode_weight_bound"]["steps"]
    assert 0 < wb == t["weight_bound_steps"] <= rp["step_errors"]["shipped"]["decode_only"]["steps"]
    off = results["offload_replay"]
    assert off["integrity"]["passed"] and off["measured"]["requests_finished"] == n_off
    assert off["offload"]["store_blocks"] > 0 and off["offload"]["evicted_chunks"] > 0
    md = (out / "results.md").read_text()
    assert "| ttft p99 |" in md and "| shipped | all" in md and "offload store" in md
    assert "Integrity checks passed" in md and "steps gapless" in md


def test_gpu_check_names_the_device_it_runs_on():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gpu_checks import catalog_gpu
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert catalog_gpu("NVIDIA H100 80GB HBM3") == "h100"
    assert catalog_gpu("NVIDIA H200") == "h200"
    assert catalog_gpu("NVIDIA H200 NVL") == "h200"           # a variant the catalog lacks
    with pytest.raises(SystemExit, match="pass --gpu"):
        catalog_gpu("Tesla T4")
