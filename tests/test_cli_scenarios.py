"""Reference scenarios reproduced from the command line with tiny pools (engine-core issue:
`kvcap replay` with --num-gpu-blocks-override / --num-cpu-blocks-override)."""
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

KVCAP = str(Path(sys.executable).with_name("kvcap"))
TINY = ["--scheduler", "v0", "--block-size", "4", "--max-num-seqs", "2",
        "--max-num-batched-tokens", "64", "--max-model-len", "16"]


def two_requests(path: Path, outputs=(3, 3)) -> Path:
    """A and B (request ids 0 and 1), prompt 4 each, arriving together."""
    from traces.loaders import write_trace
    df = pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.0],
                       "prompt_tokens": pl.Series([4, 4], dtype=pl.Int32),
                       "output_tokens": pl.Series(list(outputs), dtype=pl.Int32),
                       "priority": pl.Series([0, 0], dtype=pl.Int32),
                       "tenant": pl.Series([None, None], dtype=pl.Utf8),
                       "prefix_hashes": pl.Series([None, None], dtype=pl.List(pl.UInt64))})
    write_trace(df, path)
    return path


def replay(tmp_path, *flags):
    db = tmp_path / "k.duckdb"
    res = subprocess.run([KVCAP, "replay", two_requests(tmp_path / "t.parquet"), "--db", db,
                          "--json", *TINY, *flags], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    con = duckdb.connect(str(db), read_only=True)
    events = con.sql(f"SELECT step, request_id, kind, blocks FROM events WHERE run_id = "
                     f"'{out['run_id']}' ORDER BY step, t_s").fetchall()
    steps = con.sql(f"SELECT step, num_prefill_tokens, num_decode_tokens, gpu_blocks_used, "
                    f"cpu_blocks_used FROM steps WHERE run_id = '{out['run_id']}' ORDER BY step").fetchall()
    con.close()
    return out, events, steps


def test_S3_recompute_victims_B_A_B(tmp_path):
    """S3 (oracle S3 continued without the abort): G=2 blocks of 4, two prompts of 4 and 3 outputs:
    B is preempted at step 2 (tail), A preempts itself at step 3 (G/D1), B again later."""
    out, events, steps = replay(tmp_path, "--num-gpu-blocks-override", "2",
                                "--num-cpu-blocks-override", "2")
    assert out["status"] == "completed" and out["requests_finished"] == 2
    victims = [(step, rid) for step, rid, kind, _ in events if kind == "preempt_recompute"]
    assert [rid for _, rid in victims] == [1, 0, 1]
    assert victims[0][0] == 2
    # Step 1 prefills both prompts (8 tokens), step 2 decodes only A.
    assert steps[0][1:3] == (8, 0) and steps[1][1:3] == (0, 1)


def test_S6_swap_with_two_gpu_blocks_aborts_at_step_3(tmp_path):
    """S6 as real vLLM runs it (oracle S6, G/D2): B swapped out at step 2, then A cannot append and
    its own swap-out needs 2 CPU blocks with 1 free: the engine aborts at step 3."""
    out, events, _ = replay(tmp_path, "--preemption-mode", "swap", "--num-gpu-blocks-override", "2",
                            "--num-cpu-blocks-override", "2")
    assert out["status"] == "aborted"
    kinds = [(step, rid, kind) for step, rid, kind, _ in events]
    assert kinds == [(2, 1, "preempt_swap"), (3, 0, "swap_full_abort")]


def test_S6b_swap_out_and_back_in(tmp_path):
    """S6b: with G=3, B swaps out at step 2 and swaps back in after A finishes; nothing aborts."""
    out, events, steps = replay(tmp_path, "--preemption-mode", "swap", "--num-gpu-blocks-override",
                                "3", "--num-cpu-blocks-override", "2")
    assert out["status"] == "completed" and out["requests_finished"] == 2
    kinds = [(rid, kind, blocks) for _, rid, kind, blocks in events]
    assert kinds == [(1, "preempt_swap", 1), (1, "swap_in", 1)]   # B's one block out and back
    assert max(s[4] for s in steps) == 1            # one CPU block held while B is out (G/D3)
    assert out["peak_swapped_gib"] > 0


def test_S6_abort_can_fall_back_to_recompute_instead(tmp_path):
    out, events, _ = replay(tmp_path, "--preemption-mode", "swap", "--on-swap-full", "recompute",
                            "--num-gpu-blocks-override", "2", "--num-cpu-blocks-override", "2")
    assert out["status"] == "completed" and out["swap_full_events"] >= 1
    assert any(kind == "swap_full_fallback" for _, _, kind, _ in events)


def test_v0_runs_carry_vllms_rate_limited_preemption_warning(tmp_path):
    """Reference A5: the 1st, 51st, ... preemption logs the exact WARNING text."""
    out, _, _ = replay(tmp_path, "--num-gpu-blocks-override", "2", "--num-cpu-blocks-override", "2")
    con = duckdb.connect(str(tmp_path / "k.duckdb"), read_only=True)
    lines = con.sql("SELECT log_line FROM events WHERE log_line IS NOT NULL").fetchall()
    con.close()
    assert lines == [("Sequence group 1 is preempted by PreemptionMode.RECOMPUTE mode because there "
                      "is not enough KV cache space. This can affect the end-to-end performance. "
                      "Increase gpu_memory_utilization or tensor_parallel_size to provide more KV "
                      "cache memory. total_num_cumulative_preemption=1",)]
