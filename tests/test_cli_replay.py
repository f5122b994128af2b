"""`kvcap replay` / `kvcap runs` from the command line: JSON keys (DESIGN §7), one-line errors,
the DuckDB file's tables (DESIGN §6)."""
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
KVCAP = str(Path(sys.executable).with_name("kvcap"))
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"

REPLAY_KEYS = {"run_id", "db", "status", "requests_finished", "requests_rejected",
               "preemptions_recompute", "preemptions_swap", "swap_full_events",
               "peak_swapped_gib", "ttft_p99_s", "tbt_p99_s", "wall_seconds"}


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    """The first 300 requests of the Azure conv trace, as kvcap Parquet."""
    from traces.loaders import load_trace, write_trace
    path = tmp_path_factory.mktemp("t") / "conv300.parquet"
    write_trace(load_trace(CONV).head(300), path)
    return path


def kvcap(*args, check=True):
    res = subprocess.run([KVCAP, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_replay_json_has_the_contract_keys_and_writes_the_db(small_trace, tmp_path):
    db = tmp_path / "k.duckdb"
    res = kvcap("replay", small_trace, "--db", db, "--json", "--num-gpu-blocks-override", "600", "--block-size", "16")
    out = json.loads(res.stdout)
    assert REPLAY_KEYS <= out.keys()
    assert out["requests_finished"] == 300 and out["status"] == "completed"
    assert out["preemptions_recompute"] > 0          # 600 blocks of 16 tokens is tight
    con = duckdb.connect(str(db), read_only=True)
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"runs", "requests", "steps", "events"} <= tables
    (n,), = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [out["run_id"]]).fetchall()
    assert n == 300
    cols = {r[0] for r in con.execute("DESCRIBE requests").fetchall()}
    assert {"request_id", "arrival_s", "first_token_s", "finish_s", "status", "num_preemptions",
            "num_swaps", "num_recomputes", "recomputed_tokens", "cached_prompt_tokens",
            "max_tbt_s"} <= cols
    con.close()
    listed = json.loads(kvcap("runs", "--db", db, "--json").stdout)
    assert [r["run_id"] for r in listed["runs"]] == [out["run_id"]]


def test_same_inputs_give_identical_tables(small_trace, tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    ra = json.loads(kvcap("replay", small_trace, "--db", a, "--json",
                          "--num-gpu-blocks-override", "600", "--block-size", "16").stdout)
    rb = json.loads(kvcap("replay", small_trace, "--db", b, "--json",
                          "--num-gpu-blocks-override", "600", "--block-size", "16").stdout)
    assert ra["run_id"] == rb["run_id"]
    for table, order in (("requests", "request_id"), ("steps", "step"), ("events", "t_s, request_id")):
        qa = duckdb.connect(str(a), read_only=True).sql(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
        qb = duckdb.connect(str(b), read_only=True).sql(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
        assert qa == qb, table


@pytest.mark.parametrize("args,needle", [
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--preemption-mode", "bogus"], "preemption_mode"),
    (["--model", "no-such-model"], "model"),
    (["--scheduler", "v0", "--scheduling-policy", "priority", "--preemption-mode", "swap"], "priority"),
    # V1 has no swap: the error points at V1's host tier.
    (["--preemption-mode", "swap"], "--kv-offloading-size"),
])
def test_bad_flags_give_one_line_errors(small_trace, tmp_path, args, needle):
    res = kvcap("replay", small_trace, "--db", tmp_path / "x.duckdb", *args, check=False)
    assert res.returncode == 2
    lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvcap: error:") and needle in lines[0], res.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_missing_file_is_a_one_line_error(tmp_path):
    res = kvcap("replay", tmp_path / "nope.csv", check=False)
    assert res.returncode == 2 and "no such file" in res.stderr


def test_locked_database_is_reported_not_a_traceback(small_trace, tmp_path):
    db = tmp_path / "k.duckdb"
    holder = subprocess.Popen([sys.executable, "-c",
                               f"import duckdb,time; c=duckdb.connect({str(db)!r}); print('ok', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        res = kvcap("replay", small_trace, "--db", db, "--json", check=False)
        assert res.returncode == 2 and "locked by another process" in res.stderr
        assert "Traceback" not in res.stderr
    finally:
        holder.kill(); holder.wait()


@pytest.fixture(scope="module")
def million_trace(tmp_path_factory):
    """A 1,000,000-request synthetic trace: ~10 s in the compiled core, so a signal lands inside."""
    from traces.loaders import write_trace
    from traces.synth import synthesize
    path = tmp_path_factory.mktemp("t") / "synth1m.parquet"
    write_trace(synthesize("poisson", duration_s=1_000_000 / 15, rate_rps=15.0), path)
    return path


@pytest.mark.parametrize("path", ["python", "core"])
def test_interrupted_replay_leaves_no_partial_run(small_trace, tmp_path, path, request):
    """Ctrl-C during a replay (the Python reference loop, or inside the compiled core): exit
    130, one line, and the DuckDB file holds no part of that run."""
    import signal
    import time
    db = tmp_path / "k.duckdb"
    kvcap("replay", small_trace, "--db", db, "--json")  # a finished run in the file must survive
    args = [str(CONV), "--reference"] if path == "python" else \
        [str(request.getfixturevalue("million_trace"))]
    proc = subprocess.Popen([KVCAP, "replay", *args, "--db", str(db), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Interrupt the replay, not the interpreter's start (seconds on a loaded machine): wait until
    # the command body has imported the engine (its compiled core is mapped), then a little more.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            "_core.cpython" not in Path(f"/proc/{proc.pid}/maps").read_text():
        time.sleep(0.1)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 130, errs
    assert "interrupted" in errs and "Traceback" not in errs
    con = duckdb.connect(str(db), read_only=True)
    (runs,), = con.execute("SELECT count(*) FROM runs").fetchall()
    (orphans,), = con.execute("SELECT count(*) FROM requests WHERE run_id NOT IN "
                              "(SELECT run_id FROM runs)").fetchall()
    con.close()
    assert runs == 1 and orphans == 0


def test_record_batches_stores_every_step_batch_and_a_rerun_without_drops_it(small_trace, tmp_path):
    """`--record-batches`: one `batches` row per request per step, in batch order (seq), whose
    tokens add up to the step's; the other tables are the run without it; a rerun without the
    flag replaces the run and leaves no batches behind."""
    db, plain = tmp_path / "b.duckdb", tmp_path / "p.duckdb"
    args = (small_trace, "--json", "--num-gpu-blocks-override", "600", "--block-size", "16")
    out = json.loads(kvcap("replay", *args, "--db", db, "--record-batches").stdout)
    json.loads(kvcap("replay", *args, "--db", plain).stdout)
    con = duckdb.connect(str(db), read_only=True)
    bad, = con.execute("""
        SELECT count(*) FROM steps s LEFT JOIN (
            SELECT step, sum(num_new_tokens) AS tok, count(*) AS n, max(seq) AS top
            FROM batches WHERE run_id = $1 GROUP BY step) b USING (step)
        WHERE s.run_id = $1 AND (coalesce(b.tok, 0) != s.num_prefill_tokens + s.num_decode_tokens
                                 OR coalesce(b.top + 1, 0) != coalesce(b.n, 0))""",
                       [out["run_id"]]).fetchone()
    assert bad == 0
    kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM batches").fetchall()}
    assert kinds == {"new", "resumed", "running"}      # 600 blocks: preemptions, then resumes
    n_b, = con.execute("SELECT count(*) FROM batches").fetchone()
    steps_b = con.execute("SELECT * EXCLUDE (run_id) FROM steps ORDER BY step").fetchall()
    con.close()
    con = duckdb.connect(str(plain), read_only=True)
    assert con.execute("SELECT count(*) FROM batches").fetchone() == (0,)
    assert con.execute("SELECT * EXCLUDE (run_id) FROM steps ORDER BY step").fetchall() == steps_b
    con.close()
    assert n_b > 300
    kvcap("replay", *args, "--db", db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM batches").fetchone() == (0,)
    con.close()


def test_async_scheduling_flag_is_recorded_and_says_which_loop(small_trace, tmp_path):
    """`--async-scheduling/--no-async-scheduling` (V1): the runs table and the JSON name the loop
    replayed; the async loop finishes every request too and, applying outputs a step late,
    needs at least as many steps (blocks come back a step later)."""
    db = tmp_path / "a.duckdb"
    args = (small_trace, "--json", "--db", db, "--num-gpu-blocks-override", "600", "--block-size", "16")
    a = json.loads(kvcap("replay", *args, "--async-scheduling").stdout)
    s = json.loads(kvcap("replay", *args, "--no-async-scheduling").stdout)
    assert (a["scheduler_loop"], s["scheduler_loop"]) == ("async", "sync")
    assert a["run_id"] != s["run_id"]
    assert a["requests_finished"] == s["requests_finished"] == 300
    assert a["steps"] >= s["steps"]
    con = duckdb.connect(str(db), read_only=True)
    rows = dict(con.execute("SELECT run_id, async_scheduling FROM runs").fetchall())
    con.close()
    assert rows == {a["run_id"]: True, s["run_id"]: False}
    res = kvcap("replay", small_trace, "--scheduler", "v0", "--async-scheduling", "--db", db,
                check=False)
    assert res.returncode == 2 and "async_scheduling: a V1 scheduler knob" in res.stderr
