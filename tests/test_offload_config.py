"""#16 CPU KV offloading, the configuration side: vLLM 0.33's knob names, the tier size in chunks
as vLLM computes it (oracle README F12: GiB for all TP ranks, each chunk rounded up to the 4096-byte
page), one-line refusals (lmcache, V0, bad values), the flags of `kvcap replay`, and the compiled
core's refusal while it lacks the connector (no silent fallback)."""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from capacity.cli import app
from replay.config import EngineConfig, offload_chunk_bytes, resolve
from replay.engine import compiled
from replay.engine.prefix import UniqueBlockKeys
from replay.engine.state import RequestState
from replay.timing import memory
from replay.timing.catalog import GIB, get_model


def test_chunks_follow_vllms_arithmetic():
    """chunks = size * 2^30 // round_up(bytes per block per rank * world size, 4096); the host RAM
    pinned is the chunks times that rounded size."""
    for tp in (1, 2, 4):
        eng = resolve(EngineConfig(kv_offloading_size=10, tensor_parallel_size=tp))
        per_rank = memory.kv_bytes_per_block(get_model("llama-3.1-8b"), tp, "auto",
                                             eng.block_size)
        chunk = -(-per_rank * tp // 4096) * 4096
        assert eng.spec.kv_offloading and eng.spec.num_cpu_blocks == 10 * GIB // chunk
        assert eng.kv_offloading_host_ram_bytes == eng.spec.num_cpu_blocks * chunk
        assert eng.kv_offloading_host_ram_bytes <= 10 * GIB
    # A chunk that is not a whole number of pages is rounded up to the next page.
    assert offload_chunk_bytes(1000, 1) == 4096 and offload_chunk_bytes(4097, 1) == 8192
    assert offload_chunk_bytes(3000, 2) == 8192


def test_defaults_are_vllms_and_leave_old_run_ids_alone():
    spec = resolve(EngineConfig()).spec
    assert not spec.kv_offloading and spec.offload_prompt_only
    assert spec.offload_eviction_policy == "lru" and spec.offload_blocks_per_chunk == 1
    # A config that sets none of the new fields hashes as before they existed.
    assert "kv_offloading" not in EngineConfig().config_json()
    assert "kv_offloading_size" in EngineConfig(kv_offloading_size=4).config_json()
    assert not resolve(EngineConfig(kv_offloading_size=0)).spec.kv_offloading
    arc = resolve(EngineConfig(kv_offloading_size=4, kv_offloading_eviction_policy="arc",
                               offload_prompt_only=False)).spec
    assert arc.offload_eviction_policy == "arc" and not arc.offload_prompt_only
    # store_threshold: vLLM's default 0 (no counting); 0.34 counts each key once per request,
    # 0.33 every offer.
    assert spec.offload_store_threshold == 0 and spec.store_counting == "once_per_request"
    assert resolve(EngineConfig(vllm_version="0.33")).spec.store_counting == "every_offer"
    thr = EngineConfig(kv_offloading_size=4, kv_offloading_store_threshold=2)
    assert resolve(thr).spec.offload_store_threshold == 2
    assert '"kv_offloading_store_threshold":2' in thr.config_json()
    assert "store_threshold" not in EngineConfig(kv_offloading_size=4).config_json()


def test_num_cpu_blocks_override_sets_the_tier_in_chunks():
    eng = resolve(EngineConfig(kv_offloading_size=4, num_cpu_blocks_override=7))
    assert eng.spec.num_cpu_blocks == 7
    assert eng.kv_offloading_host_ram_bytes == 7 * offload_chunk_bytes(eng.kv_bytes_per_block, 1)


@pytest.mark.parametrize("kw,field", [
    (dict(kv_offloading_backend="lmcache", kv_offloading_size=4), "kv_offloading_backend"),
    (dict(kv_offloading_backend="nixl"), "kv_offloading_backend"),
    (dict(scheduler="v0", kv_offloading_size=4), "kv_offloading_size"),
    (dict(kv_offloading_size=-1), "kv_offloading_size"),
    (dict(kv_offloading_size=float("nan")), "kv_offloading_size"),
    (dict(kv_offloading_size=1e-9), "kv_offloading_size"),
    (dict(kv_offloading_size=4, preemption_mode="none"), "preemption_mode"),
    (dict(kv_offloading_eviction_policy="lfu"), "kv_offloading_eviction_policy"),
    (dict(offload_prompt_only="yes"), "offload_prompt_only"),
    (dict(kv_offloading_size=4, kv_offloading_store_threshold=-1), "kv_offloading_store_threshold"),
])
def test_bad_values_are_one_line_naming_the_field(kw, field):
    with pytest.raises(ValueError) as e:
        EngineConfig(**kw)
    msg = str(e.value)
    assert msg.startswith(f"{field}:") and "\n" not in msg


def test_lmcache_says_what_is_modelled():
    with pytest.raises(ValueError, match="native OffloadingConnector only"):
        EngineConfig(kv_offloading_backend="lmcache")


def test_compiled_core_refuses_offloading_until_it_models_it():
    spec = resolve(EngineConfig(kv_offloading_size=4)).spec
    state = RequestState(arrival_s=np.zeros(1), prompt_len=[4], output_len=[2])
    from replay.timing.executors import cost_model_for
    ex = cost_model_for(resolve(EngineConfig()))
    why = compiled.unavailable("v1", ex, UniqueBlockKeys(), state, spec)
    if compiled.has_offloading("v1"):
        assert why is None
    else:
        assert "does not model CPU KV offloading" in why and "\n" not in why
    assert compiled.unavailable("v1", ex, UniqueBlockKeys(), state,
                                resolve(EngineConfig()).spec) is None


runner = CliRunner()


@pytest.mark.parametrize("args,text", [
    (["--kv-offloading-backend", "lmcache", "--kv-offloading-size", "4"], "lmcache"),
    (["--scheduler", "v0", "--kv-offloading-size", "4"], "kv_offloading_size"),
    (["--kv-offloading-size", "4", "--kv-offloading-eviction-policy", "mru"],
     "kv_offloading_eviction_policy"),
    (["--kv-offloading-size", "4", "--kv-offloading-store-threshold", "-2"],
     "kv_offloading_store_threshold"),
])
def test_replay_flags_refuse_in_one_line(tmp_path, args, text):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    res = runner.invoke(app, ["replay", str(f), "--db", str(tmp_path / "k.duckdb"), *args])
    err = res.stderr if hasattr(res, "stderr") else res.output
    assert res.exit_code == 2 and text in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "k.duckdb").exists()


def test_new_columns_are_stored(tmp_path):
    """steps.offload_store_blocks / offload_load_blocks, requests.gpu_hit_tokens /
    cpu_hit_tokens and runs.kv_offloading reach DuckDB (zero / the prefix hit without the
    connector), and `kvcap replay --json` sums the hits."""
    import json

    import duckdb
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,3\n")
    db = tmp_path / "k.duckdb"
    res = runner.invoke(app, ["replay", str(f), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["cpu_hit_tokens"] == 0 and out["gpu_hit_tokens"] == 0
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT sum(offload_store_blocks), sum(offload_load_blocks), "
                           "max(cpu_blocks_used) FROM steps").fetchall() == [(0, 0, 0)]
        assert con.execute("SELECT sum(gpu_hit_tokens), sum(cpu_hit_tokens) FROM requests"
                           ).fetchall() == [(0, 0)]
        assert con.execute("SELECT kv_offloading FROM runs").fetchall() == [(False,)]
    finally:
        con.close()


def test_replay_with_offloading_end_to_end(tmp_path):
    """`kvcap replay --kv-offloading-size`: a conversation's second turn, whose prefix a filler
    pushed out of the GPU, is loaded from the CPU tier (cpu_hit_tokens), the run records the
    connector and the implementation, and the fall back to the reference is said on stderr."""
    import json

    import duckdb
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}\n'
                 '{"timestamp": 10000, "input_length": 2048, "output_length": 4, '
                 '"hash_ids": [10, 11, 12, 13]}\n'
                 '{"timestamp": 60000, "input_length": 1500, "output_length": 4, '
                 '"hash_ids": [1, 2, 3]}\n')
    db = tmp_path / "k.duckdb"
    res = runner.invoke(app, ["replay", str(f), "--db", str(db), "--json",
                              "--kv-offloading-size", "1", "--num-gpu-blocks-override", "140",
                              "--block-size", "16"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["requests_finished"] == 3 and out["cpu_hit_tokens"] > 0
    if not compiled.has_offloading("v1"):
        assert "does not model CPU KV offloading" in res.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        (impl, on, chunks), = con.execute(
            "SELECT implementation, kv_offloading, num_cpu_blocks FROM runs").fetchall()
        assert on and chunks == 512 and impl == ("compiled" if compiled.has_offloading("v1")
                                                 else "reference")
        hits = con.execute("SELECT gpu_hit_tokens, cpu_hit_tokens FROM requests "
                           "ORDER BY request_id").fetchall()
        # The third request hits its 1024-token prefix: the GPU still holds its head, the tier
        # the rest (only the first turn's prompt was stored).
        assert hits[0] == (0, 0) and sum(hits[2]) == 1024 and hits[2][1] == out["cpu_hit_tokens"]
        kinds = dict(con.execute("SELECT kind, sum(blocks) FROM events GROUP BY kind").fetchall())
        assert kinds["offload_load"] * 16 == out["cpu_hit_tokens"]
        assert con.execute("SELECT sum(offload_load_blocks), sum(offload_store_blocks) FROM steps"
                           ).fetchall() == [(kinds["offload_load"], kinds["offload_store"])]
    finally:
        con.close()
