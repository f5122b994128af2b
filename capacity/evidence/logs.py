"""Production evidence in DuckDB: ingest server logs and client results (`kvcap logs`).

Owns the evidence tables (below), their idempotent write (a re-ingested file replaces its own rows,
in one transaction) and reading them back. Parsing lives in `logparse` (server) and `clientparse`
(client); analyses (`attribute`, `logs_swap`, `validate`) read through `read_evidence`.
Must not import altair or torch.

Tables (times are naive UTC-or-as-logged datetimes plus `*epoch_s`, seconds on the same clock):
- `log_sources(source_file, kind, era, lines, rows, unparsed, year, year_source, ingested_at)`
- `log_stats`: one row per stats line (see `logparse.STATS_SCHEMA`; usages and hit rates 0..1)
- `log_preemptions(source_file, line, time, epoch_s, request_id, mode, cum_count)`
- `log_unparsed(source_file, line, reason, text)`
- `log_engine`: one row per engine-configuration line (`num_gpu_blocks`, `num_cpu_blocks` where stated,
  `kv_cache_tokens`, `kv_cache_gib`, `max_concurrency` at `max_concurrency_tokens`; see
  `logfacts.ENGINE_SCHEMA`); `log_events(source_file, line, time, epoch_s, pid, kind, text)`: one row per
  engine error or abort line (`kind` `swap_abort` for "Aborted due to the lack of CPU swap space", ...)
- `client_tokens`: one row per streamed token (see `clientparse.CLIENT_SCHEMA`)
- `attribution`: written whole by `capacity.evidence.attribute` (one row per TBT spike)
- `prom_samples`: one row per Prometheus sample (see `promparse.SAMPLE_SCHEMA`), from `/metrics` scrapes
  (a folder, or concatenated with time lines) and `query_range` exports; `prom_windows`: per series and
  window, counter increase / rate, gauge mean / max / last, histogram p50 / p90 / p99 / count / mean
  (see `promseries`); `log_sources` rows of kind `prometheus`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl

from capacity.evidence.clientparse import CLIENT_SCHEMA, ClientFormatError, looks_like_vllm_bench, parse_client_file
from capacity.evidence.promparse import (SAMPLE_SCHEMA, looks_like_exposition,
                                         looks_like_query_range, parse_query_range, parse_scrape_file,
                                         parse_scrape_folder)
from capacity.evidence.promseries import WINDOW_SCHEMA, windows
from capacity.evidence.logfacts import ENGINE_SCHEMA, EVENT_SCHEMA, looks_like_server_output
from capacity.evidence.logparse import (PREEMPTION_SCHEMA, STATS_MARK, STATS_SCHEMA, UNPARSED_SCHEMA,
                               VLLM_PREFIX, WARNING_MARK, parse_server_log, strip_ansi)
from replay.results.store import connect, remove_db

_DUCK = {pl.Utf8: "VARCHAR", pl.Int64: "BIGINT", pl.Int32: "INTEGER", pl.Float64: "DOUBLE",
         pl.Datetime("us"): "TIMESTAMP", pl.Boolean: "BOOLEAN"}
SOURCES_SCHEMA = {"source_file": pl.Utf8, "kind": pl.Utf8, "era": pl.Utf8, "lines": pl.Int64,
                  "rows": pl.Int64, "unparsed": pl.Int64, "year": pl.Int32, "year_source": pl.Utf8,
                  "ingested_at": pl.Datetime("us"), "path": pl.Utf8}
EVIDENCE_TABLES = {"log_sources": SOURCES_SCHEMA, "log_stats": STATS_SCHEMA,
                   "log_preemptions": PREEMPTION_SCHEMA, "log_unparsed": UNPARSED_SCHEMA,
                   "client_tokens": CLIENT_SCHEMA, "log_engine": ENGINE_SCHEMA, "log_events": EVENT_SCHEMA,
                   "prom_samples": SAMPLE_SCHEMA, "prom_windows": WINDOW_SCHEMA}


def ddl(schema: dict) -> str:
    return ", ".join(f"{c} {_DUCK[t]}" for c, t in schema.items())


def check_evidence_schema(con, path: str | Path = "the database") -> None:
    """Read-only: an evidence (or run) table that lacks our columns means the file is not this
    kvcap's; refused before anything is written to it."""
    from replay.results.store import StoreError, check_schema
    check_schema(con, path)
    found: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                     "WHERE table_schema = 'main'").fetchall():
        found.setdefault(table, set()).add(column)
    for table, schema in EVIDENCE_TABLES.items():
        missing = [c for c in schema if table in found and c not in found[table]
                   and (table, c) != ("log_sources", "path")]
        if missing:
            raise StoreError(f"database {path}: table {table} lacks columns {', '.join(missing[:5])}; "
                             "it was not written by this kvcap; pass another --db")


def ensure_evidence_schema(con, path: str | Path = "the database") -> None:
    check_evidence_schema(con, path)
    for table, schema in EVIDENCE_TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({ddl(schema)})")
    # DBs from before `path` existed: the column is added (NULL = path not recorded).
    con.execute("ALTER TABLE log_sources ADD COLUMN IF NOT EXISTS path VARCHAR")


def source_keys(paths: list[Path], con) -> dict[Path, str]:
    """The `source_file` key of each file: its name, unless another file with the same name (in
    this call, or already in the DB from another folder) exists; then its full path. Rows are
    replaced per key, so two `server.log` from different folders must never share one."""
    full = {p: str(Path(p).resolve()) for p in paths}
    known: dict[str, set[str]] = {}
    key_of: dict[str, str] = {}  # a file ingested before keeps the key it got then
    for key, path in con.execute("SELECT source_file, path FROM log_sources").fetchall():
        if path is not None:
            known.setdefault(key, set()).add(path)
            key_of[path] = key
    by_name: dict[str, set[str]] = {}
    for p in paths:
        by_name.setdefault(Path(p).name, set()).add(full[p])
    keys = {}
    for p in paths:
        name = Path(p).name
        clash = len(by_name[name]) > 1 or bool(known.get(name, set()) - {full[p]})
        keys[p] = key_of.get(full[p]) or (full[p] if clash else name)
    return keys


@dataclass(frozen=True, slots=True, kw_only=True)
class Ingested:
    source_file: str
    kind: str                 # "server" | "client"
    era: str | None           # "v0" | "v1" | "v0+v1" for server logs
    lines: int
    rows: int                 # stats rows (server) or token rows (client)
    preemption_warnings: int
    unparsed: int
    unparsed_lines: list[int]
    requests: int
    anchored: bool            # client: absolute times known
    engine_lines: int = 0     # server: rows in log_engine
    events: int = 0           # server: rows in log_events
    series: int = 0           # prometheus: distinct series (server, metric, labels)
    windows: int = 0          # prometheus: rows in prom_windows
    servers: tuple[str, ...] = ()   # server: the sources of a file holding several servers

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


def detect_kind(path: Path) -> str:
    """'server', 'client' or 'prometheus' from the content (the first 64 KiB); a folder is a folder
    of Prometheus scrapes."""
    if Path(path).is_dir():
        return "prometheus"
    with open(path, errors="replace") as f:
        head = f.read(65536)
    stripped = head.lstrip()
    if looks_like_query_range(head) or looks_like_exposition(head):
        return "prometheus"
    if stripped.startswith("{"):
        if '"ttfts"' in head or '"itls"' in head or '"ttft"' in head or '"token_time' in head:
            return "client"
        try:
            if looks_like_vllm_bench(json.loads(Path(path).read_text())):
                return "client"
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    first = stripped.splitlines()[0].lower() if stripped else ""
    if "token_time" in first and ("send" in first or "request" in first):
        return "client"
    if _server_marks(path):
        return "server"
    raise ClientFormatError(f"{path}: not a vLLM server log nor client results kvcap reads (no stats, "
                            "preemption, engine or error line); pass --kind server or --kind client")


def _server_marks(path: Path) -> bool:
    """Whether any line of the file is one a server log has (a stats, preemption, engine or error
    line, or vLLM's logger prefix), line by line to the first one: a server log may open with
    thousands of access-log lines."""
    with open(path, errors="replace") as f:
        for raw in f:
            line = strip_ansi(raw)
            if (STATS_MARK in line or WARNING_MARK in line or VLLM_PREFIX.search(line)
                    or looks_like_server_output(line)):
                return True
    return False


def _not_a_file(p: Path) -> str:
    """Why `p`, neither a file nor a folder, is not read: missing, or a FIFO, device or socket
    (reading one would block or never end)."""
    from traces.atomic import file_kind
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return f"is {file_kind(mode)}, not a file; save its content to a file and pass that"


def _write(con, table: str, source: str, df: pl.DataFrame) -> None:
    # A file holding several servers stores their rows as "FILE pid=N" / "FILE service=NAME"
    # (see logparse): those go too.
    con.execute(f"DELETE FROM {table} WHERE source_file = ? OR starts_with(source_file, ?) "
                "OR starts_with(source_file, ?)", [source, f"{source} pid=", f"{source} service="])
    if df.height:
        con.register("_incoming", df.to_arrow())
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _incoming")
        con.unregister("_incoming")


def _client_year(db: Path, frames: list[pl.DataFrame]) -> int | None:
    for df in frames:
        if df.height and df["send_time"].null_count() < df.height:
            return int(df["send_time"].min().year)
    if not Path(db).exists():
        return None
    with connect(db) as con:
        ensure_evidence_schema(con, db)
        (y,), = con.execute("SELECT min(year(send_time)) FROM client_tokens").fetchall()
    return int(y) if y is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    path: str
    reason: str               # one line: why the file was not read

    def as_dict(self) -> dict:
        return {"file": self.path, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestReport:
    files: list[Ingested]
    skipped: list[Skipped]    # files not read (missing, unrecognisable, bad client results)
    year: int
    year_source: str


def ingest(paths: list[Path], db: Path, *, year: int | None = None, kind: str | None = None,
           client_start: datetime | None = None) -> tuple[list[Ingested], int, str]:
    """`ingest_files` for callers that want (per-file results, year used, where it came from)."""
    r = ingest_files(paths, db, year=year, kind=kind, client_start=client_start)
    return r.files, r.year, r.year_source


def _read_prom(p: Path, source: str) -> pl.DataFrame:
    if Path(p).is_dir():
        return parse_scrape_folder(p, source=source)
    with open(p, errors="replace") as f:
        head = f.read(65536)
    if looks_like_query_range(head):
        return parse_query_range(p, source=source)
    return parse_scrape_file(p, source=source)


def _triage(paths: list[Path], kind: str | None, client_start) -> tuple[dict, dict, list[Skipped]]:
    """Which files are read as what; a file that cannot be read is skipped with its reason (one
    bad file in a folder of logs must not lose the others). Parsed client and Prometheus frames
    come back in the second dict."""
    kinds, parsed, skipped = {}, {}, []
    for p in paths:
        if not (Path(p).is_file() or Path(p).is_dir()):
            skipped.append(Skipped(path=str(p), reason=_not_a_file(Path(p))))
            continue
        try:
            k = kind or detect_kind(Path(p))
            if Path(p).is_dir() and k != "prometheus":
                raise ValueError("a folder is read only as Prometheus scrapes (--kind prometheus)")
            if k == "client":
                parsed[p] = parse_client_file(p, client_start=client_start)
            elif k == "prometheus":
                parsed[p] = _read_prom(p, Path(p).name)
        except (ValueError, OSError, pl.exceptions.PolarsError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            for prefix in (f"{p}: ", f"{Path(p).name}: "):
                reason = reason.removeprefix(prefix)
            skipped.append(Skipped(path=str(p), reason=reason))
            continue
        kinds[p] = k
    return kinds, parsed, skipped


def ingest_files(paths: list[Path], db: Path, **kwargs) -> IngestReport:
    """`_ingest_files`, leaving nothing half-written: a database this call created is removed
    again when it fails (a failed or interrupted transaction leaves an existing one as it was)."""
    created = not Path(db).exists()
    try:
        return _ingest_files(paths, db, **kwargs)
    except BaseException:
        if created:
            remove_db(db)
        raise


def _ingest_files(paths: list[Path], db: Path, *, year: int | None = None, kind: str | None = None,
                  client_start: datetime | None = None, window_s: float = 10.0) -> IngestReport:
    """Parse every readable file and store it; the others are skipped with a reason. Raises
    (nothing written) only when no file could be read.

    The year of vLLM's timestamp prefix (it prints none): `year`, else the year of the client
    results in this call or already in the DB, else the current year."""
    if kind not in (None, "server", "client", "prometheus"):
        raise ValueError(f"--kind: must be server, client or prometheus, got {kind!r}")
    if not window_s > 0:
        raise ValueError(f"--window-s: must be > 0 seconds, got {window_s!r}")
    kinds, parsed, skipped = _triage(list(paths), kind, client_start)
    clients = {p: df for p, df in parsed.items() if kinds[p] == "client"}
    if not kinds:
        raise ClientFormatError("no file could be read: " + "; ".join(f"{s.path}: {s.reason}" for s in skipped))
    paths = [p for p in paths if p in kinds]
    if year is not None:
        year_source = "--year"
    elif (cy := _client_year(db, list(clients.values()))) is not None:
        year, year_source = cy, "client results"
    else:
        year, year_source = datetime.now().year, "assumed (current year; pass --year)"
    results, now = [], datetime.now()
    with connect(db) as con:
        ensure_evidence_schema(con, db)
        keys = source_keys(paths, con)
        con.execute("BEGIN TRANSACTION")
        try:
            for p in paths:
                name = keys[p]
                if kinds[p] == "prometheus":
                    # the key, not the name the parser saw, identifies the rows (two folders "a")
                    smp = parsed[p].with_columns(source_file=pl.lit(name),
                                                 server=pl.when(pl.col("server") == Path(p).name)
                                                 .then(pl.lit(name)).otherwise(pl.col("server")))
                    win = windows(smp, window_s)
                    _write(con, "prom_samples", name, smp)
                    _write(con, "prom_windows", name, win)
                    r = Ingested(source_file=name, kind="prometheus", era=None, lines=0, rows=smp.height,
                                 preemption_warnings=0, unparsed=0, unparsed_lines=[], requests=0,
                                 anchored=True, series=smp.select("server", "metric", "labels").n_unique(),
                                 windows=win.height)
                elif kinds[p] == "client":
                    df = clients[p]
                    _write(con, "client_tokens", name, df)
                    r = Ingested(source_file=name, kind="client", era=None, lines=0, rows=df.height,
                                 preemption_warnings=0, unparsed=0, unparsed_lines=[],
                                 requests=df["request_id"].n_unique(),
                                 anchored=df["send_time"].null_count() == 0 and df.height > 0)
                else:
                    # `log`, not `parsed`: that dict still holds the Prometheus and client
                    # frames of the files after this one
                    with open(p, errors="replace") as f:
                        log = parse_server_log(f, name, _year_for(p, year, year_source, now))
                    eras = sorted(set(log.stats["era"].to_list())) or (["v0"] if log.preemptions.height else [])
                    for table, df in (("log_stats", log.stats), ("log_preemptions", log.preemptions),
                                      ("log_unparsed", log.unparsed), ("log_engine", log.engine),
                                      ("log_events", log.events)):
                        _write(con, table, name, df)
                    r = Ingested(source_file=name, kind="server", era="+".join(eras) or None,
                                 lines=log.lines, rows=log.stats.height,
                                 preemption_warnings=log.preemptions.height,
                                 unparsed=log.unparsed.height,
                                 unparsed_lines=log.unparsed["line"].to_list(),
                                 requests=0, anchored=True, engine_lines=log.engine.height,
                                 events=log.events.height, servers=_servers(name, log))
                src = pl.DataFrame([{"source_file": name, "kind": r.kind, "era": r.era,
                                     "lines": r.lines, "rows": r.rows, "unparsed": r.unparsed,
                                     "year": year if r.kind == "server" else None,
                                     "year_source": year_source if r.kind == "server" else None,
                                     "ingested_at": now, "path": str(Path(p).resolve())}],
                                   schema=SOURCES_SCHEMA)
                _write(con, "log_sources", name, src)
                results.append(r)
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:  # the failed COMMIT already ended it; keep the real error
                pass
            raise
    return IngestReport(files=results, skipped=skipped, year=year, year_source=year_source)


def _servers(name: str, log) -> tuple[str, ...]:
    """The sources a file's rows were split into (logparse: several servers), else ()."""
    found = set(log.stats["source_file"].to_list()) | set(log.preemptions["source_file"].to_list())
    return tuple(sorted(found)) if found - {name} else ()


def _year_for(path: Path, year: int, year_source: str, now: datetime) -> int:
    """The year of the log's first vLLM timestamp. Given with --year: as given. Assumed (the
    current year): a first month after the current one means the log started last year (a log
    is not from the future, e.g. December's log read in January)."""
    if year_source != "assumed (current year; pass --year)":
        return year
    with open(path, errors="replace") as f:
        for i, line in enumerate(f):
            m = VLLM_PREFIX.search(strip_ansi(line))
            if m:
                return year - 1 if int(m.group(1)) > now.month else year
            if i > 100_000:
                break
    return year


def read_evidence(db: Path, *tables: str) -> dict[str, pl.DataFrame]:
    """The evidence tables (empty frames with their schema when absent)."""
    if not Path(db).exists():
        raise FileNotFoundError(f"{db}: no such database")
    out = {}
    with connect(db, read_only=True) as con:
        present = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        for t in tables:
            schema = EVIDENCE_TABLES.get(t)
            if t in present:
                out[t] = con.sql(f"SELECT * FROM {t}").pl()
            else:
                out[t] = pl.DataFrame(schema=schema or {})
    return out


def replace_table(db: Path, table: str, df: pl.DataFrame) -> None:
    """Write a derived table (e.g. `attribution`) whole, replacing the previous one."""
    with connect(db) as con:
        check_evidence_schema(con, db)
        con.register("_incoming", df.to_arrow())
        con.execute(f"CREATE OR REPLACE TABLE {table} AS SELECT * FROM _incoming")
        con.unregister("_incoming")
