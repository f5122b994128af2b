"""Distributed sweeps: one pure unit of work per grid point, on the local process pool or on Ray;
only the driver writes DuckDB.

Unit of work: `run_point(point, trace) -> {table name: pyarrow.Table}`, the replay of `trace` (the
canonical trace as an Arrow table) at `point.rate_scale` under `point.config`: the tables `replay()`
returns, as Arrow. Pure: the same point and trace give the same tables in every process and on
every machine (except `runs.created_at` and `runs.wall_seconds`, which say when and how long).
Executors:
- `local` (default): a spawned process pool; each worker receives the traces once (initializer)
  and then only points;
- `ray` (`pip install 'kvcap[ray]'`): `ray.put` puts each trace into the object store once, every
  task gets the reference (Ray hands workers the table without copying it per task); tasks return
  Arrow tables. `address`: "local" starts a Ray instance for this sweep only, "auto" joins the
  running cluster (`ray start --head`), "ray://host:port" a remote one through Ray Client.
  Ray is imported here only, and only when this executor runs.
The driver writes results as they arrive (in batches of runs, one transaction each: a run is
all or nothing, replay/results/store.py), so an interrupted sweep keeps what finished; a rerun skips the
run ids already stored (a run id is a hash
of the trace's content and the config, known before anything runs). A task that raises is retried
(`retries` more times) and then reported with its error, never dropped.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable

import polars as pl

from replay.config import EngineConfig

EXECUTORS = ("local", "ray")
# The driver stores finished runs in batches (each run still all or nothing; one DuckDB
# transaction costs ~0.4 s on this machine, a batch of 32 small runs ~2 s): at most this many
# runs, or this many seconds of results, are lost to a crash of the driver.
WRITE_BATCH_RUNS = 32
WRITE_EVERY_S = 10.0
RAY_ADDRESS_ENV = "KVCAP_RAY_ADDRESS"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPoint:
    index: int                   # place in the grid
    config: EngineConfig
    rate_scale: float
    trace_key: str               # which of the sweep's traces (its name)
    label: str
    run_id: str                  # the run id its replay will have (resume)
    values: dict = field(default_factory=dict)   # the grid values of this point


def run_point(point: SweepPoint, trace) -> dict:
    """The unit of work (see the module doc)."""
    from replay.run import replay
    from traces.transforms import scale_rate
    df = trace if isinstance(trace, pl.DataFrame) else pl.from_arrow(trace)
    if point.rate_scale != 1.0:
        df = scale_rate(df, point.rate_scale)
    r = replay(df, point.config, label=point.label, trace_name=point.trace_key,
               rate_scale=point.rate_scale)
    if r.run_id != point.run_id:
        raise RuntimeError(f"point {point.index}: replayed as run {r.run_id}, expected "
                           f"{point.run_id} (the trace differs between driver and worker)")
    return {name: (t if isinstance(t, pl.DataFrame) else t.frame()).to_arrow()
            for name, t in r.tables().items()}


def make_points(traces: dict[str, pl.DataFrame], base: EngineConfig, grid_points: list[dict],
                default_trace: str) -> list[SweepPoint]:
    """One SweepPoint per grid point (on its `trace`, else `default_trace`); run ids computed
    here, before anything runs."""
    from capacity.analyses.grid import engine_for
    from replay.run import run_id_for, trace_sha256
    from traces.transforms import scale_rate
    out, shas = [], {}
    for values in grid_points:
        key = values.get("trace", default_trace)
        cfg = engine_for(base, values)
        scale = float(values.get("rate_scale", 1.0))
        if (key, scale) not in shas:
            t = traces[key] if scale == 1.0 else scale_rate(traces[key], scale)
            shas[key, scale] = trace_sha256(t.sort("arrival_s", maintain_order=True))
        label = "sweep " + " ".join(f"{k}={v}" for k, v in values.items() if k != "trace")
        out.append(SweepPoint(index=len(out), config=cfg, rate_scale=scale, trace_key=key,
                              label=label.strip(), values=dict(values),
                              run_id=run_id_for(traces[key], cfg, sha=shas[key, scale])))
    return out


@dataclass(slots=True, kw_only=True)
class SweepOutcome:
    executor: str
    address: str | None
    runs: list[str]                           # every point's run id, in grid order
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)   # already stored (resume)
    failed: list[dict] = field(default_factory=list)
    summaries: dict[str, dict] = field(default_factory=dict)
    wall_seconds: float = 0.0
    task_seconds: float = 0.0                 # sum of the replays' own wall time

    def as_dict(self) -> dict:
        return {"executor": self.executor, "ray_address": self.address, "runs": self.runs,
                "written": self.written, "skipped": self.skipped, "failed": self.failed,
                "points": len(self.runs), "wall_seconds": self.wall_seconds,
                "task_seconds": self.task_seconds,
                "summaries": [self.summaries[r] for r in self.runs if r in self.summaries]}


Work = Callable[[SweepPoint, object], dict]


def stored_run_ids(db) -> set[str]:
    from pathlib import Path

    from replay.results.store import connect
    if db is None or not Path(db).exists():
        return set()
    with connect(db, read_only=True) as con:
        (has,), = con.execute("SELECT count(*) FROM information_schema.tables "
                              "WHERE table_name = 'runs'").fetchall()
        if not has:
            return set()
        return {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()}


def sweep(points: list[SweepPoint], traces: dict[str, pl.DataFrame], *, db=None,
          executor: str = "local", address: str | None = None, workers: int | None = None,
          retries: int = 1, work: Work = run_point,
          on_progress: Callable[[int, int], None] | None = None) -> SweepOutcome:
    """Run every point not already in `db`; write each result to `db` as it arrives."""
    from capacity.analyses.metrics import summary
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    wall0 = time.perf_counter()
    out = SweepOutcome(executor=executor, address=address, runs=[p.run_id for p in points])
    have = stored_run_ids(db)
    todo, seen = [], set()
    for p in points:
        if p.run_id in have:
            out.skipped.append(p.run_id)
        elif p.run_id not in seen:           # two grid points can be the same replay
            seen.add(p.run_id)
            todo.append(p)
    done = 0
    batch: list[dict] = []
    flushed = [time.perf_counter()]

    def flush() -> None:
        if batch and db is not None:
            from replay.results.store import write_runs
            write_runs(db, batch)
        batch.clear()
        flushed[0] = time.perf_counter()

    def on_result(p: SweepPoint, tables: dict | None, error: str | None = None) -> None:
        nonlocal done
        done += 1
        if tables is None:
            out.failed.append({"index": p.index, "label": p.label, "run_id": p.run_id,
                               "trace": p.trace_key, "error": error})
        else:
            frames = {name: pl.from_arrow(t) for name, t in tables.items()}
            batch.append(frames)
            if len(batch) >= WRITE_BATCH_RUNS or time.perf_counter() - flushed[0] > WRITE_EVERY_S:
                flush()
            out.written.append(p.run_id)
            out.task_seconds += float(frames["runs"]["wall_seconds"][0])
            s = summary(frames)
            out.summaries[p.run_id] = {"run_id": p.run_id, "label": p.label, "trace": p.trace_key,
                                       **p.values, **{k: s[k] for k in _SUMMARY_KEYS}}
        if on_progress is not None:
            on_progress(done, len(todo))

    if on_progress is not None:
        on_progress(0, len(todo))
    if todo:
        run = _run_ray if executor == "ray" else _run_local
        try:
            run(todo, traces, work=work, address=address, workers=workers, retries=retries,
                on_result=on_result)
        finally:
            flush()               # what finished is stored, even when the sweep is interrupted
    out.wall_seconds = time.perf_counter() - wall0
    return out


_SUMMARY_KEYS = ("status", "requests", "throughput_rps", "ttft_p99_s", "tbt_p99_s",
                 "preemptions_recompute", "preemptions_swap", "sim_seconds")


def _error_text(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return (lines[-1] if lines else type(exc).__name__).strip().splitlines()[0]


# ------------------------------------------------------------------ the local process pool
_TRACES: dict = {}


def _init_worker(traces: dict, parent_pid: int, status_dir: str) -> None:
    from capacity.analyses import sweep
    sweep._init_worker(parent_pid, status_dir)
    _TRACES.clear()
    _TRACES.update(traces)


def _local_task(work: Work, point: SweepPoint) -> dict:
    from capacity.analyses.sweep import _mark
    _mark(point.label)          # what this worker runs, for the line if it dies
    return work(point, _TRACES[point.trace_key])


def _run_local(todo, traces, *, work, address, workers, retries, on_result) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from capacity.analyses.sweep import default_workers, died_message
    workers = min(workers or default_workers(), len(todo))
    if workers <= 1:
        for p in todo:
            for attempt in range(retries + 1):
                try:
                    tables = work(p, traces[p.trace_key])
                except Exception as e:          # noqa: BLE001 (reported, after the retries)
                    if attempt == retries:
                        on_result(p, None, _error_text(e))
                    continue
                on_result(p, tables)
                break
        return
    arrow = {k: t.to_arrow() for k, t in traces.items()}
    status = tempfile.mkdtemp(prefix="kvcap-sweep-")
    procs: dict = {}
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                 initializer=_init_worker,
                                 initargs=(arrow, os.getpid(), status)) as pool:
            _pool_loop(pool, procs, todo, work=work, retries=retries, on_result=on_result)
    except BrokenProcessPool:
        # A worker died (kill -9, the out-of-memory killer): stop the sweep with one line; what
        # finished is stored by the caller.
        raise died_message(list(procs.values()), status, workers) from None
    finally:
        shutil.rmtree(status, ignore_errors=True)


def _pool_loop(pool, procs: dict, todo, *, work, retries, on_result) -> None:
    from capacity.analyses.sweep import wait_alive
    pending = {pool.submit(_local_task, work, p): (p, 0) for p in todo}
    procs.update(getattr(pool, "_processes", None) or {})
    while pending:
        for fut in wait_alive(pool, pending, procs):
            p, attempt = pending.pop(fut)
            exc = fut.exception()
            if isinstance(exc, BrokenProcessPool):
                raise exc
            if exc is None:
                on_result(p, fut.result())
            elif attempt < retries:
                pending[pool.submit(_local_task, work, p)] = (p, attempt + 1)
            else:
                on_result(p, None, _error_text(exc))


# ------------------------------------------------------------------ Ray
def _ray_task(work: Work, point: SweepPoint, trace) -> dict:
    return work(point, trace)


def ray_address(flag: str | None) -> str | None:
    """--ray-address, else $KVCAP_RAY_ADDRESS, else None (the local pool)."""
    address = flag or os.environ.get(RAY_ADDRESS_ENV) or None
    if address is not None and address not in ("auto", "local") and not address.startswith("ray://"):
        raise ValueError(f"--ray-address {address!r}: use auto (the running cluster), local (a Ray "
                         "instance for this command) or ray://host:port")
    return address


def _run_ray(todo, traces, *, work, address, workers, retries, on_result) -> None:
    try:
        import ray
    except ImportError:
        raise ValueError("the Ray executor needs Ray: pip install 'kvcap[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address in (None, "local"):
                from capacity.analyses.sweep import default_workers
                start_local_ray(num_cpus=workers or default_workers())
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         logging_level="WARNING")
        except ConnectionError as e:
            raise ValueError(f"--ray-address {address}: no Ray cluster there ({_error_text(e)}); "
                             "start one with `ray start --head` or use --ray-address local") from None
    try:
        refs = {k: ray.put(t.to_arrow()) for k, t in traces.items()}   # once, not per task
        task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=True)(_ray_task)
        pending = {task.remote(work, p, refs[p.trace_key]): p for p in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                p = pending.pop(ref)
                try:
                    tables = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    on_result(p, None, _error_text(e.cause if e.cause is not None else e))
                except ray.exceptions.RayError as e:   # a worker or node lost past the retries
                    on_result(p, None, _error_text(e))
                else:
                    on_result(p, tables)
    finally:
        if started:
            ray.shutdown()


RAY_ENV_DIR = os.path.join(os.path.dirname(__file__), "ray_env")


def start_local_ray(*, num_cpus: int, paths: tuple[str, ...] = (), env: dict | None = None):
    """`ray.init` of a Ray instance on this machine for this process only. Its processes get
    `ray_env/` first on their path (see ray_env/rfc3987_syntax.py: a slow optional import that
    made Ray's agents miss their start-up deadline on a loaded machine), then `paths`."""
    import ray
    path = os.pathsep.join([RAY_ENV_DIR, *paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path          # the raylet and its agents inherit it at start
    try:
        # address="local": a new instance even when a cluster runs here (`ray start`)
        return ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                        log_to_driver=False,
                        logging_level="WARNING",
                        runtime_env={"env_vars": {"PYTHONPATH": path, **(env or {})}})
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
