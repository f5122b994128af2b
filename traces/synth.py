"""Seeded synthetic scenarios: `poisson`, `gamma`, `flash-crowd` (the default), `diurnal`, `priority-mix`.

Owns the arrival processes and the scenario parameters (frozen keyword-only dataclasses). Same
scenario + parameters (incl. seed) => the identical trace, in and across processes: numpy's PCG64
seeded once, arrivals and lengths drawn from separate child streams. Time-varying rates use
thinning of a homogeneous Poisson process (vectorised). Must not import replay/ or capacity/.

Sizing of the default flash crowd (Llama-3.1-8B, one H100, ~450k KV tokens, max_num_seqs 1024):
by Little's law a request holds on average P + o tokens at its o-th decode step, so the KV in use is
about  rate x step_s x E[O*P + O^2/2];  with the conv lognormal fit E[O*P + O^2/2] ~ 273k
token-steps, i.e. 5.5k token-seconds per request at ~20 ms per decode step. Taken alone that says
45 req/s for 55 % KV. But prefill compute binds first on this model: each request costs ~2 x 7e9 x
(P + O) ~ 19 TFLOP, and an H100 sustains ~590 TFLOP/s (60 % of 989), so compute is ~100 % busy at
~30 req/s, and a 45 req/s base would saturate and preempt before any surge. Checked by replaying
it (kvcap's cost model, V1 defaults): at 20 req/s the 2x surge overloads compute (~130 %) and the
queue drains for minutes (preemption in most windows: "structural"); at 12 req/s nothing preempts;
at 13-14 req/s (surge to 26-28 req/s, compute ~85-90 %) KV runs dry only around the surge:
preemption in a few one-minute windows, all at the peak, TBT back to baseline within a minute
("peak-only"); 13 req/s keeps the surge's TTFT p99 near 3 s. The default is therefore 13 req/s for
15 minutes with the surge at minute 5 (1 min ramp, 2 min hold, 1 min
decay): the textbook case the report is meant to explain, and small enough (~15k requests) for the
main job to replay it a few dozen times.
Assumed: bf16 weights (16 GB) and KV (128 KiB/token), 60 % of peak FLOPs, 80 % of HBM bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import polars as pl

from traces.lengths import sample_lengths
from traces.schema import SCHEMA, TraceError


@dataclass(frozen=True, slots=True, kw_only=True)
class PoissonParams:
    duration_s: float = 600.0
    rate_rps: float = 10.0
    seed: int = 0
    lengths: str = "lognormal"


@dataclass(frozen=True, slots=True, kw_only=True)
class GammaParams:
    """Renewal process with gamma inter-arrival times: cv > 1 is burstier than Poisson (cv = 1)."""
    duration_s: float = 600.0
    rate_rps: float = 10.0
    cv: float = 3.0
    seed: int = 0
    lengths: str = "lognormal"


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashCrowdParams:
    """Base load; at surge_start_s the rate ramps linearly to surge_factor x base within ramp_s,
    holds for hold_s, decays linearly back to base over decay_s, then base until duration_s."""
    duration_s: float = 900.0
    rate_rps: float = 13.0
    surge_factor: float = 2.0
    surge_start_s: float = 300.0
    ramp_s: float = 60.0
    hold_s: float = 120.0
    decay_s: float = 60.0
    seed: int = 0
    lengths: str = "lognormal"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiurnalParams:
    """rate(t) = rate_rps x (1 - amplitude x cos(2 pi t / period_s)): trough at t = 0, peak mid-period.
    A day compressed into one hour by default."""
    duration_s: float = 3600.0
    rate_rps: float = 10.0
    amplitude: float = 0.5
    period_s: float = 3600.0
    seed: int = 0
    lengths: str = "lognormal"


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityMixParams:
    """Interactive chat (priority 0, tenant "interactive", Poisson at rate_rps) sharing the instance
    with offline batch jobs (tenant "batch", priority batch_priority >= 1): jobs start as a Poisson
    process with mean gap batch_job_interval_s, each submitting batch_job_requests requests spread
    uniformly over batch_submit_s, with longer prompts and outputs."""
    duration_s: float = 600.0
    rate_rps: float = 10.0
    batch_job_interval_s: float = 120.0
    batch_job_requests: int = 200
    batch_submit_s: float = 5.0
    batch_priority: int = 1
    seed: int = 0
    lengths: str = "lognormal"
    batch_lengths: str = "lognormal-batch"


Params = PoissonParams | GammaParams | FlashCrowdParams | DiurnalParams | PriorityMixParams

DEFAULT_SCENARIO = "flash-crowd"


def flash_crowd_rate(t: np.ndarray, p: FlashCrowdParams) -> np.ndarray:
    """The flash crowd's target rate (req/s) at times t."""
    peak = p.rate_rps * p.surge_factor
    ramp_end = p.surge_start_s + p.ramp_s
    hold_end = ramp_end + p.hold_s
    decay_end = hold_end + p.decay_s
    return np.interp(t, [p.surge_start_s, ramp_end, hold_end, decay_end],
                     [p.rate_rps, peak, peak, p.rate_rps])


def diurnal_rate(t: np.ndarray, p: DiurnalParams) -> np.ndarray:
    return p.rate_rps * (1.0 - p.amplitude * np.cos(2 * np.pi * t / p.period_s))


def _poisson_times(rate_rps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    n = rng.poisson(rate_rps * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))


def _thinned(rate: Callable[[np.ndarray], np.ndarray], max_rate: float, duration_s: float,
             rng: np.random.Generator) -> np.ndarray:
    t = _poisson_times(max_rate, duration_s, rng)
    return t[rng.uniform(0.0, 1.0, len(t)) * max_rate < rate(t)]


def _gamma_times(p: GammaParams, rng: np.random.Generator) -> np.ndarray:
    shape = 1.0 / p.cv**2
    scale = 1.0 / (p.rate_rps * shape)
    chunks, total = [], 0.0
    while total <= p.duration_s:  # a few vectorised chunks, not a loop per request
        gaps = rng.gamma(shape, scale, max(16, int(p.rate_rps * p.duration_s * 0.5) + 16))
        chunks.append(gaps)
        total += gaps.sum()
    t = np.cumsum(np.concatenate(chunks))
    return t[t < p.duration_s]


def _frame(t: np.ndarray, lengths: str, rng: np.random.Generator, *, priority: int = 0,
           tenant: str | None = None) -> pl.DataFrame:
    prompt, output = sample_lengths(lengths, len(t), rng)
    return pl.DataFrame({"arrival_s": t, "prompt_tokens": prompt, "output_tokens": output,
                         "priority": np.full(len(t), priority, np.int32),
                         "tenant": pl.Series([tenant] * len(t), dtype=pl.Utf8)})


def _finish(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Stable sort by time (earlier parts first at ties), times from the first request, ids 0..n-1."""
    df = pl.concat(parts).sort("arrival_s", maintain_order=True)
    if len(df) == 0:
        raise TraceError("the scenario produced no requests; raise the rate or the duration")
    return df.with_columns(
        request_id=pl.int_range(pl.len(), dtype=pl.Int64),
        arrival_s=pl.col("arrival_s") - pl.col("arrival_s").first(),
        prefix_hashes=pl.lit(None, dtype=SCHEMA["prefix_hashes"]),
    ).select(list(SCHEMA)).cast(SCHEMA)


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    arrivals, lengths = np.random.SeedSequence(seed).spawn(2)
    return np.random.Generator(np.random.PCG64(arrivals)), np.random.Generator(np.random.PCG64(lengths))


def _poisson(p: PoissonParams) -> pl.DataFrame:
    ra, rl = _streams(p.seed)
    return _finish([_frame(_poisson_times(p.rate_rps, p.duration_s, ra), p.lengths, rl)])


def _gamma(p: GammaParams) -> pl.DataFrame:
    ra, rl = _streams(p.seed)
    return _finish([_frame(_gamma_times(p, ra), p.lengths, rl)])


def _flash_crowd(p: FlashCrowdParams) -> pl.DataFrame:
    ra, rl = _streams(p.seed)
    t = _thinned(lambda x: flash_crowd_rate(x, p), p.rate_rps * max(1.0, p.surge_factor), p.duration_s, ra)
    return _finish([_frame(t, p.lengths, rl)])


def _diurnal(p: DiurnalParams) -> pl.DataFrame:
    ra, rl = _streams(p.seed)
    t = _thinned(lambda x: diurnal_rate(x, p), p.rate_rps * (1 + abs(p.amplitude)), p.duration_s, ra)
    return _finish([_frame(t, p.lengths, rl)])


def _priority_mix(p: PriorityMixParams) -> pl.DataFrame:
    if p.batch_priority < 1:
        raise TraceError(f"batch_priority must be >= 1 (lower is more important), got {p.batch_priority}")
    ra, rl = _streams(p.seed)
    chat = _frame(_poisson_times(p.rate_rps, p.duration_s, ra), p.lengths, rl, tenant="interactive")
    starts = _poisson_times(1.0 / p.batch_job_interval_s, p.duration_s, ra)
    offsets = ra.uniform(0.0, p.batch_submit_s, (len(starts), p.batch_job_requests))
    t = np.sort((starts[:, None] + offsets).ravel())
    batch = _frame(t[t < p.duration_s], p.batch_lengths, rl, priority=p.batch_priority, tenant="batch")
    return _finish([chat, batch])


SCENARIOS: dict[str, tuple[type, Callable[..., pl.DataFrame]]] = {
    "poisson": (PoissonParams, _poisson),
    "gamma": (GammaParams, _gamma),
    "flash-crowd": (FlashCrowdParams, _flash_crowd),
    "diurnal": (DiurnalParams, _diurnal),
    "priority-mix": (PriorityMixParams, _priority_mix),
}


def make_params(scenario: str, **overrides: object) -> Params:
    """Parameters of `scenario` with overrides; text values (from the CLI) are converted by field type."""
    if scenario not in SCENARIOS:
        raise TraceError(f"unknown scenario {scenario!r}; scenarios: {', '.join(SCENARIOS)}")
    cls = SCENARIOS[scenario][0]
    types = {f.name: f.type for f in fields(cls)}
    values = {}
    for key, value in overrides.items():
        if key not in types:
            raise TraceError(f"scenario {scenario!r} has no parameter {key!r}; parameters: {', '.join(types)}")
        conv = {"float": float, "int": int, "str": str}[str(types[key])]
        try:
            values[key] = conv(value)
        except (TypeError, ValueError):
            raise TraceError(f"parameter {key}: {value!r} is not a valid {types[key]}") from None
    return cls(**values)


def synthesize(scenario: str = DEFAULT_SCENARIO, params: Params | None = None, **overrides: object) -> pl.DataFrame:
    """The canonical trace of a scenario (default: the flash crowd with its default parameters)."""
    if params is None:
        params = make_params(scenario, **overrides)
    elif overrides:
        raise TraceError("give either params or keyword overrides, not both")
    cls, build = SCENARIOS[scenario]
    if not isinstance(params, cls):
        raise TraceError(f"scenario {scenario!r} takes {cls.__name__}, got {type(params).__name__}")
    _check_params(scenario, params)
    try:
        with np.errstate(over="raise", invalid="raise"):
            return build(params)
    except (OverflowError, FloatingPointError, ValueError) as exc:
        # A parameter in range one by one, out of range together (a shape that underflows).
        raise TraceError(f"scenario {scenario!r}: its parameters give numbers out of range "
                         f"({type(exc).__name__}: {str(exc)[:80]}); use smaller values") from None


MAX_CV = 100.0      # gamma gaps: shape 1/cv^2 underflows far beyond this
# At most this many requests expected (rate x duration): memory is sized by the requests.
MAX_EXPECTED_REQUESTS = 100_000_000
# Fields that may be 0 (the rest of the floats must be > 0); amplitude is a fraction.
_MAY_BE_ZERO = {"ramp_s", "hold_s", "decay_s", "surge_start_s", "batch_submit_s", "amplitude",
                "surge_factor"}


def _check_params(scenario: str, params: Params) -> None:
    """Every number finite and in range, and a bounded amount of work; one line naming the field."""
    for f in fields(params):
        value = getattr(params, f.name)
        if isinstance(value, float) or (isinstance(value, int) and str(f.type) == "float"):
            floor = 0.0 if f.name in _MAY_BE_ZERO else None
            if not np.isfinite(value) or (value < 0 if floor is not None else value <= 0):
                bound = ">= 0" if floor is not None else "> 0"
                raise TraceError(f"scenario {scenario!r}, parameter {f.name}: {value!r} must be a "
                                 f"finite number {bound}")
        elif isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise TraceError(f"scenario {scenario!r}, parameter {f.name}: {value} must be >= 0")
    if getattr(params, "cv", 1.0) > MAX_CV:
        raise TraceError(f"scenario {scenario!r}, parameter cv: {params.cv!r} must be <= {MAX_CV:g} "  # type: ignore[union-attr]
                         "(the coefficient of variation of the gaps; Poisson is 1)")
    if getattr(params, "amplitude", 0.0) > 1:
        raise TraceError(f"scenario {scenario!r}, parameter amplitude: {params.amplitude} must be "  # type: ignore[union-attr]
                         "<= 1 (a rate cannot go negative)")
    peak = params.rate_rps * max(1.0, getattr(params, "surge_factor", 1.0))
    if peak * params.duration_s > MAX_EXPECTED_REQUESTS:
        raise TraceError(f"scenario {scenario!r}: rate_rps x duration_s asks for about "
                         f"{peak * params.duration_s:.3g} requests, more than "
                         f"{MAX_EXPECTED_REQUESTS:,}; lower rate_rps or duration_s")


def default_trace() -> pl.DataFrame:
    """The built-in default scenario (what `kvcap report` runs with no trace file)."""
    return synthesize(DEFAULT_SCENARIO)
