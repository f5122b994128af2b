"""`trace_info` reproduces ../shared/traces/README.md exactly (nearest-rank percentiles, minute bins
aligned to the first request, sliding 60 s windows, Mooncake prefix reuse)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from traces.loaders import load_trace
from traces.stats import nearest_rank, trace_info

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")

# (requests, duration_s to 0.1, prompt mean/p50/p90/p99/max/min, output mean/p50/p90/p99/max/min,
#  mean req/min to 0.1, peak req/min, its minute, sliding 60 s, peak req/s, peak tokens in a minute)
README = {
    "AzureLLMInferenceTrace_code.csv": (8819, 3435.9, (2047.8, 1469, 5194, 7436, 7437, 3),
                                        (27.9, 13, 55, 252, 1899, 6), 152.1, 632, 14, 723, 67, 1_344_551),
    "AzureLLMInferenceTrace_conv.csv": (19366, 3501.7, (1154.7, 1020, 2735, 4142, 14050, 2),
                                        (211.1, 129, 424, 601, 1000, 7), 328.2, 507, 31, 522, 16, 800_837),
    "conversation_trace.jsonl": (12031, 3537.0, (12035.1, 6909, 27367, 85401, 126195, 891),
                                 (342.6, 350, 597, 1120, 2000, 1), 203.9, 247, 36, 260, 28, 3_212_938),
}


@pytest.fixture(scope="module", params=sorted(README))
def case(request):
    return README[request.param], trace_info(load_trace(SHARED / request.param))


def test_counts_and_duration(case):
    (n, dur, *_), info = case
    assert info["requests"] == n
    assert round(info["duration_s"], 1) == dur


@pytest.mark.parametrize("key,idx", [("prompt_tokens", 2), ("output_tokens", 3)])
def test_length_percentiles(case, key, idx):
    expected, info = case
    mean, p50, p90, p99, mx, mn = expected[idx]
    got = info[key]
    assert round(got["mean"], 1) == mean
    assert (got["p50"], got["p90"], got["p99"], got["max"], got["min"]) == (p50, p90, p99, mx, mn)


def test_rates_and_peaks(case):
    (*_, mean_rpm, peak_rpm, minute, sliding, peak_rps, peak_tokens), info = case
    assert round(info["mean_rpm"], 1) == mean_rpm
    assert (info["peak_rpm"], info["peak_rpm_minute"]) == (peak_rpm, minute)
    assert info["peak_60s"] == sliding
    assert info["peak_rps"] == peak_rps
    assert info["peak_tokens_per_min"] == peak_tokens
    assert info["mean_rps"] == pytest.approx(info["requests"] / info["duration_s"])


def test_mooncake_prefix_reuse():
    p = trace_info(load_trace(SHARED / "conversation_trace.jsonl"))["prefix"]
    assert (p["block_refs"], p["unique_blocks"]) == (288_500, 182_790)
    assert round(p["refs_seen_pct"], 1) == 36.6
    assert round(p["prefix_covered_pct"], 1) == 37.4


def test_azure_has_no_prefix_figures():
    assert trace_info(load_trace(SHARED / "AzureLLMInferenceTrace_conv.csv"))["prefix"] is None


def test_nearest_rank_definition():
    v = np.arange(1, 11)
    assert [nearest_rank(v, p) for p in (10, 50, 90, 99, 100)] == [1, 5, 9, 10, 10]


def test_prefix_covered_counts_only_the_leading_run():
    df = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [1024, 1100],
                       "output_tokens": [1, 1], "priority": [0, 0], "tenant": [None, None],
                       "prefix_hashes": [[1, 2], [1, 9, 2]]},
                      schema_overrides={"prefix_hashes": pl.List(pl.UInt64), "tenant": pl.Utf8})
    p = trace_info(df)["prefix"]
    # request 1: block 1 seen (512 tokens), block 9 new -> stop; block 2 seen but not leading.
    assert p["block_refs"] == 5 and p["unique_blocks"] == 3
    assert p["refs_seen_pct"] == pytest.approx(40.0)
    assert p["prefix_covered_pct"] == pytest.approx(100 * 512 / 2124)
