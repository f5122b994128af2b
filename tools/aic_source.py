"""NVIDIA AIConfigurator's measured vLLM kernel database, read for kvcap's step-time profiles.

A development tool only (tools/aic_profiles.py uses it; kvcap never imports it): it reads the
parquet tables of an `aiconfigurator-core` wheel (`pip download --no-deps aiconfigurator-core`)
with DuckDB and composes one model's per-step parts from the measured kernels, the way a vLLM step
runs them: per layer the QKV, output, gate/up and down GEMMs (bf16), context (prefill) and
generation (decode) FlashAttention, two all-reduces under tensor parallelism; once per step the
lm_head GEMM for the rows that sample. Times in the database are milliseconds per kernel call.

What the source does not measure is said where it is used: GEMM widths between measured n/k are
interpolated linearly in n and k (AIConfigurator does the same), the bandwidth-bound elementwise
kernels (RMSNorm, SiLU-and-mul, embedding) are AIConfigurator's analytic bytes / (HBM * 0.8).
"""
from __future__ import annotations

import bisect
import email.parser
import math
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import duckdb

# kvcap catalog GPU -> AIConfigurator system directory (only systems with vLLM tables).
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "l40s": "l40s",
           "a100-80gb": "a100_sxm", "a100-40gb": "a100_sxm"}
ELEMENTWISE_EFFICIENCY = 0.8       # AIConfigurator's ElementWise ops (norms, activation)
EMBEDDING_EFFICIENCY = 0.3         # AIConfigurator's Embedding op
BYTES = 2                          # bf16 activations


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """The unpacked wheel: its data directory, package version and licence."""
    data: Path
    package: str
    version: str
    licence: str


def open_wheel(wheel: Path, into: Path | None = None) -> Source:
    """Unpack the wheel's `systems/data` parquet tables and read its METADATA."""
    into = Path(into or tempfile.mkdtemp(prefix="aic-"))
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode("utf-8"))
        for n in z.namelist():
            if "/systems/data/" in n and "/vllm/" in n and n.endswith(".parquet"):
                z.extract(n, into)
    data = next(into.glob("*/systems/data"))
    return Source(data=data, package=meta["Name"], version=meta["Version"],
                  licence=meta.get("License-Expression") or meta.get("License") or "unknown")


def _latest(system_dir: Path, op: str, table: str) -> Path | None:
    """The newest vLLM version's parquet of `op/vllm/<version>/<table>.parquet`."""
    found = sorted(system_dir.glob(f"{op}/vllm/*/{table}.parquet"),
                   key=lambda p: tuple(int(x) if x.isdigit() else 0
                                       for x in p.parent.name.split(".")))
    return found[-1] if found else None


def _rows(path: Path, sql: str, params: list) -> list[tuple]:
    return duckdb.sql(sql.replace("TABLE", f"read_parquet('{path}')"),
                      params=params).fetchall()


class Kernels:
    """One system's measured kernels for one model shape at one tensor-parallel size."""

    def __init__(self, src: Source, gpu: str, model, tp: int, hbm_bytes_per_s: float,
                 kv_cache_dtype: str = "bfloat16") -> None:
        self.system, self.kv_cache_dtype = SYSTEMS[gpu], kv_cache_dtype
        sysdir = src.data / self.system
        self.model, self.tp, self.hbm = model, tp, hbm_bytes_per_s
        self.paths = {k: _latest(sysdir, op, t) for k, (op, t) in {
            "gemm": ("gemm", "gemm_perf"),
            "context_attention": ("attention", "context_attention_perf"),
            "generation_attention": ("attention", "generation_attention_perf"),
            "allreduce": ("comm", "custom_allreduce_perf")}.items()}
        missing = [k for k, p in self.paths.items() if p is None and (k != "allreduce" or tp > 1)]
        if missing:
            raise LookupError(f"{self.system}: no vLLM tables for {missing}")
        self.vllm_version = self.paths["gemm"].parent.name
        m = model
        if m.num_attention_heads % tp or m.num_kv_heads % tp:
            raise LookupError(f"tp={tp} does not divide the heads")
        self.heads, self.kv_heads = m.num_attention_heads // tp, m.num_kv_heads // tp
        self._gemm = {(a, b, c): t for a, b, c, t in _rows(
            self.paths["gemm"], "select m, n, k, avg(latency) from TABLE "
            "where gemm_dtype = 'bfloat16' group by m, n, k", [])}
        self.gemm_m = sorted({k[0] for k in self._gemm})
        self._gemm_n = sorted({k[1] for k in self._gemm})
        self._gemm_k = sorted({k[2] for k in self._gemm})
        self.attention_kernel = {}
        self.context, self.generation = (self._attention("context_attention", "isl"),
                                         self._attention("generation_attention", "step + 1"))
        if not self.context or not self.generation:
            raise LookupError(f"{self.system}: no attention measured for {self.heads} query / "
                              f"{self.kv_heads} KV heads of size {m.head_dim}, "
                              f"{kv_cache_dtype} KV cache")
        self._ar = {}
        if tp > 1:
            rows = _rows(self.paths["allreduce"], "select message_size, avg(latency) from TABLE "
                         "where num_gpus = ? and backend = 'vllm_graph' and allreduce_dtype = "
                         "'bfloat16' group by message_size order by message_size", [tp])
            if not rows:
                raise LookupError(f"{self.system}: no all-reduce measured on {tp} GPUs")
            self._ar_sizes = [r[0] for r in rows]
            self._ar_ms = [r[1] for r in rows]

    def _attention(self, table: str, x_expr: str) -> dict[tuple[int, int], float]:
        """(batch, tokens-per-row or context) -> ms, this KV cache dtype (bf16 or fp8) with bf16
        attention math, no sliding window, the kernel source with the most rows for this head
        shape and KV dtype (FA3 on Hopper)."""
        path = self.paths[table]
        cols = {r[0] for r in _rows(path, "describe select * from TABLE", [])}
        where = ("num_heads = ? and num_key_value_heads = ? and head_dim = ? "
                 "and kv_cache_dtype = ? and attn_dtype = 'bfloat16'"
                 + (" and window_size = 0" if "window_size" in cols else ""))
        p = [self.heads, self.kv_heads, self.model.head_dim, self.kv_cache_dtype]
        ks = _rows(path, f"select kernel_source, count(*) c from TABLE where {where} "
                   "group by 1 order by c desc, 1", p)
        if not ks:
            return {}
        self.attention_kernel[table] = ks[0][0]
        return {(b, x): t for b, x, t in _rows(
            path, f"select batch_size, {x_expr}, avg(latency) from TABLE where {where} and "
            "kernel_source = ? group by 1, 2", p + [ks[0][0]])}

    # ------------------------------------------------------------------ composed parts (s)
    def gemm_ms(self, m: int, n: int, k: int) -> float:
        """A measured m; n and k linear between measured widths, proportional beyond the widest."""
        def seg(xs, x):
            if x in xs:
                return [(x, 1.0)]
            if x > xs[-1]:                  # wider than measured: work is linear in n and k
                return [(xs[-1], x / xs[-1])]
            i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
            a, b = xs[i - 1], xs[i]
            w = (x - a) / (b - a)
            return [(a, 1.0 - w), (b, w)]
        return sum(wn * wk * self._gemm[(m, a, b)]
                   for a, wn in seg(self._gemm_n, n) for b, wk in seg(self._gemm_k, k))

    def elementwise_s(self, tokens: int) -> float:
        """Not measured: two add+RMSNorm (2h in, 2h out) and SiLU-and-mul (2i in, i out) per
        layer, the embedding lookup once; bytes over HBM at AIConfigurator's efficiencies."""
        m, tp = self.model, self.tp
        inter = m.intermediate_size // tp
        per_layer = (4 * m.hidden_size + 4 * m.hidden_size + 3 * inter) * BYTES
        return tokens * (m.num_layers * per_layer / (self.hbm * ELEMENTWISE_EFFICIENCY)
                         + 2 * m.hidden_size * BYTES / (self.hbm * EMBEDDING_EFFICIENCY))

    def linear_s(self, tokens: int) -> float:
        """The layers' GEMMs for `tokens` scheduled tokens (a measured m) + elementwise."""
        m, tp = self.model, self.tp
        h, d = m.hidden_size, m.head_dim
        qkv = (m.num_attention_heads + 2 * m.num_kv_heads) * d // tp
        per_layer = (self.gemm_ms(tokens, qkv, h) + self.gemm_ms(tokens, h, m.num_attention_heads * d // tp)
                     + self.gemm_ms(tokens, 2 * m.intermediate_size // tp, h)
                     + self.gemm_ms(tokens, h, m.intermediate_size // tp))
        return m.num_layers * per_layer / 1e3 + self.elementwise_s(tokens)

    def lm_head_s(self, rows: int) -> float:
        return self.gemm_ms(rows, self.model.vocab_size // self.tp, self.model.hidden_size) / 1e3

    def prefill_attention_s(self, batch: int, isl: int) -> float | None:
        t = self.context.get((batch, isl))
        return None if t is None else self.model.num_layers * t / 1e3

    def decode_attention_s(self, batch: int, context: int) -> float | None:
        t = self.generation.get((batch, context))
        return None if t is None else self.model.num_layers * t / 1e3

    def allreduce_knots(self) -> list[tuple[float, float]]:
        """(tokens, seconds) at every measured message size from the largest at or below one
        token up: the all-reduce's own knots (a message is tokens * hidden bf16 values)."""
        per_token = self.model.hidden_size * BYTES
        first = max([i for i, s in enumerate(self._ar_sizes) if s <= per_token], default=0)
        return [(s / per_token, 2 * self.model.num_layers * ms / 1e3)
                for s, ms in zip(self._ar_sizes[first:], self._ar_ms[first:])]

    def allreduce_s(self, tokens: int) -> float:
        """Two all-reduces of tokens * hidden bf16 values per layer (CUDA-graph custom
        all-reduce), linear between measured message sizes, linear beyond the largest."""
        if self.tp == 1:
            return 0.0
        size = tokens * self.model.hidden_size * BYTES
        xs, ys = self._ar_sizes, self._ar_ms
        if size <= xs[0]:
            ms = ys[0]
        else:
            i = min(bisect.bisect_left(xs, size), len(xs) - 1)
            w = (size - xs[i - 1]) / (xs[i] - xs[i - 1])
            ms = ys[i - 1] + w * (ys[i] - ys[i - 1])
        return 2 * self.model.num_layers * ms / 1e3


def fill_grid(cells: dict[tuple[int, int], float], rows: list[int], cols: list[int]
              ) -> tuple[list[list[float]], int]:
    """A full rows x cols grid from measured cells: a cell the source lacks (it ran out of
    memory at large batch x length) extends its column's last measured segment in batch
    (attention time is close to affine in batch once the batch fills the GPU: a fixed cost plus
    the KV read), never steeper than in proportion to the batch (the fixed cost is not negative;
    a steeper segment is noise); a column with one smaller measured batch scales it in
    proportion, one with none takes the nearest shorter measured column of its row, linearly in
    length. Scaling in proportion alone scaled the fixed cost too: H100 TP8 Qwen3-32B (fp8 KV)
    measures 44.3 and 68.2 us at batch 32 and 64 x 8k context, 112.7 at 128, and a batch-256 cell
    made 4 x 68.2 put batch 128 at 136 us when interpolated, where the segment extended gives 116.
    Returns (grid, cells filled)."""
    grid, filled = [], 0
    for b in rows:
        line = []
        for x in cols:
            t = cells.get((b, x))
            if t is None or not math.isfinite(t):
                filled += 1
                lower = [bb for bb in rows if bb < b and (bb, x) in cells]
                if lower:
                    b1 = lower[-1]
                    t1 = cells[(b1, x)]
                    t = t1 * b / b1                             # in proportion: the cap
                    if len(lower) >= 2:                         # the last segment, extended
                        b0 = lower[-2]
                        t = min(t1 + max(t1 - cells[(b0, x)], 0.0) * (b - b1) / (b1 - b0), t)
                else:
                    shorter = [xx for xx in cols if xx < x and (b, xx) in cells]
                    if not shorter:
                        raise LookupError(f"no measured cell to fill ({b}, {x}) from")
                    t = cells[(b, shorter[-1])] * x / shorter[-1]
            line.append(t)
        grid.append(line)
    return grid, filled
