"""The analytic cost model against hand-computed values (docs/cost-model.md)."""
import numpy as np
import pytest
from dataclasses import replace

from replay.engine.plan import StepPlan
from replay.timing.cost_model import CostConstants, CostModel, ModelShape

# Round numbers so every term can be worked out on paper.
SHAPE = ModelShape(num_layers=2, hidden_size=100, num_attention_heads=4, head_dim=25,
                   vocab_size=1000, num_layer_params=1_000_000, weight_bytes=2_000_000)
CONST = CostConstants(flops_per_s=1e12, hbm_bytes_per_s=1e9, host_link_bytes_per_s=1e8,
                      interconnect_bytes_per_s=1e10, compute_efficiency=0.5,
                      memory_efficiency=0.5, overhead_s=0.001, allreduce_latency_s=1e-5)


def model(tp=1):
    return CostModel(shape=SHAPE, constants=CONST, tp=tp, kv_bytes_per_token=1000,
                     kv_bytes_per_block=16_000)


def plan(new, ctx, *, prefill=None, swap_out=0, swap_in=0):
    new, ctx = np.array(new), np.array(ctx)
    return StepPlan(rows=np.arange(len(new)), num_new_tokens=new, num_computed_tokens=ctx,
                    is_prefill=np.array(prefill if prefill is not None else new > 1),
                    swap_out=np.zeros((swap_out, 2), np.int64), swap_in=np.zeros((swap_in, 2), np.int64))


def test_decode_step_is_memory_bound_by_hand():
    # 2 decodes with contexts 100 and 300.
    # compute: linear 2*1e6*2 = 4e6; lm_head 2*100*1000*2 = 4e5; attention 4*2*4*25 * (100+1+300+1) = 321,600
    #          (4e6 + 4e5 + 321600) / (1e12 * 0.5) = 9.4432e-6 s
    # memory:  (2e6 + 1000 * (400 + 2)) / (1e9 * 0.5) = 2.402e6 / 5e8 = 4.804e-3 s
    got = model().step_s(plan([1, 1], [100, 300]), num_sampled=2)
    assert got == pytest.approx(0.001 + 4.804e-3, rel=1e-12)


def test_prefill_step_is_compute_bound_by_hand():
    # one prefill chunk of 1000 new tokens after 24 cached ones, sampling at the end.
    # linear 2e6*1000 = 2e9; lm_head 2e5; attention 800*(1000*24 + 1000*1001/2) = 800*524,500 = 4.196e8
    # compute (2e9 + 2e5 + 4.196e8)/5e11 = 4.8396e-3; memory (2e6 + 1000*1024)/5e8 = 6.048e-3
    got = model().step_s(plan([1000], [24]), num_sampled=1)
    assert got == pytest.approx(0.001 + 6.048e-3, rel=1e-12)
    # a bigger chunk flips it to compute-bound: 4000 tokens, no context, no sample
    # linear 8e9; attention 800 * 4000*4001/2 = 6.4016e9 -> 1.44016e10/5e11 = 2.88032e-2
    got = model().step_s(plan([4000], [0]), num_sampled=0)
    assert got == pytest.approx(0.001 + 2.88032e-2, rel=1e-12)


def test_swap_blocks_cost_host_link_time():
    base = model().step_s(plan([1], [10]), num_sampled=1)
    with_swap = model().step_s(plan([1], [10], swap_out=3, swap_in=2), num_sampled=1)
    # 5 blocks * 16,000 B / 1e8 B/s = 8e-4 s
    assert with_swap - base == pytest.approx(8e-4, rel=1e-9)


def test_tensor_parallel_divides_work_and_adds_allreduce():
    one = model(1).step_s(plan([1000], [0]), num_sampled=1)
    two = model(2).step_s(plan([1000], [0]), num_sampled=1)
    # compute halves; weights per GPU halve; all-reduce: 2*L*(1e-5 + 2*(1/2)*1000*100*2/1e10) = 4*(1e-5+2e-5)
    compute_one = (2e9 + 2e5 + 800 * 1000 * 1001 / 2) / 5e11
    memory_two = (1e6 + 1000 * 1000) / 5e8
    assert one == pytest.approx(0.001 + max(compute_one, (2e6 + 1e6) / 5e8), rel=1e-12)
    assert two == pytest.approx(0.001 + max(compute_one / 2, memory_two) + 2 * 2 * 3e-5, rel=1e-12)


def test_async_scheduling_hides_the_overhead_behind_the_forward():
    """Async scheduling (vLLM 0.33's default) prepares step k+1 on the CPU while step k's forward
    runs: a step costs the longer of overhead and forward; host-link copies still add."""
    sync = model()
    asy = CostModel(shape=SHAPE, constants=CONST, tp=1, kv_bytes_per_token=1000,
                    kv_bytes_per_block=16_000, async_scheduling=True)
    # Memory-bound decode (forward 4.804e-3 s > overhead 1e-3 s): the overhead disappears.
    assert asy.step_s(plan([1, 1], [100, 300]), num_sampled=2) == pytest.approx(4.804e-3, rel=1e-12)
    assert sync.step_s(plan([1, 1], [100, 300]), num_sampled=2) == pytest.approx(5.804e-3, rel=1e-12)
    # A forward shorter than the overhead (an empty step: weights only, 2e6 / 5e8 = 4e-3 s, with
    # a 10 ms overhead) costs the overhead.
    slow_cpu = CostModel(shape=SHAPE, constants=replace(CONST, overhead_s=0.01), tp=1,
                         kv_bytes_per_token=1000, kv_bytes_per_block=16_000, async_scheduling=True)
    assert slow_cpu.step_s(plan([], []), num_sampled=0) == 0.01
    # Swap copies are not overlapped: 5 blocks * 16,000 B / 1e8 B/s on top.
    got = asy.step_s(plan([1], [10], swap_out=3, swap_in=2), num_sampled=1)
    assert got - asy.step_s(plan([1], [10]), num_sampled=1) == pytest.approx(8e-4, rel=1e-9)


def test_calibration_profile_overrides_constants(tmp_path):
    p = tmp_path / "profile.json"
    p.write_text('{"constants": {"overhead_s": 0.005, "memory_efficiency": 0.9}}')
    c = CONST.with_profile(p)
    assert c.overhead_s == 0.005 and c.memory_efficiency == 0.9 and c.flops_per_s == 1e12
    p.write_text('{"constants": {"bogus": 1}}')
    with pytest.raises(ValueError, match="bogus"):
        CONST.with_profile(p)
