"""Run many replays in parallel worker processes, with one writer (the caller) for DuckDB.

DuckDB admits one writer process, so workers only replay and return their tables; the parent
stores them. Workers are spawned (not forked: polars and DuckDB hold threads that fork does not
copy safely). On a machine with one core, or for a single job, it runs in-process.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Callable, Sequence

import polars as pl

from replay.config import EngineConfig
from replay.results import RunResult


def _job(args) -> RunResult:
    trace, config, label, trace_name = args
    from replay.run import replay
    return replay(trace, config, label=label, trace_name=trace_name)


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def run_many(trace: pl.DataFrame, configs: Sequence[EngineConfig], labels: Sequence[str], *,
             trace_name: str = "", workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
    """Replay `trace` under each config; results in input order."""
    jobs = [(trace, c, l, trace_name) for c, l in zip(configs, labels)]
    workers = min(workers or default_workers(), len(jobs))
    results: list[RunResult | None] = [None] * len(jobs)
    if workers <= 1:
        for i, job in enumerate(jobs):
            results[i] = _job(job)
            if on_done:
                on_done(i, results[i])
        return results  # type: ignore[return-value]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_job, job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            if on_done:
                on_done(i, results[i])
    return results  # type: ignore[return-value]
