/* Indexing ops: gather, scatter, scatter_add, index_select, index_add,
 * one_hot.
 *
 * Kernel contracts (devices/cpu/index.c implements them; p.axis.dim is the
 * normalised dim for all but ONE_HOT, which uses p.onehot.num_classes):
 *
 *   GATHER       in[0] = a (strided), in[1] = index (i64, a's rank),
 *                out[0] = result of index's shape and a's dtype:
 *                out[i][j][k] = a[i][index[i][j][k]][k]   (dim 1)
 *   INDEX_SELECT in[0] = a, in[1] = index (1-D i64), out[0] = a's shape with
 *                dim replaced by index's length:
 *                out[i][j][k] = a[i][index[j]][k]          (dim 1)
 *   SCATTER      in[0] = self (the kernel first copies it into out),
 *   SCATTER_ADD  in[1] = index (i64, self's rank), in[2] = src (self's dtype,
 *                same rank, index.shape[d] <= src.shape[d]); out[0] = result
 *                of self's shape, contiguous, written whole (W access):
 *                out[i][index[i][j][k]][k] = src[i][j][k]   (scatter, dim 1)
 *                out[i][index[i][j][k]][k] += src[i][j][k]  (scatter_add)
 *                Duplicate indices: scatter keeps the last write in C order
 *                of index (PyTorch leaves it unspecified).
 *   INDEX_ADD    in[0] = self (strided) [.., V, ..], in[1] = index (1-D
 *                i64 [N]), in[2] = src (self's dtype and shape but dim of
 *                size N, strided); out[0] = result of self's shape,
 *                contiguous, written whole (W access):
 *                out = self; out[i][index[j]][k] += src[i][j][k]  (dim 1)
 *                Duplicate indices accumulate in ascending j (the CPU's C
 *                order) on every device: f32 / f64 results are the CPU's
 *                bits (CUDA sorts (index[j], j) with a stable radix sort and
 *                sums each output's segment in order; bool: logical or).
 *   ONE_HOT      in[0] = index (i64, any shape), out[0] = i64 of shape
 *                index.shape + [num_classes]: out[..., c] = (index[...] == c).
 *
 * Index values are not read at submit time (that would wait for the data), so
 * they cannot be validated here. Instead every kernel checks each index
 * against the size of its dim and never reads or writes out of bounds. On the
 * CPU an out-of-range (or negative) index is an error, as PyTorch raises: the
 * sticky kernel error EM_ERR_INVALID naming the op, the value and the dim's
 * size, reported by the next em_sync / em_to_host / em_item. On CUDA and
 * OpenCL (asynchronous kernels that cannot report a per-element condition
 * without a synchronisation) it is not reported: the value yields 0 in
 * gather / index_select, is skipped in scatter / scatter_add / index_add,
 * and gives an all-zero row in one_hot.
 *
 * src of scatter / scatter_add / index_add must have self's dtype (EM_ERR_DTYPE
 * otherwise, as PyTorch).
 *
 * Index tensors may be i64 or i32 (i32 is cast to i64 first, by a task the
 * tape does not record); any other dtype is an EM_ERR_DTYPE error.
 */
#include "tasks/tasks_internal.h"

#include <string.h>

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)

/* i64 view of an index tensor (retained or cast copy), unscoped; NULL + error
 * for other dtypes. */
static em_tensor *index_i64(const em_tensor *index, const char *op)
{
    if (index->dtype != EM_I64 && index->dtype != EM_I32)
        return em__fail(EM_ERR_DTYPE, "%s: index must be int64 or int32, got %s", op, em_dtype_name(index->dtype));
    return em__as_dtype(index, EM_I64);
}

static bool supported(em_dtype dt)
{
    return (unsigned)dt < EM_DTYPE_COUNT;
}

em_tensor *em_gather(const em_tensor *a, int dim, const em_tensor *index)
{
    if (!a || !index) return em__fail_null("em_gather: input %s is NULL", !a ? "a" : "index");
    if (!supported(a->dtype)) return em__fail(EM_ERR_DTYPE, "em_gather: dtype %s is not supported", em_dtype_name(a->dtype));
    int d = em__norm_dim(a, dim, 0, "em_gather");
    if (d < 0) return NULL;
    char sa[200], si[200];
    if (index->ndim != a->ndim)
        return em__fail(EM_ERR_SHAPE, "em_gather: index of shape %s must have the rank of the input shape %s", SHAPE_STR(index, si),
                        SHAPE_STR(a, sa));
    for (int k = 0; k < a->ndim; k++)
        if (k != d && index->shape[k] > a->shape[k])
            return em__fail(EM_ERR_SHAPE, "em_gather: index of shape %s is larger than the input shape %s at dim %d (only dim %d may differ)",
                            SHAPE_STR(index, si), SHAPE_STR(a, sa), k, d);
    em_tensor *idx = index_i64(index, "em_gather");
    if (!idx) return NULL;
    em_tensor *out = em__tensor_new(a->dtype, index->shape, index->ndim);
    if (!out) {
        em_tensor_release(idx);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.axis.dim = d;
    em_tensor *in[2] = {(em_tensor *)a, idx};
    const em_tensor *orig[2] = {a, index};
    em_tensor *r = em__run1(EM_OP_GATHER, in, 2, out, &p, orig);
    em_tensor_release(idx);
    return r;
}

static em_tensor *scatter(enum em_op_kind kind, const em_tensor *a, int dim, const em_tensor *index, const em_tensor *src,
                          const char *op)
{
    if (!a || !index || !src) return em__fail_null("%s: input %s is NULL", op, !a ? "a" : !index ? "index" : "src");
    if (!supported(a->dtype)) return em__fail(EM_ERR_DTYPE, "%s: dtype %s is not supported", op, em_dtype_name(a->dtype));
    if (!supported(src->dtype)) return em__fail(EM_ERR_DTYPE, "%s: src dtype %s is not supported", op, em_dtype_name(src->dtype));
    if (src->dtype != a->dtype)
        return em__fail(EM_ERR_DTYPE, "%s: src dtype %s must be the input's dtype %s (as PyTorch): cast src first", op,
                        em_dtype_name(src->dtype), em_dtype_name(a->dtype));
    int d = em__norm_dim(a, dim, 0, op);
    if (d < 0) return NULL;
    char sa[200], si[200], ss[200];
    if (index->ndim != a->ndim || src->ndim != a->ndim)
        return em__fail(EM_ERR_SHAPE, "%s: index %s and src %s must have the rank of the input shape %s", op, SHAPE_STR(index, si),
                        SHAPE_STR(src, ss), SHAPE_STR(a, sa));
    for (int k = 0; k < a->ndim; k++) {
        if (index->shape[k] > src->shape[k])
            return em__fail(EM_ERR_SHAPE, "%s: index of shape %s is larger than src of shape %s at dim %d", op, SHAPE_STR(index, si),
                            SHAPE_STR(src, ss), k);
        if (k != d && index->shape[k] > a->shape[k])
            return em__fail(EM_ERR_SHAPE, "%s: index of shape %s is larger than the input shape %s at dim %d (only dim %d may differ)",
                            op, SHAPE_STR(index, si), SHAPE_STR(a, sa), k, d);
    }
    em_tensor *idx = index_i64(index, op);
    if (!idx) return NULL;
    em_tensor *s = em__as_dtype(src, a->dtype); /* the same dtype: a retained reference */
    em_tensor *out = s ? em__tensor_new(a->dtype, a->shape, a->ndim) : NULL;
    em_tensor *r = NULL;
    if (out) {
        union em_op_params p;
        memset(&p, 0, sizeof p);
        p.axis.dim = d;
        em_tensor *in[3] = {(em_tensor *)a, idx, s};
        const em_tensor *orig[3] = {a, index, src};
        r = em__run1(kind, in, 3, out, &p, orig);
    }
    em_tensor_release(idx);
    em_tensor_release(s);
    return r;
}

em_tensor *em_scatter(const em_tensor *a, int dim, const em_tensor *index, const em_tensor *src)
{
    return scatter(EM_OP_SCATTER, a, dim, index, src, "em_scatter");
}

em_tensor *em_scatter_add(const em_tensor *a, int dim, const em_tensor *index, const em_tensor *src)
{
    return scatter(EM_OP_SCATTER_ADD, a, dim, index, src, "em_scatter_add");
}

em_tensor *em_index_select(const em_tensor *a, int dim, const em_tensor *index)
{
    if (!a || !index) return em__fail_null("em_index_select: input %s is NULL", !a ? "a" : "index");
    if (!supported(a->dtype)) return em__fail(EM_ERR_DTYPE, "em_index_select: dtype %s is not supported", em_dtype_name(a->dtype));
    int d = em__norm_dim(a, dim, 0, "em_index_select");
    if (d < 0) return NULL;
    char si[200];
    if (index->ndim > 1)
        return em__fail(EM_ERR_SHAPE, "em_index_select: index must be 1-D, got shape %s", SHAPE_STR(index, si));
    em_tensor *idx = index_i64(index, "em_index_select");
    if (!idx) return NULL;
    if (idx->ndim == 0) { /* a 0-d index picks one row, as a 1-element index */
        int64_t one = 1, st = 1;
        em_tensor *v = em__tensor_view(idx, &one, &st, 1, idx->offset);
        em_tensor_release(idx);
        if (!v) return NULL;
        idx = v;
    }
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    shape[d] = idx->shape[0];
    em_tensor *out = em__tensor_new(a->dtype, shape, a->ndim);
    if (!out) {
        em_tensor_release(idx);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.axis.dim = d;
    em_tensor *in[2] = {(em_tensor *)a, idx};
    const em_tensor *orig[2] = {a, index};
    em_tensor *r = em__run1(EM_OP_INDEX_SELECT, in, 2, out, &p, orig);
    em_tensor_release(idx);
    return r;
}

em_tensor *em_index_add(const em_tensor *self, int dim, const em_tensor *index, const em_tensor *src)
{
    const char *op = "em_index_add";
    if (!self || !index || !src) return em__fail_null("%s: input %s is NULL", op, !self ? "self" : !index ? "index" : "src");
    if (!supported(self->dtype)) return em__fail(EM_ERR_DTYPE, "%s: dtype %s is not supported", op, em_dtype_name(self->dtype));
    if (!supported(src->dtype)) return em__fail(EM_ERR_DTYPE, "%s: src dtype %s is not supported", op, em_dtype_name(src->dtype));
    if (src->dtype != self->dtype)
        return em__fail(EM_ERR_DTYPE, "%s: src dtype %s must be self's dtype %s (as PyTorch): cast src first", op,
                        em_dtype_name(src->dtype), em_dtype_name(self->dtype));
    char sa[200], si[200], ss[200];
    if (self->ndim < 1) return em__fail(EM_ERR_SHAPE, "%s: self must have at least one dim, got shape %s", op, SHAPE_STR(self, sa));
    int d = em__norm_dim(self, dim, 0, op);
    if (d < 0) return NULL;
    if (index->ndim > 1) return em__fail(EM_ERR_SHAPE, "%s: index must be 1-D, got shape %s", op, SHAPE_STR(index, si));
    const int64_t n = index->ndim == 0 ? 1 : index->shape[0];
    bool ok = src->ndim == self->ndim;
    for (int k = 0; ok && k < self->ndim; k++) ok = src->shape[k] == (k == d ? n : self->shape[k]);
    if (!ok)
        return em__fail(EM_ERR_SHAPE,
                        "%s: src of shape %s must be self's shape %s with dim %d of the index's length %lld (index shape %s)", op,
                        SHAPE_STR(src, ss), SHAPE_STR(self, sa), d, (long long)n, SHAPE_STR(index, si));
    em_tensor *idx = index_i64(index, op);
    if (!idx) return NULL;
    if (idx->ndim == 0) { /* a 0-d index adds one slice, as a 1-element index */
        int64_t one = 1, st = 1;
        em_tensor *v = em__tensor_view(idx, &one, &st, 1, idx->offset);
        em_tensor_release(idx);
        if (!v) return NULL;
        idx = v;
    }
    em_tensor *out = em__tensor_new(self->dtype, self->shape, self->ndim);
    if (!out) {
        em_tensor_release(idx);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.axis.dim = d;
    em_tensor *in[3] = {(em_tensor *)self, idx, (em_tensor *)src};
    const em_tensor *orig[3] = {self, index, src};
    em_tensor *r = em__run1(EM_OP_INDEX_ADD, in, 3, out, &p, orig);
    em_tensor_release(idx);
    return r;
}

em_tensor *em_one_hot(const em_tensor *index, int64_t num_classes)
{
    if (!index) return em__fail_null("em_one_hot: index is NULL");
    if (num_classes < 1)
        return em__fail(EM_ERR_INVALID, "em_one_hot: num_classes must be >= 1, got %lld (it is not inferred from the data)",
                        (long long)num_classes);
    char si[200];
    if (index->ndim + 1 > EM_MAX_DIMS)
        return em__fail(EM_ERR_SHAPE, "em_one_hot: index of shape %s gives rank %d, above the maximum %d", SHAPE_STR(index, si),
                        index->ndim + 1, EM_MAX_DIMS);
    em_tensor *idx = index_i64(index, "em_one_hot");
    if (!idx) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, index->shape, sizeof(int64_t) * (size_t)index->ndim);
    shape[index->ndim] = num_classes;
    em_tensor *out = em__tensor_new(EM_I64, shape, index->ndim + 1);
    if (!out) {
        em_tensor_release(idx);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.onehot.num_classes = num_classes;
    em_tensor *in[1] = {idx};
    const em_tensor *orig[1] = {index};
    em_tensor *r = em__run1(EM_OP_ONE_HOT, in, 1, out, &p, orig);
    em_tensor_release(idx);
    return r;
}
