"""The torch stub executor (`--executor stub`): executes every step plan on real tensors.

Per step, in vLLM's order: swap-out then swap-in copies (batched, on a copy stream on CUDA), V1's
CPU offloading stores and loads (`replay.stub.offload`: on the copy stream, overlapping the
forward pass unless a flush makes it wait), the K/V write of every scheduled token into slot
(block_table[pos // B], pos % B), attention over each request's context gathered through its
block table (padded batched attention for one-token rows, bucketed by context length; one call per
multi-token row), the weightless model's GEMMs (see
`replay.stub.model`), the lm_head for the rows that sample. Storage and copies: `replay.stub.kv`.

Integrity: each written slot gets the fingerprint of (content key of its block, offset); after the
forward pass the whole context of every scheduled row is read back and compared, so a wrong block
table, a lost or misplaced swap, a recompute over stale blocks or a write into a block another
request still reads raises `StubIntegrityError` naming the step, row, position, block and writer.
Shared prefix-cache blocks pass: their content keys are equal.

Timing: `timing="model"` (default) executes for real but returns the cost model's duration, so the
replay's decisions equal `--executor model`; `timing="measured"` returns the measured step time:
on a GPU the device's time for the step's kernels, its Python launches hidden behind a GPU sleep
(`replay.stub.clock`; each step records whether that held), on the CPU `time.perf_counter`. Index
building and uploads come before the clock starts, the integrity check after it stops. It runs on
the reference implementation only (the compiled cores price steps in C).

Imports torch, numpy and replay's engine modules only; must not import traces/, capacity/, polars
or duckdb (the GPU machine has none of them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch

from replay.engine.plan import NO_OFFLOAD, StepPlan
from replay.engine.prefix import BlockKeys, UniqueBlockKeys
from replay.engine.spec import cdiv
from replay.engine.state import RequestState, Status
from replay.stub.clock import StepClock
from replay.stub.kv import (UNWRITTEN, KVLayout, PagedKV, StubIntegrityError, fingerprints,
                             upload)
from replay.stub.model import StepBatch, StubShape, StubShapeName, WeightlessModel
from replay.stub.offload import OffloadCopies

__all__ = ["StubExecutor", "StubIntegrityError", "StepRecord", "default_device", "engine_layout",
           "kv_dtype"]

Timing = Literal["model", "measured"]
_MASK64 = (1 << 64) - 1
# Decode rows share one padded attention call while their contexts are within this ratio: on a
# GPU padding costs memory traffic (a row reads up to 2x its context) and every bucket costs 5 kernels
# per layer, which must stay inside what the device queues ahead of a step (clock.py); on the CPU
# (tiny shapes) calls are cheap and padding is not: a 200-request Azure conv replay 5x denser takes
# 18 s with 4, 28 s with one bucket.
_DECODE_BUCKET_RATIO = {"cuda": 2.0, "cpu": 4.0}
_DONE = (Status.FINISHED, Status.REJECTED, Status.ABORTED)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def engine_layout(eng, shape: StubShape) -> KVLayout:
    """The stub's KV layout for a resolved engine: its pools, `shape`'s per-GPU KV heads."""
    spec = eng.spec
    return KVLayout(num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                    head_dim=shape.head_dim, block_size=spec.block_size,
                    num_gpu_blocks=spec.num_gpu_blocks, num_cpu_blocks=spec.num_cpu_blocks,
                    dtype=kv_dtype(eng.config.kv_cache_dtype, eng.model.weight_dtype_bytes))


def kv_dtype(kv_cache_dtype: str, weight_dtype_bytes: int = 2) -> torch.dtype:
    if kv_cache_dtype == "fp8":
        return torch.float8_e4m3fn
    return torch.bfloat16 if weight_dtype_bytes == 2 else torch.float32


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """What one stub step did and took (kept when `record=True`; calibration reads it)."""
    step: int
    measured_s: float
    swap_s: float              # measured swap copies alone
    model_s: float             # the cost model's duration for the same plan (nan without one)
    enqueue_s: float           # host time spent launching the step
    gapless: bool              # the device ran the step without waiting for the host (clock.py)
    num_tokens: int
    swap_out_blocks: int
    swap_in_blocks: int


class StubExecutor:
    def __init__(self, *, kv: PagedKV, model: WeightlessModel, keys: BlockKeys,
                 state: RequestState, block_table: Callable[[int], list[int]],
                 timing: Timing = "model", cost_model=None, check: bool = True,
                 record: bool = False, hide_launch: bool = True) -> None:
        if timing not in ("model", "measured"):
            raise ValueError(f"timing: {timing!r} is not 'model' or 'measured'")
        if timing == "model" and cost_model is None:
            raise ValueError("timing='model' needs a cost model")
        self.kv, self.model, self.keys, self.state = kv, model, keys, state
        self.block_table = block_table
        self.timing, self.cost_model, self.check, self.record = timing, cost_model, check, record
        self.device = kv.device
        self.clock = StepClock(kv.device, hide_launch=hide_launch and timing == "measured")
        self.B = kv.layout.block_size
        self._arange_b = np.arange(self.B, dtype=np.int64)
        self._expected: dict[int, np.ndarray] = {}
        self.step = 0
        self.records: list[StepRecord] = []
        self.last_swap_s = 0.0
        self.last_measured_s = 0.0
        self.last_gapless = True
        # V1 CPU offloading: the tier lives in the host pool (created at the first offload plan).
        self.offload: OffloadCopies | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_engine(cls, eng, *, state: RequestState, scheduler, keys: BlockKeys | None = None,
                   device: str | torch.device | None = None,
                   stub_shape: StubShapeName | None = None, timing: Timing = "model",
                   check: bool = True, record: bool = False, seed: int = 0) -> "StubExecutor":
        """The stub for a resolved engine (`replay.config.resolve`) driving `scheduler`."""
        dev = torch.device(device) if device is not None else default_device()
        shape_name = stub_shape or ("full" if dev.type == "cuda" else "tiny")
        shape = StubShape.for_model(eng.model, eng.tensor_parallel_size, shape_name)
        kv = PagedKV(engine_layout(eng, shape), dev)
        model = WeightlessModel(shape, dev, compute_dtype(dev), seed=seed)
        if keys is None:
            keys = _scheduler_keys(scheduler)
        from replay.timing.executors import cost_model_for
        cost = cost_model_for(eng, calibration=eng.config.calibration)
        return cls(kv=kv, model=model, keys=keys, state=state,
                   block_table=scheduler.block_table, timing=timing, cost_model=cost,
                   check=check, record=record)

    # ------------------------------------------------------------------ executor contract
    def step_s(self, plan: StepPlan, num_sampled: int) -> float:
        self.step += 1
        model_s = (self.cost_model.step_s(plan, num_sampled) if self.cost_model is not None
                   else float("nan"))
        with torch.inference_mode():
            t, prep = self._execute(plan)
            if self.check:
                self._check(prep)
        measured_s = t.total_s
        self.last_swap_s, self.last_measured_s, self.last_gapless = t.swap_s, measured_s, t.gapless
        if self.record:
            self.records.append(StepRecord(
                step=self.step, measured_s=measured_s, swap_s=t.swap_s, model_s=model_s,
                enqueue_s=t.enqueue_s, gapless=t.gapless,
                num_tokens=int(plan.num_new_tokens.sum()), swap_out_blocks=len(plan.swap_out),
                swap_in_blocks=len(plan.swap_in)))
        if self.step % 1024 == 0:
            self._forget_done()
        return model_s if self.timing == "model" else measured_s

    # ------------------------------------------------------------------ one step
    def _execute(self, plan: StepPlan):
        # Host work first (indices, uploads, offload bookkeeping): outside the step's clock,
        # which times the device's work (see replay.stub.clock).
        prep = _Prepared(self, plan)
        self.model.inputs(prep.num_tokens)
        copies = None
        if plan.offload is not NO_OFFLOAD or self.offload is not None:
            if self.offload is None:
                self.offload = OffloadCopies(self.kv.layout.num_cpu_blocks)
            copies = self.offload.plan(plan.offload, self.step, plan.rows)
        clock = self.clock
        clock.start()
        self.kv.settle()
        self.kv.swap(plan.swap_out, plan.swap_in)
        clock.mark()
        if copies is not None:
            stores, loads, wait = copies
            self.kv.offload(stores, loads, wait=wait)
        self.kv.write_fingerprints(prep.new_slots_t, prep.new_slots, prep.new_fps_t, prep.new_rows,
                                   prep.new_pos, self.step)
        self.model.forward(self.kv, prep.batch)
        return clock.stop(), prep

    def expected(self, row: int, num_tokens: int) -> np.ndarray:
        """Fingerprints of positions [0, num_tokens) of a request (cached per row, grown by block)."""
        e = self._expected.get(row)
        if e is not None and len(e) >= num_tokens:
            return e
        have = 0 if e is None else len(e) // self.B
        need = cdiv(num_tokens, self.B)
        key = self.keys.key
        ks = np.array([key(row, k) & _MASK64 for k in range(have, need)], dtype=np.uint64)
        fresh = fingerprints(np.repeat(ks, self.B), np.tile(self._arange_b, need - have))
        e = fresh if e is None else np.concatenate((e, fresh))
        self._expected[row] = e
        return e

    def _forget_done(self) -> None:
        st = self.state.status
        for r in [r for r in self._expected if st[r] in _DONE]:
            del self._expected[r]

    # ------------------------------------------------------------------ integrity
    def _check(self, prep: "_Prepared") -> None:
        if not prep.ctx_slots_parts:
            return
        slots = np.concatenate(prep.ctx_slots_parts)
        exp = np.concatenate(prep.ctx_exp_parts)
        if self.device.type == "cpu":
            found = self.kv.fp.numpy().reshape(-1)[slots]
        else:
            idx = torch.from_numpy(slots).to(self.device)
            found = self.kv.fp.view(-1)[idx].cpu().numpy()
        bad = np.flatnonzero(found != exp)
        if len(bad) == 0:
            return
        i = int(bad[0])
        starts = np.cumsum([0] + [len(p) for p in prep.ctx_slots_parts])
        j = int(np.searchsorted(starts, i, "right") - 1)
        row, pos = prep.rows[j], i - int(starts[j])
        slot = int(slots[i])
        block, off = divmod(slot, self.B)
        key = self.keys.key(row, pos // self.B)
        got = int(found[i])
        what = "an unwritten slot" if got == UNWRITTEN else f"{got & _MASK64:#018x}"
        raise StubIntegrityError(
            f"step {self.step}: request row {row} reads position {pos} through block "
            f"{pos // self.B} of its block table = GPU block {block}, offset {off}: expected "
            f"fingerprint {int(exp[i]) & _MASK64:#018x} (block key {key}, offset {off}), found "
            f"{what} ({self.kv.writer(slot)}); {len(bad)} bad slot(s) in this step")


class _Prepared:
    """One step's indices: numpy on the host (for the check), small tensors on the device.

    Built before the step's clock starts. Token order: decode rows first, sorted by context
    length (each bucket a contiguous range), then the multi-token rows in plan order."""

    def __init__(self, ex: StubExecutor, plan: StepPlan) -> None:
        B, dev, kv = ex.B, ex.device, ex.kv
        N = kv.layout.num_gpu_blocks
        rows = plan.rows.tolist()
        n_new = plan.num_new_tokens.tolist()
        n_ctx = plan.num_computed_tokens.tolist()
        self.rows = rows
        self.ctx_slots_parts: list[np.ndarray] = []
        self.ctx_exp_parts: list[np.ndarray] = []
        tables: list[np.ndarray] = []
        for r, n, c in zip(rows, n_new, n_ctx):
            total = c + n
            table = np.asarray(ex.block_table(r), dtype=np.int64)
            nb = cdiv(total, B)
            if len(table) < nb:
                raise StubIntegrityError(
                    f"step {ex.step}: request row {r} computes positions {c}..{total - 1} but its "
                    f"block table has {len(table)} blocks ({len(table) * B} slots)")
            table = table[:nb]
            if nb and (table.min() < 0 or table.max() >= N):
                raise StubIntegrityError(f"step {ex.step}: request row {r}: block table "
                                         f"{table.tolist()} has ids outside [0, {N})")
            tables.append(table)
            self.ctx_slots_parts.append((table[:, None] * B + ex._arange_b).reshape(-1)[:total])
            self.ctx_exp_parts.append(ex.expected(r, total)[:total])
        n_arr = np.asarray(n_new, np.int64)
        total_arr = np.asarray(n_ctx, np.int64) + n_arr
        dec = np.flatnonzero(n_arr == 1)
        dec = dec[np.argsort(total_arr[dec], kind="stable")]
        order = np.concatenate((dec, np.flatnonzero(n_arr != 1))).astype(np.int64)
        # First token of each row (indexed like plan.rows) in the step's token order.
        tok0 = np.empty(len(rows), np.int64)
        tok0[order] = np.concatenate(([0], np.cumsum(n_arr[order])[:-1])) if len(rows) else []
        cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
        self.num_tokens = tok = int(n_arr.sum())
        self.new_slots = cat([self.ctx_slots_parts[i][n_ctx[i]:] for i in order], np.int64)
        new_fps = cat([self.ctx_exp_parts[i][n_ctx[i]:] for i in order], np.int64)
        self.new_rows = np.repeat(np.asarray(rows, np.int32)[order], n_arr[order])
        self.new_pos = cat([np.arange(n_ctx[i], total_arr[i], dtype=np.int32) for i in order],
                           np.int32)
        to_dev = (lambda a: upload(a, dev))
        self.new_slots_t = to_dev(self.new_slots)
        self.new_fps_t = to_dev(new_fps)
        batch = StepBatch(num_tokens=tok, new_slots=self.new_slots_t)
        batch.decode_groups = _decode_groups(
            [(int(tok0[i]), int(total_arr[i]), tables[i]) for i in dec], B,
            kv.layout.num_kv_heads, dev, ex.model.dtype)
        for i in order[len(dec):]:
            c, t0 = n_ctx[i], int(tok0[i])
            t1, total = t0 + n_new[i], int(total_arr[i])
            tb = to_dev(tables[i])
            ctx = (tb[:, None] * B + torch.arange(B, device=dev)).reshape(-1)[:total]
            # A chunk after earlier context is causal aligned to its end (query i sees positions
            # up to c + i): a bias object, not a mask tensor, so a GPU runs flash attention
            # instead of materialising n x total scores.
            mask = _causal_lower_right(t1 - t0, total) if c > 0 else None
            batch.prefill_rows.append((t0, t1, ctx, mask))
        if len(rows):
            known = ex.state.prompt_len[plan.rows] + ex.state.num_output[plan.rows]
            samp = (tok0 + n_arr - 1)[total_arr >= known]
            batch.sample_idx = to_dev(np.sort(samp))
        self.batch = batch


def _decode_groups(decode: list, B: int, num_kv_heads: int, dev: torch.device,
                   dtype: torch.dtype) -> list:
    """Padded attention buckets of one-token rows (given sorted by context, their tokens
    consecutive), split so padding stays under ~50 % on a GPU."""
    if not decode:
        return []
    ratio = _DECODE_BUCKET_RATIO.get(dev.type, 1.5)
    groups, cur = [], [decode[0]]
    for d in decode[1:]:
        if d[1] > ratio * cur[0][1]:
            groups.append(cur)
            cur = []
        cur.append(d)
    groups.append(cur)
    heads = torch.arange(num_kv_heads, device=dev)
    out = []
    for g in groups:
        b, S = len(g), g[-1][1]
        nbmax = -(-S // B)
        tables = np.zeros((b, nbmax), np.int64)
        for i, (_, _, table) in enumerate(g):
            tables[i, :len(table)] = table
        totals = upload(np.array([d[1] for d in g], np.int64), dev)
        tables_t = upload(tables, dev)
        pos = torch.arange(S, device=dev)
        # Slot of every (row, position): padding reads a valid slot and is masked out.
        ctx = tables_t[:, pos // B] * B + pos % B                              # [b, S]
        idx = (ctx[:, None, :] * num_kv_heads + heads[None, :, None]).reshape(-1)
        bias = torch.zeros((b, S), dtype=dtype, device=dev)
        bias.masked_fill_(pos[None, :] >= totals[:, None], float("-inf"))
        bias = bias[:, None, None, :].expand(b, num_kv_heads, 1, S).reshape(b * num_kv_heads, 1, S)
        out.append((g[0][0], g[0][0] + b, idx, bias))
    return out


def _causal_lower_right(num_queries: int, num_keys: int):
    # Imported here: torch.nn.attention.bias pulls in torch._dynamo (~3 s), needed only by a step
    # with a chunk over earlier context.
    from torch.nn.attention.bias import causal_lower_right
    return causal_lower_right(num_queries, num_keys)


def compute_dtype(device: torch.device) -> torch.dtype:
    # bf16 GEMMs on a GPU as in vLLM; float32 on the CPU, where bf16 matmuls are slow.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _scheduler_keys(scheduler) -> BlockKeys:
    for owner in ("kv", "bm"):
        keys = getattr(getattr(scheduler, owner, None), "keys", None)
        if keys is not None:
            return keys
    return UniqueBlockKeys()
