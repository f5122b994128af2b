"""The one set of planning defaults every command, the report and the notebooks read
(docs/planning.md). A command that changes one says so with its own flag; none keeps a copy.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDefaults:
    slo_ttft_p99_s: float = 5.0         # fleet P99 time to first token
    slo_tbt_p99_s: float = 0.2          # fleet P99 time between tokens
    preemption_budget: str = "peak-only"
    precision: float = 0.05             # of every load search: hi / lo <= 1 + precision
    router: str = "lor"                 # the fleet replays' router (least outstanding requests)
    max_replicas: int = 64              # the replica search's ceiling
    noise_seeds: int = 3                # jittered replays measuring each metric's spread
    noise_floor: float = 0.02           # no advice on a relative gain below this, whatever the spread


DEFAULTS = PlanDefaults()
