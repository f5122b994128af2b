"""The host tier before and after migrating V0 -> V1: `--swap-space` today, `--kv-offloading-size`
after (issue 16: the report shows both side by side).

The two answers are different questions: V0's swap pool must hold every request swapped out at
the same moment (capacity/analyses/sizing.py: peak demand, verified by replay); V1 0.33's CPU tier
is a second prefix cache whose size sets the hit rate (capacity/analyses/offload.py: the knee of
its curve). The other engine is the *twin* of the replayed one: the same model, GPU, TP, block
size, KV pool override and every knob the user set explicitly; knobs left at None take that
engine's own defaults, as they would after the upgrade (V1's max_num_seqs 1024 on an H100 where
V0 has 256, async scheduling on). A twin that cannot be built or sized (V0 refuses swap with
priority scheduling; an overloaded twin) is reported in words, not dropped silently.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from capacity.analyses.offload import OffloadSizing, size_offload
from capacity.analyses.planner import Planner
from capacity.analyses.sizing import SwapSizing, size_swap
from replay.config import EngineConfig

# What carries over between engines (the rest is version-specific or a default).
SHARED = ("model", "gpu", "tensor_parallel_size", "block_size", "gpu_memory_utilization",
          "max_num_seqs", "max_num_batched_tokens", "max_model_len", "scheduling_policy",
          "enable_prefix_caching", "enable_chunked_prefill", "kv_cache_dtype",
          "num_gpu_blocks_override", "calibration")


def twin(config: EngineConfig, scheduler: str) -> EngineConfig:
    """`config` on the other engine: V0 in swap mode with the same --swap-space, or V1 with
    recompute (and no CPU tier: the sizing sweeps it). ValueError if that engine refuses it."""
    kw = {n: getattr(config, n) for n in SHARED}
    if scheduler == "v0":
        return EngineConfig(scheduler="v0", preemption_mode="swap", swap_space=config.swap_space,
                            on_swap_full=config.on_swap_full, **kw)
    return EngineConfig(scheduler="v1", preemption_mode="recompute", **kw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    replayed: str                       # the engine of the plan ("v0" | "v1")
    v0: SwapSizing | None
    v0_note: str                        # why there is no V0 answer ("" when there is)
    v1: OffloadSizing | None
    v1_note: str

    def as_dict(self) -> dict:
        return {"replayed": self.replayed,
                "v0_swap_space_gib": (self.v0.recommended_swap_space_gib
                                      if self.v0 and self.v0.needed else 0.0 if self.v0 else None),
                "v0_words": self.v0.words() if self.v0 else self.v0_note,
                "v1_kv_offloading_size_gib": (self.v1.recommended_kv_offloading_size_gib
                                              if self.v1 else None),
                "v1_scheduler_loop": self.v1.scheduler_loop if self.v1 else None,
                "v1_words": self.v1.words() if self.v1 else self.v1_note}


def migration(trace: pl.DataFrame, config: EngineConfig, planner: Planner, *,
              sizing: SwapSizing | None = None, offload: OffloadSizing | None = None) -> Migration:
    """Both answers: the replayed engine's (given) and its twin's (sized here, V0 without the
    what-if replays)."""
    v0, v0_note, v1, v1_note = sizing, "", offload, ""
    if config.scheduler == "v1" and v0 is None:
        try:
            v0 = size_swap(trace, twin(config, "v0"), planner=planner, what_if_fraction=None)
        except ValueError as e:
            v0_note = f"V0 twin not sized: {str(e).splitlines()[0]}"
    if config.scheduler == "v0" and v1 is None:
        try:
            v1 = size_offload(trace, twin(config, "v1"), planner=planner)
        except ValueError as e:
            v1_note = f"V1 twin not sized: {str(e).splitlines()[0]}"
    return Migration(replayed=config.scheduler, v0=v0, v0_note=v0_note, v1=v1, v1_note=v1_note)
