"""One replay's peak RSS against trace length (issue 36): the first 1 h, 6 h and 24 h of the
diurnal day (`kvcap trace synth diurnal --duration-s 86400 --rate 10 --lengths azure-conv`),
replayed with full tables in memory, with full tables spilled to files past a million steps (what
a plan's baseline and recommended replays do: `Planner.replay`), and as a summary replay
(replay/results/summary.py, what a search's probes do), each in a fresh process. Prints a
markdown table (the process's peak RSS includes the interpreter, polars and the loaded trace:
"before" is that part).

    nice .venv/bin/python bench/bench_memory.py [--hours 1,6,24]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"
CHILD = r"""
import json, resource, sys, tempfile, time
import polars as pl
from replay.config import EngineConfig
from replay.results.summary import SummarySpec
from replay.run import replay
from traces.loaders import load_trace
path, mode, hours = sys.argv[1], sys.argv[2], float(sys.argv[3])
trace = load_trace(path).filter(pl.col("arrival_s") < hours * 3600)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
spec = {"full": None, "spilled": None, "summary": SummarySpec(tbt_quantiles=(0.99,)),
        "summary+median": SummarySpec()}[mode]
spill = tempfile.gettempdir() if mode == "spilled" else None
res = replay(trace, EngineConfig(), summary=spec, spill_dir=spill)
print(json.dumps({"requests": trace.height, "steps": res.run["num_steps"],
                  "wall_s": time.perf_counter() - t0, "before_mib": before / 1024,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", default="1,6,24")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="kvcap-bench-memory-") as d:
        day = Path(d) / "diurnal-24h.parquet"
        subprocess.run([sys.executable, "-c", MAIN, "trace", "synth", "diurnal", "--duration-s",
                        "86400", "--rate", "10", "--lengths", "azure-conv", "-o", str(day)],
                       check=True, env=env, capture_output=True)
        print("| hours | requests | steps | replay | wall s | peak RSS (MiB) | before replay (MiB) |")
        print("|---:|---:|---:|---|---:|---:|---:|", flush=True)
        for h in args.hours.split(","):
            for mode in ("full", "spilled", "summary", "summary+median"):
                out = subprocess.run([sys.executable, "-c", CHILD, str(day), mode, h], env=env,
                                     capture_output=True, text=True, check=True, cwd=ROOT)
                r = json.loads(out.stdout)
                name = {"full": "full tables", "spilled": "full tables, spilled",
                        "summary": "summary (TBT P99)",
                        "summary+median": "summary (TBT P50 + P99)"}[mode]
                print(f"| {h} | {r['requests']:,} | {r['steps']:,} | {name} | {r['wall_s']:.1f} | "
                      f"{r['peak_mib']:,.0f} | {r['before_mib']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
