"""Issue 36 item 2 held on the plan: identical replays run once.

A search's replay keeps no tables (a summary replay), so a question asked of it after it was made
replays it again. The plan made one or two such replays twice on nearly every corpus scenario:
the recommended configuration, replayed by the tuning (or the modes, or the host-tier sweep), was
replayed again as its capacity search's ×1 probe; V0's swap verification again as the mode
comparison's swap variant; an overloaded engine's sustainable-load probe again as its capacity
probe; V0's V1-twin size-0 point again for the block-size change. The plan now asks those
questions ahead (`Planner.asking_too`). Here: the plan makes every replay once on each of those
shapes, a question asked ahead answers exactly what a replay asked afterwards answers, and one
that fails ahead fails nothing.
"""
from __future__ import annotations

import pytest

from answers.corpus import MOONCAKE, PUBLIC_DIR, _public, _synth, trace_path
from capacity.analyses.plan import make_plan
from capacity.analyses.planner import Planner, reducer, summary_reducer
from capacity.analyses.sweep import Job
from replay.config import EngineConfig
from traces.loaders import load_trace
from traces.synth import default_trace


def _trace(recipe, tmp_path_factory):
    return load_trace(trace_path(recipe, tmp_path_factory.getbasetemp() / "traces"))


def _plan(trace, config, **kw):
    planner = Planner(workers=2)
    return planner, make_plan(trace, config, planner, **kw)


def test_the_default_scenario_replays_each_replay_once():
    """V1 0.34: the host-tier sweep's knee is the mode comparison's offload variant, and the
    recommended flags were a tuning candidate before their capacity search probed them at ×1."""
    planner, plan = _plan(default_trace(), EngineConfig())
    assert plan.offload is not None and plan.offload.needed
    assert "recompute+cpu-offload" in {r.variant for r in plan.modes.results}
    assert planner.repeated == []
    assert planner.replays_made == planner.num_distinct_runs


def test_v0_swap_verification_is_the_mode_comparisons_swap_replay(tmp_path_factory):
    trace = _trace(_synth("poisson", 5, 300), tmp_path_factory)
    config = EngineConfig(scheduler="v0", preemption_mode="swap", num_gpu_blocks_override=1000)
    planner, plan = _plan(trace, config)
    assert plan.sizing is not None and plan.sizing.needed
    assert "swap" in {r.variant for r in plan.modes.results}
    assert planner.repeated == []


def test_an_overloaded_engines_capacity_search_reuses_its_sustainable_load_probes(
        tmp_path_factory):
    trace = _trace(_synth("poisson", 36, 180), tmp_path_factory)
    planner, plan = _plan(trace, EngineConfig())
    assert plan.recommendation.verdict == "overloaded"
    assert plan.sustainable_load.scale is not None
    assert planner.repeated == []


@pytest.mark.skipif(not (PUBLIC_DIR / MOONCAKE).exists(), reason="no Mooncake trace here")
def test_v0_migrations_block_change_reuses_the_v1_twins_size_0_replay(tmp_path_factory):
    trace = _trace(_public(MOONCAKE, 600, 240, scale=0.3), tmp_path_factory)
    config = EngineConfig(scheduler="v0", num_gpu_blocks_override=8000)
    planner, plan = _plan(trace, config, slo_ttft_p99_s=60.0, slo_tbt_p99_s=0.5)
    assert plan.migration.block_hits                 # the block change was measured
    assert planner.repeated == []


# ---------------------------------------------------------------- Planner.asking_too itself
def _jobs(trace, n=2):
    return [Job(trace=trace, config=EngineConfig(max_num_seqs=16 * (i + 1)), label=f"j{i}")
            for i in range(n)]


def _preemptions(tables) -> int:
    return int(tables["requests"]["num_preemptions"].sum())


def _timeless(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_seconds"}    # the replay's own time


def _fails(tables) -> int:
    raise ZeroDivisionError("asked of the wrong replay")


@pytest.fixture(scope="module")
def small():
    return default_trace().head(300)


def test_a_question_asked_ahead_is_answered_without_a_second_replay(small):
    jobs, later = _jobs(small), summary_reducer()
    p = Planner(workers=1)
    with p.asking_too((later, lambda job: job.label == "j1")):
        p.map(jobs, reducer(_preemptions))
    assert p.replays_made == 2
    got = p.map(jobs[1:], later)                     # answered ahead: no replay
    assert p.replays_made == 2 and p.repeated == []
    fresh = Planner(workers=1).map(jobs[1:], later)          # what a replay asked now gives
    assert [_timeless(g) for g in got] == [_timeless(f) for f in fresh]
    p.map(jobs[:1], later)                           # not asked ahead (`when` was false)
    assert p.replays_made == 3 and p.repeated == ["j0 / j0"]


def test_a_question_that_fails_ahead_fails_nothing_and_is_asked_again_for_real(small):
    jobs = _jobs(small, 1)
    p = Planner(workers=1)
    with p.asking_too((reducer(_fails), lambda job: True)):
        assert p.map(jobs, reducer(_preemptions)) == Planner(workers=1).map(
            jobs, reducer(_preemptions))
    assert p.replays_made == 1
    with pytest.raises(ZeroDivisionError):          # nothing was memoized: replayed, and fails
        p.map(jobs, reducer(_fails))
