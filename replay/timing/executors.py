"""Executors from a resolved engine: the cost model with catalog constants (optionally a
calibration profile). The torch stub lives in replay/stub/executor.py.
Must not import traces/, capacity/, polars, duckdb or torch.
"""
from __future__ import annotations

import json

from replay.timing import step_profile
from replay.timing.cost_model import CostConstants, CostModel, ModelShape


def model_shape(model) -> ModelShape:
    # Embedding and lm_head (untied, as in Llama-3.1 / Qwen2.5-7B+) are not layer GEMM work.
    embed = 2 * model.vocab_size * model.hidden_size
    layer_params = max(model.num_params - embed, model.num_params // 2)
    return ModelShape(num_layers=model.num_layers, hidden_size=model.hidden_size,
                      num_attention_heads=model.num_attention_heads, head_dim=model.head_dim,
                      vocab_size=model.vocab_size, num_layer_params=layer_params,
                      weight_bytes=model.num_params * model.weight_dtype_bytes)


def catalog_constants(gpu) -> CostConstants:
    return CostConstants(flops_per_s=gpu.dense_bf16_flops_per_s,
                         hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
                         host_link_bytes_per_s=gpu.host_link_bandwidth_bytes_per_s,
                         interconnect_bytes_per_s=gpu.tp_link_bandwidth_bytes_per_s)


def _calibration_data(calibration: str) -> object:
    try:
        return json.loads(open(calibration, encoding="utf-8").read())
    except (OSError, ValueError):
        return None                   # read_profile (below) says what is wrong


def shipped_profile(eng):
    """The shipped profile of this engine's GPU x model x KV dtype x TP (None: none ships)."""
    return step_profile.shipped(eng.gpu.name, eng.model.name,
                                step_profile.dtype_key(eng.model.weight_dtype_bytes,
                                                       eng.config.kv_cache_dtype),
                                eng.tensor_parallel_size)


def has_measured_timing(eng, calibration: str | None = None) -> bool:
    """Whether `measured_for` finds measured step-time tables (else the roofline prices steps):
    what-ifs across engines compare like with like only (capacity/analyses/plan.py)."""
    if calibration:
        return step_profile.is_measured(_calibration_data(calibration))
    return shipped_profile(eng) is not None


def measured_for(eng, calibration: str | None) -> step_profile.MeasuredTables | None:
    """The step-time tables: a measured `--calibration` profile, else the shipped profile of
    this GPU x model x dtype x TP, else None (the roofline, with a one-line warning)."""
    if calibration:
        data = _calibration_data(calibration)
        if step_profile.is_measured(data):
            return step_profile.parse_tables(data, f"calibration: {calibration}")
        return None
    path = shipped_profile(eng)
    if path is None:
        step_profile.warn_unmeasured(f"{eng.model.name} on {eng.gpu.name}, "
                                     f"tp={eng.tensor_parallel_size}, "
                                     f"kv_cache_dtype={eng.config.kv_cache_dtype}")
        return None
    return step_profile.load(path)


def cost_model_for(eng, *, calibration: str | None = None) -> CostModel:
    """The cost-model executor for a resolved engine (`replay.config.resolve`)."""
    consts = catalog_constants(eng.gpu)
    if calibration:
        consts = consts.with_profile(calibration)
    return CostModel(shape=model_shape(eng.model), constants=consts,
                     tp=eng.spec_tp if hasattr(eng, "spec_tp") else eng.tensor_parallel_size,
                     kv_bytes_per_token=eng.kv_bytes_per_token,
                     kv_bytes_per_block=eng.kv_bytes_per_block,
                     measured=measured_for(eng, calibration),
                     async_scheduling=bool(getattr(eng.spec, "async_scheduling", False)))
