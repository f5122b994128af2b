/* kvcap's compiled V0 replay core: vLLM V0's scheduler (default and chunked-prefill paths; FCFS or
 * priority; preemption by recompute, swap to the host pool, or none = queue only; the swap-full
 * abort / recompute fallback; the livelock guard), its block space manager with the two block
 * pools (free lists, ref counts, prefix cache, LRU evictor), the replay loop and the analytic cost
 * model, one engine step at a time.
 *
 * This is a transcription, not a second model: every rule below is the Python one of
 * replay/engine/v0/scheduler.py, admission.py, preemption.py, budget.py, block_manager.py,
 * block_pool.py, replay/engine/loop.py (the reference loop) and replay/timing/cost_model.py, in the
 * same order, so the tables come out identical (tests/test_v0_core.py compares them with the Python
 * reference; the oracle and golden scenarios run on both). Names follow the Python ones; comments say where C keeps something
 * differently (a stamp instead of a set, a flag array instead of a dict).
 *
 * Python drives it like the V1 core (replay/engine/v1/_core.c): to the end in chunks of steps
 * (core_new() takes the request arrays, written in place like the Python loop writes RequestState,
 * and the spec by field name; core_run() advances; core_results() hands the columns back as
 * bytearrays), or one step at a time through the reference's contract
 * (core_add/abort/schedule/update/snapshot).
 */
#include "../kvcore.h"
#include <math.h>
#include <string.h>


/* ------------------------------------------------------------------ int64 key -> int32 map
 * A Python dict's semantics without its order (nothing iterates `cached`): open addressing,
 * linear probing, backward-shift deletion, doubling when half full. */
typedef struct { int64_t *keys; int32_t *vals; uint64_t mask; int64_t count; } imap;

static int imap_alloc(imap *m, uint64_t cap) {
    m->keys = (int64_t *)malloc(cap * sizeof(int64_t));
    m->vals = (int32_t *)malloc(cap * sizeof(int32_t));
    if (!m->keys || !m->vals) return -1;
    for (uint64_t i = 0; i < cap; i++) m->vals[i] = -1;
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

static int imap_init(imap *m, int64_t expect) {
    uint64_t cap = 16;
    while (cap < (uint64_t)(2 * expect + 2)) cap <<= 1;
    return imap_alloc(m, cap);
}

static inline uint64_t imap_slot(const imap *m, int64_t key) {
    uint64_t i = mix64((uint64_t)key) & m->mask;
    while (m->vals[i] >= 0 && m->keys[i] != key) i = (i + 1) & m->mask;
    return i;
}

static inline int32_t imap_get(const imap *m, int64_t key) { return m->vals[imap_slot(m, key)]; }

static int imap_set(imap *m, int64_t key, int32_t val) {
    uint64_t i = imap_slot(m, key);
    if (m->vals[i] >= 0) { m->vals[i] = val; return 0; }
    if ((uint64_t)(m->count + 1) * 2 > m->mask + 1) {
        imap old = *m;
        if (imap_alloc(m, (old.mask + 1) * 2) < 0) { free(m->keys); free(m->vals); *m = old; return -1; }
        for (uint64_t j = 0; j <= old.mask; j++) {
            if (old.vals[j] < 0) continue;
            uint64_t s = imap_slot(m, old.keys[j]);
            m->keys[s] = old.keys[j]; m->vals[s] = old.vals[j]; m->count++;
        }
        free(old.keys); free(old.vals);
        i = imap_slot(m, key);
    }
    m->keys[i] = key; m->vals[i] = val; m->count++;
    return 0;
}

/* 1 when the key was there. */
static int imap_del(imap *m, int64_t key) {
    uint64_t i = imap_slot(m, key), j = i;
    if (m->vals[i] < 0) return 0;
    m->count--;
    for (;;) {
        m->vals[i] = -1;
        for (;;) {
            j = (j + 1) & m->mask;
            if (m->vals[j] < 0) return 1;
            uint64_t home = mix64((uint64_t)m->keys[j]) & m->mask;
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        m->keys[i] = m->keys[j]; m->vals[i] = m->vals[j];
        i = j;
    }
}

/* ------------------------------------------------------------------ deque of rows */
typedef struct { int32_t *d; int64_t head, len, cap; } dq;

static inline int32_t dq_at(const dq *q, int64_t i) { return q->d[(q->head + i) % q->cap]; }
static inline void dq_push(dq *q, int32_t r) { q->d[(q->head + q->len) % q->cap] = r; q->len++; }
static inline void dq_pushleft(dq *q, int32_t r) {
    q->head = (q->head + q->cap - 1) % q->cap; q->d[q->head] = r; q->len++;
}
static inline int32_t dq_popleft(dq *q) {
    int32_t r = q->d[q->head]; q->head = (q->head + 1) % q->cap; q->len--; return r;
}
static inline int32_t dq_pop(dq *q) { q->len--; return q->d[(q->head + q->len) % q->cap]; }

/* ------------------------------------------------------------------ block pool (block_pool.py) */
typedef struct { double last; int64_t negn; int32_t blk; int64_t key; } HEnt;

static inline int hless(const HEnt *a, const HEnt *b) {
    /* Python compares the tuples (last, -num_hashed_tokens, block_id, key). */
    if (a->last != b->last) return a->last < b->last;
    if (a->negn != b->negn) return a->negn < b->negn;
    if (a->blk != b->blk) return a->blk < b->blk;
    return a->key < b->key;
}

typedef struct {
    int32_t first, nb;
    int caching;
    /* free_ids: a deque of block ids (ring buffer of nb). */
    int32_t *fq; int64_t fq_head, fq_len;
    int32_t *ref;
    imap cached;                       /* key -> block id */
    /* LruEvictor: table (flag + [last, n, key] per block) and the lazy-deletion heap. */
    uint8_t *in_ev; double *ev_last; int64_t *ev_n, *ev_key; int64_t ev_len;
    HEnt *heap; int64_t hlen, hcap;
    /* BlockTracker, indexed by id - first_id. */
    uint8_t *active, *computed; double *last_acc;
    /* touched: a set as flags + list. */
    uint8_t *in_touched; int32_t *touched; int64_t ntouched;
} Pool;

static int pool_init(Pool *p, int32_t first, int32_t nb, int caching) {
    p->first = first; p->nb = nb; p->caching = caching;
    size_t m = (size_t)(nb > 0 ? nb : 1);
    p->fq = (int32_t *)malloc(m * sizeof(int32_t));
    p->ref = (int32_t *)calloc(m, sizeof(int32_t));
    p->in_ev = (uint8_t *)calloc(m, 1);
    p->ev_last = (double *)calloc(m, sizeof(double));
    p->ev_n = (int64_t *)calloc(m, sizeof(int64_t));
    p->ev_key = (int64_t *)calloc(m, sizeof(int64_t));
    p->active = (uint8_t *)calloc(m, 1);
    p->computed = (uint8_t *)calloc(m, 1);
    p->last_acc = (double *)malloc(m * sizeof(double));
    p->in_touched = (uint8_t *)calloc(m, 1);
    p->touched = (int32_t *)malloc(m * sizeof(int32_t));
    if (!p->fq || !p->ref || !p->in_ev || !p->ev_last || !p->ev_n || !p->ev_key || !p->active ||
        !p->computed || !p->last_acc || !p->in_touched || !p->touched) return -1;
    for (int32_t i = 0; i < nb; i++) { p->fq[i] = first + i; p->last_acc[i] = -1.0; }
    p->fq_head = 0; p->fq_len = nb;
    return imap_init(&p->cached, caching ? nb : 0);
}

static void pool_free(Pool *p) {
    void *ps[] = {p->fq, p->ref, p->in_ev, p->ev_last, p->ev_n, p->ev_key, p->heap, p->active,
                  p->computed, p->last_acc, p->in_touched, p->touched, p->cached.keys,
                  p->cached.vals};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
}

static inline int64_t pool_num_free(const Pool *p) { return p->fq_len + p->ev_len; }
static inline int64_t pool_num_used(const Pool *p) { return p->nb - pool_num_free(p); }

static inline int32_t fq_popleft(Pool *p) {
    int32_t b = p->fq[p->fq_head];
    p->fq_head = (p->fq_head + 1) % p->nb; p->fq_len--;
    return b;
}
static inline void fq_appendleft(Pool *p, int32_t b) {
    p->fq_head = (p->fq_head + p->nb - 1) % p->nb; p->fq[p->fq_head] = b; p->fq_len++;
}

static inline void track(Pool *p, int32_t b, int computed) {
    int32_t i = b - p->first;
    p->active[i] = 1; p->last_acc[i] = -1.0; p->computed[i] = (uint8_t)computed;
}
static inline void untrack(Pool *p, int32_t b) {
    int32_t i = b - p->first;
    p->active[i] = 0; p->last_acc[i] = -1.0; p->computed[i] = 0;
}
static inline int is_computed(const Pool *p, int32_t b) {
    int32_t i = b - p->first;
    return p->active[i] ? p->computed[i] : p->in_ev[i];
}
static void pool_mark_computed(Pool *p) {
    for (int64_t j = 0; j < p->ntouched; j++) {
        int32_t i = p->touched[j] - p->first;
        p->computed[i] = 1; p->in_touched[i] = 0;
    }
    p->ntouched = 0;
}
static inline void touch_add(Pool *p, int32_t b) {
    int32_t i = b - p->first;
    if (!p->in_touched[i]) { p->in_touched[i] = 1; p->touched[p->ntouched++] = b; }
}
static inline void mark_accessed(Pool *p, int32_t b, double now) {
    int32_t i = b - p->first;
    if (p->active[i]) p->last_acc[i] = now;
    else if (p->in_ev[i]) p->ev_last[i] = now;     /* no new heap entry, as in vLLM */
}

/* ---------------- evictor heap (heapq: any min-heap pops the same sequence, ties are equal) */
static void heap_up(HEnt *h, int64_t i) {
    HEnt x = h[i];
    while (i > 0) {
        int64_t q = (i - 1) / 2;
        if (!hless(&x, &h[q])) break;
        h[i] = h[q]; i = q;
    }
    h[i] = x;
}
static void heap_down(HEnt *h, int64_t n, int64_t i) {
    HEnt x = h[i];
    for (;;) {
        int64_t l = 2 * i + 1, m;
        if (l >= n) break;
        m = (l + 1 < n && hless(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!hless(&h[m], &x)) break;
        h[i] = h[m]; i = m;
    }
    h[i] = x;
}

static int ev_add(Pool *p, int32_t b, int64_t key, int64_t nht, double last) {
    int32_t i = b - p->first;
    if (!p->in_ev[i]) { p->in_ev[i] = 1; p->ev_len++; }
    p->ev_last[i] = last; p->ev_n[i] = nht; p->ev_key[i] = key;
    if (p->hlen == p->hcap) {
        int64_t nc = p->hcap ? p->hcap * 2 : 1024;
        HEnt *h = (HEnt *)realloc(p->heap, (size_t)nc * sizeof(HEnt));
        if (!h) { PyErr_NoMemory(); return -1; }
        p->heap = h; p->hcap = nc;
    }
    p->heap[p->hlen] = (HEnt){last, -nht, b, key};
    heap_up(p->heap, p->hlen++);
    if (p->hlen > 50 * p->ev_len) {
        /* The cleanup rebuild: the table's live entries only. */
        int64_t k = 0;
        for (int32_t j = 0; j < p->nb; j++)
            if (p->in_ev[j]) p->heap[k++] = (HEnt){p->ev_last[j], -p->ev_n[j], p->first + j, p->ev_key[j]};
        p->hlen = k;
        for (int64_t j = k / 2 - 1; j >= 0; j--) heap_down(p->heap, k, j);
    }
    return 0;
}

static inline void ev_remove(Pool *p, int32_t b) { p->in_ev[b - p->first] = 0; p->ev_len--; }

/* (block, key of the heap entry) of the victim; -1 with an exception when nothing is live. */
static int32_t ev_evict(Pool *p, int64_t *key) {
    while (p->hlen) {
        HEnt e = p->heap[0];
        p->heap[0] = p->heap[--p->hlen];
        if (p->hlen) heap_down(p->heap, p->hlen, 0);
        int32_t i = e.blk - p->first;
        /* Live only with the same time and key (block_pool.py: vLLM checks the time alone). */
        if (p->in_ev[i] && p->ev_last[i] == e.last && p->ev_key[i] == e.key) {
            p->in_ev[i] = 0; p->ev_len--;
            *key = e.key;
            return e.blk;
        }
    }
    PyErr_SetString(PyExc_RuntimeError, "evictor is empty");
    return -1;
}

/* ---------------- allocate / free */
static int32_t allocate_new(Pool *p) {
    int32_t b;
    if (p->fq_len) {
        b = fq_popleft(p);
    } else if (p->caching && p->ev_len) {
        int64_t key;
        if ((b = ev_evict(p, &key)) < 0) return -1;
        if (!imap_del(&p->cached, key)) {
            PyErr_SetString(PyExc_KeyError, "evicted key not in the cache map");
            return -1;
        }
    } else {
        PyErr_SetString(PyExc_RuntimeError, "no free block");
        return -1;
    }
    p->ref[b - p->first] += 1;
    if (p->caching) track(p, b, 0);
    return b;
}

static void incr_cached(Pool *p, int32_t b) {
    int32_t i = b - p->first;
    p->ref[i] += 1;
    if (p->ref[i] == 1) {
        if (p->in_ev[i]) ev_remove(p, b);
        track(p, b, 1);
    }
}

static int32_t allocate_full(Pool *p, int64_t key) {
    if (!p->caching) return allocate_new(p);
    int32_t b = imap_get(&p->cached, key);
    if (b >= 0) { incr_cached(p, b); return b; }
    if ((b = allocate_new(p)) < 0) return -1;
    if (imap_set(&p->cached, key, b) < 0) { PyErr_NoMemory(); return -1; }
    touch_add(p, b);
    return b;
}

static void free_hashless(Pool *p, int32_t b) {
    int32_t i = b - p->first;
    if (p->caching && p->ref[i] == 1) untrack(p, b);
    p->ref[i] -= 1;
    if (p->ref[i] == 0) fq_appendleft(p, b);
}

static int32_t promote(Pool *p, int32_t b, int64_t key) {
    if (!p->caching) return b;
    int32_t twin = imap_get(&p->cached, key);
    if (twin < 0) {
        if (imap_set(&p->cached, key, b) < 0) { PyErr_NoMemory(); return -1; }
        touch_add(p, b);
        return b;
    }
    free_hashless(p, b);
    incr_cached(p, twin);
    return twin;
}

/* free(block, key, num_hashed_tokens); has_key = 0 is Python's key None. */
static int pool_free_block(Pool *p, int32_t b, int has_key, int64_t key, int64_t nht) {
    if (p->caching && has_key) {
        int32_t i = b - p->first;
        p->ref[i] -= 1;
        if (p->ref[i] == 0) {
            if (ev_add(p, b, key, nht, p->last_acc[i]) < 0) return -1;
            untrack(p, b);
        }
        return 0;
    }
    free_hashless(p, b);
    return 0;
}

static inline int is_cached_live(const Pool *p, int64_t key) {
    int32_t b = imap_get(&p->cached, key);
    return b >= 0 && !p->in_ev[b - p->first];
}

/* ------------------------------------------------------------------ the engine */
enum { ST_PENDING = 0, ST_WAITING = 1, ST_RUNNING = 2, ST_SWAPPED = 3, ST_FINISHED = 4,
       ST_REJECTED = 5, ST_ABORTED = 6 };
/* Event kinds: indices into replay.engine.raw.EVENT_KINDS. */
enum { MODE_RECOMPUTE = 0, MODE_NONE = 1, MODE_SWAP = 2 };
enum { A_OK = 0, A_LATER = 1, A_NEVER = 2 };   /* AllocStatus */
enum { ERR = -1, SWAP_FULL = -2 };               /* phase return codes */
#define LIVELOCK_REPEATS 5

typedef struct {
    Req q;                /* request arrays */
    Keys keys;
    Cost cost;
    Views views;
    /* Spec. */
    int64_t bs, num_gpu, num_cpu, max_seqs, max_batched, L, watermark_blocks;
    int chunked, caching, mode, policy, abort_on_full;
    /* Block manager. */
    Pool gpu, cpu;
    int32_t **tbl; int64_t *tlen, *tcap;
    uint8_t *has_tbl;
    int64_t *nfs;                          /* num_full_slots */
    uint8_t *has_la; double *la;           /* last_access */
    uint8_t *has_memo; int64_t *memo;      /* cached_tokens_memo */
    /* Scheduler. */
    dq waiting, running, swapped;
    uint8_t *in_prefill, *resume_pending, *admitted_once;
    int64_t *final_blocks, *stall_len, *stall_count, *admit_hit;
    int64_t reserved_blocks;
    int64_t num_steps;                     /* schedule() calls */
    int32_t *pending_rej; int64_t npending;
    /* Budget: membership of the per-row sets by stamp (the budget's number). */
    int64_t b_tokens, b_seqs, b_batched, b_curr_seqs, b_stamp;
    int64_t *tok_stamp, *seq_stamp;
    /* Per-step lists. */
    int32_t *r_dec, *r_pre_row, *r_recomp, *r_swout; int64_t *r_pre_n;
    int64_t nr_dec, nr_pre, nr_recomp, nr_swout;
    int32_t *s_dec, *s_pre_row, *s_infeas; int64_t *s_pre_u, *s_pre_c;
    int64_t ns_dec, ns_pre, ns_infeas;
    int32_t *p_row; int64_t *p_u, *p_c; int64_t np_;
    int32_t *tmp;                          /* sort / queue scratch */
    /* The plan. */
    int32_t *b_row; int64_t *b_new, *b_ctx; uint8_t *b_prefill, *b_sampled; int64_t nb_;
    int32_t *pre_rows; int64_t *pre_blocks; int8_t *pre_mode; uint8_t *pre_fallback; int64_t npre;
    uint8_t *pre_prio;                     /* by _schedule_priority_preemption */
    /* The per-step contract only (record_pairs): the step's swap (src, dst) physical-id pairs. */
    int record_pairs; veci pairs_out, pairs_in;
    int32_t *rej_rows; int64_t nrej;
    int32_t *si_rows; int64_t nsi;
    int64_t nswap_out, nswap_in;           /* pair counts */
    int32_t *dst_ids; int64_t ndst; uint8_t *dst_mark;   /* swap-in destinations (GPU ids) */
    int64_t ab_row, ab_needed, ab_free;    /* SwapAbort */
    Loop lp;
    int aborted;
    double abort_s;
    int32_t *fin; int64_t nfin;
    Tables out;
} Core;


static inline int64_t seq_len(const Core *c, int64_t row) { return c->q.prompt[row] + c->q.num_output[row]; }

/* ------------------------------------------------------------------ block manager */
static inline int64_t touched_by_append(int64_t full, int64_t num_new, int64_t bs) {
    int64_t first_chunk = bs - full % bs;
    return 1 + cdiv(num_new - first_chunk, bs);
}

static int tbl_reserve(Core *c, int64_t row, int64_t n) {
    if (n <= c->tcap[row]) return 0;
    int64_t nc = c->tcap[row] ? c->tcap[row] : 8;
    while (nc < n) nc *= 2;
    int32_t *p = (int32_t *)realloc(c->tbl[row], (size_t)nc * sizeof(int32_t));
    if (!p) { PyErr_NoMemory(); return -1; }
    c->tbl[row] = p; c->tcap[row] = nc;
    return 0;
}

static int can_allocate(const Core *c, int64_t num_tokens) {
    int64_t required = cdiv(num_tokens, c->bs);
    if (c->num_gpu - required < c->watermark_blocks) return A_NEVER;
    if (pool_num_free(&c->gpu) - required >= c->watermark_blocks) return A_OK;
    return A_LATER;
}

/* allocate_many(n) without caching: n pops from the front (the caller checked the count). */
static void allocate_many(Pool *p, int32_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int32_t b = fq_popleft(p);
        p->ref[b - p->first] += 1;
        out[i] = b;
    }
}

static int bm_allocate(Core *c, int64_t row, int64_t num_tokens) {
    int64_t bs = c->bs, nfull = num_tokens / bs, n = cdiv(num_tokens, bs);
    if (tbl_reserve(c, row, n) < 0) return -1;
    int32_t *ids = c->tbl[row];
    if (!c->caching) {
        if (n > c->gpu.fq_len) { PyErr_SetString(PyExc_RuntimeError, "no free block"); return -1; }
        allocate_many(&c->gpu, ids, n);
    } else {
        for (int64_t k = 0; k < nfull; k++)
            if ((ids[k] = allocate_full(&c->gpu, key_of(&c->keys, row, k))) < 0) return -1;
        if (num_tokens % bs && (ids[nfull] = allocate_new(&c->gpu)) < 0) return -1;
    }
    c->tlen[row] = n;
    c->has_tbl[row] = 1;
    c->nfs[row] = num_tokens;
    return 0;
}

static inline int can_append_slots(const Core *c, int64_t row, int64_t sl) {
    int64_t full = c->nfs[row];
    return touched_by_append(full, sl - full, c->bs) <= pool_num_free(&c->gpu);
}

static int append_slots(Core *c, int64_t row, int64_t sl) {
    int64_t bs = c->bs, full = c->nfs[row], num_new = sl - full;
    int64_t len = c->tlen[row], empty = len * bs - full;
    if (empty < num_new) {
        int64_t n = cdiv(num_new - empty, bs);
        if (tbl_reserve(c, row, len + n) < 0) return -1;
        int32_t *ids = c->tbl[row];
        if (!c->caching) {
            if (n > c->gpu.fq_len) { PyErr_SetString(PyExc_RuntimeError, "no free block"); return -1; }
            allocate_many(&c->gpu, ids + len, n);
        } else {
            for (int64_t i = 0; i < n; i++)
                if ((ids[len + i] = allocate_new(&c->gpu)) < 0) return -1;
        }
        c->tlen[row] = len + n;
    }
    if (c->caching) {
        int32_t *ids = c->tbl[row];
        for (int64_t k = full / bs; k < sl / bs; k++)
            if ((ids[k] = promote(&c->gpu, ids[k], key_of(&c->keys, row, k))) < 0) return -1;
    }
    c->nfs[row] = sl;
    return 0;
}

static int bm_release(Core *c, Pool *p, int64_t row, const int32_t *ids, int64_t n, int64_t num_full) {
    if (!c->caching) {
        /* free_many: each block back to the front, in table order. */
        for (int64_t k = 0; k < n; k++) free_hashless(p, ids[k]);
        return 0;
    }
    for (int64_t k = 0; k < n; k++) {
        int has_key = k < num_full;
        if (pool_free_block(p, ids[k], has_key, has_key ? key_of(&c->keys, row, k) : 0, (k + 1) * c->bs) < 0)
            return -1;
    }
    return 0;
}

static int bm_free(Core *c, int64_t row) {
    int has = c->has_tbl[row];
    int has_last = c->has_la[row];
    double last = c->la[row];
    c->has_tbl[row] = 0;
    c->has_la[row] = 0;
    c->has_memo[row] = 0;
    if (!has) return 0;
    int64_t n = c->tlen[row], full = c->nfs[row] / c->bs;
    int32_t *ids = c->tbl[row];
    int on_gpu = n == 0 || ids[0] < c->num_gpu;
    Pool *p = on_gpu ? &c->gpu : &c->cpu;
    c->tlen[row] = 0;
    if (c->caching && has_last && on_gpu)
        for (int64_t k = 0; k < n; k++) mark_accessed(p, ids[k], last);
    return bm_release(c, p, row, ids, n, full);
}

/* _can_swap: status, and the blocks needed in *needed. */
static int can_swap(const Core *c, int64_t row, int64_t sl, const Pool *dst, int64_t watermark,
                    int64_t *needed) {
    int64_t full = c->nfs[row], nd = touched_by_append(full, sl - full, c->bs);
    int64_t num_full = full / c->bs;
    if (c->caching) {
        for (int64_t k = 0; k < num_full; k++) nd += !is_cached_live(dst, key_of(&c->keys, row, k));
    } else {
        nd += min64(num_full, c->tlen[row]);
    }
    *needed = nd;
    if (dst->nb < nd) return A_NEVER;
    if (pool_num_free(dst) - nd >= watermark) return A_OK;
    return A_LATER;
}

/* _swap: release every block on src, then allocate each on dst. Returns the pairs (= blocks:
 * the table's ids are distinct, so vLLM's src -> dst dict has one pair per block), or -1.
 * Swap-in destinations go to the dst set the swap_in events read. */
/* The per-step contract: (src, dst) physical-id pairs of one swap, one per source block (the
 * last destination wins, as block_manager.py's dict does). */
static int record_swap_pairs(Core *c, veci *out, const int32_t *old, const int32_t *ids, int64_t n,
                             const Pool *src, const Pool *dst) {
    int64_t start = out->n;
    for (int64_t k = 0; k < n; k++) {
        int64_t s = old[k] - src->first, d = ids[k] - dst->first, j = start;
        while (j < out->n && out->d[j] != s) j += 2;
        if (j < out->n) { out->d[j + 1] = d; continue; }
        if (pushi(out, s) || pushi(out, d)) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

static int64_t bm_swap(Core *c, int64_t row, Pool *src, Pool *dst, int to_gpu) {
    int64_t n = c->tlen[row], num_full = c->nfs[row] / c->bs;
    int32_t *ids = c->tbl[row], *old = NULL;
    if (c->record_pairs) {
        old = (int32_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
        if (!old) { PyErr_NoMemory(); return -1; }
        memcpy(old, ids, (size_t)n * sizeof(int32_t));
    }
    if (bm_release(c, src, row, ids, n, num_full) < 0) { free(old); return -1; }
    /* The table is rewritten in place: each old id was read by the release above. */
    if (!c->caching) {
        if (n > dst->fq_len) {
            PyErr_SetString(PyExc_RuntimeError, "no free block");
            free(old);
            return -1;
        }
        allocate_many(dst, ids, n);
    } else {
        for (int64_t k = 0; k < n; k++) {
            int32_t b = k < num_full ? allocate_full(dst, key_of(&c->keys, row, k)) : allocate_new(dst);
            if (b < 0) { free(old); return -1; }
            ids[k] = b;
        }
    }
    if (old) {
        int rc = record_swap_pairs(c, to_gpu ? &c->pairs_in : &c->pairs_out, old, ids, n, src, dst);
        free(old);
        if (rc < 0) return -1;
    }
    if (to_gpu)
        for (int64_t k = 0; k < n; k++)
            if (!c->dst_mark[ids[k]]) { c->dst_mark[ids[k]] = 1; c->dst_ids[c->ndst++] = ids[k]; }
    return n;
}

static inline void bm_touch(Core *c, int64_t row, double now) {
    if (c->caching) { c->has_la[row] = 1; c->la[row] = now; }
}

static inline void forget(Core *c, int64_t row) { c->has_memo[row] = 0; }

static int64_t get_num_cached_tokens(Core *c, int64_t row, int64_t sl) {
    if (!c->caching) return 0;
    if (c->has_memo[row]) return c->memo[row];    /* asked with in_prefill=True only */
    int64_t lo = 0, hi = sl / c->bs;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int32_t b = imap_get(&c->gpu.cached, key_of(&c->keys, row, mid));
        if (b >= 0 && is_computed(&c->gpu, b)) lo = mid + 1;
        else hi = mid;
    }
    int64_t tokens = lo * c->bs;
    c->has_memo[row] = 1;
    c->memo[row] = tokens;
    return tokens;
}

/* ------------------------------------------------------------------ budget (budget.py) */
static void budget_new(Core *c) {
    c->b_stamp++;
    c->b_tokens = c->max_batched; c->b_seqs = c->max_seqs;
    c->b_batched = c->b_curr_seqs = 0;
}
static inline int can_schedule(const Core *c, int64_t tokens, int64_t seqs) {
    return c->b_batched + tokens <= c->b_tokens && c->b_curr_seqs + seqs <= c->b_seqs;
}
static inline int64_t remaining_budget(const Core *c) { return c->b_tokens - c->b_batched; }
static inline void add_tokens(Core *c, int64_t row, int64_t n) {
    if (c->tok_stamp[row] == c->b_stamp) return;
    c->tok_stamp[row] = c->b_stamp; c->b_batched += n;
}
static inline void subtract_tokens(Core *c, int64_t row, int64_t n) {
    if (c->tok_stamp[row] == c->b_stamp) { c->tok_stamp[row] = 0; c->b_batched -= n; }
}
static inline void add_seqs(Core *c, int64_t row, int64_t n) {
    if (c->seq_stamp[row] == c->b_stamp) return;
    c->seq_stamp[row] = c->b_stamp; c->b_curr_seqs += n;
}
static inline void subtract_seqs(Core *c, int64_t row, int64_t n) {
    if (c->seq_stamp[row] == c->b_stamp) { c->seq_stamp[row] = 0; c->b_curr_seqs -= n; }
}

/* ------------------------------------------------------------------ scheduler rows */
static void num_new_tokens(Core *c, int64_t row, int chunking, int swapped, int64_t *unc_out,
                           int64_t *cac_out) {
    int64_t cached = 0, uncached;
    if (!c->in_prefill[row]) {
        uncached = 1;
    } else {
        int64_t computed = c->q.num_computed[row], sl = seq_len(c, row);
        int64_t all_new = sl - computed;
        int64_t hit = swapped ? 0 : get_num_cached_tokens(c, row, sl);
        cached = max64(0, hit - computed);
        uncached = all_new - cached;
    }
    if (uncached == 0 && cached > 0) { uncached = 1; cached -= 1; }
    if (chunking) {
        int64_t remaining = remaining_budget(c), slot = c->max_batched;
        if (c->caching) remaining = min64(remaining, slot) / c->bs * c->bs;
        uncached = min64(min64(uncached, remaining), slot);
    }
    *unc_out = uncached;
    *cac_out = cached;
}

static inline int key_gt(const Core *c, int64_t a, int64_t b) {
    /* (priority, arrival_s, row) of a > that of b: ties in arrival follow trace order */
    if (c->q.prio[a] != c->q.prio[b]) return c->q.prio[a] > c->q.prio[b];
    if (c->q.arrival[a] != c->q.arrival[b]) return c->q.arrival[a] > c->q.arrival[b];
    return a > b;
}

/* sorted(q, key=_priority_key): stable insertion sort (the queues stay nearly sorted). */
static void dq_sort(Core *c, dq *q) {
    int64_t n = q->len;
    int32_t *a = c->tmp;
    for (int64_t i = 0; i < n; i++) a[i] = dq_at(q, i);
    for (int64_t i = 1; i < n; i++) {
        int32_t x = a[i];
        int64_t j = i;
        while (j > 0 && key_gt(c, a[j - 1], x)) { a[j] = a[j - 1]; j--; }
        a[j] = x;
    }
    memcpy(q->d, a, (size_t)n * sizeof(int32_t));
    q->head = 0;
}

static inline void reject(Core *c, int64_t row) {
    c->q.status[row] = ST_REJECTED;
    c->rej_rows[c->nrej++] = (int32_t)row;
}

static void release_reservation(Core *c, int64_t row) {
    if (c->mode == MODE_NONE && c->has_tbl[row])
        c->reserved_blocks -= max64(0, c->final_blocks[row] - c->tlen[row]);
}

static inline int64_t whole_sequence_blocks(const Core *c, int64_t row) {
    int64_t total = min64(c->q.prompt[row] + c->q.out_len[row], c->L);
    return cdiv(max64(total, seq_len(c, row)), c->bs);
}

static int can_admit(const Core *c, int64_t row) {
    int status = can_allocate(c, seq_len(c, row));
    if (c->stall_count[row] >= LIVELOCK_REPEATS) return A_NEVER;
    if (c->mode != MODE_NONE || status == A_NEVER) return status;
    int64_t floor = max64(1, c->watermark_blocks), need = whole_sequence_blocks(c, row);
    if (c->num_gpu - need < floor) return A_NEVER;
    if (pool_num_free(&c->gpu) - c->reserved_blocks - need >= floor) return A_OK;
    return A_LATER;
}

static int admit(Core *c, int64_t row, int64_t cached) {
    if (bm_allocate(c, row, seq_len(c, row)) < 0) return -1;
    c->q.status[row] = ST_RUNNING;
    c->admit_hit[row] = cached;
    if (c->mode == MODE_NONE) {
        c->final_blocks[row] = whole_sequence_blocks(c, row);
        c->reserved_blocks += c->final_blocks[row] - c->tlen[row];
    }
    if (!c->admitted_once[row]) {
        c->admitted_once[row] = 1;
        c->q.cached_prompt[row] = cached;
    }
    if (c->resume_pending[row]) {
        c->resume_pending[row] = 0;
        c->q.recomputed[row] += c->q.computed_at_pre[row] - cached;
    }
    return 0;
}

static int sched_append(Core *c, int64_t row, int64_t sl) {
    int64_t before = c->tlen[row];
    if (append_slots(c, row, sl) < 0) return -1;
    if (c->mode == MODE_NONE) c->reserved_blocks -= c->tlen[row] - before;
    return 0;
}

static void note_self_preemption(Core *c, int64_t row, int64_t sl, int alone) {
    int64_t signature = sl * (c->L + 1) + c->admit_hit[row];
    if (!alone) {
        c->stall_count[row] = 0;
    } else if (c->stall_len[row] == signature) {
        c->stall_count[row] += 1;
    } else {
        c->stall_len[row] = signature;
        c->stall_count[row] = 1;
    }
}

static inline void record_preemption(Core *c, int64_t row, int mode, int64_t blocks, int fallback) {
    c->pre_rows[c->npre] = (int32_t)row;
    c->pre_mode[c->npre] = (int8_t)mode;
    c->pre_fallback[c->npre] = (uint8_t)fallback;
    c->pre_prio[c->npre] = 0;
    c->pre_blocks[c->npre++] = blocks;
}

/* _preempt: 2 swap, 1 recompute, ERR, or SWAP_FULL (the abort is in ab_*). */
static int preempt(Core *c, int64_t row) {
    int fallback = 0;
    if (c->mode == MODE_SWAP) {
        int64_t needed;
        int status = can_swap(c, row, seq_len(c, row), &c->cpu, 0, &needed);
        if (status == A_OK) {
            int64_t num_blocks = c->tlen[row];
            int64_t pairs = bm_swap(c, row, &c->gpu, &c->cpu, 0);
            if (pairs < 0) return ERR;
            c->nswap_out += pairs;
            c->q.status[row] = ST_SWAPPED;
            c->q.num_pre[row] += 1;
            c->q.num_swaps[row] += 1;
            record_preemption(c, row, 2, num_blocks, 0);
            return 2;
        }
        if (c->abort_on_full) {
            c->ab_row = row; c->ab_needed = needed; c->ab_free = pool_num_free(&c->cpu);
            return SWAP_FULL;
        }
        fallback = 1;
    }
    int64_t num_blocks = c->tlen[row];
    if (bm_free(c, row) < 0) return ERR;
    c->q.status[row] = ST_WAITING;
    c->q.computed_at_pre[row] = c->q.num_computed[row];
    c->q.num_computed[row] = 0;
    c->q.num_pre[row] += 1;
    c->q.num_rec[row] += 1;
    c->in_prefill[row] = 1;
    c->resume_pending[row] = 1;
    record_preemption(c, row, 1, num_blocks, fallback);
    return 1;
}

/* ------------------------------------------------------------------ phases */
static int schedule_priority_preemption(Core *c) {
    dq_sort(c, &c->running);
    dq *w = &c->waiting, *run = &c->running;
    if (w->len) {
        int32_t head = dq_popleft(w);
        int64_t unc, cac;
        num_new_tokens(c, head, 0, 0, &unc, &cac);
        while (c->mode != MODE_NONE && run->len && key_gt(c, dq_at(run, run->len - 1), head)) {
            if (unc > 0 && can_allocate(c, seq_len(c, head)) == A_OK && can_schedule(c, unc, 1))
                break;
            int32_t victim = dq_pop(run);
            subtract_tokens(c, victim, 1);
            subtract_seqs(c, victim, 1);
            int m = preempt(c, victim);
            if (m < 0) return m;
            c->pre_prio[c->npre - 1] = 1;
            dq_pushleft(w, victim);
        }
        dq_pushleft(w, head);
        forget(c, head);
    }
    dq_sort(c, &c->waiting);
    return 0;
}

static int schedule_running(Core *c, int chunking) {
    dq *run = &c->running;
    while (run->len) {
        int32_t row = dq_at(run, 0);
        int64_t num_tokens, cac;
        num_new_tokens(c, row, chunking, 0, &num_tokens, &cac);
        if (num_tokens == 0) break;
        dq_popleft(run);
        int64_t sl = seq_len(c, row);
        int self = 0;
        while (!can_append_slots(c, row, sl)) {
            if (c->mode == MODE_NONE) {
                PyErr_SetString(PyExc_AssertionError, "queue-only mode must never need a preemption");
                return ERR;
            }
            subtract_tokens(c, row, num_tokens);
            subtract_seqs(c, row, 1);
            int32_t victim = run->len ? dq_pop(run) : row;
            if (victim == row) note_self_preemption(c, row, sl, !(c->nr_dec || c->nr_pre));
            int m = preempt(c, victim);
            if (m < 0) return m;
            if (m == 1) c->r_recomp[c->nr_recomp++] = victim;
            else c->r_swout[c->nr_swout++] = victim;
            if (victim == row) { self = 1; break; }
        }
        if (self) continue;
        if (sched_append(c, row, sl) < 0) return ERR;
        if (c->in_prefill[row]) {
            c->r_pre_row[c->nr_pre] = row; c->r_pre_n[c->nr_pre++] = num_tokens;
        } else {
            c->r_dec[c->nr_dec++] = row;
        }
        add_tokens(c, row, num_tokens);
        if (chunking) add_seqs(c, row, 1);
    }
    return 0;
}

static int schedule_swapped(Core *c, int chunking) {
    dq *sw = &c->swapped;
    while (sw->len) {
        int32_t row = dq_at(sw, 0);
        int64_t sl = seq_len(c, row), needed;
        int status = can_swap(c, row, sl, &c->gpu, c->watermark_blocks, &needed);
        if (status == A_LATER) break;
        if (status == A_NEVER) {
            /* Dropped without freeing its host blocks (vLLM's leak). */
            dq_popleft(sw);
            c->s_infeas[c->ns_infeas++] = row;
            continue;
        }
        int64_t unc, cac;
        num_new_tokens(c, row, chunking, 1, &unc, &cac);
        if (c->in_prefill[row] && unc > c->max_batched) {
            dq_popleft(sw);
            reject(c, row);
            continue;
        }
        if (unc == 0 || !can_schedule(c, unc, 1)) { forget(c, row); break; }
        dq_popleft(sw);
        int64_t pairs = bm_swap(c, row, &c->cpu, &c->gpu, 1);
        if (pairs < 0) return ERR;
        c->nswap_in += pairs;
        c->si_rows[c->nsi++] = row;
        c->q.status[row] = ST_RUNNING;
        if (sched_append(c, row, sl) < 0) return ERR;
        if (c->in_prefill[row]) {
            c->s_pre_row[c->ns_pre] = row; c->s_pre_u[c->ns_pre] = unc; c->s_pre_c[c->ns_pre++] = cac;
        } else {
            c->s_dec[c->ns_dec++] = row;
        }
        add_tokens(c, row, unc);
        add_seqs(c, row, 1);
    }
    return 0;
}

static int schedule_prefills(Core *c, int chunking) {
    if (remaining_budget(c) == 0) return 0;
    dq *w = &c->waiting;
    int64_t limit = chunking ? c->L : min64(c->L, c->max_batched);
    while (w->len) {
        int32_t row = dq_at(w, 0);
        int64_t unc, cac;
        num_new_tokens(c, row, chunking, 0, &unc, &cac);
        if (unc + cac > limit) {
            dq_popleft(w);
            forget(c, row);
            reject(c, row);
            continue;
        }
        int status = can_admit(c, row);
        if (status == A_LATER) { forget(c, row); break; }
        if (status == A_NEVER) {
            dq_popleft(w);
            forget(c, row);
            reject(c, row);
            continue;
        }
        if (c->b_batched >= c->max_batched || unc == 0 || !can_schedule(c, unc, 1)) {
            forget(c, row);
            break;
        }
        dq_popleft(w);
        if (admit(c, row, cac) < 0) return ERR;
        c->p_row[c->np_] = row; c->p_u[c->np_] = unc; c->p_c[c->np_++] = cac;
        add_tokens(c, row, unc);
        add_seqs(c, row, 1);
    }
    return 0;
}

static inline void batch_add(Core *c, int64_t row, int64_t n, int64_t cached, int prefill) {
    c->b_row[c->nb_] = (int32_t)row;
    c->b_new[c->nb_] = n;
    c->b_ctx[c->nb_] = cached;          /* + num_computed in finish_plan */
    c->b_prefill[c->nb_++] = (uint8_t)prefill;
}

static void reject_infeasible(Core *c) {
    for (int64_t j = 0; j < c->ns_infeas; j++) reject(c, c->s_infeas[j]);
}

static int schedule_default(Core *c) {
    budget_new(c);
    for (int64_t i = 0; i < c->running.len; i++) add_seqs(c, dq_at(&c->running, i), 1);
    int rc;
    if (!c->swapped.len && (rc = schedule_prefills(c, 0)) < 0) return rc;
    if (!c->np_) {
        if (c->policy && (rc = schedule_priority_preemption(c)) < 0) return rc;
        if ((rc = schedule_running(c, 0)) < 0) return rc;
        if (!c->nr_recomp && !c->nr_swout && (rc = schedule_swapped(c, 0)) < 0) return rc;
    }
    for (int64_t j = 0; j < c->nr_recomp; j++) dq_pushleft(&c->waiting, c->r_recomp[j]);
    for (int64_t j = 0; j < c->np_; j++) dq_push(&c->running, c->p_row[j]);
    for (int64_t j = 0; j < c->nr_dec; j++) dq_push(&c->running, c->r_dec[j]);
    for (int64_t j = 0; j < c->ns_dec; j++) dq_push(&c->running, c->s_dec[j]);
    for (int64_t j = 0; j < c->nr_swout; j++) dq_push(&c->swapped, c->r_swout[j]);
    reject_infeasible(c);
    for (int64_t j = 0; j < c->np_; j++) batch_add(c, c->p_row[j], c->p_u[j], c->p_c[j], 1);
    for (int64_t j = 0; j < c->nr_dec; j++) batch_add(c, c->r_dec[j], 1, 0, 0);
    for (int64_t j = 0; j < c->ns_dec; j++) batch_add(c, c->s_dec[j], 1, 0, 0);
    return 0;
}

static int schedule_chunked(Core *c) {
    budget_new(c);
    int rc;
    if ((rc = schedule_running(c, 1)) < 0) return rc;
    /* vLLM 0.10.1.1 calls _schedule_swapped without enable_chunking here. */
    if (!c->nr_recomp && !c->nr_swout && (rc = schedule_swapped(c, 0)) < 0) return rc;
    if ((rc = schedule_prefills(c, 1)) < 0) return rc;
    for (int64_t j = 0; j < c->nr_recomp; j++) dq_pushleft(&c->waiting, c->r_recomp[j]);
    for (int64_t j = 0; j < c->ns_dec; j++) dq_push(&c->running, c->s_dec[j]);
    for (int64_t j = 0; j < c->ns_pre; j++) dq_push(&c->running, c->s_pre_row[j]);
    for (int64_t j = 0; j < c->nr_dec; j++) dq_push(&c->running, c->r_dec[j]);
    /* Prefills that complete in this step first, so they decode first next step. */
    for (int64_t j = 0; j < c->nr_pre; j++) {
        int32_t r = c->r_pre_row[j];
        if (seq_len(c, r) - c->q.num_computed[r] == c->r_pre_n[j]) dq_push(&c->running, r);
    }
    for (int64_t j = 0; j < c->nr_pre; j++) {
        int32_t r = c->r_pre_row[j];
        if (seq_len(c, r) - c->q.num_computed[r] != c->r_pre_n[j]) dq_push(&c->running, r);
    }
    for (int64_t j = 0; j < c->np_; j++) dq_push(&c->running, c->p_row[j]);
    for (int64_t j = 0; j < c->nr_swout; j++) dq_push(&c->swapped, c->r_swout[j]);
    reject_infeasible(c);
    for (int64_t j = 0; j < c->np_; j++) batch_add(c, c->p_row[j], c->p_u[j], c->p_c[j], 1);
    for (int64_t j = 0; j < c->nr_pre; j++) batch_add(c, c->r_pre_row[j], c->r_pre_n[j], 0, 1);
    for (int64_t j = 0; j < c->ns_pre; j++) batch_add(c, c->s_pre_row[j], c->s_pre_u[j], c->s_pre_c[j], 1);
    for (int64_t j = 0; j < c->nr_dec; j++) batch_add(c, c->r_dec[j], 1, 0, 0);
    for (int64_t j = 0; j < c->ns_dec; j++) batch_add(c, c->s_dec[j], 1, 0, 0);
    return 0;
}

/* schedule(): 0, ERR, or SWAP_FULL (the run stops; statuses already aborted). */
static int schedule(Core *c) {
    c->num_steps++;
    c->nrej = c->npre = c->nsi = c->nb_ = 0;
    c->nswap_out = c->nswap_in = 0;
    c->pairs_out.n = c->pairs_in.n = 0;
    c->nr_dec = c->nr_pre = c->nr_recomp = c->nr_swout = 0;
    c->ns_dec = c->ns_pre = c->ns_infeas = c->np_ = 0;
    for (int64_t j = 0; j < c->npending; j++) c->rej_rows[c->nrej++] = c->pending_rej[j];
    c->npending = 0;
    int rc = c->chunked ? schedule_chunked(c) : schedule_default(c);
    if (rc == SWAP_FULL) {
        /* _abort: every request the engine holds is aborted. */
        for (int64_t r = 0; r < c->q.n; r++) {
            int8_t s = c->q.status[r];
            if (s == ST_WAITING || s == ST_RUNNING || s == ST_SWAPPED) c->q.status[r] = ST_ABORTED;
        }
        return SWAP_FULL;
    }
    if (rc < 0) return rc;
    /* _finish_plan. */
    double now = (double)c->num_steps;
    for (int64_t j = 0; j < c->nb_; j++) bm_touch(c, c->b_row[j], now);
    if (c->nb_ && c->caching) pool_mark_computed(&c->gpu);
    for (int64_t j = 0; j < c->nb_; j++) c->b_ctx[j] += c->q.num_computed[c->b_row[j]];
    return 0;
}

/* update(): play the outputs back; finished rows (running order) in c->fin. */
static int update(Core *c) {
    c->nfin = 0;
    int any_fin = 0;
    for (int64_t j = 0; j < c->nb_; j++) {
        int32_t r = c->b_row[j];
        c->b_sampled[j] = 0;
        if (c->q.status[r] != ST_RUNNING) continue;
        int64_t computed = c->b_new[j] + c->b_ctx[j];
        int64_t nout = c->q.num_output[r], sl = c->q.prompt[r] + nout;
        c->q.num_computed[r] = computed;
        if (computed == sl) c->in_prefill[r] = 0;
        if (c->b_prefill[j] && computed < sl) continue;
        c->b_sampled[j] = 1;
        c->q.num_output[r] = nout + 1;
        if (nout + 1 >= c->q.out_len[r] || sl + 1 >= c->L) { c->q.status[r] = ST_FINISHED; any_fin = 1; }
    }
    if (any_fin) {
        dq *run = &c->running;
        int64_t w = 0, n = run->len;
        for (int64_t i = 0; i < n; i++) {
            int32_t r = dq_at(run, i);
            if (c->q.status[r] == ST_FINISHED) {
                release_reservation(c, r);
                if (bm_free(c, r) < 0) return -1;
                /* Finished for good: free its table now, not at the end of the run. */
                free(c->tbl[r]); c->tbl[r] = NULL; c->tcap[r] = 0;
                c->fin[c->nfin++] = r;
            } else {
                c->tmp[w++] = r;
            }
        }
        memcpy(run->d, c->tmp, (size_t)w * sizeof(int32_t));
        run->head = 0; run->len = w;
    }
    return 0;
}


static inline int event(Core *c, int kind, int64_t row, int64_t blocks) {
    return tables_event(&c->out, c->lp.t, c->lp.step, kind, row, blocks);
}

static void add_request(void *core, int32_t r) {
    Core *c = (Core *)core;
    /* A prompt longer than max_model_len is rejected before the scheduler sees it (reported
     * with the next schedule()). */
    if (c->q.prompt[r] > c->L) {
        c->q.status[r] = ST_REJECTED;
        c->pending_rej[c->npending++] = r;
    } else {
        c->q.status[r] = ST_WAITING;
        dq_push(&c->waiting, r);
    }
}

static int has_unfinished(const void *core) {
    const Core *c = (const Core *)core;
    return c->waiting.len || c->running.len || c->swapped.len;
}

/* One engine step: schedule(), the executor's duration, update() (replay/engine/loop.py's step;
 * the loop's own bookkeeping is in kvcore.h). 1 when the run ends (trace done or engine abort). */
static int one_step(void *core) {
    Core *c = (Core *)core;
    int rc = schedule(c);
    if (rc == SWAP_FULL) {
        if (event(c, EV_SWAP_FULL_ABORT, c->ab_row, c->ab_needed)) return -1;
        c->aborted = 1;
        c->abort_s = c->lp.t;
        return 1;
    }
    if (rc < 0) return -1;
    Plan pl = {.rows = c->b_row, .num_new = c->b_new, .num_computed = c->b_ctx,
               .prefill = c->b_prefill, .sampled = c->b_sampled, .nrows = c->nb_,
               .pre_rows = c->pre_rows, .pre_blocks = c->pre_blocks, .pre_mode = c->pre_mode,
               .pre_fallback = c->pre_fallback, .npre = c->npre, .rej_rows = c->rej_rows,
               .nrej = c->nrej, .nswap_out = c->nswap_out, .nswap_in = c->nswap_in,
               .wake_s = NAN};
    if (loop_preemption_events(&c->lp, &c->out, &pl)) return -1;
    /* _swapped_in_blocks: the swap-in destinations in each swapped-in row's table (as the
     * tables stand after schedule()), each counted for the first such row only. */
    for (int64_t j = 0; j < c->nsi; j++) {
        int64_t r = c->si_rows[j], mine = 0;
        for (int64_t k = 0; k < c->tlen[r]; k++) {
            int32_t b = c->tbl[r][k];
            if (b < c->num_gpu && c->dst_mark[b]) { c->dst_mark[b] = 0; mine++; }
        }
        if (event(c, EV_SWAP_IN, r, mine)) return -1;
    }
    for (int64_t j = 0; j < c->ndst; j++) c->dst_mark[c->dst_ids[j]] = 0;
    c->ndst = 0;
    loop_evictions(&c->lp, &pl);
    StepSums sums = loop_sums(&c->lp, &c->q, &pl);
    StepRow row = {
        .duration_s = cost_step(&c->cost, &sums, c->nswap_out + c->nswap_in),
        .num_running = (int32_t)c->running.len, .num_waiting = (int32_t)c->waiting.len,
        .num_swapped = (int32_t)c->swapped.len, .num_prefill_tokens = sums.num_prefill,
        .num_decode_tokens = sums.num_decode};
    if (update(c) < 0) return -1;
    row.gpu_blocks_used = pool_num_used(&c->gpu);
    row.cpu_blocks_used = pool_num_used(&c->cpu);
    return loop_finish_step(&c->lp, &c->out, &c->q, &pl, &row, sums.num_sampled, c->fin, c->nfin);
}

static const CoreOps OPS = {add_request, has_unfinished, one_step};

/* ------------------------------------------------------------------ Python glue */
static void core_free(Core *c) {
    if (!c) return;
    views_release(&c->views);
    tables_free(&c->out);
    loop_free(&c->lp);
    if (c->tbl) { for (int64_t r = 0; r < c->q.n; r++) free(c->tbl[r]); }
    pool_free(&c->gpu);
    pool_free(&c->cpu);
    void *ps[] = {c->tbl, c->tlen, c->tcap, c->has_tbl, c->nfs, c->has_la, c->la, c->has_memo,
                  c->memo, c->waiting.d, c->running.d, c->swapped.d, c->in_prefill,
                  c->resume_pending, c->admitted_once, c->final_blocks, c->stall_len,
                  c->stall_count, c->admit_hit, c->pending_rej, c->tok_stamp, c->seq_stamp,
                  c->r_dec, c->r_pre_row, c->r_recomp, c->r_swout, c->r_pre_n, c->s_dec,
                  c->s_pre_row, c->s_infeas, c->s_pre_u, c->s_pre_c, c->p_row, c->p_u, c->p_c,
                  c->tmp, c->b_row, c->b_new, c->b_ctx, c->b_prefill, c->b_sampled, c->pre_rows,
                  c->pre_blocks, c->pre_mode, c->pre_fallback, c->rej_rows, c->si_rows,
                  c->dst_ids, c->dst_mark, c->fin, c->pre_prio, c->pairs_out.d, c->pairs_in.d};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
    free(c);
}

static void capsule_free(PyObject *cap) {
    core_free((Core *)PyCapsule_GetPointer(cap, "kvcap.core0"));
}


#define CALLOC(p, n, T) do { (p) = (T *)calloc((size_t)(n) > 0 ? (size_t)(n) : 1, sizeof(T)); \
                             if (!(p)) { PyErr_NoMemory(); goto fail; } } while (0)

static PyObject *core_new(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *arrays, *spec, *cost, *keys;
    if (!PyArg_ParseTuple(args, "OOOO", &arrays, &spec, &cost, &keys)) return NULL;
    Core *c = (Core *)calloc(1, sizeof(Core));
    if (!c) return PyErr_NoMemory();
    if (req_take(&c->views, arrays, &c->q) < 0) goto fail;
    int64_t n = c->q.n;
    /* replay.engine.spec.SchedulerSpec by field name (v0/scheduler.py's reads, same rules). */
    static const char *const ON_SWAP_FULL[] = {"recompute", "abort", NULL};
    int64_t bs, ng, nc, ms, mb, L;
    double wm;
    int ch, ca, mode, policy, abort_on_full;
    if (spec_int(spec, "block_size", &bs) || spec_int(spec, "num_gpu_blocks", &ng) ||
        spec_int(spec, "num_cpu_blocks", &nc) || spec_int(spec, "max_num_seqs", &ms) ||
        spec_int(spec, "max_num_batched_tokens", &mb) || spec_int(spec, "max_model_len", &L) ||
        spec_float(spec, "v0_watermark", &wm) ||
        spec_bool(spec, "enable_chunked_prefill", &ch) ||
        spec_bool(spec, "enable_prefix_caching", &ca) ||
        spec_choice(spec, "preemption_mode", MODE_NAMES, &mode) ||
        spec_choice(spec, "policy", POLICY_NAMES, &policy) ||
        spec_choice(spec, "on_swap_full", ON_SWAP_FULL, &abort_on_full)) goto fail;
    if (policy == 1 && mode == MODE_SWAP) {
        /* replay/engine/v0/scheduler.py refuses it too: real vLLM V0 crashes (reference G/D4). */
        PyErr_SetString(PyExc_ValueError, "vLLM V0 cannot run policy='priority' with "
                        "preemption_mode='swap' (reference G/D4)");
        goto fail;
    }
    if (ng + nc >= ((int64_t)1 << 31)) {
        PyErr_SetString(PyExc_ValueError, "core: more blocks than 32-bit block ids hold");
        goto fail;
    }
    c->bs = bs; c->num_gpu = ng; c->num_cpu = nc; c->max_seqs = ms; c->max_batched = mb;
    /* BlockSpaceManager's watermark: int(0.01 * num_gpu_blocks) (A2). */
    c->L = L; c->watermark_blocks = (int64_t)(wm * (double)ng); c->chunked = ch; c->caching = ca;
    c->mode = mode; c->policy = policy; c->abort_on_full = abort_on_full;
    if (cost_parse(cost, &c->cost) < 0) goto fail;
    if (keys_take(&c->views, keys, n, c->bs, &c->keys) < 0) goto fail;
    if (pool_init(&c->gpu, 0, (int32_t)ng, ca) < 0 || pool_init(&c->cpu, (int32_t)ng, (int32_t)nc, ca) < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    CALLOC(c->tbl, n, int32_t *); CALLOC(c->tlen, n, int64_t); CALLOC(c->tcap, n, int64_t);
    CALLOC(c->has_tbl, n, uint8_t); CALLOC(c->nfs, n, int64_t);
    CALLOC(c->has_la, n, uint8_t); CALLOC(c->la, n, double);
    CALLOC(c->has_memo, n, uint8_t); CALLOC(c->memo, n, int64_t);
    CALLOC(c->waiting.d, n + 1, int32_t); c->waiting.cap = n + 1;
    CALLOC(c->running.d, n + 1, int32_t); c->running.cap = n + 1;
    CALLOC(c->swapped.d, n + 1, int32_t); c->swapped.cap = n + 1;
    CALLOC(c->in_prefill, n, uint8_t);
    for (int64_t r = 0; r < n; r++) c->in_prefill[r] = 1;
    CALLOC(c->resume_pending, n, uint8_t); CALLOC(c->admitted_once, n, uint8_t);
    CALLOC(c->final_blocks, n, int64_t); CALLOC(c->stall_len, n, int64_t);
    CALLOC(c->stall_count, n, int64_t); CALLOC(c->admit_hit, n, int64_t);
    CALLOC(c->pending_rej, n, int32_t);
    CALLOC(c->tok_stamp, n, int64_t); CALLOC(c->seq_stamp, n, int64_t);
    CALLOC(c->r_dec, n, int32_t); CALLOC(c->r_pre_row, n, int32_t); CALLOC(c->r_recomp, n, int32_t);
    CALLOC(c->r_swout, n, int32_t); CALLOC(c->r_pre_n, n, int64_t);
    CALLOC(c->s_dec, n, int32_t); CALLOC(c->s_pre_row, n, int32_t); CALLOC(c->s_infeas, n, int32_t);
    CALLOC(c->s_pre_u, n, int64_t); CALLOC(c->s_pre_c, n, int64_t);
    CALLOC(c->p_row, n, int32_t); CALLOC(c->p_u, n, int64_t); CALLOC(c->p_c, n, int64_t);
    CALLOC(c->tmp, n + 1, int32_t);
    CALLOC(c->b_row, n, int32_t); CALLOC(c->b_new, n, int64_t); CALLOC(c->b_ctx, n, int64_t);
    CALLOC(c->b_prefill, n, uint8_t); CALLOC(c->b_sampled, n, uint8_t);
    /* Preemptions and rejections of one step: a row leaves its queue at most once per step,
     * so n bounds each list; 2n leaves room. */
    CALLOC(c->pre_rows, 2 * n, int32_t); CALLOC(c->pre_blocks, 2 * n, int64_t);
    CALLOC(c->pre_mode, 2 * n, int8_t); CALLOC(c->pre_fallback, 2 * n, uint8_t);
    CALLOC(c->pre_prio, 2 * n, uint8_t);
    CALLOC(c->rej_rows, 2 * n, int32_t);
    CALLOC(c->si_rows, n, int32_t);
    CALLOC(c->dst_ids, ng, int32_t); CALLOC(c->dst_mark, ng, uint8_t);
    CALLOC(c->fin, n, int32_t);
    if (loop_init(&c->lp, &c->q) < 0) { PyErr_NoMemory(); goto fail; }
    PyObject *cap = PyCapsule_New(c, "kvcap.core0", capsule_free);
    if (!cap) goto fail;
    return cap;
fail:
    core_free(c);
    return NULL;
}

static PyObject *core_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    long long max_steps;
    if (!PyArg_ParseTuple(args, "OL", &cap, &max_steps)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core0");
    if (!c) return NULL;
    return loop_run_py(&c->lp, &c->q, c, &OPS, max_steps);
}


static PyObject *core_run_until(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    double t_limit;
    if (!PyArg_ParseTuple(args, "Od", &cap, &t_limit)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core0");
    if (!c) return NULL;
    return loop_run_until_py(&c->lp, &c->q, c, &OPS, t_limit);
}

static PyObject *core_results(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core0");
    if (!c) return NULL;
    PyObject *d = tables_dict(&c->out);
    if (!d) return NULL;
    PyObject *extra = Py_BuildValue("{sdsisdsLsLsL}", "t", c->lp.t, "aborted", c->aborted,
                                    "abort_s", c->abort_s, "abort_row", (long long)c->ab_row,
                                    "abort_needed", (long long)c->ab_needed,
                                    "abort_free", (long long)c->ab_free);
    if (!extra || PyDict_Update(d, extra) < 0) { Py_XDECREF(extra); Py_DECREF(d); return NULL; }
    Py_DECREF(extra);
    return d;
}

/* Block-accounting invariants of both pools (the property tests call this after a run): every
 * block is exactly one of free-listed, evictable or referenced, its ref count equals the table
 * entries naming it, no table names a block twice, running rows hold GPU blocks and swapped rows
 * host blocks, the cache map points at blocks of its pool. Raises AssertionError on a breach. */
static const char *check_pool(const Core *c, const Pool *p, char *msg, size_t len) {
    int64_t nb = p->nb;
    int64_t *refs = (int64_t *)calloc((size_t)nb + 1, sizeof(int64_t));
    uint8_t *inq = (uint8_t *)calloc((size_t)nb + 1, 1);
    const char *err = NULL;
    if (!refs || !inq) { free(refs); free(inq); return "out of memory"; }
    for (int64_t r = 0; r < c->q.n; r++) {
        if (!c->has_tbl[r]) continue;
        for (int64_t k = 0; k < c->tlen[r]; k++) {
            int32_t b = c->tbl[r][k];
            if (b >= p->first && b < p->first + nb) refs[b - p->first]++;
        }
    }
    for (int64_t j = 0; j < p->fq_len && !err; j++) {
        int32_t b = p->fq[(p->fq_head + j) % nb];
        if (b < p->first || b >= p->first + nb) err = "free list holds a foreign block";
        else if (inq[b - p->first]++) err = "block twice in the free list";
    }
    int64_t nev = 0;
    for (int64_t i = 0; i < nb && !err; i++) {
        nev += p->in_ev[i];
        if (refs[i] != p->ref[i]) {
            snprintf(msg, len, "block %lld: ref %d but %lld table entries",
                     (long long)(p->first + i), p->ref[i], (long long)refs[i]);
            err = msg;
        } else if (inq[i] && p->in_ev[i]) {
            err = "block both free-listed and evictable";
        } else if ((p->ref[i] == 0) != (inq[i] || p->in_ev[i])) {
            snprintf(msg, len, "block %lld: ref %d but free %d", (long long)(p->first + i),
                     p->ref[i], inq[i] || p->in_ev[i]);
            err = msg;
        }
    }
    if (!err && nev != p->ev_len) err = "evictor count differs from its table";
    if (!err && pool_num_free(p) + pool_num_used(p) != nb) err = "free + used != total";
    for (uint64_t s = 0; s <= p->cached.mask && !err; s++) {
        int32_t b = p->cached.vals[s];
        if (b >= 0 && (b < p->first || b >= p->first + nb)) err = "cache map names a foreign block";
    }
    free(refs); free(inq);
    return err;
}

static PyObject *core_check(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core0");
    if (!c) return NULL;
    char msg[160];
    const char *err = check_pool(c, &c->gpu, msg, sizeof msg);
    if (!err) err = check_pool(c, &c->cpu, msg, sizeof msg);
    for (int64_t r = 0; r < c->q.n && !err; r++) {
        if (!c->has_tbl[r]) continue;
        for (int64_t k = 0; k < c->tlen[r] && !err; k++)
            for (int64_t j = 0; j < k; j++)
                if (c->tbl[r][j] == c->tbl[r][k]) { err = "a table names a block twice"; break; }
    }
    for (int64_t i = 0; i < c->running.len && !err; i++) {
        int32_t r = dq_at(&c->running, i);
        for (int64_t k = 0; k < c->tlen[r]; k++)
            if (c->tbl[r][k] >= c->num_gpu) { err = "a running row holds host blocks"; break; }
    }
    for (int64_t i = 0; i < c->swapped.len && !err; i++) {
        int32_t r = dq_at(&c->swapped, i);
        for (int64_t k = 0; k < c->tlen[r]; k++)
            if (c->tbl[r][k] < c->num_gpu) { err = "a swapped row holds GPU blocks"; break; }
    }
    if (err) { PyErr_SetString(PyExc_AssertionError, err); return NULL; }
    Py_RETURN_NONE;
}


/* ---------------- the per-step contract (replay/engine/compiled.py `StepCore`): the same calls the
 * reference scheduler answers (add_request, abort_request, schedule, update, queues and block
 * tables), for the oracle and golden scenarios; `run` above is the same steps in one call. */
static Core *core_of(PyObject *cap) { return (Core *)PyCapsule_GetPointer(cap, "kvcap.core0"); }

/* (core, row) of a call taking a request row (kvcore.h kv_row_arg: Core begins with its Req). */
_Static_assert(offsetof(Core, q) == 0, "kv_row_arg reads the row count through Core's first member");
static int row_arg(PyObject *args, Core **c, int64_t *row) {
    return (*c = (Core *)kv_row_arg(args, "kvcap.core0", row)) ? 0 : -1;
}

static PyObject *core_add(PyObject *self, PyObject *args) {
    (void)self;
    Core *c; int64_t row;
    if (row_arg(args, &c, &row) < 0) return NULL;
    add_request(c, (int32_t)row);
    Py_RETURN_NONE;
}

static int dq_remove(dq *q, int32_t row, int32_t *tmp) {
    int64_t w = 0, n = q->len, found = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t r = dq_at(q, i);
        if (r == row && !found) { found = 1; continue; }
        tmp[w++] = r;
    }
    if (!found) return 0;
    memcpy(q->d, tmp, (size_t)w * sizeof(int32_t));
    q->head = 0; q->len = w;
    return 1;
}

/* A client abort (scheduler.py abort_request): leave the first queue holding it, free. */
static PyObject *core_abort(PyObject *self, PyObject *args) {
    (void)self;
    Core *c; int64_t row;
    if (row_arg(args, &c, &row) < 0) return NULL;
    dq *qs[] = {&c->waiting, &c->running, &c->swapped};
    for (int i = 0; i < 3; i++) {
        if (!dq_remove(qs[i], (int32_t)row, c->tmp)) continue;
        release_reservation(c, row);
        if (bm_free(c, row) < 0) return NULL;
        c->q.status[row] = ST_ABORTED;
        break;
    }
    Py_RETURN_NONE;
}

static PyObject *core_schedule(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    c->record_pairs = 1;
    int rc = schedule(c);
    if (rc == SWAP_FULL)
        return Py_BuildValue("{s(LLL)}", "abort", (long long)c->ab_row, (long long)c->ab_needed,
                             (long long)c->ab_free);
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    for (int64_t j = 0; j < c->ndst; j++) c->dst_mark[c->dst_ids[j]] = 0;
    c->ndst = 0;
    return Py_BuildValue(
        "{sNsNsNsNsNsNsNsNsNsNsNsNsN}",
        "rows", bytes_of(c->b_row, c->nb_, 4), "num_new", bytes_of(c->b_new, c->nb_, 8),
        "num_computed", bytes_of(c->b_ctx, c->nb_, 8), "prefill", bytes_of(c->b_prefill, c->nb_, 1),
        "pre_rows", bytes_of(c->pre_rows, c->npre, 4), "pre_blocks", bytes_of(c->pre_blocks, c->npre, 8),
        "pre_mode", bytes_of(c->pre_mode, c->npre, 1),
        "pre_fallback", bytes_of(c->pre_fallback, c->npre, 1),
        "pre_prio", bytes_of(c->pre_prio, c->npre, 1),
        "rej_rows", bytes_of(c->rej_rows, c->nrej, 4), "si_rows", bytes_of(c->si_rows, c->nsi, 4),
        "swap_out", bytes_of(c->pairs_out.d, c->pairs_out.n, 8),
        "swap_in", bytes_of(c->pairs_in.d, c->pairs_in.n, 8));
}

static PyObject *core_update(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    if (update(c) < 0) return NULL;
    return Py_BuildValue("(NN)", bytes_of(c->b_sampled, c->nb_, 1), bytes_of(c->fin, c->nfin, 4));
}

static PyObject *dq_list(const dq *q) {
    PyObject *l = PyList_New((Py_ssize_t)q->len);
    for (int64_t i = 0; l && i < q->len; i++) {
        PyObject *x = PyLong_FromLong(dq_at(q, i));
        if (!x) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    return l;
}

/* Queues, free blocks, and the tables of running and swapped requests (ids as the pools number
 * them: host blocks offset by num_gpu_blocks, as vLLM prints them). */
static PyObject *core_snapshot(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    Core *c = core_of(cap);
    if (!c) return NULL;
    PyObject *tables = PyDict_New();
    if (!tables) return NULL;
    dq *qs[] = {&c->running, &c->swapped};
    for (int i = 0; i < 2; i++)
        for (int64_t j = 0; j < qs[i]->len; j++) {
            int32_t r = dq_at(qs[i], j);
            if (!c->has_tbl[r]) continue;
            PyObject *k = PyLong_FromLong(r), *v = list_i32(c->tbl[r], c->tlen[r]);
            int bad = !k || !v || PyDict_SetItem(tables, k, v) < 0;
            Py_XDECREF(k); Py_XDECREF(v);
            if (bad) { Py_DECREF(tables); return NULL; }
        }
    return Py_BuildValue("{sNsNsNsNsLsL}", "waiting", dq_list(&c->waiting),
                         "running", dq_list(&c->running), "swapped", dq_list(&c->swapped),
                         "tables", tables, "free_gpu", (long long)pool_num_free(&c->gpu),
                         "free_cpu", (long long)pool_num_free(&c->cpu));
}

/* record_batches(core, on[, lo, hi]): keep every step's batch (results' b_* columns), or only
 * those of the steps with index in [lo, hi] (0-based); off by default, so a replay that does not
 * ask pays nothing. */
static PyObject *core_record_batches(PyObject *self, PyObject *args) {
    PyObject *cap;
    int on;
    long long lo = 0, hi = INT64_MAX;
    if (!PyArg_ParseTuple(args, "Op|LL", &cap, &on, &lo, &hi)) return NULL;
    Core *c = (Core *)PyCapsule_GetPointer(cap, "kvcap.core0");
    if (!c) return NULL;
    c->lp.record_batches = on;
    c->lp.batch_lo = lo;
    c->lp.batch_hi = hi;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"new", core_new, METH_VARARGS, "new(arrays, spec, cost, keys) -> core handle"},
    {"add", core_add, METH_VARARGS, "add(core, row): a request arrives"},
    {"abort", core_abort, METH_VARARGS, "abort(core, row): a client abort"},
    {"schedule", core_schedule, METH_VARARGS, "schedule(core) -> the step's plan (dict)"},
    {"update", core_update, METH_VARARGS, "update(core) -> (sampled, finished): apply the output"},
    {"snapshot", core_snapshot, METH_VARARGS, "snapshot(core) -> queues, free blocks, tables"},
    {"run", core_run, METH_VARARGS, "run(core, max_steps) -> (done, step, t, cursor)"},
    {"run_until", core_run_until, METH_VARARGS,
     "run_until(core, t) -> (done, step, t, cursor): the steps that start before t"},
    {"results", core_results, METH_VARARGS, "results(core) -> dict of column bytearrays"},
    {"check", core_check, METH_VARARGS, "check(core): block-accounting invariants"},
    {"record_batches", core_record_batches, METH_VARARGS, "record_batches(core, on[, lo, hi])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core",
                                    "kvcap's compiled V0 replay core", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&module); }
