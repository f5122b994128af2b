"""Parsing production evidence (issue 8): vLLM server logs of both eras and client results, into
DuckDB (`kvcap logs`), and `kvcap size-swap --from-logs`. Fixtures: tests/data/logs (see its
make_fixtures.py: exact format strings of reference A5/D2)."""
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from capacity.evidence.clientparse import ClientFormatError, generic_tokens, parse_client_file, vllm_bench_tokens
from capacity.evidence.logparse import cumulative_at, parse_server_log, parse_stats_body, StatsLineError
from capacity.evidence.logs import detect_kind, ingest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "logs"
KVCAP = str(Path(sys.executable).with_name("kvcap"))
V0, V1_010, V1_014 = DATA / "v0_server.log", DATA / "v1_010_server.log", DATA / "v1_014_server.log"
BENCH, CSV, JSONL = DATA / "bench_v0.json", DATA / "client_generic.csv", DATA / "client_generic.jsonl"


def kvcap(*args):
    return subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def parse(path, year=2025):
    with open(path) as f:
        return parse_server_log(f, path.name, year)


# ---- server logs: good input --------------------------------------------------------------

def test_v0_log_stats_rows_fields_and_prefix_line():
    p = parse(V0)
    s = p.stats
    assert s.height == 24 and set(s["era"]) == {"v0"} and set(s["engine"]) == {0}
    first = s.row(0, named=True)
    assert first["time"] == datetime(2025, 5, 20, 12, 0, 5)
    assert (first["running"], first["swapped"], first["waiting"]) == (4, 0, 0)
    assert first["gpu_kv_usage"] == pytest.approx(0.102) and first["cpu_kv_usage"] == 0.0
    assert first["prompt_throughput_tps"] == 812.4 and first["generation_throughput_tps"] == 96.0
    assert first["prefix_cache_hit_rate"] == pytest.approx(0.4265)     # V0's second line
    assert first["interval_s"] is None and s["interval_s"][1] == 5.0
    peak = s.filter(pl.col("swapped") == s["swapped"].max()).row(0, named=True)
    assert (peak["swapped"], peak["time"], peak["cpu_kv_usage"]) == (6, datetime(2025, 5, 20, 12, 0, 50), pytest.approx(0.164))
    assert s["preemptions"].null_count() == s.height                   # V0 prints no count


def test_v0_noise_ansi_trailing_spaces_and_debug_lines_parse():
    s = parse(V0).stats
    times = s["time"].dt.strftime("%H:%M:%S").to_list()
    assert "12:00:25" in times and "12:00:45" in times                  # ANSI-coloured lines
    assert "12:01:40" in times                                          # trailing spaces
    assert s.filter(pl.col("time").dt.second() == 0).row(-1, named=True)["running"] == 0  # DEBUG when idle


def test_v0_rate_limited_warnings_with_cumulative_counter():
    w = parse(V0).preemptions
    assert w["cum_count"].to_list() == [1, 51, 101]
    assert w["mode"].to_list() == ["swap", "swap", "recompute"]
    assert w["time"].dt.strftime("%H:%M:%S").to_list() == ["12:00:37", "12:00:52", "12:01:31"]
    assert w["request_id"][0] == "8"


def test_v0_preemptions_estimated_from_the_counter():
    s = parse(V0).stats.with_columns(hms=pl.col("time").dt.strftime("%H:%M:%S"))
    est = dict(zip(s["hms"], s["preemptions_est"]))
    assert est["12:00:35"] == 0.0                     # before warning #1: none yet
    assert est["12:00:40"] == pytest.approx(11.0)     # 1 + 50 * 3/15 by 12:00:40
    assert est["12:01:35"] is None                    # after the last warning: unknown
    known = s.filter(pl.col("preemptions_est").is_not_null())
    # the estimates add up to the interpolated counter at 12:01:30 (between #51 at :52 and #101 at 1:31)
    assert known["preemptions_est"].sum() == pytest.approx(51 + 50 * 38 / 39)


def test_v1_010_two_engines_no_preemption_field():
    s = parse(V1_010).stats
    assert s.height == 24 and set(s["engine"]) == {0, 1} and set(s["era"]) == {"v1"}
    e1 = s.filter(pl.col("engine") == 1).sort("line")
    assert e1["running"].to_list()[:3] == [10, 28, 50]
    assert e1["waiting"][4] == 40 and e1["swapped"].null_count() == 12
    assert s["preemptions"].null_count() == s.height and s["preemptions_est"].null_count() == s.height
    assert s["prefix_cache_hit_rate"][0] == pytest.approx(0.31)
    assert parse(V1_010).unparsed.height == 0                     # traceback lines are not candidates


def test_v1_014_preemptions_field_and_iso_timestamps():
    p = parse(V1_014, year=1999)                                  # ISO prefix carries its own year
    s = p.stats.sort("line")
    assert s["time"][0] == datetime(2025, 5, 22, 12, 0, 10, 123456)   # kubectl UTC wins over 14:00 local
    assert s["preemptions"].to_list() == [0, 7, 19, 2, 0, 0]          # omitted when zero
    assert s["deferred"].to_list()[2] == 3
    assert s["gpu_kv_usage"][2] == pytest.approx(0.996)
    assert s["preemptions_est"].to_list() == [0.0, 7.0, 19.0, 2.0, 0.0, 0.0]


def test_real_lines_users_posted_parse():
    lines = [
        # vllm-project/vllm#1935 (0.2.x: llm_engine.py, no trailing dot, trailing spaces)
        "INFO 12-05 19:20:57 llm_engine.py:645] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 553.9 tokens/s, Running: 110 reqs, Swapped: 0 reqs, Pending: 507 reqs, GPU KV cache usage: 98.6%, CPU KV cache usage: 0.0%    ",
        # intel/llm-scaler#391 (V1 0.10)
        "(APIServer pid=851) INFO 04-28 22:54:32 [loggers.py:257] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 5.4 tokens/s, Running: 1 reqs, Waiting: 14 reqs, GPU KV cache usage: 76.5%, Prefix cache hit rate: 92.0%",
        # GAIR-NLP/LIMO#29 (the V0 warning, prefix lost in the paste -> counted, time unknown)
        " Sequence group 221 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=101",
    ]
    p = parse_server_log(lines, "posted", 2024)
    assert p.stats["running"].to_list() == [110, 1] and p.stats["waiting"].to_list() == [507, 14]
    assert p.stats["era"].to_list() == ["v0", "v1"]
    assert p.unparsed.height == 0
    assert p.preemptions.select("line", "time", "mode", "cum_count").rows() == [(3, None, "recompute", 101)]


# ---- server logs: noisy and malformed input ----------------------------------------------

def test_v0_malformed_stats_line_is_reported_by_number():
    u = parse(V0).unparsed
    assert u["line"].to_list() == [75]
    assert "without waiting, gpu_kv_usage" in u["reason"][0]


@pytest.mark.parametrize("body,reason", [
    ("Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: many reqs, "
     "Waiting: 0 reqs, GPU KV cache usage: 1.0%", "bad value for 'Running'"),
    ("Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%",
     "without generation_throughput_tps"),
])
def test_stats_body_errors_name_the_field(body, reason):
    with pytest.raises(StatsLineError, match=reason):
        parse_stats_body(body)


def test_unknown_parts_are_ignored():
    row = parse_stats_body("Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
                           "Running: 3 reqs, Waiting: 4 reqs, KV fetch: 1.5 GB/s, Preemptions: 2, "
                           "GPU KV cache usage: 50.0%, MM cache hit rate: 3.0%")
    assert (row["running"], row["waiting"], row["preemptions"], row["gpu_kv_usage"]) == (3, 4, 2, 0.5)


def test_noisy_log_malformed_warning_orphan_prefix_line_and_year_rollover():
    lines = [
        "\x1b[33mWARNING\x1b[0m 12-31 23:59:58 scheduler.py:1481] Sequence group 9 is preempted by PreemptionMode.FOO mode because there is not enough KV cache space.",
        "INFO 12-31 23:59:59 metrics.py:367] Prefix cache hit rate: GPU: 10.00%, CPU: 0.00%",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error.",
        "INFO 01-01 00:00:04 metrics.py:351] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Swapped: 1 reqs, Pending: 0 reqs, GPU KV cache usage: 99.0%, CPU KV cache usage: 1.0%.",
        "some unrelated line",
    ]
    p = parse_server_log(lines, "noisy", 2024)
    assert p.unparsed["line"].to_list() == [1, 2]
    assert p.unparsed["reason"].to_list() == ["preemption warning does not parse",
                                              "prefix cache line without its stats line"]
    assert p.stats["time"][0] == datetime(2025, 1, 1, 0, 0, 4)      # December -> January: next year
    assert p.lines == 7


def test_empty_log_gives_empty_tables():
    p = parse_server_log([], "empty", 2025)
    assert p.stats.height == p.preemptions.height == p.unparsed.height == 0


def test_counter_estimate_restarts_with_the_process():
    t = np.array([5.0, 15.0, 25.0, 35.0, 45.0])
    c = cumulative_at(t, np.array([10.0, 20.0, 30.0, 40.0]), np.array([1.0, 51.0, 1.0, 51.0]))
    assert c[0] == 0.0 and c[1] == pytest.approx(26.0)
    assert np.isnan(c[2])                     # old process's tail or new process's start: unknown
    assert c[3] == pytest.approx(26.0) and np.isnan(c[4])


# ---- client results -----------------------------------------------------------------------

def test_vllm_bench_json_tokens_anchor_and_failed_request():
    d = parse_client_file(BENCH)
    assert d["request_id"].n_unique() == 11                   # request 8 failed: skipped
    assert "8" not in set(d["request_id"])
    assert d.height == 11 * 150
    first = d.filter(pl.col("token_index") == 0)
    assert first["ttft_s"].null_count() == 0 and d.filter(pl.col("token_index") > 0)["ttft_s"].null_count() == 1650 - 11
    # date 12:02:00 minus duration 120 s = 12:00:00 for the first send (perf_counter times are relative)
    assert first["send_time"].min() == datetime(2025, 5, 20, 12, 0, 0)
    r4 = d.filter(pl.col("request_id") == "4").sort("token_index")
    assert r4["itl_s"][21] == 2.5 and r4["send_time"][0] == datetime(2025, 5, 20, 12, 0, 40, 4000)
    gaps = np.diff(r4["token_epoch_s"].to_numpy())
    assert np.allclose(gaps, r4["itl_s"].to_numpy()[1:])
    assert r4["prompt_tokens"][0] == 512 and r4["output_tokens"][0] == 150


def test_vllm_bench_without_start_times_or_date_has_no_wall_clock():
    obj = {"ttfts": [0.1, 0.2], "itls": [[0.05, 0.05], [0.04]], "input_lens": [10, 20], "output_lens": [3, 2]}
    d = vllm_bench_tokens(obj, "old.json")
    assert d.height == 5 and d["token_time"].null_count() == 5 and d["itl_s"].drop_nulls().to_list() == [0.05, 0.05, 0.04]
    anchored = vllm_bench_tokens({**obj, "start_times": [100.0, 101.0]}, "x.json",
                                 client_start=datetime(2025, 1, 2, 3, 4, 5))
    assert anchored["send_time"].to_list()[-1] == datetime(2025, 1, 2, 3, 4, 6)


def test_generic_csv_wide_and_jsonl_long():
    c = parse_client_file(CSV)
    assert c.height == 12 and c["send_time"][0] == datetime(2025, 5, 20, 12, 0, 0)
    assert c.filter(pl.col("itl_s") > 1)["request_id"].to_list() == ["req-1"]
    j = parse_client_file(JSONL)
    assert j.height == 8 and j.filter(pl.col("itl_s") > 1)["token_time"][0] == datetime(2025, 5, 20, 12, 0, 43, 250000)
    assert j["ttft_s"].drop_nulls().to_list() == pytest.approx([0.2, 0.2])


def test_generic_relative_times_need_an_anchor():
    rows = pl.DataFrame({"request_id": ["a", "a"], "send_time": ["0.0", "0.0"], "token_time": ["0.5", "0.6"]})
    d = generic_tokens(rows, "rel.csv")
    assert d["token_time"].null_count() == 2 and d["itl_s"][1] == pytest.approx(0.1)
    d = generic_tokens(rows, "rel.csv", client_start=datetime(2025, 1, 1))
    assert d["token_time"][0] == datetime(2025, 1, 1, 0, 0, 0, 500000)


@pytest.mark.parametrize("content,match", [
    ('{"ttfts": [1]}', "without 'ttfts'/'itls'"),
    ("request_id,foo\n1,2\n", "need columns request_id, send_time"),
    ("request_id,send_time,token_time\n1,yesterday,3\n", "neither a number nor an ISO time"),
])
def test_client_format_errors(tmp_path, content, match):
    p = tmp_path / "c.json" if content.startswith("{") else tmp_path / "c.csv"
    p.write_text(content)
    with pytest.raises(ClientFormatError, match=match):
        parse_client_file(p)


# ---- into DuckDB ---------------------------------------------------------------------------

def test_ingest_all_fixtures_into_duckdb_idempotently(tmp_path):
    db = tmp_path / "ev.duckdb"
    files = [V0, BENCH, V1_010, V1_014, CSV, JSONL]
    res, year, src = ingest(files, db)
    assert (year, src) == (2025, "client results")
    assert [r.kind for r in res] == ["server", "client", "server", "server", "client", "client"]
    ingest(files, db)                                             # again: same rows, no duplicates
    con = duckdb.connect(str(db), read_only=True)
    count = lambda t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]  # noqa: E731
    assert count("log_stats") == 24 + 24 + 6 and count("log_preemptions") == 3
    assert count("log_unparsed") == 1 and count("client_tokens") == 1650 + 12 + 8
    assert count("log_sources") == 6
    cols = {r[0] for r in con.execute("DESCRIBE log_stats").fetchall()}
    assert {"source_file", "line", "time", "engine", "running", "waiting", "swapped", "gpu_kv_usage",
            "cpu_kv_usage", "prompt_throughput_tps", "generation_throughput_tps",
            "prefix_cache_hit_rate", "preemptions", "preemptions_est"} <= cols
    assert con.execute("SELECT min(time) FROM log_stats WHERE source_file = 'v0_server.log'").fetchall()[0][0] \
        == datetime(2025, 5, 20, 12, 0, 5)
    con.close()


def test_year_flag_and_assumed_year(tmp_path):
    _, year, src = ingest([V0], tmp_path / "a.duckdb", year=2023)
    assert (year, src) == (2023, "--year")
    _, year, src = ingest([V0], tmp_path / "b.duckdb")
    assert year == datetime.now().year and src.startswith("assumed")


def test_detect_kind(tmp_path):
    assert detect_kind(V0) == "server" and detect_kind(V1_014) == "server"
    assert detect_kind(BENCH) == "client" and detect_kind(CSV) == "client" and detect_kind(JSONL) == "client"
    other = tmp_path / "x.txt"
    other.write_text("hello\n")
    with pytest.raises(ValueError, match="--kind"):
        detect_kind(other)


def test_cli_logs_json_and_errors(tmp_path):
    db = tmp_path / "ev.duckdb"
    res = kvcap("logs", V0, BENCH, "--db", db, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"db", "year", "year_source", "files", "stats_rows", "preemption_warnings",
            "client_tokens", "unparsed"} <= out.keys()
    assert (out["stats_rows"], out["preemption_warnings"], out["unparsed"]) == (24, 3, 1)
    assert out["files"][0]["unparsed_lines"] == [75]
    other = tmp_path / "x.txt"
    other.write_text("hello\n")
    for args in (("logs", other, "--db", db), ("logs", tmp_path / "missing.log", "--db", db),
                 ("logs", V0, "--db", db, "--kind", "both")):
        bad = kvcap(*args)
        assert bad.returncode == 2 and bad.stderr.startswith("kvcap: error: ")
        assert len(bad.stderr.strip().splitlines()) == 1


# ---- size-swap --from-logs ---------------------------------------------------------------

def test_size_swap_from_logs_peak_times_kv_size(tmp_path):
    db = tmp_path / "ev.duckdb"
    ingest([V0, BENCH], db)
    res = kvcap("size-swap", "--from-logs", "--db", db, "--model", "llama-3.1-8b", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {"peak_swapped_gib", "peak_swapped_requests", "recommended_swap_space_gib",
            "replay", "difference"} <= out.keys()
    # V0's swap answer only: a swap peak does not size V1's CPU offloading (size-offload)
    assert "recommended_kv_offloading_size_gib" not in out
    ctx = 673                                     # ceil(mean(prompt + output)) of the bench results
    assert out["peak_swapped_requests"] == 6 and out["context_tokens"] == ctx
    blocks = 6 * -(-ctx // 16)
    assert out["peak_swapped_gib"] == pytest.approx(blocks * 16 * 131072 / 2 ** 30)
    assert out["recommended_swap_space_gib"] == 1.0 and out["replay"] is None
    res = kvcap("size-swap", "--from-logs", "--db", db, "--context-tokens", "4096", "-tp", "2", "--json")
    out = json.loads(res.stdout)
    assert out["context_source"] == "--context-tokens" and out["kv_bytes_per_token"] == 65536
    # per GPU: the same peak of swapped requests holds half the KV per rank at TP 2
    assert out["tensor_parallel_size"] == 2 and out["recommended_swap_space_gib"] > 0


def test_size_swap_from_logs_beside_the_replay_answer(tmp_path):
    from replay.config import EngineConfig
    from replay.run import replay
    from replay.results.store import write_run
    from traces.synth import synthesize
    db = tmp_path / "ev.duckdb"
    ingest([V0, BENCH], db)
    trace = synthesize("poisson", rate_rps=4.0, duration_s=60, seed=1)
    demand = replay(trace, EngineConfig(scheduler="v0", num_gpu_blocks_override=800, preemption_mode="swap",
                                        on_swap_full="recompute", num_cpu_blocks_override=100_000),
                    label="size-swap demand")
    write_run(db, demand.tables())
    out = json.loads(kvcap("size-swap", "--from-logs", "--db", db, "--json").stdout)
    assert out["replay"]["run_id"] == demand.run_id
    assert out["replay"]["peak_swapped_requests"] == int(demand.steps["evicted_requests"].max())
    assert out["difference"].startswith("The ") and out["difference"].endswith(".")


def test_size_swap_from_logs_errors(tmp_path):
    db = tmp_path / "ev.duckdb"
    ingest([V1_014], db)
    for args, msg in ((("size-swap", "--from-logs"), "--from-logs needs --db"),
                      (("size-swap", "--from-logs", "--db", db, "--context-tokens", "100"), "no 'Swapped:' field"),
                      (("size-swap",), "needs a trace FILE")):
        bad = kvcap(*args)
        assert bad.returncode == 2 and msg in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
