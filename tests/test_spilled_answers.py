"""Issue 36: the replays a plan holds to the end (its baseline and recommended runs) and the fleets
the replica search scores keep their steps and TBT samples in spill files past a million steps.
The answers must not change: every reader of those tables gives, on the spilled tables, exactly
what it gives on the in-memory ones (the spill threshold is lowered here so that a short trace
spills to files in several pieces)."""
from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from capacity.analyses.classify import alert_rule, classify, windows
from capacity.analyses.criteria import Budget, evaluate
from capacity.analyses.fleet import score
from capacity.analyses.metrics import summary
from capacity.analyses.planner import Planner
from capacity.analyses.plan import make_plan
from capacity.analyses.stalls import attribute_stalls, drill_steps
from capacity.views import charts
from replay.config import EngineConfig
from replay.engine import compiled
from replay.engine.raw import ColumnSpill
from replay.fleet.run import replay_fleet
from replay.results.tables import SpilledTable, StackedTable
from replay.run import replay
from traces.synth import synthesize

PRESSED = dict(num_gpu_blocks_override=300, max_num_seqs=64)       # preempts: events, stalls


@pytest.fixture(scope="module")
def trace() -> pl.DataFrame:
    return synthesize("poisson", duration_s=120, rate_rps=8, seed=3)


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, pl.DataFrame):
        assert a.equals(b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            if k != "wall_seconds":             # the replays' own timing
                _same(a[k], b[k])
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_every_reader_gives_the_in_memory_answer(tmp_path, monkeypatch, trace, scheduler):
    config = EngineConfig(scheduler=scheduler, **PRESSED)
    whole = replay(trace, config).tables()
    monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", 97)
    run = replay(trace, config, spill_dir=str(tmp_path))
    spilled = run.tables()
    assert isinstance(spilled["steps"].spill, ColumnSpill)          # in files, in pieces
    assert spilled["steps"].height > 3 * 97 and whole["events"].height > 0
    kw = dict(slo_ttft_s=1.0, slo_tbt_s=0.1, budget=Budget())
    for fn in (summary, classify, alert_rule, attribute_stalls, drill_steps,
               lambda t: evaluate(t, **kw), lambda t: windows(t, 60.0)):
        _same(fn(whole), fn(spilled))
    r = whole["runs"].row(0, named=True)
    for fn in (lambda s: charts.load_frames(whole["requests"], s, r["sim_seconds"]),
               lambda s: charts.kv_usage_frame(s, r)):
        for a, b in zip(fn(whole["steps"]), fn(spilled["steps"])):
            _same(a, b)
    assert spilled["steps"].select("step", "start_s").equals(
        whole["steps"].select("step", "start_s"))


@pytest.mark.parametrize("router", ["lor", "rr"])
def test_a_spilled_fleet_scores_as_the_copied_one(tmp_path, monkeypatch, trace, router):
    """Scoring reads the replicas' tables stacked, not copied, and spilled lor replicas step to
    the same tables."""
    config = EngineConfig(**PRESSED)
    whole = replay_fleet(trace, config, replicas=2, router=router)
    monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", 53)
    spilled = replay_fleet(trace, config, replicas=2, router=router,
                           runner=lambda subs, c: [replay(s, c, spill_dir=str(tmp_path))
                                                   for s in subs],
                           spill_dir=str(tmp_path))
    assert all(isinstance(r.steps, SpilledTable) and isinstance(r.steps.spill, ColumnSpill)
               for r in spilled.replicas)
    copied, stacked = whole.tables(), spilled.tables(stacked=True)
    assert isinstance(stacked["steps"], StackedTable)
    for name in ("steps", "tbt"):
        assert stacked[name].frame().equals(copied[name]), name
    kw = dict(slo_ttft_s=1.0, slo_tbt_s=0.1, budget=Budget())
    _same(evaluate(copied, **kw), evaluate(stacked, **kw))
    a, b = score(whole), score(spilled)
    assert a.candidate == b.candidate and a.per_replica == b.per_replica


def test_the_plan_spills_its_own_replays_and_answers_the_same(monkeypatch, trace):
    """A plan whose baseline and recommended runs are spilled to files (the threshold lowered)
    equals the plan made with them in memory, claim by claim."""
    config = EngineConfig(num_gpu_blocks_override=450, max_num_seqs=64)   # misses, preempts
    kw = dict(slo_ttft_p99_s=2.0, slo_tbt_p99_s=0.2, noise_seeds=2)
    held = make_plan(trace, config, Planner(workers=1), **kw)
    assert isinstance(held.recommended_run.steps, pl.DataFrame)     # below the threshold
    assert held.recommended_run.events.height > 0
    monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", 97)
    spilled = make_plan(trace, config, Planner(workers=1), **kw)
    for run in (spilled.baseline, spilled.recommended_run):
        assert isinstance(run.steps.spill, ColumnSpill) and isinstance(run.tbt.spill, ColumnSpill)
    assert spilled.contract() == held.contract()
    assert spilled.recommendation == held.recommendation


def test_the_drill_down_and_the_swap_demand_spill_and_answer_the_same(monkeypatch, trace):
    """The drill-down's replay (only its batches' window and the steps' starts are read) and
    V0's swap-demand replay (three step columns) spill past the threshold, same answers."""
    from capacity.analyses.plan import drill_of
    from capacity.analyses.sizing import size_swap
    config = EngineConfig(**PRESSED)
    window = drill_steps(replay(trace, config).tables())
    v0 = EngineConfig(scheduler="v0", preemption_mode="swap", swap_space=4,
                      num_gpu_blocks_override=700, max_num_seqs=64)
    light = synthesize("poisson", duration_s=120, rate_rps=3, seed=3)     # V0 keeps up, swaps
    held = (drill_of(trace, config, window), size_swap(light, v0, planner=Planner(workers=1)))
    assert held[0] is not None and held[1].peak_swapped_blocks > 0
    monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", 97)
    spilled = (drill_of(trace, config, window), size_swap(light, v0, planner=Planner(workers=1)))
    _same(held[0], spilled[0])
    assert spilled[1].as_dict() == held[1].as_dict()
