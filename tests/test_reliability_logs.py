"""Issue 13, items 2, 9, 10 on the evidence side: log files with the same name from different
folders are kept apart (no silent replacement), several servers in one file are split by `pid=`,
a December log read in January gets last year, out-of-range numbers are reported, not stored."""
from __future__ import annotations

from datetime import datetime

import duckdb

from capacity.evidence import logs
from capacity.evidence.logparse import parse_server_log
from capacity.evidence.logs import ingest

V1 = ("(APIServer pid={pid}) INFO 05-22 14:00:{s:02d} [loggers.py:248] Engine 000: Avg prompt throughput: "
      "2400.0 tokens/s, Avg generation throughput: 960.0 tokens/s, Running: {run} reqs, Waiting: 0 reqs, "
      "GPU KV cache usage: {usage}%, Prefix cache hit rate: 35.2%\n")


def log_text(pid: int, run: int, n: int = 3, usage: str = "61.0") -> str:
    return "".join(V1.format(pid=pid, s=10 * i, run=run, usage=usage) for i in range(n))


def rows(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_same_name_in_two_folders_are_two_sources(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "server.log", tmp_path / "b" / "server.log"
    a.write_text(log_text(1, run=10))
    b.write_text(log_text(2, run=20))
    db = tmp_path / "k.duckdb"
    ingest([a, b], db, year=2025)
    got = dict(rows(db, "SELECT source_file, max(running) FROM log_stats GROUP BY 1"))
    assert sorted(got.values()) == [10, 20] and len(got) == 2
    # Re-ingesting one of them later replaces only its own rows.
    ingest([b], db, year=2025)
    assert sorted(dict(rows(db, "SELECT source_file, count(*) FROM log_stats GROUP BY 1")).values()) == [3, 3]


def test_same_name_later_from_another_folder_does_not_replace(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "server.log").write_text(log_text(1, run=10))
    (tmp_path / "b" / "server.log").write_text(log_text(2, run=20))
    db = tmp_path / "k.duckdb"
    ingest([tmp_path / "a" / "server.log"], db, year=2025)
    ingest([tmp_path / "b" / "server.log"], db, year=2025)
    assert sorted(r[0] for r in rows(db, "SELECT DISTINCT running FROM log_stats")) == [10, 20]
    ingest([tmp_path / "a" / "server.log"], db, year=2025)  # itself again: replaced, not doubled
    assert rows(db, "SELECT count(*) FROM log_stats")[0][0] == 6


def test_two_servers_in_one_file_are_kept_apart_by_pid(tmp_path):
    lines = [l for pair in zip(log_text(11, run=5).splitlines(True), log_text(22, run=50).splitlines(True))
             for l in pair]
    parsed = parse_server_log(lines, "compose.log", 2025)
    by = {s: parsed.stats.filter(parsed.stats["source_file"] == s) for s in set(parsed.stats["source_file"])}
    assert set(by) == {"compose.log pid=11", "compose.log pid=22"}
    assert by["compose.log pid=11"]["running"].to_list() == [5, 5, 5]
    # each server's interval is measured on its own lines (10 s), not between interleaved ones (0 s)
    assert by["compose.log pid=22"]["interval_s"].drop_nulls().to_list()[-1] == 10.0
    f = tmp_path / "compose.log"
    f.write_text("".join(lines))
    db = tmp_path / "k.duckdb"
    ingest([f], db, year=2025)
    ingest([f], db, year=2025)  # idempotent for the split sources too
    assert rows(db, "SELECT count(*) FROM log_stats")[0][0] == 6


def test_december_log_read_in_january_is_last_year(tmp_path, monkeypatch):
    f = tmp_path / "server.log"
    f.write_text(log_text(1, run=3).replace("05-22", "12-31"))

    class January(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2027, 1, 2, 9, 0, 0)
    monkeypatch.setattr(logs, "datetime", January)
    db = tmp_path / "k.duckdb"
    ingest([f], db)
    (t,), = rows(db, "SELECT min(time) FROM log_stats")
    assert t.year == 2026


def test_out_of_range_numbers_are_unparsed_lines_not_rows():
    lines = [V1.format(pid=1, s=0, run=3_000_000_000, usage="10.0"),
             V1.format(pid=1, s=10, run=3, usage="250.0"),
             V1.format(pid=1, s=20, run=3, usage="50.0")]
    parsed = parse_server_log(lines, "s.log", 2025)
    assert parsed.stats.height == 1
    assert parsed.unparsed["line"].to_list() == [1, 2]
    reasons = " ".join(parsed.unparsed["reason"].to_list())
    assert "out of range" in reasons and "percentage" in reasons


def test_negative_or_nan_itl_in_client_results_is_refused(tmp_path):
    import json

    import pytest

    from capacity.evidence.clientparse import ClientFormatError, vllm_bench_tokens
    good = {"ttfts": [0.1, 0.2], "itls": [[0.01, 0.02], [0.03]], "start_times": [0.0, 1.0]}
    assert vllm_bench_tokens(good, "b.json").height == 5
    for itls in ([[0.01, -0.02], [0.03]], [[0.01, float("nan")], [0.03]]):
        with pytest.raises(ClientFormatError, match="request 0"):
            vllm_bench_tokens({**good, "itls": itls}, "b.json")
    assert json.dumps(good)  # the fixture itself is plain JSON


def test_failed_ingest_into_a_new_db_leaves_no_file(tmp_path, monkeypatch):
    """Issue 13 item 4: a failure (here Ctrl-C while the second log is parsed) after the new DB was
    opened removes it and its .wal; an existing DB keeps its earlier sources untouched."""
    import pytest

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(log_text(1, run=10))
    b.write_text(log_text(2, run=20))
    real = logs.parse_server_log
    seen = []

    def interrupted(f, name, year):
        seen.append(name)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(f, name, year)

    monkeypatch.setattr(logs, "parse_server_log", interrupted)
    db = tmp_path / "new.duckdb"
    with pytest.raises(KeyboardInterrupt):
        ingest([a, b], db, year=2025)
    assert len(seen) == 2 and not db.exists() and not (tmp_path / "new.duckdb.wal").exists()

    monkeypatch.setattr(logs, "parse_server_log", real)
    ingest([a], db, year=2025)
    seen.clear()
    monkeypatch.setattr(logs, "parse_server_log", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ingest([a, b], db, year=2025)
    assert rows(db, "SELECT count(*) FROM log_sources") == [(1,)]
