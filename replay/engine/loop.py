"""The reference replay loop: a virtual clock driving a Python scheduler through an executor, one
step at a time (replay/engine/kvcore.h `loop_*` is the compiled cores' copy; replay/run.py
picks one).

Owns time. Tie order (also in docs/design.md): a request is added to the engine at the start of the
first step whose start time is >= its arrival time; requests arriving at the same time, or during
the same step, are added in trace order (the trace is sorted by arrival, stably). When the engine
holds nothing unfinished the clock jumps to the next arrival. A step that schedules nothing still
costs the executor's fixed overhead (vLLM's loop also spins); if the engine can make no progress at
all (nothing scheduled, nothing preempted, nothing arriving), the run stops and leaves the rest
`unfinished` rather than hang.

Imports numpy and replay's engine modules only (the torch stub runs this loop on machines without
polars or DuckDB). Must not import traces/, capacity/, polars or duckdb.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from replay.engine.plan import Scheduler, StepPlan
from replay.engine.raw import BATCH_COLUMNS, BATCH_KINDS, STEP_COLUMNS, RawRun, abort_reason
from replay.engine.state import RequestState, Status


class Executor(Protocol):
    def step_s(self, plan: StepPlan, num_sampled: int) -> float: ...


def run(state: RequestState, scheduler: Scheduler, executor: Executor, *,
        kv_bytes_per_block: int, on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000,
        record_batches: bool | tuple[int, int] = False) -> RawRun:
    """Replay every request of `state` (rows sorted by arrival) through `scheduler`;
    `record_batches` keeps every step's batch (RawRun.batches); (first, last): only those steps'
    (1-based, inclusive, as the `steps` table numbers them)."""
    n = state.n
    arrival = state.arrival_s
    if n and np.any(np.diff(arrival) < 0):
        raise ValueError("requests must be sorted by arrival_s")
    # Per request, as Python lists while the loop runs (a step touches ~10 rows: scalar reads
    # and writes of a list are several times cheaper than numpy's); numpy columns at the end
    # (None, "not yet", becomes NaN there).
    first_sched, first_tok, finish, last_tok = [None] * n, [None] * n, [None] * n, [None] * n
    max_tbt = [0.0] * n
    preempted_at = [None] * n            # time of the last preemption since the last token
    preempt_mode = [0] * n               # 1 recompute, 2 swap
    prompt_len = state.prompt_len.tolist()
    arrival_s = arrival.tolist()
    step_rows: list[tuple] = []         # STEP_COLUMNS values, one tuple per step
    ev = {k: [] for k in ("t_s", "step", "row", "kind", "blocks", "bytes")}
    stalls = {k: [] for k in ("row", "preempted_s", "resumed_s", "stall_s", "mode")}
    # Fleet TBT samples as (value, weight): rows that also produced a token in the previous step
    # all share one gap value, so each step adds one weighted sample plus the few rows that did
    # not (resumed, skipped): memory O(steps), not O(tokens).
    tbt_vals: list[float] = []
    tbt_wts: list[int] = []
    # Per-step batch records: one array per step and column, joined at the end.
    batch_parts: list[tuple] = []

    raw = RawRun(state=state, steps={}, first_scheduled_s=np.zeros(0), first_token_s=np.zeros(0),
                 finish_s=np.zeros(0), max_tbt_s=np.zeros(0), events=ev, stalls=stalls)

    t = 0.0 if n == 0 else float(arrival[0])
    cursor = 0
    step = 0
    idle_spins = 0
    evicted = [0] * n                    # blocks of each swap-preempted request not yet resumed
    evicted_total = evicted_count = 0

    # A V1 scheduler with timed CPU offload transfers reads the clock: the step's start before
    # schedule(), its end before update() (replay/engine/v1/offload.py).
    tell_time = getattr(scheduler, "tell_time", None)
    next_transfer_s = getattr(scheduler, "offload_next_done_s", None)

    def event(kind: str, row: int, blocks: int) -> None:
        ev["t_s"].append(t); ev["step"].append(step); ev["row"].append(row)
        ev["kind"].append(kind); ev["blocks"].append(blocks)
        ev["bytes"].append(blocks * kv_bytes_per_block)

    while True:
        # Arrivals due by now enter in trace order.
        while cursor < n and arrival_s[cursor] <= t:
            scheduler.add_request(cursor)
            cursor += 1
        if not scheduler.has_unfinished():
            if cursor >= n:
                break
            t = max(t, arrival_s[cursor])          # idle gap: jump to the next arrival
            continue

        if tell_time is not None:
            tell_time(t)
        plan = scheduler.schedule()
        if plan.abort is not None:
            a = plan.abort
            event("swap_full_abort", a.row, a.num_cpu_blocks_needed)
            raw.status, raw.abort_s = "aborted", t
            raw.abort_reason = abort_reason(a.row, a.num_cpu_blocks_needed, a.num_cpu_blocks_free)
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
            if preempted_at[p.row] is None:
                preempted_at[p.row] = t
            preempt_mode[p.row] = 2 if p.mode == "swap" else 1
        for row, blocks in _swapped_in_blocks(plan, scheduler):
            event("swap_in", row, blocks)
        # CPU KV offloading (V1 connector): one event per transfer issued, loads then stores.
        load_blocks = store_blocks = 0
        for x in plan.offload.loads:
            event("offload_load", x.row, len(x.gpu_blocks))
            load_blocks += len(x.gpu_blocks)
        for x in plan.offload.stores:
            event("offload_store", x.row, len(x.gpu_blocks))
            store_blocks += len(x.gpu_blocks)
        rows = plan.rows
        row_list = rows.tolist()
        # Resumed (scheduled again, swapped in or dropped): no longer evicted.
        # (Only swap preemptions make a row evicted: skip the per-row scan while none is.)
        back = ([r for r in (*row_list, *(x.row for x in plan.rejected)) if evicted[r]]
                 if evicted_count else ())
        for r in back:
            evicted_total -= evicted[r]; evicted_count -= 1; evicted[r] = 0
        for p in plan.preempted:
            if p.mode == "swap" and not evicted[p.row]:
                evicted[p.row] = max(p.num_blocks, 1)
                evicted_total += evicted[p.row]; evicted_count += 1
        # A row samples when its chunk reaches the end of its known tokens (both schedulers'
        # rule); the executor runs the plan before update() frees finished requests' blocks.
        num_prefill = num_decode = num_sampled = 0
        for r, new, computed, prefill, out in zip(
                row_list, plan.num_new_tokens.tolist(), plan.num_computed_tokens.tolist(),
                plan.is_prefill.tolist(), state.num_output[rows].tolist()):
            if first_sched[r] is None:
                first_sched[r] = t
            if prefill:
                num_prefill += new
            else:
                num_decode += new
            if computed + new >= prompt_len[r] + out:
                num_sampled += 1
        queues = (scheduler.num_running, scheduler.num_waiting, scheduler.num_swapped)
        if record_batches and (record_batches is True
                               or record_batches[0] <= step + 1 <= record_batches[1]):
            kind = (plan.kind if plan.kind is not None else
                    np.where(plan.is_prefill, _PREFILL, _DECODE).astype(np.int8))
            batch_parts.append((np.full(len(rows), step, np.int64), rows,
                                plan.num_new_tokens, plan.num_computed_tokens, kind))
        dt = executor.step_s(plan, num_sampled)
        if tell_time is not None:
            tell_time(t + dt)
        out = scheduler.update(plan)
        sampled = out.sampled
        if len(sampled) != num_sampled:
            raise AssertionError(f"step {step + 1}: executor costed {num_sampled} sampled rows, "
                                 f"scheduler sampled {len(sampled)}")
        end = t + dt
        step_rows.append((t, dt, *queues, num_prefill, num_decode, scheduler.gpu_blocks_used(),
                          scheduler.cpu_blocks_used(), len(plan.swap_out), len(plan.swap_in),
                          len(plan.preempted), evicted_count, evicted_total, store_blocks,
                          load_blocks))
        # TBT: the rows that also sampled in the previous step (last token at t) add one weighted
        # sample, then the others (resumed, skipped) one sample each, in batch order.
        num_same = 0
        odd: list[float] = []
        for r in sampled:
            prev = last_tok[r]
            if first_tok[r] is None:
                first_tok[r] = end
            else:
                gap = end - prev
                if prev == t:
                    num_same += 1
                else:
                    odd.append(gap)
                if gap > max_tbt[r]:
                    max_tbt[r] = gap
                if preempted_at[r] is not None:
                    stalls["row"].append(r); stalls["preempted_s"].append(preempted_at[r])
                    stalls["resumed_s"].append(end); stalls["stall_s"].append(gap)
                    stalls["mode"].append("swap" if preempt_mode[r] == 2 else "recompute")
            preempted_at[r] = None
            last_tok[r] = end
        if num_same:
            tbt_vals.append(end - t); tbt_wts.append(num_same)
        if odd:
            tbt_vals.extend(odd); tbt_wts.extend([1] * len(odd))
        # A request finishes with its last token (async: applied one step after it came).
        for r in out.finished.tolist():
            finish[r] = last_tok[r]
        progressed = (len(rows) or plan.preempted or plan.rejected or len(plan.swap_in)
                      or len(out.finished) or plan.offload.loads or plan.offload.stores
                      or out.offload_done)
        idle_spins = 0 if progressed else idle_spins + 1
        t = end
        step += 1
        if idle_spins >= 2:
            # Nothing can move until something arrives or a CPU offload transfer completes;
            # jump there or give up.
            wake = [arrival_s[cursor]] if cursor < n else []
            done_s = next_transfer_s() if next_transfer_s is not None else None
            if done_s is not None:
                wake.append(done_s)
            if wake:
                t = max(t, min(wake))
                idle_spins = 0
            else:
                break
        if on_progress is not None and step // progress_every_steps != (step - 1) // progress_every_steps:
            on_progress(t, cursor)
    raw.first_scheduled_s = np.array(first_sched, dtype=np.float64)
    raw.first_token_s = np.array(first_tok, dtype=np.float64)
    raw.finish_s = np.array(finish, dtype=np.float64)
    raw.max_tbt_s = np.array(max_tbt, dtype=np.float64)
    # One conversion of the step table (its integers are counts, exact in float64), then columns.
    table = np.array(step_rows, dtype=np.float64).reshape(-1, len(STEP_COLUMNS))
    raw.steps = {k: table[:, i].astype(dt) for i, (k, dt) in enumerate(STEP_COLUMNS.items())}
    raw.num_steps = step
    raw.sim_seconds = t - (float(arrival[0]) if n else 0.0)
    raw.tbt_values = np.array(tbt_vals, dtype=np.float64)
    raw.tbt_weights = np.array(tbt_wts, dtype=np.int64)
    if record_batches:
        raw.batches = {k: (np.concatenate([p[i] for p in batch_parts]) if batch_parts
                           else np.zeros(0)).astype(dt, copy=False)
                       for i, (k, dt) in enumerate(BATCH_COLUMNS.items())}
    return raw


_PREFILL, _DECODE = BATCH_KINDS.index("prefill"), BATCH_KINDS.index("decode")


def _swapped_in_blocks(plan: StepPlan, scheduler: Scheduler) -> list[tuple[int, int]]:
    """(row, blocks) per swapped-in request: the swap-in pairs whose GPU block is in that
    request's block table (called right after schedule(), when the tables hold them). A block
    counts for the first such request only: with prefix caching, a request admitted later in the
    same step may hit blocks an earlier one just loaded, and those were not copied for it."""
    if not plan.swapped_in:
        return []
    out, dst = [], set(plan.swap_in[:, 1].tolist())
    for row in plan.swapped_in:
        mine = dst.intersection(scheduler.block_table(int(row)))
        dst -= mine
        out.append((int(row), len(mine)))
    return out
