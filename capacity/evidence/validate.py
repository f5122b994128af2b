"""Replay vs. production (`kvcap validate`): the error per metric of a stored replay against the
logged time series and the client latency percentiles of the same period.

Alignment: replay time t (seconds from the first arrival) is log time first stats line + offset_s
+ t. The replay is resampled to the log's intervals: a stats line at log time T covers (T_prev, T];
gauges (running, waiting, swapped, KV usage) are the replay's state at the last step that started
at or before T (vLLM logs the state of its latest step); counters (preemptions, prompt / generation
tokens per second) are summed over the steps and events of (T_prev, T]. For each metric: MAE,
relative error (MAE / mean |logged|), bias (mean replay - logged), n. Client TTFT / ITL
percentiles are compared with the replay's TTFT / TBT (nearest rank). Must not import altair.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from capacity.evidence.logparse import DEFAULT_INTERVAL_S
from capacity.evidence.logs import read_evidence
from capacity.analyses.metrics import nearest_rank, request_latencies
from replay.results.store import connect

GAUGES = ("running", "waiting", "swapped", "gpu_kv_usage", "cpu_kv_usage")
COUNTERS = ("preemptions", "prompt_throughput_tps", "generation_throughput_tps")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricError:
    n: int
    log_mean: float | None
    replay_mean: float | None
    mae: float | None
    relative_error: float | None
    bias: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyError:
    client: float | None
    replay: float | None
    error: float | None
    relative_error: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    run_id: str
    db: str
    source: str
    engine: int
    offset_s: float
    log_start: str
    intervals: int
    metrics: dict[str, MetricError]
    latency: dict[str, LatencyError]
    series: pl.DataFrame | None = None          # per interval: t_s, metric, log, replay

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "series"}
        return d


def read_run(db: Path, run_id: str) -> dict[str, pl.DataFrame]:
    with connect(db, read_only=True) as con:
        have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "runs" not in have:
            raise ValueError(f"{db}: no replay runs stored; run `kvcap replay TRACE --db {db}`")
        out = {t: con.sql(f"SELECT * FROM {t} WHERE run_id = $1", params=[run_id]).pl()
               for t in ("runs", "requests", "steps", "events", "tbt")}
    if out["runs"].height == 0:
        raise ValueError(f"run {run_id!r} is not in {db} (see `kvcap runs --db {db}`)")
    return out


def pick_one(names: list[str], given: str | None, *, what: str, flag: str) -> str:
    """`given`, or the only one of `names`; several and none given is an error naming the flag."""
    if given is None and len(names) > 1:
        raise ValueError(f"several {what} in the DB ({', '.join(names)}); pick one with {flag}")
    return names[0] if given is None else given


def _log_series(stats: pl.DataFrame, source: str | None, engine: int) -> tuple[pl.DataFrame, str]:
    sources = sorted(set(stats["source_file"].to_list()))
    if not sources:
        raise ValueError("no stats lines in the DB; load a vLLM server log with `kvcap logs`")
    source = pick_one(sources, source, what="server logs", flag="--source")
    s = stats.filter((pl.col("source_file") == source) & (pl.col("engine") == engine)).sort("epoch_s")
    if s.height == 0:
        raise ValueError(f"no stats lines for --source {source} --engine {engine}")
    return s, source


def resample(steps: pl.DataFrame, events: pl.DataFrame, run: dict, t: np.ndarray,
             start: np.ndarray) -> pl.DataFrame:
    """The replay at log intervals (start, t]: gauges as of t, counters over the interval."""
    st = steps.sort("start_s")
    s_t = st["start_s"].to_numpy()
    idx = np.searchsorted(s_t, t, side="right") - 1             # last step started at or before t
    have = idx >= 0
    pick = lambda col: np.where(have, st[col].to_numpy()[np.maximum(idx, 0)], 0).astype(np.float64)  # noqa: E731
    gpu_blocks, cpu_blocks = run["num_gpu_blocks"] or 0, run["num_cpu_blocks"] or 0
    out = {"t_s": t, "running": pick("num_running"), "waiting": pick("num_waiting"),
           "swapped": pick("num_swapped"),
           "gpu_kv_usage": pick("gpu_blocks_used") / gpu_blocks if gpu_blocks else np.zeros(len(t)),
           "cpu_kv_usage": pick("cpu_blocks_used") / cpu_blocks if cpu_blocks else np.zeros(len(t))}
    length = np.maximum(t - start, 1e-9)
    ends = s_t + st["duration_s"].to_numpy()
    # A step's tokens count in the interval where the step ends (vLLM counts them on output).
    lo, hi = np.searchsorted(ends, start, side="right"), np.searchsorted(ends, t, side="right")
    for col, name in (("num_prefill_tokens", "prompt_throughput_tps"),
                      ("num_decode_tokens", "generation_throughput_tps")):
        c = np.r_[0.0, np.cumsum(st[col].to_numpy().astype(np.float64))]
        out[name] = (c[hi] - c[lo]) / length
    pre = np.sort(events.filter(pl.col("kind").str.starts_with("preempt_"))["t_s"].to_numpy())
    out["preemptions"] = (np.searchsorted(pre, t, side="right")
                          - np.searchsorted(pre, start, side="right")).astype(np.float64)
    return pl.DataFrame(out)


def metric_error(log: np.ndarray, rep: np.ndarray) -> MetricError:
    """MAE, relative error (MAE / mean |logged|), bias and means over the windows where logged is known."""
    ok = ~np.isnan(log)
    log, rep = log[ok], rep[ok]
    if len(log) == 0:
        return MetricError(n=0, log_mean=None, replay_mean=None, mae=None, relative_error=None, bias=None)
    mae = float(np.mean(np.abs(rep - log)))
    scale = float(np.mean(np.abs(log)))
    return MetricError(n=int(len(log)), log_mean=float(log.mean()), replay_mean=float(rep.mean()),
                       mae=mae, relative_error=mae / scale if scale > 0 else None,
                       bias=float(np.mean(rep - log)))


def _latency(client: float | None, replay: float | None) -> LatencyError:
    err = None if client is None or replay is None else replay - client
    rel = err / client if err is not None and client else None
    return LatencyError(client=client, replay=replay, error=err, relative_error=rel)


def validate(db: Path, run_id: str, *, offset_s: float = 0.0, source: str | None = None,
             engine: int = 0, client: str | None = None) -> Validation:
    run_t = read_run(db, run_id)
    ev = read_evidence(db, "log_stats", "client_tokens")
    stats, source = _log_series(ev["log_stats"], source, engine)
    run = run_t["runs"].row(0, named=True)
    t0 = float(stats["epoch_s"][0]) + offset_s
    default = DEFAULT_INTERVAL_S[stats["era"][0]]
    t = stats["epoch_s"].to_numpy() - t0
    start = t - stats["interval_s"].fill_null(default).to_numpy()
    sim = float(run["sim_seconds"] or 0.0)
    keep = (t >= 0) & (start <= sim)
    if not keep.any():
        raise ValueError(f"the log ({source}) and the replay ({sim:.0f} s) do not overlap with "
                         f"--offset-s {offset_s:g}")
    logged = stats.filter(pl.Series(keep))
    rep = resample(run_t["steps"], run_t["events"], run, t[keep], start[keep])
    metrics, series = {}, []
    for m in GAUGES + COUNTERS:
        col = "preemptions_est" if m == "preemptions" else m
        lv = logged[col].cast(pl.Float64).fill_null(np.nan).to_numpy()
        rv = rep[m].to_numpy()
        metrics[m] = metric_error(lv, rv)
        series.append(pl.DataFrame({"t_s": t[keep], "metric": m, "log": lv, "replay": rv}))
    tok = ev["client_tokens"]
    if client:
        tok = tok.filter(pl.col("source_file") == client)
    ttft = tok.filter(pl.col("token_index") == 0)["ttft_s"].to_numpy()
    itl = tok["itl_s"].drop_nulls().to_numpy()
    lat = request_latencies(run_t["requests"]).filter(pl.col("status") == "finished")
    tbt = run_t["tbt"]
    r_ttft, r_tbt, r_w = lat["ttft_s"].to_numpy(), tbt["tbt_s"].to_numpy(), tbt["weight"].to_numpy()
    latency = {}
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        latency[f"ttft_{name}_s"] = _latency(nearest_rank(ttft, q), nearest_rank(r_ttft, q))
        latency[f"tbt_{name}_s"] = _latency(nearest_rank(itl, q), nearest_rank(r_tbt, q, r_w))
    return Validation(run_id=run_id, db=str(db), source=source, engine=engine, offset_s=offset_s,
                      log_start=str(stats["time"][0]), intervals=int(keep.sum()), metrics=metrics,
                      latency=latency, series=pl.concat(series))
