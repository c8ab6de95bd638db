/* The tensor object: header (dtype, shape, strides, offset) over a shared
 * storage, reference counting, scopes, host I/O and printing. */
#include "runtime/runtime_internal.h"


#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* f16 / bf16 bits <-> float: the converters every backend uses (devices/half.h). */
#include "devices/half_host.h"

/* ---- scopes --------------------------------------------------------------- */

typedef struct scope {
    em_tensor **items;
    int n, cap;
} scope;

static _Thread_local scope *tl_scopes;
static _Thread_local int tl_depth, tl_cap;
/* Scopes opened while there was no memory for them: they own nothing (what
 * they would have owned goes to the enclosing scope) and only keep
 * em_scope_end calls paired. Always the innermost ones. */
static _Thread_local int tl_phantoms;

void em__thread_exit(void)
{
    for (int i = 0; i < tl_cap; i++) free(tl_scopes[i].items);
    free(tl_scopes);
    tl_scopes = NULL;
    tl_depth = tl_cap = 0;
}

void em_thread_exit(void)
{
    while (tl_depth > 0 || tl_phantoms > 0) em_scope_end();
    em__thread_exit();
}

void em_scope_begin(void)
{
    if (tl_phantoms > 0) {
        tl_phantoms++;
        return;
    }
    if (tl_depth == tl_cap) {
        int cap = tl_cap ? tl_cap * 2 : 8;
        scope *s = realloc(tl_scopes, sizeof *s * (size_t)cap);
        if (!s) {
            em__set_error(EM_ERR_NOMEM, "em_scope_begin: out of memory for scope %d: its tensors go to the enclosing scope",
                          tl_depth + 1);
            em_log_msg(EM_LOG_WARN, "%s", em_last_error());
            tl_phantoms = 1;
            return;
        }
        memset(s + tl_cap, 0, sizeof *s * (size_t)(cap - tl_cap));
        tl_scopes = s;
        tl_cap = cap;
    }
    tl_scopes[tl_depth].n = 0;
    tl_depth++;
}

/* false (t left caller-owned, error set) when the scope cannot grow. */
static bool scope_push(int level, em_tensor *t)
{
    scope *s = &tl_scopes[level - 1];
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        em_tensor **it = realloc(s->items, sizeof *it * (size_t)cap);
        if (!it) {
            t->scope_level = 0;
            em__set_error(EM_ERR_NOMEM, "out of memory adding a tensor to scope %d", level);
            return false;
        }
        s->items = it;
        s->cap = cap;
    }
    s->items[s->n++] = t;
    t->scope_level = level;
    return true;
}

void em__scope_add(em_tensor *t)
{
    if (t && tl_depth > 0 && !scope_push(tl_depth, t)) /* the tensor stays the caller's: a leak, not a crash */
        em_log_msg(EM_LOG_WARN, "%s", em_last_error());
}

void em__scope_remove(em_tensor *t)
{
    if (!t || t->scope_level <= 0 || t->scope_level > tl_depth) return;
    scope *s = &tl_scopes[t->scope_level - 1];
    for (int i = s->n - 1; i >= 0; i--)
        if (s->items[i] == t) {
            s->items[i] = s->items[--s->n];
            break;
        }
    t->scope_level = 0;
}

void em_scope_end(void)
{
    if (tl_phantoms > 0) {
        tl_phantoms--;
        return;
    }
    if (tl_depth == 0) {
        em_log_msg(EM_LOG_WARN, "em_scope_end without em_scope_begin");
        return;
    }
    scope *s = &tl_scopes[tl_depth - 1];
    /* release in reverse creation order; items may be removed while we go */
    while (s->n > 0) {
        em_tensor *t = s->items[--s->n];
        t->scope_level = 0;
        em_tensor_release(t);
    }
    tl_depth--;
}

em_tensor *em_keep(em_tensor *t)
{
    if (!t) return NULL;
    if (t->scope_level > 0 && t->scope_level <= tl_depth) {
        int level = t->scope_level;
        em__scope_remove(t);
        if (level > 1 && !scope_push(level - 1, t)) em_log_msg(EM_LOG_WARN, "em_keep: %s", em_last_error());
    }
    return t;
}

em_tensor *em__publish(em_tensor *t)
{
    if (t && tl_depth > 0 && !scope_push(tl_depth, t)) { /* the op fails rather than leak its result */
        em_tensor_release(t);
        return NULL;
    }
    return t;
}

/* ---- object ---------------------------------------------------------------- */

int64_t em__numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void em__contiguous_strides(const int64_t *shape, int ndim, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

const char *em_shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "[");
    for (int i = 0; i < ndim; i++)
        k += (size_t)snprintf(buf + k, k < n ? n - k : 0, i ? ", %lld" : "%lld", (long long)shape[i]);
    snprintf(buf + k, k < n ? n - k : 0, "]");
    return buf;
}

#define EM_MAX_NUMEL ((int64_t)1 << 48) /* elements of any tensor or view */

static em_status check_shape(const int64_t *shape, int ndim, const char *what)
{
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em__set_error(EM_ERR_SHAPE, "%s: rank %d is out of range (0..%d)", what, ndim, EM_MAX_DIMS);
    if (ndim > 0 && !shape) return em__set_error(EM_ERR_INVALID, "%s: shape is NULL", what);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            char b[160];
            return em__set_error(EM_ERR_SHAPE, "%s: negative size in shape %s", what, em_shape_str(shape, ndim, b, sizeof b));
        }
    /* the element count must not overflow (views included: an expanded view
     * of 2^64 elements would wrap numel and every size computed from it) */
    int64_t n = 1;
    bool zero = false;
    for (int i = 0; i < ndim; i++) zero = zero || shape[i] == 0;
    for (int i = 0; i < ndim && !zero; i++) {
        if (n > EM_MAX_NUMEL / shape[i]) {
            char b[160];
            return em__set_error(EM_ERR_SHAPE, "%s: shape %s has more than 2^48 elements", what, em_shape_str(shape, ndim, b, sizeof b));
        }
        n *= shape[i];
    }
    return EM_OK;
}

em_tensor *em__tensor_new(em_dtype dt, const int64_t *shape, int ndim)
{
    if (!em_is_initialized()) return em__fail(EM_ERR_STATE, "tensor creation before em_init");
    if (check_shape(shape, ndim, "tensor") != EM_OK) return NULL;
    if (dt < 0 || dt >= EM_DTYPE_COUNT) return em__fail(EM_ERR_DTYPE, "invalid dtype %d", (int)dt);
    int64_t n = em__numel(shape, ndim);
    size_t nbytes = (size_t)n * em_dtype_size(dt);
    if (nbytes >= ((size_t)1 << 32)) {
        char b[160];
        return em__fail(EM_ERR_NOMEM, "tensor of shape %s (%zu bytes) exceeds the 4 GiB per-tensor limit",
                        em_shape_str(shape, ndim, b, sizeof b), nbytes);
    }
    em_tensor *t = EM_FAULT(EM_FAULT_ALLOC) ? NULL : calloc(1, sizeof *t);
    if (!t) return em__fail(EM_ERR_NOMEM, "out of memory for a tensor header");
    t->storage = em__storage_acquire(nbytes);
    if (!t->storage) {
        free(t);
        char b[160];
        return em__fail(EM_ERR_NOMEM, "out of memory for the storage of a tensor of shape %s (%zu bytes)",
                        em_shape_str(shape, ndim, b, sizeof b), nbytes);
    }
    t->refcount = 1;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    em__contiguous_strides(shape, ndim, t->strides);
    __atomic_add_fetch(&em__live_tensors, 1, __ATOMIC_RELAXED);
    return t;
}

em_tensor *em__tensor_view(const em_tensor *base, const int64_t *shape, const int64_t *strides, int ndim, int64_t offset)
{
    if (check_shape(shape, ndim, "view") != EM_OK) return NULL;
    em_tensor *t = EM_FAULT(EM_FAULT_ALLOC) ? NULL : calloc(1, sizeof *t);
    if (!t) return em__fail(EM_ERR_NOMEM, "out of memory for a view header");
    t->refcount = 1;
    t->dtype = base->dtype;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    t->offset = offset;
    t->storage = base->storage;
    __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&em__live_tensors, 1, __ATOMIC_RELAXED);
    return t;
}

/* Set by autodiff at load time (em__runtime_set_node_release): frees a
 * tensor's producer node. The runtime calls nothing above it. */
static void (*g_node_release)(struct em_node *n);

void em__runtime_set_node_release(void (*fn)(struct em_node *n)) { g_node_release = fn; }

em_tensor *em_tensor_retain(em_tensor *t)
{
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

_Thread_local int64_t em__host_reads;

em_tensor *em__tensor_hold(em_tensor *t)
{
    __atomic_add_fetch(&t->held, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void em__tensor_unhold(em_tensor *t)
{
    __atomic_sub_fetch(&t->held, 1, __ATOMIC_RELAXED);
    em_tensor_release(t);
}

void em_tensor_release(em_tensor *t)
{
    if (!t) return;
    /* the caller's last reference (holders' aside) of a scoped tensor: out of its scope */
    if (t->refcount - __atomic_load_n(&t->held, __ATOMIC_RELAXED) == 1 && t->scope_level > 0) em__scope_remove(t);
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (t->node && g_node_release) g_node_release(t->node);
    em__storage_release(t->storage);
    __atomic_sub_fetch(&em__live_tensors, 1, __ATOMIC_RELAXED);
    free(t);
}

em_dtype em_tensor_dtype(const em_tensor *t) { return t ? t->dtype : EM_DTYPE_COUNT; }
int em_tensor_ndim(const em_tensor *t) { return t ? t->ndim : -1; }
const int64_t *em_tensor_shape(const em_tensor *t) { return t ? t->shape : NULL; }
const int64_t *em_tensor_strides(const em_tensor *t) { return t ? t->strides : NULL; }
int64_t em_tensor_offset(const em_tensor *t) { return t ? t->offset : -1; }
int64_t em_tensor_numel(const em_tensor *t) { return t ? em__numel(t->shape, t->ndim) : -1; }

int64_t em_tensor_dim(const em_tensor *t, int d)
{
    if (!t) return -1;
    if (d < 0) d += t->ndim;
    return d >= 0 && d < t->ndim ? t->shape[d] : -1;
}

bool em_tensor_is_contiguous(const em_tensor *t)
{
    if (!t) return false;
    if (em_tensor_numel(t) == 0) return true; /* as PyTorch: empty tensors are contiguous */
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool em_tensor_shares_storage(const em_tensor *a, const em_tensor *b)
{
    return a && b && a->storage == b->storage;
}

bool em__covers_storage(const em_tensor *t)
{
    return t->offset == 0 && em_tensor_is_contiguous(t) &&
           (size_t)em_tensor_numel(t) * em_dtype_size(t->dtype) == t->storage->nbytes;
}

int em__norm_dim(const em_tensor *t, int dim, int ndim_extra, const char *op)
{
    int nd = t->ndim + ndim_extra;
    int d = dim < 0 ? dim + nd : dim;
    if (d < 0 || d >= nd || (nd == 0 && d != 0)) {
        char b[160];
        em__set_error(EM_ERR_INVALID, "%s: dim %d is out of range for a tensor of shape %s (valid: %d..%d)", op, dim,
                      em_shape_str(t->shape, t->ndim, b, sizeof b), -nd, nd - 1);
        return -1;
    }
    return d;
}

void em__tdesc(const em_tensor *t, em_tdesc *d)
{
    memset(d, 0, sizeof *d);
    d->dtype = t->dtype;
    d->ndim = t->ndim;
    d->offset = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        d->shape[i] = t->shape[i];
        d->strides[i] = t->strides[i];
    }
}

/* ---- host I/O ------------------------------------------------------------- */

em_tensor *em_from_host(const void *data, const int64_t *shape, int ndim, em_dtype dt)
{
    if (ndim > 0 && !shape) return em__fail(EM_ERR_INVALID, "em_from_host: shape is NULL");
    if (!data && em__numel(shape, ndim) > 0) return em__fail(EM_ERR_INVALID, "em_from_host: data is NULL");
    em_tensor *t = em__tensor_new(dt, shape, ndim);
    if (!t) return NULL;
    starpu_data_handle_t h = t->storage->handle;
    if (starpu_data_acquire(h, STARPU_W) != 0) {
        em_tensor_release(t);
        return em__fail(EM_ERR_RUNTIME, "em_from_host: could not acquire the data handle");
    }
    if (t->storage->nbytes) memcpy((void *)starpu_vector_get_local_ptr(h), data, t->storage->nbytes);
    starpu_data_release(h);
    return em__publish(t);
}

/* Copies t's elements in C order into dst (nbytes checked by callers). */
static void gather_host(const em_tensor *t, const char *base, char *dst)
{
    size_t es = em_dtype_size(t->dtype);
    int64_t n = em_tensor_numel(t);
    if (em_tensor_is_contiguous(t)) {
        memcpy(dst, base + t->offset * (int64_t)es, (size_t)n * es);
        return;
    }
    int64_t idx[EM_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        memcpy(dst + i * (int64_t)es, base + off * (int64_t)es, es);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

/* em_to_host under the caller's name. A kernel failure recorded by then (the
 * sticky error, DESIGN.md §10) is returned instead of the values: the
 * tensor's producer may be the op that failed. */
static em_status to_host(const em_tensor *t, void *dst, size_t nbytes, const char *fn)
{
    if (!t || !dst) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, t ? "dst" : "tensor");
    size_t need = (size_t)em_tensor_numel(t) * em_dtype_size(t->dtype);
    if (nbytes < need)
        return em__set_error(EM_ERR_INVALID, "%s: buffer of %zu bytes is too small for %zu bytes", fn, nbytes, need);
    em__host_reads++;
    if (need == 0) return em__sticky_take(fn);
    if (em__fusion_flush) { /* the producer may still be held in the fusion stream */
        em_status st = em__fusion_flush();
        if (st != EM_OK) return st;
    }
    starpu_data_handle_t h = t->storage->handle;
    if (starpu_data_acquire(h, STARPU_R) != 0)
        return em__set_error(EM_ERR_RUNTIME, "%s: could not acquire the data handle", fn);
    gather_host(t, (const char *)starpu_vector_get_local_ptr(h), dst);
    starpu_data_release(h);
    return em__sticky_take(fn);
}

em_status em_to_host(const em_tensor *t, void *dst, size_t nbytes) { return to_host(t, dst, nbytes, "em_to_host"); }

static double elem_to_double(em_dtype dt, const void *p)
{
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_I32: return *(const int32_t *)p;
    case EM_I64: return (double)*(const int64_t *)p;
    case EM_U8: return *(const uint8_t *)p;
    case EM_BOOL: return *(const uint8_t *)p != 0;
    case EM_F16: return em_f16_bits_to_f32(*(const uint16_t *)p);
    case EM_BF16: return em_bf16_bits_to_f32(*(const uint16_t *)p);
    default: return NAN; /* not reached: every dtype is listed */
    }
}

em_status em_item(const em_tensor *t, double *out)
{
    if (!t || !out) return em__set_error(EM_ERR_INVALID, "em_item: NULL argument");
    if (em_tensor_numel(t) != 1) {
        char b[160];
        return em__set_error(EM_ERR_SHAPE, "em_item: tensor of shape %s has %lld elements, expected 1",
                             em_shape_str(t->shape, t->ndim, b, sizeof b), (long long)em_tensor_numel(t));
    }
    char buf[8];
    em_status st = to_host(t, buf, sizeof buf, "em_item");
    if (st == EM_OK) *out = elem_to_double(t->dtype, buf);
    return st;
}

/* ---- printing (PyTorch style) --------------------------------------------- */

/* Mirrors torch/_tensor_str.py with the default print options (precision 4,
 * threshold 1000, edgeitems 3, linewidth 80, sci_mode None). */

#define PR_PRECISION 4
#define PR_THRESHOLD 1000
#define PR_EDGEITEMS 3
#define PR_LINEWIDTH 80

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    if (b->oom) return;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static void sb_spaces(sbuf *b, int n)
{
    if (n > 0) sb_put(b, "%*s", n, "");
}

/* Host copy of the tensor's elements (logical order) plus the _Formatter state. */
typedef struct pctx {
    em_dtype dt;
    const unsigned char *raw;
    size_t es;
    int ndim;
    const int64_t *shape;
    int64_t stride[EM_MAX_DIMS]; /* contiguous strides of the host copy */
    bool summarize;
    bool floating, int_mode, sci;
    int width;
    /* formatter scan state */
    bool any;
    double fmin, fmax;
} pctx;

static double pr_get_f(const pctx *c, int64_t i)
{
    const void *p = c->raw + (size_t)i * c->es;
    switch (c->dt) {
    case EM_F32: {
        float v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case EM_F64: {
        double v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case EM_F16: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return em_f16_bits_to_f32(v);
    }
    case EM_BF16: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return em_bf16_bits_to_f32(v);
    }
    default: return NAN;
    }
}

static int64_t pr_get_i(const pctx *c, int64_t i)
{
    const void *p = c->raw + (size_t)i * c->es;
    switch (c->dt) {
    case EM_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case EM_I64: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case EM_U8:
    case EM_BOOL: return *(const uint8_t *)p;
    default: return 0;
    }
}

/* The element's text without padding (Formatter.format before the pad). */
static int fmt_value(char *out, size_t cap, const pctx *c, int64_t i)
{
    if (c->dt == EM_BOOL) return snprintf(out, cap, "%s", pr_get_i(c, i) ? "True" : "False");
    if (!c->floating) return snprintf(out, cap, "%lld", (long long)pr_get_i(c, i));
    double v = pr_get_f(c, i);
    if (isnan(v)) return snprintf(out, cap, "nan"); /* Python never signs nan */
    if (isinf(v)) return snprintf(out, cap, "%s", v > 0 ? "inf" : "-inf");
    if (c->sci) return snprintf(out, cap, "%.*e", PR_PRECISION, v);
    if (c->int_mode) return snprintf(out, cap, "%.0f.", v);
    return snprintf(out, cap, "%.*f", PR_PRECISION, v);
}

static void put_value(sbuf *b, const pctx *c, int64_t i)
{
    char tmp[64];
    fmt_value(tmp, sizeof tmp, c, i);
    sb_put(b, "%*s", c->width, tmp);
}

/* Number of entries of dim d shown, and the index of the k-th one. */
static bool pr_summarized_dim(const pctx *c, int d) { return c->summarize && c->shape[d] > 2 * PR_EDGEITEMS; }

static int64_t pr_shown_count(const pctx *c, int d) { return pr_summarized_dim(c, d) ? 2 * PR_EDGEITEMS : c->shape[d]; }

static int64_t pr_shown_index(const pctx *c, int d, int64_t k)
{
    return (pr_summarized_dim(c, d) && k >= PR_EDGEITEMS) ? c->shape[d] - 2 * PR_EDGEITEMS + k : k;
}

/* Pass 1 (floats): min/max of |x| over the shown non-zero finite values and
 * whether they are all integral; pass 2: the width.  Integers: the width. */
static void pr_scan(pctx *c, int d, int64_t base, int pass)
{
    if (d == c->ndim) {
        if (!c->floating) {
            char tmp[32];
            int len = fmt_value(tmp, sizeof tmp, c, base);
            if (len > c->width) c->width = len;
            return;
        }
        double v = pr_get_f(c, base);
        if (!isfinite(v) || v == 0) return;
        if (pass == 1) {
            double a = fabs(v);
            if (!c->any || a < c->fmin) c->fmin = a;
            if (!c->any || a > c->fmax) c->fmax = a;
            c->any = true;
            if (v != ceil(v)) c->int_mode = false;
        } else {
            char tmp[64];
            int len = fmt_value(tmp, sizeof tmp, c, base);
            if (len > c->width) c->width = len;
        }
        return;
    }
    int64_t cnt = pr_shown_count(c, d);
    for (int64_t k = 0; k < cnt; k++) pr_scan(c, d + 1, base + pr_shown_index(c, d, k) * c->stride[d], pass);
}

static void pr_formatter(pctx *c)
{
    c->int_mode = true;
    c->sci = false;
    c->width = 1;
    c->any = false;
    if (!c->floating) {
        pr_scan(c, 0, 0, 0);
        return;
    }
    pr_scan(c, 0, 0, 1);
    if (!c->any) return; /* no valid number: int_mode, width 1 */
    double ratio = c->fmax / c->fmin;
    if (c->int_mode)
        c->sci = ratio > 1000.0 || c->fmax > 1.0e8;
    else
        c->sci = ratio > 1000.0 || c->fmax > 1.0e8 || c->fmin < 1.0e-4;
    pr_scan(c, 0, 0, 2);
}

/* before data element k: ", " within a line, ",\n" + indent + 1 between lines */
static void pr_elem_sep(sbuf *b, int64_t k, int per_line, int indent)
{
    if (k == 0) return;
    if (k % per_line == 0) {
        sb_put(b, ",\n");
        sb_spaces(b, indent + 1);
    } else {
        sb_put(b, ", ");
    }
}

/* "," + "\n" * (dim - 1) + " " * (indent + 1) */
static void pr_slice_sep(sbuf *b, int newlines, int indent)
{
    sb_put(b, ",");
    for (int q = 0; q < newlines; q++) sb_put(b, "\n");
    sb_spaces(b, indent + 1);
}

/* _tensor_str_with_formatter / _vector_str */
static void print_rec(sbuf *b, const pctx *c, int d, int64_t base, int indent)
{
    sb_put(b, "[");
    int64_t cnt = pr_shown_count(c, d);
    bool dots = pr_summarized_dim(c, d);
    if (d == c->ndim - 1) {
        int element_length = c->width + 2;
        int per_line = (PR_LINEWIDTH - indent) / element_length; /* floor, >= 1 below */
        if (PR_LINEWIDTH - indent < 0 || per_line < 1) per_line = 1;
        int64_t k = 0; /* position in the data list, the " ..." element included */
        for (int64_t j = 0; j < cnt; j++) {
            if (dots && j == PR_EDGEITEMS) {
                pr_elem_sep(b, k++, per_line, indent);
                sb_put(b, " ...");
            }
            pr_elem_sep(b, k++, per_line, indent);
            put_value(b, c, base + pr_shown_index(c, d, j) * c->stride[d]);
        }
    } else {
        int newlines = c->ndim - d - 1;
        for (int64_t j = 0; j < cnt; j++) {
            if (j > 0) pr_slice_sep(b, newlines, indent);
            if (dots && j == PR_EDGEITEMS) {
                sb_put(b, "...");
                pr_slice_sep(b, newlines, indent);
            }
            print_rec(b, c, d + 1, base + pr_shown_index(c, d, j) * c->stride[d], indent + 1);
        }
    }
    sb_put(b, "]");
}

/* _add_suffixes: ", suffix" or, past the line width, ",\n" + indent + suffix. */
static void pr_suffix(sbuf *b, int indent, const char *suffix, int64_t *last_line_len)
{
    int64_t len = (int64_t)strlen(suffix);
    if (*last_line_len + len + 2 > PR_LINEWIDTH) {
        sb_put(b, ",\n");
        sb_spaces(b, indent);
        sb_put(b, "%s", suffix);
        *last_line_len = indent + len;
    } else {
        sb_put(b, ", %s", suffix);
        *last_line_len += len + 2;
    }
}

char *em_tensor_to_string(const em_tensor *t)
{
    if (!t) return em__fail(EM_ERR_INVALID, "em_tensor_to_string: tensor is NULL");
    int64_t n = em_tensor_numel(t);
    size_t es = em_dtype_size(t->dtype);
    unsigned char *raw = malloc((size_t)(n ? n : 1) * es);
    if (!raw) return em__fail(EM_ERR_NOMEM, "out of memory");
    if (n > 0 && to_host(t, raw, (size_t)n * es, "em_tensor_to_string") != EM_OK) {
        free(raw);
        return NULL;
    }
    pctx c = {.dt = t->dtype, .raw = raw, .es = es, .ndim = t->ndim, .shape = t->shape};
    em__contiguous_strides(t->shape, t->ndim, c.stride);
    c.floating = em_dtype_is_float(t->dtype);
    c.summarize = n > PR_THRESHOLD;

    const int indent = 7; /* strlen("tensor(") */
    sbuf b = {0};
    sb_put(&b, "tensor(");
    char sfx[4][200];
    int nsfx = 0;
    if (n == 0) {
        sb_put(&b, "[]");
        if (t->ndim != 1) { /* Python tuple: "(0, 3)", "(0,)" */
            size_t p = (size_t)snprintf(sfx[nsfx], sizeof sfx[nsfx], "size=(");
            for (int d = 0; d < t->ndim && p < sizeof sfx[nsfx]; d++)
                p += (size_t)snprintf(sfx[nsfx] + p, sizeof sfx[nsfx] - p, "%s%lld", d ? ", " : "",
                                      (long long)t->shape[d]);
            if (p < sizeof sfx[nsfx]) snprintf(sfx[nsfx] + p, sizeof sfx[nsfx] - p, "%s)", t->ndim == 1 ? "," : "");
            nsfx++;
        }
        if (t->dtype != EM_F32) snprintf(sfx[nsfx++], sizeof sfx[0], "dtype=torch.%s", em_dtype_name(t->dtype));
    } else {
        pr_formatter(&c);
        if (t->ndim == 0) {
            put_value(&b, &c, 0);
        } else {
            print_rec(&b, &c, 0, 0, indent);
        }
        if (t->dtype != EM_F32 && t->dtype != EM_I64 && t->dtype != EM_BOOL)
            snprintf(sfx[nsfx++], sizeof sfx[0], "dtype=torch.%s", em_dtype_name(t->dtype));
    }
    if (t->requires_grad && !t->node) snprintf(sfx[nsfx++], sizeof sfx[0], "requires_grad=True");
    free(raw);

    if (!b.oom && b.s) {
        const char *nl = strrchr(b.s, '\n');
        int64_t last_line_len = (int64_t)b.n - (nl ? (int64_t)(nl - b.s) : -1) + 1;
        for (int i = 0; i < nsfx; i++) pr_suffix(&b, indent, sfx[i], &last_line_len);
    }
    sb_put(&b, ")");
    if (b.oom || !b.s) {
        free(b.s);
        return em__fail(EM_ERR_NOMEM, "out of memory");
    }
    return b.s;
}

em_status em_tensor_print(const em_tensor *t, FILE *f)
{
    char *s = em_tensor_to_string(t);
    if (!s) return em_last_status();
    fprintf(f ? f : stdout, "%s\n", s);
    free(s);
    return EM_OK;
}
