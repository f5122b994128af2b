"""The charts of production evidence (TBT spike attribution; replay vs. Prometheus); their report
sections are in capacity.report.sections.

Series are aggregated before charting (at most MAX_ROWS marks). Altair lives here and in
charts/report only; no SQL here (callers pass the `Attribution` from capacity.evidence.attribute).
"""
from __future__ import annotations

import altair as alt
import polars as pl

from capacity.evidence.attribute import NOT_PREEMPTION, VERDICTS, Attribution
from capacity.evidence.promvalidate import ProductionComparison

MAX_ROWS = 5000
_COLORS = {"preemption": "#d62728", "likely preemption": "#ff7f0e", NOT_PREEMPTION: "#1f77b4",
           "no server log at this time": "#7f7f7f"}


def spikes_for_chart(table: pl.DataFrame, max_rows: int = MAX_ROWS) -> pl.DataFrame:
    """One row per spike, or per (second, verdict) with the largest ITL when there are too many."""
    df = table.select("spike_time", "itl_s", "verdict", pl.col("mode").fill_null("-"))
    if df.height <= max_rows:
        return df
    step = 1
    while True:
        agg = (df.with_columns(spike_time=pl.col("spike_time").dt.truncate(f"{step}s"))
               .group_by("spike_time", "verdict")
               .agg(pl.col("itl_s").max(), pl.col("mode").mode().first()))
        if agg.height <= max_rows:
            return agg.sort("spike_time")
        step *= 2


def attribution_chart(a: Attribution) -> alt.Chart:
    df = spikes_for_chart(a.table)
    scale = alt.Scale(domain=list(VERDICTS), range=[_COLORS[v] for v in VERDICTS])
    points = alt.Chart(df).mark_point(filled=True, size=60).encode(
        x=alt.X("spike_time:T", title="time of the stalled token"),
        y=alt.Y("itl_s:Q", title="inter-token latency (s)"),
        color=alt.Color("verdict:N", scale=scale, title=None, legend=alt.Legend(orient="bottom")),
        shape=alt.Shape("mode:N", title="mode"),
        tooltip=["spike_time:T", "itl_s:Q", "verdict:N", "mode:N"])
    rule = alt.Chart(pl.DataFrame({"y": [a.threshold_s]})).mark_rule(strokeDash=[4, 4], color="#555").encode(y="y:Q")
    return (points + rule).properties(width=820, height=260,
                                      title=f"TBT spikes above {a.threshold_s:.3f} s and their cause")


PRODUCTION_METRICS = ("running", "waiting", "gpu_kv_usage", "preemptions", "generation_throughput_tps",
                      "ttft_p99_s", "itl_p99_s")


def production_chart(c: ProductionComparison, metrics: tuple[str, ...] = PRODUCTION_METRICS) -> alt.Chart:
    """Production (Prometheus) and replay per window, one panel per metric; red: where they part ways."""
    keep = [m for m in metrics if m in c.metrics]
    s = (c.series.filter(pl.col("metric").is_in(keep))
         .unpivot(index=["t_s", "metric", "flagged"], on=["production", "replay"], variable_name="source")
         .head(MAX_ROWS))
    base = alt.Chart().encode(x=alt.X("t_s:Q", title="seconds from the replay's start"),
                              y=alt.Y("value:Q", title=None))
    lines = base.mark_line(interpolate="step-before").encode(
        color=alt.Color("source:N", title=None, scale=alt.Scale(domain=["production", "replay"],
                                                                range=["#1f77b4", "#ff7f0e"])))
    flags = base.mark_point(color="#d62728", size=50, filled=True).transform_filter(
        "datum.flagged && datum.source == 'production'")
    return alt.layer(lines, flags, data=s).properties(width=380, height=150).facet(
        facet=alt.Facet("metric:N", title=None, sort=keep), columns=2,
    ).resolve_scale(y="independent").properties(
        title=f"Replay {c.run_id} vs. Prometheus {c.server} (engine {c.engine or '-'}); red: parts ways")
