"""Does the engine keep up with the trace? The first question of every analysis (docs/metrics.md).

A replay is *overloaded* when requests arrive faster than the engine serves them for good, so the
waiting queue grows for the rest of the trace instead of draining after a burst. Signals, all from
one run's tables:
- offered rate: requests / arrival span (first to last arrival);
- served rate: finished requests / simulated span (first arrival to the last finish); in overload
  the engine is busy throughout, so this is its capacity at this request mix;
- backlog: requests still waiting to be scheduled when the last request arrives, as a share of
  all requests (a burst that drains leaves none; a growing queue leaves (1 - 1/k) of them at k x
  the sustainable rate);
- simulated span vs. trace span, and the TTFT trend (median TTFT of the last fifth of arrivals vs.
  the first fifth), for the explanation.
Overloaded <=> backlog share > BACKLOG_SHARE and served rate < SERVED_SHARE x accepted rate (the
offered rate less the requests vLLM rejects: those are refused, never served, so counting them
would call any trace with >= 5% rejected "not served" whatever the engine does).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

BACKLOG_SHARE = 0.05
SERVED_SHARE = 0.95


@dataclass(frozen=True, slots=True, kw_only=True)
class Stability:
    sustainable: bool
    requests: int
    offered_rps: float
    served_rps: float
    accepted_rps: float            # offered less the requests vLLM rejects (never served)
    trace_span_s: float
    sim_span_s: float
    backlog_requests: int          # waiting (never scheduled yet) at the last arrival
    backlog_share: float
    ttft_trend: float | None       # median TTFT, last fifth of arrivals / first fifth
    evidence: str

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}

    def serves(self) -> str:
        """"serves 0.14 of 0.37 req/s, 0.14 accepted": beside rejected requests, what the
        served rate is to be read against."""
        return f"serves {self.served_rps:,.2f} of {self.offered_rps:,.2f} req/s" + _accepted_words(
            self.accepted_rps, self.offered_rps)


def _accepted_words(accepted: float, offered: float) -> str:
    return f", {accepted:,.2f} accepted" if accepted < offered else ""


def _median(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else None


def stability(tables: dict[str, pl.DataFrame]) -> Stability:
    req = tables["requests"]
    n = req.height
    arrival = req["arrival_s"].to_numpy().astype(float)
    first, last = (float(arrival.min()), float(arrival.max())) if n else (0.0, 0.0)
    span = max(last - first, 1e-9)
    finish = req["finish_s"].to_numpy().astype(float)
    finished = req["status"].to_numpy() == "finished"
    run = tables["runs"].row(0, named=True)
    sim_end = max(float(run["sim_seconds"] or 0.0), float(np.nanmax(finish)) if finished.any() else 0.0)
    sim_span = max(sim_end - first, 1e-9)
    # One request, or a batch (all at one instant), offers no rate: nothing to keep up with.
    batch = n > 1 and last == first
    offered = n / span if n > 1 and not batch else 0.0
    served = int(finished.sum()) / sim_span
    sched = req["first_scheduled_s"].to_numpy().astype(float)
    # Arrived by the last arrival (all of them) and not scheduled by then; rejected requests are
    # not waiting (they were refused, not queued).
    rejected = req["status"].to_numpy() == "rejected"
    waiting = (np.isnan(sched) | (sched > last)) & ~rejected
    backlog = int(waiting.sum())
    share = backlog / n if n else 0.0
    ttft = req["first_token_s"].to_numpy().astype(float) - arrival
    fifth = span / 5
    early, late = _median(ttft[arrival <= first + fifth]), _median(ttft[arrival >= last - fifth])
    trend = late / early if early and late is not None else None
    accepted = offered * (1 - rejected.sum() / n) if n else 0.0
    sustainable = not (share > BACKLOG_SHARE and served < SERVED_SHARE * accepted)
    serves = (f"serves {served:,.2f} of {offered:,.2f} req/s offered"
              f"{_accepted_words(accepted, offered)}")
    if batch:
        why = (f"a batch: all {n:,} requests arrive at t = {first:g} s (no request rate); the "
               f"last finishes {sim_span:,.2f} s later ({served:,.2f} req/s)")
    elif sustainable:
        why = (f"{serves}; {share:.0%} of requests "
               f"still wait at the last arrival; {sim_span:,.0f} s simulated for a "
               f"{span:,.0f}-s trace")
    else:
        why = (f"{serves}: the waiting queue grows "
               f"({backlog:,} requests, {share:.0%}, still unscheduled at the last arrival), "
               f"{sim_span:,.0f} s simulated for a {span:,.0f}-s trace"
               + (f", TTFT {trend:,.0f}x longer at the end than at the start" if trend else ""))
    return Stability(sustainable=sustainable, requests=n, offered_rps=offered, served_rps=served,
                     accepted_rps=accepted,
                     trace_span_s=span, sim_span_s=sim_span, backlog_requests=backlog,
                     backlog_share=share, ttft_trend=trend, evidence=why)
