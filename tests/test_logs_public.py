"""`kvcap logs` on what users pasted publicly (issue 17, item 2): tests/data/logs/public holds 32
short verbatim excerpts, one per GitHub thread (the URL is each file's first line). All ingest in
one call; the one that is prose, not a log, is skipped with a warning naming it."""
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl
import pytest

from capacity.evidence.logfacts import engine_fields, event_kind, message, split_records
from capacity.evidence.logs import detect_kind, ingest_files

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "tests" / "data" / "logs" / "public"
V1_033 = ROOT / "tests" / "data" / "logs" / "v1_033_server.log"
KVCAP = str(Path(sys.executable).with_name("kvcap"))
PROSE = PUBLIC / "v0_6623_prose_blocks.log"
FILES = sorted(PUBLIC.glob("*.log"))
# Refused outright before issue 17 ("cannot tell a vLLM server log from client results").
REFUSED_BEFORE = ("v0_10517_blocks_concurrency_bare.log", "v0_l1_4_workerdict_raise.log",
                  "v0_rllm62_workerdict_swap_abort.log")


def kvcap(*args):
    return subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def public_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("pub") / "ev.duckdb"
    res = kvcap("logs", *FILES, "--db", db, "--year", 2025, "--json")
    assert res.returncode == 0, res.stderr
    return db, json.loads(res.stdout), res.stderr


def q(db, sql):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).pl()


def test_every_excerpt_names_its_thread():
    assert len(FILES) == 32
    for f in FILES:
        assert f.read_text().startswith("# source: https://github.com/"), f.name


def test_all_excerpts_ingest_in_one_call_and_the_prose_is_skipped(public_db):
    db, out, err = public_db
    assert len(out["files"]) == 31 and [Path(s["file"]).name for s in out["skipped"]] == [PROSE.name]
    assert err.count("kvcap: warning:") == 1 and PROSE.name in err and len(err.strip().splitlines()) == 1
    assert (out["stats_rows"], out["preemption_warnings"], out["engine_lines"], out["events"],
            out["unparsed"]) == (54, 2, 12, 3, 0)
    names = {r["source_file"] for r in out["files"]}
    assert set(REFUSED_BEFORE) <= names


def test_the_three_refused_before_are_server_logs():
    for name in REFUSED_BEFORE:
        assert detect_kind(PUBLIC / name) == "server"


def test_glued_records_each_become_a_stats_row(public_db):
    db, _, _ = public_db
    s = q(db, "SELECT source_file, line, time, gpu_kv_usage FROM log_stats ORDER BY source_file, time")
    glued = s.filter(pl.col("source_file") == "v0_2595_glued_asyncengine.log")
    assert glued["line"].to_list() == [2, 2, 2]
    assert glued["time"].dt.strftime("%H:%M:%S").to_list() == ["11:26:53", "11:26:58", "11:27:03"]
    assert glued["gpu_kv_usage"].to_list() == pytest.approx([0.001, 0.002, 0.003])
    v1 = s.filter(pl.col("source_file") == "v1_18115_glued_records.log")
    assert v1["line"].to_list() == [2, 3, 3] and v1["gpu_kv_usage"][-1] == pytest.approx(0.919)


def test_tqdm_prefixed_stats_and_the_swap_warning(public_db):
    db, _, _ = public_db
    s = q(db, "SELECT running, swapped, waiting, cpu_kv_usage FROM log_stats "
              "WHERE source_file = 'v0_5578_tqdm_glued_swap.log' ORDER BY line")
    assert s.rows() == [(34, 100, 9832, pytest.approx(0.704)), (37, 137, 9779, pytest.approx(0.779))]
    w = q(db, "SELECT source_file, time, mode, cum_count FROM log_preemptions ORDER BY source_file")
    assert w.row(0) == ("v0_5578_tqdm_glued_swap.log", datetime(2025, 6, 16, 21, 24, 15), "swap", 151)
    # a bare warning (no logger prefix) still counts, without a time
    assert w.row(1) == ("v0_limo29_bare_preemption.log", None, "recompute", 101)


def test_prefixes_k8s_docker_compose_docker_desktop_and_process_tags(public_db):
    db, _, _ = public_db
    s = q(db, "SELECT source_file, time, running, waiting FROM log_stats ORDER BY source_file, time")
    k8s = s.filter(pl.col("source_file") == "v1_tt3359_k8s_timestamps.log")
    assert k8s["time"][0] == datetime(2026, 5, 12, 8, 1, 39, 331095)      # kubectl's UTC time wins
    desk = s.filter(pl.col("source_file") == "v1_18916_docker_desktop_prefix.log")
    assert desk["time"].to_list() == [datetime(2025, 5, 30, 9, 55, 29, 284000)]
    compose = s.filter(pl.col("source_file") == "v1_kyuz073_docker_compose.log")
    assert compose["running"].to_list() == [0, 0, 1]
    ray = s.filter(pl.col("source_file") == "v1_llmscaler391_apiserver_metrics_get.log")
    assert ray["waiting"].to_list() == [14, 14, 14]


def test_engine_lines_into_log_engine(public_db):
    db, _, _ = public_db
    e = q(db, "SELECT * FROM log_engine ORDER BY source_file, line")
    by = {(r["source_file"], r["line"]): r for r in e.iter_rows(named=True)}
    bare = by[("v0_10517_blocks_concurrency_bare.log", 4)]
    assert (bare["num_gpu_blocks"], bare["num_cpu_blocks"], bare["time"]) == (1478, 2048, None)
    assert by[("v0_10517_blocks_concurrency_bare.log", 3)]["kv_cache_gib"] == 2.89
    conc = by[("v0_10517_blocks_concurrency_bare.log", 5)]
    assert (conc["max_concurrency"], conc["max_concurrency_tokens"]) == (0.82, 29000)
    assert by[("v1_13596_gpu_blocks_tokens.log", 2)]["num_gpu_blocks"] == 127626
    assert by[("v1_13596_gpu_blocks_tokens.log", 2)]["num_cpu_blocks"] is None
    startup = "v1_19794_startup_tqdm_blocks.log"
    assert by[(startup, 2)]["kv_cache_gib"] == 26.91 and by[(startup, 3)]["kv_cache_tokens"] == 251920
    assert by[(startup, 9)]["num_gpu_blocks"] == 15745
    core = by[("v1_lmcache1739_enginecore_kv.log", 2)]
    assert (core["kv_cache_gib"], core["pid"]) == (6.51, 1133552)


def test_swap_abort_is_an_event(public_db):
    db, _, _ = public_db
    ev = q(db, "SELECT source_file, line, pid, kind FROM log_events ORDER BY source_file")
    assert ev.rows() == [("v0_10517_blocks_concurrency_bare.log", 6, None, "kv_cache_too_small"),
                         ("v0_l1_4_workerdict_raise.log", 3, 111417, "swap_abort"),
                         ("v0_rllm62_workerdict_swap_abort.log", 2, None, "swap_abort")]


def test_unrecognisable_or_missing_file_warns_and_the_others_go_in(tmp_path):
    db = tmp_path / "ev.duckdb"
    good = PUBLIC / "v0_12314_metrics449.log"
    res = kvcap("logs", PROSE, tmp_path / "missing.log", good, "--db", db, "--year", 2025, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["source_file"] for r in out["files"]] == [good.name] and out["stats_rows"] == 3
    assert {Path(s["file"]).name: s["reason"] for s in out["skipped"]}["missing.log"] == "no such file"
    assert len(res.stderr.strip().splitlines()) == 2
    alone = kvcap("logs", PROSE, tmp_path / "missing.log", "--db", tmp_path / "other.duckdb")
    assert alone.returncode == 2 and alone.stderr.startswith("kvcap: error: no file could be read")
    assert len(alone.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "other.duckdb").exists()


def test_kind_still_forces(tmp_path):
    rep = ingest_files([PROSE], tmp_path / "ev.duckdb", year=2025, kind="server")
    assert [(r.source_file, r.rows, r.engine_lines) for r in rep.files] == [(PROSE.name, 0, 0)]
    assert rep.skipped == []


def test_vllm_033_deferred_preemptions_engine_and_error(tmp_path):
    rep = ingest_files([V1_033], tmp_path / "ev.duckdb", year=2025)
    (r,) = rep.files
    assert (r.rows, r.engine_lines, r.events, r.unparsed) == (4, 3, 1, 0)
    s = q(tmp_path / "ev.duckdb", "SELECT running, waiting, deferred, preemptions FROM log_stats ORDER BY line")
    assert s.rows() == [(4, 0, None, 0), (31, 12, 3, 7), (28, 5, None, 2), (20, 0, None, 0)]
    e = q(tmp_path / "ev.duckdb", "SELECT kv_cache_gib, kv_cache_tokens, max_concurrency, max_concurrency_tokens "
                                  "FROM log_engine ORDER BY line")
    assert e.rows() == [(12.4, None, None, None), (None, 101584, None, None), (None, None, 12.4, 8192)]
    ev = q(tmp_path / "ev.duckdb", "SELECT kind, pid, time FROM log_events")
    assert ev.rows() == [("error", 412, datetime(2025, 11, 20, 10, 0, 41))]


def test_record_splitting_and_messages():
    glued = ("INFO 07-28 06:41:09 [loggers.py:118] Engine 000: Avg prompt throughput: 0.0 tokens/s, x: 1%"
             "INFO 07-28 06:41:19 [loggers.py:118] Engine 000: y")
    a, b = split_records(glued)
    assert a.endswith("x: 1%") and b.startswith("INFO 07-28 06:41:19")
    assert split_records("plain line") == ["plain line"]
    tagged = "vllm-1  | (APIServer pid=1) INFO 07-02 08:34:45 [loggers.py:273] Engine 000: GPU KV cache size: 9 tokens"
    assert message(tagged) == "GPU KV cache size: 9 tokens"
    assert engine_fields(tagged) == {"kv_cache_tokens": 9}
    # quoted in prose, a block count is not an engine line
    assert engine_fields("we saw (# GPU blocks: 3631, # CPU blocks: 512) here") is None
    assert event_kind("  raise RuntimeError(") is None
