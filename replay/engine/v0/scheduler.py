"""vLLM V0's scheduler (`vllm/core/scheduler.py`, 0.10.1.1) over trace rows: reference A3-A7 and the
corrections in G.

Owns the three queues (waiting, running, swapped as deques of rows), one step's phases
(`_schedule_default`, `_schedule_chunked_prefill` around running / swapped / prefill phases sharing
one `Budget`), rejections, and playing the model output back (`update`). Admission lives in
`admission.py`, preemption (recompute, swap, swap-full fallback, priority) in `preemption.py`,
blocks in `BlockManagerV0`, per-request numbers in `RequestState`. This is the reference
implementation (one step at a time); replay/engine/v0/_core.c is the fast one, tested against it.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from replay.engine.plan import Preemption, Rejection, StepOutput, StepPlan, SwapAbort
from replay.engine.prefix import BlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status
from replay.engine.v0.admission import AdmissionMixin
from replay.engine.v0.block_manager import AllocStatus, BlockManagerV0
from replay.engine.v0.budget import Budget
from replay.engine.v0.preemption import PreemptionMixin, SwapFull

_RUNNING = Status.RUNNING


@dataclass(slots=True)
class _RunningOut:
    decodes: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int]] = field(default_factory=list)   # (row, chunk)
    recomputed: list[int] = field(default_factory=list)
    swapped_out: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _SwappedOut:
    decodes: list[int] = field(default_factory=list)
    prefills: list[tuple[int, int, int]] = field(default_factory=list)  # (row, uncached, cached)
    infeasible: list[int] = field(default_factory=list)


class V0Scheduler(AdmissionMixin, PreemptionMixin):
    """`replay.engine.plan.Scheduler` for vLLM V0. Rows are trace rows indexing `state`."""

    def __init__(self, spec: SchedulerSpec, state: RequestState, keys: BlockKeys) -> None:
        if spec.policy == "priority" and spec.preemption_mode == "swap":
            raise ValueError(
                "vLLM V0 cannot run policy='priority' with preemption_mode='swap' (the priority "
                "victim is swapped out but queued as waiting and the engine crashes, reference "
                "G/D4): use preemption_mode='recompute' or policy='fcfs'.")
        self.spec = spec
        self.state = state
        self.bm = BlockManagerV0(spec, keys)
        self.waiting: deque[int] = deque()
        self.running: deque[int] = deque()
        self.swapped: deque[int] = deque()
        n = state.n
        # vLLM's sequence stage: True from admission (or recompute) until the prompt is computed.
        self.in_prefill = np.ones(n, dtype=bool)
        # Recompute-preempted and not re-admitted yet (recomputed_tokens is settled at the resume).
        self._resume_pending = np.zeros(n, dtype=bool)
        self._admitted_once = np.zeros(n, dtype=bool)
        # Queue-only mode: blocks each running request may still grow by (its whole sequence was
        # set aside at admission); `_reserved_blocks` is their sum.
        self._final_blocks = np.zeros(n, dtype=np.int64)
        # Livelock guard: sequence length at the last self-preemption and how many self-
        # preemptions in a row happened at that length (no token produced in between).
        self._stall_len = np.zeros(n, dtype=np.int64)
        self._stall_count = np.zeros(n, dtype=np.int64)
        self._admit_hit = np.zeros(n, dtype=np.int64)
        self._reserved_blocks = 0
        # Python copies of constant per-row numbers (numpy scalar reads are slow).
        self._prompt = state.prompt_len.tolist()
        self._out_len = state.output_len.tolist()
        self.num_cumulative_preemption = 0
        self.num_steps = 0
        self._pending_rejections: list[Rejection] = []
        self._aborted = False

    # ================================================================== protocol: queues
    def add_request(self, row: int) -> None:
        st = self.state
        prompt = int(st.prompt_len[row])
        if prompt > self.spec.max_model_len:
            # vLLM rejects these in input processing, before the scheduler sees them.
            st.status[row] = Status.REJECTED
            self._pending_rejections.append(Rejection(
                row=row, reason=f"prompt {prompt} > max_model_len {self.spec.max_model_len}"))
            return
        st.status[row] = Status.WAITING
        self.waiting.append(row)

    def abort_request(self, row: int) -> None:
        """Test hook: vLLM `abort_seq_group` (the request leaves its queue, blocks are freed)."""
        for queue in (self.waiting, self.running, self.swapped):
            if row in queue:
                queue.remove(row)
                self._release_reservation(row)
                self.bm.free(row)
                self.state.status[row] = Status.ABORTED
                return

    def has_unfinished(self) -> bool:
        return not self._aborted and bool(self.waiting or self.running or self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    def block_table(self, row: int) -> list[int]:
        """GPU block ids of a request holding GPU blocks, in token order."""
        ids = self.bm.tables[row]
        assert not ids or ids[0] < self.bm.num_gpu_blocks, "the request's KV is in the host pool"
        return list(ids)

    def gpu_blocks_used(self) -> int:
        return self.bm.gpu.num_used()

    def cpu_blocks_used(self) -> int:
        return self.bm.cpu.num_used()

    def snapshot(self) -> dict:
        """Test hook: queues, free blocks and block tables as vLLM prints them."""
        return {"waiting": list(self.waiting), "running": list(self.running),
                "swapped": list(self.swapped), "free_gpu": self.bm.num_free_gpu(),
                "free_cpu": self.bm.num_free_cpu(),
                "blocks": {r: list(self.bm.tables[r]) for r in (*self.running, *self.swapped)
                           if r in self.bm.tables}}

    # ================================================================== row helpers
    def _seq_len(self, row: int) -> int:
        return self._prompt[row] + int(self.state.num_output[row])

    def _num_new_tokens(self, row: int, budget: Budget, chunking: bool,
                        swapped: bool = False) -> tuple[int, int]:
        """(uncached, cached) new tokens of a row, vLLM `_get_num_new_uncached_and_cached_tokens`.

        A swapped prefill takes no prefix hit: in vLLM its remembered hit is below its computed
        tokens, which trips an assertion (crash) there; kvcap computes the rest instead."""
        cached = 0
        if not self.in_prefill[row]:
            uncached = 1
        else:
            computed = int(self.state.num_computed[row])
            all_new = self._seq_len(row) - computed
            hit = 0 if swapped else self.bm.get_num_cached_tokens(row, self._seq_len(row), True)
            cached = max(0, hit - computed)
            uncached = all_new - cached
        if uncached == 0 and cached > 0:
            # A fully cached prompt still computes its last token.
            uncached, cached = 1, cached - 1
        if chunking:
            uncached = self._chunk(uncached, budget)
        return uncached, cached

    def _chunk(self, num_tokens: int, budget: Budget) -> int:
        remaining = budget.remaining_token_budget()
        # One partial prefill at a time (vLLM default), so the slot budget is the whole budget.
        slot = self.spec.max_num_batched_tokens
        if self.spec.enable_prefix_caching:
            b = self.spec.block_size
            remaining = min(remaining, slot) // b * b
        return min(num_tokens, remaining, slot)

    def _priority_key(self, row: int) -> tuple[int, float, int]:
        # Equal arrival times follow trace order (vLLM stamps distinct receipt times).
        return int(self.state.priority[row]), float(self.state.arrival_s[row]), row

    def _release_reservation(self, row: int) -> None:
        if self.spec.preemption_mode == "none" and row in self.bm.tables:
            self._reserved_blocks -= max(0, int(self._final_blocks[row]) - len(self.bm.tables[row]))

    # ================================================================== schedule
    def schedule(self) -> StepPlan:
        self.num_steps += 1
        rejected, self._pending_rejections = self._pending_rejections, []
        if self._aborted:
            return StepPlan(rejected=tuple(rejected))
        self._step_preempted: list[Preemption] = []
        self._step_rejected: list[Rejection] = rejected
        self._swap_out_pairs: list[np.ndarray] = []
        self._swap_in_pairs: list[np.ndarray] = []
        self._swapped_in_rows: list[int] = []
        try:
            if self.spec.enable_chunked_prefill:
                batch = self._schedule_chunked_prefill()
            else:
                batch = self._schedule_default()
        except SwapFull as stop:
            return self._abort(stop.abort)
        return self._finish_plan(batch)

    def _finish_plan(self, batch: list[tuple[int, int, int, bool]]) -> StepPlan:
        """batch: (row, uncached new tokens, cached tokens taken now, is_prefill) in batch order."""
        now = float(self.num_steps)
        for row, *_ in batch:
            self.bm.touch(row, now)
        if batch:
            self.bm.mark_computed()
        rows = np.array([b[0] for b in batch], dtype=np.int64)
        new = np.array([b[1] for b in batch], dtype=np.int64)
        context = self.state.num_computed[rows] + np.array([b[2] for b in batch], dtype=np.int64)
        return StepPlan(
            rows=rows, num_new_tokens=new, num_computed_tokens=context,
            is_prefill=np.array([b[3] for b in batch], dtype=bool),
            swap_out=_cat_pairs(self._swap_out_pairs), swap_in=_cat_pairs(self._swap_in_pairs),
            preempted=tuple(self._step_preempted), swapped_in=tuple(self._swapped_in_rows),
            rejected=tuple(self._step_rejected))

    def _abort(self, abort: SwapAbort) -> StepPlan:
        """The engine stops: every request it holds is aborted; queues stay as vLLM left them."""
        self._aborted = True
        st = self.state
        live = (st.status == Status.WAITING) | (st.status == Status.RUNNING) | (
            st.status == Status.SWAPPED)
        st.status[live] = Status.ABORTED
        return StepPlan(preempted=tuple(self._step_preempted),
                        rejected=tuple(self._step_rejected), abort=abort)

    # ------------------------------------------------------------------ default path (A3)
    def _schedule_default(self) -> list[tuple[int, int, int, bool]]:
        spec = self.spec
        budget = Budget(token_budget=spec.max_num_batched_tokens, max_num_seqs=spec.max_num_seqs)
        for row in self.running:
            budget.add_seqs(row, 1)
        prefills: list[tuple[int, int, int]] = []
        if not self.swapped:
            prefills = self._schedule_prefills(budget, chunking=False)
        run = _RunningOut()
        swapped_in = _SwappedOut()
        if not prefills:
            if spec.policy == "priority":
                self._schedule_priority_preemption(budget)
            run = self._schedule_running(budget, chunking=False)
            if not run.recomputed and not run.swapped_out:
                swapped_in = self._schedule_swapped(budget, chunking=False)
        self.waiting.extendleft(run.recomputed)
        self.running.extend(r for r, _, _ in prefills)
        self.running.extend(run.decodes)
        self.running.extend(swapped_in.decodes)
        self.swapped.extend(run.swapped_out)
        self._reject_rows(swapped_in.infeasible, "swap-in can never fit the GPU pool")
        return ([(r, u, c, True) for r, u, c in prefills]
                + [(r, 1, 0, False) for r in run.decodes]
                + [(r, 1, 0, False) for r in swapped_in.decodes])

    # ------------------------------------------------------------------ chunked path (A4)
    def _schedule_chunked_prefill(self) -> list[tuple[int, int, int, bool]]:
        spec = self.spec
        budget = Budget(token_budget=spec.max_num_batched_tokens, max_num_seqs=spec.max_num_seqs)
        run = self._schedule_running(budget, chunking=True)
        swapped_in = _SwappedOut()
        if not run.recomputed and not run.swapped_out:
            # vLLM 0.10.1.1 calls `_schedule_swapped` without `enable_chunking` here, so a swapped
            # prefill comes back only when all its remaining tokens fit the budget.
            swapped_in = self._schedule_swapped(budget, chunking=False)
        prefills = self._schedule_prefills(budget, chunking=True)
        self.waiting.extendleft(run.recomputed)
        self.running.extend(swapped_in.decodes)
        self.running.extend(r for r, _, _ in swapped_in.prefills)
        self.running.extend(run.decodes)
        # Prefills that complete in this step go first, so they decode first next step.
        st = self.state
        finishing = [r for r, n in run.prefills
                     if self._seq_len(r) - int(st.num_computed[r]) == n]
        self.running.extend(finishing)
        self.running.extend(r for r, n in run.prefills
                            if self._seq_len(r) - int(st.num_computed[r]) != n)
        self.running.extend(r for r, _, _ in prefills)
        self.swapped.extend(run.swapped_out)
        self._reject_rows(swapped_in.infeasible, "swap-in can never fit the GPU pool")
        return ([(r, u, c, True) for r, u, c in prefills]
                + [(r, n, 0, True) for r, n in run.prefills]
                + [(r, u, c, True) for r, u, c in swapped_in.prefills]
                + [(r, 1, 0, False) for r in run.decodes]
                + [(r, 1, 0, False) for r in swapped_in.decodes])

    def _reject_rows(self, rows: list[int], reason: str) -> None:
        for row in rows:
            self.state.status[row] = Status.REJECTED
            self._step_rejected.append(Rejection(row=row, reason=reason))

    # ------------------------------------------------------------------ running phase (A5)
    def _schedule_running(self, budget: Budget, chunking: bool) -> _RunningOut:
        out = _RunningOut()
        running = self.running
        bm = self.bm
        while running:
            row = running[0]
            num_tokens, _ = self._num_new_tokens(row, budget, chunking)
            if num_tokens == 0:
                break
            running.popleft()
            seq_len = self._seq_len(row)
            while not bm.can_append_slots(row, seq_len):
                if self.spec.preemption_mode == "none":
                    raise AssertionError("queue-only mode must never need a preemption")
                budget.subtract_tokens(row, num_tokens)
                budget.subtract_seqs(row, 1)
                victim = running.pop() if running else row
                if victim == row:
                    self._note_self_preemption(row, seq_len, alone=not (
                        out.decodes or out.prefills))
                if self._preempt(victim, by_priority=False) == "recompute":
                    out.recomputed.append(victim)
                else:
                    out.swapped_out.append(victim)
                if victim == row:
                    break
            else:
                self._append(row, seq_len)
                if self.in_prefill[row]:
                    out.prefills.append((row, num_tokens))
                else:
                    out.decodes.append(row)
                budget.add_tokens(row, num_tokens)
                if chunking:
                    budget.add_seqs(row, 1)
        return out

    def _append(self, row: int, seq_len: int) -> None:
        before = len(self.bm.tables[row])
        self.bm.append_slots(row, seq_len)
        if self.spec.preemption_mode == "none":
            self._reserved_blocks -= len(self.bm.tables[row]) - before

    # ------------------------------------------------------------------ swapped phase (A3 step 4)
    def _schedule_swapped(self, budget: Budget, chunking: bool) -> _SwappedOut:
        out = _SwappedOut()
        swapped = self.swapped
        bm = self.bm
        while swapped:
            row = swapped[0]
            status = bm.can_swap_in(row, self._seq_len(row))
            if status is AllocStatus.LATER:
                break
            if status is AllocStatus.NEVER:
                # vLLM drops the request (FINISHED_IGNORED) but never frees its host blocks: they
                # stay allocated for the rest of the run, shrinking the swap pool.
                swapped.popleft()
                out.infeasible.append(row)
                continue
            uncached, cached = self._num_new_tokens(row, budget, chunking, swapped=True)
            if self.in_prefill[row] and uncached > self.spec.max_num_batched_tokens:
                # Found against real vLLM: a swapped prefill comes back whole (no chunking), so
                # one whose rest exceeds the token budget stays swapped forever (holding its host
                # blocks and blocking the swapped queue). kvcap rejects it; its host blocks stay
                # taken, as in vLLM.
                swapped.popleft()
                self._reject_rows([row], f"swapped prefill needs {uncached} tokens in one step, "
                                         f"more than max_num_batched_tokens "
                                         f"{self.spec.max_num_batched_tokens}")
                continue
            if uncached == 0 or not budget.can_schedule(num_new_tokens=uncached, num_new_seqs=1):
                bm.forget_cached_tokens(row)
                break
            swapped.popleft()
            self._swap_in_pairs.append(bm.swap_in(row))
            self._swapped_in_rows.append(row)
            self.state.status[row] = Status.RUNNING
            self._append(row, self._seq_len(row))
            if self.in_prefill[row]:
                out.prefills.append((row, uncached, cached))
            else:
                out.decodes.append(row)
            budget.add_tokens(row, uncached, cached)
            budget.add_seqs(row, 1)
        return out

    # ================================================================== update
    def update(self, plan: StepPlan) -> StepOutput:
        """Play the model output back like vLLM's synchronous engine loop (oracle.py V0)."""
        st = self.state
        rows = plan.rows
        if plan.abort is not None or len(rows) == 0:
            return StepOutput(sampled=(), finished=np.zeros(0, dtype=np.int64))
        # One gather per column, then plain Python per row (batches are small).
        status = st.status[rows].tolist()
        nout = st.num_output[rows].tolist()
        reached = (plan.num_new_tokens + plan.num_computed_tokens).tolist()
        is_prefill = plan.is_prefill.tolist()
        prompt, out_len, L = self._prompt, self._out_len, self.spec.max_model_len
        live, live_computed, prefilled, got, fin = [], [], [], [], []
        for i, row in enumerate(rows.tolist()):
            if status[i] != _RUNNING:
                continue
            # The chunk ends at its context plus its new tokens.
            computed = reached[i]
            live.append(row)
            live_computed.append(computed)
            seq_len = prompt[row] + nout[i]
            if computed == seq_len:
                prefilled.append(row)
            if is_prefill[i] and computed < seq_len:
                continue
            got.append(row)
            if nout[i] + 1 >= out_len[row] or seq_len + 1 >= L:
                fin.append(row)
        st.num_computed[live] = live_computed
        self.in_prefill[prefilled] = False
        st.num_output[got] += 1
        finished: list[int] = []
        if fin:
            st.status[fin] = Status.FINISHED
            gone = set(fin)
            remaining: deque[int] = deque()
            for row in self.running:
                if row in gone:
                    self._release_reservation(row)
                    self.bm.free(row)
                    finished.append(row)
                else:
                    remaining.append(row)
            self.running = remaining
        return StepOutput(sampled=tuple(got), finished=np.array(finished, dtype=np.int64))


def _cat_pairs(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros((0, 2), dtype=np.int64)
    return np.concatenate(parts).astype(np.int64).reshape(-1, 2)
