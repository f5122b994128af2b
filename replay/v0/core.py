"""The compiled V0 core (`replay/v0/_core.c`): the whole replay loop in C for the configurations
it covers, with tables identical to the Python step-by-step path (tests/test_v0_core.py).

Covered: the V0 scheduler (default or chunked-prefill path; FCFS or priority; preemption by
recompute, swap to the host pool with `on_swap_full` abort or recompute, or none = queue only;
prefix caching on or off; keys from the trace's prefix hashes or none) with the cost-model
executor. The rest (the torch stub, token-id keys of the oracle scenarios, a scheduler that has
already run) runs the Python loop; `ineligible()` says why. `KVCAP_CORE=python` turns the core
off (benchmarks, comparisons).
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from replay.cost_model import CostModel
from replay.loop import RawRun
from replay.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.state import RequestState, Status
from replay.v0.scheduler import V0Scheduler
from replay.v1.core import _keys_args, _raw

try:
    from replay.v0 import _core
except ImportError:             # not built (a source checkout without `pip install -e .`)
    _core = None

_MODES = {"recompute": 0, "none": 1, "swap": 2}
_POLICIES = {"fcfs": 0, "priority": 1}
_ON_SWAP_FULL = {"recompute": 0, "abort": 1}


def ineligible(scheduler, executor) -> str | None:
    """Why the compiled core cannot run this replay (None when it can)."""
    if _core is None:
        return "the compiled core is not built"
    if os.environ.get("KVCAP_CORE", "") == "python":
        return "KVCAP_CORE=python"
    if type(scheduler) is not V0Scheduler:
        return "not the V0 scheduler"
    if type(executor) is not CostModel:
        return "not the cost-model executor"
    spec = scheduler.spec
    if spec.policy not in _POLICIES:
        return f"policy {spec.policy}"
    if spec.preemption_mode not in _MODES:
        return f"preemption_mode {spec.preemption_mode}"
    if spec.on_swap_full not in _ON_SWAP_FULL:
        return f"on_swap_full {spec.on_swap_full}"
    if spec.num_gpu_blocks + spec.num_cpu_blocks >= 2 ** 31:
        return "more blocks than 32-bit block ids hold"
    keys = scheduler.bm.keys
    if type(keys) is TraceBlockKeys:
        if keys.block_size != spec.block_size:
            return "trace keys built for another block size"
    elif type(keys) is not UniqueBlockKeys:
        return f"block keys {type(keys).__name__}"
    if (scheduler.running or scheduler.waiting or scheduler.swapped or scheduler.num_steps
            or scheduler._pending_rejections or scheduler.bm.tables
            or np.any(scheduler.state.status != Status.PENDING)):
        return "the scheduler has already run"
    return None


def run(state: RequestState, scheduler: V0Scheduler, executor: CostModel, *,
        kv_bytes_per_block: int, on_progress: Callable[[float, int], None] | None = None,
        progress_every_steps: int = 20_000, check: bool = False) -> RawRun:
    """Replay every request of `state` in the compiled core (check `ineligible` first).
    `check=True` verifies the block-accounting invariants at the end (tests)."""
    n = state.n
    if n and np.any(np.diff(state.arrival_s) < 0):
        raise ValueError("requests must be sorted by arrival_s")
    spec, ex = scheduler.spec, executor
    first_sched, first_tok, finish = (np.full(n, np.nan) for _ in range(3))
    max_tbt = np.zeros(n)
    arrays = (state.arrival_s, state.prompt_len, state.output_len, state.status,
              state.num_computed, state.num_output, state.num_preemptions, state.num_swaps,
              state.num_recomputes, state.recomputed_tokens, state.cached_prompt_tokens,
              state.computed_at_preemption, first_sched, first_tok, finish, max_tbt, state.priority)
    spec_args = (spec.block_size, spec.num_gpu_blocks, spec.num_cpu_blocks, spec.max_num_seqs,
                 spec.max_num_batched_tokens, spec.max_model_len, scheduler.bm.watermark_blocks,
                 spec.enable_chunked_prefill, spec.enable_prefix_caching,
                 _MODES[spec.preemption_mode], _POLICIES[spec.policy],
                 _ON_SWAP_FULL[spec.on_swap_full])
    cost_args = (ex._linear_per_token, ex._lm_head_per_sample, ex._attn_per_unit, ex._flops_rate,
                 ex._bytes_rate, ex._weight_bytes, ex.constants.overhead_s, ex._ar_fixed,
                 ex._ar_per_token, ex.kv_bytes_per_token, kv_bytes_per_block, ex._swap_per_block)
    keys = scheduler.bm.keys
    core = _core.new(arrays, spec_args, cost_args,
                     _keys_args(keys, state, spec.block_size) if spec.enable_prefix_caching
                     else _keys_args(UniqueBlockKeys(), state, spec.block_size))
    # The Python scheduler object never sees these steps: drop its block manager so nothing reads
    # stale queues or tables.
    scheduler.bm = None
    chunk = progress_every_steps if on_progress is not None else 1 << 40
    while True:
        done, _step, t, cursor = _core.run(core, chunk)
        if done:
            break
        if on_progress is not None:
            on_progress(t, cursor)
    if check:
        _core.check(core)
    out = _core.results(core)
    raw = _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block)
    if out["aborted"]:
        raw.status, raw.abort_s = "aborted", out["abort_s"]
        raw.abort_reason = (f"Aborted due to the lack of CPU swap space: request row "
                            f"{out['abort_row']} needs {out['abort_needed']} CPU blocks, "
                            f"{out['abort_free']} free")
    return raw
