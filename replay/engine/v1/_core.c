/* kvcap's compiled V1 replay core: the V1 scheduler (FCFS or priority; preemption by recompute, or
 * none = queue only), its block pool and prefix cache, the CPU KV offloading connector, the replay
 * loop and the analytic cost model, one engine step at a time.
 *
 * This is a transcription, not a second model: every rule below is the one of the Python reference
 * (replay/engine/v1/scheduler.py, kv_cache_manager.py, block_pool.py, offload.py,
 * replay/engine/loop.py and replay/timing/cost_model.py), in the same order, so the tables come out
 * identical (tests/test_v1_core.py compares them; the oracle and golden scenarios run on both).
 *
 * Python (replay/engine/compiled.py) drives it either to the end in chunks of steps (progress bar,
 * Ctrl-C between chunks: core_new, core_run, core_results) or one step at a time through the
 * reference's contract (core_add, core_abort, core_schedule, core_update, core_snapshot:
 * `StepCore`). core_new reads the resolved spec by field name. Nothing here allocates per step
 * except amortised growth of the output columns.
 */
#include "../kvcore.h"
#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ key -> value maps
 * The block map (key -> block), the CPU tier's (key -> chunk) and ARC's ghosts (key -> node).
 * Open addressing, linear probing, backward-shift deletion. The block and chunk maps are at most
 * a quarter full (four entries per block or chunk: their probe runs stay short; at half full,
 * as before, the misses' probes and the deletions' shifts cost Mooncake's replay a tenth of its
 * time), the ghosts' at most half (ARC's ghost hits are rare; a smaller table). An
 * entry holds the value and 32 bits of its key's hash (its home, and a filter: the key itself is
 * read from the value's record, `kbase + val * kstride`, which the caller touches anyway): a
 * deletion's backward shift finds the homes of the entries it moves in the entries, and a probe
 * reads a record only on a hash match. A record may keep its entry's index (`pbase`, same
 * stride), which a shift keeps up to date. */
typedef struct { uint32_t h; int32_t val; } MEnt;
typedef struct {
    MEnt *e; uint64_t mask; int shift;   /* home(h) = h >> shift: the product's top bits */
    const char *kbase; size_t kstride;
    char *pbase;                         /* NULL, or each record's uint32 entry index */
} map_t;

/* Multiplicative (Fibonacci) hashing: one multiply instead of splitmix's five operations, the
 * home from the product's top bits (the ones every key bit reaches: the keys are structured,
 * chain id << 24 | block or minus row << 24 | block). The maps are never iterated, so their
 * layout is not observable. */
static inline uint32_t key_hash(int64_t key) {
    return (uint32_t)(((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> 32);
}

/* A map of at least min_entries entries (a power of two). */
static int map_init(map_t *m, int64_t min_entries, const void *kbase, size_t kstride, void *pbase) {
    uint64_t cap = 16;
    int bits = 4;
    while (cap < (uint64_t)min_entries) { cap <<= 1; bits++; }
    m->mask = cap - 1;
    m->shift = 32 - bits;
    m->kbase = (const char *)kbase;
    m->kstride = kstride;
    m->pbase = (char *)pbase;
    m->e = (MEnt *)malloc(cap * sizeof(MEnt));
    if (!m->e) return -1;
    for (uint64_t i = 0; i < cap; i++) m->e[i].val = -1;
    return 0;
}

static inline uint64_t map_home(const map_t *m, uint32_t h) { return h >> m->shift; }

static inline int64_t map_key(const map_t *m, int32_t val) {
    return *(const int64_t *)(m->kbase + (size_t)val * m->kstride);
}

/* The entry holding `key` (hash h), or the empty entry where it would go: one probe serves a
 * lookup and the update that follows it. */
static inline uint64_t map_find_h(const map_t *m, int64_t key, uint32_t h) {
    uint64_t i = map_home(m, h);
    int32_t v;
    while ((v = m->e[i].val) >= 0 && (m->e[i].h != h || map_key(m, v) != key)) i = (i + 1) & m->mask;
    return i;
}
static inline uint64_t map_find(const map_t *m, int64_t key) { return map_find_h(m, key, key_hash(key)); }

static inline int32_t map_get(const map_t *m, int64_t key) {
    return m->e[map_find(m, key)].val;
}
/* Entry i (found by map_find) takes value v of hash h. */
static inline void map_set(map_t *m, uint64_t i, uint32_t h, int32_t v) {
    m->e[i].h = h; m->e[i].val = v;
    if (m->pbase) *(uint32_t *)(m->pbase + (size_t)v * m->kstride) = (uint32_t)i;
}
/* Fetch the home entry of hash h ahead of its probe: a pass over many keys overlaps misses. */
static inline void map_prefetch(const map_t *m, uint32_t h) { __builtin_prefetch(&m->e[map_home(m, h)]); }

/* Empty entry i (found by map_find). */
static void map_del_at(map_t *m, uint64_t i) {
    MEnt *e = m->e;
    /* Backward shift: pull later entries of the probe run into the hole. */
    uint64_t j = i;
    for (;;) {
        e[i].val = -1;
        for (;;) {
            j = (j + 1) & m->mask;
            if (e[j].val < 0) return;
            uint64_t home = map_home(m, e[j].h);
            /* Entry j may move to i when its home is not in (i, j] cyclically. */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        e[i] = e[j];
        if (m->pbase) *(uint32_t *)(m->pbase + (size_t)e[i].val * m->kstride) = (uint32_t)i;
        i = j;
    }
}

#include "_offload.h"

/* ------------------------------------------------------------------ the engine */
/* One block's pool state in one cache line: popping or freeing a block touches all of it. */
typedef struct {
    int64_t key;        /* valid while hashed */
    uint32_t fpos;      /* its index in the free queue's ring, while in the queue */
    int32_t ref;
    int32_t dup;        /* next block registered with the same key (-1: none) */
    uint8_t hashed;
    uint32_t h;         /* key_hash(key), valid while hashed */
} Blk;

enum { ST_PENDING = 0, ST_WAITING = 1, ST_RUNNING = 2, ST_SWAPPED = 3, ST_FINISHED = 4,
       ST_REJECTED = 5, ST_ABORTED = 6 };
enum { MODE_RECOMPUTE = 0, MODE_NONE = 1, MODE_SWAP = 2 };   /* MODE_NAMES order; V1 refuses swap */
enum { POLICY_FCFS = 0, POLICY_PRIORITY = 1 };

static const char *const TIES_NAMES[] = {"trace_order", "equal", NULL};   /* arrival_ties */
static const char *const VICTIM_NAMES[] = {"fcfs", "lcf", NULL};           /* preemption_victim */

/* One plain waiting request in the cache-aware window: its slot, row and cached tokens. */
typedef struct { int64_t cached; int32_t slot, row; } CaEnt;

typedef struct {
    Req q;                /* request arrays */
    Keys keys;
    Cost cost;
    Views views;          /* 17 request arrays + 3 key arrays */
    /* Spec. */
    int64_t bs, num_blocks, max_active, max_batched, L, thr_knob, watermark_blocks;
    int chunked, caching, reserve_full_isl, mode, policy, async_sched;
    /* vLLM 0.34 (SchedulerSpec.vllm_version): cache-aware admission (window 0: off; the
     * window in effect, FCFS with prefix caching only) and the in-flight CPU load cap (-1:
     * none). */
    int ties_equal;                                 /* SchedulerSpec.arrival_ties "equal" */
    int lcf;                                        /* preemption_victim "lcf" (a what-if) */
    int64_t ca_window, max_loads;
    double ca_threshold;
    CaEnt *ca; int32_t *ca_slots;                   /* the reorder's scratch (window entries) */
    /* core_schedule's record of the reorder (what the oracle prints as cache_aware): called,
     * the usage it saw, its probes (rows, tokens), the queue before and after. */
    int ca_rec, ca_called; double ca_usage; int64_t ca_nprobe, ca_len;
    int32_t *ca_before, *ca_after, *ca_prow; int64_t *ca_ptok;
    /* Async scheduling (scheduler.py): placeholders per row; rows that sampled in the step in
     * flight (fl) and in this one (fl_next). */
    int64_t *ph; int32_t *fl, *fl_next; int64_t nfl;
    int64_t *in_step;                               /* async caching: a row's tokens this step */
    /* Block pool. */
    Blk *blk;
    int64_t num_free;
    /* The free queue (vLLM's FreeKVCacheBlockQueue, a doubly linked list) as a ring of block ids
     * in queue order, positions fq_head <= p < fq_tail (mod 2^64; index p & fq_mask); a block
     * taken from the middle leaves a hole (-1) that the head skips: popping reads the ring in
     * order, where walking the list's links was one dependent cache miss per block. */
    int32_t *fq, *fq_spare; uint64_t fq_mask, fq_head, fq_tail;   /* spare: fq_compact's */
    map_t map;
    /* Block tables. */
    int32_t **tbl;
    int32_t *tcap;
    int64_t *held, *ncached;
    /* Queues. */
    int32_t *running; int64_t nrun;
    int32_t *wq; int64_t wq_head, wq_len, wq_cap;      /* FCFS: ring buffer; priority: heap */
    int32_t *arrived; int64_t narrived;
    uint8_t *prefilling;
    int64_t *promised; int64_t promised_total;       /* "none" mode */
    Loop lp;
    int32_t *fin; int64_t nfin;                     /* update(): rows finished this step */
    /* Per-step scratch. */
    int32_t *s_rows; int64_t *s_new, *s_before; uint8_t *s_prefill, *s_sampled; int64_t ns;
    int8_t *s_kind;                                 /* BK_NEW / BK_RESUMED / BK_RUNNING */
    int32_t *pre_rows; int64_t *pre_blocks; int64_t npre;
    int8_t *pre_mode; uint8_t *pre_fallback;        /* kvcore.h's Plan: all recompute */
    int32_t *rej_rows; int64_t nrej;
    int32_t *hits; int64_t hits_cap;
    Oc oc;                                          /* CPU KV offloading (_connector.h) */
    /* Client aborts with the connector (scheduler.py abort_request): the tokens the connector
     * offers at the aborted row's finish; aborted rows whose blocks go back after the step in
     * flight (async, F11) or once their CPU load is reported done (C4). */
    int64_t *abort_upto;
    int32_t *free_after_step; int64_t nfree_step;
    uint8_t *free_after_load; int64_t nfree_load;
    Tables out;
} Core;






/* ---------------- free queue (a ring with holes: Core.fq) */
/* The ring holds at least twice the pool: when it is full of entries and holes, the entries
 * (at most the pool) move to its start in order, so a move comes at most once per pool's worth
 * of insertions. */
static void fq_compact(Core *c) {
    uint64_t n = 0;
    int32_t *to = c->fq_spare;
    for (uint64_t i = 0; i <= c->fq_mask; i++) to[i] = -1;
    for (uint64_t p = c->fq_head; p != c->fq_tail; p++) {
        int32_t b = c->fq[p & c->fq_mask];
        if (b >= 0) { to[n] = b; c->blk[b].fpos = (uint32_t)n; n++; }
    }
    c->fq_spare = c->fq; c->fq = to;
    c->fq_head = 0; c->fq_tail = n;
}
static inline void fq_unlink(Core *c, int32_t b) {
    c->fq[c->blk[b].fpos] = -1;
    c->num_free--;
}
static inline void fq_append(Core *c, int32_t b) {
    if (c->fq_tail - c->fq_head > c->fq_mask) fq_compact(c);
    uint32_t i = (uint32_t)(c->fq_tail++ & c->fq_mask);
    c->fq[i] = b; c->blk[b].fpos = i;
    c->num_free++;
}
static inline void fq_prepend(Core *c, int32_t b) {
    if (c->fq_tail - c->fq_head > c->fq_mask) fq_compact(c);
    uint32_t i = (uint32_t)(--c->fq_head & c->fq_mask);
    c->fq[i] = b; c->blk[b].fpos = i;
    c->num_free++;
}
/* The queue front to back into out[] (at most num_free entries); returns their count. */
static int64_t fq_list(const Core *c, int32_t *out) {
    int64_t n = 0;
    for (uint64_t p = c->fq_head; p != c->fq_tail; p++) {
        int32_t b = c->fq[p & c->fq_mask];
        if (b >= 0) out[n++] = b;
    }
    return n;
}

/* ---------------- prefix cache (block_pool.py register / _drop_keys) */
static void cache_register(Core *c, int32_t b, int64_t k) {
    uint32_t h = key_hash(k);
    uint64_t i = map_find_h(&c->map, k, h);
    int32_t first = c->map.e[i].val;
    c->blk[b].key = k;          /* the map reads keys from the blocks */
    c->blk[b].h = h;
    if (first < 0) {
        map_set(&c->map, i, h, b);
    } else if (first != b) {
        /* Same content computed twice: later copies queue behind the first (vLLM keeps both). */
        int32_t p = first;
        while (c->blk[p].dup >= 0 && c->blk[p].dup != b) p = c->blk[p].dup;
        if (c->blk[p].dup != b) { c->blk[p].dup = b; c->blk[b].dup = -1; }
    }
    c->blk[b].hashed = 1;
}

static void cache_evict(Core *c, int32_t b) {
    c->blk[b].hashed = 0;
    int64_t k = c->blk[b].key;
    uint64_t i = map_find_h(&c->map, k, c->blk[b].h);
    int32_t first = c->map.e[i].val;
    if (first == b) {
        int32_t nx = c->blk[b].dup;
        if (nx >= 0) c->map.e[i].val = nx;
        else map_del_at(&c->map, i);
        c->blk[b].dup = -1;
    } else if (first >= 0) {
        int32_t p = first;
        while (c->blk[p].dup >= 0 && c->blk[p].dup != b) p = c->blk[p].dup;
        if (c->blk[p].dup == b) { c->blk[p].dup = c->blk[b].dup; c->blk[b].dup = -1; }
    }
}

/* Pop n blocks from the head (caller checked the count) into tbl[row]. */
static int pop_into(Core *c, int64_t row, int64_t n) {
    int64_t h = c->held[row];
    if (h + n > c->tcap[row]) {
        int64_t nc = c->tcap[row] ? c->tcap[row] : 8;
        while (nc < h + n) nc *= 2;
        int32_t *p = (int32_t *)realloc(c->tbl[row], (size_t)nc * sizeof(int32_t));
        if (!p) return -1;
        c->tbl[row] = p; c->tcap[row] = (int32_t)nc;
    }
    /* The n head blocks leave the queue (holes skipped); their prefix-cache entries go after,
     * each map entry fetched a few blocks ahead (on a long trace every pop evicts a cached
     * block). */
    int32_t *dst = c->tbl[row] + h, b;
    for (int64_t i = 0; i < n; c->fq_head++) {
        b = c->fq[c->fq_head & c->fq_mask];
        if (b >= 0) { __builtin_prefetch(&c->blk[b]); dst[i++] = b; }
    }
    c->num_free -= n;
    enum { AHEAD = 8 };
    for (int64_t i = 0; i < n; i++) {
        if (c->caching && i + AHEAD < n && c->blk[dst[i + AHEAD]].hashed)
            map_prefetch(&c->map, c->blk[dst[i + AHEAD]].h);
        b = dst[i];
        c->blk[b].ref = 1;
        if (c->caching && c->blk[b].hashed) cache_evict(c, b);
        if (c->oc.on) c->oc.alloc_stamp[b] = c->oc.astamp;     /* allocated in this batch */
    }
    /* The next pops (decodes take one block each, row after row): the head's map entry (its
     * block fetched by the last call) and the blocks after it. */
    uint64_t p = c->fq_head;
    if (c->fq_tail - p > 2) {
        int32_t nx = c->fq[p & c->fq_mask];
        if (nx >= 0 && c->caching && c->blk[nx].hashed) map_prefetch(&c->map, c->blk[nx].h);
        for (int k = 1; k <= 2; k++)
            if ((nx = c->fq[(p + k) & c->fq_mask]) >= 0) __builtin_prefetch(&c->blk[nx]);
    }
    c->held[row] = h + n;
    return 0;
}

/* cache_blocks' registrations (block_pool.py cache_full_blocks), from the row's first unhashed block. */
static void cache_blocks_from(Core *c, int64_t row, int64_t num_tokens) {
    int64_t nfull = num_tokens / c->bs, nc = c->ncached[row];
    /* Each key's map entry is fetched a few blocks ahead (a second iterator). */
    enum { AHEAD = 8 };
    KeyIt it, ahead;
    keyit_init(&c->keys, &it, row, nc);
    keyit_init(&c->keys, &ahead, row, nc);
    for (int64_t k = nc; k < nfull && k < nc + AHEAD; k++)
        map_prefetch(&c->map, key_hash(keyit_next(&c->keys, &ahead)));
    for (int64_t k = nc; k < nfull; k++) {
        if (k + AHEAD < nfull) map_prefetch(&c->map, key_hash(keyit_next(&c->keys, &ahead)));
        cache_register(c, c->tbl[row][k], keyit_next(&c->keys, &it));
    }
    c->ncached[row] = nfull;
}
/* Register the row's blocks that num_tokens filled since the last call. Called for every row
 * at every step, mostly with no new full block: that test, without a division, inline. */
static inline void cache_blocks(Core *c, int64_t row, int64_t num_tokens) {
    if (c->caching && num_tokens >= (c->ncached[row] + 1) * c->bs) cache_blocks_from(c, row, num_tokens);
}

/* Release a request's blocks, tail first: unhashed ones to the head (reused first), hashed ones
 * to the tail (LRU). Returns how many it held. */
static int64_t kv_free(Core *c, int64_t row) {
    int64_t h = c->held[row];
    int32_t *t = c->tbl[row];
    /* The blocks reaching ref 0, in release order, split by hashed-ness; reuse hits scratch. */
    int32_t *unh = c->hits, nu = 0;
    for (int64_t i = h - 1; i >= 0; i--) {
        if (i >= 8) __builtin_prefetch(&c->blk[t[i - 8]]);
        int32_t b = t[i];
        if (--c->blk[b].ref == 0) {
            if (c->blk[b].hashed) fq_append(c, b);
            else unh[nu++] = b;
        }
    }
    for (int32_t i = nu - 1; i >= 0; i--) fq_prepend(c, unh[i]);
    c->held[row] = 0;
    c->ncached[row] = 0;
    if (c->mode == MODE_NONE) { c->promised_total -= c->promised[row]; c->promised[row] = 0; }
    return h;
}

static int64_t get_computed_blocks(Core *c, int64_t row, int64_t num_tokens) {
    if (!c->caching) return 0;
    int64_t max_blocks = (num_tokens - 1) / c->bs, nh = 0;
    KeyIt it;
    keyit_init(&c->keys, &it, row, 0);
    for (int64_t k = 0; k < max_blocks; k++) {
        int32_t b = map_get(&c->map, keyit_next(&c->keys, &it));
        if (b < 0) break;
        c->hits[nh++] = b;
    }
    return nh;
}

#include "_connector.h"

/* ---------------- scheduler */
/* Waiting queue (queues.py): FCFS deque, or a heap ordered by (priority, arrival_s, row). */
static inline int heap_less(const Core *c, int32_t a, int32_t b) {
    if (c->q.prio[a] != c->q.prio[b]) return c->q.prio[a] < c->q.prio[b];
    if (c->q.arrival[a] != c->q.arrival[b]) return c->q.arrival[a] < c->q.arrival[b];
    return a < b;
}
static void heap_up(Core *c, int64_t i) {
    int32_t x = c->wq[i];
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!heap_less(c, x, c->wq[p])) break;
        c->wq[i] = c->wq[p];
        i = p;
    }
    c->wq[i] = x;
}
static void heap_down(Core *c, int64_t i) {
    int64_t n = c->wq_len;
    int32_t x = c->wq[i];
    for (;;) {
        int64_t l = 2 * i + 1, m;
        if (l >= n) break;
        m = (l + 1 < n && heap_less(c, c->wq[l + 1], c->wq[l])) ? l + 1 : l;
        if (!heap_less(c, c->wq[m], x)) break;
        c->wq[i] = c->wq[m];
        i = m;
    }
    c->wq[i] = x;
}
static int64_t wq_peek(Core *c) { return c->policy ? c->wq[0] : c->wq[c->wq_head]; }
static void wq_pop(Core *c) {
    if (c->policy) {
        c->wq[0] = c->wq[--c->wq_len];
        if (c->wq_len) heap_down(c, 0);
        return;
    }
    c->wq_head = (c->wq_head + 1) % c->wq_cap; c->wq_len--;
}
static void wq_push(Core *c, int32_t r) {
    if (c->policy) { c->wq[c->wq_len++] = r; heap_up(c, c->wq_len - 1); return; }
    c->wq[(c->wq_head + c->wq_len) % c->wq_cap] = r; c->wq_len++;
}
/* A preempted request goes back to the front (a heap has no front: it sorts by its key). */
static void wq_prepend(Core *c, int32_t r) {
    if (c->policy) { wq_push(c, r); return; }
    c->wq_head = (c->wq_head + c->wq_cap - 1) % c->wq_cap; c->wq[c->wq_head] = r; c->wq_len++;
}
static void wq_remove(Core *c, int32_t r) {
    int64_t j = 0;
    if (c->policy) {
        for (int64_t i = 0; i < c->wq_len; i++) if (c->wq[i] != r) c->wq[j++] = c->wq[i];
        c->wq_len = j;
        for (int64_t i = j / 2 - 1; i >= 0; i--) heap_down(c, i);
        return;
    }
    for (int64_t i = 0; i < c->wq_len; i++) {
        int32_t x = c->wq[(c->wq_head + i) % c->wq_cap];
        if (x != r) c->wq[(c->wq_head + j++) % c->wq_cap] = x;
    }
    c->wq_len = j;
}

static int never_runs(const Core *c, int64_t row) {
    int64_t p = c->q.prompt[row], o = c->q.out_len[row], L = c->L, need;
    if (p >= L) return 1;
    if (!c->chunked && p > c->max_batched) return 1;
    if (c->mode == MODE_NONE) need = cdiv(min64(p + o, L), c->bs);
    else need = cdiv(min64(p + o - 1, L - 1), c->bs);
    return need > c->num_blocks - 1;
}

static int64_t none_reserved(const Core *c) {
    int64_t held = 0;
    for (int64_t i = 0; i < c->nrun; i++) held += c->held[c->running[i]];
    return c->promised_total - held;
}

/* allocate_slots with an admission: touch the nh hit blocks (c->hits), they head the new
 * table. */
static int take_hits(Core *c, int64_t r, int64_t nh) {
    if (nh > c->tcap[r]) {
        int32_t *p = (int32_t *)realloc(c->tbl[r], (size_t)nh * sizeof(int32_t));
        if (!p) return -1;
        c->tbl[r] = p; c->tcap[r] = (int32_t)nh;
    }
    for (int64_t j = 0; j < nh; j++) {
        int32_t b = c->hits[j];
        if (c->blk[b].ref == 0) fq_unlink(c, b);
        c->blk[b].ref++;
        c->tbl[r][j] = b;
    }
    c->held[r] = nh;
    c->ncached[r] = nh;
    return 0;
}

/* The admission checks for the head after a hit of nh GPU blocks (in c->hits) and nload blocks
 * from a CPU tier: new tokens, or -1. `load_async`: the tier's blocks are loaded first (the
 * OffloadingConnector, F4): nothing is computed this step, only the load's blocks allocated. */
static int64_t admission_fits(Core *c, int64_t row, int64_t budget, int64_t thr, int64_t nh,
                              int64_t nload, int load_async, int64_t reserved) {
    int64_t bs = c->bs, L = c->L;
    int64_t nt = c->q.prompt[row] + c->q.num_output[row];
    int64_t n = 0;
    if (!load_async) {
        n = nt - (nh + nload) * bs;
        if (0 < thr && thr < n) n = thr;
        if (!c->chunked && n > budget) return -1;
        n = min64(n, budget);
    }
    int64_t wm = c->nrun ? c->watermark_blocks : 0, free = c->num_free, evictable = 0;
    for (int64_t i = 0; i < nh; i++) evictable += c->blk[c->hits[i]].ref == 0;
    int64_t total_computed = min64((nh + nload) * bs, L);
    if (c->reserve_full_isl) {
        int64_t need_full = max64(cdiv(min64(nt, L), bs) - nh, 0) + evictable;
        if (need_full + wm > free) return -1;
    }
    int64_t need = max64(cdiv(min64(total_computed + n, L), bs) - nh, 0) + evictable;
    if (need + wm > free - reserved) return -1;
    if (c->mode == MODE_NONE) {
        int64_t whole = cdiv(min64(c->q.prompt[row] + c->q.out_len[row], L), bs);
        int64_t need2 = max64(whole - nh, 0) + evictable;
        if (need2 + none_reserved(c) > free) return -1;
    }
    return n;
}

static int preempt(Core *c, int64_t row) {
    if (c->oc.on) oc_infl_del(&c->oc, row);
    /* The recompute tax (schedule()): positions below the most it ever computed are computed
     * again unless a prefix hit or a CPU load brings them back. */
    if (c->q.num_computed[row] > c->q.computed_at_pre[row])
        c->q.computed_at_pre[row] = c->q.num_computed[row];
    int64_t blocks = kv_free(c, row);
    c->q.num_computed[row] = 0;
    c->q.status[row] = ST_WAITING;
    c->q.num_pre[row] += 1;
    c->q.num_rec[row] += 1;
    c->prefilling[row] = 0;
    wq_prepend(c, (int32_t)row);
    c->pre_rows[c->npre] = (int32_t)row;
    c->pre_mode[c->npre] = 1;
    c->pre_blocks[c->npre++] = blocks;
    return 0;
}

static inline void sched_add(Core *c, int64_t row, int64_t n, int8_t kind) {
    c->s_kind[c->ns] = kind;
    c->s_rows[c->ns] = (int32_t)row;
    c->s_new[c->ns++] = n;
}

/* ---------------- waiting phase with the OffloadingConnector (vLLM 0.33 scheduler.py with a KV
 * connector; replay/engine/v1/offload.py): requests holding blocks (loading from the CPU tier) are
 * drained first; a request whose load is in flight, or whose lookup is deferred, is skipped for
 * the step (not head-of-line); a CPU hit admits the request with its load's blocks only, in
 * WAITING_FOR_REMOTE_KVS, using no token budget (F4). */
static void oc_skip(Core *c, int64_t r, int from_kvh) {
    Oc *o = &c->oc;
    int64_t cap = c->q.n + 1;
    if (from_kvh) { o->kvh_head = (o->kvh_head + 1) % cap; o->kvh_len--; }
    else wq_pop(c);
    if (c->held[r] > 0) o->skip_k[o->nskip_k++] = (int32_t)r;
    else o->skip_w[o->nskip_w++] = (int32_t)r;
}

/* Blocks of the row's table allocated in this batch (flush detection, F9). */
static inline void oc_stamp_table(Core *c, int64_t r) {
    for (int64_t k = 0; k < c->held[r]; k++) c->oc.alloc_stamp[c->tbl[r][k]] = c->oc.astamp;
}

/* 0.34 `_admits_inflight_kv_load`: a new CPU load stays within max_num_inflight_kv_loads,
 * counting loads in flight and loaded requests not running yet (the rows holding blocks in the
 * waiting queues: kv_holding_waiting and those skipped this step) and aborted requests whose
 * load is still in flight. */
static inline int oc_admits_load(const Core *c) {
    return c->max_loads < 0 ||
           c->oc.kvh_len + c->oc.nskip_k + c->nfree_load < c->max_loads;
}

static int oc_waiting_phase(Core *c, int64_t *budget_io, int64_t thr) {
    Oc *o = &c->oc;
    int64_t bs = c->bs, L = c->L, budget = *budget_io, cap = c->q.n + 1;
    o->nskip_w = o->nskip_k = 0;
    while (budget > 0 && (o->kvh_len || c->wq_len) && c->nrun < c->max_active) {
        int from_kvh = o->kvh_len > 0;
        int64_t r = from_kvh ? kvh_at(o, 0, cap) : wq_peek(c);
        int64_t nt = c->q.prompt[r] + c->q.num_output[r];
        if (o->loading[r]) {
            if (!o->recv_done[r]) { oc_skip(c, r, from_kvh); continue; }
            /* _update_waiting_for_remote_kv: the loaded blocks are cached now; a whole-prompt
             * hit recomputes its last token (F5). */
            if (c->q.num_computed[r] == nt) c->q.num_computed[r] = nt - 1;
            cache_blocks(c, r, c->q.num_computed[r]);
            o->loading[r] = o->recv_done[r] = 0;
        }
        int8_t kind = c->q.num_pre[r] > 0 ? BK_RESUMED : BK_NEW;
        if (c->q.num_computed[r] > 0) {
            /* Its load is done: schedule the rest on the blocks it holds. */
            int64_t cc = c->q.num_computed[r], n = nt - cc;
            if (0 < thr && thr < n) n = thr;
            int64_t wm = c->nrun ? c->watermark_blocks : 0, need = 0;
            int fits = c->chunked || n <= budget;
            if (fits) {
                n = min64(n, budget);
                fits = !(c->reserve_full_isl &&
                         max64(cdiv(min64(nt, L), bs) - c->held[r], 0) + wm > c->num_free);
                need = max64(cdiv(min64(cc + n, L), bs) - c->held[r], 0);
                fits = fits && need + wm <= c->num_free;
            }
            if (!fits && !c->nrun && !c->ns && !c->nfree_step && !c->nfree_load &&
                oc_loads_done(c, from_kvh)) {
                /* Nothing runs, no load is in flight and it still does not fit: it never
                 * will (vLLM hangs; the N2 admission rule makes this a corner case). */
                if (from_kvh) { o->kvh_head = (o->kvh_head + 1) % cap; o->kvh_len--; } else wq_pop(c);
                oc_infl_del(o, r);
                kv_free(c, r);
                oc_dropped(c, r);
                c->q.status[r] = ST_REJECTED;
                c->rej_rows[c->nrej++] = (int32_t)r;
                continue;
            }
            if (!fits) break;
            if (need > 0 && pop_into(c, r, need) < 0) return -1;
            oc_stamp_table(c, r);
            cache_blocks(c, r, min64(cc + n, nt));
            if (from_kvh) { o->kvh_head = (o->kvh_head + 1) % cap; o->kvh_len--; } else wq_pop(c);
            c->running[c->nrun++] = (int32_t)r;
            c->q.status[r] = ST_RUNNING;
            c->prefilling[r] = 1;
            sched_add(c, r, n, kind);
            budget -= n;
            continue;
        }
        int64_t nh = get_computed_blocks(c, r, nt);
        int64_t ext = oc_lookup(c, r, nh * bs);
        o->lk_rows[o->nlk] = (int32_t)r;
        o->lk_tok[o->nlk++] = ext;
        if (ext < 0) { oc_skip(c, r, from_kvh); continue; }
        int64_t nload = ext / bs;
        int load = ext > 0;
        if (load && !oc_admits_load(c)) break;   /* it waits at the head (0.34's cap) */
        /* N2: an async load is admitted only beside what the in-flight prefills (other loads
         * among them) still need (vLLM _inflight_prefill_reserved_blocks): a loading request
         * cannot be preempted, so loads cannot deadlock the pool. */
        int64_t n = admission_fits(c, r, budget, thr, nh, nload, load, load ? oc_reserved(c) : 0);
        if (n < 0) {
            /* C3: not while a deferred lookup waits for a transfer either; C4: nor while an
             * aborted request's blocks are still to come back. */
            if (c->nrun || c->ns || o->kvh_len || o->nskip_k || o->nskip_w || c->nfree_step ||
                c->nfree_load) break;
            wq_pop(c);
            c->q.status[r] = ST_REJECTED;
            c->rej_rows[c->nrej++] = (int32_t)r;
            continue;
        }
        if (take_hits(c, r, nh) < 0) return -1;
        int64_t computed = (nh + nload) * bs;
        int64_t n_new = cdiv(min64(computed + n, L), bs) - nh;
        if (n_new > 0 && pop_into(c, r, n_new) < 0) return -1;
        oc_stamp_table(c, r);
        o->hit_rows[o->nhit] = (int32_t)r;
        o->hit_g[o->nhit] = nh * bs;
        o->hit_c[o->nhit++] = ext;
        int64_t hit = computed;
        if (c->q.num_pre[r] == 0) { c->q.cached_prompt[r] = hit; c->q.cpu_hit[r] = ext; }
        if (load) {
            /* WAITING_FOR_REMOTE_KVS: its blocks are cached when the load is done. */
            c->q.num_computed[r] = computed;
            if (oc_plan_load(c, r, ext) < 0) return -1;
            o->loading[r] = 1;
            oc_infl_add(o, r);
            oc_skip(c, r, from_kvh);
            continue;
        }
        cache_blocks(c, r, min64(computed + n, nt));
        if (hit + n < oc_num_tokens(c, r)) oc_infl_add(o, r);
        wq_pop(c);
        c->running[c->nrun++] = (int32_t)r;
        c->q.status[r] = ST_RUNNING;
        c->q.num_computed[r] = hit;
        c->prefilling[r] = 1;
        sched_add(c, r, n, kind);
        budget -= n;
    }
    /* Skipped requests go back to the front of their queues, in order. */
    for (int64_t k = o->nskip_k - 1; k >= 0; k--) {
        o->kvh_head = (o->kvh_head + cap - 1) % cap;
        o->kvh[o->kvh_head] = o->skip_k[k];
        o->kvh_len++;
    }
    for (int64_t k = o->nskip_w - 1; k >= 0; k--) wq_prepend(c, o->skip_w[k]);
    if (c->policy) {
        /* vLLM's kv_holding_waiting is a priority queue under the priority policy too: kept in
         * (priority, arrival, row) order, so it is drained (and listed) that way. */
        for (int64_t a = 1; a < o->kvh_len; a++) {
            int32_t x = kvh_at(o, a, cap);
            int64_t b = a - 1;
            for (; b >= 0 && heap_less(c, x, kvh_at(o, b, cap)); b--)
                o->kvh[(o->kvh_head + b + 1) % cap] = kvh_at(o, b, cap);
            o->kvh[(o->kvh_head + b + 1) % cap] = x;
        }
    }
    *budget_io = budget;
    return 0;
}

/* 0.34 cache-aware admission (scheduler.py `_reorder_waiting_by_cached_prefix`; the reference's
 * twin): with at least two waiting requests and the usage at the threshold or above, the plain
 * waiting requests (never preempted) among the first ca_window take those slots in order of
 * their GPU prefix-cache hit (get_computed_blocks' probe, at most num_tokens - 1 tokens), deepest
 * first, ties in queue order; the new order is written back. FCFS only (the ring). */
static int ca_cmp(const void *a, const void *b) {
    const CaEnt *x = (const CaEnt *)a, *y = (const CaEnt *)b;
    if (x->cached != y->cached) return x->cached > y->cached ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}
static int ca_record_queue(Core *c, int32_t **to) {
    if (!*to && !(*to = (int32_t *)malloc(((size_t)c->q.n + 1) * sizeof(int32_t)))) return -1;
    for (int64_t i = 0; i < c->wq_len; i++) (*to)[i] = c->wq[(c->wq_head + i) % c->wq_cap];
    return 0;
}
static int ca_reorder(Core *c) {
    int64_t usable = c->num_blocks - 1;
    double usage = usable == 0 ? 0.0 : 1.0 - (double)c->num_free / (double)usable;
    if (c->ca_rec) {
        c->ca_called = 1; c->ca_usage = usage; c->ca_nprobe = 0; c->ca_len = c->wq_len;
        if (ca_record_queue(c, &c->ca_before) < 0 || ca_record_queue(c, &c->ca_after) < 0)
            return -1;
    }
    if (c->wq_len < 2 || usage < c->ca_threshold) return 0;
    int64_t w = min64(c->ca_window, c->wq_len), ns = 0;
    for (int64_t i = 0; i < w; i++) {
        int32_t r = c->wq[(c->wq_head + i) % c->wq_cap];
        if (c->q.num_pre[r] == 0) { c->ca[ns].slot = (int32_t)i; c->ca[ns++].row = r; }
    }
    if (ns < 2) return 0;
    int sorted = 1;
    for (int64_t k = 0; k < ns; k++) {
        int32_t r = c->ca[k].row;
        c->ca[k].cached = get_computed_blocks(c, r, c->q.prompt[r] + c->q.num_output[r]) * c->bs;
        if (k && c->ca[k].cached > c->ca[k - 1].cached) sorted = 0;
    }
    if (c->ca_rec) {
        for (int64_t k = 0; k < ns; k++) { c->ca_prow[k] = c->ca[k].row; c->ca_ptok[k] = c->ca[k].cached; }
        c->ca_nprobe = ns;
    }
    if (sorted) return 0;
    /* The slots keep their places; the requests in them move (a stable order by hit). */
    int32_t *slots = c->ca_slots;
    for (int64_t k = 0; k < ns; k++) slots[k] = c->ca[k].slot;
    qsort(c->ca, (size_t)ns, sizeof(CaEnt), ca_cmp);
    for (int64_t k = 0; k < ns; k++) c->wq[(c->wq_head + slots[k]) % c->wq_cap] = c->ca[k].row;
    if (c->ca_rec && ca_record_queue(c, &c->ca_after) < 0) return -1;
    return 0;
}

/* The victim at running index vi leaves `running` (the loop's index *i shifts if it was before
 * it) and, if scheduled earlier in this step, the batch, its tokens refunded (0.33). */
static void unrun(Core *c, int64_t vi, int64_t *i, int64_t *budget) {
    int32_t victim = c->running[vi];
    memmove(c->running + vi, c->running + vi + 1, (size_t)(c->nrun - vi - 1) * sizeof(int32_t));
    c->nrun--;
    if (vi < *i) (*i)--;
    for (int64_t j = 0; j < c->ns; j++) {
        if (c->s_rows[j] != victim) continue;
        *budget += c->s_new[j];
        memmove(c->s_rows + j, c->s_rows + j + 1, (size_t)(c->ns - j - 1) * sizeof(int32_t));
        memmove(c->s_new + j, c->s_new + j + 1, (size_t)(c->ns - j - 1) * sizeof(int64_t));
        memmove(c->s_kind + j, c->s_kind + j + 1, (size_t)(c->ns - j - 1));
        c->ns--;
        break;
    }
}

/* One schedule(): rejections of new arrivals, running phase, waiting phase. -1 on error. */
static int schedule(Core *c) {
    int64_t bs = c->bs, L = c->L;
    c->ns = c->npre = c->nrej = 0;
    if (c->oc.on) oc_begin_step(&c->oc, c->lp.t);
    for (int64_t i = 0; i < c->narrived; i++) {
        int32_t r = c->arrived[i];
        if (never_runs(c, r)) {
            wq_remove(c, r);
            c->q.status[r] = ST_REJECTED;
            c->rej_rows[c->nrej++] = r;
        }
    }
    c->narrived = 0;
    int64_t budget = c->max_batched;
    /* 0.33 get_request_counts: running, waiting and kv_holding_waiting (loading) requests. */
    int64_t thr = (c->nrun + c->wq_len + (c->oc.on ? c->oc.kvh_len : 0) > 1) ? c->thr_knob : 0;
    /* Running phase. */
    int64_t i = 0;
    while (i < c->nrun && budget > 0) {
        int64_t r = c->running[i];
        int64_t cc = c->q.num_computed[r], nt = c->q.prompt[r] + c->q.num_output[r];
        if (c->async_sched && c->ph[r] > 0 &&
            cc + 2 - c->ph[r] >= c->q.prompt[r] + c->q.out_len[r]) { i++; continue; }
        int64_t n = nt - cc;
        if (0 < thr && thr < n) n = thr;
        n = min64(min64(n, budget), L - cc - 1);
        if (n <= 0) { i++; continue; }
        int ok = 0;
        for (;;) {
            int64_t need = max64(cdiv(min64(cc + n, L), bs) - c->held[r], 0);
            if (need <= c->num_free) {
                if (need > 0 && pop_into(c, r, need) < 0) return -1;
                /* N1: only blocks of real tokens are cached (an async placeholder has no hash
                 * yet; vLLM caches up to request.num_tokens): the rest when the output is
                 * applied (update()). */
                cache_blocks(c, r, min64(cc + n, nt - (c->async_sched ? c->ph[r] : 0)));
                ok = 1;
                break;
            }
            if (c->mode == MODE_NONE) {
                PyErr_SetString(PyExc_AssertionError, "preemption_mode none: a running request "
                                "ran out of blocks despite its reservation");
                return -1;
            }
            int64_t victim;
            if (c->lcf) {
                /* What-if (vLLM PR #53723): the fewest computed tokens, ties the last in
                 * running order; un-scheduled and refunded as the priority victim is. */
                int64_t vi = c->nrun - 1;
                for (int64_t j = c->nrun - 2; j >= 0; j--)
                    if (c->q.num_computed[c->running[j]] < c->q.num_computed[c->running[vi]]) vi = j;
                if (oc_cannot_free(c, c->running[vi])) break;
                victim = c->running[vi];
                unrun(c, vi, &i, &budget);
            } else if (c->policy) {
                /* The worst (priority, arrival, row): ties in arrival follow trace order; with
                 * arrival_ties "equal", the first of them in running order (vLLM's max()). */
                int64_t vi = 0;
                for (int64_t j = 1; j < c->nrun; j++) {
                    int32_t x = c->running[j], y = c->running[vi];
                    if (c->q.prio[x] != c->q.prio[y] ? c->q.prio[x] > c->q.prio[y]
                        : c->q.arrival[x] != c->q.arrival[y] ? c->q.arrival[x] > c->q.arrival[y]
                        : !c->ties_equal && x > y) vi = j;
                }
                if (oc_cannot_free(c, c->running[vi])) break;
                victim = c->running[vi];
                unrun(c, vi, &i, &budget);
            } else {
                if (oc_cannot_free(c, c->running[c->nrun - 1])) break;
                victim = c->running[--c->nrun];
            }
            preempt(c, victim);
            if (victim == r) break;
        }
        if (!ok) {
            if (c->policy && c->q.status[r] == ST_WAITING) continue;   /* it preempted itself */
            break;
        }
        sched_add(c, r, n, BK_RUNNING);
        budget -= n;
        i++;
    }
    /* Waiting phase, only when nothing was preempted. */
    c->ca_called = 0;
    if (c->npre == 0 && c->ca_window && ca_reorder(c) < 0) return -1;
    if (c->npre == 0 && c->oc.on) {
        if (oc_waiting_phase(c, &budget, thr) < 0) return -1;
    } else if (c->npre == 0) {
        while (budget > 0 && c->wq_len && c->nrun < c->max_active) {
            int64_t r = wq_peek(c), nt = c->q.prompt[r] + c->q.num_output[r];
            int64_t nh = get_computed_blocks(c, r, nt);
            int64_t n = admission_fits(c, r, budget, thr, nh, 0, 0, 0);
            if (n < 0) {
                if (c->nrun || c->ns) break;
                wq_pop(c);
                c->q.status[r] = ST_REJECTED;
                c->rej_rows[c->nrej++] = (int32_t)r;
                continue;
            }
            /* allocate_slots with the admission: touch the hits, they head the new table. */
            if (take_hits(c, r, nh) < 0) return -1;
            int64_t hit = nh * bs;
            int64_t n_new = cdiv(min64(hit + n, L), bs) - nh;
            if (n_new > 0 && pop_into(c, r, n_new) < 0) return -1;
            cache_blocks(c, r, min64(hit + n, nt));
            wq_pop(c);
            c->running[c->nrun++] = (int32_t)r;
            if (c->mode == MODE_NONE) {
                int64_t whole = cdiv(min64(c->q.prompt[r] + c->q.out_len[r], L), bs);
                c->promised[r] = whole;
                c->promised_total += whole;
            }
            int8_t kind = c->q.num_pre[r] > 0 ? BK_RESUMED : BK_NEW;
            if (c->q.num_pre[r] == 0) c->q.cached_prompt[r] = hit;
            c->q.status[r] = ST_RUNNING;
            c->q.num_computed[r] = hit;
            c->prefilling[r] = 1;
            sched_add(c, r, n, kind);
            budget -= n;
        }
    }
    if (c->oc.on && oc_meta(c) < 0) return -1;
    if (c->oc.on && c->async_sched && c->ns) {
        /* The step in flight writes its rows' blocks (F11: defer_block_free). */
        c->oc.sched_seq++;
        for (int64_t j = 0; j < c->ns; j++) c->oc.last_seq[c->s_rows[j]] = c->oc.sched_seq;
    }
    for (int64_t j = 0; j < c->ns; j++) {
        int64_t r = c->s_rows[j];
        int64_t b = c->s_before[j] = c->q.num_computed[r];
        c->q.num_computed[r] += c->s_new[j];
        c->s_prefill[j] = c->prefilling[r];
        /* Recompute tax: a (re-)prefill chunk's part below what the row had computed before a
         * preemption (only a re-prefill reaches back there). */
        if (c->s_prefill[j] && c->q.computed_at_pre[r] > b)
            c->q.recomputed[r] += min64(b + c->s_new[j], c->q.computed_at_pre[r]) - b;
    }
    if (c->oc.on && c->oc.ninfl) {
        /* _update_after_schedule: a chunk reaching the known tokens ends an in-flight prefill. */
        for (int64_t j = 0; j < c->ns; j++) {
            int64_t r = c->s_rows[j];
            if (c->q.num_computed[r] >= c->q.prompt[r] + c->q.num_output[r]) oc_infl_del(&c->oc, r);
        }
    }
    return 0;
}


static inline int event(Core *c, int kind, int64_t row, int64_t blocks) {
    return tables_event(&c->out, c->lp.t, c->lp.step, kind, row, blocks);
}

static void add_request(void *core, int32_t r) {
    Core *c = (Core *)core;
    c->q.status[r] = ST_WAITING;
    wq_push(c, r);
    c->arrived[c->narrived++] = r;
}

static int has_unfinished(const void *core) {
    const Core *c = (const Core *)core;
    const Oc *o = &c->oc;
    /* With the connector: also while requests load, finishes wait for their last stores or
     * transfers are in flight (vLLM's has_requests). */
    return c->nrun || c->wq_len ||
           (o->on && (o->kvh_len || o->nfin_rows || o->live.n || o->unsubmitted.n));
}

/* update(): one token for every row whose chunk reached the end of its known tokens; finish at
 * output_len or max_model_len; free the finished in batch order. Async: this step's tokens are
 * placeholders and the stop checks apply the previous step's (scheduler.py). -1 on error. */
static int update(Core *c) {
    c->nfin = 0;
    /* The step in flight when they were aborted is processed now (_drain_deferred_frees). */
    for (int64_t k = 0; k < c->nfree_step; k++) kv_free(c, c->free_after_step[k]);
    c->nfree_step = 0;
    if (c->oc.on && oc_worker(c) < 0) return -1;
    int64_t ng = 0;
    for (int64_t j = 0; j < c->ns; j++) {
        int64_t r = c->s_rows[j];
        c->s_sampled[j] = c->q.num_computed[r] >= c->q.prompt[r] + c->q.num_output[r];
        if (!c->s_sampled[j]) continue;
        int64_t out = ++c->q.num_output[r];
        c->prefilling[r] = 0;
        if (c->async_sched) { c->ph[r]++; c->fl_next[ng++] = (int32_t)r; continue; }
        if (out >= c->q.out_len[r] || c->q.prompt[r] + out >= c->L) c->fin[c->nfin++] = (int32_t)r;
    }
    if (c->async_sched && c->oc.on) {
        /* The output applied now is the previous step's: its block writes are done. */
        c->oc.proc_seq += c->oc.inflight_nonempty;
        c->oc.inflight_nonempty = c->ns > 0;
    }
    if (c->async_sched) {
        /* This step's tokens are placeholders; the previous step's output is applied now:
         * vLLM update_from_output caches a running request's blocks up to the tokens of its
         * processed steps (num_computed_tokens - the step in flight's), N1. */
        int cache_out = c->caching && c->nfl;
        if (cache_out) for (int64_t j = 0; j < c->ns; j++) c->in_step[c->s_rows[j]] = c->s_new[j];
        for (int64_t k = 0; k < c->nfl; k++) {
            int32_t r = c->fl[k];
            int64_t out = c->q.num_output[r] - --c->ph[r];
            if (cache_out && c->q.status[r] == ST_RUNNING)
                cache_blocks(c, r, c->q.num_computed[r] - c->in_step[r]);
            if (out >= c->q.out_len[r] || c->q.prompt[r] + out >= c->L) {
                if (c->ph[r]) {
                    PyErr_SetString(PyExc_AssertionError, "async scheduling: a request was "
                                    "scheduled again after its last token");
                    return -1;
                }
                c->fin[c->nfin++] = r;
            }
        }
        if (cache_out) for (int64_t j = 0; j < c->ns; j++) c->in_step[c->s_rows[j]] = 0;
        int32_t *t = c->fl; c->fl = c->fl_next; c->fl_next = t;
        c->nfl = ng;
    }
    int any_running = 0;
    for (int64_t j = 0; j < c->nfin; j++) {
        int32_t r = c->fin[j];
        if (c->oc.on) {
            oc_infl_del(&c->oc, r);
            /* The connector stores its last chunks from these blocks at the next step. */
            c->oc.fin_blocks[r] = c->q.status[r] == ST_RUNNING ? c->held[r] : 0;
            c->oc.fin_wait[r] = 1;
            c->oc.fin_rows[c->oc.nfin_rows++] = r;
        }
        if (c->q.status[r] == ST_RUNNING) {
            kv_free(c, r);
            any_running = 1;
        } else {
            /* Preempted while its last token was in flight (vLLM: stopped_preempted_reqs). */
            wq_remove(c, r);
        }
        c->q.status[r] = ST_FINISHED;
        /* A finished request never holds blocks again: its table goes now, not at the end of
         * the run (10M requests' tables were gigabytes); with offloading once the connector
         * has stored from it. */
        if (!c->oc.on) { free(c->tbl[r]); c->tbl[r] = NULL; c->tcap[r] = 0; }
    }
    if (any_running) {
        int64_t w = 0;
        for (int64_t j = 0; j < c->nrun; j++) {
            int32_t r = c->running[j];
            if (c->q.status[r] != ST_FINISHED) c->running[w++] = r;
        }
        c->nrun = w;
    }
    /* finished_recving of an aborted request: its blocks go back now (C4), in report order. */
    for (int64_t k = 0; c->nfree_load && k < c->oc.ndone; k++) {
        int32_t r = c->oc.done_rows[k];
        if (c->oc.done_store[k] || !c->free_after_load[r]) continue;
        c->free_after_load[r] = 0;
        c->nfree_load--;
        kv_free(c, r);
    }
    return 0;
}

/* A client abort (scheduler.py abort_request; the per-step contract only: trace replays have
 * none): the row leaves whichever queue holds it and its blocks go back. With the connector,
 * vLLM calls request_finished for it too (its tokens computed so far are offered at the next
 * schedule), and under async scheduling the blocks of a row whose step is in flight go back
 * when that step's output is processed; those of a row whose CPU load is in flight once the
 * load is reported done (C4). Not running or waiting: nothing to do. */
static void abort_request(Core *c, int32_t r) {
    Oc *o = &c->oc;
    int st = c->q.status[r];
    if (st != ST_RUNNING && st != ST_WAITING) return;
    /* Waiting and holding blocks: in kv_holding_waiting (its CPU load in flight or done). */
    int kvh = o->on && st == ST_WAITING && c->held[r] > 0;
    /* The connector knows the row once admitted (a preempted or loading row too). */
    if (o->on && (st == ST_RUNNING || kvh || c->q.num_pre[r] > 0)) {
        /* A waiting row (loading ones too: their tokens count once they start) computed none. */
        c->abort_upto[r] = st == ST_RUNNING ? c->q.num_computed[r] : 0;
        o->fin_blocks[r] = c->held[r];
        o->fin_wait[r] = 1;
        o->fin_rows[o->nfin_rows++] = r;
    }
    if (st == ST_RUNNING) {
        int64_t w = 0;
        for (int64_t j = 0; j < c->nrun; j++)
            if (c->running[j] != r) c->running[w++] = c->running[j];
        c->nrun = w;
        if (oc_cannot_free(c, r)) c->free_after_step[c->nfree_step++] = r;
        else kv_free(c, r);
    } else if (kvh) {
        int64_t cap = c->q.n + 1, w = 0;
        for (int64_t i = 0; i < o->kvh_len; i++) {
            int32_t x = kvh_at(o, i, cap);
            if (x != r) o->kvh[(o->kvh_head + w++) % cap] = x;
        }
        o->kvh_len = w;
        if (o->loading[r] && !o->recv_done[r]) { c->free_after_load[r] = 1; c->nfree_load++; }
        else kv_free(c, r);
        c->q.num_computed[r] = 0;
    } else {
        wq_remove(c, r);
        int64_t w = 0;
        for (int64_t i = 0; i < c->narrived; i++)
            if (c->arrived[i] != r) c->arrived[w++] = c->arrived[i];
        c->narrived = w;
    }
    /* Its token in flight (async) is never applied. */
    int64_t w = 0;
    for (int64_t k = 0; k < c->nfl; k++) if (c->fl[k] != r) c->fl[w++] = c->fl[k];
    c->nfl = w;
    if (o->on) oc_infl_del(o, r);
    c->q.status[r] = ST_ABORTED;
    if (!o->on) { free(c->tbl[r]); c->tbl[r] = NULL; c->tcap[r] = 0; }
}

/* One engine step: schedule(), the executor's duration, update() (replay/engine/loop.py's step;
 * the loop's own bookkeeping is in kvcore.h). 1 when the run ends. */
static int one_step(void *core) {
    Core *c = (Core *)core;
    if (schedule(c) < 0) return -1;
    Plan pl = {.rows = c->s_rows, .num_new = c->s_new, .num_computed = c->s_before,
               .prefill = c->s_prefill, .sampled = c->s_sampled, .kind = c->s_kind,
               .nrows = c->ns,
               .pre_rows = c->pre_rows, .pre_blocks = c->pre_blocks, .pre_mode = c->pre_mode,
               .pre_fallback = c->pre_fallback, .npre = c->npre, .rej_rows = c->rej_rows,
               .nrej = c->nrej};
    if (loop_preemption_events(&c->lp, &c->out, &pl)) return -1;
    if (c->oc.on) {
        /* One event per transfer issued, loads then stores (replay/engine/loop.py). */
        const Oc *o = &c->oc;
        for (int64_t j = 0; j < o->step_loads.n; j++) {
            const Job *x = &o->jobs[o->step_loads.d[j]];
            if (event(c, EV_OFFLOAD_LOAD, x->row, x->nblocks)) return -1;
        }
        for (int64_t j = 0; j < o->step_stores.n; j++) {
            const Job *x = &o->jobs[o->step_stores.d[j]];
            if (event(c, EV_OFFLOAD_STORE, x->row, x->nblocks)) return -1;
        }
    }
    loop_evictions(&c->lp, &pl);
    StepSums sums = loop_sums(&c->lp, &c->q, &pl);
    StepRow row = {
        .duration_s = cost_step(&c->cost, &sums, 0),
        .num_running = (int32_t)c->nrun, .num_waiting = (int32_t)(c->wq_len + c->oc.kvh_len),
        .num_prefill_tokens = sums.num_prefill,
        .num_decode_tokens = sums.num_decode, .offload_store_blocks = c->oc.store_blocks,
        .offload_load_blocks = c->oc.load_blocks};
    c->oc.end_s = c->lp.t + row.duration_s;   /* the worker reports what is done by then */
    if (update(c) < 0) return -1;
    row.gpu_blocks_used = c->num_blocks - 1 - c->num_free;
    row.cpu_blocks_used = c->oc.on ? tier_used(&c->oc.tier) : 0;
    pl.wake_s = NAN;
    if (c->oc.on) {
        pl.noffload = c->oc.step_loads_n + c->oc.step_stores_n + c->oc.ndone;
        pl.wake_s = oc_next_done_s(&c->oc);
    }
    return loop_finish_step(&c->lp, &c->out, &c->q, &pl, &row, sums.num_sampled, c->fin, c->nfin);
}

static const CoreOps OPS = {add_request, has_unfinished, one_step};

/* ------------------------------------------------------------------ Python glue */
static void core_free(Core *c) {
    if (!c) return;
    views_release(&c->views);
    tables_free(&c->out);
    loop_free(&c->lp);
    oc_free(&c->oc, c->q.n);
    if (c->tbl) { for (int64_t r = 0; r < c->q.n; r++) free(c->tbl[r]); }
    void *ps[] = {c->abort_upto, c->free_after_step, c->free_after_load,
                  c->blk, c->fq, c->fq_spare, c->map.e, c->tbl, c->tcap, c->held, c->ncached, c->running, c->wq,
                  c->arrived, c->prefilling, c->promised, c->fin, c->ph, c->fl, c->fl_next, c->in_step,
                  c->s_rows, c->s_new, c->s_before, c->s_prefill, c->s_sampled, c->s_kind, c->pre_rows, c->pre_blocks,
                  c->rej_rows, c->hits, c->pre_mode, c->pre_fallback, c->ca, c->ca_slots, c->ca_before, c->ca_after, c->ca_prow,
                  c->ca_ptok};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
    free(c);
}

static void capsule_free(PyObject *cap) {
    core_free((Core *)PyCapsule_GetPointer(cap, "kvcap.core"));
}

#define CALLOC(p, n, T) do { (p) = (T *)calloc((size_t)(n) > 0 ? (size_t)(n) : 1, sizeof(T)); \
                             if (!(p)) { PyErr_NoMemory(); goto fail; } } while (0)

static PyObject *core_new(PyObject *self, PyObject *args) {
    PyObject *arrays, *spec, *cost, *keys;
    if (!PyArg_ParseTuple(args, "OOOO", &arrays, &spec, &cost, &keys)) return NULL;
    Core *c = (Core *)calloc(1, sizeof(Core));
    if (!c) return PyErr_NoMemory();
    if (req_take(&c->views, arrays, &c->q) < 0) goto fail;
    int64_t n = c->q.n;
    /* replay.engine.spec.SchedulerSpec by field name (v1/scheduler.py's reads, same rules). */
    int64_t bs, nb, ms, ma, mb, L, thr, ncpu, caw, maxl;
    double wm, cat;
    int ch, ca, rf, asy, mode, policy, version;
    if (spec_int(spec, "block_size", &bs) || spec_int(spec, "num_gpu_blocks", &nb) ||
        spec_int(spec, "num_cpu_blocks", &ncpu) || spec_int(spec, "max_num_seqs", &ms) ||
        /* max_num_active_seqs: None means max_num_seqs (B7). */
        spec_opt_int(spec, "max_num_active_seqs", ms, &ma) ||
        spec_int(spec, "max_num_batched_tokens", &mb) || spec_int(spec, "max_model_len", &L) ||
        spec_int(spec, "long_prefill_token_threshold", &thr) ||
        spec_float(spec, "watermark", &wm) ||
        spec_bool(spec, "enable_chunked_prefill", &ch) ||
        spec_bool(spec, "enable_prefix_caching", &ca) ||
        spec_bool(spec, "scheduler_reserve_full_isl", &rf) ||
        spec_bool(spec, "async_scheduling", &asy) ||
        spec_choice(spec, "preemption_mode", MODE_NAMES, &mode) ||
        spec_choice(spec, "policy", POLICY_NAMES, &policy) ||
        spec_choice(spec, "vllm_version", VERSION_NAMES, &version) ||
        spec_int(spec, "cache_aware_admission_window", &caw) ||
        spec_float(spec, "cache_aware_admission_threshold", &cat) ||
        spec_opt_int(spec, "max_num_inflight_kv_loads", -1, &maxl) ||
        spec_choice(spec, "arrival_ties", TIES_NAMES, &c->ties_equal) ||
        spec_choice(spec, "preemption_victim", VICTIM_NAMES, &c->lcf)) goto fail;
    if (c->lcf && policy != POLICY_FCFS) {
        PyErr_SetString(PyExc_ValueError, "core: preemption_victim lcf is for the fcfs policy");
        goto fail;
    }
    if (version == 0 && (caw != 0 || cat != 0.5 || maxl != -1)) {
        PyErr_SetString(PyExc_ValueError, "core: cache_aware_admission_window / _threshold and "
                        "max_num_inflight_kv_loads are vLLM 0.34 knobs, not in 0.33");
        goto fail;
    }
    /* CPU KV offloading (vLLM 0.33's OffloadingConnector, _connector.h). */
    int off, prompt_only, evict, counting;
    int64_t bpc, tsteps, sthr, tracker;
    double link;
    if (spec_bool(spec, "kv_offloading", &off) ||
        spec_bool(spec, "offload_prompt_only", &prompt_only) ||
        spec_choice(spec, "offload_eviction_policy", EVICTION_NAMES, &evict) ||
        spec_int(spec, "offload_blocks_per_chunk", &bpc) ||
        spec_int(spec, "offload_store_threshold", &sthr) ||
        spec_int(spec, "offload_store_tracker_size", &tracker) ||
        /* Which offers count: every offer (0.33) or each key once per request (0.34); None:
         * the version's. */
        spec_opt_choice(spec, "offload_store_counting", STORE_COUNTING_NAMES, &counting) ||
        spec_int(spec, "offload_transfer_steps", &tsteps) ||
        spec_float(spec, "offload_host_link_bytes_per_s", &link)) goto fail;
    int64_t block_bytes;          /* time mode: a transfer's bytes per block, per GPU */
    if (spec_int(spec, "kv_bytes_per_block", &block_bytes)) goto fail;
    if (mode == MODE_SWAP) {
        PyErr_SetString(PyExc_ValueError, "core: V1 has no swap preemption (its host tier is "
                        "CPU KV offloading)");
        goto fail;
    }
    if (off && (mode != MODE_RECOMPUTE || bpc < 1 || tsteps < 0 || sthr < 0 || tracker < 1)) {
        PyErr_SetString(PyExc_ValueError, "core: CPU KV offloading runs with recompute "
                        "preemption, offload_blocks_per_chunk >= 1, offload_transfer_steps >= 0, "
                        "offload_store_threshold >= 0, offload_store_tracker_size >= 1");
        goto fail;
    }
    c->policy = policy;
    c->bs = bs; c->num_blocks = nb; c->max_active = ma; c->max_batched = mb; c->L = L;
    /* vLLM: int(watermark * num_blocks), null block included (C truncates as int() does). */
    c->thr_knob = thr; c->watermark_blocks = (int64_t)(wm * (double)nb); c->chunked = ch;
    c->caching = ca; c->reserve_full_isl = rf; c->mode = mode; c->async_sched = asy;
    /* 0.34 applies the long-prefill cap with chunked prefill only (S20_off_cap). */
    if (version == 1 && !ch) c->thr_knob = 0;
    c->ca_window = policy == POLICY_FCFS && ca ? caw : 0;
    c->ca_threshold = cat;
    c->max_loads = maxl;
    if (counting < 0) counting = version == 1 ? COUNT_ONCE_PER_REQUEST : COUNT_EVERY_OFFER;
    if (cost_parse(cost, &c->cost) < 0) goto fail;
    if (keys_take(&c->views, keys, n, c->bs, &c->keys) < 0) goto fail;
    /* Pool: blocks 1..nb-1 free in order (block 0 is the null block). */
    CALLOC(c->blk, nb + 1, Blk);
    if (map_init(&c->map, 4 * nb + 2, &c->blk[0].key, sizeof(Blk), NULL) < 0) { PyErr_NoMemory(); goto fail; }
    {
        uint64_t cap = 16;
        while (cap < (uint64_t)(2 * nb + 2)) cap <<= 1;
        CALLOC(c->fq, cap, int32_t); CALLOC(c->fq_spare, cap, int32_t);
        c->fq_mask = cap - 1;
        for (uint64_t i = 0; i < cap; i++) c->fq[i] = -1;
        for (int32_t b = 1; b < (int32_t)nb; b++) fq_append(c, b);
        for (int64_t b = 0; b <= nb; b++) c->blk[b].dup = -1;
    }
    CALLOC(c->tbl, n, int32_t *); CALLOC(c->tcap, n, int32_t);
    CALLOC(c->held, n, int64_t); CALLOC(c->ncached, n, int64_t);
    CALLOC(c->running, n, int32_t); CALLOC(c->wq, n + 1, int32_t); c->wq_cap = n + 1;
    CALLOC(c->arrived, n, int32_t); CALLOC(c->prefilling, n, uint8_t);
    CALLOC(c->promised, n, int64_t);
    CALLOC(c->fin, n, int32_t);
    CALLOC(c->ph, n, int64_t); CALLOC(c->fl, n, int32_t); CALLOC(c->fl_next, n, int32_t);
    CALLOC(c->in_step, n, int64_t);
    if (loop_init(&c->lp, &c->q) < 0) { PyErr_NoMemory(); goto fail; }
    CALLOC(c->s_rows, n, int32_t); CALLOC(c->s_new, n, int64_t);
    CALLOC(c->s_before, n, int64_t); CALLOC(c->s_prefill, n, uint8_t);
    CALLOC(c->s_sampled, n, uint8_t); CALLOC(c->s_kind, n, int8_t);
    CALLOC(c->pre_rows, n, int32_t); CALLOC(c->pre_blocks, n, int64_t);
    CALLOC(c->rej_rows, n, int32_t);
    CALLOC(c->pre_mode, n, int8_t); CALLOC(c->pre_fallback, n, uint8_t);
    c->hits_cap = max64(cdiv(L, bs) + 2, nb + 1);
    CALLOC(c->hits, c->hits_cap, int32_t);
    if (c->ca_window) {
        int64_t w = min64(c->ca_window, n) + 1;
        CALLOC(c->ca, w, CaEnt); CALLOC(c->ca_slots, w, int32_t);
        CALLOC(c->ca_prow, w, int32_t); CALLOC(c->ca_ptok, w, int64_t);
    }
    if (off) {
        Oc *o = &c->oc;
        o->on = 1; o->prompt_only = prompt_only; o->policy = evict;
        o->bpc = bpc; o->tpc = bpc * bs; o->tsteps = tsteps; o->link_bps = link;
        o->block_bytes = block_bytes;
        if (tier_init(&o->tier, ncpu, evict, n) < 0) { PyErr_NoMemory(); goto fail; }
        if (sthr >= 2) {
            if (cnt_init(&o->tier, sthr, tracker) < 0) { PyErr_NoMemory(); goto fail; }
            o->tier.cnt.once_per_request = counting == COUNT_ONCE_PER_REQUEST;
            CALLOC(o->keep, cdiv(L, o->tpc) + 8, uint8_t); CALLOC(o->cnode, cdiv(L, o->tpc) + 8, int32_t);
        }
        CALLOC(o->ra, n, uint8_t *); CALLOC(o->ra_cap, n, int64_t); CALLOC(o->rank, n, int64_t);
        CALLOC(o->next_stored, n, int64_t); CALLOC(o->local_tok, n, int64_t);
        CALLOC(o->fin_blocks, n, int64_t); CALLOC(o->njobs, n, int32_t);
        CALLOC(o->loading, n, uint8_t); CALLOC(o->recv_done, n, uint8_t);
        CALLOC(o->fin_wait, n, uint8_t); CALLOC(o->kvh, n + 1, int32_t);
        CALLOC(o->skip_w, n, int32_t); CALLOC(o->skip_k, n, int32_t);
        CALLOC(o->fin_rows, n, int32_t); CALLOC(o->alloc_stamp, nb + 1, uint32_t);
        CALLOC(o->lk_rows, n, int32_t); CALLOC(o->lk_tok, n, int64_t);
        CALLOC(o->hit_rows, n, int32_t); CALLOC(o->hit_g, n, int64_t); CALLOC(o->hit_c, n, int64_t);
        CALLOC(o->failed, n, int32_t); CALLOC(o->flushed, n, int32_t);
        o->done_cap = 0;
        CALLOC(o->scratch, 4 * ncpu + cdiv(L, o->tpc) + 8, int32_t);
        CALLOC(o->ekeys, ncpu + 1, int64_t);
        CALLOC(o->kbuf, cdiv(L, o->tpc) + 8, int64_t); CALLOC(o->sbuf, cdiv(L, o->tpc) + 8, int32_t);
        CALLOC(o->hbuf, cdiv(L, o->tpc) + 8, uint32_t);
        CALLOC(o->last_seq, n, int64_t);
        CALLOC(o->infl, n, int32_t); CALLOC(o->infl_pos, n, int32_t);
        CALLOC(c->abort_upto, n, int64_t); CALLOC(c->free_after_step, n, int32_t);
        CALLOC(c->free_after_load, n, uint8_t);
    }
    PyObject *cap = PyCapsule_New(c, "kvcap.core", capsule_free);
    if (!cap) goto fail;
    return cap;
fail:
    core_free(c);
    return NULL;
}

static PyObject *core_run(PyObject *self, PyObject *args) {
    PyObject *cap;
    long long max_steps;
    if (!PyArg_ParseTuple(args, "OL", &cap, &max_steps)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core");
    if (!c) return NULL;
    return loop_run_py(&c->lp, &c->q, c, &OPS, max_steps);
}

static PyObject *core_run_until(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    double t_limit;
    if (!PyArg_ParseTuple(args, "Od", &cap, &t_limit)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core");
    if (!c) return NULL;
    return loop_run_until_py(&c->lp, &c->q, c, &OPS, t_limit);
}

static PyObject *core_results(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core");
    if (!c) return NULL;
    PyObject *d = tables_dict(&c->out), *t = PyFloat_FromDouble(c->lp.t);
    if (!d || !t || PyDict_SetItemString(d, "t", t) < 0) { Py_XDECREF(d); Py_XDECREF(t); return NULL; }
    Py_DECREF(t);
    return d;
}

/* Block-accounting invariants (the property tests call this after a run): every block is free
 * (ref 0, in the queue once) or referenced, references equal table entries, the cache map points
 * at hashed blocks with that key. Returns None or raises AssertionError naming the first breach. */
static PyObject *core_check(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core");
    if (!c) return NULL;
    int64_t nb = c->num_blocks, *refs = (int64_t *)calloc((size_t)nb + 1, sizeof(int64_t));
    uint8_t *inq = (uint8_t *)calloc((size_t)nb + 1, 1);
    const char *err = NULL;
    char msg[160];
    if (!refs || !inq) { free(refs); free(inq); return PyErr_NoMemory(); }
    for (int64_t r = 0; r < c->q.n && !err; r++)
        for (int64_t j = 0; j < c->held[r]; j++) {
            int32_t b = c->tbl[r][j];
            if (b <= 0 || b >= nb) { err = "table holds an invalid block"; break; }
            refs[b]++;
        }
    int64_t free_count = 0;
    for (uint64_t p = c->fq_head; p != c->fq_tail && !err; p++) {
        int32_t b = c->fq[p & c->fq_mask];
        if (b < 0) continue;
        if (b == 0 || b >= nb) { err = "free queue holds an invalid block"; break; }
        if (inq[b]) err = "block twice in the free queue";
        else if (c->blk[b].fpos != (p & c->fq_mask)) err = "block's free-queue index is stale";
        inq[b] = 1;
        free_count++;
    }
    if (!err && c->fq_tail - c->fq_head > c->fq_mask + 1) err = "free queue ring overfull";
    for (int64_t b = 1; b < nb && !err; b++) {
        if (refs[b] != c->blk[b].ref) {
            snprintf(msg, sizeof msg, "block %lld: ref %d but %lld table entries", (long long)b,
                     c->blk[b].ref, (long long)refs[b]);
            err = msg;
        } else if ((c->blk[b].ref == 0) != (inq[b] == 1)) {
            snprintf(msg, sizeof msg, "block %lld: ref %d but in free queue %d", (long long)b,
                     c->blk[b].ref, inq[b]);
            err = msg;
        } else if (c->blk[b].hashed) {
            int32_t p = map_get(&c->map, c->blk[b].key);
            while (p >= 0 && p != b) p = c->blk[p].dup;
            if (p != b) err = "hashed block not reachable from the cache map";
        }
    }
    if (!err && free_count != c->num_free) err = "free count differs from the queue length";
    int64_t used = 0;
    for (int64_t b = 1; b < nb; b++) used += c->blk[b].ref > 0;
    if (!err && free_count + used != nb - 1) err = "free + used != total";
    if (!err && c->oc.on) err = tier_check(&c->oc.tier);
    free(refs); free(inq);
    if (err) { PyErr_SetString(PyExc_AssertionError, err); return NULL; }
    Py_RETURN_NONE;
}


/* ---------------- the per-step contract (replay/engine/compiled.py `StepCore`): the same calls the
 * reference scheduler answers (add_request, schedule, update, queues and block tables), for the
 * oracle and golden scenarios; `run` above is the same steps without the round trips. */
static Core *core_of(PyObject *cap) { return (Core *)PyCapsule_GetPointer(cap, "kvcap.core"); }

/* (core, row) of a call taking a request row (kvcore.h kv_row_arg: Core begins with its Req). */
_Static_assert(offsetof(Core, q) == 0, "kv_row_arg reads the row count through Core's first member");
static int row_arg(PyObject *args, Core **c, int64_t *row) {
    return (*c = (Core *)kv_row_arg(args, "kvcap.core", row)) ? 0 : -1;
}

static PyObject *core_add(PyObject *self, PyObject *args) {
    Core *c; int64_t row;
    if (row_arg(args, &c, &row) < 0) return NULL;
    add_request(c, (int32_t)row);
    Py_RETURN_NONE;
}

static PyObject *core_abort(PyObject *self, PyObject *args) {
    Core *c; int64_t row;
    if (row_arg(args, &c, &row) < 0) return NULL;
    abort_request(c, (int32_t)row);
    Py_RETURN_NONE;
}

static PyObject *core_schedule(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    c->oc.plan_out = 1;                   /* the plan below lists this step's evicted keys */
    c->ca_rec = 1;                        /* and the cache-aware reorder's record */
    if (schedule(c) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    PyObject *off = c->oc.on ? oc_plan_dict(c) : (Py_INCREF(Py_None), Py_None);
    if (!off) return NULL;
    PyObject *ca;
    if (c->ca_called) {
        PyObject *cached = PyList_New((Py_ssize_t)c->ca_nprobe);
        for (int64_t k = 0; cached && k < c->ca_nprobe; k++)
            PyList_SET_ITEM(cached, k, Py_BuildValue("(iL)", c->ca_prow[k], (long long)c->ca_ptok[k]));
        ca = Py_BuildValue("(dNNN)", c->ca_usage, cached, list_i32(c->ca_before, c->ca_len),
                           list_i32(c->ca_after, c->ca_len));
    } else {
        Py_INCREF(Py_None);
        ca = Py_None;
    }
    if (!ca) { Py_DECREF(off); return NULL; }
    return Py_BuildValue(
        "{sNsNsNsNsNsNsNsNsNsNsNsN}", "cache_aware", ca,
        "rows", bytes_of(c->s_rows, c->ns, 4), "num_new", bytes_of(c->s_new, c->ns, 8),
        "num_computed", bytes_of(c->s_before, c->ns, 8), "prefill", bytes_of(c->s_prefill, c->ns, 1),
        "kind", bytes_of(c->s_kind, c->ns, 1),
        "pre_rows", bytes_of(c->pre_rows, c->npre, 4), "pre_blocks", bytes_of(c->pre_blocks, c->npre, 8),
        "pre_mode", bytes_of(c->pre_mode, c->npre, 1),
        "pre_fallback", bytes_of(c->pre_fallback, c->npre, 1),
        "rej_rows", bytes_of(c->rej_rows, c->nrej, 4), "offload", off);
}

static PyObject *core_update(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    if (update(c) < 0) return NULL;
    /* The transfers reported done, in the worker's order: (row, 1 store / 0 load). */
    PyObject *done = PyList_New(c->oc.on ? c->oc.ndone : 0);
    for (int64_t k = 0; done && c->oc.on && k < c->oc.ndone; k++)
        PyList_SET_ITEM(done, k, Py_BuildValue("(ii)", c->oc.done_rows[k], c->oc.done_store[k]));
    return Py_BuildValue("(NNN)", bytes_of(c->s_sampled, c->ns, 1), bytes_of(c->fin, c->nfin, 4),
                         done);
}

/* Queues (waiting as stored: FCFS front to back, or the heap array), free blocks, the running
 * requests' block tables. */
static PyObject *core_snapshot(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    int64_t nk = c->oc.on ? c->oc.kvh_len : 0;
    PyObject *waiting = PyList_New((Py_ssize_t)(nk + c->wq_len)), *tables = PyDict_New();
    if (!waiting || !tables) goto fail;
    for (int64_t i = 0; i < nk; i++)      /* kv_holding_waiting first (loading requests) */
        PyList_SET_ITEM(waiting, (Py_ssize_t)i, PyLong_FromLong(kvh_at(&c->oc, i, c->q.n + 1)));
    for (int64_t i = 0; i < c->wq_len; i++) {
        int32_t r = c->policy ? c->wq[i] : c->wq[(c->wq_head + i) % c->wq_cap];
        PyObject *x = PyLong_FromLong(r);
        if (!x) goto fail;
        PyList_SET_ITEM(waiting, (Py_ssize_t)(nk + i), x);
    }
    for (int64_t i = 0; i < c->nrun; i++) {
        int32_t r = c->running[i];
        PyObject *k = PyLong_FromLong(r), *v = list_i32(c->tbl[r], c->held[r]);
        int bad = !k || !v || PyDict_SetItem(tables, k, v) < 0;
        Py_XDECREF(k); Py_XDECREF(v);
        if (bad) goto fail;
    }
    /* The free queue front to back. */
    int32_t *fq = (int32_t *)malloc(((size_t)c->num_free + 1) * sizeof(int32_t));
    if (!fq) { PyErr_NoMemory(); goto fail; }
    int64_t nf = fq_list(c, fq);
    PyObject *free_queue = list_i32(fq, nf);
    free(fq);
    if (!free_queue) goto fail;
    PyObject *off = c->oc.on ? oc_snapshot(c) : (Py_INCREF(Py_None), Py_None);
    if (!off) goto fail;
    return Py_BuildValue("{sNsNsNsLsNsLsLsNsi}", "running", list_i32(c->running, c->nrun),
                         "free_queue", free_queue,
                         "waiting", waiting, "num_kv_holding", (long long)nk,
                         "tables", tables, "free_gpu", (long long)c->num_free,
                         "cpu_used", (long long)(c->oc.on ? tier_used(&c->oc.tier) : 0),
                         "offload", off,
                         "unfinished", has_unfinished(c));
fail:
    Py_XDECREF(waiting); Py_XDECREF(tables);
    return NULL;
}

/* tell_time(core, t): the loop's clock for timed offload transfers (replay/engine/loop.py calls it
 * with the step's start before schedule() and its end before update()). */
static PyObject *core_tell_time(PyObject *self, PyObject *args) {
    PyObject *cap;
    double t;
    if (!PyArg_ParseTuple(args, "Od", &cap, &t)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    if (c->oc.told_start) c->oc.end_s = t;
    else c->lp.t = t;
    c->oc.told_start = !c->oc.told_start;
    Py_RETURN_NONE;
}

/* offload_next_done_s(core): when the next transfer in flight completes, or None. */
static PyObject *core_next_done(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    double d = c->oc.on ? oc_next_done_s(&c->oc) : NAN;
    if (isnan(d)) Py_RETURN_NONE;
    return PyFloat_FromDouble(d);
}

/* record_batches(core, on[, lo, hi]): keep every step's batch (results' b_* columns), or only
 * those of the steps with index in [lo, hi] (0-based); off by default, so a replay that does not
 * ask pays nothing. */
static PyObject *core_record_batches(PyObject *self, PyObject *args) {
    PyObject *cap;
    int on;
    long long lo = 0, hi = INT64_MAX;
    if (!PyArg_ParseTuple(args, "Op|LL", &cap, &on, &lo, &hi)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core");
    if (!c) return NULL;
    c->lp.record_batches = on;
    c->lp.batch_lo = lo;
    c->lp.batch_hi = hi;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"new", core_new, METH_VARARGS, "new(arrays, spec, cost, keys) -> core handle"},
    {"run", core_run, METH_VARARGS, "run(core, max_steps) -> (done, step, t, cursor)"},
    {"run_until", core_run_until, METH_VARARGS,
     "run_until(core, t) -> (done, step, t, cursor): the steps that start before t"},
    {"results", core_results, METH_VARARGS, "results(core) -> dict of column bytearrays"},
    {"check", core_check, METH_VARARGS, "check(core): block-accounting invariants"},
    {"record_batches", core_record_batches, METH_VARARGS, "record_batches(core, on[, lo, hi])"},
    {"add", core_add, METH_VARARGS, "add(core, row): a request arrives"},
    {"abort", core_abort, METH_VARARGS, "abort(core, row): a client abort"},
    {"schedule", core_schedule, METH_VARARGS, "schedule(core) -> the step's plan (dict)"},
    {"update", core_update, METH_VARARGS, "update(core) -> (sampled, finished): apply the output"},
    {"snapshot", core_snapshot, METH_VARARGS, "snapshot(core) -> queues, free blocks, tables"},
    {"tell_time", core_tell_time, METH_VARARGS, "tell_time(core, t): step start, then end"},
    {"next_done_s", core_next_done, METH_VARARGS, "next_done_s(core) -> float or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core",
                                    "kvcap's compiled V1 replay core", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void) {
    PyObject *m = PyModule_Create(&module);
    /* This core models vLLM 0.33's OffloadingConnector (replay.engine.compiled.has_offloading). */
    if (m && PyModule_AddIntConstant(m, "KV_OFFLOADING", 1) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
