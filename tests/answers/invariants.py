"""The invariants: one function per claim, each (scenario, outcomes) -> (status, detail).

status is "pass", "fail" or "n/a"; detail says why (for a failure: what contradicts what). The
outcomes are runner.ScenarioRun's, by label: report, plan, headroom, replay-flags, replay-default,
replay-margin, replay-offload-half, fleet-n, fleet-n-1, compare-modes, tune, size-offload,
size-swap, alerts. docs/answers.md has one paragraph per invariant (INVARIANTS' docstrings).
"""
from __future__ import annotations

import json
import math
import re

from answers.corpus import Scenario, flag_value
from answers.runner import Outcome

PASS, FAIL, NA = "pass", "fail", "n/a"
VERDICTS = ("overloaded", "misses", "fits")
BINDINGS = (None, "long_prompt_prefill", "decode_step", "prefill_chunk", "kv_blocks", "compute")
# Words a headline may open with for each verdict.
OPENERS = {"fits": ("fits",), "misses": ("misses", "stable but misses", "stable, but misses",
                                         "stable but", "stable, but"),
           "overloaded": ("overloaded",)}
CONTRACT_KEYS = ("verdict", "binding_constraint", "capacity_rps", "capacity_rate_scale", "replicas",
                 "sustainable", "sustainable_rps", "offered_rps", "served_rps",
                 "headroom_rate_scale", "recommendation", "noise", "departures", "slo", "budget",
                 "recommended_kv_offloading_size_gib", "offload", "trace_has_prefix_hashes",
                 "vllm_version", "what_ifs", "rejected", "step_times")
STEP_TIMES = ("measured", "calibration", "roofline")
REPLICA_KEYS = ("count", "router", "linear_estimate", "one_fewer", "meets")
EXPECTED_KEYS = ("ttft_p99_s", "tbt_p99_s", "preemptions", "meets_slo", "within_budget", "run_id")
# Commands that may refuse (exit 2, one line), and when: V1 has no swap space, V0 no offloading
# connector, V0 with priority scheduling no swap (real vLLM crashes there); "an overloaded or missing plan yields no alert rule and no host-tier size" (DESIGN §8).
# These commands run alone on the deployment as given, not on the plan's flags: where that replay
# (replay-default) is overloaded, or its preemption structural (alerts), they may refuse even when
# the plan's flags fit (found off the corpus: Llama-3.1-70B on 2 H200s, whose plan lowers
# --max-num-batched-tokens and preempts never, while vLLM's defaults preempt in 67% of minutes).
REFUSALS = {"size-swap": lambda s, r, d: s.scheduler == "v1" or _not_fits(r) or _overloaded(d)
             or flag_value(s.engine, "--scheduling-policy") == "priority",   # V0 priority: no swap
            "size-offload": lambda s, r, d: s.scheduler == "v0" or _not_fits(r) or _overloaded(d),
            "alerts": lambda s, r, d: _not_fits(r) or r.get("preemption_verdict") == "structural"
            or _overloaded(d) or d.get("preemption_verdict") == "structural"}

O = dict[str, Outcome]


def _default(o: O, what: str) -> dict:
    """The deployment-as-given replay's (replay-default) `what`: "evaluate" or "config"."""
    d = o.get("replay-default")
    return (d.extra.get(what) or {}) if d is not None else {}


def _report(o: O) -> dict:
    rep = o.get("report")
    return rep.out if rep is not None and rep.out is not None else {}


def _overloaded(r: dict) -> bool:
    return r.get("verdict") == "overloaded" or r.get("sustainable") is False


def _not_fits(r: dict) -> bool:
    return _overloaded(r) or r.get("verdict") == "misses"


def _close(a, b, rel: float = 1e-9) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)


def _need_report(o: O):
    rep = o.get("report")
    if rep is None or not rep.ok:
        return FAIL, f"no report JSON ({rep.error_line() if rep else 'not run'})"
    return None


def _today(line: str) -> str:
    """The part of a line about today's load: what it says beyond the capacity (after "beyond",
    "at ×k", "fails at") describes a heavier load, where structural preemption is expected."""
    cut = re.search(r"beyond|at ×|at x\d|fails at", line)
    return line[:cut.start()] if cut else line


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


# ---------------------------------------------------------------------------------- invariants
def contract(s: Scenario, o: O):
    """The JSON contract's keys are there: `report --json` (and summary.json) carry verdict,
    binding_constraint, capacity_rps, replicas {count, router, linear_estimate, one_fewer, meets},
    noise, departures, recommendation.expected {ttft_p99_s, tbt_p99_s, preemptions, meets_slo,
    within_budget, run_id} (unless overloaded), step_times (measured | calibration | roofline,
    said in one line of the plan: a roofline plan says it is less accurate), …; `plan --json` and
    `headroom --json` carry capacity_rps and replicas, headroom also replicas_needed and
    headroom_rate_scale."""
    if (bad := _need_report(o)):
        return bad
    r, problems = _report(o), []
    missing = [k for k in CONTRACT_KEYS if k not in r]
    if missing:
        problems.append(f"report lacks {', '.join(missing)}")
    if isinstance(r.get("replicas"), dict):
        if (m := [k for k in REPLICA_KEYS if k not in r["replicas"]]):
            problems.append(f"report replicas lacks {', '.join(m)}")
    exp = (r.get("recommendation") or {}).get("expected") or {}
    if r.get("verdict") != "overloaded" and (m := [k for k in EXPECTED_KEYS if k not in exp]):
        problems.append(f"recommendation.expected lacks {', '.join(m)}")
    if "verdict" in r and r["verdict"] not in VERDICTS:
        problems.append(f"verdict {r['verdict']!r} not one of {'/'.join(VERDICTS)}")
    if "step_times" in r:
        lines = [ln for ln in (r.get("recommendation") or {}).get("lines") or []
                 if ln.startswith("step times: ")]
        if r["step_times"] not in STEP_TIMES:
            problems.append(f"step_times {r['step_times']!r} not one of {'/'.join(STEP_TIMES)}")
        elif len(lines) != 1 or (r["step_times"] == "roofline") != ("roofline" in lines[0]):
            problems.append(f"step_times {r['step_times']!r} but the plan's lines say {lines}")
    if "binding_constraint" in r and r["binding_constraint"] not in BINDINGS:
        problems.append(f"binding_constraint {r['binding_constraint']!r} unknown")
    if o["report"].extra.get("summary") is None:
        problems.append("no summary.json")
    for label, keys in (("plan", ("capacity_rps", "replicas")),
                        ("headroom", ("capacity_rps", "replicas", "replicas_needed",
                                      "headroom_rate_scale"))):
        c = o.get(label)
        if c is None or not c.ok:
            problems.append(f"{label}: no JSON ({c.skipped or c.error_line() if c else 'not run'})")
        elif (m := [k for k in keys if k not in c.out]):
            problems.append(f"{label} lacks {', '.join(m)}")
    return (FAIL, "; ".join(problems)) if problems else (PASS, "all contract keys present")


def no_crash(s: Scenario, o: O):
    """Every command exits 0 with one JSON object on stdout, or exits 2 with a one-line refusal
    (one `kvcap: error:` line; progress lines aside) where that refusal is documented: size-swap
    on V1 or on V0 with priority scheduling, size-offload on V0, host-tier sizing and alert rules
    where the verdict is not fits (DESIGN §8), alert rules for structural preemption; and, as
    these commands run alone on the deployment as given, where that replay is overloaded or (alert
    rules) preempts structurally. Never a traceback, never a timeout."""
    r, bad, notes = _report(o), [], []
    for label, c in o.items():
        if not c.ran:
            notes.append(f"{label}: {c.skipped}")
            continue
        if c.timed_out:
            bad.append(f"{label}: timed out after {c.wall_s:.0f} s")
        elif c.traceback:
            bad.append(f"{label}: traceback ({c.error_line()})")
        elif c.rc == 0 and c.out is None:
            bad.append(f"{label}: exit 0 but stdout is not one JSON object")
        elif c.rc == 2 and label in REFUSALS and REFUSALS[label](s, r, _default(o, "evaluate")) \
                and sum(ln.startswith("kvcap: error:") for ln in c.stderr_tail.splitlines()) == 1:
            notes.append(f"{label}: refused ({c.error_line()[:120]})")
        elif c.rc != 0:
            bad.append(f"{label}: exit {c.rc} ({c.error_line()[:200]})")
    if bad:
        return FAIL, "; ".join(bad + notes)
    return PASS, "; ".join(notes) or f"{len(o)} commands exit 0"


def headline_consistent(s: Scenario, o: O):
    """verdict is overloaded | misses | fits; the headline opens with it and says "meet(s)"/"fits"
    only for fits; fits <=> expected.meets_slo and expected.within_budget and sustainable; stdout
    JSON == summary.json on the contract keys; no line says "already misses" under fits, and none
    calls the preemption structural under fits with a peak-only budget; a "misses: stable"
    headline only where the recommended flags' replay at today's load is sustainable."""
    if (bad := _need_report(o)):
        return bad
    r, problems = _report(o), []
    verdict = r.get("verdict")
    rec = r.get("recommendation") or {}
    headline = rec.get("headline") or ""
    lines = [str(x) for x in (rec.get("lines") or [])]
    exp = rec.get("expected") or {}
    if verdict not in VERDICTS:
        problems.append(f"verdict {verdict!r}")
    else:
        h = headline.strip().lower()
        if not h.startswith(OPENERS[verdict]):
            problems.append(f"headline opens {headline[:50]!r} for verdict {verdict}")
        positive = [m.group(0) for m in re.finditer(r"(\w+\W+){0,2}\b(meets?|fits)\b", h)
                    if not re.search(r"\b(not|never|no|fails to|n't)\b", m.group(0))]
        if verdict != "fits" and positive:
            problems.append(f"headline says {positive[0]!r} but verdict is {verdict}")
        claims = {"expected.meets_slo": exp.get("meets_slo"),
                  "expected.within_budget": exp.get("within_budget"),
                  "sustainable": r.get("sustainable")}
        fits = all(v is True for v in claims.values())
        if (verdict == "fits") != fits:
            problems.append(f"verdict {verdict} but " + ", ".join(f"{k}={v}" for k, v in claims.items()))
        rf = o.get("replay-flags")
        flags_verdict = rf.out.get("verdict") if rf is not None and rf.ok else None
        if h.startswith(("misses: stable", "stable")) and flags_verdict == "overloaded":
            problems.append("the headline calls the plan stable, but `kvcap replay` of its flags "
                            "at today's load is overloaded")
        text = [headline, *lines]
        if verdict == "fits" and any("already misses" in t for t in text):
            problems.append("a line says 'already misses' under fits")
        if verdict == "fits" and s.budget == "peak-only" and any(
                re.search(r"(?<!not )(?<!never )\bstructural\b", _today(t)) for t in text):
            problems.append("a line calls today's preemption structural under fits (peak-only budget)")
    summary = o["report"].extra.get("summary")
    if summary is None:
        problems.append("no summary.json")
    else:
        diff = [k for k in CONTRACT_KEYS if json.dumps(r.get(k), sort_keys=True)
                != json.dumps(summary.get(k), sort_keys=True)]
        if diff:
            problems.append(f"stdout JSON != summary.json on {', '.join(diff)}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{verdict}: {headline[:90]}"


def flags_replay(s: Scenario, o: O):
    """`kvcap replay TRACE <engine flags> <recommended flags>` gives exactly the quoted
    expected.ttft_p99_s, tbt_p99_s and preemptions (n/a when overloaded: no flags); the engine
    flags less the plan's `drop_flags`, which name exactly what appending the flags cannot undo:
    the deployment's V1 CPU tier when the flags have none (vLLM has no flag that turns it off),
    and its cache-aware admission window when the flags turn prefix caching off."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    rec = r.get("recommendation") or {}
    if _overloaded(r) and not rec.get("flags"):
        return NA, "overloaded: no flags"
    if not rec.get("flags"):
        return FAIL, f"verdict {r.get('verdict')} but recommendation.flags is empty"
    tier = s.scheduler == "v1" and float(flag_value(s.engine, "--kv-offloading-size") or 0) > 0
    window = int(flag_value(s.engine, "--cache-aware-admission-window") or 0) > 0
    want = ((["--kv-offloading-size", "--kv-offloading-backend"]
             if tier and "--kv-offloading-size" not in rec["flags"] else [])
            + (["--cache-aware-admission-window"]
               if window and "--no-enable-prefix-caching" in rec["flags"] else []))
    if list(rec.get("drop_flags") or []) != want:
        return FAIL, (f"drop_flags {rec.get('drop_flags')}, but what the flags take from the "
                      f"deployment is {want}")
    rep = o.get("replay-flags")
    if rep is None or not rep.ok:
        return FAIL, f"replay of the flags failed ({rep.error_line() if rep else 'not run'})"
    exp, got = rec.get("expected") or {}, rep.out
    got_pre = (got.get("preemptions_recompute") or 0) + (got.get("preemptions_swap") or 0)
    pairs = (("ttft_p99_s", exp.get("ttft_p99_s"), got.get("ttft_p99_s")),
             ("tbt_p99_s", exp.get("tbt_p99_s"), got.get("tbt_p99_s")),
             ("preemptions", exp.get("preemptions"), got_pre))
    diff = [f"{k} quoted {_fmt(a)} replayed {_fmt(b)}" for k, a, b in pairs if not _close(a, b)]
    if diff:
        return FAIL, "; ".join(diff)
    return PASS, "TTFT/TBT p99 and preemptions reproduced"


def margin_holds(s: Scenario, o: O):
    """The recommended flags replayed at rate scale = headroom_rate_scale (the load capacity_rps
    names) meet both SLOs and the preemption budget and keep up (criteria.evaluate: feasible)."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    if r.get("capacity_rps") is None:
        return NA, "capacity_rps is null" if "capacity_rps" in r else "no capacity_rps"
    rep = o.get("replay-margin")
    if rep is None or not rep.ok:
        return FAIL, f"replay at the margin failed ({rep.error_line() if rep else 'not run'})"
    ev = rep.extra.get("evaluate")
    scale = r.get("headroom_rate_scale")
    if not ev:
        return FAIL, f"cannot evaluate the margin replay ({rep.extra.get('derive_error')})"
    if not ev["feasible"]:
        return FAIL, f"at x{_fmt(scale)}: {ev['breaks']}"
    return PASS, (f"at x{_fmt(scale)}: TTFT p99 {_fmt(ev['ttft_p99_s'])} s, TBT p99 "
                  f"{_fmt(ev['tbt_p99_s'])} s, preemption {ev['preemption_verdict']}")


def one_capacity(s: Scenario, o: O):
    """report, plan and headroom give the same capacity_rps and replicas.count (headroom's
    replicas_needed and headroom_rate_scale too), and capacity_rps = headroom_rate_scale x
    offered_rps."""
    if (bad := _need_report(o)):
        return bad
    r, problems, notes = _report(o), [], []
    rep = r.get("replicas") if isinstance(r.get("replicas"), dict) else {}
    base = {"capacity_rps": r.get("capacity_rps"), "replicas.count": rep.get("count")}
    if "capacity_rps" not in r or "count" not in rep:
        problems.append("report lacks capacity_rps / replicas.count")
    for label in ("plan", "headroom"):
        c = o.get(label)
        if c is None or not c.ok:
            notes.append(f"{label}: {c.skipped or c.error_line() if c else 'not run'}")
            continue
        reps = c.out.get("replicas") if isinstance(c.out.get("replicas"), dict) else {}
        other = {"capacity_rps": c.out.get("capacity_rps", "missing"),
                 "replicas.count": reps.get("count", "missing")}
        if label == "headroom":
            other["replicas_needed"] = c.out.get("replicas_needed", "missing")
            other["headroom_rate_scale"] = c.out.get("headroom_rate_scale", "missing")
        for k, v in other.items():
            want = base.get(k, rep.get("count") if k == "replicas_needed" else r.get(k))
            same = (v == want) if isinstance(v, str) or not isinstance(want, (int, float)) \
                or isinstance(want, bool) else (isinstance(v, (int, float)) and _close(v, want, 1e-6))
            if not same:
                problems.append(f"{label} {k} {_fmt(v)} vs report {_fmt(want)}")
    cap, scale, offered = r.get("capacity_rps"), r.get("headroom_rate_scale"), r.get("offered_rps")
    if isinstance(cap, (int, float)) and isinstance(scale, (int, float)) \
            and isinstance(offered, (int, float)) and not _close(cap, scale * offered, 1e-6):
        problems.append(f"capacity_rps {_fmt(cap)} != headroom_rate_scale x offered_rps "
                        f"{_fmt(scale * offered)}")
    if "capacity_rate_scale" in r and not _close(r["capacity_rate_scale"], scale, 1e-9) \
            and cap is not None:
        problems.append(f"capacity_rate_scale {_fmt(r['capacity_rate_scale'])} != "
                        f"headroom_rate_scale {_fmt(scale)}")
    if problems:
        return FAIL, "; ".join(problems + notes)
    if notes and len(notes) == 2:
        return NA, "; ".join(notes)
    return PASS, (f"capacity {_fmt(base['capacity_rps'])} req/s, {base['replicas.count']} "
                  f"replica(s)" + (f" ({'; '.join(notes)})" if notes else ""))


def replicas_confirmed(s: Scenario, o: O):
    """Fleet replay with N = replicas.count replicas (router replicas.router, the recommended
    flags) meets the SLOs and the budget (`ok`), and N-1 does not (N-1 = 0 counts as failing)."""
    if (bad := _need_report(o)):
        return bad
    rep = _report(o).get("replicas")
    if not isinstance(rep, dict):
        return FAIL, "report has no replicas object"
    n = rep.get("count")
    if n is None and _report(o).get("verdict") == "fits":
        return FAIL, ("verdict fits (one replica meets the SLOs today) but replicas.count is "
                      f"null: {rep.get('explanation')}")
    if n is None:
        return NA, "replicas.count is null"
    problems = []
    fn = o.get("fleet-n")
    if fn is None or not fn.ok:
        problems.append(f"fleet N={n}: {fn.skipped or fn.error_line() if fn else 'not run'}")
    elif fn.out.get("ok") is not True:
        problems.append(f"N={n} fails: {fn.out.get('breaks') or fn.out.get('ok')}")
    if n > 1:
        f1 = o.get("fleet-n-1")
        if f1 is None or not f1.ok:
            problems.append(f"fleet N-1={n - 1}: {f1.skipped or f1.error_line() if f1 else 'not run'}")
        elif f1.out.get("ok") is not False:
            problems.append(f"N-1={n - 1} also meets (ok={f1.out.get('ok')})")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{n} meet, {n - 1} fail ({rep.get('router')})"


def departures_above_noise(s: Scenario, o: O):
    """Every departure from a vLLM default (`departures`) wins its stated objective by more than
    the measured noise threshold: gain > threshold."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    if "departures" not in r:
        return FAIL, "report has no departures"
    deps = r["departures"] or []
    bad_ = []
    for d in deps:
        g, t = d.get("gain"), d.get("threshold")
        if not isinstance(g, (int, float)) or not isinstance(t, (int, float)) or not g > t:
            bad_.append(f"{d.get('knob')} {d.get('default')}->{d.get('recommended')}: gain "
                        f"{_fmt(g)} <= threshold {_fmt(t)} ({d.get('objective')})")
    if bad_:
        return FAIL, "; ".join(bad_)
    return PASS, ", ".join(f"{d.get('knob')} (+{_fmt(d.get('gain'))} > {_fmt(d.get('threshold'))})"
                           for d in deps) or "no departures"


def departures_in_flags(s: Scenario, o: O):
    """Every departure is what the recommended flags say: --max-num-seqs and
    --max-num-batched-tokens carry its value; --enable-chunked-prefill ("on, --max-num-batched-
    tokens N") carries the flag and N, on a deployment whose vLLM default replay ran chunked
    prefill off; --preemption-mode carries its mode; --kv-offloading-size a tier;
    --enable-prefix-caching the cache as its variant has it (recompute: off)."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    deps = r.get("departures") or []
    if not deps:
        return NA, "no departures"
    flags = (r.get("recommendation") or {}).get("flags") or []
    problems = []
    for d in deps:
        knob, rec = d.get("knob"), d.get("recommended")
        if knob in ("--max-num-seqs", "--max-num-batched-tokens", "--preemption-mode"):
            ok_ = flag_value(flags, knob) == str(rec)
        elif knob == "--enable-chunked-prefill":
            m = re.fullmatch(r"on, --max-num-batched-tokens (\d+)", str(rec))
            was = _default(o, "config").get("enable_chunked_prefill")
            ok_ = (m is not None and "--enable-chunked-prefill" in flags and was is False
                   and flag_value(flags, "--max-num-batched-tokens") == m.group(1))
        elif knob == "--kv-offloading-size":
            ok_ = flag_value(flags, knob) is not None
        elif knob == "--enable-prefix-caching":
            ok_ = ("--no-enable-prefix-caching" if rec == "recompute" else
                   "--enable-prefix-caching") in flags
        else:
            ok_ = False
        if not ok_:
            problems.append(f"{knob} -> {rec} is not what the flags say")
    if problems:
        return FAIL, "; ".join(problems) + f" (flags: {' '.join(flags)})"
    return PASS, ", ".join(f"{d.get('knob')} {d.get('recommended')}" for d in deps)


def no_prefix_off_without_hashes(s: Scenario, o: O):
    """A trace without prefix hashes never gets advice to turn prefix caching off: the recommended
    flags carry `--no-enable-prefix-caching` only where that is the engine's own default (V0
    0.10); the report's trace_has_prefix_hashes matches the trace."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    truth = s.trace.has_prefix_hashes
    said = r.get("trace_has_prefix_hashes")
    if said is not None and said != truth:
        return FAIL, f"trace_has_prefix_hashes {said} but the trace {'has' if truth else 'has no'} hashes"
    if truth:
        return NA, "the trace has prefix hashes"
    flags = (r.get("recommendation") or {}).get("flags") or []
    if "--no-enable-prefix-caching" not in flags:
        return PASS, "prefix caching not turned off"
    default_on = _default(o, "config").get("enable_prefix_caching")
    if default_on is False:
        return PASS, "--no-enable-prefix-caching restates the engine's default"
    return FAIL, ("recommends --no-enable-prefix-caching on a trace without prefix hashes "
                  f"(engine default: {'on' if default_on else 'unknown'})")


# Objective words -> (metric of runner.evaluate_run, higher is better)
_OBJECTIVES = (("goodput", "goodput_rps", True), ("throughput", "throughput_rps", True),
               ("ttft", "ttft_p99_s", False), ("tbt", "tbt_p99_s", False),
               ("preempt", "preemptions", False), ("recomput", "recomputed_tokens", False),
               ("prefill", "prefill_tokens", False), ("slo", "slo_share", True))


def offload_knee(s: Scenario, o: O):
    """When recommended_kv_offloading_size_gib > 0, replaying the recommended flags with half that
    size is worse than with the size itself, by more than its threshold, on the objective the plan
    names (its --kv-offloading-size departure; else the sweep's own: prefill work, threshold the
    sweep's tolerance, or TTFT p99, threshold the measured noise)."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    gib = r.get("recommended_kv_offloading_size_gib")
    if not isinstance(gib, (int, float)) or gib <= 0:
        return NA, "no host tier recommended" if s.scheduler == "v1" else "V0"
    flags = (r.get("recommendation") or {}).get("flags") or []
    note = "" if "--kv-offloading-size" in flags else "; the recommended flags carry no --kv-offloading-size"
    dep = next((d for d in r.get("departures") or [] if d.get("knob") == "--kv-offloading-size"), {})
    noise = (r.get("noise") or {}).get("threshold") or {}
    tolerance = (r.get("offload") or {}).get("tolerance")
    if dep:
        metric, higher = next(((m, h) for word, m, h in _OBJECTIVES
                               if word in str(dep.get("objective")).lower()), ("ttft_p99_s", False))
        objectives = [(metric, higher, dep.get("threshold"))]
    else:
        objectives = [("prefill_tokens", False, tolerance),
                      ("ttft_p99_s", False, noise.get("ttft_p99_s"))]
    full, half = o.get("replay-offload-full"), o.get("replay-offload-half")
    for c, what in ((full, "the size"), (half, "half the size")):
        if c is None or not c.ok or not c.extra.get("evaluate"):
            why = (c.error_line() or c.extra.get("derive_error")) if c else "not run"
            return FAIL, f"replay at {what} failed ({why})"
    said = []
    for metric, higher, threshold in objectives:
        a, b = full.extra["evaluate"].get(metric), half.extra["evaluate"].get(metric)
        if a is None or b is None or not isinstance(threshold, (int, float)):
            said.append(f"{metric}: no value or threshold")
            continue
        worse = (a - b) / abs(a) if higher else (b - a) / max(abs(a), 1e-12)
        said.append(f"{metric} {_fmt(a)} at {gib:g} GiB vs {_fmt(b)} at {gib / 2:g} GiB: "
                    f"{worse:+.1%} worse, threshold {threshold:.1%}")
        if worse > threshold:
            return PASS, said[-1] + note
    return FAIL, "half the size is not measurably worse: " + "; ".join(said) + note


def binding_fix(s: Scenario, o: O):
    """Diagnosis, where the scenario declares its regime (and vLLM's default config shows it: TBT
    p99 resp. TTFT p99 over the SLO). chunk-bound: binding_constraint == prefill_chunk or the flags
    lower --max-num-batched-tokens (a fits verdict must come from the latter). long-prompt-bound:
    binding_constraint == long_prompt_prefill and replicas.count is null (more replicas cannot fix
    the prefill of one prompt). decode-bound (the TBT SLO below one lone decode step):
    binding_constraint == decode_step, replicas.count null, and no --max-num-batched-tokens
    departure (a smaller chunk cannot shorten a decode step)."""
    if s.regime not in ("chunk", "long-prompt", "decode"):
        return NA, f"regime {s.regime}"
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    binding, verdict = r.get("binding_constraint", "missing"), r.get("verdict")
    count = (r.get("replicas") or {}).get("count", "missing") if isinstance(r.get("replicas"), dict) \
        else "missing"
    ev = _default(o, "evaluate")
    if s.regime == "decode":
        deps = [d.get("knob") for d in r.get("departures") or []]
        said = f"verdict {verdict}, binding {binding}, replicas.count {count}, departures {deps}"
        ok_ = binding == "decode_step" and count is None and "--max-num-batched-tokens" not in deps
        return (PASS if ok_ else FAIL), said
    if s.regime == "chunk":
        if ev.get("tbt_p99_s") is not None and ev["tbt_p99_s"] <= s.slo_tbt_s:
            return NA, f"not chunk-bound: vLLM's default gives TBT p99 {_fmt(ev['tbt_p99_s'])} s"
        flags = (r.get("recommendation") or {}).get("flags") or []
        mbt = flag_value(flags, "--max-num-batched-tokens")
        default = _default_mbt(o)
        lowered = mbt is not None and default is not None and int(mbt) < default
        said = f"verdict {verdict}, binding {binding}, --max-num-batched-tokens {mbt} (default {default})"
        if lowered or (binding == "prefill_chunk" and verdict != "fits"):
            return PASS, said
        return FAIL, said
    if ev.get("ttft_p99_s") is not None and ev["ttft_p99_s"] <= s.slo_ttft_s:
        return NA, f"not long-prompt-bound: vLLM's default gives TTFT p99 {_fmt(ev['ttft_p99_s'])} s"
    if binding == "long_prompt_prefill" and count is None:
        return PASS, "long_prompt_prefill, no replica count"
    return FAIL, f"binding {binding}, replicas.count {count} (verdict {verdict})"


def rejections_stated(s: Scenario, o: O):
    """The requests vLLM refuses are said where the verdict is: when the recommended flags'
    replay (`kvcap replay`; overloaded: the deployment as given) rejects N > 0 requests, the
    report's `rejected.requests` is N, the headline says "rejects N of", plan and headroom carry
    the same `rejected`; with none, `rejected` is null and no headline speaks of rejections."""
    if (bad := _need_report(o)):
        return bad
    r, problems = _report(o), []
    rf = o.get("replay-flags")
    if rf is None or not rf.ok:
        return FAIL, f"replay of the flags: {rf.error_line() if rf else 'not run'}"
    n = int(rf.out.get("requests_rejected") or 0)
    said = r.get("rejected")
    headline = ((r.get("recommendation") or {}).get("headline") or "")
    if n:
        if not isinstance(said, dict) or said.get("requests") != n:
            problems.append(f"the replay rejects {n} requests; report rejected = {said}")
        if f"rejects {n:,} of" not in headline:
            problems.append(f"the replay rejects {n} requests; the headline does not say so")
    elif said is not None or "rejects" in headline:
        problems.append(f"the replay rejects none; report rejected = {said}")
    for label in ("plan", "headroom"):
        c = o.get(label)
        if c is not None and c.ok and json.dumps(c.out.get("rejected"), sort_keys=True) \
                != json.dumps(said, sort_keys=True):
            problems.append(f"{label} rejected {c.out.get('rejected')} vs report {said}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{n} rejected, said" if n else "none rejected"


def floors_measured(s: Scenario, o: O):
    """A binding no replica count fixes rests on a floor that was measured and misses the SLO:
    `long_prompt_prefill` on `binding.floor_ttft_s` (the p99-length prompt alone) above the TTFT
    SLO, `decode_step` on `binding.floor_tbt_s` (the shortest prompt's lone decode step) above the
    TBT SLO; either has replicas.count null and replicas_help false, and every other binding has
    replicas_help true (a floor that never ran — a rejected prompt — claims nothing). The floor
    is a prompt the engine accepts (within max_model_len and, alone, the KV pool), so it runs:
    `binding.floor_ttft_s` is a number wherever the engine accepts any request."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    c = r.get("binding_constraint")
    b = r.get("binding") if isinstance(r.get("binding"), dict) else {}
    count = (r.get("replicas") or {}).get("count") if isinstance(r.get("replicas"), dict) else None
    rej = r.get("rejected") or {}
    if b and b.get("floor_ttft_s") is None and rej.get("requests") != rej.get("of", -1):
        return FAIL, (f"binding {c}: the floor never ran (floor_ttft_s null) though the engine "
                      "accepts requests: it was a prompt the engine rejects")
    floors = {"long_prompt_prefill": ("floor_ttft_s", s.slo_ttft_s),
              "decode_step": ("floor_tbt_s", s.slo_tbt_s)}
    if c not in floors:
        if b and b.get("replicas_help") is False:
            return FAIL, f"binding {c} says no replica count helps without a floor"
        return NA, f"binding {c}"
    key, slo = floors[c]
    v, problems = b.get(key), []
    if not isinstance(v, (int, float)) or not v > slo:
        problems.append(f"{c} with {key} {v} (SLO {slo:g} s)")
    if count is not None or b.get("replicas_help") is not False:
        problems.append(f"{c} but replicas.count {count}, replicas_help {b.get('replicas_help')}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{c}: {key} {v:.3g} s > SLO {slo:g} s, no replica count"


def version_and_what_ifs(s: Scenario, o: O):
    """Every answer names the vLLM release it replayed, the same one everywhere (report, plan,
    headroom: `vllm_version`; V1 is 0.34 unless the scenario asks for 0.33), and every what-if is
    labelled and honest: one "significant" beats the measured noise (gain > threshold, and a
    recompute tax moves by at least a point), the LCF victim is named as a PR in no release."""
    if (bad := _need_report(o)):
        return bad
    r = _report(o)
    want = ("0.10.1.1" if s.scheduler == "v0"
            else flag_value(s.engine, "--vllm-version") or "0.34")
    problems = []
    for label in ("report", "plan", "headroom"):
        c = o.get(label)
        if c is None or not c.ok:
            continue
        got = c.out.get("vllm_version")
        if got != want:
            problems.append(f"{label} says vllm_version {got!r}, the scenario replays {want}")
    for w in r.get("what_ifs") or []:
        g, t = w.get("gain"), w.get("threshold")
        if w.get("significant"):
            if not g > t:
                problems.append(f"what-if {w.get('knob')}: significant with gain {_fmt(g)} <= {_fmt(t)}")
            if w.get("objective") == "recomputed_share":
                d, n = w["default"]["recompute_tax"], w["what_if"]["recompute_tax"]
                if d - n < 0.01:
                    problems.append(f"what-if {w.get('knob')}: significant on a tax "
                                    f"{d:.2%} -> {n:.2%}")
        if w.get("knob") == "preemption_victim" and "#53723" not in (w.get("words") or ""):
            problems.append("the LCF what-if does not say it is a PR in no release")
        if w.get("released") is (w.get("knob") == "preemption_victim"):
            problems.append(f"what-if {w.get('knob')}: released={w.get('released')}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"vLLM {want}; " + (", ".join(
        f"{w.get('knob')}: {'significant' if w.get('significant') else 'not significant'}"
        for w in r.get("what_ifs") or []) or "no what-ifs")


def _default_mbt(o: O) -> int | None:
    v = _default(o, "config").get("max_num_batched_tokens")
    return int(v) if v is not None else None


INVARIANTS = (contract, no_crash, headline_consistent, flags_replay, margin_holds, one_capacity,
              replicas_confirmed, departures_above_noise, departures_in_flags,
              no_prefix_off_without_hashes, offload_knee,
              binding_fix, version_and_what_ifs, rejections_stated, floors_measured)
NAMES = tuple(f.__name__ for f in INVARIANTS)


def check(s: Scenario, o: O) -> dict[str, tuple[str, str]]:
    out = {}
    for f in INVARIANTS:
        try:
            out[f.__name__] = f(s, o)
        except Exception as e:  # a malformed answer is a failure of the answer, not of the harness
            out[f.__name__] = (FAIL, f"unexpected answer shape: {type(e).__name__}: {e}"[:300])
    return out

