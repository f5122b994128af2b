"""`kvcap calibrate --from-bench`: fit a measured profile's per-step overhead and kernel
efficiency to a `vllm bench serve --save-result --save-detailed` result.

The bench result gives, per request, when it was sent (`start_times`), its prompt and output
lengths (`input_lens`, `output_lens`), its time to first token (`ttfts`, s) and its inter-token
gaps (`itls`, s). kvcap replays those requests (arrivals as sent) on the shipped profile of the
GPU x model x TP and fits `overhead_s` and `kernel_scale` (docs/timing.md) by least squares on
relative per-request TPOT errors. TPOT is linear in the two constants for a fixed schedule: (its
decode steps' count * overhead + kernel_scale * their kernel seconds + swap seconds) /
(output - 1); the schedule itself moves with the step times, so fit -> replay -> fit repeats until
the constants settle. TTFT is reported, not fitted: a request's TTFT hangs on which step it
arrived in, which jumps with tiny step-time changes (a fit on it chases that and never settles).

Imports no capacity/, duckdb or torch (replay.run, for one replay, brings polars).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from replay.config import EngineConfig, resolve
from replay.engine.prefix import UniqueBlockKeys
from replay.engine.state import RequestState
from replay.timing import step_profile
from replay.timing.cost_model import CostModel
from replay.timing.executors import catalog_constants, model_shape

MAX_ROUNDS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Bench:
    """The requests of one bench result that finished (vLLM's own metrics skip the failed)."""
    path: str
    model_id: str | None
    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray          # NaN where output_len < 2 (vLLM: no TPOT for one token)
    median_tpot_ms: float


def read_bench(path: str | Path) -> Bench:
    """The per-request columns of a bench result (traces.vllm_bench reads the file: the result
    JSON or its per-request rows); a problem is one line naming the file and key."""
    from traces.schema import TraceError
    from traces.vllm_bench import read_runs
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--from-bench: {path}: no such file")
    try:
        runs = read_runs(path)
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"--from-bench: cannot read {path} ({exc})") from None
    except TraceError as exc:
        raise ValueError(f"--from-bench: {exc}") from None
    if runs is None:
        raise ValueError(f"--from-bench: {path}: expected the JSON object `vllm bench serve "
                         "--save-result` writes")
    if len(runs) > 1:
        raise ValueError(f"--from-bench: {path} holds {len(runs)} runs (--append-result); fit one: "
                         "split the file a line per run")
    run = runs[0]
    need = ("input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if k not in run.saved]
    if missing:
        raise ValueError(f"--from-bench: {path}: no per-request {missing}; rerun `vllm bench "
                         "serve` with --save-result --save-detailed")
    start = run.start_s
    if "start_times" not in run.saved:
        meta = run.raw
        if meta.get("request_rate") not in ("inf", None) or meta.get("max_concurrency"):
            raise ValueError(f"--from-bench: {path}: no start_times (a newer `vllm bench serve "
                             "--save-detailed` writes them); needed unless all requests were "
                             "sent at once (request_rate inf, no max_concurrency)")
        start = np.zeros(run.n)
    ok = (~run.failed & np.isfinite(start) & np.isfinite(run.input_len)
          & np.isfinite(run.output_len) & np.isfinite(run.ttft_s) & (run.output_len >= 1))
    if ok.sum() < 2:
        raise ValueError(f"--from-bench: {path}: fewer than 2 successful requests")
    out = run.output_len
    itl_sum = np.add.reduceat(np.append(run.itl_s, 0.0), run.itl_offsets[:-1])
    itl_sum = np.where(np.diff(run.itl_offsets) > 0, itl_sum, 0.0)
    tpot = np.where(out > 1, itl_sum / np.maximum(out - 1, 1), np.nan)
    # The fit is over TPOT: it needs requests that streamed at least two tokens, some time apart.
    if (ok & (out >= 2) & np.isfinite(tpot) & (tpot > 0)).sum() < 2:
        raise ValueError(f"--from-bench: {path}: fewer than 2 successful requests with 2 or more "
                         "output tokens and a time between them (TPOT); rerun the benchmark with "
                         "longer outputs (e.g. --random-output-len 128)")
    if not (run.input_len[ok] >= 1).any():
        raise ValueError(f"--from-bench: {path}: every input length is 0; a benchmark sends prompts "
                         "(check input_lens)")
    if ("start_times" in run.saved and np.ptp(start[ok]) == 0
            and run.raw.get("request_rate") not in ("inf", None)):
        raise ValueError(f"--from-bench: {path}: every start time is the same, yet the run had a "
                         f"request rate of {run.raw.get('request_rate')}; the start_times are not "
                         "the requests' send times")
    order = np.argsort(start[ok], kind="stable")
    arrival = start[ok][order]
    tpot = tpot[ok][order]
    med = run.raw.get("median_tpot_ms")
    if not isinstance(med, (int, float)) or isinstance(med, bool):
        med = float(np.nanmedian(tpot) * 1e3)
    return Bench(path=str(path), model_id=run.raw.get("model_id"), arrival_s=arrival - arrival[0],
                 prompt_len=run.input_len[ok][order].astype(np.int64),
                 output_len=out[ok][order].astype(np.int64), ttft_s=run.ttft_s[ok][order],
                 tpot_s=tpot, median_tpot_ms=float(med))


def replay_state(state: RequestState, keys, config: EngineConfig,
                 tables: step_profile.MeasuredTables):
    """One replay of (a copy of) `state` on `tables` (compiled core where it can run): (raw run,
    swap seconds per block)."""
    from replay.run import run_engine
    eng = resolve(config)
    cm = CostModel(shape=model_shape(eng.model), constants=catalog_constants(eng.gpu),
                   tp=eng.tensor_parallel_size, kv_bytes_per_token=eng.kv_bytes_per_token,
                   kv_bytes_per_block=eng.kv_bytes_per_block, measured=tables)
    fresh = RequestState(arrival_s=state.arrival_s.copy(), prompt_len=state.prompt_len.copy(),
                         output_len=state.output_len.copy(), priority=state.priority.copy())
    raw = run_engine(config.scheduler, eng.spec, fresh, keys, cm,
                     kv_bytes_per_block=eng.kv_bytes_per_block)
    return raw, cm.swap_s_per_block


def replay_bench(bench: Bench, config: EngineConfig, tables: step_profile.MeasuredTables):
    """One replay of the bench's requests (arrivals as sent; no prefix sharing known)."""
    state = RequestState(arrival_s=bench.arrival_s, prompt_len=bench.prompt_len,
                         output_len=bench.output_len, priority=None)
    return replay_state(state, UniqueBlockKeys(), config, tables)


def _features(raw, swap_per_block: float, t: step_profile.MeasuredTables, bench: Bench):
    """Per request: [steps, kernel seconds, swap seconds] of its decode steps (after its first
    token up to its last) per output token after the first, so that
    TPOT = steps * overhead + kernel_scale * kernel + swap; and the replay's TTFT and TPOT."""
    s = raw.steps["start_s"]
    d = raw.steps["duration_s"]
    e = s + d
    w = (raw.steps["swap_out_blocks"] + raw.steps["swap_in_blocks"]) * swap_per_block
    k = (d - t.overhead_s - w) / t.kernel_scale
    cn = np.arange(len(d) + 1, dtype=float)
    ck = np.concatenate([[0.0], np.cumsum(k)])
    cw = np.concatenate([[0.0], np.cumsum(w)])
    first, fin = raw.first_token_s, raw.finish_s
    lo = np.searchsorted(s, first, side="left")
    hi = np.maximum(np.searchsorted(e, fin, side="right"), lo)
    per = np.maximum(bench.output_len - 1, 1)[:, None]
    f = np.stack([cn[hi] - cn[lo], ck[hi] - ck[lo], cw[hi] - cw[lo]], axis=1) / per
    return f, first - bench.arrival_s, (fin - first) / per[:, 0]


def _errors(bench: Bench, ttft: np.ndarray, tpot: np.ndarray) -> dict:
    m = bench.output_len > 1
    e_tpot = np.abs(tpot[m] - bench.tpot_s[m]) / bench.tpot_s[m]
    e_ttft = np.abs(ttft - bench.ttft_s) / bench.ttft_s
    med = float(np.median(tpot[m]) * 1e3)
    return {"median_tpot_ms_observed": bench.median_tpot_ms, "median_tpot_ms_replayed": med,
            "median_tpot_error_pct": 100 * abs(med - bench.median_tpot_ms) / bench.median_tpot_ms,
            "tpot_median_error_pct": float(100 * np.median(e_tpot)),
            "tpot_p90_error_pct": float(100 * np.quantile(e_tpot, 0.9)),
            "ttft_median_error_pct": float(100 * np.median(e_ttft)),
            "ttft_p90_error_pct": float(100 * np.quantile(e_ttft, 0.9))}


def fit(bench: Bench, config: EngineConfig, base: step_profile.MeasuredTables,
        log=None) -> tuple[step_profile.MeasuredTables, dict]:
    """(fitted tables, report): overhead_s and kernel_scale by least squares, iterated."""
    t = replace(base, overhead_per_row_s=0.0)
    lo_o, hi_o = step_profile.CONSTANTS["overhead_s"]
    lo_k, hi_k = step_profile.CONSTANTS["kernel_scale"]
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):
        raw, swp = replay_bench(bench, config, t)
        if raw.status != "completed":
            raise ValueError(f"--from-bench: the replay of {bench.path} did not complete "
                             f"({raw.status}): check --max-model-len / the engine flags")
        tp, _, _ = _features(raw, swp, t, bench)
        m = bench.output_len > 1
        a = tp[m] / bench.tpot_s[m, None]
        y = 1 - tp[m, 2] / bench.tpot_s[m]
        good = np.all(np.isfinite(a), axis=1) & np.isfinite(y)
        (o, k), *_ = np.linalg.lstsq(a[good, :2], y[good], rcond=None)
        if o < lo_o:                              # no negative overhead: refit the scale alone
            o = lo_o
            k = float(np.dot(a[good, 1], y[good]) / np.dot(a[good, 1], a[good, 1]))
        o, k = float(min(max(o, lo_o), hi_o)), float(min(max(k, lo_k), hi_k))
        moved = abs(o - t.overhead_s) / max(o, 1e-4) + abs(k - t.kernel_scale) / k
        t = replace(t, overhead_s=o, kernel_scale=k)
        if log:
            log(f"round {rounds}: overhead_s {o:.6g}, kernel_scale {k:.4g}")
        if moved < 1e-3:
            break
    raw, swp = replay_bench(bench, config, t)
    _, ttft, tpot = _features(raw, swp, t, bench)
    report = {"rounds": rounds, "num_requests": int(len(bench.output_len)),
              **_errors(bench, ttft, tpot)}
    return t, report


def profile_json(base_json: dict, t: step_profile.MeasuredTables, report: dict,
                 source: dict) -> dict:
    """The shipped profile with the fitted constants and how they were fitted (`source`: what
    the fit read, e.g. {"from_bench": path})."""
    out = dict(base_json)
    out["name"] = f"{base_json['name']}--calibrated"
    out["constants"] = {"overhead_s": t.overhead_s, "overhead_per_row_s": 0.0,
                        "kernel_scale": t.kernel_scale}
    out["calibration"] = {**source, **report}
    return out


def write_json(profile: dict, path: str | Path) -> Path:
    """Write the profile whole or not at all (a temporary file renamed into place)."""
    from traces import atomic
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"-o: {path} is a directory; give a file name such as "
                         f"{path / 'profile.json'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(profile, indent=1) + "\n")
    return path
