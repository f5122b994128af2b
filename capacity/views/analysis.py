"""Charts of the tuning / preemption-budget / headroom / stall / priority analyses (Altair).

Pure functions: analysis result -> chart, each from a small aggregated frame (never raw steps).
Shares the look of capacity/charts.py. Must not replay anything, nor import duckdb or torch.
"""
from __future__ import annotations

import altair as alt
import polars as pl

from capacity.views.charts import COLORS, HEIGHT, WIDTH, _style

MAX_POINTS = 4000


def _slo_rule(value: float | None, label: str):
    """A dashed horizontal SLO line with its label (None: nothing)."""
    if value is None or value != value or value == float("inf"):
        return None
    d = pl.DataFrame({"y": [value], "label": [label]})
    rule = alt.Chart(d).mark_rule(strokeDash=[5, 4], color="#555").encode(y="y:Q")
    txt = alt.Chart(d).mark_text(align="left", dx=4, dy=-6, color="#555", fontSize=10).encode(
        y="y:Q", text="label:N", x=alt.value(0))
    return rule + txt


def _with_slo(chart, value, label):
    rule = _slo_rule(value, label)
    return chart if rule is None else chart + rule


def tuning_frontier(table: pl.DataFrame, recommended: int | None, *, slo_ttft_p99_s=None,
                    slo_tbt_p99_s=None):
    """P99 TTFT and TBT against max_num_seqs with the SLO lines; colour = the verdict."""
    t = table.select("max_num_seqs", "max_num_batched_tokens", "goodput_rps", "tbt_p99_s",
                     "ttft_p99_s", "feasible", "margin_rate_scale").with_columns(
        pl.col("goodput_rps", "tbt_p99_s", "ttft_p99_s", "margin_rate_scale").cast(pl.Float64)).with_columns(
        choice=pl.when(pl.col("max_num_seqs") == (recommended if recommended is not None else -1))
        .then(pl.lit("recommended"))
        .when(pl.col("feasible")).then(pl.lit("meets SLO + budget"))
        .otherwise(pl.lit("breaks SLO or budget")))
    base = alt.Chart(t).encode(x=alt.X("max_num_seqs:Q", scale=alt.Scale(type="log", base=2),
                                       title="--max-num-seqs"))
    dom = ["recommended", "meets SLO + budget", "breaks SLO or budget"]
    rng = [COLORS["recommended"], "#4c78a8", "#e45756"]
    color = alt.Color("choice:N", scale=alt.Scale(domain=dom, range=rng), title=None,
                      legend=alt.Legend(orient="bottom"))
    tip = ["max_num_seqs", "goodput_rps", "ttft_p99_s", "tbt_p99_s", "margin_rate_scale"]

    def panel(col, title, slo):
        ch = (base.mark_line(color="#999").encode(y=alt.Y(f"{col}:Q", title=title))
              + base.mark_point(size=90, filled=True).encode(y=f"{col}:Q", color=color, tooltip=tip))
        return _with_slo(ch, slo, "SLO").properties(width=WIDTH // 2 - 40, height=HEIGHT,
                                                    title=f"{title} by --max-num-seqs")
    return _style(alt.hconcat(panel("ttft_p99_s", "P99 TTFT (s)", slo_ttft_p99_s),
                              panel("tbt_p99_s", "P99 TBT (s)", slo_tbt_p99_s)))


def preemption_windows(per_window: pl.DataFrame, window_s: float, verdict: str):
    """Arrivals and preemptions per window: are preemptions confined to the peaks?"""
    t = per_window.select("t_s", "arrivals", "preemptions").with_columns(minute=pl.col("t_s") / 60)
    if t.height > MAX_POINTS:
        t = t.gather_every(t.height // MAX_POINTS + 1)
    base = alt.Chart(t).encode(x=alt.X("minute:Q", title="time (min)"))
    arr = base.mark_area(color="#4c78a8", opacity=0.35).encode(
        y=alt.Y("arrivals:Q", title=f"arrivals per {window_s:g} s"))
    pre = base.mark_bar(color=COLORS["peak"]).encode(
        y=alt.Y("preemptions:Q", title=f"preemptions per {window_s:g} s"))
    return _style(alt.layer(arr, pre).resolve_scale(y="independent").properties(
        width=WIDTH, height=HEIGHT, title=alt.Title("Preemptions against load",
                                                    subtitle=f"verdict: {verdict}")))


def headroom_curve(table: pl.DataFrame, *, slo_ttft_p99_s=None, slo_tbt_p99_s=None):
    """The metrics that break as load grows: P99 TTFT and TBT against the rate scale of each
    searched replay, with the SLO lines; colour = within SLOs and budget (and keeping up)."""
    t = (table.filter(~pl.col("surge"))
         .select("rate_scale", "ttft_p99_s", "tbt_p99_s", "ok", "breaks")
         .with_columns(pl.col("ttft_p99_s", "tbt_p99_s").cast(pl.Float64))
         .with_columns(verdict=pl.when(pl.col("ok")).then(pl.lit("within SLOs and budget"))
                       .otherwise(pl.lit("breaks")))
         .sort("rate_scale"))
    base = alt.Chart(t).encode(x=alt.X("rate_scale:Q", title="× today's request rate",
                                       scale=alt.Scale(zero=False)))
    color = alt.Color("verdict:N", title=None, legend=alt.Legend(orient="bottom"),
                      scale=alt.Scale(domain=["within SLOs and budget", "breaks"],
                                      range=[COLORS["recommended"], COLORS["peak"]]))

    def panel(col, title, slo):
        ch = (base.mark_line(color="#999").encode(y=alt.Y(f"{col}:Q", title=title,
                                                            scale=alt.Scale(type="log")))
              + base.mark_point(size=80, filled=True).encode(
                  y=f"{col}:Q", color=color, tooltip=["rate_scale", col, "breaks"]))
        return _with_slo(ch, slo, "SLO").properties(width=WIDTH // 2 - 40, height=HEIGHT,
                                                    title=f"{title} as load grows")
    return _style(alt.hconcat(panel("ttft_p99_s", "P99 TTFT (s)", slo_ttft_p99_s),
                              panel("tbt_p99_s", "P99 TBT (s)", slo_tbt_p99_s)))


def stall_timeline(stalls: pl.DataFrame, slow_steps: pl.DataFrame, threshold_s: float):
    """TBT spikes over time: preemption stalls by mode, and slow steps without a preemption."""
    a = stalls.select(t=pl.col("preempted_s") / 60, tbt_s=pl.col("stall_s"),
                      cause=pl.concat_str(pl.lit("preemption ("), pl.col("mode"), pl.lit(")")))
    b = slow_steps.select(t=pl.col("start_s") / 60, tbt_s=pl.col("duration_s"),
                          cause=pl.lit("slow step, no preemption"))
    t = pl.concat([a, b])
    if t.height > MAX_POINTS:
        t = t.sort("tbt_s", descending=True).head(MAX_POINTS)
    dom = ["preemption (recompute)", "preemption (swap)", "slow step, no preemption"]
    pts = alt.Chart(t).mark_point(filled=True, opacity=0.6).encode(
        x=alt.X("t:Q", title="time (min)"),
        y=alt.Y("tbt_s:Q", title="TBT sample (s)", scale=alt.Scale(type="log")),
        color=alt.Color("cause:N", scale=alt.Scale(domain=dom, range=[
            COLORS["recompute"], COLORS["swap"], "#9d9d9d"]), title=None))
    rule = alt.Chart(pl.DataFrame({"y": [threshold_s]})).mark_rule(strokeDash=[4, 4]).encode(y="y:Q")
    return _style((pts + rule).properties(width=WIDTH, height=HEIGHT,
                                          title="TBT spikes: preemption stalls vs. slow steps"))


def priority_classes(by_class: pl.DataFrame):
    """TTFT p99 and preemptions per class and variant."""
    t = by_class.with_columns(cls=pl.concat_str(pl.lit("priority "), pl.col("priority").cast(pl.Utf8),
                                                pl.lit(" "), pl.col("tenant").fill_null("")))
    bars = alt.Chart(t).mark_bar().encode(
        x=alt.X("variant:N", title=None), y=alt.Y("ttft_p99_s:Q", title="TTFT p99 (s)"),
        color=alt.Color("variant:N", title=None), column=alt.Column("cls:N", title=None))
    return _style(bars.properties(width=220, height=HEIGHT, title="Who pays: TTFT p99 by class"))
