"""The torch stub's paged KV storage: the device cache, the host pool, swap copies, fingerprints.

Owns the tensors and every copy between them:
- the device KV cache in vLLM's layout `[2, layers, num_blocks, block_size, kv_heads, head_dim]`
  (fp16/bf16, or `torch.float8_e4m3fn` storage for `kv_cache_dtype="fp8"`);
- the host pool (`num_cpu_blocks` blocks) for V0 swap or V1's CPU offloading tier (one chunk per
  block; `replay.stub.offload` says which chunk is where), pinned when CUDA is present. Its layout
  is block-major, `[num_cpu_blocks, 2, layers, block_size, kv_heads, head_dim]`, so one swapped
  block is one contiguous host region: swaps are a gather on the device plus a few large copies
  instead of 2 x layers small ones per block (what keeps them near pinned-copy speed);
- an int64 fingerprint per slot (`fp`, `host_fp`) moved by the same swap copies as the KV, and a
  numpy shadow of who wrote each slot (row, position, step) used only to word integrity errors.

Must not import traces/, capacity/, polars or duckdb (the GPU machine has torch + numpy only).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

UNWRITTEN = 0   # fingerprint of a slot nobody has written (real fingerprints are odd)

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


class StubIntegrityError(RuntimeError):
    """A request read KV that is not its own: wrong block table, lost or misplaced swap, stale
    recompute, or a write into a block another request still holds."""


def fingerprints(block_keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 fingerprint of (content key of the block, offset in the block), elementwise.

    `block_keys` are block content keys (`BlockKeys.key`) as uint64 (two's complement for the
    negative unique keys). Shared prefix blocks have equal keys, hence equal fingerprints, so a
    prefix-cache hit passes; every other block's key is unique to its request. SplitMix64 mixing."""
    with np.errstate(over="ignore"):
        x = block_keys.astype(np.uint64) * _M1 + offsets.astype(np.uint64) * _M2 + _M3
        x ^= x >> np.uint64(30)
        x *= _M2
        x ^= x >> np.uint64(27)
        x *= _M3
        x ^= x >> np.uint64(31)
    return (x | np.uint64(1)).view(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int        # per GPU
    head_dim: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    dtype: torch.dtype       # storage dtype

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (K and V, all layers) as stored here."""
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem


def upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host index array on `device`. On CUDA through pinned memory, asynchronously: a pageable
    copy would synchronize the stream, and inside a step that stalls the queued kernels."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(start index in ids, first id, length) of runs of consecutive ids (ids sorted)."""
    if len(ids) == 0:
        return []
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(ids)]))
    return [(int(s), int(ids[s]), int(e - s)) for s, e in zip(starts, ends)]


class PagedKV:
    """Device KV cache + host pool + fingerprints for one GPU of the TP group."""

    def __init__(self, layout: KVLayout, device: torch.device) -> None:
        self.layout = lay = layout
        self.device = device
        self.cuda = device.type == "cuda"
        L, N, B, H, d = (lay.num_layers, lay.num_gpu_blocks, lay.block_size, lay.num_kv_heads,
                         lay.head_dim)
        self.kv = torch.zeros((2, L, N, B, H, d), dtype=lay.dtype, device=device)
        self.fp = torch.zeros((N, B), dtype=torch.int64, device=device)
        # pin_memory=True raises on a CPU-only torch: ordinary host memory there.
        pin = self.cuda
        Nc = lay.num_cpu_blocks
        self.host_kv = torch.zeros((Nc, 2, L, B, H, d), dtype=lay.dtype, pin_memory=pin)
        self.host_fp = torch.zeros((Nc, B), dtype=torch.int64, pin_memory=pin)
        # Per-layer views, made once: each view costs a few microseconds of Python per layer and
        # step, which on a GPU is launch time (replay.stub.clock).
        self._flat = [[self.kv[k, layer].view(N * B, H, d) for layer in range(L)] for k in (0, 1)]
        self._rows = [[self.kv[k, layer].view(N * B * H, d) for layer in range(L)] for k in (0, 1)]
        # Byte views: copies do not care about the dtype (and CPU index_copy_ lacks fp8).
        self._kv_u8 = self.kv.view(torch.uint8)
        self._blocks_u8 = self._kv_u8.permute(2, 0, 1, 3, 4, 5)     # [N, 2, L, B, H, d*elem]
        self._host_u8 = self.host_kv.view(torch.uint8)
        # Who wrote each slot (row, position, step): only for error messages.
        self.w_row = np.full((N, B), -1, np.int32)
        self.w_pos = np.full((N, B), -1, np.int32)
        self.w_step = np.full((N, B), -1, np.int32)
        self.hw_row = np.full((Nc, B), -1, np.int32)
        self.hw_pos = np.full((Nc, B), -1, np.int32)
        self.hw_step = np.full((Nc, B), -1, np.int32)
        if self.cuda:
            self.copy_stream = torch.cuda.Stream(device=device)
            self.copy_done = torch.cuda.Event()
        self._in_flight = None           # the last offload copies' end event (CUDA)
        self.offload_copies: list = []

    # ------------------------------------------------------------------ per-layer views
    def flat(self, kind: int, layer: int) -> torch.Tensor:
        """K (kind 0) or V (kind 1) of one layer as `[num_blocks * block_size, kv_heads, head_dim]`."""
        return self._flat[kind][layer]

    def rows(self, kind: int, layer: int) -> torch.Tensor:
        """K or V of one layer as `[num_blocks * block_size * kv_heads, head_dim]`: one row per
        (slot, KV head), what a decode bucket's gather indexes."""
        return self._rows[kind][layer]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V of the scheduled tokens (`[T, kv_heads, head_dim]`) into their slots."""
        dt = self.layout.dtype
        for kind, x in ((0, k), (1, v)):
            dst = self._flat[kind][layer]
            if x.dtype != dt:
                x = x.to(dt)
            if dt == torch.float8_e4m3fn:
                dst.view(torch.uint8).index_copy_(0, slots, x.view(torch.uint8))
            else:
                dst.index_copy_(0, slots, x)

    def write_fingerprints(self, slots: torch.Tensor, slots_np: np.ndarray, fps: torch.Tensor,
                           rows_np: np.ndarray, pos_np: np.ndarray, step: int) -> None:
        self.fp.view(-1).index_copy_(0, slots, fps)
        self.w_row.reshape(-1)[slots_np] = rows_np
        self.w_pos.reshape(-1)[slots_np] = pos_np
        self.w_step.reshape(-1)[slots_np] = step

    # ------------------------------------------------------------------ swaps and offloads
    def swap(self, swap_out: np.ndarray, swap_in: np.ndarray) -> None:
        """Swap-out (gpu, cpu) pairs, then swap-in (cpu, gpu) pairs, before the forward pass.

        On CUDA the copies run on a separate stream; the compute stream waits on an event."""
        if len(swap_out) == 0 and len(swap_in) == 0:
            return
        if self.cuda:
            cur = torch.cuda.current_stream(self.device)
            self.copy_stream.wait_stream(cur)     # the previous step's KV writes come first
            with torch.cuda.stream(self.copy_stream):
                self._to_host(swap_out, "swap-out")
                self._to_device(swap_in, "swap-in")
            self.copy_done.record(self.copy_stream)
            cur.wait_event(self.copy_done)
        else:
            self._to_host(swap_out, "swap-out")
            self._to_device(swap_in, "swap-in")

    def offload(self, stores: np.ndarray, loads: np.ndarray, *, wait: bool) -> None:
        """CPU KV offloading copies: write-through stores (gpu, host) pairs, then loads (host,
        gpu) pairs, through the same host pool (the offload tier, one chunk per host block).

        On CUDA they run on the copy stream and overlap this step's forward pass, as vLLM's
        offloading worker does; `settle()` makes the next step wait for them, and `wait` makes
        this one wait (a flush, F9: a freed block a store still reads is handed out this step).
        The copy time of each call is kept in `offload_copies` (read with `offload_seconds`)."""
        if len(stores) == 0 and len(loads) == 0:
            return
        nbytes = (len(stores) + len(loads)) * self.layout.block_bytes
        if self.cuda:
            cur = torch.cuda.current_stream(self.device)
            self.copy_stream.wait_stream(cur)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(self.copy_stream):
                start.record()
                self._to_host(stores, "offload store")
                self._to_device(loads, "offload load")
                end.record()
            self._in_flight = end
            if wait:
                cur.wait_event(end)
            self.offload_copies.append((len(stores), len(loads), nbytes, (start, end)))
        else:
            t0 = time.perf_counter()
            self._to_host(stores, "offload store")
            self._to_device(loads, "offload load")
            self.offload_copies.append((len(stores), len(loads), nbytes, time.perf_counter() - t0))

    def settle(self) -> None:
        """The compute stream waits for the offload copies issued in earlier steps (a loaded
        request computes from a later step on; a stored block is reused only after a flush)."""
        if self._in_flight is not None:
            torch.cuda.current_stream(self.device).wait_event(self._in_flight)
            self._in_flight = None

    def offload_seconds(self) -> list[tuple[int, int, int, float]]:
        """(store blocks, load blocks, bytes, copy seconds) per offload call so far."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return [(s, ld, b, t if isinstance(t, float) else t[0].elapsed_time(t[1]) / 1e3)
                for s, ld, b, t in self.offload_copies]

    def _check_ids(self, gpu: np.ndarray, cpu: np.ndarray, what: str) -> None:
        lay = self.layout
        if len(gpu) and (gpu.min() < 0 or gpu.max() >= lay.num_gpu_blocks):
            raise StubIntegrityError(f"{what}: GPU block id outside [0, {lay.num_gpu_blocks}) in "
                                     f"{gpu.tolist()}")
        if len(cpu) and (cpu.min() < 0 or cpu.max() >= lay.num_cpu_blocks):
            raise StubIntegrityError(f"{what}: host block id outside [0, {lay.num_cpu_blocks}) in "
                                     f"{cpu.tolist()}")

    def _to_host(self, pairs: np.ndarray, what: str) -> None:
        """(gpu, host) pairs: one gather on the device into block-major order, then one copy per
        run of consecutive host ids; fingerprints and writers move with the KV."""
        if len(pairs) == 0:
            return
        pairs = pairs[np.argsort(pairs[:, 1], kind="stable")]
        gpu, cpu = pairs[:, 0], pairs[:, 1]
        self._check_ids(gpu, cpu, what)
        g = upload(gpu, self.device)
        staged = self._blocks_u8[g]
        staged_fp = self.fp[g]
        for i, c0, m in _runs(cpu):
            self._host_u8[c0:c0 + m].copy_(staged[i:i + m], non_blocking=True)
            self.host_fp[c0:c0 + m].copy_(staged_fp[i:i + m], non_blocking=True)
        self.hw_row[cpu] = self.w_row[gpu]
        self.hw_pos[cpu] = self.w_pos[gpu]
        self.hw_step[cpu] = self.w_step[gpu]

    def _to_device(self, pairs: np.ndarray, what: str) -> None:
        """(host, gpu) pairs: one copy per run of host ids into a staging buffer, one scatter."""
        if len(pairs) == 0:
            return
        pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
        cpu, gpu = pairs[:, 0], pairs[:, 1]
        self._check_ids(gpu, cpu, what)
        n = len(pairs)
        staged = torch.empty((n, *self._blocks_u8.shape[1:]), dtype=torch.uint8, device=self.device)
        staged_fp = torch.empty((n, self.layout.block_size), dtype=torch.int64, device=self.device)
        for i, c0, m in _runs(cpu):
            staged[i:i + m].copy_(self._host_u8[c0:c0 + m], non_blocking=True)
            staged_fp[i:i + m].copy_(self.host_fp[c0:c0 + m], non_blocking=True)
        g = upload(gpu, self.device)
        self._blocks_u8.index_copy_(0, g, staged)
        self.fp.index_copy_(0, g, staged_fp)
        self.w_row[gpu] = self.hw_row[cpu]
        self.w_pos[gpu] = self.hw_pos[cpu]
        self.w_step[gpu] = self.hw_step[cpu]

    def writer(self, slot: int) -> str:
        """Who last wrote a GPU slot, in words (for error messages)."""
        b, o = divmod(slot, self.layout.block_size)
        r = int(self.w_row[b, o])
        if r < 0:
            return "never written"
        return f"written by row {r} at position {int(self.w_pos[b, o])} in step {int(self.w_step[b, o])}"
