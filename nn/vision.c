/* Vision functional forms and modules: batch / group / instance norm,
 * interpolate (nearest, bilinear), and the modules Conv1d, Conv2d,
 * ConvTranspose2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, BatchNorm1d/2d,
 * GroupNorm, Flatten, Dropout2d, Upsample.
 *
 * The functional forms are made of ordinary differentiable ops (reductions,
 * element-wise ops, index_select gathers), so autodiff covers them and they
 * run on every device without kernels of their own; the exception is
 * training-mode batch norm on f32/f64, one fused op forward (BATCH_NORM) and
 * one backward (BATCH_NORM_BWD, tasks/norm.c), since its ~8 + ~15 small
 * tasks cost more than the arithmetic on a GPU. Formulas and checks
 * follow PyTorch 1.13: torch/nn/functional.py (batch_norm, group_norm,
 * interpolate), ATen/native/UpSample.h (source indices and weights) and
 * torch/nn/modules/{conv,batchnorm,normalization,...}.py (modules). */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A new float32 tensor of @p shape owned by the caller whatever scope is open. */
static em_tensor *new_param(const int64_t *shape, int ndim, em_dtype dt)
{
    em_scope_begin();
    em_tensor *t = em_zeros(shape, ndim, dt);
    em_tensor_retain(t);
    em_scope_end();
    return t;
}

/* [1, C, 1, ...] of rank nd: the shape a per-channel [C] tensor takes to
 * broadcast against x [N, C, ...]. */
static void channel_shape(int64_t c, int nd, int64_t *shape)
{
    for (int i = 0; i < nd; i++) shape[i] = 1;
    shape[1] = c;
}

/* Checks that @p t (may be NULL) is a 1-D tensor of @p c elements. */
static bool check_per_channel(const em_tensor *t, int64_t c, const em_tensor *x, const char *what, const char *fn)
{
    if (!t) return true;
    if (em_tensor_ndim(t) != 1 || em_tensor_dim(t, 0) != c) {
        char st[160], sx[160];
        em__fail(EM_ERR_SHAPE, "%s: %s of shape %s does not match the %lld channels of the input %s (expected [%lld])", fn, what,
                 NN_SHAPE(t, st), (long long)c, NN_SHAPE(x, sx), (long long)c);
        return false;
    }
    return true;
}

/* y * weight + bias with per-channel [C] weight / bias (either may be NULL). */
static em_tensor *affine(em_tensor *y, const em_tensor *weight, const em_tensor *bias, int64_t c, int nd)
{
    int64_t cs[EM_MAX_DIMS];
    channel_shape(c, nd, cs);
    if (weight) y = em_mul(y, em_reshape(weight, cs, nd));
    if (bias) y = em_add(y, em_reshape(bias, cs, nd));
    return y;
}

/* ---- batch norm ---------------------------------------------------------------------- */

/* running <- (1 - momentum) * running + momentum * batch (batch [C] in any
 * float dtype), in place, not recorded. */
static em_status running_update(em_tensor *running, em_tensor *batch, double momentum)
{
    em_tensor *b = em_cast(batch, em_tensor_dtype(running));
    em_tensor *upd = em_add(em_mul_scalar(running, 1.0 - momentum), em_mul_scalar(b, momentum));
    if (!upd) return em_last_status();
    return em_copy_(running, upd);
}

em_tensor *em_batch_norm(const em_tensor *x, em_tensor *running_mean, em_tensor *running_var, const em_tensor *weight,
                         const em_tensor *bias, bool training, double momentum, double eps)
{
    static const char *fn = "em_batch_norm";
    if (!x) return em__fail_null("em_batch_norm: input is NULL");
    char sx[160];
    int nd = em_tensor_ndim(x);
    if (nd < 2 || nd > 5)
        return em__fail(EM_ERR_SHAPE, "em_batch_norm: input must be [N, C, ...] of rank 2 to 5, got shape %s", NN_SHAPE(x, sx));
    {   /* autocast: batch norm in f32 (x, weight, bias) */
        const em_tensor *ins[3] = {x, weight, bias};
        em_tensor *c[3];
        EM_AUTOCAST_RERUN(EM_OP_BATCH_NORM, ins, 3, c, em_batch_norm(c[0], running_mean, running_var, c[1], c[2], training, momentum, eps));
    }
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em__fail(EM_ERR_DTYPE, "em_batch_norm: input must be float, got %s", em_dtype_name(dt));
    {   /* A 16-bit input with wider affine parameters (an f32 model fed a
         * bf16 / f16 tensor outside autocast): the result has the promoted
         * dtype anyway, so normalise in it (a recorded cast of x). The
         * composed path below would otherwise compute the mean, the variance
         * and the normalised values in 16 bits (and cast the running
         * statistics down in eval), off by a large fraction of the output's
         * scale for an input far from zero. */
        em_dtype pd = dt;
        if (weight && em_dtype_is_float(em_tensor_dtype(weight))) pd = em__promote(pd, em_tensor_dtype(weight));
        if (bias && em_dtype_is_float(em_tensor_dtype(bias))) pd = em__promote(pd, em_tensor_dtype(bias));
        if (pd != dt && em_dtype_size(dt) == 2) {
            em_scope_begin();
            em_tensor *xp = em_cast(x, pd);
            return nn_return(xp ? em_batch_norm(xp, running_mean, running_var, weight, bias, training, momentum, eps) : NULL);
        }
    }
    if (!(eps >= 0)) return em__fail(EM_ERR_INVALID, "em_batch_norm: eps must be >= 0, got %g", eps);
    if (!(momentum >= 0 && momentum <= 1))
        return em__fail(EM_ERR_INVALID, "em_batch_norm: momentum must be in [0, 1], got %g", momentum);
    if (!running_mean != !running_var)
        return em__fail(EM_ERR_INVALID, "em_batch_norm: running_mean and running_var must both be given or both be NULL (got %s NULL)",
                        running_mean ? "running_var" : "running_mean");
    if (!training && !running_mean)
        return em__fail(EM_ERR_INVALID, "em_batch_norm: eval mode (training false) needs running_mean and running_var");
    int64_t c = em_tensor_dim(x, 1);
    if (!check_per_channel(weight, c, x, "weight", fn) || !check_per_channel(bias, c, x, "bias", fn) ||
        !check_per_channel(running_mean, c, x, "running_mean", fn) || !check_per_channel(running_var, c, x, "running_var", fn))
        return NULL;
    for (int k = 0; k < 2; k++) {
        const em_tensor *r = k ? running_var : running_mean;
        if (r && !em_dtype_is_float(em_tensor_dtype(r)))
            return em__fail(EM_ERR_DTYPE, "em_batch_norm: %s must be float, got %s", k ? "running_var" : "running_mean",
                            em_dtype_name(em_tensor_dtype(r)));
    }
    int64_t numel = em_tensor_numel(x);
    int64_t count = c > 0 ? numel / c : 0; /* values per channel */
    if (training && count <= 1)
        return em__fail(EM_ERR_SHAPE, "em_batch_norm: expected more than 1 value per channel when training, got input size %s",
                        NN_SHAPE(x, sx));
    int dims[EM_MAX_DIMS], nr = 0;
    for (int i = 0; i < nd; i++)
        if (i != 1) dims[nr++] = i;
    int64_t cs[EM_MAX_DIMS];
    channel_shape(c, nd, cs);
    em_scope_begin();
    em_tensor *y;
    /* Training with float operands of one dtype: one fused op forward
     * (BATCH_NORM, tasks/norm.c) and one backward; the running statistics
     * come from its stats output [2, C]. f16 / bf16 too: the door runs the
     * fused ops in f32 (widened: statistics in f32, as PyTorch's), where the
     * composed path below would round the mean and the variance to 16 bits
     * (2 % off for an input far from zero). Mixed dtypes stay composed. */
    const bool fused = training && em_dtype_is_float(dt) && (!weight || em_tensor_dtype(weight) == dt) &&
                       (!bias || em_tensor_dtype(bias) == dt);
    if (fused) {
        const em_tensor *w = weight ? weight : em_ones(&c, 1, dt);
        const em_tensor *b = bias ? bias : em_zeros(&c, 1, dt);
        em_tensor *stats = NULL;
        y = w && b ? em__batch_norm_train(x, w, b, eps, &stats) : NULL;
        if (y && running_mean) {
            /* torch: running_var uses the unbiased variance, var * n / (n - 1) */
            const double unbias = (double)count / (double)(count - 1);
            em_status st;
            em_no_grad_begin();
            if (em_tensor_dtype(running_mean) == dt && em_tensor_dtype(running_var) == dt &&
                em_tensor_is_contiguous(running_mean) && em_tensor_is_contiguous(running_var) &&
                running_mean->storage != running_var->storage) {
                st = em__batch_norm_running(stats, running_mean, running_var, momentum, unbias); /* one task */
            } else {
                em_tensor *mean = em_reshape(em_narrow(stats, 0, 0, 1), &c, 1);
                em_tensor *var = em_reshape(em_narrow(stats, 0, 1, 1), &c, 1);
                st = running_update(running_mean, mean, momentum);
                if (st == EM_OK) st = running_update(running_var, em_mul_scalar(var, unbias), momentum);
            }
            em_no_grad_end();
            if (st != EM_OK) y = NULL;
        }
        return nn_return(y);
    }
    if (training) {
        em_tensor *mean = em_mean(x, dims, nr, true);
        em_tensor *xc = em_sub(x, mean);
        em_tensor *var = em_mean(em_square(xc), dims, nr, true); /* biased: normalisation */
        y = em_mul(xc, em_rsqrt(em_add_scalar(var, eps)));
        if (y && running_mean) {
            /* torch: running_var uses the unbiased variance, var * n / (n - 1) */
            em_no_grad_begin();
            em_status st = running_update(running_mean, em_reshape(mean, &c, 1), momentum);
            if (st == EM_OK)
                st = running_update(running_var, em_mul_scalar(em_reshape(var, &c, 1), (double)count / (double)(count - 1)), momentum);
            em_no_grad_end();
            if (st != EM_OK) y = NULL;
        }
    } else {
        const em_tensor *xf = nn_norm_input(x); /* 16 bits: in f32 (the statistics too), rounded once below */
        const em_dtype cdt = em_tensor_dtype(xf);
        em_tensor *rm = em_reshape(em_cast(running_mean, cdt), cs, nd);
        em_tensor *rv = em_reshape(em_cast(running_var, cdt), cs, nd);
        y = em_mul(em_sub(xf, rm), em_rsqrt(em_add_scalar(rv, eps)));
    }
    if (y) y = affine(y, weight, bias, c, nd);
    return nn_return(nn_norm_output(y, nn_norm_dtype(x, weight, bias)));
}

/* ---- group / instance norm -------------------------------------------------------------------- */

em_tensor *em_group_norm(const em_tensor *x, int64_t num_groups, const em_tensor *weight, const em_tensor *bias, double eps)
{
    static const char *fn = "em_group_norm";
    if (!x) return em__fail_null("em_group_norm: input is NULL");
    char sx[160];
    int nd = em_tensor_ndim(x);
    if (nd < 2) return em__fail(EM_ERR_SHAPE, "em_group_norm: input must be [N, C, ...], got shape %s", NN_SHAPE(x, sx));
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em__fail(EM_ERR_DTYPE, "em_group_norm: input must be float, got %s", em_dtype_name(dt));
    if (!(eps >= 0)) return em__fail(EM_ERR_INVALID, "em_group_norm: eps must be >= 0, got %g", eps);
    int64_t n = em_tensor_dim(x, 0), c = em_tensor_dim(x, 1);
    if (num_groups <= 0 || c % num_groups != 0)
        return em__fail(EM_ERR_SHAPE, "em_group_norm: the %lld channels of the input %s are not divisible by num_groups = %lld",
                        (long long)c, NN_SHAPE(x, sx), (long long)num_groups);
    if (!check_per_channel(weight, c, x, "weight", fn) || !check_per_channel(bias, c, x, "bias", fn)) return NULL;
    em_scope_begin();
    const em_dtype odt = nn_norm_dtype(x, weight, bias);
    int64_t gs[3] = {n, num_groups, em_tensor_numel(x) / (n * num_groups > 0 ? n * num_groups : 1)};
    int last = 2;
    em_tensor *xg = em_reshape(nn_norm_input(x), gs, 3);
    em_tensor *mean = em_mean(xg, &last, 1, true);
    em_tensor *xc = em_sub(xg, mean);
    em_tensor *var = em_mean(em_square(xc), &last, 1, true); /* biased, as torch */
    em_tensor *y = em_reshape(em_mul(xc, em_rsqrt(em_add_scalar(var, eps))), em_tensor_shape(x), nd);
    if (y) y = affine(y, weight, bias, c, nd);
    return nn_return(nn_norm_output(y, odt));
}

em_tensor *em_instance_norm(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, double eps)
{
    if (!x) return em__fail_null("em_instance_norm: input is NULL");
    if (em_tensor_ndim(x) < 3) {
        char sx[160];
        return em__fail(EM_ERR_SHAPE, "em_instance_norm: input must be [N, C, L, ...] (rank >= 3), got shape %s", NN_SHAPE(x, sx));
    }
    return em_group_norm(x, em_tensor_dim(x, 1), weight, bias, eps);
}

/* ---- interpolate ------------------------------------------------------------------------- */

/* Resamples dim @p d (2 or 3) of x from @p in to @p out elements. Indices and
 * weights as ATen/native/UpSample.h: nearest_idx (float scale in / out,
 * floor(dst * scale) capped at in - 1; identity and exact 2x as special
 * cases), compute_source_index_and_lambda (ratio in x's dtype, source index
 * in double, clamped at 0 when !align_corners; weights in x's dtype). */
static em_tensor *resample_dim(em_tensor *x, int d, int64_t in, int64_t out, em_interp_mode mode, bool align_corners)
{
    if (in == out) return x;
    bool f32 = em_tensor_dtype(x) == EM_F32;
    int64_t *i0 = malloc(sizeof *i0 * (size_t)out), *i1 = malloc(sizeof *i1 * (size_t)out);
    double *l0 = malloc(sizeof *l0 * (size_t)out), *l1 = malloc(sizeof *l1 * (size_t)out);
    em_tensor *y = NULL;
    if (!i0 || !i1 || !l0 || !l1) {
        em__fail(EM_ERR_NOMEM, "em_interpolate: out of memory");
        goto done;
    }
    if (mode == EM_INTERP_NEAREST) {
        float scale = (float)in / (float)out;
        for (int64_t o = 0; o < out; o++) {
            int64_t s = out == 2 * in ? o >> 1 : (int64_t)floorf((float)o * scale);
            i0[o] = s < in - 1 ? s : in - 1;
        }
        int64_t len = out;
        y = em_index_select(x, d, em_from_host(i0, &len, 1, EM_I64));
        goto done;
    }
    double ratio;
    if (align_corners)
        ratio = out > 1 ? (f32 ? (double)((float)(in - 1) / (float)(out - 1)) : (double)(in - 1) / (double)(out - 1)) : 0.0;
    else
        ratio = f32 ? (double)((float)in / (float)out) : (double)in / (double)out;
    for (int64_t o = 0; o < out; o++) {
        double src = align_corners ? ratio * (double)o : ratio * ((double)o + 0.5) - 0.5;
        if (!align_corners && src < 0) src = 0;
        int64_t a = (int64_t)src;
        i0[o] = a;
        i1[o] = a + (a < in - 1 ? 1 : 0);
        double lam = src - (double)a;
        if (f32) {
            float lf = (float)lam;
            l1[o] = lf;
            l0[o] = 1.0f - lf;
        } else {
            l1[o] = lam;
            l0[o] = 1.0 - lam;
        }
    }
    {
        int64_t len = out, ws[2] = {out, 1};
        int wnd = d == 2 ? 2 : 1; /* [out, 1] broadcasts over W; [out] along W */
        em_dtype dt = em_tensor_dtype(x);
        em_tensor *w0 = em_cast(em_from_host(l0, ws, wnd, EM_F64), dt);
        em_tensor *w1 = em_cast(em_from_host(l1, ws, wnd, EM_F64), dt);
        em_tensor *x0 = em_index_select(x, d, em_from_host(i0, &len, 1, EM_I64));
        em_tensor *x1 = em_index_select(x, d, em_from_host(i1, &len, 1, EM_I64));
        y = em_add(em_mul(x0, w0), em_mul(x1, w1));
    }
done:
    free(i0);
    free(i1);
    free(l0);
    free(l1);
    return y;
}

em_tensor *em_interpolate(const em_tensor *x, int64_t oh, int64_t ow, em_interp_mode mode, bool align_corners)
{
    if (!x) return em__fail_null("em_interpolate: input is NULL");
    char sx[160];
    if (em_tensor_ndim(x) != 4)
        return em__fail(EM_ERR_SHAPE, "em_interpolate: input must be [N, C, H, W], got shape %s", NN_SHAPE(x, sx));
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em__fail(EM_ERR_DTYPE, "em_interpolate: input must be float, got %s", em_dtype_name(dt));
    if (mode != EM_INTERP_NEAREST && mode != EM_INTERP_BILINEAR)
        return em__fail(EM_ERR_INVALID, "em_interpolate: unknown mode %d", (int)mode);
    if (mode == EM_INTERP_NEAREST && align_corners)
        return em__fail(EM_ERR_INVALID, "em_interpolate: align_corners can only be set with mode bilinear, not nearest");
    int64_t h = em_tensor_dim(x, 2), w = em_tensor_dim(x, 3);
    if (h <= 0 || w <= 0 || oh <= 0 || ow <= 0)
        return em__fail(EM_ERR_SHAPE, "em_interpolate: input and output sizes must be greater than 0: input %s, output size (%lld, %lld)",
                        NN_SHAPE(x, sx), (long long)oh, (long long)ow);
    em_scope_begin();
    em_tensor *y = resample_dim((em_tensor *)x, 2, h, oh, mode, align_corners);
    if (y) y = resample_dim(y, 3, w, ow, mode, align_corners);
    if (y == x) y = em_reshape(x, em_tensor_shape(x), 4); /* same size: a new header */
    return nn_return(y);
}

/* ---- Conv1d / Conv2d / ConvTranspose2d ------------------------------------------------------ */

static em_tensor *conv_forward(em_module *m, const em_tensor *x)
{
    em__conv_impl *c = em_module_impl(m);
    if (c->transposed) return em_conv_transpose2d(x, c->weight, c->bias, &c->opts);
    if (c->spatial == 1) return em_conv1d(x, c->weight, c->bias, &c->opts);
    return em_conv2d(x, c->weight, c->bias, &c->opts);
}

static const em_module_vtable CONV1D_VT = {"Conv1d", conv_forward, free};
static const em_module_vtable CONV2D_VT = {"Conv2d", conv_forward, free};
static const em_module_vtable CONV_T2D_VT = {"ConvTranspose2d", conv_forward, free};

static em_module *conv_new(const em_module_vtable *vt, int spatial, bool transposed, int64_t in, int64_t out, int64_t kh, int64_t kw,
                           const em_conv_opts *o, bool bias, const char *fn)
{
    em_conv_opts opts = o ? *o : em_conv_opts_default();
    if (in <= 0 || out <= 0)
        return em__fail(EM_ERR_INVALID, "%s: in_channels (%lld) and out_channels (%lld) must be > 0", fn, (long long)in, (long long)out);
    if (kh <= 0 || kw <= 0)
        return em__fail(EM_ERR_INVALID, "%s: kernel size (%lld, %lld) must be > 0", fn, (long long)kh, (long long)kw);
    if (opts.groups <= 0 || in % opts.groups != 0 || out % opts.groups != 0)
        return em__fail(EM_ERR_INVALID, "%s: in_channels (%lld) and out_channels (%lld) must be divisible by groups (%lld)", fn,
                        (long long)in, (long long)out, (long long)opts.groups);
    int ns = spatial == 1 ? 1 : 2;
    for (int i = 0; i < ns; i++) {
        if (opts.stride[i] <= 0 || opts.dilation[i] <= 0)
            return em__fail(EM_ERR_INVALID, "%s: stride (%lld) and dilation (%lld) must be > 0", fn, (long long)opts.stride[i],
                            (long long)opts.dilation[i]);
        if (opts.padding[i] < 0) return em__fail(EM_ERR_INVALID, "%s: padding (%lld) must be >= 0", fn, (long long)opts.padding[i]);
        if (opts.padding_same && opts.stride[i] != 1)
            return em__fail(EM_ERR_INVALID, "%s: padding='same' is not supported for strided convolutions (stride %lld)", fn,
                            (long long)opts.stride[i]);
        if (transposed && opts.output_padding[i] != 0 &&
            !(opts.output_padding[i] >= 0 && (opts.output_padding[i] < opts.stride[i] || opts.output_padding[i] < opts.dilation[i])))
            return em__fail(EM_ERR_INVALID, "%s: output_padding (%lld) must be smaller than either stride (%lld) or dilation (%lld)", fn,
                            (long long)opts.output_padding[i], (long long)opts.stride[i], (long long)opts.dilation[i]);
    }
    if (transposed && (opts.padding_same || opts.padding_end[0] >= 0 || opts.padding_end[1] >= 0))
        return em__fail(EM_ERR_INVALID, "%s: padding_same and padding_end are not supported by ConvTranspose2d", fn);
    em__conv_impl *c = calloc(1, sizeof *c);
    if (!c) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    c->spatial = spatial;
    c->transposed = transposed;
    c->in_channels = in;
    c->out_channels = out;
    c->kernel[0] = kh;
    c->kernel[1] = kw;
    c->opts = opts;
    em_module *m = em_module_new(vt, c);
    if (!m) {
        free(c);
        return NULL;
    }
    int64_t ws[4] = {transposed ? in : out, transposed ? out / opts.groups : in / opts.groups, kh, kw};
    em_tensor *w = new_param(ws, spatial == 1 ? 3 : 4, EM_F32);
    /* torch _ConvNd.reset_parameters: kaiming_uniform_(weight, a=sqrt(5)); fan_in
     * from the weight's shape (ConvTranspose: (out/groups) * prod(k)); bias ~
     * U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
    int64_t fan_in = 0;
    em_status st = w ? em_init_kaiming_uniform_(w, sqrt(5.0), EM_FAN_IN, EM_NONLIN_LEAKY_RELU) : em_last_status();
    if (st == EM_OK) st = em_init_fans(w, &fan_in, NULL);
    if (st == EM_OK) {
        c->weight = w;
        st = em_module_add_param(m, "weight", w);
    }
    em_tensor_release(w);
    if (st == EM_OK && bias) {
        em_tensor *b = new_param(&out, 1, EM_F32);
        double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
        st = b ? em_init_uniform_(b, -bound, bound) : em_last_status();
        if (st == EM_OK) {
            c->bias = b;
            st = em_module_add_param(m, "bias", b);
        }
        em_tensor_release(b);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_conv1d_new(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const em_conv_opts *o, bool bias)
{
    return conv_new(&CONV1D_VT, 1, false, in_channels, out_channels, kernel_size, 1, o, bias, "em_conv1d_new");
}

em_module *em_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw, const em_conv_opts *o, bool bias)
{
    return conv_new(&CONV2D_VT, 2, false, in_channels, out_channels, kh, kw, o, bias, "em_conv2d_new");
}

em_module *em_conv_transpose2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw, const em_conv_opts *o, bool bias)
{
    return conv_new(&CONV_T2D_VT, 2, true, in_channels, out_channels, kh, kw, o, bias, "em_conv_transpose2d_new");
}

/* ---- pooling ------------------------------------------------------------------------------ */

static em_tensor *max_pool_forward(em_module *m, const em_tensor *x)
{
    return em_max_pool2d(x, &((em__pool_impl *)em_module_impl(m))->opts, NULL);
}
static em_tensor *avg_pool_forward(em_module *m, const em_tensor *x)
{
    return em_avg_pool2d(x, &((em__pool_impl *)em_module_impl(m))->opts);
}
static em_tensor *adaptive_avg_forward(em_module *m, const em_tensor *x)
{
    em__pool_impl *p = em_module_impl(m);
    return em_adaptive_avg_pool2d(x, p->out[0], p->out[1]);
}

static const em_module_vtable MAX_POOL_VT = {"MaxPool2d", max_pool_forward, free};
static const em_module_vtable AVG_POOL_VT = {"AvgPool2d", avg_pool_forward, free};
static const em_module_vtable ADAPTIVE_AVG_VT = {"AdaptiveAvgPool2d", adaptive_avg_forward, free};

static em_module *pool_new(const em_module_vtable *vt, const em_pool_opts *o, int64_t oh, int64_t ow, const char *fn)
{
    em__pool_impl *p = calloc(1, sizeof *p);
    if (!p) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    if (o) p->opts = *o;
    p->out[0] = oh;
    p->out[1] = ow;
    em_module *m = em_module_new(vt, p);
    if (!m) free(p);
    return m;
}

static bool check_pool_opts(const em_pool_opts *o, bool is_max, const char *fn)
{
    if (!o) {
        em__fail(EM_ERR_INVALID, "%s: options are NULL: the kernel size has no default (use em_pool_opts_default(kh, kw))", fn);
        return false;
    }
    for (int i = 0; i < 2; i++) {
        /* stride 0 means the kernel size (PyTorch's stride=None), as the front end reads it */
        if (o->kernel_size[i] <= 0 || o->stride[i] < 0 || (is_max && o->dilation[i] <= 0)) {
            em__fail(EM_ERR_INVALID, "%s: kernel_size (%lld, %lld)%s must be > 0 and stride (%lld, %lld) >= 0", fn,
                     (long long)o->kernel_size[0], (long long)o->kernel_size[1], is_max ? " and dilation" : "", (long long)o->stride[0],
                     (long long)o->stride[1]);
            return false;
        }
        if (o->padding[i] < 0 || o->padding[i] > o->kernel_size[i] / 2) {
            em__fail(EM_ERR_INVALID, "%s: padding (%lld, %lld) must be >= 0 and at most half the kernel size (%lld, %lld)", fn,
                     (long long)o->padding[0], (long long)o->padding[1], (long long)o->kernel_size[0], (long long)o->kernel_size[1]);
            return false;
        }
    }
    return true;
}

em_module *em_max_pool2d_new(const em_pool_opts *o)
{
    if (!check_pool_opts(o, true, "em_max_pool2d_new")) return NULL;
    return pool_new(&MAX_POOL_VT, o, 0, 0, "em_max_pool2d_new");
}

em_module *em_avg_pool2d_new(const em_pool_opts *o)
{
    if (!check_pool_opts(o, false, "em_avg_pool2d_new")) return NULL;
    return pool_new(&AVG_POOL_VT, o, 0, 0, "em_avg_pool2d_new");
}

em_module *em_adaptive_avg_pool2d_new(int64_t oh, int64_t ow)
{
    if (oh <= 0 || ow <= 0)
        return em__fail(EM_ERR_INVALID, "em_adaptive_avg_pool2d_new: output size (%lld, %lld) must be > 0", (long long)oh, (long long)ow);
    return pool_new(&ADAPTIVE_AVG_VT, NULL, oh, ow, "em_adaptive_avg_pool2d_new");
}

/* ---- BatchNorm1d / BatchNorm2d ---------------------------------------------------------------- */

static em_tensor *batch_norm_forward(em_module *m, const em_tensor *x, bool is2d)
{
    em__batch_norm_impl *b = em_module_impl(m);
    if (!x) return em__fail_null("%s: input is NULL", em_module_type_name(m));
    int nd = em_tensor_ndim(x);
    if (is2d ? nd != 4 : (nd != 2 && nd != 3)) {
        char sx[160];
        return em__fail(EM_ERR_SHAPE, "%s: expected %s input, got shape %s", em_module_type_name(m), is2d ? "4-D [N, C, H, W]" : "2-D [N, C] or 3-D [N, C, L]",
                        NN_SHAPE(x, sx));
    }
    if (em_tensor_dim(x, 1) != b->num_features) {
        char sx[160];
        return em__fail(EM_ERR_SHAPE, "%s: input of shape %s has %lld channels, the module was built for num_features = %lld",
                        em_module_type_name(m), NN_SHAPE(x, sx), (long long)em_tensor_dim(x, 1), (long long)b->num_features);
    }
    bool training = em_module_is_training(m);
    /* torch _BatchNorm.forward: batch statistics in training, and also in eval
     * when running statistics are not tracked; the buffers are updated in
     * training only. */
    bool use_batch = training || !b->track_running_stats;
    em_tensor *rm = b->track_running_stats ? b->running_mean : NULL, *rv = b->track_running_stats ? b->running_var : NULL;
    em_scope_begin();
    em_tensor *y = em_batch_norm(x, rm, rv, b->weight, b->bias, use_batch, b->momentum, b->eps);
    if (y && training && b->num_batches_tracked) { /* counted after a successful forward only */
        em_no_grad_begin();
        if (em_copy_(b->num_batches_tracked, em_add_scalar(b->num_batches_tracked, 1)) != EM_OK) y = NULL;
        em_no_grad_end();
    }
    return nn_return(y);
}

static em_tensor *batch_norm1d_forward(em_module *m, const em_tensor *x) { return batch_norm_forward(m, x, false); }
static em_tensor *batch_norm2d_forward(em_module *m, const em_tensor *x) { return batch_norm_forward(m, x, true); }

static const em_module_vtable BATCH_NORM1D_VT = {"BatchNorm1d", batch_norm1d_forward, free};
static const em_module_vtable BATCH_NORM2D_VT = {"BatchNorm2d", batch_norm2d_forward, free};

/* Registers parameter (param true) or buffer @p name made of @p t (the local
 * reference is dropped); *slot borrows it. */
static em_status give(em_module *m, const char *name, em_tensor *t, bool param, em_tensor **slot)
{
    if (!t) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    em_status st = param ? em_module_add_param(m, name, t) : em_module_add_buffer(m, name, t);
    if (st == EM_OK) *slot = t;
    em_tensor_release(t);
    return st;
}

static em_module *batch_norm_new(const em_module_vtable *vt, int64_t nf, double eps, double momentum, bool affine_, bool track,
                                 const char *fn)
{
    if (nf <= 0) return em__fail(EM_ERR_INVALID, "%s: num_features must be > 0, got %lld", fn, (long long)nf);
    if (!(eps >= 0)) return em__fail(EM_ERR_INVALID, "%s: eps must be >= 0, got %g", fn, eps);
    if (!(momentum >= 0 && momentum <= 1))
        return em__fail(EM_ERR_INVALID, "%s: momentum must be in [0, 1], got %g (momentum=None, the cumulative average, is not supported)",
                        fn, momentum);
    em__batch_norm_impl *b = calloc(1, sizeof *b);
    if (!b) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    b->num_features = nf;
    b->eps = eps;
    b->momentum = momentum;
    b->affine = affine_;
    b->track_running_stats = track;
    em_module *m = em_module_new(vt, b);
    if (!m) {
        free(b);
        return NULL;
    }
    em_status st = EM_OK;
    if (affine_) {
        em_tensor *w = new_param(&nf, 1, EM_F32);
        st = w ? em_init_ones_(w) : em_last_status();
        st = st == EM_OK ? give(m, "weight", w, true, &b->weight) : (em_tensor_release(w), st);
        if (st == EM_OK) st = give(m, "bias", new_param(&nf, 1, EM_F32), true, &b->bias);
    }
    if (st == EM_OK && track) {
        st = give(m, "running_mean", new_param(&nf, 1, EM_F32), false, &b->running_mean);
        if (st == EM_OK) {
            em_tensor *rv = new_param(&nf, 1, EM_F32);
            st = rv ? em_init_ones_(rv) : em_last_status();
            st = st == EM_OK ? give(m, "running_var", rv, false, &b->running_var) : (em_tensor_release(rv), st);
        }
        if (st == EM_OK) st = give(m, "num_batches_tracked", new_param(&nf, 0, EM_I64), false, &b->num_batches_tracked);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_batch_norm1d_new(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
{
    return batch_norm_new(&BATCH_NORM1D_VT, num_features, eps, momentum, affine, track_running_stats, "em_batch_norm1d_new");
}

em_module *em_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
{
    return batch_norm_new(&BATCH_NORM2D_VT, num_features, eps, momentum, affine, track_running_stats, "em_batch_norm2d_new");
}

/* ---- GroupNorm ------------------------------------------------------------------------------ */

static em_tensor *group_norm_forward(em_module *m, const em_tensor *x)
{
    em__group_norm_impl *g = em_module_impl(m);
    if (x && em_tensor_ndim(x) >= 2 && em_tensor_dim(x, 1) != g->num_channels) {
        char sx[160];
        return em__fail(EM_ERR_SHAPE, "GroupNorm: input of shape %s has %lld channels, the module was built for num_channels = %lld",
                        NN_SHAPE(x, sx), (long long)em_tensor_dim(x, 1), (long long)g->num_channels);
    }
    return em_group_norm(x, g->num_groups, g->weight, g->bias, g->eps);
}

static const em_module_vtable GROUP_NORM_VT = {"GroupNorm", group_norm_forward, free};

em_module *em_group_norm_new(int64_t num_groups, int64_t num_channels, double eps, bool affine_)
{
    static const char *fn = "em_group_norm_new";
    if (num_groups <= 0 || num_channels <= 0 || num_channels % num_groups != 0)
        return em__fail(EM_ERR_INVALID, "%s: num_channels (%lld) must be divisible by num_groups (%lld), both > 0", fn,
                        (long long)num_channels, (long long)num_groups);
    if (!(eps >= 0)) return em__fail(EM_ERR_INVALID, "%s: eps must be >= 0, got %g", fn, eps);
    em__group_norm_impl *g = calloc(1, sizeof *g);
    if (!g) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    g->num_groups = num_groups;
    g->num_channels = num_channels;
    g->eps = eps;
    g->affine = affine_;
    em_module *m = em_module_new(&GROUP_NORM_VT, g);
    if (!m) {
        free(g);
        return NULL;
    }
    em_status st = EM_OK;
    if (affine_) {
        em_tensor *w = new_param(&num_channels, 1, EM_F32);
        st = w ? em_init_ones_(w) : em_last_status();
        st = st == EM_OK ? give(m, "weight", w, true, &g->weight) : (em_tensor_release(w), st);
        if (st == EM_OK) st = give(m, "bias", new_param(&num_channels, 1, EM_F32), true, &g->bias);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Flatten, Dropout2d, Upsample ---------------------------------------------------------------- */

static em_tensor *flatten_forward(em_module *m, const em_tensor *x)
{
    em__flatten_impl *f = em_module_impl(m);
    return em_flatten(x, f->start_dim, f->end_dim);
}

static const em_module_vtable FLATTEN_VT = {"Flatten", flatten_forward, free};

em_module *em_flatten_new(int start_dim, int end_dim)
{
    em__flatten_impl *f = malloc(sizeof *f);
    if (!f) return em__fail(EM_ERR_NOMEM, "em_flatten_new: out of memory");
    f->start_dim = start_dim;
    f->end_dim = end_dim;
    em_module *m = em_module_new(&FLATTEN_VT, f);
    if (!m) free(f);
    return m;
}

/* torch.nn.functional.dropout2d: one Bernoulli(1 - p) draw per (n, c), the
 * kept channels scaled by 1 / (1 - p). */
static em_tensor *dropout2d_forward(em_module *m, const em_tensor *x)
{
    double p = *(double *)em_module_impl(m);
    if (!x) return em__fail_null("Dropout2d: input is NULL");
    char sx[160];
    if (em_tensor_ndim(x) != 4) return em__fail(EM_ERR_SHAPE, "Dropout2d: expected a 4-D input [N, C, H, W], got shape %s", NN_SHAPE(x, sx));
    if (!em_module_is_training(m) || p == 0) return em_reshape(x, em_tensor_shape(x), 4);
    em_dtype dt = em_tensor_dtype(x);
    if (!em_dtype_is_float(dt)) return em__fail(EM_ERR_DTYPE, "Dropout2d: input must be float, got %s", em_dtype_name(dt));
    em_scope_begin();
    em_tensor *y;
    if (p == 1) {
        y = em_mul_scalar(x, 0.0);
    } else {
        int64_t ms[4] = {em_tensor_dim(x, 0), em_tensor_dim(x, 1), 1, 1};
        em_tensor *mask = em_rand_bernoulli(ms, 4, dt, 1.0 - p);
        y = em_mul(x, em_mul_scalar(mask, 1.0 / (1.0 - p)));
    }
    return nn_return(y);
}

static const em_module_vtable DROPOUT2D_VT = {"Dropout2d", dropout2d_forward, free};

em_module *em_dropout2d_new(double p)
{
    if (!(p >= 0 && p <= 1)) return em__fail(EM_ERR_INVALID, "em_dropout2d_new: probability must be in [0, 1], got %g", p);
    double *pp = malloc(sizeof *pp);
    if (!pp) return em__fail(EM_ERR_NOMEM, "em_dropout2d_new: out of memory");
    *pp = p;
    em_module *m = em_module_new(&DROPOUT2D_VT, pp);
    if (!m) free(pp);
    return m;
}

static em_tensor *upsample_forward(em_module *m, const em_tensor *x)
{
    em__upsample_impl *u = em_module_impl(m);
    return em_interpolate(x, u->size[0], u->size[1], u->mode, u->align_corners);
}

static const em_module_vtable UPSAMPLE_VT = {"Upsample", upsample_forward, free};

em_module *em_upsample_new(int64_t oh, int64_t ow, em_interp_mode mode, bool align_corners)
{
    if (oh <= 0 || ow <= 0)
        return em__fail(EM_ERR_INVALID, "em_upsample_new: size (%lld, %lld) must be > 0", (long long)oh, (long long)ow);
    if (mode != EM_INTERP_NEAREST && mode != EM_INTERP_BILINEAR) return em__fail(EM_ERR_INVALID, "em_upsample_new: unknown mode %d", (int)mode);
    if (mode == EM_INTERP_NEAREST && align_corners)
        return em__fail(EM_ERR_INVALID, "em_upsample_new: align_corners can only be set with mode bilinear, not nearest");
    em__upsample_impl *u = malloc(sizeof *u);
    if (!u) return em__fail(EM_ERR_NOMEM, "em_upsample_new: out of memory");
    u->size[0] = oh;
    u->size[1] = ow;
    u->mode = mode;
    u->align_corners = align_corners;
    em_module *m = em_module_new(&UPSAMPLE_VT, u);
    if (!m) free(u);
    return m;
}
