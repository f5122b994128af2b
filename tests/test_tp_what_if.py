"""The TP what-if of a floor compares like with like (capacity/analyses/plan.py, `_tp_what_if`).

Found off the corpus: Qwen3-32B on 4 L40S (PCIe), Mooncake's p99-length prompt (35,007 tokens)
alone took 41.5 s against a 30 s TTFT SLO. The what-if measured TP 8 at 87.5 s (the shipped L40S
tables' all-reduce grows with TP), then TP 16, which has no measured profile, on the analytic
roofline at 4.6 s, and advised "--tensor-parallel-size 16 meets the TTFT SLO": a claim from a
model that leaves out the very cost that made TP 8 slower. Beyond one 8-GPU node (TP 16 here) the
what-if stops: vLLM keeps tensor parallelism within a node, and no step-time model here knows
the inter-node link (the roofline would price it at NVLink speed)."""
import dataclasses

import pytest

from capacity.analyses.criteria import Budget
from capacity.analyses.plan import _Targets, _tp_what_if
from capacity.analyses.planner import Planner
from replay.config import EngineConfig, resolve
from replay.timing.executors import has_measured_timing

L40S = EngineConfig(model="qwen3-32b", gpu="l40s", tensor_parallel_size=4,
                    max_num_batched_tokens=1024)


@pytest.fixture(scope="module")
def long_prompt(tmp_path_factory):
    from traces.loaders import load_trace
    path = tmp_path_factory.mktemp("t") / "long.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,35007,100\n")
    return load_trace(path)


def _what_if(trace, config: EngineConfig, slo_ttft_p99_s: float) -> str:
    t = _Targets(slo_ttft_p99_s=slo_ttft_p99_s, slo_tbt_p99_s=1.0, budget=Budget(),
                 precision=0.05)
    return _tp_what_if(trace, config, Planner(workers=1), t)


def test_the_what_if_stops_at_one_node(long_prompt):
    assert has_measured_timing(resolve(L40S))
    words = _what_if(long_prompt, L40S, 30.0)
    assert words.startswith("measured: the p99-length prompt alone takes TP 4 (as deployed): ")
    assert ", TP 8: " in words
    assert "TP 16, 32: beyond one 8-GPU node (vLLM keeps tensor parallelism within a node; " \
           "not modelled)" in words
    assert "no TP within one node meets the TTFT SLO" in words
    assert "--tensor-parallel-size 16" not in words and "TP 16: " not in words


def test_a_tp_without_a_measured_profile_is_named_not_replayed(tmp_path):
    """Qwen2.5-32B on an A100-80GB has a shipped profile at TP 1 only."""
    from traces.loaders import load_trace
    path = tmp_path / "p.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,8000,10\n")
    one = EngineConfig(model="qwen2.5-32b", gpu="a100-80gb")
    assert has_measured_timing(resolve(one))
    assert not has_measured_timing(resolve(dataclasses.replace(one, tensor_parallel_size=2)))
    words = _what_if(load_trace(path), one, 0.01)
    assert words.startswith("measured: the p99-length prompt alone takes TP 1 (as deployed): ")
    assert "TP 2, 4, 8: not measured (no step-time profile of qwen2.5-32b on a100-80gb " \
           "there)" in words
    assert "no measured TP of this GPU and model meets the TTFT SLO" in words
    assert "TP 2: " not in words and "beyond" not in words


def test_a_measured_tp_that_meets_the_slo_is_still_named(long_prompt):
    h100 = dataclasses.replace(L40S, gpu="h100", tensor_parallel_size=1)
    words = _what_if(long_prompt, h100, 3.5)
    assert words.startswith("measured: the p99-length prompt alone takes TP 1 (as deployed): ")
    assert words.endswith("meets the TTFT SLO") and "not measured" not in words

