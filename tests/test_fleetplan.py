"""`kvcap plan` (capacity/analyses/fleetplan.py): the searched minimum passes its own fleet replay
and one replica fewer fails its own; prices; candidates that cannot run."""
import pytest

from capacity.analyses.criteria import Budget
from capacity.analyses.fleet import score
from capacity.analyses.fleetplan import plan_fleet
from capacity.analyses.planner import Planner
from capacity.analyses.prices import DEFAULT_USD_PER_GPU_HOUR, price_table
from capacity_helpers import CONV, kvcap_json
from replay.config import EngineConfig
from replay.fleet.run import replay_fleet

SLO = dict(slo_ttft_p99_s=1.0, slo_tbt_p99_s=0.1)
BUDGET = Budget.parse("any")


@pytest.fixture(scope="module")
def burst():
    from traces.loaders import load_trace
    from traces.transforms import scale_rate
    return scale_rate(load_trace(CONV).head(300), 8.0)


def test_plan_finds_the_minimum(burst):
    cfg = EngineConfig(num_gpu_blocks_override=1500)
    p = plan_fleet(burst, [("h100", "llama-3.1-8b", 1, cfg)], Planner(workers=1), router="rr",
                   budget=BUDGET, prices={"h100": 2.5}, **SLO)
    c = p.plans[0]
    assert c.replicas is not None and c.replicas >= 2, c.explanation
    assert c.linear_estimate is not None and c.headroom_rate_scale < 1
    assert c.cost_per_hour == pytest.approx(c.replicas * 2.5)
    assert p.cheapest is c and p.as_dict()["cheapest"]["replicas"] == c.replicas
    # Verified by replays of its own: n passes, n - 1 fails (fresh fleets, not the plan's).
    at = score(replay_fleet(burst, cfg, replicas=c.replicas, router="rr"), budget=BUDGET, **SLO)
    below = score(replay_fleet(burst, cfg, replicas=c.replicas - 1, router="rr"), budget=BUDGET,
                  **SLO)
    assert at.ok and not below.ok
    assert c.fleet.fleet_id == at.fleet_id and c.one_fewer.fleet_id == below.fleet_id
    assert {n for n, _, _ in c.probes} >= {c.replicas, c.replicas - 1}


def test_a_candidate_that_cannot_run_is_reported(burst):
    p = plan_fleet(burst, [("l40s", "llama-3.1-70b", 1, "does not fit"),
                           ("h100", "llama-3.1-8b", 1, EngineConfig(num_gpu_blocks_override=1500))],
                   Planner(workers=1), router="rr", budget=BUDGET, prices={}, **SLO)
    bad, good = p.plans
    assert bad.replicas is None and "cannot run" in bad.explanation
    assert good.replicas and good.cost_per_hour is None and "no price" in good.explanation
    assert p.cheapest is None


def test_price_table_overrides(tmp_path):
    f = tmp_path / "p.yml"
    f.write_text("h100: 1.25\nH200-SXM: 2\n")
    t = price_table(["l40s=0.5"], f)
    assert t["h100"] == 1.25 and t["h200"] == 2.0 and t["l40s"] == 0.5
    assert t["b200"] == DEFAULT_USD_PER_GPU_HOUR["b200"]
    with pytest.raises(ValueError, match="GPU=USD"):
        price_table(["h100"])
    with pytest.raises(ValueError, match="unknown GPU"):
        price_table(["h999=1"])
    f.write_text("h100: [1\n")
    with pytest.raises(ValueError, match="line"):
        price_table(None, f)


def test_cli_plan_json(tmp_path, burst):
    from traces.loaders import write_trace
    src = tmp_path / "b.parquet"
    write_trace(burst.head(120), src)
    out = kvcap_json("plan", src, "--gpu", "h100", "--gpu", "h200", "--router", "rr",
                     "--num-gpu-blocks-override", "1500", "--preemption-budget", "any",
                     "--slo-ttft-p99", "1", "--slo-tbt-p99", "0.1", "--gpu-price", "h200=3.5",
                     "--workers", "1")
    assert [p["gpu"] for p in out["plans"]] == ["h100", "h200"]
    for p in out["plans"]:
        assert {"gpu", "model", "tensor_parallel_size", "replicas", "linear_estimate",
                "cost_per_hour"} <= p.keys()
        assert p["cost_per_hour"] == pytest.approx(p["replicas"] * p["price_per_gpu_hour"])
    assert out["cheapest"]["cost_per_hour"] == min(p["cost_per_hour"] for p in out["plans"])


def test_the_fleet_table_keeps_gpu_model_and_price_in_view_beside_a_long_reason():
    """A candidate that cannot run (a reason of 200+ characters) squeezed the GPU, model and
    $/hour columns of `kvcap plan`'s table to '…' at 110 columns."""
    import dataclasses
    import io

    from rich.console import Console

    from capacity.analyses.fleetplan import CandidatePlan, FleetPlan
    from capacity.cli.fleet import plan_rich_table
    ok = CandidatePlan(gpu="a100-40gb", model="llama-3.1-8b", tensor_parallel_size=1, replicas=3,
                       linear_estimate=4, headroom_rate_scale=1.0, capacity_rps=1.0,
                       verdict="fits", flags=(), price_per_gpu_hour=3.0, cost_per_hour=9.0,
                       fleet=None, one_fewer=None, probes=(), explanation="3 replicas meet",
                       plan=object())
    bad = dataclasses.replace(ok, model="llama-3.1-70b", replicas=None, cost_per_hour=None,
                              plan=None, explanation="cannot run: " + "x" * 250)
    out = io.StringIO()
    Console(file=out, width=110).print(plan_rich_table(
        FleetPlan(router="lor", slo_ttft_p99_s=5, slo_tbt_p99_s=0.2, plans=(ok, bad))))
    text = out.getvalue()
    for word in ("a100-40gb", "llama-3.1-70b", "9.00 ←cheapest", "cannot run"):
        assert word in text, text
    assert "x" * 50 not in text                    # the reason itself is under the table
