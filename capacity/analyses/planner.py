"""The planner: one object that owns the replay memo and the worker pool for a whole analysis.

Every analysis asks it for replays (`run`); a replay of the same trace under the same resolved
engine is made once however many analyses ask (a report asks for its baseline again as a mode
variant, a tuning candidate and a headroom probe). `runs` lists every distinct replay made, in the
order made, for the caller to store (DuckDB has one writer: the caller).
"""
from __future__ import annotations

from typing import Callable, Sequence

import polars as pl

from capacity.analyses.sweep import Job, run_jobs
from replay.config import EngineConfig
from replay.results import RunResult


class Planner:
    def __init__(self, *, workers: int | None = None, trace_name: str = "") -> None:
        self.workers = workers
        self.trace_name = trace_name
        self._memo: dict[str, RunResult] = {}

    def run(self, jobs: Sequence[Job], *, workers: int | None = None,
            on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
        """Replay every job (reusing earlier replays); results in input order."""
        return run_jobs(jobs, workers=workers or self.workers, on_done=on_done, memo=self._memo)

    def replay(self, trace: pl.DataFrame, config: EngineConfig, label: str) -> RunResult:
        return self.run([Job(trace=trace, config=config, label=label,
                             trace_name=self.trace_name)], workers=1)[0]

    def run_shared(self, jobs: Sequence[Job]) -> list[RunResult]:
        """Like `run`, but jobs that differ only by max_num_seqs run smallest first, and a larger
        value reuses the smaller one's replay when that replay never filled its max_num_seqs: the
        limit never bound, so the larger value replays identically. Groups run in parallel."""
        groups: dict[str, list[int]] = {}
        for i, j in enumerate(jobs):
            groups.setdefault(_group_key(j), []).append(i)
        pending = {g: sorted(ix, key=lambda i: jobs[i].config.max_num_seqs or 0)
                   for g, ix in groups.items()}
        done: dict[int, RunResult] = {}
        while pending:
            heads = {g: ix[0] for g, ix in pending.items()}
            runs = self.run([jobs[i] for i in heads.values()])
            left = {}
            for (g, i), r in zip(heads.items(), runs):
                done[i] = r
                rest = pending[g][1:]
                if rest and _peak_running(r) < _max_num_seqs(jobs[i]):
                    for k in rest:
                        done[k] = r
                        self.remember(jobs[k], r)
                    rest = []
                if rest:
                    left[g] = rest
            pending = left
        return [done[i] for i in range(len(jobs))]

    def remember(self, job: Job, run: RunResult) -> None:
        """Record `run` as the replay of `job` too (a run that provably replays identically,
        e.g. a larger max_num_seqs that the smaller one never reached)."""
        from capacity.analyses.sweep import job_key
        self._memo.setdefault(job_key(job), run)

    @property
    def runs(self) -> list[RunResult]:
        return list({r.run_id: r for r in self._memo.values()}.values())


def _max_num_seqs(job: Job) -> int:
    from replay.config import resolve
    return resolve(job.config).spec.max_num_seqs


def _peak_running(run: RunResult) -> int:
    return int(run.steps["num_running"].max() or 0) if run.steps.height else 0


def _group_key(job: Job) -> str:
    """Same key <=> same replay up to max_num_seqs (and max_num_seqs set explicitly)."""
    import dataclasses

    from capacity.analyses.sweep import job_key
    if job.config.max_num_seqs is None:
        return job_key(job)
    return job_key(dataclasses.replace(job, config=dataclasses.replace(job.config, max_num_seqs=1)))
