"""The DuckDB store: appends a run's tables to a DuckDB file in one transaction (DESIGN §6).

Idempotent per `run_id` (a rerun replaces that run's rows). An interrupted write leaves the file
valid and without a partial run (the transaction never commits). DuckDB admits one writer process:
a second one gets `StoreLocked` with a clear message instead of a traceback.
The only module of `replay` that imports duckdb; SQL lives here (and in capacity's analyses).
DuckDB 2.0: `con.execute()` keeps an open result until it is fetched to the end, so queries that
return rows go through `con.sql(...)` relations (`.pl()`) or `execute(...).fetchall()`.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl

DEFAULT_DB = "kvcap.duckdb"

SCHEMA = {
    "runs": """run_id VARCHAR PRIMARY KEY, created_at TIMESTAMP, label VARCHAR,
        trace_name VARCHAR, trace_sha256 VARCHAR, num_requests BIGINT, scheduler VARCHAR,
        model VARCHAR, gpu VARCHAR, tp INTEGER, block_size INTEGER, num_gpu_blocks BIGINT,
        num_cpu_blocks BIGINT, max_num_seqs INTEGER, max_num_batched_tokens INTEGER,
        preemption_mode VARCHAR, swap_space_gib DOUBLE, on_swap_full VARCHAR, executor VARCHAR,
        status VARCHAR, sim_seconds DOUBLE, wall_seconds DOUBLE, config_json VARCHAR,
        kvcap_version VARCHAR, num_steps BIGINT, kv_bytes_per_block BIGINT, abort_s DOUBLE,
        abort_reason VARCHAR, implementation VARCHAR""",
    "requests": """run_id VARCHAR, request_id BIGINT, arrival_s DOUBLE, priority INTEGER,
        tenant VARCHAR, prompt_tokens INTEGER, output_tokens INTEGER, first_scheduled_s DOUBLE,
        first_token_s DOUBLE, finish_s DOUBLE, status VARCHAR, num_preemptions INTEGER,
        num_swaps INTEGER, num_recomputes INTEGER, recomputed_tokens BIGINT,
        cached_prompt_tokens BIGINT, output_tokens_done BIGINT, max_tbt_s DOUBLE""",
    "steps": """run_id VARCHAR, step BIGINT, start_s DOUBLE, duration_s DOUBLE,
        num_running INTEGER, num_waiting INTEGER, num_swapped INTEGER,
        num_prefill_tokens BIGINT, num_decode_tokens BIGINT, gpu_blocks_used BIGINT,
        cpu_blocks_used BIGINT, swap_out_blocks INTEGER, swap_in_blocks INTEGER,
        num_preempted INTEGER, evicted_requests INTEGER, evicted_blocks BIGINT""",
    "events": """run_id VARCHAR, t_s DOUBLE, step BIGINT, request_id BIGINT, kind VARCHAR,
        blocks BIGINT, bytes BIGINT, log_line VARCHAR""",
    "stalls": """run_id VARCHAR, request_id BIGINT, preempted_s DOUBLE, resumed_s DOUBLE,
        stall_s DOUBLE, mode VARCHAR""",
    "tbt": "run_id VARCHAR, tbt_s DOUBLE, weight BIGINT",
}


class StoreLocked(RuntimeError):
    """Another process holds the DuckDB file."""


@contextmanager
def connect(path: str | Path, *, read_only: bool = False):
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as e:
        if "lock" in str(e).lower():
            raise StoreLocked(f"database {path} is locked by another process; "
                              "wait for it to finish or use another --db") from None
        raise
    try:
        yield con
    finally:
        con.close()


def ensure_schema(con) -> None:
    for table, cols in SCHEMA.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
    # Files written before runs.implementation ('compiled' | 'reference') existed gain it (NULL).
    con.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS implementation VARCHAR")


def write_run(path: str | Path, tables: dict[str, pl.DataFrame]) -> None:
    """Append one run (all tables) atomically; replaces an earlier run with the same run_id."""
    run_id = tables["runs"]["run_id"][0]
    with connect(path) as con:
        ensure_schema(con)
        con.execute("BEGIN TRANSACTION")
        try:
            for table in SCHEMA:
                con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
                df = tables.get(table)
                if df is None or df.height == 0:
                    continue
                con.register("_incoming", df.to_arrow())
                con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _incoming")
                con.unregister("_incoming")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


def read_table(path: str | Path, table: str, run_id: str | None = None) -> pl.DataFrame:
    with connect(path, read_only=True) as con:
        sql = f"SELECT * FROM {table}" + (" WHERE run_id = $1" if run_id else "")
        return con.sql(sql, params=[run_id] if run_id else None).pl()


def list_runs(path: str | Path) -> pl.DataFrame:
    with connect(path, read_only=True) as con:
        (has_runs,), = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchall()
        if not has_runs:
            return pl.DataFrame()
        return con.sql("SELECT run_id, created_at, label, trace_name, scheduler, model, gpu, "
                           "max_num_seqs, preemption_mode, status, num_requests, sim_seconds, "
                           "wall_seconds FROM runs ORDER BY created_at").pl()
