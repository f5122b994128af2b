"""`kvcap size-swap`, `kvcap compare-modes` and `kvcap report` (the main job)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.cli.common import CliError, emit_json, engine_flags, guarded, store_runs, trace_input

err = Console(stderr=True)


def sizing_table(s) -> Table:
    t = Table(title="swap-space sizing (per GPU)", show_header=False)
    at = "-" if s.peak_at_s is None else f"{s.peak_at_s:,.1f} s"
    t.add_row("peak concurrently swapped", f"{s.peak_swapped_gib:.2f} GiB "
              f"({s.peak_swapped_requests} requests) at {at}")
    t.add_row("per-second peak p99 / p99.9", f"{s.per_second_p99_gib:.2f} / {s.per_second_p999_gib:.2f} GiB")
    t.add_row("recommended --swap-space (V0)", f"{s.recommended_swap_space_gib:g} GiB")
    t.add_row("recommended --kv-offloading-size (V1)", f"{s.recommended_kv_offloading_size_gib:g} GiB")
    t.add_row("host RAM pinned", f"{s.host_ram_gib:g} GiB" + (f" ({s.host_ram_verdict})" if s.host_ram_verdict else ""))
    for v in ([s.verify] if s.verify else []) + list(s.what_if) + list(s.sweep):
        outcome = (f"aborted at {v.abort_s:,.1f} s" if v.status == "aborted"
                   else f"{v.swap_full_fallbacks} fallbacks to recompute" if v.swap_full_fallbacks
                   else "no swap-full events")
        if v.recomputed_tokens and v.status != "aborted":
            outcome += f", {v.recomputed_tokens:,} tokens recomputed"
        t.add_row(f"replay with {v.swap_space_gib:.2f} GiB ({v.on_swap_full})", outcome)
    return t


@guarded
@engine_flags
def size_swap_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file (not with --from-logs)."),
    headroom: float = typer.Option(0.2, "--headroom", help="Fraction added to the measured peak."),
    from_logs: bool = typer.Option(False, "--from-logs", help="Size from the logged peak of swapped requests in --db."),
    context_tokens: Optional[int] = typer.Option(None, "--context-tokens", help="--from-logs: KV tokens per swapped request."),
    what_if: float = typer.Option(0.75, "--what-if", help="What-if size as a fraction of the peak."),
    sweep: str = typer.Option("", "--sweep", help="Host sizes to sweep, fractions of the peak: 0.25,0.5,1"),
    host_ram_gib: Optional[float] = typer.Option(None, "--host-ram-gib", help="Host RAM, for vLLM's 40%/70% checks."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Also store every replay here."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Measure peak concurrently swapped KV and recommend --swap-space / --kv-offloading-size."""
    if from_logs:
        from capacity.cli.evidence import size_swap_from_logs_cli
        return size_swap_from_logs_cli(db, engine, context_tokens=context_tokens, headroom=headroom,
                                       as_json=as_json)
    if file is None:
        raise CliError("size-swap needs a trace FILE (or --from-logs --db PATH)")
    from capacity.analyses.sizing import size_swap
    trace, _ = trace_input(file, trace_format, rate_scale)
    fractions = tuple(float(x) for x in sweep.split(",") if x.strip())
    runs: list = []
    with err.status("size-swap: replaying (demand, verify, what-if)…"):
        s = size_swap(trace, engine, headroom=headroom, what_if_fraction=what_if,
                      sweep_fractions=fractions, host_ram_gib=host_ram_gib, keep_runs=runs)
    store_runs(db, runs)
    if as_json:
        emit_json(s.as_dict())
        return
    Console().print(sizing_table(s))
    if s.host_ram_verdict in ("warn", "error"):
        err.print(f"[yellow]warning: {s.host_ram_gib:g} GiB of pinned host RAM is past vLLM's "
                  f"{'70% (vLLM refuses to start)' if s.host_ram_verdict == 'error' else '40% warning'} threshold")


@guarded
@engine_flags
def compare_modes_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Also store every replay here."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """Swap vs. recompute (prefix caching on/off) vs. queue-only on the same trace."""
    from capacity.analyses.modes import compare_modes
    trace, _ = trace_input(file, trace_format, rate_scale)
    runs: list = []
    with err.status("compare-modes: replaying 4 variants…"):
        cmp = compare_modes(trace, engine, keep_runs=runs)
    store_runs(db, runs)
    if as_json:
        emit_json(cmp.as_dict())
        return
    t = Table(title="preemption modes")
    cols = ["variant", "preemptions", "recomputed_share", "swapped_gib", "host_link_s",
            "ttft_p99_s", "tbt_p99_s", "max_tbt_p99_preempted_s", "high_priority_ttft_p99_s",
            "throughput_rps"]
    for c in cols:
        t.add_column(c)
    for r in cmp.results:
        d = r.__getattribute__
        t.add_row(*[("-" if d(c) is None else f"{d(c):.3f}" if isinstance(d(c), float) else str(d(c)))
                    for c in cols])
    Console().print(t)
    Console().print(f"[bold]recommendation:[/bold] {cmp.recommended} — {cmp.reason}")


def deploy_flags(engine, sizing, modes) -> list[str]:
    """The vLLM flags the report recommends."""
    flags = []
    if engine.scheduler == "v0":
        mode = modes.recommended if modes else "recompute"
        if mode == "swap" and sizing and sizing.recommended_swap_space_gib:
            flags += ["--preemption-mode swap", f"--swap-space {sizing.recommended_swap_space_gib:g}"]
    elif modes and modes.recommended == "swap" and sizing and sizing.recommended_kv_offloading_size_gib:
        flags += [f"--kv-offloading-size {sizing.recommended_kv_offloading_size_gib:g}",
                  "--kv-offloading-backend native"]
    from replay.config import resolve
    spec = resolve(engine).spec
    flags += [f"--max-num-seqs {spec.max_num_seqs}",
              f"--max-num-batched-tokens {spec.max_num_batched_tokens}"]
    return flags


def default_grid(max_num_seqs: int) -> list[int]:
    """Candidates around the engine's max_num_seqs: its 1/8, 1/4, 1/2 and itself."""
    return sorted({max(1, max_num_seqs // d) for d in (8, 4, 2, 1)})


@guarded
@engine_flags
def report_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file; none = the built-in default scenario."),
    out: Path = typer.Option(Path("report"), "-o", "--out", help="Output directory."),
    slo_ttft_p99: float = typer.Option(5.0, "--slo-ttft-p99", help="Seconds (tuning, headroom)."),
    slo_tbt_p99: float = typer.Option(0.2, "--slo-tbt-p99", help="Seconds (tuning, headroom)."),
    max_num_seqs_grid: Optional[str] = typer.Option(None, "--max-num-seqs-grid",
                                                    help="Default: 1/8, 1/4, 1/2, 1 x the engine's."),
    preemption_budget: str = typer.Option("peak-only", "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    scales: str = typer.Option("1,1.25,1.5", "--scales", help="Headroom rate scales."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Path = typer.Option(None, "--db", help="DuckDB file for the runs (default: OUT/kvcap.duckdb)."),
    as_json: bool = typer.Option(False, "--json"),
    engine=None,
) -> None:
    """The capacity report: baseline, swap sizing, modes, tuning, alerts, headroom, stalls,
    priority -> OUT/index.html (+ PNGs, summary.json)."""
    import time

    from capacity.report import sections as sec
    from capacity.analyses.classify import alert_rule, classify
    from capacity.cli.tune import parse_grid
    from capacity.analyses.modes import compare_modes
    from capacity.analyses.headroom import headroom
    from capacity.analyses.metrics import summary
    from capacity.analyses.priority import interference
    from capacity.report.render import write_report
    from capacity.analyses.stalls import attribute_stalls
    from capacity.analyses.sizing import demand_job, size_swap
    from capacity.analyses.sweep import Job, run_jobs
    from capacity.analyses.tuning import Budget, tune
    from replay.config import resolve
    from traces.stats import trace_info
    wall0 = time.perf_counter()
    trace, name = trace_input(file, trace_format, rate_scale)
    out.mkdir(parents=True, exist_ok=True)
    db = db or out / "kvcap.duckdb"
    grid = (parse_grid(max_num_seqs_grid, "--max-num-seqs-grid") if max_num_seqs_grid
            else default_grid(resolve(engine).spec.max_num_seqs))
    factors = tuple(float(x) for x in scales.split(",") if x.strip())
    runs: list = []
    memo: dict = {}      # one replay per distinct (trace, resolved engine), shared by all sections
    with err.status("report: baseline and swap-demand replays…"):
        base = run_jobs([Job(trace=trace, config=engine, label="report baseline", trace_name=name),
                         demand_job(trace, engine)], workers=workers, memo=memo)[0]
    runs.append(base)
    with err.status("report: swap sizing (verify, what-if)…"):
        sizing = size_swap(trace, engine, keep_runs=runs, workers=workers, memo=memo)
    with err.status("report: comparing preemption modes…"):
        modes = compare_modes(trace, engine, keep_runs=runs, workers=workers, memo=memo)
    with err.status(f"report: tuning max-num-seqs over {grid}…"):
        tn = tune(trace, engine, max_num_seqs_grid=grid, slo_ttft_p99_s=slo_ttft_p99,
                  slo_tbt_p99_s=slo_tbt_p99, budget=Budget.parse(preemption_budget),
                  workers=workers, keep_runs=runs, trace_name=name, memo=memo)
    with err.status("report: surge headroom…"):
        hr = headroom(trace, engine, slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99,
                      scales=factors, workers=workers, keep_runs=runs, memo=memo)
    base_tables = base.tables()
    verdict = classify(base_tables)
    rule = alert_rule(base_tables)
    stalls = attribute_stalls(base_tables)
    extra = [sec.tuning_section(tn), sec.budget_section(verdict, rule), sec.headroom_section(hr),
             sec.stalls_section(stalls)]
    prio_trace, prio_note = trace, None
    if trace["priority"].n_unique() < 2:
        from traces.synth import synthesize
        prio_trace = synthesize("priority-mix", duration_s=300.0)
        prio_note = ("the trace has one priority class, so this section replays the built-in "
                     "priority-mix scenario (5 min) on the same engine")
    with err.status("report: priority interference…"):
        prio = interference(prio_trace, engine, workers=workers, keep_runs=runs, memo=memo)
    psec = sec.priority_section(prio)
    if prio_note:
        from dataclasses import replace as _replace
        from capacity.report.render import text
        psec = _replace(psec, body=text(prio_note) + psec.body)
    extra.append(psec)
    store_runs(db, runs)
    flags = deploy_flags(engine, sizing, modes)
    if tn.recommended is not None:
        flags = [f for f in flags if not f.startswith(("--max-num-seqs", "--max-num-batched-tokens"))]
        flags += list(tn.flags)
    (out / "kvcap-preemption-rules.yml").write_text(rule.yaml)
    notes = [f"preemption in the baseline is {verdict.verdict}: {verdict.evidence}",
             f"alert rules: kvcap-preemption-rules.yml (structural above {rule.threshold} "
             f"preemptions per 5 minutes)", f"headroom: {hr.explanation}"]
    info = trace_info(trace)
    index = write_report(out, title=f"kvcap capacity report — {name}", trace_summary=info,
                         run=base, sizing=sizing, modes=modes, flags=flags, notes=notes,
                         extra_sections=extra)
    s = summary(base_tables)
    result = {"report": str(index), "db": str(db), "trace": name, "flags": flags,
              "recommended_mode": modes.recommended, "reason": modes.reason,
              "recommended_swap_space_gib": sizing.recommended_swap_space_gib,
              "recommended_kv_offloading_size_gib": sizing.recommended_kv_offloading_size_gib,
              "peak_swapped_gib": sizing.peak_swapped_gib,
              "recommended_max_num_seqs": tn.recommended.max_num_seqs if tn.recommended else None,
              "preemption_verdict": verdict.verdict, "alert_threshold_5m": rule.threshold,
              "headroom_scale": hr.max_ok_scale, "baseline": s,
              "runs": len({r.run_id for r in runs}),
              "wall_seconds": time.perf_counter() - wall0}
    if as_json:
        emit_json(result)
        return
    c = Console()
    c.print(f"[bold]report:[/bold] {index}  ({result['runs']} replays, "
            f"{result['wall_seconds']:.0f} s)")
    c.print(f"[bold]preemption mode:[/bold] {modes.recommended} — {modes.reason}")
    if sizing.peak_swapped_blocks:
        c.print(f"[bold]swap tier:[/bold] peak {sizing.peak_swapped_gib:.2f} GiB concurrently "
                f"swapped -> --swap-space {sizing.recommended_swap_space_gib:g} (V0) / "
                f"--kv-offloading-size {sizing.recommended_kv_offloading_size_gib:g} (V1)")
    else:
        c.print("[bold]swap tier:[/bold] nothing is ever swapped out at this load: no swap tier needed")
    c.print(f"[bold]max-num-seqs:[/bold] {tn.explanation}")
    c.print(f"[bold]preemption:[/bold] {verdict.verdict}; alert above {rule.threshold} per 5 min")
    c.print(f"[bold]headroom:[/bold] {hr.explanation}")
    c.print("[bold]vLLM flags:[/bold] vllm serve MODEL " + " ".join(flags))
