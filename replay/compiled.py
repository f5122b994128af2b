"""What the Python wrappers of the compiled replay cores share (replay/v1/core.py,
replay/v0/core.py; the C side is replay/kvcore.h): the checks every core needs, the arguments
kvcore.h parses (request arrays, cost constants, block keys), driving a core in chunks of steps
(progress, Ctrl-C) and turning its columns into the `RawRun` the Python loop would return.
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

MODES = {"recompute": 0, "none": 1, "swap": 2}
POLICIES = {"fcfs": 0, "priority": 1}


def ineligible(ext, executor, state: RequestState, keys, spec) -> str | None:
    """The reasons common to both cores not to run a replay (None: no such reason)."""
    block_size = spec.block_size
    if spec.policy not in POLICIES:
        return f"policy {spec.policy}"
    if spec.preemption_mode not in MODES:
        return f"preemption_mode {spec.preemption_mode}"
    if ext is None:
        return "the compiled core is not built"
    if os.environ.get("KVCAP_CORE", "") == "python":
        return "KVCAP_CORE=python"
    if type(executor) is not CostModel:
        return "not the cost-model executor"
    if type(keys) is TraceBlockKeys:
        if keys.block_size != block_size:
            return "trace keys built for another block size"
    elif type(keys) is not UniqueBlockKeys:
        return f"block keys {type(keys).__name__}"
    if state.n >= 2**31 - 1:
        return "more than 2**31 requests (the cores keep rows as int32)"
    if np.any(state.status != Status.PENDING):
        return "the scheduler has already run"
    return None


def keys_args(keys, state: RequestState, block_size: int) -> tuple:
    """kvcore.h `keys_take`: (mode, hash_block_tokens, chain offsets, chain ids, shared blocks)."""
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


def cost_args(ex: CostModel, kv_bytes_per_block: int) -> tuple:
    """kvcore.h `cost_parse`: the cost model's folded constants."""
    return (ex._linear_per_token, ex._lm_head_per_sample, ex._attn_per_unit, ex._flops_rate,
            ex._bytes_rate, ex._weight_bytes, ex.constants.overhead_s, ex._ar_fixed,
            ex._ar_per_token, ex.kv_bytes_per_token, kv_bytes_per_block, ex._swap_per_block)


def replay(ext, state: RequestState, spec_args: tuple, executor: CostModel, keys, *,
           block_size: int, kv_bytes_per_block: int,
           on_progress: Callable[[float, int], None] | None, progress_every_steps: int,
           check: bool) -> tuple[RawRun, dict]:
    """Replay every request of `state` in the core `ext`; returns the run and the core's raw
    output (for core-specific scalars such as V0's abort)."""
    n = state.n
    if n and np.any(np.diff(state.arrival_s) < 0):
        raise ValueError("requests must be sorted by arrival_s")
    first_sched, first_tok, finish = (np.full(n, np.nan) for _ in range(3))
    max_tbt = np.zeros(n)
    arrays = (state.arrival_s, state.prompt_len, state.output_len, state.status,
              state.num_computed, state.num_output, state.num_preemptions, state.num_swaps,
              state.num_recomputes, state.recomputed_tokens, state.cached_prompt_tokens,
              state.computed_at_preemption, first_sched, first_tok, finish, max_tbt, state.priority)
    core = ext.new(arrays, spec_args, cost_args(executor, kv_bytes_per_block),
                   keys_args(keys, state, block_size))
    chunk = progress_every_steps if on_progress is not None else 1 << 40
    while True:
        done, _step, t, cursor = ext.run(core, chunk)
        if done:
            break
        if on_progress is not None:
            on_progress(t, cursor)
    if check:
        ext.check(core)
    out = ext.results(core)
    return _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block), out


def _col(out: dict, name: str, dtype) -> np.ndarray:
    return np.frombuffer(out[name], dtype=dtype)


def _raw(state, out, first_sched, first_tok, finish, max_tbt, kv_bytes_per_block) -> RawRun:
    steps = {k: _col(out, k, t) for k, t in STEP_COLUMNS.items()}
    blocks = _col(out, "ev_blocks", np.int64)
    events = {"t_s": _col(out, "ev_t", np.float64).tolist(),
              "step": _col(out, "ev_step", np.int64).tolist(),
              "row": _col(out, "ev_row", np.int64).tolist(),
              "kind": np.array(EVENT_KINDS, dtype=object)[_col(out, "ev_kind", np.int8)].tolist(),
              "blocks": blocks.tolist(),
              "bytes": (blocks * kv_bytes_per_block).tolist()}
    rows = _col(out, "sl_row", np.int64).tolist()
    stalls = {"row": rows, "preempted_s": _col(out, "sl_pre", np.float64).tolist(),
              "resumed_s": _col(out, "sl_res", np.float64).tolist(),
              "stall_s": _col(out, "sl_stall", np.float64).tolist(),
              "mode": np.array(["", "recompute", "swap"], dtype=object)[
                  _col(out, "sl_mode", np.int8)].tolist()}
    return RawRun(state=state, steps=steps, first_scheduled_s=first_sched, first_token_s=first_tok,
                  finish_s=finish, max_tbt_s=max_tbt, events=events, stalls=stalls,
                  tbt_values=_col(out, "tbt_v", np.float64).copy(),
                  tbt_weights=_col(out, "tbt_w", np.int64).copy(),
                  sim_seconds=out["t"] - (float(state.arrival_s[0]) if state.n else 0.0),
                  num_steps=len(steps["start_s"]))
