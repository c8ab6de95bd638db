/* Loss functions, written with ordinary (differentiable) ops. Semantics and
 * defaults follow torch.nn.functional (ATen LossNLL.cpp, Loss.cpp). */
#include "nn/nn_internal.h"

#include <math.h>
#include <string.h>

em_cross_entropy_opts em_cross_entropy_opts_default(void)
{
    em_cross_entropy_opts o = {.reduction = EM_REDUCTION_MEAN, .ignore_index = -100, .label_smoothing = 0.0, .weight = NULL};
    return o;
}

em_bce_opts em_bce_opts_default(void)
{
    em_bce_opts o = {.reduction = EM_REDUCTION_MEAN, .weight = NULL, .pos_weight = NULL};
    return o;
}

static em_status check_reduction(em_reduction r, const char *fn)
{
    if (r != EM_REDUCTION_MEAN && r != EM_REDUCTION_SUM && r != EM_REDUCTION_NONE)
        return em__set_error(EM_ERR_INVALID, "%s: invalid reduction %d (MEAN, SUM or NONE)", fn, (int)r);
    return EM_OK;
}

static em_tensor *reduce(em_tensor *t, em_reduction r)
{
    switch (r) {
    case EM_REDUCTION_MEAN: return em_mean_all(t);
    case EM_REDUCTION_SUM: return em_sum_all(t);
    default: return t;
    }
}

/* ---- classification ----------------------------------------------------------- */

static em_status check_class_inputs(const em_tensor *x, const em_tensor *target, const em_cross_entropy_opts *o, const char *fn,
                                    const char *xname)
{
    char sx[160], st[160], sw[160];
    if (!x || !target) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !x ? xname : "target");
    if (!em_dtype_is_float(em_tensor_dtype(x)))
        return em__set_error(EM_ERR_DTYPE, "%s: %s must be float, got %s", fn, xname, em_dtype_name(em_tensor_dtype(x)));
    if (em_tensor_ndim(x) != 2)
        return em__set_error(EM_ERR_SHAPE, "%s: %s must be [N, C], got shape %s", fn, xname, NN_SHAPE(x, sx));
    if (em_tensor_dtype(target) != EM_I64)
        return em__set_error(EM_ERR_DTYPE, "%s: target must hold int64 class indices, got %s (shape %s)", fn,
                             em_dtype_name(em_tensor_dtype(target)), NN_SHAPE(target, st));
    if (em_tensor_ndim(target) != 1 || em_tensor_dim(target, 0) != em_tensor_dim(x, 0))
        return em__set_error(EM_ERR_SHAPE, "%s: target of shape %s does not match %s of shape %s (expected [%lld])", fn,
                             NN_SHAPE(target, st), xname, NN_SHAPE(x, sx), (long long)em_tensor_dim(x, 0));
    if (o->weight) {
        if (!em_dtype_is_float(em_tensor_dtype(o->weight)))
            return em__set_error(EM_ERR_DTYPE, "%s: class weight must be float, got %s", fn, em_dtype_name(em_tensor_dtype(o->weight)));
        if (em_tensor_ndim(o->weight) != 1 || em_tensor_dim(o->weight, 0) != em_tensor_dim(x, 1))
            return em__set_error(EM_ERR_SHAPE, "%s: class weight of shape %s does not match the %lld classes of %s %s", fn,
                                 NN_SHAPE(o->weight, sw), (long long)em_tensor_dim(x, 1), xname, NN_SHAPE(x, sx));
    }
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return em__set_error(EM_ERR_INVALID, "%s: label_smoothing must be in [0, 1], got %g", fn, o->label_smoothing);
    return check_reduction(o->reduction, fn);
}

/* NLL (+ label smoothing) on log-probabilities lp [N, C]. Inside a scope. */
static em_tensor *nll_core(const em_tensor *lp, const em_tensor *target, const em_cross_entropy_opts *o)
{
    em_dtype dt = em_tensor_dtype(lp);
    double ls = o->label_smoothing;
    int64_t C = em_tensor_dim(lp, 1);
    em_tensor *valid = em_ne_scalar(target, (double)o->ignore_index);             /* [N] bool */
    em_tensor *validf = em_cast(valid, dt);                                         /* [N] */
    em_tensor *safe = em_where(valid, target, em_scalar(0, EM_I64));                /* [N] i64, ignored -> 0 */
    em_tensor *picked = em_squeeze(em_gather(lp, 1, em_unsqueeze(safe, 1)), 1);     /* lp[i, y_i] */
    em_tensor *w = NULL;
    if (o->weight) w = em_tensor_dtype(o->weight) == dt ? (em_tensor *)o->weight : em_cast(o->weight, dt);
    em_tensor *wi = w ? em_mul(em_index_select(w, 0, safe), validf) : validf;       /* w[y_i], 0 if ignored */
    em_tensor *nll = em_neg(em_mul(picked, wi));                                    /* [N] */
    em_tensor *smooth = NULL;
    if (ls > 0) {
        int one = 1;
        em_tensor *s = em_sum(w ? em_mul(lp, w) : (em_tensor *)lp, &one, 1, false); /* sum_c w_c lp[i, c] */
        smooth = em_neg(em_mul(s, validf));
    }
    em_tensor *r;
    switch (o->reduction) {
    case EM_REDUCTION_NONE:
        r = smooth ? em_add(em_mul_scalar(nll, 1.0 - ls), em_mul_scalar(smooth, ls / (double)C)) : nll;
        break;
    case EM_REDUCTION_SUM:
        r = em_sum_all(nll);
        if (smooth) r = em_add(em_mul_scalar(r, 1.0 - ls), em_mul_scalar(em_sum_all(smooth), ls / (double)C));
        break;
    default: {
        /* PyTorch's weighted mean: divide by the summed weights of the
         * non-ignored targets (their count without class weights). */
        em_tensor *den = em_sum_all(wi);
        r = em_div(em_sum_all(nll), den);
        if (smooth) r = em_add(em_mul_scalar(r, 1.0 - ls), em_mul_scalar(em_div(em_sum_all(smooth), den), ls / (double)C));
        break;
    }
    }
    return r;
}

em_tensor *em_cross_entropy(const em_tensor *logits, const em_tensor *target, const em_cross_entropy_opts *opts)
{
    em_cross_entropy_opts o = opts ? *opts : em_cross_entropy_opts_default();
    if (check_class_inputs(logits, target, &o, "em_cross_entropy", "logits") != EM_OK) return NULL;
    em_scope_begin();
    em_tensor *lp = em_log_softmax(logits, 1);
    return nn_return(lp ? nll_core(lp, target, &o) : NULL);
}

em_tensor *em_nll_loss(const em_tensor *log_probs, const em_tensor *target, const em_cross_entropy_opts *opts)
{
    em_cross_entropy_opts o = opts ? *opts : em_cross_entropy_opts_default();
    if (o.label_smoothing != 0)
        return em__fail(EM_ERR_INVALID, "em_nll_loss: label_smoothing is a cross-entropy option (got %g); use em_cross_entropy",
                        o.label_smoothing);
    if (check_class_inputs(log_probs, target, &o, "em_nll_loss", "log_probs") != EM_OK) return NULL;
    em_scope_begin();
    return nn_return(nll_core(log_probs, target, &o));
}

/* ---- regression --------------------------------------------------------------------- */

static em_status check_pair(const em_tensor *x, const em_tensor *y, em_reduction r, const char *fn)
{
    char sx[160], sy[160];
    if (!x || !y) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !x ? "input" : "target");
    if (em_tensor_ndim(x) != em_tensor_ndim(y) ||
        memcmp(em_tensor_shape(x), em_tensor_shape(y), sizeof(int64_t) * (size_t)em_tensor_ndim(x)) != 0)
        return em__set_error(EM_ERR_SHAPE, "%s: input of shape %s and target of shape %s must have the same shape", fn, NN_SHAPE(x, sx),
                             NN_SHAPE(y, sy));
    if (!em_dtype_is_float(em_tensor_dtype(x)) || !em_dtype_is_float(em_tensor_dtype(y)))
        return em__set_error(EM_ERR_DTYPE, "%s: input and target must be float, got %s and %s", fn, em_dtype_name(em_tensor_dtype(x)),
                             em_dtype_name(em_tensor_dtype(y)));
    return check_reduction(r, fn);
}

/* 16-bit inputs of the element-wise losses compute in f32 (PyTorch's
 * mse / l1 / smooth_l1 / huber / BCE kernels compute in float, and they are
 * on torch.autocast's f32 list): in f16 the square of a difference above
 * 256 overflowed to inf, even inside an autocast region when both inputs
 * were f16. Returns the result's dtype: the inputs' promoted dtype (f32
 * inside autocast), to which the caller rounds once. Inside the scope. */
static em_dtype pair_widen(const em_tensor **x, const em_tensor **y)
{
    em_dtype odt = em__promote(em_tensor_dtype(*x), em_tensor_dtype(*y));
    if (em_autocast_dtype() != EM_F32 && em_dtype_size(odt) == 2) odt = EM_F32;
    if (em_dtype_size(em_tensor_dtype(*x)) == 2) *x = em_cast(*x, EM_F32);
    if (em_dtype_size(em_tensor_dtype(*y)) == 2) *y = em_cast(*y, EM_F32);
    return odt;
}

em_tensor *em_mse_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction)
{
    if (check_pair(input, target, reduction, "em_mse_loss") != EM_OK) return NULL;
    em_scope_begin();
    const em_dtype odt = pair_widen(&input, &target);
    return nn_return(nn_norm_output(reduce(em_square(em_sub(input, target)), reduction), odt));
}

em_tensor *em_l1_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction)
{
    if (check_pair(input, target, reduction, "em_l1_loss") != EM_OK) return NULL;
    em_scope_begin();
    const em_dtype odt = pair_widen(&input, &target);
    return nn_return(nn_norm_output(reduce(em_abs(em_sub(input, target)), reduction), odt));
}

em_tensor *em_smooth_l1_loss(const em_tensor *input, const em_tensor *target, double beta, em_reduction reduction)
{
    if (!(beta >= 0)) return em__fail(EM_ERR_INVALID, "em_smooth_l1_loss: beta must be >= 0, got %g", beta);
    if (check_pair(input, target, reduction, "em_smooth_l1_loss") != EM_OK) return NULL;
    em_scope_begin();
    const em_dtype odt = pair_widen(&input, &target);
    em_tensor *z = em_abs(em_sub(input, target));
    em_tensor *l;
    if (beta == 0) {
        l = z; /* torch: beta == 0 is the L1 loss */
    } else {
        em_tensor *quad = em_mul_scalar(em_square(z), 0.5 / beta);
        em_tensor *lin = em_sub_scalar(z, 0.5 * beta);
        l = em_where(em_lt_scalar(z, beta), quad, lin);
    }
    return nn_return(nn_norm_output(reduce(l, reduction), odt));
}

em_tensor *em_huber_loss(const em_tensor *input, const em_tensor *target, double delta, em_reduction reduction)
{
    if (!(delta > 0)) return em__fail(EM_ERR_INVALID, "em_huber_loss: delta must be > 0, got %g", delta);
    if (check_pair(input, target, reduction, "em_huber_loss") != EM_OK) return NULL;
    em_scope_begin();
    const em_dtype odt = pair_widen(&input, &target);
    em_tensor *z = em_abs(em_sub(input, target));
    em_tensor *quad = em_mul_scalar(em_square(z), 0.5);
    em_tensor *lin = em_mul_scalar(em_sub_scalar(z, 0.5 * delta), delta);
    return nn_return(nn_norm_output(reduce(em_where(em_lt_scalar(z, delta), quad, lin), reduction), odt));
}

/* Checks that w broadcasts to x's shape (the result keeps x's shape). */
static em_status check_broadcasts_to(const em_tensor *w, const em_tensor *x, const char *what, const char *fn)
{
    int64_t out[EM_MAX_DIMS];
    int nout;
    char sw[160], sx[160];
    if (!em_dtype_is_float(em_tensor_dtype(w)))
        return em__set_error(EM_ERR_DTYPE, "%s: %s must be float, got %s", fn, what, em_dtype_name(em_tensor_dtype(w)));
    if (em__broadcast_shapes(em_tensor_shape(w), em_tensor_ndim(w), em_tensor_shape(x), em_tensor_ndim(x), out, &nout, fn) != EM_OK ||
        nout != em_tensor_ndim(x) || memcmp(out, em_tensor_shape(x), sizeof(int64_t) * (size_t)nout) != 0)
        return em__set_error(EM_ERR_SHAPE, "%s: %s of shape %s does not broadcast to the input shape %s", fn, what, NN_SHAPE(w, sw),
                             NN_SHAPE(x, sx));
    return EM_OK;
}

em_tensor *em_binary_cross_entropy_with_logits(const em_tensor *input, const em_tensor *target, const em_bce_opts *opts)
{
    const char *fn = "em_binary_cross_entropy_with_logits";
    em_bce_opts o = opts ? *opts : em_bce_opts_default();
    if (check_pair(input, target, o.reduction, fn) != EM_OK) return NULL;
    if (o.weight && check_broadcasts_to(o.weight, input, "weight", fn) != EM_OK) return NULL;
    if (o.pos_weight && check_broadcasts_to(o.pos_weight, input, "pos_weight", fn) != EM_OK) return NULL;
    em_scope_begin();
    em_dtype odt = pair_widen(&input, &target);
    if (o.weight) odt = em__promote(odt, em_tensor_dtype(o.weight));
    if (o.pos_weight) odt = em__promote(odt, em_tensor_dtype(o.pos_weight));
    /* (1 - y) x + lw softplus(-x) with lw = 1 + (pw - 1) y equals
     * (1 - y) softplus(x) + pw y softplus(-x) (softplus(x) - x = softplus(-x)):
     * no cancellation at large |x|, and the gradient sigmoid(x) (1 - y + pw y)
     * - pw y is smooth everywhere (also at x = 0). */
    em_tensor *neg = em_mul(em_rsub_scalar(target, 1.0), em_softplus(input));
    em_tensor *pos = em_mul(o.pos_weight ? em_mul(o.pos_weight, target) : (em_tensor *)target, em_softplus(em_neg(input)));
    em_tensor *l = em_add(neg, pos);
    if (o.weight) l = em_mul(l, o.weight);
    return nn_return(nn_norm_output(reduce(l, o.reduction), odt));
}
