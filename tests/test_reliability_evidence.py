"""Issue 34 items 3 and 4: every evidence input is parsed or refused in one line. A server log
before a Prometheus file, records glued without a newline (after a digit or a letter, a stats
record after a preemption warning, an engine line after a traceback), a long tail after a stats
line (linear time), access-log lines before the first stats line, a label value holding `}`,
huge integers, a query_range `result` that is an object, a FIFO or a device; and CSV rows with
fewer fields than the header, which are errors naming the line and the fields, never read shifted."""
from __future__ import annotations

import io
import json
import os
import time

import duckdb
import pytest
from typer.testing import CliRunner

from capacity.cli import app
from capacity.evidence.logparse import parse_server_log
from capacity.evidence.logs import ingest_files
from traces.loaders import load_trace
from traces.schema import TraceError

runner = CliRunner()

V0_STATS = ("INFO 01-25 10:00:{s:02d} [metrics.py:345] Avg prompt throughput: 1.0 tokens/s, Avg "
            "generation throughput: 2.0 tokens/s, Running: 1 reqs, Swapped: {sw} reqs, Pending: 0 "
            "reqs, GPU KV cache usage: 1.0%, CPU KV cache usage: 0.0%.")
V0_WARN = ("WARNING 01-25 10:00:{s:02d} [scheduler.py:1000] Sequence group 12 is preempted by "
           "PreemptionMode.SWAP mode because there is not enough KV cache space. "
           "total_num_cumulative_preemption={cum}")
V1_STATS = ("INFO 01-25 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
            "Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache "
            "usage: 1.0%, Prefix cache hit rate: 0.0%")
SCRAPE = '# 1747742400\nvllm:num_requests_running{model_name="m",engine="0"} 3\n'


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


def parse(text: str):
    return parse_server_log(io.StringIO(text), "s.log", 2025)


def rows(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_server_log_before_a_prometheus_file(tmp_path):
    log, prom = tmp_path / "server.log", tmp_path / "scrape.prom"
    log.write_text(V1_STATS + "\n")
    prom.write_text(SCRAPE)
    code, out, err = run("logs", log, prom, "--db", tmp_path / "k.duckdb", "--json")
    assert code == 0, err
    assert {f["kind"] for f in json.loads(out)["files"]} == {"server", "prometheus"}


@pytest.mark.parametrize("tail", ["a" * 80_000, "9" * 80_000, "x_" * 40_000])
def test_a_long_tail_after_a_stats_line_is_linear(tail):
    t0 = time.perf_counter()
    parsed = parse(V1_STATS + tail + "\n")
    assert time.perf_counter() - t0 < 1.0
    assert parsed.stats.height + parsed.unparsed.height == 1


def test_a_5_mb_line_finishes():
    t0 = time.perf_counter()
    parsed = parse(V1_STATS + ", " + "a" * 5_000_000 + "\n")
    assert time.perf_counter() - t0 < 20 and parsed.lines == 1


def test_v0_stats_glued_after_a_preemption_warning_is_stored():
    text = "\n".join([V0_STATS.format(s=0, sw=1),
                      V0_WARN.format(s=5, cum=51) + V0_STATS.format(s=5, sw=3),
                      V0_STATS.format(s=10, sw=1)]) + "\n"
    parsed = parse(text)
    assert parsed.stats["swapped"].to_list() == [1, 3, 1]
    assert parsed.preemptions["cum_count"].to_list() == [51]
    # glued without the stats record's own logger prefix: both still read
    bare = V0_WARN.format(s=5, cum=51) + V0_STATS.format(s=5, sw=3).split("] ", 1)[1]
    parsed = parse(bare + "\n")
    assert parsed.stats["swapped"].to_list() == [3] and parsed.preemptions.height == 1


@pytest.mark.parametrize("glue", [
    "RuntimeError: CUDA error: out of memoryINFO 01-25 10:00:00 [executor_base.py:40] ",
    "RuntimeError: CUDA error: out of memory",
])
def test_engine_line_glued_to_a_traceback_is_found(glue):
    text = ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            + glue + "# GPU blocks: 1478, # CPU blocks: 2048\n")
    parsed = parse(text)
    assert parsed.engine["num_gpu_blocks"].to_list() == [1478]


def test_access_log_lines_before_the_first_stats_line(tmp_path):
    f = tmp_path / "server.log"
    f.write_text("".join(f'INFO:     127.0.0.1:{5000 + i % 1000} - "POST /v1/completions HTTP/1.1" '
                         "200 OK\n" for i in range(1500)) + V1_STATS + "\n")
    rep = ingest_files([f], tmp_path / "k.duckdb", year=2025)
    assert [(r.kind, r.rows) for r in rep.files] == [("server", 1)]


def test_prom_label_value_holding_a_brace(tmp_path):
    f = tmp_path / "scrape.prom"
    f.write_text('# 1747742400\nvllm:num_requests_running{model_name="a}b",engine="0"} 3\n')
    rep = ingest_files([f], tmp_path / "k.duckdb")
    assert [(r.kind, r.rows) for r in rep.files] == [("prometheus", 1)]
    assert rows(tmp_path / "k.duckdb", "SELECT model_name FROM prom_samples") == [("a}b",)]


def test_huge_integers_are_unparsed_lines_not_tracebacks(tmp_path):
    f = tmp_path / "server.log"
    f.write_text(V0_WARN.format(s=1, cum=10**30) + "\n"
                 "INFO 01-25 10:00:00 [executor_base.py:40] # GPU blocks: 99999999999999999999, "
                 "# CPU blocks: 2048\n" + V1_STATS.replace("Running: 1", "Running: " + "9" * 5000) + "\n")
    code, out, err = run("logs", f, "--db", tmp_path / "k.duckdb", "--json")
    assert code == 0, err
    assert json.loads(out)["files"][0]["unparsed_lines"] == [1, 2, 3]


def test_query_range_result_that_is_an_object(tmp_path):
    f = tmp_path / "q.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": {"a": 1}}}))
    code, _, err = run("logs", f, "--db", tmp_path / "k.duckdb")
    assert code == 2 and "data.result must be a list" in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_logs_on_a_fifo_or_device_says_what_it_is(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    code, _, err = run("logs", path, "--db", tmp_path / "k.duckdb")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("FIFO" if kind == "fifo" else "character device") in err and "no such file" not in err
    assert not (tmp_path / "k.duckdb").exists()


# ---- item 4: short CSV rows; item 3: a CSV field quoted across lines --------------------------

def test_burstgpt_row_missing_its_model_is_an_error(tmp_path):
    f = tmp_path / "burst.csv"
    f.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,300,1087,1387,Conversation log\n6,300,1087,1387,Conversation log\n")
    with pytest.raises(TraceError) as e:
        load_trace(f)
    msg = str(e.value)
    assert str(f) in msg and "line 3" in msg and "5 fields, the header has 6" in msg and "Model" in msg


def test_vidur_row_missing_a_column_is_an_error(tmp_path):
    f = tmp_path / "vidur.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
                 "0,10,5,15\n1,20,3\n")
    with pytest.raises(TraceError, match=r"line 3: 3 fields, the header has 4"):
        load_trace(f)


def test_csv_field_quoted_across_lines_is_read(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('arrival_s,prompt_tokens,output_tokens,tenant\n0,10,5,"team\na"\n0.5,20,3,b\n')
    df = load_trace(f)
    assert df["tenant"].to_list() == ["team\na", "b"] and df["prompt_tokens"].to_list() == [10, 20]


def test_stray_quote_is_still_an_error(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text('arrival_s,prompt_tokens,output_tokens\n0,10,5\n"0.5,20,3\n1,30,4\n')
    with pytest.raises(TraceError, match="line 3.*quote"):
        load_trace(f)
