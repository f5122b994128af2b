"""A what-if the plan dismisses says which rule dismissed it, on which objective: the relative
gain sat beside the TTFT numbers as "gain 24.0%" while the verdict said "changes nothing that
matters" (the LCF victim on the default scenario: tax 0.3% -> 0.2%, a quarter lower, but a tenth
of a point)."""
from __future__ import annotations

from capacity.analyses.modes import ModeResult
from capacity.analyses.noise import Noise
from capacity.analyses.whatifs import _judge


def _mode(*, tax: float, ttft_s: float) -> ModeResult:
    return ModeResult(variant="v", run_id="r", status="ok", abort_s=None, preemptions=5,
                      preempted_requests=5, recomputed_tokens=int(tax * 100_000),
                      prefill_tokens=100_000, recomputed_share=tax, swapped_gib=0.0,
                      offloaded_gib=0.0, host_tier_gib=0.0, cpu_hit_tokens=0, host_link_s=0.0,
                      ttft_p99_s=ttft_s, tbt_p99_s=0.1, ttft_p99_preempted_s=None,
                      max_tbt_p99_preempted_s=None, high_priority_ttft_p99_s=None,
                      throughput_rps=10.0, output_tokens_per_s=100.0, swap_full_fallbacks=0,
                      meets_slo=True)


NOISE = Noise(seeds=3, floor=0.02, precision=0.05,
              spread={"recomputed_share": 0.12, "ttft_p99_s": 0.12}, values={}, run_ids=())


def test_a_tax_cut_above_the_noise_but_under_a_point_says_so():
    w = _judge("preemption_victim", "lcf", False, "recomputed_share",
               _mode(tax=0.0033, ttft_s=7.71), _mode(tax=0.0025, ttft_s=7.67), NOISE)
    assert not w.significant and w.gain > w.threshold
    assert "changes nothing that matters" in w.words
    assert "recompute tax 24% lower, above the noise (12%), but by 0.1 points" in w.words
    assert "a finding needs 1 point or more)" in w.words and "gain " not in w.words


def test_a_gain_within_the_noise_names_its_objective():
    w = _judge("cache_aware_admission_window", 32, True, "ttft_p99_s",
               _mode(tax=0.01, ttft_s=8.0), _mode(tax=0.01, ttft_s=7.6), NOISE)
    assert not w.significant
    assert w.words.endswith("(TTFT p99 5.0% better, within the noise (12%))")


def test_a_significant_cut_is_advice_with_its_numbers():
    w = _judge("preemption_victim", "lcf", False, "recomputed_share",
               _mode(tax=0.10, ttft_s=8.0), _mode(tax=0.05, ttft_s=7.0), NOISE)
    assert w.significant
    assert "would cut the recompute tax by 50%, above the noise (12%)" in w.words
