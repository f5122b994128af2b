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
replay's decisions equal `--executor model`; `timing="measured"` returns the measured step time
(CUDA events on a GPU, `time.perf_counter` on the CPU). The integrity check runs outside the timed
region. It runs on the reference implementation only (the compiled cores price steps in C).

Imports torch, numpy and replay's engine modules only; must not import traces/, capacity/, polars
or duckdb (the GPU machine has none of them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import torch

from replay.engine.plan import NO_OFFLOAD, StepPlan
from replay.engine.prefix import BlockKeys, UniqueBlockKeys
from replay.engine.spec import cdiv
from replay.engine.state import RequestState, Status
from replay.stub.kv import (UNWRITTEN, KVLayout, PagedKV, StubIntegrityError, fingerprints)
from replay.stub.model import StepBatch, StubShape, StubShapeName, WeightlessModel
from replay.stub.offload import OffloadCopies

__all__ = ["StubExecutor", "StubIntegrityError", "StepRecord", "default_device", "engine_layout",
           "kv_dtype"]

Timing = Literal["model", "measured"]
_MASK64 = (1 << 64) - 1
# Decode rows share one padded attention call while their contexts are within this ratio: on a
# GPU padding costs memory traffic; on the CPU (tiny shapes) the per-call overhead dominates.
_DECODE_BUCKET_RATIO = {"cuda": 1.5, "cpu": float("inf")}
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
    num_tokens: int
    swap_out_blocks: int
    swap_in_blocks: int


class StubExecutor:
    def __init__(self, *, kv: PagedKV, model: WeightlessModel, keys: BlockKeys,
                 state: RequestState, block_table: Callable[[int], list[int]],
                 timing: Timing = "model", cost_model=None, check: bool = True,
                 record: bool = False) -> None:
        if timing not in ("model", "measured"):
            raise ValueError(f"timing: {timing!r} is not 'model' or 'measured'")
        if timing == "model" and cost_model is None:
            raise ValueError("timing='model' needs a cost model")
        self.kv, self.model, self.keys, self.state = kv, model, keys, state
        self.block_table = block_table
        self.timing, self.cost_model, self.check, self.record = timing, cost_model, check, record
        self.device = kv.device
        self.B = kv.layout.block_size
        self._arange_b = np.arange(self.B, dtype=np.int64)
        self._expected: dict[int, np.ndarray] = {}
        self.step = 0
        self.records: list[StepRecord] = []
        self.last_swap_s = 0.0
        self.last_measured_s = 0.0
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
            measured_s, swap_s, prep = self._execute(plan)
            if self.check:
                self._check(prep)
        self.last_swap_s, self.last_measured_s = swap_s, measured_s
        if self.record:
            self.records.append(StepRecord(
                step=self.step, measured_s=measured_s, swap_s=swap_s, model_s=model_s,
                num_tokens=int(plan.num_new_tokens.sum()), swap_out_blocks=len(plan.swap_out),
                swap_in_blocks=len(plan.swap_in)))
        if self.step % 1024 == 0:
            self._forget_done()
        return model_s if self.timing == "model" else measured_s

    # ------------------------------------------------------------------ one step
    def _execute(self, plan: StepPlan):
        cuda = self.device.type == "cuda"
        if cuda:
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
        else:
            t0 = time.perf_counter()
        self.kv.settle()
        self.kv.swap(plan.swap_out, plan.swap_in)
        if cuda:
            e1.record()
        else:
            t1 = time.perf_counter()
        if plan.offload is not NO_OFFLOAD or self.offload is not None:
            if self.offload is None:
                self.offload = OffloadCopies(self.kv.layout.num_cpu_blocks)
            stores, loads, wait = self.offload.plan(plan.offload, self.step, plan.rows)
            self.kv.offload(stores, loads, wait=wait)
        prep = _Prepared(self, plan)
        self.kv.write_fingerprints(prep.new_slots_t, prep.new_slots, prep.new_fps_t, prep.new_rows,
                                   prep.new_pos, self.step)
        self.model.forward(self.kv, prep.batch)
        if cuda:
            e2.record()
            e2.synchronize()
            return e0.elapsed_time(e2) / 1e3, e0.elapsed_time(e1) / 1e3, prep
        t2 = time.perf_counter()
        return t2 - t0, t1 - t0, prep

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
    """One step's indices: numpy on the host (for the check), small tensors on the device."""

    def __init__(self, ex: StubExecutor, plan: StepPlan) -> None:
        B, dev, kv = ex.B, ex.device, ex.kv
        N = kv.layout.num_gpu_blocks
        rows = plan.rows.tolist()
        n_new = plan.num_new_tokens.tolist()
        n_ctx = plan.num_computed_tokens.tolist()
        self.rows = rows
        self.ctx_slots_parts: list[np.ndarray] = []
        self.ctx_exp_parts: list[np.ndarray] = []
        new_slots, new_fps, new_rows, new_pos = [], [], [], []
        decode: list[tuple[int, int, np.ndarray]] = []     # (token index, total, table)
        prefill: list[tuple[int, int, int, np.ndarray]] = []
        tok = 0
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
            slots = (table[:, None] * B + ex._arange_b).reshape(-1)[:total]
            exp = ex.expected(r, total)[:total]
            self.ctx_slots_parts.append(slots)
            self.ctx_exp_parts.append(exp)
            new_slots.append(slots[c:]); new_fps.append(exp[c:])
            new_rows.append(np.full(n, r, np.int32)); new_pos.append(np.arange(c, total, dtype=np.int32))
            if n == 1:
                decode.append((tok, total, table))
            else:
                prefill.append((tok, tok + n, c, table))
            tok += n
        self.num_tokens = tok
        cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
        self.new_slots = cat(new_slots, np.int64)
        self.new_rows = cat(new_rows, np.int32)
        self.new_pos = cat(new_pos, np.int32)
        to_dev = (lambda a: _to_device(a, dev))
        self.new_slots_t = to_dev(self.new_slots)
        self.new_fps_t = to_dev(cat(new_fps, np.int64))
        batch = StepBatch(num_tokens=tok, new_slots=self.new_slots_t)
        batch.decode_groups = _decode_groups(decode, B, dev, ex.model.dtype)
        for t0, t1, c, table in prefill:
            total = c + (t1 - t0)
            tb = to_dev(table)
            ctx = (tb[:, None] * B + torch.arange(B, device=dev)).reshape(-1)[:total]
            mask = None
            if c > 0:
                qpos = c + torch.arange(t1 - t0, device=dev)
                mask = torch.arange(total, device=dev)[None, :] <= qpos[:, None]
            batch.prefill_rows.append((t0, t1, ctx, mask))
        if len(rows):
            known = ex.state.prompt_len[plan.rows] + ex.state.num_output[plan.rows]
            ends = np.cumsum(plan.num_new_tokens) - 1
            samp = ends[plan.num_computed_tokens + plan.num_new_tokens >= known]
            batch.sample_idx = to_dev(samp.astype(np.int64))
        self.batch = batch


def _decode_groups(decode: list, B: int, dev: torch.device, dtype: torch.dtype) -> list:
    """Padded attention groups of one-token rows, bucketed so padding stays under ~50 %."""
    if not decode:
        return []
    decode = sorted(decode, key=lambda d: d[1])
    ratio = _DECODE_BUCKET_RATIO.get(dev.type, 1.5)
    groups, cur = [], [decode[0]]
    for d in decode[1:]:
        if d[1] > ratio * cur[0][1]:
            groups.append(cur)
            cur = []
        cur.append(d)
    groups.append(cur)
    out = []
    for g in groups:
        b, S = len(g), g[-1][1]
        nbmax = -(-S // B)
        tables = np.zeros((b, nbmax), np.int64)
        for i, (_, _, table) in enumerate(g):
            tables[i, :len(table)] = table
        tok = _to_device(np.array([d[0] for d in g], np.int64), dev)
        totals = _to_device(np.array([d[1] for d in g], np.int64), dev)
        tables_t = _to_device(tables, dev)
        pos = torch.arange(S, device=dev)
        # Slot of every (row, position): padding reads a valid slot and is masked out.
        ctx = tables_t[:, pos // B] * B + pos % B
        bias = torch.zeros((len(g), 1, 1, S), dtype=dtype, device=dev)
        bias.masked_fill_((pos[None, :] >= totals[:, None])[:, None, None, :], float("-inf"))
        out.append((tok, ctx, bias))
    return out


def _to_device(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dev.type == "cpu" else t.to(dev)


def compute_dtype(device: torch.device) -> torch.dtype:
    # bf16 GEMMs on a GPU as in vLLM; float32 on the CPU, where bf16 matmuls are slow.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _scheduler_keys(scheduler) -> BlockKeys:
    for owner in ("kv", "bm"):
        keys = getattr(getattr(scheduler, owner, None), "keys", None)
        if keys is not None:
            return keys
    return UniqueBlockKeys()
