/* Dataset interface helpers, the in-memory dataset and subsets. */
#include "runtime/runtime_internal.h"
#include "ember/data.h"

#include <stdlib.h>
#include <string.h>

em_status em_dataset_init(em_dataset *ds, const em_dataset_vtable *vt, const int64_t *feature_shape,
                          int feature_ndim, int64_t num_classes)
{
    if (!ds || !vt || !vt->length || !vt->get || !vt->free)
        return em__set_error(EM_ERR_INVALID, "em_dataset_init: dataset or vtable (length/get/free) is NULL");
    if (feature_ndim < 0 || feature_ndim > EM_MAX_DIMS - 1)
        return em__set_error(EM_ERR_INVALID, "em_dataset_init: feature rank %d outside [0, %d]", feature_ndim,
                             EM_MAX_DIMS - 1);
    if (feature_ndim > 0 && !feature_shape)
        return em__set_error(EM_ERR_INVALID, "em_dataset_init: feature_shape is NULL");
    int64_t nf = 1;
    for (int i = 0; i < feature_ndim; i++) {
        if (feature_shape[i] < 1 || feature_shape[i] > (INT64_C(1) << 40) / nf)
            return em__set_error(EM_ERR_INVALID, "em_dataset_init: bad feature size %lld at dim %d",
                                 (long long)feature_shape[i], i);
        nf *= feature_shape[i];
    }
    memset(ds, 0, sizeof *ds);
    ds->vt = vt;
    ds->feature_ndim = feature_ndim;
    for (int i = 0; i < feature_ndim; i++) ds->feature_shape[i] = feature_shape[i];
    ds->num_features = nf;
    ds->num_classes = num_classes < 0 ? 0 : num_classes;
    return EM_OK;
}

int64_t em_dataset_length(const em_dataset *ds)
{
    if (!ds || !ds->vt) {
        em__set_error(EM_ERR_INVALID, "em_dataset_length: dataset is NULL");
        return -1;
    }
    return ds->vt->length(ds);
}

int64_t em_dataset_num_features(const em_dataset *ds)
{
    if (!ds || !ds->vt) {
        em__set_error(EM_ERR_INVALID, "em_dataset_num_features: dataset is NULL");
        return -1;
    }
    return ds->num_features;
}

em_status em_dataset_get(const em_dataset *ds, int64_t index, float *x, int64_t *y)
{
    if (!ds || !ds->vt || !x || !y)
        return em__set_error(EM_ERR_INVALID, "em_dataset_get: dataset, x or y is NULL");
    int64_t n = ds->vt->length(ds);
    if (index < 0 || index >= n)
        return em__set_error(EM_ERR_INVALID, "em_dataset_get: index %lld out of range [0, %lld)",
                             (long long)index, (long long)n);
    return ds->vt->get(ds, index, x, y);
}

void em_dataset_free(em_dataset *ds)
{
    if (ds && ds->vt && ds->vt->free) ds->vt->free(ds);
}

/* ---- in-memory ------------------------------------------------------------ */

typedef struct mem_ds {
    em_dataset base;
    int64_t n;
    float *x;
    int64_t *y;
} mem_ds;

static int64_t mem_length(const em_dataset *ds) { return ((const mem_ds *)ds)->n; }

static em_status mem_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    const mem_ds *m = (const mem_ds *)ds;
    memcpy(x, m->x + i * ds->num_features, (size_t)ds->num_features * sizeof(float));
    *y = m->y[i];
    return EM_OK;
}

static void mem_free(em_dataset *ds)
{
    mem_ds *m = (mem_ds *)ds;
    free(m->x);
    free(m->y);
    free(m);
}

static const em_dataset_vtable mem_vt = {mem_length, mem_get, mem_free};

em_dataset *em_dataset_from_arrays(const float *x, const int64_t *y, int64_t n, const int64_t *feature_shape,
                                   int feature_ndim)
{
    if (n < 0) return em__fail(EM_ERR_INVALID, "em_dataset_from_arrays: negative sample count %lld", (long long)n);
    if (n > 0 && (!x || !y)) return em__fail(EM_ERR_INVALID, "em_dataset_from_arrays: x or y is NULL");
    mem_ds *m = calloc(1, sizeof *m);
    if (!m) return em__fail(EM_ERR_NOMEM, "em_dataset_from_arrays: out of memory");
    int64_t maxy = -1;
    bool neg = false;
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0) neg = true;
        if (y[i] > maxy) maxy = y[i];
    }
    if (em_dataset_init(&m->base, &mem_vt, feature_shape, feature_ndim, neg ? 0 : maxy + 1) != EM_OK) {
        free(m);
        return NULL;
    }
    int64_t nf = m->base.num_features;
    if (n > 0 && nf > INT64_MAX / (int64_t)sizeof(float) / n) {
        free(m);
        return em__fail(EM_ERR_INVALID, "em_dataset_from_arrays: %lld x %lld floats overflow", (long long)n,
                        (long long)nf);
    }
    m->n = n;
    m->x = malloc((size_t)(n * nf) * sizeof(float) + 1);
    m->y = malloc((size_t)n * sizeof(int64_t) + 1);
    if (!m->x || !m->y) {
        mem_free(&m->base);
        return em__fail(EM_ERR_NOMEM, "em_dataset_from_arrays: out of memory for %lld samples", (long long)n);
    }
    if (n > 0) {
        memcpy(m->x, x, (size_t)(n * nf) * sizeof(float));
        memcpy(m->y, y, (size_t)n * sizeof(int64_t));
    }
    return &m->base;
}

/* ---- subset ----------------------------------------------------------------- */

typedef struct sub_ds {
    em_dataset base;
    em_dataset *parent;
    int64_t start, count;
} sub_ds;

static int64_t sub_length(const em_dataset *ds) { return ((const sub_ds *)ds)->count; }

static em_status sub_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    const sub_ds *s = (const sub_ds *)ds;
    return s->parent->vt->get(s->parent, s->start + i, x, y);
}

static void sub_free(em_dataset *ds) { free(ds); }

static const em_dataset_vtable sub_vt = {sub_length, sub_get, sub_free};

em_dataset *em_dataset_subset(em_dataset *base, int64_t start, int64_t count)
{
    if (!base || !base->vt) return em__fail(EM_ERR_INVALID, "em_dataset_subset: base dataset is NULL");
    int64_t n = base->vt->length(base);
    if (start < 0 || count < 0 || start > n || count > n - start)
        return em__fail(EM_ERR_INVALID, "em_dataset_subset: range [%lld, %lld) outside the dataset [0, %lld)",
                        (long long)start, (long long)(start + count), (long long)n);
    sub_ds *s = calloc(1, sizeof *s);
    if (!s) return em__fail(EM_ERR_NOMEM, "em_dataset_subset: out of memory");
    em_dataset_init(&s->base, &sub_vt, base->feature_shape, base->feature_ndim, base->num_classes);
    s->parent = base;
    s->start = start;
    s->count = count;
    return &s->base;
}
