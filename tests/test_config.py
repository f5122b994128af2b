"""EngineConfig: version and hardware defaults (A9, B9), B9 post-processing, validation that names
the field, the startup KV check (C2), resolution into a SchedulerSpec, and the stable run key."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from replay.config import EngineConfig, ResolvedEngine, resolve
from replay.engine.spec import SchedulerSpec
from replay.timing.catalog import GIB

ROOT = Path(__file__).resolve().parents[1]


def spec_of(**kw) -> SchedulerSpec:
    return resolve(EngineConfig(**kw)).spec


# ------------------------------------------------------------------------------------ defaults
def test_default_is_v1_034_llama_8b_on_h100():
    """vLLM 0.34 by default: 64-token blocks and the KV pool sized after warmup (docs/memory.md:
    61.40 GiB, 7,859 blocks, 502,976 tokens)."""
    r = resolve(EngineConfig())
    assert (r.config.scheduler, r.vllm_version, r.model.name, r.gpu.name) == (
        "v1", "0.34", "llama-3.1-8b", "h100")
    s = r.spec
    assert s.block_size == 64 and r.gpu_memory_utilization == 1.0
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (8192, 1024)
    assert r.num_gpu_blocks == 7859 and r.kv_tokens == 502_976
    assert r.log_lines()[:2] == ("Available KV cache memory: 61.40 GiB",
                                 "GPU KV cache size: 502,976 tokens")
    assert s.kv_bytes_per_block == 8 * 2**20
    assert "block_size" in r.defaulted


def test_033_is_selectable_and_keeps_its_defaults():
    r = resolve(EngineConfig(vllm_version="0.33"))
    assert (r.config.scheduler, r.vllm_version, r.model.name, r.gpu.name) == (
        "v1", "0.33", "llama-3.1-8b", "h100")
    s = r.spec
    assert r.gpu_memory_utilization == 0.92
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (8192, 1024)
    assert s.enable_prefix_caching and s.enable_chunked_prefill
    assert s.max_model_len == 131072 and s.block_size == 16
    assert (s.policy, s.preemption_mode, s.on_swap_full) == ("fcfs", "recompute", "abort")
    assert (s.long_prefill_token_threshold, s.scheduler_reserve_full_isl, s.watermark,
            s.max_num_active_seqs) == (0, True, 0.0, None)
    assert s.num_gpu_blocks == r.num_gpu_blocks == pytest.approx(28_863, rel=0.05)  # C4
    # V1 recompute has no host pool.
    assert s.num_cpu_blocks == 0 and r.swap_host_ram_bytes == 0
    assert s.kv_bytes_per_block == r.kv_bytes_per_block == 2 * 2**20
    assert r.kv_bytes_per_token == 128 * 1024
    assert r.defaulted == {"gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                           "max_model_len", "enable_prefix_caching", "enable_chunked_prefill",
                           "async_scheduling", "block_size"}


def test_overrides_win_over_the_034_defaults():
    r = resolve(EngineConfig(block_size=16, gpu_memory_utilization=0.9))
    assert r.vllm_version == "0.34" and r.block_size == 16 and r.gpu_memory_utilization == 0.9
    # An explicit utilization caps the budget: 0.9 x 79.2 GiB - weights - graphs - non-torch.
    assert r.available_kv_bytes < resolve(EngineConfig(block_size=16)).available_kv_bytes
    assert resolve(EngineConfig(num_gpu_blocks_override=100)).num_gpu_blocks == 100


@pytest.mark.parametrize("kw, flag", [
    (dict(vllm_version="0.33", cache_aware_admission_window=4), "cache_aware_admission_window"),
    (dict(vllm_version="0.33", max_num_inflight_kv_loads=1), "max_num_inflight_kv_loads"),
    (dict(vllm_version="0.33", cache_aware_admission_threshold=0.9),
     "cache_aware_admission_threshold"),
    (dict(scheduler="v0", vllm_version="0.34"), "vllm_version"),
    (dict(vllm_version="0.35"), "vllm_version"),
    (dict(preemption_victim="lcf", scheduling_policy="priority"), "preemption_victim"),
    (dict(scheduler="v0", preemption_victim="lcf"), "preemption_victim"),
])
def test_version_knobs_are_refused_where_that_vllm_has_none(kw, flag):
    with pytest.raises(ValueError) as e:
        EngineConfig(**kw)
    assert str(e.value).startswith(f"{flag}:") and "\n" not in str(e.value)


@pytest.mark.parametrize("gpu, tokens, seqs", [
    ("b200", 16384, 1024), ("h100", 8192, 1024), ("h100-pcie", 8192, 1024), ("h200", 8192, 1024),
    ("a100-80gb", 2048, 256), ("a100-40gb", 2048, 256), ("l40s", 2048, 256)])
def test_v1_api_server_defaults_by_hardware_tier(gpu, tokens, seqs):
    s = spec_of(gpu=gpu, max_model_len=8192)
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (tokens, seqs)


def test_v0_defaults():
    r = resolve(EngineConfig(scheduler="v0", max_model_len=8192))
    s = r.spec
    assert r.gpu_memory_utilization == 0.90
    assert s.max_num_seqs == 256
    assert not s.enable_prefix_caching
    assert not s.enable_chunked_prefill             # 8192 <= 32768
    assert s.max_num_batched_tokens == 8192         # max(max_model_len, 2048)
    assert s.num_gpu_blocks == pytest.approx(28_052, rel=0.05)   # C4, util 0.90
    assert s.num_cpu_blocks == 2048 and r.swap_host_ram_bytes == 4 * GIB  # always pinned in V0
    assert s.v0_watermark == 0.01


@pytest.mark.parametrize("max_model_len, chunked, tokens", [
    (1024, False, 2048), (32768, False, 32768), (32769, True, 2048), (131072, True, 2048)])
def test_v0_chunked_prefill_turns_on_above_32k(max_model_len, chunked, tokens):
    s = spec_of(scheduler="v0", max_model_len=max_model_len)
    assert (s.enable_chunked_prefill, s.max_num_batched_tokens) == (chunked, tokens)


def test_explicit_values_win_and_are_not_marked_defaulted():
    r = resolve(EngineConfig(scheduler="v0", gpu_memory_utilization=0.8, max_num_seqs=64,
                             max_num_batched_tokens=4096, max_model_len=4096,
                             enable_prefix_caching=True, enable_chunked_prefill=True))
    s = r.spec
    assert (r.gpu_memory_utilization, s.max_num_seqs, s.max_num_batched_tokens,
            s.max_model_len, s.enable_prefix_caching, s.enable_chunked_prefill) == (
        0.8, 64, 4096, 4096, True, True)
    assert r.defaulted == {"block_size"}


# ------------------------------------------------------------------------- B9 post-processing
def test_v1_defaulted_tokens_clamped_to_seqs_times_len():
    s = spec_of(max_model_len=16, max_num_seqs=2)
    assert s.max_num_batched_tokens == 32


def test_v1_defaulted_seqs_clamped_to_tokens():
    r = resolve(EngineConfig(max_num_batched_tokens=512, max_model_len=512))
    assert r.spec.max_num_seqs == 512
    assert any("clamped" in n for n in r.notes)


def test_v1_chunked_off_takes_max_of_len_and_default():
    assert spec_of(enable_chunked_prefill=False, max_model_len=32768).max_num_batched_tokens \
        == 32768
    assert spec_of(enable_chunked_prefill=False, max_model_len=4096).max_num_batched_tokens \
        == 8192


# ---------------------------------------------------------------------------------- validation
BAD = [
    (dict(scheduler="v2"), "scheduler"),
    (dict(model="gpt-5"), "model"),
    (dict(model=7), "model"),
    (dict(gpu="tpu-v5e"), "gpu"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size"),
    (dict(tensor_parallel_size=3), "tensor_parallel_size"),
    (dict(model="qwen2.5-7b", tensor_parallel_size=8), "tensor_parallel_size"),  # 28 heads
    (dict(tensor_parallel_size=2.0), "tensor_parallel_size"),
    (dict(block_size=12), "block_size"),
    (dict(block_size=0), "block_size"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.2), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=float("nan")), "gpu_memory_utilization"),
    (dict(swap_space=-1), "swap_space"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=True), "max_num_batched_tokens"),
    (dict(max_model_len=200_000), "max_model_len"),
    (dict(preemption_mode="evict"), "preemption_mode"),
    (dict(on_swap_full="ignore"), "on_swap_full"),
    (dict(scheduling_policy="lifo"), "scheduling_policy"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
    (dict(enable_chunked_prefill=1), "enable_chunked_prefill"),
    (dict(kv_cache_dtype="int8"), "kv_cache_dtype"),
    (dict(num_gpu_blocks_override=0, scheduler="v0"), "num_gpu_blocks_override"),
    (dict(num_gpu_blocks_override=1), "num_gpu_blocks_override"),   # V1: only the null block
    (dict(num_cpu_blocks_override=-1), "num_cpu_blocks_override"),
    (dict(long_prefill_token_threshold=-5), "long_prefill_token_threshold"),
    (dict(scheduler_reserve_full_isl=None), "scheduler_reserve_full_isl"),
    (dict(watermark=1.0), "watermark"),
    (dict(max_num_active_seqs=2048), "max_num_active_seqs"),        # > 1024 default seqs
    (dict(calibration=3), "calibration"),
    # V0 rules (reference A9, G/D4) and V1-only knobs on V0.
    (dict(scheduler="v0", max_model_len=8192, max_num_batched_tokens=4096),
     "max_num_batched_tokens"),
    (dict(scheduler="v0", max_num_seqs=4096, max_model_len=1024), "max_num_batched_tokens"),
    (dict(scheduler="v0", scheduling_policy="priority", preemption_mode="swap"),
     "preemption_mode"),
    (dict(preemption_mode="swap"), "preemption_mode"),               # V1 has no swap
    (dict(scheduler="v0", watermark=0.01), "watermark"),
    (dict(scheduler="v0", max_num_active_seqs=8), "max_num_active_seqs"),
    (dict(scheduler="v0", long_prefill_token_threshold=256), "long_prefill_token_threshold"),
    (dict(scheduler="v0", scheduler_reserve_full_isl=False), "scheduler_reserve_full_isl"),
    # Explicit V1 values are checked too (vLLM's SchedulerConfig).
    (dict(max_num_seqs=64, max_num_batched_tokens=32), "max_num_batched_tokens"),
    (dict(enable_chunked_prefill=False, max_model_len=16384, max_num_batched_tokens=8192),
     "max_num_batched_tokens"),
    # Memory: the weights do not fit, or one max_model_len request does not.
    (dict(model="llama-3.1-70b"), "tensor_parallel_size"),
    (dict(model="qwen3-32b", scheduler="v0"), "max_model_len"),
]


@pytest.mark.parametrize("kw, field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_each_validation_error_names_its_field(kw, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        EngineConfig(**kw)


def test_v0_priority_swap_error_says_why():
    with pytest.raises(ValueError, match="crashes real vLLM"):
        EngineConfig(scheduler="v0", scheduling_policy="priority", preemption_mode="swap")
    EngineConfig(scheduler="v0", preemption_mode="swap")


def test_v1_swap_is_refused_for_its_host_tier_kv_offloading():
    with pytest.raises(ValueError, match=r"V1 \(vLLM 0.33\) has no swap.*--kv-offloading-size"):
        EngineConfig(preemption_mode="swap")


def test_tp_error_lists_valid_sizes():
    # 28 heads and 4 KV heads: 7 and 14 divide the heads but not evenly over the KV heads.
    with pytest.raises(ValueError, match=r"use one of 1, 2, 4, 28$"):
        EngineConfig(model="qwen2.5-7b", tensor_parallel_size=8)


def test_weights_do_not_fit_suggests_a_tp():
    with pytest.raises(ValueError, match=r"131.4 GiB of weights.*tensor_parallel_size \(e.g. 4\)"):
        EngineConfig(model="llama-3.1-70b")
    r = resolve(EngineConfig(model="llama-3.1-70b", tensor_parallel_size=4))
    assert r.kv_bytes_per_token == 80 * 1024 and r.tensor_parallel_size == 4


def test_check_enough_kv_cache_memory_gives_the_estimated_max_len():
    # Qwen3-32B at V0's 0.90 on one H100: 2241 blocks of 16 tokens, less than 40960.
    with pytest.raises(ValueError, match=r"estimated maximum model length is 35856"):
        EngineConfig(model="qwen3-32b", scheduler="v0")
    EngineConfig(model="qwen3-32b", scheduler="v0", max_model_len=35856)
    with pytest.raises(ValueError, match=r"^max_model_len: "):
        EngineConfig(model="qwen3-32b", scheduler="v0", max_model_len=35857)
    # The fixes the message offers do work.
    EngineConfig(model="qwen3-32b", scheduler="v0", kv_cache_dtype="fp8")
    EngineConfig(model="qwen3-32b", scheduler="v0", tensor_parallel_size=2)


def test_override_skips_memory_checks_for_tiny_pools():
    # Reference S3: V0, block_size 4, 2 GPU / 2 CPU blocks, max_model_len 16 > pool of 8 tokens.
    r = resolve(EngineConfig(scheduler="v0", block_size=4, num_gpu_blocks_override=2,
                             num_cpu_blocks_override=2, max_num_seqs=2,
                             max_num_batched_tokens=64, max_model_len=16,
                             enable_chunked_prefill=False, enable_prefix_caching=False))
    s = r.spec
    assert (s.num_gpu_blocks, s.num_cpu_blocks, s.block_size, s.max_model_len) == (2, 2, 4, 16)
    assert s.kv_bytes_per_block == 4 * 128 * 1024
    assert any("override" in n for n in r.notes)


def test_v0_swap_pool_is_sized_from_swap_space_and_v1_has_none():
    r = resolve(EngineConfig(scheduler="v0", preemption_mode="swap", swap_space=8,
                             tensor_parallel_size=2))
    # 8 GiB per GPU / (16 tokens x 64 KiB per GPU at TP 2) = 8192 blocks.
    assert r.spec.num_cpu_blocks == 8192
    assert r.swap_host_ram_bytes == 16 * GIB
    r = resolve(EngineConfig(swap_space=8, num_cpu_blocks_override=64))
    assert r.spec.num_cpu_blocks == 0 and r.swap_host_ram_bytes == 0
    assert any("num_cpu_blocks_override ignored" in n for n in r.notes)


def test_kv_cache_dtype_fp8_doubles_blocks():
    auto, fp8 = resolve(EngineConfig()), resolve(EngineConfig(kv_cache_dtype="fp8"))
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert fp8.num_gpu_blocks in (2 * auto.num_gpu_blocks, 2 * auto.num_gpu_blocks + 1)


def test_hf_config_path_as_model(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "vocab_size": 32000, "max_position_embeddings": 65536, "torch_dtype": "float16",
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = resolve(EngineConfig(model=str(tmp_path)))
    assert r.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    assert any("estimated" in n for n in r.notes)


def test_log_lines_look_like_vllms():
    assert resolve(EngineConfig(scheduler="v0", max_model_len=8192)).log_lines()[0].startswith(
        "# cuda blocks: ")
    lines = resolve(EngineConfig()).log_lines()
    assert lines[0].startswith("Available KV cache memory: ") and "GPU KV cache size" in lines[1]


# ------------------------------------------------------------------------ frozen, hash, sweeps
def test_frozen_and_keyword_only():
    c = EngineConfig()
    with pytest.raises(FrozenInstanceError):
        c.max_num_seqs = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        EngineConfig("v0")  # type: ignore[misc]
    assert isinstance(resolve(c), ResolvedEngine)


def test_replace_revalidates_for_sweeps():
    base = EngineConfig(scheduler="v0", max_model_len=8192)
    grid = [replace(base, max_num_seqs=n) for n in (64, 128, 256)]
    assert [resolve(c).spec.max_num_seqs for c in grid] == [64, 128, 256]
    with pytest.raises(ValueError, match=r"^block_size: "):
        replace(base, block_size=3)


def test_config_json_is_sorted_and_complete():
    c = EngineConfig(max_num_seqs=64)
    d = json.loads(c.config_json())
    assert list(d) == sorted(d)
    assert d == c.to_dict() and d["max_num_seqs"] == 64 and d["swap_space"] == 4.0


def test_stable_hash_is_stable_and_changes_with_a_knob():
    c = EngineConfig(max_num_seqs=64)
    assert c.stable_hash() == EngineConfig(max_num_seqs=64).stable_hash()
    assert len(c.stable_hash()) == 16
    # int vs float spelling of the same value is the same knob.
    assert EngineConfig(swap_space=4).stable_hash() == EngineConfig(swap_space=4.0).stable_hash()
    knobs = [dict(max_num_seqs=65), dict(scheduler="v0"), dict(swap_space=8),
             dict(calibration="p.json"), dict(kv_cache_dtype="fp8")]
    changed = {c.stable_hash()} | {replace(c, **k).stable_hash() for k in knobs}
    assert len(changed) == 6


def test_stable_hash_is_equal_in_another_process():
    code = ("from replay.config import EngineConfig; print(EngineConfig("
            "max_num_seqs=64, scheduler='v0', max_model_len=8192).stable_hash())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    here = EngineConfig(max_num_seqs=64, scheduler="v0", max_model_len=8192).stable_hash()
    assert out.stdout.strip() == here


def test_engine_modules_import_nothing_heavy():
    code = ("import sys, replay.config, replay.timing.catalog, replay.timing.memory; "
            "bad = [m for m in ('traces', 'capacity', 'polars', 'duckdb', 'torch') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_async_scheduling_is_a_v1_knob_with_a_version_default():
    from replay.config import V1_ASYNC_SCHEDULING
    assert resolve(EngineConfig()).spec.async_scheduling is V1_ASYNC_SCHEDULING
    assert resolve(EngineConfig(async_scheduling=True)).spec.async_scheduling is True
    assert resolve(EngineConfig(async_scheduling=False)).spec.async_scheduling is False
    assert resolve(EngineConfig(scheduler="v0")).spec.async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling: a V1 scheduler knob"):
        EngineConfig(scheduler="v0", async_scheduling=True)
    with pytest.raises(ValueError, match="async_scheduling: expected True, False or None"):
        EngineConfig(async_scheduling="yes")
