"""`kvcap sweep`: a grid of replays on the local process pool or on Ray (capacity/analyses/distributed.py)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.cli.common import (CliError, emit_json, engine_flags, guarded, load_trace_file,
                                 seconds_text, trace_flags)

err = Console(stderr=True)


@guarded
@engine_flags
@trace_flags
def sweep_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file (or `trace` in the grid)."),
    grid: Optional[str] = typer.Option(None, "--grid", help="'max_num_seqs=64,128;rate_scale=1,2' (any engine field, rate_scale, trace)."),
    grid_file: Optional[Path] = typer.Option(None, "--grid-file", help="The grid as YAML (grid: {key: [values]})."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="auto | local | ray://host:port (or $KVCAP_RAY_ADDRESS); default: the local process pool."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local pool processes / CPUs of a local Ray (default: cores)."),
    retries: int = typer.Option(1, "--retries", help="Retries of a failed task before it is reported."),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Store every run here; runs already stored are skipped."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Replay a grid of configurations (x traces x rate scales) in parallel: the local process
    pool, or Ray with --ray-address. Only this process writes --db; a rerun skips stored runs."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from capacity.analyses.distributed import make_points, ray_address as address_of, sweep
    from capacity.analyses.grid import parse_grid_file, parse_grid_text, points
    if (grid is None) == (grid_file is None):
        raise CliError("give the grid once: --grid 'key=v1,v2;key2=v3' or --grid-file FILE.yml")
    if not 0 <= retries <= 10:
        raise CliError(f"--retries {retries}: must be a whole number from 0 to 10")
    g = parse_grid_text(grid) if grid is not None else parse_grid_file(grid_file)
    paths = g.get("trace") or ([str(file)] if file is not None else [])
    if not paths:
        raise CliError("no trace: give TRACE or a `trace` key in the grid")
    if file is not None and "trace" in g:
        raise CliError("the grid has a `trace` key: leave out the TRACE argument")
    traces = {p: load_trace_file(Path(p), trace_format=trace_format) for p in dict.fromkeys(paths)}
    pts = make_points(traces, engine, points(g), default_trace=paths[0])
    address = address_of(ray_address)
    executor = "ray" if address else "local"
    with Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as prog:
        task = prog.add_task("sweep", total=len(pts))
        out = sweep(pts, traces, db=db, executor=executor, address=address, workers=workers,
                    retries=retries, on_progress=lambda d, n: prog.update(task, completed=d,
                                                                          total=max(n, 1)))
    for f in out.failed:
        err.print(f"kvcap: sweep point {f['index']} ({f['label']}) failed after {retries} "
                  f"retr{'y' if retries == 1 else 'ies'}: {f['error']}")
    if as_json:
        emit_json(out.as_dict())
    else:
        t = Table(title=f"sweep: {len(pts)} points ({executor}{' ' + address if address else ''}); "
                        f"{len(out.written)} replayed, {len(out.skipped)} already stored, "
                        f"{len(out.failed)} failed")
        for c in ("run", "point", "req/s", "TTFT p99", "TBT p99", "preempt"):
            t.add_column(c)
        for s in out.as_dict()["summaries"]:
            t.add_row(s["run_id"], s["label"].removeprefix("sweep "), f"{s['throughput_rps']:,.2f}",
                      seconds_text(s["ttft_p99_s"]), seconds_text(s["tbt_p99_s"]),
                      f"{s['preemptions_recompute'] + s['preemptions_swap']:,}")
        Console(width=110).print(t)
    if out.failed:
        raise typer.Exit(1)
