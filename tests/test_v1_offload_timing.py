"""CPU offload transfers in time (offload_transfer_steps 0, the replay default): a transfer is
done when its bytes have crossed the host link, FIFO per direction, and reported at the end of
the first step by which it is done. On a link so fast that every copy ends within its step, the
timed connector decides exactly what the oracle's 1-step emulation decides (every O-scenario
with transfer_steps 1); on a slow link a load spans several steps and the request waits for it;
the reference loop records the transfers (steps columns, events) and jumps over idle time to
the next completion."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from replay.engine import loop
from replay.engine.prefix import TraceBlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.state import RequestState, Status
from replay.engine.v1 import V1Scheduler
from tests.oracle_driver import OFFLOAD_SCENARIOS, compare, drive, load

STEP_ONE = [n for n in OFFLOAD_SCENARIOS
            if load(n)[0].get("kv_offloading", {}).get("transfer_steps", 1) == 1
            and "kv_offloading" in load(n)[0]]


def timed(link_bytes_per_s: float, kv_bytes_per_block: int = 1):
    def make(spec, state, keys):
        return V1Scheduler(dataclasses.replace(
            spec, offload_transfer_steps=0, offload_host_link_bytes_per_s=link_bytes_per_s,
            kv_bytes_per_block=kv_bytes_per_block), state, keys)
    return make


@pytest.mark.parametrize("name", STEP_ONE)
def test_a_fast_link_decides_like_the_one_step_emulation(name):
    sc, _ = load(name)
    want = drive(V1Scheduler, sc, "v1")
    got = drive(timed(1e12), sc, "v1")
    assert not compare(got, want, "v1")
    assert got == want


def test_a_slow_load_spans_steps():
    """O1's B loads 2 blocks at step 15; at 0.5 blocks per step the load takes 4 steps (one
    FIFO: the second block after the first), so B waits through steps 15-18 and resumes at 19
    instead of 16."""
    sc, _ = load("O1")
    fast = drive(V1Scheduler, sc, "v1")
    slow = drive(timed(0.5), sc, "v1")
    first = {ln["step"] for ln in fast if ln["cpu_load"]}
    assert first == {15} and {ln["step"] for ln in slow if ln["cpu_load"]} == {15}
    waiting = [ln["step"] for ln in slow if ln["waiting_for_kv"]]
    assert waiting == [15, 16, 17, 18]
    done = [(ln["step"], d) for ln in slow for d in ln["cpu_done"] if d[1] == "load"]
    assert done == [(18, ["B", "load"])]
    resumed = [ln["step"] for ln in slow if ["B", 5, "resumed"] in ln["scheduled"]]
    assert resumed == [19]


class _FixedStep:
    """An executor whose every step takes `dt` seconds."""

    def __init__(self, dt: float) -> None:
        self.dt = dt

    def step_s(self, plan, num_sampled: int) -> float:
        return self.dt


def _spec(**kw) -> SchedulerSpec:
    base = dict(block_size=4, num_gpu_blocks=10, num_cpu_blocks=16, max_num_seqs=4,
                max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=True,
                enable_prefix_caching=True, kv_offloading=True, kv_bytes_per_block=1000,
                offload_host_link_bytes_per_s=1000.0)
    base.update(kw)
    return SchedulerSpec(**base)


def test_the_loop_records_transfers_and_waits_for_a_slow_load():
    """Two turns of one conversation: the second arrives after the first's KV left the GPU
    (a filler took its blocks) and loads its 16-token prefix from the tier. A block takes 1 s on
    the link and a step 0.01 s, so the load's 4 blocks take 4 s: the loop jumps over the idle
    steps to the completion instead of stopping."""
    prompt = np.array([16, 32, 20])
    state = RequestState(arrival_s=np.array([0.0, 1.0, 30.0]), prompt_len=prompt,
                         output_len=np.array([2, 2, 2]))
    keys = TraceBlockKeys(block_size=4, prompt_len=prompt,
                          prefix_hashes=[[7, 8, 9, 10], [20, 21, 22, 23, 24, 25, 26, 27],
                                         [7, 8, 9, 10, 11]], hash_block_tokens=4)
    spec = _spec()
    raw = loop.run(state, V1Scheduler(spec, state, keys), _FixedStep(0.01),
                   kv_bytes_per_block=spec.kv_bytes_per_block)
    assert np.all(state.status == Status.FINISHED)
    assert state.cpu_hit_tokens.tolist() == [0, 0, 16]
    ev = raw.events
    loads = [(r, b, by) for r, k, b, by in zip(ev["row"], ev["kind"], ev["blocks"], ev["bytes"])
             if k == "offload_load"]
    assert loads == [(2, 4, 4000)]
    assert raw.steps["offload_load_blocks"].sum() == 4
    assert raw.steps["offload_store_blocks"].sum() == sum(
        b for k, b in zip(ev["kind"], ev["blocks"]) if k == "offload_store")
    assert raw.steps["cpu_blocks_used"].max() <= spec.num_cpu_blocks
    # Admitted (load issued) at t >= 30, its first token only once the 4 s load is done.
    load_t = next(t for t, k in zip(ev["t_s"], ev["kind"]) if k == "offload_load")
    assert raw.first_token_s[2] >= load_t + 4.0
    assert raw.first_token_s[2] < load_t + 4.1
