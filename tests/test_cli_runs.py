"""`kvcap replay`'s summary (deployment and verdict), `kvcap runs` (what tells runs apart, in 100
columns) and `kvcap export` (a run's tables as files), issue 33."""
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def kvcap(*args, check=True, columns=None):
    env = {**os.environ, **({"COLUMNS": str(columns)} if columns else {})}
    res = subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env)
    if check:
        assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Two replays of the first 300 Azure conv requests: one overloaded (600 GPU blocks), one
    at twice the rate with the default pool (sustainable)."""
    from traces.loaders import load_trace, write_trace
    d = tmp_path_factory.mktemp("runs")
    trace = d / "conv300.parquet"
    write_trace(load_trace(CONV).head(300), trace)
    path = d / "k.duckdb"
    over = json.loads(kvcap("replay", trace, "--db", path, "--json",
                            "--num-gpu-blocks-override", "600", "--block-size", "16").stdout)
    fine = json.loads(kvcap("replay", trace, "--db", path, "--json", "--rate-scale", "2",
                            "--max-num-seqs", "64").stdout)
    return {"path": path, "trace": trace, "over": over, "fine": fine}


def test_replay_json_names_the_deployment_and_the_verdict(db):
    over, fine = db["over"], db["fine"]
    assert over["verdict"] == "overloaded" and fine["verdict"] == "sustainable"
    assert over["status"] == "completed"          # the engine's run status (DESIGN §6) stays
    assert "queue grows" in over["verdict_evidence"]
    for s in (over, fine):
        assert s["model"] == "llama-3.1-8b" and s["gpu"] == "h100" and s["tensor_parallel_size"] == 1
        assert s["scheduler"] == "v1" and s["scheduler_loop"] == "async"
    assert over["num_gpu_blocks"] == 600 and fine["num_gpu_blocks"] > 600
    assert fine["offered_rps"] == pytest.approx(2 * over["offered_rps"])
    assert fine["rate_scale"] == 2.0 and over["rate_scale"] == 1.0


def test_replay_summary_says_overloaded_not_completed(db, tmp_path):
    res = kvcap("replay", db["trace"], "--db", tmp_path / "t.duckdb",
                "--num-gpu-blocks-override", "600", "--block-size", "16", columns=80)
    out = res.stdout
    assert res.returncode == 0
    assert f"run {db['over']['run_id']}: overloaded" in out and "completed" not in out
    for words in ("vLLM 0.34 (V1,", "16-token blocks),", "llama-3.1-8b / h100 / 1", "GPU 600 of 16 tokens",
                  "3.57 req/s"):
        assert words in out, words
    assert out.strip().splitlines()[-1].startswith("overloaded: serves")


def test_runs_tell_runs_apart_in_100_columns(db):
    res = kvcap("runs", "--db", db["path"], columns=100)
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 100
    header = next(line for line in lines if line.startswith("run "))
    for name in ("trace", "engine", "seqs", "tokens", "blocks", "req/s", "TTFT p99", "TBT p99",
                 "preempt", "verdict"):
        assert f" {name}" in header, name
    over = next(line for line in lines if line.startswith(db["over"]["run_id"][:8]))
    fine = next(line for line in lines if line.startswith(db["fine"]["run_id"][:8]))
    assert "overloaded" in over and "sustainable" in fine
    assert "×2" in fine and "×" not in over
    assert "conv300.parquet" in over and " 600 " in over and "0.34 async" in over
    narrow = kvcap("runs", "--db", db["path"], columns=80).stdout.splitlines()
    assert max(map(len, narrow)) <= 80
    assert any(line.startswith(db["over"]["run_id"][:8]) and "overloaded" in line for line in narrow)


def test_runs_json_has_the_replays_numbers(db):
    runs = {r["run_id"]: r for r in json.loads(kvcap("runs", "--db", db["path"], "--json").stdout)["runs"]}
    for s in (db["over"], db["fine"]):
        r = runs[s["run_id"]]
        assert r["verdict"] == s["verdict"]
        assert r["ttft_p99_s"] == pytest.approx(s["ttft_p99_s"])
        assert r["tbt_p99_s"] == pytest.approx(s["tbt_p99_s"])
        assert r["preemptions"] == s["preemptions_recompute"] + s["preemptions_swap"]
        assert r["rate_scale"] == s["rate_scale"] and r["num_gpu_blocks"] == s["num_gpu_blocks"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_round_trip(db, tmp_path, fmt):
    rid = db["over"]["run_id"]
    out = tmp_path / "export"
    res = json.loads(kvcap("export", rid[:8], "--db", db["path"], "-o", out, "--format", fmt,
                           "--json").stdout)
    assert res["run_id"] == rid
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{t}.{fmt}" for t in ("runs", "requests", "steps", "events", "stalls", "tbt"))
    read = pl.read_csv if fmt == "csv" else pl.read_parquet
    con = duckdb.connect(str(db["path"]), read_only=True)
    for table in ("requests", "events", "steps"):
        stored = con.sql(f"SELECT * FROM {table} WHERE run_id = '{rid}'").pl()
        got = read(out / f"{table}.{fmt}")
        assert got.height == stored.height == res["rows"][table]
        assert got.columns == stored.columns
        key = [c for c in ("request_id", "step", "seq") if c in got.columns]
        a, b = got.sort(key), stored.sort(key)
        for c in ("request_id", "first_token_s", "num_preemptions", "duration_s", "kind"):
            if c in a.columns:
                assert a[c].cast(pl.Utf8).to_list() == b[c].cast(pl.Utf8).to_list(), c
    con.close()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]     # no temp folder left


@pytest.mark.parametrize("args,needle", [
    (["nosuchrun"], "run 'nosuchrun' is not in"),
    (["RUN", "--format", "xlsx"], "--format 'xlsx': use csv or parquet"),
])
def test_export_bad_input_is_one_line(db, tmp_path, args, needle):
    args = [db["over"]["run_id"] if a == "RUN" else a for a in args]
    res = kvcap("export", *args, "--db", db["path"], "-o", tmp_path / "x", check=False)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and needle in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_an_existing_folder_with_files(db, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    res = kvcap("export", db["over"]["run_id"], "--db", db["path"], "-o", tmp_path / "x", check=False)
    assert res.returncode == 2 and "already exists" in res.stderr
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["keep.txt"]
