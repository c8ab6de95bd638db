/* TEMPORARY (branch `cli` only; DROP THIS FILE when the `nn` branch lands):
 * minimal Conv2d, BatchNorm2d (+ functional em_batch_norm), MaxPool2d and
 * Flatten modules against the declarations of include/ember/nn.h, so that
 * `ember train --model cnn` links and can be tested before the real modules
 * are merged. Keys, buffers and initialisation follow PyTorch, as nn.h says,
 * but only what the CLI uses is covered (no groups checks beyond the op's,
 * no BatchNorm1d, no GroupNorm, ...). */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static em_tensor *tmp_new_param(const int64_t *shape, int ndim, em_dtype dt)
{
    em_scope_begin();
    em_tensor *t = em_zeros(shape, ndim, dt);
    em_tensor_retain(t);
    em_scope_end();
    return t;
}

static em_status tmp_give(em_module *m, const char *name, em_tensor *t, bool param)
{
    em_status st = t ? (param ? em_module_add_param(m, name, t) : em_module_add_buffer(m, name, t)) : em_last_status();
    em_tensor_release(t);
    return st;
}

/* ---- Conv2d ------------------------------------------------------------------ */

typedef struct tmp_conv {
    em_conv_opts o;
} tmp_conv;

static em_tensor *tmp_conv_forward(em_module *m, const em_tensor *x)
{
    tmp_conv *c = em_module_impl(m);
    em_tensor *w = em_module_get_param(m, "weight");
    em_tensor *b = em_module_num_param_tensors(m) > 1 ? em_module_get_param(m, "bias") : NULL;
    return em_conv2d(x, w, b, &c->o);
}

static const em_module_vtable TMP_CONV_VT = {"Conv2d", tmp_conv_forward, free};

em_module *em_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw, const em_conv_opts *o, bool bias)
{
    em_conv_opts co = o ? *o : em_conv_opts_default();
    if (in_channels < 1 || out_channels < 1 || kh < 1 || kw < 1 || co.groups < 1 || in_channels % co.groups ||
        out_channels % co.groups)
        return em__fail(EM_ERR_INVALID, "em_conv2d_new: bad sizes (in %lld, out %lld, kernel %lldx%lld, groups %lld)",
                        (long long)in_channels, (long long)out_channels, (long long)kh, (long long)kw, (long long)co.groups);
    tmp_conv *c = calloc(1, sizeof *c);
    if (!c) return em__fail(EM_ERR_NOMEM, "em_conv2d_new: out of memory");
    c->o = co;
    em_module *m = em_module_new(&TMP_CONV_VT, c);
    if (!m) {
        free(c);
        return NULL;
    }
    int64_t ws[4] = {out_channels, in_channels / co.groups, kh, kw};
    int64_t fan_in = ws[1] * kh * kw;
    double bound = 1.0 / sqrt((double)fan_in);
    em_tensor *w = tmp_new_param(ws, 4, EM_F32);
    em_status st = w ? em_init_kaiming_uniform_(w, sqrt(5.0), EM_FAN_IN, EM_NONLIN_LEAKY_RELU) : em_last_status();
    if (st == EM_OK) st = tmp_give(m, "weight", w, true);
    else em_tensor_release(w);
    if (st == EM_OK && bias) {
        em_tensor *b = tmp_new_param(&ws[0], 1, EM_F32);
        st = b ? em_init_uniform_(b, -bound, bound) : em_last_status();
        if (st == EM_OK) st = tmp_give(m, "bias", b, true);
        else em_tensor_release(b);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- batch norm ---------------------------------------------------------------- */

em_tensor *em_batch_norm(const em_tensor *x, em_tensor *running_mean, em_tensor *running_var, const em_tensor *weight,
                         const em_tensor *bias, bool training, double momentum, double eps)
{
    if (!x) return em__fail(EM_ERR_INVALID, "em_batch_norm: input is NULL");
    int nd = em_tensor_ndim(x);
    if (nd < 2 || nd > 5) return em__fail(EM_ERR_SHAPE, "em_batch_norm: input must have rank 2 to 5, got %d", nd);
    int64_t C = em_tensor_dim(x, 1);
    int dims[EM_MAX_DIMS], nr = 0;
    int64_t bshape[EM_MAX_DIMS], count = 1;
    for (int i = 0; i < nd; i++) {
        bshape[i] = i == 1 ? C : 1;
        if (i != 1) {
            dims[nr++] = i;
            count *= em_tensor_dim(x, i);
        }
    }
    if (!training && (!running_mean || !running_var))
        return em__fail(EM_ERR_INVALID, "em_batch_norm: eval mode needs running_mean and running_var");
    if (training && count <= 1)
        return em__fail(EM_ERR_SHAPE, "em_batch_norm: expected more than 1 value per channel when training");
    em_scope_begin();
    em_tensor *mean, *var;
    if (training) {
        mean = em_mean(x, dims, nr, true);
        var = em_var(x, dims, nr, 0.0, true);
        if (running_mean && running_var) {
            em_no_grad_begin();
            em_tensor *bm = em_reshape(em_detach(mean), &C, 1);
            em_tensor *bv = em_mul_scalar(em_reshape(em_detach(var), &C, 1), (double)count / (double)(count - 1));
            em_status s1 = em_copy_(running_mean, em_add(em_mul_scalar(running_mean, 1.0 - momentum), em_mul_scalar(bm, momentum)));
            em_status s2 = em_copy_(running_var, em_add(em_mul_scalar(running_var, 1.0 - momentum), em_mul_scalar(bv, momentum)));
            em_no_grad_end();
            if (s1 != EM_OK || s2 != EM_OK) {
                em_scope_end();
                return NULL;
            }
        }
    } else {
        mean = em_reshape(running_mean, bshape, nd);
        var = em_reshape(running_var, bshape, nd);
    }
    em_tensor *y = em_mul(em_sub(x, mean), em_rsqrt(em_add_scalar(var, eps)));
    if (weight) y = em_mul(y, em_reshape(weight, bshape, nd));
    if (bias) y = em_add(y, em_reshape(bias, bshape, nd));
    return nn_return(y);
}

typedef struct tmp_bn {
    double eps, momentum;
    bool affine, track;
} tmp_bn;

static em_tensor *tmp_bn_forward(em_module *m, const em_tensor *x)
{
    tmp_bn *b = em_module_impl(m);
    bool training = em_module_is_training(m);
    em_tensor *rm = b->track ? em_module_get_buffer(m, "running_mean") : NULL;
    em_tensor *rv = b->track ? em_module_get_buffer(m, "running_var") : NULL;
    em_tensor *w = b->affine ? em_module_get_param(m, "weight") : NULL;
    em_tensor *bb = b->affine ? em_module_get_param(m, "bias") : NULL;
    if (b->track && training) {
        em_tensor *nbt = em_module_get_buffer(m, "num_batches_tracked");
        em_scope_begin();
        em_no_grad_begin();
        em_copy_(nbt, em_add_scalar(nbt, 1.0));
        em_no_grad_end();
        em_scope_end();
    }
    return em_batch_norm(x, rm, rv, w, bb, training || !b->track, b->momentum, b->eps);
}

static const em_module_vtable TMP_BN2D_VT = {"BatchNorm2d", tmp_bn_forward, free};

em_module *em_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats)
{
    if (num_features < 1) return em__fail(EM_ERR_INVALID, "em_batch_norm2d_new: num_features %lld < 1", (long long)num_features);
    tmp_bn *b = calloc(1, sizeof *b);
    if (!b) return em__fail(EM_ERR_NOMEM, "em_batch_norm2d_new: out of memory");
    *b = (tmp_bn){eps, momentum, affine, track_running_stats};
    em_module *m = em_module_new(&TMP_BN2D_VT, b);
    if (!m) {
        free(b);
        return NULL;
    }
    em_status st = EM_OK;
    if (affine) {
        em_tensor *w = tmp_new_param(&num_features, 1, EM_F32);
        st = w ? em_init_ones_(w) : em_last_status();
        st = st == EM_OK ? tmp_give(m, "weight", w, true) : (em_tensor_release(w), st);
        if (st == EM_OK) st = tmp_give(m, "bias", tmp_new_param(&num_features, 1, EM_F32), true);
    }
    if (st == EM_OK && track_running_stats) {
        st = tmp_give(m, "running_mean", tmp_new_param(&num_features, 1, EM_F32), false);
        if (st == EM_OK) {
            em_tensor *v = tmp_new_param(&num_features, 1, EM_F32);
            st = v ? em_init_ones_(v) : em_last_status();
            st = st == EM_OK ? tmp_give(m, "running_var", v, false) : (em_tensor_release(v), st);
        }
        if (st == EM_OK) st = tmp_give(m, "num_batches_tracked", tmp_new_param(NULL, 0, EM_I64), false);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- MaxPool2d ------------------------------------------------------------------ */

static em_tensor *tmp_pool_forward(em_module *m, const em_tensor *x)
{
    return em_max_pool2d(x, (const em_pool_opts *)em_module_impl(m), NULL);
}

static const em_module_vtable TMP_POOL_VT = {"MaxPool2d", tmp_pool_forward, free};

em_module *em_max_pool2d_new(const em_pool_opts *o)
{
    if (!o) return em__fail(EM_ERR_INVALID, "em_max_pool2d_new: options are NULL (use em_pool_opts_default(kh, kw))");
    em_pool_opts *p = malloc(sizeof *p);
    if (!p) return em__fail(EM_ERR_NOMEM, "em_max_pool2d_new: out of memory");
    *p = *o;
    em_module *m = em_module_new(&TMP_POOL_VT, p);
    if (!m) free(p);
    return m;
}

/* ---- Flatten ---------------------------------------------------------------------- */

typedef struct tmp_flat {
    int start, end;
} tmp_flat;

static em_tensor *tmp_flat_forward(em_module *m, const em_tensor *x)
{
    tmp_flat *f = em_module_impl(m);
    return em_flatten(x, f->start, f->end);
}

static const em_module_vtable TMP_FLAT_VT = {"Flatten", tmp_flat_forward, free};

em_module *em_flatten_new(int start_dim, int end_dim)
{
    tmp_flat *f = malloc(sizeof *f);
    if (!f) return em__fail(EM_ERR_NOMEM, "em_flatten_new: out of memory");
    *f = (tmp_flat){start_dim, end_dim};
    em_module *m = em_module_new(&TMP_FLAT_VT, f);
    if (!m) free(f);
    return m;
}
