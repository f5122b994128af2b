"""Priority interference: interactive and batch traffic sharing one instance.

On a trace with priorities (e.g. the `priority-mix` scenario) under `--scheduling-policy priority`:
who is preempted, by class; high-priority TTFT with preemption vs. queue-only; how much the batch
traffic slows the interactive traffic (the same interactive requests replayed alone); preemption
counts as the interference measure. Lower priority value = more important (vLLM convention).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.metrics import nearest_rank, request_latencies
from capacity.analyses.planner import Planner
from capacity.analyses.sweep import Job
from replay.config import EngineConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Interference:
    by_class: pl.DataFrame          # per (variant, priority): requests, preempted, TTFT, max TBT
    high_priority: int
    summary: str

    def as_dict(self) -> dict:
        return {"high_priority": self.high_priority, "summary": self.summary,
                "by_class": self.by_class.to_dicts()}


def per_class(tables: dict[str, pl.DataFrame], variant: str) -> pl.DataFrame:
    lat = request_latencies(tables["requests"])
    rows = []
    for prio, grp in sorted(lat.group_by("priority"), key=lambda kv: kv[0][0]):
        rows.append({"variant": variant, "priority": int(prio[0]),
                     "tenant": grp["tenant"].drop_nulls().mode().to_list()[0]
                     if grp["tenant"].drop_nulls().len() else None,
                     "requests": grp.height,
                     "preempted_requests": int((grp["num_preemptions"] > 0).sum()),
                     "preemptions": int(grp["num_preemptions"].sum()),
                     "ttft_p50_s": nearest_rank(grp["ttft_s"].to_numpy(), 0.5),
                     "ttft_p99_s": nearest_rank(grp["ttft_s"].to_numpy(), 0.99),
                     "max_tbt_p99_s": nearest_rank(grp["max_tbt_s"].to_numpy(), 0.99)})
    return pl.DataFrame(rows)


def interference(trace: pl.DataFrame, config: EngineConfig, *,
                 planner: Planner | None = None) -> Interference:
    if trace["priority"].n_unique() < 2:
        raise ValueError("priority: the trace has one priority class; use the priority-mix "
                         "scenario or map priorities (traces.transforms)")
    note, changes = "", {"scheduling_policy": "priority"}
    if config.scheduler == "v0" and config.preemption_mode == "swap":
        # Real V0 crashes with priority + swap (reference G/D4): analyse the runnable variant.
        changes["preemption_mode"] = "recompute"
        note = ("V0 cannot run priority scheduling with swap (vLLM crashes, reference G/D4), so "
                "this analysis uses recompute; ")
    cfg = dataclasses.replace(config, **changes)
    high = int(trace["priority"].min())
    alone = trace.filter(pl.col("priority") == high)
    jobs = [Job(trace=trace, config=cfg, label="priority shared"),
            # Queue-only admits what fits and never preempts: nothing is ever offloaded for a
            # preempted request, and vLLM has no tier without preemption (the config refuses it).
            Job(trace=trace, config=dataclasses.replace(cfg, preemption_mode="none",
                                                        kv_offloading_size=None,
                                                        num_cpu_blocks_override=None),
                label="priority shared queue-only"),
            Job(trace=alone, config=cfg, label="priority interactive alone")]
    runs = (planner or Planner()).run(jobs)
    names = ("shared (preemption)", "shared (queue-only)", "interactive alone")
    table = pl.concat([per_class(r.tables(), n) for r, n in zip(runs, names)])
    hp = table.filter(pl.col("priority") == high)
    get = lambda v, col: hp.filter(pl.col("variant") == v)[col][0]  # noqa: E731
    low = table.filter((pl.col("variant") == names[0]) & (pl.col("priority") != high))
    f = lambda x: "-" if x is None else f"{x * 1000:.0f} ms"  # noqa: E731
    text = note + (f"interactive TTFT p99: {f(get(names[2], 'ttft_p99_s'))} alone, "
            f"{f(get(names[0], 'ttft_p99_s'))} sharing with batch under preemption, "
            f"{f(get(names[1], 'ttft_p99_s'))} queue-only; preemptions fall on batch "
            f"{int(low['preemptions'].sum() or 0)} times and on interactive "
            f"{get(names[0], 'preemptions')} times")
    return Interference(by_class=table, high_priority=high, summary=text)
