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

import dataclasses
from dataclasses import dataclass

import polars as pl

from capacity.analyses.offload import OffloadSizing, size_offload
from capacity.analyses.planner import Planner
from capacity.analyses.sizing import SwapSizing, size_swap
from replay.config import (DEFAULT_BLOCK_SIZE, DEFAULT_VLLM_VERSION, V0_VLLM_VERSION, EngineConfig,
                           resolve)

# What carries over between engines (the rest is version-specific or a default).
SHARED = ("model", "gpu", "tensor_parallel_size", "block_size", "gpu_memory_utilization",
          "max_num_seqs", "max_num_batched_tokens", "max_model_len", "scheduling_policy",
          "enable_prefix_caching", "enable_chunked_prefill", "kv_cache_dtype",
          "num_gpu_blocks_override", "calibration")


def twin(config: EngineConfig, scheduler: str) -> EngineConfig:
    """`config` on the other engine: V0 in swap mode with the same --swap-space, or V1 with
    recompute (and no CPU tier: the sizing sweeps it). ValueError if that engine refuses it."""
    kw = {n: getattr(config, n) for n in SHARED}
    if config.block_size is None and config.num_gpu_blocks_override is not None:
        # The block size follows the engine's default (16 on V0, 64 on vLLM 0.34); a KV pool set
        # in blocks keeps its tokens, not its block count.
        here = resolve(config).block_size
        there = DEFAULT_BLOCK_SIZE[V0_VLLM_VERSION if scheduler == "v0" else DEFAULT_VLLM_VERSION]
        kw["num_gpu_blocks_override"] = max(2, config.num_gpu_blocks_override * here // there)
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
    # What the V1 release's block size does to prefix hits (V0 and 0.33: 16 tokens; 0.34: 64),
    # measured on the V1 twin where the trace has prefix hashes; "" when the sizes agree.
    block_words: str = ""
    block_hits: dict | None = None      # {block_size: GPU prefix-hit tokens} of those replays

    def as_dict(self) -> dict:
        return {"replayed": self.replayed,
                "v0_swap_space_gib": (self.v0.recommended_swap_space_gib
                                      if self.v0 and self.v0.needed else 0.0 if self.v0 else None),
                "v0_words": self.v0.words() if self.v0 else self.v0_note,
                "v1_kv_offloading_size_gib": (self.v1.recommended_kv_offloading_size_gib
                                              if self.v1 else None),
                "v1_scheduler_loop": self.v1.scheduler_loop if self.v1 else None,
                "v1_words": self.v1.words() if self.v1 else self.v1_note,
                "block_words": self.block_words,
                "block_hits": ({str(k): v for k, v in self.block_hits.items()}
                               if self.block_hits else None)}


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
        from capacity.analyses.planner import summary_reducer
        try:
            # The twin's size-0 replay is `block_change`'s at V1's block size: it answers both.
            with planner.asking_too((summary_reducer(), lambda job: job.trace is trace
                                     and not job.config.kv_offloading_size)):
                v1 = size_offload(trace, twin(config, "v1"), planner=planner)
        except ValueError as e:
            v1_note = f"V1 twin not sized: {str(e).splitlines()[0]}"
    words, hits = block_change(trace, config, planner)
    return Migration(replayed=config.scheduler, v0=v0, v0_note=v0_note, v1=v1, v1_note=v1_note,
                     block_words=words, block_hits=hits)


def block_change(trace: pl.DataFrame, config: EngineConfig, planner: Planner
                 ) -> tuple[str, dict | None]:
    """V0 -> V1: the block size changes when V1 is 0.34 (16 -> 64 tokens) and the user left it
    unset. A prefix hit ends on a block boundary, so coarser blocks hit fewer tokens of a shared
    prefix (up to block_size - 1 per request). Measured by replaying the V1 twin, without a CPU
    tier, at both sizes; a trace without prefix hashes has no hit to lose."""
    from capacity.analyses.planner import summary_reducer
    from capacity.analyses.sweep import Job
    from traces.schema import has_prefix_hashes
    try:
        v1_cfg = twin(config, "v1") if config.scheduler == "v0" else config
    except ValueError:
        return "", None                   # no V1 twin: the section says why already
    v1 = resolve(v1_cfg)
    # V0's block: what the user set, else its default (no twin needed: V0 may refuse one, e.g.
    # swap with priority scheduling).
    old = (resolve(config).block_size if config.scheduler == "v0" else
           config.block_size if config.block_size is not None else
           DEFAULT_BLOCK_SIZE[V0_VLLM_VERSION])
    new = v1.block_size
    if old == new:
        return "", None
    head = (f"the block size changes with the upgrade: {old} tokens on V0, {new} on vLLM "
            f"{v1.vllm_version} (--block-size {old} keeps the old one)")
    if not has_prefix_hashes(trace):
        return (f"{head}; this trace carries no prefix hashes, so no prefix hit is lost or won "
                f"here (on shared prefixes a hit ends on a {new}-token boundary: up to {new - 1} "
                "fewer cached tokens per request)"), None
    jobs = [Job(trace=trace, config=dataclasses.replace(v1_cfg, block_size=b,
                                                       kv_offloading_size=None),
                label=f"migration blocks {b}", trace_name=planner.trace_name) for b in (old, new)]
    got = planner.map(jobs, summary_reducer())
    hits = {b: int(s.get("gpu_hit_tokens") or 0) for b, s in zip((old, new), got)}
    prompt = int(trace["prompt_tokens"].cast(pl.Int64).sum() or 0)
    share = {b: h / prompt if prompt else 0.0 for b, h in hits.items()}
    return (f"{head}; on this trace the GPU prefix cache hits {hits[new]:,} prompt tokens "
            f"({share[new]:.1%}) with {new}-token blocks against {hits[old]:,} ({share[old]:.1%}) "
            f"with {old}"), hits
