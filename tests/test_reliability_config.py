"""Issue 13, items 1, 7 (pools), 9, 10 and 11 on the engine side: calibration JSON, config.json,
engine flags and synthetic-trace parameters are checked at the boundary; a bad one is one line
naming the file / field and the fix, never a hang, a ZeroDivisionError or a huge allocation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replay.config import EngineConfig
from replay.timing.catalog import model_from_hf_config
from replay.timing.cost_model import CostConstants, read_profile
from traces.schema import TraceError
from traces.synth import synthesize
from traces.transforms import scale_rate, time_window

ROOT = Path(__file__).resolve().parents[1]
KVCAP = Path(sys.executable).with_name("kvcap")
CONST = CostConstants(flops_per_s=1e12, hbm_bytes_per_s=1e11, host_link_bytes_per_s=1e10,
                      interconnect_bytes_per_s=1e10)


def profile(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "profile.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize("constants,field", [
    ('{"overhead_s": NaN}', "overhead_s"),                 # item 1: the replay used to spin
    ('{"flops_per_s": 0}', "flops_per_s"),
    ('{"host_link_bytes_per_s": 0}', "host_link_bytes_per_s"),  # item 9: ZeroDivisionError
    ('{"hbm_bytes_per_s": Infinity}', "hbm_bytes_per_s"),  # item 10: sim_seconds Infinity
    ('{"overhead_s": -0.01}', "overhead_s"),               # negative TTFT
    ('{"compute_efficiency": 1.5}', "compute_efficiency"),
    ('{"overhead_s": "fast"}', "overhead_s"),
    ('{"activation_bytes": 2.5}', "activation_bytes"),
])
def test_bad_calibration_constant_is_one_line_naming_file_and_constant(tmp_path, constants, field):
    p = profile(tmp_path, '{"constants": ' + constants + "}")
    with pytest.raises(ValueError) as exc:
        CONST.with_profile(p)
    msg = str(exc.value)
    assert "\n" not in msg and str(p) in msg and field in msg


@pytest.mark.parametrize("text,what", [("[1, 2]", "got list"), ('{"constants": [1]}', "got list"),
                                       ('{"constants": {"overhead_s": 0.1,}}', "line 1, column")])
def test_calibration_that_is_not_a_profile_says_where(tmp_path, text, what):
    with pytest.raises(ValueError, match=what):
        read_profile(profile(tmp_path, text))


def test_calibration_directory_or_missing_file(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        read_profile(tmp_path)
    with pytest.raises(ValueError, match="no such file"):
        read_profile(tmp_path / "nope.json")


def test_calibration_zero_overhead_from_the_fit_is_accepted(tmp_path):
    c = CONST.with_profile(profile(tmp_path, '{"constants": {"overhead_s": 0, "flops_per_s": 2e14}}'))
    assert c.overhead_s == 0.0 and c.flops_per_s == 2e14


def test_replay_with_nan_overhead_exits_2_quickly(tmp_path):
    """Item 1 end to end: `kvcap replay --calibration` with NaN exits 2 with one line, no hang."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    p = profile(tmp_path, '{"constants": {"overhead_s": NaN}}')
    res = subprocess.run([str(KVCAP), "replay", str(trace), "--calibration", str(p), "--db",
                          str(tmp_path / "k.duckdb")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "overhead_s" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def hf(tmp_path: Path, **changes) -> Path:
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    cfg.update(changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("field,value", [("num_attention_heads", 0), ("num_hidden_layers", 0),
                                         ("num_hidden_layers", 31.7), ("hidden_size", -4096),
                                         ("vocab_size", "big"), ("num_key_value_heads", 5),
                                         ("intermediate_size", 1e30)])
def test_bad_config_json_field_is_named(tmp_path, field, value):
    with pytest.raises(ValueError) as exc:
        model_from_hf_config(hf(tmp_path, **{field: value}))
    assert field in str(exc.value) and "config.json" in str(exc.value)


def test_config_json_that_is_a_list(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        model_from_hf_config(p)


def test_config_json_whole_float_counts_are_read(tmp_path):
    assert model_from_hf_config(hf(tmp_path, num_hidden_layers=32.0)).num_layers == 32


def test_num_gpu_blocks_override_beyond_the_gpu_is_refused():
    """Item 9: 1e12 blocks asked numpy for 7 TiB inside the engine."""
    with pytest.raises(ValueError, match="num_gpu_blocks_override"):
        EngineConfig(num_gpu_blocks_override=10**12)
    with pytest.raises(ValueError, match="swap_space"):
        EngineConfig(swap_space=1e9)
    EngineConfig(num_gpu_blocks_override=3000)


def test_huge_block_size_is_blamed_on_block_size():
    """Item 11: it was blamed on tensor_parallel_size."""
    with pytest.raises(ValueError, match=r"^block_size"):
        EngineConfig(block_size=1 << 20)


@pytest.mark.parametrize("override", [dict(duration_s=float("nan")), dict(rate_rps=float("inf")),
                                      dict(duration_s=-5.0), dict(rate_rps=1e9),
                                      dict(surge_factor=float("nan"))])
def test_synth_parameters_are_finite_and_bounded(override):
    with pytest.raises(TraceError):
        synthesize("flash-crowd", **override)


def test_rate_scale_and_window_must_be_finite():
    df = synthesize("poisson", duration_s=10.0, rate_rps=2.0)
    for factor in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(TraceError, match="finite"):
            scale_rate(df, factor)
    with pytest.raises(TraceError):
        time_window(df, float("nan"))
