"""`kvcap fleet`: replay a trace on N replicas behind a router (replay/fleet.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.cli.common import (emit_json, engine_flags, guarded, seconds_text, trace_input)

err = Console(stderr=True)


def store_fleet(db: Optional[Path], fleet) -> None:
    """A fleet's replicas and its `fleets` rows, in one transaction."""
    if db is not None:
        from replay.store import write_runs
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
def fleet_cmd(
    file: Optional[Path] = typer.Argument(None, help="Trace file (default: the built-in scenario)."),
    replicas: int = typer.Option(..., "--replicas", help="Identical engine replicas (>= 1)."),
    router: str = typer.Option("lor", "--router",
                               help="lor (least outstanding requests) | rr (round robin) | prefix "
                                    "(consistent hashing on the first prefix hash / tenant)."),
    slo_ttft_p99: float = typer.Option(5.0, "--slo-ttft-p99", help="Seconds."),
    slo_tbt_p99: float = typer.Option(0.2, "--slo-tbt-p99", help="Seconds."),
    preemption_budget: str = typer.Option("peak-only", "--preemption-budget",
                                          help="peak-only, any, or a max share of minutes (0.1)."),
    rate_scale: float = typer.Option(1.0, "--rate-scale"),
    workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes (rr, prefix)."),
    trace_format: Optional[str] = typer.Option(None, "--format"),
    db: Optional[Path] = typer.Option(None, "--db", help="Store each replica as a run + `fleets`."),
    as_json: bool = typer.Option(False, "--json"),
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
    trace, name = trace_input(file, trace_format, rate_scale)
    planner = Planner(workers=workers, trace_name=name)
    with err.status(f"fleet: replaying {replicas} replicas ({router})…"):
        fleet = run_fleet(trace, engine, replicas=replicas, router=router, planner=planner)
    s = score(fleet, slo_ttft_p99_s=slo_ttft_p99, slo_tbt_p99_s=slo_tbt_p99,
              budget=Budget.parse(preemption_budget))
    store_fleet(db, fleet)
    if as_json:
        emit_json({**s.as_dict(), "replica_requests": fleet.replica_requests(),
                   "replica_run_ids": [r.run_id for r in fleet.replicas]})
        return
    c = Console(width=100)
    c.print(replica_rich_table(s))
    verdict = ("meets the SLOs and the preemption budget" if s.ok else f"misses: {s.candidate.breaks}")
    c.print(f"[bold]fleet:[/bold] {replicas} × {engine.gpu} ({engine.model}), router {router}: "
            f"TTFT p99 {seconds_text(s.candidate.ttft_p99_s)}, TBT p99 "
            f"{seconds_text(s.candidate.tbt_p99_s)} — {verdict}")
