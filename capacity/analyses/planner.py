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

    def remember(self, job: Job, run: RunResult) -> None:
        """Record `run` as the replay of `job` too (a run that provably replays identically,
        e.g. a larger max_num_seqs that the smaller one never reached)."""
        from capacity.analyses.sweep import job_key
        self._memo.setdefault(job_key(job), run)

    @property
    def runs(self) -> list[RunResult]:
        return list({r.run_id: r for r in self._memo.values()}.values())
