"""vLLM V0's per-step `SchedulingBudget` (reference A3): tokens and sequences, counted once per
request (additions and subtractions are keyed by request, as in vLLM, which matters when a running
request is pre-counted and later preempted). Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations


class Budget:
    __slots__ = ("token_budget", "max_num_seqs", "_token_rows", "_seq_rows",
                 "num_batched_tokens", "num_cached_tokens", "num_curr_seqs")

    def __init__(self, *, token_budget: int, max_num_seqs: int) -> None:
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self._token_rows: set[int] = set()
        self._seq_rows: set[int] = set()
        self.num_batched_tokens = 0
        self.num_cached_tokens = 0
        self.num_curr_seqs = 0

    def can_schedule(self, *, num_new_tokens: int, num_new_seqs: int) -> bool:
        return (self.num_batched_tokens + num_new_tokens <= self.token_budget
                and self.num_curr_seqs + num_new_seqs <= self.max_num_seqs)

    def remaining_token_budget(self) -> int:
        return self.token_budget - self.num_batched_tokens

    def add_tokens(self, row: int, num_batched_tokens: int, num_cached_tokens: int = 0) -> None:
        if row in self._token_rows:
            return
        self._token_rows.add(row)
        self.num_batched_tokens += num_batched_tokens
        self.num_cached_tokens += num_cached_tokens

    def subtract_tokens(self, row: int, num_batched_tokens: int) -> None:
        if row in self._token_rows:
            self._token_rows.remove(row)
            self.num_batched_tokens -= num_batched_tokens

    def add_seqs(self, row: int, num_seqs: int) -> None:
        if row in self._seq_rows:
            return
        self._seq_rows.add(row)
        self.num_curr_seqs += num_seqs

    def subtract_seqs(self, row: int, num_seqs: int) -> None:
        if row in self._seq_rows:
            self._seq_rows.remove(row)
            self.num_curr_seqs -= num_seqs
