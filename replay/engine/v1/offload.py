"""vLLM 0.33's CPU KV offloading as the V1 scheduler sees it (0.34's differs in the store
threshold's counting only, `SchedulerSpec.store_counting`): the native OffloadingConnector
(`--kv-offloading-size GiB --kv-offloading-backend native`) with its CPU tier, its LRU or ARC
policy and the worker's copy queues (oracle README §2 "CPU KV offloading" and §7 F1-F15; the
O-scenarios in ../shared/oracle check every decision).

- `CpuTier` (replay/engine/v1/cpu_tier.py): the chunks, their states and the LRU or ARC policy.
- `Connector`: the scheduler-side connector (lookups, loads, write-through stores, flushes,
  finishes) and, in `execute`, the worker-side copy engine (one FIFO per direction). With
  `offload_transfer_steps` T >= 1 a transfer completes T steps after it is issued, as the oracle
  emulates it: a load planned in step s is done at the end of step s+T-1, a store planned in step
  s is copied from step s+1 on and done at the end of step s+T. With T = 0 a transfer completes
  when its bytes have crossed the host link (`kv_bytes_per_block` per block per GPU: every rank
  copies its own share over its own link, at `offload_host_link_bytes_per_s`), so a long load can
  span several steps; the loop tells the time with `V1Scheduler.tell_time`.

The scheduler (replay/engine/v1/scheduler.py) calls the hooks at the points vLLM's scheduler calls
its connector. Where real vLLM iterates a set (same-step finishes, F13) kvcap takes trace order.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from replay.engine.plan import OffloadTransfer
from replay.engine.prefix import BlockKeys
from replay.engine.spec import SchedulerSpec
from replay.engine.v1.cpu_tier import Access, CpuTier


# ------------------------------------------------------------------------------- the connector
@dataclass(slots=True, kw_only=True)
class _Request:
    """The connector's state for one request (kept across preemptions until it finishes)."""
    # The tier's record of its accesses (LRU rank, chunks seen, inserted, reused).
    acc: Access = field(default_factory=Access)
    # First chunk not offered yet (vLLM next_stored_chunk_idx): 0 after a lookup that loads
    # nothing (it re-offers its GPU-hit chunks, F7), else the chunk after its load.
    next_offer: int = 0
    # Its store jobs not yet reported done, its load (keys) while in flight.
    stores_in_flight: int = 0
    loading: tuple[int, ...] = ()
    # GPU-hit + loaded tokens of its load, until it starts computing (None: no load).
    load_tokens: int | None = None
    # vLLM's `request_finished` was called: from then on its store jobs fence the GPU blocks
    # they read (`_block_id_to_pending_jobs`, F9).
    fenced: bool = False
    # Its finish was processed; the state goes when its last store is reported done.
    finished: bool = False


@dataclass(slots=True, kw_only=True)
class _Job:
    id: int
    row: int
    kind: str                       # "store" | "load"
    keys: tuple[int, ...]
    gpu_blocks: tuple[int, ...]
    done_step: int = -1             # step mode: the step at whose end it is done
    done_s: float = float("inf")    # time mode


class Connector:
    def __init__(self, spec: SchedulerSpec, keys: BlockKeys, prompt_len: list[int]) -> None:
        if spec.offload_blocks_per_chunk != 1:
            raise NotImplementedError("CPU offloading with more than one GPU block per chunk")
        if spec.offload_transfer_steps == 0 and spec.offload_host_link_bytes_per_s <= 0:
            raise ValueError("offload_host_link_bytes_per_s: must be > 0 when transfers are "
                             "timed (offload_transfer_steps 0)")
        self.spec = spec
        self.keys = keys
        self.bs = spec.block_size
        self.prompt_len = prompt_len
        if spec.offload_store_threshold < 0 or spec.offload_store_tracker_size < 1:
            raise ValueError("offload_store_threshold: must be >= 0, offload_store_tracker_size "
                             ">= 1")
        self.tier = CpuTier(capacity=spec.num_cpu_blocks, policy=spec.offload_eviction_policy,
                            store_threshold=spec.offload_store_threshold,
                            tracker_size=spec.offload_store_tracker_size,
                            once_per_request=spec.store_counting == "once_per_request")
        self.reqs: dict[int, _Request] = {}
        # Worker side: store jobs planned last step (copied from this step on), the two FIFOs.
        self._deferred: list[_Job] = []
        self._stores: list[_Job] = []
        self._loads: list[_Job] = []
        self._jobs: dict[int, _Job] = {}     # every job the scheduler has not seen completed
        self._next_job = 0
        self._link_free_s = {"store": 0.0, "load": 0.0}
        self._exec_step = 0
        # Requests finished since the last schedule (row, block table, tokens to offer up to),
        # processed at the next schedule (F6, F9).
        self._finished: list[tuple[int, list[int], int]] = []
        self.begin_step()

    # ----------------------------------------------------------------- per-step records
    def begin_step(self) -> None:
        self.lookups: list[tuple[int, int | None]] = []
        self.hits: list[tuple[int, int, int]] = []
        self.loads: list[OffloadTransfer] = []
        self.stores: list[OffloadTransfer] = []
        self.evicted: list[int] = []
        self.store_failed: list[int] = []
        self.flushed: list[int] = []
        self._flush_jobs: set[int] = set()
        # GPU blocks handed out this step (vLLM _current_batch_allocated_block_ids).
        self._allocated: set[int] = set()
        self._load_jobs: list[_Job] = []
        self._store_jobs: list[_Job] = []

    def _req(self, row: int) -> _Request:
        r = self.reqs.get(row)
        if r is None:
            r = self.reqs[row] = _Request()
        return r

    def busy(self) -> bool:
        """Transfers in flight or finishes not processed yet (vLLM's `has_requests()` counts
        them, so the engine keeps stepping: the last lines of an O-run are empty steps)."""
        return bool(self._jobs or self._finished)

    # ----------------------------------------------------------------- lookups and loads
    def lookup(self, row: int, gpu_hit_tokens: int, num_tokens: int) -> int | None:
        """`get_num_new_matched_tokens`: tokens the tier holds after the GPU hit, chunk by chunk
        up to the request's real tokens (F5: it may reach num_tokens, where the GPU hit stops one
        token short; async placeholders have no block hash, so no offload key). None (deferred):
        the request has transfers in flight, or a chunk it would load is being stored
        (HIT_PENDING) or, with GPU prefix caching, loaded for another request (F10)."""
        r = self.reqs.get(row)
        if r is not None and (r.stores_in_flight or r.loading):
            self.lookups.append((row, None))
            return None
        tier, n = self.tier, 0
        start = gpu_hit_tokens // self.bs
        for i in range(start, num_tokens // self.bs):
            k = self.keys.key(row, i)
            ready = tier.ready.get(k)
            if ready is None:
                break
            if not ready or (self.spec.enable_prefix_caching and tier.pins.get(k)):
                self.lookups.append((row, None))
                return None
            n += 1
        self.lookups.append((row, n * self.bs))
        return n * self.bs

    def admitted(self, row: int, gpu_hit_tokens: int, cpu_tokens: int,
                 table: list[int]) -> None:
        """A request admitted after a lookup (`cpu_hit`); one that loads nothing re-offers its
        chunks from chunk 0 (F7). Every block of its table counts as handed out this step, its
        GPU-hit blocks too (`update_state_after_alloc` takes `get_blocks(request_id)`)."""
        self.hits.append((row, gpu_hit_tokens, cpu_tokens))
        self._allocated.update(table)
        if cpu_tokens == 0:
            self._req(row).next_offer = 0

    def plan_load(self, row: int, gpu_hit_tokens: int, cpu_tokens: int,
                  gpu_blocks: list[int]) -> None:
        """`update_state_after_alloc`: load the hit chunks into the request's new blocks; the
        request waits (WAITING_FOR_REMOTE_KVS, F4) until the load is reported done."""
        r = self._req(row)
        first = gpu_hit_tokens // self.bs
        idxs = list(range(first, first + cpu_tokens // self.bs))
        keys = self.keys.keys(row, idxs[0], idxs[-1] + 1)
        self.tier.prepare_load(r.acc, keys, idxs)
        r.loading = tuple(keys)
        r.load_tokens = gpu_hit_tokens + cpu_tokens
        r.next_offer = idxs[-1] + 1
        t = OffloadTransfer(row=row, num_tokens=cpu_tokens, gpu_blocks=tuple(gpu_blocks),
                            chunks=tuple(idxs), keys=tuple(keys))
        self.loads.append(t)
        self._load_jobs.append(self._job(row, "load", t))

    def load_done(self, row: int) -> int | None:
        """GPU-hit + loaded tokens of a waiting request whose load was reported done (None while
        it is in flight)."""
        r = self.reqs[row]
        return None if r.loading else r.load_tokens

    def dropped(self, row: int) -> None:
        """A request rejected while holding its loaded blocks (it never runs)."""
        r = self.reqs[row]
        r.finished = True
        if not r.stores_in_flight:
            del self.reqs[row]

    def start_computing(self, row: int) -> None:
        self.reqs[row].load_tokens = None

    # ----------------------------------------------------------------- stores
    def allocated(self, blocks) -> None:
        """GPU blocks handed out this step (a block a finished request's store still reads
        forces a flush, F9)."""
        self._allocated.update(blocks)

    def preempted(self, row: int) -> None:
        """A request preempted while its stores are in flight has them flushed (F9)."""
        r = self.reqs.get(row)
        if r is not None and r.stores_in_flight:
            self._flush_jobs.update(j.id for j in self._jobs.values()
                                    if j.row == row and j.kind == "store")

    def _offer(self, row: int, r: _Request, stop: int, gpu_blocks: list[int]) -> None:
        """Offer chunks next_offer..stop-1 for storing (`prepare_store`): the tier stores the
        missing ones all or nothing (F15); no progress when they do not fit, so the same
        chunks are offered again at the request's next step."""
        if stop <= r.next_offer:
            return
        idxs = list(range(r.next_offer, stop))
        keys = self.keys.keys(row, r.next_offer, stop)
        got = self.tier.prepare_store(r.acc, keys, idxs)
        if got is None:
            self.store_failed.append(row)
            return
        stored, evicted = got
        self.evicted.extend(evicted)
        r.next_offer = stop
        if stored:
            new = set(stored)
            new_idxs = tuple(i for k, i in zip(keys, idxs) if k in new)
            t = OffloadTransfer(row=row, num_tokens=len(stored) * self.bs,
                                gpu_blocks=tuple(gpu_blocks[i] for i in new_idxs),
                                chunks=new_idxs, keys=tuple(k for k in keys if k in new))
            self.stores.append(t)
            self._store_jobs.append(self._job(row, "store", t))
            r.stores_in_flight += 1

    def plan_stores(self, row: int, num_computed: int, num_tokens: int,
                    gpu_blocks: list[int]) -> None:
        """Write-through (F1): a scheduled request offers every full chunk the step will have
        computed, capped at its prompt by default (F2) and at its real tokens (async
        placeholders have no block hash: `_calc_num_offloadable_tokens`, `storable_chunks`)."""
        stop = min(num_computed, num_tokens)
        if self.spec.offload_prompt_only:
            stop = min(stop, self.prompt_len[row])
        self._offer(row, self._req(row), stop // self.bs, gpu_blocks)

    def request_finished(self, row: int, table: list[int], num_tokens: int,
                         aborted_at: int | None = None) -> None:
        """vLLM frees a finished request's blocks at once (`request_finished` returns False,
        F9) and fences them with its store jobs in flight; the connector offers what is left
        (`_build_store_jobs` of a finished request: up to max(prompt, num_tokens - 1), or, when
        aborted, the tokens computed) at the next schedule."""
        r = self.reqs.get(row)
        if r is None:
            return
        r.fenced = True
        stop = max(self.prompt_len[row], num_tokens - 1) if aborted_at is None else aborted_at
        stop = min(stop, num_tokens)
        if self.spec.offload_prompt_only:
            stop = min(stop, self.prompt_len[row])
        self._finished.append((row, list(table), stop))

    def end_schedule(self) -> None:
        """`build_connector_meta`, after the scheduled requests' stores: the offers of the
        requests finished since the last schedule, then their recency (F6, F8), each in trace
        order (vLLM iterates a set, F13); last the flushes: a preempted request's stores, and a
        fenced store whose block was handed out this step (F9)."""
        done = sorted(self._finished)
        self._finished.clear()
        for row, table, stop in done:
            self._offer(row, self.reqs[row], min(stop, len(table) * self.bs) // self.bs, table)
        for row, _, _ in done:
            r = self.reqs[row]
            self.tier.on_request_finished(r.acc)
            r.finished = True
            if not r.stores_in_flight and not r.loading:
                del self.reqs[row]
        if self._allocated:
            for job in self._jobs.values():
                if (job.kind == "store" and self.reqs[job.row].fenced
                        and not self._allocated.isdisjoint(job.gpu_blocks)):
                    self._flush_jobs.add(job.id)
        self.flushed = sorted({self._jobs[j].row for j in self._flush_jobs})

    def _job(self, row: int, kind: str, t: OffloadTransfer) -> _Job:
        self._next_job += 1
        job = _Job(id=self._next_job, row=row, kind=kind, keys=t.keys, gpu_blocks=t.gpu_blocks)
        self._jobs[job.id] = job
        return job

    # ----------------------------------------------------------------- worker side
    def execute(self, start_s: float, end_s: float) -> list[_Job]:
        """The worker connector for the step just scheduled: submit last step's stores and this
        step's loads, wait for flushed stores (and those queued before them), report what is
        done by the end of the step (stores, then loads, in submission order)."""
        self._exec_step += 1
        k, T = self._exec_step, self.spec.offload_transfer_steps
        for job in self._deferred:
            self._submit(job, self._stores, start_s, k + T - 1)
        for job in self._load_jobs:
            self._submit(job, self._loads, start_s, k + T - 1)
        self._deferred = self._store_jobs
        if self._flush_jobs:
            # `handle_preemptions`: a flushed store planned this very step is submitted at once,
            # then the worker waits for the flushed jobs and those queued before them.
            flush = self._flush_jobs
            for job in [j for j in self._deferred if j.id in flush]:
                self._deferred.remove(job)
                self._submit(job, self._stores, start_s, k)
            last = max((i for i, j in enumerate(self._stores) if j.id in flush), default=-1)
            for job in self._stores[:last + 1]:
                job.done_step, job.done_s = k, min(job.done_s, end_s)
        out = []
        for q in (self._stores, self._loads):
            while q and (q[0].done_step <= k if T else q[0].done_s <= end_s):
                out.append(q.pop(0))
        return out

    def _submit(self, job: _Job, queue: list[_Job], start_s: float, done_step: int) -> None:
        job.done_step = done_step
        if not self.spec.offload_transfer_steps:
            nbytes = len(job.gpu_blocks) * self.spec.kv_bytes_per_block
            begin = max(start_s, self._link_free_s[job.kind])
            job.done_s = begin + nbytes / self.spec.offload_host_link_bytes_per_s
            self._link_free_s[job.kind] = job.done_s
        queue.append(job)

    def next_done_s(self) -> float | None:
        """When the next transfer in flight completes (time mode), for a loop with nothing else
        to do."""
        times = [q[0].done_s for q in (self._stores, self._loads) if q]
        return min(times) if times else None

    def apply(self, done: list[_Job]) -> list[tuple[int, str]]:
        """The scheduler applies a step's connector output: stored chunks become ready
        (evictable, hit-able); a loaded request may compute from the next schedule on."""
        out = []
        for job in done:
            del self._jobs[job.id]
            r = self.reqs.get(job.row)
            if job.kind == "store":
                self.tier.complete_store(job.keys)
                if r is not None:
                    r.stores_in_flight -= 1
                    if r.finished and not r.stores_in_flight and not r.loading:
                        del self.reqs[job.row]
            else:
                self.tier.complete_load(job.keys)
                r.loading = ()
                if r.finished and not r.stores_in_flight:
                    del self.reqs[job.row]     # aborted while its load was in flight
            out.append((job.row, job.kind))
        return out
