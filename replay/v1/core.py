"""The compiled V1 core (`replay/v1/_core.c`): the whole replay loop in C for the configurations
it covers, with tables identical to the Python step-by-step path (tests/test_v1_core.py).

Covered: the V1 scheduler (FCFS or priority; preemption by recompute, swap to the host offload
tier, or none = queue only; prefix caching on or off; keys from the trace's prefix hashes or
none) with the cost-model executor. The rest (V0, the torch stub, token-id keys of the oracle
scenarios) runs the Python loop; `ineligible()` says why. `KVCAP_CORE=python` turns the core off (benchmarks, comparisons).
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from replay.cost_model import CostModel
from replay.loop import EVENT_KINDS, STEP_COLUMNS, RawRun
from replay.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.state import RequestState, Status
from replay.v1.scheduler import V1Scheduler

try:
    from replay.v1 import _core
except ImportError:             # not built (a source checkout without `pip install -e .`)
    _core = None

_MODES = {"recompute": 0, "none": 1, "swap": 2}
_POLICIES = {"fcfs": 0, "priority": 1}


def ineligible(scheduler, executor) -> str | None:
    """Why the compiled core cannot run this replay (None when it can)."""
    if _core is None:
        return "the compiled core is not built"
    if os.environ.get("KVCAP_CORE", "") == "python":
        return "KVCAP_CORE=python"
    if type(scheduler) is not V1Scheduler:
        return "not the V1 scheduler"
    if type(executor) is not CostModel:
        return "not the cost-model executor"
    spec = scheduler.spec
    if spec.policy not in _POLICIES:
        return f"policy {spec.policy}"
    if spec.preemption_mode not in _MODES:
        return f"preemption_mode {spec.preemption_mode}"
    keys = scheduler.kv.keys
    if type(keys) is TraceBlockKeys:
        if keys.block_size != spec.block_size:
            return "trace keys built for another block size"
    elif type(keys) is not UniqueBlockKeys:
        return f"block keys {type(keys).__name__}"
    if scheduler.state.n >= 2**31 - 1:
        return "more than 2**31 requests (the core keeps rows as int32)"
    if scheduler.running or len(scheduler.waiting) or np.any(scheduler.state.status != Status.PENDING):
        return "the scheduler has already run"
    return None


def _keys_args(keys, state: RequestState, block_size: int) -> tuple:
    if type(keys) is UniqueBlockKeys:
        return (0, 1, None, None, None)
    chains = keys._chain
    lens = np.fromiter((0 if c is None else len(c) for c in chains), np.int64, len(chains))
    off = np.zeros(len(chains) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    ids = np.fromiter((i for c in chains if c is not None for i in c), np.int64, int(off[-1]))
    hbt = keys.hash_block_tokens
    shared = np.minimum(lens * hbt, state.prompt_len) // block_size
    return (1, hbt, off, ids if len(ids) else np.zeros(1, np.int64), shared)


def run(state: RequestState, scheduler: V1Scheduler, executor: CostModel, *,
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
    spec_args = (spec.block_size, spec.num_gpu_blocks, scheduler.max_active,
                 spec.max_num_batched_tokens, spec.max_model_len, spec.long_prefill_token_threshold,
                 scheduler.watermark_blocks, spec.enable_chunked_prefill, spec.enable_prefix_caching,
                 spec.scheduler_reserve_full_isl, _MODES[spec.preemption_mode],
                 _POLICIES[spec.policy], spec.num_cpu_blocks)
    cost_args = (ex._linear_per_token, ex._lm_head_per_sample, ex._attn_per_unit, ex._flops_rate,
                 ex._bytes_rate, ex._weight_bytes, ex.constants.overhead_s, ex._ar_fixed,
                 ex._ar_per_token, ex.kv_bytes_per_token, kv_bytes_per_block, ex._swap_per_block)
    core = _core.new(arrays, spec_args, cost_args, _keys_args(scheduler.kv.keys, state, spec.block_size))
    # The Python scheduler object never sees these steps: drop it so nothing reads stale queues.
    scheduler.kv = None
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
    return _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block)


def _col(out: dict, name: str, dtype) -> np.ndarray:
    return np.frombuffer(out[name], dtype=dtype)


def _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block) -> RawRun:
    num_steps = len(out["start_s"]) // 8
    steps = {}
    for k, t in STEP_COLUMNS.items():
        steps[k] = _col(out, k, t)
    blocks = _col(out, "ev_blocks", np.int64)
    names = np.array(EVENT_KINDS, dtype=object)
    kinds = _col(out, "ev_kind", np.int8)
    events = {"t_s": _col(out, "ev_t", np.float64).tolist(),
              "step": _col(out, "ev_step", np.int64).tolist(),
              "row": _col(out, "ev_row", np.int64).tolist(),
              "kind": names[kinds].tolist(),
              "blocks": blocks.tolist(),
              "bytes": (blocks * kv_bytes_per_block).tolist()}
    rows = _col(out, "sl_row", np.int64).tolist()
    stalls = {"row": rows, "preempted_s": _col(out, "sl_pre", np.float64).tolist(),
              "resumed_s": _col(out, "sl_res", np.float64).tolist(),
              "stall_s": _col(out, "sl_stall", np.float64).tolist(),
              "mode": np.array(["", "recompute", "swap"], dtype=object)[
                  _col(out, "sl_mode", np.int8)].tolist()}
    n = state.n
    return RawRun(state=state, steps=steps, first_scheduled_s=first_sched, first_token_s=first_tok,
                  finish_s=finish, max_tbt_s=max_tbt, events=events, stalls=stalls,
                  tbt_values=_col(out, "tbt_v", np.float64).copy(),
                  tbt_weights=_col(out, "tbt_w", np.int64).copy(),
                  sim_seconds=out["t"] - (float(state.arrival_s[0]) if n else 0.0),
                  num_steps=num_steps)
