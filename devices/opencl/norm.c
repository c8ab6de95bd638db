/* OpenCL host function of the norm family: fused training-mode batch norm
 * forward and backward, its running-statistics update, and fused layer norm
 * forward and backward. Operand contracts: tasks/norm.c; kernel contracts:
 * devices/opencl/norm.cl (one work-group per channel / row). Without a
 * native f64 kernel the CPU reference runs on mapped buffers
 * (em_ocl_host_fallback). */
#include "devices/opencl/opencl.h"

static bool contiguous(const em_tdesc *t)
{
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] < 0) return false;
        if (t->shape[d] != 1 && t->strides[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}

static bool same_shape(const em_tdesc *a, const em_tdesc *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static bool per_channel(const em_tdesc *t, int64_t C, int64_t rows)
{
    return rows == 1 ? t->ndim == 1 && t->shape[0] == C : t->ndim == 2 && t->shape[0] == rows && t->shape[1] == C;
}

static void arg_tensor(em_ocl_args *a, void *iface, const em_tdesc *t)
{
    em_ocl_arg_buf(a, iface);
    em_ocl_arg_i64(a, t->offset);
}

/* BATCH_NORM_RUNNING: stats [2, C] -> running_mean, running_var [C], in place. */
static void running_update(void *buffers[], const em_kargs *k)
{
    const em_tdesc *st = &k->in[0], *rm = &k->out[0], *rv = &k->out[1];
    const int dt = st->dtype;
    const int64_t C = rm->ndim == 1 ? rm->shape[0] : -1;
    const bool ok = (dt == EM_F32 || dt == EM_F64) && k->n_in == 1 && k->n_out == 2 && rm->dtype == dt && rv->dtype == dt &&
                    C >= 0 && per_channel(rv, C, 1) && per_channel(st, C, 2) && contiguous(st) && contiguous(rm) &&
                    contiguous(rv);
    if (!ok) {
        em_ocl_error("norm (op batch_norm_running): unsupported operands (dtypes %d/%d/%d, ranks %d/%d/%d)", st->dtype,
                     rm->dtype, rv->dtype, st->ndim, rm->ndim, rv->ndim);
        return;
    }
    if (C == 0) return;
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "norm")) return;
    const int kid = dt == EM_F32 ? EMK_bn_running_f32 : EMK_bn_running_f64;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    for (int i = 0; i < 3; i++) arg_tensor(&a, buffers[i], i == 0 ? st : i == 1 ? rm : rv);
    em_ocl_arg_i64(&a, C);
    em_ocl_arg_real(&a, dt, k->p.bn.momentum);
    em_ocl_arg_real(&a, dt, 1.0 - k->p.bn.momentum);
    em_ocl_arg_real(&a, dt, k->p.bn.unbias);
    em_ocl_launch_1d(&a, C, "batch_norm_running");
}

/* A work-group size for rows (or channels) of @p len values: the kernel's
 * usable size capped at 256, halved while half of it still covers the row. */
static size_t row_wg(const em_ocl_ctx *c, int kid, int64_t len)
{
    size_t wg = c->d->kwg[kid] ? c->d->kwg[kid] : 64;
    if (wg > 256) wg = 256;
    while (wg > 32 && (int64_t)wg / 2 >= len) wg /= 2;
    return wg;
}

/* LAYER_NORM / LAYER_NORM_BWD: x [M, N] rows (M from stats' dim 1, N from
 * weight's element count, checked against every operand). */
static void layer_norm(void *buffers[], const em_kargs *k)
{
    const bool fwd = k->kind == EM_OP_LAYER_NORM;
    const em_tdesc *x = fwd ? &k->in[0] : &k->in[1], *w = fwd ? &k->in[1] : &k->in[3];
    const em_tdesc *st = fwd ? &k->out[1] : &k->in[2];
    const int dt = x->dtype;
    bool ok = (dt == EM_F32 || dt == EM_F64) && k->n_in == (fwd ? 3 : 4) && k->n_out == (fwd ? 2 : 3) && st->ndim == 2 &&
              st->shape[0] == 2;
    for (int i = 0; ok && i < k->n_in; i++) ok = k->in[i].dtype == dt && contiguous(&k->in[i]);
    for (int i = 0; ok && i < k->n_out; i++) ok = k->out[i].dtype == dt && contiguous(&k->out[i]);
    const int64_t M = ok ? st->shape[1] : 0, N = ok ? em_ocl_numel(w) : 0;
    if (ok) {
        ok = em_ocl_numel(x) == M * N && em_ocl_numel(&k->out[0]) == M * N;
        if (fwd)
            ok = ok && em_ocl_numel(&k->in[2]) == N;
        else
            ok = ok && em_ocl_numel(&k->in[0]) == M * N && em_ocl_numel(&k->out[1]) == N && em_ocl_numel(&k->out[2]) == N;
    }
    if (!ok) {
        em_ocl_error("norm (op %s): unsupported operands (dtype %d, rank %d) or shapes", em__kernel_info[k->kind].name,
                     x->dtype, x->ndim);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "norm")) return;
    const bool f32 = dt == EM_F32;
    const int kid = fwd ? (f32 ? EMK_ln_fwd_f32 : EMK_ln_fwd_f64) : (f32 ? EMK_ln_bwd_f32 : EMK_ln_bwd_f64);
    const int wbid = f32 ? EMK_ln_bwd_wb_f32 : EMK_ln_bwd_wb_f64;
    if (!c.d->k[kid] || (!fwd && !c.d->k[wbid])) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const size_t accsz = c.d->fp64 ? sizeof(cl_double) : sizeof(cl_float);
    if (M > 0) { /* the rows: y and stats, or dx */
        const size_t wg = row_wg(&c, kid, N);
        em_ocl_args a = em_ocl_args_begin(&c, kid);
        /* the first five buffers: forward x, w, b, y, stats; backward dy, x, stats, w, dx */
        for (int i = 0; i < 5; i++) arg_tensor(&a, buffers[i], i < k->n_in ? &k->in[i] : &k->out[i - k->n_in]);
        em_ocl_arg_i64(&a, M);
        em_ocl_arg_i64(&a, N);
        if (fwd) em_ocl_arg_acc(&a, k->p.bn.eps);
        em_ocl_arg_local(&a, (fwd ? 1 : 2) * wg * accsz);
        const size_t g = (size_t)M * wg;
        if (!em_ocl_launch(&a, 1, &g, &wg, em__kernel_info[k->kind].name)) return;
    }
    if (!fwd && N > 0) { /* dweight, dbias: every column over the rows (zeros when M = 0) */
        em_ocl_args a = em_ocl_args_begin(&c, wbid);
        arg_tensor(&a, buffers[0], &k->in[0]);
        arg_tensor(&a, buffers[1], &k->in[1]);
        arg_tensor(&a, buffers[2], &k->in[2]);
        arg_tensor(&a, buffers[5], &k->out[1]);
        arg_tensor(&a, buffers[6], &k->out[2]);
        em_ocl_arg_i64(&a, M);
        em_ocl_arg_i64(&a, N);
        em_ocl_launch_1d(&a, N, "layer_norm_bwd (dweight, dbias)");
    }
}

void em_ocl_norm(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int kind = k->kind;
    if (kind == EM_OP_BATCH_NORM_RUNNING) {
        running_update(buffers, k);
        return;
    }
    if (kind == EM_OP_LAYER_NORM || kind == EM_OP_LAYER_NORM_BWD) {
        layer_norm(buffers, k);
        return;
    }
    const bool fwd = kind == EM_OP_BATCH_NORM;
    if (!fwd && kind != EM_OP_BATCH_NORM_BWD) {
        em_ocl_error("norm: unsupported op %d", kind);
        return;
    }
    const em_tdesc *x = fwd ? &k->in[0] : &k->in[1];
    const int dt = x->dtype;
    bool ok = (dt == EM_F32 || dt == EM_F64) && k->n_in == (fwd ? 3 : 4) && k->n_out == (fwd ? 2 : 3) && x->ndim >= 2 &&
              x->ndim <= 5;
    for (int i = 0; ok && i < k->n_in; i++) ok = k->in[i].dtype == dt && contiguous(&k->in[i]);
    for (int i = 0; ok && i < k->n_out; i++) ok = k->out[i].dtype == dt && contiguous(&k->out[i]);
    const int64_t N = ok ? x->shape[0] : 0, C = ok ? x->shape[1] : 0;
    if (ok) {
        if (fwd)
            ok = per_channel(&k->in[1], C, 1) && per_channel(&k->in[2], C, 1) && same_shape(&k->out[0], x) &&
                 per_channel(&k->out[1], C, 2);
        else
            ok = same_shape(&k->in[0], x) && per_channel(&k->in[2], C, 2) && per_channel(&k->in[3], C, 1) &&
                 same_shape(&k->out[0], x) && per_channel(&k->out[1], C, 1) && per_channel(&k->out[2], C, 1);
    }
    if (!ok) {
        em_ocl_error("norm (op %s): unsupported operands (dtype %d, rank %d) or shapes", em__kernel_info[kind].name,
                     x->dtype, x->ndim);
        return;
    }
    const int64_t L = N * C > 0 ? em_ocl_numel(x) / (N * C) : 0;
    if (C == 0) return;
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "norm")) return;
    const bool f32 = dt == EM_F32;
    const int kid = fwd ? (f32 ? EMK_bn_fwd_f32 : EMK_bn_fwd_f64) : (f32 ? EMK_bn_bwd_f32 : EMK_bn_bwd_f64);
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    size_t wg = c.d->kwg[kid] ? c.d->kwg[kid] : 64;
    if (wg > 256) wg = 256;
    while (wg > 32 && (int64_t)wg / 2 >= N * L) wg /= 2; /* short channels: smaller groups */
    const size_t accsz = c.d->fp64 ? sizeof(cl_double) : sizeof(cl_float);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    for (int i = 0; i < k->n_in + k->n_out; i++) arg_tensor(&a, buffers[i], i < k->n_in ? &k->in[i] : &k->out[i - k->n_in]);
    em_ocl_arg_i64(&a, N);
    em_ocl_arg_i64(&a, C);
    em_ocl_arg_i64(&a, L);
    em_ocl_arg_acc(&a, k->p.bn.eps);
    em_ocl_arg_local(&a, (fwd ? 1 : 2) * wg * accsz);
    const size_t g = (size_t)C * wg;
    em_ocl_launch(&a, 1, &g, &wg, em__kernel_info[kind].name);
}
