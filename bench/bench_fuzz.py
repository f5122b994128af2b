"""Benchmark: random mutations of every evidence format through the CLI (issue 34), counting clean
refusals, acceptances, tracebacks, hangs and accepted nonsense (recorded results, not a timed
test; the table is in docs/reliability.md).

Formats and commands (tests/evidence_mutations.py): vLLM server logs of the V0 and V1 eras, a
Prometheus text scrape file, a query_range JSON export and generic client CSV, each through
`kvcap logs FILE --db NEW --json`; a `vllm bench serve` result through `kvcap logs` and `kvcap
trace info`. Mutations: tests/trace_mutations.py's operations with evidence payloads, 1 to 4 per
file, a fixed seed. Each case runs in this process (CliRunner), under a per-case timeout
(SIGALRM) that counts a hang apart from a traceback. "Clean errors": exit 2 with one line
`kvcap: error: ...` and no database left behind; "accepted": exit 0 with no stored value vLLM
could not have produced (a negative latency, count or rate, KV usage over 100 %, decreasing
histogram buckets: `nonsense` otherwise). Failing mutants are kept in --keep.

    .venv/bin/python bench/bench_fuzz.py [--per-format 1000] [--seed 0] [--timeout-s 30] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU ({cpu}), Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-format", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=int, default=30)
    ap.add_argument("--keep", type=Path, default=None, help="Copy failing mutants here.")
    ap.add_argument("--formats", default=None, help="Comma-separated subset (default: all).")
    a = ap.parse_args()
    from tests.evidence_mutations import SEEDS, long_run
    formats = a.formats.split(",") if a.formats else list(SEEDS)
    t0 = time.perf_counter()
    summary = long_run(a.per_format, a.seed, timeout_s=a.timeout_s, keep=a.keep, formats=formats)
    total = time.perf_counter() - t0
    print(f"Evidence fuzzing, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}: "
          f"`{' '.join(['bench/bench_fuzz.py', *sys.argv[1:]])}` ({total:,.0f} s)\n")
    print("| format | commands | mutations | clean errors | accepted | tracebacks | hangs | accepted nonsense | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    sums = dict.fromkeys(("mutations", "error", "accepted", "traceback", "hang", "nonsense"), 0)
    for name in formats:
        s = summary[name]
        cmds = " + ".join(f"`{' '.join(c[:2]) if c[0] == 'trace' else c[0]}`" for c in SEEDS[name][2])
        print(f"| {name} | {cmds} | {s['mutations']:,} | {s['error']:,} | {s['accepted']:,} | "
              f"{s['traceback']} | {s['hang']} | {s['nonsense']} | {s['wall_s']:.0f} |")
        for k in sums:
            sums[k] += s[k]
    print(f"| all | | {sums['mutations']:,} | {sums['error']:,} | {sums['accepted']:,} | "
          f"{sums['traceback']} | {sums['hang']} | {sums['nonsense']} | {total:.0f} |")
    bad = sums["traceback"] + sums["hang"] + sums["nonsense"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
