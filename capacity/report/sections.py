"""Report sections for tuning, the preemption budget and alerts, headroom, stalls and priority.

Each function turns one analysis result into a `capacity.report.Section`. Must not replay
anything, nor import duckdb or torch.
"""
from __future__ import annotations

from capacity.evidence.attribute import NOT_PREEMPTION, VERDICTS, Attribution
from capacity.views import analysis as ac
from capacity.views import evidence as ev
from capacity.analyses.classify import AlertRule, Classification
from capacity.analyses.headroom import Headroom
from capacity.analyses.priority import Interference
from capacity.report.render import Figure, Section, bullets, code_block, pct, seconds, table, text
from capacity.analyses.stalls import StallAttribution
from capacity.analyses.tuning import Tuning


def tuning_section(tn: Tuning) -> Section:
    rows = [[c.max_num_seqs, c.max_num_batched_tokens, c.goodput_rps, seconds(c.ttft_p99_s),
             seconds(c.tbt_p99_s), c.preemptions_per_min, pct(c.preempted_minutes_share),
             pct(c.recomputed_share), "recommended" if c is tn.recommended else
             ("ok" if c.feasible else c.breaks)]
            for c in sorted(tn.candidates, key=lambda c: (c.max_num_batched_tokens, c.max_num_seqs))]
    b = tn.budget
    budget = ", ".join(x for x in (
        "preemption only at load peaks" if b.peak_only else "",
        f"in at most {b.max_minutes_share:.0%} of minutes" if b.max_minutes_share is not None else "",
        f"at most {b.max_per_minute:g} per minute" if b.max_per_minute is not None else "") if x)
    body = (text(f"SLO: TTFT p99 ≤ {tn.slo_ttft_p99_s:g} s and TBT p99 ≤ {tn.slo_tbt_p99_s:g} s; "
                 f"preemption budget: {budget or 'none'}.") + text(tn.explanation)
            + (code_block(" ".join(tn.flags)) if tn.flags else "")
            + table(rows, ["max-num-seqs", "batched tokens", "goodput req/s", "TTFT p99", "TBT p99",
                           "preempt/min", "minutes w/ preemption", "recomputed", "verdict"]))
    rec = tn.recommended.max_num_seqs if tn.recommended else None
    return Section(title="max-num-seqs tuning", body=body,
                   charts=(Figure("tuning_frontier", ac.tuning_frontier(tn.table(), rec),
                                  "Goodput and P99 TBT per candidate; colour = verdict."),))


def budget_section(c: Classification, rule: AlertRule) -> Section:
    body = (text(f"Preemption in the baseline replay is **{c.verdict}**: {c.evidence}.".replace("**", ""))
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
    rows = [[p.label.removeprefix("headroom "), p.requests, p.throughput_rps, p.preemptions_per_min,
             seconds(p.ttft_p99_s), seconds(p.tbt_p99_s), p.verdict, p.ok] for p in h.points]
    body = text(h.explanation) + table(rows, ["load", "requests", "req/s", "preempt/min",
                                              "TTFT p99", "TBT p99", "preemption", "ok"])
    return Section(title="Surge headroom", body=body,
                   charts=(Figure("headroom", ac.headroom_curve(h.table()),
                                  "Each point is a replay at a load level."),))


def stalls_section(a: StallAttribution) -> Section:
    by_mode = a.as_dict()["stalls_by_mode"]
    rows = [[d["mode"], d["n"], seconds(d["stall_p50_s"]), seconds(d["stall_max_s"])] for d in by_mode]
    causes = a.slow_steps.group_by("cause").len().sort("len", descending=True).rows()
    body = (text(a.summary) + table(rows, ["mode", "stalls", "stall p50", "stall max"])
            + (table([[c, n] for c, n in causes], ["slow steps without a preemption", "steps"])
               if causes else ""))
    return Section(title="TBT stall attribution", body=body,
                   charts=(Figure("stalls", ac.stall_timeline(a.stalls, a.slow_steps, a.threshold_s),
                                  f"Dashed line: spike threshold {seconds(a.threshold_s)}."),))


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
