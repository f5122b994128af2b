"""Metrics over a run's tables, as defined in docs/metrics.md (definitions first, then code).

Percentiles are nearest-rank (the same method as ../shared/traces/README.md): the q-quantile of n
sorted samples is the ceil(q*n)-th one. Weighted samples (the `tbt` table) use the same rule over
cumulative weights. Must not import altair or torch.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from capacity.analyses.versions import preemption_victim_of
# One implementation for tables and streamed replays (replay/results/summary.py).
from replay.results.quantiles import nearest_rank, nearest_rank_chunked, nearest_ranks  # noqa: F401
from replay.results.summary import TbtSummary
from replay.results.tables import recompute_tax

GIB = 2 ** 30


def tbt_percentile(tbt, q: float) -> float | None:
    """Nearest-rank q-quantile of the `tbt` table (weighted samples), in memory or spilled."""
    return tbt_percentiles(tbt, (q,))[0]


# Spilled TBT samples up to this many are read whole and sorted once (what
# nearest_rank_chunked's last pass holds anyway); more are narrowed down chunk by chunk.
WHOLE_TBT_SAMPLES = 1 << 22


def tbt_percentiles(tbt, qs) -> list[float | None]:
    """`tbt_percentile` for each q of `qs` (one sort of an in-memory table)."""
    if isinstance(tbt, TbtSummary):          # a summary replay: kept exactly as it streamed
        return tbt.quantiles(qs)
    if isinstance(tbt, pl.DataFrame) or tbt.height <= WHOLE_TBT_SAMPLES:
        return nearest_ranks(tbt["tbt_s"].to_numpy(), qs, tbt["weight"].to_numpy())
    return [nearest_rank_chunked(
        lambda: ((c["tbt_s"], c["weight"]) for c in tbt.spill.chunks()), q) for q in qs]


def produced_tokens(requests: pl.DataFrame) -> pl.Expr:
    """Output tokens a request really produced (Int64): an output cut at max_model_len produced
    fewer than it asked for, and sums of Int32 token counts wrap past 2^31."""
    asked = pl.col("output_tokens").cast(pl.Int64)
    if "output_tokens_done" in requests.columns:
        return pl.col("output_tokens_done").cast(pl.Int64).fill_null(asked)
    return asked


def request_latencies(requests: pl.DataFrame) -> pl.DataFrame:
    """Per-request TTFT, E2E, TPOT (seconds); null where undefined. TPOT is over the tokens the
    request produced (see `produced_tokens`)."""
    produced = produced_tokens(requests)
    return requests.with_columns(
        ttft_s=pl.col("first_token_s") - pl.col("arrival_s"),
        e2e_s=pl.when(pl.col("status") == "finished").then(pl.col("finish_s") - pl.col("arrival_s")),
        tpot_s=pl.when((pl.col("status") == "finished") & (produced > 1))
        .then((pl.col("finish_s") - pl.col("first_token_s")) / (produced - 1)),
        queue_s=pl.col("first_scheduled_s") - pl.col("arrival_s"),
    )


def meets_slo(lat: pl.DataFrame, *, ttft_s: float | None, tbt_s: float | None) -> pl.Series:
    """Per request: finished, TTFT <= ttft_s and every TBT sample (max_tbt_s) <= tbt_s."""
    ok = pl.col("status") == "finished"
    if ttft_s is not None:
        ok = ok & (pl.col("ttft_s") <= ttft_s)
    if tbt_s is not None:
        ok = ok & (pl.col("max_tbt_s").fill_null(0.0) <= tbt_s)
    return lat.select(ok.alias("ok"))["ok"]


def _sum(df: pl.DataFrame, name: str) -> int:
    """Sum of an integer column, 0 when absent (tables stored before it existed)."""
    return int(df[name].cast(pl.Int64).sum() or 0) if name in df.columns else 0


def summary(tables: dict[str, pl.DataFrame], *, slo_ttft_s: float | None = None,
            slo_tbt_s: float | None = None, tbt_p50: bool = True) -> dict:
    """The replay summary (DESIGN §7 keys and more), from full tables or a summary replay's
    (replay/results/summary.py: its steps and TBT as streamed stats). `tbt_p50=False` leaves out
    "tbt_p50_s" (a summary replay keeps the median only when asked: it needs every sample)."""
    run = tables["runs"].row(0, named=True)
    req = request_latencies(tables["requests"])
    steps, events, tbt = tables["steps"], tables["events"], tables["tbt"]
    fin = req.filter(pl.col("status") == "finished")
    kinds = events["kind"].value_counts() if events.height else None
    count = {k: 0 for k in ("preempt_recompute", "preempt_swap", "swap_in", "swap_full_fallback",
                            "swap_full_abort", "reject")}
    if kinds is not None:
        count.update(dict(zip(kinds["kind"].to_list(), kinds["count"].to_list())))
    bpb = run["kv_bytes_per_block"]
    sim = run["sim_seconds"] or 0.0
    peak_cpu = int(steps["cpu_blocks_used"].max() or 0) if steps.height else 0
    peak_gpu = int(steps["gpu_blocks_used"].max() or 0) if steps.height else 0
    out_tokens = int(fin.select(produced_tokens(fin).sum()).item() or 0)
    ttft = fin["ttft_s"].to_numpy()
    ttft_p50, ttft_p99 = nearest_ranks(ttft, (0.5, 0.99))
    want_p50 = tbt_p50      # the flag, not the value (None when no request has a second token)
    tbt_p50, tbt_p99 = (tbt_percentiles(tbt, (0.5, 0.99)) if want_p50
                        else (None, tbt_percentiles(tbt, (0.99,))[0]))
    res = {
        "run_id": run["run_id"], "status": run["status"],
        # Which engine loop was replayed: "async" / "sync" (V1), "sync" (V0).
        "scheduler": run["scheduler"],
        "scheduler_loop": "async" if run.get("async_scheduling") else "sync",
        # The vLLM release replayed and its KV block size (issue 32: every answer names them).
        "vllm_version": run.get("vllm_version"), "block_size": run.get("block_size"),
        "preemption_victim": preemption_victim_of(run) or "fcfs",
        "requests": req.height,
        "requests_finished": fin.height,
        "requests_rejected": int((req["status"] == "rejected").sum()),
        "requests_aborted": int((req["status"] == "aborted").sum()),
        "requests_unfinished": int((req["status"] == "unfinished").sum()),
        "sim_seconds": sim,
        "steps": steps.height,
        "throughput_rps": fin.height / sim if sim > 0 else 0.0,
        "output_tokens_per_s": out_tokens / sim if sim > 0 else 0.0,
        "ttft_p50_s": ttft_p50, "ttft_p99_s": ttft_p99,
        **({"tbt_p50_s": tbt_p50} if want_p50 else {}), "tbt_p99_s": tbt_p99,
        "tpot_p50_s": nearest_rank(fin["tpot_s"].to_numpy(), 0.5),
        "e2e_p50_s": nearest_rank(fin["e2e_s"].to_numpy(), 0.5),
        "preemptions_recompute": count["preempt_recompute"],
        "preemptions_swap": count["preempt_swap"],
        "swap_ins": count["swap_in"],
        "swap_full_events": count["swap_full_fallback"] + count["swap_full_abort"],
        "swap_full_fallbacks": count["swap_full_fallback"],
        "preempted_requests": int((req["num_preemptions"] > 0).sum()),
        # Prefix hits at first admission (V1): the GPU prefix cache, the CPU offloading tier.
        "gpu_hit_tokens": _sum(req, "gpu_hit_tokens"),
        "cpu_hit_tokens": _sum(req, "cpu_hit_tokens"),
        # Prefill tokens computed again because preemption dropped them, and their share of
        # all prefill tokens computed (the "recompute tax", vllm#54644).
        "recomputed_tokens": _sum(req, "recomputed_tokens"),
        "recompute_tax": recompute_tax(req, steps) or 0.0,
        "peak_swapped_gib": peak_cpu * bpb / GIB,
        "peak_gpu_kv_usage": peak_gpu / run["num_gpu_blocks"] if run["num_gpu_blocks"] else 0.0,
        "abort_s": run["abort_s"],
        "wall_seconds": run["wall_seconds"],
    }
    if slo_ttft_s is not None or slo_tbt_s is not None:
        ok = meets_slo(req, ttft_s=slo_ttft_s, tbt_s=slo_tbt_s)
        res["goodput_rps"] = int(ok.sum()) / sim if sim > 0 else 0.0
        res["slo_share"] = int(ok.sum()) / req.height if req.height else 0.0
    return res


def preemptions_per_minute(events: pl.DataFrame, sim_seconds: float) -> pl.DataFrame:
    """Preemptions per 1-minute bin of simulated time, by mode (bins with none included)."""
    minutes = max(1, math.ceil(sim_seconds / 60))
    base = pl.DataFrame({"minute": np.arange(minutes, dtype=np.int64)})
    pre = events.filter(pl.col("kind").str.starts_with("preempt_")).with_columns(
        minute=(pl.col("t_s") // 60).cast(pl.Int64),
        mode=pl.col("kind").str.strip_prefix("preempt_"))
    wide = pre.group_by("minute").agg(
        recompute=(pl.col("mode") == "recompute").sum(), swap=(pl.col("mode") == "swap").sum())
    return base.join(wide, on="minute", how="left").fill_null(0).sort("minute")
