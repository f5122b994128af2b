"""What the notebooks (notebooks/*.ipynb) call that no other module offers as one call.

Owns: the notebook's trace from its parameters, replay-or-reuse against the DuckDB store (the run id
is a hash of trace content + config, so a stored run with that id *is* that replay), storing the
runs an analysis made, small key/value tables of the summaries, and Altair charts of the tables
`capacity.views.charts` does not chart (trace arrivals and lengths, stalls against step times, the tuning
frontier, headroom, priority classes, logged stats, replay vs. log). Notebooks stay thin (no
`def`, no loops): the logic is here and tested (tests/test_nbviews.py). Every chart aggregates
first and stays under `MAX_ROWS` rows. Never imported by the packages themselves.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import altair as alt
import numpy as np
import polars as pl

from capacity.views.charts import COLORS, HEIGHT, MAX_ROWS, WIDTH, bin_seconds, time_unit
from capacity.units import number
from replay.config import EngineConfig
from replay.results.store import SCHEMA as STORE_TABLES
from replay.results.store import list_runs, read_table, write_run
from replay.results.tables import RunResult
from replay.run import replay
from replay.run import run_id_for as replay_run_id
from traces.loaders import load_trace
from traces.synth import DEFAULT_SCENARIO, synthesize
from traces.transforms import time_window

LENGTH_BINS = 40
ARRIVAL_BINS = 150      # readable rate bars; the bin width grows with the trace


# ---- trace and runs -------------------------------------------------------------------------

def notebook_trace(trace_path: str | None = None, trace_format: str | None = None, *,
                   scenario: str = DEFAULT_SCENARIO, scenario_params: dict | None = None,
                   window_s: tuple[float, float] | None = None) -> pl.DataFrame:
    """The trace file at `trace_path` (format detected unless given), else the synthetic
    `scenario` with `scenario_params`; cut to `window_s` = (start, end) seconds when given."""
    if trace_path:
        trace = load_trace(trace_path, format=trace_format)
    else:
        trace = synthesize(scenario, **(scenario_params or {}))
    return time_window(trace, *window_s) if window_s else trace


def run_id_for(trace: pl.DataFrame, config: EngineConfig) -> str:
    """The run id `replay.run.replay` gives this trace and config."""
    return replay_run_id(trace, config)


def stored_run_ids(db: str | Path) -> set[str]:
    if not Path(db).exists():
        return set()
    runs = list_runs(db)
    return set(runs["run_id"].to_list()) if runs.height else set()


def read_run(db: str | Path, run_id: str) -> dict[str, pl.DataFrame]:
    """All tables of one stored run (the shape of `RunResult.tables()`)."""
    return {t: read_table(db, t, run_id) for t in STORE_TABLES}


def cached_replay(db: str | Path, trace: pl.DataFrame, config: EngineConfig, *, label: str = "",
                  trace_name: str = "", record_batches: bool = False) -> dict[str, pl.DataFrame]:
    """The run's tables from `db` when this replay is stored there (with its batches when
    `record_batches`), else replay, store, return."""
    run_id = run_id_for(trace, config)
    if run_id in stored_run_ids(db):
        tables = read_run(db, run_id)
        if not record_batches or tables["batches"].height or not tables["steps"].height:
            return tables
    res = replay(trace, config, label=label, trace_name=trace_name,
                 record_batches=record_batches)
    write_run(db, res.tables())
    return res.tables()


def runs_table(db: str | Path) -> pl.DataFrame:
    """The runs stored in `db` so far (empty when there is no file yet)."""
    return list_runs(db) if Path(db).exists() else pl.DataFrame()


def store_runs(db: str | Path, runs: list[RunResult]) -> pl.DataFrame:
    """Write every run an analysis made (`planner.runs`); the stored runs' ids and labels."""
    for r in runs:
        write_run(db, r.tables())
    return pl.DataFrame({"run_id": [r.run_id for r in runs], "label": [r.run["label"] for r in runs]},
                        schema={"run_id": pl.Utf8, "label": pl.Utf8})


def ingested_table(results) -> pl.DataFrame:
    """One row per file `capacity.evidence.logs.ingest` stored."""
    return pl.DataFrame([{k: v for k, v in r.as_dict().items() if k != "unparsed_lines"}
                         for r in results])


# ---- small tables ---------------------------------------------------------------------------

def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return number(v, digits=4) if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


class TextTable:
    """A table of formatted text that a notebook shows as plain HTML: numbers as numbers, no
    quotes and no dtype row (polars' own display quotes every string). Everything else is the
    polars frame's (`.frame`, indexing, `iter_rows`, ...)."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame

    def __getattr__(self, name):
        return getattr(self.frame, name)

    def __getitem__(self, key):
        return self.frame[key]

    def __repr__(self) -> str:
        return "\n".join(f"{a}: {b}" for a, b in self.frame.iter_rows())

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.frame.columns)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>"
                       for r in self.frame.iter_rows())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def kv_table(d: dict, keys: tuple[str, ...] | None = None) -> TextTable:
    """A dict (or dataclass) as a two-column table of text, nested dicts flattened with '.'."""
    if dataclasses.is_dataclass(d):
        d = {f.name: getattr(d, f.name) for f in dataclasses.fields(d)}
    flat: dict[str, object] = {}
    for k, v in d.items():
        if dataclasses.is_dataclass(v):
            v = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
        if isinstance(v, dict):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, (dict, list))})
        elif not isinstance(v, (list, tuple, pl.DataFrame)):
            flat[k] = v
    if keys is not None:
        flat = {k: flat.get(k) for k in keys}
    return TextTable(pl.DataFrame({"metric": list(flat), "value": [_fmt(v) for v in flat.values()]},
                                  schema={"metric": pl.Utf8, "value": pl.Utf8}))


TRACE_KEYS = ("requests", "duration_s", "mean_rps", "peak_rps", "peak_rpm", "peak_rpm_minute",
              "peak_60s", "peak_tokens_per_min", "prompt_tokens.p50", "prompt_tokens.p99",
              "prompt_tokens.max", "output_tokens.p50", "output_tokens.p99", "output_tokens.max")


def trace_table(info: dict) -> TextTable:
    """The headline numbers of `traces.stats.trace_info`."""
    return kv_table(info, TRACE_KEYS)


def prefix_table(info: dict) -> TextTable:
    """Prefix reuse of `trace_info`, or one row saying the trace carries no prefix hashes."""
    if not info.get("prefix"):
        return kv_table({"prefix reuse": "no prefix hashes in this trace (e.g. a Mooncake trace has them)"})
    return kv_table(info["prefix"])


# ---- chart helpers --------------------------------------------------------------------------

def _look(chart):
    return (chart.configure_axis(labelFontSize=11, titleFontSize=12, gridOpacity=0.4)
            .configure_title(fontSize=14, anchor="start", subtitleColor="#555")
            .configure_view(stroke=None).properties(background="white"))


def _title(text: str, subtitle: str = "") -> alt.Title:
    return alt.Title(text, subtitle=subtitle) if subtitle else alt.Title(text)


def _time_axis(duration_s: float) -> tuple[str, float]:
    unit, div = time_unit(duration_s)
    return f"time ({unit})", div


# ---- trace charts ---------------------------------------------------------------------------

def arrivals_frame(trace: pl.DataFrame, by: str | None = None) -> tuple[pl.DataFrame, int]:
    """Arrival rate (req/s) and token rate per bin, optionally per value of `by` (tenant...)."""
    dur = max(float(trace["arrival_s"].max() or 0.0), 1.0)
    bin_s = bin_seconds(dur, ARRIVAL_BINS)
    keys = ["bin"] + ([by] if by else [])
    agg = (trace.with_columns(bin=(pl.col("arrival_s") // bin_s).cast(pl.Int64),
                              tok=pl.col("prompt_tokens") + pl.col("output_tokens"))
           .group_by(keys).agg(n=pl.len(), tokens=pl.col("tok").sum()))
    grid = pl.DataFrame({"bin": np.arange(math.ceil(dur / bin_s) + 1, dtype=np.int64)})
    if by:
        grid = grid.join(trace.select(pl.col(by).cast(pl.Utf8).fill_null("-")).unique(), how="cross")
        agg = agg.with_columns(pl.col(by).cast(pl.Utf8).fill_null("-"))
    _, div = _time_axis(dur)
    out = (grid.join(agg, on=keys, how="left").fill_null(0)
           .with_columns(t=pl.col("bin") * bin_s / div, rps=pl.col("n") / bin_s,
                         tokens_per_s=pl.col("tokens") / bin_s).sort(keys))
    return out.drop("bin"), bin_s


def arrivals_chart(trace: pl.DataFrame, by: str | None = None):
    """Requests per second over time (stacked by `by` when given), above tokens per second."""
    frame, bin_s = arrivals_frame(trace, by)
    title, _ = _time_axis(max(float(trace["arrival_s"].max() or 0.0), 1.0))
    x = alt.X("t:Q", title=title, scale=alt.Scale(nice=False))
    enc = {"color": alt.Color(f"{by}:N", title=by)} if by else {}
    rate = alt.Chart(frame).mark_area(interpolate="step-after", opacity=0.8,
                                      **({} if by else {"color": COLORS["arrivals"]})).encode(
        x=x, y=alt.Y("rps:Q", title="arrivals (req/s)", stack=True), **enc,
    ).properties(width=WIDTH, height=HEIGHT,
                 title=_title("Arrival rate", f"mean per {bin_s} s bin"))
    tokens = alt.Chart(frame).mark_area(interpolate="step-after", opacity=0.6,
                                        **({} if by else {"color": COLORS["running"]})).encode(
        x=x, y=alt.Y("tokens_per_s:Q", title="prompt + output tokens/s", stack=True), **enc,
    ).properties(width=WIDTH, height=HEIGHT * 0.6)
    return _look(alt.vconcat(rate, tokens, spacing=8))


def lengths_frame(trace: pl.DataFrame, bins: int = LENGTH_BINS) -> pl.DataFrame:
    """Histogram of prompt and output lengths on log-spaced bins (`lo`, `hi`, `requests`)."""
    parts = []
    for col in ("prompt_tokens", "output_tokens"):
        v = trace[col].to_numpy().astype(np.float64)
        edges = np.unique(np.round(np.logspace(0, np.log10(max(v.max(), 2.0)) + 1e-9, bins + 1)))
        counts, _ = np.histogram(v, bins=edges)
        parts.append(pl.DataFrame({"length": col, "lo": edges[:-1], "hi": edges[1:],
                                   "requests": counts.astype(np.int64)}))
    return pl.concat(parts)


def lengths_chart(trace: pl.DataFrame):
    """Prompt and output length distributions (log x), side by side."""
    frame = lengths_frame(trace)
    return _look(alt.Chart(frame).mark_rect(color=COLORS["running"], stroke="white").encode(
        x=alt.X("lo:Q", title="tokens (log)", scale=alt.Scale(type="log")), x2="hi:Q",
        y=alt.Y("requests:Q", title="requests"), y2=alt.datum(0),
    ).properties(width=WIDTH / 2 - 30, height=HEIGHT).facet(
        column=alt.Column("length:N", title=None)).resolve_scale(x="independent").properties(
        title=_title("Length distributions", f"{trace.height:,} requests, log-spaced bins")))


# ---- stalls ---------------------------------------------------------------------------------

def stall_frames(tables: dict[str, pl.DataFrame], threshold_s: float,
                 ) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    """Per time bin: the longest step with decodes (what every decode token in it waited), and the
    longest preemption stall by mode (a stall is the TBT sample spanning a preemption)."""
    steps, stalls = tables["steps"], tables["stalls"]
    dur = max(float((steps["start_s"] + steps["duration_s"]).max() or 0.0) if steps.height else 0.0, 1.0)
    bin_s = bin_seconds(dur, MAX_ROWS // 4)
    title, div = _time_axis(dur)
    step = (steps.filter(pl.col("num_decode_tokens") > 0)
            .group_by(bin=(pl.col("start_s") // bin_s).cast(pl.Int64))
            .agg(step_s=pl.col("duration_s").max())
            .with_columns(t=pl.col("bin") * bin_s / div).sort("t"))
    st = (stalls.group_by(bin=(pl.col("resumed_s") // bin_s).cast(pl.Int64), mode=pl.col("mode"))
          .agg(stall_s=pl.col("stall_s").max(), stalls=pl.len())
          .with_columns(t=pl.col("bin") * bin_s / div, spike=pl.col("stall_s") > threshold_s)
          .sort("t"))
    return step.drop("bin"), st.drop("bin"), title


def stalls_chart(tables: dict[str, pl.DataFrame], threshold_s: float):
    """Preemption stalls (points, by mode) lined up with the longest decode step per bin (line):
    spikes above the threshold without a stall under them come from long steps, not preemption."""
    step, st, title = stall_frames(tables, threshold_s)
    x = alt.X("t:Q", title=title, scale=alt.Scale(nice=False))
    y = alt.Y("s:Q", title="TBT (s, log)", scale=alt.Scale(type="log"))
    line = alt.Chart(step.rename({"step_s": "s"})).mark_line(
        color=COLORS["arrivals"], interpolate="step-after").encode(x=x, y=y)
    names = ["recompute", "swap"]
    pts = alt.Chart(st.rename({"stall_s": "s"})).mark_point(filled=True, size=45).encode(
        x=x, y=y, color=alt.Color("mode:N", title="stall (mode)",
                                  scale=alt.Scale(domain=names, range=[COLORS[n] for n in names])),
        tooltip=["t:Q", "s:Q", "stalls:Q", "mode:N"])
    rule = alt.Chart(pl.DataFrame({"s": [threshold_s]})).mark_rule(
        color="#555", strokeDash=[4, 3]).encode(y="s:Q")
    return _look(alt.layer(line, pts, rule).properties(
        width=WIDTH, height=HEIGHT, title=_title(
            "Preemption stalls vs. TBT spikes",
            f"grey: longest decode step per bin; points: longest stall per bin; "
            f"dashed: spike threshold {threshold_s * 1000:.0f} ms")))


# ---- tuning and headroom --------------------------------------------------------------------

def tuning_chart(tuning):
    """The report's tuning chart (one chart per result, shared)."""
    from capacity.views.analysis import tuning_frontier
    rec = tuning.recommended.max_num_seqs if tuning.recommended else None
    return tuning_frontier(tuning.table(), rec, slo_ttft_p99_s=tuning.slo_ttft_p99_s,
                           slo_tbt_p99_s=tuning.slo_tbt_p99_s)


def headroom_chart(hr):
    """The report's headroom chart: P99 TTFT and TBT against the searched rate scales."""
    from capacity.views.analysis import headroom_curve
    return headroom_curve(hr.table(), slo_ttft_p99_s=hr.slo_ttft_p99_s,
                          slo_tbt_p99_s=hr.slo_tbt_p99_s)


# ---- priority -------------------------------------------------------------------------------

def priority_chart(inter):
    """P99 TTFT and preemptions per traffic class, for each variant of the interference study."""
    t = inter.by_class.with_columns(
        cls=pl.format("{} (priority {})", pl.col("tenant").fill_null("-"), pl.col("priority")))
    base = alt.Chart(t).encode(
        y=alt.Y("variant:N", title=None, sort=t["variant"].unique(maintain_order=True).to_list()),
        color=alt.Color("cls:N", title="class"), yOffset="cls:N")
    ttft = base.mark_bar().encode(x=alt.X("ttft_p99_s:Q", title="TTFT p99 (s)"))
    pre = base.mark_bar().encode(x=alt.X("preemptions:Q", title="preemptions"))
    return _look(alt.hconcat(ttft.properties(width=WIDTH / 2 - 60, height=HEIGHT),
                             pre.properties(width=WIDTH / 2 - 60, height=HEIGHT)).properties(
        title=_title("Who yields", "interactive vs batch, shared with preemption, shared "
                                   "queue-only, interactive alone")))


# ---- production evidence --------------------------------------------------------------------

def log_stats_chart(stats: pl.DataFrame, source: str | None = None):
    """Logged running / waiting / swapped requests and GPU KV usage over time (one server log)."""
    s = stats.filter(pl.col("source_file") == source) if source else stats
    s = s.filter(pl.col("engine") == s["engine"].min()).sort("epoch_s").tail(MAX_ROWS // 4)
    cols = [c for c in ("running", "waiting", "swapped") if c in s.columns and s[c].null_count() < s.height]
    q = s.select("time", *cols).unpivot(index="time", variable_name="queue", value_name="requests")
    top = alt.Chart(q).mark_line(interpolate="step-after").encode(
        x=alt.X("time:T", title="log time"), y=alt.Y("requests:Q", title="requests"),
        color=alt.Color("queue:N", title=None, scale=alt.Scale(
            domain=cols, range=[COLORS[c] for c in cols]))).properties(
        width=WIDTH, height=HEIGHT, title=_title("Logged engine stats",
                                                 f"{s.height} stats lines{f' of {source}' if source else ''}"))
    kv = alt.Chart(s.select("time", "gpu_kv_usage")).mark_area(
        color=COLORS["GPU KV"], opacity=0.6, interpolate="step-after").encode(
        x=alt.X("time:T", title="log time"),
        y=alt.Y("gpu_kv_usage:Q", title="GPU KV usage", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]))).properties(width=WIDTH, height=HEIGHT * 0.5)
    return _look(alt.vconcat(top, kv, spacing=8))


def validation_table(v) -> pl.DataFrame:
    """Error per metric of `capacity.evidence.validate.validate` (gauges, counters, latency percentiles)."""
    rows = [{"metric": k, "logged / client": m.log_mean, "replay": m.replay_mean, "MAE": m.mae,
             "relative error": m.relative_error} for k, m in v.metrics.items()]
    rows += [{"metric": k, "logged / client": m.client, "replay": m.replay,
              "MAE": None if m.error is None else abs(m.error), "relative error": m.relative_error}
             for k, m in v.latency.items()]
    return pl.DataFrame(rows, schema={"metric": pl.Utf8, "logged / client": pl.Float64,
                                      "replay": pl.Float64, "MAE": pl.Float64,
                                      "relative error": pl.Float64})


def production_table(c) -> pl.DataFrame:
    """Error per metric of `capacity.evidence.promvalidate.compare_prometheus`."""
    rows = [{"metric": k, "windows": m.n, "production": m.log_mean, "replay": m.replay_mean, "MAE": m.mae,
             "relative error": m.relative_error,
             "parts ways (windows)": sum(d.windows for d in c.divergences if d.metric == k)}
            for k, m in c.metrics.items()]
    return pl.DataFrame(rows, schema={"metric": pl.Utf8, "windows": pl.Int64, "production": pl.Float64,
                                      "replay": pl.Float64, "MAE": pl.Float64, "relative error": pl.Float64,
                                      "parts ways (windows)": pl.Int64})


def validation_chart(v, metrics: tuple[str, ...] = ("running", "waiting", "swapped", "gpu_kv_usage")):
    """Logged vs. replayed series per metric at the log's intervals."""
    s = (v.series.filter(pl.col("metric").is_in(list(metrics)))
         .unpivot(index=["t_s", "metric"], on=["log", "replay"], variable_name="source")
         .head(MAX_ROWS))
    return _look(alt.Chart(s).mark_line(interpolate="step-after").encode(
        x=alt.X("t_s:Q", title="seconds from the replay's start"), y=alt.Y("value:Q", title=None),
        color=alt.Color("source:N", title=None, scale=alt.Scale(
            domain=["log", "replay"], range=[COLORS["arrivals"], COLORS["running"]])),
    ).properties(width=WIDTH / 2 - 40, height=HEIGHT * 0.7).facet(
        facet=alt.Facet("metric:N", title=None, sort=list(metrics)), columns=2,
    ).resolve_scale(y="independent").properties(
        title=_title("Replay vs. production", f"run {v.run_id} against {v.source}")))
