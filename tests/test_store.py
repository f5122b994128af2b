"""The DuckDB store: one transaction per run, idempotent per run_id, clear lock error."""
import subprocess
import sys
import textwrap
import time

import polars as pl
import pytest

from replay.results import store


def tables(run_id: str, n: int = 3) -> dict[str, pl.DataFrame]:
    return {
        "runs": pl.DataFrame({"run_id": [run_id], "label": ["t"], "status": ["completed"],
                              "sim_seconds": [1.0]}),
        "requests": pl.DataFrame({"run_id": [run_id] * n, "request_id": list(range(n)),
                                  "arrival_s": [0.0] * n, "status": ["finished"] * n}),
        "steps": pl.DataFrame({"run_id": [run_id] * 2, "step": [1, 2], "start_s": [0.0, 0.1],
                               "duration_s": [0.1, 0.1]}),
    }


def count(db, table, run_id):
    return store.read_table(db, table, run_id).height


def test_write_is_idempotent_per_run_id(tmp_path):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    store.write_run(db, tables("a", n=5))      # rerun replaces
    store.write_run(db, tables("b"))
    assert count(db, "requests", "a") == 5
    assert count(db, "runs", "a") == 1
    assert count(db, "requests", "b") == 3
    assert set(store.list_runs(db)["run_id"]) == {"a", "b"}


def test_failure_mid_write_leaves_no_partial_run(tmp_path):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    bad = tables("b")
    bad["steps"] = pl.DataFrame({"run_id": ["b"], "step": ["not-a-number"]})
    with pytest.raises(Exception):
        store.write_run(db, bad)
    assert count(db, "runs", "b") == 0 and count(db, "requests", "b") == 0
    assert count(db, "requests", "a") == 3


def test_second_writer_gets_a_clear_lock_error(tmp_path):
    db = tmp_path / "k.duckdb"
    store.write_run(db, tables("a"))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys, time
        con = duckdb.connect({str(db)!r})
        print("ready", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(store.StoreLocked, match="locked by another process"):
            store.write_run(db, tables("b"))
    finally:
        holder.kill()
        holder.wait()


def test_all_null_columns_of_every_schema_type_are_typed(tmp_path):
    """An all-NULL column is typed from the schema before DuckDB reads it over the Arrow C stream
    (it refuses polars' untyped Null arrays): every column of every table, run_id included."""
    from replay.results import store
    with store.connect(tmp_path / "n.duckdb") as con:
        store.ensure_schema(con)
        for table, spec in store.SCHEMA.items():
            cols = store._columns(table)
            # runs.run_id is the primary key (NOT NULL): there the other columns are all NULL.
            key = {"run_id": ["r"]} if "PRIMARY KEY" in spec else {}
            store._insert(con, table, pl.DataFrame({c: [None] for c in cols} | key))
            want = tuple("r" if key and c == "run_id" else None for c in cols)
            assert con.execute(f"SELECT * FROM {table}").fetchall() == [want], table


def test_a_constant_run_id_is_written_as_given_and_a_mixed_one_row_by_row(tmp_path):
    """The store hands DuckDB a one-valued run_id as a constant (a spilled table has none)."""
    from replay.results import store
    with store.connect(tmp_path / "c.duckdb") as con:
        store.ensure_schema(con)
        store._insert(con, "tbt", pl.DataFrame({"tbt_s": [0.5, 0.25], "weight": [1, 2]}),
                      run_id="r1")
        store._insert(con, "tbt", pl.DataFrame({"run_id": ["r2", "r2"], "tbt_s": [1.0, 2.0],
                                                "weight": [3, 4]}), run_id="ignored")
        store._insert(con, "fleets", pl.DataFrame({"fleet_id": ["f", "f"], "replica": [0, 1],
                                                   "run_id": ["a", "b"]}))
        assert con.execute("SELECT * FROM tbt").fetchall() == [
            ("r1", 0.5, 1), ("r1", 0.25, 2), ("r2", 1.0, 3), ("r2", 2.0, 4)]
        assert con.execute("SELECT replica, run_id FROM fleets").fetchall() == [(0, "a"), (1, "b")]




def test_store_runs_without_steps_keeps_everything_else(tmp_path):
    """The report folder's rule for day-long runs: no steps/tbt rows, the rest in full."""
    import duckdb

    from capacity.cli.common import store_runs
    from replay.config import EngineConfig
    from replay.run import replay
    from traces.synth import synthesize
    trace = synthesize("poisson", rate_rps=2.0, duration_s=10.0)
    a = replay(trace, EngineConfig(), label="kept")
    b = replay(trace, EngineConfig(max_num_seqs=4), label="omitted")
    db = tmp_path / "k.duckdb"
    store_runs(db, [a, b], without_steps={b.run_id})
    with duckdb.connect(str(db), read_only=True) as con:
        def count(table, run):
            return con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run]).fetchall()[0][0]
        assert count("steps", a.run_id) == a.run["num_steps"] > 0 and count("tbt", a.run_id) > 0
        assert count("steps", b.run_id) == 0 and count("tbt", b.run_id) == 0
        assert count("requests", b.run_id) == trace.height and count("runs", b.run_id) == 1
