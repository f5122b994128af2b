"""`kvcap logs`, `kvcap attribute`, `kvcap validate` and `size-swap --from-logs` (production evidence).

Thin: parse options, call capacity.evidence.logs / attribute / logs_swap / validate, print a rich table or
one JSON object (`--json`). Bad input -> one line `kvcap: error: ...`, exit 2 (cli_common.guarded).
"""
from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.cli.common import CliError, emit_json, guarded, shown
from capacity.units import number
from replay.results.dbfile import DEFAULT_DB

err = Console(stderr=True)


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _client_start(text: Optional[str]) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--client-start: {text!r} is not an ISO time (e.g. 2025-05-20T12:00:00)") from None


@guarded
def logs_cmd(
    files: List[Path] = typer.Argument(..., help="vLLM server logs, client results (JSON, CSV, JSONL), "
                                       "Prometheus /metrics scrapes (a folder, or a file with time lines) "
                                       "and query_range JSON exports."),
    db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="DuckDB file to write the evidence tables to."),
    year: Optional[int] = typer.Option(None, "--year", help="Year of the log timestamps (vLLM prints none)."),
    kind: Optional[str] = typer.Option(None, "--kind", help="server | client | prometheus (default: detect "
                                       "from content)."),
    window_s: float = typer.Option(10.0, "--window-s", help="Prometheus: window (s) for counter rates, "
                                   "gauge means and histogram quantiles (table prom_windows)."),
    client_start: Optional[str] = typer.Option(None, "--client-start",
                                               help="Wall-clock time of the first client request (ISO)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Load vLLM server logs, client benchmark results and Prometheus metrics into DuckDB (log_stats,
    log_preemptions, log_unparsed, log_engine, log_events, client_tokens, prom_samples, prom_windows). A file that cannot be read is skipped
    with a warning; exit 2 only when none could be read."""
    from capacity.evidence.logs import ingest_files
    from traces.schema import printable
    rep = ingest_files(list(files), db, year=year, kind=kind, client_start=_client_start(client_start),
                       window_s=window_s)
    results, used_year, year_source = rep.files, rep.year, rep.year_source
    for s in rep.skipped:  # one plain line each (rich would wrap it)
        print(printable(f"kvcap: warning: {s.path}: skipped: {s.reason}"), file=sys.stderr)
    unparsed = sum(r.unparsed for r in results)
    out = {"db": str(db), "year": used_year, "year_source": year_source,
           "files": [r.as_dict() for r in results],
           "skipped": [s.as_dict() for s in rep.skipped],
           "stats_rows": sum(r.rows for r in results if r.kind == "server"),
           "preemption_warnings": sum(r.preemption_warnings for r in results),
           "engine_lines": sum(r.engine_lines for r in results),
           "events": sum(r.events for r in results),
           "client_tokens": sum(r.rows for r in results if r.kind == "client"),
           "prom_samples": sum(r.rows for r in results if r.kind == "prometheus"),
           "prom_windows": sum(r.windows for r in results),
           "unparsed": unparsed}
    if as_json:
        emit_json(out)
        return
    t = Table(title=f"evidence in {shown(db)} (log year {used_year}: {year_source})")
    for c in ("file", "kind", "era", "lines", "rows", "warnings", "engine", "events", "unparsed lines"):
        t.add_column(c)
    for r in results:
        bad = ", ".join(map(str, r.unparsed_lines[:10])) + (" …" if len(r.unparsed_lines) > 10 else "")
        t.add_row(shown(r.source_file), r.kind, r.era or "-", str(r.lines or "-"), str(r.rows),
                  str(r.preemption_warnings), str(r.engine_lines), str(r.events),
                  f"{r.unparsed}" + (f" ({bad})" if bad else ""))
    Console().print(t)
    if unparsed:
        err.print(f"[yellow]{unparsed} candidate line(s) did not parse; see table log_unparsed")
    for r in results:
        if r.servers:
            err.print(f"{shown(r.source_file)}: {len(r.servers)} servers in one file, kept apart as "
                      + ", ".join(shown(s) for s in r.servers), markup=False, highlight=False)
        if r.kind == "client" and not r.anchored:
            err.print(f"[yellow]{shown(r.source_file)}: no wall-clock anchor; pass --client-start to line it up with logs")


@guarded
def attribute_cmd(
    db: Path = typer.Option(Path(DEFAULT_DB), "--db"),
    threshold_s: Optional[float] = typer.Option(None, "--threshold-s",
                                                help="ITL above this is a spike (default: 5 x median ITL)."),
    window_s: float = typer.Option(2.0, "--window-s", help="Seconds added on both sides of a spike's gap."),
    server: Optional[str] = typer.Option(None, "--server", help="Only this server log (file name)."),
    client: Optional[str] = typer.Option(None, "--client", help="Only these client results (file name)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Line client TBT spikes up with logged preemptions: preemption (which mode) or not."""
    from capacity.evidence.attribute import attribute
    a = attribute(db, threshold_s=threshold_s, window_s=window_s, server=server, client=client)
    if as_json:
        emit_json(a.as_dict())
        return
    t = Table(title=f"TBT spikes > {a.threshold_s:.3f} s (window ±{a.window_s:g} s) — table attribution")
    for c in ("time", "request", "token", "ITL s", "verdict", "mode", "evidence"):
        t.add_column(c)
    for r in a.table.head(200).iter_rows(named=True):
        t.add_row(str(r["spike_time"])[:23], shown(r["request_id"]), str(r["token_index"]),
                  f"{r['itl_s']:.3f}", r["verdict"], r["mode"] or "-", shown(r["evidence"] or "-"))
    c = Console()
    c.print(t)
    c.print(" · ".join(f"{k}: {v}" for k, v in a.verdicts.items()))
    if a.untimed_spikes:
        err.print(f"[yellow]{a.untimed_spikes} spike(s) have no wall-clock time (load with --client-start)")


@guarded
def validate_cmd(
    db: Path = typer.Option(Path(DEFAULT_DB), "--db"),
    run: str = typer.Option(..., "--run", help="Run id of the replay (see `kvcap runs`)."),
    offset_s: float = typer.Option(0.0, "--offset-s", help="Replay t=0 is this many seconds after the first log line."),
    source: Optional[str] = typer.Option(None, "--source", help="Server log file name (when several are loaded)."),
    engine: int = typer.Option(0, "--engine", help="Engine index (V1 data parallel)."),
    client: Optional[str] = typer.Option(None, "--client", help="Only these client results (file name)."),
    prometheus: bool = typer.Option(False, "--prometheus", help="Compare with the Prometheus windows "
                                    "(prom_windows) instead of the log's stats lines."),
    server: Optional[str] = typer.Option(None, "--server", help="--prometheus: which server (when several)."),
    rel_tol: float = typer.Option(0.25, "--rel-tol", help="--prometheus: a window parts ways beyond this "
                                  "relative difference (and the metric's floor)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare a replay with the logged time series and client latencies, or with the Prometheus
    series (--prometheus); error per metric, and where they part ways."""
    if prometheus:
        return _validate_prometheus(db, run, offset_s=offset_s, server=server, engine=str(engine),
                                    rel_tol=rel_tol, as_json=as_json)
    from capacity.evidence.validate import validate
    v = validate(db, run, offset_s=offset_s, source=source, engine=engine, client=client)
    if as_json:
        emit_json(v.as_dict())
        return
    t = Table(title=f"replay {v.run_id} vs {v.source} ({v.intervals} intervals from {v.log_start})")
    for c in ("metric", "n", "logged mean", "replay mean", "MAE", "relative error", "bias"):
        t.add_column(c)
    for name, m in v.metrics.items():
        t.add_row(name, str(m.n), _fmt(m.log_mean), _fmt(m.replay_mean), _fmt(m.mae),
                  "-" if m.relative_error is None else f"{100 * m.relative_error:.1f} %", _fmt(m.bias))
    lt = Table(title="client vs replay latency")
    for c in ("percentile", "client s", "replay s", "error s", "relative error"):
        lt.add_column(c)
    for name, m in v.latency.items():
        lt.add_row(name, _fmt(m.client), _fmt(m.replay), _fmt(m.error),
                   "-" if m.relative_error is None else f"{100 * m.relative_error:.1f} %")
    c = Console()
    c.print(t)
    c.print(lt)


def _validate_prometheus(db: Path, run: str, *, offset_s: float, server: Optional[str], engine: str,
                         rel_tol: float, as_json: bool) -> None:
    from capacity.evidence.promvalidate import compare_prometheus
    if not rel_tol > 0:
        raise CliError(f"--rel-tol: must be > 0, got {rel_tol:g}")
    c = compare_prometheus(db, run, server=server, engine=engine, offset_s=offset_s, rel_tol=rel_tol)
    if as_json:
        emit_json(c.as_dict())
        return
    t = Table(title=f"replay {c.run_id} vs Prometheus {shown(c.server)} engine {shown(c.engine or '-')} "
                    f"({c.windows} windows of {c.window_s:g} s from {c.start})")
    for col in ("metric", "n", "production mean", "replay mean", "MAE", "relative error", "bias"):
        t.add_column(col)
    for name, m in c.metrics.items():
        t.add_row(name, str(m.n), _fmt(m.log_mean), _fmt(m.replay_mean), _fmt(m.mae),
                  "-" if m.relative_error is None else f"{100 * m.relative_error:.1f} %", _fmt(m.bias))
    out = Console()
    out.print(t)
    for d in c.divergences:
        out.print(f"parts ways: {d.metric} over {d.windows} window(s), {d.from_s - c.start_s:.0f} s to "
                  f"{d.to_s - c.start_s:.0f} s after {c.start} "
                  f"(production {number(d.production_mean)}, replay {number(d.replay_mean)}, "
                  f"max |error| {number(d.max_abs_error)})")


def size_swap_from_logs_cli(db: Optional[Path], engine, *, context_tokens: Optional[int],
                            headroom: float, as_json: bool) -> None:
    """`kvcap size-swap --from-logs` (called from capacity.cli.plan.size_swap_cmd)."""
    from capacity.evidence.logs_swap import size_swap_from_logs
    if db is None:
        raise CliError("--from-logs needs --db PATH (the DuckDB file `kvcap logs` wrote)")
    s = size_swap_from_logs(db, engine, context_tokens=context_tokens, headroom=headroom)
    if as_json:
        emit_json(s.as_dict())
        return
    t = Table(title="swap-space sizing from production logs (per GPU)", show_header=False)
    t.add_row(f"peak concurrently swapped ({s.evidence})",
              f"{s.peak_swapped_requests} requests at {s.peak_at or '-'} ({shown(s.peak_source_file or '-')})")
    t.add_row("KV per swapped request", f"{s.context_tokens:,} tokens ({s.context_source}) x "
              f"{s.kv_bytes_per_token:,} B/token ({s.model}, TP {s.tensor_parallel_size})")
    t.add_row("peak swapped KV", f"{s.peak_swapped_gib:.2f} GiB")
    if s.peak_cpu_kv_usage is not None:
        t.add_row("logged CPU KV cache usage peak", f"{100 * s.peak_cpu_kv_usage:.1f} % "
                  f"(= {s.peak_cpu_kv_gib_at_swap_space:.2f} GiB if production ran --swap-space {engine.swap_space:g})")
    t.add_row("recommended --swap-space (V0)", f"{s.recommended_swap_space_gib:g} GiB")
    if s.replay is not None:
        t.add_row("replay-based (run " + s.replay.run_id + ")",
                  f"{s.replay.peak_swapped_requests} requests, {s.replay.peak_swapped_gib:.2f} GiB -> "
                  f"--swap-space {s.replay.recommended_swap_space_gib:g} GiB")
    c = Console()
    c.print(t)
    c.print(s.difference)
