"""V0 swap-space sizing from peak concurrent evictions (issue: size-swap).

V0 only: vLLM V1 (0.33) has no swap; its host tier, CPU KV offloading, is a second prefix cache
sized by its hit curve (capacity/analyses/offload.py, `kvcap size-offload`).

The host tier must hold, at every moment, the KV of all requests that are swapped out at that
moment. kvcap measures that demand by replaying in swap mode with a host pool too big to fill,
reads the `evicted_blocks` series of the steps table (KV blocks of swap-preempted requests not yet
resumed, per GPU), recommends peak x (1 + headroom) rounded up, and verifies the recommendation (and
a what-if size below the peak) by replaying with those sizes.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from capacity.analyses.metrics import GIB, nearest_rank, summary
from replay.config import EngineConfig, resolve
from replay.timing.memory import swap_host_ram_verdict
from capacity.analyses.planner import Planner
from capacity.analyses.stability import stability
from capacity.analyses.sweep import Job

# Rounding step of a recommendation (GiB): vLLM takes any float, people configure halves.
ROUND_GIB = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Verification:
    swap_space_gib: float
    num_cpu_blocks: int
    on_swap_full: str
    status: str                  # "completed" | "aborted"
    abort_s: float | None
    swap_full_events: int
    swap_full_fallbacks: int
    preemptions_swap: int
    # Extra prefill caused by resumes the host tier could not serve (V1's offload tier evicts
    # instead of aborting, so a short tier shows up here).
    recomputed_tokens: int
    run_id: str
    fraction_of_peak: float | None = None    # sweep/what-if points: the size / the peak demand


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapSizing:
    scheduler: str
    tensor_parallel_size: int
    kv_bytes_per_block: int
    headroom: float
    peak_swapped_blocks: int
    peak_swapped_gib: float
    peak_swapped_requests: int
    peak_at_s: float | None
    per_second_p99_gib: float
    per_second_p999_gib: float
    preemptions_swap: int
    recommended_swap_space_gib: float            # V0 --swap-space, per GPU
    host_ram_gib: float                          # what the recommendation pins on the host
    host_ram_verdict: str | None                 # "ok" | "warn" (>40%) | "error" (>70%) | None
    demand_run_id: str
    verify: Verification | None
    what_if: list[Verification] = field(default_factory=list)
    sweep: list[Verification] = field(default_factory=list)
    demand: pl.DataFrame | None = None           # per-second peak demand (t_s, gib, requests)

    @property
    def needed(self) -> bool:
        """False when nothing is ever swapped out: no host tier is needed at all."""
        return self.peak_swapped_blocks > 0

    def words(self) -> str:
        if not self.needed:
            return "not needed: no request is ever swapped out at this load"
        return (f"--swap-space {self.recommended_swap_space_gib:g} GiB per GPU (V0): "
                f"peak {self.peak_swapped_gib:.2f} GiB concurrently swapped + {self.headroom:.0%}")

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("demand", "verify", "what_if", "sweep")}
        out["verify"] = dataclasses.asdict(self.verify) if self.verify else None
        out["what_if"] = [dataclasses.asdict(v) for v in self.what_if]
        out["sweep"] = [dataclasses.asdict(v) for v in self.sweep]
        out["engine"], out["scheduler_loop"] = self.scheduler, "sync"   # V0 has one loop
        out["needed"] = self.needed
        out["words"] = self.words()
        return out


def round_up_gib(x: float, step: float = ROUND_GIB) -> float:
    return max(step, math.ceil(x / step - 1e-9) * step)


def unbounded_cpu_blocks(trace: pl.DataFrame, block_size: int) -> int:
    """A host pool no run can fill: every request's whole sequence at once (+1 block each for
    V0's swap-out check, reference G/D3)."""
    total = ((trace["prompt_tokens"].cast(pl.Int64) + trace["output_tokens"].cast(pl.Int64)
              + block_size - 1) // block_size + 1).sum()
    return int(total)


def demand_series(steps: pl.DataFrame, kv_bytes_per_block: int) -> pl.DataFrame:
    """Per simulated second: the peak concurrently evicted KV (GiB) and request count."""
    if steps.height == 0:
        return pl.DataFrame({"t_s": [], "gib": [], "requests": []})
    per_s = (steps.with_columns(second=pl.col("start_s").floor().cast(pl.Int64))
             .group_by("second").agg(blocks=pl.col("evicted_blocks").max(),
                                     requests=pl.col("evicted_requests").max()))
    # Seconds with steps plus a zero on each side of every gap: the same line as every second from
    # first to last, but sized by the steps (a year-2100 timestamp asked for 2.4e9 rows, 18 GiB).
    lo, hi = int(per_s["second"].min()), int(per_s["second"].max())
    have = np.sort(per_s["second"].to_numpy())
    edges = np.concatenate([have, have - 1, have + 1])
    full = pl.DataFrame({"second": np.unique(edges[(edges >= lo) & (edges <= hi)])})
    return (full.join(per_s, on="second", how="left").fill_null(0).sort("second")
            .select(t_s=pl.col("second").cast(pl.Float64),
                    gib=pl.col("blocks") * kv_bytes_per_block / GIB,
                    requests=pl.col("requests")))


def _verification_job(trace, config: EngineConfig, swap_gib: float, on_swap_full: str,
                      kv_bpb: int, label: str) -> Job:
    blocks = int(swap_gib * GIB // kv_bpb)
    cfg = dataclasses.replace(config, preemption_mode="swap", on_swap_full=on_swap_full,
                              swap_space=swap_gib, num_cpu_blocks_override=blocks)
    return Job(trace=trace, config=cfg, label=label)


def verification_of(tables: dict, *, swap_space_gib: float, num_cpu_blocks: int | None,
                    on_swap_full: str, peak_gib: float) -> Verification:
    """A verification replay's outcome (a reducer: computed where it was replayed)."""
    s = summary(tables)
    return Verification(swap_space_gib=swap_space_gib, num_cpu_blocks=num_cpu_blocks,
                        on_swap_full=on_swap_full, status=s["status"], abort_s=s["abort_s"],
                        swap_full_events=s["swap_full_events"],
                        swap_full_fallbacks=s["swap_full_fallbacks"],
                        preemptions_swap=s["preemptions_swap"],
                        recomputed_tokens=int(tables["requests"]["recomputed_tokens"].sum() or 0),
                        run_id=s["run_id"],
                        fraction_of_peak=swap_space_gib / peak_gib if peak_gib else None)


def _verification_reducer(job: Job, peak_gib: float):
    from capacity.analyses.planner import reducer
    cfg = job.config
    return reducer(verification_of, swap_space_gib=cfg.swap_space,
                   num_cpu_blocks=cfg.num_cpu_blocks_override, on_swap_full=cfg.on_swap_full,
                   peak_gib=peak_gib)


def demand_job(trace: pl.DataFrame, config: EngineConfig) -> Job:
    """The replay that measures demand: swap mode with a host pool nothing can fill."""
    cfg = dataclasses.replace(
        config, preemption_mode="swap", on_swap_full="recompute",
        num_cpu_blocks_override=unbounded_cpu_blocks(trace, resolve(config).spec.block_size))
    return Job(trace=trace, config=cfg, label="size-swap demand")


def size_swap(trace: pl.DataFrame, config: EngineConfig, *, headroom: float = 0.2,
              what_if_fraction: float | None = 0.75, sweep_fractions: tuple[float, ...] = (),
              host_ram_gib: float | None = None, planner: Planner | None = None,
              baseline: dict | None = None) -> SwapSizing:
    """Measure the swap demand of `trace` under `config` and recommend and verify a size.

    Refuses (ValueError) to size from an overloaded run: its swapped KV grows with the backlog,
    not with the load the tier must absorb, and V1, which has no swap (its host tier is CPU
    offloading: capacity/analyses/offload.py). `baseline`: the tables of the replay under
    `config`, when the caller has them (else it is replayed). `what_if_fraction` None: no
    what-if replays."""
    if config.scheduler != "v0":
        raise ValueError("size-swap: vLLM V1 (0.33, 0.34) has no swap space; its host tier is CPU KV "
                         "offloading, sized by `kvcap size-offload` (--kv-offloading-size)")
    if headroom < 0:
        raise ValueError(f"headroom: must be >= 0, got {headroom}")
    planner = planner or Planner()
    if baseline is not None:
        st = stability(baseline)
    else:                 # only its stability is asked: reduced where it is replayed
        from capacity.analyses.planner import reducer
        st = planner.map([Job(trace=trace, config=config, label="size-swap baseline",
                              trace_name=planner.trace_name)], reducer(stability))[0]
    if not st.sustainable:
        raise ValueError(f"size-swap: the engine is overloaded at this load ({st.evidence}); "
                         f"a swap size measured here would only measure the backlog — lower the "
                         f"rate (--rate-scale) or add capacity first")
    bpb = resolve(config).kv_bytes_per_block
    job = demand_job(trace, config)
    if planner.keep_tables:
        demand = planner.run([job], workers=1)[0]
    else:
        # Its per-step series is read here and never again: not kept in the planner's memo,
        # and spilled to files past a million steps (a day of traffic's steps are GiBs).
        from replay.run import replay
        demand = replay(job.trace, job.config, label=job.label, trace_name=planner.trace_name,
                        spill_dir=tempfile.gettempdir())
    steps = demand.steps.select("start_s", "evicted_blocks", "evicted_requests")
    peak_blocks = int(steps["evicted_blocks"].max() or 0) if steps.height else 0
    peak_reqs = int(steps["evicted_requests"].max() or 0) if steps.height else 0
    peak_at = None
    if peak_blocks:
        peak_at = float(steps.filter(pl.col("evicted_blocks") == peak_blocks)["start_s"][0])
    series = demand_series(steps, bpb)
    peak_gib = peak_blocks * bpb / GIB
    tp = config.tensor_parallel_size
    # +1 block per swap-out beyond the occupancy: V0's check asks for it (G/D3).
    rec = round_up_gib((peak_blocks + 1) * bpb / GIB * (1 + headroom)) if peak_blocks else 0.0
    host_ram = rec * tp
    verdict = (swap_host_ram_verdict(rec, tp, int(host_ram_gib * GIB))
               if host_ram_gib is not None else None)
    sizing = dict(
        scheduler=config.scheduler, tensor_parallel_size=tp, kv_bytes_per_block=bpb,
        headroom=headroom, peak_swapped_blocks=peak_blocks, peak_swapped_gib=peak_gib,
        peak_swapped_requests=peak_reqs, peak_at_s=peak_at,
        per_second_p99_gib=nearest_rank(series["gib"].to_numpy(), 0.99) or 0.0,
        per_second_p999_gib=nearest_rank(series["gib"].to_numpy(), 0.999) or 0.0,
        preemptions_swap=int(summary(demand.tables())["preemptions_swap"]),
        recommended_swap_space_gib=rec,
        host_ram_gib=host_ram, host_ram_verdict=verdict, demand_run_id=demand.run_id,
        demand=series)
    if not peak_blocks:
        return SwapSizing(verify=None, **sizing)
    jobs = [_verification_job(trace, config, rec, "abort", bpb, "size-swap verify")]
    if what_if_fraction is not None:
        jobs += [_verification_job(trace, config, peak_gib * what_if_fraction, mode, bpb,
                                   f"size-swap what-if {mode}") for mode in ("abort", "recompute")]
    jobs += [_verification_job(trace, config, peak_gib * f, "recompute", bpb,
                               f"size-swap sweep {f:g}") for f in sweep_fractions]
    checks = planner.map(jobs, [_verification_reducer(j, peak_gib) for j in jobs])
    n_what_if = 0 if what_if_fraction is None else 2
    return SwapSizing(verify=checks[0], what_if=checks[1:1 + n_what_if],
                      sweep=checks[1 + n_what_if:], **sizing)
