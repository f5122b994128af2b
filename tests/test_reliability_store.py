"""Issue 13, items 4, 6, 8 on the store side, and atomic Parquet outputs: DuckDB problems are one
line naming the file (no extension download for a SQLite file), a failed append shows the real
error, an interrupt during COMMIT tells the truth, and no half-written file is left behind."""
from __future__ import annotations

import os
import signal
import sqlite3
import stat

import duckdb
import polars as pl
import pytest

from replay.results import store
from traces.loaders import load_trace, write_trace
from traces.schema import TraceError


def tables(run_id: str, n: int = 3, **runs) -> dict[str, pl.DataFrame]:
    return {
        "runs": pl.DataFrame({"run_id": [run_id], "label": ["t"], "status": ["completed"],
                              "sim_seconds": [1.0], **{k: [v] for k, v in runs.items()}}),
        "requests": pl.DataFrame({"run_id": [run_id] * n, "request_id": list(range(n)),
                                  "arrival_s": [0.0] * n, "status": ["finished"] * n}),
    }


def one_line_store_error(fn, *args, match: str) -> str:
    with pytest.raises(store.StoreError, match=match) as exc:
        fn(*args)
    assert "\n" not in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"hello, I am text\n" * 10, "not a DuckDB"),
                                           (b"\x00" * 8 + b"DUCX" + os.urandom(4000), "not a DuckDB")])
def test_bad_db_files_are_one_line(tmp_path, content, match):
    db = tmp_path / "k.duckdb"
    db.write_bytes(content)
    one_line_store_error(store.write_run, db, tables("a"), match=match)
    one_line_store_error(store.list_runs, db, match=match)
    assert db.read_bytes() == content  # untouched


def test_corrupt_duckdb_file_is_one_line(tmp_path):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    data = bytearray(db.read_bytes())
    data[4096:] = os.urandom(len(data) - 4096)
    db.write_bytes(bytes(data))
    with pytest.raises(store.StoreError) as exc:
        store.list_runs(db)
        store.write_run(db, tables("b"))
    assert "\n" not in str(exc.value) and str(db) in str(exc.value)


def test_sqlite_file_is_refused_without_an_extension_download(tmp_path):
    db = tmp_path / "k.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (x)")
    con.commit()
    con.close()
    msg = one_line_store_error(store.list_runs, db, match="SQLite")
    assert "extension" not in msg.lower() and "INSTALL" not in msg


def test_missing_db_for_reading_and_directory(tmp_path):
    one_line_store_error(store.list_runs, tmp_path / "missing.duckdb", match="no such database")
    one_line_store_error(store.write_run, tmp_path, tables("a"), match="is a directory")
    one_line_store_error(store.write_run, tmp_path / "no" / "k.duckdb", tables("a"),
                         match="does not exist")


def test_foreign_schema_is_named(tmp_path):
    db = tmp_path / "k.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE runs (run_id VARCHAR, colour VARCHAR)")
    con.close()
    one_line_store_error(store.write_run, db, tables("a"), match="runs lacks columns")


def test_integer_overflow_is_named_before_writing(tmp_path):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    one_line_store_error(store.write_run, db, tables("b", max_num_seqs=2**31), match="runs.max_num_seqs")
    assert set(store.list_runs(db)["run_id"]) == {"a"}


def test_read_only_database_is_one_line(tmp_path, monkeypatch):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))

    def refuse(*args, **kwargs):
        raise duckdb.IOException(f'IO Error: Cannot open file "{db}": Read-only file system')
    monkeypatch.setattr(store.duckdb, "connect", refuse)
    one_line_store_error(store.write_run, db, tables("b"), match="Read-only file system")


class _Con:
    """A DuckDB connection whose COMMIT misbehaves like a full disk or a Ctrl-C."""

    def __init__(self, con, on_commit):
        self._con, self._on_commit = con, on_commit

    def execute(self, sql, *args):
        if sql == "COMMIT":
            return self._on_commit(self._con)
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def patch_commit(monkeypatch, on_commit):
    real = duckdb.connect
    monkeypatch.setattr(store.duckdb, "connect", lambda *a, **k: _Con(real(*a, **k), on_commit))


def test_failed_commit_shows_the_real_error_and_a_new_db_is_removed(tmp_path, monkeypatch):
    def disk_full(con):
        con.execute("ROLLBACK")  # DuckDB ends the transaction when its COMMIT fails
        raise duckdb.IOException("IO Error: Could not write file: No space left on device")
    patch_commit(monkeypatch, disk_full)
    db = tmp_path / "new.duckdb"
    msg = one_line_store_error(store.write_run, db, tables("a"), match="No space left on device")
    assert "cannot rollback" not in msg
    assert not db.exists() and not (tmp_path / "new.duckdb.wal").exists()


def test_failed_commit_on_an_existing_db_keeps_it(tmp_path, monkeypatch):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))

    def disk_full(con):
        con.execute("ROLLBACK")
        raise duckdb.IOException("IO Error: No space left on device")
    patch_commit(monkeypatch, disk_full)
    one_line_store_error(store.write_run, db, tables("b"), match="No space left")
    monkeypatch.undo()
    assert set(store.list_runs(db)["run_id"]) == {"a"}


def test_ctrl_c_during_commit_is_deferred_and_reported_as_written(tmp_path, monkeypatch):
    def commit_then_ctrl_c(con):
        result = con.execute("COMMIT")
        os.kill(os.getpid(), signal.SIGINT)
        return result
    patch_commit(monkeypatch, commit_then_ctrl_c)
    db = tmp_path / "k.duckdb"
    with pytest.raises(store.WriteInterrupted) as exc:
        store.write_run(db, tables("a"))
    assert exc.value.committed is True
    monkeypatch.undo()
    assert set(store.list_runs(db)["run_id"]) == {"a"}


def test_ctrl_c_during_insert_writes_nothing(tmp_path, monkeypatch):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    real = duckdb.connect

    class Interrupting(_Con):
        def from_arrow(self, table):
            class Rel:
                def __init__(self, rel):
                    self._rel = rel

                def project(self, *exprs):
                    return Rel(self._rel.project(*exprs))

                def insert_into(self, name):
                    if name == "requests":
                        raise KeyboardInterrupt
                    return self._rel.insert_into(name)
            return Rel(self._con.from_arrow(table))
    monkeypatch.setattr(store.duckdb, "connect", lambda *a, **k: Interrupting(real(*a, **k), None))
    with pytest.raises(store.WriteInterrupted) as exc:
        store.write_run(db, tables("b"))
    assert exc.value.committed is False
    monkeypatch.undo()
    assert set(store.list_runs(db)["run_id"]) == {"a"}


def small_trace() -> pl.DataFrame:
    return load_trace_text("arrival_s,prompt_tokens,output_tokens\n0,5,3\n1,6,2\n")


def load_trace_text(text: str) -> pl.DataFrame:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.csv"
        p.write_text(text)
        return load_trace(p)


def test_parquet_output_has_umask_permissions_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "t.parquet"
        write_trace(small_trace(), out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_parquet_output_failure_leaves_nothing(tmp_path, monkeypatch):
    def full(self, path, *a, **k):
        with open(path, "wb") as fh:
            fh.write(b"PAR1 half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    with pytest.raises(OSError, match="No space left on device") as exc:
        write_trace(small_trace(), tmp_path / "t.parquet")
    assert exc.value.filename == str(tmp_path / "t.parquet")
    assert list(tmp_path.iterdir()) == []


def test_parquet_output_to_a_directory_is_one_line(tmp_path):
    with pytest.raises(TraceError, match="is a directory"):
        write_trace(small_trace(), tmp_path)


def test_atomic_write_on_a_full_disk_leaves_nothing_and_names_the_file(tmp_path, monkeypatch):
    from pathlib import Path

    from traces import atomic
    target = tmp_path / "index.html"
    target.write_text("the old report")

    def half(self, data, *args, **kwargs):
        with open(self, "w") as fh:
            fh.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(OSError) as exc:
        atomic.write_text(target, "<html>" + "x" * 1000)
    monkeypatch.undo()
    assert exc.value.filename == str(target) and "No space" in exc.value.strerror
    assert target.read_text() == "the old report" and [p.name for p in tmp_path.iterdir()] == ["index.html"]
