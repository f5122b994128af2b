"""Altair charts of a run and its analyses: pure functions, polars frames in, `alt` charts out.

Owns the look of kvcap's charts (titles with units, axes, the small colour scheme) and the
aggregation that keeps every chart at most `MAX_ROWS` rows: time series are binned (the bin width
grows with the run), CDFs are evaluated at a fixed grid of quantiles (weighted for `tbt`).
Rendering to SVG/PNG/HTML is the report's job. This module and `capacity.report.render` are the only ones
that import altair; it must not import replay/, duckdb or torch, and it never replays anything.
"""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import polars as pl

from capacity.analyses.metrics import GIB, preemptions_per_minute
from capacity.units import seconds

MAX_ROWS = 5000          # Altair's default limit; every chart stays under it
MAX_BINS = 1200          # time bins per series (3 series x 1200 < MAX_ROWS)
CDF_POINTS = 600         # quantile grid of a CDF
MARKED_Q = (0.5, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0)   # always on the grid (exact there)
WIDTH, HEIGHT = 720, 200
NICE_BIN_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)

# One colour per meaning, used everywhere (Tableau 10 hues).
COLORS = {
    "arrivals": "#9d9d9d", "running": "#4c78a8", "waiting": "#f58518", "swapped": "#e45756",
    "GPU KV": "#4c78a8", "host KV": "#e45756",
    "recompute": "#4c78a8", "swap": "#e45756",
    "recompute+prefix-cache": "#54a24b", "queue-only": "#9d9d9d", "recompute+cpu-offload": "#b279a2",
    "recommended": "#54a24b", "peak": "#e45756",
}


def _scale(names: list[str]) -> alt.Scale:
    return alt.Scale(domain=names, range=[COLORS.get(n, "#b279a2") for n in names])


def _style(chart):
    """Shared look; call last (a configured chart cannot be composed any more)."""
    return (chart.configure_axis(labelFontSize=11, titleFontSize=12, grid=True, gridOpacity=0.4)
            .configure_title(fontSize=14, anchor="start", subtitleFontSize=11,
                             subtitleColor="#555")
            .configure_legend(labelFontSize=11, titleFontSize=11, orient="right")
            .configure_view(stroke=None)
            .properties(background="white"))


def time_unit(duration_s: float) -> tuple[str, float]:
    """Axis unit for a run of this length: seconds, minutes or hours."""
    if duration_s > 3 * 3600:
        return "h", 3600.0
    if duration_s > 1800:
        return "min", 60.0
    return "s", 1.0


def bin_seconds(duration_s: float, max_bins: int = MAX_BINS) -> int:
    """The smallest 'nice' bin width (s) that cuts `duration_s` into at most `max_bins` bins."""
    for b in NICE_BIN_S:
        if duration_s / b <= max_bins:
            return b
    return int(math.ceil(duration_s / max_bins / 3600) * 3600)


def _bins(frame: pl.DataFrame, t_col: str, bin_s: int) -> pl.DataFrame:
    return frame.with_columns(bin=(pl.col(t_col) // bin_s).cast(pl.Int64))


def _full_bins(duration_s: float, bin_s: int) -> pl.DataFrame:
    return pl.DataFrame({"bin": np.arange(max(1, math.ceil(duration_s / bin_s)), dtype=np.int64)})


def _time_x(duration_s: float, field: str = "t") -> alt.X:
    unit, _ = time_unit(duration_s)
    return alt.X(f"{field}:Q", title=f"simulated time ({unit})", scale=alt.Scale(nice=False, domainMin=0))


def _with_time(frame: pl.DataFrame, duration_s: float, bin_s: int) -> pl.DataFrame:
    """Bin start in the axis unit, column `t`."""
    _, div = time_unit(duration_s)
    return frame.with_columns(t=pl.col("bin") * bin_s / div)


# The step columns each chart reads: a report's own replays may keep their steps in spill
# files (replay/results/tables.py SpilledTable), read a column at a time.
QUEUE_COLUMNS = ("start_s", "duration_s", "num_running", "num_waiting", "num_swapped")
KV_COLUMNS = ("start_s", "duration_s", "gpu_blocks_used", "cpu_blocks_used")


def _run_seconds(steps: pl.DataFrame, sim_seconds: float | None) -> float:
    steps = steps.select("start_s", "duration_s")
    end = float((steps["start_s"] + steps["duration_s"]).max() or 0.0) if steps.height else 0.0
    return max(float(sim_seconds or 0.0), end, 1.0)


# ---- load and queues ------------------------------------------------------------------------

def load_frames(requests: pl.DataFrame, steps: pl.DataFrame, sim_seconds: float | None,
                ) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """Arrivals per second (mean rate per bin) and peak running / waiting / swapped per bin."""
    steps = steps.select(QUEUE_COLUMNS)
    dur = _run_seconds(steps, sim_seconds)
    bin_s = bin_seconds(dur)
    full = _full_bins(dur, bin_s)
    arr = (_bins(requests, "arrival_s", bin_s).group_by("bin").agg(n=pl.len())
           .join(full, on="bin", how="right").fill_null(0)
           .with_columns(rps=pl.col("n") / bin_s))
    q = (_bins(steps, "start_s", bin_s).group_by("bin")
         .agg(running=pl.col("num_running").max(), waiting=pl.col("num_waiting").max(),
              swapped=pl.col("num_swapped").max())
         .join(full, on="bin", how="right").fill_null(0)
         .unpivot(index="bin", on=["running", "waiting", "swapped"], variable_name="queue",
                  value_name="requests"))
    return (_with_time(arr, dur, bin_s).select("t", "rps").sort("t"),
            _with_time(q, dur, bin_s).select("t", "queue", "requests").sort("queue", "t"), bin_s)


def load_and_queues(requests: pl.DataFrame, steps: pl.DataFrame, sim_seconds: float | None):
    """Arrivals per second over time, above running / waiting / swapped requests over time."""
    steps = steps.select(QUEUE_COLUMNS)             # read once (spilled: from files)
    arr, q, bin_s = load_frames(requests, steps, sim_seconds)
    dur = _run_seconds(steps, sim_seconds)
    top = alt.Chart(arr).mark_area(color=COLORS["arrivals"], opacity=0.8,
                                   interpolate="step-after") \
        .encode(x=_time_x(dur), y=alt.Y("rps:Q", title="arrivals (req/s)")) \
        .properties(width=WIDTH, height=HEIGHT * 0.6,
                    title=alt.Title("Arrivals and queues",
                                    subtitle=f"arrival rate and peak queue lengths per {bin_s} s"))
    names = ["running", "waiting", "swapped"]
    bottom = alt.Chart(q).mark_line(interpolate="step-after", strokeWidth=1.4).encode(
        x=_time_x(dur), y=alt.Y("requests:Q", title="requests"),
        color=alt.Color("queue:N", scale=_scale(names), sort=names, title=None),
    ).properties(width=WIDTH, height=HEIGHT)
    return _style(alt.vconcat(top, bottom, spacing=8))


# ---- KV usage -------------------------------------------------------------------------------

def kv_usage_frame(steps: pl.DataFrame, run: dict) -> tuple[pl.DataFrame, int]:
    """Peak GPU / host KV usage per bin: fraction of the pool (`usage`) and host GiB."""
    steps = steps.select(KV_COLUMNS)
    dur = _run_seconds(steps, run.get("sim_seconds"))
    bin_s = bin_seconds(dur)
    gpu, cpu = max(1, run["num_gpu_blocks"]), run.get("num_cpu_blocks") or 0
    agg = (_bins(steps, "start_s", bin_s).group_by("bin")
           .agg(g=pl.col("gpu_blocks_used").max(), c=pl.col("cpu_blocks_used").max())
           .join(_full_bins(dur, bin_s), on="bin", how="right").fill_null(0)
           .with_columns(gpu_usage=pl.col("g") / gpu,
                         host_usage=(pl.col("c") / cpu) if cpu else pl.lit(None, pl.Float64),
                         host_gib=pl.col("c") * run["kv_bytes_per_block"] / GIB))
    return _with_time(agg, dur, bin_s).select("t", "gpu_usage", "host_usage", "host_gib") \
        .sort("t"), bin_s


def kv_usage(steps: pl.DataFrame, run: dict):
    """GPU and host KV pools in use over time (fraction of each pool), and host GiB."""
    steps = steps.select(KV_COLUMNS)                # read once (spilled: from files)
    frame, bin_s = kv_usage_frame(steps, run)
    dur = _run_seconds(steps, run.get("sim_seconds"))
    has_host = bool(run.get("num_cpu_blocks"))
    cols = {"gpu_usage": "GPU KV"} | ({"host_usage": "host KV"} if has_host else {})
    long = frame.select("t", *cols).rename(cols).unpivot(index="t", variable_name="pool",
                                                         value_name="usage")
    names = list(cols.values())
    sub = (f"peak per {bin_s} s; GPU pool {run['num_gpu_blocks']:,} blocks"
           + (f", host pool {run['num_cpu_blocks']:,} blocks" if has_host else ", no host pool"))
    usage = alt.Chart(long).mark_line(interpolate="step-after", strokeWidth=1.4).encode(
        x=_time_x(dur), y=alt.Y("usage:Q", title="KV blocks in use (fraction of pool)",
                                axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("pool:N", scale=_scale(names), title=None),
    ).properties(width=WIDTH, height=HEIGHT, title=alt.Title("KV cache usage", subtitle=sub))
    if not has_host:
        return _style(usage)
    gib = alt.Chart(frame.select("t", "host_gib")).mark_area(
        color=COLORS["host KV"], opacity=0.6, interpolate="step-after").encode(
        x=_time_x(dur), y=alt.Y("host_gib:Q", title="host KV (GiB per GPU)"),
    ).properties(width=WIDTH, height=HEIGHT * 0.6)
    return _style(alt.vconcat(usage, gib, spacing=8))


# ---- preemptions ----------------------------------------------------------------------------

def preemption_frame(events: pl.DataFrame, sim_seconds: float) -> tuple[pl.DataFrame, int]:
    """Preemptions per minute by mode, stacked (`y0`..`y1`, recompute below swap); minutes are
    merged (mean per minute over `per`-minute bins) when there are too many."""
    wide = preemptions_per_minute(events, sim_seconds)
    per = max(1, math.ceil(wide.height / (MAX_ROWS // 2 - 1)))
    wide = (wide.with_columns(minute=(pl.col("minute") // per) * per).group_by("minute")
            .agg(pl.col("recompute").sum() / per, pl.col("swap").sum() / per).sort("minute"))
    lo = wide.select("minute", mode=pl.lit("recompute"), y0=pl.lit(0.0),
                     y1=pl.col("recompute").cast(pl.Float64))
    hi = wide.select("minute", mode=pl.lit("swap"), y0=pl.col("recompute").cast(pl.Float64),
                     y1=(pl.col("recompute") + pl.col("swap")).cast(pl.Float64))
    return pl.concat([lo, hi]).with_columns(end=pl.col("minute") + per), per


def preemptions(events: pl.DataFrame, sim_seconds: float):
    """Preemptions per minute of simulated time, stacked by mode (recompute / swap)."""
    frame, per = preemption_frame(events, sim_seconds)
    kinds = events["kind"]
    n_re, n_sw = int((kinds == "preempt_recompute").sum()), int((kinds == "preempt_swap").sum())
    names = ["recompute", "swap"]
    sub = (f"{n_re:,} recompute + {n_sw:,} swap preemptions"
           + (f"; mean per minute over {per}-minute bins" if per > 1 else ""))
    return _style(alt.Chart(frame).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("minute:Q", title="simulated time (min)", axis=alt.Axis(format="d"), scale=alt.Scale(domainMin=0)),
        x2="end:Q",
        y=alt.Y("y0:Q", title="preemptions per minute"), y2="y1:Q",
        color=alt.Color("mode:N", scale=_scale(names), sort=names, title="mode"),
    ).properties(width=WIDTH, height=HEIGHT,
                 title=alt.Title("Preemptions per minute by mode", subtitle=sub)))


# ---- swap demand ----------------------------------------------------------------------------

def _cap_rows(frame: pl.DataFrame, t_col: str, max_rows: int) -> pl.DataFrame:
    """Merge consecutive rows (keeping each group's max) until at most `max_rows` remain."""
    if frame.height <= max_rows:
        return frame
    per = math.ceil(frame.height / max_rows)
    return (frame.with_row_index("_i").with_columns(_g=pl.col("_i") // per).group_by("_g")
            .agg(pl.col(t_col).first(), pl.exclude(t_col, "_i").max()).sort("_g")
            .drop("_g"))


def swapped_gib(demand: pl.DataFrame, *, recommended_gib: float, peak_gib: float,
                peak_at_s: float | None):
    """Concurrently swapped-out KV (GiB per GPU, peak per second) with the recommended size."""
    d = _cap_rows(demand.select("t_s", "gib"), "t_s", MAX_ROWS - 10)
    dur = max(float(d["t_s"].max() or 0.0) + 1.0, 1.0)
    unit, div = time_unit(dur)
    d = d.with_columns(t=pl.col("t_s") / div)
    x = _time_x(dur)
    area = alt.Chart(d).mark_area(color=COLORS["swapped"], opacity=0.55,
                                  interpolate="step-after").encode(
        x=x, y=alt.Y("gib:Q", title="swapped-out KV (GiB per GPU)"))
    rec = pl.DataFrame({"gib": [recommended_gib],
                        "label": [f"recommended {recommended_gib:g} GiB"]})
    rule = alt.Chart(rec).mark_rule(color=COLORS["recommended"], strokeDash=[6, 3],
                                    strokeWidth=2).encode(y="gib:Q")
    rule_text = alt.Chart(rec).mark_text(align="left", dx=4, dy=-7, color=COLORS["recommended"],
                                         fontWeight="bold").encode(
        x=alt.value(0), y="gib:Q", text="label:N")
    layers = [area, rule, rule_text]
    if peak_at_s is not None and peak_gib > 0:
        pk = pl.DataFrame({"t": [peak_at_s / div], "gib": [peak_gib],
                           "label": [f"peak {peak_gib:.2f} GiB at {peak_at_s:,.0f} s"]})
        layers += [alt.Chart(pk).mark_point(color=COLORS["peak"], size=60, filled=True)
                   .encode(x="t:Q", y="gib:Q"),
                   alt.Chart(pk).mark_text(align="left", dx=6, dy=10, color=COLORS["peak"])
                   .encode(x="t:Q", y="gib:Q", text="label:N")]
    return _style(alt.layer(*layers).properties(
        width=WIDTH, height=HEIGHT, title=alt.Title(
            "Concurrently swapped-out KV",
            subtitle="peak per second of the demand run (unbounded host pool); "
                     "dashed: recommended --swap-space")))


def sweep_frame(verifications) -> pl.DataFrame:
    """One row per host size replayed: fallbacks (recompute on full) or abort time (abort)."""
    rows = [{"swap_space_gib": v.swap_space_gib, "on_swap_full": v.on_swap_full,
             "status": v.status, "abort_s": v.abort_s,
             "swap_full_fallbacks": v.swap_full_fallbacks, "swap_full_events": v.swap_full_events}
            for v in verifications]
    return pl.DataFrame(rows, schema={"swap_space_gib": pl.Float64, "on_swap_full": pl.Utf8,
                                      "status": pl.Utf8, "abort_s": pl.Float64,
                                      "swap_full_fallbacks": pl.Int64,
                                      "swap_full_events": pl.Int64}).unique().sort(
        "on_swap_full", "swap_space_gib")


def host_size_sweep(verifications, *, recommended_gib: float, peak_gib: float):
    """Host size -> victims that fell back to recompute, and (abort mode) when the engine aborts."""
    f = sweep_frame(verifications)
    x = alt.X("swap_space_gib:Q", title="host swap space (GiB per GPU)")
    marks = pl.DataFrame({"gib": [peak_gib, recommended_gib],
                          "what": ["measured peak", "recommended"]})
    guides = alt.Chart(marks).mark_rule(strokeDash=[6, 3]).encode(
        x="gib:Q", color=alt.Color("what:N", title=None, scale=alt.Scale(
            domain=["measured peak", "recommended"],
            range=[COLORS["peak"], COLORS["recommended"]])))
    fb = f.filter(pl.col("on_swap_full") == "recompute")
    fall = alt.Chart(fb).mark_line(point=True, color=COLORS["running"]).encode(
        x=x, y=alt.Y("swap_full_fallbacks:Q", title="swap-full fallbacks (victims)"))
    panels = [alt.layer(fall, guides).properties(
        width=WIDTH, height=HEIGHT, title=alt.Title(
            "Host swap size sweep", subtitle="victims that found the host pool full and fell "
                                             "back to recompute (--on-swap-full recompute)"))]
    ab = f.filter((pl.col("on_swap_full") == "abort") & pl.col("abort_s").is_not_null())
    if ab.height:
        pts = alt.Chart(ab).mark_point(filled=True, size=70, color=COLORS["swapped"]).encode(
            x=x, y=alt.Y("abort_s:Q", title="engine abort time (s)"))
        panels.append(alt.layer(pts, guides).properties(
            width=WIDTH, height=HEIGHT * 0.6,
            title=alt.Title("", subtitle="abort mode: when the engine aborts for lack of "
                                         "CPU swap space")))
    return _style(alt.vconcat(*panels, spacing=8) if len(panels) > 1 else panels[0])


# ---- latency CDFs ---------------------------------------------------------------------------

def cdf_points(values, weights=None, n: int = CDF_POINTS) -> pl.DataFrame:
    """Nearest-rank quantiles at a grid of probabilities (linear, denser in the tail).

    Columns `value_s`, `fraction`; non-positive values are dropped (log axis)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones(len(v), dtype=np.int64) if weights is None else np.asarray(weights, np.int64)
    keep = ~np.isnan(v)
    v, w = v[keep], w[keep]
    if len(v) == 0 or w.sum() == 0:
        return pl.DataFrame({"value_s": [], "fraction": []},
                            schema={"value_s": pl.Float64, "fraction": pl.Float64})
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order])
    total = int(cw[-1])
    tail = 1.0 - np.logspace(-1, -4, n // 4)
    p = np.unique(np.concatenate([np.linspace(0, 1, n - n // 4 + 1)[1:], tail, MARKED_Q]))
    k = np.maximum(1, np.ceil(p * total - 1e-9)).astype(np.int64)
    vals = v[np.searchsorted(cw, k, "left")]
    out = pl.DataFrame({"value_s": vals, "fraction": p})
    return out.filter(pl.col("value_s") > 0).unique("value_s", keep="last").sort("value_s")


def _cdf_chart(points: pl.DataFrame, *, title: str, x_title: str, color: str, p99: float | None):
    line = alt.Chart(points).mark_line(interpolate="step-after", color=color).encode(
        x=alt.X("value_s:Q", title=x_title, scale=alt.Scale(type="log"),
                axis=alt.Axis(labelOverlap="greedy", labelSeparation=6)),
        y=alt.Y("fraction:Q", title="fraction of samples", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])))
    layers = [line]
    if p99 is not None and p99 > 0:
        m = pl.DataFrame({"value_s": [p99], "label": [f"p99 {_seconds(p99)}"]})
        layers += [alt.Chart(m).mark_rule(color="#555", strokeDash=[4, 3]).encode(x="value_s:Q"),
                   alt.Chart(m).mark_text(align="left", dx=4, y=HEIGHT + 28, color="#333").encode(
                       x="value_s:Q", text="label:N")]
    return _style(alt.layer(*layers).properties(width=WIDTH / 2 - 20, height=HEIGHT + 40,
                                                title=title))


def _seconds(x: float) -> str:
    return seconds(x)


def ttft_cdf(requests: pl.DataFrame, p99: float | None = None):
    """CDF of TTFT over finished requests (s, log x)."""
    fin = requests.filter(pl.col("status") == "finished")
    ttft = (fin["first_token_s"] - fin["arrival_s"]).to_numpy()
    return _cdf_chart(cdf_points(ttft), title="TTFT CDF (finished requests)",
                      x_title="time to first token (s, log)", color=COLORS["running"], p99=p99)


def tbt_cdf(tbt: pl.DataFrame, p99: float | None = None):
    """Fleet CDF of time between tokens over all output tokens (weighted samples; s, log x)."""
    pts = cdf_points(tbt["tbt_s"].to_numpy(), tbt["weight"].to_numpy())
    return _cdf_chart(pts, title="TBT CDF (all output tokens)",
                      x_title="time between tokens (s, log)", color=COLORS["waiting"], p99=p99)


# ---- mode comparison ------------------------------------------------------------------------

MODE_METRICS = (  # column, panel title
    ("ttft_p99_s", "TTFT p99 (s)"),
    ("max_tbt_p99_preempted_s", "preempted: max TBT p99 (s)"),
    ("recomputed_share", "recomputed prefill (%)"),
    ("swapped_gib", "swapped out (GiB)"),
)


def mode_metrics(table: pl.DataFrame) -> tuple:
    """MODE_METRICS, with V1's offloaded GiB in place of swapped GiB (V1 has no swap)."""
    if "recompute+cpu-offload" in table["variant"].to_list():
        return MODE_METRICS[:-1] + (("offloaded_gib", "written to the CPU tier (GiB)"),)
    return MODE_METRICS


def mode_frame(table: pl.DataFrame) -> pl.DataFrame:
    metrics = mode_metrics(table)
    cols = [c for c, _ in metrics]
    t = table.select("variant", *cols).with_columns(pl.col("recomputed_share") * 100)
    return t.unpivot(index="variant", on=cols, variable_name="metric", value_name="value") \
        .with_columns(pl.col("metric").replace(dict(metrics))).fill_null(0.0)


def mode_comparison(table: pl.DataFrame, recommended: str | None = None):
    """Grouped bars per variant: TTFT p99, preempted max-TBT p99, recomputed share, swapped GiB."""
    f = mode_frame(table)
    names = table["variant"].to_list()
    sub = f"recommended: {recommended}" if recommended else ""
    return _style(alt.Chart(f).mark_bar().encode(
        x=alt.X("variant:N", title=None, sort=names, axis=None),
        y=alt.Y("value:Q", title=None),
        color=alt.Color("variant:N", scale=_scale(names), sort=names, title="variant"),
    ).properties(width=140, height=HEIGHT).facet(
        column=alt.Column("metric:N", title=None, sort=[t for _, t in mode_metrics(table)],
                          header=alt.Header(labelFontSize=11, labelLimit=170)),
    ).resolve_scale(y="independent").properties(
        title=alt.Title("Preemption modes compared", subtitle=sub)))


# ---- checks ---------------------------------------------------------------------------------

def chart_rows(chart) -> int:
    """The most rows any one dataset of `chart` holds (what Altair's row limit is about)."""
    spec = chart.to_dict()
    sizes = [len(v) for v in spec.get("datasets", {}).values()]
    return max(sizes, default=0)
