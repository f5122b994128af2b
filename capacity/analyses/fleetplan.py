"""`kvcap plan`: the fewest replicas that serve a trace within the SLOs and the preemption budget,
per candidate (GPU, model, tensor parallelism), searched by fleet replay; and the cheapest fleet.

For each candidate: the whole capacity plan (capacity/analyses/plan.py) of that deployment: its
recommended flags, their capacity, and the replicas by fleet replay from the linear estimate
ceil(target / capacity) (capacity/analyses/replicas.py: N passes its own fleet replay, N - 1
fails its own). The same procedure as `kvcap report` and `kvcap headroom`, so the same count.
Cost: replicas x tensor_parallel_size GPUs x the $/GPU-hour of `prices.py` (overridable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import polars as pl

from capacity.analyses.criteria import Budget
from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.fleet import FleetScore
from capacity.analyses.planner import Planner
from replay.config import EngineConfig
from replay.fleet.run import FleetResult


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidatePlan:
    gpu: str
    model: str
    tensor_parallel_size: int
    replicas: int | None               # searched minimum (None: none up to max_replicas / no fit)
    linear_estimate: int | None        # ceil(1 / one replica's headroom)
    headroom_rate_scale: float | None  # the recommended flags' capacity, × the trace's rate
    capacity_rps: float | None         # per replica, SLOs and budget met
    verdict: str | None                # the candidate's plan: overloaded | misses | fits
    flags: tuple[str, ...]             # its recommended `vllm serve` flags
    price_per_gpu_hour: float | None
    cost_per_hour: float | None
    fleet: FleetScore | None           # the replay of the answer
    one_fewer: FleetScore | None       # the replay of replicas - 1 (fails)
    probes: tuple[tuple[int, bool, str], ...]
    explanation: str
    plan: object = None                # the candidate's Plan (capacity.analyses.plan)
    # Requests vLLM refuses on this candidate (a prompt too long for its model's context, KV
    # larger than its pool): a fleet that refuses them is not the same service.
    rejected: int = 0
    # What priced its steps (capacity/analyses/versions.py): candidates compared on unlike
    # sources ("roofline" beside "measured") are a closer call than their numbers say.
    step_times: str | None = None

    def as_dict(self) -> dict:
        def brief(s: FleetScore | None) -> dict | None:
            if s is None:
                return None
            return {"replicas": s.replicas, "fleet_id": s.fleet_id, "ok": s.ok,
                    "ttft_p99_s": s.candidate.ttft_p99_s, "tbt_p99_s": s.candidate.tbt_p99_s,
                    "breaks": s.candidate.breaks}
        return {"gpu": self.gpu, "model": self.model,
                "tensor_parallel_size": self.tensor_parallel_size, "replicas": self.replicas,
                "linear_estimate": self.linear_estimate,
                "headroom_rate_scale": self.headroom_rate_scale,
                "capacity_rps": self.capacity_rps, "verdict": self.verdict,
                "flags": list(self.flags),
                "gpus": None if self.replicas is None else self.replicas * self.tensor_parallel_size,
                "price_per_gpu_hour": self.price_per_gpu_hour, "cost_per_hour": self.cost_per_hour,
                "ttft_p99_s": self.fleet.candidate.ttft_p99_s if self.fleet else None,
                "tbt_p99_s": self.fleet.candidate.tbt_p99_s if self.fleet else None,
                "fleet": brief(self.fleet), "one_fewer": brief(self.one_fewer),
                "probes": [{"replicas": n, "ok": o, "breaks": b} for n, o, b in self.probes],
                "explanation": self.explanation, "rejected": self.rejected,
                "step_times": self.step_times}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    router: str
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    plans: tuple[CandidatePlan, ...]

    @property
    def cheapest(self) -> CandidatePlan | None:
        """The cheapest of the priced fleets that reject the fewest requests: a fleet that
        refuses requests another one serves is no cheaper way to the same service."""
        priced = [p for p in self.plans if p.cost_per_hour is not None]
        if not priced:
            return None
        least = min(p.rejected for p in priced)
        return min((p for p in priced if p.rejected == least),
                   key=lambda p: (p.cost_per_hour, p.replicas))

    @property
    def cheaper_but_rejecting(self) -> tuple[CandidatePlan, ...]:
        """Priced fleets cheaper than `cheapest` that were passed over for their rejections."""
        best = self.cheapest
        return () if best is None else tuple(
            p for p in self.plans if p.cost_per_hour is not None
            and p.cost_per_hour < best.cost_per_hour and p.rejected > best.rejected)

    def as_dict(self) -> dict:
        c = self.cheapest
        return {"router": self.router, "slo_ttft_p99_s": self.slo_ttft_p99_s,
                "slo_tbt_p99_s": self.slo_tbt_p99_s,
                "plans": [p.as_dict() for p in self.plans],
                "cheapest": None if c is None else c.as_dict()}

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([{k: v for k, v in p.as_dict().items()
                              if k not in ("fleet", "one_fewer", "probes", "flags")}
                             for p in self.plans])


def plan_fleet(trace: pl.DataFrame, candidates: list[tuple[str, str, int, EngineConfig | str]],
               planner: Planner, *, router: str = DEFAULTS.router,
               slo_ttft_p99_s: float = DEFAULTS.slo_ttft_p99_s,
               slo_tbt_p99_s: float = DEFAULTS.slo_tbt_p99_s, budget: Budget = Budget(),
               prices: dict[str, float], max_replicas: int = DEFAULTS.max_replicas,
               precision: float = DEFAULTS.precision, target_peak_scale: float = 1.0,
               on_fleet: Callable[[FleetResult], None] | None = None,
               grid: list[int] | None = None) -> FleetPlan:
    """`candidates`: (gpu, model, tp, config or the reason it cannot be built). Each buildable
    candidate gets the whole capacity plan (capacity/analyses/plan.py): the replicas of its
    recommended flags, by fleet replay — the same number `kvcap report` gives for it."""
    from capacity.analyses.plan import make_plan
    plans = []
    for gpu, model, tp, cfg in candidates:
        price = prices.get(gpu)
        if not isinstance(cfg, EngineConfig):
            plans.append(CandidatePlan(
                gpu=gpu, model=model, tensor_parallel_size=tp, replicas=None, linear_estimate=None,
                headroom_rate_scale=None, capacity_rps=None, verdict=None, flags=(),
                price_per_gpu_hour=price, cost_per_hour=None, fleet=None, one_fewer=None,
                probes=(), explanation=f"cannot run: {cfg}"))
            continue
        plan = make_plan(trace, cfg, planner, slo_ttft_p99_s=slo_ttft_p99_s,
                         slo_tbt_p99_s=slo_tbt_p99_s, budget=budget, precision=precision,
                         router=router, max_replicas=max_replicas,
                         target_peak_scale=target_peak_scale, on_fleet=on_fleet, grid=grid)
        reps = plan.replicas
        n = reps.count
        cost = None if n is None or price is None else n * tp * price
        why = reps.explanation + ("" if n is None or price is not None
                                  else f"; no price for {gpu} (give --gpu-price {gpu}=USD)")
        rej = plan.rejections
        if rej is not None:
            why += f"; {rej.short()}"
        plans.append(CandidatePlan(
            gpu=gpu, model=model, tensor_parallel_size=tp, replicas=n,
            linear_estimate=reps.linear_estimate,
            headroom_rate_scale=plan.recommendation.headroom_rate_scale,
            capacity_rps=plan.capacity_rps, verdict=plan.verdict,
            flags=plan.recommendation.flags, price_per_gpu_hour=price, cost_per_hour=cost,
            fleet=reps.meets, one_fewer=reps.one_fewer, probes=reps.probes, explanation=why,
            plan=plan, rejected=rej.num_rejected if rej else 0, step_times=plan.step_times))
    return FleetPlan(router=router, slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s,
                     plans=tuple(plans))
