"""Swap-space sizing from production logs and metrics (`kvcap size-swap --from-logs`).

The host tier must hold the KV of every request swapped out at one moment. The logs show how many
were swapped (V0's `Swapped: N reqs`, sampled every 5 s), and so does V0's Prometheus gauge
`vllm:num_requests_swapped` (with `vllm:cpu_cache_usage_perc`), at the scrape interval; the peak
of both is used. Each swapped request holds about one context of KV:
ceil(context / block_size) blocks of the model's KV bytes per block (per GPU). The context is the
observed mean prompt + output length of the client results when they are loaded, else
`--context-tokens`. Recommendation: the same headroom and rounding as the replay-based sizing
(`swap_sizing.round_up_gib`, +1 block for V0's swap-out check). When the DB holds a replay-based
answer (a run labelled "size-swap demand"), both are reported with the difference explained.
Must not import altair.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from capacity.evidence.logs import read_evidence
from capacity.analyses.metrics import GIB
from capacity.analyses.sizing import round_up_gib
from replay.config import DEFAULT_BLOCK_SIZE, V0_VLLM_VERSION, EngineConfig
from replay.results.store import connect
from replay.timing.catalog import get_model
from replay.timing.memory import kv_bytes_per_block, kv_bytes_per_token

V0_BLOCK_SIZE = DEFAULT_BLOCK_SIZE[V0_VLLM_VERSION]

DEMAND_LABEL = "size-swap demand"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySide:
    run_id: str
    trace_name: str | None
    peak_swapped_requests: int
    peak_swapped_gib: float
    recommended_swap_space_gib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSwapSizing:
    source: str                                  # "logs"
    model: str
    tensor_parallel_size: int
    block_size: int
    headroom: float
    kv_bytes_per_token: int
    context_tokens: int
    context_source: str                          # "client results (mean prompt+output)" | "--context-tokens"
    peak_swapped_requests: int
    peak_at: str | None
    peak_source_file: str | None                 # log file, or "FILE SERVER" of a Prometheus series
    evidence: str                                # "logs", "prometheus" or "logs+prometheus"
    peak_cpu_kv_usage: float | None              # V0's "CPU KV cache usage" at its peak, 0..1
    peak_cpu_kv_gib_at_swap_space: float | None  # that usage x --swap-space (if production used it)
    peak_swapped_blocks: int
    peak_swapped_gib: float
    recommended_swap_space_gib: float            # V0 --swap-space, per GPU
    replay: ReplaySide | None
    difference: str

    def as_dict(self) -> dict:
        return asdict(self)


def _replay_side(db: Path, headroom: float) -> ReplaySide | None:
    with connect(db, read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if not {"runs", "steps"} <= tables:
            return None
        rows = con.execute(
            "SELECT r.run_id, r.trace_name, r.kv_bytes_per_block, max(s.evicted_blocks), "
            "max(s.evicted_requests) FROM runs r JOIN steps s USING (run_id) WHERE r.label = ? "
            "GROUP BY ALL ORDER BY max(r.created_at) DESC LIMIT 1", [DEMAND_LABEL]).fetchall()
    if not rows:
        return None
    run_id, trace, bpb, blocks, reqs = rows[0]
    blocks, reqs = int(blocks or 0), int(reqs or 0)
    rec = round_up_gib((blocks + 1) * bpb / GIB * (1 + headroom)) if blocks else 0.0
    return ReplaySide(run_id=run_id, trace_name=trace, peak_swapped_requests=reqs,
                      peak_swapped_gib=blocks * bpb / GIB, recommended_swap_space_gib=rec)


def explain(logs_reqs: int, logs_gib: float, rep: ReplaySide | None, context: int) -> str:
    if rep is None:
        return ("No replay-based answer in this DB (run `kvcap size-swap TRACE --db ...` to add one); "
                "the log-based size rests on 5-10 s samples and a mean context.")
    if abs(rep.peak_swapped_gib - logs_gib) <= 0.1 * max(logs_gib, rep.peak_swapped_gib, 1e-9):
        return (f"The replay ({rep.peak_swapped_gib:.2f} GiB) and the logs ({logs_gib:.2f} GiB) agree "
                "within 10%, so the recommendation is corroborated by production.")
    if rep.peak_swapped_gib > logs_gib:
        why = ("the replay sees every engine step while the stats line samples every 5-10 s and misses "
               "short peaks" if rep.peak_swapped_requests > logs_reqs else
               f"the swapped requests in the replay are longer than the mean context of {context} tokens")
        return f"The replay needs {rep.peak_swapped_gib - logs_gib:.2f} GiB more than the logs show: {why}."
    why = ("production swapped more requests at once than the replayed trace produced (a different "
           "period or load)" if logs_reqs > rep.peak_swapped_requests else
           f"the mean context of {context} tokens overstates the requests that were actually swapped")
    return f"The logs need {logs_gib - rep.peak_swapped_gib:.2f} GiB more than the replay: {why}."


def _swapped_observations(stats: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """Swapped requests and CPU KV usage over time, from the stats lines and the V0 gauges."""
    cols = {"source_file": pl.Utf8, "time": pl.Datetime("us"), "epoch_s": pl.Float64, "swapped": pl.Int64,
            "cpu_kv_usage": pl.Float64, "evidence": pl.Utf8}
    logs = stats.filter(pl.col("swapped").is_not_null()).select(
        "source_file", "time", "epoch_s", pl.col("swapped").cast(pl.Int64), "cpu_kv_usage",
        evidence=pl.lit("logs"))
    key = [pl.col("source_file") + " " + pl.col("server"), "time", "epoch_s"]
    prom = samples.filter(pl.col("metric") == "vllm:num_requests_swapped").select(
        *key, swapped=pl.col("value").round().cast(pl.Int64))
    cpu = samples.filter(pl.col("metric") == "vllm:cpu_cache_usage_perc").select(*key, cpu_kv_usage=pl.col("value"))
    prom = prom.join(cpu.group_by("source_file", "time", "epoch_s").agg(pl.col("cpu_kv_usage").max()),
                     on=["source_file", "time", "epoch_s"], how="left").with_columns(evidence=pl.lit("prometheus"))
    return pl.concat([logs.select([pl.col(c).cast(t) for c, t in cols.items()]),
                      prom.select([pl.col(c).cast(t) for c, t in cols.items()])])


def size_swap_from_logs(db: Path, config: EngineConfig, *, context_tokens: int | None = None,
                        headroom: float = 0.2) -> LogSwapSizing:
    if headroom < 0:
        raise ValueError(f"--headroom: must be >= 0, got {headroom}")
    ev = read_evidence(db, "log_stats", "client_tokens", "prom_samples")
    stats, tok = ev["log_stats"], ev["client_tokens"]
    swapped = _swapped_observations(stats, ev["prom_samples"])
    if swapped.height == 0:
        raise ValueError(f"{db}: no 'Swapped:' field in the logs and no vllm:num_requests_swapped in "
                         "Prometheus (V1 reports neither); size the offload tier with a replay: "
                         "kvcap size-swap TRACE")
    firsts = tok.filter(pl.col("token_index") == 0)
    if context_tokens is not None:
        if context_tokens <= 0:
            raise ValueError(f"--context-tokens: must be > 0, got {context_tokens}")
        ctx, ctx_src = int(context_tokens), "--context-tokens"
    elif firsts.height and firsts["prompt_tokens"].null_count() < firsts.height:
        mean = (firsts["prompt_tokens"].cast(pl.Float64) + firsts["output_tokens"].cast(pl.Float64)).mean()
        ctx, ctx_src = int(math.ceil(mean)), "client results (mean prompt+output)"
    else:
        raise ValueError("no client results with prompt/output lengths in the DB; pass --context-tokens N")
    model = get_model(config.model)
    # Swap is V0's (0.10.1.1): its block size, whichever engine the flags name.
    tp = config.tensor_parallel_size
    bs = config.block_size if config.block_size is not None else V0_BLOCK_SIZE
    bpt = kv_bytes_per_token(model, tp, config.kv_cache_dtype)
    bpb = kv_bytes_per_block(model, tp, config.kv_cache_dtype, bs)
    peak = swapped.sort(["swapped", "epoch_s"], descending=[True, False]).row(0, named=True)
    reqs = int(peak["swapped"])
    blocks = reqs * math.ceil(ctx / bs)
    gib = blocks * bpb / GIB
    rec = round_up_gib((blocks + 1) * bpb / GIB * (1 + headroom)) if blocks else 0.0
    rep = _replay_side(db, headroom)
    cpu_peak = swapped["cpu_kv_usage"].max()
    return LogSwapSizing(
        source="logs", model=config.model, tensor_parallel_size=tp, block_size=bs, headroom=headroom,
        kv_bytes_per_token=bpt, context_tokens=ctx, context_source=ctx_src,
        peak_swapped_requests=reqs, peak_at=str(peak["time"]) if reqs else None,
        peak_source_file=peak["source_file"] if reqs else None,
        evidence="+".join(sorted(set(swapped["evidence"].to_list()))),
        peak_cpu_kv_usage=cpu_peak,
        peak_cpu_kv_gib_at_swap_space=None if cpu_peak is None else cpu_peak * config.swap_space,
        peak_swapped_blocks=blocks,
        peak_swapped_gib=gib, recommended_swap_space_gib=rec,
        replay=rep,
        difference=explain(reqs, gib, rep, ctx))
