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
VllmVersion = Literal["0.33", "0.34"]
VLLM_VERSIONS: tuple[str, ...] = ("0.33", "0.34")
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
    # What equal (priority, arrival_s) mean to the V1 priority policy. "trace_order" (replays):
    # vLLM stamps arrival_time on receipt, so requests a trace gives one time reached it with
    # distinct times in trace order: the later trace row ranks after the earlier in the waiting
    # heap and is the preemption victim. "equal" (oracle scenarios that set arrival_time): the
    # times are what vLLM compared, and equal: its victim is the first maximal request in
    # running-list order (`max(self.running, key=lambda r: (r.priority, r.arrival_time))`), so
    # where a request joined `running` decides (an admission appends it, a CPU-loaded one once
    # its load is done); its heaps break the tie by request id, kvcap's by trace row.
    arrival_ties: Literal["trace_order", "equal"] = "trace_order"
    # A what-if, in no vLLM release (vLLM PR #53723, open): which running request a V1 request
    # that cannot get blocks preempts. "fcfs" is vLLM's (the last in running order, the newest
    # admission); "lcf" (least computed first) the one with the fewest computed tokens (vLLM's
    # num_computed_tokens before the step; ties: the last in running order), un-scheduled and
    # its tokens refunded if it was scheduled earlier in the step, as vLLM's priority victim is.
    # FCFS policy only: under policy "priority" vLLM's priority victim rule stays.
    preemption_victim: Literal["fcfs", "lcf"] = "fcfs"
    # V0's block-manager watermark is hard-coded in vLLM (A2).
    v0_watermark: float = 0.01
    # Bytes of one KV block on one GPU (all layers, K and V); events report bytes from it.
    kv_bytes_per_block: int = 0
    # V1 0.33 CPU KV offloading (`--kv-offloading-size`, the native OffloadingConnector; oracle
    # README §7, replay/engine/v1/offload.py): on, the tier is `num_cpu_blocks` chunks of
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
    # `counted_keys`, each key once per request, so a preempted request's re-offer stores
    # nothing; kept while the request lives, across its preemptions).
    offload_store_threshold: int = 0
    offload_store_tracker_size: int = 64_000
    # None: the version's rule (`store_counting`).
    offload_store_counting: Literal["every_offer", "once_per_request"] | None = None
    # >= 1: the oracle's step emulation, a transfer completes that many steps after it is issued
    # (the O-scenarios use 1, O7_slow 2). 0: in time, when its bytes (kv_bytes_per_block per
    # block, per GPU: each rank copies its share over its own link) have crossed the host link at
    # `offload_host_link_bytes_per_s`; the loop tells the scheduler the clock (`tell_time`).
    offload_transfer_steps: int = 0
    offload_host_link_bytes_per_s: float = 0.0
    # Which vLLM release's scheduler to model (oracle README §8). 0.34 differs from 0.33 in: the
    # long-prefill cap applies with chunked prefill only (`long_prefill_token_threshold`,
    # S20_off_cap); the offload store threshold counts each key once per request (O1_threshold);
    # and it has the three knobs below (C1-C3, L1), which 0.33 refuses.
    vllm_version: VllmVersion = "0.33"
    # 0.34 cache-aware admission: in a step that preempted nothing, once the KV usage (after the
    # running requests' allocations) is at least the threshold, the plain waiting requests (never
    # run, nothing computed) among the first `window` of the waiting queue trade places so the
    # deepest GPU prefix-cache hit goes first (ties keep queue order); the new order stays.
    # FCFS with prefix caching only (vLLM turns it off otherwise). 0: off.
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # 0.34: at most this many CPU KV loads at once, counting loads in flight and loaded requests
    # not running yet; a CPU hit over the cap stays at the head of the waiting queue and ends the
    # step's admissions (head of line). None: no cap.
    max_num_inflight_kv_loads: int | None = None

    def __post_init__(self) -> None:
        if self.vllm_version not in VLLM_VERSIONS:
            raise ValueError(f"vllm_version {self.vllm_version!r}: use one of {VLLM_VERSIONS}")
        if self.vllm_version == "0.33":
            set_034 = [f for f, on in (
                ("cache_aware_admission_window", self.cache_aware_admission_window != 0),
                ("cache_aware_admission_threshold", self.cache_aware_admission_threshold != 0.5),
                ("max_num_inflight_kv_loads", self.max_num_inflight_kv_loads is not None)) if on]
            if set_034:
                raise ValueError(f"{', '.join(set_034)}: vLLM 0.34 knob(s), not in 0.33; "
                                 "replay vllm_version 0.34 or leave them unset")
        if self.preemption_victim not in ("fcfs", "lcf"):
            raise ValueError(f"preemption_victim {self.preemption_victim!r}: use 'fcfs' or 'lcf'")
        if self.preemption_victim == "lcf" and self.policy != "fcfs":
            raise ValueError("preemption_victim 'lcf' (least computed first) is a what-if for "
                             "the fcfs policy; policy 'priority' keeps vLLM's priority victim")
        if self.cache_aware_admission_window < 0:
            raise ValueError("cache_aware_admission_window: must be >= 0 (0: off)")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            raise ValueError("cache_aware_admission_threshold: a KV usage, between 0 and 1")
        if self.max_num_inflight_kv_loads is not None and self.max_num_inflight_kv_loads < 1:
            raise ValueError("max_num_inflight_kv_loads: must be >= 1, or None for no cap")

    @property
    def store_counting(self) -> Literal["every_offer", "once_per_request"]:
        """Which offers count toward `offload_store_threshold`: the explicit choice, else the
        version's rule."""
        if self.offload_store_counting is not None:
            return self.offload_store_counting
        return "once_per_request" if self.vllm_version == "0.34" else "every_offer"

    @property
    def cache_aware_window(self) -> int:
        """The cache-aware admission window in effect: vLLM turns it off unless the policy is
        FCFS and prefix caching is on."""
        if self.policy != "fcfs" or not self.enable_prefix_caching:
            return 0
        return self.cache_aware_admission_window
