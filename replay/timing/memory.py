"""KV memory formulas (reference C1-C4, A6): bytes per token and block, GPU and CPU block counts.

Pure functions of a `ModelSpec`, a `GpuSpec` and numbers; all sizes are per GPU worker unless the
name says otherwise. Owns nothing else. Must not import traces/, capacity/, duckdb, polars or torch.
"""
from __future__ import annotations

import math
from typing import Literal

from replay.timing.catalog import GIB, GpuSpec, ModelSpec

KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")

# Non-KV memory beyond the weights (activation peak of the profile run + non-torch memory, and
# in V1 >= 0.21 the CUDA-graph estimate): the C4 assumptions. Real logs show 1.3-2 GiB; calibrate
# against the `Available KV cache memory` / `# GPU blocks` line of a real run.
NON_KV_OVERHEAD_TP1_BYTES = int(1.5 * GIB)
NON_KV_OVERHEAD_TP_BYTES = int(2.0 * GIB)  # NCCL buffers and custom all-reduce at TP > 1

# vLLM `CacheConfig.verify_with_parallel_config`: swap_space * TP above 70% of host RAM raises
# "Too large swap space", above 40% warns (reference A6).
SWAP_RAM_WARN_FRACTION = 0.4
SWAP_RAM_ERROR_FRACTION = 0.7


def kv_dtype_bytes(model: ModelSpec, kv_cache_dtype: str = "auto") -> int:
    """"auto" stores KV in the model dtype; every fp8 variant is one byte (reference C1)."""
    if kv_cache_dtype == "auto":
        return model.weight_dtype_bytes
    if kv_cache_dtype in KV_CACHE_DTYPES:
        return 1
    raise ValueError(f"kv_cache_dtype: {kv_cache_dtype!r} is not one of "
                     f"{', '.join(KV_CACHE_DTYPES)}")


def kv_heads_per_gpu(model: ModelSpec, tp: int = 1) -> int:
    # When TP exceeds the KV head count, vLLM replicates heads: every rank keeps at least one.
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token(model: ModelSpec, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
    """K and V for one token position, all layers, on one GPU (reference C1)."""
    return (2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim
            * kv_dtype_bytes(model, kv_cache_dtype))


def kv_bytes_per_block(model: ModelSpec, tp: int = 1, kv_cache_dtype: str = "auto",
                       block_size: int = 16) -> int:
    """vLLM's `cache_block_size` (V0) / page size x layers (V1) on one GPU."""
    return block_size * kv_bytes_per_token(model, tp, kv_cache_dtype)


def weight_bytes_per_gpu(model: ModelSpec, tp: int = 1) -> int:
    # Every weight matrix and the vocab embedding are sharded; norms (negligible) are replicated.
    return model.weight_bytes // tp


def default_non_kv_overhead_bytes(tp: int = 1) -> int:
    return NON_KV_OVERHEAD_TP1_BYTES if tp == 1 else NON_KV_OVERHEAD_TP_BYTES


def available_kv_bytes(model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                       gpu_memory_utilization: float = 0.9,
                       non_kv_overhead_bytes: int | None = None) -> int:
    """total x utilization - weights - non-KV overhead, per GPU (reference C2). May be negative:
    the model does not fit at this TP / utilization."""
    overhead = default_non_kv_overhead_bytes(tp) if non_kv_overhead_bytes is None \
        else non_kv_overhead_bytes
    requested = int(gpu.memory_bytes * gpu_memory_utilization)
    return requested - weight_bytes_per_gpu(model, tp) - overhead


# ------------------------------------------------------------------ vLLM 0.34: extensible KV cache
# 0.34 sizes the KV cache after warmup and CUDA-graph capture from the memory then measured
# (`measure_kv_cache_blocks`, v1/worker/gpu: docs/memory.md): non-KV memory is what is resident
# besides the committed KV prefix, the headroom is free memory plus that prefix, and the cache gets
# min(gpu_memory_utilization x total - non-KV, headroom - margin), margin = max(256 MiB, 2% of
# the headroom). Left unset, gpu_memory_utilization is 1.0 there, so the headroom binds.
V034_MARGIN_FLOOR_BYTES = 256 * 2**20
V034_MARGIN_FRACTION = 0.02
# What the CUDA context and the runtime pin on a GPU before vLLM measures its "initial free
# memory" (torch's context, cuBLAS/cuDNN handles): resident, but never part of non-KV memory.
CUDA_CONTEXT_BYTES = int(0.5 * GIB)
# Non-torch memory resident after warmup besides the weights and the CUDA graphs (cuBLAS
# workspaces, the sampler's buffers; NCCL buffers and custom all-reduce at TP > 1).
NON_TORCH_TP1_BYTES = int(0.25 * GIB)
NON_TORCH_TP_BYTES = int(0.75 * GIB)


def v034_available_kv_bytes(model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                            gpu_memory_utilization: float | None = None,
                            cuda_graph_bytes: int | None = None) -> int:
    """KV bytes per GPU under vLLM 0.34's extensible KV cache (see above). May be negative: the
    model does not fit. `gpu_memory_utilization` None = 0.34's default (the headroom binds)."""
    graphs = gpu.cuda_graph_bytes(model, tp) if cuda_graph_bytes is None else cuda_graph_bytes
    non_kv = (weight_bytes_per_gpu(model, tp) + graphs
              + (NON_TORCH_TP1_BYTES if tp == 1 else NON_TORCH_TP_BYTES))
    headroom = gpu.memory_bytes - CUDA_CONTEXT_BYTES - non_kv
    margin = max(V034_MARGIN_FLOOR_BYTES, int(max(headroom, 0) * V034_MARGIN_FRACTION))
    available = headroom - margin
    if gpu_memory_utilization is not None:
        available = min(available, math.ceil(gpu.memory_bytes * gpu_memory_utilization) - non_kv)
    return available


def num_gpu_blocks(model: ModelSpec, gpu: GpuSpec, tp: int = 1,
                   gpu_memory_utilization: float = 0.9, kv_cache_dtype: str = "auto",
                   block_size: int = 16, non_kv_overhead_bytes: int | None = None) -> int:
    """vLLM's `# GPU blocks` (V1: including the null block), 0 when nothing is left for KV."""
    available = available_kv_bytes(model, gpu, tp, gpu_memory_utilization, non_kv_overhead_bytes)
    return max(0, available // kv_bytes_per_block(model, tp, kv_cache_dtype, block_size))


def num_cpu_blocks(swap_space_gib: float, model: ModelSpec, tp: int = 1,
                   kv_cache_dtype: str = "auto", block_size: int = 16) -> int:
    """Blocks of one GPU worker's swap buffer: floor(swap_space x 2^30 / cache_block_size) (C3)."""
    return int(swap_space_gib * GIB) // kv_bytes_per_block(model, tp, kv_cache_dtype, block_size)


def kv_tokens(num_blocks: int, block_size: int) -> int:
    """Token positions a pool holds. Every TP rank stores its heads for the same positions, so
    this is the whole TP group's capacity, not multiplied by TP (reference C4)."""
    return num_blocks * block_size


def max_concurrency(num_gpu_blocks: int, block_size: int, max_model_len: int) -> float:
    """vLLM's `Maximum concurrency for L tokens per request: C x` (num_blocks x block_size / L)."""
    return num_gpu_blocks * block_size / max_model_len


def estimated_max_model_len(num_gpu_blocks: int, block_size: int) -> int:
    """Longest single request the pool holds (vLLM's estimate in `check_enough_kv_cache_memory`)."""
    return num_gpu_blocks * block_size


def swap_host_ram_bytes(swap_space_gib: float, tp: int = 1) -> int:
    """Pinned host RAM the swap buffers take: each TP rank pins its own (reference A6)."""
    return int(swap_space_gib * GIB) * tp


def swap_host_ram_verdict(swap_space_gib: float, tp: int,
                          host_ram_bytes: int) -> Literal["ok", "warn", "error"]:
    """What vLLM does at startup for this swap space on a host with `host_ram_bytes` of RAM."""
    used = swap_host_ram_bytes(swap_space_gib, tp)
    if used > SWAP_RAM_ERROR_FRACTION * host_ram_bytes:
        return "error"
    if used > SWAP_RAM_WARN_FRACTION * host_ram_bytes:
        return "warn"
    return "ok"
