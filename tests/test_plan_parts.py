"""The capacity plan's parts as claims (docs/planning.md): one set of defaults in every command,
the noise threshold, the binding constraint's precedence, the jittered traces, the replica
search's stopping rule."""
import dataclasses
import inspect

import polars as pl
import pytest

from capacity.analyses.binding import cause, diagnose
from capacity.analyses.defaults import DEFAULTS
from capacity.analyses.headroom import LoadPoint
from capacity.analyses.noise import Noise, gain
from traces.transforms import jitter_arrivals

COMMANDS = ("report", "plan", "headroom", "tune", "fleet")


def _defaults(name: str) -> dict:
    from capacity.cli import command_object
    fn = command_object(name)
    out = {}
    for p in inspect.signature(fn).parameters.values():
        d = getattr(p.default, "default", None)
        if p.name in ("slo_ttft_p99", "slo_tbt_p99", "preemption_budget", "precision", "router"):
            out[p.name] = d
    return out


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_reads_the_one_set_of_defaults(name):
    want = {"slo_ttft_p99": DEFAULTS.slo_ttft_p99_s, "slo_tbt_p99": DEFAULTS.slo_tbt_p99_s,
            "preemption_budget": DEFAULTS.preemption_budget, "precision": DEFAULTS.precision,
            "router": DEFAULTS.router}
    got = _defaults(name)
    assert got, name
    for k, v in got.items():
        assert v == want[k], (name, k, v)


def test_gain_and_threshold():
    assert gain(1.0, 0.9) == pytest.approx(0.1)
    assert gain(1.0, 1.1) == pytest.approx(-0.1)
    assert gain(2.0, 3.0, higher_is_better=True) == pytest.approx(0.5)
    assert gain(None, 1.0) == 0.0 and gain(0.0, 0.0) == 0.0
    n = Noise(seeds=3, floor=0.02, precision=0.05, spread={"ttft_p99_s": 0.08, "tbt_p99_s": 0.001},
              values={}, run_ids=())
    assert n.threshold("ttft_p99_s") == 0.08 and n.threshold("tbt_p99_s") == 0.02
    assert n.threshold("margin") == pytest.approx(0.1)
    # A 0.1% TBT difference is never advice; a 10% TTFT cut beats an 8% spread.
    assert not n.beats("tbt_p99_s", 0.100, 0.0999)
    assert n.beats("ttft_p99_s", 1.0, 0.9) and not n.beats("ttft_p99_s", 1.0, 0.93)


def test_jittered_trace_is_the_same_traffic_resampled_deterministically():
    t = pl.DataFrame({"request_id": list(range(200)), "arrival_s": [i * 0.5 for i in range(200)],
                      "prompt_tokens": [100] * 200, "output_tokens": [10] * 200})
    a, b = jitter_arrivals(t, seed=1), jitter_arrivals(t, seed=1)
    assert a.equals(b) and not a.equals(jitter_arrivals(t, seed=2))
    assert sorted(a["request_id"].to_list()) == list(range(200))
    assert a["arrival_s"].is_sorted() and a["arrival_s"][0] == 0.0
    moved = (a.sort("request_id")["arrival_s"] - t["arrival_s"]).abs()
    assert float(moved.max()) <= 0.5 * 0.5 + 0.25 + 1e-9     # ≤ half a gap (+ the re-zeroing)


def _point(scale, **kw) -> LoadPoint:
    base = dict(rate_scale=scale, surge=False, run_id="r", requests=10, offered_rps=1.0,
                served_rps=1.0, sustainable=True, throughput_rps=1.0, goodput_rps=1.0,
                slo_share=1.0, ttft_p99_s=1.0, tbt_p99_s=0.05, preemptions=0, verdict="none",
                meets_slo=True, within_budget=True, ok=True, breaks="")
    return LoadPoint(**{**base, **kw})


SLO = dict(slo_ttft_p99_s=5.0, slo_tbt_p99_s=0.2)


def test_binding_cause_precedence():
    bad = dict(ok=False, meets_slo=False)
    assert cause(_point(1, sustainable=False, ttft_p99_s=50, **bad), **SLO) == "compute"
    assert cause(_point(1, within_budget=False, ok=False), **SLO) == "kv_blocks"
    assert cause(_point(1, tbt_p99_s=0.3, **bad), **SLO) == "prefill_chunk"
    assert cause(_point(1, tbt_p99_s=0.3, preemptions=9, **bad), **SLO) == "kv_blocks"
    assert cause(_point(1, ttft_p99_s=6, **bad), **SLO) == "compute"
    assert cause(_point(1), **SLO) is None


def test_long_prompts_bind_before_anything_else_and_replicas_cannot_help():
    floor = _point(1.0, ttft_p99_s=6.0)
    b = diagnose((_point(0.5, ttft_p99_s=7.0, ok=False, meets_slo=False),), floor,
                 floor_prompt_tokens=30_000, scale=None, failed_at=0.5, **SLO)
    assert b.constraint == "long_prompt_prefill" and not b.replicas_help
    assert "30,000 tokens" in b.evidence
    ok = diagnose((_point(1.0), _point(2.0, tbt_p99_s=0.4, ok=False, meets_slo=False)),
                  _point(1.0, ttft_p99_s=0.2), floor_prompt_tokens=500, scale=1.0, failed_at=2.0,
                  **SLO)
    assert ok.constraint == "prefill_chunk" and ok.replicas_help and "×2" in ok.evidence


def test_replica_search_stops_at_n_passing_and_n_minus_1_failing(monkeypatch):
    """N passes, N - 1 fails, nothing probed above a passing N (the issue: after finding 7 the
    old search went on to 9, 17, 33 ... 64)."""
    from capacity.analyses import replicas as rp
    need = 7
    probed = []

    @dataclasses.dataclass
    class Fake:
        replicas: int

    def fake_fleet(trace, config, *, replicas, router, planner):
        probed.append(replicas)
        return Fake(replicas)

    def fake_score(fleet, **kw):
        ok = fleet.replicas >= need
        cand = type("C", (), {"breaks": "" if ok else "TTFT p99 9 s > 5 s", "ttft_p99_s": 1.0,
                              "tbt_p99_s": 0.1, "preemptions": 0})()
        return type("S", (), {"ok": ok, "candidate": cand, "replicas": fleet.replicas,
                              "fleet_id": f"f{fleet.replicas}"})()
    monkeypatch.setattr(rp, "run_fleet", fake_fleet)
    monkeypatch.setattr(rp, "score", fake_score)
    from capacity.analyses.criteria import Budget
    for cap in (None, 0.2, 1 / 7, 0.1, 1 / 59):
        probed.clear()
        # keep_tables: the fleets run here (not in a worker), where the fakes are
        planner = type("P", (), {"keep_tables": True, "trace_name": ""})()
        r = rp.min_replicas(pl.DataFrame({"arrival_s": [0.0]}), None, planner, capacity_scale=cap,
                            budget=Budget(), router="lor", max_replicas=64, **SLO)
        assert r.count == need and r.one_fewer.replicas == need - 1, (cap, probed)
        assert need in probed and need - 1 in probed
        # It stops as soon as it knows both: the last probe is the one that completed the pair.
        assert probed[-1] in (need, need - 1) and not {need, need - 1} <= set(probed[:-1])
        assert len(probed) == len(set(probed)) <= 14, (cap, probed)   # ~2 log2(64)


def test_keep_tables_gives_the_same_values_and_keeps_every_replay():
    """`--db` planners replay searches in full to store them; the answers are the same."""
    from capacity.analyses.criteria import Budget
    from capacity.analyses.headroom import search_loads, ok
    from capacity.analyses.planner import Planner
    from replay.config import EngineConfig
    from traces.synth import synthesize
    trace = synthesize("poisson", duration_s=60, rate_rps=4.0)
    cfg = EngineConfig(num_gpu_blocks_override=800)
    kw = dict(passes=ok, slo_ttft_p99_s=2.0, slo_tbt_p99_s=0.2, budget=Budget(), precision=0.2)
    lean, full = Planner(workers=1), Planner(workers=1, keep_tables=True)
    a = search_loads(trace, {"c": cfg}, lean, **kw)["c"]
    b = search_loads(trace, {"c": cfg}, full, **kw)["c"]
    assert a == b
    assert lean.runs == [] and len(lean.reduced) == len(a[0].probes)
    assert len(full.runs) == len(b[0].probes) and full.reduced == []


def test_migration_block_words_need_no_v0_twin():
    """A V1 priority deployment has no V0 swap twin (vLLM V0 crashes there); the block-size
    words of the migration still come (16 on V0, 64 on 0.34), without replaying anything."""
    from capacity.analyses.migration import block_change
    from replay.config import EngineConfig
    from traces.synth import synthesize
    trace = synthesize("poisson", rate_rps=1.0, duration_s=5.0)
    words, hits = block_change(trace, EngineConfig(scheduling_policy="priority"), planner=None)
    assert "16 tokens on V0, 64 on vLLM 0.34" in words and hits is None


def test_a_sparse_trace_gets_a_surge_window_with_requests():
    """Found off the corpus: Azure code's [1200, 1320) s slowed to ×0.1 had no arrival in the
    default flash-crowd window (half the span on), so report, plan and headroom all stopped
    with "surge window … holds no requests to sample from"."""
    from capacity.analyses.headroom import surge_window
    from traces.transforms import overlay_surge
    trace = pl.DataFrame({"request_id": [0, 1, 2, 3], "arrival_s": [0.0, 10.0, 900.0, 1190.0],
                          "prompt_tokens": [10] * 4, "output_tokens": [5] * 4})
    start, duration = surge_window(trace)
    assert (start, duration) == (900.0, 290.0)
    assert len(overlay_surge(trace, start_s=start, duration_s=duration, extra_factor=1.0)) == 5
    dense = trace.with_columns(arrival_s=pl.Series([0.0, 600.0, 700.0, 1190.0]))
    assert surge_window(dense) == (595.0, 300.0)          # the default where it holds requests
    assert surge_window(trace, start_s=100.0) == (100.0, 300.0)   # a given start stays
