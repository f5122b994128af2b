"""Measured step-time profiles: per (GPU, model, dtype, TP) tables of a vLLM step's parts.

A profile (JSON, `replay/timing/profiles/<gpu>--<model>--<dtype>--tp<N>.json`, made by
tools/aic_profiles.py from NVIDIA AIConfigurator's kernel database, or by `kvcap calibrate
--from-bench`) holds, in seconds for the whole model on one GPU of the TP group:

    linear_s            tokens            -> the layers' GEMMs (+ elementwise) for T scheduled tokens
    lm_head_s           rows              -> the lm_head GEMM for S sampling rows
    prefill_attention_s rows x tokens/row -> prefill (context) attention
    decode_attention_s  rows x context    -> decode (generation) attention
    allreduce_s         tokens            -> the TP all-reduces (tp > 1 only)

and constants `overhead_s` (per step), `overhead_per_row_s` (per scheduled row) and
`kernel_scale` (a calibrated efficiency: every kernel part is multiplied by it). The step (docs/
timing.md):

    step_s = overhead_s + rows * overhead_per_row_s
             + kernel_scale * (linear(T) + lm_head(S) + prefill(Bp, L_eq) + decode(Bd, Kd / Bd)
                               + allreduce(T))
             + swap_blocks * block_bytes / host_link_bytes_per_s

Rows with one new token are decodes (Bd of them, Kd = sum of their KV lengths c + 1); the others
prefill (Bp of them with causal work A = sum n(c + (n + 1) / 2)), priced at the equal-work
tokens per row L_eq = (sqrt(1 + 8 A / Bp) - 1) / 2 (a prefill of L_eq tokens has that work).

Interpolation is piecewise linear in the value (no logs, so C and Python round identically):
below the first knot the first value, above the last the last segment extended (work grows
linearly past the measured range); 2-D tables bilinearly, the same rule on each axis. The one
Python copy of the step is `MeasuredTables.step_s`; kvcore.h `cost_measured_s` is the same
expression in the same order.

Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

import bisect
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

PROFILE_DIR = Path(__file__).parent / "profiles"
FORMAT = "kvcap-step-profile/1"
# kvcore.h's fixed table capacities (the compiled core keeps tables inline, no allocation).
MAX_KNOTS_1D, MAX_ROWS_2D, MAX_COLS_2D = 96, 16, 24
CONSTANTS = {"overhead_s": (0.0, 60.0), "overhead_per_row_s": (0.0, 1.0),
             "kernel_scale": (1e-3, 1e3)}
_1D = ("linear_s", "lm_head_s", "allreduce_s")
_2D = ("prefill_attention_s", "decode_attention_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class Table1:
    x: tuple[float, ...]
    y: tuple[float, ...]

    def at(self, v: float) -> float:
        i, w = _segment(self.x, v)
        return self.y[i] + w * (self.y[i + 1] - self.y[i])


@dataclass(frozen=True, slots=True, kw_only=True)
class Table2:
    rows: tuple[float, ...]
    cols: tuple[float, ...]
    z: tuple[float, ...]          # row-major, len(rows) * len(cols)

    def at(self, r: float, c: float) -> float:
        i, wr = _segment(self.rows, r)
        j, wc = _segment(self.cols, c)
        n = len(self.cols)
        z00, z01 = self.z[i * n + j], self.z[i * n + j + 1]
        z10, z11 = self.z[(i + 1) * n + j], self.z[(i + 1) * n + j + 1]
        a = z00 + wc * (z01 - z00)
        b = z10 + wc * (z11 - z10)
        return a + wr * (b - a)


def _segment(xs: tuple[float, ...], v: float) -> tuple[int, float]:
    """(i, w): v = xs[i] + w * (xs[i+1] - xs[i]), w clamped at 0 below, not above (kvcore.h
    `tab_segment`)."""
    if v <= xs[0]:
        return 0, 0.0
    i = bisect.bisect_right(xs, v, 0, len(xs) - 1) - 1     # the last segment at most
    return i, (v - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredTables:
    """A profile's tables and constants, checked; `step_s` is the measured step formula."""
    name: str
    overhead_s: float
    overhead_per_row_s: float
    kernel_scale: float
    linear: Table1
    lm_head: Table1
    prefill_attention: Table2
    decode_attention: Table2
    allreduce: Table1 | None

    def step_s(self, tokens: int, samples: int, rows: int, decode_rows: int, decode_kv: int,
               prefill_rows: int, prefill_work: int, swaps: int, swap_per_block: float,
               async_scheduling: bool = False) -> float:
        """kvcore.h `cost_measured_s`: the same terms in the same order (bit-identical). Async
        scheduling hides the CPU-side overhead (fixed + per row) behind the forward pass."""
        kern = 0.0
        if tokens > 0:
            kern += self.linear.at(float(tokens))
            if self.allreduce is not None:
                kern += self.allreduce.at(float(tokens))
        if samples > 0:
            kern += self.lm_head.at(float(samples))
        if prefill_rows > 0:
            eq = (math.sqrt(1.0 + 8.0 * float(prefill_work) / float(prefill_rows)) - 1.0) * 0.5
            kern += self.prefill_attention.at(float(prefill_rows), eq)
        if decode_rows > 0:
            kern += self.decode_attention.at(float(decode_rows),
                                             float(decode_kv) / float(decode_rows))
        if async_scheduling:
            cpu = self.overhead_s + float(rows) * self.overhead_per_row_s
            return max(cpu, self.kernel_scale * kern) + float(swaps) * swap_per_block
        return (self.overhead_s + float(rows) * self.overhead_per_row_s + self.kernel_scale * kern
                + float(swaps) * swap_per_block)

    def c_args(self) -> tuple:
        """kvcore.h `measured_parse`."""
        ar = self.allreduce
        return (self.overhead_s, self.overhead_per_row_s, self.kernel_scale,
                self.linear.x, self.linear.y, self.lm_head.x, self.lm_head.y,
                self.prefill_attention.rows, self.prefill_attention.cols, self.prefill_attention.z,
                self.decode_attention.rows, self.decode_attention.cols, self.decode_attention.z,
                () if ar is None else ar.x, () if ar is None else ar.y)


def step_aggregates(new: list[int], computed: list[int]) -> tuple[int, int, int, int, int]:
    """(rows, decode_rows, decode_kv, prefill_rows, prefill_work) of one step's rows (kvcore.h
    `loop_sums`)."""
    dr = dk = pr = pw = 0
    for n, c in zip(new, computed):
        if n == 1:
            dr += 1
            dk += c + 1
        else:
            pr += 1
            pw += n * c + n * (n + 1) // 2
    return len(new), dr, dk, pr, pw


# ------------------------------------------------------------------ reading and selecting
def profile_name(gpu: str, model: str, dtype: str, tp: int) -> str:
    return f"{gpu}--{model}--{dtype}--tp{tp}"


# kv_cache_dtype -> the profiles' dtype key (bf16 weights). vLLM's "fp8" is e4m3 on CUDA, the
# format the source measured; fp8_e5m2 has no measured profile (the roofline prices it).
_DTYPE_KEYS = {"auto": "bf16", "fp8": "bf16-fp8kv", "fp8_e4m3": "bf16-fp8kv"}


def dtype_key(weight_dtype_bytes: int, kv_cache_dtype: str) -> str | None:
    """The profiles' dtype key: bf16 weights with a bf16 KV cache ("auto") or an fp8 (e4m3)
    one; None for anything else."""
    return _DTYPE_KEYS.get(kv_cache_dtype) if weight_dtype_bytes == 2 else None


def shipped(gpu: str, model: str, dtype: str | None, tp: int) -> Path | None:
    if dtype is None:
        return None
    p = PROFILE_DIR / f"{profile_name(gpu, model, dtype, tp)}.json"
    return p if p.is_file() else None


_WARNED: set[str] = set()


def warn_unmeasured(what: str) -> None:
    """One line on stderr, once per combination per process."""
    if what not in _WARNED:
        _WARNED.add(what)
        print(f"kvcap: no measured step-time profile for {what}; step times use the analytic "
              "roofline (docs/cost-model.md), less accurate (docs/timing.md)", file=sys.stderr)


def is_measured(data: object) -> bool:
    return isinstance(data, dict) and "tables" in data


def parse_tables(data: dict, where: str) -> MeasuredTables:
    """A profile's JSON object -> MeasuredTables; any problem is one ValueError naming `where`
    and the field."""
    def fail(field: str, msg: str):
        raise ValueError(f"{where}, {field}: {msg}")

    consts = data.get("constants", {})
    if not isinstance(consts, dict):
        fail("constants", "expected an object")
    vals = {}
    for k, (lo, hi) in CONSTANTS.items():
        v = consts.get(k, 1.0 if k == "kernel_scale" else 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not lo <= v <= hi:
            fail(f"constants.{k}", f"{v!r} is not a number from {lo:g} to {hi:g}")
        vals[k] = float(v)
    tabs = data.get("tables")
    if not isinstance(tabs, dict):
        fail("tables", "expected an object")

    def axis(field, v, cap):
        if not isinstance(v, list) or not 2 <= len(v) <= cap or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in v):
            fail(field, f"expected 2 to {cap} finite numbers")
        if any(b <= a for a, b in zip(v, v[1:])):
            fail(field, "must increase strictly")
        return tuple(float(x) for x in v)

    def values(field, v, n):
        if not isinstance(v, list) or len(v) != n or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                and x >= 0 for x in v):
            fail(field, f"expected {n} finite numbers >= 0")
        return tuple(float(x) for x in v)

    one = {}
    for k in _1D:
        t = tabs.get(k)
        if t is None and k == "allreduce_s":
            one[k] = None
            continue
        if not isinstance(t, dict):
            fail(f"tables.{k}", "expected an object with x and s")
        x = axis(f"tables.{k}.x", t.get("x"), MAX_KNOTS_1D)
        one[k] = Table1(x=x, y=values(f"tables.{k}.s", t.get("s"), len(x)))
    two = {}
    for k in _2D:
        t = tabs.get(k)
        if not isinstance(t, dict):
            fail(f"tables.{k}", "expected an object with rows, cols and s")
        r = axis(f"tables.{k}.rows", t.get("rows"), MAX_ROWS_2D)
        c = axis(f"tables.{k}.cols", t.get("cols"), MAX_COLS_2D)
        s = t.get("s")
        if not isinstance(s, list) or len(s) != len(r):
            fail(f"tables.{k}.s", f"expected {len(r)} rows of {len(c)} numbers")
        z = sum((values(f"tables.{k}.s[{i}]", line, len(c)) for i, line in enumerate(s)), ())
        two[k] = Table2(rows=r, cols=c, z=z)
    return MeasuredTables(name=str(data.get("name", where)), **vals, linear=one["linear_s"],
                          lm_head=one["lm_head_s"], allreduce=one["allreduce_s"],
                          prefill_attention=two["prefill_attention_s"],
                          decode_attention=two["decode_attention_s"])


def load(path: str | Path) -> MeasuredTables:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"step profile {path}: {exc}") from None
    if not is_measured(data):
        raise ValueError(f"step profile {path}: no \"tables\" object (not a measured profile)")
    return parse_tables(data, str(path))
