"""Issue 13: `kvcap report`'s worker processes (spawned pool of capacity/analyses/sweep.py, plus
multiprocessing's resource tracker) die with a parent killed by SIGKILL instead of living on
with its stdout pipe."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import time
from multiprocessing import resource_tracker
from capacity.analyses import sweep
pool = sweep._pool(2)
futures = [pool.submit(time.sleep, 600) for _ in range(2)]
while len(pool._processes) < 2 or not all(p.pid for p in pool._processes.values()):
    time.sleep(0.05)
time.sleep(1.0)             # both workers past their initializer
pids = [p.pid for p in pool._processes.values()] + [resource_tracker._resource_tracker._pid]
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")      # a zombie is dead (the container's init may not reap it)


def test_workers_die_with_a_killed_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        pids = [int(p) for p in parent.stdout.readline().split() if p != "None"]
        assert len(pids) >= 2 and all(_alive(p) for p in pids)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes {left} outlived their killed parent"
