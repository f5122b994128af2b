"""The self-contained HTML capacity report: `write_report(out_dir, ...) -> out_dir/index.html`.

Owns the report's layout (sections, tables, the flags block), its rendering (charts through
vl-convert: SVG embedded as data URIs in the HTML, one PNG per chart beside it) and
`summary.json`. The page loads nothing from the network: no scripts, no external CSS or fonts.
Later analyses add `Section`s through `extra_sections`; the body helpers (`text`, `table`,
`code_block`, `bullets`) escape what they are given. Charts come from `capacity.views.charts`; this
module, that one and the other chart modules (capacity.views.*) are the importers of altair. Must not replay anything, nor import duckdb
or torch.
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Iterable, Sequence

import altair as alt
import vl_convert as vlc

from capacity.views import charts
from capacity.analyses.modes import ModeComparison
from capacity.analyses.metrics import summary as run_summary
from capacity.analyses.flags import serve_lines
from capacity.analyses.sizing import SwapSizing
from capacity import units
from capacity.units import number
from capacity.report.ahead import Ahead
from replay.results.tables import RunResult
from traces import atomic

PNG_SCALE = 2
SVG_ZOOM = 1.25     # charts are drawn for ~900 px; the page is ~1150 px wide


@dataclass(frozen=True, slots=True)
class Figure:
    name: str            # file stem: out_dir/<name>.png; unique within a report
    chart: object        # a top-level Altair chart
    caption: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Section:
    title: str
    body: str = ""       # HTML, built with the helpers below (they escape their text)
    charts: tuple[Figure, ...] = ()
    anchor: str | None = None

    @property
    def id(self) -> str:
        return self.anchor or re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


# ---- body helpers (escape everything they are given) ----------------------------------------

def inline(s: str) -> str:
    """Escaped text; `backticks` become <code>."""
    parts = html.escape(s).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def text(s: str) -> str:
    """One paragraph (see `inline`)."""
    return f"<p>{inline(s)}</p>"


def bullets(items: Iterable[str]) -> str:
    items = list(items)
    return ("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>") if items else ""


def code_block(s: str) -> str:
    return f'<pre class="code"><code>{html.escape(s)}</code></pre>'


def table(rows: Sequence[Sequence[object]], header: Sequence[str] | None = None) -> str:
    """A plain table; cells are formatted with `fmt` and escaped."""
    head = ("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
            + "</tr></thead>") if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f'<div class="tbl"><table>{head}<tbody>{body}</tbody></table></div>'


def fmt(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        return (f"{v:,.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1
                else "0" if a == 0 else number(v))
    return str(v)


def seconds(v: float | None) -> str:
    if v is None:
        return "—"
    return units.seconds(v, missing="—", nbsp=True)    # no break before the unit


def pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.1%}"


def gib(v: float | None) -> str:
    return "—" if v is None else f"{v:,.2f}\u00a0GiB"


# ---- sections -------------------------------------------------------------------------------

def recommendations_section(rec, stab) -> Section:
    """The top of the report: one Recommendation (capacity.analyses.plan), in words and flags."""
    if rec.flags:
        # A configuration that still misses the SLOs is not advice to deploy: say so above it.
        misses = rec.verdict != "fits"
        intro = ("These flags reproduce the replay quoted here, which MISSES the SLOs or the "
                 "preemption budget: following them is not enough (the lines below say what "
                 "binds and how many replicas it takes):" if misses else
                 "Serve with these flags (set MODEL to your model; they reproduce the replay "
                 "whose numbers are quoted here):")
        block = text(intro) + code_block(serve_lines(rec.flags)) + (
            text("And leave these out of the deployment's flags (appending the flags above "
                 "does not undo them): " + " ".join(rec.drop_flags)) if rec.drop_flags else "")
    else:
        block = text("No flags: the run is overloaded, so no configuration is derived from it.")
    exp = rec.expected
    rows = []
    if exp is not None:
        rows = [["TTFT p99", seconds(exp.ttft_p99_s)], ["TBT p99 (fleet)", seconds(exp.tbt_p99_s)],
                ["preemptions", exp.preemptions], ["throughput", f"{exp.throughput_rps:,.2f} req/s"],
                ["requests within both SLOs", pct(exp.slo_share)],
                ["goodput", f"{exp.goodput_rps:,.2f} req/s"],
                ["preemption budget", "met" if exp.within_budget else "MISSED"],
                ["capacity per replica (SLOs and budget)", "—" if rec.capacity_rps is None
                 else f"{rec.capacity_rps:,.2f} req/s (×{rec.headroom_rate_scale:.2f} of today, "
                      f"precision {rec.precision:.0%})"]]
    body = (f'<p class="headline">{inline(rec.headline)}</p>' + block
            + (table(rows, ["with these flags", "value"]) if rows else "") + bullets(rec.lines))
    return Section(title="Recommendation", body=body, anchor="recommendations")


def stability_section(st) -> Section:
    rows = [["verdict", "sustainable" if st.sustainable else "overloaded"],
            ["offered rate", f"{st.offered_rps:,.2f} req/s"],
            ["served rate", f"{st.served_rps:,.2f} req/s"],
            ["requests still waiting at the last arrival", f"{st.backlog_requests:,} "
                                                            f"({st.backlog_share:.0%})"],
            ["trace span / simulated span", f"{seconds(st.trace_span_s)} / {seconds(st.sim_span_s)}"],
            ["TTFT trend (last fifth of arrivals / first fifth)",
             "—" if st.ttft_trend is None else f"×{st.ttft_trend:,.1f}"]]
    body = text(st.evidence + ".") + table(rows, ["baseline replay", "value"])
    return Section(title="Stability", body=body, anchor="stability")


def _stat_rows(d: dict) -> tuple[list[list], list[list]]:
    scalars, stats = [], []
    for k, v in d.items():
        if isinstance(v, dict) and {"mean", "p50", "p99"} <= set(v):
            stats.append([k] + [v.get(q) for q in ("mean", "p50", "p90", "p99", "max")])
        elif isinstance(v, dict):
            if v:
                scalars.append([k, ", ".join(f"{a}: {fmt(b)}" for a, b in v.items())])
        elif v is not None:
            scalars.append([k, v])
    return scalars, stats


# The Workload table in words, with units (trace_info keys; unknown keys are shown as they are).
WORKLOAD_WORDS = {
    "requests": ("requests", "{:,}"), "duration_s": ("arrival span", None),
    "mean_rps": ("mean arrival rate", "{:,.2f} req/s"), "mean_rpm": ("mean arrivals per minute", "{:,.0f}"),
    "peak_rpm": ("busiest minute", "{:,} requests"), "peak_rpm_minute": ("busiest minute starts at", "minute {:,}"),
    "peak_60s": ("busiest 60 s (sliding)", "{:,} requests"), "peak_rps": ("busiest second", "{:,} requests"),
    "peak_tokens_per_min": ("busiest minute, tokens", "{:,} tokens"),
    "peak_tokens_minute": ("busiest token minute starts at", "minute {:,}"),
    "priorities": ("requests per priority", None), "tenants": ("requests per tenant", None),
    "prefix": ("prefix reuse", None)}


def _workload_rows(d: dict) -> tuple[list[list], list[list]]:
    scalars, stats = _stat_rows(d)
    out = []
    for k, v in scalars:
        label, pattern = WORKLOAD_WORDS.get(k, (k, None))
        if k == "duration_s" and isinstance(v, (int, float)):
            v = seconds(float(v))
        elif pattern and isinstance(v, (int, float)):
            v = pattern.format(v)
        out.append([label, v])
    words = {"prompt_tokens": "prompt (tokens)", "output_tokens": "output (tokens)"}
    return out, [[words.get(r[0], r[0]), *r[1:]] for r in stats]


def workload_section(trace_summary: dict) -> Section:
    scalars, stats = _workload_rows(trace_summary)
    body = table(scalars, ["quantity", "value"])
    if stats:
        body += table(stats, ["length per request", "mean", "p50", "p90", "p99", "max"])
    return Section(title="Workload", body=body, anchor="workload")


CONFIG_KEYS = ("scheduler", "vllm_version", "model", "gpu", "tp", "block_size", "num_gpu_blocks",
               "num_cpu_blocks", "max_num_seqs", "max_num_batched_tokens", "preemption_mode",
               "swap_space_gib", "on_swap_full", "async_scheduling", "executor")


def engine_words(r: dict) -> str:
    """Which vLLM release, block size and loop a run replayed, in words."""
    from capacity.analyses.versions import run_engine_words
    return run_engine_words(r)


def baseline_metric_rows(s: dict) -> list[list]:
    return [
        ["status", s["status"] + (f" (aborted at {seconds(s['abort_s'])})"
                                  if s["abort_s"] is not None else "")],
        ["requests finished / rejected / aborted / unfinished",
         f"{s['requests_finished']:,} / {s['requests_rejected']:,} / "
         f"{s['requests_aborted']:,} / {s['requests_unfinished']:,}"],
        ["simulated duration", seconds(s["sim_seconds"])],
        ["throughput", f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:,.0f} tok/s"],
        ["TTFT p50 / p99", f"{seconds(s['ttft_p50_s'])} / {seconds(s['ttft_p99_s'])}"],
        ["TBT p50 / p99 (fleet)", f"{seconds(s['tbt_p50_s'])} / {seconds(s['tbt_p99_s'])}"],
        ["TPOT p50", seconds(s["tpot_p50_s"])],
        ["E2E p50", seconds(s["e2e_p50_s"])],
        *(_v1_host_rows(s) if s.get("scheduler") == "v1" else _v0_host_rows(s)),
        ["peak GPU KV usage", pct(s["peak_gpu_kv_usage"])],
    ]


def _v0_host_rows(s: dict) -> list[list]:
    return [["preemptions recompute / swap", f"{s['preemptions_recompute']:,} / "
                                             f"{s['preemptions_swap']:,}"],
            ["preempted requests", s["preempted_requests"]],
            ["swap-full events (fallbacks)", f"{s['swap_full_events']:,} "
                                             f"({s['swap_full_fallbacks']:,})"],
            ["peak swapped KV (per GPU)", gib(s["peak_swapped_gib"])]]


def _v1_host_rows(s: dict) -> list[list]:
    """V1 recomputes (no swap); its host tier is the CPU offloading connector."""
    return [["preemptions (recompute)", f"{s['preemptions_recompute']:,}"],
            ["preempted requests", s["preempted_requests"]],
            ["prompt tokens hit: GPU prefix cache / CPU tier",
             f"{s.get('gpu_hit_tokens', 0):,} / {s.get('cpu_hit_tokens', 0):,}"]]


def run_figures(run: RunResult, s: dict) -> dict[str, Figure]:
    """The charts of one replay alone (the baseline's and latency sections'): the ones a report
    can render as soon as its baseline is replayed (capacity/report/ahead.py)."""
    r, sim = run.run, run.run["sim_seconds"]
    return {"load_and_queues": Figure("load_and_queues",
                                      charts.load_and_queues(run.requests, run.steps, sim)),
            "kv_usage": Figure("kv_usage", charts.kv_usage(run.steps, r)),
            "preemptions_per_minute": Figure("preemptions_per_minute",
                                             charts.preemptions(run.events, sim)),
            "ttft_cdf": Figure("ttft_cdf", charts.ttft_cdf(run.requests, s["ttft_p99_s"])),
            "tbt_cdf": Figure("tbt_cdf", charts.tbt_cdf(run.tbt, s["tbt_p99_s"]))}


def baseline_section(run: RunResult, s: dict, figures: dict[str, Figure]) -> Section:
    """`figures`: `run_figures(run, s)`."""
    r = run.run
    cfg = [[k, r.get(k)] for k in CONFIG_KEYS if k in r]
    body = (text(f"Run `{run.run_id}`{' — ' + r['label'] if r.get('label') else ''}: the trace "
                 f"replayed once on {engine_words(r)}, under the configuration below.")
            + '<div class="cols">' + table(cfg, ["engine", "value"])
            + table(baseline_metric_rows(s), ["metric", "value"]) + "</div>")
    figs = (figures["load_and_queues"], figures["kv_usage"], figures["preemptions_per_minute"])
    return Section(title="Baseline run", body=body, charts=figs, anchor="baseline")


def verification_rows(sizing: SwapSizing) -> list[list]:
    roles = ([("verify", sizing.verify)] if sizing.verify else []) \
        + [("what-if", v) for v in sizing.what_if] + [("sweep", v) for v in sizing.sweep]
    return [[role, gib(v.swap_space_gib) + ("" if v.fraction_of_peak is None
                                            else f" ({v.fraction_of_peak:.0%} of the peak)"),
             v.num_cpu_blocks, v.on_swap_full, v.status,
             seconds(v.abort_s), v.swap_full_events, v.swap_full_fallbacks, v.preemptions_swap]
            for role, v in roles]


NOT_DERIVED = "Not derived: the baseline is overloaded (see Stability)."


def swap_section(sizing: SwapSizing | None) -> Section:
    if sizing is None:
        return Section(title="Swap sizing", anchor="swap-sizing", body=text(NOT_DERIVED))
    z = sizing
    nums = [["peak concurrently swapped-out KV (per GPU)", gib(z.peak_swapped_gib)],
            ["peak concurrently swapped-out requests", z.peak_swapped_requests],
            ["peak at", seconds(z.peak_at_s)],
            ["per-second peak p99 / p99.9", f"{gib(z.per_second_p99_gib)} / "
                                            f"{gib(z.per_second_p999_gib)}"],
            ["swap preemptions in the demand run", z.preemptions_swap],
            ["headroom", pct(z.headroom)],
            ["recommended --swap-space (V0, per GPU)", gib(z.recommended_swap_space_gib)],
            ["host RAM pinned (× TP)", gib(z.host_ram_gib)],
            ["host RAM verdict", z.host_ram_verdict]]
    if not z.needed:
        return Section(title="Swap sizing", anchor="swap-sizing", body=text(
            "Swap tier: not needed — the demand replay (swap mode, a host pool too large to "
            "fill) never swapped a request out at this load."))
    body = (text("What a swap tier would need; whether to use one is the Recommendation's call "
                 "(the preemption-mode comparison below).")
            + text("Demand: the trace replayed in swap mode with a host pool too large to fill; "
                 "the peak of the KV bytes of all requests swapped out at the same moment sets "
                 "the size. Each size below was then replayed to check it.")
            + table(nums, ["quantity", "value"]))
    rows = verification_rows(z)
    if rows:
        body += table(rows, ["replay", "host size", "CPU blocks", "on swap full", "status",
                             "abort at", "swap-full events", "fallbacks", "swap preemptions"])
    figs = []
    if z.demand is not None and z.demand.height:
        figs.append(Figure("swapped_gib", charts.swapped_gib(
            z.demand, recommended_gib=z.recommended_swap_space_gib,
            peak_gib=z.peak_swapped_gib, peak_at_s=z.peak_at_s)))
    if z.sweep:
        figs.append(Figure("host_size_sweep", charts.host_size_sweep(
            [*z.sweep, *z.what_if], recommended_gib=z.recommended_swap_space_gib,
            peak_gib=z.peak_swapped_gib)))
    return Section(title="Swap sizing", body=body, charts=tuple(figs), anchor="swap-sizing")


def mode_rows(modes: ModeComparison) -> list[list]:
    moved = (lambda m: gib(m.offloaded_gib)) if modes.scheduler == "v1" else (lambda m: gib(m.swapped_gib))
    return [[m.variant, m.status, gib(m.host_tier_gib) if m.host_tier_gib else "—", m.preemptions,
             m.preempted_requests, pct(m.recomputed_share), f"{m.cpu_hit_tokens:,}",
             moved(m), seconds(m.host_link_s), seconds(m.ttft_p99_s),
             seconds(m.tbt_p99_s), seconds(m.max_tbt_p99_preempted_s),
             seconds(m.high_priority_ttft_p99_s), f"{m.throughput_rps:.2f}"]
            for m in modes.results]


def modes_section(modes: ModeComparison | None) -> Section:
    if modes is None:
        return Section(title="Preemption modes", anchor="modes", body=text(NOT_DERIVED))
    v1 = modes.scheduler == "v1"
    body = (text(f"Each variant replayed on {modes.engine_words()}"
                 + (" (V1 has no swap: its host tier is CPU offloading)." if v1 else "."))
            + text(f"Recommended: {modes.recommended} — {modes.reason}.")
            + (text(modes.queue_only_note + ".") if modes.queue_only_note else "")
            + table(mode_rows(modes), ["variant", "status", "host tier", "preemptions",
                                       "preempted requests", "recomputed prefill",
                                       "CPU-hit tokens", "offloaded" if v1 else "swapped",
                                       "host-link time",
                                       "TTFT p99", "TBT p99", "preempted max TBT p99",
                                       "high-priority TTFT p99", "throughput (req/s)"]))
    fig = Figure("mode_comparison", charts.mode_comparison(modes.table(), modes.recommended))
    return Section(title="Preemption modes", body=body, charts=(fig,), anchor="modes")


def latency_section(figures: dict[str, Figure]) -> Section:
    """`figures`: `run_figures(run, s)`."""
    body = text("TTFT over finished requests; TBT over every output token of the run (the "
                "fleet distribution a Grafana panel of inter-token latency shows). "
                "Percentiles are nearest-rank.")
    figs = (figures["ttft_cdf"], figures["tbt_cdf"])
    return Section(title="Latency", body=body, charts=figs, anchor="latency")


# ---- rendering ------------------------------------------------------------------------------

def _vl_version() -> str | None:
    v = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return v if v in vlc.get_vegalite_versions() else None


def render_chart(chart) -> tuple[str, bytes]:
    """(SVG text, PNG bytes) of a chart, offline through vl-convert."""
    svg = vlc.vegalite_to_svg(chart.to_dict(), vl_version=_vl_version())
    return svg, vlc.svg_to_png(svg, scale=PNG_SCALE)     # same pixels, no second Vega run


def _svg_width(svg: str) -> float | None:
    m = re.search(r'<svg[^>]*\bwidth="([0-9.]+)', svg)
    return float(m.group(1)) if m else None


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;
 max-width:1200px;margin:0 auto;padding:16px 24px;line-height:1.4;background:#fff}
h1{font-size:1.6em;margin-bottom:0}h2{border-bottom:2px solid #4c78a8;padding-bottom:2px;
 margin-top:1.8em}.sub{color:#555;margin-top:2px}
nav a{margin-right:14px;color:#4c78a8}
table{border-collapse:collapse;margin:8px 16px 12px 0;font-size:.85em}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eef2f7}.tbl{overflow-x:auto}tbody tr:nth-child(even){background:#f8f8f8}
pre.code{background:#1e2430;color:#e8e8e8;padding:12px 16px;border-radius:4px;font-size:1em;
 overflow-x:auto}code{font-family:ui-monospace,Menlo,Consolas,monospace}
.cols{display:flex;flex-wrap:wrap;align-items:flex-start}
.figs{display:flex;flex-wrap:wrap;gap:8px}figure{margin:8px 0}figure img{max-width:100%}
footer{color:#777;font-size:.8em;margin-top:3em}
.headline{font-size:1.15em;font-weight:600}
"""


def _template():
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("capacity.report", "templates"),
                             autoescape=True, trim_blocks=False)
    return env.get_template("report.html.j2")


def render_html(title: str, subtitle: str, sections: Sequence[Section], svgs: dict[str, str],
                footer: str) -> str:
    """The page, through templates/report.html.j2 with autoescaping: every string is escaped
    except section bodies, which the body helpers above built from escaped parts."""
    from markupsafe import Markup
    secs = []
    for sec in sections:
        figs = []
        for f in sec.charts:
            w = _svg_width(svgs[f.name])
            figs.append({"name": f.name, "caption": f.caption,
                         "data": base64.b64encode(svgs[f.name].encode()).decode(),
                         "width": f"{w * SVG_ZOOM:.0f}" if w else None})
        secs.append({"id": sec.id, "title": sec.title, "body": Markup(sec.body), "figures": figs})
    return _template().render(title=title, subtitle=subtitle, sections=secs, footer=footer,
                              style=Markup(STYLE)) + "\n"


def json_safe(v: object) -> object:
    """JSON-ready copy: NaN/inf -> null, datetimes -> ISO text, numpy scalars -> Python."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def summary_dict(*, title: str, trace_summary: dict, run: RunResult, run_sum: dict,
                 sizing: SwapSizing | None, modes: ModeComparison | None, rec, stab,
                 sections: Sequence[Section], extra: dict | None = None) -> dict:
    engine = {k: run.run.get(k) for k in CONFIG_KEYS if k in run.run}
    return json_safe({
        "title": title, "sustainable": rec.sustainable, "offered_rps": rec.offered_rps,
        "served_rps": rec.served_rps, "headroom_rate_scale": rec.headroom_rate_scale,
        "recommendation": rec.as_dict(), "stability": stab.as_dict(),
        "trace": trace_summary, "run": run_sum | {"engine": engine},
        "sizing": sizing.as_dict() if sizing else None,
        "modes": modes.as_dict() if modes else None,
        **(extra or {}),
        "sections": [s.title for s in sections],
        "charts": [f"{f.name}.png" for s in sections for f in s.charts],
    })


def build_sections(*, trace_summary: dict, run: RunResult, run_sum: dict,
                   sizing: SwapSizing | None, modes: ModeComparison | None, rec, stab,
                   extra_sections: Sequence[Section],
                   host_tier_sections: Sequence[Section] | None = None,
                   figures: dict[str, Figure] | None = None) -> list[Section]:
    """`host_tier_sections`: in place of the swap sizing (V1: CPU offloading, the migration).
    `figures`: the run's own charts, built already (`Ahead`)."""
    host = list(host_tier_sections) if host_tier_sections is not None else [swap_section(sizing)]
    figures = figures or run_figures(run, run_sum)
    secs = [recommendations_section(rec, stab), stability_section(stab),
            workload_section(trace_summary), baseline_section(run, run_sum, figures), *host,
            modes_section(modes), latency_section(figures), *extra_sections]
    names = [f.name for s in secs for f in s.charts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"extra_sections: chart names must be unique, repeated: {dup}")
    return secs


def write_report(out_dir: str | Path, *, title: str, trace_summary: dict, run: RunResult,
                 sizing: SwapSizing | None, modes: ModeComparison | None, recommendation,
                 stability, extra_sections: Sequence[Section] = (),
                 extra_summary: dict | None = None,
                 host_tier_sections: Sequence[Section] | None = None,
                 extra_files: dict[str, str] | None = None, ahead: Ahead | None = None) -> Path:
    """Write `out_dir/index.html`, `out_dir/<chart>.png` and `out_dir/summary.json`; return the
    path of index.html. `recommendation` (capacity.analyses.plan.Recommendation) is the top of
    the page and of summary.json; `stability` (capacity.analyses.stability.Stability) follows.
    `ahead`: `run`'s summary and charts, rendered already (capacity/report/ahead.py)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ahead is not None and ahead.run_id != run.run_id:
        ahead = None
    run_sum = ahead.run_sum if ahead else run_summary(run.tables())
    sections = build_sections(trace_summary=trace_summary, run=run, run_sum=run_sum,
                              sizing=sizing, modes=modes, rec=recommendation, stab=stability,
                              extra_sections=extra_sections, host_tier_sections=host_tier_sections,
                              figures=ahead.figures if ahead else None)
    done = ahead.rendered if ahead else {}
    svgs, files = {}, {}
    for name, (svg, png) in done.items():
        svgs[name], files[out / f"{name}.png"] = svg, png
    figs = [f for s in sections for f in s.charts if f.name not in done]
    # vl-convert renders outside Python's lock for much of each chart: two at a time is ~30%
    # faster on two cores, and the order of the results is the figures' order either way.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        rendered = list(pool.map(lambda f: render_chart(f.chart), figs))
    for fig, (svg, png) in zip(figs, rendered):
        svgs[fig.name], files[out / f"{fig.name}.png"] = svg, png
    r = run.run
    subtitle = (f"{r.get('model')} on {r.get('gpu')} × {r.get('tp', 1)}, scheduler "
                f"{r.get('scheduler')}; {run_sum['requests']:,} requests over "
                f"{seconds(run_sum['sim_seconds'])} simulated")
    footer = f"kvcap {r.get('kvcap_version', '')} · run {run.run_id} · offline report"
    index = out / "index.html"
    files[index] = render_html(title, subtitle, sections, svgs, footer)
    doc = summary_dict(title=title, trace_summary=trace_summary, run=run, run_sum=run_sum,
                       sizing=sizing, modes=modes, rec=recommendation, stab=stability,
                       sections=sections, extra=extra_summary)
    files[out / "summary.json"] = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    files.update({out / name: text for name, text in (extra_files or {}).items()})
    # The whole report or none of it (all written to temp files, then renamed): a full disk
    # leaves no PNGs without their index.html.
    atomic.write_files(files)
    return index
