"""Swap vs. recompute vs. queue-only on the same trace (issue: compare-modes).

Runs the trace under: swap (host pool of the configured --swap-space; V1: the offload tier),
recompute with prefix caching on, recompute with prefix caching off, and none (queue only). For
each: recomputed tokens and their share of all prefill work, swapped GiB and host-link seconds,
TTFT / TBT p99 for preempted requests and for all, throughput, high-priority TTFT; then one
sentence of recommendation with its reason.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.metrics import GIB, nearest_rank, request_latencies, summary
from capacity.analyses.sweep import Job, run_jobs
from replay.config import EngineConfig, resolve

VARIANTS = (
    ("swap", dict(preemption_mode="swap", on_swap_full="recompute")),
    ("recompute+prefix-cache", dict(preemption_mode="recompute", enable_prefix_caching=True)),
    ("recompute", dict(preemption_mode="recompute", enable_prefix_caching=False)),
    ("queue-only", dict(preemption_mode="none")),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeResult:
    variant: str
    run_id: str
    status: str
    abort_s: float | None
    preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    prefill_tokens: int
    recomputed_share: float
    swapped_gib: float
    host_link_s: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    ttft_p99_preempted_s: float | None
    max_tbt_p99_preempted_s: float | None
    high_priority_ttft_p99_s: float | None
    throughput_rps: float
    output_tokens_per_s: float
    swap_full_fallbacks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeComparison:
    results: tuple[ModeResult, ...]
    recommended: str
    reason: str

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dataclasses.asdict(r) for r in self.results])

    def as_dict(self) -> dict:
        return {"recommended": self.recommended, "reason": self.reason,
                "modes": [dataclasses.asdict(r) for r in self.results]}


def mode_result(variant: str, tables: dict[str, pl.DataFrame], host_link_bytes_per_s: float,
                ) -> ModeResult:
    s = summary(tables)
    run = tables["runs"].row(0, named=True)
    req = request_latencies(tables["requests"])
    steps = tables["steps"]
    bpb = run["kv_bytes_per_block"]
    prefill = int(steps["num_prefill_tokens"].sum() or 0)
    recomputed = int(req["recomputed_tokens"].sum() or 0)
    swap_blocks = int((steps["swap_out_blocks"].sum() or 0) + (steps["swap_in_blocks"].sum() or 0))
    pre = req.filter(pl.col("num_preemptions") > 0)
    top = req.filter(pl.col("priority") == req["priority"].min()) if req.height else req
    return ModeResult(
        variant=variant, run_id=run["run_id"], status=run["status"], abort_s=run["abort_s"],
        preemptions=s["preemptions_recompute"] + s["preemptions_swap"],
        preempted_requests=s["preempted_requests"], recomputed_tokens=recomputed,
        prefill_tokens=prefill, recomputed_share=recomputed / prefill if prefill else 0.0,
        swapped_gib=int(steps["swap_out_blocks"].sum() or 0) * bpb / GIB,
        host_link_s=swap_blocks * bpb / host_link_bytes_per_s,
        ttft_p99_s=s["ttft_p99_s"], tbt_p99_s=s["tbt_p99_s"],
        ttft_p99_preempted_s=nearest_rank(pre["ttft_s"].to_numpy(), 0.99),
        max_tbt_p99_preempted_s=nearest_rank(pre["max_tbt_s"].to_numpy(), 0.99),
        high_priority_ttft_p99_s=nearest_rank(top["ttft_s"].to_numpy(), 0.99),
        throughput_rps=s["throughput_rps"], output_tokens_per_s=s["output_tokens_per_s"],
        swap_full_fallbacks=s["swap_full_fallbacks"])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms"


def recommend(results: list[ModeResult]) -> tuple[str, str]:
    """Pick a mode: among the preempting modes the one whose preempted requests stall least
    (then fleet TBT p99, TTFT p99, throughput); queue-only only when it costs newcomers no more
    than 10% of TTFT p99 and nothing in throughput or TBT."""
    by = {r.variant: r for r in results}
    preempting = [r for r in results if r.variant != "queue-only"]
    if all(r.preemptions == 0 for r in preempting):
        return "recompute", ("no preemption happens under any mode at this load, so keep vLLM's "
                             "default (recompute) and spend no host memory on swap")
    ok = [r for r in preempting if r.status == "completed"] or preempting
    best = min(ok, key=lambda r: (r.max_tbt_p99_preempted_s or 0.0, r.tbt_p99_s or 0.0,
                                  r.ttft_p99_s or 0.0, -r.throughput_rps))
    rc_ok = by.get("recompute+prefix-cache")
    if best.variant == "swap" and rc_ok is not None and rc_ok.status == "completed":
        # Swap costs host memory and PCIe time: it must buy a real improvement (>= 5% shorter
        # preemption stalls), otherwise stay with vLLM's default.
        gain = (rc_ok.max_tbt_p99_preempted_s or 0.0) - (best.max_tbt_p99_preempted_s or 0.0)
        if gain < 0.05 * (rc_ok.max_tbt_p99_preempted_s or 0.0) or gain <= 0.001:
            best = rc_ok
    q = by.get("queue-only")
    if (q is not None and q.status == "completed" and best.ttft_p99_s is not None
            and q.ttft_p99_s is not None and q.ttft_p99_s <= best.ttft_p99_s * 1.1
            and q.throughput_rps >= best.throughput_rps * 0.98
            and (q.tbt_p99_s or 0.0) <= (best.tbt_p99_s or 0.0)):
        return "queue-only", (f"admitting only what fits (no preemption) keeps TTFT p99 at "
                              f"{_ms(q.ttft_p99_s)} (vs {_ms(best.ttft_p99_s)} with {best.variant}) "
                              f"and removes the preemption stalls")
    tail = ""
    if q is not None and q.ttft_p99_s is not None and best.ttft_p99_s is not None:
        tail = (f"; queue-only would avoid the stalls but raise TTFT p99 from "
                f"{_ms(best.ttft_p99_s)} to {_ms(q.ttft_p99_s)}")
    rc = by.get("recompute+prefix-cache")
    if best.variant == "swap" and rc is not None:
        gain = (rc.max_tbt_p99_preempted_s or 0) - (best.max_tbt_p99_preempted_s or 0)
        return "swap", (f"swap keeps the preempted requests' P99 stall {gain * 1000:,.0f} ms shorter "
                        f"than recompute with prefix caching (which re-prefills "
                        f"{rc.recomputed_share:.1%} of all prefill work) for "
                        f"{best.swapped_gib:.1f} GiB over the host link{tail}")
    return best.variant, (f"{best.variant} gives the shortest preemption stalls here "
                          f"(P99 {_ms(best.max_tbt_p99_preempted_s)}, recomputing "
                          f"{best.recomputed_share:.1%} of prefill work) without host memory for "
                          f"a swap tier{tail}")


def compare_modes(trace: pl.DataFrame, config: EngineConfig, *, keep_runs: list | None = None,
                  workers: int | None = None, memo: dict | None = None) -> ModeComparison:
    gpu = resolve(config).gpu
    jobs = [Job(trace=trace, config=dataclasses.replace(config, **changes),
                label=f"compare-modes {name}") for name, changes in VARIANTS]
    runs = run_jobs(jobs, workers=workers, memo=memo)
    if keep_runs is not None:
        keep_runs.extend(runs)
    results = [mode_result(name, r.tables(), gpu.host_link_bandwidth_bytes_per_s)
               for (name, _), r in zip(VARIANTS, runs)]
    rec, reason = recommend(results)
    return ModeComparison(results=tuple(results), recommended=rec, reason=reason)
