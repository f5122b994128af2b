"""Run many replays in parallel worker processes, with one writer (the caller) for DuckDB.

DuckDB admits one writer process, so workers only replay and return their tables; the parent
stores them. Workers are spawned (not forked: polars and DuckDB hold threads that fork does not
copy safely) once per process and reused by every later sweep (spawning costs ~1-2 s each).
Jobs that would replay the same trace under the same resolved engine are run once (a report asks
for its baseline again as a mode variant, a tuning candidate and a headroom point).
With one worker, or one job, everything runs in-process.
"""
from __future__ import annotations

import atexit
import hashlib
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


_POOL: dict[int, ProcessPoolExecutor] = {}
_PR_SET_PDEATHSIG = 1           # <linux/prctl.h>


def _die_with_parent(parent_pid: int) -> None:
    """Worker initializer: a killed parent (SIGKILL, the OOM killer) must not leave workers
    behind holding its stdout pipe. Linux delivers SIGKILL to the worker when the thread that
    spawned it exits (kvcap submits from the main thread); elsewhere nothing is set."""
    import ctypes
    import signal
    import sys
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:      # the parent died before prctl took effect
        os._exit(1)


def _pool(workers: int) -> ProcessPoolExecutor:
    pool = _POOL.get(workers)
    if pool is None:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                   initializer=_die_with_parent, initargs=(os.getpid(),))
        _POOL[workers] = pool
    return pool


@atexit.register
def _shutdown() -> None:
    for pool in _POOL.values():
        pool.shutdown(wait=False, cancel_futures=True)
    _POOL.clear()


def job_key(job: Job) -> str:
    """Same key <=> same replay: the trace's content and the resolved engine (not the spelling of
    the config: `enable_prefix_caching=None` and `True` resolve alike on V1)."""
    from replay.config import resolve
    from replay.run import trace_sha256
    eng = resolve(job.config)
    resolved = repr((eng.spec, eng.model.name, eng.gpu.name, eng.tensor_parallel_size,
                     eng.kv_bytes_per_block, job.config.calibration))
    return hashlib.sha256(f"{trace_sha256(job.trace)}|{resolved}".encode()).hexdigest()


def run_jobs(jobs: Sequence[Job], *, workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None,
             memo: dict[str, RunResult] | None = None) -> list[RunResult]:
    """Replay every job; results in input order. `memo` (key -> result) reuses earlier replays
    and records new ones."""
    memo = {} if memo is None else memo
    keys = [job_key(j) for j in jobs]
    todo: dict[str, int] = {}
    for i, k in enumerate(keys):
        if k not in memo and k not in todo:
            todo[k] = i
    def done(k: str) -> None:
        if on_done:
            for i, key in enumerate(keys):
                if key == k:
                    on_done(i, memo[k])

    for k in dict.fromkeys(keys):
        if k not in todo:
            done(k)                      # reused from an earlier replay
    workers = min(workers or default_workers(), max(len(todo), 1))
    if workers <= 1:
        for k, i in todo.items():
            memo[k] = _run(jobs[i])
            done(k)
    elif todo:
        pool = _pool(workers)
        futures = {pool.submit(_run, jobs[i]): k for k, i in todo.items()}
        for fut in as_completed(futures):
            memo[futures[fut]] = fut.result()
            done(futures[fut])
    return [memo[k] for k in keys]


def run_many(trace: pl.DataFrame, configs: Sequence[EngineConfig], labels: Sequence[str], *,
             trace_name: str = "", workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None,
             memo: dict[str, RunResult] | None = None) -> list[RunResult]:
    """Replay one trace under each config."""
    return run_jobs([Job(trace=trace, config=c, label=l, trace_name=trace_name)
                     for c, l in zip(configs, labels)], workers=workers, on_done=on_done, memo=memo)
