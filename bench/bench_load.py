"""Benchmark: trace loading time and peak memory (recorded results, not a timed test).

Cases, each in a fresh subprocess so its peak RSS is its own:
- the Azure conv trace from ../shared/traces (19,366 rows; target well under 1 s),
- a 10-million-row generic CSV and the same rows as Parquet, generated into /tmp (or --dir), loaded
  through `load_trace` with a column mapping (lazy scans of only the mapped columns).
Prints a markdown table: rows, file size, wall seconds (best of --repeat), peak RSS.

    .venv/bin/python bench/bench_load.py [--rows 10000000] [--repeat 3] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
MAPPING = {"t_ms": "arrival_s", "prompt": "prompt_tokens", "output": "output_tokens", "user": "tenant"}


def generate(rows: int, directory: Path) -> tuple[Path, Path]:
    import numpy as np
    import polars as pl

    csv, parquet = directory / f"kvcap_bench_{rows}.csv", directory / f"kvcap_bench_{rows}.parquet"
    if csv.exists() and parquet.exists():
        return csv, parquet
    rng = np.random.default_rng(0)
    df = pl.DataFrame({
        "t_ms": np.cumsum(rng.exponential(10.0, rows)).round(3),
        "prompt": rng.lognormal(6.93, 0.5, rows).astype(np.int64) + 1,
        "output": rng.lognormal(4.86, 0.99, rows).astype(np.int64) + 1,
        "user": rng.choice(np.array(["alice", "bob", "carol"]), rows),
        "status": np.full(rows, "ok"),
    })
    df.write_csv(csv)
    df.write_parquet(parquet)
    return csv, parquet


def run_case(path: str, mapped: bool) -> dict:
    """In the child: load once, report wall time, rows and peak RSS."""
    sys.path.insert(0, str(REPO))
    from traces.loaders import load_trace

    start = time.perf_counter()
    df = load_trace(path, mapping=MAPPING if mapped else None, time_unit="ms" if mapped else None)
    wall_s = time.perf_counter() - start
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"rows": len(df), "wall_s": wall_s, "peak_rss_mib": peak_rss_mib}


def measure(label: str, path: Path, mapped: bool, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--child", str(path)] + (["--mapped"] if mapped else []),
                             check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout))
    best = min(runs, key=lambda r: r["wall_s"])
    return {"case": label, "rows": best["rows"], "size_mib": path.stat().st_size / 2**20,
            "wall_s": best["wall_s"], "peak_rss_mib": max(r["peak_rss_mib"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--child")
    ap.add_argument("--mapped", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child, args.mapped)))
        return
    results = []
    conv = SHARED / "AzureLLMInferenceTrace_conv.csv"
    if conv.is_file():
        results.append(measure("Azure conv CSV", conv, False, args.repeat))
    csv, parquet = generate(args.rows, args.dir)
    results.append(measure("generic CSV (mapped, ms)", csv, True, args.repeat))
    results.append(measure("generic Parquet (mapped, ms)", parquet, True, args.repeat))
    print("| case | rows | file MiB | load s (best of %d) | peak RSS MiB |" % args.repeat)
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['case']} | {r['rows']:,} | {r['size_mib']:,.1f} | {r['wall_s']:.3f} | {r['peak_rss_mib']:,.0f} |")


if __name__ == "__main__":
    main()
