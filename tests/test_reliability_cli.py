"""Issue 13, items 6, 8, 9, 10, 11 at the command line: every flag is checked before the work
starts (one line naming the flag and the fix, exit 2), DuckDB errors and disk errors are one line,
echoed text is escaped, and an interrupt tells the truth about what was written."""
from __future__ import annotations

import time

import polars as pl
import pytest
import typer
from typer.testing import CliRunner

from capacity.cli import app
from capacity.cli.common import fail, guarded
from replay.results.store import WriteInterrupted

runner = CliRunner()


@pytest.fixture()
def trace(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n1.0,30,4\n")
    return f


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stderr if hasattr(res, "stderr") else res.output


@pytest.mark.parametrize("args,flag", [
    (("alerts", "{t}", "--window-s", "0"), "--window-s"),
    (("tune", "{t}", "--max-num-seqs-grid", "8,16", "--slo-ttft-p99", "nan", "--slo-tbt-p99", "1"),
     "--slo-ttft-p99"),
    (("tune", "{t}", "--max-num-seqs-grid", "8,16", "--slo-ttft-p99", "-1", "--slo-tbt-p99", "1"),
     "--slo-ttft-p99"),
    (("tune", "{t}", "--max-num-seqs-grid", "8,x", "--slo-ttft-p99", "1", "--slo-tbt-p99", "1"),
     "--max-num-seqs-grid"),
    (("tune", "{t}", "--max-num-seqs-grid", "8", "--slo-ttft-p99", "1", "--slo-tbt-p99", "1",
      "--workers", "-3"), "--workers"),
    (("headroom", "{t}", "--slo-ttft-p99", "1", "--slo-tbt-p99", "1", "--target-peak", "0"), "--target-peak"),
    (("logs", "{t}", "--year", "0"), "--year"),
    (("size-swap", "{t}", "--sweep", "x"), "--sweep"),
    (("size-swap", "{t}", "--headroom", "nan"), "--headroom"),
    (("replay", "{t}", "--rate-scale", "inf"), "--rate-scale"),
    (("report", "{t}", "--workers", "-3"), "--workers"),
    (("replay", "{t}", "--kv-offloading-size", "nan"), "--kv-offloading-size"),
    (("replay", "{t}", "--kv-offloading-size", "-4"), "--kv-offloading-size"),
])
def test_bad_flag_is_one_line_naming_it(tmp_path, trace, args, flag):
    code, err = run(*(a.format(t=trace) for a in args), *(["--db", tmp_path / "k.duckdb"]
                                                          if args[0] in ("logs", "replay") else []))
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_report_to_an_existing_file_fails_before_any_work(tmp_path, trace):
    out = tmp_path / "report.txt"
    out.write_text("keep me")
    t0 = time.perf_counter()
    code, err = run("report", trace, "-o", out)
    assert code == 2 and "-o" in err and time.perf_counter() - t0 < 5
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("cmd", ["alerts", "calibrate"])
def test_directory_as_output_file(tmp_path, trace, cmd):
    args = ("alerts", trace, "-o", tmp_path) if cmd == "alerts" else ("calibrate", "--quick", "-o", tmp_path)
    code, err = run(*args)
    assert code == 2 and "folder" in err


def test_directory_or_bad_profile_as_calibration_fails_before_replaying(tmp_path, trace):
    code, err = run("replay", trace, "--calibration", tmp_path, "--db", tmp_path / "k.duckdb")
    assert code == 2 and "directory" in err
    bad = tmp_path / "p.json"
    bad.write_text('{"constants": {"overhead_s": NaN}}')
    code, err = run("replay", trace, "--calibration", bad, "--db", tmp_path / "k.duckdb")
    assert code == 2 and "overhead_s" in err and not (tmp_path / "k.duckdb").exists()


def test_sqlite_db_and_missing_db_for_validate(tmp_path, trace):
    import sqlite3
    db = tmp_path / "s.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    code, err = run("replay", trace, "--db", db)
    assert code == 2 and "SQLite" in err
    code, err = run("validate", "--db", tmp_path / "missing.duckdb", "--run", "x")
    assert code == 2 and "no such database" in err


def test_duckdb_error_from_an_analysis_is_one_line():
    import duckdb

    @guarded
    def cmd():
        duckdb.connect().execute("SELECT * FROM nope")
    with pytest.raises(typer.Exit) as exc:
        cmd()
    assert exc.value.exit_code == 2


def test_disk_full_is_one_line(capsys):
    @guarded
    def cmd():
        raise OSError(28, "No space left on device", "/full/index.html")
    with pytest.raises(typer.Exit):
        cmd()
    err = capsys.readouterr().err
    assert "No space left on device" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("committed,said", [(True, "was committed"), (False, "nothing was written")])
def test_interrupt_while_writing_tells_the_truth(capsys, committed, said):
    @guarded
    def cmd():
        raise WriteInterrupted("k.duckdb", committed=committed)
    with pytest.raises(typer.Exit) as exc:
        cmd()
    assert exc.value.exit_code == 130 and said in capsys.readouterr().err


def test_echoed_control_characters_are_escaped(capsys):
    with pytest.raises(typer.Exit):
        fail("bad header 'TIME\x1b[2J\x1b[31mSTAMP'\nsecond line")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b" in err and len(err.strip().splitlines()) == 1


def test_throughput_counts_produced_tokens_in_int64():
    from capacity.analyses.metrics import produced_tokens
    req = pl.DataFrame({"output_tokens": pl.Series([2**31 - 1, 2**31 - 1], dtype=pl.Int32),
                        "output_tokens_done": pl.Series([2**31 - 1, 100], dtype=pl.Int64)})
    assert req.select(produced_tokens(req).sum()).item() == 2**31 - 1 + 100
    # without output_tokens_done (older tables), the asked lengths, summed without wrapping
    only = req.drop("output_tokens_done")
    assert only.select(produced_tokens(only).sum()).item() == 2 * (2**31 - 1)


def test_swap_demand_series_is_sized_by_steps_not_span():
    """Item 7: a year-2100 timestamp made the per-second series 2.4e9 rows (18 GiB)."""
    from capacity.analyses.sizing import demand_series
    steps = pl.DataFrame({"start_s": [0.0, 0.5, 1.2, 5.0, 2.4e9], "evicted_blocks": [1, 3, 2, 4, 7],
                          "evicted_requests": [1, 2, 1, 1, 1]})
    s = demand_series(steps, 2**30)
    assert s.height <= 10
    assert s["t_s"].to_list() == [0.0, 1.0, 2.0, 4.0, 5.0, 6.0, 2.4e9 - 1, 2.4e9]
    assert s["gib"].to_list() == [3.0, 2.0, 0.0, 0.0, 4.0, 0.0, 0.0, 7.0]


def test_rule_files_get_umask_permissions_and_no_temp_file(tmp_path):
    import os
    import stat

    from capacity.report.build import write_atomic
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "rules.yml", "groups: []\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "rules.yml").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["rules.yml"]


def run_without_replays(monkeypatch, args, what: str):
    """`run(*args)` with every way to replay failing the test: a refusal must come first."""
    import capacity.analyses.sweep as sweep
    import replay.run

    def no_replay(*a, **k):
        raise AssertionError(f"replayed {what}")
    with monkeypatch.context() as m:
        m.setattr(sweep, "run_jobs", no_replay)
        m.setattr(replay.run, "replay", no_replay)
        return run(*args)


@pytest.mark.parametrize("cmd", ["report", "tune", "alerts"])
def test_one_year_2100_timestamp_is_refused_before_any_replay(tmp_path, monkeypatch, cmd):
    """Issue 13 item 7: one far-future timestamp made `report` bin 40M minutes (hours, GBs); the
    planning commands now refuse it at once, naming the request; `replay` still runs it."""
    rows = "".join(f"2023-11-16 18:15:{s:02d}.0000000,374,44\n" for s in range(20))
    f = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + "2100-01-01 00:00:00.0000000,374,44\n")
    args = {"report": ("report", f, "-o", tmp_path / "rep"),
            "tune": ("tune", f, "--max-num-seqs-grid", "8,16", "--slo-ttft-p99", "1",
                     "--slo-tbt-p99", "1"),
            "alerts": ("alerts", f, "-o", tmp_path / "rules.yml")}[cmd]
    code, err = run_without_replays(monkeypatch, args, "a trace the analyses cannot bin")
    assert code == 2 and "request_id 20 " in err and "years" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists()
    code, _ = run("replay", f, "--db", tmp_path / "k.duckdb", "--json")
    assert code == 0


@pytest.mark.parametrize("cmd", ["report", "headroom", "tune"])
@pytest.mark.parametrize("times,words", [((0.0, 0.0, 0.0), "all 3 requests arrive at t = 0 s"),
                                         ((7.0,), "one request has no request rate")])
def test_a_trace_without_a_rate_is_refused_before_any_replay(tmp_path, monkeypatch, cmd, times,
                                                              words):
    """An offline batch (every request at one instant) or a single request offers no rate, and
    every planning answer is a multiple of it: refused in one line; `kvcap replay` replays it."""
    f = tmp_path / "batch.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n"
                 + "".join(f"{t},{100 + i},5\n" for i, t in enumerate(times)))
    args = {"report": ("report", f, "-o", tmp_path / "rep"), "headroom": ("headroom", f),
            "tune": ("tune", f, "--max-num-seqs-grid", "8,16")}[cmd]
    code, err = run_without_replays(monkeypatch, args, "a trace with no rate")
    assert code == 2 and words in err and "--arrivals" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists()
    res = runner.invoke(app, ["replay", str(f), "--db", str(tmp_path / "k.duckdb"), "--json"])
    assert res.exit_code == 0
    if len(times) > 1:       # no 3e9 req/s offered by a 0-s span
        assert '"offered_rps": 0.0' in res.stdout and "a batch: all 3 requests" in res.stdout
