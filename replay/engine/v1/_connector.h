/* vLLM 0.33's OffloadingConnector on the compiled V1 core's scheduler (included once, by
 * replay/engine/v1/_core.c, after its block pool): lookups at admission, loads that make a request
 * wait in WAITING_FOR_REMOTE_KVS, write-through stores planned at schedule time, flushes, and the
 * emulated transfer engine. Transcribes the Python reference (replay/engine/v1/offload.py; vLLM's
 * offloading/scheduler.py, worker.py and the oracle's StepTransferEngine) rule for rule; the tier
 * itself (chunks, LRU, ARC) is in _offload.h. Oracle README section 7 names the findings.
 */

static inline int32_t kvh_at(const Oc *o, int64_t i, int64_t cap) {
    return o->kvh[(o->kvh_head + i) % cap];
}

/* vLLM's defer_block_free (async scheduling with a KV consumer connector): a victim whose
 * last step is still in flight cannot be preempted (scheduler.py _request_blocks_can_be_freed). */
static inline int oc_cannot_free(const Core *c, int64_t row) {
    return c->oc.on && c->async_sched && c->oc.last_seq[row] > c->oc.proc_seq;
}

static inline int64_t oc_key(const Core *c, int64_t row, int64_t chunk) {
    /* A chunk's offload key is the key of its last block (scheduler.py update_offload_keys). */
    return key_of(&c->keys, row, (chunk + 1) * c->oc.bpc - 1);
}

/* The row's first chunk with a key of its own (no other request can store it): chunk i's
 * last block (i + 1) * bpc - 1 is past the row's shared blocks. */
static inline int64_t oc_first_unique(const Core *c, int64_t row) {
    const Keys *ks = &c->keys;
    return ks->mode == 0 ? 0 : cdiv(ks->num_shared[row] + 1, c->oc.bpc) - 1;
}

/* The request's tokens with real values (async placeholders excluded: vLLM hashes blocks of
 * real tokens only). */
static inline int64_t oc_num_tokens(const Core *c, int64_t row) {
    return c->q.prompt[row] + c->q.num_output[row] - (c->async_sched ? c->ph[row] : 0);
}

/* The tier slot of the row's chunk i, or -1 (LRU: a key of the row's own is found in the row's
 * group, not in the map). */
static inline int32_t oc_get(const Core *c, int64_t row, int64_t i) {
    const Oc *o = &c->oc;
    if (o->policy == POL_LRU && i >= oc_first_unique(c, row)) return tier_get_own(&o->tier, (int32_t)row, i);
    return tier_get(&o->tier, oc_key(c, row, i));
}

/* The in-flight prefill set (N2). */
static inline void oc_infl_add(Oc *o, int64_t row) {
    if (o->infl_pos[row]) return;
    o->infl[o->ninfl++] = (int32_t)row;
    o->infl_pos[row] = (int32_t)o->ninfl;
}
static inline void oc_infl_del(Oc *o, int64_t row) {
    int32_t p = o->infl_pos[row];
    if (!p) return;
    int32_t last = o->infl[--o->ninfl];
    o->infl[p - 1] = last; o->infl_pos[last] = p;
    o->infl_pos[row] = 0;
}
/* Blocks the in-flight prefills still need to hold their whole (real) sequence (vLLM
 * _inflight_prefill_reserved_blocks; the order of the sum does not matter). */
static int64_t oc_reserved(const Core *c) {
    const Oc *o = &c->oc;
    int64_t sum = 0;
    for (int64_t k = 0; k < o->ninfl; k++) {
        int32_t q = o->infl[k];
        sum += max64(cdiv(min64(oc_num_tokens(c, q), c->L), c->bs) - c->held[q], 0);
    }
    return sum;
}

static inline uint8_t *oc_flags(Core *c, int64_t row, int64_t chunk) {
    Oc *o = &c->oc;
    if (chunk >= o->ra_cap[row]) {
        int64_t nc = o->ra_cap[row] ? o->ra_cap[row] : 16;
        while (nc <= chunk) nc *= 2;
        uint8_t *p = (uint8_t *)realloc(o->ra[row], (size_t)nc);
        if (!p) return NULL;
        memset(p + o->ra_cap[row], 0, (size_t)(nc - o->ra_cap[row]));
        o->ra[row] = p; o->ra_cap[row] = nc;
    }
    return &o->ra[row][chunk];
}

/* The row's provisional LRU rank (lru.py _get_request_rank), its group opened on first use. */
static inline int64_t oc_rank(Core *c, int64_t row) {
    if (!c->oc.rank[row]) {
        c->oc.rank[row] = ++c->oc.tier.next_rank;
        grp_open(&c->oc.tier, (int32_t)row, c->oc.rank[row]);
    }
    return c->oc.rank[row];
}

/* LRU: chunk index idx of group g leaves group g: while g is a row whose finish is still to
 * come, that row's flag says so (its finish looks the chunk up; the chunks still in its group
 * move with the group). */
static inline void oc_left(Core *c, int32_t g, int32_t idx) {
    Oc *o = &c->oc;
    if (g < c->q.n && o->ra[g]) o->ra[g][idx] |= RA_OUT;
}

/* manager._record_request_cache_access for one of the row's chunks (+ policy.on_request_access:
 * LRU ranks a chunk first seen by a request (request rank, -position), never lowering it). */
static inline void oc_record_f(Core *c, int64_t row, int64_t chunk, uint8_t *f, int reused,
                               int32_t s) {
    Oc *o = &c->oc;
    if (!(*f & RA_SEEN)) {
        *f |= RA_SEEN;
        if (o->policy == POL_LRU) {
            int64_t rr = oc_rank(c, row);
            if (s >= 0 && lru_rank_less(&o->tier, &o->tier.ch[s], rr, chunk)) {
                int32_t g = o->tier.ch[s].grp, idx = o->tier.ch[s].idx;
                lru_rerank(&o->tier, s, (int32_t)row, chunk);
                oc_left(c, g, idx);
            } else {
                *f |= RA_OUT;
            }
        }
    }
    if (reused && !(*f & RA_INSERTED)) *f |= RA_REUSED;
}
static int oc_record_at(Core *c, int64_t row, int64_t chunk, int reused, int32_t s) {
    uint8_t *f = oc_flags(c, row, chunk);
    if (!f) return -1;
    oc_record_f(c, row, chunk, f, reused, s);
    return 0;
}

/* The same for a chunk whose tier slot is not known yet. */
static int oc_record(Core *c, int64_t row, int64_t chunk, int reused) {
    return oc_record_at(c, row, chunk, reused, oc_get(c, row, chunk));
}

/* get_num_new_matched_tokens: tokens the tier can load after `local` GPU-hit tokens (block
 * aligned), or -1 when the lookup is deferred (F10: a chunk being stored or loaded, or the
 * request still has transfers in flight). */
static int64_t oc_lookup(Core *c, int64_t row, int64_t local) {
    Oc *o = &c->oc;
    o->next_stored[row] = 0;              /* restarting at token 0: offer every chunk again */
    if (o->njobs[row]) return -1;
    o->local_tok[row] = local;
    int64_t tpc = o->tpc, ntok = oc_num_tokens(c, row), keyed = ntok / tpc;
    int64_t max_hit = min64(ntok, keyed * tpc);
    if (max_hit - local < tpc) return 0;
    int64_t nchunks = min64(cdiv(max_hit, tpc), keyed), start = local / tpc, hits = 0;
    int defer = 0;
    for (int64_t i = start; i < nchunks; i++) {
        int32_t s = oc_get(c, row, i);
        if (s < 0) break;
        hits++;
        defer |= o->tier.ch[s].ref < 0;
    }
    if (hits == 0) return 0;
    if (defer) return -1;
    max_hit = min64(max_hit, tpc * (start + hits));
    int64_t got = max_hit - local;
    if (got < tpc) return 0;
    if (c->caching) {
        /* F10: a chunk another request is loading. */
        for (int64_t i = start; i < cdiv(local + got, tpc); i++) {
            int32_t s = oc_get(c, row, i);
            if (s >= 0 && o->tier.ch[s].ref > 0) return -1;
        }
    }
    return got;
}

/* A job record for up to nslots chunks and nblocks blocks: a finished job's record (and its
 * arrays) is reused, so records grow with the jobs in flight, not with the run. */
static int64_t oc_new_job(Core *c, int64_t row, int store, int64_t nslots, int64_t nblocks) {
    Oc *o = &c->oc;
    int64_t ji;
    if (o->free_jobs.n) ji = o->free_jobs.d[--o->free_jobs.n];
    else {
        if (o->njobs_all == o->jobs_cap) {
            int64_t nc = o->jobs_cap ? o->jobs_cap * 2 : 64;
            Job *p = (Job *)realloc(o->jobs, (size_t)nc * sizeof(Job));
            if (!p) return -1;
            o->jobs = p; o->jobs_cap = nc;
        }
        ji = o->njobs_all++;
        memset(&o->jobs[ji], 0, sizeof(Job));
    }
    Job *j = &o->jobs[ji];
    j->row = (int32_t)row;
    j->store = (int8_t)store;
    j->flush = j->submitted = 0;
    j->done_at = 0; j->done_s = 0;
    j->nslots = j->nblocks = 0;
    if (nslots > j->slots_cap) {
        int32_t *p = (int32_t *)realloc(j->slots, (size_t)nslots * sizeof(int32_t));
        if (!p) return -1;
        j->slots = p; j->slots_cap = nslots;
    }
    if (nblocks > j->blocks_cap) {
        int32_t *p = (int32_t *)realloc(j->blocks, (size_t)nblocks * sizeof(int32_t));
        if (!p) return -1;
        j->blocks = p; j->blocks_cap = nblocks;
    }
    o->njobs[row]++;
    if (joblist_push(&o->live, ji)) return -1;
    return ji;
}

/* update_state_after_alloc with `ext` > 0 tokens to load after the row's local hit: pin the
 * chunks, plan the load into the row's fresh blocks (F4), skip the loaded chunks when storing. */
static int oc_plan_load(Core *c, int64_t row, int64_t ext) {
    Oc *o = &c->oc;
    int64_t local = o->local_tok[row], cached = local + ext, bs = c->bs;
    int64_t nblk = cdiv(cached, bs), first = cdiv(local, bs);
    int64_t nchunks = cdiv(cached, o->tpc), start = first / o->bpc;
    int64_t ji = oc_new_job(c, row, 0, nchunks - start, nblk - first);
    if (ji < 0) return -1;
    Job *j = &o->jobs[ji];
    for (int64_t k = first; k < nblk; k++) j->blocks[j->nblocks++] = c->tbl[row][k];
    for (int64_t i = start; i < nchunks; i++) {
        int32_t s = oc_get(c, row, i);
        tier_pin(&o->tier, s);
        j->slots[j->nslots++] = s;
        if (oc_record(c, row, i, 1)) return -1;
    }
    o->next_stored[row] = nchunks;        /* CHUNK_LEVEL: loaded chunks are not stored again */
    o->load_blocks += j->nblocks;
    return joblist_push(&o->step_loads, ji);
}

/* manager.prepare_store for the row's chunks [start, end): chunks already in the tier count as
 * reused (their recency is recorded), missing ones are stored, all or nothing (F15): evict what
 * is needed from ready, unpinned chunks outside this offer. Returns the number of chunks
 * inserted (their indices in o->scratch, their tier slots at o->sbuf[index - start]), or -1
 * when they do not fit, -2 on error. */
static int64_t oc_prepare_store(Core *c, int64_t row, int64_t start, int64_t end) {
    Oc *o = &c->oc;
    Tier *t = &o->tier;
    int32_t *todo = o->scratch;           /* chunk indices to store */
    int64_t ntodo = 0, *kb = o->kbuf;     /* the offer's keys, hashes and slots, computed once */
    int32_t *sb = o->sbuf;
    uint32_t *hb = o->hbuf;
    if (!oc_flags(c, row, end - 1)) return -2;
    uint8_t *fl = o->ra[row];
    t->stamp++;
    KeyIt it;
    keyit_init(&c->keys, &it, row, start);
    /* LRU: a chunk with a key of its own is in the tier exactly when this row stored it and
     * it did not leave the row's group (RA_OUT): no lookup for the others (most of a trace
     * without prefix information). */
    int lru = o->policy == POL_LRU;
    int64_t fu = oc_first_unique(c, row);
    for (int64_t i = start; i < end; i++) {
        kb[i - start] = o->bpc == 1 ? keyit_next(&c->keys, &it) : oc_key(c, row, i);
        hb[i - start] = key_hash(kb[i - start]);
        if (i < start + 16) tier_prefetch(t, hb[i - start]);
    }
    /* store_threshold: the offer is counted, and only the missing chunks offered often enough
     * are stored (and recorded); chunks in the tier are looked up (reused, protected) whatever
     * their count. 0.34 counts each of the row's keys once (RA_COUNTED). */
    const uint8_t *keep = NULL;
    if (t->cnt.thr) {
        int once = t->cnt.once_per_request;
        if (cnt_offer(t, kb, hb, end - start, o->keep, o->cnode, once ? fl + start : NULL) < 0)
            return -2;
        keep = o->keep;
        if (once) for (int64_t i = start; i < end; i++) fl[i] |= RA_COUNTED;
    }
    /* One pass looks each chunk up and records the access (_record_request_cache_access, in
     * chunk order; an LRU re-rank moves no other chunk of this offer out of the lookups' way).
     * A miss's record is oc_record_f's for a chunk not in the tier, inlined: first seen, it is
     * out of the row's group until inserted; its first sight ranks the row (LRU). */
    uint8_t miss_first = lru ? RA_SEEN | RA_OUT : RA_SEEN;
    for (int64_t i = start; i < end; i++) {
        if (i + 16 < end) tier_prefetch(t, hb[i + 16 - start]);
        int absent = lru && (fl[i] & (RA_INSERTED | RA_OUT)) != RA_INSERTED && i >= fu;
        int32_t s = sb[i - start] = absent ? -1
                  : lru && i >= fu ? tier_get_own(t, (int32_t)row, i)
                  : tier_get_h(t, kb[i - start], hb[i - start]);
        if (s < 0) {
            if (keep && !keep[i - start]) continue;
            todo[ntodo++] = (int32_t)i;
            if (!(fl[i] & RA_SEEN)) {
                fl[i] |= miss_first;
                if (lru && !o->rank[row]) oc_rank(c, row);
            }
            continue;
        }
        t->ch[s].stamp = t->stamp;        /* protected from this store's evictions */
        if (t->ch[s].ref >= 0) oc_record_f(c, row, i, &fl[i], 1, s);
    }
    if (o->policy == POL_ARC) {
        /* on_store_miss: the first miss of each chunk by this request may be a ghost hit (LRU
         * has no use for the flag). */
        for (int64_t k = ntodo - 1; k >= 0; k--)
            if (!(fl[todo[k]] & RA_STORE_MISS)) arc_ghost_hit(t, kb[todo[k] - start]);
        for (int64_t k = 0; k < ntodo; k++) fl[todo[k]] |= RA_STORE_MISS;
    }
    if (!ntodo) return 0;
    int64_t need = ntodo - tier_free_chunks(t);
    if (need > 0) {
        if (need > t->num_evictable) return -1;
        int32_t *out = o->scratch + ntodo;
        if (tier_evict(t, need, out, o->plan_out || !lru ? o->ekeys : NULL) < 0) return -1;
        for (int64_t k = 0; o->plan_out && k < need; k++)
            if (joblist_push(&o->evicted, o->ekeys[k])) return -2;
        if (o->policy == POL_LRU)
            for (int64_t k = 0; k < need; k++) oc_left(c, t->ch[out[k]].grp, t->ch[out[k]].idx);
    }
    if (o->policy == POL_LRU) oc_rank(c, row);
    for (int64_t k = 0; k < ntodo; k++) {
        int64_t i = todo[k];
        sb[i - start] = tier_insert(t, kb[i - start], hb[i - start], (int32_t)row, i, lru && i >= fu);
        fl[todo[k]] = (uint8_t)((fl[todo[k]] | RA_INSERTED) & ~RA_OUT);
    }
    return ntodo;
}

/* A row the connector has been told is finished (request_finished): finished, or aborted by
 * the client (vLLM calls request_finished for an aborted request too). */
static inline int oc_gone(const Core *c, int64_t row) {
    return c->q.status[row] == ST_FINISHED || c->q.status[row] == ST_ABORTED;
}

/* The connector's view of a row's GPU blocks: its table, kept for a finished row until the
 * connector has seen the finish (its last stores read them). */
static inline int64_t oc_held(const Core *c, int64_t row) {
    return oc_gone(c, row) ? c->oc.fin_blocks[row] : c->held[row];
}

/* _build_store_jobs for one row: the full chunks this step will have computed (a finished row:
 * up to max(prompt, tokens - 1), F2; an aborted one: the tokens it had computed,
 * FINISHED_ABORTED), prompt chunks only by default, from the first chunk not offered yet; stored
 * all or nothing, a failed offer is repeated at the next step (F15). */
static int oc_plan_store(Core *c, int64_t row, int64_t after) {
    Oc *o = &c->oc;
    int finished = oc_gone(c, row);
    int64_t ntok = oc_num_tokens(c, row), prompt = c->q.prompt[row];
    int64_t upto = c->q.status[row] == ST_ABORTED ? c->abort_upto[row]
                 : finished ? max64(prompt, ntok - 1) : after;
    int64_t offl = min64(upto, ntok);
    if (o->prompt_only) offl = min64(offl, prompt);
    int64_t nch = min64(min64(offl / o->tpc, oc_held(c, row) / o->bpc), ntok / o->tpc);
    int64_t start = o->next_stored[row];
    if (nch <= start) return 0;
    int64_t got = oc_prepare_store(c, row, start, nch);
    if (got == -2) return -1;
    if (got == -1) { o->failed[o->nfailed++] = (int32_t)row; return 0; }
    if (got == 0) { o->next_stored[row] = max64(o->next_stored[row], nch); return 0; }
    int64_t ji = oc_new_job(c, row, 1, got, got * o->bpc);
    if (ji < 0) return -1;
    Job *j = &o->jobs[ji];
    const int32_t *tb = c->tbl[row];
    int64_t bpc = o->bpc;
    for (int64_t k = 0; k < got; k++) {
        int64_t i = o->scratch[k];
        j->slots[k] = o->sbuf[i - start];
        if (bpc == 1) j->blocks[k] = tb[i];
        else memcpy(j->blocks + k * bpc, tb + i * bpc, (size_t)bpc * sizeof(int32_t));
    }
    j->nslots = got; j->nblocks = got * bpc;
    o->next_stored[row] = max64(o->next_stored[row], nch);
    o->store_blocks += j->nblocks;
    if (finished) {
        /* A finished row's store reads freed blocks: one reallocated this step flushes it. */
        for (int64_t k = 0; k < j->nblocks && !j->flush; k++)
            j->flush = o->alloc_stamp[j->blocks[k]] == o->astamp;
    }
    return joblist_push(&o->step_stores, ji);
}

/* on_request_finished: the row's recency is committed (LRU: fresh ranks, tail first; ARC:
 * reused chunks move to T2, F8). Its access record goes with it. */
static void oc_request_finished(Core *c, int64_t row) {
    Oc *o = &c->oc;
    Tier *t = &o->tier;
    int lru = o->policy == POL_LRU;
    /* LRU: the row's group takes the fresh rank with the chunks in it, in order (see Grp); the
     * row's other chunks still in the tier join it. A chunk of its own key that left the group
     * was evicted and is gone (only this row stores it). ARC: every chunk it saw. */
    if (lru && o->rank[row]) grp_renew(t, (int32_t)row, ++t->next_rank);
    int64_t m = 0, *kb = o->kbuf;         /* the chunks to look up, their lookups overlapped */
    int32_t *idx = o->scratch;
    uint32_t *hb = o->hbuf;
    int64_t fu = oc_first_unique(c, row);
    for (int64_t i = o->ra_cap[row] - 1; i >= 0; i--) {
        uint8_t f = o->ra[row][i];
        if (!(f & RA_SEEN)) continue;
        if (lru && (!(f & RA_OUT) || i >= fu)) continue;
        idx[m++] = (int32_t)i;
    }
    /* Their keys (kb, hb by chunk index): in one pass of the row's block keys when a chunk is a
     * block (no division per key), descending as the policies need. */
    if (m && o->bpc == 1) {
        KeyIt it;
        keyit_init(&c->keys, &it, row, 0);
        for (int64_t i = 0; i <= idx[0]; i++) kb[i] = keyit_next(&c->keys, &it);
    } else {
        for (int64_t k = 0; k < m; k++) kb[idx[k]] = oc_key(c, row, idx[k]);
    }
    for (int64_t k = 0; k < m; k++) hb[idx[k]] = key_hash(kb[idx[k]]);
    for (int64_t k = 0; k < m && k < 16; k++) tier_prefetch(t, hb[idx[k]]);
    for (int64_t k = 0; k < m; k++) {
        if (k + 16 < m) tier_prefetch(t, hb[idx[k + 16]]);
        int64_t i = idx[k];
        uint8_t f = o->ra[row][i];
        int32_t s = tier_get_h(t, kb[i], hb[i]);
        if (s < 0) continue;
        if (lru) {
            int32_t g = t->ch[s].grp, gi = t->ch[s].idx;
            lru_rerank(t, s, (int32_t)row, i);
            oc_left(c, g, gi);
        } else if ((f & RA_INSERTED) && !(f & RA_REUSED)) {
            int list = t->ch[s].list;
            arc_unlink(t, s); arc_append(t, s, list);
        } else if (f & RA_REUSED) {
            arc_unlink(t, s); arc_append(t, s, 2);
        }
    }
    free(o->ra[row]); o->ra[row] = NULL; o->ra_cap[row] = 0;
    if (lru && o->rank[row]) grp_retire(t, (int32_t)row);
}

/* No load in flight among the requests holding blocks (kv_holding_waiting, including those
 * skipped this step); the head of kv_holding_waiting is the one being admitted. */
static int oc_loads_done(const Core *c, int from_kvh) {
    const Oc *o = &c->oc;
    int64_t cap = c->q.n + 1;
    for (int64_t i = from_kvh ? 1 : 0; i < o->kvh_len; i++) {
        int32_t r = kvh_at(o, i, cap);
        if (o->loading[r] && !o->recv_done[r]) return 0;
    }
    for (int64_t k = 0; k < o->nskip_k; k++) {
        int32_t r = o->skip_k[k];
        if (o->loading[r] && !o->recv_done[r]) return 0;
    }
    return 1;
}

/* A request rejected while holding its loaded blocks (it never runs; no recency commit). */
static void oc_dropped(Core *c, int64_t row) {
    Oc *o = &c->oc;
    free(o->ra[row]); o->ra[row] = NULL; o->ra_cap[row] = 0;
    if (o->policy == POL_LRU && o->rank[row]) grp_retire(&o->tier, (int32_t)row);
}

static void oc_flush_row(Oc *o, int64_t row, int only_stores) {
    for (int64_t k = 0; k < o->live.n; k++) {
        Job *j = &o->jobs[o->live.d[k]];
        if (j->row == row && (j->store || !only_stores)) j->flush = 1;
    }
}

/* build_connector_meta, after the scheduler's phases: flushes (F9: a preempted row's stores in
 * flight; a finished row's store whose source block was reallocated in this batch), stores for
 * every scheduled row then every row finished since the last step (trace order: vLLM iterates a
 * set here, oracle F13), then the finished rows' recency. */
static int oc_meta(Core *c) {
    Oc *o = &c->oc;
    for (int64_t k = 0; k < c->npre; k++) oc_flush_row(o, c->pre_rows[k], 0);
    for (int64_t k = 0; k < o->live.n; k++) {
        Job *j = &o->jobs[o->live.d[k]];
        if (!j->store || j->flush || !oc_gone(c, j->row)) continue;
        for (int64_t b = 0; b < j->nblocks && !j->flush; b++)
            j->flush = o->alloc_stamp[j->blocks[b]] == o->astamp;
    }
    for (int64_t k = 0; k < c->ns; k++) {
        int64_t r = c->s_rows[k];
        /* Prompt only: nothing left once the offers reach the prompt's last full chunk (every
         * decode step of every running row, the common case: no call, no divisions). */
        if (o->prompt_only && (o->next_stored[r] + 1) * o->tpc > c->q.prompt[r]) continue;
        if (oc_plan_store(c, r, c->q.num_computed[r] + c->s_new[k])) return -1;
    }
    /* Rows finished in the last update(), in trace order. */
    int32_t *fr = o->fin_rows;
    for (int64_t a = 1; a < o->nfin_rows; a++) {
        int32_t x = fr[a]; int64_t b = a - 1;
        while (b >= 0 && fr[b] > x) { fr[b + 1] = fr[b]; b--; }
        fr[b + 1] = x;
    }
    for (int64_t k = 0; k < o->nfin_rows; k++)
        if (oc_plan_store(c, fr[k], 0)) return -1;
    for (int64_t k = 0; k < o->nfin_rows; k++) {
        int64_t r = fr[k];
        oc_request_finished(c, r);
        o->fin_wait[r] = 0;
        /* (An aborted row whose frees are deferred keeps its table until they are done.) */
        if (!o->njobs[r] && !c->held[r]) { free(c->tbl[r]); c->tbl[r] = NULL; c->tcap[r] = 0; }
    }
    o->nfin_rows = 0;
    /* The rows whose jobs are flushed, in row order. */
    o->nflushed = 0;
    for (int64_t k = 0; k < o->live.n; k++) {
        Job *j = &o->jobs[o->live.d[k]];
        if (!j->flush) continue;
        int seen = 0;
        for (int64_t m = 0; m < o->nflushed; m++) seen |= o->flushed[m] == j->row;
        if (!seen) o->flushed[o->nflushed++] = j->row;
    }
    for (int64_t a = 1; a < o->nflushed; a++) {
        int32_t x = o->flushed[a]; int64_t b = a - 1;
        while (b >= 0 && o->flushed[b] > x) { o->flushed[b + 1] = o->flushed[b]; b--; }
        o->flushed[b + 1] = x;
    }
    return o->tier.oom ? -1 : 0;
}

static int oc_job_done(Core *c, int64_t ji) {
    Oc *o = &c->oc;
    Job *j = &o->jobs[ji];
    if (o->ndone == o->done_cap) {
        int64_t nc = o->done_cap ? o->done_cap * 2 : 64;
        int32_t *a = (int32_t *)realloc(o->done_rows, (size_t)nc * sizeof(int32_t));
        if (a) o->done_rows = a;
        int8_t *b = (int8_t *)realloc(o->done_store, (size_t)nc);
        if (b) o->done_store = b;
        if (!a || !b) return -1;
        o->done_cap = nc;
    }
    for (int64_t k = 0; k < j->nslots; k++) {
        if (j->store && o->tier.ch[j->slots[k]].ref >= 0) continue;   /* complete_store */
        tier_unpin(&o->tier, j->slots[k]);
    }
    if (!j->store) o->recv_done[j->row] = 1;                          /* finished_recving */
    if (--o->njobs[j->row] == 0 && c->q.status[j->row] == ST_FINISHED && !o->fin_wait[j->row]) {
        free(c->tbl[j->row]); c->tbl[j->row] = NULL; c->tcap[j->row] = 0;
    }
    o->done_rows[o->ndone] = j->row;
    o->done_store[o->ndone++] = j->store;
    if (joblist_push(&o->free_jobs, ji)) return -1;
    for (int64_t k = 0; k < o->live.n; k++)
        if (o->live.d[k] == ji) {
            memmove(o->live.d + k, o->live.d + k + 1, (size_t)(o->live.n - k - 1) * sizeof(int64_t));
            o->live.n--;
            break;
        }
    return 0;
}

/* Submit a job to its direction's FIFO: in steps, done from step + T - 1 on (the oracle's
 * StepTransferEngine); in time, when its bytes have crossed the host link after the jobs queued
 * before it. */
static void oc_submit(Oc *o, Job *j, double *link_free_s) {
    j->submitted = 1;
    j->done_at = o->step + o->tsteps - 1;
    double start = *link_free_s > o->now_s ? *link_free_s : o->now_s;
    double bytes = (double)j->nblocks * (double)o->block_bytes;
    j->done_s = o->link_bps > 0 ? start + bytes / o->link_bps : start;
    *link_free_s = j->done_s;
}

/* When the next transfer in flight completes (time mode; a step-mode transfer has no time:
 * infinity), NAN when none is in a FIFO: the loop jumps there when it is idle. */
static double oc_next_done_s(const Oc *o) {
    double next = NAN;
    const JobList *fifos[2] = {&o->store_fifo, &o->load_fifo};
    for (int f = 0; f < 2; f++) {
        if (!fifos[f]->n) continue;
        double d = o->tsteps ? INFINITY : o->jobs[fifos[f]->d[0]].done_s;
        if (isnan(next) || d < next) next = d;
    }
    return next;
}

/* The worker side of one step (offloading/worker.py over the oracle's StepTransferEngine):
 * last step's stores and this step's flushed ones are submitted, flushed jobs finish now with
 * those queued before them, this step's loads are submitted, its other stores wait for the
 * next step; then each FIFO reports its finished head jobs, stores first. */
static int oc_worker(Core *c) {
    Oc *o = &c->oc;
    int64_t s = o->step, T = o->tsteps;
    o->ndone = 0;
    /* Async scheduling: the output applied now is the previous step's (its worker results). */
    if (c->async_sched) {
        for (int64_t k = 0; k < o->reported.n; k++)
            if (oc_job_done(c, o->reported.d[k])) return -1;
        o->reported.n = 0;
    }
    int any_flush = 0;
    for (int64_t k = 0; k < o->step_stores.n; k++) {
        Job *j = &o->jobs[o->step_stores.d[k]];
        if (j->flush && joblist_push(&o->unsubmitted, o->step_stores.d[k])) return -1;
    }
    for (int64_t k = 0; k < o->unsubmitted.n; k++) {
        oc_submit(o, &o->jobs[o->unsubmitted.d[k]], &o->store_free_s);
        if (joblist_push(&o->store_fifo, o->unsubmitted.d[k])) return -1;
    }
    o->unsubmitted.n = 0;
    for (int64_t k = 0; k < o->live.n; k++) any_flush |= o->jobs[o->live.d[k]].flush;
    if (any_flush) {
        JobList *fifos[2] = {&o->store_fifo, &o->load_fifo};
        for (int f = 0; f < 2; f++) {
            int64_t last = -1;
            for (int64_t k = 0; k < fifos[f]->n; k++)
                if (o->jobs[fifos[f]->d[k]].flush) last = k;
            for (int64_t k = 0; k <= last; k++) {
                Job *j = &o->jobs[fifos[f]->d[k]];
                if (j->done_at > s) j->done_at = s;
                if (j->done_s > o->now_s) j->done_s = o->now_s;
            }
        }
        for (int64_t k = 0; k < o->live.n; k++) o->jobs[o->live.d[k]].flush = 0;
    }
    for (int64_t k = 0; k < o->step_loads.n; k++) {
        oc_submit(o, &o->jobs[o->step_loads.d[k]], &o->load_free_s);
        if (joblist_push(&o->load_fifo, o->step_loads.d[k])) return -1;
    }
    for (int64_t k = 0; k < o->step_stores.n; k++) {
        Job *j = &o->jobs[o->step_stores.d[k]];
        if (!j->submitted && joblist_push(&o->unsubmitted, o->step_stores.d[k])) return -1;
    }
    o->step_loads_n = o->step_loads.n; o->step_stores_n = o->step_stores.n;
    o->step_loads.n = o->step_stores.n = 0;
    JobList *fifos[2] = {&o->store_fifo, &o->load_fifo};
    for (int f = 0; f < 2; f++) {
        int64_t k = 0;
        while (k < fifos[f]->n && (T ? o->jobs[fifos[f]->d[k]].done_at <= s
                                     : o->jobs[fifos[f]->d[k]].done_s <= o->end_s))
            if (joblist_push(&o->reported, fifos[f]->d[k++])) return -1;
        memmove(fifos[f]->d, fifos[f]->d + k, (size_t)(fifos[f]->n - k) * sizeof(int64_t));
        fifos[f]->n -= k;
    }
    if (!c->async_sched) {
        for (int64_t k = 0; k < o->reported.n; k++)
            if (oc_job_done(c, o->reported.d[k])) return -1;
        o->reported.n = 0;
    }
    return o->tier.oom ? -1 : 0;
}

static void oc_begin_step(Oc *o, double now_s) {
    o->step++;
    o->now_s = now_s;
    o->astamp++;
    o->nlk = o->nhit = o->evicted.n = o->nfailed = o->nflushed = 0;
    o->store_blocks = o->load_blocks = 0;
}

static void oc_free(Oc *o, int64_t n) {
    if (!o->on) return;
    tier_free(&o->tier);
    if (o->ra) for (int64_t r = 0; r < n; r++) free(o->ra[r]);
    for (int64_t k = 0; o->jobs && k < o->njobs_all; k++) { free(o->jobs[k].slots); free(o->jobs[k].blocks); }
    void *ps[] = {o->ra, o->ra_cap, o->rank, o->next_stored, o->local_tok, o->fin_blocks, o->njobs,
                  o->loading, o->recv_done, o->fin_wait, o->kvh, o->skip_w, o->skip_k,
                  o->fin_rows, o->alloc_stamp, o->jobs, o->store_fifo.d, o->load_fifo.d,
                  o->unsubmitted.d, o->reported.d, o->free_jobs.d, o->step_loads.d, o->step_stores.d, o->live.d, o->lk_rows,
                  o->lk_tok, o->hit_rows, o->hit_g, o->hit_c, o->evicted.d, o->failed, o->flushed,
                  o->done_rows, o->done_store, o->scratch, o->ekeys, o->last_seq, o->kbuf, o->sbuf, o->hbuf,
                  o->keep, o->cnode, o->infl, o->infl_pos};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
}

/* ------------------------------------------------------------------ Python views */
/* A job as StepPlan's OffloadTransfer: (row, tokens, GPU blocks, chunk indices, keys). */
static PyObject *oc_job_tuple(const Core *c, const Job *j) {
    const Oc *o = &c->oc;
    PyObject *blocks = list_i32(j->blocks, j->nblocks), *idx = PyList_New(j->nslots),
             *keys = PyList_New(j->nslots);
    if (!blocks || !idx || !keys) goto fail;
    /* The chunks in the row's order: chunk i's key is the row's key i. */
    int64_t first = -1;
    for (int64_t k = 0; k < j->nslots; k++) {
        int64_t key = tier_key(&o->tier, j->slots[k]);
        if (first < 0) {
            for (int64_t i = 0; ; i++) if (oc_key(c, j->row, i) == key) { first = i; break; }
        }
        int64_t i = first;
        while (oc_key(c, j->row, i) != key) i++;
        first = i + 1;
        PyList_SET_ITEM(idx, k, PyLong_FromLongLong(i));
        PyList_SET_ITEM(keys, k, PyLong_FromLongLong(key));
    }
    return Py_BuildValue("(iLNNN)", j->row, (long long)(j->nslots * o->tpc), blocks, idx, keys);
fail:
    Py_XDECREF(blocks); Py_XDECREF(idx); Py_XDECREF(keys);
    return NULL;
}

static PyObject *oc_jobs_list(const Core *c, const JobList *l) {
    PyObject *out = PyList_New(l->n);
    for (int64_t k = 0; out && k < l->n; k++) {
        PyObject *t = oc_job_tuple(c, &c->oc.jobs[l->d[k]]);
        if (!t) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, k, t);
    }
    return out;
}

/* The step's connector decisions for core_schedule (StepPlan.offload_*). */
static PyObject *oc_plan_dict(const Core *c) {
    const Oc *o = &c->oc;
    PyObject *lk = PyList_New(o->nlk), *hits = PyList_New(o->nhit);
    if (!lk || !hits) { Py_XDECREF(lk); Py_XDECREF(hits); return NULL; }
    for (int64_t k = 0; k < o->nlk; k++)
        PyList_SET_ITEM(lk, k, o->lk_tok[k] < 0 ? Py_BuildValue("(iO)", o->lk_rows[k], Py_None)
                                               : Py_BuildValue("(iL)", o->lk_rows[k], (long long)o->lk_tok[k]));
    for (int64_t k = 0; k < o->nhit; k++)
        PyList_SET_ITEM(hits, k, Py_BuildValue("(iLL)", o->hit_rows[k], (long long)o->hit_g[k],
                                               (long long)o->hit_c[k]));
    PyObject *ev = PyList_New(o->evicted.n);
    for (int64_t k = 0; ev && k < o->evicted.n; k++)
        PyList_SET_ITEM(ev, k, PyLong_FromLongLong(o->evicted.d[k]));
    return Py_BuildValue("{sNsNsNsNsNsNsN}", "lookups", lk, "hits", hits,
                         "loads", oc_jobs_list(c, &o->step_loads),
                         "stores", oc_jobs_list(c, &o->step_stores), "evicted", ev,
                         "failed", list_i32(o->failed, o->nfailed),
                         "flushed", list_i32(o->flushed, o->nflushed));
}

/* The tier for snapshot(): rows waiting for their load, chunks being stored, and the policy's
 * order (LRU: evictable chunks, next victim first; ARC: T1, T2 least recently used first). */
static PyObject *oc_snapshot(const Core *c) {
    const Oc *o = &c->oc;
    const Tier *t = &o->tier;
    PyObject *wfk = PyList_New(0);
    int64_t cap = c->q.n + 1;
    for (int64_t i = 0; wfk && i < o->kvh_len; i++) {
        int32_t r = kvh_at(o, i, cap);
        if (o->loading[r]) {
            PyObject *x = PyLong_FromLong(r);
            if (!x || PyList_Append(wfk, x) < 0) { Py_XDECREF(x); Py_DECREF(wfk); return NULL; }
            Py_DECREF(x);
        }
    }
    if (!wfk) return NULL;
    PyObject *order;
    if (o->policy == POL_LRU) {
        order = PyList_New(0);
        for (int32_t g = t->grp[t->ng].next; order && g != t->ng; g = t->grp[g].next)
            for (int32_t i = t->grp[g].top - 1, s; i >= 0; i--) {
                if ((s = t->grp[g].at[i]) < 0 || t->ch[s].list != 1) continue;
                PyObject *x = PyLong_FromLongLong(tier_key(t, s));
                if (!x || PyList_Append(order, x) < 0) { Py_XDECREF(x); Py_CLEAR(order); break; }
                Py_DECREF(x);
            }
    } else {
        PyObject *t1 = PyList_New(0), *t2 = PyList_New(0);
        for (int list = 1; list <= 2; list++) {
            int32_t head = (int32_t)t->n + (list - 1);
            for (int32_t s = t->ch[head].next; s != head; s = t->ch[s].next) {
                PyObject *x = PyLong_FromLongLong(tier_key(t, s));
                PyList_Append(list == 1 ? t1 : t2, x);
                Py_XDECREF(x);
            }
        }
        order = Py_BuildValue("{sNsNsLsLsd}", "t1", t1, "t2", t2, "b1", (long long)t->b1_len,
                              "b2", (long long)t->b2_len, "target_t1", t->target_t1);
    }
    if (!order) { Py_DECREF(wfk); return NULL; }
    return Py_BuildValue("{sNsLsLsN}", "waiting_for_kv", wfk, "cpu_pending",
                         (long long)t->num_pending, "free_cpu", (long long)tier_free_chunks(t),
                         o->policy == POL_LRU ? "cpu_lru" : "cpu_arc", order);
}
