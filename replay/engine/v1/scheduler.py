"""kvcap's model of the vLLM V1 scheduler (0.33.0 `vllm/v1/core/sched/scheduler.py`, synchronous
loop), reference B1-B9 with the corrections of section G.

One `schedule()` is a running phase (walk `running` in order under one token budget; a request
that cannot get blocks preempts the newest, or under priority the worst (priority, arrival),
until it fits or preempted itself) then, only if nothing was preempted, a waiting phase (admit the
head while it fits; head-of-line blocking). `update()` plays the model output back as
`../shared/oracle/oracle.py` does. V1 preempts by recompute only (its host tier is CPU KV
offloading, replay/engine/v1/offload.py); kvcap's addition `preemption_mode` "none" admits only what
can run to completion beside what running requests were promised, so nothing is ever preempted.
Requests that can never run are rejected instead of hanging.

Owns the queues and block tables; writes the request counters in `RequestState`. This is the
reference implementation: one step at a time, no speed tricks (the compiled core,
replay/engine/v1/_core.c, is the fast one and is tested against it). Must not import traces/,
capacity/ or torch.
"""
from __future__ import annotations

import numpy as np

from replay.engine.plan import NO_OFFLOAD, OffloadPlan, Preemption, Rejection, StepOutput, StepPlan
from replay.engine.prefix import BlockKeys
from replay.engine.raw import BATCH_KINDS
from replay.engine.spec import SchedulerSpec, cdiv
from replay.engine.state import RequestState, Status
from replay.engine.v1.kv_cache_manager import Admission, KVCacheManager
from replay.engine.v1.offload import Connector
from replay.engine.v1.queues import FcfsQueue, PriorityQueue

_I64 = np.int64
_NEW, _RESUMED, _RUNNING = (BATCH_KINDS.index(k) for k in ("new", "resumed", "running"))
# V1 never swaps: every plan shares one empty (read-only) pair list instead of allocating two;
# most steps finish no request: their outputs share one empty row list.
_NO_PAIRS = np.zeros((0, 2), dtype=_I64)
_NO_ROWS = np.zeros(0, dtype=_I64)
_NO_PAIRS.flags.writeable = _NO_ROWS.flags.writeable = False


class V1Scheduler:
    def __init__(self, spec: SchedulerSpec, state: RequestState, keys: BlockKeys) -> None:
        self.spec = spec
        self.state = state
        self.block_size = spec.block_size
        self.kv = KVCacheManager(num_rows=state.n, num_blocks=spec.num_gpu_blocks, block_size=spec.block_size,
                                 max_model_len=spec.max_model_len,
                                 enable_caching=spec.enable_prefix_caching, keys=keys)
        self.running: list[int] = []
        self.waiting = (PriorityQueue(priority=state.priority, arrival_s=state.arrival_s)
                        if spec.policy == "priority" else FcfsQueue())
        self.mode = spec.preemption_mode
        if self.mode == "swap":
            raise ValueError("V1 has no swap preemption (its host tier is CPU KV offloading)")
        self.max_active = (spec.max_num_active_seqs if spec.max_num_active_seqs is not None
                           else spec.max_num_seqs)
        # 0.34 applies the long-prefill cap with chunked prefill only (S20_off_cap); 0.33 always.
        self._thr_knob = (spec.long_prefill_token_threshold
                          if spec.enable_chunked_prefill or spec.vllm_version == "0.33" else 0)
        # Equal (priority, arrival): running-list order picks the victim (SchedulerSpec).
        self._ties_equal = spec.arrival_ties == "equal"
        # 0.34 cache-aware admission (0: off) and the in-flight CPU load cap (None: none).
        self._cache_aware_window = spec.cache_aware_window
        self._max_loads = spec.max_num_inflight_kv_loads
        # vLLM: int(watermark * num_blocks), null block included.
        self.watermark_blocks = int(spec.watermark * spec.num_gpu_blocks)
        # Python copies of the per-row numbers a step reads (a numpy scalar read costs ~100 ns).
        self._prompt = state.prompt_len.tolist()
        self._out_len = state.output_len.tolist()
        self._prio = state.priority.tolist()
        self._arrival = state.arrival_s.tolist()
        # The counters every step reads and writes, as Python ints; `state` gets them once per
        # step (num_computed from schedule(), num_output from update()), the other counters
        # (written at admission, preemption and finish only) directly.
        self.num_computed = state.num_computed.tolist()
        self.num_output = state.num_output.tolist()
        self._arrived: list[int] = []          # added since the last schedule (rejection check)
        # Rows admitted whose first token of this life is not sampled yet (StepPlan.is_prefill).
        self.prefilling: set[int] = set()
        self._last_sched: dict[int, int] = {}  # the last schedule(): row -> new tokens
        self._admitted: dict[int, int] = {}
        # Async scheduling (0.33 AsyncScheduler, lag 1): a token sampled by the step in flight
        # counts in num_output at once (vLLM schedules on num_tokens +
        # num_output_placeholders) and stays a placeholder until the next update() applies it;
        # the stop checks and frees run then, one step late.
        self.async_scheduling = spec.async_scheduling
        self.placeholders = [0] * state.n
        self._in_flight: list[int] = []        # rows that sampled in the step in flight
        # "none" mode: blocks promised to running requests (whole sequence) and blocks they hold.
        self._promised: dict[int, int] = {}
        self._promised_total = 0
        # CPU KV offloading (vLLM 0.33 OffloadingConnector, replay/engine/v1/offload.py): waiting
        # rows that hold blocks, their CPU load in flight or done (vLLM kv_holding_waiting; drained
        # before `waiting`); the rows of the step in flight (async, F11); the connector output
        # of the step in flight (async: applied one step late); the clock (`tell_time`).
        self.conn = Connector(spec, keys, self._prompt) if spec.kv_offloading else None
        self.loading: list[int] = []
        # vLLM `_inflight_prefills`: admitted rows still prefilling after their scheduled chunk
        # and rows loading from the CPU tier; a CPU-hit admission must leave their remaining
        # blocks free (`_inflight_prefill_reserved_blocks`).
        self._inflight_prefills: set[int] = set()
        # Loading rows whose finished load the waiting loop has seen: vLLM promotes a request
        # out of WAITING_FOR_REMOTE_KVS only when its waiting loop reaches it
        # (`_handle_blocked_waiting_request`), not when the load is reported done.
        self._promoted: set[int] = set()
        # Aborted rows whose blocks go back later (vLLM deferred frees, see abort_request).
        self._free_after_step: list[int] = []
        self._free_after_load: set[int] = set()
        self._rows_in_flight: set[int] = set()
        self._conn_in_flight: list = []
        self._now_s = self._step_start_s = 0.0
        # Preempted rows -> the most tokens they had computed (RequestState
        # .computed_at_preemption), until a re-prefill has computed past it: recomputed_tokens.
        self._recompute_upto: dict[int, int] = {}
        # The last step's cache-aware reorder (0.34; None: not called): usage, probes, queue order
        # before and after, as the oracle prints it (`cache_aware`).
        self.cache_aware: dict | None = None

    # ---------------------------------------------------------------- queue API
    def add_request(self, row: int) -> None:
        self.state.status[row] = Status.WAITING
        self.waiting.add(row)
        self._arrived.append(row)

    def abort_request(self, row: int) -> None:
        """Client abort (test hook): leave whichever queue, free the blocks. With the connector
        under async scheduling (vLLM's defer_block_free), the blocks of a request whose step is
        in flight go back once that step's output is processed; those of a request whose CPU
        load is in flight once the load is reported done (`finish_requests`)."""
        st = int(self.state.status[row])
        if self.conn is not None and st in (Status.RUNNING, Status.WAITING):
            # vLLM calls the connector's request_finished for an aborted request too; it offers
            # the tokens computed so far (FINISHED_ABORTED in `_build_store_jobs`).
            self.conn.request_finished(row, self.kv.tables.get(row, []), self._real_tokens(row),
                                       aborted_at=self.num_computed[row])
        if st == Status.RUNNING:
            self.running.remove(row)
            if self.conn is not None and row in self._rows_in_flight:
                if self._promised:
                    self._promised_total -= self._promised.pop(row, 0)
                self._free_after_step.append(row)
            else:
                self._release(row)
        elif row in self.loading:
            self.loading.remove(row)
            self._promoted.discard(row)
            if self.conn.load_done(row) is None:
                self._free_after_load.add(row)
            else:
                self.kv.free(row)
        elif st == Status.WAITING:
            self.waiting.remove(row)
            if row in self._arrived:
                self._arrived.remove(row)
        else:
            return
        self._in_flight = [r for r in self._in_flight if r != row]
        self._inflight_prefills.discard(row)
        self._recompute_upto.pop(row, None)
        self.state.status[row] = Status.ABORTED

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    @property
    def num_swapped(self) -> int:
        return 0

    def block_table(self, row: int) -> list[int]:
        """GPU block ids of a request holding GPU blocks, in token order."""
        return list(self.kv.tables.get(row, ()))

    def gpu_blocks_used(self) -> int:
        return self.kv.pool.num_used

    def cpu_blocks_used(self) -> int:
        return 0 if self.conn is None else self.conn.tier.num_used

    def has_unfinished(self) -> bool:
        return (bool(self.running) or len(self.waiting) > 0 or bool(self.loading)
                or (self.conn is not None and self.conn.busy()))

    def tell_time(self, now_s: float) -> None:
        """The replay loop's clock: the step's start before `schedule()`, its end before
        `update()`. Only timed CPU offload transfers (offload_transfer_steps 0) read it."""
        self._now_s = now_s

    def offload_next_done_s(self) -> float | None:
        """When the next CPU offload transfer in flight completes (timed transfers), so a loop
        with nothing to schedule can jump there."""
        return None if self.conn is None else self.conn.next_done_s()

    def snapshot(self) -> dict:
        pool = self.kv.pool
        snap = {"waiting": self.loading + self.waiting.rows(), "running": list(self.running),
                "swapped": [], "free_gpu": pool.num_free, "free_cpu": None,
                "blocks": {r: list(self.kv.tables.get(r, [])) for r in self.running},
                "computed": {r: self.num_computed[r] for r in self._last_sched},
                "kv_usage": pool.usage(), "free_queue": pool.free_queue}
        if self.conn is not None:
            tier = self.conn.tier
            snap["free_cpu"] = tier.capacity - tier.num_used
            snap["waiting_for_kv"] = [r for r in self.loading if r not in self._promoted]
            snap["cpu_pending"] = tier.num_pending
            if tier.lru is not None:
                snap["cpu_lru"] = tier.lru_order()
            else:
                snap["cpu_arc"] = tier.arc_state()
        return snap

    # ---------------------------------------------------------------- helpers
    def _real_tokens(self, row: int) -> int:
        """vLLM `request.num_tokens`: prompt and sampled tokens, without async placeholders
        (only real tokens have block hashes: the GPU prefix cache and the offload keys stop
        there)."""
        return self._prompt[row] + self.num_output[row] - self.placeholders[row]

    def _reserved_for_prefills(self) -> int:
        """Blocks the in-flight prefills still need to hold their whole (real) sequence
        (vLLM `_inflight_prefill_reserved_blocks`)."""
        L, held, bs = self.spec.max_model_len, self.kv.held, self.block_size
        return sum(max(cdiv(min(self._real_tokens(q), L), bs) - held[q], 0)
                   for q in self._inflight_prefills)

    def _never_runs(self, row: int) -> str | None:
        spec = self.spec
        p, o, L = self._prompt[row], self._out_len[row], spec.max_model_len
        if p >= L:
            # vLLM 0.33 input processor: the prompt plus at least one output token must fit.
            return f"prompt {p} + 1 output token > max_model_len {L}"
        if not spec.enable_chunked_prefill and p > spec.max_num_batched_tokens:
            return f"prompt {p} > max_num_batched_tokens {spec.max_num_batched_tokens} " \
                   "with chunked prefill off"
        if self.mode == "none":
            need = cdiv(min(p + o, L), self.block_size)
        else:
            # Most KV slots it ever holds: the last step computes token p+o-2 (0-based).
            need = cdiv(min(p + o - 1, L - 1), self.block_size)
        usable = spec.num_gpu_blocks - 1
        if need > usable:
            return f"needs {need} blocks > {usable} usable GPU blocks"
        return None

    def _release(self, row: int) -> list[int]:
        if self._promised:
            self._promised_total -= self._promised.pop(row, 0)
        return self.kv.free(row)

    def _none_reserved(self) -> int:
        """Blocks running requests were promised and do not hold yet ("none" mode)."""
        tables = self.kv.tables
        return self._promised_total - sum(len(tables.get(r, ())) for r in self.running)

    def _admission(self, row: int, budget: int, thr: int):
        """The waiting-phase checks for the head `row` without side effects on the pool:
        (num_new_tokens, Admission, CPU-hit tokens to load), None when it cannot be admitted now,
        "skip" when the connector defers its lookup (F10), or "capped" when its CPU hit would
        pass `max_num_inflight_kv_loads` (0.34)."""
        spec, kv, bs = self.spec, self.kv, self.block_size
        nt = self._prompt[row] + self.num_output[row]
        hits = kv.get_computed_blocks(row, nt)
        if self.conn is not None:
            cpu = self.conn.lookup(row, len(hits) * bs, self._real_tokens(row))
            if cpu is None:
                return "skip"
            if cpu:
                if (self._max_loads is not None
                        and len(self.loading) + len(self._free_after_load) >= self._max_loads):
                    # 0.34 `_admits_inflight_kv_load`: loads in flight, loaded requests not
                    # running yet and aborted requests' loads still in flight count.
                    return "capped"
                # A CPU hit: blocks for the hit and the load now, no tokens this step (F4).
                # vLLM 0.33 admits an async load only if its blocks fit beside what the
                # in-flight prefills (other loads among them) still need: a loading request
                # cannot be preempted, so this keeps loads from deadlocking the pool.
                adm = Admission(hit_blocks=tuple(hits), num_tokens=nt,
                                full_sequence_must_fit=spec.scheduler_reserve_full_isl,
                                watermark_blocks=self.watermark_blocks if self.running else 0,
                                num_loaded_blocks=cpu // bs,
                                reserved_blocks=self._reserved_for_prefills())
                if kv.num_blocks_needed(row, 0, adm) is None:
                    return None
                return 0, adm, cpu
        n = nt - len(hits) * bs
        if 0 < thr < n:
            n = thr
        if not spec.enable_chunked_prefill and n > budget:
            return None
        n = min(n, budget)
        adm = Admission(hit_blocks=tuple(hits), num_tokens=nt,
                        full_sequence_must_fit=spec.scheduler_reserve_full_isl,
                        watermark_blocks=self.watermark_blocks if self.running else 0)
        if kv.num_blocks_needed(row, n, adm) is None:
            return None
        if self.mode == "none":
            whole = cdiv(min(self._prompt[row] + self._out_len[row], spec.max_model_len),
                         self.block_size)
            need = max(whole - len(hits), 0) + kv.pool.num_evictable(hits)
            if need + self._none_reserved() > kv.pool.num_free:
                return None
        return n, adm, 0

    def _preempt(self, row: int, preempted: list) -> None:
        st = self.state
        if self.conn is not None:
            self.conn.preempted(row)
        # The recompute tax (`schedule`): every position below the most it ever computed is
        # computed again, unless a prefix hit or a CPU load brings it back.
        done = self.num_computed[row]
        if done > self._recompute_upto.get(row, 0):
            self._recompute_upto[row] = done
            st.computed_at_preemption[row] = done
        table = self._release(row)
        self.num_computed[row] = st.num_computed[row] = 0
        st.status[row] = Status.WAITING
        st.num_preemptions[row] += 1
        st.num_recomputes[row] += 1
        self.prefilling.discard(row)
        self._inflight_prefills.discard(row)
        self.waiting.prepend(row)
        preempted.append(Preemption(row=row, mode="recompute", num_blocks=len(table)))

    # ---------------------------------------------------------------- one step
    def schedule(self) -> StepPlan:
        spec, st = self.spec, self.state
        rejected: list[Rejection] = []
        if self._arrived:
            for r in self._arrived:
                reason = self._never_runs(r)
                if reason is not None:
                    self.waiting.remove(r)
                    st.status[r] = Status.REJECTED
                    self._recompute_upto.pop(r, None)
                    rejected.append(Rejection(row=r, reason=reason))
            self._arrived.clear()
        budget = spec.max_num_batched_tokens
        self.cache_aware = None
        conn = self.conn
        if conn is not None:
            conn.begin_step()
            self._step_start_s = self._now_s
        # 0.33: the long-prefill cap is skipped when only one request exists
        # (get_request_counts: running, waiting and kv_holding_waiting, loads among them).
        thr = self._thr_knob if len(self.running) + self.num_waiting > 1 else 0
        # Batch in order: row -> new tokens (running requests first, then admissions).
        sched: dict[int, int] = {}
        # Admissions: row -> new / resumed (every other scheduled row is running).
        self._admitted = {}
        preempted: list[Preemption] = []
        budget = self._running_loop(0, sched, budget, thr, preempted)
        if not preempted and self._cache_aware_window:
            self._reorder_waiting_by_cached_prefix()
        if not preempted and (len(self.waiting) or self.loading):
            budget = self._waiting_phase(sched, budget, thr, rejected)

        rows = np.fromiter(sched, _I64, len(sched))
        nnew = np.fromiter(sched.values(), _I64, len(sched))
        adm = self._admitted
        kind = np.array([adm.get(r, _RUNNING) for r in sched] if adm else [_RUNNING] * len(sched),
                        np.int8)
        # Admissions already hold their hit as computed; _update_after_schedule comes next.
        before = st.num_computed[rows]
        st.num_computed[rows] = before + nnew
        computed = self.num_computed
        upto = self._recompute_upto
        if upto:
            # Recompute tax: the part of a chunk below what the request had computed before a
            # preemption (its prefix hit and loaded tokens are not scheduled: not counted). Only
            # a re-prefill reaches back there; past it the row leaves the dict.
            for r, n in sched.items():
                u = upto.get(r)
                if u is not None:
                    c = computed[r]
                    if c < u:
                        st.recomputed_tokens[r] += min(c + n, u) - c
                    if c + n >= u:
                        del upto[r]
        for r, n in sched.items():
            computed[r] += n
        self._last_sched = sched
        if self._inflight_prefills:
            # `_update_after_schedule`: a request whose chunk reaches its known tokens is no
            # longer an in-flight prefill.
            for r in sched:
                if computed[r] >= self._prompt[r] + self.num_output[r]:
                    self._inflight_prefills.discard(r)
        pre, offload = self.prefilling, NO_OFFLOAD
        if conn is not None:
            # build_connector_meta: write-through stores of the scheduled requests (batch
            # order), then the finishes since the last step and the flushes.
            tables = self.kv.tables
            for r in sched:
                conn.plan_stores(r, computed[r], self._real_tokens(r), tables[r])
            conn.end_schedule()
            offload = OffloadPlan(
                lookups=tuple(conn.lookups), hits=tuple(conn.hits), loads=tuple(conn.loads),
                stores=tuple(conn.stores), evicted=tuple(conn.evicted),
                store_failed=tuple(conn.store_failed), flushed=tuple(conn.flushed))
        return StepPlan(
            rows=rows, num_new_tokens=nnew, num_computed_tokens=before,
            is_prefill=np.array([r in pre for r in sched] if pre else [False] * len(sched), bool),
            kind=kind, swap_out=_NO_PAIRS, swap_in=_NO_PAIRS, preempted=tuple(preempted),
            rejected=tuple(rejected), offload=offload)

    def _running_loop(self, i: int, sched: dict[int, int], budget: int, thr: int,
                      preempted: list) -> int:
        """vLLM's running loop from request i on: allocate, preempting until it fits."""
        st, kv, L = self.state, self.kv, self.spec.max_model_len
        running, prompt = self.running, self._prompt
        num_computed, num_output = self.num_computed, self.num_output
        priority = self.spec.policy == "priority"
        lcf = self.spec.preemption_victim == "lcf"
        ph, out_len, async_scheduling = self.placeholders, self._out_len, self.async_scheduling
        grow = kv.grow
        while i < len(running) and budget > 0:
            r = running[i]
            c = num_computed[r]
            if async_scheduling and ph[r] > 0 and c + 2 - ph[r] >= prompt[r] + out_len[r]:
                # 0.33 AsyncScheduler: the step in flight already samples its last token.
                i += 1
                continue
            nt = prompt[r] + num_output[r]
            n = nt - c
            if 0 < thr < n:
                n = thr
            if n > budget:
                n = budget
            if n > L - 1 - c:    # the sequence stays below max_model_len
                n = L - 1 - c
            if n <= 0:
                i += 1
                continue
            blocked = False
            while True:
                # Only real tokens are cached: a block that holds an async placeholder has no
                # hash yet (vLLM caches up to request.num_tokens), so it is registered at a
                # later step.
                new = grow(r, n, c, nt - ph[r])
                if new is not None:
                    break
                if self.mode == "none":
                    raise AssertionError("preemption_mode none: a running request ran out of "
                                         "blocks despite its reservation")
                if lcf:
                    # What-if (vLLM PR #53723): the fewest computed tokens, ties the last in
                    # running order (min() keeps the first minimal one of the reversed list).
                    victim = min(reversed(running), key=num_computed.__getitem__)
                elif priority:
                    prio, arr = self._prio, self._arrival
                    if self._ties_equal:
                        # vLLM: the first maximal (priority, arrival_time) in running order.
                        victim = max(running, key=lambda x: (prio[x], arr[x]))
                    else:
                        # Equal (priority, arrival): the later trace row, as vLLM's receipt
                        # timestamps (distinct, in trace order) would rank them.
                        victim = max(running, key=lambda x: (prio[x], arr[x], x))
                else:
                    victim = running[-1]
                if victim in self._rows_in_flight:
                    # F11 (O6 step 6): async scheduling with a KV connector defers block frees,
                    # and a victim whose last step is still in flight cannot be preempted.
                    blocked = True
                    break
                if priority or lcf:
                    vi = running.index(victim)
                    del running[vi]
                    if vi < i:
                        i -= 1
                    if victim in sched:
                        budget += sched.pop(victim)   # un-schedule and refund (0.33)
                else:
                    victim = running.pop()
                self._preempt(victim, preempted)
                if victim == r:
                    break
            if blocked:
                break
            if new and self.conn is not None:
                self.conn.allocated(new)
            if new is None:
                if priority and st.status[r] == Status.WAITING:
                    continue   # it preempted itself; higher-priority requests after it may fit
                break
            sched[r] = n
            budget -= n
            i += 1
        return budget

    def _waiting_phase(self, sched: dict[int, int], budget: int, thr: int, rejected: list) -> int:
        st, kv, L = self.state, self.kv, self.spec.max_model_len
        running, waiting = self.running, self.waiting
        if self.loading:
            budget = self._loaded_phase(sched, budget, thr, rejected)
            if budget is None:
                return 0
        skipped: list[int] = []      # lookups the connector deferred: back in front afterwards
        while budget > 0 and len(waiting) and len(running) < self.max_active:
            r = waiting.peek()
            got = self._admission(r, budget, thr)
            if got == "skip":
                skipped.append(waiting.pop())
                continue
            if got == "capped":
                break             # it waits at the head: nothing behind it is admitted
            if got is None:
                if (running or sched or self.loading or skipped or self._free_after_step
                        or self._free_after_load):
                    break
                # Nothing runs, nothing will give blocks back, no lookup waits for a transfer,
                # and the head still does not fit: it never will (vLLM hangs).
                waiting.pop()
                st.status[r] = Status.REJECTED
                self._recompute_upto.pop(r, None)
                rejected.append(Rejection(row=r, reason="cannot be admitted with the whole "
                                          "GPU pool free"))
                continue
            n, adm, cpu = got
            new = kv.allocate_slots(r, n, adm.num_tokens, adm, delay_cache=cpu > 0)
            assert new is not None
            waiting.pop()
            gpu = len(adm.hit_blocks) * self.block_size
            if self.conn is not None:
                self.conn.admitted(r, len(adm.hit_blocks) * self.block_size, cpu,
                                   kv.tables[r])
            if st.num_preemptions[r] == 0:
                # vLLM's counters at first admission (PrefillStats: num_local_cached_tokens,
                # num_external_cached_tokens; vllm:prefix_cache_hits and
                # vllm:external_prefix_cache_hits): the whole CPU hit, also when it reaches the
                # last prompt token, which is then recomputed (F5).
                st.cached_prompt_tokens[r] = gpu + cpu
                st.cpu_hit_tokens[r] = cpu
            if cpu:
                # F4: WAITING_FOR_REMOTE_KVS, holding its blocks; it computes once the load is
                # reported done. The load takes no token budget.
                self.conn.plan_load(r, len(adm.hit_blocks) * self.block_size, cpu,
                                    new[: cpu // self.block_size])
                self.loading.append(r)
                self._inflight_prefills.add(r)
                continue
            running.append(r)
            if self.mode == "none":
                whole = cdiv(min(self._prompt[r] + self._out_len[r], L), self.block_size)
                self._promised[r] = whole
                self._promised_total += whole
            self._start(r, gpu, n, sched)
            if gpu + n < self._real_tokens(r):
                self._inflight_prefills.add(r)
            budget -= n
        for r in reversed(skipped):
            waiting.prepend(r)
        if self.spec.policy == "priority" and len(self.loading) > 1:
            # vLLM's kv_holding_waiting is a priority queue under the priority policy too: the
            # loading requests are drained (and listed) by (priority, arrival), not by admission.
            prio, arr = self._prio, self._arrival
            self.loading.sort(key=lambda x: (prio[x], arr[x], x))
        return budget

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """0.34 cache-aware admission (`_reorder_waiting_by_cached_prefix`, oracle C1-C3), at the
        start of the waiting phase: with at least two waiting requests and the KV usage (after
        this step's running allocations) at the threshold or above, the plain waiting requests
        among the first `window` (never preempted: a preempted one keeps its place, and nothing
        moves past it) take those slots in order of their GPU prefix-cache hit, deepest first,
        ties in queue order. The probe is `get_num_cached_tokens`: `get_computed_blocks`'s hit
        (at most num_tokens - 1 tokens) without touching anything. The CPU tier is not asked.
        `cache_aware` records the call (what the oracle prints)."""
        waiting, spec = self.waiting, self.spec
        usage = self.kv.pool.usage()
        before = waiting.rows()
        rec = self.cache_aware = {"usage": usage, "cached": {}, "before": before, "after": before}
        if len(waiting) < 2 or usage < spec.cache_aware_admission_threshold:
            return
        npre = self.state.num_preemptions
        head = before[:self._cache_aware_window]
        slots = [i for i, r in enumerate(head) if npre[r] == 0]
        if len(slots) < 2:
            return
        cached = {i: len(self.kv.get_computed_blocks(head[i], self._prompt[head[i]]
                                                     + self.num_output[head[i]]))
                  * self.block_size for i in slots}
        rec["cached"] = {head[i]: c for i, c in cached.items()}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order):
            reordered[slot] = head[source]
        waiting.replace_head(reordered)
        rec["after"] = reordered + before[len(head):]

    def _start(self, r: int, computed: int, n: int, sched: dict[int, int]) -> None:
        """An admitted request runs from `computed` tokens on, `n` of them this step."""
        st = self.state
        self._admitted[r] = _RESUMED if st.num_preemptions[r] > 0 else _NEW
        st.status[r] = Status.RUNNING
        self.num_computed[r] = st.num_computed[r] = computed
        self.prefilling.add(r)
        sched[r] = n

    def _loaded_phase(self, sched: dict[int, int], budget: int, thr: int,
                      rejected: list) -> int | None:
        """vLLM drains kv_holding_waiting first: a request whose CPU load is done is admitted
        (no new lookup) with the GPU-hit and loaded tokens computed, less one when that is its
        whole sequence (F5: its last token is recomputed for its logits); one still loading is
        skipped. Returns the budget left, or None when a loaded request does not fit (head-of-line
        blocking: the waiting queue is not tried either). vLLM never gives a loaded request's
        blocks back; its admission rule (`_reserved_for_prefills`) keeps loads from deadlocking."""
        st, kv, conn, spec = self.state, self.kv, self.conn, self.spec
        for r in list(self.loading):
            if budget <= 0 or len(self.running) >= self.max_active:
                return budget
            done = conn.load_done(r)
            if done is None:
                continue
            self._promoted.add(r)
            nt = self._prompt[r] + self.num_output[r]
            computed = min(done, nt - 1)
            kv.cache_blocks(r, computed)
            n = nt - computed
            if 0 < thr < n:
                n = thr
            adm = Admission(num_tokens=nt, full_sequence_must_fit=spec.scheduler_reserve_full_isl,
                            watermark_blocks=self.watermark_blocks if self.running else 0)
            new = None
            if spec.enable_chunked_prefill or n <= budget:
                n = min(n, budget)
                new = kv.extend_held(r, n, computed, nt, adm)
            if (new is None and not self.running and not sched and not self._free_after_step
                    and not self._free_after_load
                    and all(conn.load_done(x) is not None for x in self.loading)):
                # Nothing runs, no load is in flight and it still does not fit: it never will
                # (vLLM hangs; its admission rule makes this a corner case).
                self.loading.remove(r)
                self._promoted.discard(r)
                self._inflight_prefills.discard(r)
                kv.free(r)
                conn.dropped(r)
                st.status[r] = Status.REJECTED
                self._recompute_upto.pop(r, None)
                rejected.append(Rejection(row=r, reason="cannot be admitted with the whole "
                                          "GPU pool free"))
                continue
            if new is None:
                return None
            # `update_state_after_alloc` for the admission: every block of its table.
            conn.allocated(kv.tables[r])
            conn.start_computing(r)
            self.loading.remove(r)
            self._promoted.discard(r)
            self.running.append(r)
            self._start(r, computed, n, sched)
            budget -= n
        return budget

    def update(self, plan: StepPlan) -> StepOutput:
        """One sampled token for every scheduled request whose chunk reached the end of its known
        tokens; finish at output_len or max_model_len; free finished requests in batch order.
        Async: the stop checks and frees apply the previous step's tokens (`finished` are rows
        whose last token that step sampled)."""
        st = self.state
        rows = plan.rows.tolist()
        for r in self._free_after_step:
            # The step in flight when they were aborted is processed now (_drain_deferred_frees).
            self.kv.free(r)
        self._free_after_step.clear()
        prompt, out_len, L = self._prompt, self._out_len, self.spec.max_model_len
        computed, num_output = self.num_computed, self.num_output
        got = [r for r in rows if computed[r] >= prompt[r] + num_output[r]]
        prefilling = self.prefilling
        for r in got:
            num_output[r] += 1
            prefilling.discard(r)
        st.num_output[plan.rows] = [num_output[r] for r in rows]
        applied = got
        ph = self.placeholders
        if self.async_scheduling:
            # This step's tokens are placeholders; the previous step's output is applied now.
            for r in got:
                ph[r] += 1
            applied, self._in_flight = self._in_flight, got
            for r in applied:
                ph[r] -= 1
            if self.spec.enable_prefix_caching and applied:
                # vLLM update_from_output: with placeholders, a running request's blocks are
                # cached up to the tokens of its processed steps (num_computed_tokens -
                # num_in_flight_tokens) once the output is applied; the step in flight stays out.
                # (A request preempted in this step holds no blocks: nothing to cache.)
                in_step = self._last_sched
                for r in applied:
                    self.kv.cache_blocks(r, computed[r] - in_step.get(r, 0))
        # Stop checks on the applied tokens (placeholders are not output yet).
        fin = []
        for r in applied:
            out = num_output[r] - ph[r]
            if out >= out_len[r] or prompt[r] + out >= L:
                fin.append(r)
        if fin:
            if self.async_scheduling and not set(got).isdisjoint(fin):
                raise AssertionError("async scheduling: a request was scheduled again after "
                                     "its last token")
            running = []
            conn = self.conn
            for r in fin:
                self._inflight_prefills.discard(r)
                if conn is not None:
                    conn.request_finished(r, self.kv.tables.get(r, []),
                                          prompt[r] + num_output[r])
                if st.status[r] == Status.RUNNING:
                    self._release(r)
                    running.append(r)
                else:
                    # Preempted while its last token was in flight (vLLM: stopped_preempted_reqs).
                    self.waiting.remove(r)
            for r in fin:
                st.status[r] = Status.FINISHED
            gone = set(running)
            self.running = [r for r in self.running if r not in gone]
        sampled, finished = tuple(got), np.array(fin, _I64) if fin else _NO_ROWS
        if self.conn is None:
            return StepOutput(sampled=sampled, finished=finished)
        # The worker runs the step's connector metadata; its output (transfers done) is applied
        # now, or one step late with async scheduling (O6: cpu_done a step later than O1).
        done = self.conn.execute(self._step_start_s, self._now_s)
        if self.async_scheduling:
            done, self._conn_in_flight = self._conn_in_flight, done
            self._rows_in_flight = set(rows)
        offload_done = tuple(self.conn.apply(done))
        for r, kind in offload_done:
            if kind == "load" and r in self._free_after_load:
                self._free_after_load.discard(r)      # finished_recving of an aborted request
                self.kv.free(r)
        return StepOutput(sampled=sampled, finished=finished, offload_done=offload_done)
