"""`kvcap size-offload` (V1): sweep `--kv-offloading-size`, recommend the knee, chart the curve.

Thin: parse options, call capacity.analyses.offload.size_offload, print a rich table (or one
JSON object), write the chart when asked (`-o curve.png|.svg|.html`, rendered offline).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.views.progress import phase
from capacity.cli.common import (HASH_BLOCK_TOKENS_OPTION, CliError, emit_json, engine_flags,
                                 guarded, store_runs, trace_input, trace_flags)
from capacity.cli.common import seconds_text as _t

err = Console(stderr=True)
CHART_SUFFIXES = (".png", ".svg", ".html")


def parse_sizes(sizes: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in sizes.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--sizes: expected GiB like 0,16,32,64, got {sizes!r}") from None


def points_table(z) -> Table:
    t = Table(title=f"--kv-offloading-size sweep ({z.engine_words()})")
    for c in ("size (GiB)", "CPU-hit tokens", "prefill computed", "recomputed", "TTFT p50",
              "TTFT p99", "TBT p99", "stalls", "host RAM"):
        t.add_column(c, no_wrap=True)
    for i, p in enumerate(z.points):
        mark = " *" if i == z.knee.index else ""
        t.add_row(f"{p.kv_offloading_size_gib:g}{mark}", f"{p.cpu_hit_tokens:,}",
                  f"{p.prefill_tokens:,}", f"{p.recomputed_prefill_tokens:,}", _t(p.ttft_p50_s),
                  _t(p.ttft_p99_s), _t(p.tbt_p99_s), f"{p.preemption_stalls:,}",
                  f"{p.host_ram_gib:g} GiB" + (f" ({p.host_ram_verdict})" if p.host_ram_verdict else ""))
    return t


def write_chart(z, path: Path) -> None:
    from capacity.report.render import render_chart
    from capacity.views.offload_charts import offload_curve
    from traces import atomic
    chart = offload_curve(z)
    suffix = path.suffix.lower()
    if suffix == ".html":
        import vl_convert as vlc
        atomic.write_text(path, vlc.vegalite_to_html(chart.to_dict(), inline=True))
        return
    svg, png = render_chart(chart)
    if suffix == ".svg":
        atomic.write_text(path, svg)
    else:
        atomic.write_bytes(path, png)


@guarded
@engine_flags
@trace_flags
def size_offload_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    sizes: str = typer.Option("", "--sizes", help="GiB (all TP ranks) to sweep, e.g. 0,16,32,64; "
                              "default: 0.5-8 x the GPU KV pool, up to every prompt's KV."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Recommend the smallest size within "
                                    "this fraction of the best prefill work and TTFT p99."),
    host_ram_gib: Optional[float] = typer.Option(None, "--host-ram-gib", help="Host RAM of the "
                                                 "replica's GPUs (default: the GPU's reference server)."),
    output: Optional[Path] = typer.Option(None, "-o", "--chart", help="Write the curve: .png, .svg or .html."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Also store every replay here."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """V1: sweep --kv-offloading-size and recommend the smallest size within --tolerance of the best."""
    from capacity.analyses.offload import check_v1, size_offload
    from capacity.analyses.planner import Planner
    check_v1(engine)
    if output is not None and output.suffix.lower() not in CHART_SUFFIXES:
        raise CliError(f"-o {output}: the chart is written as .png, .svg or .html; pick one")
    swept = parse_sizes(sizes)
    if engine.kv_offloading_size:
        swept = (*swept, engine.kv_offloading_size)   # the size given is a point of the sweep
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    with phase("size-offload: replaying the sweep…", quiet=quiet):
        z = size_offload(trace, engine, sizes=swept or None, tolerance=tolerance,
                         host_ram_gib=host_ram_gib, planner=planner)
    store_runs(db, planner.runs)
    if output is not None:
        write_chart(z, output)
    if as_json:
        emit_json(z.as_dict() | ({"chart": str(output)} if output else {}))
        return
    Console(width=120).print(points_table(z))
    Console().print(f"[bold]recommendation:[/bold] {z.words()}")
    if z.recommended.host_ram_verdict in ("warn", "error"):
        err.print(f"[yellow]warning: {z.recommended.host_ram_gib:g} GiB of pinned host RAM is past "
                  f"{'70%' if z.recommended.host_ram_verdict == 'error' else '40%'} of the host's "
                  f"{z.host_ram_total_gib:g} GiB ({z.host_ram_source})")
    elif z.recommended.host_ram_verdict is None and z.needed:
        err.print(f"host RAM: {z.host_ram_source}")
