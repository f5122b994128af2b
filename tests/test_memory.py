"""KV memory formulas against reference C1 (exact) and the worked table C4 (within 5%)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.timing import memory
from replay.timing.catalog import GIB, GPUS, MODELS, get_gpu, get_model

KIB = 1024
H100 = GPUS["h100"]

# Reference C1/C4: KiB of KV per token summed over all GPUs (TP 1), fp16 / fp8.
C1_KIB_PER_TOKEN = {
    "llama-3.1-8b": (128, 64), "mistral-7b": (128, 64), "qwen2.5-7b": (56, 28),
    "qwen2.5-32b": (256, 128), "llama-3.1-70b": (320, 160),
}

# Reference C4 on an H100-80GB, block_size 16:
# (model, TP, util, kv dtype, KiB/tok/GPU, KV GiB/GPU, GPU blocks, KV tokens, CPU blocks @ 4 GiB)
C4 = [
    ("llama-3.1-8b", 1, 0.90, "auto", 128, 54.8, 28_052, 448_832, 2_048),
    ("llama-3.1-8b", 1, 0.92, "auto", 128, 56.4, 28_863, 461_808, 2_048),
    ("llama-3.1-8b", 1, 0.90, "fp8", 64, 54.8, 56_104, 897_664, 4_096),
    ("mistral-7b", 1, 0.90, "auto", 128, 56.3, 28_815, 461_040, 2_048),
    ("mistral-7b", 1, 0.90, "fp8", 64, 56.3, 57_630, 922_080, 4_096),
    ("qwen2.5-7b", 1, 0.90, "auto", 56, 55.6, 65_056, 1_040_896, 4_681),
    ("qwen2.5-7b", 1, 0.90, "fp8", 28, 55.6, 130_112, 2_081_792, 9_362),
    ("qwen2.5-32b", 1, 0.90, "auto", 256, 8.8, 2_240, 35_840, 1_024),
    ("qwen2.5-32b", 1, 0.92, "auto", 256, 10.3, 2_645, 42_320, 1_024),
    ("qwen2.5-32b", 1, 0.90, "fp8", 128, 8.8, 4_480, 71_680, 2_048),
    ("qwen2.5-32b", 2, 0.90, "auto", 128, 38.8, 19_847, 317_552, 2_048),
    ("llama-3.1-70b", 4, 0.90, "auto", 80, 36.4, 29_843, 477_488, 3_276),
    ("llama-3.1-70b", 4, 0.90, "fp8", 40, 36.4, 59_686, 954_976, 6_553),
    ("llama-3.1-70b", 8, 0.90, "auto", 40, 52.9, 86_597, 1_385_552, 6_553),
    ("llama-3.1-70b", 8, 0.90, "fp8", 20, 52.9, 173_195, 2_771_120, 13_107),
]


def _row_id(row) -> str:
    return f"{row[0]}-tp{row[1]}-{row[2]}-{row[3]}"


@pytest.mark.parametrize("name", sorted(C1_KIB_PER_TOKEN))
def test_c1_kib_per_token_exact(name):
    fp16, fp8 = C1_KIB_PER_TOKEN[name]
    m = get_model(name)
    assert memory.kv_bytes_per_token(m, 1, "auto") == fp16 * KIB
    assert memory.kv_bytes_per_token(m, 1, "fp8") == fp8 * KIB
    assert memory.kv_bytes_per_token(m, 1, "fp8_e5m2") == fp8 * KIB
    assert memory.kv_bytes_per_block(m, 1, "auto", 16) == 16 * fp16 * KIB


@pytest.mark.parametrize("row", C4, ids=_row_id)
def test_c4_per_gpu_kib_per_token_exact(row):
    name, tp, _, dtype, kib = row[:5]
    assert memory.kv_bytes_per_token(MODELS[name], tp, dtype) == kib * KIB


@pytest.mark.parametrize("row", C4, ids=_row_id)
def test_c4_gpu_blocks_kv_tokens_and_cpu_blocks(row):
    name, tp, util, dtype, _, kv_gib, gpu_blocks, kv_tokens, cpu_blocks = row
    m = MODELS[name]
    avail = memory.available_kv_bytes(m, H100, tp, util)
    blocks = memory.num_gpu_blocks(m, H100, tp, util, dtype, 16)
    assert avail / GIB == pytest.approx(kv_gib, rel=0.05)
    assert blocks == pytest.approx(gpu_blocks, rel=0.05)
    assert memory.kv_tokens(blocks, 16) == pytest.approx(kv_tokens, rel=0.05)
    assert memory.num_cpu_blocks(4, m, tp, dtype, 16) == pytest.approx(cpu_blocks, rel=0.05)


def test_c4_is_in_fact_much_closer_than_5_percent():
    # The formulas are C2/C3 themselves; only the weight sizes are rounded in the table.
    for name, tp, util, dtype, _, _, gpu_blocks, _, cpu_blocks in C4:
        m = MODELS[name]
        assert memory.num_gpu_blocks(m, H100, tp, util, dtype, 16) == pytest.approx(gpu_blocks,
                                                                                    rel=0.001)
        assert memory.num_cpu_blocks(4, m, tp, dtype, 16) == cpu_blocks


def test_tp_beyond_kv_heads_replicates_one_head_per_gpu():
    m = MODELS["qwen2.5-7b"]  # 4 KV heads
    assert memory.kv_heads_per_gpu(m, 4) == 1
    assert memory.kv_heads_per_gpu(m, 8) == 1
    assert memory.kv_bytes_per_token(m, 8) == memory.kv_bytes_per_token(m, 4) == 14 * KIB


def test_non_kv_overhead_defaults_and_override():
    m = MODELS["llama-3.1-8b"]
    assert memory.default_non_kv_overhead_bytes(1) == int(1.5 * GIB)
    assert memory.default_non_kv_overhead_bytes(2) == 2 * GIB
    base = memory.num_gpu_blocks(m, H100, 1, 0.9)
    # One extra GiB of overhead costs exactly one GiB of 2 MiB blocks (512 of them, +-1 rounding).
    less = memory.num_gpu_blocks(m, H100, 1, 0.9, non_kv_overhead_bytes=int(2.5 * GIB))
    assert base - less in (511, 512, 513)


def test_model_that_does_not_fit_has_zero_blocks():
    m = MODELS["llama-3.1-70b"]
    assert memory.available_kv_bytes(m, H100, 1, 0.9) < 0
    assert memory.num_gpu_blocks(m, H100, 1, 0.9) == 0


def test_swap_rule_of_thumb_and_host_ram():
    m = MODELS["llama-3.1-8b"]
    # Reference C4: about 32K tokens of preempted context per 4 GiB for 8B models at fp16.
    assert memory.kv_tokens(memory.num_cpu_blocks(4, m), 16) == 32_768
    assert memory.num_cpu_blocks(0, m) == 0
    assert memory.swap_host_ram_bytes(4, 4) == 16 * GIB
    host = 100 * GIB
    assert memory.swap_host_ram_verdict(10, 4, host) == "ok"      # 40 GiB = 40%: not above
    assert memory.swap_host_ram_verdict(11, 4, host) == "warn"
    assert memory.swap_host_ram_verdict(17.5, 4, host) == "warn"  # exactly 70%
    assert memory.swap_host_ram_verdict(18, 4, host) == "error"


def test_concurrency_and_estimated_max_len():
    assert memory.max_concurrency(28_052, 16, 131_072) == pytest.approx(3.424, abs=1e-3)
    assert memory.estimated_max_model_len(2_240, 16) == 35_840


def test_unknown_kv_dtype():
    with pytest.raises(ValueError, match=r"^kv_cache_dtype: 'int4'"):
        memory.kv_bytes_per_token(MODELS["llama-3.1-8b"], 1, "int4")


@given(name=st.sampled_from(sorted(MODELS)), gpu=st.sampled_from(sorted(GPUS)),
       tp=st.sampled_from([1, 2, 4, 8]), u1=st.floats(0.05, 1.0), u2=st.floats(0.05, 1.0),
       block_size=st.sampled_from([8, 16, 32]))
def test_blocks_grow_with_utilization_and_fp8_doubles_them(name, gpu, tp, u1, u2, block_size):
    m, g = MODELS[name], GPUS[gpu]
    lo, hi = sorted((u1, u2))
    assert (memory.num_gpu_blocks(m, g, tp, lo, "auto", block_size)
            <= memory.num_gpu_blocks(m, g, tp, hi, "auto", block_size))
    half = memory.num_gpu_blocks(m, g, tp, hi, "auto", block_size)
    full = memory.num_gpu_blocks(m, g, tp, hi, "fp8", block_size)
    assert full in (2 * half, 2 * half + 1)
    # Blocks never hold more bytes than were available.
    avail = memory.available_kv_bytes(m, g, tp, hi)
    assert full * memory.kv_bytes_per_block(m, tp, "fp8", block_size) <= max(0, avail)


def test_034_kv_size_of_llama_8b_on_h100_follows_docs_memory_md():
    """docs/memory.md's worked example, term by term: total - CUDA context - weights - CUDA graphs
    - non-torch = headroom; available = headroom - max(256 MiB, 2% of it)."""
    m, g = get_model("llama-3.1-8b"), get_gpu("h100")
    headroom = (g.memory_bytes - memory.CUDA_CONTEXT_BYTES - m.num_params * 2
                - g.cuda_graph_bytes(m, 1) - memory.NON_TORCH_TP1_BYTES)
    assert round(headroom / GIB, 2) == 62.65
    available = memory.v034_available_kv_bytes(m, g, 1)
    assert available == headroom - int(headroom * 0.02)
    assert round(available / GIB, 2) == 61.40
    assert available // memory.kv_bytes_per_block(m, 1, "auto", 64) == 7859
    # An explicit utilization is a budget on the total: it binds below the headroom.
    non_kv = m.num_params * 2 + g.cuda_graph_bytes(m, 1) + memory.NON_TORCH_TP1_BYTES
    assert memory.v034_available_kv_bytes(m, g, 1, 0.9) == math.ceil(g.memory_bytes * 0.9) - non_kv
