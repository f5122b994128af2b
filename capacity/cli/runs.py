"""`kvcap runs` (what tells the stored runs apart) and `kvcap export` (one run's tables as CSV
or Parquet files, for a spreadsheet or another tool).

A run's row says what was replayed (trace, engine, knobs, offered rate); its outcome (TTFT and
TBT p99, preemptions, the verdict) is computed from its tables with the definitions `kvcap
replay` prints (capacity.analyses.metrics, capacity.analyses.stability), so both commands give
the same numbers for one run.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import typer

from capacity.cli.common import CliError, emit_json, guarded
from replay.results.dbfile import DEFAULT_DB

# The run's own columns `kvcap runs --json` gives (those a file written before them lacks are
# null), then the computed outcome.
RUN_COLUMNS = ("run_id", "created_at", "label", "trace_name", "num_requests", "scheduler",
               "async_scheduling", "model", "gpu", "tp", "block_size", "num_gpu_blocks",
               "num_cpu_blocks", "kv_offloading", "max_num_seqs", "max_num_batched_tokens",
               "preemption_mode", "swap_space_gib", "executor", "implementation", "status",
               "sim_seconds", "offered_rps", "rate_scale", "arrivals", "vllm_version")
# The tables of one run that `export` writes (the last two only when the run has rows there).
EXPORT_TABLES = ("runs", "requests", "steps", "events", "stalls", "tbt", "batches", "fleets")
FORMATS = ("csv", "parquet")


def _columns(con, table: str) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' "
        "AND table_name = ?", [table]).fetchall()}


def stored_runs(db: Path) -> list[dict]:
    """Every run of `db` (oldest first): its row's RUN_COLUMNS and its outcome."""
    import polars as pl

    from capacity.analyses.metrics import nearest_ranks, tbt_percentiles
    from capacity.cli.replay import verdict
    from replay.results.store import check_schema, connect
    out = []
    with connect(db, read_only=True) as con:
        check_schema(con, db)
        have = _columns(con, "runs")
        if not have:
            return []
        select = ", ".join(c if c in have else f"NULL AS {c}" for c in RUN_COLUMNS)
        runs = con.sql(f"SELECT {select} FROM runs ORDER BY created_at, run_id").pl()
        full = con.sql("SELECT * FROM runs ORDER BY created_at, run_id").pl()
        for i, row in enumerate(runs.iter_rows(named=True)):
            rid = [row["run_id"]]
            req = con.sql("SELECT arrival_s, first_scheduled_s, first_token_s, finish_s, status "
                          "FROM requests WHERE run_id = $1", params=rid).pl()
            tbt = con.sql("SELECT tbt_s, weight FROM tbt WHERE run_id = $1", params=rid).pl()
            (preempted,), = con.execute(
                "SELECT count(*) FROM events WHERE run_id = ? AND kind LIKE 'preempt_%'",
                rid).fetchall()
            fin = req.filter(pl.col("status") == "finished")
            ttft = (fin["first_token_s"] - fin["arrival_s"]).to_numpy()
            v = verdict({"requests": req, "runs": full[i]}, row["status"])
            out.append({**row, "created_at": str(row["created_at"]),
                        "ttft_p99_s": nearest_ranks(ttft, (0.99,))[0],
                        "tbt_p99_s": tbt_percentiles(tbt, (0.99,))[0],
                        "preemptions": int(preempted), "verdict": v["verdict"],
                        "served_rps": v["served_rps"]})
    return out


def _engine(r: dict) -> str:
    """'0.34 async', '0.33 sync+cpu' (V1 and its release; CPU offloading), 'V0 swap', 'V0 recompute'; '+queue' for
    queue-only admission."""
    if r["scheduler"] == "v0":
        text = "V0 " + ("queue" if r["preemption_mode"] == "none" else r["preemption_mode"] or "?")
    else:
        text = f"{r.get('vllm_version') or '0.33'} " + ("async" if r["async_scheduling"] else "sync")
        if r["preemption_mode"] == "none":
            text += "+queue"
    return text + ("+cpu" if r["kv_offloading"] else "")


def _rate(r: dict) -> str:
    text = "-" if r["offered_rps"] is None else f"{r['offered_rps']:,.2f}"
    if r["rate_scale"] not in (None, 1.0):
        text += f" ×{r['rate_scale']:g}"
    return text


def _count(v) -> str:
    return "-" if v is None else f"{v:,}"


# Columns a terminal narrower than 100 columns goes without (the batch limits: `--json` has them).
WIDE_ONLY = ("tokens", "blocks")


def runs_table(rows: list[dict], title: str, *, width: int = 100):
    """The runs as a table of at most `width` (>= 80) columns: only the trace name gives way
    (an ellipsis); no header, id or number is cut, no cell wraps. Below 100 columns the batch
    token limit and the KV blocks are left out."""
    from rich.table import Table

    from capacity.cli.common import shown
    from capacity.units import seconds
    cols = {"run": [r["run_id"][:8] for r in rows],
            "trace": [shown(r["trace_name"]) if r["trace_name"] else "-" for r in rows],
            "engine": [_engine(r) for r in rows],
            "seqs": [_count(r["max_num_seqs"]) for r in rows],
            "tokens": [_count(r["max_num_batched_tokens"]) for r in rows],
            "blocks": [_count(r["num_gpu_blocks"]) for r in rows],
            "req/s": [_rate(r) for r in rows],
            "TTFT p99": [seconds(r["ttft_p99_s"]) for r in rows],
            "TBT p99": [seconds(r["tbt_p99_s"]) for r in rows],
            "preempt": [_count(r["preemptions"]) for r in rows],
            "verdict": [r["verdict"] for r in rows]}
    if width < 100:
        cols = {k: v for k, v in cols.items() if k not in WIDE_ONLY}
    t = Table(title=title, box=None, padding=(0, 1, 0, 0), pad_edge=False,
              header_style="bold underline", title_justify="left")
    need = {k: max([len(k), *map(len, v)]) for k, v in cols.items()}
    # What the trace column may take: the width less every other column and the spaces.
    room = width - sum(n for k, n in need.items() if k != "trace") - (len(need) - 1)
    need["trace"] = max(5, min(need["trace"], room))
    cols["trace"] = [c if len(c) <= need["trace"] else c[:need["trace"] - 1] + "…"
                     for c in cols["trace"]]
    for name in cols:
        left = name in ("run", "trace", "engine", "verdict")
        t.add_column(name, no_wrap=True, width=need[name], justify="left" if left else "right")
    for row in zip(*cols.values()):
        t.add_row(*row)
    return t


def list_runs(db: Path, as_json: bool) -> None:
    """`kvcap runs`."""
    if not db.exists():
        raise CliError(f"{db}: no such database (write one with `kvcap replay TRACE --db {db}`)")
    rows = stored_runs(db)
    if as_json:
        emit_json({"db": str(db), "runs": rows})
        return
    from rich.console import Console
    out = Console()
    width = max(80, min(out.width, 100))   # laid out for 100 columns, or 80 without two of them
    out.width = width
    if not rows:
        out.print(f"no runs in {db} (write one with `kvcap replay TRACE --db {db}`)",
                  soft_wrap=True)
        return
    out.print(runs_table(rows, f"{len(rows):,} runs in {db}", width=width))
    for line in ("req/s: offered (×k: the trace at k times its rate); overloaded: the queue grows",
                 "one run's tables as CSV or Parquet files: kvcap export RUN --db DB -o DIR"):
        out.print(line, soft_wrap=True, markup=False, highlight=False)


def resolve_run(con, db: Path, run_id: str) -> str:
    """The stored run id that `run_id` names: the whole id or a prefix of one run's id
    (`kvcap runs` shows 8 characters)."""
    ids = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE starts_with(run_id, ?)",
                                     [run_id]).fetchall()]
    if run_id in ids:
        return run_id
    if len(ids) == 1:
        return ids[0]
    if not ids:
        (n,), = con.execute("SELECT count(*) FROM runs").fetchall()
        raise CliError(f"run {run_id!r} is not in {db} ({n:,} runs); list them with "
                       f"`kvcap runs --db {db}`")
    raise CliError(f"run {run_id!r} matches {len(ids)} runs in {db}; give more of its id "
                   f"(`kvcap runs --db {db}`)")


def _sql_text(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def export_run(db: Path, run_id: str, fmt: str, out: Path) -> dict:
    """Write run `run_id`'s tables to folder `out` (one file per table, DuckDB COPY), whole or
    not at all: into a temporary folder beside `out`, renamed to `out` at the end."""
    from replay.results.store import check_schema, connect
    if fmt not in FORMATS:
        raise CliError(f"--format {fmt!r}: use csv or parquet")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"-o {out}: already exists{'' if out.is_dir() else ' (a file)'}; give a "
                       "new folder name (export writes a folder of one file per table)")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CliError(f"-o {out}: folder {parent} does not exist; create it first")
    if not db.exists():
        raise CliError(f"{db}: no such database; pass the --db the run was written to")
    written: dict[str, int] = {}
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        with connect(db, read_only=True) as con:
            check_schema(con, db)
            if not _columns(con, "runs"):
                raise CliError(f"{db}: holds no runs; list them with `kvcap runs --db {db}`")
            rid = resolve_run(con, db, run_id)
            for table in EXPORT_TABLES:
                if not _columns(con, table):
                    continue
                (n,), = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?",
                                    [rid]).fetchall()
                if n == 0 and table in ("batches", "fleets"):
                    continue
                path = tmp / f"{table}.{fmt}"
                options = "FORMAT csv, HEADER" if fmt == "csv" else "FORMAT parquet"
                con.execute(f"COPY (SELECT * FROM {table} WHERE run_id = {_sql_text(rid)}) "
                            f"TO {_sql_text(str(path))} ({options})")
                written[table] = n
        os.chmod(tmp, 0o777 & ~_umask())
        if out.is_dir():                 # an empty folder: replaced
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"run_id": rid, "db": str(db), "format": fmt, "out": str(out),
            "files": {t: str(out / f"{t}.{fmt}") for t in written}, "rows": written}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@guarded
def export_cmd(run_id: str = typer.Argument(..., help="Run id (or a prefix of one: `kvcap runs`)."),
               out: Path = typer.Option(..., "-o", "--output", help="Folder to create, one file "
                                        "per table (runs, requests, steps, events, stalls, tbt; "
                                        "batches and fleets when the run has them)."),
               fmt: str = typer.Option("csv", "--format", help="csv | parquet."),
               db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="DuckDB file holding the run."),
               as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Write one stored run's tables as CSV or Parquet files into a new folder."""
    res = export_run(db, run_id, fmt, out)
    if as_json:
        emit_json(res)
        return
    rows = ", ".join(f"{t} {n:,}" for t, n in res["rows"].items())
    typer.echo(f"wrote run {res['run_id']} to {out}/ ({fmt}; rows: {rows})")
