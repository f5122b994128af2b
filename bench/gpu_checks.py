"""The prepared device check for the torch stub (run by bench/gpu_calibrate.sh).

1. Calibrates the cost model with the stub on the device (`replay.calibration.stub_fit`): writes the profile.
2. Reports swap-out / swap-in GB/s against plain pinned-copy GB/s measured in the same run.
3. Replays a short slice of the Azure conv trace twice with the V1 scheduler: with the stub and
   `timing="measured"` (integrity checks on), and with the calibrated cost model; reports the
   per-step error of the calibrated model against the measured steps (mean absolute %) and TTFT /
   TBT p50 / p99 of both replays.
4. Writes results.json and results.md (plus the profile) under --out.

torch + numpy + replay's engine modules only: the GPU machine has no polars/duckdb, so this must
not import traces/ or capacity/. Also runs on the CPU (`--device cpu --quick`) so it is tested.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from replay.calibration.stub_fit import (CalibrationOptions, calibrate,  # noqa: E402
                                         stub_cost_model, write_profile)
from replay.config import EngineConfig, resolve  # noqa: E402
from replay.engine.loop import run  # noqa: E402
from replay.engine.prefix import UniqueBlockKeys  # noqa: E402
from replay.engine.state import RequestState  # noqa: E402
from replay.engine.v1.scheduler import V1Scheduler  # noqa: E402
from replay.stub.executor import StubExecutor  # noqa: E402
from replay.timing.executors import cost_model_for  # noqa: E402

TRACE_NAME = "AzureLLMInferenceTrace_conv.csv"


def find_trace(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [ROOT.parent / "shared" / "traces" / TRACE_NAME,
                                     ROOT / "shared" / "traces" / TRACE_NAME]
    for p in cands:
        if p.exists():
            return p
    raise SystemExit(f"trace not found (tried {', '.join(map(str, cands))}); pass --trace PATH")


def read_azure(path: Path, n: int) -> RequestState:
    """The first n requests of an Azure LLM inference CSV (TIMESTAMP, ContextTokens,
    GeneratedTokens; CRLF line ends), arrival relative to the first."""
    ts, prompt, out = [], [], []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= n:
                break
            # 7 fractional digits: keep microseconds for fromisoformat.
            ts.append(datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]))
            prompt.append(int(row["ContextTokens"]))
            out.append(int(row["GeneratedTokens"]))
    t0 = ts[0]
    arrival = np.array([(t - t0).total_seconds() for t in ts])
    order = np.argsort(arrival, kind="stable")
    return RequestState(arrival_s=arrival[order], prompt_len=np.array(prompt)[order],
                        output_len=np.array(out)[order])


def fresh_state(src: RequestState) -> RequestState:
    return RequestState(arrival_s=src.arrival_s, prompt_len=src.prompt_len,
                        output_len=src.output_len)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if len(values) == 0:
        return float("nan")
    o = np.argsort(values)
    cw = np.cumsum(weights[o])
    return float(values[o][np.searchsorted(cw, q * cw[-1], "left")])


def latency(raw, state: RequestState) -> dict:
    ttft = raw.first_token_s - state.arrival_s
    ttft = ttft[np.isfinite(ttft)]
    w = raw.tbt_weights.astype(float)
    return {"ttft_p50_s": float(np.quantile(ttft, 0.5)), "ttft_p99_s": float(np.quantile(ttft, 0.99)),
            "tbt_p50_s": weighted_quantile(raw.tbt_values, w, 0.5),
            "tbt_p99_s": weighted_quantile(raw.tbt_values, w, 0.99),
            "num_steps": int(raw.num_steps), "sim_seconds": float(raw.sim_seconds),
            "status": raw.status,
            "requests_finished": int(np.isfinite(raw.finish_s).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h200", help="catalog GPU of the engine being modelled")
    ap.add_argument("--stub-shape", default=None, choices=("full", "tiny"))
    ap.add_argument("--quick", action="store_true", help="small grid and slice (CPU smoke test)")
    ap.add_argument("--requests", type=int, default=None, help="trace rows to replay")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="replay X times faster")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                    help="below vLLM's 0.92: leaves room for the stub's temporaries")
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if a.device == "cpu":
        torch.set_num_threads(1)      # shared CPUs: more threads only spin against each other
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t_all = time.perf_counter()

    # 1-2. calibration and copy bandwidth -------------------------------------------------
    log(f"calibrating {a.model} on {a.device} ({'quick' if a.quick else 'full grid'})")
    prof = calibrate(CalibrationOptions(device=a.device, model=a.model, gpu=a.gpu,
                                        stub_shape=a.stub_shape, quick=a.quick), log=log)
    profile_path = write_profile(prof, out / f"profile-{a.gpu}-{a.model}.json")
    if a.device == "cuda":
        torch.cuda.empty_cache()      # the calibration pool's segments; the replay's is larger

    # 3. the trace slice, measured vs calibrated model ------------------------------------
    n = a.requests or (30 if a.quick else 200)
    src = read_azure(find_trace(a.trace), n)
    if a.rate_scale != 1.0:
        src = RequestState(arrival_s=src.arrival_s / a.rate_scale, prompt_len=src.prompt_len,
                           output_len=src.output_len)
    cfg = EngineConfig(scheduler="v1", model=a.model, gpu=a.gpu, max_num_seqs=a.max_num_seqs,
                       gpu_memory_utilization=a.gpu_memory_utilization,
                       calibration=str(profile_path))
    eng = resolve(cfg)
    log(f"replaying {n} requests: {eng.num_gpu_blocks} GPU blocks, stub timing=measured")
    st = fresh_state(src)
    keys = UniqueBlockKeys()
    sched = V1Scheduler(eng.spec, st, keys)
    stub = StubExecutor.for_engine(eng, state=st, scheduler=sched, keys=keys, device=a.device,
                                   stub_shape=a.stub_shape, timing="measured", record=True)
    if prof["shape"]["kind"] == "full":
        calibrated = cost_model_for(eng, calibration=str(profile_path))   # what users replay with
    else:
        # A tiny stub's rates describe the tiny model: compare it with its own formula.
        calibrated = stub_cost_model(eng, stub.model.shape, stub.kv.layout, prof["constants"])
    stub.cost_model = calibrated
    t0 = time.perf_counter()
    raw_m = run(st, sched, stub, kv_bytes_per_block=eng.kv_bytes_per_block)
    wall_stub = time.perf_counter() - t0
    measured = latency(raw_m, st)
    rec = stub.records[5:]                     # the first steps warm the allocator up
    meas = np.array([r.measured_s for r in rec])
    pred = np.array([r.model_s for r in rec])
    step_mape = float(np.mean(np.abs(pred - meas) / meas) * 100) if len(rec) else float("nan")
    st2 = fresh_state(src)
    sched2 = V1Scheduler(eng.spec, st2, keys)
    raw_c = run(st2, sched2, calibrated, kv_bytes_per_block=eng.kv_bytes_per_block)
    modelled = latency(raw_c, st2)

    bw = prof["bandwidth"]
    results = {
        "device": prof["device"], "model": prof["model"], "gpu_catalog": a.gpu,
        "stub_shape": prof["shape"]["kind"], "profile": profile_path.name,
        "constants": prof["constants"],
        "calibration_fit": {k: prof["fit"][k] for k in ("mape_heldout_pct", "mape_train_pct",
                                                         "max_abs_error_heldout_pct",
                                                         "num_train", "num_heldout")},
        "bandwidth": bw,
        "replay": {"requests": n, "num_gpu_blocks": eng.num_gpu_blocks,
                   "step_time_mape_pct": step_mape, "steps_compared": len(rec),
                   "measured_step_ms_mean": float(meas.mean() * 1e3) if len(rec) else None,
                   "stub_wall_s": wall_stub, "stub_steps_per_s": raw_m.num_steps / wall_stub,
                   "measured": measured, "calibrated_model": modelled},
        "targets": {"swap_vs_pinned_min": 0.8, "heldout_mape_max_pct": 10.0,
                    "swap_out_ok": bw.get("swap_out_vs_pinned", 0) >= 0.8,
                    "swap_in_ok": bw.get("swap_in_vs_pinned", 0) >= 0.8,
                    "fit_ok": prof["fit"]["mape_heldout_pct"] <= 10.0},
        "wall_s": time.perf_counter() - t_all,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(json.dumps({k: results[k] for k in ("calibration_fit", "bandwidth", "targets")}))
    log((out / "results.md").read_text())
    return 0


def markdown(r: dict) -> str:
    bw, rp, f = r["bandwidth"], r["replay"], r["calibration_fit"]
    m, c = rp["measured"], rp["calibrated_model"]
    ms = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
    lines = [
        f"# Stub calibration on {r['device']['name']} ({r['device']['type']}, torch "
        f"{r['device']['torch']})", "",
        f"Model {r['model']}, stub shape `{r['stub_shape']}`, catalog GPU {r['gpu_catalog']}; "
        f"profile `{r['profile']}`.", "",
        "| calibration | value |", "|---|---|",
        f"| held-out step-time MAPE | {f['mape_heldout_pct']:.1f} % ({f['num_heldout']} shapes; "
        f"train {f['mape_train_pct']:.1f} %, worst held-out {f['max_abs_error_heldout_pct']:.1f} %) |",
    ]
    lines += [f"| {k} | {v:.4g} |" for k, v in r["constants"].items()]
    lines += ["", "| copy | GB/s | vs pinned |", "|---|---|---|",
              f"| pinned device→host | {bw['pinned_d2h_gb_per_s']:.1f} | 1.00 |",
              f"| pinned host→device | {bw['pinned_h2d_gb_per_s']:.1f} | 1.00 |"]
    for d in ("out", "in"):
        if f"swap_{d}_gb_per_s" in bw:
            lines.append(f"| swap-{d} ({bw[f'swap_{d}_blocks']} blocks) | "
                         f"{bw[f'swap_{d}_gb_per_s']:.1f} | {bw[f'swap_{d}_vs_pinned']:.2f} |")
    lines += ["", f"Replay of {rp['requests']} Azure conv requests (V1, {rp['num_gpu_blocks']} GPU "
              f"blocks): calibrated model vs measured step time, MAPE "
              f"{rp['step_time_mape_pct']:.1f} % over {rp['steps_compared']} steps; stub "
              f"{rp['stub_steps_per_s']:.0f} steps/s.", "",
              "| metric | stub, measured | calibrated cost model |", "|---|---|---|"]
    for k in ("ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s"):
        lines.append(f"| {k[:-2].replace('_', ' ')} | {ms(m[k])} | {ms(c[k])} |")
    lines += [f"| steps | {m['num_steps']} | {c['num_steps']} |",
              f"| finished | {m['requests_finished']} | {c['requests_finished']} |", "",
              "Targets: swap copies ≥ 80 % of pinned-copy bandwidth "
              f"(out {'ok' if r['targets']['swap_out_ok'] else 'MISSED'}, in "
              f"{'ok' if r['targets']['swap_in_ok'] else 'MISSED'}); held-out error ≤ 10 % "
              f"({'ok' if r['targets']['fit_ok'] else 'MISSED'}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
