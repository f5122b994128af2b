"""Replay vs. production from Prometheus (`kvcap validate --prometheus`): per window, the replay's
counters, gauges and latency quantiles against the `prom_windows` of one server and engine; the
error per metric, and the windows where the two part ways.

Alignment: replay time t (seconds from the first arrival) is production time (the server's first
sample) + offset_s + t. Each window is compared over exactly what its production value covers
(`from_s` .. `to_s`, see promseries): gauges (`last`) against the replay's state at `to_s` (its
latest step started by then, as vLLM sets its gauges each step); counters (`increase`, `rate_per_s`)
against the replay's preemptions and prefill / decode tokens in (`from_s`, `to_s`]; histogram
quantiles against the replay's observations of the same window put into the same buckets and read
with the same `histogram_quantile` (TTFT of the requests whose first token came then; ITL = the
duration of each step ending then, once per decode token in it), so bucket interpolation is no
source of error.
A window parts ways when |replay - production| > max(floor, rel_tol x |production|) (floors in
FLOOR); consecutive flagged windows of a metric form one `Divergence`.
Must not import altair.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from capacity.evidence.logs import read_evidence
from capacity.evidence.promseries import histogram_quantile
from capacity.evidence.validate import MetricError, metric_error, pick_one, read_run, resample

# comparison name -> (Prometheus metrics, first found wins; stat; what the replay gives)
PROM_METRICS = {
    "running": (("vllm:num_requests_running",), "last", "running"),
    "waiting": (("vllm:num_requests_waiting",), "last", "waiting"),
    "swapped": (("vllm:num_requests_swapped",), "last", "swapped"),
    "gpu_kv_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "last", "gpu_kv_usage"),
    "preemptions": (("vllm:num_preemptions_total",), "increase", "preemptions"),
    "prompt_throughput_tps": (("vllm:prompt_tokens_total",), "rate_per_s", "prompt_throughput_tps"),
    "generation_throughput_tps": (("vllm:generation_tokens_total",), "rate_per_s", "generation_throughput_tps"),
    "ttft_p50_s": (("vllm:time_to_first_token_seconds",), "p50", "ttft"),
    "ttft_p99_s": (("vllm:time_to_first_token_seconds",), "p99", "ttft"),
    "itl_p50_s": (("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "p50", "itl"),
    "itl_p99_s": (("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "p99", "itl"),
    # V1 CPU KV offloading (OffloadingConnector): bytes stored to / loaded from host memory
    "offload_store_bytes": (("vllm:kv_offload_store_bytes_total",), "increase", "offload_store_blocks"),
    "offload_load_bytes": (("vllm:kv_offload_load_bytes_total",), "increase", "offload_load_blocks"),
}
# Differences below these never flag a window (a request or two, 5 points of KV usage, ...).
FLOOR = {"running": 2.0, "waiting": 2.0, "swapped": 2.0, "gpu_kv_usage": 0.05, "preemptions": 2.0,
         "prompt_throughput_tps": 50.0, "generation_throughput_tps": 20.0, "ttft_p50_s": 0.01,
         "ttft_p99_s": 0.02, "itl_p50_s": 0.005, "itl_p99_s": 0.01,
         "offload_store_bytes": float(2 ** 26), "offload_load_bytes": float(2 ** 26)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    metric: str
    from_s: float            # production (epoch) seconds: the first flagged window's start of coverage
    to_s: float
    windows: int
    max_abs_error: float
    production_mean: float
    replay_mean: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ProductionComparison:
    run_id: str
    db: str
    server: str
    engine: str | None
    offset_s: float
    window_s: float
    start: str               # production time of replay t=0 - offset_s (the server's first sample)
    start_s: float           # the same, epoch seconds
    windows: int
    metrics: dict[str, MetricError]
    divergences: list[Divergence]
    series: pl.DataFrame | None = None   # t_s, metric, production, replay, flagged

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "series"}
        return d


def _pick(win: pl.DataFrame, server: str | None, engine: str | None) -> tuple[pl.DataFrame, str, str | None]:
    servers = sorted(set(win["server"].to_list()))
    if not servers:
        raise ValueError("no Prometheus windows in the DB; load scrapes or a query_range export with `kvcap logs`")
    server = pick_one(servers, server, what="Prometheus servers", flag="--server")
    w = win.filter(pl.col("server") == server)
    if w.height == 0:
        raise ValueError(f"--server {server}: not in the DB (servers: {', '.join(servers)})")
    engines = set(w["engine"].drop_nulls().to_list())
    if engines:
        if engine not in engines:
            raise ValueError(f"--engine {engine}: server {server} has engines {', '.join(sorted(engines))}")
        w = w.filter(pl.col("engine") == engine)
    else:
        engine = None        # V0 servers label no engine
    return w, server, engine


def _buckets(samples: pl.DataFrame, server: str, metric: str) -> np.ndarray:
    le = samples.filter((pl.col("server") == server) & (pl.col("metric") == metric) & (pl.col("part") == "bucket"))
    return np.sort(le["le"].unique().to_numpy())


def _replay_quantile(values: np.ndarray, weights: np.ndarray, le: np.ndarray, q: float) -> float | None:
    """The replay's observations through the production histogram's buckets."""
    if len(le) == 0 or len(values) == 0:
        return None
    idx = np.searchsorted(le, values, side="left")       # bucket i holds values <= le[i]
    counts = np.bincount(idx, weights=weights, minlength=len(le))[: len(le)]
    return histogram_quantile(q, list(le), list(np.cumsum(counts)))


def compare_prometheus(db: Path, run_id: str, *, server: str | None = None, engine: str | None = "0",
                       offset_s: float = 0.0, rel_tol: float = 0.25) -> ProductionComparison:
    """A stored replay (`run_id` in `db`) against the Prometheus windows in the same DB."""
    return compare_run(read_run(db, run_id), db, server=server, engine=engine, offset_s=offset_s,
                       rel_tol=rel_tol)


def compare_run(run_t: dict[str, pl.DataFrame], evidence_db: Path, *, server: str | None = None,
                engine: str | None = "0", offset_s: float = 0.0, rel_tol: float = 0.25) -> ProductionComparison:
    """A replay's tables (`runs`, `requests`, `steps`, `events`) against the Prometheus windows of
    `evidence_db` (the report compares its baseline replay without storing it there)."""
    db = evidence_db
    run_id = run_t["runs"]["run_id"][0]
    ev = read_evidence(db, "prom_windows", "prom_samples")
    win, server, engine = _pick(ev["prom_windows"], server, engine)
    run = run_t["runs"].row(0, named=True)
    t0 = float(win["to_s"].min()) + offset_s
    sim = float(run["sim_seconds"] or 0.0)
    lat = run_t["requests"].filter(pl.col("first_token_s").is_not_null())
    first_tok = lat["first_token_s"].to_numpy()
    ttft = first_tok - lat["arrival_s"].to_numpy()
    steps = run_t["steps"].filter(pl.col("num_decode_tokens") > 0)
    step_end = (steps["start_s"] + steps["duration_s"]).to_numpy()
    series, metrics = [], {}
    for name, (candidates, stat, what) in PROM_METRICS.items():
        metric = next((m for m in candidates if m in set(win["metric"].to_list())), None)
        if metric is None:
            continue
        w = win.filter((pl.col("metric") == metric) & (pl.col("stat") == stat) & pl.col("value").is_not_null())
        if what in ("ttft", "itl") and w["labels"].n_unique() > 1:
            # quantiles of two label sets do not add up; vLLM exports one histogram per engine
            raise ValueError(f"{server}: {metric} has {w['labels'].n_unique()} label sets on engine {engine} "
                             f"({', '.join(sorted(set(w['labels'].to_list()))[:3])}); load one server's series")
        w = w.group_by("window_start_s").agg(pl.col("value").sum(), pl.col("from_s").min(), pl.col("to_s").max())
        w = w.sort("window_start_s")
        frm = w["from_s"].fill_null(w["to_s"]).to_numpy() - t0
        to = w["to_s"].to_numpy() - t0
        keep = (to >= 0) & (frm <= sim)
        if not keep.any():
            continue
        frm, to, prod = frm[keep], to[keep], w["value"].to_numpy()[keep]
        if what in ("ttft", "itl"):
            le, q = _buckets(ev["prom_samples"], server, metric), float(stat[1:]) / 100
            if what == "ttft":
                obs = [(ttft[(first_tok > a) & (first_tok <= b)], None) for a, b in zip(frm, to)]
            else:
                obs = [(steps["duration_s"].to_numpy()[m], steps["num_decode_tokens"].to_numpy()[m].astype(float))
                       for m in ((step_end > a) & (step_end <= b) for a, b in zip(frm, to))]
            rep = np.array([np.nan if (v := _replay_quantile(o, np.ones(len(o)) if wt is None else wt, le, q)) is None
                            else v for o, wt in obs])
        elif what in ("offload_store_blocks", "offload_load_blocks"):
            # blocks moved by steps ending in the window, in bytes over all TP ranks (the connector
            # sums its workers' transfer stats)
            per_block = float(run["kv_bytes_per_block"] or 0) * int(run["tp"] or 1)
            rep = _step_sums(run_t["steps"], what, frm, to) * per_block
        else:
            rep = resample(run_t["steps"], run_t["events"], run, to, frm)[what].to_numpy()
        ok = ~np.isnan(rep)
        metrics[name] = metric_error(prod[ok], rep[ok])
        flagged = ok & (np.abs(rep - prod) > np.maximum(FLOOR[name], rel_tol * np.abs(prod)))
        series.append(pl.DataFrame({"t_s": to, "from_s": frm + t0, "to_s": to + t0, "metric": name,
                                    "production": prod, "replay": rep, "flagged": flagged}))
    if not series:
        raise ValueError(f"the Prometheus series of {server} and the replay ({sim:.0f} s) do not overlap "
                         f"with --offset-s {offset_s:g}, or it holds none of {', '.join(PROM_METRICS)}")
    s = pl.concat(series)
    start = datetime.fromtimestamp(t0 - offset_s, tz=timezone.utc).replace(tzinfo=None)
    return ProductionComparison(run_id=run_id, db=str(db), server=server, engine=engine, offset_s=offset_s,
                                window_s=float(win["window_s"][0]), start=str(start), start_s=t0 - offset_s,
                                windows=int(s.filter(pl.col("metric") == s["metric"][0]).height),
                                metrics=metrics, divergences=divergences(s), series=s)


def _step_sums(steps: pl.DataFrame, col: str, frm: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Per window, the sum of `col` over the steps that end in (frm, to]."""
    st = steps.with_columns(end=pl.col("start_s") + pl.col("duration_s")).sort("end")
    end = st["end"].to_numpy()
    c = np.r_[0.0, np.cumsum(st[col].fill_null(0).to_numpy().astype(np.float64))]
    return c[np.searchsorted(end, to, side="right")] - c[np.searchsorted(end, frm, side="right")]


def divergences(series: pl.DataFrame) -> list[Divergence]:
    """Runs of consecutive flagged windows, per metric."""
    out = []
    for (name,), g in series.sort("metric", "t_s").group_by("metric", maintain_order=True):
        f = g["flagged"].to_numpy()
        if not f.any():
            continue
        run_id = np.cumsum(np.r_[True, f[1:] != f[:-1]])
        for k in np.unique(run_id[f]):
            part = g.filter(pl.Series(run_id == k))
            err = (part["replay"] - part["production"]).abs()
            out.append(Divergence(metric=name, from_s=float(part["from_s"].min()), to_s=float(part["to_s"].max()),
                                  windows=part.height, max_abs_error=float(err.max()),
                                  production_mean=float(part["production"].mean()),
                                  replay_mean=float(part["replay"].mean())))
    return out
