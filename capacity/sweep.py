"""Run many replays in parallel worker processes, with one writer (the caller) for DuckDB.

DuckDB admits one writer process, so workers only replay and return their tables; the parent
stores them. Workers are spawned (not forked: polars and DuckDB hold threads that fork does not
copy safely). With one worker, or one job, everything runs in-process.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Callable, Sequence

import polars as pl

from replay.config import EngineConfig
from replay.results import RunResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    trace: pl.DataFrame
    config: EngineConfig
    label: str
    trace_name: str = ""


def _run(job: Job) -> RunResult:
    from replay.run import replay
    return replay(job.trace, job.config, label=job.label, trace_name=job.trace_name)


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def run_jobs(jobs: Sequence[Job], *, workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Replay every job; results in input order."""
    workers = min(workers or default_workers(), len(jobs))
    results: list[RunResult | None] = [None] * len(jobs)
    if workers <= 1:
        for i, job in enumerate(jobs):
            results[i] = _run(job)
            if on_done:
                on_done(i, results[i])
        return results  # type: ignore[return-value]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_run, job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if on_done:
                on_done(i, results[i])
    return results  # type: ignore[return-value]


def run_many(trace: pl.DataFrame, configs: Sequence[EngineConfig], labels: Sequence[str], *,
             trace_name: str = "", workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Replay one trace under each config."""
    return run_jobs([Job(trace=trace, config=c, label=l, trace_name=trace_name)
                     for c, l in zip(configs, labels)], workers=workers, on_done=on_done)
