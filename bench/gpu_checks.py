"""The prepared device check for the torch stub (run by bench/gpu_calibrate.sh; issue #35).

1. Calibrates the cost model with the stub on the device (`replay.calibration.stub_fit`): writes
   the profile, swap-out / swap-in and offload store / load GB/s against plain pinned copies
   measured in the same run.
2. Replays a slice of the Azure conv trace with the V1 scheduler (synchronous loop: the stub steps
   synchronously) on the stub with `timing="measured"` and integrity checks on. Every step it ran
   is also priced by the calibrated cost model and by the shipped measured profile of that GPU
   (`replay/timing/profiles/`, from AIConfigurator's kernels): mean, p95 and signed error per step,
   over all steps and by kind (decode-only, with prefill). TTFT / TBT p50 / p99 of the measured
   replay and of the replays priced by each model.
3. Replays a 20x denser slice with CPU KV offloading (a small pool that preempts, a small tier that
   evicts, four shared system prompts) on the stub, integrity on: the copies really made (store,
   load blocks, flushes) and their GB/s inside a replay.
4. Writes results.json and results.md (plus the profile) under --out, after every phase, so a run
   stopped at its time limit still leaves what it measured; exits 1 if an integrity check failed.

torch + numpy + replay's engine modules only: the GPU machine has no polars/duckdb, and its Python
cannot load this machine's compiled cores, so this must not import traces/ (beyond traces.atomic)
or capacity/, and runs on the reference scheduler. Also runs on the CPU (`--device cpu --quick`),
which the tests do with polars, duckdb and the compiled cores blocked.
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import sys
import time
import traceback
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
from replay.engine.prefix import TraceBlockKeys, UniqueBlockKeys  # noqa: E402
from replay.engine.state import RequestState  # noqa: E402
from replay.engine.v1.scheduler import V1Scheduler  # noqa: E402
from replay.stub.executor import StubExecutor, StubIntegrityError, engine_layout  # noqa: E402
from replay.stub.model import StubShape  # noqa: E402
from replay.timing.catalog import get_gpu  # noqa: E402
from replay.timing.executors import cost_model_for  # noqa: E402

TRACE_NAME = "AzureLLMInferenceTrace_conv.csv"
WARMUP_STEPS = 5                     # the first steps warm the allocator and kernels up


class OutOfTime(Exception):
    """The check's wall budget ran out inside a replay."""


def find_trace(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [ROOT.parent / "shared" / "traces" / TRACE_NAME,
                                     ROOT / "shared" / "traces" / TRACE_NAME,
                                     ROOT / ".gpu" / TRACE_NAME]
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
    if len(ts) < n:
        raise SystemExit(f"{path}: {len(ts)} requests, the check asks for {n}")
    t0 = ts[0]
    arrival = np.array([(t - t0).total_seconds() for t in ts])
    order = np.argsort(arrival, kind="stable")
    return RequestState(arrival_s=arrival[order], prompt_len=np.array(prompt)[order],
                        output_len=np.array(out)[order])


def fresh_state(src: RequestState, n: int, rate_scale: float = 1.0) -> RequestState:
    """A new state of the first n requests of `src`, arriving `rate_scale` times faster."""
    return RequestState(arrival_s=src.arrival_s[:n] / rate_scale, prompt_len=src.prompt_len[:n],
                        output_len=src.output_len[:n])


def shared_prompts(state: RequestState, block_size: int) -> TraceBlockKeys:
    """Four system prompts: request i shares up to 2,048 prompt tokens with every i' = i mod 4."""
    hashes = [[(i % 4) * 1000 + j for j in range(min(int(p) // 512, 4))]
              for i, p in enumerate(state.prompt_len)]
    return TraceBlockKeys(block_size=block_size, prompt_len=state.prompt_len.tolist(),
                          prefix_hashes=hashes, hash_block_tokens=512)


def catalog_gpu(device_name: str) -> str:
    """The catalog GPU of a torch device name; a variant the catalog lacks (an "NVIDIA H200 NVL")
    is taken as its family's, so a device run is not lost to a name."""
    try:
        return get_gpu(device_name).name
    except ValueError:
        up = device_name.upper()
        for token, name in (("H200", "h200"), ("H100 PCIE", "h100-pcie"), ("H100", "h100"),
                            ("B200", "b200"), ("L40S", "l40s"), ("A100", "a100-80gb")):
            if token in up:
                print(f"gpu: {device_name!r} is not in the catalog; modelled as {name}",
                      file=sys.stderr)
                return name
        raise SystemExit(f"gpu: {device_name!r} is not in the catalog; pass --gpu NAME")


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
    q = (lambda a, p: float(np.quantile(a, p)) if len(a) else float("nan"))  # noqa: E731
    return {"ttft_p50_s": q(ttft, 0.5), "ttft_p99_s": q(ttft, 0.99),
            "tbt_p50_s": weighted_quantile(raw.tbt_values, w, 0.5),
            "tbt_p99_s": weighted_quantile(raw.tbt_values, w, 0.99),
            "num_steps": int(raw.num_steps), "sim_seconds": float(raw.sim_seconds),
            "status": raw.status,
            "requests_finished": int(np.isfinite(raw.finish_s).sum())}


# A decode step is weight-bound when its context KV is under this share of the weights' bytes:
# there the stub's GEMMs dominate, and they are a real engine's (its attention gathers the KV
# through its block tables: a few times a fused paged kernel's memory traffic).
WEIGHT_BOUND_KV_SHARE = 0.25


class Priced:
    """The stub as the loop's executor, with every step also priced by reference cost models
    (the same plan), and a wall deadline."""

    def __init__(self, stub: StubExecutor, models: dict, deadline: float, *,
                 weight_bytes: float, kv_bytes_per_token: float) -> None:
        self.stub, self.models, self.deadline = stub, models, deadline
        self.priced: dict[str, list[float]] = {k: [] for k in models}
        self.decode_only: list[bool] = []
        self.weight_bound: list[bool] = []
        self._kv_limit_tokens = WEIGHT_BOUND_KV_SHARE * weight_bytes / kv_bytes_per_token

    def step_s(self, plan, num_sampled: int) -> float:
        if time.perf_counter() > self.deadline:
            raise OutOfTime
        for k, m in self.models.items():
            self.priced[k].append(m.step_s(plan, num_sampled))
        decode = bool(len(plan.rows)) and not plan.is_prefill.any()
        self.decode_only.append(decode)
        ctx = int((plan.num_computed_tokens + plan.num_new_tokens).sum())
        self.weight_bound.append(decode and ctx < self._kv_limit_tokens)
        return self.stub.step_s(plan, num_sampled)


def step_errors(measured: np.ndarray, predicted: np.ndarray, decode_only: np.ndarray,
                weight_bound: np.ndarray, gapless: np.ndarray) -> dict:
    """Absolute % error per step (mean, p95), signed mean (+ = the model is slower), by kind, over
    the gapless steps (the device's time alone: replay.stub.clock); `all_with_gaps` keeps all."""
    out = {}
    every = np.ones(len(measured), bool)
    for kind, sel in (("all", gapless), ("decode_only", decode_only & gapless),
                      ("decode_weight_bound", weight_bound & gapless),
                      ("with_prefill", ~decode_only & gapless), ("all_with_gaps", every)):
        m, p = measured[sel], predicted[sel]
        if len(m) == 0:
            out[kind] = {"steps": 0}
            continue
        err = (p - m) / m * 100.0
        out[kind] = {"steps": int(len(m)), "mean_abs_pct": float(np.mean(np.abs(err))),
                     "p95_abs_pct": float(np.quantile(np.abs(err), 0.95)),
                     "mean_signed_pct": float(np.mean(err)),
                     "measured_ms_mean": float(m.mean() * 1e3),
                     "predicted_ms_mean": float(p.mean() * 1e3)}
    return out


def stub_replay(eng, state: RequestState, keys, *, device: str, stub_shape, models: dict,
                deadline: float) -> dict:
    """One measured stub replay; its steps priced by `models`; integrity outcome recorded."""
    sched = V1Scheduler(eng.spec, state, keys)
    stub = StubExecutor.for_engine(eng, state=state, scheduler=sched, keys=keys, device=device,
                                   stub_shape=stub_shape, timing="measured", record=True)
    ex = Priced(stub, models, deadline,
                weight_bytes=eng.model.weight_bytes / eng.tensor_parallel_size,
                kv_bytes_per_token=eng.kv_bytes_per_token)
    out: dict = {"num_gpu_blocks": eng.num_gpu_blocks, "num_cpu_blocks": eng.spec.num_cpu_blocks}
    t0 = time.perf_counter()
    raw = None
    try:
        raw = run(state, sched, ex, kv_bytes_per_block=eng.kv_bytes_per_block)
        out["integrity"] = {"passed": True}
    except StubIntegrityError as e:
        out["integrity"] = {"passed": False, "error": str(e)}
    except OutOfTime:
        out["integrity"] = {"passed": True, "truncated": "wall budget ran out"}
    wall = time.perf_counter() - t0
    out["integrity"]["steps_checked"] = stub.step
    out.update(stub_wall_s=wall, stub_steps_per_s=stub.step / wall if wall else 0.0)
    if raw is not None:
        out["measured"] = latency(raw, state)
    rec = stub.records[WARMUP_STEPS:]
    kept = slice(WARMUP_STEPS, len(stub.records))
    meas = np.array([r.measured_s for r in rec])
    gapless = np.array([r.gapless for r in rec], bool)
    dec = np.array(ex.decode_only[kept], bool)
    wb = np.array(ex.weight_bound[kept], bool)
    out["step_errors"] = {k: step_errors(meas, np.array(v[kept]), dec, wb, gapless)
                          for k, v in ex.priced.items()} if len(rec) else {}
    if len(rec):
        enq = np.array([r.enqueue_s for r in rec])
        out["timing"] = {"steps": len(rec), "gapless_steps": int(gapless.sum()),
                         "measured_ms_mean": float(meas.mean() * 1e3),
                         "host_enqueue_ms_mean": float(enq.mean() * 1e3),
                         "weight_bound_steps": int(wb.sum())}
    if stub.offload is not None:
        off = stub.offload
        copies = stub.kv.offload_seconds()
        nbytes = sum(c[2] for c in copies)
        secs = sum(c[3] for c in copies)
        out["offload"] = {"store_blocks": off.num_store_blocks, "load_blocks": off.num_load_blocks,
                          "evicted_chunks": off.num_evicted, "flush_steps": off.num_flushes,
                          "copy_calls": len(copies),
                          "blocks_per_call_mean": (sum(c[0] + c[1] for c in copies) / len(copies)
                                                   if copies else 0.0),
                          "in_replay_gb_per_s": nbytes / secs / 1e9 if secs else float("nan")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="auto",
                    help="catalog GPU of the engine modelled; auto: the device's own "
                         "(h200 on a CPU)")
    ap.add_argument("--stub-shape", default=None, choices=("full", "tiny"))
    ap.add_argument("--quick", action="store_true", help="small grid and slices (CPU smoke test)")
    ap.add_argument("--requests", type=int, default=None, help="trace rows of the main replay")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="main replay X times faster")
    ap.add_argument("--offload-requests", type=int, default=None,
                    help="trace rows of the offloading replay (0: skip it)")
    ap.add_argument("--offload-rate-scale", type=float, default=20.0,
                    help="offloading replay X times faster (a pool that preempts)")
    ap.add_argument("--offload-gpu-blocks", type=int, default=300)
    ap.add_argument("--kv-offloading-size", type=float, default=2.0, help="GiB")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85,
                    help="below vLLM's 0.92: leaves room for the stub's temporaries")
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="wall budget: a replay still running then stops and reports what it has")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--out", default=None, help="default bench/results/gpu/<gpu>")
    a = ap.parse_args(argv)
    t_all = time.perf_counter()
    deadline = t_all + a.budget_s
    if a.gpu == "auto":
        a.gpu = catalog_gpu(torch.cuda.get_device_name()) if a.device == "cuda" else "h200"
    out = Path(a.out or ROOT / "bench" / "results" / "gpu" / a.gpu)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if a.device == "cpu":
        torch.set_num_threads(1)      # shared CPUs: more threads only spin against each other
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results: dict = {"gpu_catalog": a.gpu, "model": a.model,
                     "command": "bench/gpu_calibrate.sh " + " ".join(argv or sys.argv[1:])}

    def save() -> None:
        results["wall_s"] = time.perf_counter() - t_all
        (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (out / "results.md").write_text(markdown(results))

    # 1. calibration and copy bandwidth ---------------------------------------------------
    log(f"calibrating {a.model} on {a.device} ({'quick' if a.quick else 'full grid'}), "
        f"catalog GPU {a.gpu}")
    prof = calibrate(CalibrationOptions(device=a.device, model=a.model, gpu=a.gpu,
                                        stub_shape=a.stub_shape, quick=a.quick), log=log)
    # The resolved name: --model may be a config.json path.
    profile_path = write_profile(prof, out / f"profile-{a.gpu}-{prof['model']}.json")
    gc.collect()                      # the calibration's stub: its pool is ~34 GiB at full shape,
    if a.device == "cuda":            # the replay's 51 GiB on an H100 (78 GiB)
        torch.cuda.empty_cache()
    bw = prof["bandwidth"]
    results.update({
        "device": prof["device"], "stub_shape": prof["shape"]["kind"],
        "profile": profile_path.name, "constants": prof["constants"],
        "calibration_fit": {k: prof["fit"][k] for k in ("mape_heldout_pct", "mape_train_pct",
                                                         "max_abs_error_heldout_pct",
                                                         "num_train", "num_heldout", "seconds",
                                                         "gapless_pct")},
        "bandwidth": bw})
    save()

    # 2. the trace slice: measured steps against the calibrated and the shipped models -----------
    n = a.requests or (30 if a.quick else 200)
    src = read_azure(find_trace(a.trace), max(n, a.offload_requests or 0, 80 if a.quick else 200))
    base = dict(scheduler="v1", model=a.model, gpu=a.gpu, async_scheduling=False,
                max_num_seqs=a.max_num_seqs)
    eng = resolve(EngineConfig(**base, gpu_memory_utilization=a.gpu_memory_utilization,
                               calibration=str(profile_path)))
    shape = a.stub_shape or ("full" if a.device == "cuda" else "tiny")
    if shape == "full":
        calibrated = cost_model_for(eng, calibration=str(profile_path))   # what users replay with
    else:
        # A tiny stub's rates describe the tiny model: compare it with its own formula.
        tiny = StubShape.for_model(eng.model, eng.tensor_parallel_size, shape)
        calibrated = stub_cost_model(eng, tiny, engine_layout(eng, tiny), prof["constants"])
    models = {"calibrated": calibrated}
    shipped = resolve(EngineConfig(**base, gpu_memory_utilization=a.gpu_memory_utilization))
    models["shipped"] = cost_model_for(shipped)
    log(f"replaying {n} requests: {eng.num_gpu_blocks} GPU blocks, stub timing=measured")
    st = fresh_state(src, n, a.rate_scale)
    rep = stub_replay(eng, st, UniqueBlockKeys(), device=a.device, stub_shape=shape, models=models,
                      deadline=deadline)
    rep.update(requests=n, rate_scale=a.rate_scale)
    for name, m in models.items():           # the same requests priced by each model alone
        s2 = fresh_state(src, n, a.rate_scale)
        rep[f"{name}_model"] = latency(run(s2, V1Scheduler(eng.spec, s2, UniqueBlockKeys()), m,
                                           kv_bytes_per_block=eng.kv_bytes_per_block), s2)
    results["replay"] = rep
    save()
    gc.collect()                          # the replay's stub (its KV pool) before the next one
    if a.device == "cuda":
        torch.cuda.empty_cache()

    # 3. CPU KV offloading on the stub --------------------------------------------------------
    n_off = a.offload_requests if a.offload_requests is not None else (80 if a.quick else 200)
    if n_off:
        cfg = EngineConfig(**base, num_gpu_blocks_override=a.offload_gpu_blocks,
                           kv_offloading_size=a.kv_offloading_size, max_model_len=8192)
        eng_o = resolve(cfg)
        st_o = fresh_state(src, n_off, a.offload_rate_scale)
        log(f"offloading replay: {n_off} requests {a.offload_rate_scale:g}x denser, "
            f"{eng_o.num_gpu_blocks} GPU blocks, "
            f"{eng_o.spec.num_cpu_blocks} CPU chunks ({a.kv_offloading_size} GiB)")
        off = stub_replay(eng_o, st_o, shared_prompts(st_o, eng_o.spec.block_size),
                          device=a.device, stub_shape=shape, models={}, deadline=deadline)
        off.pop("step_errors", None)
        off.update(requests=n_off, rate_scale=a.offload_rate_scale,
                   kv_offloading_size_gib=a.kv_offloading_size)
        results["offload_replay"] = off
    save()
    print(json.dumps({k: results[k] for k in ("calibration_fit", "bandwidth")}))
    log((out / "results.md").read_text())
    failed = [k for k in ("replay", "offload_replay")
              if k in results and not results[k]["integrity"]["passed"]]
    return 1 if failed else 0


def markdown(r: dict) -> str:
    ms = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
    dev = r.get("device", {})
    lines = [f"# Stub check on {dev.get('name', '?')} ({dev.get('type', '?')}, torch "
             f"{dev.get('torch', '?')})", "",
             f"Model {r['model']}, catalog GPU {r['gpu_catalog']}, stub shape "
             f"`{r.get('stub_shape', '?')}`; profile `{r.get('profile', '?')}`. "
             f"Command: `{r['command']}`; {r.get('wall_s', 0):.0f} s.", ""]
    if r.get("stub_shape") == "tiny":
        lines += ["A tiny stub: a smoke test of the check itself. The shipped profile prices the "
                  "real model on the catalog GPU, not this run.", ""]
    f = r.get("calibration_fit")
    if f:
        lines += ["| calibration | value |", "|---|---|",
                  f"| held-out step-time error (mean abs) | {f['mape_heldout_pct']:.1f} % "
                  f"({f['num_heldout']} shapes; train {f['mape_train_pct']:.1f} %, worst held-out "
                  f"{f['max_abs_error_heldout_pct']:.1f} %) |",
                  f"| timed runs gapless | {f.get('gapless_pct', float('nan')):.0f} % |"]
        lines += [f"| {k} | {v:.4g} |" for k, v in r["constants"].items()]
        bw = r["bandwidth"]
        lines += ["", "| copy | GB/s | vs pinned |", "|---|---:|---:|",
                  f"| pinned device→host | {bw['pinned_d2h_gb_per_s']:.1f} | 1.00 |",
                  f"| pinned host→device | {bw['pinned_h2d_gb_per_s']:.1f} | 1.00 |"]
        for name, label, n in (("swap_out", "swap-out", "swap_out_blocks"),
                               ("swap_in", "swap-in", "swap_in_blocks"),
                               ("offload_store", "offload store", "offload_blocks"),
                               ("offload_load", "offload load", "offload_blocks")):
            if f"{name}_gb_per_s" in bw:
                lines.append(f"| {label} ({bw[n]} blocks) | {bw[f'{name}_gb_per_s']:.1f} | "
                             f"{bw[f'{name}_vs_pinned']:.2f} |")
    rp = r.get("replay")
    if rp:
        lines += ["", f"## Replay: {rp['requests']} Azure conv requests (V1, synchronous loop, "
                  f"{rp['num_gpu_blocks']} GPU blocks)", "", integrity_line(rp), "",
                  timing_line(rp, dev.get("type")), "",
                  "Per-step error against the stub's measured steps (+ = the model is slower; "
                  f"first {WARMUP_STEPS} steps left out; gapless steps unless said):", "",
                  "| model | steps | mean abs | p95 abs | mean signed | measured mean | "
                  "model mean |", "|---|---|---:|---:|---:|---:|---:|"]
        for name, errs in rp["step_errors"].items():
            for kind, e in errs.items():
                if e["steps"]:
                    lines.append(f"| {name} | {kind.replace('_', ' ')} ({e['steps']}) | "
                                 f"{e['mean_abs_pct']:.1f} % | {e['p95_abs_pct']:.1f} % | "
                                 f"{e['mean_signed_pct']:+.1f} % | {e['measured_ms_mean']:.2f} ms | "
                                 f"{e['predicted_ms_mean']:.2f} ms |")
        cols = [("stub, measured", rp.get("measured"))] + \
            [(f"{k} model", rp.get(f"{k}_model")) for k in rp["step_errors"]]
        cols = [(k, v) for k, v in cols if v]
        lines += ["", "| metric | " + " | ".join(k for k, _ in cols) + " |",
                  "|---|" + "---:|" * len(cols)]
        for k in ("ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s"):
            lines.append(f"| {k[:-2].replace('_', ' ')} | " +
                         " | ".join(ms(v[k]) for _, v in cols) + " |")
        lines.append("| steps | " + " | ".join(str(v["num_steps"]) for _, v in cols) + " |")
        lines.append(f"\nStub: {rp['stub_steps_per_s']:.0f} steps/s.")
    o = r.get("offload_replay")
    if o:
        lines += ["", f"## Offloading replay: {o['requests']} requests "
                  f"{o['rate_scale']:g}x denser, "
                  f"{o['num_gpu_blocks']} GPU blocks, {o['num_cpu_blocks']} CPU chunks "
                  f"({o['kv_offloading_size_gib']} GiB)", "", integrity_line(o)]
        if "offload" in o:
            c = o["offload"]
            lines.append(f"Copied {c['store_blocks']} blocks to the tier and {c['load_blocks']} "
                         f"back, {c['evicted_chunks']} chunks evicted, {c['flush_steps']} flush "
                         f"steps; {c['copy_calls']} copy calls of {c['blocks_per_call_mean']:.1f} "
                         f"blocks on average at {c['in_replay_gb_per_s']:.2f} GB/s.")
    return "\n".join(lines) + "\n"


def timing_line(rp: dict, device_type: str | None) -> str:
    t = rp.get("timing")
    if not t:
        return "No step was timed."
    how = ("the device ran every kernel back to back: its time, not Python's"
           if device_type == "cuda" else "on the CPU the host's time is the step's")
    return (f"{t['gapless_steps']} of {t['steps']} steps gapless ({how}); measured "
            f"{t['measured_ms_mean']:.2f} ms a step on average, host launches "
            f"{t['host_enqueue_ms_mean']:.2f} ms; "
            f"{t['weight_bound_steps']} weight-bound decode steps (context KV under "
            f"{WEIGHT_BOUND_KV_SHARE:.0%} of the weights' bytes).")


def integrity_line(rp: dict) -> str:
    i = rp["integrity"]
    if not i["passed"]:
        return f"Integrity check **FAILED** after {i['steps_checked']} steps: {i['error']}"
    tail = f" (stopped early: {i['truncated']})" if i.get("truncated") else ""
    return f"Integrity checks passed on all {i['steps_checked']} steps{tail}."


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except OutOfTime:
        traceback.print_exc()
        raise SystemExit(2)
