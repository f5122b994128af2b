"""The step contract between a scheduler and an executor (and the replay loop).

A scheduler's `schedule()` returns a frozen `StepPlan`: which requests (trace rows) compute how many
new tokens, with how much context, and which KV blocks move between the GPU and the host pool. The
executor turns a plan into a duration; the loop then calls the scheduler's `update(plan)`, which
plays the model's output back (one sampled token for every request whose chunk reaches the end of
its known tokens) and returns a `StepOutput`. Schedulers never import executors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

_I64 = np.int64


def _empty_pairs() -> np.ndarray:
    return np.zeros((0, 2), dtype=_I64)


def _empty_rows() -> np.ndarray:
    return np.zeros(0, dtype=_I64)


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    row: int
    # The mode the request was really preempted in.
    mode: Literal["recompute", "swap"]
    # GPU blocks released (recompute) or copied to the host pool (swap).
    num_blocks: int
    # V0 `_schedule_priority_preemption` victim: counted in vLLM's cumulative counter but not in
    # `SchedulerOutputs.preempted` (the Prometheus counter), reference A5/D1.
    by_priority: bool = False
    # Swap was wanted but the host pool could not take the victim; recomputed instead.
    swap_full_fallback: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    row: int
    # Why the request can never run, e.g. "prompt 9000 > max_model_len 8192".
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SwapAbort:
    """The host pool could not take a swap victim and `on_swap_full="abort"`: the engine stops
    (vLLM V0: RuntimeError "Aborted due to the lack of CPU swap space...")."""
    row: int
    num_cpu_blocks_needed: int
    num_cpu_blocks_free: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadTransfer:
    """One CPU KV offloading transfer planned by a `schedule()` (V1 OffloadingConnector, oracle
    README §4 `cpu_load` / `cpu_store`): a load (CPU -> GPU, before the request computes) or a
    write-through store (GPU -> CPU, copied from the next step on)."""
    row: int
    # Tokens the load brings (a store: the tokens its chunks cover).
    num_tokens: int
    # GPU blocks read (store) or written (load), in token order.
    gpu_blocks: tuple[int, ...]
    # The chunks: their index in the request (chunk i holds tokens i*c .. (i+1)*c - 1, c tokens
    # per chunk) and their offload keys (with one block per chunk: the block's prefix key).
    chunks: tuple[int, ...]
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadPlan:
    """A step's V1 CPU KV offloading decisions (vLLM's `kv_connector_metadata`), in the order the
    connector made them; all empty without the connector."""
    # Every lookup (row, tokens it would load; None = deferred: a chunk is being loaded or
    # stored, or the request has transfers in flight), also for requests then not admitted.
    lookups: tuple[tuple[int, int | None], ...] = ()
    # (row, GPU-hit tokens, CPU-hit tokens) for requests admitted after a lookup.
    hits: tuple[tuple[int, int, int], ...] = ()
    # Loads and stores planned; chunk keys evicted for the stores (in eviction order); rows whose
    # store was dropped (not enough evictable chunks, F15); rows whose in-flight stores are
    # flushed before this step's forward pass (F9).
    loads: tuple[OffloadTransfer, ...] = ()
    stores: tuple[OffloadTransfer, ...] = ()
    evicted: tuple[int, ...] = ()
    store_failed: tuple[int, ...] = ()
    flushed: tuple[int, ...] = ()


NO_OFFLOAD = OffloadPlan()


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    # Scheduled requests (trace rows) in batch order.
    rows: np.ndarray = field(default_factory=_empty_rows)
    # New tokens computed for each row in this step (a decode is 1).
    num_new_tokens: np.ndarray = field(default_factory=_empty_rows)
    # Tokens already in the KV cache of each row before this step (attention context); prefix-cache
    # hits taken at admission in this step count as already computed.
    num_computed_tokens: np.ndarray = field(default_factory=_empty_rows)
    # True where the row's chunk belongs to a (re-)prefill, False for a one-token decode.
    is_prefill: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # V1: each row's replay.engine.raw.BATCH_KINDS code (new / resumed / running, as vLLM's
    # scheduler output lists it). None (V0): prefill or decode, from is_prefill.
    kind: np.ndarray | None = None
    # (gpu_block, cpu_block) copies GPU -> host pool, done before the forward pass.
    swap_out: np.ndarray = field(default_factory=_empty_pairs)
    # (cpu_block, gpu_block) copies host pool -> GPU, done before the forward pass.
    swap_in: np.ndarray = field(default_factory=_empty_pairs)
    # Requests preempted in this step, in the order the scheduler preempted them.
    preempted: tuple[Preemption, ...] = ()
    # Requests whose KV came back from the host pool in this step (rows, in order).
    swapped_in: tuple[int, ...] = ()
    # Requests dropped because they can never run (vLLM: FINISHED_IGNORED / rejected).
    rejected: tuple[Rejection, ...] = ()
    # Set when the engine stops in this step (nothing in this plan runs).
    abort: SwapAbort | None = None
    # V1 CPU KV offloading (NO_OFFLOAD without the connector).
    offload: OffloadPlan = NO_OFFLOAD

    @property
    def num_batched_tokens(self) -> int:
        return int(self.num_new_tokens.sum())


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutput:
    # The rows that produced an output token at the end of this step, in batch order.
    sampled: tuple[int, ...]
    # Rows that finished in this step (their blocks are already freed), in the order freed.
    finished: np.ndarray
    # V1 CPU KV offloading: (row, "load" | "store") per transfer reported complete in this
    # step's output, in the order the worker reported them.
    offload_done: tuple[tuple[int, str], ...] = ()


class Scheduler(Protocol):
    """What the replay loop needs from a scheduler (V0 and V1 both implement it)."""

    def add_request(self, row: int) -> None: ...
    def schedule(self) -> StepPlan: ...
    def update(self, plan: StepPlan) -> StepOutput: ...
    def has_unfinished(self) -> bool: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_swapped(self) -> int: ...
    def block_table(self, row: int) -> list[int]: ...
    def gpu_blocks_used(self) -> int: ...
    def cpu_blocks_used(self) -> int: ...
    # `block_table(row)`: GPU block ids of a request that holds GPU blocks, in token order
    # (what the torch stub reads and writes through).
