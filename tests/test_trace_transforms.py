"""Transforms keep the trace canonical and do what they say."""
from __future__ import annotations

import polars as pl
import pytest

from traces import transforms as tf
from traces.schema import SCHEMA, TraceError
from traces.synth import synthesize


@pytest.fixture(scope="module")
def trace() -> pl.DataFrame:
    return synthesize("poisson", rate_rps=10, duration_s=600, seed=3)


def test_scale_rate_compresses_time(trace):
    fast = tf.scale_rate(trace, 2.0)
    assert fast["arrival_s"].to_list() == [t / 2 for t in trace["arrival_s"].to_list()]
    assert fast.drop("arrival_s").equals(trace.drop("arrival_s"))
    with pytest.raises(TraceError):
        tf.scale_rate(trace, 0)


def test_time_window_is_rebased(trace):
    w = tf.time_window(trace, 100.0, 200.0)
    inside = trace.filter((pl.col("arrival_s") >= 100) & (pl.col("arrival_s") < 200))
    assert w["request_id"].to_list() == inside["request_id"].to_list()
    assert w["arrival_s"][0] == 0.0
    assert w["arrival_s"].to_list() == pytest.approx((inside["arrival_s"] - inside["arrival_s"][0]).to_list())
    with pytest.raises(TraceError, match="no requests"):
        tf.time_window(trace, 1e6, 2e6)


def test_overlay_surge_doubles_the_window_deterministically(trace):
    out = tf.overlay_surge(trace, start_s=300, duration_s=60, extra_factor=1.0, seed=7, tenant="surge")
    assert out.schema == pl.Schema(SCHEMA)
    assert out["arrival_s"].is_sorted() and out["request_id"].n_unique() == len(out)
    n_window = trace.filter(pl.col("arrival_s").is_between(300, 360, closed="left")).height
    extra = out.filter(pl.col("tenant") == "surge")
    assert len(extra) == n_window
    assert extra["arrival_s"].min() >= 300 and extra["arrival_s"].max() < 360
    assert extra["request_id"].min() == trace["request_id"].max() + 1
    # originals are untouched and extra lengths come from the window
    original = out.filter(pl.col("tenant").is_null())
    assert original.equals(trace)
    window_prompts = set(trace.filter(pl.col("arrival_s").is_between(300, 360, closed="left"))["prompt_tokens"])
    assert set(extra["prompt_tokens"]) <= window_prompts
    again = tf.overlay_surge(trace, start_s=300, duration_s=60, extra_factor=1.0, seed=7, tenant="surge")
    assert out.equals(again)


def test_priority_from_column():
    df = synthesize("priority-mix", duration_s=300)
    out = tf.priority_from_column(df, "tenant", {"batch": 5}, default=0)
    assert (out.filter(pl.col("tenant") == "batch")["priority"] == 5).all()
    assert (out.filter(pl.col("tenant") == "interactive")["priority"] == 0).all()
    assert out.schema == pl.Schema(SCHEMA)


def test_priority_by_length_classes(trace):
    out = tf.priority_by_length(trace, prompt_tokens_at_least=[1000, 3000], priorities=[0, 1, 2],
                                tenants=["short", "medium", "long"])
    expected = (pl.when(pl.col("prompt_tokens") >= 3000).then(2)
                .when(pl.col("prompt_tokens") >= 1000).then(1).otherwise(0))
    assert out["priority"].to_list() == trace.select(expected.alias("p"))["p"].to_list()
    assert set(out["tenant"]) == {"short", "medium", "long"}
    assert out.schema == pl.Schema(SCHEMA)
    with pytest.raises(TraceError):
        tf.priority_by_length(trace, prompt_tokens_at_least=[1000], priorities=[0])


def test_priority_random_share_is_exact_and_seeded(trace):
    out = tf.priority_random_share(trace, share=0.25, priority=3, tenant="batch", seed=1)
    chosen = out.filter(pl.col("priority") == 3)
    assert len(chosen) == round(0.25 * len(trace))
    assert (chosen["tenant"] == "batch").all()
    assert out.equals(tf.priority_random_share(trace, share=0.25, priority=3, tenant="batch", seed=1))
    assert not out.equals(tf.priority_random_share(trace, share=0.25, priority=3, tenant="batch", seed=2))
