"""`kvcap calibrate --from-logs LOG --trace TRACE`: fit a measured profile's kernel efficiency to
the periodic stats lines of a vLLM server log that served a known trace (docs/timing.md, "From a
server log").

A stats line (every 10 s in V1, 5 s in V0) gives the interval's generated and prompt tokens per
second and, at its end, the requests running. The log has no request ids, so the trace is first
placed on the log's clock: the offset whose prompt tokens per interval best match the logged prompt
throughput (least squares over a grid, then refined). Below saturation the generation throughput
is what the clients asked for, whatever the step time; what the step time decides is how many
requests are running at once (Little's law: arrivals x time in the engine). So the fit finds the
`kernel_scale` at which the replay runs as many requests at the logged instants as the server did
(bisection on the scale; the running count grows with it), keeping the profile's per-step
overhead: 5-10 s averages cannot tell the two apart.

Must not import capacity/, duckdb or torch (replay.run, for the replays, brings polars).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import math

import numpy as np

from replay.calibration.bench_fit import replay_state
from replay.config import EngineConfig
from replay.engine.state import RequestState
from replay.timing import step_profile



@dataclass(frozen=True, slots=True, kw_only=True)
class StatsWindows:
    """One entry per stats line of one engine, in log order."""
    end_s: np.ndarray                   # the line's time (s, any fixed origin)
    interval_s: np.ndarray              # the interval the line averages over
    running: np.ndarray                 # requests running at the line
    generation_tps: np.ndarray          # generated tokens / s over the interval
    prompt_tps: np.ndarray              # prompt tokens / s over the interval


def align(w: StatsWindows, first_token_s: np.ndarray, prompt_len: np.ndarray) -> float:
    """The offset d (s) that puts the trace on the log's clock (log time = trace time + d): the
    replay's prompt tokens per interval best match the logged prompt throughput (vLLM counts a
    request's prompt tokens in the interval of its first token)."""
    ok = np.isfinite(first_token_s)
    order = np.argsort(first_token_s[ok], kind="stable")
    t = first_token_s[ok][order]
    prompt_len = prompt_len[ok]
    cum = np.cumsum(prompt_len[order].astype(float))

    def tokens_by(x: np.ndarray) -> np.ndarray:          # prompt tokens arrived by time x
        return np.concatenate([[0.0], cum])[np.searchsorted(t, x, side="right")]

    def cost(d: np.ndarray) -> np.ndarray:
        hi = w.end_s[None, :] - d[:, None]
        got = (tokens_by(hi) - tokens_by(hi - w.interval_s[None, :])) / w.interval_s[None, :]
        return ((got - w.prompt_tps[None, :]) ** 2).sum(axis=1)
    lo, hi = float(w.end_s.min() - t[-1] - w.interval_s.max()), float(w.end_s.max() - t[0])
    step = max((hi - lo) / 2000, 0.05)
    best = lo
    while True:
        grid = np.arange(lo, hi + step, step)
        best = float(grid[int(np.argmin(cost(grid)))])
        if step <= 0.05:
            return best
        lo, hi, step = best - step, best + step, max(step / 20, 0.05)


def running_at(raw, times_s: np.ndarray) -> np.ndarray:
    """The replay's running requests at each time (after the last step that ended by then)."""
    st = raw.steps
    end = st["start_s"] + st["duration_s"]
    i = np.searchsorted(end, times_s, side="right") - 1
    return np.where(i >= 0, st["num_running"][np.maximum(i, 0)], 0)


def _bisect(state, keys, config, t, at: np.ndarray, want: float, k0: float, bounds, log):
    """(kernel_scale, its replay, bracketed, replays): the scale whose replay's running requests
    at `at`, summed, equal `want` (geometric bisection; the count grows with the scale)."""
    replays = {}

    def excess(k: float) -> float:                  # replay's running minus the log's
        raw, _ = replay_state(state, keys, config, replace(t, kernel_scale=k))
        replays[k] = raw
        got = float(running_at(raw, at).sum())
        if log:
            log(f"kernel_scale {k:.4g}: {got / len(at):.2f} running on average "
                f"(log: {want / len(at):.2f})")
        return got - want
    lo_k, hi_k = bounds
    lo, hi = max(0.7 * k0, lo_k), min(1.4 * k0, hi_k)
    f_lo, f_hi = excess(lo), excess(hi)
    while f_lo > 0 and lo > lo_k:                   # widen until the root is bracketed
        lo = max(lo / 2, lo_k)
        f_lo = excess(lo)
    while f_hi < 0 and hi < hi_k:
        hi = min(hi * 2, hi_k)
        f_hi = excess(hi)
    while hi / lo > 1.002 and f_lo < 0 < f_hi:
        mid = math.sqrt(lo * hi)
        f = excess(mid)
        lo, f_lo, hi, f_hi = (mid, f, hi, f_hi) if f < 0 else (lo, f_lo, mid, f)
    k = lo if abs(f_lo) <= abs(f_hi) else hi
    return k, replays[k], bool(f_lo <= 0 <= f_hi), len(replays)


def fit(w: StatsWindows, state: RequestState, keys, config: EngineConfig,
        base: step_profile.MeasuredTables, log=None) -> tuple[step_profile.MeasuredTables, dict]:
    """(fitted tables, report): the kernel_scale whose replay has the logged number of running
    requests at the logged instants where the server was busy (summed over them)."""
    use = (w.running >= 1) & (w.generation_tps > 0)
    if use.sum() < 3:
        raise ValueError(f"--from-logs: {int(use.sum())} stats lines with running requests; at "
                         "least 3 are needed")
    want = float(w.running[use].sum())
    lo_k, hi_k = step_profile.CONSTANTS["kernel_scale"]
    t = replace(base, overhead_per_row_s=0.0)
    raw0 = replay_state(state, keys, config, t)[0]
    # Place the trace with the shipped profile's replay, fit, then place it again with the
    # fitted one (in overload the first tokens lag the arrivals by the queue) and fit again.
    offset, k, rounds = align(w, raw0.first_token_s, state.prompt_len), base.kernel_scale, 0
    for placing in range(3):
        k, raw, bracketed, n = _bisect(state, keys, config, t, w.end_s[use] - offset,
                                       want, k, (lo_k, hi_k), log)
        rounds += n
        placed = align(w, raw.first_token_s, state.prompt_len)
        if abs(placed - offset) <= float(np.median(w.interval_s)) or placing == 2:
            break
        offset = placed
    at = w.end_s[use] - offset
    fitted = replace(t, kernel_scale=float(k))
    run = running_at(raw, at)
    run0 = running_at(raw0, at)
    gen = _generated(raw, w, offset)
    report = {"replays": rounds + 1, "offset_s": offset, "num_intervals": int(len(w.end_s)),
              "num_busy_intervals": int(use.sum()),
              "running_mean_log": want / use.sum(), "running_mean_replay": float(run.mean()),
              "running_sum_error_pct": float(100 * abs(run.sum() - want) / want),
              "running_sum_error_pct_shipped": float(100 * abs(run0.sum() - want) / want),
              "running_median_error_pct": float(100 * np.median(
                  np.abs(run - w.running[use]) / w.running[use])),
              "bracketed": bracketed,
              "generation_tps_median_error_pct": float(100 * np.median(
                  np.abs(gen[use] - w.generation_tps[use]) / w.generation_tps[use]))}
    return fitted, report


def _generated(raw, w: StatsWindows, offset_s: float) -> np.ndarray:
    """The replay's generated tokens per second in each logged interval."""
    st = raw.steps
    end = st["start_s"] + st["duration_s"]
    first = np.sort(raw.first_token_s[np.isfinite(raw.first_token_s)])
    hi = w.end_s - offset_s
    c = np.concatenate([[0], np.cumsum(st["num_decode_tokens"])])
    dec = c[np.searchsorted(end, hi, side="right")] - c[np.searchsorted(end, hi - w.interval_s,
                                                                        side="right")]
    fst = np.searchsorted(first, hi, side="right") - np.searchsorted(first, hi - w.interval_s,
                                                                     side="right")
    return (dec + fst) / w.interval_s
