"""Full tables vs. summary replays for a search (issue 36 item 1): the same probes of a trace at a
few rate scales, scored with headroom's `load_point`, (a) as today's searches do it
(`Planner.run` returns every replay's tables, scored in the parent) and (b) with `Planner.map`
(scored in the worker on a summary replay). Prints wall seconds, the peak RSS of the largest
process and of the parent (MiB), and whether the points are identical.

    nice .venv/bin/python bench/bench_summary.py [TRACE] [--scales 0.5,0.75,1,1.25] [--workers 2]
"""
from __future__ import annotations

import argparse
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"

CHILD = r"""
import pickle, resource, sys, time
sys.path.insert(0, sys.argv[1])
from capacity.analyses.criteria import Budget
from capacity.analyses.headroom import load_point
from capacity.analyses.planner import Planner, reducer
from capacity.analyses.sweep import Job
from replay.config import EngineConfig
from traces.loaders import load_trace
from traces.transforms import scale_rate
mode, path, workers = sys.argv[2], sys.argv[3], int(sys.argv[4])
scales = [float(s) for s in sys.argv[5].split(",")]
trace = load_trace(path)
kw = dict(surge=False, slo_ttft_p99_s=2.0, slo_tbt_p99_s=0.2, budget=Budget())
jobs = [Job(trace=scale_rate(trace, s), config=EngineConfig(), label=f"x{s:g}") for s in scales]
t0 = time.perf_counter()
p = Planner(workers=workers)
if mode == "tables":
    points = [load_point(r.tables(), rate_scale=s, **kw) for s, r in zip(scales, p.run(jobs))]
else:
    points = p.map(jobs, [reducer(load_point, rate_scale=s, **kw) for s in scales])
wall = time.perf_counter() - t0
from capacity.analyses import sweep
for pool in list(sweep._POOL.values()):
    pool.shutdown(wait=True)           # reaped: their peak RSS counts in RUSAGE_CHILDREN
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stdout.buffer.write(pickle.dumps((wall, me, kids, points)))
"""


def run(mode: str, trace: str, workers: int, scales: str):
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), mode, trace, str(workers),
                          scales], capture_output=True, check=True)
    return pickle.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", default=str(CONV))
    ap.add_argument("--scales", default="0.5,0.75,1,1.25")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="tables,summary", help="tables, summary or both")
    a = ap.parse_args()
    res = {m: run(m, a.trace, a.workers, a.scales) for m in a.modes.split(",")}
    print("| probes scored from | wall s | peak RSS, parent (MiB) | peak RSS, largest worker (MiB) |")
    print("|---|---:|---:|---:|")
    for m, (wall, me, kids, _) in res.items():
        print(f"| {'full tables (Planner.run)' if m == 'tables' else 'summaries (Planner.map)'} | "
              f"{wall:.1f} | {me / 1024:,.0f} | {kids / 1024:,.0f} |")
    same = (all(x == y for x, y in zip(res["tables"][3], res["summary"][3]))
            if len(res) == 2 else "not compared")
    print(f"\n{Path(a.trace).name}, scales {a.scales}, {a.workers} workers: points identical: "
          f"{same}")
    for p in next(iter(res.values()))[3]:
        print(f"x{p.rate_scale:g}: ok={p.ok} sustainable={p.sustainable} TTFT p99 "
              f"{p.ttft_p99_s} TBT p99 {p.tbt_p99_s} verdict {p.verdict}")


if __name__ == "__main__":
    main()
