"""The compiled V1 core (`replay/v1/_core.c`): the whole replay loop in C for the configurations
it covers, with tables identical to the Python step-by-step path (tests/test_v1_core.py).

Covered: the V1 scheduler (FCFS or priority; preemption by recompute, swap to the host offload
tier, or none = queue only; prefix caching on or off; keys from the trace's prefix hashes or
none) with the cost-model executor. The rest (the torch stub, token-id keys of the oracle
scenarios) runs the Python loop; `ineligible()` says why. `KVCAP_CORE=python` turns the cores off
(benchmarks, comparisons). Shared driver: replay/compiled.py.
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

from typing import Callable

from replay import compiled
from replay.cost_model import CostModel
from replay.loop import RawRun
from replay.state import RequestState
from replay.v1.scheduler import V1Scheduler

try:
    from replay.v1 import _core
except ImportError:             # not built (no C compiler at install time)
    _core = None


def ineligible(scheduler, executor) -> str | None:
    """Why the compiled core cannot run this replay (None when it can)."""
    if type(scheduler) is not V1Scheduler:
        return "not the V1 scheduler"
    if scheduler.kv is None:
        return "the scheduler has already run"
    spec = scheduler.spec
    why = compiled.ineligible(_core, executor, scheduler.state, scheduler.kv.keys, spec)
    if why:
        return why
    if scheduler.running or len(scheduler.waiting):
        return "the scheduler has already run"
    return None


def run(state: RequestState, scheduler: V1Scheduler, executor: CostModel, *,
        kv_bytes_per_block: int, on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000, check: bool = False) -> RawRun:
    """Replay every request of `state` in the compiled core (check `ineligible` first).
    `check=True` verifies the block-accounting invariants at the end (tests)."""
    spec = scheduler.spec
    spec_args = (spec.block_size, spec.num_gpu_blocks, scheduler.max_active,
                 spec.max_num_batched_tokens, spec.max_model_len, spec.long_prefill_token_threshold,
                 scheduler.watermark_blocks, spec.enable_chunked_prefill, spec.enable_prefix_caching,
                 spec.scheduler_reserve_full_isl, compiled.MODES[spec.preemption_mode],
                 compiled.POLICIES[spec.policy], spec.num_cpu_blocks)
    keys = scheduler.kv.keys
    # The Python scheduler object never sees these steps: drop it so nothing reads stale queues.
    scheduler.kv = None
    raw, _ = compiled.replay(_core, state, spec_args, executor, keys, block_size=spec.block_size,
                             kv_bytes_per_block=kv_bytes_per_block, on_progress=on_progress,
                             progress_every_steps=progress_every_steps, check=check)
    return raw
