"""Issue 36 item 6: a worker that dies (the out-of-memory killer, a crash) gives one line naming
the replay and the likely cause, a non-zero exit, no traceback and no hang; the broken pool is
dropped and the next sweep gets a fresh one. The worker is killed by the test-only hook
KVCAP_TEST_KILL_LABEL (capacity/analyses/sweep.py: a worker given a replay whose label holds
it sends itself SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from capacity.analyses import sweep
from capacity.analyses.planner import Planner, summary_reducer
from capacity.analyses.sweep import Job, WorkerDied
from replay.config import EngineConfig
from traces.loaders import load_trace

from capacity_helpers import CONV, ROOT, conv800  # noqa: F401


# kvcap from this checkout (the installed `kvcap` script may import another one).
KVCAP_MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"


@pytest.fixture(scope="module")
def small():
    return load_trace(CONV).head(300)


def test_killed_worker_is_one_line_naming_the_replay(small, monkeypatch):
    monkeypatch.setenv(sweep._KILL_ENV, "doomed")
    sweep._discard(2)               # workers spawned by earlier tests do not have the variable
    jobs = [Job(trace=small, config=EngineConfig(max_num_seqs=s), label=f"probe {s}")
            for s in (8, 16)] + [Job(trace=small, config=EngineConfig(), label="doomed probe")]
    with pytest.raises(WorkerDied) as e:
        Planner(workers=2).run(jobs)
    msg = str(e.value)
    assert "\n" not in msg and "'doomed probe'" in msg
    assert "SIGKILL" in msg and "out of memory" in msg and "--workers (now 2)" in msg
    assert 2 not in sweep._POOL                      # the broken pool was dropped
    with pytest.raises(WorkerDied, match="doomed probe"):   # the reducer path too
        Planner(workers=2).map(jobs, summary_reducer())
    monkeypatch.delenv(sweep._KILL_ENV)
    assert len(Planner(workers=2).run(jobs[:2])) == 2        # a fresh pool works


class _Proc:
    """What break_pool and died_message read of a worker process. `unread`: how many first reads
    of exitcode give None although the process has ended (another thread is reaping it)."""

    def __init__(self, pid: int, exitcode: int | None, *, unread: int = 0) -> None:
        self.pid, self._exitcode, self._unread = pid, exitcode, unread
        r, w = os.pipe()                    # the sentinel: ready once the write end is closed
        self.sentinel, self._w = r, w
        if exitcode is not None:
            os.close(w)

    @property
    def exitcode(self) -> int | None:
        if self._unread:
            self._unread -= 1
            return None
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        pass

    def kill(self) -> None:
        self._exitcode = -9
        os.close(self._w)                   # ended: its sentinel is ready, as a real one's


class _Pool:
    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def test_a_reused_pid_does_not_hide_the_worker_that_died(tmp_path):
    # break_pool stopped a worker of an earlier pool; a long session (the test suite: pids wrap
    # at 32,768 here) gives its pid to a later worker, which the out-of-memory killer then
    # kills. The message still names that worker's replay, not a worker the pool stopped.
    stopped = _Proc(4242, None)
    sweep.break_pool(_Pool(), {4242: stopped})
    assert stopped.exitcode == -signal.SIGKILL
    killed = _Proc(4242, -signal.SIGKILL)
    terminated = _Proc(4243, -signal.SIGTERM)          # the pool's own SIGTERM to the other one
    (tmp_path / "4242").write_text("1048576\ndoomed replay")
    msg = str(sweep.died_message([terminated, killed], str(tmp_path), 2))
    assert "'doomed replay'" in msg and "SIGKILL" in msg and "1.0 GiB" in msg


def test_the_worker_that_died_is_named_while_the_pool_is_still_reaping_it(tmp_path):
    # The pool's thread reaps the dead worker (waitpid) and sets its exit code a moment later,
    # holding for the GIL in between; meanwhile exitcode reads None here. break_pool must not
    # take it for a live worker it stopped, nor died_message name the worker that the pool
    # terminated instead (the full suite on 2 cores hit this once).
    doomed = _Proc(5151, -signal.SIGKILL, unread=3)
    terminated = _Proc(5152, -signal.SIGTERM)
    sweep.break_pool(_Pool(), {5152: terminated, 5151: doomed})
    assert doomed not in sweep._KILLED
    (tmp_path / "5151").write_text("2097152\ndoomed replay")
    (tmp_path / "5152").write_text("1048576\nprobe 16")
    msg = str(sweep.died_message([terminated, doomed], str(tmp_path), 2))
    assert "'doomed replay'" in msg and "SIGKILL" in msg and "2.0 GiB" in msg


def test_cli_says_which_replay_died(conv800):                 # noqa: F811
    # The smallest candidates always replay (a larger one may reuse them: map_shared); two
    # batched-token values make two of them, so the round goes to the pool.
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               **{sweep._KILL_ENV: "max_num_seqs=8 max_num_batched_tokens=1024"})
    res = subprocess.run([sys.executable, "-c", KVCAP_MAIN, "tune", str(conv800),
                          "--max-num-seqs-grid", "8,16", "--workers", "2",
                          "--max-num-batched-tokens-grid", "1024,2048",
                          "--slo-ttft-p99", "2", "--slo-tbt-p99", "0.2"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kvcap: error")]
    assert len(lines) == 1 and "worker process was killed" in lines[0], res.stderr
    assert "'tune max_num_seqs=8 max_num_batched_tokens=1024'" in lines[0]


# Issue 34 item 2: a worker killed while sending its result left half a message in CPython's
# shared result pipe: the pool never noticed and `kvcap sweep` waited forever (no CPU, no DB).
# Each case runs in a subprocess with a timeout, so a hang fails the test instead of the suite.
SWEEP_HALF_MESSAGE = """
import polars as pl
from capacity.analyses import distributed
from capacity.analyses.sweep import WorkerDied
from replay.config import EngineConfig
from dead_worker_helpers import sweep_work
trace = pl.DataFrame({"arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [5]})
pts = [distributed.SweepPoint(index=i, config=EngineConfig(), rate_scale=1.0, trace_key="t",
                              label=lab, run_id=str(i))
       for i, lab in enumerate(["a", "b", "doomed c", "d"])]
try:
    distributed._run_local(pts, {"t": trace}, work=sweep_work, address=None, workers=2,
                           retries=1, on_result=lambda *a: None)
except WorkerDied as e:
    print("DIED", e)
"""

POOL_HALF_MESSAGE = """
from capacity.analyses import sweep
from dead_worker_helpers import task
try:
    sweep.execute_on(2, task, [(k, (k,)) for k in ("a", "b", "doomed", "d")],
                     on_result=lambda k, v: None)
except sweep.WorkerDied as e:
    print("DIED", e)
print("FRESH", sweep.in_worker(task, "x"))
"""


@pytest.mark.parametrize("script", [SWEEP_HALF_MESSAGE, POOL_HALF_MESSAGE], ids=["sweep", "pool"])
def test_worker_killed_mid_send_ends_the_command_within_seconds(script):
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}"), timeout=60)
    assert res.returncode == 0, res.stderr
    died = [ln for ln in res.stdout.splitlines() if ln.startswith("DIED")]
    assert len(died) == 1 and "killed (SIGKILL)" in died[0], res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    if script is SWEEP_HALF_MESSAGE:
        assert "'doomed c'" in died[0]
    else:
        assert "FRESH x" in res.stdout          # the broken pool was replaced


def test_cli_sweep_with_a_killed_worker_is_one_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                 "".join(f"{i * 0.1},{100 + i},{20 + i % 7}\n" for i in range(200)))
    db = tmp_path / "k.duckdb"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{sweep._KILL_ENV: "max_num_seqs=16"})
    res = subprocess.run([sys.executable, "-c", KVCAP_MAIN, "sweep", str(f), "--grid",
                          "max_num_seqs=8,16,32", "--workers", "2", "--db", str(db)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kvcap: error")]
    assert len(lines) == 1 and "'sweep max_num_seqs=16'" in lines[0], res.stderr
    assert "--workers (now 2)" in lines[0]
