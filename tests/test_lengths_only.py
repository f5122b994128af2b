"""Lengths-only traces (issue 33): Vidur's arxiv-summarization and BWB layouts (prompt and output
token counts, no timestamps) are detected, refused without `--arrivals` (one line naming it),
and given seeded synthetic arrivals with it, on every command that loads a trace."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from capacity.cli import app
from traces.arrivals import parse_arrivals
from traces.loaders import load_trace, load_trace_with_report
from traces.schema import TraceError

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
# The header of Vidur's data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv
# and bwb_stats_llama2_tokenizer_filtered_v2.csv.
VIDUR_HEADER = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"
runner = CliRunner()


def kvcap(*args, check=True):
    res = subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "COLUMNS": "100"})
    if check:
        assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def arxiv(tmp_path_factory):
    """400 rows in Vidur's layout (lengths drawn like arxiv-summarization: long prompts)."""
    rng = np.random.default_rng(7)
    p = rng.integers(200, 4000, 400)
    o = rng.integers(20, 600, 400)
    path = tmp_path_factory.mktemp("lengths") / "arxiv_summarization_stats.csv"
    path.write_text(VIDUR_HEADER + "\n" + "".join(f"{a},{b},{a + b},{a / b}\n" for a, b in zip(p, o)))
    return path


def test_the_vidur_layout_is_detected_and_refused_without_arrivals(arxiv):
    with pytest.raises(TraceError, match=r"lengths only \(vidur_lengths layout.*--arrivals poisson:RATE"):
        load_trace(arxiv)
    res = kvcap("trace", "info", arxiv, check=False)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "--arrivals" in res.stderr and str(arxiv) in res.stderr


def test_arrivals_are_seeded_poisson_or_gamma_at_the_rate_asked(arxiv):
    a = load_trace(arxiv, arrivals=parse_arrivals("poisson:5", seed=1))
    b = load_trace(arxiv, arrivals=parse_arrivals("poisson:5", seed=1))
    c = load_trace(arxiv, arrivals=parse_arrivals("poisson:5", seed=2))
    assert a.equals(b) and not a["arrival_s"].equals(c["arrival_s"])
    raw = pl.read_csv(arxiv)
    assert a["prompt_tokens"].to_list() == raw["num_prefill_tokens"].to_list()   # file order
    assert a["output_tokens"].to_list() == raw["num_decode_tokens"].to_list()
    assert a["arrival_s"][0] == 0.0 and a["arrival_s"].is_sorted()
    assert a.height / a["arrival_s"].max() == pytest.approx(5, rel=0.15)
    g = load_trace(arxiv, arrivals=parse_arrivals("gamma:5:3", seed=1))["arrival_s"].diff().drop_nulls()
    assert g.std() / g.mean() == pytest.approx(3, rel=0.35)
    assert 1 / g.mean() == pytest.approx(5, rel=0.35)


def test_trace_info_says_the_layout_and_the_synthetic_arrivals(arxiv):
    info = json.loads(kvcap("trace", "info", arxiv, "--arrivals", "poisson:5", "--seed", "3",
                            "--json").stdout)
    assert info["format"] == "vidur_lengths" and info["layout_detected"] is True
    assert info["arrivals"] == "poisson:5 seed 3" and info["requests"] == 400
    table = kvcap("trace", "info", arxiv, "--arrivals", "poisson:5", "--seed", "3").stdout
    assert "vidur_lengths (detected)" in table and "synthesised: poisson:5 seed 3" in table


def test_kvcap_parquet_keeps_the_arrivals_in_its_metadata(arxiv, tmp_path):
    out = tmp_path / "arxiv.parquet"
    kvcap("trace", "convert", arxiv, "--arrivals", "gamma:4:2", "-o", out)
    meta = pl.read_parquet_metadata(out)
    assert meta["kvcap.arrivals"] == "gamma:4:2 seed 0" and meta["kvcap.source_format"] == "vidur_lengths"
    df, report = load_trace_with_report(out)
    assert report.format == "kvcap" and report.arrivals == "gamma:4:2 seed 0"
    assert df.equals(load_trace(arxiv, arrivals=parse_arrivals("gamma:4:2")))
    info = json.loads(kvcap("trace", "info", out, "--json").stdout)
    assert info["arrivals"] == "gamma:4:2 seed 0" and info["source_format"] == "vidur_lengths"
    # The Parquet has its own times now: --arrivals again is refused.
    res = kvcap("trace", "info", out, "--arrivals", "poisson:1", check=False)
    assert res.returncode == 2 and "has its own arrival times" in res.stderr


def test_replay_records_the_arrivals_and_the_parquet_replays_alike(arxiv, tmp_path):
    db = tmp_path / "k.duckdb"
    a = json.loads(kvcap("replay", arxiv, "--arrivals", "poisson:2", "--seed", "5", "--db", db,
                         "--json").stdout)
    assert a["arrivals"] == "poisson:2 seed 5" and a["requests_finished"] == 400
    pq = tmp_path / "a.parquet"
    kvcap("trace", "convert", arxiv, "--arrivals", "poisson:2", "--seed", "5", "-o", pq)
    b = json.loads(kvcap("replay", pq, "--db", db, "--json").stdout)
    assert b["run_id"] == a["run_id"] and b["arrivals"] == a["arrivals"]
    runs = json.loads(kvcap("runs", "--db", db, "--json").stdout)["runs"]
    assert [r["arrivals"] for r in runs] == ["poisson:2 seed 5"]


def test_a_generic_lengths_file_is_detected_too(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("prompt_tokens,output_tokens\n100,20\n200,30\n")
    df, report = load_trace_with_report(f, arrivals=parse_arrivals("poisson:1"))
    assert report.format == "lengths" and df["prompt_tokens"].to_list() == [100, 200]
    with pytest.raises(TraceError, match="lengths only"):
        load_trace(f)


@pytest.mark.parametrize("argv,needle", [
    (["--arrivals", "poisson"], "expected poisson:RATE or gamma:RATE:CV"),
    (["--arrivals", "gamma:5"], "expected poisson:RATE or gamma:RATE:CV"),
    (["--arrivals", "poisson:-2"], "RATE must be a finite number > 0"),
    (["--arrivals", "poisson:fast"], "must be numbers"),
    (["--seed", "3"], "--seed 3: seeds --arrivals"),
])
def test_bad_arrivals_are_one_line_naming_the_flag(arxiv, tmp_path, argv, needle):
    res = kvcap("replay", arxiv, "--db", tmp_path / "k.duckdb", *argv, check=False)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and needle in res.stderr
    assert not (tmp_path / "k.duckdb").exists()


def test_a_bad_length_names_its_line_and_column(tmp_path):
    f = tmp_path / "bwb_stats.csv"
    f.write_text(VIDUR_HEADER + "\n100,20,120,5\n200,-3,197,0\n")
    with pytest.raises(TraceError, match=r"line 3, column 'num_decode_tokens'"):
        load_trace(f, arrivals=parse_arrivals("poisson:1"))


def test_a_timed_trace_refuses_arrivals(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,10,2\n")
    with pytest.raises(TraceError, match="has its own arrival times"):
        load_trace(f, arrivals=parse_arrivals("poisson:1"))


# Every command that loads a trace takes --arrivals and --seed.
TRACE_COMMANDS = [["replay"], ["size-swap"], ["size-offload"], ["compare-modes"], ["report"],
                  ["tune"], ["headroom"], ["alerts"], ["fleet"], ["plan"], ["sweep"], ["calibrate"],
                  ["trace", "info"], ["trace", "convert"]]


@pytest.mark.parametrize("path", TRACE_COMMANDS, ids=" ".join)
def test_every_command_that_loads_a_trace_takes_arrivals(path):
    out = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "100"}).output
    assert "--arrivals" in out and "--seed" in out, path
