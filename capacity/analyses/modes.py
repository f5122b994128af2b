"""Swap vs. recompute vs. queue-only on the same trace (issue: compare-modes).

Runs the trace under: swap (host pool of the configured --swap-space; V1: the offload tier),
recompute with prefix caching on, recompute with prefix caching off, and none (queue only). For
each: recomputed tokens and their share of all prefill work, swapped GiB and host-link seconds,
TTFT / TBT p99 for preempted requests and for all, throughput, high-priority TTFT; then one
sentence of recommendation with its reason.

The stated criterion: the preempted requests' P99 stall (their worst inter-token gap), then fleet
TBT p99, TTFT p99, throughput; swap must shorten the stalls by at least 5% over recompute with
prefix caching to be worth its host memory. Only modes vLLM can be configured for are recommended
(each maps to flags, capacity/analyses/flags.py); queue-only is reported in words when it is no
worse on every criterion, never dropped, never put in the flags.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.metrics import GIB, nearest_rank, request_latencies, summary
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
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
    meets_slo: bool | None         # fleet P99 TTFT and TBT within the SLOs (None: no SLOs given)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeComparison:
    results: tuple[ModeResult, ...]
    recommended: str
    reason: str
    config: EngineConfig            # the recommended variant's engine (flags.vllm_flags spells it)
    queue_only_note: str            # "" or why queue-only would be better, in words

    def table(self) -> pl.DataFrame:
        return pl.DataFrame([dataclasses.asdict(r) for r in self.results])

    def as_dict(self) -> dict:
        return {"recommended": self.recommended, "reason": self.reason,
                "queue_only_note": self.queue_only_note,
                "modes": [dataclasses.asdict(r) for r in self.results]}


def mode_result(variant: str, tables: dict[str, pl.DataFrame], host_link_bytes_per_s: float,
                slo_ttft_p99_s: float | None = None, slo_tbt_p99_s: float | None = None) -> ModeResult:
    s = summary(tables)
    meets = None
    if slo_ttft_p99_s is not None and slo_tbt_p99_s is not None:
        meets = (s["ttft_p99_s"] is not None and s["ttft_p99_s"] <= slo_ttft_p99_s
                 and s["tbt_p99_s"] is not None and s["tbt_p99_s"] <= slo_tbt_p99_s
                 and s["status"] == "completed")
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
        swap_full_fallbacks=s["swap_full_fallbacks"], meets_slo=meets)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms"


def _stall_key(r: ModeResult) -> tuple:
    return (r.max_tbt_p99_preempted_s or 0.0, r.tbt_p99_s or 0.0, r.ttft_p99_s or 0.0,
            -r.throughput_rps)


def _no_worse(q: ModeResult, best: ModeResult) -> bool:
    """Queue-only loses nothing on any stated criterion (it has no preemption stalls)."""
    return (q.status == "completed" and q.ttft_p99_s is not None and best.ttft_p99_s is not None
            and q.ttft_p99_s <= best.ttft_p99_s and (q.tbt_p99_s or 0.0) <= (best.tbt_p99_s or 0.0)
            and q.throughput_rps >= best.throughput_rps)


def recommend(results: list[ModeResult], default_variant: str) -> tuple[str, str, str]:
    """(recommended variant, reason, queue-only note). See the module docstring for the rule."""
    by = {r.variant: r for r in results}
    preempting = [r for r in results if r.variant != "queue-only"]
    q = by.get("queue-only")
    slo_miss = ""
    if all(r.meets_slo is False for r in results):
        slo_miss = ("; every mode misses the SLOs at this load, so the fix is capacity (GPUs, a "
                    "lower --max-num-seqs or rate limiting), not the preemption mode")
    if all(r.preemptions == 0 for r in preempting):
        return default_variant, ("no preemption happens under any mode at this load, so keep "
                                 "vLLM's default and spend no host memory on swap" + slo_miss), ""
    ok = [r for r in preempting if r.status == "completed"] or preempting
    best = min(ok, key=_stall_key)
    rc = by.get("recompute+prefix-cache")
    swap_gain = ""
    if best.variant == "swap" and rc is not None and rc in ok:
        # Swap costs host memory and PCIe time: it must buy a real improvement (>= 5% shorter
        # preemption stalls), otherwise stay with vLLM's default.
        gain = (rc.max_tbt_p99_preempted_s or 0.0) - (best.max_tbt_p99_preempted_s or 0.0)
        if gain < 0.05 * (rc.max_tbt_p99_preempted_s or 0.0) or gain <= 0.001:
            swap_gain = (f" (swap's stalls are only {gain * 1000:,.0f} ms shorter, under the 5% "
                         f"that would pay for its host memory)")
            best = rc
    note = ""
    if q is not None and _no_worse(q, best):
        note = (f"admitting only what fits (queue-only, no preemption) would keep TTFT p99 at "
                f"{_ms(q.ttft_p99_s)} (vs {_ms(best.ttft_p99_s)}) without preemption stalls, but "
                f"vLLM has no flag for it; the nearest vLLM setting is a --max-num-seqs small "
                f"enough that the KV cache never runs out (see the tuning)")
    elif q is not None and q.ttft_p99_s is not None and best.ttft_p99_s is not None:
        note = (f"queue-only would avoid the stalls but raise TTFT p99 from {_ms(best.ttft_p99_s)} "
                f"to {_ms(q.ttft_p99_s)}")
    if best.variant == "swap" and rc is not None:
        gain = (rc.max_tbt_p99_preempted_s or 0) - (best.max_tbt_p99_preempted_s or 0)
        return "swap", (f"swap keeps the preempted requests' P99 stall {gain * 1000:,.0f} ms shorter "
                        f"than recompute with prefix caching (which re-prefills "
                        f"{rc.recomputed_share:.1%} of all prefill work) for "
                        f"{best.swapped_gib:.1f} GiB over the host link" + slo_miss), note
    return best.variant, (f"{best.variant} gives the shortest preemption stalls of the modes vLLM "
                          f"can run (P99 {_ms(best.max_tbt_p99_preempted_s)}, recomputing "
                          f"{best.recomputed_share:.1%} of prefill work){swap_gain}" + slo_miss), note


def variant_config(config: EngineConfig, variant: str, swap_space_gib: float | None = None
                   ) -> EngineConfig:
    """The engine a variant replays: the swap variant with the host tier `swap_space_gib` (the
    sized recommendation) and the configured behaviour when it is full."""
    changes = dict(VARIANTS)[variant]
    if variant == "swap":
        changes = dict(preemption_mode="swap", swap_space=swap_space_gib or config.swap_space,
                       num_cpu_blocks_override=None)
    return dataclasses.replace(config, **changes)


def compare_modes(trace: pl.DataFrame, config: EngineConfig, *, planner: Planner | None = None,
                  swap_space_gib: float | None = None, slo_ttft_p99_s: float | None = None,
                  slo_tbt_p99_s: float | None = None) -> ModeComparison:
    planner = planner or Planner()
    gpu = resolve(config).gpu
    cfgs = {name: variant_config(config, name, swap_space_gib) for name, _ in VARIANTS}
    runs = planner.run([Job(trace=trace, config=c, label=f"compare-modes {name}",
                            trace_name=planner.trace_name) for name, c in cfgs.items()])
    results = [mode_result(name, r.tables(), gpu.host_link_bandwidth_bytes_per_s,
                           slo_ttft_p99_s, slo_tbt_p99_s) for name, r in zip(cfgs, runs)]
    default = ("recompute+prefix-cache" if resolve(config).spec.enable_prefix_caching
               else "recompute")
    rec, reason, note = recommend(results, default)
    return ModeComparison(results=tuple(results), recommended=rec, reason=reason,
                          config=cfgs[rec], queue_only_note=note)
