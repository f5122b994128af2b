"""Benchmark: what V1's CPU KV offloading (`--kv-offloading-size`) costs the compiled engine
(issue 16: the speed targets must hold with async and offloading on; aim: 64 GiB LRU <= 1.3x the
engine CPU time of no offloading on the same trace). Recorded results, not a timed test.

Cases: {azure-conv, mooncake} x {off, 64 GiB LRU, 64 GiB ARC, 8 GiB LRU}, default engine (V1,
async, Llama-3.1-8B on H100, cost model), compiled core. Each run is a fresh process; the rounds
interleave the cases (round 1: every case, round 2: every case, ...) so that load drifts hit
them alike, and each case reports its best of --repeat. Columns: engine CPU s
(`time.process_time` around `replay.run.run_engine`: the C core plus its Python glue), core CPU s
(inside the compiled `run` calls only), the glue (the difference: result columns, events), the
whole `replay()` (tables and summary included), steps, events, CPU-hit tokens, and the engine CPU
ratio to the same trace without offloading.

    .venv/bin/python bench/bench_offload.py [--repeat 3] [--traces azure-conv mooncake]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
TRACES = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "mooncake": "conversation_trace.jsonl"}
# label -> EngineConfig fields
OFFLOAD = {"off": {},
           "off, sync loop": {"async_scheduling": False},   # 0.33 with --no-async-scheduling
           "64 GiB LRU": {"kv_offloading_size": 64.0},
           "64 GiB ARC": {"kv_offloading_size": 64.0, "kv_offloading_eviction_policy": "arc"},
           "8 GiB LRU": {"kv_offloading_size": 8.0}}


def one(trace_name: str, offload: str) -> dict:
    """Run one case in this process and return its numbers."""
    import replay.engine.compiled as compiled
    import replay.run as run_mod
    from replay.config import EngineConfig
    from traces.loaders import load_trace

    trace = load_trace(SHARED / TRACES[trace_name])
    times = {"engine_cpu_s": 0.0, "engine_wall_s": 0.0, "core_cpu_s": 0.0}
    inner, ext = run_mod.run_engine, compiled.CORES["v1"]
    core_run = ext.run

    def timed_engine(*args, **kwargs):
        c0, w0 = time.process_time(), time.perf_counter()
        out = inner(*args, **kwargs)
        times["engine_cpu_s"] += time.process_time() - c0
        times["engine_wall_s"] += time.perf_counter() - w0
        return out

    def timed_core(*args):
        c0 = time.process_time()
        out = core_run(*args)
        times["core_cpu_s"] += time.process_time() - c0
        return out

    run_mod.run_engine, ext.run = timed_engine, timed_core
    c0 = time.process_time()
    try:
        r = run_mod.replay(trace, EngineConfig(**OFFLOAD[offload]), implementation="compiled")
    finally:
        ext.run = core_run
    times["replay_cpu_s"] = time.process_time() - c0
    return {"trace": trace_name, "offload": offload, "steps": r.run["num_steps"],
            "events": r.events.height,
            "cpu_hit_tokens": int(r.requests["cpu_hit_tokens"].sum())
            if "cpu_hit_tokens" in r.requests.columns else 0, **times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--traces", nargs="*", default=list(TRACES), choices=list(TRACES))
    ap.add_argument("--offload", nargs="*", default=list(OFFLOAD), choices=list(OFFLOAD))
    ap.add_argument("--one", nargs=2, metavar=("TRACE", "OFFLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    cases = [(t, o) for t in args.traces for o in args.offload]
    best: dict[tuple, dict] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeat):
        for case in cases:
            out = subprocess.run([sys.executable, __file__, "--one", *case], cwd=REPO,
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{case}: failed: {out.stderr.strip()}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            if case not in best or res["engine_cpu_s"] < best[case]["engine_cpu_s"]:
                best[case] = res
        load.append(os.getloadavg()[0])
    print(f"best of {args.repeat}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average (1 min) {min(load):.2f}-{max(load):.2f}")
    print("| trace | offloading | steps | events | CPU-hit tokens | engine CPU s | core CPU s "
          "| glue CPU s | replay() CPU s | engine wall s | / off |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t, o in cases:
        r = best[(t, o)]
        base = best.get((t, "off"))
        ratio = f"{r['engine_cpu_s'] / base['engine_cpu_s']:.2f}" if base else "—"
        print(f"| {t} | {o} | {r['steps']:,} | {r['events']:,} | {r['cpu_hit_tokens']:,} | "
              f"{r['engine_cpu_s']:.2f} | {r['core_cpu_s']:.2f} | "
              f"{r['engine_cpu_s'] - r['core_cpu_s']:.2f} | {r['replay_cpu_s']:.2f} | "
              f"{r['engine_wall_s']:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
