/* The tensor object: header (dtype, shape, strides, offset) over a shared
 * storage, reference counting, scopes, host I/O and printing. */
#include "runtime/internal.h"

#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* ---- scopes --------------------------------------------------------------- */

typedef struct scope {
    em_tensor **items;
    int n, cap;
} scope;

static _Thread_local scope *tl_scopes;
static _Thread_local int tl_depth, tl_cap;

void em_scope_begin(void)
{
    if (tl_depth == tl_cap) {
        int cap = tl_cap ? tl_cap * 2 : 8;
        scope *s = realloc(tl_scopes, sizeof *s * (size_t)cap);
        if (!s) abort();
        memset(s + tl_cap, 0, sizeof *s * (size_t)(cap - tl_cap));
        tl_scopes = s;
        tl_cap = cap;
    }
    tl_scopes[tl_depth].n = 0;
    tl_depth++;
}

static void scope_push(int level, em_tensor *t)
{
    scope *s = &tl_scopes[level - 1];
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        em_tensor **it = realloc(s->items, sizeof *it * (size_t)cap);
        if (!it) abort();
        s->items = it;
        s->cap = cap;
    }
    s->items[s->n++] = t;
    t->scope_level = level;
}

void em__scope_add(em_tensor *t)
{
    if (t && tl_depth > 0) scope_push(tl_depth, t);
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
        if (level > 1) scope_push(level - 1, t);
    }
    return t;
}

em_tensor *em__publish(em_tensor *t)
{
    em__scope_add(t);
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
    return EM_OK;
}

em_tensor *em__tensor_new(em_dtype dt, const int64_t *shape, int ndim)
{
    if (!em_is_initialized()) return em__fail(EM_ERR_STATE, "tensor creation before em_init");
    if (check_shape(shape, ndim, "tensor") != EM_OK) return NULL;
    if (dt < 0 || dt >= EM_DTYPE_COUNT) return em__fail(EM_ERR_DTYPE, "invalid dtype %d", (int)dt);
    if (dt == EM_F16 || dt == EM_BF16) return em__fail(EM_ERR_DTYPE, "dtype %s is declared but not supported yet", em_dtype_name(dt));
    int64_t n = em__numel(shape, ndim);
    size_t nbytes = (size_t)n * em_dtype_size(dt);
    if (nbytes >= ((size_t)1 << 32)) {
        char b[160];
        return em__fail(EM_ERR_NOMEM, "tensor of shape %s (%zu bytes) exceeds the 4 GiB per-tensor limit",
                        em_shape_str(shape, ndim, b, sizeof b), nbytes);
    }
    em_tensor *t = calloc(1, sizeof *t);
    if (!t) return em__fail(EM_ERR_NOMEM, "out of memory");
    t->storage = em__storage_acquire(nbytes);
    if (!t->storage) {
        free(t);
        return em__fail(EM_ERR_NOMEM, "out of memory");
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
    em_tensor *t = calloc(1, sizeof *t);
    if (!t) return em__fail(EM_ERR_NOMEM, "out of memory");
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

void em__node_release(struct em_node *n); /* autodiff/tape.c */

em_tensor *em_tensor_retain(em_tensor *t)
{
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

void em_tensor_release(em_tensor *t)
{
    if (!t) return;
    if (t->refcount == 1 && t->scope_level > 0) em__scope_remove(t);
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (t->node) em__node_release(t->node);
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

em_status em_to_host(const em_tensor *t, void *dst, size_t nbytes)
{
    if (!t || !dst) return em__set_error(EM_ERR_INVALID, "em_to_host: %s is NULL", t ? "dst" : "tensor");
    size_t need = (size_t)em_tensor_numel(t) * em_dtype_size(t->dtype);
    if (nbytes < need)
        return em__set_error(EM_ERR_INVALID, "em_to_host: buffer of %zu bytes is too small for %zu bytes", nbytes, need);
    if (need == 0) return EM_OK;
    starpu_data_handle_t h = t->storage->handle;
    if (starpu_data_acquire(h, STARPU_R) != 0)
        return em__set_error(EM_ERR_RUNTIME, "em_to_host: could not acquire the data handle");
    gather_host(t, (const char *)starpu_vector_get_local_ptr(h), dst);
    starpu_data_release(h);
    return EM_OK;
}

static double elem_to_double(em_dtype dt, const void *p)
{
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_I32: return *(const int32_t *)p;
    case EM_I64: return (double)*(const int64_t *)p;
    case EM_U8: return *(const uint8_t *)p;
    case EM_BOOL: return *(const uint8_t *)p != 0;
    default: return NAN;
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
    em_status st = em_to_host(t, buf, sizeof buf);
    if (st == EM_OK) *out = elem_to_double(t->dtype, buf);
    return st;
}

/* ---- printing (PyTorch style) --------------------------------------------- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
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
        if (!s) return;
        b->s = s;
        b->cap = cap;
    }
}

typedef struct pfmt {
    em_dtype dt;
    bool sci, integral;
    int width, prec;
} pfmt;

static void fmt_value(sbuf *b, const pfmt *f, double v)
{
    if (f->dt == EM_BOOL) {
        sb_put(b, "%*s", f->width, v != 0 ? "True" : "False");
    } else if (!em_dtype_is_float(f->dt)) {
        sb_put(b, "%*.0f", f->width, v);
    } else if (isnan(v)) {
        sb_put(b, "%*s", f->width, "nan");
    } else if (isinf(v)) {
        sb_put(b, "%*s", f->width, v > 0 ? "inf" : "-inf");
    } else if (f->sci) {
        sb_put(b, "%*.*e", f->width, f->prec, v);
    } else if (f->integral) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.0f.", v);
        sb_put(b, "%*s", f->width, tmp);
    } else {
        sb_put(b, "%*.*f", f->width, f->prec, v);
    }
}

static void print_rec(sbuf *b, const em_tensor *t, const double *vals, int dim, int64_t *pos, const pfmt *f, int indent)
{
    int64_t n = t->shape[dim];
    sb_put(b, "[");
    bool summarize = em_tensor_numel(t) > 1000 && n > 6;
    for (int64_t i = 0; i < n; i++) {
        if (summarize && i == 3) {
            sb_put(b, dim == t->ndim - 1 ? "..., " : "...,\n%*s", dim == t->ndim - 1 ? 0 : indent + 1, "");
            i = n - 3;
        }
        int64_t p = *pos + i;
        if (dim == t->ndim - 1) {
            fmt_value(b, f, vals[p]);
            if (i + 1 < n) sb_put(b, ", ");
        } else {
            int64_t stride = em__numel(t->shape + dim + 1, t->ndim - dim - 1);
            int64_t sub = *pos + i * stride;
            print_rec(b, t, vals, dim + 1, &sub, f, indent + 1);
            if (i + 1 < n) {
                sb_put(b, ",");
                for (int k = 0; k < t->ndim - dim - 1; k++) sb_put(b, "\n");
                sb_put(b, "%*s", indent + 1, "");
            }
        }
    }
    sb_put(b, "]");
}

char *em_tensor_to_string(const em_tensor *t)
{
    if (!t) return em__fail(EM_ERR_INVALID, "em_tensor_to_string: tensor is NULL");
    int64_t n = em_tensor_numel(t);
    size_t es = em_dtype_size(t->dtype);
    char *raw = malloc((size_t)(n ? n : 1) * es);
    double *vals = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!raw || !vals) {
        free(raw);
        free(vals);
        return em__fail(EM_ERR_NOMEM, "out of memory");
    }
    if (em_to_host(t, raw, (size_t)n * es) != EM_OK) {
        free(raw);
        free(vals);
        return NULL;
    }
    pfmt f = {.dt = t->dtype, .width = 1, .prec = 4, .integral = true};
    double amax = 0, amin = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        vals[i] = elem_to_double(t->dtype, raw + i * (int64_t)es);
        double a = fabs(vals[i]);
        if (!isfinite(vals[i])) continue;
        if (vals[i] != floor(vals[i])) f.integral = false;
        if (a > amax) amax = a;
        if (a > 0 && a < amin) amin = a;
    }
    free(raw);
    if (em_dtype_is_float(t->dtype) && !f.integral && (amax >= 1e8 || (amin < 1e-4 && amin > 0) || (amin > 0 && amax / amin > 1000)))
        f.sci = true;
    if (em_dtype_is_float(t->dtype) && f.integral && amax >= 1e8) f.sci = true;
    /* width = longest formatted value */
    for (int64_t i = 0; i < n; i++) {
        sbuf tmp = {0};
        pfmt g = f;
        g.width = 1;
        fmt_value(&tmp, &g, vals[i]);
        if (tmp.s && (int)tmp.n > f.width) f.width = (int)tmp.n;
        free(tmp.s);
    }
    sbuf b = {0};
    sb_put(&b, "tensor(");
    if (t->ndim == 0) {
        fmt_value(&b, &(pfmt){f.dt, f.sci, f.integral, 1, f.prec}, vals[0]);
    } else if (n == 0) {
        sb_put(&b, "[]");
    } else {
        int64_t pos = 0;
        print_rec(&b, t, vals, 0, &pos, &f, 7);
    }
    if (t->dtype != EM_F32 && t->dtype != EM_I64 && t->dtype != EM_BOOL) sb_put(&b, ", dtype=torch.%s", em_dtype_name(t->dtype));
    if (n == 0) {
        char sh[160];
        sb_put(&b, ", size=%s", em_shape_str(t->shape, t->ndim, sh, sizeof sh));
    }
    sb_put(&b, ")");
    free(vals);
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
