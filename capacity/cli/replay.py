"""`kvcap replay` and `kvcap runs`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from capacity.cli.common import (HASH_BLOCK_TOKENS_OPTION, CliError, emit_json, engine_flags,
                                 guarded, shown, trace_flags, trace_input_arrivals)
from replay.results.dbfile import DEFAULT_DB

# rich is imported where a terminal is drawn on: `kvcap replay --json` never loads it.
if TYPE_CHECKING:
    from rich.table import Table


def replay_with_progress(trace, engine, *, executor: str, reference: bool, label: str | None,
                         trace_name: str, quiet: bool, stub_options: dict | None = None,
                         record_batches: bool = False, spill_dir: str | None = None,
                         step_sink=None, rate_scale: float | None = None,
                         arrivals: str | None = None):
    """Replay with a rich progress bar on stderr (simulated time, requests admitted);
    `rate_scale` and `arrivals` are recorded with the run."""
    from replay.run import replay
    total_s = float(trace["arrival_s"].max() or 0.0) - float(trace["arrival_s"].min() or 0.0)
    if quiet:
        return replay(trace, engine, executor=executor, label=label,
                      implementation="reference" if reference else "auto",
                      trace_name=trace_name, stub_options=stub_options,
                      record_batches=record_batches, spill_dir=spill_dir, step_sink=step_sink,
                      rate_scale=rate_scale, arrivals=arrivals)
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
                      record_batches=record_batches, spill_dir=spill_dir, step_sink=step_sink,
                      rate_scale=rate_scale, arrivals=arrivals)


def engine_words(s: dict) -> str:
    """'vLLM 0.34 (V1, 64-token blocks), async scheduling (the default)' (capacity.analyses.versions)."""
    from capacity.analyses.versions import engine_words as words
    return words(s["scheduler"], s.get("vllm_version"), s["scheduler_loop"], s.get("block_size"),
                 s.get("preemption_victim"))


def summary_table(s: dict, db: str) -> Table:
    """The replay's summary: what was replayed (deployment, KV blocks, offered rate), whether
    the engine keeps up (the verdict), then the numbers."""
    from rich.table import Table

    from capacity.units import seconds
    t = Table(title=f"run {s['run_id']}: {s['verdict']}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column()
    count = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
    blocks = f"GPU {s['num_gpu_blocks']:,} of {s['block_size']} tokens"
    if s.get("num_cpu_blocks"):
        blocks += f", CPU {s['num_cpu_blocks']:,}"
    offered = "-" if s["offered_rps"] is None else f"{s['offered_rps']:,.2f} req/s"
    if s.get("rate_scale") not in (None, 1.0):
        offered += f" (×{s['rate_scale']:g} the trace)"
    if s.get("arrivals"):
        offered += f" ({s['arrivals']} arrivals)"
    rows = [
        ("engine", engine_words(s)),
        ("model / GPU / TP", f"{s['model']} / {s['gpu']} / {s['tensor_parallel_size']}"),
        ("KV blocks", f"{blocks}; peak use {100 * s['peak_gpu_kv_usage']:.1f} %"),
        ("offered / served", f"{offered} / {s['served_rps']:,.2f} req/s"),
        ("verdict", s["verdict"]),
        ("requests finished / rejected", f"{s['requests_finished']:,} / {s['requests_rejected']:,}"),
        ("simulated duration", seconds(s["sim_seconds"])),
        ("throughput", f"{s['throughput_rps']:,.2f} req/s, {s['output_tokens_per_s']:,.0f} tok/s"),
        ("TTFT p50 / p99", f"{seconds(s['ttft_p50_s'])} / {seconds(s['ttft_p99_s'])}"),
        ("TBT p50 / p99", f"{seconds(s['tbt_p50_s'])} / {seconds(s['tbt_p99_s'])}"),
        *((("preemptions (recompute)", f"{s['preemptions_recompute']:,}"),
           ("recompute tax", f"{s.get('recompute_tax') or 0.0:.1%} of prefill tokens "
                             f"({s.get('recomputed_tokens', 0):,} recomputed)"),
           ("prefix hits GPU / CPU tier", f"{s.get('gpu_hit_tokens', 0):,} / "
                                          f"{s.get('cpu_hit_tokens', 0):,} tokens"))
          if s.get("scheduler") == "v1" else
          (("preemptions recompute / swap", f"{s['preemptions_recompute']:,} / {s['preemptions_swap']:,}"),
           ("swap-full events", count(s["swap_full_events"])),
           ("peak swapped", f"{s['peak_swapped_gib']:,.3f} GiB"))),
        ("wall time", seconds(s["wall_seconds"])),
    ]
    if s.get("abort_s") is not None:
        rows.insert(5, ("engine aborted at", seconds(s["abort_s"])))
    for k, v in rows:
        t.add_row(k, v)
    return t


def verdict(tables: dict, status: str) -> dict:
    """Whether the engine keeps up with the trace (capacity.analyses.stability): `overloaded`
    (the waiting queue grows), `sustainable` (it drains), or `aborted` (the engine stopped)."""
    from capacity.analyses.stability import stability
    from capacity.units import seconds
    st = stability(tables)
    word = "aborted" if status == "aborted" else "sustainable" if st.sustainable else "overloaded"
    why = st.evidence
    if word == "aborted":
        run = tables["runs"].row(0, named=True)
        why = (f"the engine stopped at {seconds(run['abort_s'])} simulated"
               + (f" ({run['abort_reason']})" if run.get("abort_reason") else "")
               + "; the requests left are reported `aborted`")
    return {"verdict": word, "verdict_evidence": why, "offered_rps": st.offered_rps,
            "served_rps": st.served_rps, "backlog_requests": st.backlog_requests}


def deployment(tables: dict) -> dict:
    """What was replayed, from the run's row: model, GPU, TP, KV blocks."""
    run = tables["runs"].row(0, named=True)
    return {"model": run["model"], "gpu": run["gpu"], "tensor_parallel_size": run["tp"],
            "num_gpu_blocks": run["num_gpu_blocks"], "num_cpu_blocks": run["num_cpu_blocks"],
            "block_size": run["block_size"], "rate_scale": run.get("rate_scale"),
            "arrivals": run.get("arrivals")}


@guarded
@engine_flags
@trace_flags
def replay_cmd(
    file: Path = typer.Argument(..., help="Trace file (format detected) or kvcap Parquet."),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="Replay the trace X times faster."),
    executor: str = typer.Option("model", "--executor", help="model (cost model) | stub (torch)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Cost-model profile JSON."),
    db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="DuckDB file to append the run to."),
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
    from replay.results.writer import RunWriter
    wall0 = time.perf_counter()
    trace, _, arrivals = trace_input_arrivals(file, trace_format, rate_scale, binned=False,
                                              hash_block_tokens=hash_block_tokens)
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
                                      spill_dir=spill_dir, step_sink=writer,
                                      rate_scale=rate_scale, arrivals=arrivals)
        tables = result.tables()
        writer.commit(tables)
        s = summary(tables)             # while the writer commits
        writer.wait()
    # Prefix hits at first admission: vLLM's GPU prefix cache and the CPU offloading connector.
    req = tables["requests"]
    s["gpu_hit_tokens"] = int(req["gpu_hit_tokens"].sum())
    s["cpu_hit_tokens"] = int(req["cpu_hit_tokens"].sum())
    s |= deployment(tables) | verdict(tables, s["status"])
    s["db"] = str(db)
    s["wall_seconds"] = time.perf_counter() - wall0
    if facts is not None:
        s["engine_from_logs"] = facts.as_dict()
    if as_json:
        emit_json(s)
    else:
        from rich.console import Console
        out = Console()
        out.print(summary_table(s, str(db)))
        out.print(f"database: {db}", soft_wrap=True, markup=False, highlight=False)
        # Why, in words (a line of its own: no table cell to wrap it in).
        out.print(f"{s['verdict']}: {s['verdict_evidence']}", soft_wrap=True, markup=False,
                  highlight=False)


def _facts_from_logs(db: Path, source: Optional[str], engine):
    """The block counts a production log states (capacity.evidence.engine_facts)."""
    from capacity.evidence.engine_facts import engine_facts
    if engine.num_gpu_blocks_override is not None:
        raise CliError("--from-logs sets the GPU blocks from the log; drop --num-gpu-blocks-override")
    if not db.is_file():
        raise CliError(f"--from-logs: {db}: no such database (write it with `kvcap logs ... --db {db}`)")
    try:
        from replay.config import resolve
        return engine_facts(db, block_size=resolve(engine).block_size, source=source)
    except ValueError as e:
        raise CliError(f"--from-logs: {e}") from None


@guarded
def runs_cmd(db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="DuckDB file to list."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """List the stored runs: trace, engine, knobs, offered rate, TTFT/TBT p99, preemptions,
    verdict (`kvcap export RUN_ID` writes one run's tables)."""
    from capacity.cli.runs import list_runs
    list_runs(db, as_json)
