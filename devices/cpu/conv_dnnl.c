/* oneDNN implementation of the CPU conv family (CONV2D, CONV2D_BWD_DATA,
 * CONV2D_BWD_WEIGHT; contracts at the top of tasks/conv.c), f32 only (oneDNN
 * has no f64 convolution; f64 stays on im2col, devices/cpu/conv.c).
 *
 * One thread per worker: Debian's libdnnl runs on OpenMP (libgomp), whose
 * thread count is a per-thread setting; every worker thread sets it to 1
 * before its first oneDNN call, so a conv task uses the core of its worker
 * only, as the im2col path (one OpenBLAS thread) does.
 *
 * Per worker thread (thread-local, freed by a pthread key destructor when
 * StarPU ends its workers): a CPU engine and stream, a bounded cache of
 * primitives keyed by (kind, every size, stride, padding, dilation, groups,
 * memory-format mode), least recently used out first, and one growing
 * buffer (the pool) that holds the primitive's scratchpad and the operands
 * reordered to the formats the primitive chose.
 *
 * Operands are contiguous NCHW / OIHW (the front ends copy strided inputs),
 * at an element offset into their StarPU buffer. Two memory-format modes
 * (EMBER_DNNL_FORMAT, read once; for measurements):
 *   any    the primitive picks its formats (blocked, e.g. nChw16c / OIhw16i16o);
 *          inputs are reordered into the pool before, the output out of it
 *          after, whenever the pick differs from the plain layout
 *   plain  the primitive works on nchw / oihw (goihw with groups) directly
 *   auto   (default) any, except plain for 1x1 kernels and where any would
 *          pad the channels of an activation to twice or more (entry_build);
 *          the fastest of the three on bench/bench_conv_cpu.c's shapes
 *
 * oneDNN's padding: left = the contract's pad; right = whatever makes the
 * output descriptor's size (the contract does not fix OH, OW): right =
 * (OH-1)*stride + (KH-1)*dilation + 1 - H - pad, which oneDNN accepts when
 * > -stride, else the shape has no primitive. Dilation is oneDNN's d-1.
 *
 * Failures: no primitive for a shape (creation answers unimplemented or
 * invalid arguments) sends the conv to im2col, and the cache remembers it;
 * any other oneDNN failure is a kernel error naming the call and its status. */
#include "devices/cpu/conv_dnnl.h"

#include "devices/cpu/cpu.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef EMBER_HAVE_DNNL
#include <dnnl.h>
#include <dnnl_debug.h>
#include <pthread.h>

extern void omp_set_num_threads(int); /* libgomp, under libdnnl */
#endif

static atomic_int g_forced = -1; /* em__cpu_conv_set_path */
static atomic_int g_env_path = -2; /* -2: not read yet */

void em__cpu_conv_set_path(int path) { atomic_store(&g_forced, path); }

int em__cpu_conv_path(void)
{
#ifdef EMBER_HAVE_DNNL
    const int f = atomic_load(&g_forced);
    if (f == EM_CPU_CONV_IM2COL || f == EM_CPU_CONV_ONEDNN) return f;
    int p = atomic_load(&g_env_path);
    if (p == -2) {
        const char *e = getenv("EMBER_CPU_CONV");
        p = EM_CPU_CONV_ONEDNN;
        if (e && !strcasecmp(e, "im2col")) p = EM_CPU_CONV_IM2COL;
        atomic_store(&g_env_path, p);
    }
    return p;
#else
    return EM_CPU_CONV_IM2COL;
#endif
}

#ifndef EMBER_HAVE_DNNL

int em__cpu_conv_dnnl(const em_kargs *k, void **bufs)
{
    (void)k, (void)bufs;
    return 0;
}

#else

enum { FMT_AUTO = 0, FMT_ANY = 1, FMT_PLAIN = 2 };
enum { CACHE_MAX = 64, ALIGN = 64 };

static int format_mode(void)
{
    static atomic_int mode = -1;
    int m = atomic_load(&mode);
    if (m < 0) {
        const char *e = getenv("EMBER_DNNL_FORMAT");
        m = !e ? FMT_AUTO : !strcasecmp(e, "plain") ? FMT_PLAIN : !strcasecmp(e, "any") ? FMT_ANY : FMT_AUTO;
        atomic_store(&mode, m);
    }
    return m;
}

typedef struct conv_key {
    int64_t kind, fmt, N, C, H, W, O, KH, KW, OH, OW, G, sh, sw, ph, pw, dh, dw;
} conv_key;

/* Operand roles: 0 = in[0], 1 = in[1] (read), 2 = out[0] (written). */
typedef struct conv_entry {
    conv_key key;
    uint64_t used;          /* LRU tick */
    int ok;                 /* 0: no primitive for this shape (im2col) */
    dnnl_primitive_t prim;
    int arg[3];             /* DNNL_ARG_* of each role */
    dnnl_memory_t user[3];  /* plain layout, the StarPU buffer */
    dnnl_memory_t inner[3]; /* the primitive's layout in the pool, or NULL */
    dnnl_primitive_t reorder[3];
    size_t inner_off[3];
    dnnl_memory_t scratch; /* NULL without scratchpad */
    size_t scratch_off, pool_bytes;
} conv_entry;

typedef struct tstate {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    conv_entry ent[CACHE_MAX];
    int n;
    uint64_t tick;
    void *pool;
    size_t cap;
} tstate;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
static _Thread_local tstate *tl;

static void entry_free(conv_entry *e)
{
    if (e->prim) dnnl_primitive_destroy(e->prim);
    for (int r = 0; r < 3; r++) {
        if (e->user[r]) dnnl_memory_destroy(e->user[r]);
        if (e->inner[r]) dnnl_memory_destroy(e->inner[r]);
        if (e->reorder[r]) dnnl_primitive_destroy(e->reorder[r]);
    }
    if (e->scratch) dnnl_memory_destroy(e->scratch);
    memset(e, 0, sizeof *e);
}

static void tstate_free(void *p)
{
    tstate *t = (tstate *)p;
    if (!t) return;
    for (int i = 0; i < t->n; i++) entry_free(&t->ent[i]);
    if (t->strm) dnnl_stream_destroy(t->strm);
    if (t->eng) dnnl_engine_destroy(t->eng);
    free(t->pool);
    free(t);
    if (tl == t) tl = NULL;
}

static void key_once(void) { g_key_ok = pthread_key_create(&g_key, tstate_free) == 0; }

static tstate *thread_state(const em_kargs *k)
{
    if (tl) return tl;
    pthread_once(&g_key_once, key_once);
    omp_set_num_threads(1); /* before this thread's first oneDNN call */
    tstate *t = (tstate *)calloc(1, sizeof *t);
    if (!t) {
        em__kernel_error(k, EM_ERR_NOMEM, "oneDNN: out of memory for the worker's primitive cache");
        return NULL;
    }
    dnnl_status_t st = dnnl_engine_create(&t->eng, dnnl_cpu, 0);
    if (st == dnnl_success) st = dnnl_stream_create(&t->strm, t->eng, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        em__kernel_error(k, EM_ERR_RUNTIME, "oneDNN engine/stream creation: status %s", dnnl_status2str(st));
        tstate_free(t);
        return NULL;
    }
    if (g_key_ok) pthread_setspecific(g_key, t);
    tl = t;
    return t;
}

static void make_key(const em_kargs *k, conv_key *key)
{
    const em_tdesc *x, *w, *y;
    if (k->kind == EM_OP_CONV2D)
        x = &k->in[0], w = &k->in[1], y = &k->out[0];
    else if (k->kind == EM_OP_CONV2D_BWD_DATA)
        x = &k->out[0], w = &k->in[1], y = &k->in[0];
    else
        x = &k->in[0], w = &k->out[0], y = &k->in[1];
    memset(key, 0, sizeof *key);
    key->kind = k->kind, key->fmt = format_mode();
    key->N = x->shape[0], key->C = x->shape[1], key->H = x->shape[2], key->W = x->shape[3];
    key->O = w->shape[0], key->KH = w->shape[2], key->KW = w->shape[3];
    key->OH = y->shape[2], key->OW = y->shape[3];
    key->G = k->p.conv.groups;
    key->sh = k->p.conv.stride[0], key->sw = k->p.conv.stride[1];
    key->ph = k->p.conv.pad[0], key->pw = k->p.conv.pad[1];
    key->dh = k->p.conv.dilation[0], key->dw = k->p.conv.dilation[1];
}

/* A oneDNN call that failed: a kernel error (the caller returns -1). */
static int fail(const em_kargs *k, const char *what, dnnl_status_t st)
{
    em__kernel_error(k, st == dnnl_out_of_memory ? EM_ERR_NOMEM : EM_ERR_RUNTIME, "oneDNN %s: status %s", what,
                     dnnl_status2str(st));
    return -1;
}

#define TRY(call, what)                                           \
    do {                                                          \
        dnnl_status_t st_ = (call);                               \
        if (st_ != dnnl_success) return fail(k, what, st_);       \
    } while (0)

static size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The primitive descriptor of @p q with memory descriptors x, w, y (plain
 * or any). 1 (ok, *pd set), 0 (no primitive for this shape and formats) or
 * -1 (a kernel error was reported). */
static int create_pd(const em_kargs *k, tstate *t, const conv_key *q, const dnnl_memory_desc_t *px,
                     const dnnl_memory_desc_t *pw, const dnnl_memory_desc_t *py, dnnl_primitive_desc_t *pd)
{
    const dnnl_dims_t strides = {q->sh, q->sw}, dil = {q->dh - 1, q->dw - 1}, pad_l = {q->ph, q->pw},
                      pad_r = {(q->OH - 1) * q->sh + (q->KH - 1) * q->dh + 1 - q->H - q->ph,
                               (q->OW - 1) * q->sw + (q->KW - 1) * q->dw + 1 - q->W - q->pw};
    *pd = NULL;
    dnnl_convolution_desc_t fwd_d, bwd_d;
    dnnl_status_t st = dnnl_dilated_convolution_forward_desc_init(&fwd_d, dnnl_forward_training, dnnl_convolution_direct, px,
                                                                  pw, NULL, py, strides, dil, pad_l, pad_r);
    if (st == dnnl_invalid_arguments || st == dnnl_unimplemented) return 0;
    if (st != dnnl_success) return fail(k, "convolution descriptor", st);
    dnnl_primitive_attr_t attr = NULL;
    TRY(dnnl_primitive_attr_create(&attr), "primitive attributes");
    st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (st != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return fail(k, "scratchpad mode", st);
    }
    dnnl_primitive_desc_t fwd_pd = NULL;
    st = dnnl_primitive_desc_create(&fwd_pd, &fwd_d, attr, t->eng, NULL);
    if (st == dnnl_success && q->kind != EM_OP_CONV2D) {
        /* backward: the forward one is the hint */
        if (q->kind == EM_OP_CONV2D_BWD_DATA)
            st = dnnl_dilated_convolution_backward_data_desc_init(&bwd_d, dnnl_convolution_direct, px, pw, py, strides, dil,
                                                                  pad_l, pad_r);
        else
            st = dnnl_dilated_convolution_backward_weights_desc_init(&bwd_d, dnnl_convolution_direct, px, pw, NULL, py,
                                                                     strides, dil, pad_l, pad_r);
        if (st == dnnl_success) st = dnnl_primitive_desc_create(pd, &bwd_d, attr, t->eng, fwd_pd);
        dnnl_primitive_desc_destroy(fwd_pd);
    } else {
        *pd = fwd_pd;
    }
    dnnl_primitive_attr_destroy(attr);
    if (st == dnnl_success) return 1;
    if (*pd) dnnl_primitive_desc_destroy(*pd);
    *pd = NULL;
    if (st == dnnl_invalid_arguments || st == dnnl_unimplemented) return 0;
    return fail(k, "convolution primitive descriptor", st);
}

/* Whether @p pd's layout of an activation operand (src / dst and their
 * diffs) pads its channels to twice their number or more (a blocked format
 * on 1 to 8 channels: conv1's 1 -> 16). */
static bool pads_activations(const_dnnl_primitive_desc_t pd)
{
    static const int args[] = {DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_DIFF_SRC, DNNL_ARG_DIFF_DST};
    for (int i = 0; i < 4; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i]);
        if (md && md->ndims == 4 && md->padded_dims[1] >= 2 * md->dims[1]) return true;
    }
    return false;
}

/* Builds the primitive of @p e->key on @p t. Returns 1 (ok), 0 (no primitive
 * for the shape: e->ok stays 0) or -1 (a kernel error was reported).
 * Formats (EMBER_DNNL_FORMAT): any, plain, or auto: plain for 1x1 kernels
 * (oneDNN's plain 1x1 is a GEMM on the operands themselves: no reorders) and
 * where the blocked pick pads an activation (pads_activations), any else;
 * auto tries the other when its pick has no primitive. */
static int entry_build(const em_kargs *k, tstate *t, conv_entry *e)
{
    const conv_key *q = &e->key;
    const int64_t Cg = q->C / q->G, Og = q->O / q->G;
    dnnl_memory_desc_t md_x, md_w, md_y, any_x, any_w, any_y;
    const dnnl_dims_t dx = {q->N, q->C, q->H, q->W}, dy = {q->N, q->O, q->OH, q->OW};
    const dnnl_dims_t dw4 = {q->O, Cg, q->KH, q->KW}, dw5 = {q->G, Og, Cg, q->KH, q->KW};
    const int wnd = q->G > 1 ? 5 : 4;
    TRY(dnnl_memory_desc_init_by_tag(&md_x, 4, dx, dnnl_f32, dnnl_nchw), "memory descriptor");
    TRY(dnnl_memory_desc_init_by_tag(&md_y, 4, dy, dnnl_f32, dnnl_nchw), "memory descriptor");
    TRY(dnnl_memory_desc_init_by_tag(&md_w, wnd, wnd == 5 ? dw5 : dw4, dnnl_f32, wnd == 5 ? dnnl_goihw : dnnl_oihw),
        "memory descriptor");
    TRY(dnnl_memory_desc_init_by_tag(&any_x, 4, dx, dnnl_f32, dnnl_format_tag_any), "memory descriptor");
    TRY(dnnl_memory_desc_init_by_tag(&any_y, 4, dy, dnnl_f32, dnnl_format_tag_any), "memory descriptor");
    TRY(dnnl_memory_desc_init_by_tag(&any_w, wnd, wnd == 5 ? dw5 : dw4, dnnl_f32, dnnl_format_tag_any),
        "memory descriptor");
    dnnl_primitive_desc_t pd = NULL;
    int r;
    if (q->fmt == FMT_ANY) {
        r = create_pd(k, t, q, &any_x, &any_w, &any_y, &pd);
    } else if (q->fmt == FMT_PLAIN) {
        r = create_pd(k, t, q, &md_x, &md_w, &md_y, &pd);
    } else {
        const bool plain1x1 = q->KH == 1 && q->KW == 1;
        r = plain1x1 ? create_pd(k, t, q, &md_x, &md_w, &md_y, &pd) : create_pd(k, t, q, &any_x, &any_w, &any_y, &pd);
        if (r == 1 && !plain1x1 && pads_activations(pd)) {
            dnnl_primitive_desc_t pp = NULL;
            const int rp = create_pd(k, t, q, &md_x, &md_w, &md_y, &pp);
            if (rp < 0) {
                dnnl_primitive_desc_destroy(pd);
                return -1;
            }
            if (rp == 1) {
                dnnl_primitive_desc_destroy(pd);
                pd = pp;
            }
        } else if (r == 0) {
            r = plain1x1 ? create_pd(k, t, q, &any_x, &any_w, &any_y, &pd) : create_pd(k, t, q, &md_x, &md_w, &md_y, &pd);
        }
    }
    if (r <= 0) return r;
    dnnl_status_t st;

    /* roles: in[0], in[1], out[0] */
    const dnnl_memory_desc_t *plain[3];
    if (q->kind == EM_OP_CONV2D) {
        e->arg[0] = DNNL_ARG_SRC, e->arg[1] = DNNL_ARG_WEIGHTS, e->arg[2] = DNNL_ARG_DST;
        plain[0] = &md_x, plain[1] = &md_w, plain[2] = &md_y;
    } else if (q->kind == EM_OP_CONV2D_BWD_DATA) {
        e->arg[0] = DNNL_ARG_DIFF_DST, e->arg[1] = DNNL_ARG_WEIGHTS, e->arg[2] = DNNL_ARG_DIFF_SRC;
        plain[0] = &md_y, plain[1] = &md_w, plain[2] = &md_x;
    } else {
        e->arg[0] = DNNL_ARG_SRC, e->arg[1] = DNNL_ARG_DIFF_DST, e->arg[2] = DNNL_ARG_DIFF_WEIGHTS;
        plain[0] = &md_x, plain[1] = &md_y, plain[2] = &md_w;
    }
    int ret = 1;
    size_t off = 0;
#define TRYB(call, what)                      \
    do {                                      \
        dnnl_status_t st_ = (call);           \
        if (st_ != dnnl_success) {            \
            ret = fail(k, what, st_);         \
            goto out;                         \
        }                                     \
    } while (0)
    for (int r = 0; r < 3; r++) {
        TRYB(dnnl_memory_create(&e->user[r], plain[r], t->eng, DNNL_MEMORY_NONE), "memory creation");
        const dnnl_memory_desc_t *chosen = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, e->arg[r]);
        if (!chosen) TRYB(dnnl_runtime_error, "memory descriptor query");
        if (dnnl_memory_desc_equal(chosen, plain[r])) continue;
        TRYB(dnnl_memory_create(&e->inner[r], chosen, t->eng, DNNL_MEMORY_NONE), "memory creation");
        e->inner_off[r] = off;
        off += align_up(dnnl_memory_desc_get_size(chosen));
        dnnl_primitive_desc_t rpd = NULL;
        if (r < 2)
            TRYB(dnnl_reorder_primitive_desc_create(&rpd, plain[r], t->eng, chosen, t->eng, NULL), "reorder descriptor");
        else
            TRYB(dnnl_reorder_primitive_desc_create(&rpd, chosen, t->eng, plain[r], t->eng, NULL), "reorder descriptor");
        st = dnnl_primitive_create(&e->reorder[r], rpd);
        dnnl_primitive_desc_destroy(rpd);
        TRYB(st, "reorder creation");
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd && dnnl_memory_desc_get_size(smd) > 0) {
        TRYB(dnnl_memory_create(&e->scratch, smd, t->eng, DNNL_MEMORY_NONE), "memory creation");
        e->scratch_off = off;
        off += align_up(dnnl_memory_desc_get_size(smd));
    }
    e->pool_bytes = off;
    TRYB(dnnl_primitive_create(&e->prim, pd), "convolution primitive creation");
    e->ok = 1;
out:
#undef TRYB
    dnnl_primitive_desc_destroy(pd);
    return ret;
}

/* The cache entry of @p key on @p t (built on a miss; the least recently used
 * goes when full). NULL after a reported error. */
static conv_entry *lookup(const em_kargs *k, tstate *t, const conv_key *key)
{
    for (int i = 0; i < t->n; i++)
        if (!memcmp(&t->ent[i].key, key, sizeof *key)) {
            t->ent[i].used = ++t->tick;
            return &t->ent[i];
        }
    int slot = t->n;
    if (t->n == CACHE_MAX) {
        slot = 0;
        for (int i = 1; i < t->n; i++)
            if (t->ent[i].used < t->ent[slot].used) slot = i;
        entry_free(&t->ent[slot]);
    } else {
        t->n++;
    }
    conv_entry *e = &t->ent[slot];
    memset(e, 0, sizeof *e);
    e->key = *key;
    e->used = ++t->tick;
    if (entry_build(k, t, e) < 0) {
        entry_free(e);      /* leaves a zeroed slot: key 0 never matches a conv */
        return NULL;
    }
    return e;
}

/* Runs @p e's reorders and primitive on the operands of @p k. 0 or -1 (a
 * kernel error was reported). */
static int execute(const em_kargs *k, tstate *t, conv_entry *e, void **bufs)
{
    char *pool = (char *)t->pool;
    void *ptr[3] = {(float *)bufs[0] + k->in[0].offset, (float *)bufs[1] + k->in[1].offset,
                    (float *)bufs[2] + k->out[0].offset};
    dnnl_exec_arg_t args[4];
    int nargs = 0;
    for (int r = 0; r < 3; r++) {
        TRY(dnnl_memory_set_data_handle(e->user[r], ptr[r]), "set data handle");
        dnnl_memory_t m = e->user[r];
        if (e->inner[r]) {
            m = e->inner[r];
            TRY(dnnl_memory_set_data_handle(m, pool + e->inner_off[r]), "set data handle");
        }
        args[nargs++] = (dnnl_exec_arg_t){e->arg[r], m};
    }
    if (e->scratch) {
        TRY(dnnl_memory_set_data_handle(e->scratch, pool + e->scratch_off), "set data handle");
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch};
    }
    for (int r = 0; r < 2; r++)
        if (e->reorder[r]) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, e->user[r]}, {DNNL_ARG_TO, e->inner[r]}};
            TRY(dnnl_primitive_execute(e->reorder[r], t->strm, 2, ra), "reorder execution");
        }
    TRY(dnnl_primitive_execute(e->prim, t->strm, nargs, args), "convolution execution");
    if (e->reorder[2]) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, e->inner[2]}, {DNNL_ARG_TO, e->user[2]}};
        TRY(dnnl_primitive_execute(e->reorder[2], t->strm, 2, ra), "reorder execution");
    }
    TRY(dnnl_stream_wait(t->strm), "stream wait");
    return 0;
}

int em__cpu_conv_dnnl(const em_kargs *k, void **bufs)
{
    for (int i = 0; i < 3; i++) {
        const em_tdesc *d = i < 2 ? &k->in[i] : &k->out[0];
        for (int j = 0; j < d->ndim; j++)
            if (d->shape[j] <= 0) return 0; /* empty operands: im2col's loops */
    }
    tstate *t = thread_state(k);
    if (!t) return 1;
    conv_key key;
    make_key(k, &key);
    conv_entry *e = lookup(k, t, &key);
    if (!e) return 1;
    if (!e->ok) return 0;
    if (e->pool_bytes > t->cap) {
        size_t cap = e->pool_bytes > 2 * t->cap ? e->pool_bytes : 2 * t->cap;
        void *p = aligned_alloc(ALIGN, align_up(cap));
        if (!p) {
            em__kernel_error(k, EM_ERR_NOMEM, "oneDNN: out of memory for the reorder/scratchpad pool (%zu bytes)", cap);
            return 1;
        }
        free(t->pool);
        t->pool = p, t->cap = cap;
    }
    execute(k, t, e, bufs);
    return 1;
}

#endif /* EMBER_HAVE_DNNL */
