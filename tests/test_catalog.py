"""Model and GPU catalogs: real shapes, aliases, Hugging Face config.json loading, unknown names."""
from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from replay.timing.catalog import (GIB, GPUS, MODELS, estimate_num_params, get_gpu, get_model,
                                   model_from_hf_config, vllm_hardware_tier)

# name: (layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, params, max_pos)
SHAPES = {
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256, 8_030_261_248, 131072),
    "llama-3.1-70b": (80, 8192, 64, 8, 128, 28672, 128256, 70_553_706_496, 131072),
    "mistral-7b": (32, 4096, 32, 8, 128, 14336, 32768, 7_248_023_552, 32768),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064, 7_615_616_512, 32768),
    "qwen2.5-32b": (64, 5120, 40, 8, 128, 27648, 152064, 32_763_876_352, 32768),
    "qwen3-32b": (64, 5120, 64, 8, 128, 25600, 151936, 32_762_123_264, 40960),
}


def hf_config(name: str) -> dict:
    """The config.json fields a Hugging Face repo of this catalog model carries."""
    m = MODELS[name]
    model_type = "qwen2" if name.startswith("qwen2") else "qwen3" if name.startswith("qwen3") \
        else "mistral" if name.startswith("mistral") else "llama"
    return {"model_type": model_type, "num_hidden_layers": m.num_layers,
            "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
            "num_key_value_heads": m.num_kv_heads, "intermediate_size": m.intermediate_size,
            "vocab_size": m.vocab_size, "max_position_embeddings": m.max_position_embeddings,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False,
            # Only configs whose head_dim differs from hidden / heads spell it out (Qwen3).
            **({"head_dim": m.head_dim} if m.head_dim * m.num_attention_heads != m.hidden_size
               else {})}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_model_shapes(name):
    m = get_model(name)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
            m.intermediate_size, m.vocab_size, m.num_params,
            m.max_position_embeddings) == SHAPES[name]
    assert m.weight_dtype_bytes == 2 and not m.num_params_estimated


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_param_count_matches_the_shapes(name):
    assert estimate_num_params(hf_config(name)) == MODELS[name].num_params


def test_weight_sizes_match_reference_c4():
    # Reference C4 states the bf16 weight sizes in GiB.
    for name, gib in {"llama-3.1-8b": 14.99, "mistral-7b": 13.5, "qwen2.5-7b": 14.19,
                      "qwen2.5-32b": 61.0, "llama-3.1-70b": 131.4}.items():
        assert MODELS[name].weight_bytes / GIB == pytest.approx(gib, rel=0.005)


@pytest.mark.parametrize("alias, name", [
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "llama-3.1-8b"),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
    ("mistralai/Mistral-7B-v0.3", "mistral-7b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("qwen/qwen2.5-32b-instruct", "qwen2.5-32b"),
    ("Qwen/Qwen3-32B", "qwen3-32b"),
    ("  Llama-3.1-8B ", "llama-3.1-8b"),
])
def test_model_aliases(alias, name):
    assert get_model(alias) is MODELS[name]


@pytest.mark.parametrize("alias, name", [
    ("H100", "h100"), ("h100-sxm", "h100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("A100-SXM4-40GB", "a100-40gb"), ("a100-80gb", "a100-80gb"), ("H100-PCIe", "h100-pcie"),
    ("H200", "h200"), ("L40S", "l40s"), ("b200", "b200"),
])
def test_gpu_aliases(alias, name):
    assert get_gpu(alias) is GPUS[name]


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"^model: unknown model 'llama-9b'.*qwen3-32b"):
        get_model("llama-9b")
    with pytest.raises(ValueError, match=r"^gpu: unknown GPU 'a100'.*a100-40gb, a100-80gb"):
        get_gpu("a100")  # ambiguous on purpose: 40 or 80 GB


def test_gpu_numbers_are_sane():
    assert set(GPUS) == {"a100-40gb", "a100-80gb", "h100", "h100-pcie", "h200", "l40s", "b200"}
    assert GPUS["h100"].memory_gib == pytest.approx(79.2, abs=0.05)  # reference C4
    for g in GPUS.values():
        assert 40 * GIB <= g.memory_bytes + 2 * GIB and g.memory_bytes <= 192 * GIB
        assert g.hbm_bandwidth_bytes_per_s > 0.5e12
        assert g.dense_fp8_flops_per_s >= g.dense_bf16_flops_per_s > 1e14
        assert g.native_fp8 == (g.dense_fp8_flops_per_s > g.dense_bf16_flops_per_s)
        assert 10e9 <= g.host_link_bandwidth_bytes_per_s <= 64e9
        assert g.tp_link_bandwidth_bytes_per_s >= g.host_link_bandwidth_bytes_per_s
    assert GPUS["l40s"].nvlink_bandwidth_bytes_per_s is None
    l40s = GPUS["l40s"]
    assert l40s.tp_link_bandwidth_bytes_per_s == l40s.host_link_bandwidth_bytes_per_s
    assert GPUS["h100"].tp_link_bandwidth_bytes_per_s == 450e9


@pytest.mark.parametrize("name, tier", [
    ("a100-40gb", "other"), ("a100-80gb", "other"), ("l40s", "other"), ("h100", "ge70gib"),
    ("h100-pcie", "ge70gib"), ("h200", "ge70gib"), ("b200", "ge160gib")])
def test_hardware_tiers_follow_vllms_rule(name, tier):
    g = GPUS[name]
    assert g.vllm_hardware_tier == tier == vllm_hardware_tier(g.memory_bytes, g.device_name)


def test_catalog_entries_are_frozen():
    with pytest.raises(FrozenInstanceError):
        MODELS["llama-3.1-8b"].num_layers = 1  # type: ignore[misc]


# ------------------------------------------------------------------------ Hugging Face config.json
def test_hf_config_without_count_estimates_it(tmp_path):
    cfg = hf_config("qwen2.5-7b")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path)
    assert m.num_params_estimated
    assert m.num_params == MODELS["qwen2.5-7b"].num_params
    # No head_dim in the file: hidden_size / heads.
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.weight_dtype_bytes) == (28, 4, 128, 2)
    assert m.max_position_embeddings == 32768


def test_hf_config_file_path_and_explicit_head_dim(tmp_path):
    cfg = hf_config("qwen3-32b") | {"torch_dtype": "float32"}
    assert cfg["head_dim"] == 128  # not 5120 / 64
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = get_model(str(path))
    assert (m.num_attention_heads, m.head_dim, m.weight_dtype_bytes) == (64, 128, 4)
    assert m.num_params == MODELS["qwen3-32b"].num_params


def test_hf_config_count_from_safetensors_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config("llama-3.1-8b")))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}))
    m = get_model(tmp_path)
    assert m.num_params == 8_030_261_248 and not m.num_params_estimated


def test_hf_config_defaults_and_tiny_llama(tmp_path):
    # The oracle's tiny llama: 2 layers, 4 heads, 2 KV heads, float16.
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 65536,
           "torch_dtype": "float16", "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = get_model(tmp_path)
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.weight_dtype_bytes) == (2, 2, 16, 2)
    per_layer = 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    assert m.num_params == 2 * 32000 * 64 + 2 * per_layer + 64


def test_hf_config_multimodal_text_config(tmp_path):
    text = hf_config("mistral-7b")
    del text["torch_dtype"]  # the wrapper carries it
    cfg = {"model_type": "llava", "torch_dtype": "bfloat16", "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = get_model(tmp_path)
    assert m.num_layers == 32 and m.num_params == MODELS["mistral-7b"].num_params


def test_hf_config_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^model: no Hugging Face config.json"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match=r"^model: .* lacks num_hidden_layers"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf_config("llama-3.1-8b")
                                                     | {"torch_dtype": "int3"}))
    with pytest.raises(ValueError, match=r"^model: .*torch_dtype 'int3'"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^model: cannot read"):
        model_from_hf_config(tmp_path)
