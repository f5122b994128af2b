"""Prefix granularity (#16 item 7): a trace carries how many prompt tokens each prefix hash stands
for (`hash_block_tokens`; Mooncake `hash_ids`: 512), set per trace by the loader or
`--hash-block-tokens`; replays on both implementations key their prefix cache by it, the run id and
the runs table record it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from replay.config import EngineConfig
from replay.run import replay
from traces.loaders import load_trace, write_trace
from traces.schema import SCHEMA, TraceError, hash_block_tokens, with_hash_block_tokens

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "conversation_trace.jsonl"
needs_shared = pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/traces not present")
IMPLEMENTATIONS = ("compiled", "reference")


def two_requests() -> pl.DataFrame:
    """Request 1 shares the first two of request 0's three hashes and arrives after it finished."""
    return pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 60.0],
                         "prompt_tokens": [1400, 1400], "output_tokens": [4, 4],
                         "priority": [0, 0], "tenant": [None, None],
                         "prefix_hashes": [[1, 2, 3], [1, 2, 4]]}, schema=SCHEMA)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("tokens", [512, 256, 64])
def test_shared_hashes_hit_their_tokens(implementation, tokens):
    """Two shared hashes are 2 x hash_block_tokens prompt tokens of GPU prefix hits."""
    trace = two_requests() if tokens == 512 else with_hash_block_tokens(two_requests(), tokens)
    r = replay(trace, EngineConfig(), implementation=implementation)
    assert r.requests["cached_prompt_tokens"].to_list() == [0, 2 * tokens]
    assert r.run["hash_block_tokens"] == tokens


@needs_shared
def test_mooncake_head_at_256_tokens_per_hash_hits_half_the_tokens_on_both_implementations():
    head = load_trace(MOONCAKE).head(300)
    runs = {(n, impl): replay(head if n == 512 else with_hash_block_tokens(head, n),
                              implementation=impl)
            for n in (512, 256) for impl in IMPLEMENTATIONS}
    for n in (512, 256):
        assert runs[n, "compiled"].requests.equals(runs[n, "reference"].requests)
        assert runs[n, "compiled"].steps.equals(runs[n, "reference"].steps)
    full = runs[512, "compiled"].requests["cached_prompt_tokens"].to_numpy()
    half = runs[256, "compiled"].requests["cached_prompt_tokens"].to_numpy()
    # Each hash now covers 256 tokens: what a request can hit is 256 per hash, and every shared
    # hash is worth half as many tokens (the default pool never evicts this head).
    assert np.all(half <= 256 * head["prefix_hashes"].list.len().to_numpy())
    assert full.sum() > 0 and abs(full.sum() - 2 * half.sum()) <= 0.02 * full.sum()
    assert runs[512, "compiled"].run_id != runs[256, "compiled"].run_id


def test_the_default_granularity_keeps_earlier_run_ids():
    plain = replay(two_requests())
    assert replay(with_hash_block_tokens(two_requests(), 512)).run_id == plain.run_id
    assert replay(with_hash_block_tokens(two_requests(), 256)).run_id != plain.run_id
    # A trace without prefix hashes has no granularity to record.
    no_hashes = two_requests().with_columns(pl.lit(None, SCHEMA["prefix_hashes"]).alias("prefix_hashes"))
    assert replay(no_hashes).run["hash_block_tokens"] is None


def test_loader_override_and_parquet_round_trip(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
                   '{"timestamp": 3001, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    assert hash_block_tokens(load_trace(src)) == 512               # Mooncake's
    t = load_trace(src, hash_block_tokens=128)
    assert hash_block_tokens(t) == 128
    write_trace(t, tmp_path / "t.parquet")
    back = load_trace(tmp_path / "t.parquet")
    assert hash_block_tokens(back) == 128 and back.equals(t)
    assert hash_block_tokens(load_trace(tmp_path / "t.parquet", hash_block_tokens=32)) == 32


@pytest.mark.parametrize("bad", [0, -512, 1.5, True, "512"])
def test_a_bad_granularity_is_one_line(tmp_path, bad):
    with pytest.raises(TraceError, match=r"^hash_block_tokens: .* whole number of tokens from 1 to"):
        with_hash_block_tokens(two_requests(), bad)


def test_a_parquet_with_a_bad_granularity_names_the_row(tmp_path):
    f = tmp_path / "bad.parquet"
    two_requests().with_columns(pl.Series("hash_block_tokens", [256, 0], pl.Int32)).write_parquet(f)
    with pytest.raises(TraceError, match=r"row .*column 'hash_block_tokens': value 0"):
        load_trace(f)


@needs_shared
def test_cli_replay_takes_hash_block_tokens_and_records_it(tmp_path):
    import json

    import duckdb

    from test_cli_replay import kvcap
    head = tmp_path / "moon300.parquet"
    write_trace(load_trace(MOONCAKE).head(300), head)
    db = tmp_path / "k.duckdb"
    out = {n: json.loads(kvcap("replay", head, "--db", db, "--json", "--hash-block-tokens", n).stdout)
           for n in (512, 256)}
    assert out[512]["gpu_hit_tokens"] > 0
    assert abs(out[512]["gpu_hit_tokens"] - 2 * out[256]["gpu_hit_tokens"]) <= 0.02 * out[512]["gpu_hit_tokens"]
    with duckdb.connect(str(db), read_only=True) as con:
        got = dict(con.execute("SELECT run_id, hash_block_tokens FROM runs").fetchall())
    assert got == {out[512]["run_id"]: 512, out[256]["run_id"]: 256}


SLO = ("--slo-ttft-p99", "1", "--slo-tbt-p99", "1")


@pytest.mark.parametrize("command", [("replay",), ("compare-modes",), ("size-offload",),
                                     ("size-swap",), ("tune", "--max-num-seqs-grid", "8", *SLO),
                                     ("headroom", *SLO), ("alerts",), ("report",), ("fleet", "--replicas", "2"),
                                     ("plan",)])
def test_cli_refuses_a_bad_hash_block_tokens_in_one_line(tmp_path, command):
    """Every command that loads a trace takes the flag (and checks it before any replay)."""
    from test_cli_replay import kvcap
    f = tmp_path / "t.parquet"
    write_trace(two_requests(), f)
    res = kvcap(command[0], f, *command[1:], "--hash-block-tokens", "0", check=False)
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("kvcap: error: --hash-block-tokens 0: must be a whole number")
