"""Guards for the V1 speed work: on a few hundred real requests (Azure conv and Mooncake, with the
Mooncake prefix hashes) the compiled core and the Python reference give identical result tables,
with the default pool and with one small enough to preempt, evict cached blocks and re-hit them
(recompute, and with CPU KV offloading). Optionally, tables saved by an older build under $KVCAP_BASELINE_DIR
(`bench/bench_replay.py --save-baseline DIR`) must be reproduced exactly."""
from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from replay.config import EngineConfig
from replay.run import replay

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv", "mooncake": "conversation_trace.jsonl"}
TABLES = ("requests", "steps", "events", "stalls", "tbt")

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces not present")


def head(name: str, n: int) -> pl.DataFrame:
    from traces.loaders import load_trace
    return load_trace(SHARED / TRACES[name]).head(n)


def assert_same_tables(a, b) -> None:
    """Identical tables (TBT compared as the multiset of samples the metrics read)."""
    assert a.run_id == b.run_id
    assert a.run["num_steps"] == b.run["num_steps"]
    for t in TABLES[:-1]:
        assert_frame_equal(getattr(a, t), getattr(b, t), check_exact=True)
    expand = [pl.col("tbt_s").repeat_by("weight").explode().sort()]
    assert_frame_equal(a.tbt.select(expand), b.tbt.select(expand), check_exact=True)


# A pool a few requests wide (per trace): preemption, LRU eviction of cached blocks and re-hits
# of a preempted request's own blocks.
SMALL_POOL = {"conv": 400, "mooncake": 2000}
CONFIGS = {
    "default": lambda trace: EngineConfig(),
    "small": lambda trace: EngineConfig(num_gpu_blocks_override=SMALL_POOL[trace]),
    # V1's host tier: CPU KV offloading (4 GiB: 2,048 chunks of one 2-MiB block).
    "small-offload": lambda trace: EngineConfig(num_gpu_blocks_override=SMALL_POOL[trace],
                                                kv_offloading_size=4),
}


@needs_shared
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("trace", TRACES)
def test_compiled_equals_reference_on_real_requests(trace, cfg):
    t = head(trace, 300)
    config = CONFIGS[cfg](trace)
    fast = replay(t, config, implementation="compiled")
    slow = replay(t, config, implementation="reference")
    assert_same_tables(fast, slow)
    if cfg != "default":
        assert fast.requests["num_preemptions"].sum() > 0, "the small pool should preempt"


@needs_shared
@pytest.mark.parametrize("trace", TRACES)
def test_matches_saved_baseline(trace):
    base = os.environ.get("KVCAP_BASELINE_DIR")
    if not base or not (Path(base) / f"{trace}.requests.parquet").exists():
        pytest.skip("no baseline tables (set KVCAP_BASELINE_DIR)")
    r = replay(head(trace, 3000), EngineConfig())
    for t in TABLES:
        assert_frame_equal(getattr(r, t), pl.read_parquet(Path(base) / f"{trace}.{t}.parquet"),
                           check_exact=True)
