"""Sizing vLLM 0.33's CPU KV offloading (`--kv-offloading-size`, issue 16: `kvcap size-offload`).

In vLLM 0.33 the host tier is the OffloadingConnector: every computed prompt block is written
through to CPU memory, and a request admitted later loads from there what the GPU prefix cache has
lost. It is a second-level prefix cache (oracle README §7, F3): its size decides how much prefill a
request is spared, not whether a preemption can happen, so it is not sized like V0's
`--swap-space` (the peak of concurrently swapped-out KV, capacity/analyses/sizing.py). It is sized
by its curve: the trace is replayed at each size of a sweep (in parallel, through the planner) and
each point records CPU-hit tokens, the prefill the GPU computes, recomputed prefill, TTFT p50/p99,
TBT p99 and preemption stalls.

The recommendation (`knee`) is the smallest swept size that is within `tolerance` of the best
point of the sweep on the two things a prefix cache buys: the prefill tokens the GPU computes
(≤ (1 + tolerance) × the fewest) and TTFT p99 (≤ (1 + tolerance) × the lowest). Size 0 (no
connector) is always a point, so a tier that saves less than the tolerance recommends none. When no
size is within tolerance on both (TTFT p99 moves for reasons the tier does not cause), the smallest
size within tolerance on prefill work is taken and the reason says so. A recommendation is always
a replayed size, never an interpolation. The default sweep starts at 1/16 of the GPU KV pool,
doubles up to the KV of every prompt (stopping at a plateau: three sizes in a row that replay
alike, counting no tier), halves below the smallest size while that is the knee
(up to 8 times), then bisects (geometrically, twice) between the knee and the size below it;
the answer says where the gain comes from (`gain_source`: prompt reuse, preempted requests
reloading, or nothing) and when the host-RAM cap binds instead of the knee.

Host RAM: the tier pins what `resolve` computes (`kv_offloading_host_ram_bytes`). vLLM 0.33 does not
check it against the host; kvcap applies V0's swap-space thresholds (warn above 40%, error above
70% of the host RAM of the GPUs the replica uses, replay/timing/memory.py), against `--host-ram-gib` or,
when not given, a reference server of the GPU (`REFERENCE_HOST_RAM`). A knee the host cannot pin
(verdict "error") is never the recommendation: the knee is then taken among the sizes the host can
pin, and the answer names the unconstrained knee and what it would pin — a tier that needs more
RAM than the server has is an answer to a different question (buy hosts), not a flag to set.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import polars as pl

from capacity.analyses.metrics import GIB, nearest_rank, summary
from capacity.analyses.planner import Planner
from capacity.analyses.stability import stability
from capacity.analyses.sweep import Job
from replay.config import EngineConfig, offload_chunk_bytes, resolve
from replay.timing.memory import SWAP_RAM_ERROR_FRACTION, SWAP_RAM_WARN_FRACTION

TOLERANCE = 0.05
# Default sweep: multiples of the GPU KV pool (a write-through tier no larger than the GPU cache
# mostly holds copies of what the GPU still has), up to the KV of every prompt in the trace.
# The sweep starts at 1/16 of the pool: a tier that only has to hold what preempted requests
# reload is small, and a sweep that starts large recommends a large size for a small gain.
POOL_MULTIPLES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32)
# Bisection steps between the knee and the swept size below it (geometric midpoints).
KNEE_BISECTIONS = 2
# Halvings below the smallest swept size while it is still the knee (a tier that only holds
# what preempted requests reload can be a few GiB).
KNEE_HALVINGS = 8

# Host RAM per GPU of the vendor's reference 8-GPU server (DGX datasheets: DGX A100 1 TB, DGX H100 /
# H200 2 TB, DGX B200 2 TB base), used when --host-ram-gib is not given. GPUs sold in servers of
# every size (PCIe H100, L40S) have no reference: their verdict needs --host-ram-gib.
REFERENCE_HOST_RAM = {
    "a100-40gb": ("DGX A100", 1024 / 8), "a100-80gb": ("DGX A100", 1024 / 8),
    "h100": ("DGX H100", 2048 / 8), "h200": ("DGX H200", 2048 / 8), "b200": ("DGX B200", 2048 / 8),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadPoint:
    kv_offloading_size_gib: float       # total over the TP group, as vLLM's flag
    num_cpu_chunks: int                 # the tier as resolved (chunks of blocks)
    host_ram_gib: float                 # what the tier pins
    host_ram_verdict: str | None        # "ok" | "warn" | "error" | None (no host RAM known)
    cpu_hit_tokens: int                 # at first admission, summed over requests
    gpu_hit_tokens: int
    prefill_tokens: int                 # prefill the GPU computed (all steps)
    recomputed_prefill_tokens: int      # of which: work redone after preemptions
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    preemptions: int
    preemption_stalls: int
    stall_p99_s: float | None
    throughput_rps: float
    run_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Knee:
    index: int              # into the points, sorted by size
    size_gib: float
    within_both: bool       # False: TTFT p99 was not within tolerance anywhere prefill work was
    reason: str
    # The knee of the whole sweep when the host cannot pin it (this knee is the one among the
    # sizes it can); None when the knee fits.
    unconstrained_gib: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadSizing:
    scheduler: str
    scheduler_loop: str                 # "async" | "sync": the loop every point replayed
    vllm_version: str | None = None     # the release every point replayed
    block_size: int | None = None
    tensor_parallel_size: int
    tolerance: float
    points: tuple[OffloadPoint, ...]    # by size, 0 (no connector) first
    knee: Knee
    host_ram_total_gib: float | None    # host RAM of the replica's GPUs the verdicts compare to
    host_ram_source: str

    @property
    def recommended(self) -> OffloadPoint:
        return self.points[self.knee.index]

    @property
    def recommended_kv_offloading_size_gib(self) -> float:
        return self.knee.size_gib

    @property
    def needed(self) -> bool:
        return self.knee.size_gib > 0

    def engine_words(self) -> str:
        from capacity.analyses.versions import engine_words
        return engine_words(self.scheduler, self.vllm_version, self.scheduler_loop,
                            self.block_size)

    def flags(self) -> tuple[str, ...]:
        if not self.needed:
            return ()
        return ("--kv-offloading-size", f"{self.knee.size_gib:g}", "--kv-offloading-backend",
                "native")

    def words(self) -> str:
        r, base = self.recommended, self.points[0]
        if not self.needed:
            return f"no CPU offloading: {self.knee.reason}"
        ram = (f"; pins {r.host_ram_gib:g} GiB of host RAM ({r.host_ram_verdict})"
               if r.host_ram_verdict else f"; pins {r.host_ram_gib:g} GiB of host RAM")
        binds = ("; the host-RAM cap binds, not the knee" if self.knee.unconstrained_gib
                 is not None else "")
        return (f"--kv-offloading-size {self.knee.size_gib:g} GiB (V1, all TP ranks): "
                f"{self.gain_words()}; the GPU computes "
                f"{_pct(r.prefill_tokens, base.prefill_tokens)} of the prefill it computes without "
                f"offloading; {self.knee.reason}{ram}{binds}")

    def gain_source(self) -> str:
        """Where the recommended tier's gain comes from: "prompt_reuse" (prompts found in the
        CPU tier at first admission), "preempted_reload" (preempted requests coming back from
        host memory instead of recomputing: fewer recomputed tokens or preemptions), both, or
        "none"."""
        r, base = self.recommended, self.points[0]
        reuse = r.cpu_hit_tokens > 0
        reload = (r.recomputed_prefill_tokens < base.recomputed_prefill_tokens
                  or r.preemptions < base.preemptions)
        return ("prompt_reuse+preempted_reload" if reuse and reload else "prompt_reuse" if reuse
                else "preempted_reload" if reload else "none")

    def gain_words(self) -> str:
        r, base = self.recommended, self.points[0]
        parts = []
        if r.cpu_hit_tokens:
            parts.append(f"{r.cpu_hit_tokens:,} prompt tokens found in the CPU tier at first "
                         f"admission (prompt reuse)")
        if (r.recomputed_prefill_tokens < base.recomputed_prefill_tokens
                or r.preemptions < base.preemptions):
            parts.append(f"preempted requests reload from host memory: recomputed prefill "
                         f"{base.recomputed_prefill_tokens:,} → {r.recomputed_prefill_tokens:,} "
                         f"tokens, preemptions {base.preemptions:,} → {r.preemptions:,}")
        return "; ".join(parts) or "no measurable gain (no prompt reuse, no fewer recomputes)"

    def as_dict(self) -> dict:
        return {"engine": self.scheduler, "scheduler_loop": self.scheduler_loop,
                "engine_words": self.engine_words(), "gain_source": self.gain_source(),
                "gain_words": self.gain_words(),
                "host_ram_binds": self.knee.unconstrained_gib is not None,
                "tensor_parallel_size": self.tensor_parallel_size,
                "points": [dataclasses.asdict(p) for p in self.points],
                "recommended_kv_offloading_size_gib": self.knee.size_gib,
                "tolerance": self.tolerance, "within_tolerance_on_both": self.knee.within_both,
                "reason": self.knee.reason,
                "unconstrained_kv_offloading_size_gib": self.knee.unconstrained_gib, "needed": self.needed, "flags": list(self.flags()),
                "host_ram_gib": self.recommended.host_ram_gib,
                "host_ram_verdict": self.recommended.host_ram_verdict,
                "host_ram_total_gib": self.host_ram_total_gib,
                "host_ram_source": self.host_ram_source, "words": self.words()}


def _pct(x: int, of: int) -> str:
    return f"{x / of:.0%}" if of else "-"


# ------------------------------------------------------------------------------ the knee (pure)
def check_tolerance(tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance)
            and 0 <= tolerance < 1):
        raise ValueError(f"--tolerance {tolerance!r}: must be a fraction in [0, 1), e.g. 0.05")


def knee(points: Sequence, tolerance: float = TOLERANCE) -> Knee:
    """The smallest size within `tolerance` of the best on prefill work and TTFT p99 (see the
    module docstring). `points`: objects with `kv_offloading_size_gib`, `prefill_tokens` and
    `ttft_p99_s`, in any order; the index is into them sorted by size."""
    if not points:
        raise ValueError("knee: no points")
    check_tolerance(tolerance)
    pts = sorted(points, key=lambda p: p.kv_offloading_size_gib)
    least_work = min(p.prefill_tokens for p in pts)
    ttfts = [p.ttft_p99_s for p in pts if p.ttft_p99_s is not None]
    best_ttft = min(ttfts) if ttfts else None

    def work_ok(p) -> bool:
        return p.prefill_tokens <= least_work * (1 + tolerance)

    def ttft_ok(p) -> bool:
        return best_ttft is None or (p.ttft_p99_s is not None
                                     and p.ttft_p99_s <= best_ttft * (1 + tolerance))

    tol = f"{tolerance:.0%}"
    for i, p in enumerate(pts):
        if work_ok(p) and ttft_ok(p):
            if i == 0 and p.kv_offloading_size_gib == 0:
                why = (f"no swept size cuts the prefill the GPU computes or TTFT p99 by more than "
                       f"{tol} against no offloading")
            else:
                why = (f"the smallest swept size within {tol} of the best on prefill work "
                       f"({p.prefill_tokens:,} vs {least_work:,} tokens) and TTFT p99 "
                       f"({_sec(p.ttft_p99_s)} vs {_sec(best_ttft)})")
            return Knee(index=i, size_gib=p.kv_offloading_size_gib, within_both=True, reason=why)
    i, p = next((i, p) for i, p in enumerate(pts) if work_ok(p))
    return Knee(index=i, size_gib=p.kv_offloading_size_gib, within_both=False, reason=(
        f"the smallest swept size within {tol} of the fewest prefill tokens ({p.prefill_tokens:,} "
        f"vs {least_work:,}); no size is also within {tol} of the lowest TTFT p99 "
        f"({_sec(best_ttft)}), which varies across the sweep for reasons other than the tier"))


def host_bounded_knee(points: Sequence, tolerance: float = TOLERANCE) -> Knee:
    """`knee`, unless the host cannot pin it (`host_ram_verdict` "error"): then the knee among the
    sizes it can pin (pinned RAM grows with size, so they are the smallest ones; size 0 always
    fits), with the unconstrained knee named in the reason."""
    pts = sorted(points, key=lambda p: p.kv_offloading_size_gib)
    k = knee(pts, tolerance)
    if pts[k.index].host_ram_verdict != "error":
        return k
    fit = [p for p in pts if p.host_ram_verdict != "error"]
    if not fit:
        raise ValueError("knee: no swept size fits in host RAM (not even 0)")
    kf = knee(fit, tolerance)
    big = pts[k.index]
    reason = (f"{kf.reason}, among the sizes the host can pin (up to {fit[-1].kv_offloading_size_gib:g}"
              f" GiB); the whole sweep's knee, {big.kv_offloading_size_gib:g} GiB, would pin "
              f"{big.host_ram_gib:g} GiB of host RAM, past {SWAP_RAM_ERROR_FRACTION:.0%} of the "
              f"host's: with this host "
              f"the tier cannot reach it")
    return dataclasses.replace(kf, reason=reason, unconstrained_gib=big.kv_offloading_size_gib)


def _sec(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:,.0f} ms" if v < 1 else f"{v:,.2f} s"


# ---------------------------------------------------------------------------- sizes and host RAM
def nice_gib(x: float) -> float:
    """Round up to 2 significant digits (27.3 -> 28, 0.123 -> 0.13): sizes people configure."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return round(math.ceil(x / 10 ** e - 1e-9) * 10 ** e, max(0, -e))


def smallest_tier_gib(config: EngineConfig) -> float:
    """The smallest --kv-offloading-size that holds anything: one offload chunk (every rank's
    bytes of its blocks, page-rounded); vLLM's connector gets no chunk below it and kvcap
    refuses such a size. The sweep never probes under it."""
    return offload_chunk_bytes(resolve(config).kv_bytes_per_block,
                               config.tensor_parallel_size) / GIB


def default_sizes(trace: pl.DataFrame, config: EngineConfig) -> tuple[float, ...]:
    """Multiples of the GPU KV pool (total over TP) up to the first that holds the KV of every
    prompt of the trace (nothing larger can hold more: only prompts are stored by default); none
    below one offload chunk (a pool of a few blocks)."""
    eng = resolve(config)
    tp = config.tensor_parallel_size
    pool = eng.num_gpu_blocks * eng.kv_bytes_per_block * tp / GIB
    prompts = float(trace["prompt_tokens"].cast(pl.Int64).sum() or 0) * eng.kv_bytes_per_token * tp / GIB
    least = smallest_tier_gib(config)
    out: list[float] = []
    for m in POOL_MULTIPLES:
        out.append(nice_gib(pool * m))
        if pool * m >= prompts:
            break
    return tuple(dict.fromkeys(s for s in out if s >= least))


def host_ram_total(config: EngineConfig, host_ram_gib: float | None) -> tuple[float | None, str]:
    """Host RAM (GiB) of the GPUs one replica uses, and where the number comes from."""
    tp = config.tensor_parallel_size
    if host_ram_gib is not None:
        return host_ram_gib, "--host-ram-gib"
    ref = REFERENCE_HOST_RAM.get(resolve(config).gpu.name)
    if ref is None:
        return None, (f"unknown for {resolve(config).gpu.name} (no reference server): give "
                      f"--host-ram-gib for a verdict")
    server, per_gpu = ref
    return per_gpu * tp, (f"{server} reference server: {per_gpu:g} GiB per GPU x {tp} GPU"
                          f"{'s' if tp > 1 else ''}")


def host_ram_verdict(pinned_bytes: int, total_gib: float | None) -> str | None:
    if total_gib is None:
        return None
    if pinned_bytes > SWAP_RAM_ERROR_FRACTION * total_gib * GIB:
        return "error"
    if pinned_bytes > SWAP_RAM_WARN_FRACTION * total_gib * GIB:
        return "warn"
    return "ok"


# ------------------------------------------------------------------------------------ the sweep
def offload_config(config: EngineConfig, size_gib: float) -> EngineConfig:
    """`config` with a tier of `size_gib` (0: no connector). The tier is sized by GiB, as vLLM's
    flag: a num_cpu_blocks_override would override it."""
    return dataclasses.replace(config, kv_offloading_size=size_gib or None,
                               num_cpu_blocks_override=None)


def point(size_gib: float, tables: dict[str, pl.DataFrame], config: EngineConfig,
          total_gib: float | None) -> OffloadPoint:
    s = summary(tables)
    req, steps, stalls = tables["requests"], tables["steps"], tables["stalls"]
    eng = resolve(config)
    pinned = eng.kv_offloading_host_ram_bytes

    def col_sum(df: pl.DataFrame, name: str) -> int:
        return int(df[name].cast(pl.Int64).sum() or 0) if name in df.columns else 0

    return OffloadPoint(
        kv_offloading_size_gib=size_gib, num_cpu_chunks=eng.spec.num_cpu_blocks if size_gib else 0,
        host_ram_gib=pinned / GIB, host_ram_verdict=host_ram_verdict(pinned, total_gib),
        cpu_hit_tokens=col_sum(req, "cpu_hit_tokens"), gpu_hit_tokens=col_sum(req, "gpu_hit_tokens"),
        prefill_tokens=col_sum(steps, "num_prefill_tokens"),
        recomputed_prefill_tokens=col_sum(req, "recomputed_tokens"),
        ttft_p50_s=s["ttft_p50_s"], ttft_p99_s=s["ttft_p99_s"], tbt_p99_s=s["tbt_p99_s"],
        preemptions=s["preemptions_recompute"] + s["preemptions_swap"],
        preemption_stalls=stalls.height,
        stall_p99_s=nearest_rank(stalls["stall_s"].to_numpy(), 0.99),
        throughput_rps=s["throughput_rps"], run_id=s["run_id"])


def check_v1(config: EngineConfig) -> None:
    if config.scheduler != "v1":
        raise ValueError("size-offload: --kv-offloading-size is vLLM V1's CPU offloading; V0's "
                         "host tier is --swap-space: use `kvcap size-swap --scheduler v0`")


def size_offload(trace: pl.DataFrame, config: EngineConfig, *, sizes: Sequence[float] | None = None,
                 tolerance: float = TOLERANCE, host_ram_gib: float | None = None,
                 planner: Planner | None = None, baseline: dict | None = None) -> OffloadSizing:
    """Replay `trace` under `config` at each size (plus 0) and recommend the knee.

    Refuses (ValueError) an overloaded run at size 0: its TTFT measures the backlog, and a tier
    sized there would be sized for it. `baseline`: the tables of the replay of `config` without a
    connector, when the caller has them."""
    check_v1(config)
    check_tolerance(tolerance)                       # before any replay
    planner = planner or Planner()
    default_sweep = not sizes
    sizes = tuple(sorted({0.0, *(float(s) for s in (sizes or default_sizes(trace, config)))}))
    for s in sizes:
        if not (math.isfinite(s) and s >= 0):
            raise ValueError(f"--sizes: {s!r} must be GiB >= 0")
    cfgs = [offload_config(config, s) for s in sizes]
    total, source = host_ram_total(config, host_ram_gib)
    if baseline is not None:
        st, p0, loop = _base_of(baseline, config=cfgs[0], total_gib=total)
    else:                         # reduced where it is replayed, as every other point
        from capacity.analyses.planner import reducer
        st, p0, loop = planner.map([Job(trace=trace, config=cfgs[0], label="size-offload 0",
                                        trace_name=planner.trace_name)],
                                   reducer(_base_of, config=cfgs[0], total_gib=total))[0]
    if not st.sustainable:
        raise ValueError(f"size-offload: the engine is overloaded at this load ({st.evidence}); "
                         f"a tier sized here would be sized for the backlog — lower the rate "
                         f"(--rate-scale) or add capacity first")
    pts = [p0]
    if default_sweep:
        pts += _plateau_sweep(trace, config, sizes[1:], planner, total, pts[0])
    else:
        pts += _points(trace, config, sizes[1:], planner, total)
    if default_sweep:
        ahead: dict[float, OffloadPoint] = {}
        least = smallest_tier_gib(config)         # no halving below one offload chunk
        for i in range(KNEE_HALVINGS):            # the knee is the smallest size: go below it
            ordered = sorted(pts, key=lambda p: p.kv_offloading_size_gib)
            if host_bounded_knee(ordered, tolerance).index != 1:
                break
            half = nice_gib(ordered[1].kv_offloading_size_gib / 2)
            if not least <= half < ordered[1].kv_offloading_size_gib:
                break
            if half not in ahead:
                # The next halving replays beside this one: it is the next probe whenever this
                # one leaves the knee at the smallest size, as it does all the way down where
                # any tier helps (two rounds in the time of one on two workers). It joins the
                # points only if the search gets there: the answer is the one-at-a-time search's,
                # and the replays made do not depend on --workers.
                quarter = nice_gib(half / 2)
                both = ((half, quarter) if least <= quarter < half and i + 1 < KNEE_HALVINGS
                        else (half,))
                ahead.update(zip(both, _points(trace, config, both, planner, total)))
            pts.append(ahead.pop(half))
        for _ in range(KNEE_BISECTIONS):          # bisect between the knee and the size below
            ordered = sorted(pts, key=lambda p: p.kv_offloading_size_gib)
            k = host_bounded_knee(ordered, tolerance).index
            if k < 2:                             # the knee is 0 or the smallest size
                break
            lo, hi = ordered[k - 1].kv_offloading_size_gib, ordered[k].kv_offloading_size_gib
            mid = nice_gib(math.sqrt(lo * hi))
            if not lo < mid < hi:
                break
            pts += _points(trace, config, (mid,), planner, total)
    pts.sort(key=lambda p: p.kv_offloading_size_gib)

    return OffloadSizing(
        scheduler=config.scheduler, tensor_parallel_size=config.tensor_parallel_size,
        scheduler_loop=loop, vllm_version=resolve(config).vllm_version,
        block_size=resolve(config).block_size,
        tolerance=tolerance, points=tuple(pts), knee=host_bounded_knee(pts, tolerance),
        host_ram_total_gib=total, host_ram_source=source)


def _base_of(tables: dict, *, config: EngineConfig, total_gib: float | None):
    """The size-0 point: (stability, point, scheduler loop)."""
    run = tables["runs"].row(0, named=True)
    return (stability(tables), point(0.0, tables, config, total_gib),
            "async" if run.get("async_scheduling") else "sync")


def _same(a: OffloadPoint, b: OffloadPoint) -> bool:
    return (a.prefill_tokens, a.ttft_p99_s, a.tbt_p99_s, a.preemptions, a.cpu_hit_tokens) == \
        (b.prefill_tokens, b.ttft_p99_s, b.tbt_p99_s, b.preemptions, b.cpu_hit_tokens)


PLATEAU_ROUND = 2       # sizes replayed together in the default sweep (what 1 or 2 workers did)


def _plateau_sweep(trace, config, sizes, planner: Planner, total,
                   base: OffloadPoint) -> list[OffloadPoint]:
    """The default sweep, smallest sizes first, PLATEAU_ROUND sizes at a time; it stops once two
    consecutive sizes replay alike with the tier in use (a plateau: a larger tier holds what is
    never asked for again), or alike when nothing could come back from a tier (no prefix hashes,
    no preemption at size 0), so a tier that changes nothing costs two replays, not ten. Sizes
    alike with no hit in the tier are no plateau where something could come back: the sizes are
    too small for the trace's reuse distance (sessions back 10 GiB of KV later gain nothing
    from 1 or 2 GiB). The round is fixed, not the worker count: the sizes replayed (the answer,
    and the runs a report stores) are the same with any --workers."""
    from traces.schema import has_prefix_hashes
    could_return = has_prefix_hashes(trace) or base.preemptions > 0
    n = PLATEAU_ROUND
    out: list[OffloadPoint] = []
    for i in range(0, len(sizes), n):
        out += _points(trace, config, sizes[i:i + n], planner, total)
        seq = [base, *out]
        if (len(seq) >= 3 and _same(seq[-1], seq[-2]) and _same(seq[-2], seq[-3])
                and (seq[-1].cpu_hit_tokens > 0 or not could_return)):
            break
    return out


def _points(trace, config, sizes, planner: Planner, total) -> list[OffloadPoint]:
    """Each size's point, reduced where it was replayed (no tables kept)."""
    from capacity.analyses.planner import reducer
    cfgs = [offload_config(config, s) for s in sizes]
    return planner.map([Job(trace=trace, config=c, label=f"size-offload {s:g}",
                            trace_name=planner.trace_name) for s, c in zip(sizes, cfgs)],
                       [reducer(_point_of, size_gib=s, config=c, total_gib=total)
                        for s, c in zip(sizes, cfgs)])


def _point_of(tables: dict, *, size_gib: float, config: EngineConfig,
              total_gib: float | None) -> OffloadPoint:
    return point(size_gib, tables, config, total_gib)
