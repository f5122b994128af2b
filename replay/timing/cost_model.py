"""The analytic cost model executor (`--executor model`, the default): a step plan -> seconds.

Per step (formulas and units in docs/cost-model.md):

    linear_flops = 2 * P_layers * T + 2 * h * V * S          (GEMMs; lm_head only for sampled rows)
    attn_flops   = 4 * L * H_q * d * A,  A = sum_i n_i * c_i + n_i * (n_i + 1) / 2
    bytes        = W + kv_token_bytes * (sum_i (c_i + n_i))  (weights once, then KV read + write)
    compute_s    = (linear_flops + attn_flops) / tp / (flops_per_s * compute_efficiency)
    memory_s     = bytes / (hbm_bytes_per_s * memory_efficiency)
    allreduce_s  = (tp > 1) * 2 * L * (allreduce_latency_s + 2 * (tp-1)/tp * T * h * act_bytes / interconnect_bytes_per_s)
    swap_s       = swap_blocks * kv_block_bytes / host_link_bytes_per_s
    step_s       = overhead_s + max(compute_s, memory_s) + allreduce_s + swap_s
    step_s       = max(overhead_s, max(compute_s, memory_s) + allreduce_s) + swap_s   (async)

with T = scheduled tokens, S = rows that sample, n_i / c_i = new / context tokens of row i, W = weight
bytes per GPU, kv_token_bytes = KV bytes per token per GPU. With V1 async scheduling
(`async_scheduling=True`, vLLM 0.33's default) the engine schedules step k+1 and prepares its
inputs while step k's forward runs, so the CPU-side overhead is hidden behind the forward pass and
a step costs the longer of the two; host-link copies (V0 swap) still add, as the
copy precedes the forward (docs/design.md "Async cost overlap"). This is the one Python copy of the
formula; the compiled cores' one copy is `cost_step_s` in replay/engine/kvcore.h, with the same
operation order, so both agree to the last bit (the differential tests rely on it).

Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING


from replay.timing.step_profile import MeasuredTables, is_measured, parse_tables, step_aggregates

if TYPE_CHECKING:     # the step contract: only annotated here (a compiled replay never builds one)
    from replay.engine.plan import StepPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The numbers of a model the cost model needs, per whole model (not per GPU)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    vocab_size: int
    # Parameters in the transformer layers (attention + MLP), without embeddings / lm_head.
    num_layer_params: int
    weight_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CostConstants:
    """Hardware constants; a calibration profile (JSON with these field names) overrides them."""
    flops_per_s: float
    hbm_bytes_per_s: float
    host_link_bytes_per_s: float
    interconnect_bytes_per_s: float
    # Achievable fraction of the datasheet peak for large GEMMs and for streaming reads.
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    # Scheduler + launch + sampling cost of one engine step (vLLM with CUDA graphs: a few ms).
    overhead_s: float = 0.003
    allreduce_latency_s: float = 8e-6
    activation_bytes: int = 2

    def __post_init__(self) -> None:
        # A zero rate divides by zero, NaN or infinity makes every step NaN/inf seconds (a replay
        # that never ends): every constant is finite and in its range, or the config is refused.
        for name, (low, high, low_open) in _RANGES.items():
            value = getattr(self, name)
            if name == "activation_bytes":
                ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
                what = f"a whole number of bytes from {low} to {high}"
            else:
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                      and math.isfinite(value) and (value > low if low_open else value >= low)
                      and value <= high)
                what = (f"a finite number {'>' if low_open else '>='} {low:g}"
                        + (f" and <= {high:g}" if math.isfinite(high) else ""))
            if not ok:
                raise ValueError(f"{name}: {value!r} is not {what}")

    def with_profile(self, path: str | Path) -> "CostConstants":
        """Constants overridden by a calibration profile (`kvcap calibrate` output)."""
        return replace(self, **read_profile(path))


# name -> (low, high, low bound exclusive)
_RANGES: dict[str, tuple[float, float, bool]] = {
    "flops_per_s": (0.0, math.inf, True), "hbm_bytes_per_s": (0.0, math.inf, True),
    "host_link_bytes_per_s": (0.0, math.inf, True), "interconnect_bytes_per_s": (0.0, math.inf, True),
    "compute_efficiency": (0.0, 1.0, True), "memory_efficiency": (0.0, 1.0, True),
    "overhead_s": (0.0, 60.0, False), "allreduce_latency_s": (0.0, 1.0, False),
    "activation_bytes": (1, 16, False),
}


def read_profile(path: str | Path) -> dict[str, float | int]:
    """The checked constants of a calibration profile: `{"constants": {...}}` (or the constants
    alone). Every problem is one line naming the file (and line, or constant) and the fix."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ValueError(f"calibration: {path} is a directory; pass the profile JSON that "
                         "`kvcap calibrate -o FILE` wrote") from None
    except FileNotFoundError:
        raise ValueError(f"calibration: {path}: no such file; run `kvcap calibrate` to make one") from None
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"calibration: cannot read {path} ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"calibration: {path}, line {exc.lineno}, column {exc.colno}: invalid "
                         f"JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"calibration: {path}: invalid JSON ({exc})") from None
    if is_measured(data):
        # A measured profile (replay/timing/step_profile.py): its tables replace the roofline; it
        # overrides no roofline constant. Checked here so a bad one is refused up front.
        parse_tables(data, f"calibration: {path}")
        return {}
    consts = data.get("constants", data) if isinstance(data, dict) else data
    if not isinstance(consts, dict):
        raise ValueError(f"calibration: {path}: expected a JSON object with a \"constants\" object "
                         f"(the output of `kvcap calibrate`), got {type(consts).__name__}")
    known = {f.name for f in fields(CostConstants)}
    unknown = sorted(set(consts) - known)
    if unknown:
        raise ValueError(f"{path}: unknown cost-model constants {unknown}; known: {sorted(known)}")
    out: dict[str, float | int] = {}
    for k, v in consts.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"calibration: {path}, constant {k!r}: expected a number, got {v!r}")
        if k == "activation_bytes" and float(v).is_integer():
            v = int(v)
        out[k] = v if k == "activation_bytes" else float(v)
    probe = dict(flops_per_s=1.0, hbm_bytes_per_s=1.0, host_link_bytes_per_s=1.0,
                 interconnect_bytes_per_s=1.0)
    try:
        CostConstants(**{**probe, **out})
    except ValueError as exc:
        raise ValueError(f"calibration: {path}, constant {exc}; fix the profile or run "
                         "`kvcap calibrate` again") from None
    return out


class CostModel:
    """Executor: turns a StepPlan into a duration in seconds: the measured profile's tables
    (replay/timing/step_profile.py) when `measured` is given, else the roofline above."""

    def __init__(self, *, shape: ModelShape, constants: CostConstants, tp: int,
                 kv_bytes_per_token: int, kv_bytes_per_block: int,
                 measured: MeasuredTables | None = None, async_scheduling: bool = False) -> None:
        self.shape, self.constants, self.tp = shape, constants, tp
        self.measured = measured
        # The engine loop this prices: async scheduling overlaps the CPU overhead with the forward.
        self.async_scheduling = async_scheduling
        self.kv_bytes_per_token = kv_bytes_per_token
        self.kv_bytes_per_block = kv_bytes_per_block
        c, s = constants, shape
        # Per-step constants folded once (each term is linear in the step aggregates).
        self._linear_per_token = 2.0 * s.num_layer_params
        self._lm_head_per_sample = 2.0 * s.hidden_size * s.vocab_size
        self._attn_per_unit = 4.0 * s.num_layers * s.num_attention_heads * s.head_dim
        self._flops_rate = tp * c.flops_per_s * c.compute_efficiency
        self._bytes_rate = c.hbm_bytes_per_s * c.memory_efficiency
        self._weight_bytes = s.weight_bytes / tp
        if tp > 1:
            self._ar_fixed = 2.0 * s.num_layers * c.allreduce_latency_s
            self._ar_per_token = (2.0 * s.num_layers * 2.0 * (tp - 1) / tp * s.hidden_size
                                  * c.activation_bytes / c.interconnect_bytes_per_s)
        else:
            self._ar_fixed = self._ar_per_token = 0.0
        self.swap_s_per_block = kv_bytes_per_block / c.host_link_bytes_per_s

    def c_args(self) -> tuple:
        """kvcore.h `cost_parse`: the folded constants, in its order (the compiled cores price
        steps with exactly these numbers, hence bit-identical step times)."""
        return (self._linear_per_token, self._lm_head_per_sample, self._attn_per_unit,
                self._flops_rate, self._bytes_rate, self._weight_bytes, self.constants.overhead_s,
                self._ar_fixed, self._ar_per_token, self.kv_bytes_per_token,
                self.kv_bytes_per_block, self.swap_s_per_block,
                None if self.measured is None else self.measured.c_args(),
                bool(self.async_scheduling))

    def _step_s(self, tokens, samples, attn_units, kv_tokens, swap_blocks):
        """The formula on Python numbers (one step); kvcore.h `cost_step_s` is the same expression,
        term for term in the same order, so both give bit-identical floats."""
        compute = (tokens * self._linear_per_token + samples * self._lm_head_per_sample
                   + attn_units * self._attn_per_unit) / self._flops_rate
        memory = (self._weight_bytes + kv_tokens * self.kv_bytes_per_token) / self._bytes_rate
        if self.async_scheduling:
            forward = max(compute, memory) + (self._ar_fixed + tokens * self._ar_per_token)
            return max(self.constants.overhead_s, forward) + swap_blocks * self.swap_s_per_block
        return (self.constants.overhead_s + max(compute, memory)
                + (self._ar_fixed + tokens * self._ar_per_token) + swap_blocks * self.swap_s_per_block)

    def step_s(self, plan: StepPlan, num_sampled: int) -> float:
        n = plan.num_new_tokens.tolist()
        c = plan.num_computed_tokens.tolist()
        tokens = sum(n)
        swaps = len(plan.swap_out) + len(plan.swap_in)
        if self.measured is not None:
            return self.measured.step_s(tokens, num_sampled, *step_aggregates(n, c), swaps,
                                        self.swap_s_per_block, self.async_scheduling)
        attn = sum(ni * ci + ni * (ni + 1) // 2 for ni, ci in zip(n, c))
        kv = sum(c) + tokens
        return self._step_s(tokens, num_sampled, attn, kv, swaps)
