"""Fleet answers: a fleet replay through the planner (its memo and worker pool) and its metrics.

A fleet is scored exactly as one engine is (capacity/analyses/criteria.py `evaluate`): fleet
P99 TTFT over every request, fleet P99 TBT over every token gap, the preemption budget over the
fleet's events, stability over its requests (replay/fleet/run.py `FleetResult.tables`). Per replica:
the same summary over that replica's own tables.
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass

import polars as pl

from capacity.analyses.criteria import Budget, Candidate, evaluate
from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.metrics import summary
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
from replay.config import EngineConfig
from replay.fleet.run import FleetResult, replay_fleet

DEFAULT_SLO_TTFT_S = DEFAULTS.slo_ttft_p99_s     # the one set of defaults
DEFAULT_SLO_TBT_S = DEFAULTS.slo_tbt_p99_s


def run_fleet(trace: pl.DataFrame, config: EngineConfig, *, replicas: int, router: str,
              planner: Planner) -> FleetResult:
    """`replay_fleet` with rr / prefix replicas replayed in the planner's pool (and memo)."""
    def runner(subs, cfg):
        return planner.run([Job(trace=s, config=cfg, label=f"fleet {router} replica {k}",
                                trace_name=planner.trace_name) for k, s in enumerate(subs)])
    return replay_fleet(trace, config, replicas=replicas, router=router,
                        trace_name=planner.trace_name, runner=runner,
                        spill_dir=tempfile.gettempdir() if planner.spill else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetScore:
    fleet_id: str
    router: str
    replicas: int
    candidate: Candidate              # the fleet scored as one engine
    per_replica: tuple[dict, ...]
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float

    @property
    def ok(self) -> bool:
        """SLOs met, preemption within budget, keeps up, no engine aborted."""
        return self.candidate.feasible

    def as_dict(self) -> dict:
        c = self.candidate
        return {"fleet_id": self.fleet_id, "router": self.router, "replicas": self.replicas,
                "ttft_p99_s": c.ttft_p99_s, "tbt_p99_s": c.tbt_p99_s, "meets_slo": c.meets_slo,
                "ok": self.ok, "breaks": c.breaks, "slo_ttft_p99_s": self.slo_ttft_p99_s,
                "slo_tbt_p99_s": self.slo_tbt_p99_s, "throughput_rps": c.throughput_rps,
                "goodput_rps": c.goodput_rps, "preemptions": c.preemptions,
                "preemption_verdict": c.preemption_verdict, "sustainable": c.sustainable,
                "within_budget": c.within_budget, "candidate": asdict(c),
                "per_replica": list(self.per_replica)}


_REPLICA_KEYS = ("run_id", "status", "requests", "requests_finished", "throughput_rps",
                 "ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "preemptions_recompute",
                 "preemptions_swap", "peak_gpu_kv_usage", "sim_seconds", "steps")


def score(fleet: FleetResult, *, slo_ttft_p99_s: float = DEFAULT_SLO_TTFT_S,
          slo_tbt_p99_s: float = DEFAULT_SLO_TBT_S, budget: Budget = Budget()) -> FleetScore:
    # Stacked, not copied: the replicas' steps are read a few columns at a time.
    c = evaluate(fleet.tables(stacked=True), slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s,
                 budget=budget)
    per = []
    for k, r in enumerate(fleet.replicas):
        s = summary(r.tables())
        per.append({"replica": k, **{key: s[key] for key in _REPLICA_KEYS}})
    return FleetScore(fleet_id=fleet.fleet_id, router=fleet.router, replicas=fleet.num_replicas,
                      candidate=c, per_replica=tuple(per), slo_ttft_p99_s=slo_ttft_p99_s,
                      slo_tbt_p99_s=slo_tbt_p99_s)


def replica_table(s: FleetScore) -> pl.DataFrame:
    """The per-replica metrics as a table (`replica` first)."""
    return pl.DataFrame(list(s.per_replica))
