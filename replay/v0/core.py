"""The compiled V0 core (`replay/v0/_core.c`): the whole replay loop in C for the configurations
it covers, with tables identical to the Python step-by-step path (tests/test_v0_core.py).

Covered: the V0 scheduler (default or chunked-prefill path; FCFS or priority; preemption by
recompute, swap to the host pool with `on_swap_full` abort or recompute, or none = queue only;
prefix caching on or off; keys from the trace's prefix hashes or none) with the cost-model
executor. The rest (the torch stub, token-id keys of the oracle scenarios, a scheduler that has
already run) runs the Python loop; `ineligible()` says why. `KVCAP_CORE=python` turns the core
off (benchmarks, comparisons). Shared driver: replay/compiled.py.
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

from typing import Callable

from replay import compiled
from replay.cost_model import CostModel
from replay.loop import RawRun
from replay.prefix import UniqueBlockKeys
from replay.state import RequestState
from replay.v0.scheduler import V0Scheduler

try:
    from replay.v0 import _core
except ImportError:             # not built (no C compiler at install time)
    _core = None

_ON_SWAP_FULL = {"recompute": 0, "abort": 1}


def ineligible(scheduler, executor) -> str | None:
    """Why the compiled core cannot run this replay (None when it can)."""
    if type(scheduler) is not V0Scheduler:
        return "not the V0 scheduler"
    if scheduler.bm is None:
        return "the scheduler has already run"
    spec = scheduler.spec
    why = compiled.ineligible(_core, executor, scheduler.state, scheduler.bm.keys, spec)
    if why:
        return why
    if spec.on_swap_full not in _ON_SWAP_FULL:
        return f"on_swap_full {spec.on_swap_full}"
    if spec.num_gpu_blocks + spec.num_cpu_blocks >= 2 ** 31:
        return "more blocks than 32-bit block ids hold"
    if (scheduler.running or scheduler.waiting or scheduler.swapped or scheduler.num_steps
            or scheduler._pending_rejections or scheduler.bm.tables):
        return "the scheduler has already run"
    return None


def run(state: RequestState, scheduler: V0Scheduler, executor: CostModel, *,
        kv_bytes_per_block: int, on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000, check: bool = False) -> RawRun:
    """Replay every request of `state` in the compiled core (check `ineligible` first).
    `check=True` verifies the block-accounting invariants at the end (tests)."""
    spec = scheduler.spec
    spec_args = (spec.block_size, spec.num_gpu_blocks, spec.num_cpu_blocks, spec.max_num_seqs,
                 spec.max_num_batched_tokens, spec.max_model_len, scheduler.bm.watermark_blocks,
                 spec.enable_chunked_prefill, spec.enable_prefix_caching,
                 compiled.MODES[spec.preemption_mode], compiled.POLICIES[spec.policy],
                 _ON_SWAP_FULL[spec.on_swap_full])
    # Without prefix caching V0 never looks at keys: unique ones keep the core's lookups cheap.
    keys = scheduler.bm.keys if spec.enable_prefix_caching else UniqueBlockKeys()
    # The Python scheduler object never sees these steps: drop its block manager so nothing reads
    # stale queues or tables.
    scheduler.bm = None
    raw, out = compiled.replay(_core, state, spec_args, executor, keys, block_size=spec.block_size,
                               kv_bytes_per_block=kv_bytes_per_block, on_progress=on_progress,
                               progress_every_steps=progress_every_steps, check=check)
    if out["aborted"]:
        raw.status, raw.abort_s = "aborted", out["abort_s"]
        raw.abort_reason = (f"Aborted due to the lack of CPU swap space: request row "
                            f"{out['abort_row']} needs {out['abort_needed']} CPU blocks, "
                            f"{out['abort_free']} free")
    return raw
