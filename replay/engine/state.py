"""Per-request engine state as a struct of numpy arrays indexed by trace row.

Schedulers own the queues and the blocks; this table holds what every part reads (the replay loop,
the results): lengths, progress and the preemption counters. (The V1 reference scheduler keeps the
two it changes every step, num_computed and num_output, as Python ints and writes them here once
per step.) Must not import traces/ or capacity/.
"""
from __future__ import annotations

import numpy as np


class Status:
    """A request's state in `RequestState.status` (int8). Plain ints, not an IntEnum: on Python
    3.11 numpy probes an IntEnum member's type for `__array_ufunc__` on every comparison with a
    numpy scalar (`status[r] == Status.RUNNING`), which runs EnumType.__getattr__ in Python three
    times — 50x the cost of the comparison — and numpy clears the error it raises, swallowing a
    Ctrl-C that arrives meanwhile (the reference loop could not be interrupted)."""
    PENDING = 0     # not arrived yet
    WAITING = 1     # queued for (re-)admission, holds no GPU blocks
    RUNNING = 2
    SWAPPED = 3     # KV in the host pool (V0 swap)
    FINISHED = 4
    REJECTED = 5    # can never run (too long for max_model_len / the whole pool)
    ABORTED = 6     # the engine stopped while the request was in it (V0 swap full)


class RequestState:
    """Arrays of length n (one entry per trace row). Lengths are tokens."""

    __slots__ = ("n", "arrival_s", "prompt_len", "output_len", "priority", "status",
                 "num_computed", "num_output", "num_preemptions", "num_swaps",
                 "num_recomputes", "recomputed_tokens", "cached_prompt_tokens",
                 "computed_at_preemption", "cpu_hit_tokens")

    def __init__(self, *, arrival_s, prompt_len, output_len, priority=None) -> None:
        self.arrival_s = np.ascontiguousarray(arrival_s, dtype=np.float64)
        self.n = n = len(self.arrival_s)
        self.prompt_len = np.ascontiguousarray(prompt_len, dtype=np.int64)
        self.output_len = np.ascontiguousarray(output_len, dtype=np.int64)
        self.priority = (np.zeros(n, np.int64) if priority is None
                         else np.ascontiguousarray(priority, dtype=np.int64))
        self.status = np.zeros(n, np.int8)
        # Tokens whose KV is computed (vLLM num_computed_tokens).
        self.num_computed = np.zeros(n, np.int64)
        # Output tokens produced so far.
        self.num_output = np.zeros(n, np.int64)
        self.num_preemptions = np.zeros(n, np.int32)
        self.num_swaps = np.zeros(n, np.int32)
        self.num_recomputes = np.zeros(n, np.int32)
        # Extra prefill work caused by recompute preemption (the recompute tax). V1: the tokens
        # computed again at positions the request had computed before a preemption (a prefix
        # hit or a CPU load at the resume is not computed, so not counted). V0: at each resume,
        # the tokens computed before the preemption minus the prefix-cache hit taken then.
        self.recomputed_tokens = np.zeros(n, np.int64)
        # Prefix-cache hit (tokens) at the first admission.
        self.cached_prompt_tokens = np.zeros(n, np.int64)
        # Of those, the tokens loaded from the CPU offload tier (vLLM's external hit; V1
        # offloading only): gpu_hit_tokens = cached_prompt_tokens - cpu_hit_tokens.
        self.cpu_hit_tokens = np.zeros(n, np.int64)
        # Scratch for recomputed_tokens: V0 num_computed at the last recompute preemption, V1
        # the most tokens computed before any preemption.
        self.computed_at_preemption = np.zeros(n, np.int64)

    def num_tokens(self, row: int) -> int:
        """Known tokens of a request: prompt + output produced so far."""
        return int(self.prompt_len[row] + self.num_output[row])
