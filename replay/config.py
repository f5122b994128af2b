"""The engine configuration users set (vLLM's knob names and units) and its resolution.

Owns `EngineConfig` (frozen; `None` = the vLLM version default), its validation, its stable hash
and JSON for the run table, and `resolve(config) -> ResolvedEngine`: the `SchedulerSpec` the
schedulers read plus the derived memory numbers. Defaults follow reference A9 (V0, vLLM 0.10.1.1)
and B9 (V1, vLLM 0.33, the `vllm serve` API-server usage context). Sweeps use
`dataclasses.replace`. Must not import traces/, capacity/, duckdb, polars or torch.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Literal

from replay.engine.spec import OnSwapFull, Policy, PreemptionModeName, SchedulerSpec, cdiv
from replay.timing import memory
from replay.timing.catalog import GIB, GpuSpec, HardwareTier, ModelSpec, get_gpu, get_model

SchedulerVersion = Literal["v0", "v1"]
# The V1 releases kvcap models (`--vllm-version`); V0 is always 0.10.1.1.
VllmVersion = Literal["0.33", "0.34"]
VLLM_VERSIONS: tuple[str, ...] = ("0.33", "0.34")
DEFAULT_VLLM_VERSION = "0.34"   # the latest release (2026-11-16)
V0_VLLM_VERSION = "0.10.1.1"
# Default KV block size in tokens: 16 up to 0.33, 64 from 0.34 (`config/cache.py`, oracle §8).
DEFAULT_BLOCK_SIZE = {"0.10.1.1": 16, "0.33": 16, "0.34": 64}

# Reference A9 (V0, 0.10.1.1).
V0_GPU_MEMORY_UTILIZATION = 0.90
V0_MAX_NUM_SEQS = 256
V0_MIN_BATCHED_TOKENS = 2048        # chunked off: max(max_model_len, 2048)
V0_CHUNKED_BATCHED_TOKENS = 2048    # chunked on
V0_AUTO_CHUNKED_ABOVE_LEN = 32768   # chunked prefill turns itself on above this max_model_len
# Reference B9 (V1, 0.33): utilization, and (max_num_batched_tokens, max_num_seqs) for the API
# server by hardware tier.
V1_GPU_MEMORY_UTILIZATION = 0.92
V1_API_SERVER_BATCH_DEFAULTS: dict[HardwareTier, tuple[int, int]] = {
    "ge160gib": (16384, 1024),
    "ge70gib": (8192, 1024),
    "other": (2048, 256),
}

_FLOAT_FIELDS = ("gpu_memory_utilization", "swap_space", "watermark", "kv_offloading_size",
                 "cache_aware_admission_threshold")
# Fields added with the offloading connector (#16): in the config JSON (and so in the run id)
# only when set, so runs stored before them keep their ids.
_LATER_FIELDS = {"kv_offloading_size": None, "kv_offloading_backend": "native",
                 "kv_offloading_eviction_policy": "lru", "offload_prompt_only": True,
                 "kv_offloading_store_threshold": 0, "vllm_version": None,
                 "cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5,
                 "max_num_inflight_kv_loads": None, "preemption_victim": "fcfs"}
# vLLM 0.33 `v1/kv_offload/cpu/spec.py`: every offload chunk is rounded up to the page size.
OFFLOAD_PAGE_BYTES = 4096
# kv_connector_extra_config "block_size" defaults to the GPU block size: one block per chunk.
OFFLOAD_BLOCKS_PER_CHUNK = 1

# vLLM 0.33 turns async scheduling on when unset (VllmConfig; off under pipeline parallelism,
# which kvcap does not model), so kvcap's V1 replays the async loop unless told otherwise.
V1_ASYNC_SCHEDULING = True

@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """What a user sets, with vLLM's names. `None` means "what this vLLM version would pick"."""

    scheduler: SchedulerVersion = "v1"
    # V1 only: which release's defaults and behaviours (None = DEFAULT_VLLM_VERSION, 0.34).
    vllm_version: VllmVersion | None = None
    # Catalog name, Hugging Face id, or the path of a local config.json.
    model: str = "llama-3.1-8b"
    gpu: str = "h100"
    tensor_parallel_size: int = 1
    block_size: int | None = None                 # 16 (V0, 0.33) / 64 (0.34)
    # 0.90 (V0) / 0.92 (0.33) / 0.34: the memory left after warmup (memory.v034_available_kv_bytes)
    gpu_memory_utilization: float | None = None
    # GiB per GPU (vLLM's unit): V0's swap pool. V1 has no swap (its host tier is
    # kv_offloading_size) and ignores it.
    swap_space: float = 4.0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None              # the model's max_position_embeddings
    preemption_mode: PreemptionModeName = "recompute"
    on_swap_full: OnSwapFull = "abort"
    scheduling_policy: Policy = "fcfs"
    enable_prefix_caching: bool | None = None     # V0 off, V1 on
    enable_chunked_prefill: bool | None = None    # V0 on iff max_model_len > 32768, V1 on
    kv_cache_dtype: memory.KvCacheDtype = "auto"
    num_gpu_blocks_override: int | None = None
    num_cpu_blocks_override: int | None = None
    # V1 (0.33) knobs, reference B3/B7; refused for V0, which has no such knobs.
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    max_num_active_seqs: int | None = None
    # V1: vLLM 0.33's `--async-scheduling/--no-async-scheduling` (AsyncScheduler: step k is
    # scheduled before step k-1's output is applied). None = the version default.
    async_scheduling: bool | None = None
    # V1: vLLM 0.33's CPU KV offloading (`--kv-offloading-size GiB`, for all TP ranks together;
    # None or 0 = no connector) through the native OffloadingConnector
    # (`--kv-offloading-backend native`), evicting LRU or ARC (kv_connector_extra_config
    # "eviction_policy") and storing prompt blocks only by default (oracle README §7).
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    kv_offloading_eviction_policy: Literal["lru", "arc"] = "lru"
    offload_prompt_only: bool = True
    # kv_connector_extra_config "store_threshold": a chunk is stored in the tier only from its
    # N-th offer on (0.33 counts every offer, a preempted request's re-offer too); 0 or 1 store
    # at once (vLLM's default 0).
    kv_offloading_store_threshold: int = 0
    # vLLM 0.34's cache-aware admission (refused on 0.33): once KV usage reaches the threshold,
    # the first `window` waiting requests are admitted deepest GPU prefix-cache hit first
    # (0 = off, vLLM's default).
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # vLLM 0.34's cap on concurrent KV connector loads (None = no cap; refused on 0.33).
    max_num_inflight_kv_loads: int | None = None
    # A what-if, in no vLLM release: "lcf" preempts the running request with the fewest computed
    # tokens (vLLM PR #53723, open) instead of the last one admitted ("fcfs", vLLM's rule).
    preemption_victim: Literal["fcfs", "lcf"] = "fcfs"
    # Path of a cost-model profile (`kvcap calibrate`); carried for the executor, not read here.
    calibration: str | None = None

    def __post_init__(self) -> None:
        _check_fields(self)
        # Cross-field rules depend on the defaults (model length, hardware tier) and on the
        # memory maths, so validating means resolving; the result is thrown away.
        resolve(self)

    def to_dict(self) -> dict:
        d = asdict(self)
        # 4 and 4.0 are the same knob: keep the JSON (and the hash) independent of int vs float.
        for name in _FLOAT_FIELDS:
            if d[name] is not None:
                d[name] = float(d[name])
        for name, default in _LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d

    def config_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces) for the run table's `config_json` column."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def stable_hash(self) -> str:
        """A key that is equal across processes for equal configs (16 hex digits of SHA-256)."""
        return hashlib.sha256(self.config_json().encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedEngine:
    """A config with every default applied and every derived number computed."""

    config: EngineConfig
    spec: SchedulerSpec
    # The vLLM release replayed: "0.10.1.1" (V0), "0.33" or "0.34" (V1).
    vllm_version: str
    model: ModelSpec
    gpu: GpuSpec
    gpu_memory_utilization: float
    kv_bytes_per_token: int
    kv_bytes_per_block: int
    # From the memory formula (C2) even when an override sets num_gpu_blocks; may be negative.
    available_kv_bytes: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    # Pinned host RAM V0's swap pool takes over the whole TP group (0 on V1).
    swap_host_ram_bytes: int
    # Pinned host RAM the OffloadingConnector's tier takes (all TP ranks; 0 without it):
    # num_cpu_blocks chunks of kv_offloading_chunk_bytes.
    kv_offloading_host_ram_bytes: int
    # Names of the EngineConfig fields left at None and filled with a version default.
    defaulted: frozenset[str]
    # Human-readable remarks (estimates, clamps, skipped checks) for logs and reports.
    notes: tuple[str, ...] = ()

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def tensor_parallel_size(self) -> int:
        return self.config.tensor_parallel_size

    @property
    def kv_tokens(self) -> int:
        return memory.kv_tokens(self.num_gpu_blocks, self.spec.block_size)

    @property
    def max_concurrency(self) -> float:
        return memory.max_concurrency(self.num_gpu_blocks, self.spec.block_size,
                                      self.spec.max_model_len)

    def log_lines(self) -> tuple[str, ...]:
        """The startup lines vLLM prints for these numbers, to compare with a production log."""
        mml, c = self.spec.max_model_len, self.max_concurrency
        if self.config.scheduler == "v0":
            return (f"# cuda blocks: {self.num_gpu_blocks}, # CPU blocks: {self.num_cpu_blocks}",
                    f"Maximum concurrency for {mml} tokens per request: {c:.2f}x")
        return (f"Available KV cache memory: {self.available_kv_bytes / GIB:.2f} GiB",
                f"GPU KV cache size: {self.kv_tokens:,} tokens",
                f"Maximum concurrency for {mml:,} tokens per request: {c:.2f}x")


# ------------------------------------------------------------------------------------ resolve
def resolve(config: EngineConfig) -> ResolvedEngine:
    """Apply the version/hardware defaults, compute the block counts, check that it can start."""
    c = config
    v1 = c.scheduler == "v1"
    model, gpu = get_model(c.model), get_gpu(c.gpu)
    tp = c.tensor_parallel_size
    defaulted = {name for name in ("gpu_memory_utilization", "max_num_seqs",
                                   "max_num_batched_tokens", "max_model_len",
                                   "enable_prefix_caching", "enable_chunked_prefill",
                                   *(("async_scheduling",) if v1 else ()))
                 if getattr(c, name) is None}
    notes: list[str] = []
    if model.num_params_estimated:
        notes.append(f"num_params of {model.name} estimated from its config shapes "
                     f"({model.num_params / 1e9:.2f}B)")

    version = vllm_version_of(c)
    block_size = DEFAULT_BLOCK_SIZE[version] if c.block_size is None else c.block_size
    if c.block_size is None:
        defaulted.add("block_size")
    util = c.gpu_memory_utilization
    if util is None:
        # 0.34 has no fixed fraction: it takes what warmup left (reported as 1.0, vLLM's value).
        util = (1.0 if version == "0.34" else V1_GPU_MEMORY_UTILIZATION) if v1 \
            else V0_GPU_MEMORY_UTILIZATION
    max_model_len = model.max_position_embeddings if c.max_model_len is None else c.max_model_len
    chunked = c.enable_chunked_prefill
    if chunked is None:
        chunked = True if v1 else max_model_len > V0_AUTO_CHUNKED_ABOVE_LEN
    prefix = v1 if c.enable_prefix_caching is None else c.enable_prefix_caching
    asynchronous = v1 and (V1_ASYNC_SCHEDULING if c.async_scheduling is None
                           else c.async_scheduling)
    max_num_seqs, max_num_batched_tokens = _batch_limits(c, gpu, max_model_len, chunked, notes)
    _check_batch_limits(c, max_num_seqs, max_num_batched_tokens, max_model_len, chunked)

    per_token = memory.kv_bytes_per_token(model, tp, c.kv_cache_dtype)
    per_block = memory.kv_bytes_per_block(model, tp, c.kv_cache_dtype, block_size)
    available = _available_kv_bytes(version, model, gpu, tp, c.gpu_memory_utilization)
    _check_pool_sizes(c, gpu, per_block, available, block_size)
    if c.num_gpu_blocks_override is None:
        gpu_blocks = max(0, available // per_block)
        _check_kv_memory(c, model, gpu, util, available, gpu_blocks, max_model_len,
                         version, block_size)
    else:
        gpu_blocks = c.num_gpu_blocks_override
        notes.append("num_gpu_blocks_override set: the memory formula and the startup "
                     "max_model_len check are skipped")
    offloading = v1 and bool(c.kv_offloading_size)
    chunk_bytes = offload_chunk_bytes(per_block, tp)
    if offloading:
        # The connector's tier in chunks (F12): size * 2^30 // page-rounded chunk bytes, or the
        # override (tests, oracle comparisons).
        cpu_blocks = (c.num_cpu_blocks_override if c.num_cpu_blocks_override is not None
                      else int(c.kv_offloading_size * GIB) // chunk_bytes)
        if cpu_blocks == 0:
            raise ValueError(f"kv_offloading_size: {c.kv_offloading_size:g} GiB holds no offload "
                             f"chunk of {chunk_bytes:,} bytes; raise it")
    elif v1:
        # V1 without the connector has no host tier at all.
        cpu_blocks = 0
        if c.num_cpu_blocks_override is not None:
            notes.append("num_cpu_blocks_override ignored: V1 has a host tier only with "
                         "kv_offloading_size (CPU KV offloading)")
    elif c.num_cpu_blocks_override is not None:
        cpu_blocks = c.num_cpu_blocks_override
    else:
        cpu_blocks = memory.num_cpu_blocks(c.swap_space, model, tp, c.kv_cache_dtype,
                                           block_size)
    if c.preemption_mode == "swap" and cpu_blocks == 0:
        notes.append("preemption_mode='swap' with an empty host pool: every swap-out is "
                     f"swap-full (on_swap_full={c.on_swap_full!r})")
    if not v1 and c.scheduling_policy == "priority" and chunked:
        notes.append("v0 honours priority only with chunked prefill off (reference A7)")

    spec = SchedulerSpec(
        block_size=block_size, num_gpu_blocks=gpu_blocks, num_cpu_blocks=cpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix, policy=c.scheduling_policy,
        preemption_mode=c.preemption_mode, on_swap_full=c.on_swap_full,
        long_prefill_token_threshold=c.long_prefill_token_threshold,
        scheduler_reserve_full_isl=c.scheduler_reserve_full_isl, watermark=c.watermark,
        max_num_active_seqs=c.max_num_active_seqs, async_scheduling=asynchronous,
        kv_bytes_per_block=per_block, kv_offloading=offloading,
        offload_prompt_only=c.offload_prompt_only,
        offload_eviction_policy=c.kv_offloading_eviction_policy,
        offload_blocks_per_chunk=OFFLOAD_BLOCKS_PER_CHUNK,
        offload_store_threshold=c.kv_offloading_store_threshold,
        offload_host_link_bytes_per_s=gpu.host_link_bandwidth_bytes_per_s,
        # V0 reads none of the V1 release's rules; its spec keeps the spec default.
        **(dict(vllm_version=version,
                cache_aware_admission_window=c.cache_aware_admission_window,
                cache_aware_admission_threshold=c.cache_aware_admission_threshold,
                max_num_inflight_kv_loads=c.max_num_inflight_kv_loads,
                preemption_victim=c.preemption_victim) if v1 else {}))
    return ResolvedEngine(
        config=c, spec=spec, vllm_version=version, model=model, gpu=gpu, gpu_memory_utilization=util,
        kv_bytes_per_token=per_token, kv_bytes_per_block=per_block, available_kv_bytes=available,
        num_gpu_blocks=gpu_blocks, num_cpu_blocks=cpu_blocks,
        swap_host_ram_bytes=0 if v1 else memory.swap_host_ram_bytes(c.swap_space, tp),
        kv_offloading_host_ram_bytes=cpu_blocks * chunk_bytes if offloading else 0,
        defaulted=frozenset(defaulted), notes=tuple(notes))


def vllm_version_of(c: EngineConfig) -> str:
    """The release a config replays: V0 is 0.10.1.1; V1 its `vllm_version` or the latest."""
    if c.scheduler == "v0":
        return V0_VLLM_VERSION
    return DEFAULT_VLLM_VERSION if c.vllm_version is None else c.vllm_version


def _available_kv_bytes(version: str, model: ModelSpec, gpu: GpuSpec, tp: int,
                        util: float | None) -> int:
    """KV bytes per GPU by the version's rule: 0.34 sizes after warmup, earlier releases take
    gpu_memory_utilization of the total (reference C2)."""
    if version == "0.34":
        return memory.v034_available_kv_bytes(model, gpu, tp, util)
    if util is None:
        util = V1_GPU_MEMORY_UTILIZATION if version == "0.33" else V0_GPU_MEMORY_UTILIZATION
    return memory.available_kv_bytes(model, gpu, tp, util)


def offload_chunk_bytes(kv_bytes_per_block: int, tp: int,
                       blocks_per_chunk: int = OFFLOAD_BLOCKS_PER_CHUNK) -> int:
    """One offload chunk in host memory: every rank's bytes of its blocks, rounded up to the
    4096-byte page (vLLM 0.33 `v1/kv_offload/cpu/spec.py`, oracle README F12)."""
    raw = kv_bytes_per_block * tp * blocks_per_chunk
    return cdiv(raw, OFFLOAD_PAGE_BYTES) * OFFLOAD_PAGE_BYTES


def _batch_limits(c: EngineConfig, gpu: GpuSpec, max_model_len: int, chunked: bool,
                  notes: list[str]) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) after the version defaults (A9, B9)."""
    seqs, tokens = c.max_num_seqs, c.max_num_batched_tokens
    if c.scheduler == "v0":
        if seqs is None:
            seqs = V0_MAX_NUM_SEQS
        if tokens is None:
            tokens = V0_CHUNKED_BATCHED_TOKENS if chunked \
                else max(max_model_len, V0_MIN_BATCHED_TOKENS)
        return seqs, tokens
    default_tokens, default_seqs = V1_API_SERVER_BATCH_DEFAULTS[gpu.vllm_hardware_tier]
    seqs_for_clamp = default_seqs if seqs is None else seqs
    if tokens is None:
        # 0.33: chunked off needs a whole prompt per step; defaulted values never exceed what
        # max_num_seqs full-length requests could use.
        tokens = default_tokens if chunked else max(max_model_len, default_tokens)
        tokens = min(tokens, seqs_for_clamp * max_model_len)
    if seqs is None:
        seqs = default_seqs
    if (c.max_num_seqs is None or c.max_num_batched_tokens is None) and seqs > tokens:
        notes.append(f"max_num_seqs clamped from {seqs} to max_num_batched_tokens={tokens} "
                     "(vLLM post-processing, reference B9)")
        seqs = tokens
    return seqs, tokens


# ---------------------------------------------------------------------------------- validation
def _check_fields(c: EngineConfig) -> None:
    """One field at a time: types, ranges, spellings; then the version-specific refusals."""
    _choice("scheduler", c.scheduler, ("v0", "v1"))
    for name in ("model", "gpu"):
        if not isinstance(getattr(c, name), str):
            raise ValueError(f"{name}: expected a string name, got {getattr(c, name)!r}")
    model = get_model(c.model)  # its ValueError names the field and lists the known models
    get_gpu(c.gpu)
    _int("tensor_parallel_size", c.tensor_parallel_size, 1)
    _check_tp(c.tensor_parallel_size, model)
    if c.vllm_version is not None:
        _choice("vllm_version", c.vllm_version, VLLM_VERSIONS)
        if c.scheduler == "v0":
            raise ValueError(f"vllm_version: V0 is vLLM {V0_VLLM_VERSION}; --vllm-version "
                             f"selects a V1 release ({', '.join(VLLM_VERSIONS)}); drop it or set "
                             "scheduler='v1'")
    if c.block_size is not None:
        _int("block_size", c.block_size, 1)
        if c.block_size & (c.block_size - 1):
            raise ValueError(f"block_size: {c.block_size} is not a power of two; use 16 or 64 "
                             "(vLLM's defaults up to 0.33 / from 0.34) or another power of two")
    if c.gpu_memory_utilization is not None:
        _number("gpu_memory_utilization", c.gpu_memory_utilization)
        if not 0 < c.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: {c.gpu_memory_utilization} is outside "
                             "(0, 1]; it is a fraction of the GPU's memory, e.g. 0.9")
    _number("swap_space", c.swap_space)
    if c.swap_space < 0:
        raise ValueError(f"swap_space: {c.swap_space} GiB is negative; use 0 for no swap pool")
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                 "max_num_active_seqs"):
        if getattr(c, name) is not None:
            _int(name, getattr(c, name), 1)
    if c.max_model_len is not None and c.max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len: {c.max_model_len} exceeds {model.name}'s "
                         f"max_position_embeddings {model.max_position_embeddings} (vLLM refuses "
                         "it); lower max_model_len")
    _choice("preemption_mode", c.preemption_mode, ("recompute", "swap", "none"))
    _choice("on_swap_full", c.on_swap_full, ("abort", "recompute"))
    _choice("scheduling_policy", c.scheduling_policy, ("fcfs", "priority"))
    _choice("kv_cache_dtype", c.kv_cache_dtype, memory.KV_CACHE_DTYPES)
    if c.kv_cache_dtype == "fp8_e5m2" and c.scheduler == "v1":
        # V1's FlashAttention backend (vLLM's default on CUDA) maps fp8 to e4m3 only
        # (`get_fp8_dtype_for_flashattn`); V0's paged attention and FlashInfer do have e5m2.
        raise ValueError("kv_cache_dtype: 'fp8_e5m2' on V1: vLLM V1's default FlashAttention "
                         "backend stores an fp8 KV cache as e4m3 only (it fails with "
                         "'Unrecognized FP8 dtype: fp8_e5m2'); use 'fp8' (e4m3, the same bytes "
                         "per token) or scheduler='v0'")
    for name in ("enable_prefix_caching", "enable_chunked_prefill", "async_scheduling"):
        if getattr(c, name) is not None and not isinstance(getattr(c, name), bool):
            raise ValueError(f"{name}: expected True, False or None (version default), "
                             f"got {getattr(c, name)!r}")
    if not isinstance(c.scheduler_reserve_full_isl, bool):
        raise ValueError("scheduler_reserve_full_isl: expected True or False, "
                         f"got {c.scheduler_reserve_full_isl!r}")
    # V1 reserves block 0 as the null block (reference B3): one block holds nothing.
    min_gpu_blocks = 2 if c.scheduler == "v1" else 1
    if c.num_gpu_blocks_override is not None:
        _int("num_gpu_blocks_override", c.num_gpu_blocks_override, min_gpu_blocks)
    if c.num_cpu_blocks_override is not None:
        _int("num_cpu_blocks_override", c.num_cpu_blocks_override, 0)
    _int("long_prefill_token_threshold", c.long_prefill_token_threshold, 0)
    _number("watermark", c.watermark)
    if not 0 <= c.watermark < 1:
        raise ValueError(f"watermark: {c.watermark} is outside [0, 1); it is the fraction of "
                         "GPU blocks kept free when admitting, e.g. 0.01")
    if c.scheduler == "v1" and c.preemption_mode == "swap":
        raise ValueError("preemption_mode: V1 (vLLM 0.33) has no swap preemption; its host tier is "
                         "CPU KV offloading: use --kv-offloading-size GIB (kv_offloading_size) with "
                         "preemption_mode='recompute', or scheduler='v0' for --swap-space")
    _check_offloading(c)
    _check_version_knobs(c)
    if c.calibration is not None and not isinstance(c.calibration, str):
        raise ValueError(f"calibration: expected a path string or None, got {c.calibration!r}")
    if c.scheduler == "v0":
        _check_v0_only(c)


def _check_offloading(c: EngineConfig) -> None:
    if c.kv_offloading_backend == "lmcache":
        raise ValueError("kv_offloading_backend: 'lmcache' is not modelled; kvcap models vLLM's "
                         "native OffloadingConnector only (--kv-offloading-backend native)")
    _choice("kv_offloading_backend", c.kv_offloading_backend, ("native",))
    _choice("kv_offloading_eviction_policy", c.kv_offloading_eviction_policy, ("lru", "arc"))
    if not isinstance(c.offload_prompt_only, bool):
        raise ValueError(f"offload_prompt_only: expected True or False, got {c.offload_prompt_only!r}")
    _int("kv_offloading_store_threshold", c.kv_offloading_store_threshold, 0)
    if c.scheduler == "v0":
        for name, flag, changed in (
                ("kv_offloading_eviction_policy", "--kv-offloading-eviction-policy",
                 c.kv_offloading_eviction_policy != "lru"),
                ("offload_prompt_only", "--no-offload-prompt-only", not c.offload_prompt_only),
                ("kv_offloading_store_threshold", "--kv-offloading-store-threshold",
                 c.kv_offloading_store_threshold != 0)):
            if changed:
                raise ValueError(f"{name}: {flag} sets V1's CPU KV offloading connector; V0 has "
                                 "none (it swaps: --swap-space with preemption_mode='swap'); "
                                 "drop it or set scheduler='v1'")
    if c.kv_offloading_size is None:
        return
    _number("kv_offloading_size", c.kv_offloading_size)
    if c.kv_offloading_size < 0:
        raise ValueError(f"kv_offloading_size: {c.kv_offloading_size} GiB is negative; use 0 (or "
                         "leave it unset) for no CPU offloading")
    if not c.kv_offloading_size:
        return
    if c.scheduler == "v0":
        raise ValueError("kv_offloading_size: CPU KV offloading is a V1 connector; V0 swaps "
                         "instead: use swap_space (--swap-space) with "
                         "preemption_mode='swap', or set scheduler='v1'")
    if c.preemption_mode != "recompute":
        raise ValueError(f"preemption_mode: {c.preemption_mode!r} with kv_offloading_size: the "
                         "OffloadingConnector runs with V1's recompute preemption; use "
                         "preemption_mode='recompute'")


def _check_version_knobs(c: EngineConfig) -> None:
    """0.34's new scheduler knobs, and the least-computed-first what-if."""
    _int("cache_aware_admission_window", c.cache_aware_admission_window, 0)
    _number("cache_aware_admission_threshold", c.cache_aware_admission_threshold)
    if not 0 <= c.cache_aware_admission_threshold <= 1:
        raise ValueError(f"cache_aware_admission_threshold: {c.cache_aware_admission_threshold} "
                         "is outside [0, 1]; it is a KV usage fraction, e.g. 0.5 (vLLM's default)")
    if c.max_num_inflight_kv_loads is not None:
        _int("max_num_inflight_kv_loads", c.max_num_inflight_kv_loads, 1)
    _choice("preemption_victim", c.preemption_victim, ("fcfs", "lcf"))
    version = vllm_version_of(c)
    for name, flag, on in (
            ("cache_aware_admission_window", "--cache-aware-admission-window",
             c.cache_aware_admission_window > 0),
            ("cache_aware_admission_threshold", "--cache-aware-admission-threshold",
             c.cache_aware_admission_threshold != 0.5),
            ("max_num_inflight_kv_loads", "--max-num-inflight-kv-loads",
             c.max_num_inflight_kv_loads is not None)):
        if on and version != "0.34":
            raise ValueError(f"{name}: {flag} is new in vLLM 0.34 and this config replays "
                             f"{version}; use --vllm-version 0.34 (scheduler='v1') or drop it")
    if c.cache_aware_admission_window > 0 and c.enable_prefix_caching is False:
        raise ValueError("cache_aware_admission_window: vLLM reorders by GPU prefix-cache hit, so "
                         "it does nothing with prefix caching off; enable prefix caching or drop it")
    if c.preemption_victim == "lcf":
        if c.scheduler == "v0":
            raise ValueError("preemption_victim: the least-computed-first what-if is a V1 "
                             "scheduler change (vLLM PR #53723); set scheduler='v1'")
        if c.scheduling_policy == "priority":
            raise ValueError("preemption_victim: 'lcf' replaces the FCFS victim rule; with "
                             "scheduling_policy='priority' vLLM picks by priority; use 'fcfs'")


def _check_v0_only(c: EngineConfig) -> None:
    v1_knobs = {"long_prefill_token_threshold": c.long_prefill_token_threshold != 0,
                "scheduler_reserve_full_isl": c.scheduler_reserve_full_isl is not True,
                "watermark": c.watermark != 0.0,
                "max_num_active_seqs": c.max_num_active_seqs is not None,
                "async_scheduling": bool(c.async_scheduling)}
    for name, changed in v1_knobs.items():
        if changed:
            raise ValueError(f"{name}: a V1 scheduler knob; V0 has none (its block watermark is "
                             "hard-coded at 0.01); set scheduler='v1' or leave it at its default")
    if c.scheduling_policy == "priority" and c.preemption_mode == "swap":
        raise ValueError("preemption_mode: V0 with scheduling_policy='priority' and "
                         "preemption_mode='swap' crashes real vLLM (the priority victim is "
                         "swapped out but re-queued as waiting; reference G/D4); use "
                         "preemption_mode='recompute', scheduling_policy='fcfs', or scheduler='v1'")


# No host pins more than this for one GPU's swap pool: a bound on what a flag may make kvcap allocate.
MAX_HOST_POOL_BYTES = 4 * 2**40


def _check_pool_sizes(c: EngineConfig, gpu: GpuSpec, per_block: int, available: int,
                      block_size: int) -> None:
    """Block pools are arrays sized by their block counts, so a count no GPU or host could hold is
    refused here (1e12 blocks asked numpy for 7 TiB) instead of failing inside the engine."""
    if available > 0 and per_block > available:
        raise ValueError(f"block_size: one block of {block_size} tokens needs "
                         f"{per_block / GIB:.2f} GiB of KV cache, more than the available "
                         f"{available / GIB:.2f} GiB on {gpu.name}; use a smaller block_size "
                         "such as 16")
    if c.num_gpu_blocks_override is not None:
        most = gpu.memory_bytes // per_block
        if c.num_gpu_blocks_override > most:
            raise ValueError(f"num_gpu_blocks_override: {c.num_gpu_blocks_override} blocks of "
                             f"{per_block / 2**20:.2f} MiB exceed the whole {gpu.memory_gib:.0f} GiB "
                             f"of {gpu.name} (at most {most}); lower it")
    host = (c.num_cpu_blocks_override * per_block if c.num_cpu_blocks_override is not None
            else c.swap_space * GIB)
    if c.kv_offloading_size and c.num_cpu_blocks_override is None:
        host = c.kv_offloading_size * GIB / c.tensor_parallel_size
    if host > MAX_HOST_POOL_BYTES:
        flag = ("num_cpu_blocks_override" if c.num_cpu_blocks_override is not None else
                "kv_offloading_size" if c.kv_offloading_size else "swap_space")
        raise ValueError(f"{flag}: a host pool of {host / GIB:,.0f} GiB per GPU is more than "
                         f"{MAX_HOST_POOL_BYTES // GIB:,} GiB; lower it")


def _check_batch_limits(c: EngineConfig, seqs: int, tokens: int, max_model_len: int,
                        chunked: bool) -> None:
    if tokens < seqs:
        raise ValueError(f"max_num_batched_tokens: {tokens} is smaller than max_num_seqs {seqs} "
                         "(vLLM requires max_num_batched_tokens >= max_num_seqs); raise "
                         "max_num_batched_tokens or lower max_num_seqs")
    if not chunked and tokens < max_model_len:
        raise ValueError(f"max_num_batched_tokens: {tokens} is smaller than max_model_len "
                         f"{max_model_len} with chunked prefill off, so long prompts could never "
                         "be scheduled; raise max_num_batched_tokens, lower max_model_len, or set "
                         "enable_chunked_prefill=True")
    if c.max_num_active_seqs is not None and c.max_num_active_seqs > seqs:
        raise ValueError(f"max_num_active_seqs: {c.max_num_active_seqs} exceeds max_num_seqs "
                         f"{seqs}; lower it or raise max_num_seqs")


def _check_kv_memory(c: EngineConfig, model: ModelSpec, gpu: GpuSpec, util: float,
                     available: int, gpu_blocks: int, max_model_len: int, version: str,
                     block_size: int) -> None:
    """vLLM refuses to start without KV memory, or when one max_model_len request cannot fit
    (V1 `check_enough_kv_cache_memory`, V0 `raise_if_cache_size_invalid`; reference C2)."""
    tp = c.tensor_parallel_size
    need_blocks = cdiv(max_model_len, block_size)
    if gpu_blocks == 0:
        weights_gib = memory.weight_bytes_per_gpu(model, tp) / GIB
        # Suggest the smallest TP at which one max_model_len request fits as well.
        better = [t for t in (2, 4, 8, 16) if t > tp and _tp_error(t, model) is None
                  and _available_kv_bytes(version, model, gpu, t, c.gpu_memory_utilization)
                  // memory.kv_bytes_per_block(model, t, c.kv_cache_dtype, block_size)
                  >= need_blocks]
        hint = f"raise tensor_parallel_size (e.g. {better[0]})" if better \
            else "use a GPU with more memory"
        if util < 1 and _available_kv_bytes(version, model, gpu, tp, 1.0) > 0:
            hint += ", or raise gpu_memory_utilization"
        raise ValueError(
            f"tensor_parallel_size: {model.name} needs {weights_gib:.1f} GiB of weights per GPU "
            f"at tensor_parallel_size={tp}, leaving no KV cache memory within "
            f"gpu_memory_utilization={util} x {gpu.memory_gib:.1f} GiB on {gpu.name} "
            f"(available {available / GIB:.2f} GiB); {hint}")
    if need_blocks > gpu_blocks:
        estimate = memory.estimated_max_model_len(gpu_blocks, block_size)
        need_gib = need_blocks * memory.kv_bytes_per_block(model, tp, c.kv_cache_dtype,
                                                           block_size) / GIB
        raise ValueError(
            f"max_model_len: one request of the model's max seq len ({max_model_len}) needs "
            f"{need_gib:.2f} GiB of KV cache, more than the available {available / GIB:.2f} GiB "
            f"({gpu_blocks} blocks); the estimated maximum model length is {estimate}. Set "
            f"max_model_len <= {estimate}, raise gpu_memory_utilization or tensor_parallel_size, "
            "or use kv_cache_dtype='fp8'")


def _tp_error(tp: int, model: ModelSpec) -> str | None:
    if model.num_attention_heads % tp:
        return f"does not divide num_attention_heads={model.num_attention_heads}"
    kv = model.num_kv_heads
    # vLLM shards KV heads when there are at least TP of them, else replicates them evenly.
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return f"is incompatible with num_key_value_heads={kv}"
    return None


def _check_tp(tp: int, model: ModelSpec) -> None:
    problem = _tp_error(tp, model)
    if problem is not None:
        ok = [t for t in range(1, min(model.num_attention_heads, 64) + 1)
              if _tp_error(t, model) is None]
        raise ValueError(f"tensor_parallel_size: {tp} {problem} of {model.name}; use one of "
                         f"{', '.join(map(str, ok))}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(map(repr, allowed))}")


# Counts are stored in 32-bit INTEGER columns of the run table (and int32 arrays in the cores).
INT32_MAX = 2**31 - 1


def _int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: {value} is below the minimum {minimum}; set it to at least "
                         f"{minimum}")
    if value > INT32_MAX:
        raise ValueError(f"{name}: {value} is above the maximum {INT32_MAX}; lower it")


def _number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
