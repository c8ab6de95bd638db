/* Reductions (sum, prod, max, min, argmax, argmin, any, all, logsumexp, var)
 * and softmax / log_softmax.
 *
 * The front end hands the kernel a permuted view of the input whose kept dims
 * come first (in order) and reduced dims last; p.red.nkeep says how many are
 * kept. The output is contiguous over the kept dims. */
#include "tasks/tasks_internal.h"
#include "ember/amp.h"

#include <math.h>
#include <string.h>

/* Parses dims into a mask; ndims == 0 means all. Error names the op and dim. */
static em_status dims_mask(const em_tensor *a, const int *dims, int ndims, bool *mask, const char *op)
{
    memset(mask, 0, sizeof(bool) * EM_MAX_DIMS);
    if (ndims < 0 || ndims > EM_MAX_DIMS) return em__set_error(EM_ERR_INVALID, "%s: %d dims given", op, ndims);
    if (ndims == 0) {
        for (int i = 0; i < a->ndim; i++) mask[i] = true;
        return EM_OK;
    }
    if (!dims) return em__set_error(EM_ERR_INVALID, "%s: dims is NULL but ndims is %d", op, ndims);
    for (int i = 0; i < ndims; i++) {
        int d = em__norm_dim(a, dims[i], 0, op);
        if (d < 0) return EM_ERR_INVALID;
        if (mask[d]) return em__set_error(EM_ERR_INVALID, "%s: dim %d appears more than once", op, dims[i]);
        mask[d] = true;
    }
    return EM_OK;
}

static em_tensor *reduce(enum em_op_kind kind, const em_tensor *a, const int *dims, int ndims, bool keepdim, double correction,
                         const char *op)
{
    if (!a) return em__fail_null("%s: input is NULL", op);
    em_tensor *ac[1]; /* autocast: sum, prod, logsumexp, var in f32 */
    EM_AUTOCAST_RERUN(kind, &a, 1, ac, reduce(kind, ac[0], dims, ndims, keepdim, correction, op));
    bool mask[EM_MAX_DIMS];
    if (a->ndim == 0 && ndims == 1 && dims && (dims[0] == 0 || dims[0] == -1)) ndims = 0; /* 0-d: dim 0 ok */
    if (dims_mask(a, dims, ndims, mask, op) != EM_OK) return NULL;
    int64_t in_shape[EM_MAX_DIMS], in_st[EM_MAX_DIMS], out_shape[EM_MAX_DIMS];
    int nk = 0, nr = 0, no = 0;
    int64_t nred = 1;
    for (int i = 0; i < a->ndim; i++)
        if (!mask[i]) {
            in_shape[nk] = a->shape[i];
            in_st[nk] = a->strides[i];
            nk++;
        }
    for (int i = 0; i < a->ndim; i++)
        if (mask[i]) {
            in_shape[nk + nr] = a->shape[i];
            in_st[nk + nr] = a->strides[i];
            nred *= a->shape[i];
            nr++;
        }
    for (int i = 0; i < a->ndim; i++) {
        if (!mask[i]) out_shape[no++] = a->shape[i];
        else if (keepdim) out_shape[no++] = 1;
    }
    bool is_arg = kind == EM_OP_ARGMAX || kind == EM_OP_ARGMIN;
    if (nred == 0 && (kind == EM_OP_MAX || kind == EM_OP_MIN || is_arg)) {
        char b[160];
        return em__fail(EM_ERR_SHAPE, "%s: cannot reduce over a zero-size dim of a tensor of shape %s (no identity)", op,
                        em_shape_str(a->shape, a->ndim, b, sizeof b));
    }
    em_dtype cdt = a->dtype, odt = a->dtype;
    switch (kind) {
    case EM_OP_SUM:
    case EM_OP_PROD:
        if (!em_dtype_is_float(cdt)) odt = EM_I64; /* as PyTorch: integer sums are int64 */
        break;
    case EM_OP_ARGMAX:
    case EM_OP_ARGMIN: odt = EM_I64; break;
    case EM_OP_ANY:
    case EM_OP_ALL: odt = EM_BOOL; break;
    case EM_OP_LOGSUMEXP:
    case EM_OP_VAR:
        if (!em_dtype_is_float(cdt)) cdt = odt = EM_F32;
        break;
    default: break;
    }
    em_tensor *c = em__as_dtype(a, cdt);
    if (!c) return NULL;
    em_tensor *view = em__tensor_view(c, in_shape, in_st, a->ndim, c->offset);
    em_tensor_release(c);
    if (!view) return NULL;
    em_tensor *out = em__tensor_new(odt, out_shape, no);
    if (!out) {
        em_tensor_release(view);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.red.nkeep = nk;
    p.red.correction = correction;
    p.red.keepdim = keepdim;
    for (int i = 0; i < a->ndim; i++)
        if (mask[i]) p.red.mask |= 1u << i;
    const em_tensor *orig[1] = {a};
    em_tensor *r = em__run1(kind, &view, 1, out, &p, orig);
    em_tensor_release(view);
    return r;
}

em_tensor *em_sum(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_SUM, a, dims, ndims, keepdim, 0, "em_sum");
}
em_tensor *em_prod(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_PROD, a, dims, ndims, keepdim, 0, "em_prod");
}
em_tensor *em_max(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_MAX, a, dims, ndims, keepdim, 0, "em_max");
}
em_tensor *em_min(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_MIN, a, dims, ndims, keepdim, 0, "em_min");
}
em_tensor *em_any(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_ANY, a, dims, ndims, keepdim, 0, "em_any");
}
em_tensor *em_all(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_ALL, a, dims, ndims, keepdim, 0, "em_all");
}
em_tensor *em_logsumexp(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    return reduce(EM_OP_LOGSUMEXP, a, dims, ndims, keepdim, 0, "em_logsumexp");
}
em_tensor *em_var(const em_tensor *a, const int *dims, int ndims, double correction, bool keepdim)
{
    return reduce(EM_OP_VAR, a, dims, ndims, keepdim, correction, "em_var");
}
em_tensor *em_argmax(const em_tensor *a, int dim, bool keepdim)
{
    return reduce(EM_OP_ARGMAX, a, &dim, 1, keepdim, 0, "em_argmax");
}
em_tensor *em_argmin(const em_tensor *a, int dim, bool keepdim)
{
    return reduce(EM_OP_ARGMIN, a, &dim, 1, keepdim, 0, "em_argmin");
}
em_tensor *em_sum_all(const em_tensor *a) { return em_sum(a, NULL, 0, false); }

em_tensor *em_mean(const em_tensor *a, const int *dims, int ndims, bool keepdim)
{
    if (!a) return em__fail_null("em_mean: input is NULL");
    if (!em_dtype_is_float(a->dtype))
        return em__fail(EM_ERR_DTYPE, "em_mean: input dtype %s is not a float dtype (cast it first, as in PyTorch)",
                        em_dtype_name(a->dtype));
    bool mask[EM_MAX_DIMS];
    if (a->ndim == 0) ndims = 0;
    if (dims_mask(a, dims, ndims, mask, "em_mean") != EM_OK) return NULL;
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        if (mask[i]) n *= a->shape[i];
    em_scope_begin();
    /* 16 bits: the sum and the division in f32, rounded once (the sum
     * rounded to f16 overflowed: the mean of four 65504 was inf), as
     * PyTorch's CUDA mean; inside autocast the result stays f32 (sum is an
     * f32 op there) */
    const bool low = em_dtype_size(a->dtype) == 2;
    em_tensor *s = em_sum(low ? em_cast(a, EM_F32) : a, dims, ndims, keepdim);
    em_tensor *r = em_mul_scalar(s, n > 0 ? 1.0 / (double)n : NAN);
    if (low && r && em_autocast_dtype() == EM_F32) r = em_cast(r, a->dtype);
    r = r ? em_keep(r) : NULL;
    em_scope_end();
    return r;
}
em_tensor *em_mean_all(const em_tensor *a) { return em_mean(a, NULL, 0, false); }

em_tensor *em_std(const em_tensor *a, const int *dims, int ndims, double correction, bool keepdim)
{
    em_scope_begin();
    /* 16 bits: the variance and its root in f32, rounded once (not the
     * variance rounded, then its root rounded again); f32 inside autocast */
    const bool low = a && em_dtype_size(a->dtype) == 2;
    em_tensor *v = em_var(low ? em_cast(a, EM_F32) : a, dims, ndims, correction, keepdim);
    /* keep em_var's error message; the gradient is 0 where std = 0 (a constant
     * input), as PyTorch, not 0 / 0 */
    em_tensor *r = v ? em__sqrt_std(v) : NULL;
    if (low && r && em_autocast_dtype() == EM_F32) r = em_cast(r, a->dtype);
    r = r ? em_keep(r) : NULL;
    em_scope_end();
    return r;
}

/* softmax family: the kernel gets input and output views with `dim` moved last. */
static em_tensor *softmax(enum em_op_kind kind, const em_tensor *a, int dim, const char *op)
{
    if (!a) return em__fail_null("%s: input is NULL", op);
    em_tensor *ac[1]; /* autocast: softmax, log_softmax in f32 */
    EM_AUTOCAST_RERUN(kind, &a, 1, ac, softmax(kind, ac[0], dim, op));
    int d = a->ndim == 0 && (dim == 0 || dim == -1) ? 0 : em__norm_dim(a, dim, 0, op);
    if (d < 0) return NULL;
    em_tensor *c = em__as_dtype(a, em_dtype_is_float(a->dtype) ? a->dtype : EM_F32);
    if (!c) return NULL;
    em_tensor *out = em__tensor_new(c->dtype, a->shape, a->ndim);
    if (!out) {
        em_tensor_release(c);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.axis.dim = d;
    const em_tensor *orig[1] = {a};
    em_tensor *r = em__run1(kind, &c, 1, out, &p, orig);
    em_tensor_release(c);
    return r;
}

em_tensor *em_softmax(const em_tensor *a, int dim) { return softmax(EM_OP_SOFTMAX, a, dim, "em_softmax"); }
em_tensor *em_log_softmax(const em_tensor *a, int dim) { return softmax(EM_OP_LOG_SOFTMAX, a, dim, "em_log_softmax"); }
