"""Issue 34 item 5: a `--db` kvcap will not use is refused in one line and left exactly as it was:
a foreign DuckDB file gains no table or column (the schema is checked read-only first), a FIFO
is refused without opening it (no hang), a dangling symbolic link is refused (never replaced by a
regular file), and a file cut short is refused by every command alike."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from capacity.evidence.logs import ingest_files, replace_table
from replay.results.store import StoreError

ROOT = Path(__file__).resolve().parents[1]
KVCAP_MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"
LOG = ("INFO 01-25 10:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
       "Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache "
       "usage: 1.0%, Prefix cache hit rate: 0.0%\n")


def run(*args):
    """kvcap of this checkout in a process of its own (replay writes in a thread of its own)."""
    res = subprocess.run([sys.executable, "-c", KVCAP_MAIN, *map(str, args)], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    return res.returncode, res.stderr


@pytest.fixture()
def files(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n1.0,30,4\n")
    log = tmp_path / "server.log"
    log.write_text(LOG)
    return t, log


def schema_of(db):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT table_name, column_name FROM information_schema.columns "
                           "ORDER BY 1, 2").fetchall()


@pytest.mark.parametrize("foreign_table", ["runs (id INTEGER, note VARCHAR)",
                                           "log_sources (source_file VARCHAR, x INTEGER)"])
def test_a_refused_command_never_changes_a_foreign_db(tmp_path, files, foreign_table):
    db = tmp_path / "foreign.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(f"CREATE TABLE {foreign_table}")
    before, size = schema_of(db), db.stat().st_size
    cmds = [("logs", files[1], "--db", db), ("attribute", "--db", db)]
    if foreign_table.startswith("runs"):
        cmds.append(("replay", files[0], "--db", db))
    for args in cmds:
        code, err = run(*args)
        assert code == 2 and (args[0] == "attribute" or "not written by this kvcap" in err), (args, err)
        assert len(err.strip().splitlines()) == 1
        assert schema_of(db) == before, args
    with pytest.raises(StoreError):
        replace_table(db, "attribution", __import__("polars").DataFrame({"a": [1]}))
    assert schema_of(db) == before and db.stat().st_size == size


def test_a_fifo_as_db_is_refused_without_hanging(tmp_path, files):
    db = tmp_path / "k.duckdb"
    os.mkfifo(db)
    for args in (("replay", files[0], "--db", db), ("logs", files[1], "--db", db),
                 ("runs", "--db", db), ("attribute", "--db", db)):
        code, err = run(*args)          # opening the FIFO would block forever
        assert code == 2 and "FIFO" in err and len(err.strip().splitlines()) == 1, (args, err)


def test_a_dangling_db_symlink_is_refused_never_replaced(tmp_path, files):
    db = tmp_path / "k.duckdb"
    db.symlink_to(tmp_path / "gone" / "k.duckdb")
    for args in (("replay", files[0], "--db", db), ("logs", files[1], "--db", db)):
        code, err = run(*args)
        assert code == 2 and "symbolic link" in err, err
        assert db.is_symlink() and not db.exists()


def test_a_db_symlink_to_a_database_is_followed(tmp_path, files):
    real = tmp_path / "real.duckdb"
    ingest_files([files[1]], real, year=2025)
    link = tmp_path / "link.duckdb"
    link.symlink_to(real)
    code, err = run("runs", "--db", link)
    assert code == 0, err
    assert link.is_symlink()


def test_a_truncated_db_is_refused_by_every_command(tmp_path, files):
    db = tmp_path / "k.duckdb"
    code, err = run("replay", files[0], "--db", db)
    assert code == 0, err
    ingest_files([files[1]], db, year=2025)
    with duckdb.connect(str(db)) as con:
        con.execute("CHECKPOINT")
    cut = tmp_path / "cut.duckdb"
    shutil.copy(db, cut)
    os.truncate(cut, cut.stat().st_size // 2)
    size = cut.stat().st_size
    for args in (("runs", "--db", cut), ("replay", files[0], "--max-num-seqs", "3", "--db", cut),
                 ("logs", files[1], "--db", cut), ("attribute", "--db", cut)):
        code, err = run(*args)
        assert code == 2 and "truncated" in err and len(err.strip().splitlines()) == 1, (args, err)
    assert cut.stat().st_size == size and not os.path.exists(f"{cut}.wal")
    code, err = run("runs", "--db", db)                 # the whole file still reads
    assert code == 0, err
