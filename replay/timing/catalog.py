"""Model and GPU catalogs: the shapes and datasheet numbers every memory and cost formula reads.

Owns `ModelSpec`, `GpuSpec`, the built-in entries, loading a local Hugging Face `config.json`
(`model_from_hf_config`) and name lookup (`get_model`, `get_gpu`; case-insensitive, Hugging Face
ids and device names accepted as aliases). Plain Python only: must not import traces/, capacity/,
duckdb, polars or torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

GIB = 2**30

# vLLM's hardware tiers for the V1 batch defaults (reference B9; 0.33
# `EngineArgs.get_batch_defaults`).
HardwareTier = Literal["ge160gib", "ge70gib", "other"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape. Counts are for the whole model (before TP sharding)."""

    name: str
    hf_ids: tuple[str, ...] = ()
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    max_position_embeddings: int
    # bf16/fp16 = 2; the KV cache dtype "auto" follows it (reference C1).
    weight_dtype_bytes: int = 2
    # True when num_params was estimated from the shapes (a config.json without a count).
    num_params_estimated: bool = False

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.weight_dtype_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator. Rates are dense (no sparsity), bytes/s and FLOP/s."""

    name: str
    aliases: tuple[str, ...] = ()
    # What `torch.cuda.get_device_name()` prints; vLLM's tier rule looks for "A100" in it.
    device_name: str
    # Total memory as PyTorch reports it (`get_device_properties().total_memory`), which is what
    # vLLM multiplies by gpu_memory_utilization; a little under the marketing "80 GB".
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    dense_bf16_flops_per_s: float
    # Without FP8 tensor cores (A100) FP8 runs at the BF16 rate (weight-only FP8 via Marlin).
    dense_fp8_flops_per_s: float
    native_fp8: bool
    # Effective GPU<->host copy rate (pinned memory, one direction): what swap / offload traffic
    # really gets, not the link's theoretical peak.
    host_link_bandwidth_bytes_per_s: float
    # Datasheet NVLink figure: total over all links, both directions (one direction is half).
    # None = no NVLink; TP all-reduce then goes over PCIe (see tp_link_bandwidth_bytes_per_s).
    nvlink_bandwidth_bytes_per_s: float | None
    vllm_hardware_tier: HardwareTier

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def cuda_graph_bytes(self, model: ModelSpec, tp: int = 1) -> int:
        """GPU memory vLLM's captured CUDA graphs keep per GPU (0.34 sizes the KV cache after
        capture, so it comes off the KV cache): a measured entry of CUDA_GRAPH_BYTES, else
        DEFAULT_CUDA_GRAPH_BYTES."""
        return CUDA_GRAPH_BYTES.get((self.name, model.name, tp), DEFAULT_CUDA_GRAPH_BYTES)

    @property
    def tp_link_bandwidth_bytes_per_s(self) -> float:
        """One-direction bandwidth between two GPUs of a TP group."""
        if self.nvlink_bandwidth_bytes_per_s is None:
            return self.host_link_bandwidth_bytes_per_s
        return self.nvlink_bandwidth_bytes_per_s / 2


# CUDA-graph memory per GPU. vLLM logs it at startup ("Graph capturing finished in 14 secs, took
# 0.84 GiB": the shipped tests/data/logs/public/v1_19794_startup_tqdm_blocks.log, 67 capture
# sizes, the V1 default). It depends on the capture sizes far more than on the model, so one
# measured figure is the default; (gpu, model, tp) entries take a measured line of their own
# (`kvcap calibrate` from a startup log is the way to confirm it for a deployment).
DEFAULT_CUDA_GRAPH_BYTES = int(0.84 * GIB)
CUDA_GRAPH_BYTES: dict[tuple[str, str, int], int] = {}


def _printable(text: str) -> str:
    """`text` with control characters escaped (traces.schema.printable, without importing polars)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)

def vllm_hardware_tier(memory_bytes: int, device_name: str) -> HardwareTier:
    """vLLM 0.33's rule: >=160 GiB; >=70 GiB and not an A100; everything else (reference B9)."""
    if memory_bytes >= 160 * GIB:
        return "ge160gib"
    if memory_bytes >= 70 * GIB and "A100" not in device_name.upper():
        return "ge70gib"
    return "other"


# ---------------------------------------------------------------------------------------- models
# Shapes from each repository's config.json on the Hugging Face Hub; parameter counts are the
# safetensors totals on the model cards (and equal `estimate_num_params` of the shapes exactly).
# max_position_embeddings is the Instruct config's value (what `vllm serve` uses as max_model_len).
_MODELS = (
    ModelSpec(
        name="llama-3.1-8b",
        hf_ids=("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=128256, num_params=8_030_261_248,
        max_position_embeddings=131072),
    ModelSpec(
        name="llama-3.1-70b",
        hf_ids=("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
        num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8, head_dim=128,
        intermediate_size=28672, vocab_size=128256, num_params=70_553_706_496,
        max_position_embeddings=131072),
    # v0.3 (vocab 32768, no sliding window); v0.1's 4096-token sliding window is not modelled.
    ModelSpec(
        name="mistral-7b",
        hf_ids=("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3",
                "mistral-7b-v0.3"),
        num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=14336, vocab_size=32768, num_params=7_248_023_552,
        max_position_embeddings=32768),
    ModelSpec(
        name="qwen2.5-7b",
        hf_ids=("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
        num_layers=28, hidden_size=3584, num_attention_heads=28, num_kv_heads=4, head_dim=128,
        intermediate_size=18944, vocab_size=152064, num_params=7_615_616_512,
        max_position_embeddings=32768),
    ModelSpec(
        name="qwen2.5-32b",
        hf_ids=("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct"),
        num_layers=64, hidden_size=5120, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        intermediate_size=27648, vocab_size=152064, num_params=32_763_876_352,
        max_position_embeddings=32768),
    ModelSpec(
        name="qwen3-32b",
        hf_ids=("Qwen/Qwen3-32B",),
        num_layers=64, hidden_size=5120, num_attention_heads=64, num_kv_heads=8, head_dim=128,
        intermediate_size=25600, vocab_size=151936, num_params=32_762_123_264,
        max_position_embeddings=40960),
)

# ------------------------------------------------------------------------------------------ GPUs
_TB = 1e12
_GB = 1e9
# Effective pinned host<->device copy, one direction (bandwidthTest-style measurements): PCIe gen4
# x16 peaks at 32 GB/s and delivers about 25; gen5 x16 peaks at 64 and delivers about 50.
_PCIE4_EFFECTIVE = 25 * _GB
_PCIE5_EFFECTIVE = 50 * _GB

_GPUS = (
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
    # 40GB SXM 1,555 GB/s, 80GB SXM 2,039 GB/s; BF16 312 TFLOPS dense; NVLink 600 GB/s; PCIe gen4.
    # No FP8 tensor cores. PyTorch reports 39.39 GiB / 79.15 GiB total.
    GpuSpec(name="a100-40gb", aliases=("a100-sxm4-40gb", "a100-40g"),
            device_name="NVIDIA A100-SXM4-40GB", memory_bytes=int(39.39 * GIB),
            hbm_bandwidth_bytes_per_s=1.555 * _TB, dense_bf16_flops_per_s=312 * _TB,
            dense_fp8_flops_per_s=312 * _TB, native_fp8=False,
            host_link_bandwidth_bytes_per_s=_PCIE4_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=600 * _GB, vllm_hardware_tier="other"),
    GpuSpec(name="a100-80gb", aliases=("a100-sxm4-80gb", "a100-80g"),
            device_name="NVIDIA A100-SXM4-80GB", memory_bytes=int(79.15 * GIB),
            hbm_bandwidth_bytes_per_s=2.039 * _TB, dense_bf16_flops_per_s=312 * _TB,
            dense_fp8_flops_per_s=312 * _TB, native_fp8=False,
            host_link_bandwidth_bytes_per_s=_PCIE4_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=600 * _GB, vllm_hardware_tier="other"),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM / H100 PCIe columns; the sheet quotes
    # sparse TFLOPS, dense is half): SXM 3.35 TB/s, BF16 989.5 / FP8 1,979 dense, NVLink 900 GB/s;
    # PCIe 2.0 TB/s, BF16 756 / FP8 1,513 dense, NVLink bridge 600 GB/s (pairs). PCIe gen5.
    # PyTorch reports about 79.2 GiB (reference C4; vLLM logs show 79.1-79.3).
    GpuSpec(name="h100", aliases=("h100-sxm", "h100-80gb", "h100-sxm5-80gb"),
            device_name="NVIDIA H100 80GB HBM3", memory_bytes=int(79.2 * GIB),
            hbm_bandwidth_bytes_per_s=3.35 * _TB, dense_bf16_flops_per_s=989.5 * _TB,
            dense_fp8_flops_per_s=1979 * _TB, native_fp8=True,
            host_link_bandwidth_bytes_per_s=_PCIE5_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=900 * _GB, vllm_hardware_tier="ge70gib"),
    GpuSpec(name="h100-pcie", aliases=("h100-pcie-80gb",),
            device_name="NVIDIA H100 PCIe", memory_bytes=int(79.2 * GIB),
            hbm_bandwidth_bytes_per_s=2.0 * _TB, dense_bf16_flops_per_s=756 * _TB,
            dense_fp8_flops_per_s=1513 * _TB, native_fp8=True,
            host_link_bandwidth_bytes_per_s=_PCIE5_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=600 * _GB, vllm_hardware_tier="ge70gib"),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, BF16 989.5 /
    # FP8 1,979 dense, NVLink 900 GB/s, PCIe gen5. PyTorch reports about 139.8 GiB.
    GpuSpec(name="h200", aliases=("h200-sxm", "h200-141gb"),
            device_name="NVIDIA H200", memory_bytes=int(139.8 * GIB),
            hbm_bandwidth_bytes_per_s=4.8 * _TB, dense_bf16_flops_per_s=989.5 * _TB,
            dense_fp8_flops_per_s=1979 * _TB, native_fp8=True,
            host_link_bandwidth_bytes_per_s=_PCIE5_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=900 * _GB, vllm_hardware_tier="ge70gib"),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 362 / FP8 733 TFLOPS dense, PCIe gen4
    # x16, no NVLink. PyTorch reports about 44.5 GiB.
    GpuSpec(name="l40s", aliases=("l40s-48gb",),
            device_name="NVIDIA L40S", memory_bytes=int(44.5 * GIB),
            hbm_bandwidth_bytes_per_s=0.864 * _TB, dense_bf16_flops_per_s=362 * _TB,
            dense_fp8_flops_per_s=733 * _TB, native_fp8=True,
            host_link_bandwidth_bytes_per_s=_PCIE4_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=None, vllm_hardware_tier="other"),
    # NVIDIA HGX B200 datasheet, per GPU (8-GPU totals / 8): 180 GB HBM3e, 8 TB/s, BF16 2.25 /
    # FP8 4.5 PFLOPS dense, NVLink 5 1.8 TB/s, PCIe gen5 to the host. nvidia-smi shows 183,359 MiB;
    # PyTorch reports about 178.4 GiB.
    GpuSpec(name="b200", aliases=("b200-180gb",),
            device_name="NVIDIA B200", memory_bytes=int(178.4 * GIB),
            hbm_bandwidth_bytes_per_s=8.0 * _TB, dense_bf16_flops_per_s=2250 * _TB,
            dense_fp8_flops_per_s=4500 * _TB, native_fp8=True,
            host_link_bandwidth_bytes_per_s=_PCIE5_EFFECTIVE,
            nvlink_bandwidth_bytes_per_s=1800 * _GB, vllm_hardware_tier="ge160gib"),
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in _MODELS}
GPUS: dict[str, GpuSpec] = {g.name: g for g in _GPUS}

_MODEL_ALIASES = {a.lower(): m for m in _MODELS for a in (m.name, *m.hf_ids)}
_GPU_ALIASES = {a.lower(): g for g in _GPUS for a in (g.name, *g.aliases, g.device_name)}


# ------------------------------------------------------------------------ Hugging Face config.json
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 4, "float": 4,
                "float8_e4m3fn": 1, "float8_e5m2": 1}


def estimate_num_params(cfg: dict) -> int:
    """Parameter count of a Llama/Mistral/Qwen-style decoder from its config.json fields.

    Embedding (+ LM head unless tied), per layer q/k/v/o and a gated MLP (three matrices), the two
    RMSNorms, the final norm; q/k/v biases for Qwen2 (or `attention_bias`), q/k norms for Qwen3.
    Mixture-of-experts configs count every expert (`num_local_experts` / `num_experts`).
    """
    hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = cfg.get("num_key_value_heads")
    if kv_heads is not None and not (isinstance(kv_heads, int) and 1 <= kv_heads <= heads):
        # 0 is no KV head at all, not "as many as the attention heads" (MHA is the field left out)
        raise ValueError(f"model: {cfg_path} has num_key_value_heads {kv_heads!r}; expected a whole "
                         f"number from 1 to num_attention_heads ({heads}), or the field left out (MHA)")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg["vocab_size"])
    model_type = str(cfg.get("model_type", "")).lower()
    # Hugging Face's PretrainedConfig default is tied embeddings; Llama/Qwen configs say false.
    tied = bool(cfg.get("tie_word_embeddings", True))
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden
    if cfg.get("attention_bias") or model_type == "qwen2":
        attn += q + 2 * kv
    if model_type.startswith("qwen3"):
        attn += 2 * head_dim
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    if experts:
        inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        mlp = experts * 3 * hidden * inter + experts * hidden
    else:
        mlp = 3 * hidden * int(cfg["intermediate_size"])
    per_layer = attn + mlp + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a local Hugging Face `config.json` (the file or its directory).

    num_params comes from `model.safetensors.index.json` (metadata.total_size / dtype bytes) next
    to the config when present, otherwise it is estimated from the shapes and
    `num_params_estimated` is True.
    """
    p = Path(path)
    cfg_path = p / "config.json" if p.is_dir() else p
    if not cfg_path.is_file():
        raise ValueError(f"model: no Hugging Face config.json at {cfg_path}; pass a catalog name "
                         f"({', '.join(MODELS)}) or the path of a config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"model: cannot read {cfg_path} as JSON (line {e.lineno}, column "
                         f"{e.colno}: {e.msg})") from None
    except (OSError, UnicodeError, ValueError, RecursionError) as e:
        raise ValueError(f"model: cannot read {cfg_path} as JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"model: {cfg_path}: expected a JSON object (a Hugging Face config.json), "
                         f"got {type(cfg).__name__}")
    # Multimodal wrappers keep the language model's shape under text_config.
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        text = dict(cfg["text_config"])
        text.setdefault("torch_dtype", cfg.get("torch_dtype"))
        cfg = text
    missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                           "intermediate_size", "vocab_size") if k not in cfg]
    if missing:
        raise ValueError(f"model: {cfg_path} lacks {', '.join(missing)}; kvcap needs a decoder "
                         "config with these fields")
    cfg = _checked_shape(cfg, cfg_path)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"model: {cfg_path} has torch_dtype {dtype!r}; expected one of "
                         f"{', '.join(_DTYPE_BYTES)}")
    dtype_bytes = _DTYPE_BYTES[dtype]
    heads = int(cfg["num_attention_heads"])
    kv_heads = cfg.get("num_key_value_heads")
    if kv_heads is not None and not (isinstance(kv_heads, int) and 1 <= kv_heads <= heads):
        # 0 is no KV head at all, not "as many as the attention heads" (MHA is the field left out)
        raise ValueError(f"model: {cfg_path} has num_key_value_heads {kv_heads!r}; expected a whole "
                         f"number from 1 to num_attention_heads ({heads}), or the field left out (MHA)")
    num_params, estimated = _params_from_index(cfg_path.parent, dtype_bytes), False
    if num_params is None:
        num_params, estimated = estimate_num_params(cfg), True
    return ModelSpec(
        # escaped: the name is echoed in warnings and tables (an ESC in a config must not reach
        # the terminal)
        name=_printable(str(cfg.get("_name_or_path") or cfg_path.parent.name or cfg_path.stem)),
        hf_ids=(), num_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]),
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
        num_params=num_params,
        # vLLM's fallback when a config names no length (derived max_model_len default).
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
        weight_dtype_bytes=dtype_bytes, num_params_estimated=estimated)


# config.json fields kvcap reads as counts: whole numbers >= 1 (31.7 layers or 0 heads is a damaged
# file, not a model), bounded so that no product of them overflows or sizes a huge allocation.
_SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                 "vocab_size", "num_key_value_heads", "head_dim", "max_position_embeddings",
                 "num_local_experts", "num_experts", "moe_intermediate_size")
_SHAPE_MAX = 1 << 24
_CONTEXT_MAX = 1 << 31  # max_position_embeddings: up to 2^31 tokens


def _checked_shape(cfg: dict, path: Path) -> dict:
    """cfg with its shape fields as ints; a bad one is a one-line error naming file and field."""
    out = dict(cfg)
    for key in _SHAPE_FIELDS:
        value = cfg.get(key)
        if value is None or (value == 0 and key in ("num_local_experts", "num_experts",
                                                    "head_dim", "num_key_value_heads",
                                                    "max_position_embeddings",
                                                    "moe_intermediate_size")):
            continue  # absent (or 0, which these files use for "not set"): the usual default
        top = _CONTEXT_MAX if key == "max_position_embeddings" else _SHAPE_MAX
        whole = (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
        if not whole or not 1 <= value <= top:
            raise ValueError(f"model: {path}, field {key!r}: {value!r} is not a whole number from "
                             f"1 to {top}; fix the config.json")
        out[key] = int(value)
    heads = out["num_attention_heads"]
    if not out.get("head_dim") and out["hidden_size"] % heads:
        raise ValueError(f"model: {path}, field 'hidden_size': {out['hidden_size']} is not a "
                         f"multiple of num_attention_heads {heads} and no head_dim is given")
    kv = out.get("num_key_value_heads") or heads
    if heads % kv:
        raise ValueError(f"model: {path}, field 'num_key_value_heads': {kv} does not divide "
                         f"num_attention_heads {heads}")
    return out


def _params_from_index(directory: Path, dtype_bytes: int) -> int | None:
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        total = json.loads(index.read_text())["metadata"]["total_size"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return int(total) // dtype_bytes


# ------------------------------------------------------------------------------------- lookup
def get_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog model by name or Hugging Face id (case-insensitive), or a local config.json."""
    key = str(name_or_path).strip()
    if key.lower() in _MODEL_ALIASES:
        return _MODEL_ALIASES[key.lower()]
    p = Path(key).expanduser()
    if p.is_file() or (p.is_dir() and (p / "config.json").is_file()):
        return model_from_hf_config(p)
    raise ValueError(f"model: unknown model {key!r}; known: {', '.join(MODELS)} (or their "
                     "Hugging Face ids), or the path of a local config.json")


def get_gpu(name: str) -> GpuSpec:
    """A catalog GPU by name, alias or torch device name (case-insensitive)."""
    key = str(name).strip().lower()
    if key in _GPU_ALIASES:
        return _GPU_ALIASES[key]
    raise ValueError(f"gpu: unknown GPU {name!r}; known: {', '.join(GPUS)}")
