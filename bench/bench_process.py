"""Benchmark: the whole `kvcap replay` process (interpreter start, imports, trace load, replay,
DuckDB write, summary): wall seconds, CPU seconds (user + system) and peak RSS from
`/usr/bin/time -v`, each run a fresh process writing a fresh DB (recorded results, not a timed
test). Reports min and median of --repeat runs: on a shared machine the min is the number to
compare, and CPU seconds move less with the load than wall seconds do.

Cases: Azure conv, Mooncake conversation, Azure conv repeated 10x one after the other (193,660
requests: the memory target), and optionally a synthetic Poisson trace of --synth-requests
requests at 15 req/s (1M: the speed target; 10M: the memory bound of issue 13). Traces made here
go to --dir (default $TMPDIR), never into the repository.

`--baseline DIR` (a checkout of another commit, e.g. `git archive <commit> | tar -x -C DIR`
with the compiled cores copied in) runs that code too, interleaved run by run with this one
(same load for both), through this virtual environment with PYTHONPATH=DIR.

Bytecode is cached as in an installed kvcap: the processes run without PYTHONDONTWRITEBYTECODE
(which the development machines set) and with PYTHONPYCACHEPREFIX in the work folder, each
case starting with one unmeasured run that fills the cache. Without the cache every process
compiles kvcap's modules from source again (~0.07 s of CPU for `kvcap replay`).

    .venv/bin/python bench/bench_process.py [--only azure-conv,mooncake] [--repeat 5]
        [--synth-requests 1000000] [--dir /tmp] [--baseline /tmp/base]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
# What the `kvcap` executable runs (its entry point; `main` where a checkout has no `console`),
# so a baseline checkout runs its own entry point through this environment.
KVCAP = [sys.executable, "-c", "import sys, capacity.cli as c; sys.argv[0] = 'kvcap'; "
         "sys.exit(getattr(c, 'console', c.main)())"]


def conv_times_10(out: Path) -> Path:
    """Azure conv ten times over, each copy starting where the previous one ended."""
    import polars as pl

    from traces.loaders import load_trace, write_trace
    conv = load_trace(SHARED / "AzureLLMInferenceTrace_conv.csv")
    span = float(conv["arrival_s"].max()) + 1.0
    n = conv.height
    copies = [conv.with_columns(pl.col("arrival_s") + k * span,
                                pl.col("request_id") + k * n) for k in range(10)]
    path = out / "conv_x10.parquet"
    write_trace(pl.concat(copies), path)
    return path


def synthetic(out: Path, requests: int) -> Path:
    from traces.loaders import write_trace
    from traces.synth import synthesize
    path = out / f"poisson_{requests}.parquet"
    write_trace(synthesize("poisson", duration_s=requests / 15.0, rate_rps=15.0), path)
    return path


def _seconds(clock: str) -> float:
    return sum(float(x) * 60 ** i for i, x in enumerate(reversed(clock.split(":"))))


def measure(trace: Path, work: Path, code: Path | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one `kvcap replay --json` into a fresh DB; `code`: run
    the kvcap of that checkout instead of this one."""
    db = work / "bench.duckdb"
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache" / (code.name if code else "this"))
    if code:
        env["PYTHONPATH"] = str(code)
    res = subprocess.run(["/usr/bin/time", "-v", *KVCAP, "replay", str(trace), "--db", str(db),
                          "--json"], capture_output=True, text=True, check=True, env=env, cwd=work)
    field = lambda name: re.search(rf"{re.escape(name)}: (\S+)", res.stderr)[1]  # noqa: E731
    wall = _seconds(field("Elapsed (wall clock) time (h:mm:ss or m:ss)"))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return wall, cpu, int(field("Maximum resident set size (kbytes)")) / 1024


def row(name: str, runs: list[tuple[float, float, float]]) -> str:
    wall, cpu, rss = zip(*runs)
    return (f"| {name} | {min(wall):.2f} / {statistics.median(wall):.2f} | "
            f"{min(cpu):.2f} / {statistics.median(cpu):.2f} | {max(rss):,.0f} | {len(runs)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth-requests", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="checkout of other code to run interleaved with this one")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvcap-bench-", dir=args.dir))
    cases = {"azure-conv": lambda: SHARED / "AzureLLMInferenceTrace_conv.csv",
             "mooncake": lambda: SHARED / "conversation_trace.jsonl",
             "azure-conv x10": lambda: conv_times_10(work)}
    if args.synth_requests:
        cases[f"poisson {args.synth_requests:,}"] = lambda: synthetic(work, args.synth_requests)
    only = [c for c in args.only.split(",") if c]
    print(f"load average before: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("| trace | wall s min / median | CPU s min / median | peak RSS MiB (max) | runs |\n"
          "|---|---:|---:|---:|---:|")
    for name, make in cases.items():
        if only and name not in only:
            continue
        trace = make()
        measure(trace, work)                    # fills the bytecode caches (not counted)
        if args.baseline:
            measure(trace, work, args.baseline)
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(measure(trace, work))
            if args.baseline:
                theirs.append(measure(trace, work, args.baseline))
        print(row(name, ours), flush=True)
        if args.baseline:
            print(row(f"{name} (baseline {args.baseline.name})", theirs), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
