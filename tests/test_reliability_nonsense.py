"""Issue 34 item 8, the rest of the nonsense accepted with exit 0: client timings with a token
before the send (a negative TTFT), Prometheus counters that go negative or down (a drop is a
restart, as Prometheus' rate() reads it), histogram buckets that decrease as `le` grows,
`--kv-cache-dtype fp8_e5m2` on V1, an offloading knob on V0, and two servers interleaved in one
log. Each is refused in one line naming file, line (or scrape, series, request) and field, or
read the way vLLM / Prometheus mean it."""
from __future__ import annotations

import json

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from capacity.cli import app

runner = CliRunner()
T0 = 1747742400


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, res.stderr


def one_error(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("kvcap: error:"), err
    return lines[0]


def rows(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


# ---- client timings: a token before its send -------------------------------------------------

@pytest.mark.parametrize("name, text, where", [
    ("c.csv", "request_id,send_time,token_times\nr0,1747742400.0,\"1747742400.2;1747742400.3\"\n"
              "r1,1747742600.0,\"1747742400.4;1747742600.5\"\n", "line 3"),
    ("c.csv", "request_id,send_time,token_times,prompt_tokens\nr0,1747742400.0,\"1747742400.2\",5\n"
              "r1,1747742410.0,\"1747742409.9\",5\n", "line 3"),
    ("c.jsonl", '{"request_id": "a", "send_time": 10.0, "token_time": 11.0}\n\n'
                '{"request_id": "b", "send_time": 210.0, "token_time": 10.5}\n', "line 3"),
])
def test_a_token_before_its_send_is_refused_naming_the_line(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    db = tmp_path / "k.duckdb"
    line = one_error(*run("logs", f, "--db", db)[::2])
    assert name in line and where in line and "send_time" in line and "negative TTFT" in line
    assert not db.exists()


def test_token_times_without_a_send_time_are_refused(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("request_id,send_time,token_times\nr0,1747742400.0,\"1747742400.2\"\nr1,,\"1747742400.4\"\n")
    line = one_error(*run("logs", f, "--db", tmp_path / "k.duckdb")[::2])
    assert "c.csv: line 3: request 'r1' has token times but no send_time" in line


def test_bench_result_with_a_negative_ttft_is_refused(tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"date": "20250520-120200", "duration": 10.0, "input_lens": [5, 6],
                             "output_lens": [2, 2], "ttfts": [0.1, -200.0], "itls": [[0.01], [0.01]],
                             "start_times": [0.0, 1.0], "errors": ["", ""]}))
    line = one_error(*run("logs", f, "--db", tmp_path / "k.duckdb")[::2])
    assert "b.json: request 1: 'ttfts' -200.0" in line


def test_valid_client_timings_still_load(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("request_id,send_time,token_times\nr0,1747742400.0,\"1747742400.2;1747742400.3\"\n")
    code, _, err = run("logs", f, "--db", tmp_path / "k.duckdb")
    assert code == 0, err
    assert rows(tmp_path / "k.duckdb", "SELECT min(ttft_s) FROM client_tokens")[0][0] == pytest.approx(0.2)


# ---- Prometheus: counters, resets, histogram buckets -------------------------------------------

def scrape(t: int, counter: float, buckets=(1, 4, 5)) -> str:
    b = "".join(f'vllm:e2e_request_latency_seconds_bucket{{le="{le}",model_name="m"}} {c}\n'
                for le, c in zip(("1.0", "5.0", "+Inf"), buckets))
    return (f"# {t}\n# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {counter}\n'
            "# TYPE vllm:e2e_request_latency_seconds histogram\n" + b +
            f'vllm:e2e_request_latency_seconds_count{{model_name="m"}} {buckets[-1]}\n'
            f'vllm:e2e_request_latency_seconds_sum{{model_name="m"}} 1.5\n')


def query_range(counter_values, buckets=None) -> str:
    def series(name, values, **labels):
        return {"metric": {"__name__": name, "instance": "a:8000", **labels},
                "values": [[T0 + 10 * i, str(v)] for i, v in enumerate(values)]}
    result = [series("vllm:prompt_tokens_total", counter_values)]
    for le, values in (buckets or {}).items():
        result.append(series("vllm:time_to_first_token_seconds_bucket", values, le=le))
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def counter_windows(db) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT window_start_s, stat, value FROM prom_windows WHERE metric = "
                       "'vllm:prompt_tokens_total' AND value IS NOT NULL ORDER BY 1, 2").pl()


@pytest.mark.parametrize("fmt", ["text", "query_range"])
def test_a_counter_going_down_is_a_reset_never_a_negative_rate(tmp_path, fmt):
    values = [1000, 5000, 200, 900]     # the server restarted between the 2nd and 3rd sample
    if fmt == "text":
        f = tmp_path / "s.prom"
        f.write_text("".join(scrape(T0 + 10 * i, v) for i, v in enumerate(values)))
    else:
        f = tmp_path / "q.json"
        f.write_text(query_range(values))
    db = tmp_path / "k.duckdb"
    code, _, err = run("logs", f, "--db", db)
    assert code == 0, err
    w = counter_windows(db)
    inc = w.filter(pl.col("stat") == "increase")["value"].to_list()
    assert inc == [4000.0, 200.0, 700.0]       # as Prometheus' increase(): the reset counts from 0
    assert (w["value"] >= 0).all()


@pytest.mark.parametrize("fmt", ["text", "query_range"])
@pytest.mark.parametrize("bad", ["-5", "NaN"])
def test_a_negative_or_nan_counter_is_refused(tmp_path, fmt, bad):
    if fmt == "text":
        f = tmp_path / "s.prom"
        f.write_text(scrape(T0, 10) + scrape(T0 + 10, bad))
        where = "s.prom, scrape 2"
    else:
        f = tmp_path / "q.json"
        f.write_text(query_range([10, bad]))
        where = "q.json"
    db = tmp_path / "k.duckdb"
    line = one_error(*run("logs", f, "--db", db)[::2])
    assert where in line and "counter vllm:prompt_tokens_total" in line and "counts up from 0" in line
    assert not db.exists()


def test_decreasing_histogram_buckets_are_refused_naming_the_metric(tmp_path):
    f = tmp_path / "s.prom"
    f.write_text(scrape(T0, 10) + scrape(T0 + 10, 20, buckets=(6, 2, 9)))
    line = one_error(*run("logs", f, "--db", tmp_path / "k.duckdb")[::2])
    assert "s.prom, scrape 2: histogram vllm:e2e_request_latency_seconds" in line
    assert 'le="5" holds 2, less than 6 of le="1"' in line
    # the same in a query_range export, buckets as series of their own
    q = tmp_path / "q.json"
    q.write_text(query_range([1, 2], buckets={"0.1": [1, 5], "1.0": [2, 4], "+Inf": [2, 6]}))
    line = one_error(*run("logs", q, "--db", tmp_path / "k2.duckdb")[::2])
    assert "q.json: histogram vllm:time_to_first_token_seconds" in line and 'le="1" holds 4' in line


def test_valid_histograms_still_load(tmp_path):
    f = tmp_path / "s.prom"
    f.write_text(scrape(T0, 10) + scrape(T0 + 10, 20, buckets=(2, 9, 11)))
    code, _, err = run("logs", f, "--db", tmp_path / "k.duckdb")
    assert code == 0, err


# ---- engine flags: fp8_e5m2 on V1, offloading knobs on V0 ----------------------------------------

def test_fp8_e5m2_is_refused_on_v1_and_kept_on_v0():
    from replay.config import EngineConfig
    with pytest.raises(ValueError, match="'fp8_e5m2' on V1.*FlashAttention.*use 'fp8'"):
        EngineConfig(kv_cache_dtype="fp8_e5m2")
    assert EngineConfig(kv_cache_dtype="fp8_e5m2", scheduler="v0").kv_cache_dtype == "fp8_e5m2"
    assert EngineConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"


@pytest.mark.parametrize("flags, named", [
    (["--kv-offloading-eviction-policy", "arc"], "--kv-offloading-eviction-policy"),
    (["--no-offload-prompt-only"], "--no-offload-prompt-only"),
    (["--kv-offloading-store-threshold", "2"], "--kv-offloading-store-threshold"),
])
def test_v0_with_an_offloading_knob_is_refused_in_one_line(tmp_path, flags, named):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    db = tmp_path / "k.duckdb"
    line = one_error(*run("replay", t, "--scheduler", "v0", *flags, "--db", db)[::2])
    assert named in line and "V0 has none" in line and "scheduler='v1'" in line
    assert not db.exists()


def test_cli_fp8_e5m2_on_v1_is_one_line(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    line = one_error(*run("replay", t, "--kv-cache-dtype", "fp8_e5m2", "--db", tmp_path / "k.duckdb")[::2])
    assert "fp8_e5m2" in line and "Unrecognized FP8 dtype" in line


# ---- two servers interleaved in one log ----------------------------------------------------------

STATS = ("{tag}(APIServer pid={pid}) INFO 05-22 14:00:{s:02d} [loggers.py:248] Engine 000: Avg prompt "
         "throughput: 2400.0 tokens/s, Avg generation throughput: 960.0 tokens/s, Running: {run} reqs, "
         "Waiting: 0 reqs, GPU KV cache usage: 61.0%, Prefix cache hit rate: 35.2%\n")
ENGINE = ("{tag}(EngineCore_DP0 pid={pid}) INFO 05-22 13:59:{s:02d} [kv_cache_utils.py:833] GPU KV cache "
          "size: {tokens} tokens\n")
V0_STATS = ("{tag}INFO 05-22 14:00:{s:02d} metrics.py:351] Avg prompt throughput: 1.0 tokens/s, Avg generation "
            "throughput: 2.0 tokens/s, Running: {run} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
            "usage: 1.0%, CPU KV cache usage: 0.0%.\n")
V0_PREFIX = "{tag}INFO 05-22 14:00:{s:02d} metrics.py:367] Prefix cache hit rate: GPU: {hit}%, CPU: 0.00%\n"


def compose_log(a_pid: int = 1, b_pid: int = 1) -> str:
    """`docker compose logs` of two vLLM containers: each server is pid 1 in its container."""
    out = [ENGINE.format(tag="vllm-a-1  | ", pid=40, s=1, tokens="100,000"),
           ENGINE.format(tag="vllm-b-1  | ", pid=40, s=2, tokens="200,000")]
    for i in range(3):
        out.append(STATS.format(tag="vllm-a-1  | ", pid=a_pid, s=10 * i, run=5))
        out.append(STATS.format(tag="vllm-b-1  | ", pid=b_pid, s=10 * i + 3, run=50))
    return "".join(out)


def test_two_compose_containers_with_the_same_pid_are_kept_apart(tmp_path):
    f = tmp_path / "compose.log"
    f.write_text(compose_log())
    db = tmp_path / "k.duckdb"
    code, out, err = run("logs", f, "--db", db, "--year", "2025", "--json")
    assert code == 0, err
    assert json.loads(out)["files"][0]["servers"] == ["compose.log service=vllm-a-1",
                                                      "compose.log service=vllm-b-1"]
    got = rows(db, "SELECT source_file, list(running ORDER BY line), list(interval_s ORDER BY line) "
                   "FROM log_stats GROUP BY 1 ORDER BY 1")
    assert got == [("compose.log service=vllm-a-1", [5, 5, 5], [None, 10.0, 10.0]),
                   ("compose.log service=vllm-b-1", [50, 50, 50], [None, 10.0, 10.0])]
    # each server's engine line stays its own: --from-logs asks which one, naming both
    assert rows(db, "SELECT source_file, kv_cache_tokens FROM log_engine ORDER BY 1") == [
        ("compose.log service=vllm-a-1", 100000), ("compose.log service=vllm-b-1", 200000)]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    line = one_error(*run("replay", trace, "--from-logs", db, "--db", tmp_path / "r.duckdb")[::2])
    assert "compose.log service=vllm-a-1" in line and "compose.log service=vllm-b-1" in line
    code, _, err = run("replay", trace, "--from-logs", db, "--log-source", "compose.log service=vllm-b-1",
                       "--db", tmp_path / "r.duckdb")
    assert code == 0, err
    # re-ingesting replaces the split rows, never doubles them
    assert run("logs", f, "--db", db, "--year", "2025")[0] == 0
    assert rows(db, "SELECT count(*) FROM log_stats") == [(6,)]
    # the text output says so in one line
    assert "2 servers in one file, kept apart" in run("logs", f, "--db", db, "--year", "2025")[2]


def test_interleaved_pids_keep_their_own_engine_lines_but_a_restart_does_not_split_them():
    from capacity.evidence.logparse import parse_server_log
    inter = [ENGINE.format(tag="", pid=12, s=1, tokens="100,000"),
             ENGINE.format(tag="", pid=22, s=2, tokens="200,000")]
    for i in range(2):
        inter += [STATS.format(tag="", pid=11, s=10 * i, run=5), STATS.format(tag="", pid=21, s=10 * i + 1, run=50)]
    parsed = parse_server_log(inter, "c.log", 2025)
    assert parsed.engine["source_file"].to_list() == ["c.log pid=12", "c.log pid=22"]
    # one server restarted (pid 11, then pid 21): its stats split by pid as before, the engine
    # lines stay the file's (the last start-up states the engine)
    restart = [ENGINE.format(tag="", pid=12, s=1, tokens="100,000"), STATS.format(tag="", pid=11, s=10, run=5),
               ENGINE.format(tag="", pid=22, s=20, tokens="200,000"), STATS.format(tag="", pid=21, s=30, run=5)]
    parsed = parse_server_log(restart, "c.log", 2025)
    assert set(parsed.stats["source_file"]) == {"c.log pid=11", "c.log pid=21"}
    assert parsed.engine["source_file"].to_list() == ["c.log", "c.log"]


def test_v0_prefix_cache_line_goes_to_its_own_servers_stats_line():
    from capacity.evidence.logparse import parse_server_log
    lines = [V0_STATS.format(tag="vllm-a-1  | ", s=5, run=3), V0_STATS.format(tag="vllm-b-1  | ", s=5, run=30),
             V0_PREFIX.format(tag="vllm-a-1  | ", s=5, hit="10.00"), V0_PREFIX.format(tag="vllm-b-1  | ", s=5, hit="90.00")]
    st = parse_server_log(lines, "c.log", 2025).stats.sort("source_file")
    assert st.select("source_file", "running", "prefix_cache_hit_rate").rows() == [
        ("c.log service=vllm-a-1", 3, 0.1), ("c.log service=vllm-b-1", 30, 0.9)]
