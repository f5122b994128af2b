"""Fleet replay: N identical replicas of one engine behind a router (issue 19).

The router decides when a request arrives, knowing only what a real router knows then:
- `rr`: round robin, the i-th request (arrival order) goes to replica i mod N;
- `prefix`: affinity by consistent hashing (`VNODES` points per replica on a 64-bit ring) of the
  request's session key: its first prefix hash (Mooncake's `hash_ids[0]`: requests that share a
  prefix land together and hit each other's prefix cache), else its tenant, else its request id;
- `lor`: least outstanding requests, the replica with the fewest requests sent to it that have
  not finished by the arrival instant (finished = last token at or before it; rejected and
  aborted requests leave when the engine drops them); ties go to the lowest replica index.

Every replica is the exact engine model (the compiled core of the engine). How each is driven:
- rr and prefix never look at replica state: the assignment is a function of the trace, so each
  replica replays its share to the end with `replay()` (in parallel processes). This is exact by
  construction: a replica sees exactly its requests at their arrival times.
- lor needs every replica's state at every arrival, so all replicas advance together in one
  process: before request i (arrival t) is routed, each replica's core takes every step that
  starts before t in its own C loop (`run_until(core, t)`: the loop a whole replay runs, stopped
  at the limit, replay/engine/kvcore.h `loop_run_until`). A step that starts before t cannot contain request i
  (the loop admits a request at the first step that starts at or after its arrival), so stepping
  up to t needs no knowledge of where i goes. The replica's request arrays are allocated for the
  whole trace with arrival +inf in the rows not yet routed; routing writes the next row in place
  (the core reads a row only once its arrival is due, replay/engine/kvcore.h `loop_run`). Each
  replica therefore replays bit-identically to `replay()` of the requests it was sent (tested: lor's
  stepping driven with the rr assignment equals rr's whole replays).
  lor needs the compiled core (no stepping of the Python reference) and the cost-model executor.
Must not import traces/, capacity/ or duckdb.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from replay.config import EngineConfig, resolve
from replay.engine import compiled
from replay.engine.state import RequestState, Status
from replay.fleet.routing import ROUTERS, static_assignment
from replay.results.tables import RunResult

_DONE = int(Status.FINISHED)      # statuses >= FINISHED are terminal (finished/rejected/aborted)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetResult:
    """One fleet replay: the fleet's identity, each replica's run (as `replay()` returns it) and
    the replica every trace row (arrival order) was sent to."""
    fleet_id: str
    router: str
    num_replicas: int
    trace_name: str
    replicas: tuple[RunResult, ...]
    assignment: np.ndarray = field(repr=False)
    wall_seconds: float

    def replica_requests(self) -> list[int]:
        return np.bincount(self.assignment, minlength=self.num_replicas).tolist()

    def tables(self, *, stacked: bool = False) -> dict[str, pl.DataFrame]:
        """The fleet's tables: every replica's rows with a `replica` column, and one `runs` row
        for the fleet (run_id = fleet_id; sim_seconds from the first arrival to the last replica's
        end; status aborted if any replica aborted), so the single-run analyses read a fleet.
        `stacked`: `steps` and `tbt` are `StackedTable`s over the replicas' own tables (in
        memory or spilled), not copies: what scoring a fleet of a day of traffic can afford."""
        from replay.results.tables import StackedTable
        out: dict[str, list[pl.DataFrame]] = {}
        for k, r in enumerate(self.replicas):
            for name, df in r.tables().items():
                if name == "runs" or (stacked and name in ("steps", "tbt")):
                    continue
                frame = df if isinstance(df, pl.DataFrame) else df.frame()
                out.setdefault(name, []).append(
                    frame.with_columns(replica=pl.lit(k, pl.Int32)))
        tables = {name: pl.concat(parts, how="vertical_relaxed") for name, parts in out.items()}
        if stacked:
            ks = list(range(len(self.replicas)))
            for name in ("steps", "tbt"):
                tables[name] = StackedTable([getattr(r, name) for r in self.replicas],
                                            column="replica", values=ks)
        return {"runs": pl.DataFrame([self.fleet_run()]), **tables}

    def fleet_run(self) -> dict:
        runs = [r.run for r in self.replicas]
        first = min(float(r.requests["arrival_s"].min()) for r in self.replicas
                    if r.requests.height)
        ends = [float(r.requests["arrival_s"].min()) + (r.run["sim_seconds"] or 0.0)
                for r in self.replicas if r.requests.height]
        run = dict(runs[0])
        run.update(run_id=self.fleet_id, label=f"fleet {self.router} x{self.num_replicas}",
                   num_requests=sum(r["num_requests"] for r in runs),
                   status="aborted" if any(r["status"] != "completed" for r in runs)
                   else "completed",
                   sim_seconds=max(ends) - first, num_steps=sum(r["num_steps"] for r in runs),
                   wall_seconds=self.wall_seconds,
                   abort_s=min((r["abort_s"] for r in runs if r["abort_s"] is not None),
                               default=None))
        return run

    def store_tables(self) -> list[dict]:
        """What the store writes (one transaction): each replica as a run of its own, and the
        `fleets` rows that tie them to the fleet (fleet_id, replica, run_id, router)."""
        out = []
        for k, r in enumerate(self.replicas):
            t = r.tables()
            t["fleets"] = pl.DataFrame({
                "fleet_id": [self.fleet_id], "replica": pl.Series([k], dtype=pl.Int32),
                "run_id": [r.run_id], "router": [self.router],
                "num_replicas": pl.Series([self.num_replicas], dtype=pl.Int32),
                "trace_name": [self.trace_name]})
            out.append(t)
        return out


def fleet_id_for(trace: pl.DataFrame, config: EngineConfig, *, replicas: int, router: str) -> str:
    from replay.run import trace_sha256
    key = f"fleet|{trace_sha256(trace)}|{config.config_json()}|{router}|{replicas}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _replica_run_id(fleet_id: str, k: int) -> str:
    return hashlib.sha256(f"{fleet_id}|replica|{k}".encode()).hexdigest()[:16]


# ------------------------------------------------------------------ lor: stepped replicas
class _SteppedReplica:
    """One replica's compiled core, grown one routed request at a time (see the module doc)."""

    def __init__(self, engine: str, eng, executor, src: RequestState, keys,
                 spill_dir: str | None = None) -> None:
        n = src.n
        self.engine, self.eng, self.executor, self.src, self.src_keys = engine, eng, executor, src, keys
        self.ext = compiled.CORES[engine]
        self.state = RequestState(arrival_s=np.full(n, np.inf), prompt_len=np.zeros(n, np.int64),
                                  output_len=np.zeros(n, np.int64), priority=np.zeros(n, np.int64))
        self.outputs = (np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.zeros(n))
        self.rows: list[int] = []          # trace rows sent here, in order (local row = index)
        self.core = None
        self.cursor = 0                    # local rows the core has admitted
        self.clock = -np.inf
        self.open = np.zeros(0, np.int64)  # local rows not yet gone (outstanding)
        self.keys_in = self._keys_in(keys, n)
        # With `spill_dir`, the step and TBT columns leave the core for files every
        # SPILL_EVERY_STEPS steps, as a whole replay's do (compiled.run): a replica of a day of
        # traffic holds its requests, not its steps.
        self._drain = (compiled._Drain(None, spill_dir, compiled.SPILL_EVERY_STEPS,
                                       compiled.SINK_EVERY_STEPS)
                       if spill_dir is not None else None)
        self._drained_at = 0

    def _keys_in(self, keys, n) -> tuple | None:
        """Block keys for local rows in the cores' argument form, filled in place as rows are
        routed (trace keys: the row's chain of prefix-hash ids); None: unique keys."""
        from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys
        if type(keys) is UniqueBlockKeys:
            return None
        if type(keys) is not TraceBlockKeys:
            raise ValueError(f"lor routing: {type(keys).__name__} block keys are not supported")
        mode, hbt, off, ids, shared = compiled.keys_args(keys, self.src, self.eng.spec.block_size)
        self._src_keys = (off, ids, shared)
        self._off = np.zeros(n + 1, np.int64)
        self._ids = np.zeros(max(len(ids), 1), np.int64)
        self._shared = np.zeros(n, np.int64)
        return (mode, hbt, self._off, self._ids, self._shared)

    def add(self, row: int) -> None:
        k = len(self.rows)
        s, d = self.src, self.state
        d.prompt_len[k], d.output_len[k], d.priority[k] = s.prompt_len[row], s.output_len[row], s.priority[row]
        if self.keys_in is not None:
            off, ids, shared = self._src_keys
            a, b = off[row], off[row + 1]
            self._off[k + 1] = self._off[k] + (b - a)
            self._ids[self._off[k]:self._off[k + 1]] = ids[a:b]
            self._shared[k] = shared[row]
        d.arrival_s[k] = s.arrival_s[row]          # last: the row is due from now on
        self.rows.append(row)
        self.open = np.append(self.open, k)
        if self.core is None:                       # the core's clock starts at its first arrival
            self.core, _ = compiled.new_core(self.engine, d, self.eng.spec, self.executor,
                                             self.src_keys, self.outputs, keys_in=self.keys_in)

    def advance(self, t: float) -> None:
        """Take every step that starts before t (they cannot contain a request arriving at t):
        the core's own loop (`run_until`), which admits every request due by a step's start and
        jumps an idle gap only to an arrival before t."""
        if self.core is not None:
            self._run_until(t)

    def drain(self) -> None:
        """Every step left once the whole trace is routed."""
        if self.core is not None:
            self._run_until(np.inf)

    def _run_until(self, t: float) -> None:
        _, step, clock, cursor = self.ext.run_until(self.core, t)
        if self._drain is not None and step - self._drained_at >= self._drain.every:
            self._drain.take(self.ext.results(self.core))
            self._drained_at = step
        if clock == np.inf or cursor > len(self.rows):
            raise RuntimeError("fleet replay: a replica's core went idle with work it could not "
                               "move (its loop looked for an arrival that is not routed yet)")
        self.cursor, self.clock = cursor, clock

    def outstanding(self, t: float) -> int:
        """Requests sent here and not gone by t (finished at or before t, rejected, aborted)."""
        o = self.open
        if not len(o):
            return 0
        st = self.state.status[o]
        fin = self.outputs[2][o]
        gone = (st >= _DONE) & ~(fin > t)          # a NaN finish (rejected, aborted) is gone
        self.open = o[~gone]
        return len(self.open)

    def raw(self):
        """The replica's RawRun over its local rows (as `compiled.run` builds it)."""
        from replay.engine.raw import abort_reason
        k = len(self.rows)
        d = self.state
        sub = RequestState(arrival_s=d.arrival_s[:k], prompt_len=d.prompt_len[:k],
                           output_len=d.output_len[:k], priority=d.priority[:k])
        for name in ("status", "num_computed", "num_output", "num_preemptions", "num_swaps",
                     "num_recomputes", "recomputed_tokens", "cached_prompt_tokens",
                     "computed_at_preemption"):
            setattr(sub, name, getattr(d, name)[:k].copy())
        out = self.ext.results(self.core)
        held = None
        if self._drain is not None and self._drain.held is not None:
            self._drain.take(out)                   # the rest, then every piece in step order
            out.update({key: b"".join(v) for key, v in self._drain.pieces.items()})
            held = self._drain.held
        fs, ft, fin, mt = (a[:k].copy() for a in self.outputs)
        raw = compiled._raw(sub, out, fs, ft, fin, mt, self.eng.kv_bytes_per_block, held)
        if out.get("aborted"):
            raw.status, raw.abort_s = "aborted", out["abort_s"]
            raw.abort_reason = abort_reason(out["abort_row"], out["abort_needed"], out["abort_free"])
        return raw


def _lor(trace: pl.DataFrame, config: EngineConfig, replicas: int, *, fleet_id: str,
         trace_name: str, assign: np.ndarray | None = None,
         spill_dir: str | None = None) -> tuple[list[RunResult], np.ndarray]:
    """Stepped replicas; `assign` (tests) replaces the lor choice by a given assignment."""
    from replay.timing.executors import cost_model_for
    from replay.run import block_keys, request_state, result_of
    wall0 = time.perf_counter()
    eng = resolve(config)
    state = request_state(trace)
    keys = block_keys(trace, eng.spec.block_size)
    ex = cost_model_for(eng, calibration=config.calibration)
    why = compiled.unavailable(config.scheduler, ex, keys, state)
    if why:
        raise ValueError(f"--router lor steps the compiled {config.scheduler} core, which cannot "
                         f"run here: {why}; use --router rr or prefix")
    reps = [_SteppedReplica(config.scheduler, eng, ex, state, keys, spill_dir)
            for _ in range(replicas)]
    chosen = np.zeros(state.n, np.int64)
    arrival = state.arrival_s
    for i in range(state.n):
        t = arrival[i]
        for r in reps:
            r.advance(t)
        if assign is None:
            k = int(np.argmin([r.outstanding(t) for r in reps]))
        else:
            k = int(assign[i])
        chosen[i] = k
        reps[k].add(i)
    results = []
    for k, r in enumerate(reps):
        r.drain()
        sub = trace[np.asarray(r.rows, np.int64)]
        if r.core is None:                          # sent nothing: an empty replay
            from replay.run import replay
            res = replay(sub, config, trace_name=trace_name)
            results.append(as_replica(res, fleet_id, k, router="lor", replicas=replicas))
            continue
        res = result_of(r.raw(), sub, config, eng, executor="model", label="",
                        trace_name=trace_name, wall0=wall0)
        r.core = None                               # its tables are made: free the core
        results.append(as_replica(res, fleet_id, k, router="lor", replicas=replicas))
    return results, chosen


def as_replica(r: RunResult, fleet_id: str, k: int, *, router: str, replicas: int) -> RunResult:
    """`r` (the replay of replica k's requests) relabelled as that replica of the fleet: its own
    run id (two replicas may be sent identical requests), the fleet in its label."""
    import dataclasses
    rid = _replica_run_id(fleet_id, k)
    run = dict(r.run, run_id=rid, label=f"fleet {fleet_id} {router} x{replicas} replica {k}")
    tables = {name: (df.with_columns(run_id=pl.lit(rid, pl.Utf8)) if isinstance(df, pl.DataFrame)
                     else _respill(df, rid))
              for name, df in r.tables().items() if name not in ("runs", "batches")}
    return dataclasses.replace(r, run=run, **tables)


def _respill(table, run_id: str):
    from replay.results.tables import SpilledTable
    return SpilledTable(table.spill, run_id, numbered=table.numbered)


Runner = Callable[[list[pl.DataFrame], EngineConfig], list[RunResult]]


def _sequential(subs: list[pl.DataFrame], config: EngineConfig, trace_name: str = ""
                ) -> list[RunResult]:
    from replay.run import replay
    return [replay(s, config, trace_name=trace_name) for s in subs]


def replay_fleet(trace: pl.DataFrame, config: EngineConfig | None = None, *, replicas: int,
                 router: str = "lor", trace_name: str = "", runner: Runner | None = None,
                 stepped: bool = False, spill_dir: str | None = None) -> FleetResult:
    """Replay `trace` on `replicas` identical engines behind `router`. rr / prefix replay each
    replica's share to the end through `runner` (sub-traces, config) -> runs (default: one
    after the other in this process; capacity passes its worker pool); lor steps all replicas
    together here. `stepped` drives rr / prefix through lor's stepping too (tests: both ways
    give the same tables). `spill_dir`: lor's replicas keep their steps and TBT samples in
    files there past a million steps (a runner spills its own replays, or not)."""
    config = config or EngineConfig()
    if router not in ROUTERS:
        raise ValueError(f"--router {router!r}: use one of {', '.join(ROUTERS)}")
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ValueError(f"--replicas {replicas!r}: must be a whole number >= 1")
    wall0 = time.perf_counter()
    if not trace["arrival_s"].is_sorted():
        trace = trace.sort("arrival_s", maintain_order=True)
    fid = fleet_id_for(trace, config, replicas=replicas, router=router)
    # One replica: every router sends it everything, so it replays whole (the compiled loop,
    # not lor's stepping: tests/test_fleet.py checks the tables are the single engine's).
    if (router == "lor" and replicas > 1) or stepped:
        assign = None if router == "lor" else static_assignment(trace, replicas, router)
        runs, chosen = _lor(trace, config, replicas, fleet_id=fid, trace_name=trace_name,
                            assign=assign, spill_dir=spill_dir)
    else:
        chosen = (np.zeros(trace.height, np.int64) if router == "lor"
                  else static_assignment(trace, replicas, router))
        subs = [trace.filter(pl.Series(chosen == k)) for k in range(replicas)]
        whole = (runner or (lambda s, c: _sequential(s, c, trace_name)))(subs, config)
        runs = [as_replica(r, fid, k, router=router, replicas=replicas)
                for k, r in enumerate(whole)]
    return FleetResult(fleet_id=fid, router=router, num_replicas=replicas, trace_name=trace_name,
                       replicas=tuple(runs), assignment=chosen,
                       wall_seconds=time.perf_counter() - wall0)
