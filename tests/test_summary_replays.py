"""Issue 36 item 1: a search keeps summaries, not tables. A summary replay (replay/results/summary.py)
gives exactly the numbers of the full tables to evaluate / stability / classify / summary, never
builds per-step tables, and the planner's `map` reduces in the worker with a memo."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import polars as pl
import pytest

from capacity.analyses import planner as planner_mod
from capacity.analyses.classify import classify
from capacity.analyses.criteria import Budget, evaluate
from capacity.analyses.metrics import summary
from capacity.analyses.planner import Planner, score_reducer, summary_reducer
from capacity.analyses.stability import stability
from capacity.analyses.sweep import Job
from replay.config import EngineConfig
from replay.results import tables
from replay.results.quantiles import nearest_rank
from replay.results.summary import SummarySpec, _TopWeight, tail_weight
from replay.run import replay
from traces.loaders import load_trace

from capacity_helpers import CONV

SLO = dict(slo_ttft_s=1.0, slo_tbt_s=0.1)
CONFIGS = {
    "v1 recompute": EngineConfig(num_gpu_blocks_override=600, block_size=16, max_num_seqs=64),
    "v1 roomy": EngineConfig(),
    "v0 recompute": EngineConfig(scheduler="v0", num_gpu_blocks_override=500),
    "v0 swap": EngineConfig(scheduler="v0", preemption_mode="swap", swap_space=2.5,
                            num_gpu_blocks_override=500, max_num_seqs=64),
    "v0 swap fallback": EngineConfig(scheduler="v0", preemption_mode="swap",
                                     on_swap_full="recompute", swap_space=0.05,
                                     num_gpu_blocks_override=500, max_num_seqs=64),
}


@pytest.fixture(scope="module")
def conv():
    return load_trace(CONV).head(1500)


def _same_summary(a: dict, b: dict) -> None:
    a, b = dict(a), dict(b)
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert a == b, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_summary_replay_gives_the_full_tables_numbers(conv, name):
    config = CONFIGS[name]
    full = replay(conv, config).tables()
    lean = replay(conv, config, summary=SummarySpec()).tables()
    _same_summary(summary(full, **SLO), summary(lean, **SLO))
    assert evaluate(full, budget=Budget(), **SLO) == evaluate(lean, budget=Budget(), **SLO)
    assert stability(full) == stability(lean)
    a, b = classify(full), classify(lean)
    assert a.per_window.equals(b.per_window)
    assert dataclasses.replace(a, per_window=None) == dataclasses.replace(b, per_window=None)
    assert lean["steps"].height == full["steps"].height
    for col in ("num_running", "gpu_blocks_used", "cpu_blocks_used", "num_prefill_tokens"):
        assert lean["steps"][col].max() == full["steps"][col].max()
        assert lean["steps"][col].sum() == full["steps"][col].sum()


MOONCAKE = CONV.parent / "conversation_trace.jsonl"
PREFIX_CONFIGS = {
    "v1 prefix cache, preempting": EngineConfig(num_gpu_blocks_override=1500, block_size=16, max_num_seqs=64),
    "v1 cpu offloading": EngineConfig(kv_offloading_size=8.0, num_gpu_blocks_override=3000, block_size=16),
    "v0 prefix cache": EngineConfig(scheduler="v0", enable_prefix_caching=True,
                                    num_gpu_blocks_override=1500),
}


@pytest.mark.parametrize("name", list(PREFIX_CONFIGS))
def test_summary_replay_with_prefix_hashes(name):
    trace = load_trace(MOONCAKE).head(600)
    full = replay(trace, PREFIX_CONFIGS[name]).tables()
    lean = replay(trace, PREFIX_CONFIGS[name], summary=SummarySpec()).tables()
    _same_summary(summary(full, **SLO), summary(lean, **SLO))
    assert evaluate(full, budget=Budget(), **SLO) == evaluate(lean, budget=Budget(), **SLO)
    for col in ("offload_store_blocks", "offload_load_blocks", "cpu_blocks_used"):
        assert lean["steps"][col].sum() == full["steps"][col].sum()
    assert summary(lean, **SLO)["gpu_hit_tokens"] > 0
    if "offloading" in name:
        assert lean["steps"]["offload_store_blocks"].sum() > 0


def test_the_cases_cover_preemption_and_swap(conv):
    s = {n: summary(replay(conv, c, summary=SummarySpec(tbt_quantiles=(0.99,))).tables(),
                    tbt_p50=False) for n, c in CONFIGS.items()}
    assert s["v1 recompute"]["preemptions_recompute"] > 0
    assert s["v0 swap"]["preemptions_swap"] > 0
    assert s["v0 swap fallback"]["swap_full_fallbacks"] > 0


def test_summary_replay_builds_no_step_tables(conv, monkeypatch):
    def no_frames(*a, **k):
        raise AssertionError("a summary replay built a per-step frame")
    monkeypatch.setattr(tables, "chunk_frame", no_frames)
    monkeypatch.setattr(tables, "SpilledTable", no_frames)
    held = []
    from replay.engine import compiled
    real = compiled._Drain._hold
    monkeypatch.setattr(compiled._Drain, "_hold", lambda self, *a: held.append(1) or real(self, *a))
    res = replay(conv, CONFIGS["v1 recompute"], summary=SummarySpec())
    assert not held                                     # no chunk kept by the core's drain
    assert res.steps.height > 10_000 and not hasattr(res.steps, "to_numpy")
    with pytest.raises(AttributeError):
        res.steps.filter                                # rows are not there: loud, no guess
    assert res.run["num_steps"] == res.steps.height


@pytest.mark.parametrize("seed", range(3))
def test_top_weight_quantile_is_exact(seed):
    rng = np.random.default_rng(seed)
    v = np.round(rng.lognormal(-4, 1, 30_000), 3)               # ties
    w = rng.integers(0, 40, len(v))
    for q in (0.9, 0.99, 0.999):
        top = _TopWeight(tail_weight(q, int(w.sum()) + 17))      # a bound above the total
        for part in np.array_split(np.arange(len(v)), 9):
            top.add(v[part], w[part])
        assert top.quantile(q, int(w.sum())) == nearest_rank(v, q, w)
        assert len(top.v) < len(v) // 5


def test_planner_map_equals_full_tables_and_memoizes(conv):
    jobs = [Job(trace=conv, config=c, label=f"map {n}") for n, c in CONFIGS.items()]
    p = Planner(workers=2)
    score = score_reducer(budget=Budget(), **SLO)
    got = p.map(jobs, score)
    for job, (cand, st) in zip(jobs, got):
        t = replay(conv, job.config).tables()
        assert cand == evaluate(t, budget=Budget(), **SLO) and st == stability(t)
    assert len(p.reduced) == len(jobs) and not p.runs             # no tables kept
    calls = []
    p2_progress = type("P", (), {"planned": lambda s, n: calls.append(n),
                                 "replayed": lambda s, label: None})()
    with planner_mod.reporting(p2_progress):
        assert p.map(jobs, score) == got                          # memo: no replay
        sums = p.map(jobs[:2], summary_reducer(**SLO))             # another reducer: replays
    assert calls == [2]
    _same_summary(sums[0], summary(replay(conv, jobs[0].config).tables(), **SLO))


def test_map_reduces_a_full_replay_in_place(conv):
    p = Planner(workers=1)
    job = Job(trace=conv, config=CONFIGS["v1 roomy"], label="baseline")
    full = p.run([job])[0]
    red = functools.partial(planner_mod.summarize, slo_ttft_s=1.0)
    assert p.map([job], red)[0] == summary(full.tables(), slo_ttft_s=1.0)
    assert not p.reduced                                           # no second replay


def test_map_shared_reuses_an_unfilled_max_num_seqs(conv):
    base = CONFIGS["v1 roomy"]
    jobs = [Job(trace=conv, config=dataclasses.replace(base, max_num_seqs=s), label=f"seqs {s}")
            for s in (512, 1024, 8)]
    p = Planner(workers=2)
    reds = [score_reducer(budget=Budget(), config=None, **SLO) for _ in jobs]
    got = p.map_shared(jobs, reds)
    full = Planner(workers=1).run_shared(jobs)
    assert [c for c, _ in got] == [evaluate(r.tables(), budget=Budget(), **SLO) for r in full]
    assert len(p.reduced) == 2          # 8 and 512 replayed; 1024 reuses 512 (never filled)


def test_reducer_must_be_picklable(conv):
    with pytest.raises(ValueError, match="module-level"):
        Planner(workers=1).map([Job(trace=conv, config=EngineConfig(), label="x")],
                               lambda t: t["requests"].height)


def test_summary_replay_refuses_what_it_cannot_keep(conv):
    with pytest.raises(ValueError, match="summary replay"):
        replay(conv, EngineConfig(), summary=SummarySpec(), record_batches=True)
    lean = replay(conv, EngineConfig(), summary=SummarySpec(tbt_quantiles=(0.99,))).tables()
    with pytest.raises(KeyError, match="tbt_quantiles"):
        summary(lean)                                       # the median was not kept
    with pytest.raises(KeyError):
        classify(lean, window_s=30.0)                       # nor this window
    assert isinstance(lean["requests"], pl.DataFrame)


def test_map_shared_names_each_candidate_after_its_own_config(conv):
    from replay.config import resolve
    base = CONFIGS["v1 roomy"]
    cfgs = [dataclasses.replace(base, max_num_seqs=s) for s in (512, 1024)]
    jobs = [Job(trace=conv, config=c, label=f"tune {c.max_num_seqs}") for c in cfgs]
    reds = [score_reducer(budget=Budget(), config=resolve(c), **SLO) for c in cfgs]
    got = [c for c, _ in Planner(workers=1).map_shared(jobs, reds)]
    full = replay(conv, cfgs[0]).tables()            # 1024 reuses 512's replay (never filled)
    assert got == [evaluate(full, budget=Budget(), config=resolve(c), **SLO) for c in cfgs]
    assert [c.max_num_seqs for c in got] == [512, 1024]


def test_reference_implementation_summary_replay(conv):
    trace, config = conv.head(150), CONFIGS["v0 swap"]
    full = replay(trace, config, implementation="reference").tables()
    lean = replay(trace, config, implementation="reference", summary=SummarySpec()).tables()
    assert lean["runs"]["implementation"][0] == "reference"
    _same_summary(summary(full, **SLO), summary(lean, **SLO))
    assert evaluate(full, budget=Budget(), **SLO) == evaluate(lean, budget=Budget(), **SLO)
