"""The size-offload recommendation is a pure function of the sweep's points: hand-checkable curves.

Each curve is (size GiB, prefill tokens the GPU computes, TTFT p99 s); the knee is the smallest
size within the tolerance of the fewest prefill tokens and of the lowest TTFT p99."""
from types import SimpleNamespace

import pytest

from capacity.analyses.offload import host_bounded_knee, host_ram_verdict, knee, nice_gib


def pts(*rows):
    return [SimpleNamespace(kv_offloading_size_gib=s, prefill_tokens=w, ttft_p99_s=t)
            for s, w, t in rows]


def test_saturating_curve_knee_is_the_first_size_within_tolerance():
    # fewest work 800 (at 64 GiB): within 5% is <= 840. 16 GiB (850) is not, 32 GiB (830) is;
    # TTFT best 1.00 s: 32 GiB's 1.04 s is within 5% (<= 1.05).
    k = knee(pts((0, 1000, 2.0), (8, 900, 1.5), (16, 850, 1.2), (32, 830, 1.04), (64, 800, 1.0)),
             0.05)
    assert (k.index, k.size_gib, k.within_both) == (3, 32, True)
    # A looser tolerance moves the knee down: 10% -> work <= 880 and TTFT <= 1.10 s: 16 GiB's
    # 850 passes work but 1.2 s fails TTFT; 32 GiB again. 25%: work <= 1000, TTFT <= 1.25: 16 GiB.
    assert knee(pts((0, 1000, 2.0), (16, 850, 1.2), (32, 830, 1.04), (64, 800, 1.0)), 0.10).size_gib == 32
    assert knee(pts((0, 1000, 2.0), (16, 850, 1.2), (32, 830, 1.04), (64, 800, 1.0)), 0.25).size_gib == 16


def test_tier_that_saves_under_the_tolerance_recommends_none():
    k = knee(pts((0, 1000, 1.00), (8, 990, 0.99), (16, 980, 0.985)), 0.05)
    assert (k.index, k.size_gib) == (0, 0)
    assert "no swept size" in k.reason


def test_order_of_the_points_does_not_matter_and_index_is_into_the_sorted_sweep():
    rows = [(64, 800, 1.0), (0, 1000, 2.0), (32, 830, 1.04), (16, 850, 1.2)]
    k = knee(pts(*rows), 0.05)
    assert (k.index, k.size_gib) == (2, 32)


def test_ttft_guard_keeps_a_size_whose_work_is_fine_but_latency_is_not():
    # Work is flat from 8 GiB on (all within 5%), but TTFT p99 only drops at 32 GiB.
    k = knee(pts((0, 2000, 3.0), (8, 1000, 2.0), (16, 1000, 1.8), (32, 1000, 1.0)), 0.05)
    assert k.size_gib == 32 and k.within_both


def test_when_no_size_is_within_tolerance_on_both_the_work_criterion_decides_and_says_so():
    # Lowest work at 32 GiB, lowest TTFT at 8 GiB with much more work: no point passes both.
    k = knee(pts((0, 2000, 3.0), (8, 1800, 1.0), (32, 1000, 2.0)), 0.05)
    assert (k.size_gib, k.within_both) == (32, False)
    assert "no size is also within 5%" in k.reason


def test_missing_ttft_everywhere_uses_work_alone():
    k = knee(pts((0, 1000, None), (4, 500, None), (8, 490, None)), 0.05)
    assert k.size_gib == 4 and k.within_both


def test_zero_tolerance_takes_the_exact_best():
    k = knee(pts((0, 1000, 2.0), (16, 800, 1.0), (32, 800, 1.0)), 0.0)
    assert k.size_gib == 16


@pytest.mark.parametrize("tol", [-0.1, 1.0, float("nan")])
def test_bad_tolerance_is_refused(tol):
    with pytest.raises(ValueError, match="--tolerance"):
        knee(pts((0, 1, 1.0)), tol)


def test_nice_sizes_and_host_ram_verdict():
    assert nice_gib(27.3) == 28 and nice_gib(55.0) == 55 and nice_gib(0.123) == 0.13
    assert nice_gib(110.2) == 120 and nice_gib(0) == 0
    gib = 2 ** 30
    # 256 GiB host: warn above 102.4 GiB, error above 179.2 GiB.
    assert host_ram_verdict(100 * gib, 256) == "ok"
    assert host_ram_verdict(103 * gib, 256) == "warn"
    assert host_ram_verdict(180 * gib, 256) == "error"
    assert host_ram_verdict(180 * gib, None) is None


def test_a_knee_the_host_cannot_pin_is_not_recommended():
    # The whole curve's knee is 64 GiB, but the host can pin up to 16 GiB ("error" above): the
    # knee is taken among 0-16 (best there 850; 16 is the only size within 5%), and the answer
    # names the 64-GiB knee it could not reach.
    verdict = {0: "ok", 8: "ok", 16: "warn", 32: "error", 64: "error"}
    rows = [SimpleNamespace(kv_offloading_size_gib=s, prefill_tokens=w, ttft_p99_s=t,
                            host_ram_verdict=verdict[s], host_ram_gib=float(s))
            for s, w, t in ((0, 1000, 2.0), (8, 900, 1.5), (16, 850, 1.2), (32, 830, 1.04),
                            (64, 800, 1.0))]
    assert knee(rows, 0.05).size_gib == 32
    k = host_bounded_knee(rows, 0.05)
    assert (k.size_gib, k.index, k.unconstrained_gib) == (16, 2, 32)
    assert "32 GiB" in k.reason and "up to 16 GiB" in k.reason
    # A knee that fits is returned as is.
    verdict[32] = "warn"
    rows[3].host_ram_verdict = "warn"
    assert host_bounded_knee(rows, 0.05) == knee(rows, 0.05)


def test_no_swept_size_is_below_one_offload_chunk():
    """Found off the corpus: Qwen3-32B on 2 B200s with prefix caching off kept its knee at the
    smallest size, and the sweep halved 2.4 GiB eight times to 0.011 GiB, under one 16 MiB
    chunk: the engine refused that size and `kvcap report` and `plan` died on it."""
    import polars as pl

    from capacity.analyses.offload import default_sizes, offload_config, smallest_tier_gib
    from replay.config import EngineConfig, resolve
    b200 = EngineConfig(model="qwen3-32b", gpu="b200", tensor_parallel_size=2,
                        num_gpu_blocks_override=2500)
    least = smallest_tier_gib(b200)
    assert least == 16 * 2**20 / 2**30                  # 64 tokens x 256 KiB, both ranks
    assert resolve(offload_config(b200, least)).num_cpu_blocks == 1
    with pytest.raises(ValueError, match="holds no offload chunk"):
        offload_config(b200, least * 0.7)
    # A pool of 8 blocks (8 chunks of both ranks): 1/16 of it holds no chunk, so it is not swept;
    # the sweep starts at 1/8, one chunk.
    tiny = EngineConfig(model="qwen3-32b", gpu="b200", tensor_parallel_size=2,
                        num_gpu_blocks_override=8)
    trace = pl.DataFrame({"prompt_tokens": [100_000]})
    sizes = default_sizes(trace, tiny)
    assert sizes and min(sizes) >= smallest_tier_gib(tiny)
    assert sizes[0] == nice_gib(8 * 8 * 2**20 * 2 / 2**30 / 8)
