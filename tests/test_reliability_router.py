"""Issue 34 item 9: the prefix router on the shipped Mooncake trace, where every request's first
hash is 0 (a system prompt all share). Its session key is the first hash past the prefix every
request shares (the conversation), so `kvcap fleet ... --replicas 3 --router prefix` spreads the
trace; a trace whose requests all share one key says in one line why prefix affinity cannot
spread it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from capacity.cli import app
from replay.fleet.routing import balance_note, session_keys, shared_prefix_len, static_assignment
from traces.schema import SCHEMA

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "conversation_trace.jsonl"
needs_shared = pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/traces not present")
runner = CliRunner()


def trace(arrival, prompt, output, *, prefix=None) -> pl.DataFrame:
    n = len(arrival)
    return pl.DataFrame({
        "request_id": np.arange(n), "arrival_s": np.asarray(arrival, float),
        "prompt_tokens": prompt, "output_tokens": output, "priority": [0] * n,
        "tenant": [None] * n, "prefix_hashes": prefix or [None] * n}, schema=SCHEMA)


def fleet(path, *args):
    res = runner.invoke(app, ["fleet", str(path), "--replicas", "3", "--router", "prefix", "--workers", "1",
                              "--quiet", "--json", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


@needs_shared
def test_prefix_router_spreads_the_real_mooncake_head(tmp_path):
    head = tmp_path / "mooncake_head.jsonl"
    head.write_text("".join(MOONCAKE.read_text().splitlines(True)[:300]))
    res = fleet(head)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    per = out["replica_requests"]
    assert sum(per) == 300 and min(per) > 0 and max(per) < 0.6 * 300, per
    assert out["router_note"] is None and "warning" not in res.stderr


@needs_shared
def test_the_whole_mooncake_trace_keys_on_the_conversation():
    from traces.loaders import load_trace
    t = load_trace(MOONCAKE)
    assert shared_prefix_len(t) == 1                      # hash 0 opens every request
    keys = session_keys(t)
    assert (keys == t["prefix_hashes"].list.get(1, null_on_oob=True)
            .fill_null(t["prefix_hashes"].list.last()).to_numpy().astype(np.uint64)).all()
    counts = np.bincount(static_assignment(t, 3, "prefix"), minlength=3)
    assert counts.min() > 0.2 * t.height, counts          # was [12031, 0, 0]
    assert balance_note(t, 3, static_assignment(t, 3, "prefix")) is None


def test_turns_of_one_conversation_stay_together_past_a_shared_system_prompt():
    # [0] is the system prompt; 5 and 9 are conversations, each turn extending the last
    prefix = [[0, 5], [0, 9], [0, 5, 6], [0, 9, 10, 11], [0, 5, 6, 7], [0]]
    t = trace(range(6), [600] * 6, [5] * 6, prefix=[[np.uint64(x) for x in p] for p in prefix])
    assert shared_prefix_len(t) == 1
    k = session_keys(t)
    assert k[0] == k[2] == k[4] == 5 and k[1] == k[3] == 9 and k[5] == 0
    a = static_assignment(t, 8, "prefix")
    assert a[0] == a[2] == a[4] and a[1] == a[3]


def test_a_trace_prefix_affinity_cannot_spread_says_why_in_one_line(tmp_path):
    f = tmp_path / "same.jsonl"
    f.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 5,
                                     "hash_ids": [0, 1]}) + "\n" for i in range(12)))
    res = fleet(f)
    assert res.exit_code == 0, res.stderr
    note = json.loads(res.stdout)["router_note"]
    assert note and "replica" in note and "12 of 12 requests" in note and "1 distinct session keys" in note
    warn = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(warn) == 1 and warn[0].startswith("kvcap: warning: --router prefix:")


def test_no_note_for_rr_or_a_spread_trace():
    t = trace(range(40), [600] * 40, [5] * 40, prefix=[[np.uint64(7), np.uint64(i)] for i in range(40)])
    a = static_assignment(t, 3, "prefix")
    assert balance_note(t, 3, a) is None and np.bincount(a, minlength=3).min() > 0
    assert balance_note(t, 1, np.zeros(40, np.int64)) is None


def test_no_second_token_anywhere_is_no_tbt_median_not_a_traceback(tmp_path):
    """A replica sent nothing (prefix affinity above) or a trace of one-token outputs has no
    token gap: summary() kept its TBT median key only when the median existed (KeyError)."""
    f = tmp_path / "one.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n0.5,20,1\n")
    res = runner.invoke(app, ["replay", str(f), "--db", str(tmp_path / "k.duckdb"), "--json"])
    assert res.exit_code == 0 and res.exception is None, res.stderr
    out = json.loads(res.stdout)
    assert out["tbt_p50_s"] is None and out["tbt_p99_s"] is None
