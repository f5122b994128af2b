"""`kvcap plan`: the fewest replicas that serve a trace within the SLOs and the preemption budget,
per candidate (GPU, model, tensor parallelism), searched by fleet replay; and the cheapest fleet.

For each candidate:
1. the linear estimate, what dividing the load gives: one replica's headroom h (the largest
   multiple of the trace's rate one replica passes at, capacity/analyses/headroom.py) and
   replicas = ceil(1 / h);
2. the searched minimum: fleet replays (capacity/analyses/fleet.py, the chosen router) starting
   at the linear estimate, going down while the fleet still passes, or up (doubling, then
   bisecting) until it passes. The answer n passed its own fleet replay and n - 1 failed its own
   (`one_fewer`, kept in the plan). Bisection assumes more replicas never hurt, as the rate
   search assumes a higher load never helps; every probe is kept (`probes`).
Cost: replicas x tensor_parallel_size GPUs x the $/GPU-hour of `prices.py` (overridable).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import polars as pl

from capacity.analyses.criteria import Budget
from capacity.analyses.fleet import FleetScore, run_fleet, score
from capacity.analyses.headroom import ok, search_loads
from capacity.analyses.planner import Planner
from replay.config import EngineConfig
from replay.fleet import FleetResult

MAX_REPLICAS = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidatePlan:
    gpu: str
    model: str
    tensor_parallel_size: int
    replicas: int | None               # searched minimum (None: none up to max_replicas / no fit)
    linear_estimate: int | None        # ceil(1 / one replica's headroom)
    headroom_rate_scale: float | None
    price_per_gpu_hour: float | None
    cost_per_hour: float | None
    fleet: FleetScore | None           # the replay of the answer
    one_fewer: FleetScore | None       # the replay of replicas - 1 (fails)
    probes: tuple[tuple[int, bool, str], ...]
    explanation: str

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
                "gpus": None if self.replicas is None else self.replicas * self.tensor_parallel_size,
                "price_per_gpu_hour": self.price_per_gpu_hour, "cost_per_hour": self.cost_per_hour,
                "ttft_p99_s": self.fleet.candidate.ttft_p99_s if self.fleet else None,
                "tbt_p99_s": self.fleet.candidate.tbt_p99_s if self.fleet else None,
                "fleet": brief(self.fleet), "one_fewer": brief(self.one_fewer),
                "probes": [{"replicas": n, "ok": o, "breaks": b} for n, o, b in self.probes],
                "explanation": self.explanation}


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetPlan:
    router: str
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    plans: tuple[CandidatePlan, ...]

    @property
    def cheapest(self) -> CandidatePlan | None:
        priced = [p for p in self.plans if p.cost_per_hour is not None]
        return min(priced, key=lambda p: (p.cost_per_hour, p.replicas)) if priced else None

    def as_dict(self) -> dict:
        c = self.cheapest
        return {"router": self.router, "slo_ttft_p99_s": self.slo_ttft_p99_s,
                "slo_tbt_p99_s": self.slo_tbt_p99_s,
                "plans": [p.as_dict() for p in self.plans],
                "cheapest": None if c is None else c.as_dict()}

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([{k: v for k, v in p.as_dict().items()
                              if k not in ("fleet", "one_fewer", "probes")} for p in self.plans])


def _min_replicas(trace, config, planner, *, start: int, router: str, judge, max_replicas: int,
                  on_fleet=None):
    """(n, its score, n - 1's score, probes): the fewest replicas whose fleet replay passes."""
    scores: dict[int, FleetScore] = {}

    def passes(n: int) -> bool:
        if n not in scores:
            fleet = run_fleet(trace, config, replicas=n, router=router, planner=planner)
            if on_fleet is not None:
                on_fleet(fleet)
            scores[n] = judge(fleet)
        return scores[n].ok

    n = max(1, min(start, max_replicas))
    if passes(n):
        hi, lo, step = n, 0, 1                   # 0 replicas serve nothing: lo always fails
        while hi - step >= 1:                    # gallop down: n - 1, n - 2, n - 4, ...
            if not passes(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    else:
        lo = n                                   # fails
        hi = None
        step = max(1, n)
        while hi is None:
            cand = min(lo + step, max_replicas)
            if passes(cand):
                hi = cand
            elif cand == max_replicas:
                break
            else:
                lo, step = cand, step * 2
        while hi is not None and hi - lo > 1:    # lo fails, hi passes
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    probes = tuple((k, s.ok, s.candidate.breaks) for k, s in sorted(scores.items()))
    if hi is None:
        return None, None, scores.get(max_replicas), probes
    return hi, scores[hi], scores.get(hi - 1), probes


def plan_fleet(trace: pl.DataFrame, candidates: list[tuple[str, str, int, EngineConfig | str]],
               planner: Planner, *, router: str = "lor", slo_ttft_p99_s: float,
               slo_tbt_p99_s: float, budget: Budget = Budget(), prices: dict[str, float],
               max_replicas: int = MAX_REPLICAS, precision: float = 0.05,
               on_fleet: Callable[[FleetResult], None] | None = None) -> FleetPlan:
    """`candidates`: (gpu, model, tp, config or the reason it cannot be built); `on_fleet` sees
    every fleet replayed (the caller stores them)."""
    def judge(fleet):
        return score(fleet, slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s,
                     budget=budget)
    built = {i: c[3] for i, c in enumerate(candidates) if isinstance(c[3], EngineConfig)}
    # One replica's headroom for every candidate, the searches in lock-step (parallel replays).
    found = search_loads(trace, built, planner, passes=ok, slo_ttft_p99_s=slo_ttft_p99_s,
                         slo_tbt_p99_s=slo_tbt_p99_s, budget=budget, precision=precision,
                         label="plan one replica") if built else {}
    plans = []
    for i, (gpu, model, tp, cfg) in enumerate(candidates):
        price = prices.get(gpu)
        if not isinstance(cfg, EngineConfig):
            plans.append(CandidatePlan(
                gpu=gpu, model=model, tensor_parallel_size=tp, replicas=None, linear_estimate=None,
                headroom_rate_scale=None, price_per_gpu_hour=price, cost_per_hour=None, fleet=None,
                one_fewer=None, probes=(), explanation=f"cannot run: {cfg}"))
            continue
        h = found[i][0].scale
        linear = None if h is None else max(1, math.ceil(1 / h - 1e-9))
        start = linear or max(2, round(1 / (found[i][0].failed_at or 1)))
        n, best, below, probes = _min_replicas(trace, cfg, planner, start=start, router=router,
                                               judge=judge, max_replicas=max_replicas,
                                               on_fleet=on_fleet)
        cost = None if n is None or price is None else n * tp * price
        if n is None:
            why = f"no fleet of up to {max_replicas} replicas meets the SLOs and the budget"
        else:
            why = (f"{n} replica{'s' if n > 1 else ''} ({router}) meet the SLOs and the budget"
                   + (f"; {n - 1} miss: {below.candidate.breaks}" if below else "")
                   + (f"; the linear estimate says {linear}" if linear is not None
                      else "; one replica passes at no fraction of the load (no linear estimate)"))
            if price is None:
                why += f"; no price for {gpu} (give --gpu-price {gpu}=USD)"
        plans.append(CandidatePlan(
            gpu=gpu, model=model, tensor_parallel_size=tp, replicas=n, linear_estimate=linear,
            headroom_rate_scale=h, price_per_gpu_hour=price, cost_per_hour=cost, fleet=best,
            one_fewer=below, probes=probes, explanation=why))
    return FleetPlan(router=router, slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s,
                     plans=tuple(plans))
