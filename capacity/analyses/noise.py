"""How much a metric moves for reasons no configuration causes: the significance threshold of
every piece of advice (docs/planning.md, "Advice above the noise").

The same configuration is replayed on `seeds` jittered copies of the trace (each arrival moved by
up to half the mean inter-arrival gap, traces.transforms.jitter_arrivals): the same traffic,
sampled again. A metric's spread is (max - min) / mean over the original and the jittered
replays; its threshold is the spread, never below `floor`. A recommendation departs from vLLM's
default only when it wins its objective by more than that threshold (`beats`).
A load search's answer (a margin) is known only to its precision: its threshold is twice the
precision (both margins compared carry one bracket each), or the floor.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
from replay.config import EngineConfig, resolve
from traces.transforms import jitter_arrivals

# ModeResult fields measured (capacity/analyses/modes.py): the objectives advice is judged on.
METRICS = ("ttft_p99_s", "tbt_p99_s", "max_tbt_p99_preempted_s", "preemptions", "throughput_rps",
           "recomputed_share")


@dataclass(frozen=True, slots=True, kw_only=True)
class Noise:
    seeds: int
    floor: float
    precision: float
    spread: dict[str, float]           # metric -> relative spread across the jittered replays
    values: dict[str, tuple]           # metric -> the replays' values (original first)
    run_ids: tuple[str, ...]

    def threshold(self, metric: str) -> float:
        if metric == "margin":
            return max(2 * self.precision, self.floor)
        return max(self.spread.get(metric, 0.0), self.floor)

    def beats(self, metric: str, default: float | None, new: float | None, *,
              higher_is_better: bool = False) -> bool:
        """Does `new` beat `default` on `metric` by more than its threshold?"""
        return gain(default, new, higher_is_better=higher_is_better) > self.threshold(metric)

    def as_dict(self) -> dict:
        return {"seeds": self.seeds, "floor": self.floor, "spread": dict(self.spread),
                "threshold": {m: self.threshold(m) for m in (*METRICS, "margin")},
                "run_ids": list(self.run_ids)}


def gain(default: float | None, new: float | None, *, higher_is_better: bool = False) -> float:
    """Relative improvement of `new` over `default` (0 when either is missing; a change from 0
    counts as 100%)."""
    if default is None or new is None:
        return 0.0
    d = (new - default) if higher_is_better else (default - new)
    if default == 0:
        return 0.0 if d == 0 else (1.0 if d > 0 else -1.0)
    return d / abs(default)


def _spread(vals: list[float]) -> float:
    v = [x for x in vals if x is not None]
    if len(v) < 2:
        return 0.0
    mean = sum(v) / len(v)
    return (max(v) - min(v)) / mean if mean else 0.0


def measure_noise(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
                  seeds: int = DEFAULTS.noise_seeds, floor: float = DEFAULTS.noise_floor,
                  precision: float = DEFAULTS.precision) -> Noise:
    from capacity.analyses.modes import mode_reducer
    host_link = resolve(config).gpu.host_link_bandwidth_bytes_per_s
    jobs = [Job(trace=trace, config=config, label="noise original", trace_name=planner.trace_name)]
    jobs += [Job(trace=jitter_arrivals(trace, seed=s), config=config, label=f"noise seed {s}",
                 trace_name=planner.trace_name) for s in range(1, seeds + 1)]
    results = [r for r, _ in planner.map(jobs, mode_reducer("noise", host_link))]
    values = {m: tuple(getattr(r, m) for r in results) for m in METRICS}
    return Noise(seeds=seeds, floor=floor, precision=precision,
                 spread={m: _spread(list(v)) for m, v in values.items()}, values=values,
                 run_ids=tuple(r.run_id for r in results))
