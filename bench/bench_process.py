"""Benchmark: the whole `kvcap replay` process (interpreter start, imports, trace load, replay,
DuckDB write, summary), wall seconds and peak RSS from `/usr/bin/time -v`, each case in a fresh
process writing a fresh DB (recorded results, not a timed test).

Cases: Azure conv, Mooncake conversation, Azure conv repeated 10x one after the other (193,660
requests: the memory target), and optionally a synthetic Poisson trace of --synth-requests
requests at 15 req/s (1M: the speed target; 10M: the memory bound of issue 13). Traces made here
go to --dir (default $TMPDIR), never into the repository.

    .venv/bin/python bench/bench_process.py [--synth-requests 1000000] [--repeat 3] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
KVCAP = Path(sys.executable).parent / "kvcap"


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


def measure(trace: Path, work: Path) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one `kvcap replay` into a fresh DB."""
    db = work / "bench.duckdb"
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    res = subprocess.run(["/usr/bin/time", "-v", str(KVCAP), "replay", str(trace), "--db", str(db),
                          "--json"], capture_output=True, text=True, check=True)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", res.stderr)[1]
    secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.split(":"))))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)[1]) / 1024
    return secs, rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth-requests", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvcap-bench-", dir=args.dir))
    cases = {"azure-conv": lambda: SHARED / "AzureLLMInferenceTrace_conv.csv",
             "mooncake": lambda: SHARED / "conversation_trace.jsonl",
             "azure-conv x10": lambda: conv_times_10(work)}
    if args.synth_requests:
        cases[f"poisson {args.synth_requests:,}"] = lambda: synthetic(work, args.synth_requests)
    only = [c for c in args.only.split(",") if c]
    print("| trace | wall s (best of n) | peak RSS MiB (max) |\n|---|---:|---:|")
    for name, make in cases.items():
        if only and name not in only:
            continue
        trace = make()
        runs = [measure(trace, work) for _ in range(args.repeat)]
        print(f"| {name} | {min(r[0] for r in runs):.2f} | {max(r[1] for r in runs):,.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
