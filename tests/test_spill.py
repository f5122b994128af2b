"""Issue 13 item 7 (memory bounded by the work): a long compiled run spills its step and TBT
columns to files (replay/engine/raw.py ColumnSpill) that the store inserts in batches; the tables, the
stored rows and the summary are the same as without spilling, and the files go with the run."""
from __future__ import annotations

import gc
import os

import numpy as np
import polars as pl
import pytest

from capacity.analyses.metrics import nearest_rank, nearest_rank_chunked, summary
from replay.config import EngineConfig
from replay.engine import compiled
from replay.results.store import read_table, write_run
from replay.results.tables import SpilledTable
from replay.run import replay
from traces.synth import synthesize


@pytest.mark.parametrize("seed", range(4))
def test_chunked_nearest_rank_is_the_in_memory_one(seed):
    rng = np.random.default_rng(seed)
    v = np.round(rng.lognormal(-4, 1, 20_000), 3 + seed)       # many ties (rounded)
    w = rng.integers(1, 50, len(v))
    parts = np.array_split(np.arange(len(v)), 7)
    chunks = lambda: ((v[i], w[i]) for i in parts)               # noqa: E731
    for q in (0.001, 0.5, 0.9, 0.99, 1.0):
        # A limit far below the sample count forces the histogram narrowing passes.
        assert nearest_rank_chunked(chunks, q, limit=50, bins=16) == nearest_rank(v, q, w), q
    assert nearest_rank_chunked(lambda: iter(()), 0.5) is None


def _frame(t) -> pl.DataFrame:
    return t.frame() if isinstance(t, SpilledTable) else t


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_spilled_run_equals_the_in_memory_one(tmp_path, monkeypatch, scheduler):
    trace = synthesize("poisson", duration_s=120, rate_rps=8, seed=3)
    # A small KV pool: preemptions, so events and stalls are spread over several spills.
    config = EngineConfig(scheduler=scheduler, num_gpu_blocks_override=300, max_num_seqs=64)
    whole = replay(trace, config, record_batches=True)
    monkeypatch.setattr(compiled, "SPILL_EVERY_STEPS", 97)
    spilled = replay(trace, config, spill_dir=str(tmp_path), record_batches=True)
    assert isinstance(spilled.steps, SpilledTable) and isinstance(spilled.tbt, SpilledTable)
    assert spilled.steps.height == whole.steps.height > 3 * 97
    assert whole.events.height > 0
    a, b = whole.tables(), spilled.tables()
    for name in ("requests", "steps", "events", "stalls", "tbt", "batches"):
        assert _frame(b[name]).equals(a[name]), name
    assert spilled.steps["gpu_blocks_used"].max() == whole.steps["gpu_blocks_used"].max()
    sa, sb = summary(a), summary(b)
    assert {k: v for k, v in sb.items() if k != "wall_seconds"} == \
        {k: v for k, v in sa.items() if k != "wall_seconds"}
    write_run(tmp_path / "a.duckdb", a)
    write_run(tmp_path / "b.duckdb", b)
    for name in ("steps", "tbt", "events", "requests", "batches"):
        ra, rb = (read_table(tmp_path / f, name).sort(pl.all()) for f in ("a.duckdb", "b.duckdb"))
        assert rb.equals(ra), name
    folders = [spilled.steps.spill.dir, spilled.tbt.spill.dir]
    assert all(os.path.isdir(f) for f in folders)
    del spilled, b
    gc.collect()
    assert not any(os.path.exists(f) for f in folders)
