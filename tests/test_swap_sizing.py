"""Swap-space sizing: a hand-computed peak, and self-consistency on a real trace and on the flash
crowd (the recommended size never runs out; 25% below the measured peak does); "not needed" when
nothing swaps; no sizing from an overloaded run."""
from pathlib import Path

import polars as pl
import pytest

from capacity.analyses.planner import Planner
from capacity.analyses.sizing import demand_series, round_up_gib, size_swap
from replay.config import EngineConfig
from traces.loaders import load_trace
from traces.synth import synthesize

CONV = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
KIB = 1024


def tiny_trace(prompts, outputs, arrivals=None) -> pl.DataFrame:
    n = len(prompts)
    return pl.DataFrame({
        "request_id": list(range(n)), "arrival_s": arrivals or [0.0] * n,
        "prompt_tokens": pl.Series(prompts, dtype=pl.Int32),
        "output_tokens": pl.Series(outputs, dtype=pl.Int32),
        "priority": pl.Series([0] * n, dtype=pl.Int32), "tenant": pl.Series([None] * n, dtype=pl.Utf8),
        "prefix_hashes": pl.Series([None] * n, dtype=pl.List(pl.UInt64))})


def test_hand_computed_peak_of_the_S6b_story():
    """V0, blocks of 4 tokens, 3 GPU blocks, two prompts of 4 tokens (A: 4 outputs, B: 3).
    Step 1 prefills both (1 block each, 1 free). Step 2: A takes the free block for its 5th token;
    B then finds 0 free blocks (G/D1) and, as the tail, is swapped out holding exactly its one
    block. Nothing else is ever swapped, so the peak is 1 block = 4 tokens x 128 KiB (Llama-3.1-8B,
    bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes) = 512 KiB, one request."""
    cfg = EngineConfig(scheduler="v0", block_size=4, num_gpu_blocks_override=3, max_num_seqs=2,
                       max_num_batched_tokens=64, max_model_len=16)
    s = size_swap(tiny_trace([4, 4], [4, 3]), cfg, headroom=0.0, planner=Planner(workers=1))
    assert s.kv_bytes_per_block == 4 * 128 * KIB
    assert s.peak_swapped_blocks == 1 and s.peak_swapped_requests == 1
    assert s.peak_swapped_gib == 512 * KIB / 2 ** 30
    # (peak + 1 block for V0's swap-out check) rounded up to the next half GiB
    assert s.recommended_swap_space_gib == 0.5
    assert s.verify.status == "completed" and s.verify.swap_full_events == 0


def assert_self_consistent(s):
    assert s.peak_swapped_blocks > 0, "the setting must force swapping"
    assert s.verify.status == "completed" and s.verify.swap_full_events == 0
    abort, fallback = s.what_if
    assert abort.swap_space_gib == pytest.approx(0.75 * s.peak_swapped_gib)
    assert abort.status == "aborted" and abort.abort_s is not None
    assert fallback.status == "completed" and fallback.swap_full_fallbacks > 0


def test_real_trace_recommended_size_never_runs_out_and_75pct_does():
    trace = load_trace(CONV).head(2500)
    cfg = EngineConfig(scheduler="v0", num_gpu_blocks_override=1600, max_num_seqs=64)
    assert_self_consistent(size_swap(trace, cfg, planner=Planner(workers=1)))


def test_flash_crowd_recommended_size_never_runs_out_and_75pct_does():
    trace = synthesize("flash-crowd", duration_s=240, surge_start_s=60, hold_s=60, decay_s=30,
                       rate_rps=3.0)
    cfg = EngineConfig(scheduler="v0", num_gpu_blocks_override=1200, max_num_seqs=64)
    s = size_swap(trace, cfg, planner=Planner(workers=1))
    assert_self_consistent(s)
    # The peak sits at the surge, not in the base load before it.
    assert s.peak_at_s is not None and s.peak_at_s >= 60


def test_demand_series_fills_idle_seconds_and_rounding():
    steps = pl.DataFrame({"start_s": [0.2, 0.7, 3.1], "evicted_blocks": [1, 4, 2],
                          "evicted_requests": [1, 2, 1]})
    d = demand_series(steps, kv_bytes_per_block=2 ** 30)
    assert d["t_s"].to_list() == [0.0, 1.0, 2.0, 3.0]
    assert d["gib"].to_list() == [4.0, 0.0, 0.0, 2.0]
    assert round_up_gib(0.01) == 0.5 and round_up_gib(1.5) == 1.5 and round_up_gib(1.51) == 2.0


def test_not_needed_when_nothing_swaps_and_refused_when_overloaded():
    trace = load_trace(CONV).head(800)
    s = size_swap(trace, EngineConfig(scheduler="v0", num_gpu_blocks_override=3000),
                  planner=Planner(workers=1))
    assert not s.needed and s.verify is None and s.words().startswith("not needed")
    with pytest.raises(ValueError, match="overloaded"):
        size_swap(trace, EngineConfig(scheduler="v0", num_gpu_blocks_override=500),
                  planner=Planner(workers=1))


def test_demand_series_stays_small_for_a_trace_spanning_years():
    steps = pl.DataFrame({"start_s": [0.0, 5.0, 3.2e9], "evicted_blocks": [0, 7, 2],
                          "evicted_requests": [0, 2, 1]})
    s = demand_series(steps, 2 ** 20)
    assert s.height <= 3 * 3      # each second with steps and its two neighbours, not the span
    assert s["gib"].max() == 7 * 2 ** 20 / 2 ** 30 and s["t_s"].max() <= 3.2e9
