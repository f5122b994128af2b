"""capacity.views.notebook: the notebook helpers (replay-or-reuse, tables, aggregated charts)."""
import dataclasses

import polars as pl
import pytest

from capacity.views import notebook as nbviews
from capacity.views.charts import MAX_ROWS, chart_rows
from replay.config import EngineConfig
from replay.run import replay
from traces.stats import trace_info
from traces.synth import synthesize

SMALL = {"duration_s": 60, "rate_rps": 4.0, "surge_start_s": 20, "ramp_s": 5, "hold_s": 15,
         "decay_s": 10}


@pytest.fixture(scope="module")
def trace():
    return nbviews.notebook_trace(scenario_params=SMALL)


@pytest.fixture(scope="module")
def config():
    return EngineConfig(num_gpu_blocks_override=600, block_size=16)


def test_notebook_trace_is_the_scenario_or_a_window_of_it(trace, tmp_path):
    assert trace.equals(synthesize("flash-crowd", **SMALL))
    cut = nbviews.notebook_trace(scenario_params=SMALL, window_s=[10, 30])
    assert cut["arrival_s"].min() == 0.0 and cut["arrival_s"].max() < 20.0
    path = tmp_path / "t.csv"
    trace.select("arrival_s", "prompt_tokens", "output_tokens").write_csv(path)
    assert nbviews.notebook_trace(str(path)).height == trace.height


def test_run_id_for_is_the_id_replay_gives(trace, config):
    assert nbviews.run_id_for(trace, config) == replay(trace, config).run_id


def test_cached_replay_stores_once_and_reads_back(trace, config, tmp_path, monkeypatch):
    db = tmp_path / "nb.duckdb"
    assert nbviews.runs_table(db).height == 0
    first = nbviews.cached_replay(db, trace, config, label="x")
    calls = []
    monkeypatch.setattr(nbviews, "replay", lambda *a, **k: calls.append(1))
    again = nbviews.cached_replay(db, trace, config, label="x")
    assert calls == []                                  # read back, not replayed
    assert again["runs"]["run_id"][0] == first["runs"]["run_id"][0]
    for t in ("requests", "steps", "events", "stalls", "tbt"):
        assert again[t].height == first[t].height
    assert nbviews.runs_table(db).height == 1


def test_store_runs_writes_every_run(trace, config, tmp_path):
    runs = [replay(trace, config, label="a"),
            replay(trace, EngineConfig(num_gpu_blocks_override=900, block_size=16), label="b")]
    out = nbviews.store_runs(tmp_path / "s.duckdb", runs)
    assert out["label"].to_list() == ["a", "b"]
    assert set(nbviews.stored_run_ids(tmp_path / "s.duckdb")) == set(out["run_id"])


@dataclasses.dataclass(frozen=True)
class _Point:
    x: float = 0.1
    y: int | None = None


def test_kv_table_flattens_dicts_and_dataclasses():
    t = nbviews.kv_table({"a": 1.23456, "b": {"c": None}, "d": _Point(), "skip": [1, 2]})
    assert dict(t.iter_rows()) == {"a": "1.235", "b.c": "-", "d.x": "0.1", "d.y": "-"}
    # Shown as plain text in a notebook: no quoted strings, no dtype row.
    shown = t._repr_html_()
    assert "<td>1.235</td>" in shown and "&quot;" not in shown and "str" not in shown


def test_trace_and_prefix_tables(trace):
    info = trace_info(trace)
    assert nbviews.trace_table(info)["metric"].to_list() == list(nbviews.TRACE_KEYS)
    assert "no prefix hashes" in nbviews.prefix_table(info)["value"][0]
    hashed = trace.with_columns(prefix_hashes=pl.lit([1, 2], dtype=pl.List(pl.UInt64)))
    assert "refs_seen_pct" in nbviews.prefix_table(trace_info(hashed))["metric"].to_list()


def test_trace_charts_are_aggregated(trace):
    long = nbviews.notebook_trace(scenario="poisson", scenario_params={"duration_s": 20000, "rate_rps": 1})
    frame, bin_s = nbviews.arrivals_frame(long)
    assert frame.height <= MAX_ROWS and bin_s > 1
    assert frame["rps"].sum() * bin_s == pytest.approx(long.height)
    by = nbviews.arrivals_frame(synthesize("priority-mix", duration_s=120, rate_rps=2, batch_job_interval_s=20),
                               by="tenant")[0]
    assert set(by["tenant"]) == {"interactive", "batch"}
    lengths = nbviews.lengths_frame(trace)
    assert lengths.group_by("length").agg(pl.col("requests").sum())["requests"].to_list() == [trace.height] * 2
    for chart in (nbviews.arrivals_chart(trace), nbviews.arrivals_chart(long),
                  nbviews.lengths_chart(trace)):
        assert chart_rows(chart) <= MAX_ROWS


def test_stall_chart_lines_up_stalls_and_steps(trace, config):
    tables = replay(trace, config).tables()
    steps, stalls, _ = nbviews.stall_frames(tables, 0.1)
    assert stalls["stalls"].sum() == tables["stalls"].height > 0
    assert steps["step_s"].max() == tables["steps"].filter(pl.col("num_decode_tokens") > 0)["duration_s"].max()
    assert chart_rows(nbviews.stalls_chart(tables, 0.1)) <= MAX_ROWS


def test_analysis_charts_build(trace, config):
    from capacity.analyses.headroom import headroom
    from capacity.analyses.priority import interference
    from capacity.analyses.criteria import Budget
    from capacity.analyses.planner import Planner
    from capacity.analyses.tuning import tune
    planner = Planner(workers=1)
    tu = tune(trace, config, max_num_seqs_grid=[16, 64], slo_ttft_p99_s=2, slo_tbt_p99_s=0.2, planner=planner)
    hr = headroom(trace, config, planner, slo_ttft_p99_s=2, slo_tbt_p99_s=0.2, budget=Budget(peak_only=False))
    mix = synthesize("priority-mix", duration_s=60, rate_rps=2, batch_job_interval_s=20,
                     batch_job_requests=20)
    inter = interference(mix, config, planner=planner)
    for chart in (nbviews.tuning_chart(tu), nbviews.headroom_chart(hr), nbviews.priority_chart(inter)):
        assert chart.to_dict() and chart_rows(chart) <= MAX_ROWS


def test_evidence_views(tmp_path, trace):
    from pathlib import Path

    from capacity.evidence.logs import ingest, read_evidence
    from capacity.evidence.validate import validate
    logs = Path(__file__).parent / "data" / "logs"
    db = tmp_path / "ev.duckdb"
    res, _, _ = ingest([logs / "v0_server.log", logs / "bench_v0.json"], db, year=2025)
    assert nbviews.ingested_table(res)["source_file"].to_list() == ["v0_server.log", "bench_v0.json"]
    stats = read_evidence(db, "log_stats")["log_stats"]
    assert nbviews.log_stats_chart(stats, "v0_server.log").to_dict()
    cfg = EngineConfig(scheduler="v0", num_gpu_blocks_override=2048)
    tables = nbviews.cached_replay(db, trace, cfg)
    v = validate(db, tables["runs"]["run_id"][0], source="v0_server.log", client="bench_v0.json")
    t = nbviews.validation_table(v)
    assert {"running", "ttft_p99_s"} <= set(t["metric"])
    assert nbviews.validation_chart(v).to_dict()
