"""vLLM 0.33's CPU KV offloading as the V1 scheduler sees it: the native OffloadingConnector
(`--kv-offloading-size GiB --kv-offloading-backend native`) with its CPU tier, its LRU or ARC
policy and the worker's copy queues (oracle README §2 "CPU KV offloading" and §7 F1-F15; the
O-scenarios in ../shared/oracle check every decision).

- `CpuTier` (replay/v1/cpu_tier.py): the chunks, their states and the LRU or ARC policy.
- `Connector`: the scheduler-side connector (lookups, loads, write-through stores, flushes,
  finishes) and, in `execute`, the worker-side copy engine (one FIFO per direction). With
  `offload_transfer_steps` T >= 1 a transfer completes T steps after it is issued, as the oracle
  emulates it: a load planned in step s is done at the end of step s+T-1, a store planned in step
  s is copied from step s+1 on and done at the end of step s+T. With T = 0 a transfer completes
  when its bytes have crossed the host link (`kv_bytes_per_block` per block per GPU: every rank
  copies its own share over its own link, at `offload_host_link_bytes_per_s`), so a long load can
  span several steps; the loop tells the time with `V1Scheduler.tell_time`.

The scheduler (replay/v1/scheduler.py) calls the hooks at the points vLLM's scheduler calls its
connector. Where real vLLM iterates a set (same-step finishes, F13) kvcap takes trace order.
Must not import traces/, capacity/ or torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from replay.plan import OffloadTransfer
from replay.prefix import BlockKeys
from replay.spec import SchedulerSpec
from replay.v1.cpu_tier import CpuTier


# ------------------------------------------------------------------------------- the connector
@dataclass(slots=True, kw_only=True)
class _Request:
    """The connector's state for one request (kept across preemptions until it finishes)."""
    rank: int | None = None
    # First chunk not offered yet: 0 for a request that loaded nothing (it re-offers its GPU-hit
    # chunks, F7), else the chunk after its load.
    next_offer: int = 0
    # Chunks it touched, in chunk order (key -> index), and those it loaded or re-offered (ARC
    # promotes them at its finish).
    touched: dict[int, int] = field(default_factory=dict)
    reused: set[int] = field(default_factory=set)
    # Its store jobs not yet reported done, its load (keys) while in flight.
    stores_in_flight: int = 0
    loading: tuple[int, ...] = ()
    # GPU-hit + loaded tokens of its load, until it starts computing (None: no load).
    load_tokens: int | None = None
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
        self.tier = CpuTier(capacity=spec.num_cpu_blocks, policy=spec.offload_eviction_policy)
        self.reqs: dict[int, _Request] = {}
        self._next_rank = 0
        # Worker side: store jobs planned last step (copied from this step on), the two FIFOs.
        self._deferred: list[_Job] = []
        self._stores: list[_Job] = []
        self._loads: list[_Job] = []
        self._jobs: dict[int, _Job] = {}     # every job the scheduler has not seen completed
        self._next_job = 0
        self._link_free_s = {"store": 0.0, "load": 0.0}
        self._exec_step = 0
        # Finished requests (trace rows, in the order the scheduler freed them) and their block
        # tables, processed at the next schedule (F6, F9).
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
        self._allocated: dict[int, int] = {}     # GPU block -> row it was handed to this step
        self._load_jobs: list[_Job] = []
        self._store_jobs: list[_Job] = []

    def _req(self, row: int) -> _Request:
        r = self.reqs.get(row)
        if r is None:
            r = self.reqs[row] = _Request()
        return r

    def _rank(self, r: _Request) -> int:
        if r.rank is None:
            r.rank = self._fresh_rank()
        return r.rank

    def _fresh_rank(self) -> int:
        self._next_rank += 1
        return self._next_rank

    def busy(self) -> bool:
        """Transfers in flight or finishes not processed yet (vLLM's `has_requests()` counts
        them, so the engine keeps stepping: the last lines of an O-run are empty steps)."""
        return bool(self._jobs or self._finished)

    # ----------------------------------------------------------------- lookups and loads
    def lookup(self, row: int, gpu_hit_tokens: int, num_tokens: int) -> int | None:
        """`get_num_new_matched_tokens`: tokens the tier holds after the GPU hit, chunk by chunk
        up to the whole known sequence (F5: it may reach num_tokens, where the GPU hit stops one
        token short). None (deferred): the request has transfers in flight, or a chunk it would
        load is being stored (HIT_PENDING) or, with GPU prefix caching, loaded for another
        request (F10)."""
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

    def admitted(self, row: int, gpu_hit_tokens: int, cpu_tokens: int) -> None:
        """A request admitted after a lookup (`cpu_hit`); one that loads nothing re-offers its
        chunks from chunk 0 (F7)."""
        self.hits.append((row, gpu_hit_tokens, cpu_tokens))
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
        for k in keys:
            self.tier.pins[k] = self.tier.pins.get(k, 0) + 1
        self.tier.touch(keys, self._rank(r))
        for k, i in zip(keys, idxs):
            r.touched[k] = i
        r.reused.update(keys)
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

    def unloaded(self, row: int) -> None:
        """Its loaded blocks were given back (kvcap's way out of a stuck engine; its load was
        done): it looks the tier up again when it is next admitted."""
        self.reqs[row].load_tokens = None

    def dropped(self, row: int) -> None:
        """A request rejected while holding its loaded blocks (it never runs)."""
        r = self.reqs[row]
        r.finished = True
        if not r.stores_in_flight:
            del self.reqs[row]

    def start_computing(self, row: int) -> None:
        self.reqs[row].load_tokens = None

    # ----------------------------------------------------------------- stores
    def allocated(self, row: int, blocks: list[int]) -> None:
        """GPU blocks handed to `row` this step (a block another request's store still reads
        forces a flush, F9)."""
        for b in blocks:
            self._allocated[b] = row

    def preempted(self, row: int) -> None:
        """A request preempted while its stores are in flight is flushed (F9)."""
        r = self.reqs.get(row)
        if r is not None and r.stores_in_flight and row not in self.flushed:
            self.flushed.append(row)

    def _offer(self, row: int, r: _Request, stop: int, gpu_blocks: list[int]) -> None:
        """Offer chunks next_offer..stop-1 for storing: those already in the tier are reused
        (touched), the others stored if all of them fit (F15); no progress when they do not."""
        if stop <= r.next_offer:
            return
        idxs = list(range(r.next_offer, stop))
        keys = self.keys.keys(row, r.next_offer, stop)
        tier = self.tier
        new = [(k, i) for k, i in zip(keys, idxs) if k not in tier.ready]
        rank = self._rank(r)
        evicted = tier.prepare_store([k for k, _ in new], [i for _, i in new], set(keys), rank)
        if evicted is None:
            self.store_failed.append(row)
            return
        self.evicted.extend(evicted)
        tier.touch(keys, rank)
        for k, i in zip(keys, idxs):
            r.touched[k] = i
        fresh = {k for k, _ in new}
        r.reused.update(k for k in keys if k not in fresh)
        r.next_offer = stop
        if new:
            t = OffloadTransfer(row=row, num_tokens=len(new) * self.bs,
                                gpu_blocks=tuple(gpu_blocks[i] for _, i in new),
                                chunks=tuple(i for _, i in new), keys=tuple(k for k, _ in new))
            self.stores.append(t)
            self._store_jobs.append(self._job(row, "store", t))
            r.stores_in_flight += 1

    def plan_stores(self, row: int, num_computed: int, num_tokens: int,
                    gpu_blocks: list[int]) -> None:
        """Write-through (F1): a scheduled request offers every full chunk the step will have
        computed, capped at its prompt by default (F2)."""
        stop = num_computed if not self.spec.offload_prompt_only else \
            min(num_computed, self.prompt_len[row])
        self._offer(row, self._req(row), min(stop, num_tokens) // self.bs, gpu_blocks)

    def request_finished(self, row: int, table: list[int], num_tokens: int) -> None:
        """vLLM frees a finished request's blocks at once (`request_finished` returns False,
        F9); the connector processes the finish at the next schedule."""
        if row in self.reqs:
            self._finished.append((row, list(table), num_tokens))

    def end_schedule(self) -> None:
        """`build_connector_meta`, after the scheduled requests' stores: each request finished
        since the last schedule (trace order; vLLM iterates a set, F13) offers what is left of
        its prompt (with `offload_prompt_only` off: up to max(prompt, num_tokens - 1), F2) from
        its freed blocks, then its recency is committed (F6, F8). Last the flushes: a block
        handed out this step that an in-flight store of another request reads (F9)."""
        for row, table, num_tokens in self._finished:
            r = self.reqs[row]
            p = self.prompt_len[row]
            stop = p if self.spec.offload_prompt_only else max(p, num_tokens - 1)
            self._offer(row, r, min(stop, len(table) * self.bs) // self.bs, table)
            self.tier.finish(list(r.touched), self._fresh_rank(), r.reused)
            r.finished = True
            if not r.stores_in_flight and not r.loading:
                del self.reqs[row]
        self._finished.clear()
        if self._allocated:
            for job in self._jobs.values():
                if job.kind != "store" or job.row in self.flushed:
                    continue
                if any(self._allocated.get(b, job.row) != job.row for b in job.gpu_blocks):
                    self.flushed.append(job.row)

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
        if self.flushed:
            rows = set(self.flushed)
            # A flushed store planned this very step is submitted and waited for at once.
            for job in [j for j in self._deferred if j.row in rows]:
                self._deferred.remove(job)
                self._submit(job, self._stores, start_s, k)
            last = max((i for i, j in enumerate(self._stores) if j.row in rows), default=-1)
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
                for k in job.keys:
                    self.tier.pins[k] -= 1
                    if not self.tier.pins[k]:
                        del self.tier.pins[k]
                r.loading = ()
                if r.finished and not r.stores_in_flight:
                    del self.reqs[job.row]     # aborted while its load was in flight
            out.append((job.row, job.kind))
        return out
