"""The replay loop: a virtual clock driving a scheduler through an executor.

Owns time. Tie order (also in docs/design.md): a request is added to the engine at the start of the
first step whose start time is >= its arrival time; requests arriving at the same time, or during
the same step, are added in trace order (the trace is sorted by arrival, stably). When the engine
holds nothing unfinished the clock jumps to the next arrival. A step that schedules nothing still
costs the executor's fixed overhead (vLLM's loop also spins); if the engine can make no progress at
all (nothing scheduled, nothing preempted, nothing arriving), the run stops and leaves the rest
`unfinished` rather than hang.

The fast path asks the scheduler how many of the next steps are steady decode steps and advances
them at once; `step_by_step=True` forces the one-step path (the oracle for the differential tests).
Both produce identical columns.

Imports numpy and replay's engine modules only (the torch stub runs this loop on machines without
polars or DuckDB). Must not import traces/, capacity/, polars or duckdb.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable, Protocol

import numpy as np

from replay.plan import Scheduler, StepPlan
from replay.state import RequestState, Status


class Executor(Protocol):
    def step_s(self, plan: StepPlan, num_sampled: int) -> float: ...
    # Fast path only (executors with supports_steady = False need neither):
    def steady_step_s(self, num_computed: np.ndarray, num_steps: int) -> np.ndarray: ...
    def decode_step_s(self, batch: int, context_tokens: int) -> float: ...


class _StepLog:
    """The per-step table, recorded cheaply: event steps as Python scalars, steady runs as one
    segment each (constants + three arrays), expanded into numpy columns once at the end."""

    def __init__(self) -> None:
        self.ev_rows: list[tuple] = []              # (step index, *STEP_COLUMNS values)
        self.segs: list[tuple] = []                 # (first step index, k, b, waiting, swapped,
                                                    #  cpu_used, evicted_requests, evicted_blocks)
        self.seg_start: list[np.ndarray] = []
        self.seg_dur: list[np.ndarray] = []
        self.seg_gpu: list[np.ndarray] = []

    def frozen(self, num_steps: int) -> dict[str, np.ndarray]:
        cols = {k: np.zeros(num_steps, dtype=t) for k, t in STEP_COLUMNS.items()}
        if self.ev_rows:
            ev = list(zip(*self.ev_rows))
            idx = np.asarray(ev[0], dtype=np.int64)
            for j, k in enumerate(STEP_COLUMNS, start=1):
                cols[k][idx] = np.asarray(ev[j], dtype=cols[k].dtype)
        if self.segs:
            seg = np.asarray(self.segs, dtype=np.int64)
            i0, k = seg[:, 0], seg[:, 1]
            offs = np.cumsum(k) - k
            pos = np.repeat(i0 - offs, k) + np.arange(int(k.sum()))
            cols["start_s"][pos] = np.concatenate(self.seg_start)
            cols["duration_s"][pos] = np.concatenate(self.seg_dur)
            cols["gpu_blocks_used"][pos] = np.concatenate(self.seg_gpu)
            for j, name in ((2, "num_running"), (2, "num_decode_tokens"), (3, "num_waiting"),
                            (4, "num_swapped"), (5, "cpu_blocks_used"), (6, "evicted_requests"),
                            (7, "evicted_blocks")):
                cols[name][pos] = np.repeat(seg[:, j], k)
        return cols


STEP_COLUMNS = {
    "start_s": np.float64, "duration_s": np.float64, "num_running": np.int32,
    "num_waiting": np.int32, "num_swapped": np.int32, "num_prefill_tokens": np.int64,
    "num_decode_tokens": np.int64, "gpu_blocks_used": np.int64, "cpu_blocks_used": np.int64,
    "swap_out_blocks": np.int32, "swap_in_blocks": np.int32, "num_preempted": np.int32,
    # Requests preempted in swap mode and not yet resumed, and their KV blocks (per GPU): the
    # concurrently evicted KV the host tier must hold (size-swap's demand series).
    "evicted_requests": np.int32, "evicted_blocks": np.int64,
}


@dataclass(slots=True, kw_only=True)
class RawRun:
    """Everything a replay produced, as numpy columns (results.py turns it into tables)."""
    state: RequestState
    steps: dict[str, np.ndarray]
    # Per request (trace row).
    first_scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    max_tbt_s: np.ndarray
    # Events: parallel lists (eventful steps only, so plain lists are cheap).
    events: dict[str, list] = field(default_factory=dict)
    # Preemption stalls: the TBT sample that spans a preemption.
    stalls: dict[str, list] = field(default_factory=dict)
    # Fleet TBT samples as (value, weight): a steady run contributes each step duration once,
    # weighted by its batch size, so a day of decode steps costs O(steps), not O(tokens).
    tbt_values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tbt_weights: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    status: str = "completed"          # "completed" | "aborted"
    abort_s: float | None = None
    abort_reason: str | None = None
    sim_seconds: float = 0.0
    num_steps: int = 0


# Steady runs of up to this many rows and steps do their per-row bookkeeping on Python lists: a
# numpy call costs about a microsecond whatever its size, more than a few dozen scalar operations.
_SMALL = 64

EVENT_KINDS = ("preempt_recompute", "preempt_swap", "swap_in", "swap_full_fallback",
               "swap_full_abort", "reject")


def run(state: RequestState, scheduler: Scheduler, executor: Executor, *,
        kv_bytes_per_block: int, step_by_step: bool = False,
        on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000) -> RawRun:
    """Replay every request of `state` (rows sorted by arrival) through `scheduler`."""
    if not step_by_step:
        # A compiled core runs the whole loop where it covers the engine (replay/compiled.py).
        from replay.v0 import core as v0_core
        from replay.v1 import core as v1_core
        for core in (v1_core, v0_core):
            if core.ineligible(scheduler, executor) is None:
                return core.run(state, scheduler, executor, kv_bytes_per_block=kv_bytes_per_block,
                                on_progress=on_progress, progress_every_steps=progress_every_steps)
    n = state.n
    arrival = state.arrival_s
    if n and np.any(np.diff(arrival) < 0):
        raise ValueError("requests must be sorted by arrival_s")
    nan = np.full(n, np.nan)
    first_sched, first_tok, finish, last_tok = nan.copy(), nan.copy(), nan.copy(), nan.copy()
    max_tbt = np.zeros(n)
    preempted_at = nan.copy()            # time of the last preemption since the last token
    preempt_mode = np.zeros(n, np.int8)  # 1 recompute, 2 swap
    log = _StepLog()
    ev = {k: [] for k in ("t_s", "step", "row", "kind", "blocks", "bytes")}
    stalls = {k: [] for k in ("row", "preempted_s", "resumed_s", "stall_s", "mode")}
    # Fleet TBT samples as (values, weights) chunks. Rows that also produced a token in the
    # previous step all share one gap value, so each step adds one weighted sample plus the few
    # rows that did not (resumed, skipped): memory O(steps), not O(tokens).
    # Flat Python lists (one entry per sample, in order): appending a scalar is far cheaper than
    # keeping a list of tiny arrays and concatenating 100k+ of them at the end.
    tbt_vals: list[float] = []
    tbt_wts: list[int] = []

    def add_gaps(end: float, prev: np.ndarray) -> np.ndarray:
        """Record the TBT samples end - prev; return them (per row)."""
        gap = end - prev
        same = prev == t
        k = int(np.count_nonzero(same))
        if k:
            tbt_vals.append(end - t); tbt_wts.append(k)
        if k < len(prev):
            odd = gap[~same].tolist()
            tbt_vals.extend(odd); tbt_wts.extend([1] * len(odd))
        return gap

    raw = RawRun(state=state, steps={}, first_scheduled_s=first_sched, first_token_s=first_tok,
                 finish_s=finish, max_tbt_s=max_tbt, events=ev, stalls=stalls)

    t = 0.0 if n == 0 else float(arrival[0])
    cursor = 0
    step = 0
    idle_spins = 0
    # An executor that must see every step (the torch stub) turns the fast path off.
    steady_ok = getattr(executor, "supports_steady", True)
    evicted = np.zeros(n, np.int64)      # blocks of each swap-preempted request not yet resumed
    evicted_total = evicted_count = 0

    def event(kind: str, row: int, blocks: int) -> None:
        ev["t_s"].append(t); ev["step"].append(step); ev["row"].append(row)
        ev["kind"].append(kind); ev["blocks"].append(blocks)
        ev["bytes"].append(blocks * kv_bytes_per_block)

    while True:
        # Arrivals due by now enter in trace order.
        while cursor < n and arrival[cursor] <= t:
            scheduler.add_request(cursor)
            cursor += 1
        if not scheduler.has_unfinished():
            if cursor >= n:
                break
            t = max(t, float(arrival[cursor]))     # idle gap: jump to the next arrival
            continue

        k_max = 0 if step_by_step or not steady_ok else scheduler.max_steady_steps()
        if k_max > 0:
            rows = scheduler.running_rows()
            ctx = state.num_computed[rows]
            if cursor < n:
                # Durations grow with context, so steps before the next arrival are at most
                # (gap / first duration) + 1: evaluate no more of them than that.
                d0 = executor.decode_step_s(len(rows), int(ctx.sum()))
                k_max = min(k_max, int((float(arrival[cursor]) - t) / d0) + 2)
            durations = executor.steady_step_s(ctx, k_max)
            b = len(rows)
            if b <= _SMALL and k_max <= _SMALL:
                # Few rows, few steps: the same arithmetic on Python floats (accumulate adds in
                # order, like cumsum; max equals np.maximum without NaNs) beats a dozen numpy calls.
                dur = durations.tolist()
                ends = list(accumulate(dur, initial=t))         # sequential, like t += d
                k = k_max if cursor >= n else bisect_left(ends, float(arrival[cursor]), 0, k_max)
                k = max(1, min(k, k_max))
                run_ = scheduler.advance_steady(k)
                k = run_.num_steps
                log.segs.append((step, k, b, scheduler.num_waiting, scheduler.num_swapped,
                                 scheduler.cpu_blocks_used(), evicted_count, evicted_total))
                log.seg_start.append(ends[:k]); log.seg_dur.append(dur[:k])
                log.seg_gpu.append(run_.gpu_blocks_used)
                end1 = ends[1]
                prev = last_tok[rows].tolist()
                same = prev.count(t)
                if same:
                    tbt_vals.append(end1 - t); tbt_wts.append(same)
                later_max = 0.0
                if k > 1:
                    later = [y - x for x, y in zip(ends[1:k], ends[2:k + 1])]
                    later_max = max(later)
                if same < b:
                    odd = [end1 - p for p in prev if p != t]
                    tbt_vals.extend(odd); tbt_wts.extend([1] * len(odd))
                    top = [max(end1 - p, later_max) for p in prev]
                else:
                    top = max(end1 - t, later_max)
                if k > 1:
                    tbt_vals.extend(later); tbt_wts.extend([b] * (k - 1))
                max_tbt[rows] = np.maximum(max_tbt[rows], top)
                t = ends[k]
                last_tok[rows] = t
                if len(run_.finished):
                    finish[run_.finished] = t
                step += k
                if on_progress is not None and \
                        step // progress_every_steps != (step - 1) // progress_every_steps:
                    on_progress(t, cursor)
                continue
            ends = np.cumsum(np.concatenate(([t], durations)))   # sequential, like t += d
            k = k_max if cursor >= n else int(np.searchsorted(ends[:-1], arrival[cursor], "left"))
            k = max(1, min(k, k_max))
            run_ = scheduler.advance_steady(k)
            k = run_.num_steps          # a scheduler may stop a run early (it says how far it got)
            log.segs.append((step, k, b, scheduler.num_waiting, scheduler.num_swapped,
                             scheduler.cpu_blocks_used(), evicted_count, evicted_total))
            log.seg_start.append(ends[:k]); log.seg_dur.append(durations[:k])
            log.seg_gpu.append(run_.gpu_blocks_used)
            gap = add_gaps(float(ends[1]), last_tok[rows])
            later_max = 0.0
            if k > 1:
                # end - previous end, exactly as the one-step path computes each sample.
                later = ends[2:k + 1] - ends[1:k]
                tbt_vals.extend(later.tolist()); tbt_wts.extend([b] * (k - 1))
                later_max = float(later.max())
            max_tbt[rows] = np.maximum(max_tbt[rows], np.maximum(gap, later_max))
            t = float(ends[k])
            last_tok[rows] = t
            if len(run_.finished):
                finish[run_.finished] = t
            step += k
        else:
            plan = scheduler.schedule()
            if plan.abort is not None:
                a = plan.abort
                event("swap_full_abort", a.row, a.num_cpu_blocks_needed)
                raw.status, raw.abort_s = "aborted", t
                raw.abort_reason = (f"Aborted due to the lack of CPU swap space: request row {a.row} "
                                    f"needs {a.num_cpu_blocks_needed} CPU blocks, "
                                    f"{a.num_cpu_blocks_free} free")
                inside = (state.status != Status.PENDING) & (state.status != Status.FINISHED) & \
                         (state.status != Status.REJECTED)
                state.status[inside] = Status.ABORTED
                break
            for r in plan.rejected:
                event("reject", r.row, 0)
            for p in plan.preempted:
                if p.swap_full_fallback:
                    event("swap_full_fallback", p.row, p.num_blocks)
                event("preempt_swap" if p.mode == "swap" else "preempt_recompute", p.row, p.num_blocks)
                if np.isnan(preempted_at[p.row]):
                    preempted_at[p.row] = t
                preempt_mode[p.row] = 2 if p.mode == "swap" else 1
            for row, blocks in _swapped_in_blocks(plan, scheduler):
                event("swap_in", row, blocks)
            rows = plan.rows
            # Resumed (scheduled again, swapped in or dropped): no longer evicted.
            # (Only swap preemptions make a row evicted: skip the per-row scan while none is.)
            back = ([r for r in (*rows.tolist(), *(x.row for x in plan.rejected)) if evicted[r]]
                     if evicted_count else ())
            for r in back:
                evicted_total -= int(evicted[r]); evicted_count -= 1; evicted[r] = 0
            for p in plan.preempted:
                if p.mode == "swap" and not evicted[p.row]:
                    evicted[p.row] = max(p.num_blocks, 1)
                    evicted_total += int(evicted[p.row]); evicted_count += 1
            fresh = rows[np.isnan(first_sched[rows])]
            first_sched[fresh] = t
            num_prefill = int(plan.num_new_tokens[plan.is_prefill].sum())
            num_decode = int(plan.num_new_tokens[~plan.is_prefill].sum())
            queues = (scheduler.num_running, scheduler.num_waiting, scheduler.num_swapped)
            # A row samples when its chunk reaches the end of its known tokens (both schedulers'
            # rule); the executor runs the plan before update() frees finished requests' blocks.
            known = state.prompt_len[rows] + state.num_output[rows]
            num_sampled = int(np.count_nonzero(plan.num_computed_tokens + plan.num_new_tokens >= known))
            dt = executor.step_s(plan, num_sampled)
            out = scheduler.update(plan)
            sampled = rows[out.sampled]
            if len(sampled) != num_sampled:
                raise AssertionError(f"step {step + 1}: executor costed {num_sampled} sampled rows, "
                                     f"scheduler sampled {len(sampled)}")
            end = t + dt
            log.ev_rows.append((step, t, dt, *queues, num_prefill, num_decode,
                                scheduler.gpu_blocks_used(), scheduler.cpu_blocks_used(),
                                len(plan.swap_out), len(plan.swap_in), len(plan.preempted),
                                evicted_count, evicted_total))
            if len(sampled):
                first = np.isnan(first_tok[sampled])
                first_tok[sampled[first]] = end
                cont = sampled[~first]
                if len(cont):
                    gap = add_gaps(end, last_tok[cont])
                    max_tbt[cont] = np.maximum(max_tbt[cont], gap)
                    stalled = cont[~np.isnan(preempted_at[cont])]
                    for row in stalled.tolist():
                        stalls["row"].append(row); stalls["preempted_s"].append(preempted_at[row])
                        stalls["resumed_s"].append(end); stalls["stall_s"].append(end - last_tok[row])
                        stalls["mode"].append("swap" if preempt_mode[row] == 2 else "recompute")
                preempted_at[sampled] = np.nan
                last_tok[sampled] = end
            if len(out.finished):
                finish[out.finished] = end
            progressed = len(rows) or plan.preempted or plan.rejected or len(plan.swap_in)
            idle_spins = 0 if progressed else idle_spins + 1
            t = end
            step += 1
            if idle_spins >= 2:
                # Nothing can move until something arrives; jump there or give up.
                if cursor < n:
                    t = max(t, float(arrival[cursor]))
                    idle_spins = 0
                else:
                    break
        if on_progress is not None and step // progress_every_steps != (step - 1) // progress_every_steps:
            on_progress(t, cursor)
    raw.steps = log.frozen(step)
    raw.num_steps = step
    raw.sim_seconds = t - (float(arrival[0]) if n else 0.0)
    raw.tbt_values = np.array(tbt_vals, dtype=np.float64)
    raw.tbt_weights = np.array(tbt_wts, dtype=np.int64)
    return raw


def _swapped_in_blocks(plan: StepPlan, scheduler: Scheduler):
    """(row, blocks) per swapped-in request: the swap-in pairs whose GPU block is in that
    request's block table (called right after schedule(), when the tables hold them). A block
    counts for the first such request only: with prefix caching, a request admitted later in the
    same step may hit blocks an earlier one just loaded, and those were not copied for it."""
    if not plan.swapped_in:
        return
    dst = set(plan.swap_in[:, 1].tolist())
    for row in plan.swapped_in:
        mine = dst.intersection(scheduler.block_table(int(row)))
        dst -= mine
        yield int(row), len(mine)
