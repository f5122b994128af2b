"""A day of traffic (issue 36 item 5): `kvcap report`, `kvcap plan` and `kvcap headroom` on a
24-hour diurnal trace (`kvcap trace synth diurnal --duration-s 86400 --rate 10 --lengths
azure-conv`, ~865k requests) and a 24-hour Mooncake-like one with prefix hashes (the
conversation trace tiled over 24 h, fresh hash ids per copy), plus the first 1 h and 6 h of the
diurnal day (peak RSS against trace length), and Azure conv for reference. Prints a markdown
table: wall seconds and peak RSS per command.

Peak RSS is of the whole process tree: kvcap and its worker processes. Two numbers: `max proc`
(the largest single process: getrusage(RUSAGE_CHILDREN).ru_maxrss of a fresh wrapper process per
command, which counts every descendant reaped) and `tree` (the largest sum over the tree, polled
every 0.2 s with psutil). Traces are built in a temporary folder (never in the repository).

    nice .venv/bin/python bench/bench_day.py [--only conv,diurnal-1h,...] [--commands report,...]
                                             [--workers 2] [--timeout-s 1800]

Runs one command at a time; the 24-hour scenarios take many minutes each.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# KVCAP_ROOT: measure another checkout with this script.
ROOT = Path(os.environ.get("KVCAP_ROOT") or Path(__file__).resolve().parents[1])
SHARED = Path(os.environ.get("KVCAP_TRACES", ROOT.parent / "shared" / "traces"))
# kvcap from this checkout (the installed `kvcap` script may import another one).
MAIN = "import sys; from capacity.cli import console; sys.argv[0] = 'kvcap'; console()"
# A wrapper that runs one command and reports the largest descendant's peak RSS.
WRAP = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc, file=sys.stderr)")
SLO = ["--slo-ttft-p99", "2", "--slo-tbt-p99", "0.2"]
COMMANDS = {
    "report": lambda f, out: ["report", str(f), "-o", str(out), *SLO, "--json"],
    "plan": lambda f, out: ["plan", str(f), *SLO, "--json"],
    "headroom": lambda f, out: ["headroom", str(f), *SLO, "--json"],
}


def kvcap(*args: str) -> list[str]:
    return [sys.executable, "-c", MAIN, *args]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), KVCAP_QUIET="1")


def diurnal(folder: Path, hours: float) -> Path:
    """The diurnal day (synthesized once), cut to its first `hours`."""
    day = folder / "diurnal-24h.parquet"
    if not day.exists():
        subprocess.run(kvcap("trace", "synth", "diurnal", "--duration-s", "86400", "--rate", "10",
                             "--lengths", "azure-conv", "-o", str(day)), check=True, env=env(),
                       capture_output=True)
    if hours >= 24:
        return day
    import polars as pl
    path = folder / f"diurnal-{hours:g}h.parquet"
    if not path.exists():
        pl.read_parquet(day).filter(pl.col("arrival_s") < hours * 3600).write_parquet(path)
    return path


def mooncake_day(folder: Path) -> Path:
    """conversation_trace.jsonl repeated back to back over 24 h; each copy's prefix hashes are
    shifted past every id of the copies before it (no prefix is shared across copies)."""
    import polars as pl
    sys.path.insert(0, str(ROOT))
    from traces.loaders import load_trace, write_trace
    path = folder / "mooncake-24h.parquet"
    if path.exists():
        return path
    one = load_trace(SHARED / "conversation_trace.jsonl")
    span = float(one["arrival_s"].max()) + 1.0
    top = int(one["prefix_hashes"].explode().max()) + 1
    copies = []
    for c in range(int(86400 // span) + 1):
        part = one.with_columns(arrival_s=pl.col("arrival_s") + c * span,
                                request_id=pl.col("request_id") + c * one.height,
                                prefix_hashes=pl.col("prefix_hashes").list.eval(
                                    pl.element() + c * top))
        copies.append(part.filter(pl.col("arrival_s") < 86400))
    write_trace(pl.concat(copies), path)
    return path


def measure(cmd: list[str], timeout_s: float, limit_gib: float) -> dict:
    """Wall seconds, the largest process's and the whole tree's peak RSS (MiB), exit code; the
    tree is killed past `timeout_s` or `limit_gib` of RSS (a shared machine)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", WRAP, *cmd], env=env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree = 0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        tree = max(tree, total)
        if time.perf_counter() - t0 > timeout_s or total > limit_gib * 2**30:
            for p in [*root.children(recursive=True), root]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    try:
        maxrss_kib, rc = (int(x) for x in err.strip().splitlines()[-1].split())
    except (IndexError, ValueError):        # the wrapper was killed (time or memory limit)
        maxrss_kib, rc = 0, -9
    return {"wall_s": wall, "max_proc_mib": maxrss_kib / 1024, "tree_mib": tree / 2**20,
            "rc": rc, "stdout": out, "stderr": err}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="conv,diurnal-1h,diurnal-6h,diurnal-24h,mooncake-24h")
    ap.add_argument("--commands", default="report,plan,headroom")
    ap.add_argument("--workers", default=None)
    ap.add_argument("--timeout-s", type=float, default=1800)
    ap.add_argument("--limit-gib", type=float, default=10.0, help="kill a command past this RSS")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcap-bench-day-") as d:
        folder = Path(d)
        traces = {"conv": lambda: SHARED / "AzureLLMInferenceTrace_conv.csv",
                  "diurnal-1h": lambda: diurnal(folder, 1), "diurnal-6h": lambda: diurnal(folder, 6),
                  "diurnal-24h": lambda: diurnal(folder, 24),
                  "mooncake-24h": lambda: mooncake_day(folder)}
        print("| trace | requests | command | wall s | peak RSS, largest process (MiB) | "
              "peak RSS, process tree (MiB) | report folder (MB) | exit |")
        print("|---|---:|---|---:|---:|---:|---:|---:|", flush=True)
        for name in args.only.split(","):
            path = traces[name]()
            import polars as pl
            sys.path.insert(0, str(ROOT))
            from traces.loaders import load_trace
            n = load_trace(path).height if path.suffix != ".parquet" else pl.scan_parquet(
                path).select(pl.len()).collect().item()
            for c in args.commands.split(","):
                out = folder / f"report-{name}"
                cmd = kvcap(*COMMANDS[c](path, out),
                            *(["--workers", args.workers] if args.workers else []))
                m = measure(cmd, args.timeout_s, args.limit_gib)
                size = (sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6
                        if c == "report" and out.exists() else None)
                status = m["rc"] if m["rc"] else "0"
                if m["rc"]:
                    tail = (m["stderr"].strip().splitlines() or [""])[-2:]
                    status = f"{m['rc']}: {' '.join(tail)[:120]}"
                print(f"| {name} | {n:,} | kvcap {c} | {m['wall_s']:.1f} | "
                      f"{m['max_proc_mib']:,.0f} | {m['tree_mib']:,.0f} | "
                      f"{'' if size is None else f'{size:,.1f}'} | {status} |", flush=True)
                if c == "report" and out.exists():
                    subprocess.run(["rm", "-rf", str(out)])


if __name__ == "__main__":
    main()
