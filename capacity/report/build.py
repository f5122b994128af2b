"""Assemble the report of a capacity plan: its sections, files and the JSON result.

Everything quoted comes from `Plan` (capacity.analyses.plan): the recommendation at the top, then
each analysis. An overloaded plan gets its stability and tuning sections and no rule file.
Must not replay anything.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from capacity.analyses.metrics import summary
from replay.config import resolve
from capacity.analyses.plan import Plan
from capacity.analyses.stalls import attribute_stalls
from capacity.report import sections as sec
from capacity.report.offload_sections import migration_section, offload_section
from capacity.report.render import swap_section, text, write_report
from traces import atomic
from traces.stats import trace_info

RULES_FILE = "kvcap-preemption-rules.yml"


def write_atomic(path: Path, content: str) -> None:
    # temp file removed on failure, umask permissions (mkstemp alone left it 0600)
    atomic.write_text(path, content)


def result_dict(plan: Plan, name: str, trace) -> dict:
    """The `kvcap report --json` object (the contract keys first)."""
    from traces.schema import has_prefix_hashes
    rec, tn = plan.recommendation, plan.tuning
    fits = rec.verdict == "fits"
    return {**plan.contract(),
            "recommendation": rec.as_dict(), "trace": name,
            "trace_has_prefix_hashes": has_prefix_hashes(trace),
            "stability": plan.stability.as_dict(),
            "sustainable_load": plan.sustainable_load.as_dict() if plan.sustainable_load else None,
            "recommended_mode": plan.modes.recommended if plan.modes else None,
            # A host-tier size only for a fitting plan (DESIGN §8), and the one its flags set
            # (the sweep's knee is in `offload` / `sizing`, used or not).
            "recommended_swap_space_gib": (
                rec.config.swap_space if fits and rec.config.preemption_mode == "swap" else
                0.0 if fits and rec.config.scheduler == "v0" else None),
            # V1: the flags' --kv-offloading-size (0: no connector); None on V0, or when the
            # plan does not fit.
            "recommended_kv_offloading_size_gib": (
                float(rec.config.kv_offloading_size or 0.0)
                if fits and rec.config.scheduler == "v1" else None),
            "offload": plan.offload.as_dict() if plan.offload else None,
            "migration": plan.migration.as_dict() if plan.migration else None,
            # The plan's value (vLLM's default unless tuning won beyond the noise).
            "recommended_max_num_seqs": (resolve(rec.config).spec.max_num_seqs
                                         if rec.config is not None else None),
            "margin_rate_scale": rec.headroom_rate_scale if rec.config is not None else None,
            "preemption_verdict": plan.classification.verdict if plan.classification else None,
            "alert_threshold_5m": plan.alert.threshold if plan.alert else None,
            "baseline": summary(plan.baseline.tables()),
            "tuning": tn.as_dict() if tn else None}


def host_tier_sections(plan: Plan) -> list:
    """The host tier's sections: V0 swap sizing or V1 CPU offloading, then both side by side."""
    v1 = plan.baseline.run.get("scheduler") == "v1"
    if v1 and plan.offload is None and plan.modes is not None:     # sustainable, not sized
        from capacity.analyses.plan import NOT_SIZED
        first = offload_section(None, f"CPU offloading {NOT_SIZED}.")
    else:
        first = offload_section(plan.offload) if v1 else swap_section(plan.sizing)
    moved = migration_section(plan.migration)
    return [first] + ([moved] if moved else [])


def build_report(plan: Plan, *, out: Path, name: str, trace, priority=None,
                 priority_note: str | None = None, production=None,
                 ahead=None) -> tuple[Path, dict]:
    """`production`: the baseline replay vs. Prometheus (promvalidate.ProductionComparison), or
    None. `ahead`: the baseline's summary and charts, rendered already (report/ahead.py)."""
    extra = []
    if plan.tuning is not None:
        cfg = plan.recommendation.config
        why = next((ln.removeprefix("max-num-seqs: ") for ln in plan.recommendation.lines
                    if ln.startswith("max-num-seqs: ")), None)
        extra.append(sec.tuning_section(
            plan.tuning, chosen=resolve(cfg).spec.max_num_seqs if cfg is not None else None,
            explanation=why))
    if plan.alert is not None:
        extra.append(sec.budget_section(plan.classification, plan.alert))
    if plan.headroom is not None:
        extra.append(sec.headroom_section(plan.headroom))
    run = plan.recommended_run or plan.baseline
    extra.append(sec.stalls_section(attribute_stalls(run.tables()), plan.stall_drill))
    if priority is not None:
        psec = sec.priority_section(priority)
        if priority_note:
            psec = dataclasses.replace(psec, body=text(priority_note) + psec.body)
        extra.append(psec)
    if production is not None:
        extra.append(sec.production_section(production))
    result = result_dict(plan, name, trace)
    if production is not None:
        result["production"] = production.as_dict()
    rules = out / RULES_FILE
    if plan.alert is not None:
        result["rules"] = str(rules)       # written with the report's files, all or none
    elif rules.exists():
        rules.unlink()         # a rule file from an earlier run must not look like this one's
    index = write_report(out, title=f"kvcap capacity report — {name}", trace_summary=trace_info(trace),
                         run=plan.baseline, sizing=plan.sizing, modes=plan.modes,
                         recommendation=plan.recommendation, stability=plan.stability,
                         extra_sections=extra, host_tier_sections=host_tier_sections(plan),
                         extra_files={RULES_FILE: plan.alert.yaml} if plan.alert is not None else None,
                         ahead=ahead,
                         extra_summary={**plan.contract(),
                                        "trace_has_prefix_hashes": result["trace_has_prefix_hashes"],
                                        **{k: result[k] for k in ("recommended_mode",
                                                               "recommended_max_num_seqs",
                                                               "margin_rate_scale",
                                                               "recommended_swap_space_gib",
                                                               "recommended_kv_offloading_size_gib",
                                                               "offload", "migration",
                                                               "tuning")}})
    return index, result
