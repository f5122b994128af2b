"""Every answer says what priced its steps (capacity/analyses/versions.py, `step_times`).

Found off the corpus: `kvcap plan` over H100 and L40S at TP 8 and 16 for Qwen3-32B chose 1 × L40S
at TP 16 as the cheapest fleet. TP 16 has no measured profile on either GPU, so its steps came
from the analytic roofline, while L40S at TP 8 (measured kernels, whose PCIe all-reduce grows
with TP) could not meet the SLO at any replica count. Nothing in the plan said that the winner
and the loser were priced by different models."""
import dataclasses
import io

from rich.console import Console

from capacity.analyses.fleetplan import CandidatePlan, FleetPlan
from capacity.analyses.versions import step_time_words, step_times
from capacity.cli.fleet import ROOFLINE_NOTE, plan_rich_table
from replay.config import EngineConfig

from capacity_helpers import conv800, kvcap_json  # noqa: F401 (conv800: a fixture)

MEASURED = EngineConfig(model="qwen3-32b", gpu="l40s", tensor_parallel_size=8)
ROOFLINE = dataclasses.replace(MEASURED, tensor_parallel_size=16)


def test_the_source_and_its_words():
    assert step_times(MEASURED) == "measured"
    assert step_time_words(MEASURED) == ("step times: measured kernels of qwen3-32b on l40s at "
                                         "TP 8 (NVIDIA AIConfigurator)")
    assert step_times(ROOFLINE) == "roofline"
    assert step_time_words(ROOFLINE).startswith(
        "step times: the analytic roofline — no measured profile of qwen3-32b on l40s at TP 16;")
    # fp8 KV on A100: the source measured bf16 KV only there.
    assert step_times(EngineConfig(gpu="a100-80gb", kv_cache_dtype="fp8")) == "roofline"
    assert step_times(dataclasses.replace(MEASURED, calibration="/x.json")) == "calibration"


def test_the_fleet_table_marks_a_roofline_candidate():
    ok = CandidatePlan(gpu="h100", model="qwen3-32b", tensor_parallel_size=8, replicas=1,
                       linear_estimate=1, headroom_rate_scale=1.0, capacity_rps=1.0,
                       verdict="fits", flags=(), price_per_gpu_hour=3.0, cost_per_hour=24.0,
                       fleet=None, one_fewer=None, probes=(), explanation="1 replica meets",
                       plan=object(), step_times="measured")
    guess = dataclasses.replace(ok, gpu="l40s", tensor_parallel_size=16, cost_per_hour=19.2,
                                step_times="roofline")
    out = io.StringIO()
    Console(file=out, width=110).print(plan_rich_table(
        FleetPlan(router="lor", slo_ttft_p99_s=5, slo_tbt_p99_s=0.2, plans=(ok, guess))))
    rows = [ln for ln in out.getvalue().splitlines() if ln.startswith("│ ")]
    assert "qwen3-32b †" in rows[1] and "†" not in rows[0]
    assert ROOFLINE_NOTE.startswith("† no measured step-time profile")


def test_the_report_says_it_in_a_line_and_in_its_json(conv800, tmp_path):
    doc = kvcap_json("report", conv800, "-o", tmp_path / "r", "--gpu", "a100-80gb",
                     "--kv-cache-dtype", "fp8", "--workers", "1")
    assert doc["step_times"] == "roofline"
    assert sum(ln.startswith("step times: the analytic roofline")
               for ln in doc["recommendation"]["lines"]) == 1
