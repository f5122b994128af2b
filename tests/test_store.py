"""The DuckDB store: one transaction per run, idempotent per run_id, clear lock error."""
import subprocess
import sys
import textwrap
import time

import polars as pl
import pytest

from replay import store


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


def test_every_schema_type_has_a_null_column_type():
    """An all-NULL column is typed from the schema before DuckDB reads it over the Arrow C stream
    (it refuses polars' untyped Null arrays): every type our tables use must be mapped."""
    from replay import store
    kinds = {kind for table in store.SCHEMA for kind in store._columns(table).values()}
    assert kinds <= set(store._POLARS_TYPE), kinds - set(store._POLARS_TYPE)
