"""`kvcap replay` and `kvcap runs`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from capacity.cli.common import (HASH_BLOCK_TOKENS_OPTION, CliError, emit_json, engine_flags,
                                 guarded, shown, trace_input)

# rich is imported where a terminal is drawn on: `kvcap replay --json` never loads it.
if TYPE_CHECKING:
    from rich.table import Table


def replay_with_progress(trace, engine, *, executor: str, reference: bool, label: str | None,
                         trace_name: str, quiet: bool, stub_options: dict | None = None,
                         record_batches: bool = False, spill_dir: str | None = None,
                         step_sink=None):
    """Replay with a rich progress bar on stderr (simulated time, requests admitted)."""
    from replay.run import replay
    total_s = float(trace["arrival_s"].max() or 0.0) - float(trace["arrival_s"].min() or 0.0)
    if quiet:
        return replay(trace, engine, executor=executor, label=label,
                      implementation="reference" if reference else "auto",
                      trace_name=trace_name, stub_options=stub_options,
                      record_batches=record_batches, spill_dir=spill_dir, step_sink=step_sink)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]replay"), BarColumn(), TextColumn("{task.fields[sim]}"),
                  TextColumn("{task.fields[reqs]}"), TimeElapsedColumn(), console=err,
                  transient=True) as prog:
        task = prog.add_task("replay", total=max(total_s, 1e-9), sim="", reqs="")

        def on_progress(t: float, admitted: int) -> None:
            prog.update(task, completed=min(t, total_s), sim=f"sim {t:,.0f}/{total_s:,.0f} s",
                        reqs=f"{admitted:,}/{trace.height:,} requests")

        return replay(trace, engine, executor=executor, label=label,
                      implementation="reference" if reference else "auto",
                      trace_name=trace_name, on_progress=on_progress, stub_options=stub_options,
                      record_batches=record_batches, spill_dir=spill_dir, step_sink=step_sink)


def summary_table(s: dict, db: str) -> Table:
    from rich.table import Table
    t = Table(title=f"run {s['run_id']} ({s['status']})", show_header=False)
    fmt = lambda v, unit="": "-" if v is None else (f"{v:,.3f}{unit}" if isinstance(v, float) else f"{v:,}{unit}")  # noqa: E731
    rows = [
        ("requests finished / rejected", f"{s['requests_finished']:,} / {s['requests_rejected']:,}"),
        ("simulated duration", fmt(s["sim_seconds"], " s")),
        ("throughput", f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:,.0f} tok/s"),
        ("TTFT p50 / p99", f"{fmt(s['ttft_p50_s'], ' s')} / {fmt(s['ttft_p99_s'], ' s')}"),
        ("TBT p50 / p99", f"{fmt(s['tbt_p50_s'], ' s')} / {fmt(s['tbt_p99_s'], ' s')}"),
        *((("engine", f"V1 (0.33), {s['scheduler_loop']} scheduling loop"),
           ("preemptions (recompute)", f"{s['preemptions_recompute']:,}"),
           ("prompt tokens hit: GPU / CPU tier", f"{s.get('gpu_hit_tokens', 0):,} / "
                                                 f"{s.get('cpu_hit_tokens', 0):,}"))
          if s.get("scheduler") == "v1" else
          (("engine", "V0 (0.10.1.1), synchronous loop"),
           ("preemptions recompute / swap", f"{s['preemptions_recompute']:,} / {s['preemptions_swap']:,}"),
           ("swap-full events", fmt(s["swap_full_events"])),
           ("peak swapped", fmt(s["peak_swapped_gib"], " GiB")))),
        ("peak GPU KV usage", f"{100 * s['peak_gpu_kv_usage']:.1f} %"),
        ("wall time", fmt(s["wall_seconds"], " s")),
        ("database", db),
    ]
    if s.get("abort_s") is not None:
        rows.insert(1, ("engine aborted at", fmt(s["abort_s"], " s")))
    for k, v in rows:
        t.add_row(k, v)
    return t


@guarded
@engine_flags
def replay_cmd(
    file: Path = typer.Argument(..., help="Trace file (format detected) or kvcap Parquet."),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="Replay the trace X times faster."),
    executor: str = typer.Option("model", "--executor", help="model (cost model) | stub (torch)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Cost-model profile JSON."),
    db: Path = typer.Option(Path("kvcap.duckdb"), "--db", help="DuckDB file to append the run to."),
    label: Optional[str] = typer.Option(None, "--label"),
    trace_format: Optional[str] = typer.Option(None, "--format", help="Trace format (default: detect)."),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    reference: bool = typer.Option(False, "--reference", help="Replay on the Python reference implementation instead of the compiled core."),
    stub_shape: Optional[str] = typer.Option(None, "--stub-shape", help="Stub model: full | tiny (default: full on CUDA, tiny on CPU)."),
    timing: str = typer.Option("model", "--timing", help="Stub clock: model (cost model, same decisions) | measured."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    record_batches: bool = typer.Option(False, "--record-batches", help="Also store table `batches`: every request in every step's batch with its new and computed tokens (one row per scheduled request per step)."),
    from_logs: Optional[Path] = typer.Option(None, "--from-logs", help="DuckDB of `kvcap logs`: take the GPU "
                                             "(and CPU) block counts its server log states."),
    log_source: Optional[str] = typer.Option(None, "--log-source", help="With --from-logs: which log."),
    engine=None,
) -> None:
    """Replay a trace through the engine model and store the run in DuckDB."""
    import dataclasses
    import time

    from capacity.analyses.metrics import summary
    from replay.writer import RunWriter
    wall0 = time.perf_counter()
    trace, _ = trace_input(file, trace_format, rate_scale, binned=False, hash_block_tokens=hash_block_tokens)
    if calibration is not None:
        engine = dataclasses.replace(engine, calibration=str(calibration))
    facts = _facts_from_logs(from_logs, log_source, engine) if from_logs is not None else None
    if facts is not None:
        engine = dataclasses.replace(engine, num_gpu_blocks_override=facts.num_gpu_blocks,
                                     num_cpu_blocks_override=engine.num_cpu_blocks_override
                                     if facts.num_cpu_blocks is None else facts.num_cpu_blocks)
    stub_options = {"stub_shape": stub_shape, "timing": timing} if executor == "stub" else None
    # A long run's steps and TBT samples wait on disk beside the DB (memory bounded by requests).
    spill_dir = str(db.parent) if db.parent.is_dir() else None
    # The run goes into the DB while it replays (one transaction, committed at the end).
    with RunWriter(db) as writer:
        result = replay_with_progress(trace, engine, executor=executor, reference=reference,
                                      label=label, trace_name=file.name, quiet=as_json,
                                      stub_options=stub_options, record_batches=record_batches,
                                      spill_dir=spill_dir, step_sink=writer)
        tables = result.tables()
        writer.commit(tables)
        s = summary(tables)             # while the writer commits
        writer.wait()
    # Prefix hits at first admission: vLLM's GPU prefix cache and the CPU offloading connector.
    req = tables["requests"]
    s["gpu_hit_tokens"] = int(req["gpu_hit_tokens"].sum())
    s["cpu_hit_tokens"] = int(req["cpu_hit_tokens"].sum())
    s["db"] = str(db)
    s["wall_seconds"] = time.perf_counter() - wall0
    if facts is not None:
        s["engine_from_logs"] = facts.as_dict()
    if as_json:
        emit_json(s)
    else:
        from rich.console import Console
        Console().print(summary_table(s, str(db)))


def _facts_from_logs(db: Path, source: Optional[str], engine):
    """The block counts a production log states (capacity.evidence.engine_facts)."""
    from capacity.evidence.engine_facts import engine_facts
    if engine.num_gpu_blocks_override is not None:
        raise CliError("--from-logs sets the GPU blocks from the log; drop --num-gpu-blocks-override")
    if not db.is_file():
        raise CliError(f"--from-logs: {db}: no such database (write it with `kvcap logs ... --db {db}`)")
    try:
        return engine_facts(db, block_size=engine.block_size, source=source)
    except ValueError as e:
        raise CliError(f"--from-logs: {e}") from None


@guarded
def runs_cmd(db: Path = typer.Option(Path("kvcap.duckdb"), "--db"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """List the runs stored in a DuckDB file."""
    from replay.store import list_runs
    if not db.exists():
        raise FileNotFoundError(f"{db}: no such database")
    df = list_runs(db)
    from rich.console import Console
    from rich.table import Table
    if as_json:
        emit_json({"db": str(db), "runs": df.with_columns(
            df["created_at"].cast(str)).to_dicts() if df.height else []})
        return
    t = Table(title=f"runs in {db}")
    for c in df.columns:
        t.add_column(c)
    for row in df.iter_rows():
        t.add_row(*["" if v is None else (f"{v:.2f}" if isinstance(v, float) else shown(v)) for v in row])
    Console().print(t)
