"""`kvcap trace info|synth|convert`: exit codes, the JSON contract (DESIGN §7), no half-written files."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from capacity.cli import app
from traces import loaders
from traces.loaders import load_trace
from traces.synth import synthesize

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")
runner = CliRunner()
JSON_KEYS = {"requests", "duration_s", "mean_rps", "peak_rpm", "peak_60s", "prompt_tokens", "output_tokens"}


def kvcap(*args: str):
    return runner.invoke(app, ["trace", *args])


def assert_bad_input(result) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcap: error: ")
    assert result.stdout == ""


@needs_shared
def test_info_json_has_the_contract_keys_and_readme_numbers():
    result = kvcap("info", str(SHARED / "AzureLLMInferenceTrace_conv.csv"), "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert JSON_KEYS <= set(info)
    for key in ("prompt_tokens", "output_tokens"):
        assert {"mean", "p50", "p90", "p99", "max"} <= set(info[key])
    assert (info["requests"], info["peak_rpm"], info["peak_60s"]) == (19366, 507, 522)
    assert info["prompt_tokens"]["p99"] == 4142


@needs_shared
def test_info_table_for_mooncake_shows_prefix_reuse():
    result = kvcap("info", str(SHARED / "conversation_trace.jsonl"))
    assert result.exit_code == 0, result.output
    for text in ("12,031", "288,500", "36.6 %", "37.4 %", "260"):
        assert text in result.stdout


def test_info_with_map_and_time_unit(tmp_path):
    f = tmp_path / "g.csv"
    f.write_text("ms,in,out\n0,3,4\n1500,5,6\n")
    result = kvcap("info", str(f), "--map", "ms=arrival_s", "--map", "in=prompt_tokens",
                   "--map", "out=output_tokens", "--time-unit", "ms", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["duration_s"] == 1.5


@pytest.mark.parametrize("content,needle", [("", "empty"), ("a,b\n1,2\n", "unknown trace layout"),
                                            ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                             "2023-11-16 18:15:46.6805900,x,1\n", "line 2")])
def test_info_bad_input_exits_2_with_one_line(tmp_path, content, needle):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    result = kvcap("info", str(f), "--json")
    assert_bad_input(result)
    assert needle in result.stderr


def test_synth_writes_a_deterministic_canonical_trace(tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (a, b):
        result = kvcap("synth", "poisson", "-o", str(out), "--seed", "5", "--duration-s", "120",
                       "--rate", "4", "--json")
        assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == len(load_trace(a))
    assert load_trace(a).equals(load_trace(b), null_equal=True)
    assert load_trace(a).equals(synthesize("poisson", seed=5, duration_s=120, rate_rps=4), null_equal=True)


def test_synth_default_scenario_and_params(tmp_path):
    out = tmp_path / "fc.parquet"
    result = kvcap("synth", "-o", str(out), "--param", "surge_factor=3", "--duration-s", "700")
    assert result.exit_code == 0, result.output
    assert load_trace(out).equals(synthesize("flash-crowd", surge_factor=3.0, duration_s=700), null_equal=True)


def test_synth_bad_parameter_leaves_no_file(tmp_path):
    out = tmp_path / "x.parquet"
    assert_bad_input(kvcap("synth", "gamma", "-o", str(out), "--param", "cv=lots"))
    assert_bad_input(kvcap("synth", "tsunami", "-o", str(out)))
    assert list(tmp_path.iterdir()) == []


@needs_shared
def test_convert_writes_the_canonical_form(tmp_path):
    out = tmp_path / "conv.parquet"
    result = kvcap("convert", str(SHARED / "AzureLLMInferenceTrace_code.csv"), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 8819
    assert load_trace(out).equals(load_trace(SHARED / "AzureLLMInferenceTrace_code.csv"), null_equal=True)


def test_convert_bad_input_leaves_no_output(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 6}\n{"timestamp": 1,\n')
    out = tmp_path / "out.parquet"
    result = kvcap("convert", str(f), "-o", str(out))
    assert_bad_input(result)
    assert "line 2" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_write_that_fails_midway_leaves_no_file(tmp_path, monkeypatch):
    def broken(self, path, *args, **kwargs):
        Path(path).write_bytes(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    with pytest.raises(OSError):
        loaders.write_trace(synthesize("poisson", duration_s=10), tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_kvcap_script_runs(tmp_path):
    import subprocess
    import sys
    exe = Path(sys.executable).with_name("kvcap")
    if not exe.exists():
        pytest.skip("kvcap script not installed in this environment")
    f = tmp_path / "empty.csv"
    f.write_text("")
    proc = subprocess.run([str(exe), "trace", "info", str(f)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("kvcap: error: ") and proc.stdout == ""
