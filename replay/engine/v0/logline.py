"""vLLM V0's preemption warning (reference A5) as a pure function of the cumulative counter.

Owns only the text and its 1-in-50 rate limit. Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from typing import Literal

_FORMAT = ("Sequence group %s is preempted by %s mode because there is not enough KV cache space. "
           "This can affect the end-to-end performance. Increase gpu_memory_utilization or "
           "tensor_parallel_size to provide more KV cache memory. "
           "total_num_cumulative_preemption=%d")
_MODE_NAMES = {"recompute": "PreemptionMode.RECOMPUTE", "swap": "PreemptionMode.SWAP"}
_EVERY = 50


def preemption_warning(request_id: str, mode: Literal["recompute", "swap"],
                       cum_count: int) -> str | None:
    """The WARNING vLLM logs for a preemption, or None when it stays silent.

    `cum_count` is the process's cumulative preemption count *including* this one (priority
    preemptions count too). vLLM logs when the count before this preemption is a multiple of 50,
    i.e. for the 1st, 51st, 101st... preemption, and prints the count including this one."""
    if cum_count < 1:
        raise ValueError(f"cum_count must be >= 1 (it includes this preemption), got {cum_count}")
    if (cum_count - 1) % _EVERY != 0:
        return None
    return _FORMAT % (request_id, _MODE_NAMES[mode], cum_count)
