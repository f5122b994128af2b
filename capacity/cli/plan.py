"""`kvcap size-swap`, `kvcap compare-modes` and `kvcap report` (the main job)."""
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
from replay.results.dbfile import DEFAULT_DB

# The report folder's DuckDB keeps a run's per-step tables up to this many steps (about four hours
# of busy traffic, some 40 MB for the two runs); `--db FILE` keeps every table of every replay.
FOLDER_MAX_STEPS = 1_000_000

err = Console(stderr=True)


def sizing_table(s) -> Table:
    t = Table(title="swap-space sizing (per GPU)", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column()
    at = "-" if s.peak_at_s is None else f"{s.peak_at_s:,.1f} s"
    t.add_row("peak concurrently swapped", f"{s.peak_swapped_gib:.2f} GiB "
              f"({s.peak_swapped_requests} requests) at {at}")
    t.add_row("per-second peak p99 / p99.9", f"{s.per_second_p99_gib:.2f} / {s.per_second_p999_gib:.2f} GiB")
    if not s.needed:
        t.add_row("swap tier", "not needed: no request is ever swapped out at this load")
        return t
    t.add_row("recommended --swap-space (V0)", f"{s.recommended_swap_space_gib:g} GiB")
    t.add_row("host RAM pinned", f"{s.host_ram_gib:g} GiB" + (f" ({s.host_ram_verdict})" if s.host_ram_verdict else ""))
    for v in ([s.verify] if s.verify else []) + list(s.what_if) + list(s.sweep):
        outcome = (f"aborted at {v.abort_s:,.1f} s" if v.status == "aborted"
                   else f"{v.swap_full_fallbacks} fallbacks to recompute" if v.swap_full_fallbacks
                   else "no swap-full events")
        if v.recomputed_tokens and v.status != "aborted":
            outcome += f", {v.recomputed_tokens:,} tokens recomputed"
        frac = "" if v.fraction_of_peak is None else f", {v.fraction_of_peak:.0%} of the peak"
        t.add_row(f"replay with {v.swap_space_gib:.2f} GiB{frac} ({v.on_swap_full})", outcome)
    return t


@guarded
@engine_flags
@trace_flags
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
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Also store every replay here."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """V0: measure peak concurrently swapped KV and recommend --swap-space (V1: size-offload)."""
    if from_logs:
        from capacity.cli.evidence import size_swap_from_logs_cli
        return size_swap_from_logs_cli(db, engine, context_tokens=context_tokens, headroom=headroom,
                                       as_json=as_json)
    if file is None:
        raise CliError("size-swap needs a trace FILE (or --from-logs --db PATH)")
    if engine.scheduler == "v1":
        raise CliError("size-swap: vLLM V1 (0.33, 0.34) has no swap space; its host tier is CPU KV "
                       "offloading: use `kvcap size-offload` (--kv-offloading-size), or "
                       "--scheduler v0 for --swap-space")
    from capacity.analyses.planner import Planner
    from capacity.analyses.sizing import size_swap
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    try:
        fractions = tuple(float(x) for x in sweep.split(",") if x.strip())
    except ValueError:
        raise CliError(f"--sweep: expected fractions of the peak like 0.25,0.5,1, got {sweep!r}") from None
    planner = Planner(trace_name=name, keep_tables=db is not None)
    with phase("size-swap: replaying (baseline, demand, verify, what-if)…", quiet=quiet):
        s = size_swap(trace, engine, headroom=headroom, what_if_fraction=what_if,
                      sweep_fractions=fractions, host_ram_gib=host_ram_gib, planner=planner)
    store_runs(db, planner.runs)
    if as_json:
        emit_json(s.as_dict())
        return
    Console().print(sizing_table(s))
    if s.host_ram_verdict in ("warn", "error"):
        err.print(f"[yellow]warning: {s.host_ram_gib:g} GiB of pinned host RAM is past vLLM's "
                  f"{'70% (vLLM refuses to start)' if s.host_ram_verdict == 'error' else '40% warning'} threshold")


@guarded
@engine_flags
@trace_flags
def compare_modes_cmd(
    file: Path = typer.Argument(..., help="Trace file."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    slo_ttft_p99: Optional[float] = typer.Option(None, "--slo-ttft-p99", help="Seconds (optional)."),
    slo_tbt_p99: Optional[float] = typer.Option(None, "--slo-tbt-p99", help="Seconds (optional)."),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Also store every replay here."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """The preemption choices on one trace: V0 swap / V1 CPU offloading vs. recompute (prefix
    caching on/off) vs. queue-only."""
    from capacity.analyses.modes import compare_modes
    from capacity.analyses.noise import measure_noise
    from capacity.analyses.planner import Planner
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(trace_name=name, keep_tables=db is not None)
    with phase("compare-modes: the noise (3 jittered replays), then 4 variants…", quiet=quiet):
        # The same significance rule as the plan: a mode replaces vLLM's default only when it
        # wins by more than the metric's spread across jittered replays of the trace.
        noise = measure_noise(trace, engine, planner)
        cmp = compare_modes(trace, engine, planner=planner, slo_ttft_p99_s=slo_ttft_p99,
                            slo_tbt_p99_s=slo_tbt_p99, noise=noise)
    store_runs(db, planner.runs)
    if as_json:
        emit_json({**cmp.as_dict(), "noise": noise.as_dict()})
        return
    Console(width=130).print(modes_table(cmp))
    Console().print(f"[bold]recommendation:[/bold] {cmp.recommended} — {cmp.reason}")
    if cmp.queue_only_note:
        Console().print(f"[bold]queue-only:[/bold] {cmp.queue_only_note}")


def modes_table(cmp) -> Table:
    v1 = cmp.scheduler == "v1"
    t = Table(title=f"preemption modes ({cmp.engine_words()})",
              caption="stall p99: the P99 stall of the preempted requests; *: recommended")
    for c in ("mode", "host tier", "preempt", "recomputed", "CPU hits" if v1 else "swapped",
              "TTFT p99", "TBT p99", "stall p99", "req/s", "SLO"):
        t.add_column(c, no_wrap=True)
    for r in cmp.results:
        moved = f"{r.cpu_hit_tokens:,} tok" if v1 else f"{r.swapped_gib:,.1f} GiB"
        t.add_row(r.variant + (" *" if r.variant == cmp.recommended else ""),
                  f"{r.host_tier_gib:g} GiB" if r.host_tier_gib else "-", f"{r.preemptions:,}",
                  f"{r.recomputed_share:.1%}", moved, _t(r.ttft_p99_s),
                  _t(r.tbt_p99_s), _t(r.max_tbt_p99_preempted_s), f"{r.throughput_rps:,.2f}",
                  "-" if r.meets_slo is None else "met" if r.meets_slo else "missed")
    return t


@guarded
@engine_flags
@trace_flags
def report_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file; none = the built-in default scenario."),
    out: Path = typer.Option(Path("report"), "-o", "--out", help="Output directory."),
    slo_ttft_p99: float = typer.Option(DEFAULTS.slo_ttft_p99_s, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(DEFAULTS.slo_tbt_p99_s, "--slo-tbt-p99", help="Seconds."),
    max_num_seqs_grid: Optional[str] = typer.Option(None, "--max-num-seqs-grid",
                                                    help="Default: 1/8, 1/4, 1/2, 1 x the engine's."),
    preemption_budget: str = typer.Option(DEFAULTS.preemption_budget, "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    precision: float = typer.Option(DEFAULTS.precision, "--precision",
                                    help="Of the load searches: relative width of the last bracket."),
    router: str = typer.Option(DEFAULTS.router, "--router", help="The replica search's router: lor | rr | prefix."),
    target_peak: float = typer.Option(1.0, "--target-peak", help="Plan replicas for this multiple of the trace's rate."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="model_name label for the alert rules."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (default: cores)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="DuckDB file for every replay of the plan "
                                      "(default: OUT/kvcap.duckdb with the baseline and the "
                                      "recommended runs only)."),
    no_db: bool = typer.Option(False, "--no-db", help="Write no DuckDB file."),
    evidence_db: Optional[Path] = typer.Option(None, "--evidence-db", help="DuckDB of `kvcap logs` with "
                                               "Prometheus series: adds replay vs. production."),
    prometheus_server: Optional[str] = typer.Option(None, "--prometheus-server",
                                                    help="--evidence-db: which server (when several)."),
    prometheus_engine: str = typer.Option("0", "--prometheus-engine", help="--evidence-db: engine label."),
    prometheus_offset_s: float = typer.Option(0.0, "--prometheus-offset-s",
                                              help="--evidence-db: replay t=0 this long after the first sample."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """The capacity plan as a report: verdict, binding constraint, flags, capacity, replicas,
    host tier, modes, tuning, alerts, stalls, priority (and replay vs. Prometheus with
    --evidence-db) -> OUT/index.html (+ PNGs, summary.json)."""
    import time

    from capacity.analyses.planner import Planner
    wall0 = time.perf_counter()
    # The report's modules (altair, vl-convert: about a second) load in a thread, which then
    # renders the baseline's own charts as soon as the baseline is replayed, while the planning
    # process mostly waits for its workers' replays.
    from capacity.report.ahead import ChartsAhead
    ahead = ChartsAhead()
    if evidence_db is not None and not evidence_db.is_file():
        raise CliError(f"--evidence-db: {evidence_db}: no such database (write it with `kvcap logs`)")
    if no_db and db is not None:
        raise CliError("--db and --no-db: give one of them")
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    with phase("report: baseline, noise, host tier, modes, tuning, capacity, replicas…",
               quiet=quiet):
        plan = plan_from_cli(trace, engine, planner, slo_ttft_p99=slo_ttft_p99,
                             slo_tbt_p99=slo_tbt_p99, preemption_budget=preemption_budget,
                             precision=precision, router=router, target_peak=target_peak,
                             max_num_seqs_grid=max_num_seqs_grid, model_name=model_name,
                             on_baseline=ahead.baseline)
    prio = prio_note = None
    if trace["priority"].n_unique() >= 2 and plan.recommendation.config is not None:
        # Only about this trace: its own priority classes, under the recommended flags.
        with phase("report: priority interference…", quiet=quiet):
            from capacity.analyses.priority import interference
            prio = interference(trace, plan.recommendation.config, planner=planner)
    production = None
    if evidence_db is not None:
        from capacity.evidence.promvalidate import compare_run
        try:
            production = compare_run(plan.baseline.tables(), evidence_db, server=prometheus_server,
                                     engine=prometheus_engine, offset_s=prometheus_offset_s)
        except ValueError as e:
            raise CliError(f"--evidence-db: {e}") from None
    from capacity.report.build import build_report
    with phase("report: charts…", quiet=quiet):
        out.mkdir(parents=True, exist_ok=True)
        index, result = build_report(plan, out=out, name=name, trace=trace, priority=prio,
                                     priority_note=prio_note, production=production,
                                     ahead=ahead.result())
    omitted: list[str] = []
    if no_db:
        db_path, stored = None, []
    elif db is not None:
        db_path, stored = db, planner.runs
    else:
        db_path = out / DEFAULT_DB
        stored = [r for r in (plan.baseline, plan.recommended_run) if r is not None]
        # A day of traffic is millions of steps per run: the folder keeps those runs' requests,
        # events and stalls, not their per-step tables (the charts are drawn already).
        omitted = sorted({r.run_id for r in stored if (r.run.get("num_steps") or 0)
                          > FOLDER_MAX_STEPS})
    if db_path is not None:
        store_runs(db_path, list({r.run_id: r for r in stored}.values()),
                   without_steps=set(omitted))
    result |= {"report": str(index), "db": None if db_path is None else str(db_path),
               # the replays made (what the phases count) and the distinct run ids among them
               # (a search's replay made in full again under the same config counts once)
               "replays": planner.replays_made, "runs": planner.num_distinct_runs,
               "runs_stored": len(stored),
               "steps_omitted": omitted,
               "wall_seconds": time.perf_counter() - wall0}
    if as_json:
        emit_json(result)
        return
    print_plan(plan, result)


def plan_from_cli(trace, engine, planner, *, slo_ttft_p99: float, slo_tbt_p99: float,
                  preemption_budget: str, precision: float, router: str, target_peak: float,
                  max_num_seqs_grid: str | None = None, model_name: str | None = None,
                  surge: bool = True, on_baseline=None):
    """The one planning procedure behind `report`, `plan` and `headroom` (same inputs, same
    Plan: the same capacity and replica count in every command)."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.plan import make_plan
    from capacity.cli.tune import parse_grid
    grid = parse_grid(max_num_seqs_grid, "--max-num-seqs-grid") if max_num_seqs_grid else None
    try:
        budget = Budget.parse(preemption_budget)
    except ValueError as e:
        raise CliError(f"--preemption-budget: {e}") from None
    from replay.fleet.run import ROUTERS
    if router not in ROUTERS:
        raise CliError(f"--router {router!r}: use one of {', '.join(ROUTERS)}")
    if not target_peak > 0:
        raise CliError(f"--target-peak {target_peak}: a multiple of the trace's rate > 0, e.g. 2")
    return make_plan(trace, engine, planner, slo_ttft_p99_s=slo_ttft_p99,
                     slo_tbt_p99_s=slo_tbt_p99, budget=budget, grid=grid, precision=precision,
                     model_name=model_name, router=router, target_peak_scale=target_peak,
                     surge=surge, on_baseline=on_baseline)


def print_plan(plan, result: dict) -> None:
    c = Console()
    rec = plan.recommendation
    c.print(f"[bold]report:[/bold] {result['report']}  ({result['replays']} replays, "
            f"{result['wall_seconds']:.0f} s)")
    if result["db"] is not None and result["runs_stored"] < result["runs"]:
        c.print(f"[bold]runs:[/bold] {result['db']} holds the baseline and recommended replays "
                f"({result['runs_stored']} of {result['runs']} runs); --db FILE keeps every one")
    if result.get("steps_omitted"):
        c.print(f"[bold]runs:[/bold] their per-step tables (steps, tbt) are left out of the "
                f"folder for runs over {FOLDER_MAX_STEPS:,} steps "
                f"({', '.join(result['steps_omitted'])}); --db FILE keeps them")
    c.print(f"[bold]{rec.headline}[/bold]")
    for line in rec.lines:
        c.print(f"  - {line}")
    if rec.flags:
        print_flags(c, rec.flags, drop=rec.drop_flags)
    else:
        c.print("[bold]vLLM flags:[/bold] none (overloaded: fix the capacity first)")
