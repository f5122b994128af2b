"""Issue 36 item 6: a worker that dies (the out-of-memory killer, a crash) gives one line naming
the replay and the likely cause, a non-zero exit, no traceback and no hang; the broken pool is
dropped and the next sweep gets a fresh one. The worker is killed by the test-only hook
KVCAP_TEST_KILL_LABEL (capacity/analyses/sweep.py: a worker given a replay whose label holds
it sends itself SIGKILL)."""
from __future__ import annotations

import os
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
