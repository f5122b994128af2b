"""The `--kv-offloading-size` curve (capacity.analyses.offload.OffloadSizing) as an Altair chart.

Two panels over the swept sizes (a symlog axis, so 0 = no connector sits at the left edge): the
prefill tokens the GPU computes beside the prompt tokens that hit the CPU tier, then TTFT p50/p99
and TBT p99; the recommended size (the knee) as a dashed rule, and where the tier would pin 40% /
70% of the host RAM (kvcap's warning / error thresholds) when the host RAM is known.
Rendering is the caller's job (the report, a notebook with the png/svg renderer).
"""
from __future__ import annotations

import altair as alt
import polars as pl

from capacity.views.charts import COLORS, HEIGHT, WIDTH, _style
from capacity.analyses.offload import SWAP_RAM_ERROR_FRACTION, SWAP_RAM_WARN_FRACTION

TOKEN_SERIES = ("prefill computed by the GPU", "prompt tokens from the CPU tier")
LATENCY_SERIES = ("TTFT p50", "TTFT p99", "TBT p99")
SERIES_COLORS = {"prefill computed by the GPU": COLORS["running"],
                 "prompt tokens from the CPU tier": COLORS["recommended"],
                 "TTFT p50": "#9ecae9", "TTFT p99": COLORS["running"], "TBT p99": COLORS["waiting"]}


def curve_frame(sizing) -> pl.DataFrame:
    """Long form: size, series, value (tokens or seconds), panel."""
    rows = []
    for p in sizing.points:
        for name, v, panel in ((TOKEN_SERIES[0], p.prefill_tokens, "tokens"),
                               (TOKEN_SERIES[1], p.cpu_hit_tokens, "tokens"),
                               ("TTFT p50", p.ttft_p50_s, "latency"),
                               ("TTFT p99", p.ttft_p99_s, "latency"),
                               ("TBT p99", p.tbt_p99_s, "latency")):
            if v is not None:
                rows.append({"size_gib": p.kv_offloading_size_gib, "series": name,
                             "value": float(v), "panel": panel})
    return pl.DataFrame(rows, schema={"size_gib": pl.Float64, "series": pl.Utf8,
                                      "value": pl.Float64, "panel": pl.Utf8})


def _guides(sizing) -> alt.Chart:
    marks = [{"gib": sizing.recommended_kv_offloading_size_gib, "what": "recommended"}]
    if sizing.host_ram_total_gib:
        marks += [{"gib": SWAP_RAM_WARN_FRACTION * sizing.host_ram_total_gib, "what": "40% of host RAM"},
                  {"gib": SWAP_RAM_ERROR_FRACTION * sizing.host_ram_total_gib, "what": "70% of host RAM"}]
    top = max(p.kv_offloading_size_gib for p in sizing.points)
    marks = [m for m in marks if m["gib"] <= top * 1.05 or m["what"] == "recommended"]
    names = [m["what"] for m in marks]
    return alt.Chart(pl.DataFrame(marks)).mark_rule(strokeDash=[6, 3]).encode(
        x="gib:Q", color=alt.Color("what:N", title=None, scale=alt.Scale(
            domain=names, range=[{"recommended": COLORS["recommended"],
                                  "40% of host RAM": COLORS["waiting"]}.get(n, COLORS["peak"])
                                 for n in names])))


def offload_curve(sizing):
    """The sweep's curve with the knee; see the module docstring."""
    f = curve_frame(sizing)
    x = alt.X("size_gib:Q", title="--kv-offloading-size (GiB, all TP ranks)",
              scale=alt.Scale(type="symlog", constant=1))
    color = alt.Color("series:N", title=None, scale=alt.Scale(
        domain=list(SERIES_COLORS), range=list(SERIES_COLORS.values())))
    guides = _guides(sizing)
    tokens = alt.Chart(f.filter(pl.col("panel") == "tokens")).mark_line(point=True).encode(
        x=x, y=alt.Y("value:Q", title="tokens"), color=color,
        tooltip=["size_gib", "series", "value"])
    latency = alt.Chart(f.filter(pl.col("panel") == "latency")).mark_line(point=True).encode(
        x=x, y=alt.Y("value:Q", title="seconds"), color=color,
        tooltip=["size_gib", "series", "value"])
    sub = (f"{sizing.engine_words()}; recommended "
           f"{sizing.recommended_kv_offloading_size_gib:g} GiB: "
           + (f"the host-RAM cap binds (the knee, {sizing.knee.unconstrained_gib:g} GiB, cannot "
              f"be pinned)" if sizing.knee.unconstrained_gib is not None else
              f"the smallest size within {sizing.tolerance:.0%} of the best"))
    return _style(alt.vconcat(
        alt.layer(tokens, guides).properties(width=WIDTH, height=HEIGHT, title=alt.Title(
            "CPU KV offloading size sweep", subtitle=sub)),
        alt.layer(latency, guides).properties(width=WIDTH, height=HEIGHT * 0.8),
        spacing=8).resolve_scale(color="independent"))
