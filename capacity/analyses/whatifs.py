"""What-ifs the plan measures but never turns into flags (issue 32): settings a user cannot simply
switch on today, or that the plan does not recommend, each replayed on the recommended flags and
judged against them with the plan's significance rule (capacity/analyses/noise.py).

- `preemption_victim=lcf`: vLLM preempts the newest running request; vLLM PR #53723 (open, in no
  release) would preempt the one with the fewest computed tokens, which wastes less prefill. The
  objective is the recompute tax (recomputed / all prefill tokens), then TTFT p99.
- `cache_aware_admission_window`: vLLM 0.34's knob that admits the deepest GPU prefix-cache hit
  first among the first N waiting requests once KV usage passes a threshold. Only a trace with
  prefix hashes can hit, and only 0.34 (FCFS, prefix caching on) has it. The objective is TTFT p99.

A what-if is "significant" only when its objective beats the recommended replay by more than the
measured noise; the words say so either way, with the numbers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.modes import ModeResult, mode_reducer, mode_result
from capacity.analyses.noise import Noise, gain
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
from capacity.units import seconds as seconds_words
from replay.config import EngineConfig, resolve
from traces.schema import has_prefix_hashes

# The window the plan tries for 0.34's cache-aware admission (vLLM's default is 0, off) and the
# threshold it keeps at vLLM's default.
CACHE_AWARE_WINDOW = 32
LCF_NOTE = "vLLM PR #53723, open, in no release"
# A recompute tax that moves by less than this many points is no finding, whatever the relative
# change (0.3% -> 0.2% is a third, and nothing a deployment would notice).
MIN_TAX_POINTS = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    knob: str                      # the EngineConfig field changed
    value: object
    released: bool                 # in a vLLM release (a flag a user can set)
    objective: str                 # the ModeResult metric it is judged on
    default: dict                  # the recommended replay: recompute_tax, ttft/tbt p99, preemptions
    what_if: dict                  # the same, replayed with the what-if ({} when not replayed)
    gain: float                    # relative, on the objective (positive = better)
    threshold: float               # the noise it had to beat
    significant: bool
    words: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _numbers(r: ModeResult) -> dict:
    return {"recompute_tax": r.recomputed_share, "ttft_p99_s": r.ttft_p99_s,
            "tbt_p99_s": r.tbt_p99_s, "preemptions": r.preemptions,
            "recomputed_tokens": r.recomputed_tokens}


def what_ifs(trace: pl.DataFrame, config: EngineConfig, tables: dict, planner: Planner,
             noise: Noise | None) -> tuple[WhatIf, ...]:
    """The what-ifs that apply to `config` (the recommended flags; `tables` its replay)."""
    eng = resolve(config)
    if config.scheduler != "v1":
        return ()
    link = eng.gpu.host_link_bandwidth_bytes_per_s
    base = mode_result("recommended", tables, link)
    todo: list[tuple[str, object, bool, str]] = []
    if eng.spec.policy == "fcfs" and config.preemption_victim == "fcfs":
        todo.append(("preemption_victim", "lcf", False, "recomputed_share"))
    if (eng.vllm_version == "0.34" and eng.spec.policy == "fcfs"
            and eng.spec.enable_prefix_caching and has_prefix_hashes(trace)
            and config.cache_aware_admission_window == 0):
        todo.append(("cache_aware_admission_window", CACHE_AWARE_WINDOW, True, "ttft_p99_s"))
    out: list[WhatIf] = []
    replay_jobs = []
    for knob, value, released, objective in todo:
        if knob == "preemption_victim" and base.preemptions == 0:
            out.append(WhatIf(knob=knob, value=value, released=released, objective=objective,
                              default=_numbers(base), what_if={}, gain=0.0, threshold=0.0,
                              significant=False,
                              words="a least-computed-first victim (" + LCF_NOTE + ") changes "
                                    "nothing here: these flags preempt no request"))
            continue
        replay_jobs.append((knob, value, released, objective))
    if replay_jobs:
        jobs = [Job(trace=trace, config=dataclasses.replace(config, **{knob: value}),
                    label=f"what-if {knob}={value}", trace_name=planner.trace_name)
                for knob, value, _, _ in replay_jobs]
        results = planner.map(jobs, [mode_reducer(f"{k}={v}", link) for k, v, _, _ in replay_jobs])
        for (knob, value, released, objective), (r, _) in zip(replay_jobs, results):
            out.append(_judge(knob, value, released, objective, base, r, noise))
    return tuple(out)


def _judge(knob: str, value: object, released: bool, objective: str, base: ModeResult,
           new: ModeResult, noise: Noise | None) -> WhatIf:
    g = gain(getattr(base, objective), getattr(new, objective))
    threshold = noise.threshold(objective) if noise is not None else 0.0
    tax_cut = base.recomputed_share - new.recomputed_share
    significant = noise is not None and g > threshold
    if objective == "recomputed_share" and tax_cut < MIN_TAX_POINTS:
        significant = False
    ttft = (f"TTFT p99 {seconds_words(base.ttft_p99_s)} → {seconds_words(new.ttft_p99_s)}")
    if knob == "preemption_victim":
        what = f"a least-computed-first victim ({LCF_NOTE})"
        nums = (f"recompute tax {base.recomputed_share:.1%} → {new.recomputed_share:.1%}, "
                f"{ttft}")
        obj = "recompute tax"
        verb = f"would cut the {obj}"
    else:
        what = (f"vLLM 0.34's cache-aware admission (--cache-aware-admission-window {value}, "
                "threshold 0.5)")
        nums = ttft
        obj = "TTFT p99"
        verb = f"would cut {obj}"
    if significant:
        words = f"{what} {verb} by {g:.0%}, above the noise ({threshold:.0%}): {nums}"
    elif g > 0:
        # Say which rule it failed: a relative gain printed beside the TTFT numbers read as a
        # 24% TTFT gain that the verdict then dismissed.
        if noise is None:
            why = f"{obj} {g:.1%} better; no noise was measured to judge it against"
        elif g <= threshold:
            why = f"{obj} {g:.1%} better, within the noise ({threshold:.0%})"
        else:  # above the noise, so the tax rule above dismissed it
            why = (f"{obj} {g:.0%} lower, above the noise ({threshold:.0%}), but by "
                   f"{tax_cut * 100:.1f} points; a finding needs {MIN_TAX_POINTS * 100:.0f} point "
                   "or more")
        words = f"{what} changes nothing that matters: {nums} ({why})"
    else:
        words = f"{what} does not help here: {nums}"
    return WhatIf(knob=knob, value=value, released=released, objective=objective,
                  default=_numbers(base), what_if=_numbers(new), gain=g, threshold=threshold,
                  significant=significant, words=words)
