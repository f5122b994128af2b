/* The CPU tier of vLLM 0.33's OffloadingConnector for the compiled V1 core (included once, by
 * replay/v1/_core.c, after its key -> slot map): the chunk pool with its ref counts
 * (v1/kv_offload/cpu/manager.py: -1 while a store is in flight, 0 ready and evictable, > 0 pinned
 * by loads), the LRU and ARC policies (cpu/policies/lru.py, arc.py) and the per-request cache
 * access record the policies rank by (manager.py `_RequestCacheAccess`). Oracle README section 7
 * (F6-F8, F15) says what they do; the Python reference is replay/v1/offload.py.
 *
 * A request only ever offers or loads its own chunks, at known positions (chunk i ends at token
 * (i + 1) * tokens_per_chunk), so a request's record is one flag byte per chunk index, and its
 * keys are recomputed from the block keys (key_of) instead of being stored.
 */

/* Per request, per chunk index (RequestAccess.flags). */
enum { RA_SEEN = 1, RA_INSERTED = 2, RA_REUSED = 4, RA_STORE_MISS = 8 };
enum { POL_LRU = 0, POL_ARC = 1 };
static const char *const EVICTION_NAMES[] = {"lru", "arc", NULL};

typedef struct {
    int32_t ref;                 /* -1 store in flight, 0 ready, > 0 loads in flight */
    int8_t list;                 /* ARC: 1 T1, 2 T2 (0: slot free) */
    int32_t prev, next;          /* ARC list links */
    int64_t rank_hi, rank_lo;    /* LRU: (rank, -position), evicted smallest first */
    int32_t hpos;                /* LRU: index in the evictable heap, -1 when not in it */
    uint32_t stamp;              /* protected by the store being prepared (== Tier.stamp) */
    uint32_t stamp2;             /* LRU heap compaction: already kept */
} Chunk;

typedef struct { int64_t hi, lo; int32_t s; } HeapEnt;

typedef struct { int64_t key; int32_t prev, next; int8_t list; } Ghost;

typedef struct {
    int64_t n;                   /* capacity in chunks */
    int policy;
    Chunk *ch;                   /* n slots + 2 list sentinels (n: T1 / LRU list, n + 1: T2) */
    int64_t *keys;               /* per slot (apart from Chunk: the map probes stay compact) */
    map_t map;                   /* key -> slot */
    int32_t *free_slots; int64_t nfree_list, next_fresh;
    int64_t num_evictable, num_pending;
    uint32_t stamp;
    /* LRU: min-heap of evictable slots by (rank_hi, rank_lo). */
    HeapEnt *heap; int64_t nheap, nlive;   /* capacity 2n + 130 (compacted before it fills) */
    uint32_t stamp2;
    int64_t next_rank;
    /* ARC. */
    int64_t t1_len, t2_len, b1_len, b2_len;
    double target_t1;
    Ghost *gh;                   /* 3n + 2 nodes; sentinels 3n (B1) and 3n + 1 (B2) */
    map_t gmap;
    int32_t *gfree; int64_t ngfree;
} Tier;

/* ------------------------------------------------------------------ LRU heap */
/* A lazy min-heap of (rank, slot) entries, as lru.py's: removing a chunk only clears its flag
 * (Chunk.hpos: 1 in the heap, 2 picked by the eviction in progress, -1 not), and an entry counts
 * only while its slot is flagged and still has the entry's rank; the heap is rebuilt when stale
 * entries outnumber live ones. */
static inline int ent_less(const HeapEnt *a, const HeapEnt *b) {
    return a->hi != b->hi ? a->hi < b->hi : a->lo < b->lo;
}
static inline int ent_live(const Tier *t, const HeapEnt *e);
static void lheap_up(Tier *t, int64_t i) {
    HeapEnt x = t->heap[i];
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!ent_less(&x, &t->heap[p])) break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = x;
}
static void lheap_down(Tier *t, int64_t i) {
    HeapEnt x = t->heap[i];
    for (;;) {
        int64_t l = 2 * i + 1, m;
        if (l >= t->nheap) break;
        m = (l + 1 < t->nheap && ent_less(&t->heap[l + 1], &t->heap[l])) ? l + 1 : l;
        if (!ent_less(&t->heap[m], &x)) break;
        t->heap[i] = t->heap[m];
        i = m;
    }
    t->heap[i] = x;
}
static void lheap_compact(Tier *t) {
    int64_t w = 0;
    for (int64_t i = 0; i < t->nheap; i++) {
        HeapEnt *e = &t->heap[i];
        if (!ent_live(t, e) || t->ch[e->s].stamp2 == t->stamp2) continue;
        t->ch[e->s].stamp2 = t->stamp2;           /* one entry per chunk */
        t->heap[w++] = *e;
    }
    t->stamp2++;
    t->nheap = w;
    for (int64_t i = w / 2 - 1; i >= 0; i--) lheap_down(t, i);
}
static void lheap_push_ent(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    t->heap[t->nheap] = (HeapEnt){c->rank_hi, c->rank_lo, s};
    lheap_up(t, t->nheap++);
}
static void lheap_push(Tier *t, int32_t s) {
    t->ch[s].hpos = 1;
    t->nlive++;
    lheap_push_ent(t, s);
    if (t->nheap > 2 * t->nlive + 64) lheap_compact(t);
}
static inline void lheap_remove(Tier *t, int32_t s) { t->ch[s].hpos = -1; t->nlive--; }
static inline int ent_live(const Tier *t, const HeapEnt *e) {
    const Chunk *c = &t->ch[e->s];
    return c->hpos == 1 && c->rank_hi == e->hi && c->rank_lo == e->lo;
}
/* The live top entry (stale ones popped), or NULL. */
static HeapEnt *lheap_top(Tier *t) {
    while (t->nheap && !ent_live(t, &t->heap[0])) {
        t->heap[0] = t->heap[--t->nheap];
        if (t->nheap) lheap_down(t, 0);
    }
    return t->nheap ? &t->heap[0] : NULL;
}
static void lheap_pop(Tier *t) {
    t->heap[0] = t->heap[--t->nheap];
    if (t->nheap) lheap_down(t, 0);
}
/* The evictable chunks in rank order are the union of the heap and an ordered list: a fresh
 * rank (a finished request's recency, the common case) is larger than every rank so far, so its
 * chunk is appended to the list in O(1) instead of sifting through the heap; any other rank goes
 * to the heap. Eviction merges the two (lru.py's heap order, ranks are distinct). The list's
 * sentinel is slot n; Chunk.list == 3 marks list members. */
static inline int lru_rank_less(const Chunk *x, int64_t hi, int64_t lo) {
    return x->rank_hi != hi ? x->rank_hi < hi : x->rank_lo < lo;
}
static void lru_add(Tier *t, int32_t s) {
    int32_t head = (int32_t)t->n, tail = t->ch[head].prev;
    Chunk *c = &t->ch[s];
    if (tail == head || lru_rank_less(&t->ch[tail], c->rank_hi, c->rank_lo)) {
        t->ch[tail].next = s; c->prev = tail; c->next = head; t->ch[head].prev = s;
        c->list = 3;
    } else {
        lheap_push(t, s);
    }
}
static void lru_del(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    if (c->list == 3) {
        t->ch[c->prev].next = c->next; t->ch[c->next].prev = c->prev;
        c->list = 0;
    } else if (c->hpos == 1) {
        lheap_remove(t, s);
    }
}
/* A chunk's rank changed: re-place it when it is evictable. */
static inline void lru_moved(Tier *t, int32_t s) {
    if (t->ch[s].list != 3 && t->ch[s].hpos != 1) return;
    lru_del(t, s);
    lru_add(t, s);
}

/* ------------------------------------------------------------------ ARC lists */
static inline void arc_unlink(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    t->ch[c->prev].next = c->next; t->ch[c->next].prev = c->prev;
    if (c->list == 1) t->t1_len--; else t->t2_len--;
    c->list = 0;
}
static inline void arc_append(Tier *t, int32_t s, int list) {
    int32_t head = (int32_t)t->n + (list - 1), p = t->ch[head].prev;
    t->ch[p].next = s; t->ch[s].prev = p; t->ch[s].next = head; t->ch[head].prev = s;
    t->ch[s].list = (int8_t)list;
    if (list == 1) t->t1_len++; else t->t2_len++;
}
static inline void ghost_unlink(Tier *t, int32_t g) {
    Ghost *x = &t->gh[g];
    t->gh[x->prev].next = x->next; t->gh[x->next].prev = x->prev;
    if (x->list == 1) t->b1_len--; else t->b2_len--;
}
static inline void ghost_append(Tier *t, int32_t g, int list) {
    int32_t head = (int32_t)(3 * t->n) + (list - 1), p = t->gh[head].prev;
    t->gh[p].next = g; t->gh[g].prev = p; t->gh[g].next = head; t->gh[head].prev = g;
    t->gh[g].list = (int8_t)list;
    if (list == 1) t->b1_len++; else t->b2_len++;
}
/* Drop a ghost entry (its node back to the pool). */
static void ghost_drop(Tier *t, int32_t g) {
    ghost_unlink(t, g);
    map_del_at(&t->gmap, map_find(&t->gmap, t->gh[g].key));
    t->gfree[t->ngfree++] = g;
}
static void ghost_add(Tier *t, int64_t key, int list) {
    int32_t g = t->gfree[--t->ngfree];
    t->gh[g].key = key;
    t->gmap.slots[map_find(&t->gmap, key)] = g;
    ghost_append(t, g, list);
}

/* ------------------------------------------------------------------ the tier */
static int tier_init(Tier *t, int64_t n, int policy) {
    memset(t, 0, sizeof *t);
    t->n = n;
    t->policy = policy;
    t->ch = (Chunk *)calloc((size_t)n + 2, sizeof(Chunk));
    t->free_slots = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
    t->heap = (HeapEnt *)malloc((2 * (size_t)n + 130) * sizeof(HeapEnt));
    t->stamp2 = 1;
    t->gh = (Ghost *)calloc(3 * (size_t)n + 2, sizeof(Ghost));
    t->gfree = (int32_t *)malloc((3 * (size_t)n + 1) * sizeof(int32_t));
    if (!t->ch || !t->free_slots || !t->heap || !t->gh || !t->gfree) return -1;
    t->keys = (int64_t *)calloc((size_t)n + 2, sizeof(int64_t));
    if (!t->keys || map_init(&t->map, n, t->keys, sizeof(int64_t)) < 0) return -1;
    if (map_init(&t->gmap, 3 * n, &t->gh[0].key, sizeof(Ghost)) < 0) return -1;
    for (int64_t s = 0; s < n + 2; s++) t->ch[s].hpos = -1;
    for (int i = 0; i < 2; i++) {
        int32_t h = (int32_t)n + i, g = (int32_t)(3 * n) + i;
        t->ch[h].prev = t->ch[h].next = h;
        t->gh[g].prev = t->gh[g].next = g;
    }
    for (int64_t g = 3 * n - 1; g >= 0; g--) t->gfree[t->ngfree++] = (int32_t)g;
    return 0;
}

static void tier_free(Tier *t) {
    free(t->ch); free(t->keys); free(t->map.slots); free(t->free_slots); free(t->heap); free(t->gh);
    free(t->gmap.slots); free(t->gfree);
}

static inline int32_t tier_get(const Tier *t, int64_t key) {
    return t->n ? map_get(&t->map, key) : -1;
}
static inline int64_t tier_used(const Tier *t) { return t->next_fresh - t->nfree_list; }
static inline int64_t tier_free_chunks(const Tier *t) { return t->n - tier_used(t); }

/* The chunk leaves the tier (evicted): its slot goes back to the pool. */
static void tier_drop(Tier *t, int32_t s) {
    map_del_at(&t->map, map_find(&t->map, t->keys[s]));
    if (t->policy == POL_LRU) lru_del(t, s);
    else if (t->ch[s].list) arc_unlink(t, s);
    t->ch[s].ref = 0;
    t->free_slots[t->nfree_list++] = s;
}

/* prepare_load: pin the chunk (a load reads it). */
static void tier_pin(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    if (c->ref == 0) {
        if (t->policy == POL_LRU) lru_del(t, s);
        t->num_evictable--;
    }
    c->ref++;
}
/* complete_load / complete_store: the chunk becomes evictable at ref 0. */
static void tier_unpin(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    if (c->ref < 0) { c->ref = 0; t->num_pending--; }
    else if (--c->ref > 0) return;
    t->num_evictable++;
    if (t->policy == POL_LRU) lru_add(t, s);
}

/* ARC: a miss that is a ghost hit adapts target_t1 (arc.py _adapt_to_ghost_hit). */
static void arc_ghost_hit(Tier *t, int64_t key) {
    int32_t g = map_get(&t->gmap, key);
    if (g < 0) return;
    if (t->gh[g].list == 1) {
        double delta = (double)t->b2_len / (double)t->b1_len;
        if (delta < 1) delta = 1;
        t->target_t1 = t->target_t1 + delta < (double)t->n ? t->target_t1 + delta : (double)t->n;
    } else {
        double delta = (double)t->b1_len / (double)t->b2_len;
        if (delta < 1) delta = 1;
        t->target_t1 = t->target_t1 - delta > 0 ? t->target_t1 - delta : 0;
    }
    int list = t->gh[g].list;
    ghost_unlink(t, g);
    ghost_append(t, g, list);
}

/* A new chunk (its store just prepared, ref -1), ranked for the storing request (LRU) or in
 * T1 (ARC, leaving the ghost lists). */
static int32_t tier_insert(Tier *t, int64_t key, int64_t request_rank, int64_t position) {
    int32_t s = t->nfree_list ? t->free_slots[--t->nfree_list] : (int32_t)t->next_fresh++;
    Chunk *c = &t->ch[s];
    t->keys[s] = key; c->ref = -1; c->hpos = -1; c->stamp = 0;
    t->map.slots[map_find(&t->map, key)] = s;
    t->num_pending++;
    if (t->policy == POL_LRU) {
        c->rank_hi = request_rank; c->rank_lo = -position;
    } else {
        arc_append(t, s, 1);
        int32_t g = map_get(&t->gmap, key);
        if (g >= 0) ghost_drop(t, g);
    }
    return s;
}

/* Evict n ready, unpinned chunks not stamped with t->stamp (the store's own offer); their keys
 * go to keys[] in eviction order (out[]: scratch of 3 * capacity + 3). 0, or -1 when n cannot be
 * found (nothing changed). */
static int tier_evict(Tier *t, int64_t n, int32_t *out, int64_t *keys) {
    if (n == 0) return 0;
    if (t->policy == POL_LRU) {
        /* lru.py evict: smallest ranks first (the heap and the list merged), protected ones
         * skipped (and kept). */
        int64_t got = 0, nd = 0;
        int32_t *deferred = out + n;          /* caller sized out[] for n + num_evictable */
        int32_t head = (int32_t)t->n, cur = t->ch[head].next;
        int8_t *from_heap = (int8_t *)(deferred + t->num_evictable + 1);
        HeapEnt *top;
        while (got < n && ((top = lheap_top(t)) || cur != head)) {
            int use_heap = top && (cur == head || lru_rank_less(&t->ch[top->s], t->ch[cur].rank_hi,
                                                                t->ch[cur].rank_lo));
            int32_t s;
            if (use_heap) { s = top->s; lheap_pop(t); t->ch[s].hpos = 2; }
            else { s = cur; cur = t->ch[cur].next; }
            if (t->ch[s].stamp == t->stamp) { if (use_heap) deferred[nd++] = s; continue; }
            from_heap[got] = (int8_t)use_heap;
            out[got++] = s;
        }
        for (int64_t i = 0; i < nd; i++) { t->ch[deferred[i]].hpos = 1; lheap_push_ent(t, deferred[i]); }
        if (got < n) {
            for (int64_t i = 0; i < got; i++)
                if (from_heap[i]) { t->ch[out[i]].hpos = 1; lheap_push_ent(t, out[i]); }
            return -1;
        }
        for (int64_t i = 0; i < got; i++) if (from_heap[i]) { t->ch[out[i]].hpos = 1; }
        for (int64_t i = 0; i < got; i++) {
            keys[i] = t->keys[out[i]];
            t->num_evictable--;
            tier_drop(t, out[i]);
        }
        return 0;
    }
    /* arc.py evict: from T1 while its (virtual) size is at least int(target_t1), else T2,
     * else T1 again; both lists scanned by cursors that never rewind. */
    int32_t h1 = (int32_t)t->n, h2 = h1 + 1, c1 = t->ch[h1].next, c2 = t->ch[h2].next;
    int64_t vt1 = t->t1_len, got = 0;
    int8_t *from_t1 = (int8_t *)(out + n);
    int64_t target = (int64_t)t->target_t1;
#define ARC_NEXT(cur, head, found)                                                     \
    do {                                                                               \
        found = -1;                                                                    \
        while (cur != head) {                                                          \
            int32_t s_ = cur; cur = t->ch[cur].next;                                   \
            if (t->ch[s_].ref == 0 && t->ch[s_].stamp != t->stamp) { found = s_; break; } \
        }                                                                              \
    } while (0)
    for (int64_t k = 0; k < n; k++) {
        int32_t s = -1;
        if (vt1 >= target) {
            ARC_NEXT(c1, h1, s);
            if (s >= 0) { from_t1[got] = 1; vt1--; }
        }
        if (s < 0) { ARC_NEXT(c2, h2, s); if (s >= 0) from_t1[got] = 0; }
        if (s < 0) {
            ARC_NEXT(c1, h1, s);
            if (s < 0) return -1;
            from_t1[got] = 1; vt1--;
        }
        out[got++] = s;
    }
#undef ARC_NEXT
    for (int64_t k = 0; k < got; k++) {
        int64_t key = keys[k] = t->keys[out[k]];
        int list = from_t1[k] ? 1 : 2;
        t->num_evictable--;
        tier_drop(t, out[k]);
        ghost_add(t, key, list);
    }
    for (int list = 1; list <= 2; list++) {
        int32_t head = (int32_t)(3 * t->n) + (list - 1);
        while ((list == 1 ? t->b1_len : t->b2_len) > t->n) ghost_drop(t, t->gh[head].next);
    }
    return 0;
}

/* ------------------------------------------------------------------ connector state */
/* One transfer job (offloading/scheduler.py TransferJob + the emulated worker's FIFO entry). */
typedef struct {
    int64_t id;
    int32_t row;
    int8_t store, flush, submitted;
    int64_t done_at;             /* step mode: the step whose output reports it */
    double done_s;               /* time mode: when its bytes have crossed the host link */
    int32_t *slots; int64_t nslots;      /* tier chunks it writes (store) or reads (load) */
    int32_t *blocks; int64_t nblocks;    /* GPU blocks it reads (store) or writes (load) */
} Job;

/* A growable list of int64 (job indices: FIFOs, unsubmitted stores, this step's jobs; keys). */
typedef struct { int64_t *d; int64_t n, cap; } JobList;

typedef struct {
    int on, prompt_only, policy;
    int64_t bpc, tpc, tsteps;    /* blocks / tokens per chunk; transfer steps (0: in time) */
    double link_bps;             /* time mode: host-link bytes per second */
    int64_t block_bytes;         /* time mode: bytes of one GPU block */
    Tier tier;
    int64_t step;                /* connector steps (schedule() calls) */
    /* Per row. */
    uint8_t **ra; int64_t *ra_cap;       /* access flags per chunk index (RA_*) */
    int64_t *rank;               /* LRU request rank, 0 before the first */
    int64_t *next_stored, *local_tok, *fin_blocks;
    int32_t *njobs;
    uint8_t *loading, *recv_done, *fin_wait;   /* WAITING_FOR_REMOTE_KVS; load done; finished,
                                                  not yet seen by the connector */
    int32_t *kvh; int64_t kvh_head, kvh_len;   /* kv_holding_waiting (FIFO ring) */
    int32_t *skip_w, *skip_k; int64_t nskip_w, nskip_k;
    int32_t *fin_rows; int64_t nfin_rows;      /* finished since the last schedule() */
    uint32_t *alloc_stamp; uint32_t astamp;    /* per GPU block: allocated in this batch */
    /* Jobs. */
    Job *jobs; int64_t njobs_all, jobs_cap, next_id;
    JobList store_fifo, load_fifo, unsubmitted, step_loads, step_stores, live;
    JobList reported;            /* done in the worker, not yet applied (async: one step) */
    int64_t step_loads_n, step_stores_n;       /* this step's transfers issued (loop progress) */
    /* This step's decisions (StepPlan.offload_*). */
    int32_t *lk_rows; int64_t *lk_tok; int64_t nlk;
    int32_t *hit_rows; int64_t *hit_g, *hit_c; int64_t nhit;
    JobList evicted;             /* keys evicted for this step's stores (an int64 list) */
    int32_t *failed; int64_t nfailed;
    int32_t *flushed; int64_t nflushed;
    int32_t *done_rows; int8_t *done_store; int64_t ndone, done_cap;
    int32_t *scratch;            /* 4 * capacity + max chunks per request + 8 */
    int64_t *ekeys;              /* evicted keys of one store (capacity) */
    int64_t *kbuf; int32_t *sbuf;        /* one offer's keys and tier slots (chunks / request) */
    int64_t store_blocks, load_blocks;         /* this step's (steps columns) */
    /* Async scheduling (F11): non-empty steps scheduled / whose output was applied; a row's
     * blocks cannot be freed for a preemption while its last step is in flight. */
    int64_t *last_seq; int64_t sched_seq, proc_seq; int inflight_nonempty;
    /* Time mode (tsteps 0): this step's start and end, when each direction's link is free. */
    double now_s, end_s, store_free_s, load_free_s;
    int told_start;              /* StepCore: tell_time gave this step's start (end next) */
} Oc;

static inline int joblist_push(JobList *l, int64_t j) {
    if (l->n == l->cap) {
        int64_t nc = l->cap ? l->cap * 2 : 64;
        int64_t *p = (int64_t *)realloc(l->d, (size_t)nc * sizeof(int64_t));
        if (!p) return -1;
        l->d = p; l->cap = nc;
    }
    l->d[l->n++] = j;
    return 0;
}
