"""`kvcap tune` (max-num-seqs sweep against SLOs and a preemption budget)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from capacity.cli_common import CliError, emit_json, engine_flags, guarded

err = Console(stderr=True)


def parse_grid(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise CliError(f"{name}: expected a comma-separated list of integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise CliError(f"{name}: give positive integers, e.g. 64,128,256")
    return vals


def tuning_table(tn) -> Table:
    t = Table(title=f"max-num-seqs sweep (SLO: TTFT p99 ≤ {tn.slo_ttft_p99_s:g} s, "
                    f"TBT p99 ≤ {tn.slo_tbt_p99_s:g} s)")
    for c in ("max_num_seqs", "batched_tokens", "goodput req/s", "TTFT p99 s", "TBT p99 s",
              "preempt/min", "min w/ preempt", "recomputed", "verdict"):
        t.add_column(c)
    rec = tn.recommended
    for c in sorted(tn.candidates, key=lambda c: (c.max_num_batched_tokens, c.max_num_seqs)):
        verdict = ("[bold green]recommended" if c is rec else "ok" if c.feasible else c.breaks)
        f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        t.add_row(str(c.max_num_seqs), str(c.max_num_batched_tokens), f"{c.goodput_rps:.2f}",
                  f(c.ttft_p99_s), f(c.tbt_p99_s), f"{c.preemptions_per_min:.2f}",
                  f"{c.preempted_minutes_share:.0%}", f"{c.recomputed_share:.1%}", verdict)
    return t


@guarded
@engine_flags
def tune_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    max_num_seqs_grid: str = typer.Option(..., "--max-num-seqs-grid", help="e.g. 64,128,256,512"),
    max_num_batched_tokens_grid: Optional[str] = typer.Option(None, "--max-num-batched-tokens-grid"),
    slo_ttft_p99: float = typer.Option(..., "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(..., "--slo-tbt-p99", help="Seconds."),
    preemption_budget: float = typer.Option(
        0.1, "--preemption-budget", help="Max share of minutes with any preemption (peaks only)."),
    max_preemptions_per_minute: Optional[float] = typer.Option(None, "--max-preemptions-per-minute"),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Store every replay here (one writer)."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Sweep --max-num-seqs (and --max-num-batched-tokens) and recommend the value to deploy."""
    from capacity.cli_capacity import _store, _trace
    from capacity.tuning import Budget, tune
    grid = parse_grid(max_num_seqs_grid, "--max-num-seqs-grid")
    tokens = (parse_grid(max_num_batched_tokens_grid, "--max-num-batched-tokens-grid")
              if max_num_batched_tokens_grid else None)
    trace, name = _trace(file, trace_format, rate_scale)
    budget = Budget(max_minutes_share=preemption_budget, max_per_minute=max_preemptions_per_minute)
    runs: list = []
    n = len(grid) * len(tokens or [None])
    with Progress(console=err, transient=True, disable=as_json) as prog:
        task = prog.add_task("tune: replaying candidates", total=n)
        tn = tune(trace, engine, max_num_seqs_grid=grid, max_num_batched_tokens_grid=tokens,
                  slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99, budget=budget,
                  workers=workers, keep_runs=runs, trace_name=name,
                  on_done=lambda i, r: prog.advance(task))
    _store(db, runs)
    if as_json:
        emit_json(tn.as_dict())
        return
    c = Console()
    c.print(tuning_table(tn))
    c.print(f"[bold]recommendation:[/bold] {tn.explanation}")
    if tn.flags:
        c.print("[bold]vLLM flags:[/bold] " + " ".join(tn.flags))
