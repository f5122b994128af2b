"""Report sections for tuning, the preemption budget and alerts, headroom, stalls and priority.

Each function turns one analysis result into a `capacity.report.Section`. Must not replay
anything, nor import duckdb or torch.
"""
from __future__ import annotations

from capacity.evidence.attribute import NOT_PREEMPTION, VERDICTS, Attribution
from capacity.evidence.promvalidate import ProductionComparison
from capacity.views import analysis as ac
from capacity.views import evidence as ev
from capacity.analyses.classify import AlertRule, Classification
from capacity.analyses.headroom import Headroom
from capacity.analyses.priority import Interference
from capacity.report.render import Figure, Section, bullets, code_block, pct, seconds, table, text
from capacity.analyses.stalls import StallAttribution, StallBatches
from capacity.analyses.tuning import Tuning
from capacity.units import number


def _margin(m) -> str:
    return "—" if m is None or m.scale is None else f"×{m.scale:.2f}" + ("+" if m.capped else "")


def tuning_section(tn: Tuning, chosen: int | None = None, explanation: str | None = None) -> Section:
    """`chosen`/`explanation`: the plan's max-num-seqs and why (vLLM's default stays unless the
    tuned value wins beyond the noise); default: the tuning's own pick."""
    pick = tn.recommended if chosen is None else next(
        (c for c in tn.candidates if c.max_num_seqs == chosen), None)
    rows = [[c.max_num_seqs, c.max_num_batched_tokens, _margin(m), f"{c.goodput_rps:,.2f}",
             pct(c.slo_share), seconds(c.ttft_p99_s), seconds(c.tbt_p99_s),
             f"{c.preemptions_per_min:,.2f}", pct(c.preempted_minutes_share),
             "recommended" if c is pick else ("ok" if c.feasible else c.breaks)]
            for c, m in sorted(zip(tn.candidates, tn.margins),
                               key=lambda cm: (cm[0].max_num_batched_tokens, cm[0].max_num_seqs))]
    b = tn.budget
    budget = ", ".join(x for x in (
        "preemption only at load peaks" if b.peak_only else "",
        f"in at most {b.max_minutes_share:.0%} of minutes" if b.max_minutes_share is not None else "",
        f"at most {b.max_per_minute:g} per minute" if b.max_per_minute is not None else "") if x)
    body = (text(f"SLO: fleet TTFT p99 ≤ {seconds(tn.slo_ttft_p99_s)} and TBT p99 ≤ "
                 f"{seconds(tn.slo_tbt_p99_s)}; preemption budget: {budget or 'none'}. Margin: "
                 f"the largest multiple of today's rate at which the value still meets both "
                 f"(searched to {tn.precision:.0%}; + = at the top of the search).")
            + text((explanation or tn.explanation) + ".")
            + table(rows, ["max-num-seqs", "batched tokens", "margin", "goodput req/s",
                           "within SLOs", "TTFT p99", "TBT p99", "preempt/min",
                           "minutes w/ preemption", "verdict"]))
    rec = pick.max_num_seqs if pick else None
    chart = ac.tuning_frontier(tn.table(), rec, slo_ttft_p99_s=tn.slo_ttft_p99_s,
                               slo_tbt_p99_s=tn.slo_tbt_p99_s)
    return Section(title="max-num-seqs tuning", body=body,
                   charts=(Figure("tuning_frontier", chart,
                                  "P99 TTFT and TBT per candidate at today's load; dashed: SLO."),))


def budget_section(c: Classification, rule: AlertRule) -> Section:
    body = (text(f"Preemption in the replay of the recommended flags is {c.verdict}: {c.evidence}.")
            + bullets([f"windows of {c.window_s:g} s: {c.windows}; with preemption: "
                       f"{c.windows_with_preemption} ({c.preempted_windows_share:.0%})",
                       f"peak windows: ≥ {c.peak_load_threshold:.0f} arrivals; preempted windows "
                       f"outside the peaks: {c.outside_peak_windows}",
                       f"baseline P99 TBT (windows without preemption): "
                       f"{seconds(c.baseline_tbt_p99_s)}; worst recovery: "
                       f"{'—' if c.worst_recovery_s is None else f'{c.worst_recovery_s:.0f} s'}"])
            + text(f"Alert: `increase(vllm:num_preemptions_total[5m]) > {rule.threshold}` for "
                   f"{rule.for_duration} (normal traffic peaks at {rule.normal_max_5m} per 5 "
                   f"minutes). Ready-to-load Prometheus rules:") + code_block(rule.yaml))
    figs = ()
    if c.per_window is not None:
        figs = (Figure("preemption_windows", ac.preemption_windows(c.per_window, c.window_s,
                                                                   c.verdict),
                       "Arrivals (area) and preemptions (bars) per window."),)
    return Section(title="Preemption budget and alerts", body=body, charts=figs)


def headroom_section(h: Headroom) -> Section:
    rows = [["flash crowd ×" if p.surge else "×", p.rate_scale, p.requests,
             f"{p.offered_rps:,.2f}", f"{p.served_rps:,.2f}", seconds(p.ttft_p99_s),
             seconds(p.tbt_p99_s), p.preemptions, p.verdict, "yes" if p.ok else p.breaks]
            for p in h.points]
    rows = [[f"{a}{b:g}", *rest] for a, b, *rest in rows]
    body = (text(h.explanation + ".")
            + text(f"Each row is one replay of the search (precision {h.rate.precision:.0%}): the "
                   f"trace with its arrival times divided by the scale"
                   + (", or one window's traffic multiplied (flash crowd)" if h.surge else "")
                   + ".")
            + table(rows, ["load", "requests", "offered req/s", "served req/s", "TTFT p99",
                           "TBT p99", "preemptions", "preemption", "ok"]))
    chart = ac.headroom_curve(h.table(), slo_ttft_p99_s=h.slo_ttft_p99_s,
                              slo_tbt_p99_s=h.slo_tbt_p99_s)
    return Section(title="Surge headroom", body=body,
                   charts=(Figure("headroom", chart, "The searched load levels; dashed: SLO."),))


def stalls_section(a: StallAttribution, drill: StallBatches | None = None) -> Section:
    by_mode = a.as_dict()["stalls_by_mode"]
    rows = [[d["mode"], d["n"], seconds(d["stall_p50_s"]), seconds(d["stall_max_s"])] for d in by_mode]
    causes = a.slow_steps.group_by("cause").len().sort("len", descending=True).rows()
    body = (text(a.summary) + table(rows, ["mode", "stalls", "stall p50", "stall max"])
            + (table([[c, n] for c, n in causes], ["slow steps without a preemption", "steps"])
               if causes else "")
            + (drill_down(drill) if drill is not None else ""))
    return Section(title="TBT stall attribution", body=body,
                   charts=(Figure("stalls", ac.stall_timeline(a.stalls, a.slow_steps, a.threshold_s),
                                  f"Dashed line: spike threshold {seconds(a.threshold_s)}."),))


def drill_down(d: StallBatches) -> str:
    """The worst-stalled request's batches around its stalls (`batches` table)."""
    rows = [[r["stall"], r["phase"], r["step"], f"{r['start_s']:,.3f} s", r["batch_size"],
             r["tokens"], "—" if r["this_kind"] is None else f"{r['this_kind']} {r['this_tokens']}",
             ", ".join(map(str, r["preempted"] or [])) or "—"]
            for r in d.per_step.to_dicts()]
    return (text(f"Drill-down, {d.summary}. `kvcap replay --record-batches` stores every step's "
                 "batch (table `batches`) for any request.")
            + table(rows, ["stall", "phase", "step", "start", "batch size", "tokens",
                           f"request {d.request_id}", "preempted (in order)"]))


def priority_section(i: Interference) -> Section:
    rows = [[r["variant"], r["priority"], r["tenant"], r["requests"], r["preempted_requests"],
             r["preemptions"], seconds(r["ttft_p50_s"]), seconds(r["ttft_p99_s"]),
             seconds(r["max_tbt_p99_s"])] for r in i.by_class.to_dicts()]
    body = text(i.summary) + table(rows, ["variant", "priority", "tenant", "requests", "preempted",
                                          "preemptions", "TTFT p50", "TTFT p99", "max TBT p99"])
    return Section(title="Priority interference", body=body,
                   charts=(Figure("priority", ac.priority_classes(i.by_class),
                                  "Lower priority value = more important."),))


def attribution_section(a: Attribution):
    """The report section for `kvcap attribute`'s result."""
    n = a.spikes
    pre = a.verdicts.get("preemption", 0) + a.verdicts.get("likely preemption", 0)
    lead = (f"{n} client ITL samples exceeded {a.threshold_s:.3f} s; {pre} line up with a logged "
            f"preemption (window ±{a.window_s:g} s) and {a.verdicts.get(NOT_PREEMPTION, 0)} do not — "
            "for those, look at the network path and load, not at KV capacity.")
    rows = [[v, a.verdicts.get(v, 0)] for v in VERDICTS]
    modes = ", ".join(f"{k}: {v}" for k, v in sorted(a.modes.items())) or "none"
    body = text(lead) + table(rows, header=["verdict", "spikes"]) + text(f"Preemption modes: {modes}.")
    fig = Figure(name="evidence-attribution", chart=ev.attribution_chart(a),
                 caption="Each point is one stalled token; colour: the log evidence found around it.")
    return Section(title="Production evidence: TBT spikes vs. preemptions", body=body, charts=(fig,),
                   anchor="evidence-attribution")


def production_section(c: ProductionComparison):
    """The report section for `kvcap validate --prometheus` (replay vs. the production series)."""
    fmt = lambda v: number(v, missing="—")        # noqa: E731
    rows = [[k, m.n, fmt(m.log_mean), fmt(m.replay_mean), fmt(m.mae),
             "—" if m.relative_error is None else pct(m.relative_error), fmt(m.bias)]
            for k, m in c.metrics.items()]
    parts = [f"{d.metric}: {d.windows} window(s) from {d.from_s - c.start_s:.0f} s "
             f"(production {number(d.production_mean)}, replay {number(d.replay_mean)})"
             for d in c.divergences]
    lead = (f"The baseline replay against the Prometheus series of {c.server} (engine {c.engine or '-'}), "
            f"{c.windows} windows of {c.window_s:g} s from {c.start} (offset {c.offset_s:g} s). "
            + ("They part ways in: " if parts else "They part ways nowhere (within the tolerances)."))
    body = text(lead) + (bullets(parts) if parts else "") + table(
        rows, ["metric", "windows", "production mean", "replay mean", "MAE", "relative error", "bias"])
    fig = Figure(name="evidence-prometheus", chart=ev.production_chart(c),
                 caption="Per window: production (Prometheus) and the replay; red points: the windows that part ways.")
    return Section(title="Replay vs. production (Prometheus)", body=body, charts=(fig,),
                   anchor="evidence-prometheus")
