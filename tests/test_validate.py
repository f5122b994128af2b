"""`kvcap validate` (issue 8): a replay against the logged time series and client latencies. The
"production" log here is rendered from the replay itself with vLLM's exact stats format (reference
D2), independently of capacity.evidence.validate's resampling, so a perfect model scores ~0 error."""
import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from capacity.evidence.logs import ingest
from capacity.evidence.validate import validate
from replay.config import EngineConfig
from replay.results.store import write_run
from replay.run import replay
from traces.synth import synthesize

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "logs"
KVCAP = str(Path(sys.executable).with_name("kvcap"))
T0 = datetime(2025, 6, 1, 8, 0, 0)


def kvcap(*args):
    return subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def runs():
    trace = synthesize("poisson", rate_rps=4.0, duration_s=60, seed=1)
    v1 = replay(trace, EngineConfig(scheduler="v1", num_gpu_blocks_override=800, block_size=16))
    v0 = replay(trace, EngineConfig(scheduler="v0", num_gpu_blocks_override=800, preemption_mode="swap",
                                    on_swap_full="recompute"))
    return v1, v0


def state_at(steps: pl.DataFrame, t: float) -> dict:
    before = steps.filter(pl.col("start_s") <= t)
    return before.row(-1, named=True) if before.height else None


def render_log(run, *, era: str, every_s: float, lead_s: float = 0.0) -> str:
    """vLLM stats lines for the replay, the first at replay time -lead_s."""
    steps, ev = run.steps.sort("start_s"), run.events
    pre_t = ev.filter(pl.col("kind").str.starts_with("preempt_"))["t_s"].to_numpy()
    gpu, cpu = run.run["num_gpu_blocks"], run.run["num_cpu_blocks"]
    lines, t = [], -lead_s
    while t <= run.run["sim_seconds"] + every_s:
        s = state_at(steps, t)
        r, w, sw = (s["num_running"], s["num_waiting"], s["num_swapped"]) if s else (0, 0, 0)
        g = 100 * s["gpu_blocks_used"] / gpu if s else 0.0
        c = 100 * s["cpu_blocks_used"] / cpu if s and cpu else 0.0
        p = int(((pre_t > t - every_s) & (pre_t <= t)).sum())
        stamp = (T0 + timedelta(seconds=t + lead_s)).strftime("%m-%d %H:%M:%S")
        if era == "v0":
            lines.append(f"INFO {stamp} metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation "
                         f"throughput: 0.0 tokens/s, Running: {r} reqs, Swapped: {sw} reqs, Pending: {w} reqs, "
                         f"GPU KV cache usage: {g:.1f}%, CPU KV cache usage: {c:.1f}%.")
        else:
            extra = f", Preemptions: {p}" if p else ""
            lines.append(f"(APIServer pid=1) INFO {stamp} [loggers.py:248] Engine 000: Avg prompt throughput: "
                         f"0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: {r} reqs, Waiting: "
                         f"{w} reqs{extra}, GPU KV cache usage: {g:.1f}%, Prefix cache hit rate: 0.0%")
        t += every_s
    return "\n".join(lines) + "\n"


def client_json(run) -> dict:
    """A benchmark results file whose TTFTs / ITLs are the replay's own (one request per row)."""
    req = run.requests.filter(pl.col("status") == "finished").sort("arrival_s")
    ttft = (req["first_token_s"] - req["arrival_s"]).to_list()
    return {"date": (T0 + timedelta(seconds=60)).strftime("%Y%m%d-%H%M%S"), "duration": 60.0,
            "ttfts": ttft, "itls": [[] for _ in ttft], "start_times": req["arrival_s"].to_list(),
            "input_lens": req["prompt_tokens"].to_list(), "output_lens": req["output_tokens"].to_list()}


@pytest.fixture(scope="module")
def db(runs, tmp_path_factory):
    v1, v0 = runs
    d = tmp_path_factory.mktemp("v")
    path = d / "ev.duckdb"
    for r in runs:
        write_run(path, r.tables())
    (d / "v1.log").write_text(render_log(v1, era="v1", every_s=10.0))
    (d / "v0.log").write_text(render_log(v0, era="v0", every_s=5.0))
    (d / "v1_late.log").write_text(render_log(v1, era="v1", every_s=10.0, lead_s=30.0))
    (d / "bench.json").write_text(json.dumps(client_json(v1)))
    ingest([d / "v1.log", d / "v0.log", d / "v1_late.log", d / "bench.json"], path, year=2025)
    return path


def test_v1_replay_against_its_own_log_has_no_gauge_or_preemption_error(runs, db):
    v1, _ = runs
    v = validate(db, v1.run_id, source="v1.log", client="bench.json")
    assert v.intervals >= 7
    for m in ("running", "waiting", "preemptions"):
        assert v.metrics[m].mae == 0.0, m
    assert v.metrics["preemptions"].log_mean > 0                     # the run does preempt
    assert v.metrics["gpu_kv_usage"].mae <= 0.0005 + 1e-12           # the log rounds to 0.1 %
    assert v.metrics["swapped"].n == 0                               # V1 logs no swapped count
    assert v.latency["ttft_p99_s"].error == pytest.approx(0.0, abs=1e-6)
    assert v.latency["ttft_p50_s"].relative_error == pytest.approx(0.0, abs=1e-6)


def test_v0_swap_replay_against_its_own_log(runs, db):
    _, v0 = runs
    v = validate(db, v0.run_id, source="v0.log")
    for m in ("running", "waiting", "swapped"):
        assert v.metrics[m].mae == 0.0, m
    assert v.metrics["cpu_kv_usage"].mae <= 0.0005 + 1e-12


def test_offset_aligns_a_log_that_starts_earlier(runs, db):
    v1, _ = runs
    wrong = validate(db, v1.run_id, source="v1_late.log")
    right = validate(db, v1.run_id, source="v1_late.log", offset_s=30.0)
    assert wrong.metrics["running"].mae > 0 and wrong.metrics["running"].relative_error > 0
    assert right.metrics["running"].mae == 0.0 and right.metrics["preemptions"].mae == 0.0


def test_replay_is_resampled_to_log_intervals(runs, db):
    v1, _ = runs
    v = validate(db, v1.run_id, source="v1.log")
    pre = v.series.filter(pl.col("metric") == "preemptions")
    n_events = v1.events.filter(pl.col("kind").str.starts_with("preempt_")).height
    assert pre["replay"].sum() == n_events and pre["log"].sum() == n_events
    assert np.all(np.diff(pre["t_s"].to_numpy()) == 10.0)


def test_cli_validate_json_and_errors(runs, db):
    v1, _ = runs
    res = kvcap("validate", "--db", db, "--run", v1.run_id, "--source", "v1.log", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"run_id", "db", "source", "engine", "offset_s", "log_start", "intervals", "metrics",
            "latency"} <= out.keys()
    assert {"running", "waiting", "swapped", "gpu_kv_usage", "preemptions"} <= out["metrics"].keys()
    assert {"n", "mae", "relative_error", "bias"} <= out["metrics"]["running"].keys()
    assert {"ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s"} <= out["latency"].keys()
    assert kvcap("validate", "--db", db, "--run", v1.run_id, "--source", "v1.log").returncode == 0
    for args, msg in ((("validate", "--db", db, "--run", "nope"), "is not in"),
                      (("validate", "--db", db, "--run", v1.run_id), "pick one with --source"),
                      (("validate", "--db", db, "--run", v1.run_id, "--source", "v1.log", "--offset-s", "1e6"),
                       "do not overlap")):
        bad = kvcap(*args)
        assert bad.returncode == 2 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_validate_against_the_fixture_log(tmp_path):
    """The shipped V0 fixture log against a replay of a similar load (smoke: numbers, no crash)."""
    db = tmp_path / "ev.duckdb"
    ingest([DATA / "v0_server.log", DATA / "bench_v0.json"], db)
    run = replay(synthesize("poisson", rate_rps=2.0, duration_s=120, seed=3),
                 EngineConfig(scheduler="v0", num_gpu_blocks_override=600, preemption_mode="swap",
                              on_swap_full="recompute"))
    write_run(db, run.tables())
    v = validate(db, run.run_id)
    assert v.intervals == 24 and v.metrics["running"].n == 24
    assert v.metrics["preemptions"].n == 18       # V0 estimate known 12:00:05-12:01:30
    assert v.latency["tbt_p99_s"].client is not None and v.latency["tbt_p99_s"].replay is not None
