"""`--max-num-seqs` (and `--max-num-batched-tokens`) tuning against SLOs and a preemption budget.

Each grid point is one replay. Per candidate: throughput, goodput (requests meeting every SLO per
second, docs/metrics.md), P99 TTFT and TBT, preemptions per minute, the share of minutes with any
preemption, and the recomputed-token share of prefill work. The recommendation is the feasible
candidate (SLOs met, preemption within budget) with the highest goodput; among candidates whose
goodput is within `TIE_TOLERANCE` of it, the smallest (the conservative side) is chosen and the
tie is said. The candidate next above the choice is reported with what it breaks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.classify import classify
from capacity.analyses.metrics import preemptions_per_minute, summary
from capacity.analyses.sweep import default_workers, run_many
from replay.results import RunResult
from replay.config import EngineConfig, resolve

TIE_TOLERANCE = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Preemption allowed. `peak_only`: the run's preemption must classify as none or peak-only
    (capacity/classify.py: confined to the highest-load windows, TBT recovering after each);
    optionally also in at most `max_minutes_share` of the minutes and at most `max_per_minute`
    preemptions in any minute (None = no limit)."""
    peak_only: bool = True
    max_minutes_share: float | None = None
    max_per_minute: float | None = None

    @classmethod
    def parse(cls, text: str, max_per_minute: float | None = None) -> "Budget":
        """CLI form: "peak-only" (default), "any", or a share of minutes such as 0.1."""
        t = text.strip().lower()
        if t in ("peak-only", "peak"):
            return cls(max_per_minute=max_per_minute)
        if t in ("any", "none", "unlimited"):
            return cls(peak_only=False, max_per_minute=max_per_minute)
        try:
            share = float(t)
        except ValueError:
            raise ValueError(f"preemption budget: use peak-only, any, or a share of minutes "
                             f"such as 0.1, got {text!r}") from None
        if not 0 <= share <= 1:
            raise ValueError(f"preemption budget: a share of minutes is between 0 and 1, got {share}")
        return cls(peak_only=False, max_minutes_share=share, max_per_minute=max_per_minute)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    max_num_seqs: int
    max_num_batched_tokens: int
    run_id: str
    status: str
    throughput_rps: float
    goodput_rps: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    preemptions: int
    preemptions_per_min: float
    peak_preemptions_per_min: int
    preempted_minutes_share: float
    recomputed_share: float
    meets_slo: bool
    preemption_verdict: str     # none | peak-only | structural (capacity/classify.py)
    within_budget: bool
    breaks: str          # "" or what it breaks, e.g. "TTFT p99 1.9 s > 1.0 s"

    @property
    def feasible(self) -> bool:
        return self.meets_slo and self.within_budget and self.status == "completed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    candidates: tuple[Candidate, ...]
    recommended: Candidate | None
    explanation: str
    flags: tuple[str, ...]
    slo_ttft_p99_s: float
    slo_tbt_p99_s: float
    budget: Budget

    def as_dict(self) -> dict:
        rec = self.recommended
        return {"recommended_max_num_seqs": rec.max_num_seqs if rec else None,
                "recommended_max_num_batched_tokens": rec.max_num_batched_tokens if rec else None,
                "explanation": self.explanation, "flags": list(self.flags),
                "slo_ttft_p99_s": self.slo_ttft_p99_s, "slo_tbt_p99_s": self.slo_tbt_p99_s,
                "budget": dataclasses.asdict(self.budget),
                "candidates": [dict(dataclasses.asdict(c), feasible=c.feasible)
                               for c in self.candidates]}

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dict(dataclasses.asdict(c), feasible=c.feasible)
                             for c in self.candidates])


def evaluate(tables: dict[str, pl.DataFrame], *, slo_ttft_s: float, slo_tbt_s: float,
             budget: Budget, config=None) -> Candidate:
    """Score one run. `config` (a resolved engine) names the candidate when its run is shared
    with a smaller one (see `_sweep_smallest_first`)."""
    run = dict(tables["runs"].row(0, named=True))
    if config is not None:
        run.update(max_num_seqs=config.spec.max_num_seqs,
                   max_num_batched_tokens=config.spec.max_num_batched_tokens)
    s = summary(tables, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s)
    sim = s["sim_seconds"] or 0.0
    per_min = preemptions_per_minute(tables["events"], sim)
    total = per_min["recompute"] + per_min["swap"]
    minutes = max(per_min.height, 1)
    share = float((total > 0).sum()) / minutes
    peak = int(total.max() or 0)
    prefill = int(tables["steps"]["num_prefill_tokens"].sum() or 0)
    recomputed = int(tables["requests"]["recomputed_tokens"].sum() or 0)
    breaks = []
    if s["ttft_p99_s"] is None or s["ttft_p99_s"] > slo_ttft_s:
        breaks.append(f"TTFT p99 {s['ttft_p99_s'] or float('nan'):.3g} s > {slo_ttft_s:g} s")
    if s["tbt_p99_s"] is None or s["tbt_p99_s"] > slo_tbt_s:
        breaks.append(f"TBT p99 {s['tbt_p99_s'] or float('nan'):.3g} s > {slo_tbt_s:g} s")
    meets = not breaks
    verdict = classify(tables).verdict
    budget_breaks = []
    if budget.peak_only and verdict == "structural":
        budget_breaks.append("preemption is structural, not peak-only")
    if budget.max_minutes_share is not None and share > budget.max_minutes_share:
        budget_breaks.append(f"preemption in {share:.0%} of minutes > {budget.max_minutes_share:.0%}")
    if budget.max_per_minute is not None and peak > budget.max_per_minute:
        budget_breaks.append(f"{peak} preemptions in one minute > {budget.max_per_minute:g}")
    within = not budget_breaks
    breaks += budget_breaks
    if s["status"] != "completed":
        breaks.append("engine aborted")
    npre = s["preemptions_recompute"] + s["preemptions_swap"]
    return Candidate(
        max_num_seqs=run["max_num_seqs"], max_num_batched_tokens=run["max_num_batched_tokens"],
        run_id=run["run_id"], status=s["status"], throughput_rps=s["throughput_rps"],
        goodput_rps=s["goodput_rps"], ttft_p99_s=s["ttft_p99_s"], tbt_p99_s=s["tbt_p99_s"],
        preemptions=npre, preemptions_per_min=npre / (sim / 60) if sim else 0.0,
        peak_preemptions_per_min=peak, preempted_minutes_share=share,
        recomputed_share=recomputed / prefill if prefill else 0.0, meets_slo=meets,
        preemption_verdict=verdict, within_budget=within, breaks="; ".join(breaks))


def choose(cands: list[Candidate]) -> tuple[Candidate | None, str]:
    order = sorted(cands, key=lambda c: (c.max_num_batched_tokens, c.max_num_seqs))
    feasible = [c for c in order if c.feasible]
    if not feasible:
        best = max(order, key=lambda c: c.goodput_rps)
        return None, (f"no candidate meets the SLOs and the preemption budget; the highest goodput "
                      f"is max_num_seqs={best.max_num_seqs} ({best.breaks}) — the load needs more "
                      f"GPUs or rate limiting")
    top = max(c.goodput_rps for c in feasible)
    tied = [c for c in feasible if c.goodput_rps >= top * (1 - TIE_TOLERANCE)]
    pick = min(tied, key=lambda c: (c.max_num_seqs, c.max_num_batched_tokens))
    words = [f"max_num_seqs={pick.max_num_seqs} meets the SLOs with goodput "
             f"{pick.goodput_rps:.2f} req/s ({pick.preemption_verdict} preemption, in "
             f"{pick.preempted_minutes_share:.0%} of minutes)"]
    if len(tied) > 1:
        words.append(f"larger values ({', '.join(str(c.max_num_seqs) for c in tied if c is not pick)}) "
                     f"are tied within {TIE_TOLERANCE:.0%} of goodput, so the conservative one is chosen")
    above = [c for c in order if c.max_num_batched_tokens == pick.max_num_batched_tokens
             and c.max_num_seqs > pick.max_num_seqs]
    if above:
        nxt = above[0]
        if not nxt.feasible:
            words.append(f"the next larger value {nxt.max_num_seqs} breaks it ({nxt.breaks}), so "
                         f"this is the edge: keep the conservative side")
        elif nxt not in tied:
            words.append(f"the next larger value {nxt.max_num_seqs} is feasible but has lower goodput")
    return pick, "; ".join(words)


def _same_but_seqs(a, b) -> bool:
    """Do two configs resolve to the same engine except for max_num_seqs?"""
    ra, rb = resolve(a).spec, resolve(b).spec
    return dataclasses.replace(ra, max_num_seqs=0) == dataclasses.replace(rb, max_num_seqs=0)


def _sweep_smallest_first(trace, configs, *, workers, on_done, trace_name, memo):
    """Replay the candidates smallest max_num_seqs first, `workers` at a time. A run whose
    running set never reached its max_num_seqs was never limited by it, so every larger value
    (same engine otherwise) replays identically: those reuse it instead of replaying."""
    n = max(1, workers or default_workers())
    done: dict[int, RunResult] = {}
    reported: set[int] = set()
    order = sorted(range(len(configs)), key=lambda i: (configs[i].max_num_batched_tokens or 0,
                                                       configs[i].max_num_seqs))
    pending = list(order)
    while pending:
        batch, pending = pending[:n], pending[n:]
        runs = run_many(trace, [configs[i] for i in batch],
                        [f"tune max_num_seqs={configs[i].max_num_seqs} "
                         f"max_num_batched_tokens={configs[i].max_num_batched_tokens}" for i in batch],
                        workers=n, trace_name=trace_name, memo=memo)
        for i, r in zip(batch, runs):
            done[i] = r
            peak = int(r.steps["num_running"].max() or 0) if r.steps.height else 0
            if peak < resolve(configs[i]).spec.max_num_seqs:
                for j in [j for j in pending if _same_but_seqs(configs[j], configs[i])
                          and configs[j].max_num_seqs > configs[i].max_num_seqs]:
                    done[j] = r
                    pending.remove(j)
        if on_done:
            for i in [i for i in done if i not in reported]:
                reported.add(i)
                on_done(i, done[i])
    return [done[i] for i in range(len(configs))]


def tune(trace: pl.DataFrame, config: EngineConfig, *, max_num_seqs_grid: list[int],
         max_num_batched_tokens_grid: list[int] | None = None, slo_ttft_p99_s: float,
         slo_tbt_p99_s: float, budget: Budget = Budget(), workers: int | None = None,
         keep_runs: list | None = None, on_done=None, trace_name: str = "",
         memo: dict | None = None) -> Tuning:
    if not max_num_seqs_grid:
        raise ValueError("max_num_seqs_grid: give at least one value, e.g. 64,128,256")
    tokens = max_num_batched_tokens_grid or [config.max_num_batched_tokens]
    configs = [dataclasses.replace(config, max_num_seqs=seqs, max_num_batched_tokens=mbt)
               for mbt in tokens for seqs in sorted(set(max_num_seqs_grid))]
    runs = _sweep_smallest_first(trace, configs, workers=workers, on_done=on_done,
                                 trace_name=trace_name, memo=memo)
    if keep_runs is not None:
        keep_runs.extend({r.run_id: r for r in runs}.values())
    cands = [evaluate(r.tables(), slo_ttft_s=slo_ttft_p99_s, slo_tbt_s=slo_tbt_p99_s, budget=budget,
                      config=resolve(cfg)) for cfg, r in zip(configs, runs)]
    pick, why = choose(cands)
    flags: tuple[str, ...] = ()
    if pick is not None:
        flags = (f"--max-num-seqs {pick.max_num_seqs}",
                 f"--max-num-batched-tokens {pick.max_num_batched_tokens}")
    return Tuning(candidates=tuple(cands), recommended=pick, explanation=why, flags=flags,
                  slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=slo_tbt_p99_s, budget=budget)
