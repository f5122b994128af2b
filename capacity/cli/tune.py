"""`kvcap tune` (max-num-seqs sweep against SLOs and a preemption budget)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.views.progress import phase
from capacity.cli.common import (HASH_BLOCK_TOKENS_OPTION, CliError, emit_json, engine_flags,
                                 guarded, print_flags, store_runs, trace_input, trace_flags)
from capacity.cli.common import seconds_text as _t
from capacity.analyses.defaults import DEFAULTS

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
    for c in ("max-num-seqs", "batched tok", "margin", "goodput", "in SLO", "TTFT p99",
              "TBT p99", "preempt/min"):
        t.add_column(c, no_wrap=True)
    # The verdict wraps: its words, not the numbers beside them, give way to a narrow terminal.
    t.add_column("verdict", ratio=1, overflow="fold")
    rec = tn.recommended
    for c, m in sorted(zip(tn.candidates, tn.margins),
                       key=lambda cm: (cm[0].max_num_batched_tokens, cm[0].max_num_seqs)):
        verdict = ("[bold green]recommended" if c is rec else "ok" if c.feasible else c.breaks)
        t.add_row(f"{c.max_num_seqs:,}", f"{c.max_num_batched_tokens:,}",
                  "-" if m is None or m.scale is None else f"×{m.scale:.2f}",
                  f"{c.goodput_rps:,.2f}", f"{c.slo_share:.0%}", _t(c.ttft_p99_s), _t(c.tbt_p99_s),
                  f"{c.preemptions_per_min:,.2f}", verdict)
    return t


@guarded
@engine_flags
@trace_flags
def tune_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    max_num_seqs_grid: Optional[str] = typer.Option(None, "--max-num-seqs-grid",
                                                    help="e.g. 64,128,256,512 (default: 1/8, 1/4, "
                                                         "1/2, 1 x the engine's, as the report)."),
    max_num_batched_tokens_grid: Optional[str] = typer.Option(None, "--max-num-batched-tokens-grid"),
    slo_ttft_p99: float = typer.Option(DEFAULTS.slo_ttft_p99_s, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(DEFAULTS.slo_tbt_p99_s, "--slo-tbt-p99", help="Seconds."),
    preemption_budget: str = typer.Option(
        DEFAULTS.preemption_budget, "--preemption-budget",
        help="peak-only (preemption confined to load peaks), any, or a max share of minutes (0.1)."),
    max_preemptions_per_minute: Optional[float] = typer.Option(None, "--max-preemptions-per-minute"),
    precision: float = typer.Option(DEFAULTS.precision, "--precision", help="Of the margin search (relative)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Store every replay here (one writer)."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """Sweep --max-num-seqs (and --max-num-batched-tokens); recommend the value with the largest
    margin (the highest load at which it still meets the SLOs and the budget)."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.planner import Planner
    from capacity.analyses.tuning import tune
    from capacity.analyses.plan import default_grid
    from replay.config import resolve
    grid = (parse_grid(max_num_seqs_grid, "--max-num-seqs-grid") if max_num_seqs_grid
            else default_grid(resolve(engine).spec.max_num_seqs))
    tokens = (parse_grid(max_num_batched_tokens_grid, "--max-num-batched-tokens-grid")
              if max_num_batched_tokens_grid else None)
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    budget = Budget.parse(preemption_budget, max_preemptions_per_minute)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    with phase("tune: candidates, then their margins…", quiet=quiet):
        tn = tune(trace, engine, max_num_seqs_grid=grid, max_num_batched_tokens_grid=tokens,
                  slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99, budget=budget,
                  planner=planner, precision=precision)
    store_runs(db, planner.runs)
    if as_json:
        emit_json(tn.as_dict())
        return
    c = Console(width=120)             # nine columns: the verdict keeps room to be read
    c.print(tuning_table(tn))
    c.print(f"[bold]recommendation:[/bold] {tn.explanation}")
    if tn.flags:
        print_flags(c, tn.flags)


@guarded
@engine_flags
@trace_flags
def headroom_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    slo_ttft_p99: float = typer.Option(DEFAULTS.slo_ttft_p99_s, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(DEFAULTS.slo_tbt_p99_s, "--slo-tbt-p99", help="Seconds."),
    preemption_budget: str = typer.Option(DEFAULTS.preemption_budget, "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    precision: float = typer.Option(DEFAULTS.precision, "--precision", help="Of the load search (relative)."),
    surge: bool = typer.Option(True, "--surge/--no-surge", help="Also search a flash-crowd overlay."),
    target_peak: float = typer.Option(1.0, "--target-peak", help="Peak to plan replicas for, x today's traffic."),
    router: str = typer.Option(DEFAULTS.router, "--router", help="The replica search's router: lor | rr | prefix."),
    max_num_seqs_grid: Optional[str] = typer.Option(None, "--max-num-seqs-grid",
                                                    help="The plan's tuning grid (default: 1/8, 1/4, 1/2, 1 x the engine's)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    workers: Optional[int] = typer.Option(None, "--workers"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db"),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """Capacity: the largest multiple of today's traffic the plan's recommended flags serve within
    the SLOs and the preemption budget (searched), and the replicas a target peak needs (fleet
    replay) — the same plan, so the same numbers, as `kvcap report` and `kvcap plan`."""
    from capacity.analyses.planner import Planner
    from capacity.cli.plan import plan_from_cli
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    with phase("headroom: the capacity plan (recommended flags, capacity, replicas)…",
               quiet=quiet):
        plan = plan_from_cli(trace, engine, planner, slo_ttft_p99=slo_ttft_p99,
                             slo_tbt_p99=slo_tbt_p99, preemption_budget=preemption_budget,
                             precision=precision, router=router, target_peak=target_peak,
                             surge=surge, max_num_seqs_grid=max_num_seqs_grid)
    store_runs(db, planner.runs)
    h = plan.headroom
    if as_json:
        emit_json({**plan.contract(), **h.as_dict(),
                   "headroom_rate_scale": plan.recommendation.headroom_rate_scale,
                   "replicas_needed": plan.replicas.count if plan.replicas else None,
                   "recommendation": plan.recommendation.as_dict()})
        return
    t = Table(title="capacity search (the searched loads, recommended flags)")
    for c in ("load", "offered req/s", "served req/s", "TTFT p99", "TBT p99", "preempt",
              "preemption"):
        t.add_column(c, no_wrap=True)
    t.add_column("ok", ratio=1, overflow="fold")       # wraps: the numbers stay whole
    for p in h.points:
        t.add_row(f"{'flash crowd ' if p.surge else ''}×{p.rate_scale:g}", f"{p.offered_rps:,.2f}",
                  f"{p.served_rps:,.2f}", _t(p.ttft_p99_s), _t(p.tbt_p99_s), f"{p.preemptions:,}",
                  p.verdict, "yes" if p.ok else p.breaks)
    Console(width=100).print(t)
    c = Console()
    c.print(f"[bold]{plan.recommendation.headline}[/bold]")
    if plan.recommendation.flags:
        print_flags(c, plan.recommendation.flags, drop=plan.recommendation.drop_flags)


@guarded
@engine_flags
@trace_flags
def alerts_cmd(
    file: Path = typer.Argument(..., help="Trace of normal traffic."),
    out: Path = typer.Option(Path("kvcap-preemption-rules.yml"), "-o", "--out"),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="model_name label to match."),
    window_s: float = typer.Option(60.0, "--window-s"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """Classify the preemption of normal traffic and write Prometheus alerting rules."""
    from capacity.analyses.classify import alert_rule, classify
    from replay.run import replay
    from traces import atomic
    trace, name = trace_input(file, trace_format, 1.0, hash_block_tokens=hash_block_tokens)
    with phase("alerts: replaying normal traffic…", quiet=quiet):
        res = replay(trace, engine, label="alerts normal traffic", trace_name=name)
    tables = res.tables()
    from capacity.analyses.stability import stability
    st = stability(tables)
    if not st.sustainable:
        raise CliError(f"alerts: the replay of this trace is overloaded ({st.evidence}); an alert "
                       f"rule derived from it would fire all the time — no rule written")
    c = classify(tables, window_s=window_s)
    if c.verdict == "structural":
        raise CliError(f"alerts: preemption in this replay is structural ({c.evidence}); a rule "
                       f"that separates peaks from structural preemption needs traffic that "
                       f"fits — run `kvcap report` for what binds; no rule written")
    rule = alert_rule(tables, model_name=model_name)
    # whole or not at all, umask permissions, no temp file left on a full disk (traces.atomic)
    atomic.write_text(out, rule.yaml)
    result = {"verdict": c.verdict, "evidence": c.evidence, "threshold": rule.threshold,
              "normal_max_5m": rule.normal_max_5m, "rules": str(out), "run_id": res.run_id}
    if as_json:
        emit_json(result)
        return
    Console().print(f"[bold]preemption:[/bold] {c.verdict} — {c.evidence}")
    Console().print(f"[bold]alert:[/bold] increase(vllm:num_preemptions_total[5m]) > "
                    f"{rule.threshold} for {rule.for_duration} (normal traffic peaks at "
                    f"{rule.normal_max_5m}); rules written to {out}")
