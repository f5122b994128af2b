"""`kvcap trace ...`: inspect (`info`), synthesise (`synth`) and convert (`convert`) traces.

Bad input prints one line `kvcap: error: <message>` on stderr and exits with code 2; output files
are written to a temp file beside the target and renamed, so a failure leaves no file behind.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from traces.arrivals import parse_arrivals
from traces.loaders import LoadReport, load_trace_with_report, write_trace
from traces.schema import TraceError
from traces.stats import trace_info
from traces.synth import DEFAULT_SCENARIO, SCENARIOS, make_params, synthesize

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Inspect, synthesise and convert traces.")

EXIT_BAD_INPUT = 2

FormatOpt = typer.Option(None, "--format", help="azure, mooncake, burstgpt, vidur, vllm_bench, "
                         "vllm_bench_requests, kvcap, csv, jsonl or parquet (detected from the "
                         "header / keys when omitted)")
MapOpt = typer.Option(None, "--map", help="COLUMN=FIELD (repeat): map a source column to arrival_s, "
                      "prompt_tokens, output_tokens, request_id, priority, tenant or prefix_hashes")
UnitOpt = typer.Option(None, "--time-unit", help="unit of numeric times: s, ms, us")
TsFmtOpt = typer.Option(None, "--timestamp-format", help="strftime-style format of text times, or 'auto'")
HbtOpt = typer.Option(None, "--hash-block-tokens", help="prompt tokens per prefix hash (default: the "
                      "trace's own, Mooncake hash_ids: 512)")
ArrOpt = typer.Option(None, "--arrivals", help="a lengths-only trace's arrivals (Vidur "
                      "arxiv-summarization, BWB): poisson:RATE or gamma:RATE:CV, RATE in req/s")
SeedOpt = typer.Option(None, "--seed", help="seed of --arrivals (default 0)")


def _fail(message: str) -> None:
    typer.echo(f"kvcap: error: {' '.join(message.split())}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _check_output(output: Path, *inputs: Path) -> None:
    """Before any work: -o must be a regular file or absent, not an input, named .parquet-like."""
    from traces.atomic import OutputRefused, check_output
    try:
        check_output(output, fmt="Parquet", inputs=inputs)
    except OutputRefused as exc:
        _fail(str(exc))


def _mapping(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        column, sep, field = pair.rpartition("=")
        if not sep or not column or not field:
            _fail(f"--map {pair!r}: expected COLUMN=FIELD, e.g. --map ts=arrival_s")
        out[column] = field
    return out


def _load(file: Path, format, map_, time_unit, timestamp_format, hash_block_tokens=None,
          arrivals: str | None = None, seed: int | None = None):
    try:
        if arrivals is None and seed is not None:
            raise TraceError(f"--seed {seed}: seeds --arrivals (a lengths-only trace's arrival "
                             "times); give --arrivals too, or drop --seed")
        synthetic = None if arrivals is None else parse_arrivals(arrivals, seed or 0)
        return load_trace_with_report(file, format=format, mapping=_mapping(map_), time_unit=time_unit,
                                      timestamp_format=timestamp_format,
                                      hash_block_tokens=hash_block_tokens, arrivals=synthetic)
    except TraceError as exc:
        _fail(str(exc))


@app.command()
def info(file: Path = typer.Argument(..., help="trace file (CSV, JSONL or Parquet)"),
         format: Optional[str] = FormatOpt, map_: Optional[list[str]] = MapOpt,
         time_unit: Optional[str] = UnitOpt, timestamp_format: Optional[str] = TsFmtOpt,
         hash_block_tokens: Optional[int] = HbtOpt, arrivals: Optional[str] = ArrOpt,
         seed: Optional[int] = SeedOpt,
         json_: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Requests, duration, rates, peaks, length percentiles and prefix reuse of a trace, and
    the layout detected (lengths-only: with the synthetic arrivals of --arrivals)."""
    df, report = _load(file, format, map_, time_unit, timestamp_format, hash_block_tokens,
                       arrivals, seed)
    stats = trace_info(df)
    stats.update(format=report.format, file=report.path, rows_read=report.rows_read,
                 failed_requests=report.failed_requests, rows_reordered=report.rows_reordered,
                 time_origin=report.time_origin,
                 layout_detected=format is None and not map_,
                 arrivals=report.arrivals, source_format=report.source_format)
    if json_:
        typer.echo(json.dumps(stats))
    else:
        Console().print(_table(stats, report))


def _table(s: dict, report: LoadReport) -> Table:
    from capacity.cli.common import shown
    # No cell wraps at 80 columns: short labels, the length percentiles on two rows.
    t = Table(title=f"{shown(Path(report.path).name)} ({report.format})", show_header=False,
              caption="percentiles: nearest rank")
    t.add_column("statistic", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    t.add_row("layout", f"{report.format} ({'detected' if s['layout_detected'] else 'as given'})")
    if report.arrivals:
        t.add_row("arrivals", f"synthesised: {report.arrivals}")
        if report.format == "kvcap" and report.source_format:
            t.add_row("converted from", f"{report.source_format} layout")
    t.add_row("requests", f"{s['requests']:,}")
    if report.failed_requests:
        t.add_row("failed requests (excluded)", f"{report.failed_requests:,}")
    if report.rows_reordered:
        t.add_row("rows reordered by time", f"{report.rows_reordered:,}")
    t.add_row("first request at", shown(report.time_origin))
    t.add_row("duration (s)", f"{s['duration_s']:,.1f}")
    t.add_row("mean req/s | req/min", f"{s['mean_rps'] or 0:,.2f} | {s['mean_rpm']:,.1f}")
    t.add_row("peak req/min (bins)", f"{s['peak_rpm']:,} (minute {s['peak_rpm_minute']})")
    t.add_row("peak req in sliding 60 s", f"{s['peak_60s']:,}")
    t.add_row("peak req/s", f"{s['peak_rps']:,}")
    t.add_row("peak prompt+output tokens / min", f"{s['peak_tokens_per_min']:,} (minute {s['peak_tokens_minute']})")
    for name in ("prompt_tokens", "output_tokens"):
        d = s[name]
        t.add_row(f"{name.replace('_', ' ')} mean / p50 / p90",
                  f"{d['mean']:,.1f} / {d['p50']:,} / {d['p90']:,}")
        t.add_row(f"{name.replace('_', ' ')} p99 / max / min", f"{d['p99']:,} / {d['max']:,} / {d['min']:,}")
    if len(s["priorities"]) > 1 or s["tenants"]:
        t.add_row("priorities", ", ".join(f"{k}: {v:,}" for k, v in s["priorities"].items()))
        t.add_row("tenants", ", ".join(f"{shown(k)}: {v:,}" for k, v in s["tenants"].items()) or "-")
    p = s["prefix"]
    if p:
        t.add_row("tokens per prefix hash", f"{p['hash_block_tokens']:,}")
        t.add_row("block refs / unique blocks", f"{p['block_refs']:,} / {p['unique_blocks']:,}")
        t.add_row("block refs seen earlier", f"{p['refs_seen_pct']:.1f} %")
        t.add_row("prompt tokens in a seen prefix", f"{p['prefix_covered_pct']:.1f} %")
    return t


@app.command()
def synth(scenario: str = typer.Argument(DEFAULT_SCENARIO, help=f"one of: {', '.join(SCENARIOS)}"),
          output: Path = typer.Option(..., "-o", "--output", help="output Parquet file"),
          seed: Optional[int] = typer.Option(None, "--seed"),
          duration_s: Optional[float] = typer.Option(None, "--duration-s"),
          rate: Optional[float] = typer.Option(None, "--rate", help="base / mean request rate (req/s)"),
          lengths: Optional[str] = typer.Option(None, "--lengths",
                                                help="lognormal | azure-conv | azure-code | mooncake"),
          param: Optional[list[str]] = typer.Option(None, "--param", help="KEY=VALUE (repeat): any "
                                                    "scenario parameter, e.g. --param cv=4"),
          json_: bool = typer.Option(False, "--json")) -> None:
    """Write a seeded synthetic scenario as a canonical Parquet trace."""
    _check_output(output)
    overrides: dict[str, object] = {}
    for pair in param or []:
        key, sep, value = pair.partition("=")
        if not sep:
            _fail(f"--param {pair!r}: expected KEY=VALUE")
        overrides[key] = value
    for key, value in (("seed", seed), ("duration_s", duration_s), ("rate_rps", rate), ("lengths", lengths)):
        if value is not None:
            overrides[key] = value
    try:
        params = make_params(scenario, **overrides)
        df = synthesize(scenario, params)
        write_trace(df, output)
    except (TraceError, OSError, ValueError) as exc:
        _fail(str(exc))
    if json_:
        typer.echo(json.dumps({"output": str(output), "scenario": scenario, "requests": len(df),
                               "params": {k: getattr(params, k) for k in params.__dataclass_fields__}}))
    else:
        typer.echo(f"wrote {len(df):,} requests ({scenario}) to {output}")


@app.command()
def convert(file: Path = typer.Argument(..., help="trace file to convert"),
            output: Path = typer.Option(..., "-o", "--output", help="output Parquet file"),
            format: Optional[str] = FormatOpt, map_: Optional[list[str]] = MapOpt,
            time_unit: Optional[str] = UnitOpt, timestamp_format: Optional[str] = TsFmtOpt,
            hash_block_tokens: Optional[int] = HbtOpt, arrivals: Optional[str] = ArrOpt,
            seed: Optional[int] = SeedOpt,
            json_: bool = typer.Option(False, "--json")) -> None:
    """Write a trace in kvcap's canonical Parquet form (keeping --hash-block-tokens, and
    --arrivals in the file's metadata)."""
    _check_output(output, file)
    df, report = _load(file, format, map_, time_unit, timestamp_format, hash_block_tokens,
                       arrivals, seed)
    try:
        write_trace(df, output, metadata=report.metadata())
    except (TraceError, OSError, ValueError) as exc:
        _fail(str(exc))
    result = {"output": str(output), "format": report.format, "requests": report.requests,
              "failed_requests": report.failed_requests, "rows_reordered": report.rows_reordered,
              "arrivals": report.arrivals}
    if json_:
        typer.echo(json.dumps(result))
    else:
        typer.echo(f"wrote {report.requests:,} requests ({report.format}) to {output}", file=sys.stdout)
