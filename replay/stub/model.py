"""The torch stub's weightless model: random weights of the configured shape, a real forward pass.

Owns `StubShape` (`full`: the model's real per-GPU dimensions; `tiny`: small hidden size, heads and
layers so a CPU replays thousands of requests), `StepBatch` (the device-side index tensors of one
step) and `WeightlessModel.forward`: per layer the Q and KV GEMMs, the K/V write into the paged cache,
attention over each request's context gathered through its block table, the output projection and
the MLP GEMMs; then the lm_head for the rows that sample.

One layer's weights are shared by all layers: every layer still streams its weights from memory
(a layer of an 8B model is far larger than any cache), so time matches a real model while the
stub needs ~1/L of the weight memory; the KV cache is per layer, as in vLLM.

Must not import traces/, capacity/, polars or duckdb.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from replay.stub.kv import PagedKV

StubShapeName = Literal["full", "tiny"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StubShape:
    """Per-GPU dimensions of the model the stub runs."""
    kind: StubShapeName
    num_layers: int
    hidden_size: int
    num_heads: int            # query heads per GPU
    num_kv_heads: int         # KV heads per GPU
    head_dim: int
    intermediate_size: int    # per GPU
    vocab_size: int           # lm_head columns per GPU

    @classmethod
    def for_model(cls, model, tp: int, kind: StubShapeName) -> "StubShape":
        if kind == "tiny":
            # Small enough for thousands of CPU steps; the block pool stays real-sized.
            return cls(kind="tiny", num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1,
                       head_dim=16, intermediate_size=64, vocab_size=256)
        if kind != "full":
            raise ValueError(f"stub_shape: {kind!r} is not 'full' or 'tiny'")
        return cls(kind="full", num_layers=model.num_layers, hidden_size=model.hidden_size,
                   num_heads=model.num_attention_heads // tp,
                   num_kv_heads=max(1, model.num_kv_heads // tp), head_dim=model.head_dim,
                   intermediate_size=-(-model.intermediate_size // tp),
                   vocab_size=-(-model.vocab_size // tp))


@dataclass(slots=True, kw_only=True)
class StepBatch:
    """Device index tensors of one step (built once per step, used by every layer).

    Tokens are ordered decode rows first (by context length, so each bucket is one contiguous
    token range), then the multi-token rows: every layer then slices instead of scattering."""
    num_tokens: int
    new_slots: torch.Tensor                       # [T] cache slot of each scheduled token
    # Decode rows (one new token) bucketed by context length: (first token, end token, KV index
    # [b * kv_heads * S] into the cache viewed as `[slots * kv_heads, head_dim]` in (row, KV
    # head, position) order, padded to the bucket's longest context S; additive mask
    # [b * kv_heads, 1, S]: 0 inside the context, -inf on padding).
    decode_groups: list = field(default_factory=list)
    # Rows with several new tokens: (first token, end token, context slots [S], lower-right
    # causal bias after earlier context, or None: plain causal).
    prefill_rows: list = field(default_factory=list)
    sample_idx: torch.Tensor | None = None        # token index of each sampling row


class WeightlessModel:
    def __init__(self, shape: StubShape, device: torch.device, dtype: torch.dtype,
                 seed: int = 0) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        s = shape
        g = torch.Generator(device="cpu").manual_seed(seed)

        def w(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g) / rows ** 0.5).to(device=device, dtype=dtype)

        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        # The QKV projection as two GEMMs of the same total size: Q comes out contiguous, so
        # every decode bucket's queries are a view, not a copy per layer.
        self.w_q = w(s.hidden_size, q)
        self.w_kv = w(s.hidden_size, 2 * kv)
        self.w_o = w(q, s.hidden_size)
        self.w_gate_up = w(s.hidden_size, 2 * s.intermediate_size)
        self.w_down = w(s.intermediate_size, s.hidden_size)
        self.w_lm = w(s.hidden_size, s.vocab_size)
        self._x = torch.zeros(0, s.hidden_size, device=device, dtype=dtype)
        self._gen = g

    def inputs(self, n: int) -> torch.Tensor:
        """Random token embeddings (grown on demand, reused: values do not matter). The executor
        calls it before it starts a step's clock: growing copies from the host."""
        if self._x.shape[0] < n:
            m = max(n, 2 * self._x.shape[0], 256)
            self._x = torch.randn(m, self.shape.hidden_size, generator=self._gen).to(
                device=self.device, dtype=self.dtype)
        return self._x[:n]

    def forward(self, kv: PagedKV, batch: StepBatch) -> torch.Tensor | None:
        """Run every layer over the batch; returns the sampled token ids (or None).

        About a dozen kernels per layer, plus 5 per decode bucket and a few per multi-token row
        (a real engine's fused layer has ~10): few enough that a step's launches fit in what the
        device queues ahead, so its measured time is the kernels' (`replay.stub.clock`)."""
        s, T = self.shape, batch.num_tokens
        if T == 0:
            return None
        H, Hkv, d, inter = s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size
        x = self.inputs(T)
        for layer in range(s.num_layers):
            q = (x @ self.w_q).view(T, H, d)
            kvp = x @ self.w_kv
            kv.write(layer, batch.new_slots, kvp[:, :Hkv * d].view(T, Hkv, d),
                     kvp[:, Hkv * d:].view(T, Hkv, d))
            attn = self._attention(kv, layer, q, batch)
            h = torch.addmm(x, attn.view(T, H * d), self.w_o)
            gu = h @ self.w_gate_up
            h = torch.addmm(h, F.silu(gu[:, :inter]) * gu[:, inter:], self.w_down)
            # RMS norm keeps the random activations bounded across layers.
            x = F.rms_norm(h, (s.hidden_size,), eps=1e-6)
        if batch.sample_idx is None or batch.sample_idx.numel() == 0:
            return None
        return (x[batch.sample_idx] @ self.w_lm).argmax(-1)

    def _attention(self, kv: PagedKV, layer: int, q: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        dt, d = self.dtype, self.shape.head_dim
        out = torch.empty_like(q)
        g = self.shape.num_heads // self.shape.num_kv_heads
        scale = d ** -0.5
        # K and V of one layer as [slots * kv_heads, head_dim]: one gather per bucket yields the
        # bucket's context in (row, KV head, position) order, ready for a batched GEMM.
        K, V = kv.rows(0, layer), kv.rows(1, layer)
        for t0, t1, idx, bias in batch.decode_groups:
            # One query per row: grouped GEMVs over the gathered context (query heads h*g..h*g+g-1
            # share KV head h), as a paged decode kernel does; no K/V expansion for GQA.
            bh = bias.shape[0]
            kk = _rows(K, idx, dt).view(bh, -1, d)
            vv = _rows(V, idx, dt).view(bh, -1, d)
            p = torch.baddbmm(bias, q[t0:t1].view(bh, g, d), kk.transpose(1, 2),
                              alpha=scale).softmax(-1)
            torch.bmm(p, vv, out=out[t0:t1].view(bh, g, d))
        if batch.prefill_rows:
            K, V = kv.flat(0, layer), kv.flat(1, layer)
        for t0, t1, ctx, mask in batch.prefill_rows:
            kk = _gather(K, ctx).to(dt).transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, d]
            vv = _gather(V, ctx).to(dt).transpose(0, 1).unsqueeze(0)
            qq = q[t0:t1].transpose(0, 1).unsqueeze(0)        # [1, H, n, d]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask,
                                               is_causal=mask is None, enable_gqa=True)
            out[t0:t1] = o[0].transpose(0, 1)
        return out


def _rows(cache: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache[idx] along dim 0 in `dtype` (fp8 through bytes: index_select lacks it on the CPU)."""
    if cache.dtype == torch.float8_e4m3fn:
        got = cache.view(torch.uint8).index_select(0, idx).view(cache.dtype)
    else:
        got = cache.index_select(0, idx)
    return got if got.dtype == dtype else got.to(dtype)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache[slots] for a `[slots, heads, dim]` cache and an index of any shape. index_select on a
    flat index is several times faster than advanced indexing on the CPU; fp8 goes through bytes."""
    flat = slots.reshape(-1)
    if cache.dtype == torch.float8_e4m3fn:
        got = cache.view(torch.uint8).index_select(0, flat).view(cache.dtype)
    else:
        got = cache.index_select(0, flat)
    return got.view(*slots.shape, *cache.shape[1:])
