"""The torch stub executor: paged KV writes and gathers, swap copies, fingerprint integrity, and
the differential test (stub with cost-model timing = `--executor model`, decision for decision).

Tiny shapes, one torch thread: the whole file runs in seconds on a CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from replay.engine.plan import StepPlan
from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys
from replay.engine.state import RequestState
from replay.stub.executor import StubExecutor, StubIntegrityError
from replay.stub.kv import KVLayout, PagedKV, fingerprints
from replay.stub.model import WeightlessModel

from stub_helpers import AZURE_CONV, B, CPU, TINY, tiny_kv


class FakeEngine:
    """Hand-made block tables and plans: the executor sees only `block_table(row)`."""

    def __init__(self, prompt_len, keys=None, model_dtype=torch.float32, **kv_kw) -> None:
        n = len(prompt_len)
        self.state = RequestState(arrival_s=np.zeros(n), prompt_len=prompt_len,
                                  output_len=np.full(n, 100))
        self.tables: dict[int, list[int]] = {}
        self.ex = StubExecutor(kv=tiny_kv(**kv_kw), model=WeightlessModel(TINY, CPU, model_dtype),
                               keys=keys or UniqueBlockKeys(), state=self.state,
                               block_table=lambda r: self.tables[r], timing="measured")

    def step(self, rows, new, computed, swap_out=(), swap_in=()) -> float:
        plan = StepPlan(rows=np.array(rows, np.int64), num_new_tokens=np.array(new, np.int64),
                        num_computed_tokens=np.array(computed, np.int64),
                        is_prefill=np.array([n > 1 for n in new], bool),
                        swap_out=np.array(swap_out, np.int64).reshape(-1, 2),
                        swap_in=np.array(swap_in, np.int64).reshape(-1, 2))
        return self.ex.step_s(plan, 0)


# ----------------------------------------------------------------------------- storage
def test_fingerprints_are_nonzero_and_tell_keys_and_offsets_apart():
    keys = np.array([1, 1, 2, (-5) & (2**64 - 1)], np.uint64)
    fp = fingerprints(keys, np.array([0, 1, 0, 0]))
    assert len(set(fp.tolist())) == 4 and (fp != 0).all()
    assert fingerprints(keys[:1], np.array([1]))[0] == fp[1]      # deterministic


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_kv_write_then_gather_round_trips(dtype):
    kv = tiny_kv(dtype=dtype)
    slots = torch.tensor([5, 6, 7, 40, 41])
    k = torch.randn(5, 1, 8)
    v = torch.randn(5, 1, 8)
    kv.write(1, slots, k, v)
    assert torch.equal(kv.flat(0, 1)[slots].float(), k.to(dtype).float())
    assert torch.equal(kv.flat(1, 1)[slots].float(), v.to(dtype).float())
    assert kv.flat(0, 0).float().abs().sum() == 0                  # other layers untouched
    # vLLM's layout: [2, layers, blocks, block_size, kv_heads, head_dim]
    assert kv.kv.shape == (2, 2, 16, B, 1, 8)
    assert torch.equal(kv.kv[0, 1, 10, 0].float(), k[3].to(dtype).float())


def test_swap_out_and_in_moves_kv_fingerprints_and_writers():
    kv = tiny_kv()
    kv.kv.copy_(torch.randn(kv.kv.shape).to(kv.kv.dtype))
    kv.fp.copy_(torch.arange(kv.fp.numel()).view(kv.fp.shape) + 1)
    kv.w_row[:] = np.arange(16)[:, None]
    before = kv.kv[:, :, [3, 9, 4]].clone()
    fp_before = kv.fp[[3, 9, 4]].clone()
    kv.swap(np.array([[3, 5], [9, 6], [4, 0]]), np.zeros((0, 2), np.int64))
    kv.kv.zero_(); kv.fp.zero_()
    kv.swap(np.zeros((0, 2), np.int64), np.array([[5, 11], [6, 2], [0, 12]]))
    assert torch.equal(kv.kv[:, :, [11, 2, 12]], before)
    assert torch.equal(kv.fp[[11, 2, 12]], fp_before)
    assert kv.w_row[[11, 2, 12], 0].tolist() == [3, 9, 4]


# ----------------------------------------------------------------------------- integrity
@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])  # bf16: as on a GPU
def test_prefill_decode_and_chunks_pass_the_check(model_dtype):
    e = FakeEngine([6, 9], model_dtype=model_dtype)
    e.tables = {0: [3, 7], 1: [1, 8, 2]}
    assert e.step([0, 1], [6, 5], [0, 0]) > 0          # prefill + first chunk
    e.step([0, 1], [1, 4], [6, 5])                     # decode + last chunk (context > 0)
    e.tables[0].append(11)
    for c in range(7, 12):                              # decodes crossing a block boundary
        e.step([0], [1], [c])
    assert e.ex.kv.w_row[11, 0] == 0 and e.ex.kv.w_pos[11, 3] == 11


def test_corrupted_block_table_fails_with_a_precise_message():
    e = FakeEngine([8])
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0])
    e.tables[0] = [3, 5]                       # block 1 of the table now points at block 5
    with pytest.raises(StubIntegrityError) as err:
        e.step([0], [1], [7])
    msg = str(err.value)
    assert "step 2: request row 0 reads position 4 through block 1 of its block table = GPU " \
           "block 5, offset 0" in msg
    assert "found an unwritten slot (never written)" in msg


def test_write_into_a_block_another_request_holds_is_caught_and_named():
    e = FakeEngine([8, 8])
    e.tables = {0: [3, 7], 1: [2, 7]}          # row 1 wrongly shares row 0's block 7
    with pytest.raises(StubIntegrityError) as err:
        e.step([0, 1], [8, 8], [0, 0])
    assert "request row 0 reads position 4" in str(err.value)
    assert "written by row 1 at position 4 in step 1" in str(err.value)


def test_swap_round_trip_keeps_fingerprints_and_a_misplaced_swap_in_fails():
    e = FakeEngine([8, 8])
    e.tables = {0: [3, 7], 1: [1, 2]}
    e.step([0, 1], [8, 8], [0, 0])
    # Row 0 swapped out (blocks 3, 7 -> host 0, 1); its GPU blocks are reused by row 1.
    e.tables = {1: [1, 2, 3]}
    e.step([1], [1], [8], swap_out=[[3, 0], [7, 1]])
    e.tables = {1: [1, 2, 3], 0: [9, 10, 14]}
    e.step([0, 1], [1, 1], [8, 9], swap_in=[[0, 9], [1, 10]])   # correct: passes
    # Swap out again (all three blocks), and swap back in with two pairs crossed.
    e.tables = {1: [1, 2, 3]}
    e.step([1], [1], [10], swap_out=[[9, 4], [10, 5], [14, 6]])
    e.tables = {1: [1, 2, 3], 0: [12, 13, 15]}
    with pytest.raises(StubIntegrityError) as err:
        e.step([0], [1], [9], swap_in=[[4, 13], [5, 12], [6, 15]])
    assert "step 5: request row 0 reads position 0 through block 0 of its block table = GPU " \
           "block 12" in str(err.value)
    assert "written by row 0 at position 4 in step 1" in str(err.value)


def test_a_lost_swap_in_reads_stale_blocks_and_fails():
    e = FakeEngine([8, 8])
    e.tables = {0: [3, 7], 1: [1, 2]}
    e.step([0, 1], [8, 8], [0, 0])
    e.tables = {1: [1, 2, 3, 7]}
    e.step([1], [8], [8], swap_out=[[3, 0], [7, 1]])          # row 1 overwrites 3 and 7
    e.tables = {0: [3, 7, 5], 1: [1, 2, 3, 7]}
    with pytest.raises(StubIntegrityError, match=r"row 0 reads position 0 .* found 0x[0-9a-f]+ "
                                                 r"\(written by row 1 at position 8 in step 2\)"):
        e.step([0], [1], [8])                                  # swap-in forgotten


def test_shared_prefix_blocks_pass_and_stale_cache_hits_fail():
    keys = TraceBlockKeys(block_size=B, prompt_len=[8, 10, 10], prefix_hashes=[[11], [11], [12]],
                          hash_block_tokens=8)
    e = FakeEngine([8, 10, 10], keys=keys)
    e.tables = {0: [3, 7]}
    e.step([0], [8], [0])
    e.tables = {0: [3, 7], 1: [3, 7, 9]}        # prefix-cache hit on both of row 0's blocks
    e.step([1], [2], [8])
    e.tables[2] = [3, 7, 10]                    # different prefix: a hit here is stale
    with pytest.raises(StubIntegrityError, match="request row 2 reads position 0"):
        e.step([2], [2], [8])


# ----------------------------------------------------------------------------- replays
def _azure_slice(n: int):
    pl = pytest.importorskip("polars")
    if not AZURE_CONV.exists():
        pytest.skip(f"{AZURE_CONV} not present")
    try:
        from traces.loaders import load_trace
        return load_trace(AZURE_CONV).head(n)
    except ImportError:
        import csv
        from datetime import datetime
        with AZURE_CONV.open(newline="") as f:
            rows = list(csv.DictReader(f))[:n]
        t = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in rows]
        return pl.DataFrame({
            "request_id": list(range(n)),
            "arrival_s": [(x - t[0]).total_seconds() for x in t],
            "prompt_tokens": [int(r["ContextTokens"]) for r in rows],
            "output_tokens": [int(r["GeneratedTokens"]) for r in rows],
            "priority": [0] * n, "tenant": [None] * n, "prefix_hashes": [None] * n},
            schema_overrides={"prefix_hashes": pl.List(pl.UInt64), "tenant": pl.Utf8})


def _config(scheduler: str, mode: str):
    from replay.config import EngineConfig
    # A small pool forces preemption (and swaps) within 150 requests.
    return EngineConfig(scheduler=scheduler, preemption_mode=mode, num_gpu_blocks_override=1200,
                        block_size=16, num_cpu_blocks_override=2000, max_num_seqs=64,
                        max_model_len=8192)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler,mode", [("v0", "recompute"), ("v0", "swap"),
                                            ("v1", "recompute")])
def test_stub_replays_azure_conv_with_the_same_decisions_as_the_cost_model(scheduler, mode):
    from replay.run import replay
    trace = _azure_slice(120)
    # Arrivals 5x denser: bigger batches (fewer steps, so the test stays quick) and a tight pool.
    trace = trace.with_columns(trace["arrival_s"] / 5)
    cfg = _config(scheduler, mode)
    # The stub runs on the reference; the core tests hold the compiled core equal to that.
    model = replay(trace, cfg, executor="model", implementation="reference")
    stub = replay(trace, cfg, executor="stub", stub_options={"device": "cpu", "stub_shape": "tiny"})
    assert stub.run["status"] == model.run["status"]
    for name in ("steps", "requests", "events"):
        a, b = getattr(model, name).drop("run_id"), getattr(stub, name).drop("run_id")
        assert a.equals(b), name
    assert model.steps["num_preempted"].sum() > 0          # the pool really was tight
    if mode == "swap":
        assert model.steps["swap_in_blocks"].sum() > 0


def test_stub_catches_a_corrupted_block_table_during_a_trace_replay():
    from replay.config import resolve
    from replay.engine.loop import run
    from replay.run import block_keys, make_scheduler, request_state
    trace = _azure_slice(40)
    eng = resolve(_config("v1", "recompute"))
    state = request_state(trace)
    keys = block_keys(trace, eng.spec.block_size)
    sched = make_scheduler("v1", eng.spec, state, keys)
    ex = StubExecutor.for_engine(eng, state=state, scheduler=sched, keys=keys, device="cpu")
    honest = ex.block_table

    def corrupted(row: int) -> list[int]:
        table = list(honest(row))
        if ex.step >= 30 and row == 0 and len(table) > 2:
            table[1], table[2] = table[2], table[1]
        return table

    ex.block_table = corrupted
    with pytest.raises(StubIntegrityError, match=r"step 30: request row 0 reads position 16 "
                                                 r"through block 1 of its block table"):
        run(state, sched, ex, kv_bytes_per_block=eng.kv_bytes_per_block)


def test_measured_timing_replays_and_records_steps():
    from replay.run import replay
    trace = _azure_slice(20)
    res = replay(trace, _config("v1", "recompute"), executor="stub",
                 stub_options={"device": "cpu", "timing": "measured"})
    d = res.steps["duration_s"].to_numpy()
    assert res.run["status"] == "completed" and (d > 0).all() and d.max() < 5.0


# ----------------------------------------------------------------------------- attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])   # bf16: the GPU's dtypes
def test_paged_attention_equals_dense_attention_per_request(monkeypatch, dtype):
    """Decode buckets (one gather per bucket in (row, KV head, position) order, padding masked),
    a chunk over earlier context, a whole prompt and GQA: each query's output equals softmax
    attention over its own request's K/V read position by position, causal within the step."""
    from replay.stub import executor as stub_executor
    from replay.stub.model import StubShape
    monkeypatch.setitem(stub_executor._DECODE_BUCKET_RATIO, "cpu", 1.5)   # several buckets
    shape = StubShape(kind="tiny", num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=64, vocab_size=50)
    kv = PagedKV(KVLayout(num_layers=1, num_kv_heads=2, head_dim=8, block_size=B,
                          num_gpu_blocks=40, num_cpu_blocks=1, dtype=dtype), CPU)
    # rows 0..3 decode (contexts 3, 10, 11, 21), row 4 a chunk of 5 after 6, row 5 a prompt of 7
    computed, new = [2, 9, 10, 20, 6, 0], [1, 1, 1, 1, 5, 7]
    perm = np.random.default_rng(1).permutation(40).tolist()
    tables, used = {}, 0
    for r, (c, n) in enumerate(zip(computed, new)):
        nb = -(-(c + n) // B)
        tables[r], used = perm[used:used + nb], used + nb
    n_rows = len(new)
    state = RequestState(arrival_s=np.zeros(n_rows), prompt_len=np.full(n_rows, 100),
                         output_len=np.ones(n_rows))
    ex = StubExecutor(kv=kv, model=WeightlessModel(shape, CPU, dtype), keys=UniqueBlockKeys(),
                      state=state, block_table=lambda r: tables[r], timing="measured")
    order = [3, 0, 5, 2, 4, 1]        # plan order is not token order
    plan = StepPlan(rows=np.array(order, np.int64), num_new_tokens=np.array([new[r] for r in order]),
                    num_computed_tokens=np.array([computed[r] for r in order]),
                    is_prefill=np.array([new[r] > 1 for r in order]),
                    swap_out=np.zeros((0, 2), np.int64), swap_in=np.zeros((0, 2), np.int64))
    prep = stub_executor._Prepared(ex, plan)
    batch = prep.batch
    assert len(batch.decode_groups) == 3                   # contexts 3 | 10, 11 | 21
    assert [g[:2] for g in batch.decode_groups] == [(0, 1), (1, 3), (3, 4)]
    assert prep.new_rows.tolist() == [0, 1, 2, 3] + [5] * 7 + [4] * 5
    g = torch.Generator().manual_seed(0)
    kv.kv.copy_(torch.randn(kv.kv.shape, generator=g))
    T = prep.num_tokens
    q = torch.randn(T, 4, 8, generator=g).to(dtype)
    out = ex.model._attention(kv, 0, q, batch).float()
    K, V = kv.kv[0, 0].float(), kv.kv[1, 0].float()         # [blocks, B, kv_heads, d]
    q = q.float()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for t in range(T):
        r, pos = int(prep.new_rows[t]), int(prep.new_pos[t])
        blocks = torch.tensor([tables[r][p // B] for p in range(pos + 1)])
        offs = torch.tensor([p % B for p in range(pos + 1)])
        k, v = K[blocks, offs], V[blocks, offs]              # [pos + 1, kv_heads, d]
        for h in range(4):
            w = (k[:, h // 2] @ q[t, h] * 8 ** -0.5).softmax(0)
            torch.testing.assert_close(out[t, h], w @ v[:, h // 2], rtol=tol, atol=tol)
    # the new tokens' slots follow the token order too
    exp_slots = [tables[r][p // B] * B + p % B for r, p in zip(prep.new_rows, prep.new_pos)]
    assert prep.new_slots.tolist() == exp_slots
