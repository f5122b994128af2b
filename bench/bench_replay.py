"""Benchmark: replay speed and peak memory of the default config (V1, Llama-3.1-8B on H100, cost
model) on the shared traces and a large synthetic one (recorded results, not a timed test).

Cases, each in a fresh subprocess so its peak RSS (`resource.getrusage`) is its own:
- Azure conv (19,366 requests) and Azure code, no prefix information; conv again on V0;
- Mooncake `conversation_trace.jsonl` (12,031 requests, ~12k-token prompts, prefix hashes; V1's
  prefix caching is on by default);
- a synthetic Poisson trace of --synth-requests requests (default 1,000,000; targets: <= 60 s and
  <= 4 GiB peak RSS).
Implementations: `compiled` (the default: the compiled cores, replay/engine/v*/_core.c) and `reference`
(the Python schedulers and loop, the differential oracle); the real traces run both unless
--no-reference (compiled only). Prints a markdown table: engine seconds (inside
`replay.run.run_engine`), whole `replay()` seconds, steps/s and requests/s (of the whole replay),
peak RSS.

    .venv/bin/python bench/bench_replay.py [--synth-requests 1000000] [--no-reference]
    .venv/bin/python bench/bench_replay.py --save-baseline DIR   # tables for the regression test
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
REAL = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "azure-code": "AzureLLMInferenceTrace_code.csv",
        "mooncake": "conversation_trace.jsonl",
        # The same conv trace on the V0 scheduler (its own compiled core).
        "azure-conv-v0": "AzureLLMInferenceTrace_conv.csv"}
SYNTH_RATE_RPS = 15.0      # below the ~30 req/s the default engine sustains (traces/synth.py)


def load(name: str, synth_requests: int):
    if name == "synthetic":
        from traces.synth import synthesize
        return synthesize("poisson", duration_s=synth_requests / SYNTH_RATE_RPS, rate_rps=SYNTH_RATE_RPS)
    from traces.loaders import load_trace
    return load_trace(SHARED / REAL[name])


def one(name: str, mode: str, synth_requests: int) -> dict:
    """Run one case in this process and return its numbers."""
    import replay.run as run_mod
    from replay.config import EngineConfig

    trace = load(name, synth_requests)
    loop_s = 0.0
    inner = run_mod.run_engine

    def timed_loop(*args, **kwargs):
        nonlocal loop_s
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        loop_s = time.perf_counter() - t0
        return out

    run_mod.run_engine = timed_loop
    t0 = time.perf_counter()
    config = EngineConfig(scheduler="v0") if name.endswith("-v0") else EngineConfig()
    r = run_mod.replay(trace, config, implementation=mode)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    return {"trace": name, "mode": mode, "requests": trace.height, "steps": r.run["num_steps"],
            "loop_s": loop_s, "replay_s": wall, "peak_rss": peak}


def save_baseline(directory: Path, n: int = 3000) -> None:
    """Tables of the first n requests of conv and Mooncake (tests/test_v1_speed_regression.py)."""
    from replay.config import EngineConfig
    from replay.run import replay

    directory.mkdir(parents=True, exist_ok=True)
    for key, name in (("conv", "azure-conv"), ("mooncake", "mooncake")):
        r = replay(load(name, 0).head(n), EngineConfig())
        for t in ("requests", "steps", "events", "stalls", "tbt"):
            getattr(r, t).write_parquet(directory / f"{key}.{t}.parquet")


def row(res: dict) -> str:
    return (f"| {res['trace']} | {res['mode']} | {res['requests']:,} | {res['steps']:,} | "
            f"{res['loop_s']:.2f} | {res['replay_s']:.2f} | {res['steps'] / res['replay_s']:,.0f} | "
            f"{res['requests'] / res['replay_s']:,.0f} | {res['peak_rss'] / 2**30:.2f} GiB |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synth-requests", type=int, default=1_000_000)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--traces", nargs="*", default=[*REAL, "synthetic"])
    ap.add_argument("--save-baseline", type=Path)
    ap.add_argument("--one", nargs=2, metavar=("TRACE", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.save_baseline:
        save_baseline(args.save_baseline)
        return
    if args.one:
        print(json.dumps(one(*args.one, args.synth_requests)))
        return
    cases = [(t, "compiled") for t in args.traces]
    if not args.no_reference:
        cases += [(t, "reference") for t in args.traces if t in REAL]
    print("| trace | implementation | requests | steps | engine s | replay() s | steps/s | requests/s "
          "| peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, mode in cases:
        out = subprocess.run([sys.executable, __file__, "--one", name, mode,
                              "--synth-requests", str(args.synth_requests)],
                             cwd=REPO, capture_output=True, text=True)
        if out.returncode:
            print(f"| {name} | {mode} | failed: {out.stderr.strip().splitlines()[-1]} |")
            continue
        print(row(json.loads(out.stdout.strip().splitlines()[-1])), flush=True)


if __name__ == "__main__":
    main()
