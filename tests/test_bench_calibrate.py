"""`kvcap calibrate --from-bench` (replay/calibration/bench_fit.py): a synthetic `vllm bench serve` result made
by replaying a known profile is fitted back to that profile's constants, and the written profile
reproduces the result's median TPOT within 5 % through `--calibration`; bad bench files are refused
in one line naming the key."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from replay.calibration import bench_fit
from replay.config import EngineConfig
from replay.timing import step_profile

ROOT = Path(__file__).resolve().parents[1]
KVCAP = Path(sys.executable).with_name("kvcap")
SHIPPED = step_profile.PROFILE_DIR / "h100--llama-3.1-8b--bf16--tp1.json"
TRUE_OVERHEAD_S, TRUE_SCALE = 0.0025, 1.15


def _bench_json(n=120, seed=3) -> dict:
    """What `vllm bench serve --save-result --save-detailed` writes (the keys kvcap reads), for
    requests replayed on the shipped profile with known constants."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / 6.0, n))
    prompt = rng.integers(100, 3000, n)
    output = rng.integers(2, 400, n)
    tables = replace(step_profile.load(SHIPPED), overhead_s=TRUE_OVERHEAD_S,
                     kernel_scale=TRUE_SCALE)
    b = bench_fit.Bench(path="synthetic", model_id=None, arrival_s=arrival - arrival[0],
                        prompt_len=prompt, output_len=output, ttft_s=np.zeros(n),
                        tpot_s=np.zeros(n), median_tpot_ms=0.0)
    raw, _ = bench_fit.replay_bench(b, EngineConfig(model="llama-3.1-8b", gpu="h100"), tables)
    assert raw.status == "completed"
    ttft = raw.first_token_s - b.arrival_s
    tpot = (raw.finish_s - raw.first_token_s) / (output - 1)
    return {"date": "20261202-000000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
            "num_prompts": n, "request_rate": 6.0, "burstiness": 1.0, "max_concurrency": None,
            "completed": n, "median_tpot_ms": float(np.median(tpot) * 1e3),
            "median_ttft_ms": float(np.median(ttft) * 1e3),
            "start_times": (1000.0 + b.arrival_s).tolist(), "input_lens": prompt.tolist(),
            "output_lens": output.tolist(), "ttfts": ttft.tolist(),
            "itls": [[float(t)] * int(o - 1) for t, o in zip(tpot, output)],
            "errors": [""] * n}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    bench = d / "result.json"
    data = _bench_json()
    bench.write_text(json.dumps(data))
    out = d / "cal.json"
    res = subprocess.run([str(KVCAP), "calibrate", "--from-bench", str(bench), "--gpu", "h100",
                          "-o", str(out), "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return data, json.loads(res.stdout), out


def test_fit_recovers_the_constants_the_bench_was_made_with(fitted):
    _, summary, out = fitted
    assert summary["written"] and summary["base"] == "h100--llama-3.1-8b--bf16--tp1"
    c = summary["constants"]
    assert c["overhead_s"] == pytest.approx(TRUE_OVERHEAD_S, rel=0.05)
    assert c["kernel_scale"] == pytest.approx(TRUE_SCALE, rel=0.02)
    assert summary["fit"]["median_tpot_error_pct"] <= 5.0
    prof = json.loads(out.read_text())
    assert prof["calibration"]["from_bench"].endswith("result.json")
    assert prof["source"]["package"] == "aiconfigurator-core"       # the tables it was fitted on


def test_the_profile_reproduces_the_median_tpot_through_calibration(fitted):
    data, _, out = fitted
    from replay.config import resolve
    from replay.timing.executors import cost_model_for
    cfg = EngineConfig(model="llama-3.1-8b", gpu="h100", calibration=str(out))
    cm = cost_model_for(resolve(cfg), calibration=cfg.calibration)
    assert cm.measured is not None and cm.measured.name.endswith("--calibrated")
    bench = bench_fit.read_bench(Path(out).with_name("result.json"))
    raw, _ = bench_fit.replay_bench(bench, cfg, cm.measured)
    tpot = (raw.finish_s - raw.first_token_s) / (bench.output_len - 1)
    assert np.median(tpot) * 1e3 == pytest.approx(data["median_tpot_ms"], rel=0.05)
    # The shipped profile (no overhead, scale 1) does not: the fit is what closes the gap.
    raw0, _ = bench_fit.replay_bench(bench, cfg, step_profile.load(SHIPPED))
    tpot0 = (raw0.finish_s - raw0.first_token_s) / (bench.output_len - 1)
    assert abs(np.median(tpot0) * 1e3 / data["median_tpot_ms"] - 1) > 0.1


@pytest.mark.parametrize("patch,msg", [
    (lambda d: d.pop("itls"), r"no per-request \['itls'\].*--save-detailed"),
    (lambda d: d["ttfts"].pop(), r"key 'ttfts': 119 entries, 'input_lens' has 120"),
    (lambda d: d.pop("start_times"), r"no start_times"),
])
def test_a_bench_without_the_detail_is_refused_in_one_line(tmp_path, patch, msg):
    data = json.loads(json.dumps(_bench_json(n=120)))
    patch(data)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=msg):
        bench_fit.read_bench(p)


def test_a_fit_worse_than_the_limit_says_so_and_writes_nothing(tmp_path):
    bench = tmp_path / "result.json"
    bench.write_text(json.dumps(_bench_json(n=40)))
    out = tmp_path / "cal.json"
    res = subprocess.run([str(KVCAP), "calibrate", "--from-bench", str(bench), "-o", str(out),
                          "--max-error-pct", "0"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 1, res.stderr
    assert "misses the bench's median TPOT by" in res.stderr and "no profile written" in res.stderr
    assert not out.exists()
