"""Run many replays in parallel worker processes, with one writer (the caller) for DuckDB.

DuckDB admits one writer process, so workers only replay and return their tables; the parent
stores them. Workers are spawned (not forked: polars and DuckDB hold threads that fork does not
copy safely) once per process and reused by every later sweep (spawning costs ~1-2 s each).
Jobs that would replay the same trace under the same resolved engine are run once (a report asks
for its baseline again as a mode variant, a tuning candidate and a headroom point).
With one worker, or one job, everything runs in-process.
A search asks for summaries instead (`reduce_jobs`): the worker replays without keeping per-step
tables (replay/results/summary.py) and returns only what the caller's reducers make of the run.
A worker that dies (the out-of-memory killer, a crash) breaks the pool: the pool is dropped and
`WorkerDied` says, in one line, which replay it was running and how large it had grown.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import resource
import shutil
import signal
import tempfile
import time
import weakref
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Sequence

import polars as pl

from replay.config import EngineConfig
from replay.results.summary import SummarySpec
from replay.results.tables import RunResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    trace: pl.DataFrame
    config: EngineConfig
    label: str
    trace_name: str = ""


def _run(job: Job, spill_dir: str | None = None) -> RunResult:
    from replay.run import replay
    _mark(job.label)
    return replay(job.trace, job.config, label=job.label, trace_name=job.trace_name,
                  on_progress=_still_running, spill_dir=spill_dir)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reduced:
    """What a worker sends back for a searched replay: no tables."""
    run: dict                   # the run's `runs` row (run_id, label, status, config_json, ...)
    values: tuple               # reducer(tables) for each reducer asked, in order
    peak_running: int           # max num_running over the steps (Planner's max_num_seqs reuse)


def _reduce(job: Job, reducers: tuple, spec: SummarySpec) -> Reduced:
    """Replay `job` keeping summaries only (replay/results/summary.py) and apply each reducer to its
    tables, here in the worker."""
    from replay.run import replay
    _mark(job.label)
    res = replay(job.trace, job.config, label=job.label, trace_name=job.trace_name,
                 summary=spec, on_progress=_still_running)
    tables = res.tables()
    return Reduced(run=res.run, values=tuple(r(tables) for r in reducers),
                   peak_running=int(res.steps["num_running"].max() or 0))


class WorkerDied(BrokenProcessPool):
    """A worker process ended without an answer; the message is one line for the user."""


# In a worker: the folder where it notes the replay it runs and its peak RSS (file = its pid),
# read by the parent when the worker dies. None in the parent process.
_STATUS_DIR: str | None = None
_KILL_ENV = "KVCAP_TEST_KILL_LABEL"     # tests: a worker given a replay so labelled kills itself


def _mark(label: str) -> None:
    if _STATUS_DIR is None:
        return
    _note(label)
    kill_hook(label)


def kill_hook(label: str) -> None:
    """Tests only: a worker process given a replay whose label holds $KVCAP_TEST_KILL_LABEL
    kills itself, as the out-of-memory killer would."""
    import multiprocessing
    if ((hook := os.environ.get(_KILL_ENV)) and hook in label
            and multiprocessing.parent_process() is not None):     # never the command itself
        os.kill(os.getpid(), signal.SIGKILL)


_LABEL = [""]


def _note(label: str) -> None:
    _LABEL[0] = label
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.path.join(_STATUS_DIR, str(os.getpid())), "w") as f:
        f.write(f"{kib}\n{label}")


def _still_running(_t: float, _cursor: int) -> None:
    """The replay's progress callback in a worker: keeps its peak RSS note current."""
    if _STATUS_DIR is not None:
        _note(_LABEL[0])


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


_POOL: dict[int, ProcessPoolExecutor] = {}
_PROCS: dict[int, dict] = {}        # workers -> {pid: Process} of that pool, as last seen
_STATUS: dict[int, str] = {}        # workers -> the pool's status folder
_PR_SET_PDEATHSIG = 1           # <linux/prctl.h>


def _init_worker(parent_pid: int, status_dir: str) -> None:
    global _STATUS_DIR
    _STATUS_DIR = status_dir
    # Ctrl-C reaches the whole process group: the command stops its workers itself (a worker
    # interrupted while sending its result left half a pickle in the pool's pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)


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
        status = _STATUS.setdefault(workers, tempfile.mkdtemp(prefix="kvcap-workers-"))
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                   initializer=_init_worker, initargs=(os.getpid(), status))
        _POOL[workers] = pool
        _PROCS[workers] = {}
    return pool


def _discard(workers: int) -> None:
    pool = _POOL.pop(workers, None)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    _PROCS.pop(workers, None)


@atexit.register
def _shutdown() -> None:
    for workers in list(_POOL):
        _discard(workers)
    for folder in _STATUS.values():
        shutil.rmtree(folder, ignore_errors=True)
    _STATUS.clear()


def execute(fn: Callable, calls: Sequence[tuple[Any, tuple]], *, workers: int | None,
            on_result: Callable[[Any, Any], None]) -> None:
    """fn(*args) for each (key, args) of `calls`, in-process with one worker or one call, else
    on the pool; on_result(key, value) as each is done (in completion order). A worker that dies
    drops the pool and raises `WorkerDied` naming the replay it ran."""
    workers = pool_size(workers, len(calls))
    if workers <= 1:
        for key, args in calls:
            on_result(key, fn(*args))
        return
    execute_on(workers, fn, calls, on_result=on_result)


def pool_size(workers: int | None, calls: int) -> int:
    """The processes `execute` runs `calls` calls on (1: in this process)."""
    return min(workers or default_workers(), max(calls, 1))


def _ready(modules: tuple[str, ...]) -> None:
    """A worker's first job: the imports its later jobs will need."""
    import importlib
    for name in modules:
        importlib.import_module(name)


def prewarm(workers: int, *modules: str) -> None:
    """Start the pool of exactly `workers` processes now, importing `modules` there, without
    waiting for it: a worker's spawn and imports (about a second) are paid while the caller
    replays in this process (a plan's baseline), not when its first job waits for them."""
    pool = _pool(workers)
    for _ in range(workers):
        pool.submit(_ready, modules)
    _PROCS[workers].update(getattr(pool, "_processes", None) or {})


def in_worker(fn: Callable, *args) -> Any:
    """fn(*args) in a worker process of its own (a one-worker pool, kept for the next call):
    a replay whose tables are only read there leaves the caller's memory as it was."""
    out = []
    execute_on(1, fn, [(0, args)], on_result=lambda _, v: out.append(v))
    return out[0]


def execute_on(workers: int, fn: Callable, calls, *, on_result) -> None:
    """`execute` on the pool of exactly `workers` processes, even for one call."""
    pool = _pool(workers)
    try:
        futures = {}
        for key, args in calls:
            futures[pool.submit(fn, *args)] = key
            _PROCS[workers].update(getattr(pool, "_processes", None) or {})
        pending = set(futures)
        while pending:
            for fut in wait_alive(pool, pending, _PROCS[workers]):
                pending.discard(fut)
                on_result(futures[fut], fut.result())
    except BrokenProcessPool:
        died = _worker_died(workers)
        _discard(workers)
        raise died from None


_POLL_S = 0.5   # how often a waiting caller looks for a dead worker
# Live workers that break_pool stopped: the Process objects, not their pids (a long session
# spawns enough processes for a pid of an earlier pool to come back as a new worker's).
_KILLED: weakref.WeakSet = weakref.WeakSet()


def wait_alive(pool: ProcessPoolExecutor, pending, procs: dict) -> set:
    """The futures of `pending` that are done (at least one), like `wait(FIRST_COMPLETED)`, but
    a worker that dies without the pool noticing breaks the pool (BrokenProcessPool) instead of
    waiting forever: CPython's pool blocks for good when a worker is killed (kill -9, the
    out-of-memory killer) while sending its result, the shared result pipe holding half a
    message that the live workers keep open. `procs` collects the pool's processes as seen."""
    while True:
        done, _ = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
        if done:
            return done
        procs.update(getattr(pool, "_processes", None) or {})
        if any(_ended(p) for p in list(procs.values())):
            break_pool(pool, procs)
            raise BrokenProcessPool("a worker process died")


def break_pool(pool: ProcessPoolExecutor, procs: dict) -> None:
    """Stop a pool one of whose workers died: kill the others, then close this process's end of
    the result pipe so that the pool's thread reads end-of-file (not half a message, forever),
    marks the pool broken and ends; then nothing is left waiting at exit."""
    for p in list(procs.values()):
        # Its sentinel, not its exit code: the one that died may not be reaped yet (or the pool's
        # thread is reaping it: exitcode reads None meanwhile), and it must not count as stopped.
        if not _ended(p):
            _KILLED.add(p)              # not the one that died (died_message)
            p.kill()
    for p in list(procs.values()):
        p.join(5.0)
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    try:
        if writer is not None:
            writer.close()
    except OSError:
        pass
    pool.shutdown(wait=False, cancel_futures=True)


def _ended(p) -> bool:
    """Has the process exited (its sentinel is ready), reaped or not."""
    return bool(wait_ready([p.sentinel], 0))


def _exit_code(p, deadline: float) -> int | None:
    """The process's exit code, waiting for it until `deadline` (time.monotonic()). A process that
    the pool's thread is reaping reads None between that thread's waitpid and its setting the
    code (the thread waits for the GIL meanwhile): sleeping hands it over. Reading exitcode
    reaps a process that nobody else is reaping."""
    while (code := p.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return code


def _worker_died(workers: int) -> WorkerDied:
    """Which worker of the broken pool died, running what, and the likely cause."""
    return died_message(list(_PROCS.get(workers, {}).values()), _STATUS.get(workers), workers)


def died_message(procs: list, status_dir: str | None, workers: int) -> WorkerDied:
    """Which of the processes `procs` of a broken pool died, running what (its note in
    `status_dir`), and the likely cause, as one line."""
    # Every worker of a broken pool ends (the pool terminates the others, break_pool kills them):
    # wait for all exit codes first, or the one that died may read as alive and another, which the
    # pool terminated, be named instead.
    deadline = time.monotonic() + 3.0
    ended = [(p, _exit_code(p, deadline)) for p in procs]
    dead = [(p, c) for p, c in ended if c not in (None, -signal.SIGTERM) and p not in _KILLED]
    proc, code = (dead or ended or [(None, None)])[0]
    label, kib = "", 0
    if proc is not None:
        try:
            with open(os.path.join(status_dir or "", str(proc.pid))) as f:
                rss, _, label = f.read().partition("\n")
            kib = int(rss)
        except (OSError, ValueError):
            pass
    kib = max(kib, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if not label else 0)
    what = f"replaying {label!r}" if label else "replaying"
    gib = f"{kib / 2**20:.1f} GiB" if kib else "an unknown size"
    if code == -signal.SIGKILL:
        return WorkerDied(
            f"a worker process was killed (SIGKILL) while {what}, after growing to {gib} "
            f"resident: most likely out of memory; lower --workers (now {workers}) or give the "
            f"machine more memory")
    how = (f"signal {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exit code {code}" if code is not None else "no exit code")
    return WorkerDied(f"a worker process died ({how}) while {what} ({gib} resident); "
                      f"rerun with --workers 1 to see the error in this process")


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
             memo: dict[str, RunResult] | None = None, progress=None,
             spill: bool = False) -> list[RunResult]:
    """Replay every job; results in input order. `memo` (key -> result) reuses earlier replays
    and records new ones. `progress` (capacity/analyses/planner.py `Progress`) hears of each
    replay to make and each made. `spill`: replays made in this process keep their steps and
    TBT samples in spill files past a million steps (`replay(spill_dir=...)`, in the temporary
    folder; the files go with the tables): the tables a person looks at, held to the end of a
    report, cost the requests' memory, not the steps'. Replays made in workers come back whole."""
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
    def finished(k: str, res: RunResult) -> None:
        memo[k] = res
        if progress is not None:
            progress.replayed(res.run["label"])
        done(k)

    if progress is not None and todo:
        progress.planned(len(todo))
    spill_dir = tempfile.gettempdir() if spill and pool_size(workers, len(todo)) <= 1 else None
    execute(_run, [(k, (jobs[i], spill_dir)) for k, i in todo.items()], workers=workers,
            on_result=finished)
    return [memo[k] for k in keys]


def run_many(trace: pl.DataFrame, configs: Sequence[EngineConfig], labels: Sequence[str], *,
             trace_name: str = "", workers: int | None = None,
             on_done: Callable[[int, RunResult], None] | None = None,
             memo: dict[str, RunResult] | None = None) -> list[RunResult]:
    """Replay one trace under each config."""
    return run_jobs([Job(trace=trace, config=c, label=l, trace_name=trace_name)
                     for c, l in zip(configs, labels)], workers=workers, on_done=on_done, memo=memo)
