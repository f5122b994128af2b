"""The torch stub's V1 CPU offloading copies (replay/stub/offload.py): stores reach the host tier
one step after they are planned (flushed ones at once), loads bring the stored content back, and a
lost, misplaced or unknown chunk fails the integrity check; a whole offloading replay on the stub
makes the cost model's decisions, step for step.

Tiny shapes, one torch thread."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from replay.engine.plan import OffloadPlan, OffloadTransfer, StepPlan
from replay.engine.prefix import UniqueBlockKeys
from replay.engine.state import RequestState
from replay.stub.executor import StubExecutor, StubIntegrityError
from replay.stub.model import WeightlessModel

from stub_helpers import AZURE_CONV, B, CPU, TINY, tiny_kv


class Engine:
    """Hand-made block tables and plans for one request (row 0, 8 prompt tokens = 2 blocks)."""

    def __init__(self, num_host_blocks: int = 4) -> None:
        self.keys = UniqueBlockKeys()
        self.state = RequestState(arrival_s=np.zeros(2), prompt_len=np.array([8, 8]),
                                  output_len=np.full(2, 100))
        kv = tiny_kv(num_cpu_blocks=num_host_blocks)
        self.tables: dict[int, list[int]] = {}
        self.ex = StubExecutor(kv=kv, model=WeightlessModel(TINY, CPU, torch.float32),
                               keys=self.keys, state=self.state,
                               block_table=lambda r: self.tables[r], timing="measured")

    def transfer(self, gpu_blocks, row: int = 0) -> OffloadTransfer:
        keys = tuple(self.keys.key(row, i) for i in range(len(gpu_blocks)))
        return OffloadTransfer(row=row, num_tokens=B * len(gpu_blocks), gpu_blocks=tuple(gpu_blocks),
                               chunks=tuple(range(len(gpu_blocks))), keys=keys)

    def step(self, rows=(), new=(), computed=(), **offload) -> None:
        plan = StepPlan(rows=np.array(rows, np.int64), num_new_tokens=np.array(new, np.int64),
                        num_computed_tokens=np.array(computed, np.int64),
                        is_prefill=np.array([n > 1 for n in new], bool),
                        offload=OffloadPlan(**offload))
        self.ex.step_s(plan, 0)


def _store_then_reload(e: Engine) -> None:
    """Row 0 prefills into GPU blocks 3, 7 and stores them (write-through); it is preempted and
    comes back into GPU blocks 9, 10 by a load, then decodes one token over the loaded context."""
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0], stores=(e.transfer([3, 7]),))
    e.step()                                        # the store is copied now (vLLM: submitted)
    e.tables = {0: [9, 10, 11]}
    e.step(loads=(e.transfer([9, 10]),))
    e.step([0], [1], [8])                           # reads positions 0..7 from the loaded blocks


def test_a_stored_chunk_loads_back_into_other_blocks_and_passes_the_check():
    e = Engine()
    _store_then_reload(e)
    off = e.ex.offload
    assert (off.num_store_blocks, off.num_load_blocks) == (2, 2)
    # The host blocks hold row 0's fingerprints, and its loaded GPU blocks equal them.
    host = sorted(off.block_of.values())
    assert (e.ex.kv.host_fp[host] != 0).all()
    assert torch.equal(e.ex.kv.fp[[9, 10]], e.ex.kv.fp[[3, 7]])
    assert torch.equal(e.ex.kv.kv[:, :, [9, 10]], e.ex.kv.kv[:, :, [3, 7]])


def test_a_store_is_copied_the_step_after_it_is_planned():
    # Its tokens are computed by the step that plans it (copied then, the tier would hold what
    # the blocks held before): the host blocks stay unwritten until the next step starts.
    e = Engine()
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0], stores=(e.transfer([3, 7]),))
    host = sorted(e.ex.offload.block_of.values())
    assert (e.ex.kv.host_fp[host] == 0).all()
    e.step()
    assert torch.equal(e.ex.kv.host_fp[host], e.ex.kv.fp[[3, 7]])
    assert e.ex.kv.hw_row[host].tolist() == [[0] * B] * 2


def test_a_flushed_store_is_copied_before_the_forward_pass():
    # Row 0 finished; its blocks 3, 7 are handed to row 1 in this very step, so its store is
    # flushed: copied before row 1's prefill overwrites them.
    e = Engine()
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0])
    e.tables = {1: [3, 7]}
    e.step([1], [8], [0], stores=(e.transfer([3, 7]),), flushed=(0,))
    e.tables = {0: [12, 13, 14]}
    e.step(loads=(e.transfer([12, 13]),))
    e.step([0], [1], [8])
    assert e.ex.offload.num_flushes == 1


def test_evictions_free_host_blocks_and_unknown_keys_fail():
    e = Engine(num_host_blocks=2)
    e.tables = {0: [3, 7]}
    first = e.transfer([3, 7])
    e.step([0], [8], [0], stores=(first,))
    e.step()
    e.tables[1] = [5, 6]
    other = e.transfer([5, 6], row=1)
    # The tier is full: row 1's store fits only after row 0's chunks are evicted.
    e.step([1], [8], [0], stores=(other,), evicted=first.keys)
    e.step()
    assert set(e.ex.offload.block_of) == set(other.keys)
    with pytest.raises(StubIntegrityError, match="loads offload key .* never stored"):
        e.step(loads=(e.transfer([9, 10]),))
    with pytest.raises(StubIntegrityError, match="evicts key .* does not hold"):
        e.step(evicted=first.keys)
    with pytest.raises(StubIntegrityError, match="already holds"):
        e.step(stores=(other,))


def test_a_misplaced_load_fails_the_check():
    e = Engine()
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0], stores=(e.transfer([3, 7]),))
    e.step()
    e.tables = {0: [9, 10, 11]}
    t = e.transfer([9, 10])
    swapped = OffloadTransfer(row=0, num_tokens=t.num_tokens, gpu_blocks=(10, 9), chunks=t.chunks,
                              keys=t.keys)
    e.step(loads=(swapped,))
    with pytest.raises(StubIntegrityError, match="request row 0 reads position 0 through block 0 "
                                                 "of its block table = GPU block 9"):
        e.step([0], [1], [8])


# ----------------------------------------------------------------------------- a whole replay
def _shared_prefix_slice(n: int):
    """The first n Azure conv requests, 5x denser, in four groups that share up to 2,048 prompt
    tokens (a system prompt each): loads bring back both a preempted request's own chunks and
    another request's."""
    pl = pytest.importorskip("polars")
    if not AZURE_CONV.exists():
        pytest.skip(f"{AZURE_CONV} not present")
    from traces.loaders import load_trace
    t = load_trace(AZURE_CONV).head(n)
    hashes = [[(i % 4) * 1000 + j for j in range(min(p // 512, 4))]
              for i, p in enumerate(t["prompt_tokens"].to_list())]
    return t.with_columns(t["arrival_s"] / 5,
                          pl.Series("prefix_hashes", hashes, dtype=pl.List(pl.UInt64)))


@pytest.mark.slow
def test_an_offloading_replay_on_the_stub_makes_the_cost_models_decisions():
    from replay.config import EngineConfig, resolve
    from replay.engine.loop import run
    from replay.run import block_keys, make_scheduler, replay, request_state
    trace = _shared_prefix_slice(80)
    # A 400-block pool preempts; a 0.5 GiB tier (256 chunks of 16 tokens) evicts.
    cfg = EngineConfig(scheduler="v1", num_gpu_blocks_override=400, block_size=16,
                       max_num_seqs=64, max_model_len=8192, kv_offloading_size=0.5)
    model = replay(trace, cfg, executor="model", implementation="reference")
    eng = resolve(cfg)
    state = request_state(trace)
    keys = block_keys(trace, eng.spec.block_size)
    sched = make_scheduler("v1", eng.spec, state, keys)
    ex = StubExecutor.for_engine(eng, state=state, scheduler=sched, keys=keys, device="cpu")
    raw = run(state, sched, ex, kv_bytes_per_block=eng.kv_bytes_per_block)
    assert raw.status == model.run["status"] == "completed"
    assert raw.num_steps == model.steps.height
    np.testing.assert_array_equal(raw.finish_s, model.requests["finish_s"].to_numpy())
    off = ex.offload
    steps = model.steps
    assert off.num_store_blocks <= steps["offload_store_blocks"].sum()   # the last may be unsent
    assert off.num_load_blocks == steps["offload_load_blocks"].sum() > 0
    assert off.num_evicted > 0 and steps["num_preempted"].sum() > 0
    assert model.requests["cpu_hit_tokens"].sum() > 0                   # another request's chunks
    copies = ex.kv.offload_seconds()
    assert sum(c[0] + c[1] for c in copies) == off.num_store_blocks + off.num_load_blocks
