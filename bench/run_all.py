"""Run every benchmark in turn and print their markdown tables (numbers go into docs/benchmarks.md).

    .venv/bin/python bench/run_all.py            # or: make bench
"""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for script in ("bench_load.py", "bench_replay.py", "bench_report.py"):
    print(f"\n## {script}\n", flush=True)
    subprocess.run([sys.executable, str(HERE / script)], check=False)
