"""`kvcap fleet`: replay a trace on N replicas behind a router (replay/fleet/run.py)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.analyses.defaults import DEFAULTS
from capacity.views.progress import phase
from capacity.cli.common import (HASH_BLOCK_TOKENS_OPTION, emit_json, engine_flags, guarded,
                                 seconds_text, trace_input, trace_flags)

err = Console(stderr=True)


def store_fleet(db: Optional[Path], fleet) -> None:
    """A fleet's replicas and its `fleets` rows, in one transaction."""
    if db is not None:
        from replay.results.store import write_runs
        write_runs(db, fleet.store_tables())


def replica_rich_table(s) -> Table:
    t = Table(title=f"fleet: {s.replicas} replicas, router {s.router}")
    for c in ("replica", "requests", "req/s", "TTFT p99", "TBT p99", "preempt", "peak KV"):
        t.add_column(c, justify="right")
    for p in s.per_replica:
        t.add_row(str(p["replica"]), f"{p['requests']:,}", f"{p['throughput_rps']:,.2f}",
                  seconds_text(p["ttft_p99_s"]), seconds_text(p["tbt_p99_s"]),
                  f"{p['preemptions_recompute'] + p['preemptions_swap']:,}",
                  f"{p['peak_gpu_kv_usage']:.0%}")
    c = s.candidate
    t.add_row("fleet", f"{sum(p['requests'] for p in s.per_replica):,}",
              f"{c.throughput_rps:,.2f}", seconds_text(c.ttft_p99_s), seconds_text(c.tbt_p99_s),
              f"{c.preemptions:,}", "")
    return t


@guarded
@engine_flags
@trace_flags
def fleet_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file (default: the built-in scenario)."),
    replicas: int = typer.Option(..., "--replicas", help="Identical engine replicas (>= 1)."),
    router: str = typer.Option(DEFAULTS.router, "--router",
                               help="lor (least outstanding requests) | rr (round robin) | prefix "
                                    "(consistent hashing on the first prefix hash / tenant)."),
    slo_ttft_p99: float = typer.Option(DEFAULTS.slo_ttft_p99_s, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(DEFAULTS.slo_tbt_p99_s, "--slo-tbt-p99", help="Seconds."),
    preemption_budget: str = typer.Option(DEFAULTS.preemption_budget, "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (rr, prefix)."),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Store each replica as a run + `fleets`."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    engine=None,
) -> None:
    """Replay the trace on --replicas identical engines behind a router that decides on arrival;
    fleet and per-replica TTFT/TBT, and whether the fleet meets the SLOs."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.fleet import run_fleet, score
    from capacity.analyses.planner import Planner
    if replicas < 1 or replicas > 4096:
        from capacity.cli.common import CliError
        raise CliError(f"--replicas {replicas}: must be a whole number from 1 to 4096")
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    with phase(f"fleet: replaying {replicas} replicas ({router})…", quiet=quiet):
        fleet = run_fleet(trace, engine, replicas=replicas, router=router, planner=planner)
    s = score(fleet, slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99,
              budget=Budget.parse(preemption_budget))
    store_fleet(db, fleet)
    note = None
    if router == "prefix":      # affinity that cannot spread the trace says so, in one line
        from replay.fleet.routing import balance_note
        note = balance_note(trace.sort("arrival_s", maintain_order=True), replicas, fleet.assignment)
        if note:
            import sys

            from traces.schema import printable
            print(printable(f"kvcap: warning: {note}"), file=sys.stderr)
    if as_json:
        emit_json({**s.as_dict(), "replica_requests": fleet.replica_requests(),
                   "replica_run_ids": [r.run_id for r in fleet.replicas], "router_note": note})
        return
    c = Console(width=100)
    c.print(replica_rich_table(s))
    verdict = ("meets the SLOs and the preemption budget" if s.ok else f"misses: {s.candidate.breaks}")
    c.print(f"[bold]fleet:[/bold] {replicas} × {engine.gpu} ({engine.model}), router {router}: "
            f"TTFT p99 {seconds_text(s.candidate.ttft_p99_s)}, TBT p99 "
            f"{seconds_text(s.candidate.tbt_p99_s)} — {verdict}")


# --------------------------------------------------------------------------- kvcap plan
_LISTED = {"gpu": (List[str], typer.Option(None, "--gpu", help="Candidate GPU (repeat: --gpu h100 --gpu a100-80gb); default h100.")),
           "model": (List[str], typer.Option(None, "--model", help="Candidate model (repeatable); default llama-3.1-8b.")),
           "tensor_parallel_size": (List[int], typer.Option(None, "--tensor-parallel-size", "-tp", help="Candidate TP (repeatable); default 1."))}


def candidate_flags(fn):
    """Like `engine_flags`, with --gpu, --model and -tp repeatable: the command gets
    `candidates`, one (gpu, model, tp, EngineConfig or why it cannot be built) per combination."""
    import functools
    import inspect

    from capacity.cli.common import ENGINE_FLAGS, engine_config
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "candidates"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=ann)
             for name, (ann, opt) in {**ENGINE_FLAGS, **_LISTED}.items()]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        flags = {k: kwargs.pop(k) for k in list(kwargs) if k in ENGINE_FLAGS}
        gpus = flags.pop("gpu") or ["h100"]
        models = flags.pop("model") or ["llama-3.1-8b"]
        tps = flags.pop("tensor_parallel_size") or [1]
        cands = []
        for g in dict.fromkeys(gpus):
            for m in dict.fromkeys(models):
                for tp in dict.fromkeys(tps):
                    try:
                        cfg = engine_config({**flags, "gpu": g, "model": m,
                                             "tensor_parallel_size": tp})
                    except (ValueError, TypeError) as e:
                        cfg = str(e).splitlines()[0]
                        if "unknown" in cfg:        # a misspelt name is an error, not a plan
                            raise
                    cands.append((g, m, tp, cfg))
        return fn(*args, candidates=cands, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + extra)
    return wrapper


# Beside a model in the table: no measured step-time profile of that GPU x model x TP, so the
# analytic roofline prices its steps (capacity/analyses/versions.py); said under the table.
ROOFLINE_MARK = " †"
ROOFLINE_NOTE = ("† no measured step-time profile of that GPU, model and TP: the analytic roofline "
                 "prices its steps, less accurately than the others' measured kernels "
                 "(docs/timing.md)")


def plan_rich_table(p) -> Table:
    t = Table(title=f"fleet plan (router {p.router}; SLO TTFT p99 ≤ {p.slo_ttft_p99_s:g} s, "
                    f"TBT p99 ≤ {p.slo_tbt_p99_s:g} s)")
    # Every column but the reasons keeps its words whole: a long reason (a candidate that cannot
    # run) wraps in its own column instead of squeezing the GPU, model and price out of view;
    # the lines under the table give each reason in full.
    for c in ("GPU", "model", "TP", "replicas (searched)", "linear estimate"):
        t.add_column(c, no_wrap=True)
    t.add_column("one fewer", ratio=1, overflow="fold")
    t.add_column("$/hour", no_wrap=True)
    cheapest = p.cheapest
    for c in p.plans:
        fewer = "-" if c.one_fewer is None else c.one_fewer.candidate.breaks or "passes"
        mark = " ←cheapest" if c is cheapest else ""
        why = c.explanation if c.plan is not None else "cannot run (below)"
        t.add_row(c.gpu, c.model + (ROOFLINE_MARK if c.step_times == "roofline" else ""),
                  str(c.tensor_parallel_size),
                  "-" if c.replicas is None else str(c.replicas),
                  "-" if c.linear_estimate is None else str(c.linear_estimate),
                  fewer if c.replicas else why,
                  "-" if c.cost_per_hour is None else f"{c.cost_per_hour:,.2f}{mark}")
    return t


@guarded
@candidate_flags
@trace_flags
def plan_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file (default: the built-in scenario)."),
    router: str = typer.Option(DEFAULTS.router, "--router", help="lor | rr | prefix (the fleets replayed)."),
    slo_ttft_p99: float = typer.Option(DEFAULTS.slo_ttft_p99_s, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(DEFAULTS.slo_tbt_p99_s, "--slo-tbt-p99", help="Seconds."),
    preemption_budget: str = typer.Option(DEFAULTS.preemption_budget, "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    precision: float = typer.Option(DEFAULTS.precision, "--precision", help="Of the load searches (relative)."),
    target_peak: float = typer.Option(1.0, "--target-peak", help="Plan for this multiple of the trace's rate."),
    max_num_seqs_grid: Optional[str] = typer.Option(None, "--max-num-seqs-grid",
                                                    help="The plan's tuning grid (default: 1/8, 1/4, 1/2, 1 x the engine's)."),
    gpu_price: List[str] = typer.Option(None, "--gpu-price", help="GPU=USD per GPU-hour (repeatable), over the defaults."),
    prices: Optional[Path] = typer.Option(None, "--prices", help="YAML/JSON mapping gpu: USD per GPU-hour."),
    max_replicas: int = typer.Option(DEFAULTS.max_replicas, "--max-replicas"),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    workers: Optional[int] = typer.Option(None, "--workers"),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    hash_block_tokens: Optional[int] = HASH_BLOCK_TOKENS_OPTION,
    db: Optional[Path] = typer.Option(None, "--db", help="Store every replay (fleets included)."),
    as_json: bool = typer.Option(False, "--json"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    candidates=None,
) -> None:
    """The fewest replicas per candidate GPU/model/TP that meet the SLOs and the preemption
    budget, found by fleet replay (one fewer fails its own), next to the linear estimate
    (ceil(1 / one replica's headroom)); and the cheapest fleet by $/GPU-hour."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.fleetplan import plan_fleet
    from capacity.analyses.planner import Planner
    from capacity.analyses.prices import price_table
    from capacity.cli.common import CliError, store_runs
    from replay.fleet.routing import ROUTERS
    if router not in ROUTERS:
        raise CliError(f"--router {router!r}: use one of {', '.join(ROUTERS)}")
    if not 1 <= max_replicas <= 4096:
        raise CliError(f"--max-replicas {max_replicas}: must be a whole number from 1 to 4096")
    table = price_table(gpu_price, prices)
    trace, name = trace_input(file, trace_format, rate_scale, hash_block_tokens=hash_block_tokens)
    planner = Planner(workers=workers, trace_name=name, keep_tables=db is not None)
    fleets: list = []
    from capacity.cli.tune import parse_grid
    grid = parse_grid(max_num_seqs_grid, "--max-num-seqs-grid") if max_num_seqs_grid else None
    if not target_peak > 0:
        raise CliError(f"--target-peak {target_peak}: a multiple of the trace's rate > 0, e.g. 2")
    try:
        budget = Budget.parse(preemption_budget)
    except ValueError as e:
        raise CliError(f"--preemption-budget: {e}") from None
    with phase(f"plan: {len(candidates)} candidate(s), the capacity plan of each, then fleet "
               "replays…", quiet=quiet):
        p = plan_fleet(trace, candidates, planner, router=router, slo_ttft_p99_s=slo_ttft_p99,
                       slo_tbt_p99_s=slo_tbt_p99, budget=budget, precision=precision,
                       prices=table, max_replicas=max_replicas, target_peak_scale=target_peak,
                       # fleets are kept (with their tables) only to be stored
                       on_fleet=fleets.append if db is not None else None, grid=grid)
    # The fleets' replicas are stored as fleet runs; the planner's copies of them are not.
    store_runs(db, [r for r in planner.runs if not r.run["label"].startswith("fleet ")])
    for f in fleets:
        store_fleet(db, f)
    if as_json:
        # The contract keys (same as `report --json` for the same inputs): the cheapest
        # candidate's, or the only one's.
        top = p.cheapest or next((c for c in p.plans if c.plan is not None), None)
        head = top.plan.contract() if top is not None and top.plan is not None else {
            "capacity_rps": None, "replicas": None, "verdict": None}
        emit_json({**head, **p.as_dict()})
        return
    c = Console(width=110)
    c.print(plan_rich_table(p))
    if any(cp.step_times == "roofline" for cp in p.plans):
        c.print(ROOFLINE_NOTE, soft_wrap=True, markup=False, highlight=False)
    for cp in p.plans:
        c.print(f"- {cp.gpu} {cp.model} TP{cp.tensor_parallel_size}: {cp.explanation}")
    best = p.cheapest
    if best is not None:
        c.print(f"[bold]cheapest:[/bold] {best.replicas} × {best.gpu} (TP{best.tensor_parallel_size},"
                f" {best.model}) at ${best.cost_per_hour:,.2f}/hour — fleet replay "
                f"{best.fleet.fleet_id}" + "".join(
                    f"; not {o.replicas} × {o.gpu} (TP{o.tensor_parallel_size}, {o.model}) at "
                    f"${o.cost_per_hour:,.2f}/hour: it rejects {o.rejected:,} requests"
                    for o in p.cheaper_but_rejecting))
        if best.step_times == "roofline" and any(o.step_times == "measured" for o in p.plans):
            c.print(f"{best.gpu} TP{best.tensor_parallel_size} ({best.model}) has no measured "
                    "step-time profile: its numbers are the analytic roofline's, the others' "
                    "measured kernels' (docs/timing.md); measure it on that GPU (`kvcap "
                    "calibrate`) before buying on a close call",
                    soft_wrap=True, markup=False, highlight=False)
