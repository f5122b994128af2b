"""Preemption classification on constructed traces, and the generated Prometheus alert rule."""
import numpy as np
import polars as pl
import pytest
import yaml

from capacity.analyses.classify import alert_rule, classify
from replay.config import EngineConfig
from replay.run import replay

CFG = EngineConfig(num_gpu_blocks_override=400, block_size=16, max_num_seqs=64)   # 6,400 KV tokens


def trace(times, prompt=300, output=120, seed=0):
    rng = np.random.default_rng(seed)
    n = len(times)
    return pl.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "arrival_s": np.sort(times).astype(float),
        "prompt_tokens": rng.integers(prompt // 2, prompt * 3 // 2, n).astype(np.int32),
        "output_tokens": rng.integers(output // 2, output * 3 // 2, n).astype(np.int32),
        "priority": np.zeros(n, np.int32), "tenant": [None] * n,
        "prefix_hashes": pl.Series([None] * n, dtype=pl.List(pl.UInt64))})


def poisson(rate, start, end, seed):
    rng = np.random.default_rng(seed)
    k = rng.poisson(rate * (end - start))
    return rng.uniform(start, end, k)


@pytest.fixture(scope="module")
def light():
    return replay(trace(poisson(1, 0, 900, 1)), CFG).tables()


@pytest.fixture(scope="module")
def burst():
    t = np.concatenate([poisson(1, 0, 900, 2), poisson(40, 420, 450, 3)])
    return replay(trace(t, seed=4), CFG).tables()


@pytest.fixture(scope="module")
def overload():
    return replay(trace(poisson(25, 0, 900, 5), seed=6), CFG).tables()


def test_light_load_is_none(light):
    c = classify(light)
    assert c.verdict == "none", c.evidence


def test_single_burst_is_peak_only(burst):
    c = classify(burst)
    assert c.windows_with_preemption > 0
    assert c.verdict == "peak-only", c.evidence
    assert "highest-load" in c.evidence


def test_sustained_overload_is_structural(overload):
    c = classify(overload)
    assert c.verdict == "structural", c.evidence
    assert c.preempted_windows_share > 0.5


def test_alert_rule_is_valid_prometheus_yaml_with_the_expected_expression(burst):
    rule = alert_rule(burst, model_name="llama")
    doc = yaml.safe_load(rule.yaml)
    rules = doc["groups"][0]["rules"]
    structural = next(r for r in rules if r["alert"] == "VllmPreemptionStructural")
    assert structural["expr"] == (f'increase(vllm:num_preemptions_total{{model_name="llama"}}[5m]) '
                                  f"> {rule.threshold}")
    assert rule.threshold > rule.normal_max_5m >= 1
    assert set(structural) >= {"alert", "expr", "for", "labels", "annotations"}


def test_alert_rule_passes_promtool_where_installed(burst, tmp_path):
    import shutil
    import subprocess
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); YAML checked above")
    p = tmp_path / "rules.yml"
    p.write_text(alert_rule(burst).yaml)
    res = subprocess.run([promtool, "check", "rules", str(p)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", ['x"}[5m]) > 0 or vector(1) #', "a: b", "line\nbreak", "tab\there",
                                  "back\\slash", "#comment", "- dash", "{brace}", "ünï"])
def test_any_model_name_gives_valid_yaml_and_a_closed_promql_string(burst, name):
    """Issue 13 item 3: a model name must never end the label selector nor break the YAML."""
    import json
    rule = alert_rule(burst, model_name=name)
    for r in yaml.safe_load(rule.yaml)["groups"][0]["rules"]:
        head, inner = r["expr"].split("{model_name=", 1)
        assert head == "increase(vllm:num_preemptions_total"
        literal, end = json.JSONDecoder().raw_decode(inner)    # Go/PromQL escapes = JSON's here
        assert literal == name
        assert inner[end:] in (f"}}[5m]) > {rule.threshold}", "}[5m]) > 0")


def test_no_preemption_free_window_with_decode_is_structural_not_a_crash():
    """Preemption in the burst's windows only (a third of them, all at or next to the peak), and
    no decode step in any other window: no TBT baseline to recover to. It used to format None."""
    requests = pl.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0, 130.0, 190.0, 250.0, 310.0]})
    events = pl.DataFrame({"kind": ["preempt_recompute", "preempt_recompute"], "t_s": [5.0, 65.0]})
    steps = pl.DataFrame({"start_s": [5.0, 6.0, 65.0, 66.0], "duration_s": [0.05] * 4,
                          "num_decode_tokens": [5, 5, 3, 3]})
    c = classify({"requests": requests, "events": events, "steps": steps})
    assert (c.windows, c.windows_with_preemption, c.outside_peak_windows) == (6, 2, 0)
    assert c.baseline_tbt_p99_s is None and c.worst_recovery_s is None
    assert c.verdict == "structural"
    assert "no TBT baseline to recover to" in c.evidence
