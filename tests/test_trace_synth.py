"""Synthetic scenarios: deterministic, canonical, and shaped as their names promise."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from traces import synth
from traces.lengths import LOGNORMAL_CONV, shared_traces_dir
from traces.schema import SCHEMA, TraceError

REPO = Path(__file__).resolve().parents[1]


def rate_between(df: pl.DataFrame, a: float, b: float) -> float:
    t = df["arrival_s"]
    return int(((t >= a) & (t < b)).sum()) / (b - a)


@pytest.mark.parametrize("scenario", sorted(synth.SCENARIOS))
def test_every_scenario_is_canonical_and_deterministic(scenario):
    a = synth.synthesize(scenario, duration_s=300)
    assert a.schema == pl.Schema(SCHEMA)
    assert a["request_id"].to_list() == list(range(len(a)))
    assert a["arrival_s"][0] == 0.0 and a["arrival_s"].is_sorted()
    assert (a["prompt_tokens"] > 0).all() and (a["output_tokens"] > 0).all()
    assert a.equals(synth.synthesize(scenario, duration_s=300), null_equal=True)
    assert not a.equals(synth.synthesize(scenario, duration_s=300, seed=1), null_equal=True)


def _digest() -> str:
    df = synth.default_trace()
    return hashlib.sha256(df.write_ipc(None).getvalue()).hexdigest()


def test_default_scenario_is_identical_across_processes_and_needs_no_shared_data(tmp_path):
    assert synth.DEFAULT_SCENARIO == "flash-crowd"
    code = ("from tests_digest import digest; print(digest())")
    (tmp_path / "tests_digest.py").write_text(
        "import hashlib\nfrom traces import synth\n"
        "def digest():\n    return hashlib.sha256(synth.default_trace().write_ipc(None).getvalue()).hexdigest()\n")
    env = dict(os.environ, KVCAP_SHARED_TRACES=str(tmp_path / "missing"),
               PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == _digest()


def test_flash_crowd_doubles_within_one_minute_then_returns():
    p = synth.FlashCrowdParams()
    df = synth.synthesize("flash-crowd", p)
    before = rate_between(df, p.surge_start_s - 300, p.surge_start_s)
    ramp_end = p.surge_start_s + p.ramp_s
    assert p.ramp_s <= 60
    held = rate_between(df, ramp_end, ramp_end + p.hold_s)
    after = rate_between(df, ramp_end + p.hold_s + p.decay_s, p.duration_s)
    assert before == pytest.approx(p.rate_rps, rel=0.05)
    assert held / before == pytest.approx(2.0, rel=0.05)
    assert after == pytest.approx(p.rate_rps, rel=0.08)
    # the rate profile itself: base before, 2x one minute after the surge starts
    r = synth.flash_crowd_rate(np.array([p.surge_start_s - 1, p.surge_start_s + 60]), p)
    assert r.tolist() == [p.rate_rps, 2 * p.rate_rps]


def test_poisson_rate_and_gamma_burstiness():
    pois = synth.synthesize("poisson", rate_rps=20, duration_s=2000)
    n = len(pois)
    assert abs(n - 40_000) < 4 * np.sqrt(40_000)
    gaps = np.diff(pois["arrival_s"].to_numpy())
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    gam = synth.synthesize("gamma", rate_rps=20, duration_s=2000, cv=3.0)
    gaps = np.diff(gam["arrival_s"].to_numpy())
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)
    assert len(gam) / 2000 == pytest.approx(20, rel=0.15)


def test_diurnal_peaks_mid_period():
    p = synth.DiurnalParams()
    df = synth.synthesize("diurnal", p)
    trough = rate_between(df, 0, 300)
    peak = rate_between(df, 1650, 1950)
    assert peak / trough > 2.0  # (1 + 0.5) / (1 - 0.5) = 3 at the extremes


def test_priority_mix_shares_the_instance():
    p = synth.PriorityMixParams()
    df = synth.synthesize("priority-mix", p)
    chat = df.filter(pl.col("tenant") == "interactive")
    batch = df.filter(pl.col("tenant") == "batch")
    assert len(chat) + len(batch) == len(df) and len(batch) > 0
    assert (chat["priority"] == 0).all() and (batch["priority"] >= 1).all()
    assert batch["prompt_tokens"].mean() > 2 * chat["prompt_tokens"].mean()
    assert batch["output_tokens"].mean() > chat["output_tokens"].mean()
    with pytest.raises(TraceError, match="batch_priority"):
        synth.synthesize("priority-mix", batch_priority=0)


def test_lognormal_fit_matches_the_conv_trace_medians_and_prompt_mean():
    rng = np.random.default_rng(0)
    prompt, output = LOGNORMAL_CONV.sample(200_000, rng)
    assert np.median(prompt) == pytest.approx(1020, rel=0.02)
    assert np.median(output) == pytest.approx(129, rel=0.03)
    assert prompt.mean() == pytest.approx(1154.7, rel=0.02)
    assert prompt.max() <= 14_050 and output.max() <= 1_000


@pytest.mark.skipif(not shared_traces_dir().is_dir(), reason="../shared/traces not present")
def test_empirical_lengths_are_real_pairs():
    from traces.loaders import load_trace
    real = load_trace(shared_traces_dir() / "AzureLLMInferenceTrace_code.csv")
    pairs = set(zip(real["prompt_tokens"].to_list(), real["output_tokens"].to_list()))
    df = synth.synthesize("poisson", duration_s=60, lengths="azure-code")
    assert set(zip(df["prompt_tokens"].to_list(), df["output_tokens"].to_list())) <= pairs


def test_bad_parameters_are_named():
    with pytest.raises(TraceError, match="no parameter 'nope'"):
        synth.make_params("poisson", nope=1)
    with pytest.raises(TraceError, match="unknown scenario"):
        synth.make_params("tsunami")
    with pytest.raises(TraceError, match="unknown lengths"):
        synth.synthesize("poisson", lengths="imaginary")
    assert synth.make_params("gamma", cv="4", seed="3") == synth.GammaParams(cv=4.0, seed=3)
