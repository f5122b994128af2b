"""Issue 34 item 10: a report's runs depended on `--workers`. Run ids are content hashes of trace,
config and executor (no worker count in them); what changed was which replays were made: the
host-tier sweep replayed `workers` sizes a round and stopped at the first two alike, so 4 workers
replayed sizes 1 or 2 never did, and on a trace whose sessions come back 10 GiB of KV later the
answer itself flipped (2 workers: no tier, the two smallest sizes alike with nothing found in
them; 4: --kv-offloading-size 7.9 GiB). The round is now fixed, and sizes alike with no hit in
the tier are no plateau where something could come back."""
from __future__ import annotations

import json

import duckdb
from typer.testing import CliRunner

from capacity.cli import app

runner = CliRunner()


def size_offload(trace, workers: int, db) -> dict:
    res = runner.invoke(app, ["size-offload", str(trace), "--num-gpu-blocks-override", "2000",
                              "--workers", str(workers), "--json", "--db", str(db)])
    assert res.exit_code == 0 and res.exception is None, (res.stderr, res.exception)
    out = json.loads(res.stdout)
    out.pop("wall_seconds", None)
    return out


def test_host_tier_sweep_is_the_same_with_any_workers(tmp_path):
    # 40 sessions of 2,048 prompt tokens in turn: a session comes back 40 requests (10 GiB of
    # KV) later; the GPU pool holds 4 GiB (tests/test_size_offload.py's small trace)
    rows = [{"timestamp": 400 * i, "input_length": 2048, "output_length": 8,
             "hash_ids": [0, *(1 + 3 * (i % 40) + k for k in range(3))]} for i in range(200)]
    trace = tmp_path / "sessions.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one, four = size_offload(trace, 1, tmp_path / "1.duckdb"), size_offload(trace, 4, tmp_path / "4.duckdb")
    assert one == four
    assert one["needed"] and one["recommended_kv_offloading_size_gib"] > 4   # the reuse is found

    def run_ids(db):
        with duckdb.connect(str(db), read_only=True) as con:
            return sorted(con.execute("SELECT run_id FROM runs").fetchall())
    assert run_ids(tmp_path / "1.duckdb") == run_ids(tmp_path / "4.duckdb")
