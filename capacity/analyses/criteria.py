"""What "meets the SLOs" and "within the preemption budget" mean, in one place (docs/metrics.md).

`evaluate` scores one replay: fleet P99 TTFT (finished requests) and fleet P99 TBT (every output
token) against the SLOs decide "meets the SLOs" — the numbers a Grafana panel shows; the share of
requests individually within both SLOs (own TTFT and own worst TBT) and goodput (those requests per
second) are shown beside it, never used to decide it. The budget says which preemption is
acceptable; `sustainable` (capacity/analyses/stability.py) says the engine keeps up at all.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from capacity.analyses.classify import classify
from capacity.analyses.metrics import preemptions_per_minute, summary
from capacity.analyses.stability import stability
from capacity.units import limit, seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """Preemption allowed. `peak_only`: the run's preemption must classify as none or peak-only
    (capacity/analyses/classify.py: confined to the highest-load windows, TBT recovering after each);
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
    slo_share: float            # requests individually within both SLOs / all requests
    meets_slo: bool             # fleet P99 TTFT and TBT within the SLOs
    sustainable: bool           # the engine keeps up (stability.py)
    preemption_verdict: str     # none | peak-only | structural (classify.py)
    within_budget: bool
    breaks: str          # "" or what it breaks, e.g. "TTFT p99 1.9 s > 1.0 s"

    @property
    def feasible(self) -> bool:
        return (self.meets_slo and self.within_budget and self.sustainable
                and self.status == "completed")




def evaluate(tables: dict[str, pl.DataFrame], *, slo_ttft_s: float, slo_tbt_s: float,
             budget: Budget, config=None) -> Candidate:
    """Score one run. `config` (a resolved engine) names the candidate when its run is shared
    with a smaller one (capacity.analyses.tuning)."""
    run = dict(tables["runs"].row(0, named=True))
    if config is not None:
        run.update(max_num_seqs=config.spec.max_num_seqs,
                   max_num_batched_tokens=config.spec.max_num_batched_tokens)
    s = summary(tables, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s, tbt_p50=False)
    sim = s["sim_seconds"] or 0.0
    per_min = preemptions_per_minute(tables["events"], sim)
    total = per_min["recompute"] + per_min["swap"]
    minutes = max(per_min.height, 1)
    share = float((total > 0).sum()) / minutes
    peak = int(total.max() or 0)
    breaks = []
    if s["ttft_p99_s"] is None or s["ttft_p99_s"] > slo_ttft_s:
        breaks.append(f"TTFT p99 {seconds(s['ttft_p99_s'], missing='none')} > {limit(slo_ttft_s)}")
    if s["tbt_p99_s"] is None or s["tbt_p99_s"] > slo_tbt_s:
        breaks.append(f"TBT p99 {seconds(s['tbt_p99_s'], missing='none')} > {limit(slo_tbt_s)}")
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
    st = stability(tables)
    if not st.sustainable:
        breaks.append(f"overloaded ({st.serves()})")
    npre = s["preemptions_recompute"] + s["preemptions_swap"]
    return Candidate(
        max_num_seqs=run["max_num_seqs"], max_num_batched_tokens=run["max_num_batched_tokens"],
        run_id=run["run_id"], status=s["status"], throughput_rps=s["throughput_rps"],
        goodput_rps=s["goodput_rps"], ttft_p99_s=s["ttft_p99_s"], tbt_p99_s=s["tbt_p99_s"],
        preemptions=npre, preemptions_per_min=npre / (sim / 60) if sim else 0.0,
        peak_preemptions_per_min=peak, preempted_minutes_share=share,
        recomputed_share=s["recompute_tax"],
        slo_share=s["slo_share"], meets_slo=meets, sustainable=st.sustainable,
        preemption_verdict=verdict, within_budget=within, breaks="; ".join(breaks))
