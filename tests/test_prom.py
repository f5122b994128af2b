"""Prometheus evidence (issue 17, items 1 and 6): `/metrics` scrapes of vLLM 0.33 (a folder; a
concatenated file with time lines) and a `query_range` export -> prom_samples and prom_windows.
Fixtures: tests/data/prom, written by make_prom_fixtures.py with prometheus_client from vLLM's own
metric names, types and buckets; scenario.json is their ground truth."""
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

from capacity.evidence.logs import detect_kind, ingest_files
from capacity.evidence.promparse import PromFormatError, parse_query_range, parse_scrape_file, split_scrapes
from capacity.evidence.promseries import histogram_quantile

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "tests" / "data" / "prom"
FOLDER, CONCAT, QR = PROM / "scrapes" / "server-a", PROM / "server-b.prom", PROM / "query_range.json"
TRUTH = json.loads((PROM / "scenario.json").read_text())
T0, STEP, N = TRUTH["t0"], TRUTH["step_s"], TRUTH["scrapes"]
KVCAP = str(Path(sys.executable).with_name("kvcap"))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("prom") / "ev.duckdb"
    rep = ingest_files([FOLDER, CONCAT, QR], path, window_s=10.0)
    assert rep.skipped == [] and [r.kind for r in rep.files] == ["prometheus"] * 3
    return path


def win(db, server, metric, stat, engine="0"):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT window_start_s, value FROM prom_windows WHERE server = ? AND metric = ? "
                           "AND stat = ? AND engine = ? ORDER BY window_start_s",
                           [server, metric, stat, engine]).fetchall()


def truth(server, engine, key):
    return [TRUTH["intervals"][f"{server}/{engine}/{k}"][key] for k in range(N)]


def test_detection_of_the_three_shapes():
    assert [detect_kind(p) for p in (FOLDER, CONCAT, QR)] == ["prometheus"] * 3


def test_counter_increase_per_window_matches_what_was_added(db):
    for engine in ("0", "1"):
        got = win(db, "server-a", "vllm:num_preemptions_total", "increase", engine)
        assert [t for t, _ in got] == [T0 + k * STEP for k in range(N)]
        added = truth("server-a", engine, "preemptions")
        # the first scrape has no predecessor: no increase, not 0
        assert [v for _, v in got] == [None, *map(float, added[1:])]
    with duckdb.connect(str(db), read_only=True) as con:
        spans = con.execute("SELECT from_s, to_s FROM prom_windows WHERE server = 'server-a' AND engine = '0' "
                            "AND metric = 'vllm:num_preemptions_total' AND stat = 'increase' "
                            "ORDER BY window_start_s").fetchall()
    # what a window's increase covers: from the scrape before it to its own scrape
    assert spans[1:] == [(T0 + (k - 1) * STEP, T0 + k * STEP) for k in range(1, N)]
    rate = win(db, "server-a", "vllm:prompt_tokens_total", "rate_per_s")
    assert [v for _, v in rate][1:] == pytest.approx([x / 10.0 for x in truth("server-a", "0", "prompt_tokens")[1:]])


def test_counter_reset_at_a_restart_counts_from_zero(db):
    restart = TRUTH["restart_before_scrape"]["server-b"]
    got = [v for _, v in win(db, "server-b.prom", "vllm:generation_tokens_total", "increase")]
    added = truth("server-b", "0", "generation_tokens")
    assert got[restart] == added[restart] and got[1:] == [float(x) for x in added[1:]]


def test_gauges_last_and_max(db):
    got = win(db, "server-a", "vllm:num_requests_running", "last")
    assert [v for _, v in got] == [float(x) for x in truth("server-a", "0", "running")]
    kv = win(db, "server-a", "vllm:kv_cache_usage_perc", "max", "1")
    assert [v for _, v in kv] == pytest.approx(truth("server-a", "1", "kv_cache_usage_perc"))


def test_histogram_quantiles_count_and_mean_per_window(db):
    k = 4       # the window with the hand-placed observations (make_prom_fixtures.KNOWN_TTFT)
    obs = truth("server-a", "0", "ttft")[k]
    p50 = dict(win(db, "server-a", "vllm:time_to_first_token_seconds", "p50"))[T0 + k * STEP]
    assert p50 == pytest.approx(0.06 + 0.02 * (5 - 4) / 6)
    count = dict(win(db, "server-a", "vllm:time_to_first_token_seconds", "count"))[T0 + k * STEP]
    mean = dict(win(db, "server-a", "vllm:time_to_first_token_seconds", "mean"))[T0 + k * STEP]
    assert count == len(obs) == 10 and mean == pytest.approx(sum(obs) / len(obs))
    # every window: the count is the number of observations of that interval
    counts = [v for _, v in win(db, "server-a", "vllm:time_to_first_token_seconds", "count", "1")]
    assert counts[1:] == [float(len(x)) for x in truth("server-a", "1", "ttft")[1:]]


def test_query_range_servers_by_instance_and_the_same_numbers(db):
    with duckdb.connect(str(db), read_only=True) as con:
        servers = {r[0] for r in con.execute("SELECT DISTINCT server FROM prom_windows").fetchall()}
    assert servers == {"server-a", "server-b.prom", "10.0.0.1:8000", "10.0.0.2:8000"}
    a = win(db, "10.0.0.1:8000", "vllm:num_preemptions_total", "increase", "1")
    assert a == win(db, "server-a", "vllm:num_preemptions_total", "increase", "1")
    q = win(db, "10.0.0.1:8000", "vllm:time_to_first_token_seconds", "p50")
    f = win(db, "server-a", "vllm:time_to_first_token_seconds", "p50")
    assert [t for t, _ in q] == [t for t, _ in f] and [v for _, v in q] == pytest.approx([v for _, v in f])


def test_cli_json_and_idempotent_reingest(tmp_path):
    path = tmp_path / "ev.duckdb"
    for _ in range(2):
        res = subprocess.run([KVCAP, "logs", str(FOLDER), str(QR), "--db", str(path), "--json", "--window-s", "30"],
                             capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    with duckdb.connect(str(path), read_only=True) as con:
        n, = con.execute("SELECT count(*) FROM prom_samples").fetchone()
        w, = con.execute("SELECT DISTINCT window_s FROM prom_windows").fetchone()
    assert n == out["prom_samples"] and w == 30.0


def test_histogram_quantile_edges():
    le = [0.1, 0.5, float("inf")]
    assert histogram_quantile(0.5, le, [0, 0, 0]) is None
    assert histogram_quantile(0.99, le, [1, 2, 10]) == 0.5            # in +Inf: highest finite bound
    assert histogram_quantile(0.5, le, [4, 8, 8]) == pytest.approx(0.1)
    assert histogram_quantile(0.25, le, [4, 8, 8]) == pytest.approx(0.05)


def test_bad_prometheus_input_is_one_line(tmp_path):
    no_time = tmp_path / "metrics.txt"
    no_time.write_text((FOLDER / f"{T0}.prom").read_text())     # the time was in the name only
    with pytest.raises(PromFormatError, match="no scrape time"):
        parse_scrape_file(no_time, source=no_time.name)
    rated = tmp_path / "rate.json"
    rated.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix",
                                 "result": [{"metric": {"instance": "x"}, "values": [[1, "2"]]}]}}))
    with pytest.raises(PromFormatError, match="no __name__"):
        parse_query_range(rated, source=rated.name)
    rep = ingest_files([rated, CONCAT], tmp_path / "ev.duckdb")
    assert [r.source_file for r in rep.files] == [CONCAT.name]
    assert "no __name__" in rep.skipped[0].reason and "\n" not in rep.skipped[0].reason


def test_time_lines_split_concatenated_scrapes():
    parts = split_scrapes("# 1747742400\na 1\n# scrape_time: 2025-05-20T12:00:10Z\na 2\n")
    assert [t for t, _ in parts] == [1747742400.0, 1747742410.0]


def test_swap_sizing_from_v0_prometheus_gauges(tmp_path):
    """V0 exports vllm:num_requests_swapped and vllm:cpu_cache_usage_perc: their peak sizes swap."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    from capacity.evidence.logs_swap import size_swap_from_logs
    from replay.config import EngineConfig
    folder = tmp_path / "v0-server"
    folder.mkdir()
    reg = CollectorRegistry()
    sw = Gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", ["model_name"], registry=reg)
    cpu = Gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.", ["model_name"],
                registry=reg)
    for k, (n, u) in enumerate(((0, 0.0), (7, 0.42), (3, 0.1))):
        sw.labels("m").set(n)
        cpu.labels("m").set(u)
        (folder / f"{T0 + 15 * k}.prom").write_text(generate_latest(reg).decode())
    db = tmp_path / "ev.duckdb"
    ingest_files([folder], db)
    s = size_swap_from_logs(db, EngineConfig(model="llama-3.1-8b"), context_tokens=1000)
    assert (s.peak_swapped_requests, s.evidence, s.peak_cpu_kv_usage) == (7, "prometheus", 0.42)
    assert s.peak_source_file == "v0-server v0-server" and s.peak_at == "2025-05-20 12:00:15"
    assert s.peak_swapped_blocks == 7 * 63            # ceil(1000 / 16) blocks each
