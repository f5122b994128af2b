"""The V0 prefill phase (`_schedule_prefills`, reference A3 step 1 / A4) and admission gates:
vLLM's OK / LATER / NEVER whole-sequence check, kvcap's queue-only reservation gate, rejections.
A mixin of `V0Scheduler` (uses its queues, state and block manager).
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from replay.engine.spec import cdiv
from replay.engine.state import Status
from replay.engine.v0.block_manager import AllocStatus
from replay.engine.v0.budget import Budget

# Self-preemptions at one (length, hit) after which a request counts as livelocked.
LIVELOCK_REPEATS = 5


class AdmissionMixin:
    # ------------------------------------------------------------------ prefill phase
    def _schedule_prefills(self, budget: Budget, chunking: bool) -> list[tuple[int, int, int]]:
        """Admit from the front of `waiting` (head-of-line): (row, uncached, cached) in order."""
        out: list[tuple[int, int, int]] = []
        if budget.remaining_token_budget() == 0:
            return out
        spec, st, bm = self.spec, self.state, self.bm
        waiting = self.waiting
        limit = (spec.max_model_len if chunking
                 else min(spec.max_model_len, spec.max_num_batched_tokens))
        while waiting:
            row = waiting[0]
            uncached, cached = self._num_new_tokens(row, budget, chunking)
            num_new = uncached + cached
            if num_new > limit:
                waiting.popleft()
                bm.forget_cached_tokens(row)
                self._reject_rows([row], f"prompt {num_new} tokens > limit {limit}")
                continue
            status = self._can_admit(row)
            if status is AllocStatus.LATER:
                bm.forget_cached_tokens(row)
                break
            if status is AllocStatus.NEVER:
                waiting.popleft()
                bm.forget_cached_tokens(row)
                self._reject_rows([row], self._never_reason(row))
                continue
            if (budget.num_batched_tokens >= spec.max_num_batched_tokens or uncached == 0
                    or not budget.can_schedule(num_new_tokens=uncached, num_new_seqs=1)):
                bm.forget_cached_tokens(row)
                break
            waiting.popleft()
            self._admit(row, cached)
            out.append((row, uncached, cached))
            budget.add_tokens(row, uncached, cached)
            budget.add_seqs(row, 1)
        return out

    def _whole_sequence_blocks(self, row: int) -> int:
        st = self.state
        total = min(int(st.prompt_len[row] + st.output_len[row]), self.spec.max_model_len)
        return cdiv(max(total, self._seq_len(row)), self.spec.block_size)

    def _can_admit(self, row: int) -> AllocStatus:
        status = self.bm.can_allocate(self._seq_len(row))
        if self._stall_count[row] >= LIVELOCK_REPEATS:
            return AllocStatus.NEVER
        if self.spec.preemption_mode != "none" or status is AllocStatus.NEVER:
            return status
        # Queue-only: the whole sequence must fit beside the growth promised to running requests,
        # keeping one block free so V0's decode check (G/D1) always passes.
        floor = max(1, self.bm.watermark_blocks)
        need = self._whole_sequence_blocks(row)
        if self.bm.num_gpu_blocks - need < floor:
            return AllocStatus.NEVER
        if self.bm.num_free_gpu() - self._reserved_blocks - need >= floor:
            return AllocStatus.OK
        return AllocStatus.LATER

    def _never_reason(self, row: int) -> str:
        if self._stall_count[row] >= LIVELOCK_REPEATS:
            return (f"preempted itself {LIVELOCK_REPEATS} times in a row at {self._seq_len(row)} "
                    f"tokens without progress: vLLM V0 would re-admit and preempt it forever")
        if self.spec.preemption_mode == "none":
            return (f"whole sequence needs {self._whole_sequence_blocks(row)} blocks, more than "
                    f"the {self.bm.num_gpu_blocks} GPU blocks allow")
        return (f"{self._seq_len(row)} tokens need {cdiv(self._seq_len(row), self.spec.block_size)}"
                f" blocks, more than the {self.bm.num_gpu_blocks} GPU blocks allow")

    def _admit(self, row: int, cached: int) -> None:
        st = self.state
        self.bm.allocate(row, self._seq_len(row))
        st.status[row] = Status.RUNNING
        self._admit_hit[row] = cached
        if self.spec.preemption_mode == "none":
            self._final_blocks[row] = self._whole_sequence_blocks(row)
            self._reserved_blocks += int(self._final_blocks[row]) - len(self.bm.tables[row])
        if not self._admitted_once[row]:
            self._admitted_once[row] = True
            st.cached_prompt_tokens[row] = cached
        if self._resume_pending[row]:
            self._resume_pending[row] = False
            st.recomputed_tokens[row] += int(st.computed_at_preemption[row]) - cached
