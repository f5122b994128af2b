"""`--max-num-seqs` (and `--max-num-batched-tokens`) tuning against SLOs and a preemption budget.

Each grid point is one replay at today's traffic, scored by `criteria.evaluate` (fleet P99 TTFT
and TBT against the SLOs, the preemption budget, sustainable or not; goodput and the share of
requests within the SLOs shown beside). Among the feasible candidates the choice is by *margin*:
the largest multiple of the trace's rate at which the candidate still meets the SLOs and the
budget (the search of capacity/analyses/headroom.py, to its stated precision) — a value that is
2% better at today's load but breaks at 1.1x is the fragile pick. Ties in margin go to the higher
goodput, then the smaller value. The recommended value's margin is the report's headroom.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.criteria import Budget, Candidate, evaluate  # noqa: F401 (re-exported)
from capacity.analyses.headroom import ok, search_loads
from capacity.analyses.planner import Planner
from capacity.analyses.search import PRECISION, ScaleSearch
from capacity.analyses.sweep import Job
from capacity.units import seconds
from replay.config import EngineConfig, resolve

__all__ = ["Budget", "Candidate", "Tuning", "evaluate", "choose", "tune"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    candidates: tuple[Candidate, ...]
    margins: tuple[ScaleSearch | None, ...]      # per candidate; None: infeasible today
    recommended: Candidate | None
    recommended_config: EngineConfig | None
    explanation: str
    flags: tuple[str, ...]                       # vllm_flags(recommended_config)
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    budget: Budget
    precision: float

    @property
    def margin(self) -> ScaleSearch | None:
        """The recommended value's margin (its headroom)."""
        if self.recommended is None:
            return None
        return self.margins[self.candidates.index(self.recommended)]

    def _rows(self) -> list[dict]:
        return [dict(dataclasses.asdict(c), feasible=c.feasible,
                     margin_rate_scale=m.scale if m else None)
                for c, m in zip(self.candidates, self.margins)]

    def as_dict(self) -> dict:
        rec, m = self.recommended, self.margin
        return {"recommended_max_num_seqs": rec.max_num_seqs if rec else None,
                "recommended_max_num_batched_tokens": rec.max_num_batched_tokens if rec else None,
                "margin_rate_scale": m.scale if m else None, "precision": self.precision,
                "explanation": self.explanation, "flags": list(self.flags),
                "slo_ttft_p99_s": self.slo_ttft_p99_s, "slo_tbt_p99_s": self.slo_tbt_p99_s,
                "budget": dataclasses.asdict(self.budget), "candidates": self._rows()}

    def table(self) -> pl.DataFrame:
        return pl.DataFrame(self._rows())


def _key(c: Candidate, m: ScaleSearch | None) -> tuple:
    return ((m.scale or 0.0) if m else 0.0, c.goodput_rps, -c.max_num_seqs, -c.max_num_batched_tokens)


def choose(cands: list[Candidate], margins: list[ScaleSearch | None]) -> tuple[Candidate | None, str]:
    """The feasible candidate with the largest margin (docstring of the module)."""
    pairs = [(c, m) for c, m in zip(cands, margins)]
    feasible = [(c, m) for c, m in pairs if c.feasible]
    if not feasible:
        best = max(cands, key=lambda c: c.goodput_rps)
        return None, (f"no candidate meets the SLOs and the preemption budget at today's traffic; "
                      f"the highest goodput is max_num_seqs={best.max_num_seqs} ({best.breaks}); "
                      f"what binds, and its knob, is the plan's binding constraint")
    pick, pm = max(feasible, key=lambda cm: _key(*cm))
    words = [f"max_num_seqs={pick.max_num_seqs} meets the SLOs up to {pm.words()} today's "
             f"traffic (its margin), the largest margin of the feasible values (a tie goes to the "
             f"higher goodput, then the smaller value); at today's load: "
             f"TTFT p99 {seconds(pick.ttft_p99_s)}, TBT p99 {seconds(pick.tbt_p99_s)}, "
             f"{pick.slo_share:.0%} of requests within both SLOs (preemption: "
             f"{pick.preemption_verdict})"]
    others = [f"{c.max_num_seqs}: ×{m.scale:.2f}" for c, m in feasible if c is not pick and m]
    if others:
        words.append("the other feasible values' margins: " + ", ".join(others))
    infeasible = [f"{c.max_num_seqs} ({c.breaks})" for c, _ in pairs if not c.feasible]
    if infeasible:
        words.append("infeasible today: " + "; ".join(infeasible))
    return pick, "; ".join(words)


def _score_candidates(trace, configs, planner: Planner, *, slo_ttft_p99_s: float,
                      slo_tbt_p99_s: float, budget: Budget) -> list[Candidate]:
    """Score every candidate where it was replayed (no tables kept), smallest max_num_seqs first:
    a run whose running set never reached its max_num_seqs was never limited by it, so every
    larger value (same engine otherwise) replays identically and reuses it (the planner's
    `map_shared`)."""
    from capacity.analyses.planner import score_reducer
    jobs = [Job(trace=trace, config=c, trace_name=planner.trace_name,
                label=f"tune max_num_seqs={c.max_num_seqs} "
                      f"max_num_batched_tokens={c.max_num_batched_tokens}") for c in configs]
    scored = planner.map_shared(jobs, [score_reducer(slo_ttft_s=slo_ttft_p99_s,
                                                     slo_tbt_s=slo_tbt_p99_s, budget=budget,
                                                     config=resolve(c)) for c in configs])
    return [cand for cand, _ in scored]


def tune(trace: pl.DataFrame, config: EngineConfig, *, max_num_seqs_grid: list[int],
         max_num_batched_tokens_grid: list[int] | None = None, slo_ttft_p99_s: float,
         slo_tbt_p99_s: float, budget: Budget = Budget(), planner: Planner | None = None,
         precision: float = PRECISION) -> Tuning:
    from capacity.analyses.flags import vllm_flags
    if not max_num_seqs_grid:
        raise ValueError("max_num_seqs_grid: give at least one value, e.g. 64,128,256")
    planner = planner or Planner()
    tokens = max_num_batched_tokens_grid or [config.max_num_batched_tokens]
    configs = [dataclasses.replace(config, max_num_seqs=seqs, max_num_batched_tokens=mbt)
               for mbt in tokens for seqs in sorted(set(max_num_seqs_grid))]
    cands = _score_candidates(trace, configs, planner, slo_ttft_p99_s=slo_ttft_p99_s,
                                  slo_tbt_p99_s=slo_tbt_p99_s, budget=budget)
    feasible = {i: cfg for i, (cfg, c) in enumerate(zip(configs, cands)) if c.feasible}
    found = search_loads(trace, feasible, planner, passes=ok, slo_ttft_p99_s=slo_ttft_p99_s,
                         slo_tbt_p99_s=slo_tbt_p99_s, budget=budget, precision=precision,
                         label="headroom") if feasible else {}
    margins = [found[i][0] if i in found else None for i in range(len(cands))]
    pick, why = choose(cands, margins)
    rec_cfg = configs[cands.index(pick)] if pick is not None else None
    flags = vllm_flags(rec_cfg) if rec_cfg is not None and rec_cfg.preemption_mode != "none" else ()
    return Tuning(candidates=tuple(cands), margins=tuple(margins), recommended=pick,
                  recommended_config=rec_cfg, explanation=why, flags=flags,
                  slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget,
                  precision=precision)
