"""The one Python adapter for both compiled replay cores (replay/engine/v1/_core.c,
replay/engine/v0/_core.c; their shared C is replay/engine/kvcore.h): what a core cannot run
(`unavailable`), the arguments it takes (request arrays, the resolved spec as a dict read by field
name, cost constants, block keys), driving it in chunks of steps (progress, Ctrl-C) and turning its
columns into the `RawRun` the reference loop (replay/engine/loop.py) returns for the same replay.

No silent fallback: a core removes every spec field it reads from the dict it is given, and
`run` fails on any field left that `NOT_APPLICABLE` does not list for that core, so a new knob
without C support fails (tests/test_compiled.py) instead of replaying something else.
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Callable

import numpy as np

from replay.engine.prefix import TokenBlockKeys, TraceBlockKeys, UniqueBlockKeys, row_offsets
from replay.engine.raw import (BATCH_COLUMNS, EVENT_KINDS, OFFLOAD_STEP_COLUMNS, STEP_COLUMNS,
                               TBT_COLUMNS, ColumnChunks, ColumnSpill, RawRun, abort_reason)
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState
from replay.timing.cost_model import CostModel

try:
    from replay.engine.v1 import _core as _v1_core
except ImportError:             # not built (no C compiler at install time)
    _v1_core = None
try:
    from replay.engine.v0 import _core as _v0_core
except ImportError:
    _v0_core = None

CORES = {"v1": _v1_core, "v0": _v0_core}
SPILL_EVERY_STEPS = 1 << 20      # ~100 MB of step and TBT columns between two spills
# Steps per chunk handed to a sink: the store writer inserts each while the core runs on
# (replay/results/writer.py), so what is left to insert after the loop is at most this many.
# A quarter of DuckDB's row group: smaller chunks cost the writer thread more per row (~20% at
# 16,384).
SINK_EVERY_STEPS = 30_720

# sink(steps, tbt): the STEP_COLUMNS and TBT_COLUMNS of one chunk, in step order.
Sink = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None]

# SchedulerSpec fields a core does not read, and why (the reference scheduler of that engine does
# not read them either: tests/test_compiled.py checks both).
_BYTES = "events' bytes are blocks x kv_bytes_per_block, computed here (the executor prices swaps)"
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "v1": {"on_swap_full": "V0 only: V1 has no swap preemption",
           "v0_watermark": "V0's block-manager watermark"},
    "v0": {"long_prefill_token_threshold": "V1 knob", "scheduler_reserve_full_isl": "V1 knob",
           "watermark": "V1 knob (V0 uses v0_watermark)", "max_num_active_seqs": "V1 knob",
           "async_scheduling": "V1 knob (V0's async output processing is not modelled)",
           "kv_bytes_per_block": _BYTES,
           "vllm_version": "V1 release (V0 is vLLM 0.10's engine)",
           "cache_aware_admission_window": "V1 0.34 knob",
           "cache_aware_admission_threshold": "V1 0.34 knob",
           "max_num_inflight_kv_loads": "V1 0.34 knob (with its CPU KV offloading)",
           "arrival_ties": "V1's priority victim rule (V0 re-sorts running by priority)",
           "preemption_victim": "V1 what-if (vLLM PR #53723)"},
}


# The CPU KV offloading knobs (#16): the compiled V1 core models vLLM's OffloadingConnector
# (replay/engine/v1/_connector.h; its module constant `KV_OFFLOADING = 1`) and reads them all.
OFFLOAD_FIELDS = ("kv_offloading", "offload_prompt_only", "offload_eviction_policy",
                  "offload_blocks_per_chunk", "offload_store_threshold",
                  "offload_store_tracker_size", "offload_store_counting", "offload_transfer_steps",
                  "offload_host_link_bytes_per_s")


def has_offloading(engine: str) -> bool:
    """Whether the compiled core of `engine` models vLLM's OffloadingConnector."""
    return bool(getattr(CORES.get(engine), "KV_OFFLOADING", 0))


NOT_APPLICABLE["v0"].update({f: "V1 knob (V1's CPU KV offloading)" for f in OFFLOAD_FIELDS})


def spec_dict(spec: SchedulerSpec) -> dict:
    """The resolved spec as {field name: value}, what a core reads by name."""
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def unavailable_offloading_reason(engine: str) -> str:
    return (f"the compiled {engine} core does not model CPU KV offloading "
            "(--kv-offloading-size) yet")


def unavailable(engine: str, executor, keys, state: RequestState,
                spec: SchedulerSpec | None = None) -> str | None:
    """Why the compiled core of `engine` cannot run this replay (None when it can)."""
    if CORES.get(engine) is None:
        return f"the compiled {engine} core is not built (no C compiler at install time?)"
    if spec is not None and spec.kv_offloading and not has_offloading(engine):
        return unavailable_offloading_reason(engine)
    if type(executor) is not CostModel:
        return f"the {type(executor).__name__} executor is not the cost model the cores price with"
    if type(keys) is TokenBlockKeys and keys.all_tokens is None:
        return "token-id block keys without the requests' whole token lists"
    if type(keys) not in (TraceBlockKeys, UniqueBlockKeys, TokenBlockKeys):
        return f"{type(keys).__name__} block keys are not handed to C"
    if state.n >= 2**31 - 1:
        return "more than 2**31 requests (the cores keep rows as int32)"
    return None


# Cost constants for a core stepped from Python (StepCore: the caller prices each step).
_NO_COST_ARGS = (0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, None, False)


def new_core(engine: str, state: RequestState, spec: SchedulerSpec, executor: CostModel | None, keys,
             outputs: tuple, *, fields_in: dict | None = None, keys_in: tuple | None = None):
    """(core handle, the spec fields it did not read) for one replay; raises if the core left a
    field unread that it does not declare not applicable (`fields_in` overrides the spec dict:
    tests; `keys_in`: the keys already in `keys_args` form, arrays the caller fills in place as
    rows arrive: replay/fleet/run.py)."""
    ext = CORES[engine]
    if keys is not None and type(keys) is TraceBlockKeys and keys.block_size != spec.block_size:
        raise ValueError("trace keys were built for another block size")
    if engine == "v0" and not spec.enable_prefix_caching:
        # Without prefix caching V0 never looks at keys: unique ones keep the core's lookups cheap.
        keys, keys_in = UniqueBlockKeys(), None
    arrays = (state.arrival_s, state.prompt_len, state.output_len, state.status,
              state.num_computed, state.num_output, state.num_preemptions, state.num_swaps,
              state.num_recomputes, state.recomputed_tokens, state.cached_prompt_tokens,
              state.computed_at_preemption, *outputs, state.priority, state.cpu_hit_tokens)
    left = dict(spec_dict(spec) if fields_in is None else fields_in)
    core = ext.new(arrays, left, executor.c_args() if executor is not None else _NO_COST_ARGS,
                   keys_in or keys_args(keys, state, spec.block_size))
    unread = sorted(set(left) - set(NOT_APPLICABLE[engine]))
    if unread:
        raise AssertionError(f"the compiled {engine} core does not read spec field(s) {unread}: "
                             f"read them in replay/engine/{engine}/_core.c or declare them in "
                             "replay.engine.compiled.NOT_APPLICABLE")
    return core, left


def keys_args(keys, state: RequestState, block_size: int) -> tuple:
    """kvcore.h `keys_take`: (mode, hash_block_tokens, chain offsets, chain ids, shared blocks);
    token-id keys go as mode 2: every block key precomputed, per row in order."""
    if type(keys) is UniqueBlockKeys:
        return (0, 1, None, None, None)
    if type(keys) is TokenBlockKeys:
        per_row = keys.precomputed(state.n)
        lens = np.fromiter(map(len, per_row), np.int64, len(per_row))
        off = row_offsets(lens)
        ids = np.fromiter((k for ks in per_row for k in ks), np.int64, int(off[-1]))
        return (2, 1, off, ids if len(ids) else np.zeros(1, np.int64), lens)
    ids = keys.chain_ids
    return (1, keys.hash_block_tokens, keys.offsets, ids if len(ids) else np.zeros(1, np.int64),
            keys.shared_blocks)


def run(engine: str, state: RequestState, spec: SchedulerSpec, executor: CostModel, keys, *,
        kv_bytes_per_block: int, on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000, check: bool = False,
        record_batches: bool | tuple[int, int] = False, spill_dir: str | None = None,
        spill_every_steps: int | None = None, sink: Sink | None = None,
        sink_every_steps: int | None = None, keep_steps: bool = True) -> RawRun:
    """Replay every request of `state` in the compiled core of `engine` (check `unavailable`
    first). `check=True` verifies the block-accounting invariants at the end (tests);
    `record_batches` keeps every step's batch (RawRun.batches); (first, last): only the batches of
    those steps (1-based, inclusive, as the `steps` table numbers them).
    With `spill_dir`, a run longer than `spill_every_steps` steps moves its step and TBT columns
    out of the core into files under that folder every `spill_every_steps` steps
    (`RawRun.spilled`): memory bounded by the requests, not by the steps (batch records, when
    asked for, stay in memory).
    With `sink`, the step and TBT columns leave the core every `sink_every_steps` steps and at
    the end, and `sink(steps, tbt)` gets each chunk while the core runs on without the GIL
    (`kvcap replay`'s store writer appends it meanwhile); the run keeps the chunks
    (`RawRun.spilled`: in memory, moved to files once past `spill_every_steps` with
    `spill_dir`). `keep_steps=False` (with a sink: a summary replay, replay/results/summary.py): the
    chunks go to the sink only and the run keeps none (its `steps` and TBT columns are empty,
    `num_steps` counts them)."""
    if not keep_steps and sink is None:
        raise ValueError("keep_steps=False needs a sink for the step columns")
    n = state.n
    if n and np.any(np.diff(state.arrival_s) < 0):
        raise ValueError("requests must be sorted by arrival_s")
    first_sched, first_tok, finish = (np.full(n, np.nan) for _ in range(3))
    max_tbt = np.zeros(n)
    ext = CORES[engine]
    core, _ = new_core(engine, state, spec, executor, keys,
                       (first_sched, first_tok, finish, max_tbt))
    if record_batches:
        # (first, last) table steps (1-based, inclusive): record those steps' batches only.
        lo, hi = ((record_batches[0] - 1, record_batches[1] - 1)
                  if isinstance(record_batches, tuple) else (0, 2 ** 63 - 1))
        ext.record_batches(core, True, lo, hi)
    drain = _Drain(sink, spill_dir, spill_every_steps or SPILL_EVERY_STEPS,
                   sink_every_steps or SINK_EVERY_STEPS, keep=keep_steps)
    chunk = progress_every_steps if on_progress is not None else 1 << 40
    if drain.every is not None:
        chunk = min(chunk, drain.every)
    drained_at = 0
    while True:
        done, step, t, cursor = ext.run(core, chunk)
        if done:
            break
        if drain.every is not None and step - drained_at >= drain.every:
            drain.take(ext.results(core))
            drained_at = step
        if on_progress is not None:
            on_progress(t, cursor)
    if check:
        ext.check(core)
    out = ext.results(core)
    if drain.held is not None or sink is not None:
        drain.take(out)
        out.update({k: b"".join(v) for k, v in drain.pieces.items()})
    raw = _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block,
               drain.held)
    if not keep_steps:
        raw.num_steps = drain.n
    if record_batches:
        count = _col(out, "b_count", np.int32)
        raw.batches = {"step": np.repeat(np.arange(len(count), dtype=np.int64), count),
                       "row": _col(out, "b_row", np.int32).astype(np.int64),
                       "num_new_tokens": _col(out, "b_new", np.int64),
                       "num_computed_tokens": _col(out, "b_ctx", np.int64),
                       "kind": _col(out, "b_kind", np.int8)}
        assert raw.batches.keys() == BATCH_COLUMNS.keys()
    if out.get("aborted"):
        raw.status, raw.abort_s = "aborted", out["abort_s"]
        raw.abort_reason = abort_reason(out["abort_row"], out["abort_needed"], out["abort_free"])
    return raw


def _col(out: dict, name: str, dtype) -> np.ndarray:
    return np.frombuffer(out[name], dtype=dtype)


def _steps(out: dict) -> dict[str, np.ndarray]:
    """The step columns a core handed back; a core without offloading has no offload columns
    (`unavailable` refuses offloading for it, so they are zero)."""
    n = len(out["start_s"]) // 8
    return {k: (_col(out, k, t) if k in out or k not in OFFLOAD_STEP_COLUMNS
                else np.zeros(n, t)) for k, t in STEP_COLUMNS.items()}


class _Drain:
    """Where the step and TBT columns go when they leave the core before the end: to the sink
    (if any), then kept as chunks in memory, or in spill files once a spilling run holds
    `spill_every_steps` of them; events, stalls and batch records gather in `pieces` (one
    entry per eventful step)."""

    def __init__(self, sink: Sink | None, spill_dir: str | None, spill_every_steps: int,
                 sink_every_steps: int, *, keep: bool = True) -> None:
        self.sink, self.spill_dir, self.spill_every_steps = sink, spill_dir, spill_every_steps
        self.keep = keep
        self.n = 0                                      # steps drained
        every = [k for k, on in ((spill_every_steps, spill_dir is not None),
                                 (sink_every_steps, sink is not None)) if on]
        self.every = min(every) if every else None      # steps between two drains
        self.held: dict[str, ColumnSpill | ColumnChunks] | None = None
        self.pieces: dict[str, list] = {}

    def take(self, out: dict) -> None:
        """Move the columns a core handed back (`results`: everything since the last call)."""
        steps = _steps(out)
        tbt = {"tbt_s": _col(out, "tbt_v", np.float64), "weight": _col(out, "tbt_w", np.int64)}
        self.n += len(steps["start_s"])
        if self.sink is not None:
            self.sink(steps, tbt)
        if self.keep:
            self._hold(steps, tbt)
        for k in list(out):
            if k.startswith(("ev_", "sl_", "b_")):
                self.pieces.setdefault(k, []).append(out.pop(k))
        for k in (*STEP_COLUMNS, "tbt_v", "tbt_w"):
            out[k] = b""

    def _hold(self, steps: dict[str, np.ndarray], tbt: dict[str, np.ndarray]) -> None:
        if self.held is None:
            self.held = {"steps": ColumnChunks(STEP_COLUMNS), "tbt": ColumnChunks(TBT_COLUMNS)}
        self.held["steps"].append(steps)
        self.held["tbt"].append(tbt)
        if (self.spill_dir is not None and type(self.held["steps"]) is ColumnChunks
                and self.held["steps"].n >= self.spill_every_steps):
            self.held = {name: _to_files(chunks, self.spill_dir)
                         for name, chunks in self.held.items()}


def _to_files(chunks: ColumnChunks, folder: str) -> ColumnSpill:
    spill = ColumnSpill(chunks.dtypes, folder)
    for piece in chunks.chunks():
        spill.append(piece)
    chunks.close()
    return spill


def _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block,
         spilled=None) -> RawRun:
    steps = _steps(out)
    blocks = _col(out, "ev_blocks", np.int64)
    events = {"t_s": _col(out, "ev_t", np.float64).tolist(),
              "step": _col(out, "ev_step", np.int64).tolist(),
              "row": _col(out, "ev_row", np.int64).tolist(),
              "kind": np.array(EVENT_KINDS, dtype=object)[_col(out, "ev_kind", np.int8)].tolist(),
              "blocks": blocks.tolist(),
              "bytes": (blocks * kv_bytes_per_block).tolist()}
    rows = _col(out, "sl_row", np.int64).tolist()
    stalls = {"row": rows, "preempted_s": _col(out, "sl_pre", np.float64).tolist(),
              "resumed_s": _col(out, "sl_res", np.float64).tolist(),
              "stall_s": _col(out, "sl_stall", np.float64).tolist(),
              "mode": np.array(["", "recompute", "swap"], dtype=object)[
                  _col(out, "sl_mode", np.int8)].tolist()}
    return RawRun(state=state, steps=steps, first_scheduled_s=first_sched, first_token_s=first_tok,
                  finish_s=finish, max_tbt_s=max_tbt, events=events, stalls=stalls,
                  tbt_values=_col(out, "tbt_v", np.float64).copy(),
                  tbt_weights=_col(out, "tbt_w", np.int64).copy(),
                  sim_seconds=out["t"] - (float(state.arrival_s[0]) if state.n else 0.0),
                  num_steps=spilled["steps"].n if spilled else len(steps["start_s"]),
                  implementation="compiled", spilled=spilled)


class StepCore:
    """A compiled core driven one step at a time through the reference scheduler's contract
    (`replay.engine.plan.Scheduler` plus the oracle hooks `abort_request` and `snapshot`): the
    oracle and golden scenarios run on both implementations with it. `run` is the same steps without
    the round trips. The request counters live in `state` (the core writes its arrays in place).
    V0 plans carry the swap block pairs; V1 has no swap."""

    def __init__(self, engine: str, spec: SchedulerSpec, state: RequestState, keys) -> None:
        self.engine, self.spec, self.state = engine, spec, state
        self._ext = CORES[engine]
        if self._ext is None:
            raise RuntimeError(f"the compiled {engine} core is not built")
        n = state.n
        self._outputs = (np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.zeros(n))
        # No executor: the contract leaves pricing to the caller (the constants are never read).
        self._core, _ = new_core(engine, state, spec, None, keys, self._outputs)
        self._rows = np.zeros(0, np.int64)
        self.cache_aware: dict | None = None
        self._aborted = False

    # ------------------------------------------------------------- the Scheduler protocol
    def add_request(self, row: int) -> None:
        self._ext.add(self._core, row)

    def tell_time(self, now_s: float) -> None:
        """The loop's clock (timed offload transfers): the step's start before schedule(), its
        end before update()."""
        if self.engine == "v1":
            self._ext.tell_time(self._core, now_s)

    def offload_next_done_s(self) -> float | None:
        """When the next offload transfer in flight completes (the loop's idle jump)."""
        return self._ext.next_done_s(self._core) if self.engine == "v1" else None

    def abort_request(self, row: int) -> None:
        """A client abort (the oracle hook; trace replays have none)."""
        self._ext.abort(self._core, row)

    def schedule(self):
        from replay.engine.plan import Preemption, Rejection, StepPlan, SwapAbort
        p = self._ext.schedule(self._core)
        if "abort" in p:
            row, needed, free = p["abort"]
            self._aborted = True
            return StepPlan(abort=SwapAbort(row=row, num_cpu_blocks_needed=needed,
                                            num_cpu_blocks_free=free))
        rows = _col(p, "rows", np.int32).astype(np.int64)
        self._rows = rows
        ca = p.get("cache_aware")
        # The 0.34 cache-aware reorder of this step, as the reference records it.
        self.cache_aware = None if ca is None else {
            "usage": ca[0], "cached": dict(ca[1]), "before": ca[2], "after": ca[3]}
        mode = _col(p, "pre_mode", np.int8).tolist()
        npre = len(mode)
        prio = _col(p, "pre_prio", np.uint8).tolist() if "pre_prio" in p else [0] * npre
        pre = tuple(Preemption(row=r, mode="swap" if m == 2 else "recompute", num_blocks=b,
                               swap_full_fallback=bool(f), by_priority=bool(y))
                    for r, m, b, f, y in zip(_col(p, "pre_rows", np.int32).tolist(), mode,
                                             _col(p, "pre_blocks", np.int64).tolist(),
                                             _col(p, "pre_fallback", np.uint8).tolist(), prio))
        rej = tuple(Rejection(row=r, reason="") for r in _col(p, "rej_rows", np.int32).tolist())
        if "swap_out" in p:
            swap = dict(swap_out=_col(p, "swap_out", np.int64).reshape(-1, 2).copy(),
                        swap_in=_col(p, "swap_in", np.int64).reshape(-1, 2).copy(),
                        swapped_in=tuple(_col(p, "si_rows", np.int32).tolist()))
        else:
            swap = {}
        return StepPlan(rows=rows, num_new_tokens=_col(p, "num_new", np.int64).copy(),
                        num_computed_tokens=_col(p, "num_computed", np.int64).copy(),
                        is_prefill=_col(p, "prefill", np.uint8).astype(bool),
                        kind=_col(p, "kind", np.int8).copy() if "kind" in p else None,
                        preempted=pre, rejected=rej, **swap,
                        offload=_offload_plan(p.get("offload")))

    def update(self, plan):
        from replay.engine.plan import StepOutput
        sampled, fin, *done = self._ext.update(self._core)
        sampled = plan.rows[np.frombuffer(sampled, np.uint8) != 0]
        return StepOutput(sampled=tuple(sampled.tolist()),
                          finished=np.frombuffer(fin, np.int32).astype(np.int64),
                          offload_done=tuple((r, "store" if s else "load")
                                             for r, s in (done[0] if done else ())))

    def _snap(self) -> dict:
        return self._ext.snapshot(self._core)

    def has_unfinished(self) -> bool:
        s = self._snap()
        return not self._aborted and bool(s["running"] or s["waiting"] or s.get("swapped")
                                          or s.get("unfinished"))

    @property
    def num_running(self) -> int:
        return len(self._snap()["running"])

    @property
    def num_waiting(self) -> int:
        return len(self._snap()["waiting"])

    @property
    def num_swapped(self) -> int:
        return len(self._snap()["swapped"]) if self.engine == "v0" else 0

    def block_table(self, row: int) -> list[int]:
        return list(self._snap()["tables"].get(row, ()))

    def gpu_blocks_used(self) -> int:
        free = self._snap()["free_gpu"]
        return self.spec.num_gpu_blocks - free - (self.engine == "v1")

    def cpu_blocks_used(self) -> int:
        s = self._snap()
        return self.spec.num_cpu_blocks - s["free_cpu"] if self.engine == "v0" else s["cpu_used"]

    def snapshot(self) -> dict:
        """The oracle hook, as the reference scheduler of the engine returns it."""
        s, spec = self._snap(), self.spec
        if self.engine == "v0":
            return {"waiting": s["waiting"], "running": s["running"], "swapped": s["swapped"],
                    "free_gpu": s["free_gpu"], "free_cpu": s["free_cpu"], "blocks": s["tables"]}
        waiting = s["waiting"]
        if spec.policy == "priority":
            # kv_holding_waiting (loading requests) in its order, then the heap array in vLLM's
            # iteration order: sorted by (priority, arrival, row).
            prio, arr, nk = self.state.priority, self.state.arrival_s, s["num_kv_holding"]
            waiting = waiting[:nk] + sorted(waiting[nk:], key=lambda r: (prio[r], arr[r], r))
        usable = spec.num_gpu_blocks - 1
        out = {"waiting": waiting, "running": s["running"], "swapped": [],
               "free_gpu": s["free_gpu"], "free_cpu": None, "blocks": s["tables"],
               "computed": {r: int(self.state.num_computed[r]) for r in self._rows.tolist()},
               "kv_usage": 0.0 if usable == 0 else 1.0 - s["free_gpu"] / usable,
               "free_queue": s["free_queue"]}
        if s.get("offload") is not None:
            # The OffloadingConnector's tier (tests/oracle_driver.py): loading rows, chunks
            # being stored, the policy's order; free_cpu counts chunks holding no data.
            out.update(s["offload"])
        return out


def _offload_plan(off: dict | None):
    """StepPlan.offload from a V1 core's schedule() (NO_OFFLOAD without the connector)."""
    from replay.engine.plan import NO_OFFLOAD, OffloadPlan, OffloadTransfer
    if off is None:
        return NO_OFFLOAD

    def transfers(jobs):
        return tuple(OffloadTransfer(row=r, num_tokens=n, gpu_blocks=tuple(b), chunks=tuple(i),
                                     keys=tuple(k)) for r, n, b, i, k in jobs)
    return OffloadPlan(
        lookups=tuple(off["lookups"]), hits=tuple(off["hits"]), loads=transfers(off["loads"]),
        stores=transfers(off["stores"]), evicted=tuple(off["evicted"]),
        store_failed=tuple(off["failed"]), flushed=tuple(off["flushed"]))
