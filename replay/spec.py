"""The resolved scheduler spec: every knob a scheduler reads, as plain numbers.

`replay.config.EngineConfig` (what users set, vLLM's names, `None` = version default) resolves into
one `SchedulerSpec` through pure functions; tests and the oracle scenarios build a spec directly.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vLLM's `cdiv` (blocks for `a` tokens at `b` per block); exact on
    Python ints, where a float ceil is not."""
    return -(-a // b)

Policy = Literal["fcfs", "priority"]
PreemptionModeName = Literal["recompute", "swap", "none"]
OnSwapFull = Literal["abort", "recompute"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSpec:
    block_size: int
    # vLLM's own count. V1 reserves block 0 as the null block, so it can hand out num_gpu_blocks - 1.
    num_gpu_blocks: int
    # V0: the swap pool (`--swap-space` / cache block size). V1: the CPU offloading tier's chunks.
    num_cpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    policy: Policy = "fcfs"
    # "recompute" (vLLM default for single-sequence requests), "swap" (V0 only), "none" (queue
    # only: admit only when the whole sequence fits, never evict).
    preemption_mode: PreemptionModeName = "recompute"
    # What to do when a swap victim does not fit the host pool: stop the run as vLLM V0 does, or
    # recompute that victim instead (recorded as a swap_full_fallback event).
    on_swap_full: OnSwapFull = "abort"
    # V1 (0.33) knobs, reference B2/B3/B7.
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    max_num_active_seqs: int | None = None
    # V1 0.33 AsyncScheduler (oracle README §2, S13_async): step k is scheduled before step k-1's
    # output is applied, so finishes and frees come one step late.
    async_scheduling: bool = False
    # V0's block-manager watermark is hard-coded in vLLM (A2).
    v0_watermark: float = 0.01
    # Bytes of one KV block on one GPU (all layers, K and V); events report bytes from it.
    kv_bytes_per_block: int = 0
    # V1 0.33 CPU KV offloading (`--kv-offloading-size`, the native OffloadingConnector; oracle
    # README §7, replay/v1/offload.py): on, the tier is `num_cpu_blocks` chunks of
    # `offload_blocks_per_chunk` GPU blocks, shared by all traffic as a second prefix cache.
    kv_offloading: bool = False
    # Store prompt blocks only (vLLM's default, F2).
    offload_prompt_only: bool = True
    offload_eviction_policy: Literal["lru", "arc"] = "lru"
    # vLLM's kv_connector_extra_config "block_size" / GPU block size (1 by default).
    offload_blocks_per_chunk: int = 1
    # kv_connector_extra_config "store_threshold": a chunk is stored from its N-th offer on
    # (the CPU manager counts offers per offload key, `prepare_store`); 0 and 1 store at once
    # (vLLM's default 0: no counting). "max_tracker_size": the counts are kept for at most that
    # many keys, least recently offered dropped first. `offload_store_counting` is which offers
    # count: "every_offer" (0.33: `counts[key] += 1` on each, so a preempted request's re-offer
    # or a retried failed store counts again; oracle O1_threshold) or "once_per_request" (0.34:
    # each key once per request; not modelled yet, refused).
    offload_store_threshold: int = 0
    offload_store_tracker_size: int = 64_000
    offload_store_counting: Literal["every_offer", "once_per_request"] = "every_offer"
    # >= 1: the oracle's step emulation, a transfer completes that many steps after it is issued
    # (the O-scenarios use 1, O7_slow 2). 0: in time, when its bytes (kv_bytes_per_block per
    # block, per GPU: each rank copies its share over its own link) have crossed the host link at
    # `offload_host_link_bytes_per_s`; the loop tells the scheduler the clock (`tell_time`).
    offload_transfer_steps: int = 0
    offload_host_link_bytes_per_s: float = 0.0
