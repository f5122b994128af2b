"""The store writer (replay/results/writer.py): `kvcap replay`'s DuckDB write done by a thread while the
compiled core runs. The file it writes reads back exactly as `store.write_run`'s (every table,
row order included), whatever the chunking; it is one transaction: a failure or Ctrl-C leaves
the file as it was, and Ctrl-C during COMMIT says that the run was written."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest

from replay.config import EngineConfig
from replay.engine import compiled
from replay.results import store
from replay.results.writer import RunWriter
from replay.run import replay
from traces.synth import synthesize


@pytest.fixture(scope="module")
def trace():
    return synthesize("poisson", duration_s=120, rate_rps=8, seed=3)


CONFIG = EngineConfig(num_gpu_blocks_override=300, max_num_seqs=64)   # preemptions: events


def dump(db) -> dict:
    """Every table as stored, in stored row order (the run's clock fields left out)."""
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                "ORDER BY 1").fetchall():
        cols = [c for (c,) in con.execute(f"SELECT column_name FROM information_schema.columns "
                                          f"WHERE table_name = '{table}' ORDER BY ordinal_position"
                                          ).fetchall() if c not in ("created_at", "wall_seconds")]
        out[table] = con.sql(f"SELECT {', '.join(cols)} FROM {table}").pl()
    con.close()
    return out


def assert_same_files(a, b):
    da, db_ = dump(a), dump(b)
    assert da.keys() == db_.keys()
    for table in da:
        assert da[table].equals(db_[table], null_equal=True), table


def streamed_write(db, trace, config=CONFIG, **kw):
    with RunWriter(db) as w:
        result = replay(trace, config, step_sink=w, **kw)
        w.commit(result.tables())
        w.wait()
    return result


@pytest.mark.parametrize("sink_every,spill_every",
                         [(97, None), (1000, None), (64, 300)])
def test_streamed_write_reads_back_as_write_run(tmp_path, trace, monkeypatch, sink_every,
                                                spill_every):
    whole = replay(trace, CONFIG, record_batches=True)
    store.write_run(tmp_path / "a.duckdb", whole.tables())
    monkeypatch.setattr(compiled, "SINK_EVERY_STEPS", sink_every)
    if spill_every:
        monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", spill_every)
    got = streamed_write(tmp_path / "b.duckdb", trace, record_batches=True,
                         spill_dir=str(tmp_path) if spill_every else None)
    assert got.steps.height == whole.steps.height > 3 * sink_every
    assert_same_files(tmp_path / "a.duckdb", tmp_path / "b.duckdb")


def test_a_rerun_replaces_the_run_and_the_reference_writes_everything_at_commit(tmp_path, trace):
    db = tmp_path / "k.duckdb"
    streamed_write(db, trace)
    streamed_write(db, trace)                     # the same run id: replaced, not doubled
    ref = tmp_path / "ref.duckdb"
    streamed_write(ref, trace.head(50), implementation="reference")
    store.write_run(tmp_path / "ref2.duckdb",
                    replay(trace.head(50), CONFIG, implementation="reference").tables())
    assert_same_files(ref, tmp_path / "ref2.duckdb")
    plain = tmp_path / "plain.duckdb"
    store.write_run(plain, replay(trace, CONFIG).tables())
    assert_same_files(db, plain)


def test_a_failed_replay_leaves_the_file_as_it_was(tmp_path, trace, monkeypatch):
    db = tmp_path / "k.duckdb"
    store.write_run(db, replay(trace.head(20), CONFIG).tables())
    before = dump(db)
    monkeypatch.setattr(compiled, "SINK_EVERY_STEPS", 50)
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with RunWriter(db) as w:
                replay(trace, CONFIG, step_sink=w)     # chunks appended, nothing committed
                raise error
        after = dump(db)
        assert after.keys() == before.keys()
        assert all(after[t].equals(before[t], null_equal=True) for t in before)
    new = tmp_path / "new.duckdb"
    with pytest.raises(RuntimeError):
        with RunWriter(new) as w:
            replay(trace, CONFIG, step_sink=w)
            raise RuntimeError("boom")
    assert not new.exists() and not (tmp_path / "new.duckdb.wal").exists()


def test_a_locked_database_stops_the_replay_with_the_store_error(tmp_path, trace, monkeypatch):
    db = tmp_path / "k.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb,time; c=duckdb.connect("
                               f"{str(db)!r}); print('ok', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        monkeypatch.setattr(compiled, "SINK_EVERY_STEPS", 50)
        with pytest.raises(store.StoreLocked, match="locked by another process"):
            streamed_write(db, trace)
    finally:
        holder.kill()
        holder.wait()


def test_ctrl_c_during_commit_waits_for_it_and_says_written(tmp_path, trace, monkeypatch):
    started = threading.Event()
    real = store.RunWrite.commit

    def slow_commit(self):
        started.set()
        time.sleep(0.5)             # Ctrl-C lands here
        real(self)
    monkeypatch.setattr(store.RunWrite, "commit", slow_commit)
    db = tmp_path / "k.duckdb"
    threading.Thread(target=lambda: started.wait(30) and os.kill(os.getpid(), signal.SIGINT)
                     ).start()
    with pytest.raises(store.WriteInterrupted) as exc:
        streamed_write(db, trace)
    assert exc.value.committed is True
    assert dump(db)["runs"].height == 1


def test_ctrl_c_before_commit_says_nothing_was_written(tmp_path, trace, monkeypatch):
    real = store.RunWrite.append_tables
    hold = threading.Event()

    def stuck(self, tables, **kw):
        hold.wait(30)               # Ctrl-C lands while the last tables are being appended
        real(self, tables, **kw)
    db = tmp_path / "k.duckdb"
    store.write_run(db, replay(trace.head(20), CONFIG).tables())
    monkeypatch.setattr(store.RunWrite, "append_tables", stuck)   # the streamed write only

    def interrupt():
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        hold.set()
    threading.Thread(target=interrupt).start()
    with pytest.raises(store.WriteInterrupted) as exc:
        streamed_write(db, trace)
    assert exc.value.committed is False
    assert dump(db)["runs"].height == 1                  # only the earlier run
