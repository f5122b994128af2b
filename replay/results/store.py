"""The DuckDB store: appends a run's tables to a DuckDB file in one transaction (DESIGN §6).

Idempotent per `run_id` (a rerun replaces that run's rows). An interrupted write leaves the file
valid and without a partial run (the transaction never commits). DuckDB admits one writer process:
a second one gets `StoreLocked` with a clear message instead of a traceback.
The only module of `replay` that imports duckdb; SQL lives here (and in capacity's analyses).
DuckDB 2.0: `con.execute()` keeps an open result until it is fetched to the end, so queries that
return rows go through `con.sql(...)` relations (`.pl()`) or `execute(...).fetchall()`.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl

# The file checks and the store's errors live in replay.results.dbfile (no DuckDB import: the
# command line checks --db and reports errors without loading DuckDB); they are the store's API too.
from replay.results.dbfile import (DEFAULT_DB, StoreError, StoreLocked,  # noqa: F401
                                   WriteInterrupted, check_db_file, remove_db, truncated)

WRITE_MEMORY_LIMIT = "512MB"

SCHEMA = {
    "runs": """run_id VARCHAR PRIMARY KEY, created_at TIMESTAMP, label VARCHAR,
        trace_name VARCHAR, trace_sha256 VARCHAR, num_requests BIGINT, scheduler VARCHAR,
        model VARCHAR, gpu VARCHAR, tp INTEGER, block_size INTEGER, num_gpu_blocks BIGINT,
        num_cpu_blocks BIGINT, max_num_seqs INTEGER, max_num_batched_tokens INTEGER,
        preemption_mode VARCHAR, swap_space_gib DOUBLE, on_swap_full VARCHAR, executor VARCHAR,
        status VARCHAR, sim_seconds DOUBLE, wall_seconds DOUBLE, config_json VARCHAR,
        kvcap_version VARCHAR, num_steps BIGINT, kv_bytes_per_block BIGINT, abort_s DOUBLE,
        abort_reason VARCHAR, implementation VARCHAR, async_scheduling BOOLEAN,
        kv_offloading BOOLEAN, hash_block_tokens INTEGER, vllm_version VARCHAR,
        recompute_tax DOUBLE, offered_rps DOUBLE, rate_scale DOUBLE, arrivals VARCHAR""",
    "requests": """run_id VARCHAR, request_id BIGINT, arrival_s DOUBLE, priority INTEGER,
        tenant VARCHAR, prompt_tokens INTEGER, output_tokens INTEGER, first_scheduled_s DOUBLE,
        first_token_s DOUBLE, finish_s DOUBLE, status VARCHAR, num_preemptions INTEGER,
        num_swaps INTEGER, num_recomputes INTEGER, recomputed_tokens BIGINT,
        cached_prompt_tokens BIGINT, output_tokens_done BIGINT, max_tbt_s DOUBLE,
        gpu_hit_tokens BIGINT, cpu_hit_tokens BIGINT""",
    "steps": """run_id VARCHAR, step BIGINT, start_s DOUBLE, duration_s DOUBLE,
        num_running INTEGER, num_waiting INTEGER, num_swapped INTEGER,
        num_prefill_tokens BIGINT, num_decode_tokens BIGINT, gpu_blocks_used BIGINT,
        cpu_blocks_used BIGINT, swap_out_blocks INTEGER, swap_in_blocks INTEGER,
        num_preempted INTEGER, evicted_requests INTEGER, evicted_blocks BIGINT,
        offload_store_blocks BIGINT, offload_load_blocks BIGINT""",
    "events": """run_id VARCHAR, t_s DOUBLE, step BIGINT, request_id BIGINT, kind VARCHAR,
        blocks BIGINT, bytes BIGINT, log_line VARCHAR, seq INTEGER""",
    "stalls": """run_id VARCHAR, request_id BIGINT, preempted_s DOUBLE, resumed_s DOUBLE,
        stall_s DOUBLE, mode VARCHAR""",
    "tbt": "run_id VARCHAR, tbt_s DOUBLE, weight BIGINT",
    # `kvcap replay --record-batches` only: one row per request scheduled in a step; seq is its
    # place in the batch (vLLM's order), kind new/resumed/running (V1) or prefill/decode (V0).
    "batches": """run_id VARCHAR, step BIGINT, seq INTEGER, request_id BIGINT,
        num_new_tokens BIGINT, num_computed_tokens BIGINT, kind VARCHAR""",
    # `kvcap fleet` / `kvcap plan`: one row per replica of a fleet replay; each replica is a run
    # of its own (run_id) in the tables above, so `JOIN fleets USING (run_id)` adds `replica`.
    "fleets": """fleet_id VARCHAR, replica INTEGER, run_id VARCHAR, router VARCHAR,
        num_replicas INTEGER, trace_name VARCHAR""",
}


# No extension is ever installed or loaded: a SQLite file given as --db made DuckDB try to download
# its sqlite scanner.
_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def connect(path: str | Path, *, read_only: bool = False):
    con = _open(path, read_only=read_only)
    try:
        yield con
    finally:
        con.close()


def _open(path: str | Path, *, read_only: bool):
    check_db_file(path, must_exist=read_only)
    if not read_only and Path(path).exists():
        _connect(path, read_only=True).close()     # checked before anything may write to it
    return _connect(path, read_only=read_only)


def _connect(path: str | Path, *, read_only: bool):
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=_CONFIG)
    except duckdb.Error as e:
        if "lock" in str(e).lower():
            raise StoreLocked(f"database {path} is locked by another process; "
                              "wait for it to finish or use another --db") from None
        raise StoreError(f"database {path}: cannot open it ({_one_line(e)})") from None
    if read_only:
        try:
            _check_blocks(con, path)
        except BaseException:
            con.close()
            raise
    return con


def _check_blocks(con, path: str | Path) -> None:
    """Refuse a file cut short (a partial copy, a full disk): a block its tables or metadata use
    lies beyond the end of the file. DuckDB reads such a file until a query touches the missing
    part and appends to it meanwhile; every command refuses it instead."""
    try:
        (block_size,), = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()
        used = [b for (b,) in con.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()]
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables WHERE "
                                    "table_schema = 'main' AND table_type = 'BASE TABLE'").fetchall():
            (top,), = con.execute("SELECT max(block_id) FROM pragma_storage_info(?) WHERE persistent",
                                  [table]).fetchall()
            used.append(top)
    except duckdb.Error:
        return                      # a file this check cannot inspect: DuckDB's own errors decide
    top = max((b for b in used if b is not None and b >= 0), default=None)
    if top is None or not block_size:
        return
    want, size = 3 * 4096 + (top + 1) * int(block_size), Path(path).stat().st_size
    if size < want:
        raise StoreError(truncated(path, size, want))


def ensure_schema(con, path: str | Path = "the database") -> None:
    # Read-only check first: a file that is not ours is refused before any table or column is
    # added to it (a refused command changes nothing).
    check_schema(con, path)
    for table, cols in SCHEMA.items():
        try:
            con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({cols})")
        except duckdb.Error as e:
            raise StoreError(f"database {path}: cannot create table {table} ({_one_line(e)})") from None
    # Files written before these columns existed gain them (NULL).
    for table, cols in _ADDED_LATER.items():
        for column, sql_type in cols.items():
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {sql_type}")
    check_schema(con, path)


# Columns ensure_schema adds to older files (ALTER TABLE), with their types: a read-only reader
# does not require them.
_ADDED_LATER = {"runs": {"implementation": "VARCHAR", "async_scheduling": "BOOLEAN",
                         "kv_offloading": "BOOLEAN", "hash_block_tokens": "INTEGER",
                         "vllm_version": "VARCHAR", "recompute_tax": "DOUBLE",
                         "offered_rps": "DOUBLE", "rate_scale": "DOUBLE", "arrivals": "VARCHAR"},
                "requests": {"gpu_hit_tokens": "BIGINT", "cpu_hit_tokens": "BIGINT"},
                "steps": {"offload_store_blocks": "BIGINT", "offload_load_blocks": "BIGINT"},
                "events": {"seq": "INTEGER"}}


def check_schema(con, path: str | Path = "the database") -> None:
    """A table of ours that lacks columns was written by something else (or another version)."""
    found: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                     "WHERE table_schema = 'main'").fetchall():
        found.setdefault(table, set()).add(column)
    for table, cols in SCHEMA.items():
        if table not in found:
            continue
        want = [c.split()[0] for c in cols.replace("\n", " ").split(",")]
        missing = [c for c in want if c not in found[table] and c not in _ADDED_LATER.get(table, ())]
        if missing:
            raise StoreError(f"database {path}: table {table} lacks columns {', '.join(missing[:5])}; "
                             "it was not written by this kvcap; pass another --db")


# DuckDB INTEGER is 32-bit: a value beyond it failed the INSERT after a whole replay, so the tables
# are checked first and the column is named.
_INT32 = (-(2**31), 2**31 - 1)


def check_int32(tables: dict[str, pl.DataFrame]) -> None:
    for table, cols in SCHEMA.items():
        df = tables.get(table)
        # A spilled table (results.SpilledTable) holds the cores' own int32 columns.
        if not isinstance(df, pl.DataFrame) or df.height == 0:
            continue
        for spec in cols.replace("\n", " ").split(","):
            name, kind = spec.split()[:2]
            if kind != "INTEGER" or name not in df.columns:
                continue
            col = df[name]
            if col.dtype.is_numeric() and col.len() and col.null_count() < col.len():
                lo, hi = col.min(), col.max()
                if lo < _INT32[0] or hi > _INT32[1]:
                    raise StoreError(f"{table}.{name}: value {hi if hi > _INT32[1] else lo} does "
                                     "not fit the 32-bit INTEGER column; nothing was written")


def write_run(path: str | Path, tables: dict) -> None:
    """Append one run (all tables) atomically; replaces an earlier run with the same run_id.

    A failure leaves the database as it was (a database this call created is removed again) and
    raises `StoreError` with DuckDB's real reason; Ctrl-C raises `WriteInterrupted`."""
    write_runs(path, [tables])


def write_runs(path: str | Path, runs: list[dict]) -> None:
    """`write_run` for several runs in one transaction (a fleet's replicas): all or none."""
    for tables in runs:
        check_int32(tables)
    write = RunWrite(path)
    try:
        write.open()
        for tables in runs:
            write.delete_run(tables["runs"]["run_id"][0])
            write.append_tables(tables)
        with _interrupt_deferred() as pending:
            write.commit()
        if pending:
            raise KeyboardInterrupt
    except BaseException as e:
        err = write.failed(e)
        if err is e:
            raise
        raise err from None
    finally:
        write.close()


class RunWrite:
    """One write transaction on a DuckDB file, in steps: `open` (connect, schema, BEGIN),
    `delete_run` (the earlier run of that id), `append` / `append_tables`, `commit`; on any
    exception `failed(exc)` rolls back, removes a file this write created, and returns what to
    raise: `WriteInterrupted` for Ctrl-C (`committed` tells the truth), `StoreError` with
    DuckDB's real reason for a DuckDB error, else the exception itself. `write_runs` runs them
    in a row; replay/results/writer.py runs them in a thread while the run is replayed."""

    def __init__(self, path: str | Path, *, memory_limit: str = WRITE_MEMORY_LIMIT,
                 threads: int | None = None) -> None:
        self.path, self.memory_limit, self.threads = path, memory_limit, threads
        self.created = not Path(path).exists()
        self.committed = False
        self.con = None

    def open(self) -> None:
        self.con = _open(self.path, read_only=False)
        ensure_schema(self.con, self.path)
        # Written blocks need not stay cached: bounded memory for a run of many steps.
        self.con.execute(f"SET memory_limit = '{self.memory_limit}'")
        if self.threads is not None:
            self.con.execute(f"SET threads = {int(self.threads)}")
        self.con.execute("BEGIN TRANSACTION")

    def delete_run(self, run_id: str) -> None:
        for table in SCHEMA:
            self.con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    def append_tables(self, tables: dict, *, skip: tuple[str, ...] = ()) -> None:
        """Every table of one run (those in `skip` are written already)."""
        run_id = tables["runs"]["run_id"][0]
        for table in SCHEMA:
            if table in skip:
                continue
            df = tables.get(table)
            if df is None or df.height == 0:
                continue
            # A spilled table (results.SpilledTable) goes in batches, each dropped before the
            # next is read: bounded memory.
            parts = (df,) if isinstance(df, pl.DataFrame) else df.batches(run_id=False)
            del df
            for part in parts:
                self.append(table, part, run_id=run_id)
                del part

    def append(self, table: str, df: pl.DataFrame, *, run_id: str | None = None) -> None:
        _insert(self.con, table, df, run_id=run_id)

    def commit(self) -> None:
        self.con.execute("COMMIT")
        self.committed = True

    def failed(self, exc: BaseException) -> BaseException:
        if self.con is not None and not self.committed:
            _rollback(self.con)
        self.close()
        if self.created and not self.committed:
            remove_db(self.path)
        if isinstance(exc, KeyboardInterrupt):
            return exc if isinstance(exc, WriteInterrupted) else \
                WriteInterrupted(self.path, committed=self.committed)
        if isinstance(exc, duckdb.Error):
            return StoreError(f"database {self.path}: the run was not written ({_one_line(exc)})")
        return exc

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def _columns(table: str) -> dict[str, str]:
    """{column: DuckDB type} of one of our tables."""
    return dict(c.split()[:2] for c in SCHEMA[table].replace("\n", " ").split(","))


def _insert(con, table: str, df: pl.DataFrame, *, run_id: str | None = None) -> None:
    """Append `df` to `table` (columns by name; ours that it lacks are NULL). Through a relation's
    `insert_into`, not `INSERT ... SELECT` from a registered Arrow table: DuckDB keeps about
    100 B per row of the latter in memory until the transaction commits (a 10M-request run's
    tens of millions of step rows did not fit), the former streams to disk.
    A `run_id` column holding one value (every table of one run) — or none, with `run_id`
    given — goes in as a constant: DuckDB then reads no string per row (a tenth of a
    million-step write)."""
    cols = _columns(table)
    extra = [c for c in df.columns if c not in cols]
    if extra:
        raise StoreError(f"table {table} has no column(s) {', '.join(extra)}")
    if "run_id" in df.columns and df.height and df["run_id"].null_count() == 0 \
            and (df["run_id"] == df["run_id"][0]).all():
        run_id, df = df["run_id"][0], df.drop("run_id")
    # All-NULL columns (a one-row `runs` without an abort) are typed here: DuckDB refuses
    # polars' untyped Null arrays through the Arrow C stream.
    present = [c for c in cols if c in df.columns and df.schema[c] != pl.Null]
    exprs = []
    for c, kind in cols.items():
        if c in present:
            exprs.append(duckdb.ColumnExpression(c))
        else:
            value = run_id if c == "run_id" else None
            exprs.append(duckdb.ConstantExpression(value).cast(duckdb.sqltype(kind)).alias(c))
    # DuckDB reads no stream without a column: a frame of NULLs only still brings its row count.
    rows = df.select(present) if present else pl.DataFrame({"_rows": pl.repeat(0, df.height, eager=True)})
    con.from_arrow(_ArrowStream(rows)).project(*exprs).insert_into(table)


class _ArrowStream:
    """A DataFrame seen only through the Arrow C stream interface: DuckDB then reads polars'
    buffers directly instead of calling `to_arrow()`, which imports pyarrow (~0.3 s of every
    `kvcap replay`)."""

    def __init__(self, df: pl.DataFrame) -> None:
        self._df = df

    def __arrow_c_stream__(self, requested_schema=None):
        return self._df.__arrow_c_stream__(requested_schema)


def _rollback(con) -> None:
    """Undo the open transaction; if DuckDB already ended it (a failed COMMIT), there is nothing
    to undo, and that second error must not hide the first one."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


@contextmanager
def _interrupt_deferred():
    """Hold Ctrl-C during the COMMIT (main thread only); yields a list that is non-empty when
    one arrived, so the caller raises it once the COMMIT has finished."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield pending
    finally:
        signal.signal(signal.SIGINT, previous)


def read_table(path: str | Path, table: str, run_id: str | None = None) -> pl.DataFrame:
    with connect(path, read_only=True) as con:
        check_schema(con, path)
        sql = f"SELECT * FROM {table}" + (" WHERE run_id = $1" if run_id else "")
        try:
            return con.sql(sql, params=[run_id] if run_id else None).pl()
        except duckdb.Error as e:
            raise StoreError(f"database {path}: cannot read table {table} ({_one_line(e)})") from None


def list_runs(path: str | Path) -> pl.DataFrame:
    with connect(path, read_only=True) as con:
        check_schema(con, path)
        (has_runs,), = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchall()
        if not has_runs:
            return pl.DataFrame()
        try:
            return con.sql("SELECT run_id, created_at, label, trace_name, scheduler, model, gpu, "
                           "max_num_seqs, preemption_mode, status, num_requests, sim_seconds, "
                           "wall_seconds FROM runs ORDER BY created_at").pl()
        except duckdb.Error as e:
            raise StoreError(f"database {path}: cannot read its runs ({_one_line(e)})") from None
