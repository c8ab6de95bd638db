/* ONNX operators, nn group: reductions (Reduce*, ArgMax / ArgMin), the
 * softmax family (Softmax, LogSoftmax, Hardmax), normalizations
 * (LayerNormalization, RMSNormalization, LpNormalization,
 * MeanVarianceNormalization), losses (NegativeLogLikelihoodLoss,
 * SoftmaxCrossEntropyLoss), attention (Attention, LinearAttention,
 * RotaryEmbedding), Einsum and Det, all composed from Ember's tensor ops.
 * Semantics from onnx/docs/Operators.md (onnx 1.23); each function names
 * the opsets whose differences it handles. */
#include "store/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------------- */

static bool is_low_float(em_dtype dt) { return em_dtype_is_float(dt) && em_dtype_size(dt) == 2; }

/* x in a dtype the reduction kernels compute well: 16-bit floats in f32. */
static em_tensor *compute_dtype(em_tensor *x) { return is_low_float(em_tensor_dtype(x)) ? em_cast(x, EM_F32) : x; }

/* t cast to dt when it is not already, integer results wrapped to @p type. */
static em_tensor *to_dtype(em_tensor *t, em_dtype dt, int type)
{
    if (!t) return NULL;
    if (em_tensor_dtype(t) != dt) t = em_cast(t, dt);
    return em_dtype_is_float(dt) ? t : onnx_wrap_int(t, type);
}

/* Smallest / largest value of an ONNX integer type (int64's for others). */
static void int_range(int type, double *lo, double *hi)
{
    if (!onnx_int_range(type, lo, hi)) *lo = -9223372036854775808.0, *hi = 9223372036854775807.0;
}

/* ---- Reduce* --------------------------------------------------------------------------- */

enum rkind { RK_SUM, RK_MEAN, RK_MAX, RK_MIN, RK_PROD, RK_L1, RK_L2, RK_LOGSUM, RK_LOGSUMEXP, RK_SUMSQ };

/* The element-wise part of a reduction applied alone (no axis reduced:
 * noop_with_empty_axes, or a 0-d input), as the reference's reduction over
 * axes=() gives. */
static em_tensor *reduce_none(em_tensor *x, enum rkind k, int type)
{
    em_dtype dt = em_tensor_dtype(x);
    switch (k) {
    case RK_L1:
    case RK_L2: return to_dtype(em_abs(x), dt, type);
    case RK_SUMSQ: return to_dtype(em_square(x), dt, type);
    case RK_LOGSUM: return to_dtype(em_log(x), dt, type);
    default: return em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
    }
}

/* Reduce* of every opset: axes an attribute before @p axes_input_since,
 * then an optional input with noop_with_empty_axes; keepdims (default 1).
 * Integer inputs keep their type (sums wrap as the type does); a
 * reduction over an empty set gives the operation's identity (0 for sums,
 * 1 for the product, -inf / the type's minimum for max, +inf / the maximum
 * for min, -inf for the log forms, NaN for the mean). */
static em_status reduce_op(onnx_ctx *c, enum rkind k, int axes_input_since)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int type = onnx_in_type(c, 0);
    em_dtype dt = em_tensor_dtype(x);
    int r = em_tensor_ndim(x);
    int64_t ax[EM_MAX_DIMS + 1];
    int na = 0;
    bool from_input = c->opset >= axes_input_since;
    if (from_input) {
        if (onnx_in(c, 1)) {
            na = onnx_in_ints(c, 1, ax, EM_MAX_DIMS + 1);
            if (na < 0) return em_last_status();
        }
    } else {
        const int64_t *v;
        na = onnx_attr_ints(c, "axes", &v);
        if (na < 0) na = 0;
        if (na > EM_MAX_DIMS + 1) return em_set_error(EM_ERR_INVALID, "%d axes for rank %d", na, r);
        for (int i = 0; i < na; i++) ax[i] = v[i];
    }
    bool keep = onnx_attr_int(c, "keepdims", 1) != 0;
    bool noop = from_input && onnx_attr_int(c, "noop_with_empty_axes", 0) != 0;
    bool mask[EM_MAX_DIMS] = {false};
    if (na == 0) {
        if (noop) return onnx_out(c, 0, reduce_none(x, k, type), type);
        for (int d = 0; d < r; d++) mask[d] = true;
    } else {
        for (int i = 0; i < na; i++) {
            int a;
            if (r == 0 && (ax[i] == 0 || ax[i] == -1)) continue;
            if (onnx_axis(c, ax[i], r, &a) != EM_OK) return em_last_status();
            if (mask[a]) return em_set_error(EM_ERR_INVALID, "axis %lld appears more than once", (long long)ax[i]);
            mask[a] = true;
        }
    }
    int dims[EM_MAX_DIMS], nd = 0;
    int64_t oshape[EM_MAX_DIMS];
    int no = 0;
    int64_t nred = 1;
    for (int d = 0; d < r; d++) {
        if (mask[d]) {
            dims[nd++] = d;
            nred *= em_tensor_dim(x, d);
            if (keep) oshape[no++] = 1;
        } else oshape[no++] = em_tensor_dim(x, d);
    }
    if (nd == 0) return onnx_out(c, 0, reduce_none(x, k, type), type);
    if (em_tensor_numel(x) == 0) {
        double lo, hi, v;
        bool fl = em_dtype_is_float(dt);
        int_range(type, &lo, &hi);
        switch (k) {
        case RK_PROD: v = 1; break;
        case RK_MAX: v = fl ? -INFINITY : lo; break;
        case RK_MIN: v = fl ? INFINITY : hi; break;
        case RK_LOGSUM:
        case RK_LOGSUMEXP:
            if (!fl) return onnx_unsupported(c, "an integer log-reduction over an empty set (-inf)");
            v = -INFINITY;
            break;
        case RK_MEAN:
            if (!fl) return onnx_unsupported(c, "an integer mean over an empty set (NaN)");
            v = NAN;
            break;
        default: v = 0; break;
        }
        if (nred != 0) v = 0; /* the output is empty too: any value */
        if (dt == EM_I64 && v == hi && k == RK_MIN) /* INT64_MAX has no double: -(INT64_MIN + 1) */
            return onnx_out(c, 0, em_neg(em_add_scalar(em_full(oshape, no, dt, lo), 1)), type);
        return onnx_out(c, 0, em_full(oshape, no, dt, v), type);
    }
    em_tensor *xc = compute_dtype(x), *y = NULL;
    bool fl = em_dtype_is_float(dt);
    switch (k) {
    case RK_SUM: y = em_sum(xc, dims, nd, keep); break;
    case RK_MEAN:
        if (fl) y = em_mean(xc, dims, nd, keep);
        else y = em_div_scalar(em_cast(em_sum(xc, dims, nd, keep), EM_F64), (double)nred);
        break;
    case RK_MAX:
        y = dt == EM_BOOL ? em_any(xc, dims, nd, keep) : em_max(xc, dims, nd, keep);
        break;
    case RK_MIN:
        y = dt == EM_BOOL ? em_all(xc, dims, nd, keep) : em_min(xc, dims, nd, keep);
        break;
    case RK_PROD: y = em_prod(xc, dims, nd, keep); break;
    case RK_L1: y = em_sum(em_abs(xc), dims, nd, keep); break;
    case RK_L2: {
        em_tensor *s = em_sum(em_square(xc), dims, nd, keep);
        y = em_sqrt(fl ? s : em_cast(s, EM_F64));
        break;
    }
    case RK_LOGSUM: {
        em_tensor *s = em_sum(xc, dims, nd, keep);
        y = em_log(fl ? s : em_cast(s, EM_F64));
        break;
    }
    case RK_LOGSUMEXP: y = em_logsumexp(fl ? xc : em_cast(xc, EM_F64), dims, nd, keep); break;
    case RK_SUMSQ: y = em_sum(em_square(xc), dims, nd, keep); break;
    }
    return onnx_out(c, 0, to_dtype(y, dt, type), type);
}

/* ReduceSum (1, 11, 13: axes an input, noop_with_empty_axes). The others
 * (1, 11, 13, 18: axes an input; ReduceMax / ReduceMin 20: bool). */
static em_status op_reduce_sum(onnx_ctx *c) { return reduce_op(c, RK_SUM, 13); }
static em_status op_reduce_mean(onnx_ctx *c) { return reduce_op(c, RK_MEAN, 18); }
static em_status op_reduce_max(onnx_ctx *c) { return reduce_op(c, RK_MAX, 18); }
static em_status op_reduce_min(onnx_ctx *c) { return reduce_op(c, RK_MIN, 18); }
static em_status op_reduce_prod(onnx_ctx *c) { return reduce_op(c, RK_PROD, 18); }
static em_status op_reduce_l1(onnx_ctx *c) { return reduce_op(c, RK_L1, 18); }
static em_status op_reduce_l2(onnx_ctx *c) { return reduce_op(c, RK_L2, 18); }
static em_status op_reduce_log_sum(onnx_ctx *c) { return reduce_op(c, RK_LOGSUM, 18); }
static em_status op_reduce_log_sum_exp(onnx_ctx *c) { return reduce_op(c, RK_LOGSUMEXP, 18); }
static em_status op_reduce_sum_square(onnx_ctx *c) { return reduce_op(c, RK_SUMSQ, 18); }

/* ---- ArgMax / ArgMin -------------------------------------------------------------------- */

/* ArgMax / ArgMin (1, 11: negative axis, 12: select_last_index, 13): int64
 * indices along axis (default 0), keepdims (default 1). */
static em_status arg_op(onnx_ctx *c, bool want_max)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), a;
    if (r == 0) return em_set_error(EM_ERR_SHAPE, "the input is 0-d");
    if (onnx_axis(c, onnx_attr_int(c, "axis", 0), r, &a) != EM_OK) return em_last_status();
    bool keep = onnx_attr_int(c, "keepdims", 1) != 0;
    bool last = onnx_attr_int(c, "select_last_index", 0) != 0;
    em_tensor *xc = compute_dtype(x);
    if (em_tensor_dtype(xc) == EM_BOOL) xc = em_cast(xc, EM_I32);
    int64_t n = em_tensor_dim(x, a);
    if (n == 0) return em_set_error(EM_ERR_SHAPE, "axis %d has size 0", a);
    if (last) xc = em_index_select(xc, a, em_arange((double)(n - 1), -1, -1, EM_I64));
    em_tensor *idx = want_max ? em_argmax(xc, a, keep) : em_argmin(xc, a, keep);
    if (last) idx = em_rsub_scalar(idx, (double)(n - 1));
    return onnx_out(c, 0, idx, ONNX_INT64);
}
static em_status op_argmax(onnx_ctx *c) { return arg_op(c, true); }
static em_status op_argmin(onnx_ctx *c) { return arg_op(c, false); }

/* ---- Softmax family ---------------------------------------------------------------------- */

enum smkind { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_HARDMAX };

/* One-hot of the first maximum along dim a (of x's dtype). */
static em_tensor *hardmax(em_tensor *x, int a)
{
    int r = em_tensor_ndim(x);
    em_tensor *idx = em_argmax(compute_dtype(x), a, true);
    int64_t n = em_tensor_dim(x, a), s[EM_MAX_DIMS];
    for (int d = 0; d < r; d++) s[d] = d == a ? n : 1;
    em_tensor *ar = em_reshape(em_arange(0, (double)n, 1, EM_I64), s, r);
    return em_cast(em_eq(ar, idx), em_tensor_dtype(x));
}

/* x (f32 holding 16-bit values of dt) rounded to dt and back. */
static em_tensor *rnd16(em_tensor *x, em_dtype dt) { return em_cast(em_cast(x, dt), EM_F32); }

/* Softmax along dim a of x (f32 holding values of the 16-bit dt), rounded
 * to dt after each step as the reference implementation computes in dt:
 * x - max, exp, the sum (numpy sums float16 in float32; ml_dtypes' bfloat16
 * adds in order, rounding each step: emulated for rows of up to 32, longer
 * rows are summed in f32 and rounded once), the division. So results match
 * the reference's bits instead of being one rounding off; the result is f32.
 * guard: rows whose max is -inf subtract 0 (Attention's fully-masked rows). */
static em_tensor *softmax16(em_tensor *x, int a, em_dtype dt, bool guard)
{
    em_tensor *m = em_max(x, &a, 1, true);
    if (guard) m = em_masked_fill(m, em_eq_scalar(m, -INFINITY), 0.0);
    em_tensor *e = rnd16(em_exp(rnd16(em_sub(x, m), dt)), dt);
    int64_t n = em_tensor_dim(x, a);
    em_tensor *sum;
    if (dt == EM_F16 || n > 32) sum = rnd16(em_sum(e, &a, 1, true), dt); /* long rows: one task, not n */
    else {
        sum = em_narrow(e, a, 0, 1);
        for (int64_t j = 1; j < n; j++) sum = rnd16(em_add(sum, em_narrow(e, a, j, 1)), dt);
    }
    if (guard) sum = em_masked_fill(sum, em_eq_scalar(sum, 0), 1.0);
    return rnd16(em_div(e, sum), dt);
}

static em_tensor *softmax_along(em_tensor *x, int a, enum smkind k)
{
    if (k == SM_HARDMAX) return hardmax(x, a);
    em_dtype dt = em_tensor_dtype(x);
    em_tensor *xc = compute_dtype(x), *y;
    if (is_low_float(dt)) {
        y = softmax16(xc, a, dt, false);
        if (k == SM_LOG_SOFTMAX) y = em_log(y);
    } else y = k == SM_SOFTMAX ? em_softmax(xc, a) : em_log_softmax(xc, a);
    return y && em_tensor_dtype(y) != dt ? em_cast(y, dt) : y;
}

/* Softmax / LogSoftmax / Hardmax. Opsets 1 and 11: the input coerced to
 * 2-D [prod(dims < axis), prod(dims >= axis)] (axis default 1) and the
 * operation along the second dim; 13: along the one axis (default -1). */
static em_status softmax_op(onnx_ctx *c, enum smkind k)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (!em_dtype_is_float(em_tensor_dtype(x))) return em_set_error(EM_ERR_DTYPE, "the input must be a float tensor");
    int r = em_tensor_ndim(x), a;
    if (c->opset >= 13) {
        if (r == 0) return onnx_out(c, 0, softmax_along(em_reshape(x, (int64_t[]){1}, 1), 0, k), 0);
        if (onnx_axis(c, onnx_attr_int(c, "axis", -1), r, &a) != EM_OK) return em_last_status();
        return onnx_out(c, 0, softmax_along(x, a, k), 0);
    }
    int64_t axis = onnx_attr_int(c, "axis", 1);
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r) return em_set_error(EM_ERR_INVALID, "axis %lld is out of range for rank %d", (long long)onnx_attr_int(c, "axis", 1), r);
    int64_t s[2] = {1, 1};
    for (int d = 0; d < r; d++) s[d < axis ? 0 : 1] *= em_tensor_dim(x, d);
    em_tensor *y = softmax_along(em_reshape(x, s, 2), 1, k);
    return onnx_out(c, 0, em_reshape(y, em_tensor_shape(x), r), 0);
}
static em_status op_softmax(onnx_ctx *c) { return softmax_op(c, SM_SOFTMAX); }
static em_status op_log_softmax(onnx_ctx *c) { return softmax_op(c, SM_LOG_SOFTMAX); }
static em_status op_hardmax(onnx_ctx *c) { return softmax_op(c, SM_HARDMAX); }

/* ---- normalizations ---------------------------------------------------------------------- */

/* The compute dtype of stash_type (1 = float, 11 = double; others are
 * unsupported) for input dtype dt. */
static em_status stash_dtype(onnx_ctx *c, em_dtype *out)
{
    int64_t st = onnx_attr_int(c, "stash_type", 1);
    if (st == ONNX_FLOAT) *out = EM_F32;
    else if (st == ONNX_DOUBLE) *out = EM_F64;
    else return onnx_unsupported(c, "stash_type %lld", (long long)st);
    return EM_OK;
}

/* What LayerNormalization and RMSNormalization share: X (float) and Scale
 * (inputs 0 and 1), X's dtype, the stash_type compute dtype, the dims
 * axis.. (attribute axis, default -1) and epsilon (default 1e-5). */
static em_status norm_setup(onnx_ctx *c, em_tensor **x, em_tensor **w, em_dtype *dt, em_dtype *cdt, int *dims, int *nd,
                            double *eps)
{
    *x = onnx_in_req(c, 0);
    *w = onnx_in_req(c, 1);
    if (!*x || !*w) return em_last_status();
    *dt = em_tensor_dtype(*x);
    *cdt = EM_F32;
    if (!em_dtype_is_float(*dt)) return em_set_error(EM_ERR_DTYPE, "X must be a float tensor");
    if (stash_dtype(c, cdt) != EM_OK) return em_last_status();
    int r = em_tensor_ndim(*x), a;
    if (onnx_axis(c, onnx_attr_int(c, "axis", -1), r, &a) != EM_OK) return em_last_status();
    *eps = onnx_attr_float(c, "epsilon", 1e-5);
    *nd = 0;
    for (int d = a; d < r; d++) dims[(*nd)++] = d;
    return EM_OK;
}

/* LayerNormalization (17): normalised over dims axis.. (default -1) with
 * the mean and the biased variance computed in stash_type; Y = norm *
 * Scale + B (B optional); optional outputs Mean and InvStdDev of shape
 * X's with the normalised dims 1. */
static em_status op_layer_norm(onnx_ctx *c)
{
    em_tensor *x, *w, *b = onnx_in(c, 2);
    em_dtype dt, cdt;
    int dims[EM_MAX_DIMS], nd;
    double eps;
    if (norm_setup(c, &x, &w, &dt, &cdt, dims, &nd, &eps) != EM_OK) return em_last_status();
    em_tensor *xs = em_cast(x, cdt);
    em_tensor *mean = em_mean(xs, dims, nd, true);
    em_tensor *diff = em_sub(xs, mean);
    em_tensor *var = em_mean(em_square(diff), dims, nd, true);
    em_tensor *inv = em_reciprocal(em_sqrt(em_add_scalar(var, eps)));
    em_tensor *y = em_cast(em_mul(diff, inv), dt);
    y = em_mul(y, w);
    if (b) y = em_add(y, b);
    if (y && em_tensor_dtype(y) != dt) y = em_cast(y, dt);
    em_status st = onnx_out(c, 0, y, 0);
    if (st == EM_OK && c->nout > 1) st = onnx_out(c, 1, mean, onnx_type_of_dtype(cdt));
    if (st == EM_OK && c->nout > 2) st = onnx_out(c, 2, inv, onnx_type_of_dtype(cdt));
    return st;
}

/* RMSNormalization (23): Y = X / sqrt(mean(X^2 over dims axis..) +
 * epsilon) * scale, computed in stash_type. */
static em_status op_rms_norm(onnx_ctx *c)
{
    em_tensor *x, *w;
    em_dtype dt, cdt;
    int dims[EM_MAX_DIMS], nd;
    double eps;
    if (norm_setup(c, &x, &w, &dt, &cdt, dims, &nd, &eps) != EM_OK) return em_last_status();
    em_tensor *xs = em_cast(x, cdt);
    em_tensor *ms = em_mean(em_square(xs), dims, nd, true);
    em_tensor *y = em_mul(xs, em_reciprocal(em_sqrt(em_add_scalar(ms, eps))));
    y = em_mul(em_cast(y, dt), w);
    if (y && em_tensor_dtype(y) != dt) y = em_cast(y, dt);
    return onnx_out(c, 0, y, 0);
}

/* LpNormalization (1, 22): x / ||x||_p along axis (default -1), p 1 or 2
 * (default 2); a zero norm gives 0. */
static em_status op_lp_norm(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "the input must be a float tensor");
    int r = em_tensor_ndim(x), a;
    if (onnx_axis(c, onnx_attr_int(c, "axis", -1), r, &a) != EM_OK) return em_last_status();
    int64_t p = onnx_attr_int(c, "p", 2);
    if (p != 1 && p != 2) return em_set_error(EM_ERR_INVALID, "p must be 1 or 2, not %lld", (long long)p);
    em_tensor *xc = compute_dtype(x);
    em_tensor *n = p == 1 ? em_sum(em_abs(xc), &a, 1, true) : em_sqrt(em_sum(em_square(xc), &a, 1, true));
    em_tensor *zero = em_eq_scalar(n, 0);
    em_tensor *y = em_masked_fill(em_div(xc, em_masked_fill(n, zero, 1.0)), zero, 0.0);
    return onnx_out(c, 0, to_dtype(y, dt, 0), 0);
}

/* MeanVarianceNormalization (9, 13): (X - mean) / (sqrt(mean(X^2) -
 * mean^2) + 1e-9) over axes (default {0, 2, 3}). */
static em_status op_mvn(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "the input must be a float tensor");
    int r = em_tensor_ndim(x);
    const int64_t *v;
    int64_t defaxes[3] = {0, 2, 3};
    int na = onnx_attr_ints(c, "axes", &v);
    if (na < 0) na = 3, v = defaxes;
    int dims[EM_MAX_DIMS];
    if (na > r) return em_set_error(EM_ERR_INVALID, "%d axes for rank %d", na, r);
    for (int i = 0; i < na; i++)
        if (onnx_axis(c, v[i], r, &dims[i]) != EM_OK) return em_last_status();
    em_tensor *xc = compute_dtype(x);
    em_tensor *mean = em_mean(xc, dims, na, true);
    em_tensor *var = em_sub(em_mean(em_square(xc), dims, na, true), em_square(mean));
    em_tensor *y = em_div(em_sub(xc, mean), em_add_scalar(em_sqrt(var), 1e-9));
    return onnx_out(c, 0, to_dtype(y, dt, 0), 0);
}

/* ---- losses ------------------------------------------------------------------------------- */

/* NLL of log-probabilities lp [N, C, d...] (float) and target [N, d...]:
 * loss = -lp[n, target, d...] * weight[target] (weight 1 without the
 * input), 0 where target == ignore_index; mean = sum / sum of the weights
 * that count. */
static em_tensor *nll(onnx_ctx *c, em_tensor *lp, em_tensor *target, em_tensor *weight)
{
    int r = em_tensor_ndim(lp);
    if (r < 2 || em_tensor_ndim(target) != r - 1) {
        em_set_error(EM_ERR_SHAPE, "input of rank %d and target of rank %d (want rank >= 2 and rank - 1)", r, em_tensor_ndim(target));
        return NULL;
    }
    for (int d = 0; d < r - 1; d++)
        if (em_tensor_dim(target, d) != em_tensor_dim(lp, d == 0 ? 0 : d + 1)) {
            em_set_error(EM_ERR_SHAPE, "target dim %d (%lld) does not match the input's", d, (long long)em_tensor_dim(target, d));
            return NULL;
        }
    const char *red = onnx_attr_string(c, "reduction", "mean");
    bool has_ii = onnx_has_attr(c, "ignore_index");
    int64_t ii = onnx_attr_int(c, "ignore_index", 0);
    em_tensor *t = em_cast(target, EM_I64);
    em_tensor *keep = NULL;
    if (has_ii) {
        keep = em_ne_scalar(t, (double)ii);
        t = em_where(keep, t, em_zeros_like(t)); /* ignored targets read class 0 */
    }
    /* a target outside [0, C) (other than ignore_index) is bad input: checked
     * here (one value read back) rather than left to the gather's sticky
     * kernel error, which would surface in a later, unrelated read */
    int64_t C = em_tensor_dim(lp, 1);
    em_tensor *oob = em_any(em_logical_or(em_lt_scalar(t, 0), em_ge_scalar(t, (double)C)), NULL, 0, false);
    double bad = 0;
    if (!oob || em_item(oob, &bad) != EM_OK) return NULL;
    if (bad != 0) {
        em_set_error(EM_ERR_INVALID, "a target value is outside [0, %lld) and is not ignore_index", (long long)C);
        return NULL;
    }
    em_tensor *g = em_squeeze(em_gather(lp, 1, em_unsqueeze(t, 1)), 1);
    em_dtype dt = em_tensor_dtype(lp);
    em_tensor *w = NULL;
    if (weight) {
        int64_t n = em_tensor_numel(t);
        w = em_reshape(em_index_select(em_cast(weight, dt), 0, em_reshape(t, &n, 1)), em_tensor_shape(t), em_tensor_ndim(t));
    }
    if (keep) {
        em_tensor *k = em_cast(keep, dt);
        w = w ? em_mul(w, k) : k;
    }
    em_tensor *loss = em_neg(w ? em_mul(g, w) : g);
    if (!strcmp(red, "none")) return loss;
    if (!strcmp(red, "sum")) return em_sum(loss, NULL, 0, false);
    if (!strcmp(red, "mean")) {
        if (!w) return em_mean(loss, NULL, 0, false);
        return em_div(em_sum(loss, NULL, 0, false), em_sum(w, NULL, 0, false));
    }
    onnx_unsupported(c, "reduction '%s'", red);
    return NULL;
}

/* NegativeLogLikelihoodLoss (12, 13, 22). */
static em_status op_nll_loss(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *t = onnx_in_req(c, 1);
    if (!x || !t) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "input must be a float tensor");
    em_tensor *loss = nll(c, compute_dtype(x), t, onnx_in(c, 2));
    return onnx_out(c, 0, to_dtype(loss, dt, 0), 0);
}

/* SoftmaxCrossEntropyLoss (12, 13): nll of log_softmax(scores, 1); output 1
 * (optional) the log-probabilities. */
static em_status op_sce_loss(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *t = onnx_in_req(c, 1);
    if (!x || !t) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "scores must be a float tensor");
    if (em_tensor_ndim(x) < 2) return em_set_error(EM_ERR_SHAPE, "scores must have rank >= 2");
    em_tensor *lp = em_log_softmax(compute_dtype(x), 1);
    em_tensor *loss = nll(c, lp, t, onnx_in(c, 2));
    em_status st = onnx_out(c, 0, to_dtype(loss, dt, 0), 0);
    if (st == EM_OK && c->nout > 1) st = onnx_out(c, 1, to_dtype(lp, dt, 0), 0);
    return st;
}


/* ---- Attention ------------------------------------------------------------------------------ */

/* 0 where allowed, -inf elsewhere, in dtype cd. */
static em_tensor *allowed_bias(em_tensor *allowed, em_dtype cd)
{
    return em_where(allowed, em_scalar(0, cd), em_scalar(-INFINITY, cd));
}

/* Attention (23, 24: nonpad_kv_seqlen): softmax(softcap(Q K^T * scale) +
 * bias) V, computed as the composed math path (matmul, softmax) in f32 for
 * 16-bit inputs. Q, K, V 4-D [B, H, S, D] or 3-D [B, S, H * D] (with
 * q_num_heads / kv_num_heads); GQA repeats each KV head (h0, h0, h1, ...);
 * past_key / past_value concatenated along the sequence (present_key /
 * present_value outputs); attn_mask bool (true = attend) or additive, its
 * last dim padded to the total length (-inf); is_causal bottom-right
 * aligned (offset = the past length, or nonpad_kv_seqlen - q_len per
 * batch); left / right_window_size (25); a row with every key masked gives
 * zeros. qk_matmul_output (output 3): the scores after softcap for modes 0
 * and 1 (as the reference implementation: the spec says mode 0 is before
 * softcap), with the bias for 2, the probabilities for 3. */
static em_status op_attention(onnx_ctx *c)
{
#define RND(t) (low ? em_cast(em_cast((t), dt), cd) : (t))
    em_tensor *q = onnx_in_req(c, 0), *k = onnx_in_req(c, 1), *v = onnx_in_req(c, 2);
    if (!q || !k || !v) return em_last_status();
    em_tensor *mask = onnx_in(c, 3), *pk = onnx_in(c, 4), *pv = onnx_in(c, 5), *nonpad = onnx_in(c, 6);
    em_dtype dt = em_tensor_dtype(q);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "Q must be a float tensor");
    em_dtype cd = is_low_float(dt) ? EM_F32 : dt;
    int r = em_tensor_ndim(q);
    if (r != 3 && r != 4) return em_set_error(EM_ERR_SHAPE, "Q must be 3-D or 4-D, it has rank %d", r);
    if (em_tensor_ndim(k) != r || em_tensor_ndim(v) != r) return em_set_error(EM_ERR_SHAPE, "Q, K and V must have one rank");
    if (!pk != !pv) return em_set_error(EM_ERR_INVALID, "past_key and past_value must be given together");
    if (nonpad && pk) return em_set_error(EM_ERR_INVALID, "nonpad_kv_seqlen cannot be combined with past_key");
    q = em_cast(q, cd), k = em_cast(k, cd), v = em_cast(v, cd);
    int64_t B = em_tensor_dim(q, 0);
    if (r == 3) {
        int64_t hq = onnx_attr_int(c, "q_num_heads", 0), hkv = onnx_attr_int(c, "kv_num_heads", 0);
        if (hq <= 0 || hkv <= 0) return em_set_error(EM_ERR_INVALID, "3-D inputs need q_num_heads and kv_num_heads");
        if (em_tensor_dim(q, 2) % hq || em_tensor_dim(k, 2) % hkv || em_tensor_dim(v, 2) % hkv)
            return em_set_error(EM_ERR_SHAPE, "hidden sizes are not divisible by the head counts");
        int64_t sq[4] = {B, em_tensor_dim(q, 1), hq, em_tensor_dim(q, 2) / hq};
        int64_t sk[4] = {B, em_tensor_dim(k, 1), hkv, em_tensor_dim(k, 2) / hkv};
        int64_t sv[4] = {B, em_tensor_dim(v, 1), hkv, em_tensor_dim(v, 2) / hkv};
        q = em_transpose(em_reshape(q, sq, 4), 1, 2);
        k = em_transpose(em_reshape(k, sk, 4), 1, 2);
        v = em_transpose(em_reshape(v, sv, 4), 1, 2);
    }
    if (!q || !k || !v) return em_last_status();
    int64_t D = em_tensor_dim(q, 3);
    if (em_tensor_dim(k, 3) != D || em_tensor_dim(k, 0) != B || em_tensor_dim(v, 0) != B || em_tensor_dim(v, 1) != em_tensor_dim(k, 1) ||
        em_tensor_dim(v, 2) != em_tensor_dim(k, 2)) {
        char a[96], b[96], d[96];
        return em_set_error(EM_ERR_SHAPE, "Q %s, K %s and V %s (as [B, H, S, D]) do not agree", em_shape_str(em_tensor_shape(q), 4, a, sizeof a),
                            em_shape_str(em_tensor_shape(k), 4, b, sizeof b), em_shape_str(em_tensor_shape(v), 4, d, sizeof d));
    }
    double scale = onnx_has_attr(c, "scale") ? onnx_attr_float(c, "scale", 1.0) : 1.0 / sqrt((double)D);
    if (pk) {
        if (em_tensor_ndim(pk) != 4 || em_tensor_ndim(pv) != 4) return em_set_error(EM_ERR_SHAPE, "past_key and past_value must be 4-D");
        em_tensor *ks[2] = {em_cast(pk, cd), k}, *vs[2] = {em_cast(pv, cd), v};
        k = em_cat(ks, 2, 2);
        v = em_cat(vs, 2, 2);
        if (!k || !v) return em_last_status();
    }
    int64_t Sq = em_tensor_dim(q, 2), Skv = em_tensor_dim(k, 2);
    int64_t past = pk ? em_tensor_dim(pk, 2) : 0;
    /* the bias: [Sq, Skv] or broadcastable to [B, H, Sq, Skv] */
    em_tensor *bias = em_zeros((int64_t[]){Sq, Skv}, 2, cd);
    if (mask) {
        em_tensor *mb = em_tensor_dtype(mask) == EM_BOOL ? allowed_bias(mask, cd) : em_cast(mask, cd);
        int64_t last = em_tensor_dim(mask, -1);
        if (em_tensor_ndim(mask) < 1 || last > Skv) return em_set_error(EM_ERR_SHAPE, "attn_mask's last dim (%lld) exceeds the total sequence length %lld", (long long)last, (long long)Skv);
        if (last < Skv) mb = em_pad(mb, (int64_t[]){0, Skv - last}, 2, -INFINITY);
        bias = em_add(bias, mb);
    }
    em_tensor *off = NULL; /* per-batch offsets [B, 1, 1] (i64) or NULL: the scalar `past` */
    if (nonpad) {
        if (em_tensor_numel(nonpad) != B) return em_set_error(EM_ERR_SHAPE, "nonpad_kv_seqlen must have batch_size values");
        em_tensor *np64 = em_reshape(em_cast(nonpad, EM_I64), (int64_t[]){B, 1, 1}, 3);
        off = em_sub_scalar(np64, (double)Sq);
        em_tensor *pad_ok = em_lt(em_reshape(em_arange(0, (double)Skv, 1, EM_I64), (int64_t[]){1, 1, Skv}, 3), np64);
        bias = em_add(bias, em_reshape(allowed_bias(pad_ok, cd), (int64_t[]){B, 1, 1, Skv}, 4));
    }
    em_tensor *ii = em_reshape(em_arange(0, (double)Sq, 1, EM_I64), (int64_t[]){Sq, 1}, 2);
    em_tensor *jj = em_reshape(em_arange(0, (double)Skv, 1, EM_I64), (int64_t[]){1, Skv}, 2);
    em_tensor *diff = off ? em_sub(em_add(ii, off), jj) : em_sub(em_add_scalar(ii, (double)past), jj); /* i + offset - j */
    em_tensor *allowed = NULL;
    if (onnx_attr_int(c, "is_causal", 0)) allowed = em_ge_scalar(diff, 0);
    int64_t lw = onnx_attr_int(c, "left_window_size", -1), rw = onnx_attr_int(c, "right_window_size", -1);
    if (lw >= 0) {
        em_tensor *a = em_le_scalar(diff, (double)lw);
        allowed = allowed ? em_logical_and(allowed, a) : a;
    }
    if (rw >= 0) {
        em_tensor *a = em_ge_scalar(diff, -(double)rw);
        allowed = allowed ? em_logical_and(allowed, a) : a;
    }
    if (allowed) {
        em_tensor *ab = allowed_bias(allowed, cd);
        if (off) ab = em_unsqueeze(ab, 1); /* [B, 1, Sq, Skv] */
        bias = em_add(bias, ab);
    }
    if (!bias) return em_last_status();
    /* GQA */
    int64_t hq = em_tensor_dim(q, 1), hk = em_tensor_dim(k, 1);
    em_tensor *present_k = k, *present_v = v;
    if (hq != hk) {
        if (hk <= 0 || hq % hk || em_tensor_dim(v, 1) != hk)
            return em_set_error(EM_ERR_SHAPE, "%lld query heads cannot share %lld key/value heads", (long long)hq, (long long)hk);
        int64_t rep = hq / hk;
        int64_t ek[5] = {B, hk, rep, Skv, D}, ev[5] = {B, hk, rep, Skv, em_tensor_dim(v, 3)};
        k = em_reshape(em_expand(em_unsqueeze(k, 2), ek, 5), (int64_t[]){B, hq, Skv, D}, 4);
        v = em_reshape(em_expand(em_unsqueeze(v, 2), ev, 5), (int64_t[]){B, hq, Skv, em_tensor_dim(v, 3)}, 4);
    }
    /* 16-bit inputs: f32 math rounded to their dtype after each step of
     * the reference (which computes in the dtype; matmuls accumulate in f32) */
    bool low = cd != dt;
    double ss = sqrt(scale);
    if (low) {
        em_tensor *sst = em_cast(em_scalar(ss, EM_F64), dt);
        if (!sst || em_item(sst, &ss) != EM_OK) return em_last_status();
    }
    em_tensor *qk = RND(em_matmul(RND(em_mul_scalar(q, ss)), em_transpose(RND(em_mul_scalar(k, ss)), 2, 3)));
    double softcap = onnx_attr_float(c, "softcap", 0.0);
    if (softcap > 0) qk = RND(em_mul_scalar(RND(em_tanh(RND(em_div_scalar(qk, softcap)))), softcap));
    em_tensor *qkb = RND(em_add(qk, RND(bias)));
    int64_t mode = onnx_attr_int(c, "qk_matmul_output_mode", 0);
    em_tensor *qk_out = mode == 2 ? qkb : qk;
    int64_t sp = onnx_attr_int(c, "softmax_precision", 0);
    em_tensor *sm_in = qkb;
    if (sp == ONNX_DOUBLE) sm_in = em_cast(qkb, EM_F64);
    else if (sp && sp != ONNX_FLOAT && sp != ONNX_FLOAT16 && sp != ONNX_BFLOAT16)
        return onnx_unsupported(c, "softmax_precision %lld", (long long)sp);
    int last = -1;
    em_tensor *p;
    if (low && !sp) p = softmax16(sm_in, 3, dt, true);
    else p = em_softmax(sm_in, -1);
    em_tensor *masked = em_logical_or(em_eq_scalar(em_max(bias, &last, 1, true), -INFINITY), em_eq_scalar(em_max(sm_in, &last, 1, true), -INFINITY));
    p = em_cast(em_where(masked, em_scalar(0, em_tensor_dtype(p)), p), cd);
    if (mode == 3) qk_out = p;
    else if (mode < 0 || mode > 3) return em_set_error(EM_ERR_INVALID, "qk_matmul_output_mode %lld", (long long)mode);
    em_tensor *y = em_matmul(RND(p), v);
    if (r == 3 && y) y = em_reshape(em_contiguous(em_transpose(y, 1, 2)), (int64_t[]){B, Sq, -1}, 3);
    em_status st = onnx_out(c, 0, to_dtype(y, dt, 0), 0);
    if (st == EM_OK && c->nout > 1) st = onnx_out(c, 1, to_dtype(present_k, dt, 0), 0);
    if (st == EM_OK && c->nout > 2) st = onnx_out(c, 2, to_dtype(present_v, dt, 0), 0);
    if (st == EM_OK && c->nout > 3) st = onnx_out(c, 3, to_dtype(qk_out, dt, 0), 0);
    return st;
#undef RND
}

/* ---- RotaryEmbedding ------------------------------------------------------------------------- */

/* RotaryEmbedding (23): input [B, H, S, D] or [B, S, H * D] (num_heads);
 * cos / sin caches [max_pos, r/2] indexed by position_ids [B, S], or [B, S,
 * r/2] without them; the first r = rotary_embedding_dim (0: D) features
 * rotated as halves (x1 = [:r/2], x2 = [r/2:]) or interleaved pairs (x1 =
 * [0::2], x2 = [1::2]): real = cos x1 - sin x2, imag = sin x1 + cos x2. */
static em_status op_rotary(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *cs = onnx_in_req(c, 1), *sn = onnx_in_req(c, 2), *pos = onnx_in(c, 3);
    if (!x || !cs || !sn) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "the input must be a float tensor");
    em_dtype cd = is_low_float(dt) ? EM_F32 : dt;
    int rank = em_tensor_ndim(x);
    int64_t B = em_tensor_dim(x, 0), S, H, D;
    em_tensor *xs; /* [B, S, H, D] */
    if (rank == 4) {
        xs = em_transpose(x, 1, 2);
        S = em_tensor_dim(x, 2), H = em_tensor_dim(x, 1), D = em_tensor_dim(x, 3);
    } else if (rank == 3) {
        H = onnx_attr_int(c, "num_heads", 0);
        S = em_tensor_dim(x, 1);
        if (H <= 0 || em_tensor_dim(x, 2) % H) return em_set_error(EM_ERR_INVALID, "3-D input needs num_heads dividing its hidden size");
        D = em_tensor_dim(x, 2) / H;
        xs = em_reshape(x, (int64_t[]){B, S, H, D}, 4);
    } else return em_set_error(EM_ERR_SHAPE, "the input must be 3-D or 4-D, it has rank %d", rank);
    xs = em_cast(xs, cd);
    int64_t r = onnx_attr_int(c, "rotary_embedding_dim", 0);
    if (r == 0) r = D;
    if (r < 0 || r > D || r % 2) return em_set_error(EM_ERR_INVALID, "rotary_embedding_dim %lld for head size %lld", (long long)r, (long long)D);
    int64_t h = r / 2;
    if (pos) {
        int64_t n = em_tensor_numel(pos);
        if (em_tensor_ndim(cs) != 2 || em_tensor_ndim(sn) != 2) return em_set_error(EM_ERR_SHAPE, "with position_ids the caches must be 2-D");
        em_tensor *flat = em_reshape(em_cast(pos, EM_I64), &n, 1);
        int64_t maxp = em_tensor_dim(cs, 0);
        em_tensor *oob = em_any(em_logical_or(em_lt_scalar(flat, 0), em_ge_scalar(flat, (double)maxp)), NULL, 0, false);
        double bad = 0;
        if (!oob || em_item(oob, &bad) != EM_OK) return em_last_status();
        if (bad != 0) return em_set_error(EM_ERR_INVALID, "a position id is outside the caches' [0, %lld)", (long long)maxp);
        if (em_tensor_dim(sn, 0) != maxp) return em_set_error(EM_ERR_SHAPE, "cos_cache and sin_cache differ in length");
        cs = em_reshape(em_index_select(cs, 0, flat), (int64_t[]){B, S, em_tensor_dim(cs, 1)}, 3);
        sn = em_reshape(em_index_select(sn, 0, flat), (int64_t[]){B, S, em_tensor_dim(sn, 1)}, 3);
    }
    if (!cs || !sn) return em_last_status();
    if (em_tensor_ndim(cs) != 3 || em_tensor_dim(cs, -1) != h || em_tensor_ndim(sn) != 3 || em_tensor_dim(sn, -1) != h)
        return em_set_error(EM_ERR_SHAPE, "the caches' last dim must be rotary_embedding_dim / 2 = %lld", (long long)h);
    cs = em_unsqueeze(em_cast(cs, cd), 2), sn = em_unsqueeze(em_cast(sn, cd), 2); /* [B, S, 1, r/2] */
    bool inter = onnx_attr_int(c, "interleaved", 0) != 0;
    em_tensor *x1 = inter ? em_slice(xs, 3, 0, r, 2) : em_narrow(xs, 3, 0, h);
    em_tensor *x2 = inter ? em_slice(xs, 3, 1, r, 2) : em_narrow(xs, 3, h, h);
    em_tensor *re = em_sub(em_mul(cs, x1), em_mul(sn, x2));
    em_tensor *im = em_add(em_mul(sn, x1), em_mul(cs, x2));
    em_tensor *rot;
    if (inter) rot = em_reshape(em_stack((em_tensor *[]){re, im}, 2, 4), (int64_t[]){B, S, H, r}, 4);
    else rot = em_cat((em_tensor *[]){re, im}, 2, 3);
    em_tensor *y = r < D ? em_cat((em_tensor *[]){rot, em_narrow(xs, 3, r, D - r)}, 2, 3) : rot;
    if (!y) return em_last_status();
    y = rank == 4 ? em_contiguous(em_transpose(y, 1, 2)) : em_reshape(em_contiguous(y), em_tensor_shape(x), 3);
    return onnx_out(c, 0, to_dtype(y, dt, 0), 0);
}

/* ---- Einsum ------------------------------------------------------------------------------- */

/* Labels: 'A'-'Z' 0-25, 'a'-'z' 26-51 (ASCII order, the implicit output's
 * order), ellipsis dims 52.. (right-aligned across operands). */
#define EIN_MAXL (52 + EM_MAX_DIMS)

typedef struct ein_op {
    em_tensor *t;
    int n;                  /* rank = label count */
    int lab[EM_MAX_DIMS];
} ein_op;

static int ein_label(char ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return 26 + ch - 'a';
    return -1;
}

/* Parses one term into labels; *ell = the position of "..." (-1 none) and
 * the count of letters in *nl. */
static em_status ein_term(const char *s, size_t len, int *lab, int *nl, int *ell)
{
    *nl = 0, *ell = -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (*ell >= 0 || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.')
                return em_set_error(EM_ERR_INVALID, "bad ellipsis in the equation");
            *ell = *nl;
            i += 2;
            continue;
        }
        int l = ein_label(s[i]);
        if (l < 0) return em_set_error(EM_ERR_INVALID, "bad character '%c' in the equation", s[i]);
        if (*nl >= EM_MAX_DIMS) return em_set_error(EM_ERR_INVALID, "too many labels in a term");
        lab[(*nl)++] = l;
    }
    return EM_OK;
}

/* Position of label l in o (-1 when absent). */
static int ein_pos(const ein_op *o, int l)
{
    for (int i = 0; i < o->n; i++)
        if (o->lab[i] == l) return i;
    return -1;
}

/* Sums dims of o whose label is not in need[] (removing them). */
static void ein_sum_unneeded(ein_op *o, const bool *need)
{
    int dims[EM_MAX_DIMS], nd = 0, nl[EM_MAX_DIMS], n = 0;
    for (int i = 0; i < o->n; i++) {
        if (need[o->lab[i]]) nl[n++] = o->lab[i];
        else dims[nd++] = i;
    }
    if (!nd) return;
    o->t = em_sum(o->t, dims, nd, false);
    o->n = n;
    memcpy(o->lab, nl, sizeof(int) * (size_t)n);
}

/* Einsum (12): numpy's einsum for any number of operands: repeated labels
 * of an operand take its diagonal (a mask with eye and a sum), labels not
 * needed later are summed, operands are contracted left to right with
 * batched matmuls (batch dims broadcast), then permuted to the output. */
static em_status op_einsum(onnx_ctx *c)
{
    const char *eq0 = onnx_attr_string(c, "equation", NULL);
    if (!eq0) return em_set_error(EM_ERR_INVALID, "Einsum needs an equation");
    char eq[256];
    size_t n = 0;
    for (const char *p = eq0; *p && n < sizeof eq - 1; p++)
        if (*p != ' ') eq[n++] = *p;
    eq[n] = 0;
    char *arrow = strstr(eq, "->");
    size_t lhs_len = arrow ? (size_t)(arrow - eq) : n;
    int nops = c->nin;
    if (nops < 1 || nops > 16) return onnx_unsupported(c, "Einsum with %d inputs", nops);
    ein_op ops[16];
    int max_ell = 0;
    int cnt[EIN_MAXL] = {0};
    size_t start = 0;
    em_dtype dt = EM_F32;
    for (int k = 0; k < nops; k++) {
        size_t end = start;
        while (end < lhs_len && eq[end] != ',') end++;
        if (k < nops - 1 ? end >= lhs_len : end != lhs_len) return em_set_error(EM_ERR_INVALID, "the equation has not %d terms", nops);
        em_tensor *t = onnx_in_req(c, k);
        if (!t) return em_last_status();
        if (k == 0) dt = em_tensor_dtype(t);
        else if (em_tensor_dtype(t) != dt) return em_set_error(EM_ERR_DTYPE, "Einsum inputs of different dtypes");
        int lab[EM_MAX_DIMS], nl, ell;
        if (ein_term(eq + start, end - start, lab, &nl, &ell) != EM_OK) return em_last_status();
        int r = em_tensor_ndim(t), ne = r - nl;
        if (ne < 0 || (ell < 0 && ne != 0)) return em_set_error(EM_ERR_SHAPE, "term %d has %d labels for rank %d", k, nl, r);
        if (ne > max_ell) max_ell = ne;
        ops[k].t = is_low_float(dt) ? em_cast(t, EM_F32) : t;
        ops[k].n = r;
        int j = 0;
        for (int i = 0; i < nl; i++) {
            if (i == ell)
                for (int e = 0; e < ne; e++) ops[k].lab[j++] = -(ne - e); /* fixed below */
            ops[k].lab[j++] = lab[i];
        }
        if (ell == nl)
            for (int e = 0; e < ne; e++) ops[k].lab[j++] = -(ne - e);
        start = end + 1;
    }
    /* ellipsis dims: -m (m-th from the end) -> label 52 + max_ell - m */
    for (int k = 0; k < nops; k++)
        for (int i = 0; i < ops[k].n; i++) {
            if (ops[k].lab[i] < 0) ops[k].lab[i] = 52 + max_ell + ops[k].lab[i];
            cnt[ops[k].lab[i]]++;
        }
    int out[EIN_MAXL], no = 0;
    if (arrow) {
        int lab[EM_MAX_DIMS], nl, ell;
        if (ein_term(arrow + 2, strlen(arrow + 2), lab, &nl, &ell) != EM_OK) return em_last_status();
        for (int i = 0; i <= nl; i++) {
            if (i == ell)
                for (int e = 0; e < max_ell; e++) out[no++] = 52 + e;
            if (i < nl) out[no++] = lab[i];
        }
    } else {
        for (int e = 0; e < max_ell; e++) out[no++] = 52 + e;
        for (int l = 0; l < 52; l++)
            if (cnt[l] == 1) out[no++] = l;
    }
    if (no > EM_MAX_DIMS) return onnx_unsupported(c, "an output of rank %d", no);
    bool in_out[EIN_MAXL] = {false};
    for (int i = 0; i < no; i++) {
        if (in_out[out[i]] || !cnt[out[i]]) return em_set_error(EM_ERR_INVALID, "output label repeated or absent from the inputs");
        in_out[out[i]] = true;
    }
    /* diagonals */
    for (int k = 0; k < nops; k++) {
        ein_op *o = &ops[k];
        for (int p = 0; p < o->n; p++)
            for (int q = p + 1; q < o->n; q++) {
                if (o->lab[p] != o->lab[q]) continue;
                int64_t sz = em_tensor_dim(o->t, p);
                if (em_tensor_dim(o->t, q) != sz) return em_set_error(EM_ERR_SHAPE, "a repeated label's dims differ");
                int64_t es[EM_MAX_DIMS];
                for (int d = 0; d < o->n; d++) es[d] = d == p || d == q ? sz : 1;
                em_tensor *eye = em_reshape(em_eye(sz, sz, em_tensor_dtype(o->t)), es, o->n);
                o->t = em_sum(em_mul(o->t, eye), &q, 1, false);
                if (!o->t) return em_last_status();
                for (int d = q; d + 1 < o->n; d++) o->lab[d] = o->lab[d + 1];
                o->n--;
                q--;
            }
    }
    /* contract left to right */
    ein_op acc = ops[0];
    for (int k = 0; k < nops; k++) {
        bool need[EIN_MAXL];
        for (int l = 0; l < EIN_MAXL; l++) need[l] = in_out[l];
        for (int j = k + 1; j < nops; j++)
            for (int i = 0; i < ops[j].n; i++) need[ops[j].lab[i]] = true;
        if (k == 0) {
            ein_sum_unneeded(&acc, need);
            continue;
        }
        ein_op b = ops[k];
        bool need_a[EIN_MAXL], need_b[EIN_MAXL], in_a[EIN_MAXL] = {false}, in_b[EIN_MAXL] = {false};
        for (int i = 0; i < acc.n; i++) in_a[acc.lab[i]] = true;
        for (int i = 0; i < b.n; i++) in_b[b.lab[i]] = true;
        for (int l = 0; l < EIN_MAXL; l++) need_a[l] = need[l] || in_b[l], need_b[l] = need[l] || in_a[l];
        ein_sum_unneeded(&acc, need_a);
        ein_sum_unneeded(&b, need_b);
        if (!acc.t || !b.t) return em_last_status();
        memset(in_a, 0, sizeof in_a), memset(in_b, 0, sizeof in_b);
        for (int i = 0; i < acc.n; i++) in_a[acc.lab[i]] = true;
        for (int i = 0; i < b.n; i++) in_b[b.lab[i]] = true;
        int bat[EM_MAX_DIMS], nb = 0, con[EM_MAX_DIMS], nc = 0, ao[EM_MAX_DIMS], na = 0, bo[EM_MAX_DIMS], nbo = 0;
        for (int i = 0; i < acc.n; i++) {
            int l = acc.lab[i];
            if (in_b[l]) {
                if (need[l]) bat[nb++] = l;
                else con[nc++] = l;
            } else ao[na++] = l;
        }
        for (int i = 0; i < b.n; i++)
            if (!in_a[b.lab[i]]) bo[nbo++] = b.lab[i];
        if (nb + na + nbo > EM_MAX_DIMS || nb + 2 > EM_MAX_DIMS) return onnx_unsupported(c, "an intermediate of rank > %d", EM_MAX_DIMS);
        /* positions */
        int pa[EM_MAX_DIMS], pb[EM_MAX_DIMS], np_ = 0;
        int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS], so[EM_MAX_DIMS];
        int nsa = 0, nsb = 0, nso = 0;
        int64_t M = 1, K = 1, N = 1;
        for (int i = 0; i < nb; i++) {
            int ia = ein_pos(&acc, bat[i]), ib = ein_pos(&b, bat[i]);
            int64_t da = em_tensor_dim(acc.t, ia), db = em_tensor_dim(b.t, ib);
            if (da != db && da != 1 && db != 1) return em_set_error(EM_ERR_SHAPE, "label dims %lld and %lld do not broadcast", (long long)da, (long long)db);
            pa[np_] = ia, pb[np_] = ib, np_++;
            sa[nsa++] = da, sb[nsb++] = db, so[nso++] = da > db ? da : db;
        }
        int npa = np_, npb = np_;
        for (int i = 0; i < na; i++) {
            pa[npa++] = ein_pos(&acc, ao[i]);
            M *= em_tensor_dim(acc.t, pa[npa - 1]);
            so[nso++] = em_tensor_dim(acc.t, pa[npa - 1]);
        }
        for (int i = 0; i < nc; i++) {
            int ia = ein_pos(&acc, con[i]), ib = ein_pos(&b, con[i]);
            int64_t da = em_tensor_dim(acc.t, ia), db = em_tensor_dim(b.t, ib);
            if (da != db && da != 1 && db != 1) return em_set_error(EM_ERR_SHAPE, "a contracted label has dims %lld and %lld", (long long)da, (long long)db);
            if (da != db) return onnx_unsupported(c, "a contracted label broadcast from size 1");
            pa[npa++] = ia;
            pb[npb++] = ib;
            K *= em_tensor_dim(acc.t, ia);
        }
        for (int i = 0; i < nbo; i++) {
            pb[npb++] = ein_pos(&b, bo[i]);
            N *= em_tensor_dim(b.t, pb[npb - 1]);
            so[nso++] = em_tensor_dim(b.t, pb[npb - 1]);
        }
        sa[nsa++] = M, sa[nsa++] = K;
        sb[nsb++] = K, sb[nsb++] = N;
        em_tensor *ta = em_reshape(em_contiguous(em_permute(acc.t, pa, npa)), sa, nsa);
        em_tensor *tb = em_reshape(em_contiguous(em_permute(b.t, pb, npb)), sb, nsb);
        acc.t = em_reshape(em_matmul(ta, tb), so, nso);
        if (!acc.t) return em_last_status();
        acc.n = 0;
        for (int i = 0; i < nb; i++) acc.lab[acc.n++] = bat[i];
        for (int i = 0; i < na; i++) acc.lab[acc.n++] = ao[i];
        for (int i = 0; i < nbo; i++) acc.lab[acc.n++] = bo[i];
    }
    if (!acc.t) return em_last_status();
    int perm[EM_MAX_DIMS];
    for (int i = 0; i < no; i++) {
        perm[i] = -1;
        for (int j = 0; j < acc.n; j++)
            if (acc.lab[j] == out[i]) perm[i] = j;
        if (perm[i] < 0) return em_set_error(EM_ERR_INVALID, "output label not found");
    }
    em_tensor *y = no ? em_contiguous(em_permute(acc.t, perm, no)) : em_reshape(acc.t, NULL, 0);
    return onnx_out(c, 0, to_dtype(y, dt, onnx_in_type(c, 0)), onnx_in_type(c, 0));
}

/* ---- Det ------------------------------------------------------------------------------------ */

/* Determinant of the [..., n, n] tensor a by cofactor expansion along the
 * first row (n! terms: small n only). */
static em_tensor *det_rec(em_tensor *a, int64_t n)
{
    if (n == 1) return em_squeeze(em_squeeze(a, -1), -1);
    if (n == 2) {
        em_tensor *r0 = em_narrow(a, -2, 0, 1), *r1 = em_narrow(a, -2, 1, 1);
        em_tensor *d = em_sub(em_mul(em_narrow(r0, -1, 0, 1), em_narrow(r1, -1, 1, 1)), em_mul(em_narrow(r0, -1, 1, 1), em_narrow(r1, -1, 0, 1)));
        return em_squeeze(em_squeeze(d, -1), -1);
    }
    em_tensor *rest = em_narrow(a, -2, 1, n - 1), *acc = NULL;
    for (int64_t j = 0; j < n; j++) {
        em_tensor *parts[2];
        int np_ = 0;
        if (j > 0) parts[np_++] = em_narrow(rest, -1, 0, j);
        if (j < n - 1) parts[np_++] = em_narrow(rest, -1, j + 1, n - 1 - j);
        em_tensor *minor = np_ == 1 ? parts[0] : em_cat(parts, 2, -1);
        em_tensor *term = em_mul(em_squeeze(em_squeeze(em_narrow(em_narrow(a, -2, 0, 1), -1, j, 1), -1), -1), det_rec(minor, n - 1));
        if (!term) return NULL;
        acc = !acc ? term : (j % 2 ? em_sub(acc, term) : em_add(acc, term));
    }
    return acc;
}

/* Det (11, 22): X [..., M, M] -> [...]; computed in double by cofactor
 * expansion for M <= 5 (Ember has no LU factorisation for larger M). */
static em_status op_det(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "X must be a float tensor");
    int r = em_tensor_ndim(x);
    if (r < 2 || em_tensor_dim(x, -1) != em_tensor_dim(x, -2)) return em_set_error(EM_ERR_SHAPE, "X must be [..., M, M]");
    int64_t n = em_tensor_dim(x, -1);
    if (n == 0) {
        int64_t s[EM_MAX_DIMS];
        for (int d = 0; d < r - 2; d++) s[d] = em_tensor_dim(x, d);
        return onnx_out(c, 0, em_ones(s, r - 2, dt), 0);
    }
    if (n > 5) return onnx_unsupported(c, "Det of %lld x %lld matrices (needs an LU factorisation Ember lacks; cofactor expansion up to 5 x 5)", (long long)n, (long long)n);
    return onnx_out(c, 0, to_dtype(det_rec(em_cast(x, EM_F64), n), dt, 0), 0);
}

/* ---- LinearAttention ------------------------------------------------------------------------- */

/* (B, T, H * D) -> (B, H, T, D) in f32; NULL + error when H does not divide. */
static em_tensor *unpack_heads(em_tensor *x, int64_t h, const char *name)
{
    if (em_tensor_ndim(x) != 3 || em_tensor_dim(x, 2) % h) {
        em_set_error(EM_ERR_SHAPE, "%s must be [B, T, H * D] with H = %lld", name, (long long)h);
        return NULL;
    }
    int64_t s[4] = {em_tensor_dim(x, 0), em_tensor_dim(x, 1), h, em_tensor_dim(x, 2) / h};
    return em_transpose(em_reshape(em_cast(x, EM_F32), s, 4), 1, 2);
}

/* LinearAttention (27): the recurrent form, one time step after another:
 * state [B, Hkv, dk, dv] (past_state or zeros); per step t, gated rules
 * decay the state by exp(decay_t) (per head or per key feature), delta
 * rules replace v_t by beta_t (v_t - k_t state); state += k_t^T v_t; the
 * output is scale * q_t state (each KV state shared by q_num_heads /
 * kv_num_heads query heads). update_rule linear / gated / delta /
 * gated_delta (default); computed in f32 (chunk_size is a tuning hint). */
static em_status op_linear_attention(onnx_ctx *c)
{
    em_tensor *q = onnx_in_req(c, 0), *k = onnx_in_req(c, 1), *v = onnx_in_req(c, 2);
    if (!q || !k || !v) return em_last_status();
    em_tensor *past = onnx_in(c, 3), *decay = onnx_in(c, 4), *beta = onnx_in(c, 5);
    em_dtype dt = em_tensor_dtype(q);
    if (!em_dtype_is_float(dt)) return em_set_error(EM_ERR_DTYPE, "query must be a float tensor");
    const char *rule = onnx_attr_string(c, "update_rule", "gated_delta");
    bool gating, delta;
    if (!strcmp(rule, "linear")) gating = false, delta = false;
    else if (!strcmp(rule, "gated")) gating = true, delta = false;
    else if (!strcmp(rule, "delta")) gating = false, delta = true;
    else if (!strcmp(rule, "gated_delta")) gating = true, delta = true;
    else return em_set_error(EM_ERR_INVALID, "unknown update_rule '%s'", rule);
    int64_t hq = onnx_attr_int(c, "q_num_heads", 0), hkv = onnx_attr_int(c, "kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0 || hq % hkv) return em_set_error(EM_ERR_INVALID, "q_num_heads (%lld) must be a positive multiple of kv_num_heads (%lld)", (long long)hq, (long long)hkv);
    if (gating != (decay != NULL)) return em_set_error(EM_ERR_INVALID, "update_rule '%s' %s the decay input", rule, gating ? "needs" : "forbids");
    if (delta != (beta != NULL)) return em_set_error(EM_ERR_INVALID, "update_rule '%s' %s the beta input", rule, delta ? "needs" : "forbids");
    em_tensor *q4 = unpack_heads(q, hq, "query"), *k4 = unpack_heads(k, hkv, "key"), *v4 = unpack_heads(v, hkv, "value");
    if (!q4 || !k4 || !v4) return em_last_status();
    int64_t B = em_tensor_dim(q4, 0), T = em_tensor_dim(q4, 2), dk = em_tensor_dim(q4, 3), dv = em_tensor_dim(v4, 3);
    if (em_tensor_dim(k4, 3) != dk || em_tensor_dim(k4, 2) != T || em_tensor_dim(v4, 2) != T || em_tensor_dim(k4, 0) != B || em_tensor_dim(v4, 0) != B)
        return em_set_error(EM_ERR_SHAPE, "query, key and value shapes do not agree");
    em_tensor *decay4 = NULL, *beta4 = NULL;
    if (decay) {
        if (em_tensor_ndim(decay) != 3) return em_set_error(EM_ERR_SHAPE, "decay must be rank 3");
        int64_t dl = em_tensor_dim(decay, 2);
        if (dl == hkv) decay4 = em_transpose(em_reshape(em_cast(decay, EM_F32), (int64_t[]){B, T, hkv, 1}, 4), 1, 2);
        else if (dl == hkv * dk) decay4 = unpack_heads(decay, hkv, "decay");
        else return em_set_error(EM_ERR_SHAPE, "decay's last dim %lld must be kv_num_heads or kv_num_heads * d_k", (long long)dl);
        decay4 = em_exp(decay4);
    }
    if (beta) {
        if (em_tensor_ndim(beta) != 3) return em_set_error(EM_ERR_SHAPE, "beta must be rank 3");
        int64_t bl = em_tensor_dim(beta, 2);
        if (bl != hkv && bl != 1) return em_set_error(EM_ERR_SHAPE, "beta's last dim %lld must be kv_num_heads or 1", (long long)bl);
        beta4 = em_transpose(em_reshape(em_cast(beta, EM_F32), (int64_t[]){B, T, bl, 1}, 4), 1, 2);
    }
    int64_t ss[4] = {B, hkv, dk, dv};
    em_tensor *state;
    em_dtype sdt = dt;
    if (past) {
        if (em_tensor_ndim(past) != 4 || em_tensor_dim(past, 0) != B || em_tensor_dim(past, 1) != hkv || em_tensor_dim(past, 2) != dk || em_tensor_dim(past, 3) != dv)
            return em_set_error(EM_ERR_SHAPE, "past_state must be [%lld, %lld, %lld, %lld]", (long long)B, (long long)hkv, (long long)dk, (long long)dv);
        sdt = em_tensor_dtype(past);
        state = em_cast(past, EM_F32);
    } else state = em_zeros(ss, 4, EM_F32);
    double scale = onnx_attr_float(c, "scale", 0.0);
    if (scale == 0.0) scale = 1.0 / sqrt((double)dk);
    int64_t rep = hq / hkv;
    em_tensor **outs = calloc((size_t)(T > 0 ? T : 1), sizeof *outs);
    if (!outs) return em_set_error(EM_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < T && state; i++) {
        em_tensor *qt = em_narrow(q4, 2, i, 1), *kt = em_narrow(k4, 2, i, 1), *vt = em_narrow(v4, 2, i, 1);
        if (gating) state = em_mul(state, em_transpose(em_narrow(decay4, 2, i, 1), 2, 3));
        if (delta) vt = em_mul(em_narrow(beta4, 2, i, 1), em_sub(vt, em_matmul(kt, state)));
        state = em_add(state, em_matmul(em_transpose(kt, 2, 3), vt));
        em_tensor *sr = rep == 1 ? state : em_reshape(em_expand(em_unsqueeze(state, 2), (int64_t[]){B, hkv, rep, dk, dv}, 5), (int64_t[]){B, hq, dk, dv}, 4);
        outs[i] = em_mul_scalar(em_matmul(qt, sr), scale);
    }
    em_tensor *o = T > 0 && state ? em_cat(outs, (int)T, 2) : NULL;
    free(outs);
    if (T == 0) o = em_zeros((int64_t[]){B, hq, 0, dv}, 4, EM_F32);
    if (!o || !state) return em_last_status();
    em_tensor *y = em_reshape(em_contiguous(em_transpose(o, 1, 2)), (int64_t[]){B, T, hq * dv}, 3);
    em_status st = onnx_out(c, 0, to_dtype(y, dt, 0), 0);
    if (st == EM_OK && c->nout > 1) st = onnx_out(c, 1, to_dtype(state, sdt, 0), past ? onnx_in_type(c, 3) : onnx_in_type(c, 0));
    return st;
}

const onnx_op onnx_ops_nn[] = {
    {"LinearAttention", 27, op_linear_attention},
    {"Det", 11, op_det},
    {"Einsum", 12, op_einsum},
    {"RotaryEmbedding", 23, op_rotary},
    {"Attention", 23, op_attention},
    {"ReduceSum", 1, op_reduce_sum},
    {"ReduceMean", 1, op_reduce_mean},
    {"ReduceMax", 1, op_reduce_max},
    {"ReduceMin", 1, op_reduce_min},
    {"ReduceProd", 1, op_reduce_prod},
    {"ReduceL1", 1, op_reduce_l1},
    {"ReduceL2", 1, op_reduce_l2},
    {"ReduceLogSum", 1, op_reduce_log_sum},
    {"ReduceLogSumExp", 1, op_reduce_log_sum_exp},
    {"ReduceSumSquare", 1, op_reduce_sum_square},
    {"ArgMax", 1, op_argmax},
    {"ArgMin", 1, op_argmin},
    {"Softmax", 1, op_softmax},
    {"LogSoftmax", 1, op_log_softmax},
    {"Hardmax", 1, op_hardmax},
    {"LayerNormalization", 17, op_layer_norm},
    {"RMSNormalization", 23, op_rms_norm},
    {"LpNormalization", 1, op_lp_norm},
    {"MeanVarianceNormalization", 9, op_mvn},
    {"NegativeLogLikelihoodLoss", 12, op_nll_loss},
    {"SoftmaxCrossEntropyLoss", 12, op_sce_loss},
    {NULL, 0, NULL},
};
