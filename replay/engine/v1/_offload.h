/* The CPU tier of vLLM 0.33's OffloadingConnector for the compiled V1 core (included once, by
 * replay/engine/v1/_core.c, after its key -> slot map): the chunk pool with its ref counts
 * (v1/kv_offload/cpu/manager.py: -1 while a store is in flight, 0 ready and evictable, > 0 pinned
 * by loads), the LRU and ARC policies (cpu/policies/lru.py, arc.py) and the per-request cache
 * access record the policies rank by (manager.py `_RequestCacheAccess`), and the store threshold's
 * offer counts (manager.py `counts`: 0.33 counts every offer). Oracle README section 7
 * (F6-F8, F15) says what they do; the Python reference is replay/engine/v1/offload.py.
 *
 * A request only ever offers or loads its own chunks, at known positions (chunk i ends at token
 * (i + 1) * tokens_per_chunk), so a request's record is one flag byte per chunk index, and its
 * keys are recomputed from the block keys (key_of) instead of being stored.
 */

/* Per request, per chunk index (RequestAccess.flags). */
enum { RA_SEEN = 1, RA_INSERTED = 2, RA_REUSED = 4, RA_STORE_MISS = 8 /* ARC only */,
       RA_OUT = 16 /* LRU: seen, but not (or no longer) in the row's own rank group */,
       RA_COUNTED = 32 /* 0.34: counted toward the store threshold (`counted_keys`) */ };
enum { POL_LRU = 0, POL_ARC = 1 };
#define NOMAP UINT32_MAX         /* Chunk.mpos of a chunk not in the key map */
static const char *const EVICTION_NAMES[] = {"lru", "arc", NULL};
/* SchedulerSpec.offload_store_counting: every offer counts (0.33), or each key once per
 * request (0.34: `counted_keys`, the row's RA_COUNTED flags). */
static const char *const STORE_COUNTING_NAMES[] = {"every_offer", "once_per_request", NULL};
enum { COUNT_EVERY_OFFER = 0, COUNT_ONCE_PER_REQUEST = 1 };

typedef struct {
    int64_t key;
    int32_t ref;                 /* -1 store in flight, 0 ready, > 0 loads in flight */
    int32_t prev, next;          /* ARC list links */
    int32_t grp;                 /* LRU: its rank's group (Grp) */
    int32_t idx;                 /* its chunk index in the rows that offer it (a key is one
                                    position's): LRU's second part of its rank, -position, is
                                    -(idx + 1) * tokens per chunk, so it orders as -idx; an
                                    eviction flags the owner's record at idx */
    uint32_t stamp;              /* protected by the store being prepared (== Tier.stamp) */
    uint32_t mpos;               /* its entry in Tier.map (NOMAP: a key of its request's own,
                                    LRU: found through its group, Grp.at) */
    int8_t list;                 /* ARC: 1 T1, 2 T2 (0: slot free); LRU: 1 linked (evictable) */
} Chunk;

/* LRU ranks (lru.py) are pairs (rank, -position) with every rank from one counter: a request's
 * provisional rank, shared by the chunks it touches first, or, at its finish, fresh ranks for its
 * chunks tail first. A finish's fresh ranks are consecutive and nothing else takes a rank between
 * them, so they order like one rank with the chunks' -position: every rank is a group (one
 * counter value) and an order inside it. The evictable chunks are then a list of groups in rank
 * order (a new rank is the largest: appended) each ordered by -position, so that every rank
 * change, pin, unpin and eviction is O(1) work instead of lru.py's heap pushes. Group r is row
 * r's: its provisional rank, then its finish's (the group renewed: its chunks keep their order
 * and take the fresh rank at once; the connector moves in the row's other chunks). A group's
 * chunks are row r's, one per chunk index (a key is one position's), so the group holds them by
 * index (Grp.at) rather than in a linked list: an eviction reads them down that array, where a
 * list walk was one dependent cache miss per chunk (Mooncake evicts 8.6M). A chunk with a key of
 * its request's own (no other request offers it) never leaves that request's group, so it is
 * found there (Grp.at) and stays out of the key map (conv's every chunk: no map insert and
 * delete per chunk). */
typedef struct {
    int64_t rank;                /* counter value (0: not in the group list) */
    int32_t prev, next;          /* group list links (sentinel: Tier.ng) */
    int32_t *at;                 /* at[idx]: its chunk of chunk index idx (-1: none) */
    int32_t cap;                 /* entries of at (grown on demand) */
    int32_t top;                 /* no evictable chunk at idx >= top */
    int32_t nev;                 /* evictable chunks */
    int32_t members;             /* tier chunks of this rank, evictable or not */
    int8_t retired;              /* takes no new members: leaves the list once it has none */
} Grp;

typedef struct { int64_t key; int32_t prev, next; int8_t list; } Ghost;

/* The store threshold's offer counts (manager.py `counts`, `_record_accesses`; threshold >= 2
 * only): key -> offers, least recently offered first (a list through node 0, its sentinel), at
 * most `max` keys. The nodes grow on demand up to max (the map is rebuilt as they grow). */
typedef struct {
    int64_t key;
    int64_t count;
    int32_t prev, next;
    uint32_t mpos;               /* its entry in Counts.map */
    uint32_t stamp;              /* counted again by the offer being recorded (== Counts.stamp) */
} CntNode;
typedef struct {
    int64_t thr, max;            /* thr 0: no counting */
    int once_per_request;        /* 0.34: a row's keys count once (its RA_COUNTED flags) */
    int64_t cap, len;            /* nodes 1..cap; keys tracked */
    CntNode *nd;
    map_t map;
    int32_t *free_nodes; int64_t nfree, next_fresh;
    uint32_t stamp;
} Counts;

typedef struct {
    int64_t n;                   /* capacity in chunks */
    int policy;
    Chunk *ch;                   /* n slots + 2 list sentinels (ARC: n T1, n + 1 T2) */
    map_t map;                   /* key -> slot (a chunk keeps its entry: Chunk.mpos) */
    int32_t *free_slots; int64_t nfree_list, next_fresh;
    int64_t num_evictable, num_pending;
    uint32_t stamp;
    /* LRU: the groups (1 per row + the list sentinel at index ng). */
    Grp *grp; int64_t ng;
    int64_t next_rank;
    int oom;                     /* a group's array could not grow (the step fails) */
    /* ARC. */
    int64_t t1_len, t2_len, b1_len, b2_len;
    double target_t1;
    Ghost *gh;                   /* 3n + 2 nodes; sentinels 3n (B1) and 3n + 1 (B2) */
    map_t gmap;
    int32_t *gfree; int64_t ngfree;
    Counts cnt;                  /* store_threshold */
} Tier;

/* ------------------------------------------------------------------ LRU groups */
/* Whether chunk x ranks below (rank, chunk index idx). */
static inline int lru_rank_less(const Tier *t, const Chunk *x, int64_t rank, int64_t idx) {
    int64_t r = t->grp[x->grp].rank;
    return r != rank ? r < rank : x->idx > idx;
}
/* Group g takes rank `rank`, the largest so far: the tail of the group list. */
static void grp_open(Tier *t, int32_t g, int64_t rank) {
    Grp *x = &t->grp[g];
    int32_t h = (int32_t)t->ng, p = t->grp[h].prev;
    x->rank = rank; x->at = NULL; x->cap = x->top = x->nev = 0; x->members = 0; x->retired = 0;
    t->grp[p].next = g; x->prev = p; x->next = h; t->grp[h].prev = g;
}
/* Group g takes a new rank, the largest so far (its chunks with it). */
static void grp_renew(Tier *t, int32_t g, int64_t rank) {
    Grp *x = &t->grp[g];
    int32_t h = (int32_t)t->ng;
    t->grp[x->prev].next = x->next; t->grp[x->next].prev = x->prev;
    int32_t p = t->grp[h].prev;
    x->rank = rank;
    t->grp[p].next = g; x->prev = p; x->next = h; t->grp[h].prev = g;
}
static void grp_close(Tier *t, int32_t g) {
    Grp *x = &t->grp[g];
    t->grp[x->prev].next = x->next; t->grp[x->next].prev = x->prev;
    x->rank = 0;
    free(x->at); x->at = NULL; x->cap = x->top = 0;
}
static inline void grp_left(Tier *t, int32_t g) {
    if (--t->grp[g].members == 0 && t->grp[g].retired) grp_close(t, g);
}
/* Chunk s joins group g at chunk index idx (its rank's group, at its -position). */
static inline void grp_join(Tier *t, int32_t s, int32_t g, int64_t idx) {
    Chunk *c = &t->ch[s];
    Grp *x = &t->grp[g];
    c->grp = g; c->idx = (int32_t)idx;
    x->members++;
    if (idx >= x->cap) {
        int32_t nc = x->cap ? x->cap : 16;
        while (nc <= idx) nc *= 2;
        int32_t *p = (int32_t *)realloc(x->at, (size_t)nc * sizeof(int32_t));
        if (!p) { t->oom = 1; return; }
        for (int32_t i = x->cap; i < nc; i++) p[i] = -1;
        x->at = p; x->cap = nc;
    }
    x->at[idx] = s;
}
/* Its place in its group (the group's member count is the caller's: grp_left). */
static inline void grp_unplace(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    Grp *x = &t->grp[c->grp];
    if (c->idx < x->cap && x->at[c->idx] == s) x->at[c->idx] = -1;
}
static inline void grp_retire(Tier *t, int32_t g) {
    if (!t->grp[g].rank) return;
    t->grp[g].retired = 1;
    if (!t->grp[g].members) grp_close(t, g);
}
/* The chunk (a member of its group) becomes evictable, or stops being so. */
static inline void lru_add(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    Grp *g = &t->grp[c->grp];
    if (c->idx >= g->top) g->top = c->idx + 1;
    g->nev++;
    c->list = 1;
}
static void lru_del(Tier *t, int32_t s) {
    Chunk *c = &t->ch[s];
    if (c->list != 1) return;
    t->grp[c->grp].nev--;
    c->list = 0;
}
/* Chunk s (chunk index idx) takes group g's rank (it joins g before leaving its old group, which
 * may be g). */
static void lru_rerank(Tier *t, int32_t s, int32_t g, int64_t idx) {
    Chunk *c = &t->ch[s];
    int linked = c->list == 1;
    if (linked) lru_del(t, s);
    int32_t old = c->grp;
    grp_unplace(t, s);
    grp_join(t, s, g, idx);
    grp_left(t, old);
    if (linked) lru_add(t, s);
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
    uint32_t h = key_hash(key);
    map_set(&t->gmap, map_find_h(&t->gmap, key, h), h, g);
    ghost_append(t, g, list);
}

/* ------------------------------------------------------------------ the tier */
/* A tier of n chunks for a run of nrows requests. */
static int tier_init(Tier *t, int64_t n, int policy, int64_t nrows) {
    memset(t, 0, sizeof *t);
    t->n = n;
    t->policy = policy;
    t->ch = (Chunk *)calloc((size_t)n + 2, sizeof(Chunk));
    t->free_slots = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!t->ch || !t->free_slots) return -1;
    if (map_init(&t->map, 4 * n + 2, &t->ch[0].key, sizeof(Chunk), &t->ch[0].mpos) < 0) return -1;
    if (policy == POL_LRU) {
        t->ng = nrows;
        t->grp = (Grp *)calloc((size_t)t->ng + 1, sizeof(Grp));
        if (!t->grp) return -1;
        t->grp[t->ng].prev = t->grp[t->ng].next = (int32_t)t->ng;
        return 0;
    }
    t->gh = (Ghost *)calloc(3 * (size_t)n + 2, sizeof(Ghost));
    t->gfree = (int32_t *)malloc((3 * (size_t)n + 1) * sizeof(int32_t));
    if (!t->gh || !t->gfree) return -1;
    if (map_init(&t->gmap, 6 * n + 2, &t->gh[0].key, sizeof(Ghost), NULL) < 0) return -1;
    for (int i = 0; i < 2; i++) {
        int32_t h = (int32_t)n + i, g = (int32_t)(3 * n) + i;
        t->ch[h].prev = t->ch[h].next = h;
        t->gh[g].prev = t->gh[g].next = g;
    }
    for (int64_t g = 3 * n - 1; g >= 0; g--) t->gfree[t->ngfree++] = (int32_t)g;
    return 0;
}

static void tier_free(Tier *t) {
    for (int64_t g = 0; t->grp && g <= t->ng; g++) free(t->grp[g].at);
    free(t->ch); free(t->map.e); free(t->free_slots); free(t->grp); free(t->gh);
    free(t->gmap.e); free(t->gfree);
    free(t->cnt.nd); free(t->cnt.map.e); free(t->cnt.free_nodes);
}

/* ------------------------------------------------------------------ the store threshold */
/* Room for cap nodes (1..cap), the map rebuilt over them. */
static int cnt_grow(Counts *k, int64_t cap) {
    CntNode *nd = (CntNode *)realloc(k->nd, ((size_t)cap + 1) * sizeof(CntNode));
    if (!nd) return -1;
    k->nd = nd;
    int32_t *fr = (int32_t *)realloc(k->free_nodes, (size_t)cap * sizeof(int32_t));
    if (!fr) return -1;
    k->free_nodes = fr;
    k->cap = cap;
    free(k->map.e);
    k->map.e = NULL;
    if (map_init(&k->map, 4 * cap + 2, (char *)nd + offsetof(CntNode, key), sizeof(CntNode),
                 (char *)nd + offsetof(CntNode, mpos)) < 0) return -1;
    for (int32_t x = nd[0].next; x != 0; x = nd[x].next) {
        uint32_t h = key_hash(nd[x].key);
        map_set(&k->map, map_find_h(&k->map, nd[x].key, h), h, x);
    }
    return 0;
}
/* Count offers for a store threshold thr >= 2, keeping at most max keys. */
static int cnt_init(Tier *t, int64_t thr, int64_t max) {
    Counts *k = &t->cnt;
    k->thr = thr; k->max = max;
    k->nd = (CntNode *)calloc(1, sizeof(CntNode));
    if (!k->nd) return -1;
    k->next_fresh = 1;
    return cnt_grow(k, max < 1024 ? max : 1024);
}
static inline void cnt_unlink(Counts *k, int32_t x) {
    k->nd[k->nd[x].prev].next = k->nd[x].next; k->nd[k->nd[x].next].prev = k->nd[x].prev;
}
static inline void cnt_append(Counts *k, int32_t x) {
    int32_t p = k->nd[0].prev;
    k->nd[p].next = x; k->nd[x].prev = p; k->nd[x].next = 0; k->nd[0].prev = x;
}
/* Record one offer of n keys (hashes hb) and set keep[i]: whether key i has now been offered
 * thr times. As `_record_accesses`: first the keys already tracked count again, in order, each
 * moving to the most recent end (0.34: a key whose flag in fl[] has RA_COUNTED moves without
 * counting; fl NULL: 0.33, every offer counts); then each new key is tracked at 1, a full
 * tracker dropping its least recently offered key outside this offer (none left: the key is not
 * tracked). node[] is scratch of n entries. -1: out of memory. */
static int cnt_offer(Tier *t, const int64_t *kb, const uint32_t *hb, int64_t n, uint8_t *keep,
                     int32_t *node, const uint8_t *fl) {
    Counts *k = &t->cnt;
    int64_t prot = 0;
    k->stamp++;
    for (int64_t i = 0; i < n; i++) {
        int32_t x = node[i] = k->map.e[map_find_h(&k->map, kb[i], hb[i])].val;
        if (x < 0) continue;
        cnt_unlink(k, x); cnt_append(k, x);
        if (!fl || !(fl[i] & RA_COUNTED)) k->nd[x].count++;
        if (k->nd[x].stamp != k->stamp) { k->nd[x].stamp = k->stamp; prot++; }
    }
    int64_t unprot = k->len - prot;
    for (int64_t i = 0; i < n; i++) {
        if (node[i] >= 0) continue;
        if ((node[i] = k->map.e[map_find_h(&k->map, kb[i], hb[i])].val) >= 0)
            continue;                     /* a repeat of a key this offer tracked */
        if (k->len >= k->max) {
            if (unprot == 0) continue;
            int32_t y = k->nd[0].next;
            cnt_unlink(k, y);
            map_del_at(&k->map, k->nd[y].mpos);
            k->free_nodes[k->nfree++] = y;
            k->len--; unprot--;
        }
        if (!k->nfree && k->next_fresh > k->cap) {
            int64_t nc = 2 * k->cap < k->max ? 2 * k->cap : k->max;
            if (cnt_grow(k, nc) < 0) return -1;
        }
        int32_t x = k->nfree ? k->free_nodes[--k->nfree] : (int32_t)k->next_fresh++;
        k->nd[x].key = kb[i]; k->nd[x].count = 1; k->nd[x].stamp = 0;
        map_set(&k->map, map_find_h(&k->map, kb[i], hb[i]), hb[i], x);
        cnt_append(k, x);
        k->len++;
        node[i] = x;
    }
    for (int64_t i = 0; i < n; i++) keep[i] = node[i] >= 0 && k->nd[node[i]].count >= k->thr;
    return 0;
}

static inline int32_t tier_get_h(const Tier *t, int64_t key, uint32_t h) {
    return t->n ? t->map.e[map_find_h(&t->map, key, h)].val : -1;
}
/* LRU: group g's chunk of chunk index idx, for a key of g's own (never in the map). */
static inline int32_t tier_get_own(const Tier *t, int32_t g, int64_t idx) {
    const Grp *x = &t->grp[g];
    return idx < x->cap ? x->at[idx] : -1;
}
static inline int32_t tier_get(const Tier *t, int64_t key) { return tier_get_h(t, key, key_hash(key)); }
/* Fetch key's map entry ahead of its lookup: a pass over many keys overlaps their misses. */
static inline void tier_prefetch(const Tier *t, uint32_t h) {
    if (t->n) map_prefetch(&t->map, h);
}
static inline int64_t tier_key(const Tier *t, int32_t s) { return t->ch[s].key; }
static inline int64_t tier_used(const Tier *t) { return t->next_fresh - t->nfree_list; }
static inline int64_t tier_free_chunks(const Tier *t) { return t->n - tier_used(t); }

/* The chunk leaves the tier (evicted): its slot goes back to the pool. */
static void tier_drop(Tier *t, int32_t s) {
    if (t->ch[s].mpos != NOMAP) map_del_at(&t->map, t->ch[s].mpos);
    if (t->policy == POL_LRU) { lru_del(t, s); grp_unplace(t, s); grp_left(t, t->ch[s].grp); }
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

/* A new chunk (key hash h, chunk index idx; its store just prepared, ref -1), ranked for the
 * storing request, group g (LRU), or in T1 (ARC, leaving the ghost lists). `own`: LRU, a key of
 * the request's own, kept out of the map. */
static inline int32_t tier_insert(Tier *t, int64_t key, uint32_t h, int32_t g, int64_t idx, int own) {
    int32_t s = t->nfree_list ? t->free_slots[--t->nfree_list] : (int32_t)t->next_fresh++;
    Chunk *c = &t->ch[s];
    c->key = key; c->ref = -1; c->list = 0; c->stamp = 0;
    if (own) c->mpos = NOMAP;
    else map_set(&t->map, map_find_h(&t->map, key, h), h, s);
    c->idx = (int32_t)idx;
    t->num_pending++;
    if (t->policy == POL_LRU) {
        grp_join(t, s, g, idx);
    } else {
        arc_append(t, s, 1);
        int32_t g = map_get(&t->gmap, key);
        if (g >= 0) ghost_drop(t, g);
    }
    return s;
}

/* Evict n ready, unpinned chunks not stamped with t->stamp (the store's own offer); their keys
 * go to keys[] in eviction order (LRU: unless keys is NULL), their slots to out[] (scratch of
 * 4 * n). 0, or -1 when n cannot be found (nothing changed). */
static int tier_evict(Tier *t, int64_t n, int32_t *out, int64_t *keys) {
    if (n == 0) return 0;
    if (t->policy == POL_LRU) {
        /* lru.py evict: smallest ranks first, protected ones skipped (and kept); in a group,
         * down its chunk indices (-position ascending). A group's top comes down past the
         * victims and holes above its first chunk kept. */
        int64_t got = 0;
        for (int32_t g = t->grp[t->ng].next; got < n && g != t->ng; g = t->grp[g].next) {
            Grp *x = &t->grp[g];
            int32_t seen = 0, top = x->top, *at = x->at;
            int64_t first = got;
            for (int32_t i = x->top - 1; i >= 0 && got < n && seen < x->nev; i--) {
                if (i >= 8 && at[i - 8] >= 0) __builtin_prefetch(&t->ch[at[i - 8]]);
                int32_t s = at[i];
                if (s < 0) { if (top == i + 1) top = i; continue; }
                const Chunk *c = &t->ch[s];
                if (c->list != 1) { if (top == i + 1) top = i; continue; }   /* stored or loaded */
                seen++;
                if (c->stamp == t->stamp) continue;
                if (c->mpos != NOMAP) __builtin_prefetch(&t->map.e[c->mpos]);
                out[got++] = s;
                at[i] = -1;
                if (top == i + 1) top = i;
            }
            if (got == first) continue;
            x->top = top;
            x->nev -= (int32_t)(got - first);
        }
        if (got < n) {
            /* Not enough: put back the ones taken (nothing changed). */
            for (int64_t k = 0; k < got; k++) {
                Chunk *c = &t->ch[out[k]];
                Grp *x = &t->grp[c->grp];
                x->at[c->idx] = out[k]; x->nev++;
                if (c->idx >= x->top) x->top = c->idx + 1;
            }
            return -1;
        }
        for (int64_t k = 0; k < n; k++) {
            int32_t s = out[k];
            Chunk *c = &t->ch[s];
            if (keys) keys[k] = c->key;
            if (c->mpos != NOMAP) map_del_at(&t->map, c->mpos);
            c->list = 0;
            t->free_slots[t->nfree_list++] = s;
            grp_left(t, c->grp);
        }
        t->num_evictable -= n;
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
        int64_t key = keys[k] = tier_key(t, out[k]);
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

/* The tier's own invariants (tests, core_check): the map and each live chunk agree, every LRU
 * chunk sits in its group's array at its chunk index, an evictable one below the group's top,
 * and the evictable counts add up. NULL, or what is wrong. */
static const char *tier_check(const Tier *t) {
    if (!t->n) return NULL;
    uint8_t *dead = (uint8_t *)calloc((size_t)t->n, 1);
    if (!dead) return "tier check: out of memory";
    const char *err = NULL;
    for (int64_t k = 0; k < t->nfree_list; k++) dead[t->free_slots[k]] = 1;
    int64_t evictable = 0;
    for (int32_t s = 0; s < t->next_fresh && !err; s++) {
        if (dead[s]) continue;
        const Chunk *c = &t->ch[s];
        if (c->mpos != NOMAP && (c->mpos > t->map.mask || t->map.e[c->mpos].val != s))
            err = "tier chunk not at its key map entry";
        else if (c->mpos == NOMAP && t->policy != POL_LRU) err = "ARC chunk outside the key map";
        if (t->policy != POL_LRU || err) continue;
        const Grp *x = &t->grp[c->grp];
        if (!x->rank || c->idx >= x->cap || x->at[c->idx] != s) err = "LRU chunk not in its group's array";
        else if (c->list == 1 && c->idx >= x->top) err = "evictable LRU chunk above its group's top";
        evictable += c->list == 1;
    }
    if (!err && t->policy == POL_LRU) {
        int64_t nev = 0;
        for (int64_t g = 0; g < t->ng; g++) nev += t->grp[g].rank ? t->grp[g].nev : 0;
        if (nev != evictable || evictable != t->num_evictable) err = "LRU evictable counts differ";
    }
    free(dead);
    return err;
}

/* ------------------------------------------------------------------ connector state */
/* One transfer job (offloading/scheduler.py TransferJob + the emulated worker's FIFO entry). */
typedef struct {
    int32_t row;
    int8_t store, flush, submitted;
    int64_t done_at;             /* step mode: the step whose output reports it */
    double done_s;               /* time mode: when its bytes have crossed the host link */
    int32_t *slots; int64_t nslots, slots_cap;     /* tier chunks it writes (store) or reads (load) */
    int32_t *blocks; int64_t nblocks, blocks_cap;  /* GPU blocks it reads (store) or writes (load) */
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
    Job *jobs; int64_t njobs_all, jobs_cap;
    JobList free_jobs;           /* finished jobs' records, reused */
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
    uint32_t *hbuf;                      /* and their key hashes (key_hash) */
    uint8_t *keep; int32_t *cnode;       /* store_threshold: offered often enough; scratch */
    int plan_out;                        /* the step's decisions are read back (core_schedule:
                                            StepPlan.offload_*), evicted keys included */
    int64_t store_blocks, load_blocks;         /* this step's (steps columns) */
    /* Async scheduling (F11): non-empty steps scheduled / whose output was applied; a row's
     * blocks cannot be freed for a preemption while its last step is in flight. */
    int64_t *last_seq; int64_t sched_seq, proc_seq; int inflight_nonempty;
    /* vLLM _inflight_prefills (N2): admitted rows still prefilling after their scheduled chunk
     * and rows loading from the tier; infl_pos[row] is its index + 1 (0: not in). */
    int32_t *infl, *infl_pos; int64_t ninfl;
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
