"""Replay vs. production from Prometheus (issue 17, item 4), and `kvcap replay --from-logs`.

The "production" scrapes are rendered from a replay with prometheus_client (vLLM 0.33's metric names
and buckets, as tests/data/prom), independently of capacity.evidence.promvalidate: a replay compared
with its own scrapes has no error and parts ways nowhere; a window given 10 extra preemptions is the
one divergence found."""
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from capacity.evidence.logs import ingest_files
from capacity.evidence.promvalidate import compare_prometheus
from replay.config import EngineConfig
from replay.results.store import write_run
from replay.run import replay
from traces.synth import synthesize

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
T0 = 1748764800.0          # 2025-06-01 08:00:00 UTC
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0]


def render_scrapes(run, folder: Path, *, every_s=10.0, lead_s=0.0, extra_preemptions: dict | None = None):
    """One /metrics file per scrape (named by its Unix time); the first at replay time -lead_s."""
    folder.mkdir(parents=True)
    reg, lab = CollectorRegistry(), ("model_name", "engine")
    g = {n: Gauge(n, n, lab, registry=reg) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                    "vllm:kv_cache_usage_perc")}
    c = {n: Counter(n, n, lab, registry=reg) for n in ("vllm:num_preemptions", "vllm:prompt_tokens",
                                                      "vllm:generation_tokens", "vllm:kv_offload_store_bytes",
                                                      "vllm:kv_offload_load_bytes")}
    ttft_h = Histogram("vllm:time_to_first_token_seconds", "ttft", lab, buckets=TTFT_BUCKETS, registry=reg)
    itl_h = Histogram("vllm:inter_token_latency_seconds", "itl", lab, buckets=ITL_BUCKETS, registry=reg)
    steps = run.steps.sort("start_s")
    end = (steps["start_s"] + steps["duration_s"]).to_numpy()
    pre = run.events.filter(pl.col("kind").str.starts_with("preempt_"))["t_s"].to_numpy()
    req = run.requests.filter(pl.col("first_token_s").is_not_null())
    first = req["first_token_s"].to_numpy()
    gpu = run.run["num_gpu_blocks"]
    m, e = "m", "0"
    t, prev, k = -lead_s, -np.inf, 0
    while t <= run.run["sim_seconds"] + every_s:
        before = steps.filter(pl.col("start_s") <= t)
        s = before.row(-1, named=True) if before.height else None
        g["vllm:num_requests_running"].labels(m, e).set(s["num_running"] if s else 0)
        g["vllm:num_requests_waiting"].labels(m, e).set(s["num_waiting"] if s else 0)
        g["vllm:kv_cache_usage_perc"].labels(m, e).set(s["gpu_blocks_used"] / gpu if s else 0.0)
        c["vllm:num_preemptions"].labels(m, e).inc(int(((pre > prev) & (pre <= t)).sum())
                                                  + (extra_preemptions or {}).get(k, 0))
        done = (end > prev) & (end <= t)
        c["vllm:prompt_tokens"].labels(m, e).inc(int(steps["num_prefill_tokens"].to_numpy()[done].sum()))
        c["vllm:generation_tokens"].labels(m, e).inc(int(steps["num_decode_tokens"].to_numpy()[done].sum()))
        bpb = run.run["kv_bytes_per_block"] * run.run["tp"]
        c["vllm:kv_offload_store_bytes"].labels(m, e).inc(int(steps["offload_store_blocks"].to_numpy()[done].sum()) * bpb)
        c["vllm:kv_offload_load_bytes"].labels(m, e).inc(int(steps["offload_load_blocks"].to_numpy()[done].sum()) * bpb)
        for x in (req["first_token_s"] - req["arrival_s"]).to_numpy()[(first > prev) & (first <= t)]:
            ttft_h.labels(m, e).observe(float(x))
        for d, n in zip(steps["duration_s"].to_numpy()[done], steps["num_decode_tokens"].to_numpy()[done]):
            for _ in range(int(n)):
                itl_h.labels(m, e).observe(float(d))
        (folder / f"{T0 + lead_s + t:.0f}.prom").write_text(generate_latest(reg).decode())
        prev, t, k = t, t + every_s, k + 1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("pv")
    trace = synthesize("poisson", rate_rps=4.0, duration_s=60, seed=1)
    # V1 with CPU KV offloading: prompt blocks are written through, resumes load them back
    run = replay(trace, EngineConfig(scheduler="v1", num_gpu_blocks_override=500, block_size=16,
                                     kv_offloading_size=1.0))
    db = d / "ev.duckdb"
    write_run(db, run.tables())
    render_scrapes(run, d / "same")
    render_scrapes(run, d / "late", lead_s=30.0)
    render_scrapes(run, d / "extra", extra_preemptions={3: 10})
    rep = ingest_files([d / "same", d / "late", d / "extra"], db, window_s=10.0)
    assert rep.skipped == []
    return db, run


def test_a_replay_against_its_own_scrapes_has_no_error(setup):
    db, run = setup
    assert run.events.filter(pl.col("kind").str.starts_with("preempt_")).height > 0   # something to compare
    c = compare_prometheus(db, run.run["run_id"], server="same")
    assert c.divergences == [] and c.windows >= 6
    assert run.steps["offload_store_blocks"].sum() > 0 and run.steps["offload_load_blocks"].sum() > 0
    for name in ("running", "waiting", "gpu_kv_usage", "preemptions", "prompt_throughput_tps",
                 "generation_throughput_tps", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                 "offload_store_bytes", "offload_load_bytes"):
        m = c.metrics[name]
        assert m.n > 0 and m.mae == pytest.approx(0.0, abs=1e-9), name


def test_offset_lines_up_a_server_that_started_earlier(setup):
    db, run = setup
    ok = compare_prometheus(db, run.run["run_id"], server="late", offset_s=30.0)
    assert ok.metrics["running"].mae == pytest.approx(0.0, abs=1e-9) and ok.divergences == []
    off = compare_prometheus(db, run.run["run_id"], server="late", offset_s=0.0)
    assert off.metrics["running"].mae > 0


def test_the_window_with_extra_preemptions_is_where_they_part(setup):
    db, run = setup
    c = compare_prometheus(db, run.run["run_id"], server="extra")
    (d,) = c.divergences
    assert (d.metric, d.windows, d.max_abs_error) == ("preemptions", 1, 10.0)
    assert (d.from_s, d.to_s) == (T0 + 20.0, T0 + 30.0)      # the interval ending at the 4th scrape
    assert c.metrics["preemptions"].bias == pytest.approx(-10.0 / c.metrics["preemptions"].n)
    s = c.series.filter((pl.col("metric") == "preemptions") & pl.col("flagged"))
    assert s.height == 1 and s["production"][0] - s["replay"][0] == 10.0


def test_cli_validate_prometheus_json_and_errors(setup):
    db, run = setup
    res = subprocess.run([KVCAP, "validate", "--db", str(db), "--run", run.run["run_id"], "--prometheus",
                          "--server", "extra", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"run_id", "server", "engine", "offset_s", "window_s", "windows", "metrics", "divergences"} <= out.keys()
    assert [d["metric"] for d in out["divergences"]] == ["preemptions"]
    bad = subprocess.run([KVCAP, "validate", "--db", str(db), "--run", run.run["run_id"], "--prometheus"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--server" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_replay_from_logs_takes_the_logged_gpu_blocks(tmp_path):
    logs = tmp_path / "logs.duckdb"
    ingest_files([ROOT / "tests" / "data" / "logs" / "public" / "v1_lmcache1739_enginecore_kv.log"], logs, year=2025)
    db = tmp_path / "r.duckdb"
    res = subprocess.run([KVCAP, "replay", str(ROOT / "tests" / "data" / "logs" / "bench_v0.json"), "--db", str(db),
                          "--from-logs", str(logs), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)["engine_from_logs"]
    # "GPU KV cache size: 42,656 tokens" / the replay's block size (64: vLLM 0.34 by default)
    assert (facts["num_gpu_blocks"], facts["line"]) == (42656 // 64, 3) and "42,656" in facts["derived"]
    with duckdb.connect(str(db), read_only=True) as con:
        (blocks,), = con.execute("SELECT num_gpu_blocks FROM runs").fetchall()
    assert blocks == 42656 // 64
    both = subprocess.run([KVCAP, "replay", str(ROOT / "tests" / "data" / "logs" / "bench_v0.json"), "--db",
                           str(db), "--from-logs", str(logs), "--num-gpu-blocks-override", "100"],
                          capture_output=True, text=True, cwd=ROOT)
    assert both.returncode == 2 and "--num-gpu-blocks-override" in both.stderr


def test_report_section_and_chart(setup, tmp_path):
    from capacity.analyses.stability import stability
    from capacity.report.render import write_report
    from capacity.report.sections import production_section
    from test_report import recommendation
    db, run = setup
    c = compare_prometheus(db, run.run["run_id"], server="extra")
    sec = production_section(c)
    assert sec.title == "Replay vs. production (Prometheus)" and "preemptions: 1 window(s) from 20 s" in sec.body
    spec = sec.charts[0].chart.to_dict()
    assert spec["spec"]["layer"][1]["mark"]["color"] == "#d62728"
    index = write_report(tmp_path, title="t", trace_summary={"requests": run.requests.height}, run=run,
                         sizing=None, modes=None, recommendation=recommendation(()),
                         stability=stability(run.tables()), extra_sections=[sec])
    assert "Replay vs. production (Prometheus)" in index.read_text()
    assert (tmp_path / "evidence-prometheus.png").stat().st_size > 1000


def test_report_evidence_db_must_exist(tmp_path):
    res = subprocess.run([KVCAP, "report", "-o", str(tmp_path / "r"), "--evidence-db", str(tmp_path / "no.duckdb")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "--evidence-db" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
