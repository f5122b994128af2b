"""V0 preemption (reference A5, A7, G/D1, D4, D7): recompute and swap victims, kvcap's swap-full
handling (`on_swap_full`), priority preemption, and the livelock guard for self-preemptions.
A mixin of `V0Scheduler`. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from collections import deque

from replay.engine.plan import Preemption, SwapAbort
from replay.engine.state import Status
from replay.engine.v0.block_manager import AllocStatus
from replay.engine.v0.budget import Budget


class SwapFull(Exception):
    """Raised inside a phase when a swap victim does not fit the host pool and the run stops."""

    def __init__(self, abort: SwapAbort) -> None:
        super().__init__(abort)
        self.abort = abort


class PreemptionMixin:
    def _note_self_preemption(self, row: int, seq_len: int, *, alone: bool) -> None:
        """Found against real vLLM: a chunked prefill whose blocks fill the pool with a partial last
        block fails the touched-block check (G/D1) at every later chunk, so vLLM re-admits and
        preempts it forever. After `admission.LIVELOCK_REPEATS` self-preemptions at the same length kvcap
        rejects it at its next admission instead of looping."""
        # The prefix hit taken at the last admission is part of the signature: a growing hit
        # (blocks vLLM marked computed) is progress.
        signature = seq_len * (self.spec.max_model_len + 1) + int(self._admit_hit[row])
        if not alone:
            self._stall_count[row] = 0
        elif self._stall_len[row] == signature:
            self._stall_count[row] += 1
        else:
            self._stall_len[row] = signature
            self._stall_count[row] = 1

    # ------------------------------------------------------------------ priority (A7, D7)
    def _schedule_priority_preemption(self, budget: Budget) -> None:
        running = deque(sorted(self.running, key=self._priority_key))
        waiting = self.waiting
        if waiting:
            head = waiting.popleft()
            head_key = self._priority_key(head)
            uncached, _ = self._num_new_tokens(head, budget, chunking=False)
            while (self.spec.preemption_mode != "none" and running
                   and self._priority_key(running[-1]) > head_key):
                if (uncached > 0 and self.bm.can_allocate(self._seq_len(head)) is AllocStatus.OK
                        and budget.can_schedule(num_new_tokens=uncached, num_new_seqs=1)):
                    break
                victim = running.pop()
                budget.subtract_tokens(victim, 1)
                budget.subtract_seqs(victim, 1)
                self._preempt(victim, by_priority=True)
                waiting.appendleft(victim)
            waiting.appendleft(head)
            self.bm.forget_cached_tokens(head)
        self.waiting = deque(sorted(waiting, key=self._priority_key))
        self.running = running

    # ------------------------------------------------------------------ preemption (A5)
    def _preempt(self, row: int, *, by_priority: bool) -> str:
        """Preempt `row` in the configured mode; returns the mode really used."""
        st, bm = self.state, self.bm
        self.num_cumulative_preemption += 1
        fallback = False
        if self.spec.preemption_mode == "swap":
            status, needed = bm.can_swap_out(row, self._seq_len(row))
            if status is AllocStatus.OK:
                num_blocks = len(bm.tables[row])
                self._swap_out_pairs.append(bm.swap_out(row))
                st.status[row] = Status.SWAPPED
                st.num_preemptions[row] += 1
                st.num_swaps[row] += 1
                self._step_preempted.append(Preemption(
                    row=row, mode="swap", num_blocks=num_blocks, by_priority=by_priority))
                return "swap"
            if self.spec.on_swap_full == "abort":
                raise SwapFull(SwapAbort(row=row, num_cpu_blocks_needed=needed,
                                          num_cpu_blocks_free=bm.num_free_cpu()))
            fallback = True
        num_blocks = len(bm.tables[row])
        bm.free(row)
        st.status[row] = Status.WAITING
        st.computed_at_preemption[row] = st.num_computed[row]
        st.num_computed[row] = 0
        st.num_preemptions[row] += 1
        st.num_recomputes[row] += 1
        self.in_prefill[row] = True
        self._resume_pending[row] = True
        self._step_preempted.append(Preemption(
            row=row, mode="recompute", num_blocks=num_blocks, by_priority=by_priority,
            swap_full_fallback=fallback))
        return "recompute"
