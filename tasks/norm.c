/* Fused norms: training-mode batch norm, em__batch_norm_train (em_batch_norm's
 * training path, nn/vision.c) and em__batch_norm_bwd (its backward rule,
 * autodiff/rules.c), one task forward and one backward instead of the ~8
 * and ~15 small ops of the composed form; and layer norm, em__layer_norm
 * (em_layer_norm's affine path, nn/layers.c) and em__layer_norm_bwd (its
 * rule), one task each instead of ~9 forward and ~20 backward.
 *
 * Kernel contracts (every backend). Operands have one dtype, f32 or f64, and
 * are contiguous (a descriptor may have an offset). x / y / dy / dx are
 * [N, C, *] of rank 2 to 5, seen as [N, C, S] with S = numel / (N * C);
 * M = N * S values per channel (M > 1: the front end checks it). weight,
 * bias, dweight, dbias are [C]; stats is [2, C]: row 0 the batch mean, row 1
 * the biased batch variance. p.bn.eps >= 0.
 *
 *   BATCH_NORM     in = x, weight, bias; out = y, stats:
 *       mean = sum(x) / M, var = sum((x - mean)^2) / M (two passes, per
 *       channel; CPU and GPUs accumulate in double, OpenCL devices without
 *       fp64 in float), invstd = 1 / sqrt(var + eps),
 *       y = (x - mean) * invstd * weight + bias;
 *       stats = (mean, var) rounded to the dtype (f32 for f16 / bf16 x, whose
 *       ops the door widens: the kernels only see f32 / f64).
 *   BATCH_NORM_BWD in = dy, x, stats, weight; out = dx, dweight, dbias
 *       (PyTorch's batch_norm_backward): with mean, var from stats,
 *       invstd = 1 / sqrt(var + eps), xhat = (x - mean) * invstd,
 *       dbias = sum(dy), dweight = sum(dy * xhat) (per channel, accumulated
 *       as above), dx = weight * invstd * (dy - dbias / M - xhat * dweight / M).
 *       All three are written whole.
 *   BATCH_NORM_RUNNING in = stats; out = running_mean, running_var [C]
 *       (read-modify-write, F_INPLACE), all of one dtype T: with
 *       m = (T)momentum, k = (T)(1 - momentum), u = (T)unbias, every step
 *       rounded to T and in this order (the composed update's roundings):
 *       running_mean = running_mean * k + mean * m,
 *       running_var  = running_var * k + (var * u) * m.
 *
 * Layer norm (torch.nn.functional.layer_norm with weight and bias). x / y /
 * dy / dx hold M * N values of any rank, seen as [M, N] rows: M = the
 * product of the leading dims, N = the product of the normalized dims.
 * weight, bias, dweight, dbias hold N values (any rank: the normalized
 * shape); stats is [2, M]: row 0 the mean, row 1 rstd of each row of x. The
 * kernels read M from stats' dim 1 and N from weight's element count, and
 * refuse operands whose counts disagree (numel(x) = M * N). M or N may be 0.
 * Sums accumulate in double (CPU, CUDA; OpenCL: acc_t, double when the
 * device has fp64, else float).
 *
 *   LAYER_NORM     in = x, weight, bias; out = y, stats: per row,
 *       mean = sum(x) / N, var = sum((x - mean)^2) / N (two passes; biased,
 *       as torch; N = 0: mean = var = 0), rstd = 1 / sqrt(var + eps),
 *       y = (x - mean) * rstd * weight + bias; stats = (mean, rstd) rounded
 *       to the dtype (f32 for f16 / bf16 x: the door widens the op, as for
 *       batch norm, so the kernels see f32 and the statistics stay f32, as
 *       PyTorch's). eps: p.bn.eps.
 *   LAYER_NORM_BWD in = dy, x, stats, weight; out = dx, dweight, dbias
 *       (PyTorch's layer_norm_backward): with mean, rstd from stats,
 *       xhat = (x - mean) * rstd, g = dy * weight (per row),
 *       dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (means over the
 *       row's N values); per column j, dweight[j] = sum over the M rows of
 *       dy * xhat, dbias[j] = sum over the rows of dy (0 when M = 0). All
 *       three are written whole. eps is not read (rstd is saved). */
#include "tasks/tasks_internal.h"

#include <string.h>

/* Unscoped contiguous operands (NULL entries stay NULL). */
static bool contiguous_all(const em_tensor *const *in, em_tensor **out, int n)
{
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        if (!in[i]) continue;
        if (!(out[i] = em__contiguous_operand(in[i]))) {
            for (int j = 0; j < i; j++) em_tensor_release(out[j]);
            return false;
        }
    }
    return true;
}

static void release_all(em_tensor **t, int n)
{
    for (int i = 0; i < n; i++) em_tensor_release(t[i]);
}

em_tensor *em__batch_norm_train(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, double eps,
                                em_tensor **stats)
{
    *stats = NULL;
    const int64_t c = x->shape[1];
    const em_tensor *orig[3] = {x, weight, bias};
    em_tensor *in[3];
    if (!contiguous_all(orig, in, 3)) return NULL;
    const int64_t sshape[2] = {2, c};
    em_tensor *y = em__tensor_new(x->dtype, x->shape, x->ndim);
    /* f16 / bf16: the statistics stay f32 (as PyTorch's save_mean / save_invstd),
     * so the backward and the running update do not see a mean rounded to 16
     * bits; the door runs the op widened (every operand f32 in the kernel). */
    const em_dtype sdt = (x->dtype == EM_F16 || x->dtype == EM_BF16) ? EM_F32 : x->dtype;
    em_tensor *st = y ? em__tensor_new(sdt, sshape, 2) : NULL;
    if (!st) {
        em_tensor_release(y);
        release_all(in, 3);
        return NULL;
    }
    em_op op = {.kind = EM_OP_BATCH_NORM, .n_in = 3, .n_out = 2, .in = {in[0], in[1], in[2]}, .out = {y, st},
                .orig_in = {x, weight, bias}};
    op.p.bn.eps = eps;
    em_status s = em__submit(&op);
    release_all(in, 3);
    if (s != EM_OK) {
        em_tensor_release(y);
        em_tensor_release(st);
        return NULL;
    }
    *stats = em__publish(st);
    return em__publish(y);
}

em_status em__batch_norm_running(const em_tensor *stats, em_tensor *running_mean, em_tensor *running_var, double momentum,
                                 double unbias)
{
    em_op op = {.kind = EM_OP_BATCH_NORM_RUNNING, .n_in = 1, .n_out = 2, .in = {(em_tensor *)stats},
                .out = {running_mean, running_var}, .flags = EM_OPF_NO_RECORD};
    op.p.bn.momentum = momentum;
    op.p.bn.unbias = unbias;
    return em__submit(&op);
}

em_status em__batch_norm_bwd(const em_tensor *dy, const em_tensor *x, const em_tensor *stats, const em_tensor *weight,
                             double eps, em_tensor **dx, em_tensor **dweight, em_tensor **dbias)
{
    *dx = *dweight = *dbias = NULL;
    const int64_t c = x->shape[1];
    const em_tensor *orig[4] = {dy, x, stats, weight};
    em_tensor *in[4];
    if (!contiguous_all(orig, in, 4)) return em_last_status();
    em_tensor *o[3] = {em__tensor_new(x->dtype, x->shape, x->ndim), NULL, NULL};
    if (o[0]) o[1] = em__tensor_new(x->dtype, &c, 1);
    if (o[1]) o[2] = em__tensor_new(x->dtype, &c, 1);
    if (!o[2]) {
        release_all(o, 3);
        release_all(in, 4);
        return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    }
    em_op op = {.kind = EM_OP_BATCH_NORM_BWD, .n_in = 4, .n_out = 3, .in = {in[0], in[1], in[2], in[3]},
                .out = {o[0], o[1], o[2]}, .flags = EM_OPF_NO_RECORD};
    op.p.bn.eps = eps;
    em_status s = em__submit(&op);
    release_all(in, 4);
    if (s != EM_OK) {
        release_all(o, 3);
        return s;
    }
    *dx = em__publish(o[0]);
    *dweight = em__publish(o[1]);
    *dbias = em__publish(o[2]);
    return EM_OK;
}

/* x's leading dims (all but the last @p ndim) multiplied: the rows of the
 * [M, N] view. */
static int64_t ln_rows(const em_tensor *x, int ndim)
{
    int64_t m = 1;
    for (int d = 0; d < x->ndim - ndim; d++) m *= x->shape[d];
    return m;
}

em_tensor *em__layer_norm(const em_tensor *x, int ndim, const em_tensor *weight, const em_tensor *bias, double eps,
                          em_tensor **stats)
{
    *stats = NULL;
    if (!x || !weight || !bias) return em__fail(EM_ERR_INVALID, "layer_norm: %s is NULL", !x ? "input" : !weight ? "weight" : "bias");
    const em_dtype dt = x->dtype;
    if (!em_dtype_is_float(dt) || weight->dtype != dt || bias->dtype != dt)
        return em__fail(EM_ERR_DTYPE, "layer_norm: input, weight and bias must share one float dtype, got %s, %s, %s",
                        em_dtype_name(dt), em_dtype_name(weight->dtype), em_dtype_name(bias->dtype));
    if (ndim < 1 || ndim > x->ndim)
        return em__fail(EM_ERR_SHAPE, "layer_norm: cannot normalize the last %d dims of a rank-%d input", ndim, x->ndim);
    const int64_t m = ln_rows(x, ndim), n = em_tensor_numel(weight);
    if (em_tensor_numel(bias) != n || m * n != em_tensor_numel(x))
        return em__fail(EM_ERR_SHAPE, "layer_norm: weight (%lld values) and bias (%lld) do not match the last %d dims of the input",
                        (long long)n, (long long)em_tensor_numel(bias), ndim);
    const em_tensor *orig[3] = {x, weight, bias};
    em_tensor *in[3];
    if (!contiguous_all(orig, in, 3)) return NULL;
    const int64_t sshape[2] = {2, m};
    em_tensor *y = em__tensor_new(dt, x->shape, x->ndim);
    /* f16 / bf16: f32 statistics (PyTorch's mean / rstd of a half input are
     * float too); the door runs the op widened */
    const em_dtype sdt = (dt == EM_F16 || dt == EM_BF16) ? EM_F32 : dt;
    em_tensor *st = y ? em__tensor_new(sdt, sshape, 2) : NULL;
    if (!st) {
        em_tensor_release(y);
        release_all(in, 3);
        return NULL;
    }
    em_op op = {.kind = EM_OP_LAYER_NORM, .n_in = 3, .n_out = 2, .in = {in[0], in[1], in[2]}, .out = {y, st},
                .orig_in = {x, weight, bias}};
    op.p.bn.eps = eps;
    em_status s = em__submit(&op);
    release_all(in, 3);
    if (s != EM_OK) {
        em_tensor_release(y);
        em_tensor_release(st);
        return NULL;
    }
    *stats = em__publish(st);
    return em__publish(y);
}

em_status em__layer_norm_bwd(const em_tensor *dy, const em_tensor *x, const em_tensor *stats, const em_tensor *weight,
                             em_tensor **dx, em_tensor **dweight, em_tensor **dbias)
{
    *dx = *dweight = *dbias = NULL;
    const int64_t n = em_tensor_numel(weight), m = stats->ndim == 2 ? stats->shape[1] : -1;
    if (dy->dtype != x->dtype || weight->dtype != x->dtype || m < 0 || stats->shape[0] != 2 || m * n != em_tensor_numel(x) ||
        em_tensor_numel(dy) != em_tensor_numel(x))
        return em__set_error(EM_ERR_SHAPE, "layer_norm_bwd: operands do not match (dy %s, x %s, weight %s, %lld rows of statistics)",
                             em_dtype_name(dy->dtype), em_dtype_name(x->dtype), em_dtype_name(weight->dtype), (long long)m);
    const em_tensor *orig[4] = {dy, x, stats, weight};
    em_tensor *in[4];
    if (!contiguous_all(orig, in, 4)) return em_last_status();
    em_tensor *o[3] = {em__tensor_new(x->dtype, x->shape, x->ndim), NULL, NULL};
    if (o[0]) o[1] = em__tensor_new(x->dtype, weight->shape, weight->ndim);
    if (o[1]) o[2] = em__tensor_new(x->dtype, weight->shape, weight->ndim);
    if (!o[2]) {
        release_all(o, 3);
        release_all(in, 4);
        return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    }
    em_op op = {.kind = EM_OP_LAYER_NORM_BWD, .n_in = 4, .n_out = 3, .in = {in[0], in[1], in[2], in[3]},
                .out = {o[0], o[1], o[2]}, .flags = EM_OPF_NO_RECORD};
    em_status s = em__submit(&op);
    release_all(in, 4);
    if (s != EM_OK) {
        release_all(o, 3);
        return s;
    }
    *dx = em__publish(o[0]);
    *dweight = em__publish(o[1]);
    *dbias = em__publish(o[2]);
    return EM_OK;
}
