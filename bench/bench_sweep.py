"""A 200-point `kvcap sweep` on this machine: the local process pool vs a local Ray instance.

Grid: 10 max_num_seqs x 20 rate scales on the first 200 requests of Azure conv (each replay takes
tens of milliseconds, so what is measured is mostly the executors' own cost), both with the
driver writing every run to DuckDB. Per-task overhead = (wall x workers - the replays' own wall
time) / tasks: worker-seconds a task costs beyond its replay (transfer, scheduling, result
conversion, the driver's write). Startup (spawning the pool / ray.init) is timed separately.

    .venv/bin/python bench/bench_sweep.py [--workers 2] [--requests 200]
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    from capacity.analyses.distributed import make_points, sweep
    from capacity.analyses.grid import parse_grid_text, points
    from replay.config import EngineConfig
    from traces.loaders import load_trace
    traces = {"conv": load_trace(CONV).head(args.requests)}
    scales = ",".join(f"{0.5 + 0.25 * i:g}" for i in range(20))
    grid = parse_grid_text(f"max_num_seqs=8,16,24,32,48,64,96,128,192,256;rate_scale={scales}")
    pts = make_points(traces, EngineConfig(), points(grid), default_trace="conv")
    assert len(pts) == 200
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for executor in ("local", "ray"):
            t0 = time.perf_counter()
            if executor == "ray":
                from capacity.analyses.distributed import start_local_ray
                start_local_ray(num_cpus=args.workers)
            startup = time.perf_counter() - t0
            out = sweep(pts, traces, db=Path(tmp) / f"{executor}.duckdb", executor=executor,
                        workers=args.workers)
            assert not out.failed and len(out.written) == 200, out.failed[:1]
            if executor == "ray":
                import ray
                ray.shutdown()
            over = (out.wall_seconds * args.workers - out.task_seconds) / len(pts)
            rows.append((executor, startup, out.wall_seconds, out.task_seconds, over))
    print(f"200-point sweep, {args.requests} requests per replay, {args.workers} workers "
          "(measured under load)\n")
    print("| executor | startup s | sweep wall s | replays' own s | overhead per task ms |")
    print("|---|---:|---:|---:|---:|")
    for ex, st, wall, task, over in rows:
        print(f"| {ex} | {st:.1f} | {wall:.1f} | {task:.1f} | {over * 1000:.0f} |")


if __name__ == "__main__":
    main()
