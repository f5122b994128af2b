/* What the two compiled replay cores (replay/engine/v1/_core.c, replay/engine/v0/_core.c) share:
 * growable columns, the tables a replay produces (steps, events, stalls, fleet TBT samples: the
 * columns of replay.engine.raw.RawRun), the hash that spreads block keys, and the Python glue
 * (buffer views of the request arrays, columns handed back as bytearrays). Header-only: each core
 * is one translation unit, so everything here is static.
 */
#ifndef KVCAP_KVCORE_H
#define KVCAP_KVCORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ errors without the GIL */
/* `run` steps with the GIL released (loop_run_released below), so an error a step raises may be
 * set on a thread that does not hold it: these take the GIL for that moment (PyGILState_Ensure
 * nests, so they are right where the GIL is held too). The macros route every later use in the
 * translation unit (this header and the core that includes it) through them, so code added to
 * a step cannot forget. */
static void kv_err_set_string(PyObject *type, const char *msg) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyErr_SetString(type, msg);
    PyGILState_Release(g);
}

static PyObject *kv_err_no_memory(void) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyErr_NoMemory();
    PyGILState_Release(g);
    return NULL;
}

static PyObject *kv_err_format(PyObject *type, const char *fmt, ...) {
    va_list ap;
    PyGILState_STATE g = PyGILState_Ensure();
    va_start(ap, fmt);
    PyErr_FormatV(type, fmt, ap);
    va_end(ap);
    PyGILState_Release(g);
    return NULL;
}

#define PyErr_SetString kv_err_set_string
#define PyErr_NoMemory kv_err_no_memory
#define PyErr_Format kv_err_format

/* ------------------------------------------------------------------ growable columns */
typedef struct { double *d; int64_t n, cap; } vecd;
typedef struct { int64_t *d; int64_t n, cap; } veci;
typedef struct { int32_t *d; int64_t n, cap; } veci32;
typedef struct { int8_t *d; int64_t n, cap; } veci8;

#define KV_GROW(v, T)                                                                  \
    do {                                                                               \
        if ((v)->n == (v)->cap) {                                                      \
            int64_t nc = (v)->cap ? (v)->cap * 2 : 1024;                               \
            T *p = (T *)realloc((v)->d, (size_t)nc * sizeof(T));                       \
            if (!p) return -1;                                                         \
            (v)->d = p; (v)->cap = nc;                                                 \
        }                                                                              \
    } while (0)

/* Append k items at once (one capacity check): the batch records copy a whole step's arrays. */
#define KV_APPEND(v, T, src, k)                                                        \
    do {                                                                               \
        if ((v)->n + (k) > (v)->cap) {                                                 \
            int64_t nc = (v)->cap ? (v)->cap : 1024;                                   \
            while (nc < (v)->n + (k)) nc *= 2;                                         \
            T *p = (T *)realloc((v)->d, (size_t)nc * sizeof(T));                       \
            if (!p) return -1;                                                         \
            (v)->d = p; (v)->cap = nc;                                                 \
        }                                                                              \
        if (src) memcpy((v)->d + (v)->n, (src), (size_t)(k) * sizeof(T));             \
        (v)->n += (k);                                                                 \
    } while (0)

static inline int pushd(vecd *v, double x) { KV_GROW(v, double); v->d[v->n++] = x; return 0; }
static inline int pushi(veci *v, int64_t x) { KV_GROW(v, int64_t); v->d[v->n++] = x; return 0; }
static inline int pushi32(veci32 *v, int32_t x) { KV_GROW(v, int32_t); v->d[v->n++] = x; return 0; }
static inline int pushi8(veci8 *v, int8_t x) { KV_GROW(v, int8_t); v->d[v->n++] = x; return 0; }

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
/* Python's -(-a // b) for b > 0: C division truncates, which is the ceiling for a <= 0. */
static inline int64_t cdiv(int64_t a, int64_t b) { return a > 0 ? (a + b - 1) / b : a / b; }

/* splitmix64's finaliser: block keys are structured (chain id << 24 | block index), so they
 * need mixing before they index an open-addressing table. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* ------------------------------------------------------------------ the run's tables */
/* Event kinds: indices into replay.engine.raw.EVENT_KINDS. */
enum { EV_PREEMPT_RECOMPUTE = 0, EV_PREEMPT_SWAP = 1, EV_SWAP_IN = 2, EV_SWAP_FULL_FALLBACK = 3,
       EV_SWAP_FULL_ABORT = 4, EV_REJECT = 5, EV_OFFLOAD_STORE = 6, EV_OFFLOAD_LOAD = 7 };
/* Batch kinds: indices into replay.engine.raw.BATCH_KINDS. */
enum { BK_NEW = 0, BK_RESUMED = 1, BK_RUNNING = 2, BK_PREFILL = 3, BK_DECODE = 4 };

typedef struct {
    /* One row per step: replay.engine.raw.STEP_COLUMNS. */
    vecd start_s, duration_s;
    veci32 num_running, num_waiting, num_swapped, swap_out_blocks, swap_in_blocks, num_preempted,
        evicted_requests;
    veci num_prefill_tokens, num_decode_tokens, gpu_blocks_used, cpu_blocks_used, evicted_blocks,
        offload_store_blocks, offload_load_blocks;
    /* Events. */
    vecd ev_t; veci ev_step, ev_row, ev_blocks; veci8 ev_kind;
    /* Preemption stalls (mode 1 recompute, 2 swap). */
    veci sl_row; vecd sl_pre, sl_res, sl_stall; veci8 sl_mode;
    /* Fleet TBT samples as (value, weight). */
    vecd tbt_v; veci tbt_w;
    /* Per-step batch records (Loop.record_batches only; replay/engine/compiled.py expands them to
     * replay.engine.raw.BATCH_COLUMNS): rows per step, then each step's plan arrays back to back.
     */
    veci32 b_count, b_row; veci b_new, b_ctx; veci8 b_kind;
} Tables;

typedef struct {
    double start_s, duration_s;
    int32_t num_running, num_waiting, num_swapped, swap_out_blocks, swap_in_blocks,
        num_preempted, evicted_requests;
    int64_t num_prefill_tokens, num_decode_tokens, gpu_blocks_used, cpu_blocks_used,
        evicted_blocks, offload_store_blocks, offload_load_blocks;
} StepRow;

static int tables_step(Tables *o, const StepRow *r) {
    if (pushd(&o->start_s, r->start_s) || pushd(&o->duration_s, r->duration_s) ||
        pushi32(&o->num_running, r->num_running) || pushi32(&o->num_waiting, r->num_waiting) ||
        pushi32(&o->num_swapped, r->num_swapped) ||
        pushi(&o->num_prefill_tokens, r->num_prefill_tokens) ||
        pushi(&o->num_decode_tokens, r->num_decode_tokens) ||
        pushi(&o->gpu_blocks_used, r->gpu_blocks_used) ||
        pushi(&o->cpu_blocks_used, r->cpu_blocks_used) ||
        pushi32(&o->swap_out_blocks, r->swap_out_blocks) ||
        pushi32(&o->swap_in_blocks, r->swap_in_blocks) ||
        pushi32(&o->num_preempted, r->num_preempted) ||
        pushi32(&o->evicted_requests, r->evicted_requests) ||
        pushi(&o->evicted_blocks, r->evicted_blocks) ||
        pushi(&o->offload_store_blocks, r->offload_store_blocks) ||
        pushi(&o->offload_load_blocks, r->offload_load_blocks)) return -1;
    return 0;
}

static int tables_event(Tables *o, double t, int64_t step, int kind, int64_t row, int64_t blocks) {
    if (pushd(&o->ev_t, t) || pushi(&o->ev_step, step) || pushi(&o->ev_row, row) ||
        pushi8(&o->ev_kind, (int8_t)kind) || pushi(&o->ev_blocks, blocks)) return -1;
    return 0;
}

static int tables_stall(Tables *o, int64_t row, double preempted_s, double resumed_s,
                        double stall_s, int8_t mode) {
    if (pushi(&o->sl_row, row) || pushd(&o->sl_pre, preempted_s) || pushd(&o->sl_res, resumed_s) ||
        pushd(&o->sl_stall, stall_s) || pushi8(&o->sl_mode, mode)) return -1;
    return 0;
}

static int tables_tbt(Tables *o, double value, int64_t weight) {
    if (pushd(&o->tbt_v, value) || pushi(&o->tbt_w, weight)) return -1;
    return 0;
}

static void tables_free(Tables *o) {
    void *ps[] = {o->start_s.d, o->duration_s.d, o->num_running.d, o->num_waiting.d,
                  o->num_swapped.d, o->swap_out_blocks.d, o->swap_in_blocks.d, o->num_preempted.d,
                  o->evicted_requests.d, o->num_prefill_tokens.d, o->num_decode_tokens.d,
                  o->gpu_blocks_used.d, o->cpu_blocks_used.d, o->evicted_blocks.d,
                  o->offload_store_blocks.d, o->offload_load_blocks.d, o->ev_t.d,
                  o->ev_step.d, o->ev_row.d, o->ev_blocks.d, o->ev_kind.d, o->sl_row.d,
                  o->sl_pre.d, o->sl_res.d, o->sl_stall.d, o->sl_mode.d, o->tbt_v.d, o->tbt_w.d,
                  o->b_count.d, o->b_row.d, o->b_new.d, o->b_ctx.d, o->b_kind.d};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) free(ps[i]);
}

static PyObject *bytes_of(const void *p, int64_t n, size_t item) {
    return PyByteArray_FromStringAndSize((const char *)p, (Py_ssize_t)(n * (int64_t)item));
}

/* A Python list of ints from n int32 values. */
static inline PyObject *list_i32(const int32_t *p, int64_t n) {
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        PyObject *x = PyLong_FromLong(p[i]);
        if (!x) { Py_DECREF(l); return NULL; }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    return l;
}

/* The columns as a dict of bytearrays (replay/engine/compiled.py turns them into numpy); the core
 * adds its own scalars (final time, abort) to it. Each column's C buffer is freed as soon as it is
 * copied, so a long run never holds both copies of all its columns (peak memory); the columns
 * are handed over once (a second call returns them empty). */
static int col_move(PyObject *d, const char *name, void **p, int64_t *n, int64_t *cap,
                    size_t item) {
    PyObject *b = bytes_of(*p, *n, item);
    int rc = b ? PyDict_SetItemString(d, name, b) : -1;
    Py_XDECREF(b);
    free(*p);
    *p = NULL;
    *n = *cap = 0;          /* empty: a later push grows it afresh */
    return rc;
}

static PyObject *tables_dict(Tables *o) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define COL(name, v, item) \
    if (col_move(d, #name, (void **)&(v).d, &(v).n, &(v).cap, item) < 0) goto fail;
    COL(start_s, o->start_s, 8) COL(duration_s, o->duration_s, 8)
    COL(num_running, o->num_running, 4) COL(num_waiting, o->num_waiting, 4)
    COL(num_swapped, o->num_swapped, 4) COL(num_prefill_tokens, o->num_prefill_tokens, 8)
    COL(num_decode_tokens, o->num_decode_tokens, 8)
    COL(gpu_blocks_used, o->gpu_blocks_used, 8) COL(cpu_blocks_used, o->cpu_blocks_used, 8)
    COL(swap_out_blocks, o->swap_out_blocks, 4) COL(swap_in_blocks, o->swap_in_blocks, 4)
    COL(num_preempted, o->num_preempted, 4) COL(evicted_requests, o->evicted_requests, 4)
    COL(evicted_blocks, o->evicted_blocks, 8)
    COL(offload_store_blocks, o->offload_store_blocks, 8)
    COL(offload_load_blocks, o->offload_load_blocks, 8)
    COL(ev_t, o->ev_t, 8) COL(ev_step, o->ev_step, 8) COL(ev_row, o->ev_row, 8)
    COL(ev_kind, o->ev_kind, 1) COL(ev_blocks, o->ev_blocks, 8)
    COL(sl_row, o->sl_row, 8) COL(sl_pre, o->sl_pre, 8) COL(sl_res, o->sl_res, 8)
    COL(sl_stall, o->sl_stall, 8) COL(sl_mode, o->sl_mode, 1)
    COL(tbt_v, o->tbt_v, 8) COL(tbt_w, o->tbt_w, 8)
    COL(b_count, o->b_count, 4) COL(b_row, o->b_row, 4) COL(b_new, o->b_new, 8)
    COL(b_ctx, o->b_ctx, 8) COL(b_kind, o->b_kind, 1)
#undef COL
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ------------------------------------------------------------------ buffer views */
/* The numpy arrays a core reads and writes in place; the views keep them alive. */
typedef struct { Py_buffer v[24]; int n; } Views;

/* A C-contiguous buffer of n items of `itemsize` bytes (n < 0: any length). */
static void *views_take(Views *vs, PyObject *obj, int64_t n, Py_ssize_t itemsize, int writable,
                        const char *name) {
    if (vs->n == (int)(sizeof(vs->v) / sizeof(vs->v[0]))) {
        PyErr_SetString(PyExc_ValueError, "core: too many arrays");
        return NULL;
    }
    Py_buffer *v = &vs->v[vs->n];
    if (PyObject_GetBuffer(obj, v, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    vs->n++;
    if (n >= 0 && v->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "core: %s has %zd bytes, expected %lld", name, v->len,
                     (long long)(n * itemsize));
        return NULL;
    }
    return v->buf;
}

static void views_release(Views *vs) {
    for (int i = 0; i < vs->n; i++) PyBuffer_Release(&vs->v[i]);
    vs->n = 0;
}

/* ------------------------------------------------------------------ request arrays */
/* replay.engine.state.RequestState's arrays and the loop's per-request outputs (numpy buffers,
 * written in place), in the order replay/engine/compiled.py passes them. */
typedef struct {
    int64_t n;
    const double *arrival;
    const int64_t *prompt, *out_len, *prio;
    int8_t *status;
    int64_t *num_computed, *num_output, *recomputed, *cached_prompt, *computed_at_pre;
    int32_t *num_pre, *num_swaps, *num_rec;
    double *first_sched, *first_tok, *finish, *max_tbt;
    int64_t *cpu_hit;       /* V1 offloading: tokens loaded from the CPU tier at first admission */
} Req;

/* The core behind a per-step call taking (capsule, request row), the row checked: both cores'
 * Core structs begin with their Req, so the row count is read through it. NULL with the error
 * set. */
static void *kv_row_arg(PyObject *args, const char *capsule, int64_t *row) {
    PyObject *cap;
    long long r;
    if (!PyArg_ParseTuple(args, "OL", &cap, &r)) return NULL;
    Req *q = (Req *)PyCapsule_GetPointer(cap, capsule);
    if (!q) return NULL;
    if (r < 0 || r >= q->n) { PyErr_Format(PyExc_IndexError, "core: row %lld", r); return NULL; }
    *row = r;
    return q;
}

static int req_take(Views *vs, PyObject *arrays, Req *q) {
    PyObject *a[18];
    if (!PyArg_ParseTuple(arrays, "OOOOOOOOOOOOOOOOOO", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                          &a[6], &a[7], &a[8], &a[9], &a[10], &a[11], &a[12], &a[13], &a[14],
                          &a[15], &a[16], &a[17])) return -1;
    if (!(q->arrival = views_take(vs, a[0], -1, 8, 0, "arrival_s"))) return -1;
    int64_t n = q->n = vs->v[vs->n - 1].len / 8;
    if (!(q->prompt = views_take(vs, a[1], n, 8, 0, "prompt_len")) ||
        !(q->out_len = views_take(vs, a[2], n, 8, 0, "output_len")) ||
        !(q->status = views_take(vs, a[3], n, 1, 1, "status")) ||
        !(q->num_computed = views_take(vs, a[4], n, 8, 1, "num_computed")) ||
        !(q->num_output = views_take(vs, a[5], n, 8, 1, "num_output")) ||
        !(q->num_pre = views_take(vs, a[6], n, 4, 1, "num_preemptions")) ||
        !(q->num_swaps = views_take(vs, a[7], n, 4, 1, "num_swaps")) ||
        !(q->num_rec = views_take(vs, a[8], n, 4, 1, "num_recomputes")) ||
        !(q->recomputed = views_take(vs, a[9], n, 8, 1, "recomputed_tokens")) ||
        !(q->cached_prompt = views_take(vs, a[10], n, 8, 1, "cached_prompt_tokens")) ||
        !(q->computed_at_pre = views_take(vs, a[11], n, 8, 1, "computed_at_preemption")) ||
        !(q->first_sched = views_take(vs, a[12], n, 8, 1, "first_scheduled_s")) ||
        !(q->first_tok = views_take(vs, a[13], n, 8, 1, "first_token_s")) ||
        !(q->finish = views_take(vs, a[14], n, 8, 1, "finish_s")) ||
        !(q->max_tbt = views_take(vs, a[15], n, 8, 1, "max_tbt_s")) ||
        !(q->prio = views_take(vs, a[16], n, 8, 0, "priority")) ||
        !(q->cpu_hit = views_take(vs, a[17], n, 8, 1, "cpu_hit_tokens"))) return -1;
    return 0;
}

/* ------------------------------------------------------------------ the resolved spec */
/* replay.engine.spec.SchedulerSpec as a dict of its fields (replay/engine/compiled.py passes a
 * fresh copy). A core takes each field it reads by name and removes it from the dict; the adapter
 * then fails on any field left that the core does not declare not applicable, so a knob without C
 * support can never be silently ignored. */
static PyObject *spec_pop(PyObject *spec, const char *name) {
    PyObject *v = PyDict_GetItemString(spec, name);     /* borrowed */
    if (!v) {
        PyErr_Format(PyExc_KeyError, "core: the spec has no field %s", name);
        return NULL;
    }
    Py_INCREF(v);
    if (PyDict_DelItemString(spec, name) < 0) { Py_DECREF(v); return NULL; }
    return v;
}

static int spec_int(PyObject *spec, const char *name, int64_t *out) {
    PyObject *v = spec_pop(spec, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

/* An optional int field: None takes `dflt`. */
static inline int spec_opt_int(PyObject *spec, const char *name, int64_t dflt, int64_t *out) {
    PyObject *v = spec_pop(spec, name);
    if (!v) return -1;
    long long x = v == Py_None ? dflt : PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static int spec_bool(PyObject *spec, const char *name, int *out) {
    PyObject *v = spec_pop(spec, name);
    if (!v) return -1;
    int x = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (x < 0) return -1;
    *out = x;
    return 0;
}

static int spec_float(PyObject *spec, const char *name, double *out) {
    PyObject *v = spec_pop(spec, name);
    if (!v) return -1;
    double x = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

/* A string field: its index in the NULL-terminated `choices`; any other value is an error. */
static int spec_choice(PyObject *spec, const char *name, const char *const *choices, int *out) {
    PyObject *v = spec_pop(spec, name);
    if (!v) return -1;
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    for (int i = 0; s && choices[i]; i++)
        if (strcmp(s, choices[i]) == 0) { Py_DECREF(v); *out = i; return 0; }
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "core: spec field %s = %R is not supported", name, v);
    Py_DECREF(v);
    return -1;
}

/* An optional string field: None gives -1. */
static inline int spec_opt_choice(PyObject *spec, const char *name, const char *const *choices, int *out) {
    PyObject *v = PyDict_GetItemString(spec, name);     /* borrowed */
    if (v == Py_None) {
        if (PyDict_DelItemString(spec, name) < 0) return -1;
        *out = -1;
        return 0;
    }
    return spec_choice(spec, name, choices, out);
}

/* The spec's string fields, in the order of the cores' MODE_* / POLICY_* enums. */
static const char *const MODE_NAMES[] = {"recompute", "none", "swap", NULL};
static const char *const POLICY_NAMES[] = {"fcfs", "priority", NULL};
/* replay.engine.spec.VLLM_VERSIONS */
static const char *const VERSION_NAMES[] = {"0.33", "0.34", NULL};

/* ------------------------------------------------------------------ block keys */
/* replay/engine/prefix.py: request-unique keys, or keys from the trace's prefix-hash chains. */
#define K_BITS 24

typedef struct {
    int mode;                    /* 0 unique per request, 1 trace prefix chains, 2 explicit keys */
    int64_t bs, hbt;
    const int64_t *chain_off, *chain_ids, *num_shared;
} Keys;

static int keys_take(Views *vs, PyObject *keys, int64_t n, int64_t block_size, Keys *k) {
    PyObject *off, *ids, *shared;
    long long hbt;
    if (!PyArg_ParseTuple(keys, "iLOOO", &k->mode, &hbt, &off, &ids, &shared)) return -1;
    k->bs = block_size;
    k->hbt = hbt;
    /* Mode 2 (token-id keys, precomputed by replay/engine/compiled.py): chain_ids holds each row's
     * block keys in order from chain_off[row], num_shared[row] of them. */
    if (k->mode >= 1 &&
        (!(k->chain_off = views_take(vs, off, n + 1, 8, 0, "chain_off")) ||
         !(k->num_shared = views_take(vs, shared, n, 8, 0, "num_shared")) ||
         !(k->chain_ids = views_take(vs, ids, -1, 8, 0, "chain_ids")))) return -1;
    return 0;
}

static inline int64_t key_of(const Keys *ks, int64_t row, int64_t k) {
    if (ks->mode == 2 && k < ks->num_shared[row]) return ks->chain_ids[ks->chain_off[row] + k];
    if (ks->mode == 1 && k < ks->num_shared[row]) {
        int64_t j = ((k + 1) * ks->bs - 1) / ks->hbt;
        return (ks->chain_ids[ks->chain_off[row] + j] << K_BITS) | k;
    }
    return -((row << K_BITS) | k) - 1;
}

/* key_of for k = start, start + 1, ... of one row without a division per block (the trace block
 * index j only moves every hash_block_tokens / block_size blocks): prefix-cache scans and
 * registrations go through millions of blocks. */
typedef struct { int64_t row, k, shared, j, jend; const int64_t *chain; } KeyIt;

static inline void keyit_init(const Keys *ks, KeyIt *it, int64_t row, int64_t start) {
    it->row = row;
    it->k = start;
    it->shared = ks->mode >= 1 ? ks->num_shared[row] : 0;
    it->j = it->jend = 0;
    it->chain = NULL;
    if (ks->mode == 2) {
        it->chain = ks->chain_ids + ks->chain_off[row];
    } else if (start < it->shared) {
        it->chain = ks->chain_ids + ks->chain_off[row];
        it->j = ((start + 1) * ks->bs - 1) / ks->hbt;
        /* The first block whose j is larger: ((k + 1) * bs - 1) / hbt > j. */
        it->jend = cdiv((it->j + 1) * ks->hbt + 1, ks->bs) - 1;
    }
}

static inline int64_t keyit_next(const Keys *ks, KeyIt *it) {
    int64_t k = it->k++;
    if (ks->mode == 2 && k < it->shared) return it->chain[k];
    if (k < it->shared) {
        while (k >= it->jend) { it->j++; it->jend = cdiv((it->j + 1) * ks->hbt + 1, ks->bs) - 1; }
        return (it->chain[it->j] << K_BITS) | k;
    }
    return -((it->row << K_BITS) | k) - 1;
}

/* ------------------------------------------------------------------ cost model */
/* replay/timing/cost_model.py's constants, folded as there; `cost_step_s` is `_step_s` with the
 * same terms in the same order (built with -ffp-contract=off: bit-identical durations). A measured
 * profile (replay/timing/step_profile.py) replaces the roofline by its tables: `cost_measured_s` is
 * `MeasuredTables.step_s`, term for term. Tables live inline (no allocation, nothing to free). */
#define TAB1_MAX 96
#define TAB2_ROWS 16
#define TAB2_COLS 24
typedef struct { int n; double x[TAB1_MAX], y[TAB1_MAX]; } Tab1;
typedef struct { int nr, nc; double r[TAB2_ROWS], c[TAB2_COLS], z[TAB2_ROWS * TAB2_COLS]; } Tab2;
typedef struct {
    int on;
    double overhead_s, per_row_s, scale;
    Tab1 lin, lm, ar;          /* ar.n == 0: no tensor parallelism */
    Tab2 pa, da;               /* prefill rows x tokens per row; decode rows x context */
} Measured;

typedef struct {
    double lin_per_token, lm_per_sample, attn_per_unit, flops_rate, bytes_rate, weight_bytes,
        overhead_s, ar_fixed, ar_per_token, swap_per_block;
    int64_t kv_bytes_per_token, kv_bytes_per_block;
    int async_overlap;         /* async scheduling: the CPU overhead hides behind the forward */
    Measured m;
} Cost;

/* n doubles of a Python sequence into out[cap]. */
static int tab_vals(PyObject *seq, double *out, int cap, int *n, const char *name) {
    PyObject *f = PySequence_Fast(seq, name);
    if (!f) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(f);
    if (len > cap) {
        PyErr_Format(PyExc_ValueError, "core: %s has %zd values, at most %d", name, len, cap);
        Py_DECREF(f);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        out[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(f, i));
        if (out[i] == -1.0 && PyErr_Occurred()) { Py_DECREF(f); return -1; }
    }
    *n = (int)len;
    Py_DECREF(f);
    return 0;
}

static int tab1_take(PyObject *x, PyObject *y, Tab1 *t, int optional, const char *name) {
    int ny = 0;
    if (tab_vals(x, t->x, TAB1_MAX, &t->n, name) || tab_vals(y, t->y, TAB1_MAX, &ny, name))
        return -1;
    if (ny != t->n || (t->n < 2 && !(optional && t->n == 0))) {
        PyErr_Format(PyExc_ValueError, "core: table %s needs 2+ knots and a value each", name);
        return -1;
    }
    return 0;
}

static int tab2_take(PyObject *r, PyObject *c, PyObject *z, Tab2 *t, const char *name) {
    int nz = 0;
    if (tab_vals(r, t->r, TAB2_ROWS, &t->nr, name) || tab_vals(c, t->c, TAB2_COLS, &t->nc, name) ||
        tab_vals(z, t->z, TAB2_ROWS * TAB2_COLS, &nz, name)) return -1;
    if (t->nr < 2 || t->nc < 2 || nz != t->nr * t->nc) {
        PyErr_Format(PyExc_ValueError, "core: table %s needs 2+ rows, 2+ columns, a value each",
                     name);
        return -1;
    }
    return 0;
}

/* MeasuredTables.c_args(): (overhead_s, per_row_s, scale, lin x, y, lm x, y, prefill rows, cols,
 * z, decode rows, cols, z, allreduce x, y). */
static int measured_parse(PyObject *args, Measured *m) {
    PyObject *o[12];
    if (!PyArg_ParseTuple(args, "dddOOOOOOOOOOOO", &m->overhead_s, &m->per_row_s, &m->scale,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                          &o[10], &o[11])) return -1;
    if (tab1_take(o[0], o[1], &m->lin, 0, "linear_s") || tab1_take(o[2], o[3], &m->lm, 0, "lm_head_s") ||
        tab2_take(o[4], o[5], o[6], &m->pa, "prefill_attention_s") ||
        tab2_take(o[7], o[8], o[9], &m->da, "decode_attention_s") ||
        tab1_take(o[10], o[11], &m->ar, 1, "allreduce_s")) return -1;
    m->on = 1;
    return 0;
}

static int cost_parse(PyObject *cost, Cost *c) {
    long long kvbpt, kvbpb;
    PyObject *measured = Py_None;
    int async_overlap = 0;
    if (!PyArg_ParseTuple(cost, "dddddddddLLd|Op", &c->lin_per_token, &c->lm_per_sample,
                          &c->attn_per_unit, &c->flops_rate, &c->bytes_rate, &c->weight_bytes,
                          &c->overhead_s, &c->ar_fixed, &c->ar_per_token, &kvbpt, &kvbpb,
                          &c->swap_per_block, &measured, &async_overlap)) return -1;
    c->async_overlap = async_overlap;
    c->kv_bytes_per_token = kvbpt;
    c->kv_bytes_per_block = kvbpb;
    c->m.on = 0;
    return measured == Py_None ? 0 : measured_parse(measured, &c->m);
}

static inline double cost_step_s(const Cost *c, int64_t tokens, int64_t samples, int64_t attn,
                                 int64_t kv, int64_t swaps) {
    double compute = ((double)tokens * c->lin_per_token + (double)samples * c->lm_per_sample
                      + (double)attn * c->attn_per_unit) / c->flops_rate;
    double memory = (c->weight_bytes + (double)(kv * c->kv_bytes_per_token)) / c->bytes_rate;
    double m = memory > compute ? memory : compute;
    if (c->async_overlap) {
        double fwd = m + (c->ar_fixed + (double)tokens * c->ar_per_token);
        return (c->overhead_s > fwd ? c->overhead_s : fwd) + (double)swaps * c->swap_per_block;
    }
    return c->overhead_s + m + (c->ar_fixed + (double)tokens * c->ar_per_token)
           + (double)swaps * c->swap_per_block;
}

/* step_profile._segment: v = xs[i] + w (xs[i+1] - xs[i]); below the first knot w = 0, past the
 * last the last segment extends (w > 1). Binary search: the largest i with xs[i] <= v. */
static inline double tab_segment(const double *xs, int n, double v, int *i) {
    if (v <= xs[0]) { *i = 0; return 0.0; }
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (xs[mid] <= v) lo = mid; else hi = mid;
    }
    if (lo > n - 2) lo = n - 2;
    *i = lo;
    return (v - xs[lo]) / (xs[lo + 1] - xs[lo]);
}

static inline double tab1_at(const Tab1 *t, double v) {
    int i;
    double w = tab_segment(t->x, t->n, v, &i);
    return t->y[i] + w * (t->y[i + 1] - t->y[i]);
}

static inline double tab2_at(const Tab2 *t, double r, double c) {
    int i, j, n = t->nc;
    double wr = tab_segment(t->r, t->nr, r, &i), wc = tab_segment(t->c, t->nc, c, &j);
    double z00 = t->z[i * n + j], z01 = t->z[i * n + j + 1];
    double z10 = t->z[(i + 1) * n + j], z11 = t->z[(i + 1) * n + j + 1];
    double a = z00 + wc * (z01 - z00);
    double b = z10 + wc * (z11 - z10);
    return a + wr * (b - a);
}

/* ------------------------------------------------------------------ the replay loop */
/* replay/engine/loop.py (the reference loop) around a core's schedule() and update(): the virtual
 * clock, arrivals, events, evicted-KV gauges, step rows, TBT samples and stalls. */
typedef struct {
    double t;                             /* virtual clock */
    int64_t cursor, step, idle_spins;     /* next trace row to arrive; steps taken */
    int done;
    /* A stepped replica (loop_run_until) that must wait for its next arrival, not routed yet:
     * it resumes at that arrival, as a whole replay would jump there. */
    int parked;
    double *last_tok, *preempted_at;      /* per row */
    int8_t *last_mode;                    /* per row: 1 recompute, 2 swap (its last preemption) */
    int64_t *evicted;                     /* per row: blocks of a swap victim not yet resumed */
    int64_t evicted_count, evicted_total;
    int record_batches;                   /* keep every step's batch (Tables.b_*) */
    int64_t batch_lo, batch_hi;           /* ... of the steps with index in [lo, hi] only */
} Loop;

static int loop_init(Loop *lp, const Req *q) {
    int64_t n = q->n > 0 ? q->n : 1;
    lp->last_tok = (double *)malloc((size_t)n * sizeof(double));
    lp->preempted_at = (double *)malloc((size_t)n * sizeof(double));
    lp->last_mode = (int8_t *)calloc((size_t)n, 1);
    lp->evicted = (int64_t *)calloc((size_t)n, sizeof(int64_t));
    if (!lp->last_tok || !lp->preempted_at || !lp->last_mode || !lp->evicted) return -1;
    for (int64_t r = 0; r < n; r++) lp->last_tok[r] = lp->preempted_at[r] = NAN;
    lp->t = q->n ? q->arrival[0] : 0.0;
    return 0;
}

static void loop_free(Loop *lp) {
    free(lp->last_tok); free(lp->preempted_at); free(lp->last_mode); free(lp->evicted);
}

/* One step's plan as the loop reads it (each core points these at its own arrays). */
typedef struct {
    const int32_t *rows; const int64_t *num_new, *num_computed; const uint8_t *prefill;
    const uint8_t *sampled;               /* set by the core's update() */
    const int8_t *kind;                   /* V1: BK_* per row; NULL (V0): prefill / decode */
    int64_t nrows;
    const int32_t *pre_rows; const int64_t *pre_blocks; const int8_t *pre_mode;
    const uint8_t *pre_fallback; int64_t npre;
    const int32_t *rej_rows; int64_t nrej;
    int64_t nswap_out, nswap_in;          /* block pairs copied */
    int64_t noffload;                     /* CPU offload transfers issued or reported done */
    double wake_s;                        /* when the next offload transfer completes (NAN: none) */
} Plan;

/* Rejections, then each preemption (its swap-full fallback first); marks when and how the
 * victims were preempted. The core adds its swap-in events after these. */
static int loop_preemption_events(Loop *lp, Tables *o, const Plan *pl) {
    for (int64_t j = 0; j < pl->nrej; j++)
        if (tables_event(o, lp->t, lp->step, EV_REJECT, pl->rej_rows[j], 0)) return -1;
    for (int64_t j = 0; j < pl->npre; j++) {
        int64_t r = pl->pre_rows[j], b = pl->pre_blocks[j];
        if (pl->pre_fallback[j] && tables_event(o, lp->t, lp->step, EV_SWAP_FULL_FALLBACK, r, b))
            return -1;
        if (tables_event(o, lp->t, lp->step,
                         pl->pre_mode[j] == 2 ? EV_PREEMPT_SWAP : EV_PREEMPT_RECOMPUTE, r, b))
            return -1;
        if (isnan(lp->preempted_at[r])) lp->preempted_at[r] = lp->t;
        lp->last_mode[r] = pl->pre_mode[j];
    }
    return 0;
}

/* Resumed (scheduled again, swapped in) or dropped rows are no longer evicted; then this step's
 * swap victims are. */
static void loop_evictions(Loop *lp, const Plan *pl) {
    if (lp->evicted_count) {
        for (int64_t j = 0; j < pl->nrows + pl->nrej; j++) {
            int64_t r = j < pl->nrows ? pl->rows[j] : pl->rej_rows[j - pl->nrows];
            if (!lp->evicted[r]) continue;
            lp->evicted_total -= lp->evicted[r];
            lp->evicted_count--;
            lp->evicted[r] = 0;
        }
    }
    for (int64_t j = 0; j < pl->npre; j++) {
        int64_t r = pl->pre_rows[j];
        if (pl->pre_mode[j] != 2 || lp->evicted[r]) continue;
        lp->evicted[r] = max64(pl->pre_blocks[j], 1);
        lp->evicted_total += lp->evicted[r];
        lp->evicted_count++;
    }
}

/* The step's aggregates for the cost model (before update(): a row samples when its chunk
 * reaches the end of its known tokens); stamps first_scheduled_s. */
typedef struct {
    int64_t num_prefill, num_decode, tokens, attn, kv, num_sampled;
    /* For a measured profile: rows, decode rows (one new token) and their KV tokens, prefill
     * rows and their causal work (step_profile.step_aggregates). */
    int64_t rows, dec_rows, dec_kv, pre_rows, pre_work;
} StepSums;

static StepSums loop_sums(const Loop *lp, Req *q, const Plan *pl) {
    StepSums s = {0, 0, 0, 0, 0, 0, pl->nrows, 0, 0, 0, 0};
    for (int64_t j = 0; j < pl->nrows; j++) {
        int64_t r = pl->rows[j], nn = pl->num_new[j], cc = pl->num_computed[j];
        if (isnan(q->first_sched[r])) q->first_sched[r] = lp->t;
        if (pl->prefill[j]) s.num_prefill += nn; else s.num_decode += nn;
        s.tokens += nn;
        s.attn += nn * cc + nn * (nn + 1) / 2;
        s.kv += cc;
        s.num_sampled += cc + nn >= q->prompt[r] + q->num_output[r];
        if (nn == 1) { s.dec_rows++; s.dec_kv += cc + 1; }
        else { s.pre_rows++; s.pre_work += nn * cc + nn * (nn + 1) / 2; }
    }
    s.kv += s.tokens;
    return s;
}

/* MeasuredTables.step_s: the same terms in the same order. */
static inline double cost_measured_s(const Cost *c, const StepSums *s, int64_t swaps) {
    const Measured *m = &c->m;
    double kern = 0.0;
    if (s->tokens > 0) {
        kern += tab1_at(&m->lin, (double)s->tokens);
        if (m->ar.n) kern += tab1_at(&m->ar, (double)s->tokens);
    }
    if (s->num_sampled > 0) kern += tab1_at(&m->lm, (double)s->num_sampled);
    if (s->pre_rows > 0) {
        double eq = (sqrt(1.0 + 8.0 * (double)s->pre_work / (double)s->pre_rows) - 1.0) * 0.5;
        kern += tab2_at(&m->pa, (double)s->pre_rows, eq);
    }
    if (s->dec_rows > 0)
        kern += tab2_at(&m->da, (double)s->dec_rows, (double)s->dec_kv / (double)s->dec_rows);
    if (c->async_overlap) {
        double cpu = m->overhead_s + (double)s->rows * m->per_row_s, gpu = m->scale * kern;
        return (cpu > gpu ? cpu : gpu) + (double)swaps * c->swap_per_block;
    }
    return m->overhead_s + (double)s->rows * m->per_row_s + m->scale * kern
           + (double)swaps * c->swap_per_block;
}

/* One step's duration: the measured profile when there is one, else the roofline. */
static inline double cost_step(const Cost *c, const StepSums *s, int64_t swaps) {
    if (c->m.on) return cost_measured_s(c, s, swaps);
    return cost_step_s(c, s->tokens, s->num_sampled, s->attn, s->kv, swaps);
}

/* The step's batch, one record per scheduled row in batch order (replay/engine/loop.py's
 * record_batches): the plan's arrays copied whole. */
static int loop_batches(Tables *o, const Plan *pl) {
    int64_t k = pl->nrows, n0 = o->b_kind.n;
    if (pushi32(&o->b_count, (int32_t)k)) return -1;
    KV_APPEND(&o->b_row, int32_t, pl->rows, k);
    KV_APPEND(&o->b_new, int64_t, pl->num_new, k);
    KV_APPEND(&o->b_ctx, int64_t, pl->num_computed, k);
    KV_APPEND(&o->b_kind, int8_t, pl->kind, k);
    if (!pl->kind)
        for (int64_t j = 0; j < k; j++)
            o->b_kind.d[n0 + j] = pl->prefill[j] ? BK_PREFILL : BK_DECODE;
    return 0;
}

/* After update(): record the step row (`row`, completed here with the loop's own columns), the
 * TBT samples (one weighted sample for the rows that also sampled in the previous step, then
 * the others one by one in batch order), stalls, finish times; advance the clock. Returns 1 when
 * the run must stop (nothing can move and nothing will arrive), 0 to go on, -1 on error. */
static int loop_finish_step(Loop *lp, Tables *o, Req *q, const Plan *pl, StepRow *row,
                            int64_t num_sampled, const int32_t *fin, int64_t nfin) {
    double t = lp->t, end = t + row->duration_s;
    int64_t same = 0, got = 0;
    for (int64_t j = 0; j < pl->nrows; j++) {
        if (!pl->sampled[j]) continue;
        int64_t r = pl->rows[j];
        got++;
        if (!isnan(q->first_tok[r])) same += lp->last_tok[r] == t;
    }
    if (got != num_sampled) {
        PyErr_Format(PyExc_AssertionError, "step %lld: executor costed %lld sampled rows, "
                     "scheduler sampled %lld", (long long)(lp->step + 1), (long long)num_sampled,
                     (long long)got);
        return -1;
    }
    row->start_s = t;
    row->num_preempted = (int32_t)pl->npre;
    row->swap_out_blocks = (int32_t)pl->nswap_out;
    row->swap_in_blocks = (int32_t)pl->nswap_in;
    row->evicted_requests = (int32_t)lp->evicted_count;
    row->evicted_blocks = lp->evicted_total;
    if (tables_step(o, row)) return -1;
    if (lp->record_batches) {
        /* Outside the asked step range a step records an empty batch (its count only), so the
         * counts still number the steps. */
        if (lp->step >= lp->batch_lo && lp->step <= lp->batch_hi) {
            if (loop_batches(o, pl)) return -1;
        } else if (pushi32(&o->b_count, 0)) return -1;
    }
    if (same && tables_tbt(o, end - t, same)) return -1;
    for (int64_t j = 0; j < pl->nrows; j++) {
        if (!pl->sampled[j]) continue;
        int64_t r = pl->rows[j];
        if (isnan(q->first_tok[r])) {
            q->first_tok[r] = end;
        } else {
            double prev = lp->last_tok[r], gap = end - prev;
            if (prev != t && tables_tbt(o, gap, 1)) return -1;
            if (gap > q->max_tbt[r]) q->max_tbt[r] = gap;
            if (!isnan(lp->preempted_at[r]) &&
                tables_stall(o, r, lp->preempted_at[r], end, gap, lp->last_mode[r] == 2 ? 2 : 1))
                return -1;
        }
        lp->preempted_at[r] = NAN;
        lp->last_tok[r] = end;
    }
    /* A request finishes with its last token (async: applied one step after it came). */
    for (int64_t j = 0; j < nfin; j++) q->finish[fin[j]] = lp->last_tok[fin[j]];
    int progressed = pl->nrows || pl->npre || pl->nrej || pl->nswap_in || nfin || pl->noffload;
    lp->idle_spins = progressed ? 0 : lp->idle_spins + 1;
    lp->t = end;
    lp->step++;
    if (lp->idle_spins >= 2) {
        /* Nothing can move until something arrives or a CPU offload transfer completes: jump
         * there, or stop. */
        int arrives = lp->cursor < q->n, wakes = !isnan(pl->wake_s);
        if (!arrives && !wakes) return 1;
        double w = arrives ? q->arrival[lp->cursor] : pl->wake_s;
        if (wakes && pl->wake_s < w) w = pl->wake_s;
        lp->idle_spins = 0;
        /* A stepped replica's next row is not routed yet (+inf): wait for it, clock unmoved
         * (a stuck core, e.g. V0 whose swapped request can never swap back in: vLLM idles). */
        if (isinf(w)) { lp->parked = 1; return 0; }
        if (w > lp->t) lp->t = w;
    }
    return 0;
}

/* What the loop needs from a core. */
typedef struct {
    void (*add_request)(void *core, int32_t row);
    int (*has_unfinished)(const void *core);
    int (*step)(void *core);              /* one engine step: 1 when the run ends, -1 on error */
} CoreOps;

/* Run until the trace is done or `max_steps` more steps were taken: 1 when done, 0 when not,
 * -1 on error. Pure C (no Python object, no GIL needed): loop_run_released checks for Ctrl-C. */
static int loop_run(Loop *lp, Req *q, void *core, const CoreOps *ops, int64_t max_steps) {
    int64_t stop = lp->step + max_steps;
    while (!lp->done && lp->step < stop) {
        /* Arrivals due by now enter in trace order. */
        while (lp->cursor < q->n && q->arrival[lp->cursor] <= lp->t)
            ops->add_request(core, (int32_t)lp->cursor++);
        if (!ops->has_unfinished(core)) {
            if (lp->cursor >= q->n) { lp->done = 1; break; }
            if (q->arrival[lp->cursor] > lp->t) lp->t = q->arrival[lp->cursor];   /* idle gap */
            continue;
        }
        int rc = ops->step(core);
        if (rc < 0) return -1;
        if (rc == 1) lp->done = 1;
    }
    return lp->done;
}

/* loop_run_released steps in slices of about LOOP_SLICE_S seconds without the GIL: Ctrl-C
 * answers within one, and a thread waiting for the GIL (taken back at each slice's end, for at
 * most the interpreter's switch interval, 5 ms) costs the loop a few percent. The clock is
 * read every LOOP_CLOCK_STEPS steps (steps take 0.5-20 us). */
#define LOOP_SLICE_S 0.05
#define LOOP_CLOCK_STEPS 1024

static double loop_clock_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* loop_run with the GIL released, so another Python thread runs meanwhile (`kvcap replay`'s
 * store writer imports DuckDB and appends the previous chunk of steps). Ctrl-C: Python's
 * handler only sets a flag; it is raised here, between two slices (two steps), with the GIL
 * held. Steps read and write only C memory (the request arrays are buffers held for the core's
 * lifetime); their errors go through kv_err_* above. */
static int loop_run_released(Loop *lp, Req *q, void *core, const CoreOps *ops, int64_t max_steps) {
    int64_t stop = lp->step + max_steps;
    for (;;) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        double until = loop_clock_s() + LOOP_SLICE_S;
        do {
            int64_t k = stop - lp->step < LOOP_CLOCK_STEPS ? stop - lp->step : LOOP_CLOCK_STEPS;
            rc = loop_run(lp, q, core, ops, k);
        } while (rc == 0 && lp->step < stop && loop_clock_s() < until);
        Py_END_ALLOW_THREADS
        if (rc != 0 || lp->step >= stop) return rc;
        if (PyErr_CheckSignals() < 0) return -1;
    }
}

/* Take every step that starts before `t_limit` (lor's stepped replicas, replay/fleet/run.py: a
 * request arriving at t_limit is not routed yet, and a step starting before it cannot contain
 * it): arrivals due by a step's start enter first, as in loop_run; an idle core jumps to its
 * next arrival only when that is before the limit (rows not routed yet arrive at +inf). 1 when
 * done, 0 when the next step would start at or after the limit, -1 on error. With the GIL: the
 * steps between two arrivals are few. */
static int loop_run_until(Loop *lp, Req *q, void *core, const CoreOps *ops, double t_limit) {
    while (!lp->done) {
        if (lp->parked) {                 /* waiting for its next arrival: routed before t_limit? */
            if (!(lp->cursor < q->n && q->arrival[lp->cursor] < t_limit)) return 0;
            if (q->arrival[lp->cursor] > lp->t) lp->t = q->arrival[lp->cursor];
            lp->parked = 0;
        }
        while (lp->cursor < q->n && q->arrival[lp->cursor] <= lp->t)
            ops->add_request(core, (int32_t)lp->cursor++);
        if (!ops->has_unfinished(core)) {
            if (lp->cursor >= q->n) { lp->done = 1; break; }
            if (!(q->arrival[lp->cursor] < t_limit)) return 0;
            if (q->arrival[lp->cursor] > lp->t) lp->t = q->arrival[lp->cursor];   /* idle gap */
            continue;
        }
        if (!(lp->t < t_limit)) return 0;
        int rc = ops->step(core);
        if (rc < 0) return -1;
        if (rc == 1) lp->done = 1;
    }
    return lp->done;
}

static PyObject *loop_run_until_py(Loop *lp, Req *q, void *core, const CoreOps *ops,
                                   double t_limit) {
    int rc = loop_run_until(lp, q, core, ops, t_limit);
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    return Py_BuildValue("(iLdL)", rc, (long long)lp->step, lp->t, (long long)lp->cursor);
}

/* `run(core, max_steps)` of both modules: loop_run (GIL released), then (done, step, t, cursor)
 * for Python. */
static PyObject *loop_run_py(Loop *lp, Req *q, void *core, const CoreOps *ops, long long max_steps) {
    int rc = loop_run_released(lp, q, core, ops, max_steps);
    if (rc < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    return Py_BuildValue("(iLdL)", rc, (long long)lp->step, lp->t, (long long)lp->cursor);
}

#endif
