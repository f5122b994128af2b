"""`kvcap tune` (max-num-seqs sweep against SLOs and a preemption budget)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from capacity.cli.common import CliError, emit_json, engine_flags, guarded, store_runs, trace_input

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
    preemption_budget: str = typer.Option(
        "peak-only", "--preemption-budget",
        help="peak-only (preemption confined to load peaks), any, or a max share of minutes (0.1)."),
    max_preemptions_per_minute: Optional[float] = typer.Option(None, "--max-preemptions-per-minute"),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Store every replay here (one writer)."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Sweep --max-num-seqs (and --max-num-batched-tokens) and recommend the value to deploy."""
    from capacity.analyses.tuning import Budget, tune
    grid = parse_grid(max_num_seqs_grid, "--max-num-seqs-grid")
    tokens = (parse_grid(max_num_batched_tokens_grid, "--max-num-batched-tokens-grid")
              if max_num_batched_tokens_grid else None)
    trace, name = trace_input(file, trace_format, rate_scale)
    budget = Budget.parse(preemption_budget, max_preemptions_per_minute)
    runs: list = []
    n = len(grid) * len(tokens or [None])
    with Progress(console=err, transient=True, disable=as_json) as prog:
        task = prog.add_task("tune: replaying candidates", total=n)
        tn = tune(trace, engine, max_num_seqs_grid=grid, max_num_batched_tokens_grid=tokens,
                  slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99, budget=budget,
                  workers=workers, keep_runs=runs, trace_name=name,
                  on_done=lambda i, r: prog.advance(task))
    store_runs(db, runs)
    if as_json:
        emit_json(tn.as_dict())
        return
    c = Console()
    c.print(tuning_table(tn))
    c.print(f"[bold]recommendation:[/bold] {tn.explanation}")
    if tn.flags:
        c.print("[bold]vLLM flags:[/bold] " + " ".join(tn.flags))


@guarded
@engine_flags
def headroom_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    slo_ttft_p99: float = typer.Option(..., "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(..., "--slo-tbt-p99", help="Seconds."),
    scales: str = typer.Option("1,1.25,1.5,2,2.5,3", "--scales", help="Rate-scale factors to try."),
    target_peak: Optional[float] = typer.Option(None, "--target-peak", help="Peak to plan for, x today's traffic."),
    workers: Optional[int] = typer.Option(None, "--workers"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db"),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """How much more traffic fits before preemption becomes structural (and replicas needed)."""
    from capacity.analyses.headroom import headroom
    try:
        factors = tuple(float(x) for x in scales.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--scales: expected numbers like 1,1.5,2, got {scales!r}") from None
    trace, _ = trace_input(file, trace_format, 1.0)
    runs: list = []
    with Progress(console=err, transient=True, disable=as_json) as prog:
        task = prog.add_task("headroom: replaying load levels", total=len(factors) + 1)
        h = headroom(trace, engine, slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99,
                     scales=factors, target_peak_scale=target_peak, workers=workers,
                     keep_runs=runs, on_done=lambda i, r: prog.advance(task))
    store_runs(db, runs)
    if as_json:
        emit_json(h.as_dict())
        return
    t = Table(title="surge headroom")
    for c in ("load", "requests", "preempt/min", "TTFT p99 s", "TBT p99 s", "preemption", "SLO", "ok"):
        t.add_column(c)
    for p in h.points:
        f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        t.add_row(p.label.removeprefix("headroom "), str(p.requests), f"{p.preemptions_per_min:.2f}",
                  f(p.ttft_p99_s), f(p.tbt_p99_s), p.verdict, "met" if p.meets_slo else "broken",
                  "yes" if p.ok else "no")
    Console().print(t)
    Console().print(f"[bold]headroom:[/bold] {h.explanation}")


@guarded
@engine_flags
def alerts_cmd(
    file: Path = typer.Argument(..., help="Trace of normal traffic."),
    out: Path = typer.Option(Path("kvcap-preemption-rules.yml"), "-o", "--out"),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="model_name label to match."),
    window_s: float = typer.Option(60.0, "--window-s"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Classify the preemption of normal traffic and write Prometheus alerting rules."""
    import os
    import tempfile

    from capacity.analyses.classify import alert_rule, classify
    from replay.run import replay
    trace, name = trace_input(file, trace_format, 1.0)
    with err.status("alerts: replaying normal traffic…"):
        res = replay(trace, engine, label="alerts normal traffic", trace_name=name)
    tables = res.tables()
    c = classify(tables, window_s=window_s)
    rule = alert_rule(tables, model_name=model_name)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(rule.yaml)
    os.replace(tmp, out)
    result = {"verdict": c.verdict, "evidence": c.evidence, "threshold": rule.threshold,
              "normal_max_5m": rule.normal_max_5m, "rules": str(out), "run_id": res.run_id}
    if as_json:
        emit_json(result)
        return
    Console().print(f"[bold]preemption:[/bold] {c.verdict} — {c.evidence}")
    Console().print(f"[bold]alert:[/bold] increase(vllm:num_preemptions_total[5m]) > "
                    f"{rule.threshold} for {rule.for_duration} (normal traffic peaks at "
                    f"{rule.normal_max_5m}); rules written to {out}")
