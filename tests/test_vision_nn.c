/* Tests of the vision part of nn against PyTorch 1.13 (tests/fixtures/
 * vision_nn_fixtures.txt and vision_cnn.safetensors, written by
 * gen_vision_nn_fixtures.py): em_batch_norm (training, running statistics,
 * eval), BatchNorm1d/2d over three steps with momentum 0.1 and 0.3,
 * em_group_norm / em_instance_norm, em_interpolate (nearest, bilinear with
 * both align_corners, up and down, non-integer ratios), em_pad_mode
 * (reflect, replicate, circular), forwards and gradients; every vision
 * module's type, parameter / buffer keys, shapes, initialisation bound and
 * forward; Dropout2d; a PyTorch CNN's state_dict loaded from SafeTensors
 * into an em_sequential of these modules (eval logits); error messages; a
 * small CNN of all of them learning a batch without leaking tensors;
 * checkpoints keeping the BatchNorm buffers. */
#include "fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fx_block *BS;
static int NBS;

static void load_fixtures(void)
{
    if (!BS) NBS = fx_load("vision_nn_fixtures.txt", &BS);
    assert_true(NBS >= 60);
}

static bool starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

static em_dtype block_dtype(const fx_block *b) { return !strcmp(b->dtype, "float32") ? EM_F32 : EM_F64; }

/* Fails unless t has the fixture tensor's shape and values (within tolerance). */
static void check(const em_tensor *t, const fx_block *b, const char *name, double rtol, double atol)
{
    const fx_tensor *want = fx_get(b, name);
    if (!t) fail_msg("%s: %s is NULL: %s", b->config, name, em_last_error());
    char s1[160], s2[160];
    if (em_tensor_ndim(t) != want->ndim || memcmp(em_tensor_shape(t), want->shape, sizeof(int64_t) * (size_t)want->ndim))
        fail_msg("%s: %s has shape %s, PyTorch %s", b->config, name, em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), s1, sizeof s1),
                 em_shape_str(want->shape, want->ndim, s2, sizeof s2));
    double *v = em_test_values(t);
    for (int64_t i = 0; i < want->n; i++)
        if (!(fabs(v[i] - want->v[i]) <= atol + rtol * fabs(want->v[i]))) {
            double got = v[i];
            free(v);
            fail_msg("%s: %s[%lld] = %.17g, PyTorch %.17g", b->config, name, (long long)i, got, want->v[i]);
        }
    free(v);
}

/* A fixture tensor as a new leaf of dtype dt (scope-owned), requiring grad when asked. */
static em_tensor *leaf(const fx_block *b, const char *name, em_dtype dt, bool grad)
{
    em_tensor *t = fx_new(fx_get(b, name), dt);
    if (grad) assert_int_equal(em_set_requires_grad(t, true), EM_OK);
    return t;
}

/* loss = (out * W).sum(); backward. */
static em_grads *backward_weighted(em_tensor *out, const fx_block *b, const char *wname)
{
    em_tensor *W = fx_new(fx_get(b, wname), em_tensor_dtype(out));
    em_grads *g = em_backward(em_sum_all(em_mul(out, W)));
    if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
    return g;
}

static void set_from(em_tensor *dst, const fx_tensor *src)
{
    em_scope_begin();
    em_tensor *s = em_from_host(src->v, src->shape, src->ndim, EM_F64);
    assert_non_null(s);
    if (em_copy_(dst, s) != EM_OK) fail_msg("em_copy_ %s: %s", src->name, em_last_error());
    em_scope_end();
}

/* ---- batch norm ------------------------------------------------------------------------ */

static void test_batch_norm_functional(void **state)
{
    (void)state;
    load_fixtures();
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "bn_func_")) continue;
        seen++;
        bool training = fx_kw(b, "training", 0) != 0, affine = fx_kw(b, "affine", 1) != 0, running = fx_kw(b, "running", 1) != 0;
        em_scope_begin();
        em_tensor *x = leaf(b, "x", EM_F64, true);
        em_tensor *w = affine ? leaf(b, "weight", EM_F64, true) : NULL;
        em_tensor *bias = affine ? leaf(b, "bias", EM_F64, true) : NULL;
        em_tensor *rm = running ? leaf(b, "rm0", EM_F64, false) : NULL;
        em_tensor *rv = running ? leaf(b, "rv0", EM_F64, false) : NULL;
        em_tensor *out = em_batch_norm(x, rm, rv, w, bias, training, fx_kw(b, "momentum", 0.1), fx_kw(b, "eps", 1e-5));
        check(out, b, "out", 1e-10, 1e-10);
        em_grads *g = backward_weighted(out, b, "W");
        check(em_grad(g, x), b, "gx", 1e-9, 1e-10);
        if (affine) {
            check(em_grad(g, w), b, "gw", 1e-9, 1e-10);
            check(em_grad(g, bias), b, "gb", 1e-9, 1e-10);
        }
        if (running && training) {
            check(rm, b, "rm1", 1e-12, 1e-12);
            check(rv, b, "rv1", 1e-12, 1e-12);
        } else if (running) { /* eval leaves the running statistics alone */
            check(rm, b, "rm0", 0, 0);
            check(rv, b, "rv0", 0, 0);
        }
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(seen, 8);
}

static void test_batch_norm_modules_three_steps(void **state)
{
    (void)state;
    load_fixtures();
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "bn_mod_")) continue;
        seen++;
        char op[32];
        fx_op(b, op, sizeof op);
        int64_t c = fx_get(b, "weight")->n;
        double momentum = fx_kw(b, "momentum", 0.1), eps = fx_kw(b, "eps", 1e-5);
        em_module *m = !strcmp(op, "BatchNorm2d") ? em_batch_norm2d_new(c, eps, momentum, true, true)
                                                  : em_batch_norm1d_new(c, eps, momentum, true, true);
        assert_non_null(m);
        assert_string_equal(em_module_type_name(m), op);
        em_tensor *w = em_module_get_param(m, "weight"), *bias = em_module_get_param(m, "bias");
        set_from(w, fx_get(b, "weight"));
        set_from(bias, fx_get(b, "bias"));
        em_scope_begin();
        em_tensor *x1 = leaf(b, "x1", EM_F32, true);
        em_tensor *out1 = em_module_forward(m, x1);
        check(out1, b, "out1", 1e-5, 1e-5);
        em_grads *g = backward_weighted(out1, b, "W");
        check(em_grad(g, x1), b, "gx1", 1e-4, 2e-5);
        check(em_grad(g, w), b, "gw1", 1e-4, 2e-5);
        check(em_grad(g, bias), b, "gb1", 1e-4, 2e-5);
        em_grads_free(g);
        assert_non_null(em_module_forward(m, leaf(b, "x2", EM_F32, false)));
        assert_non_null(em_module_forward(m, leaf(b, "x3", EM_F32, false)));
        check(em_module_get_buffer(m, "running_mean"), b, "running_mean", 1e-5, 1e-6);
        check(em_module_get_buffer(m, "running_var"), b, "running_var", 1e-5, 1e-6);
        em_tensor *nbt = em_module_get_buffer(m, "num_batches_tracked");
        em_test_check_dtype(nbt, EM_I64, "num_batches_tracked");
        assert_int_equal(em_tensor_ndim(nbt), 0);
        check(nbt, b, "num_batches_tracked", 0, 0); /* 3 */
        /* eval: the running statistics normalise, and nothing is updated */
        em_module_train(m, false);
        em_tensor *xe = leaf(b, "xe", EM_F32, true);
        em_tensor *oute = em_module_forward(m, xe);
        check(oute, b, "oute", 1e-5, 1e-5);
        g = backward_weighted(oute, b, "We");
        check(em_grad(g, xe), b, "gxe", 1e-5, 1e-5);
        em_grads_free(g);
        check(em_module_get_buffer(m, "running_mean"), b, "running_mean", 1e-5, 1e-6);
        check(nbt, b, "num_batches_tracked", 0, 0);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(seen, 4);
}

/* ---- group norm ------------------------------------------------------------------------- */

static void test_group_norm(void **state)
{
    (void)state;
    load_fixtures();
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "gn_") && !starts(b->config, "in_")) continue;
        seen++;
        char op[32];
        fx_op(b, op, sizeof op);
        bool affine = fx_kw(b, "affine", 1) != 0;
        double eps = fx_kw(b, "eps", 1e-5);
        em_scope_begin();
        em_tensor *x = leaf(b, "x", EM_F64, true);
        em_tensor *w = affine ? leaf(b, "weight", EM_F64, true) : NULL;
        em_tensor *bias = affine ? leaf(b, "bias", EM_F64, true) : NULL;
        em_tensor *out = !strcmp(op, "instance_norm") ? em_instance_norm(x, w, bias, eps)
                                                      : em_group_norm(x, (int64_t)fx_kw(b, "groups", 1), w, bias, eps);
        check(out, b, "out", 1e-10, 1e-10);
        em_grads *g = backward_weighted(out, b, "W");
        check(em_grad(g, x), b, "gx", 1e-9, 1e-10);
        if (affine) {
            check(em_grad(g, w), b, "gw", 1e-9, 1e-10);
            check(em_grad(g, bias), b, "gb", 1e-9, 1e-10);
        }
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(seen, 6);
}

/* ---- interpolate ---------------------------------------------------------------------------- */

static void test_interpolate(void **state)
{
    (void)state;
    load_fixtures();
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "interp_")) continue;
        seen++;
        char mode[32];
        fx_kw_str(b, "mode", mode, sizeof mode);
        em_interp_mode md = !strcmp(mode, "nearest") ? EM_INTERP_NEAREST : EM_INTERP_BILINEAR;
        em_dtype dt = block_dtype(b);
        double tol = dt == EM_F64 ? 1e-12 : 2e-6;
        em_scope_begin();
        em_tensor *x = leaf(b, "x", dt, true);
        em_tensor *out = em_interpolate(x, (int64_t)fx_kw(b, "oh", 0), (int64_t)fx_kw(b, "ow", 0), md, fx_kw(b, "align_corners", 0) != 0);
        check(out, b, "out", tol, tol);
        em_grads *g = backward_weighted(out, b, "W");
        check(em_grad(g, x), b, "gx", tol, tol);
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(seen, 23);
}

/* ---- pad modes ------------------------------------------------------------------------------- */

static void test_pad_modes(void **state)
{
    (void)state;
    load_fixtures();
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "pad_")) continue;
        seen++;
        char mode[32], ps[64];
        fx_kw_str(b, "mode", mode, sizeof mode);
        fx_kw_str(b, "pads", ps, sizeof ps);
        int64_t pads[8];
        int np = 0;
        for (char *save = NULL, *tok = strtok_r(ps, ",", &save); tok && np < 8; tok = strtok_r(NULL, ",", &save)) pads[np++] = atoll(tok);
        em_pad_mode_kind k = !strcmp(mode, "reflect") ? EM_PAD_REFLECT : !strcmp(mode, "replicate") ? EM_PAD_REPLICATE : EM_PAD_CIRCULAR;
        em_scope_begin();
        em_tensor *x = leaf(b, "x", EM_F64, true);
        em_tensor *out = em_pad_mode(x, pads, np, k, 0.0);
        check(out, b, "out", 0, 0); /* a gather: exact */
        em_grads *g = backward_weighted(out, b, "W");
        check(em_grad(g, x), b, "gx", 1e-12, 1e-12);
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(seen, 8);
    /* constant mode is em_pad; no padding gives the input's values */
    em_scope_begin();
    em_tensor *x = F64((1, 1, 2), 1, 2);
    em_test_expect(em_pad_mode(x, SHAPE(1, 2), 2, EM_PAD_CONSTANT, 7.0), EM_F64, VALS(7, 1, 2, 7, 7), 0, 0, "constant");
    em_test_expect(em_pad_mode(x, SHAPE(0, 0), 2, EM_PAD_REFLECT, 0.0), EM_F64, VALS(1, 2), 0, 0, "zero pads");
    em_scope_end();
}

/* ---- modules: keys, shapes, init, forward ------------------------------------------------------- */

/* The Ember module of fixture block @p name (the same settings as the script's). */
static em_module *module_for(const char *name)
{
    em_conv_opts o = em_conv_opts_default();
    em_pool_opts p;
    if (!strcmp(name, "mod_conv1d")) return em_conv1d_new(4, 6, 3, NULL, true);
    if (!strcmp(name, "mod_conv1d_opts")) {
        o.stride[0] = 2, o.padding[0] = 2, o.dilation[0] = 2, o.groups = 2;
        return em_conv1d_new(4, 6, 3, &o, false);
    }
    if (!strcmp(name, "mod_conv2d")) return em_conv2d_new(3, 8, 3, 5, NULL, true);
    if (!strcmp(name, "mod_conv2d_opts")) {
        o.stride[0] = 2, o.padding[0] = 1, o.padding[1] = 2, o.dilation[1] = 2, o.groups = 2;
        return em_conv2d_new(4, 8, 3, 3, &o, false);
    }
    if (!strcmp(name, "mod_conv2d_same")) {
        o.padding_same = true;
        return em_conv2d_new(2, 3, 2, 3, &o, true);
    }
    if (!strcmp(name, "mod_convt2d")) {
        o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1, o.output_padding[0] = o.output_padding[1] = 1, o.groups = 2;
        return em_conv_transpose2d_new(4, 6, 2, 3, &o, true);
    }
    if (!strcmp(name, "mod_convt2d_plain")) return em_conv_transpose2d_new(3, 2, 3, 3, NULL, false);
    if (!strcmp(name, "mod_maxpool")) {
        p = em_pool_opts_default(2, 2);
        return em_max_pool2d_new(&p);
    }
    if (!strcmp(name, "mod_maxpool_opts")) {
        p = em_pool_opts_default(3, 3);
        p.stride[0] = p.stride[1] = 2, p.padding[0] = p.padding[1] = 1, p.ceil_mode = true;
        return em_max_pool2d_new(&p);
    }
    if (!strcmp(name, "mod_avgpool")) {
        p = em_pool_opts_default(3, 3);
        return em_avg_pool2d_new(&p);
    }
    if (!strcmp(name, "mod_avgpool_opts")) {
        p = em_pool_opts_default(2, 3);
        p.stride[0] = 1, p.stride[1] = 2, p.padding[0] = p.padding[1] = 1, p.count_include_pad = false;
        return em_avg_pool2d_new(&p);
    }
    if (!strcmp(name, "mod_adaptive_avg")) return em_adaptive_avg_pool2d_new(2, 3);
    if (!strcmp(name, "mod_bn1d")) return em_batch_norm1d_new(5, 1e-5, 0.1, true, true);
    if (!strcmp(name, "mod_bn2d")) return em_batch_norm2d_new(3, 1e-5, 0.1, true, true);
    if (!strcmp(name, "mod_bn2d_bare")) return em_batch_norm2d_new(3, 1e-5, 0.1, false, false);
    if (!strcmp(name, "mod_gn")) return em_group_norm_new(2, 6, 1e-5, true);
    if (!strcmp(name, "mod_gn_noaffine")) return em_group_norm_new(3, 6, 1e-5, false);
    if (!strcmp(name, "mod_flatten")) return em_flatten_new(1, -1);
    if (!strcmp(name, "mod_flatten_range")) return em_flatten_new(0, 2);
    if (!strcmp(name, "mod_dropout2d")) return em_dropout2d_new(0.5);
    if (!strcmp(name, "mod_upsample_nearest")) return em_upsample_new(5, 7, EM_INTERP_NEAREST, false);
    if (!strcmp(name, "mod_upsample_bilinear")) return em_upsample_new(5, 7, EM_INTERP_BILINEAR, true);
    fail_msg("no Ember module for fixture %s", name);
    return NULL;
}

typedef struct keylist {
    char k[16][64];
    em_tensor *t[16];
    int n;
} keylist;

static void collect(const char *key, em_tensor *t, void *ud)
{
    keylist *l = ud;
    assert_true(l->n < 16);
    snprintf(l->k[l->n], sizeof l->k[0], "%s", key);
    l->t[l->n++] = t;
}

static void check_keys(const fx_block *b, const keylist *got, const char *prefix)
{
    int j = 0;
    char s1[160], s2[160];
    for (int i = 0; i < b->nt; i++) {
        const fx_tensor *ft = &b->t[i];
        if (!starts(ft->name, prefix)) continue;
        if (j >= got->n) fail_msg("%s: PyTorch has %s, Ember has only %d %s", b->config, ft->name, got->n, prefix);
        if (strcmp(got->k[j], ft->name + 2)) fail_msg("%s: key %d is '%s' in Ember, '%s' in PyTorch", b->config, j, got->k[j], ft->name + 2);
        const em_tensor *t = got->t[j];
        if (em_tensor_ndim(t) != ft->ndim || memcmp(em_tensor_shape(t), ft->shape, sizeof(int64_t) * (size_t)ft->ndim))
            fail_msg("%s: '%s' has shape %s in Ember, %s in PyTorch", b->config, ft->name + 2,
                     em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), s1, sizeof s1), em_shape_str(ft->shape, ft->ndim, s2, sizeof s2));
        em_test_check_dtype(t, !strcmp(ft->name + 2, "num_batches_tracked") ? EM_I64 : EM_F32, ft->name);
        j++;
    }
    if (j != got->n) fail_msg("%s: Ember has %d %s entries, PyTorch %d (first extra: %s)", b->config, got->n, prefix, j, got->k[j]);
}

static double max_abs(const em_tensor *t)
{
    double *v = em_test_values(t), m = 0;
    for (int64_t i = 0; i < em_tensor_numel(t); i++) m = fmax(m, fabs(v[i]));
    free(v);
    return m;
}

static void test_module_keys_init_forward(void **state)
{
    (void)state;
    load_fixtures();
    em_manual_seed(7);
    int seen = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (!starts(b->config, "mod_")) continue;
        seen++;
        char type[64];
        fx_op(b, type, sizeof type);
        em_module *m = module_for(b->config);
        if (!m) fail_msg("%s: %s", b->config, em_last_error());
        assert_string_equal(em_module_type_name(m), type);
        keylist ps = {0}, bufs = {0};
        assert_int_equal(em_module_visit_params(m, collect, &ps), EM_OK);
        assert_int_equal(em_module_visit_buffers(m, collect, &bufs), EM_OK);
        check_keys(b, &ps, "p.");
        check_keys(b, &bufs, "b.");
        /* PyTorch's init: conv weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), norms ones / zeros,
         * running_var ones */
        double fan_in = fx_kw(b, "fan_in", 0);
        for (int k = 0; k < ps.n; k++) {
            double mx = max_abs(ps.t[k]);
            if (fan_in > 0) {
                double bound = 1.0 / sqrt(fan_in);
                if (mx > bound * (1 + 1e-6) || (em_tensor_numel(ps.t[k]) >= 6 && mx < 0.3 * bound))
                    fail_msg("%s: %s has max |value| %g, bound 1/sqrt(fan_in = %g) = %g", b->config, ps.k[k], mx, fan_in, bound);
            } else {
                double *v = em_test_values(ps.t[k]);
                for (int64_t e = 0; e < em_tensor_numel(ps.t[k]); e++)
                    if (v[e] != (!strcmp(ps.k[k], "weight") ? 1.0 : 0.0)) fail_msg("%s: %s[%lld] = %g at init", b->config, ps.k[k], (long long)e, v[e]);
                free(v);
            }
        }
        for (int k = 0; k < bufs.n; k++) {
            double want = !strcmp(bufs.k[k], "running_var") ? 1.0 : 0.0;
            double *v = em_test_values(bufs.t[k]);
            for (int64_t e = 0; e < em_tensor_numel(bufs.t[k]); e++)
                if (v[e] != want) fail_msg("%s: buffer %s[%lld] = %g at init", b->config, bufs.k[k], (long long)e, v[e]);
            free(v);
        }
        /* PyTorch's values, then the forward */
        for (int k = 0; k < ps.n; k++) {
            char nm[40];
            snprintf(nm, sizeof nm, "p.%s", ps.k[k]);
            set_from(ps.t[k], fx_get(b, nm));
        }
        for (int k = 0; k < bufs.n; k++) {
            char nm[40];
            snprintf(nm, sizeof nm, "b.%s", bufs.k[k]);
            set_from(bufs.t[k], fx_get(b, nm));
        }
        em_module_train(m, fx_kw(b, "training", 0) != 0);
        em_scope_begin();
        em_tensor *y = em_module_forward(m, leaf(b, "x", EM_F32, false));
        if (!y) fail_msg("%s: forward: %s", b->config, em_last_error());
        check(y, b, "out", 1e-5, 1e-5);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(seen, 22);
}

static void test_dropout2d(void **state)
{
    (void)state;
    em_manual_seed(11);
    em_module *m = em_dropout2d_new(0.5);
    assert_non_null(m);
    em_scope_begin();
    em_tensor *x = em_full(SHAPE(4, 8, 3, 3), 4, EM_F32, 1.5);
    em_tensor *y = em_module_forward(m, x);
    assert_non_null(y);
    double *v = em_test_values(y);
    int zero = 0, kept = 0;
    for (int p = 0; p < 32; p++) {
        double first = v[p * 9];
        if (first != 0.0 && first != 3.0) fail_msg("channel %d starts with %g: neither dropped (0) nor scaled (1.5 / (1 - p) = 3)", p, first);
        for (int e = 1; e < 9; e++)
            if (v[p * 9 + e] != first) fail_msg("channel %d is not dropped as a whole (%g and %g)", p, first, v[p * 9 + e]);
        if (first == 0.0)
            zero++;
        else
            kept++;
    }
    free(v);
    if (zero < 4 || kept < 4) fail_msg("Dropout2d(0.5) dropped %d of 32 channels", zero);
    /* the gradient goes through the kept channels with the same scale */
    em_tensor *xg = em_ones(SHAPE(2, 3, 2, 2), 4, EM_F32);
    em_set_requires_grad(xg, true);
    em_tensor *yg = em_module_forward(m, xg);
    em_grads *g = em_backward(em_sum_all(yg));
    assert_non_null(g);
    double *gy = em_test_values(yg), *gx = em_test_values(em_grad(g, xg));
    for (int e = 0; e < 24; e++) assert_true(gx[e] == gy[e]); /* d(x * mask / (1-p)) / dx = mask / (1-p) = y for x = 1 */
    free(gy);
    free(gx);
    em_grads_free(g);
    em_module_train(m, false);
    em_test_expect(em_module_forward(m, F32((1, 1, 1, 2), 1, 2)), EM_F32, VALS(1, 2), 0, 0, "eval");
    em_test_assert_error(em_module_forward(m, F32((1, 2), 1, 2)), "Dropout2d", "[1, 2]", NULL);
    em_scope_end();
    em_module_free(m);
}

/* ---- a PyTorch CNN from SafeTensors ------------------------------------------------------------- */

static void test_pytorch_cnn_from_safetensors(void **state)
{
    (void)state;
    load_fixtures();
    const fx_block *b = NULL;
    for (int i = 0; i < NBS; i++)
        if (!strcmp(BS[i].config, "cnn")) b = &BS[i];
    assert_non_null(b);
    em_conv_opts co = em_conv_opts_default();
    co.padding[0] = co.padding[1] = 1;
    em_pool_opts po = em_pool_opts_default(2, 2);
    em_module *mods[6] = {em_conv2d_new(3, 4, 3, 3, &co, true), em_batch_norm2d_new(4, 1e-5, 0.1, true, true), em_relu_new(),
                          em_max_pool2d_new(&po), em_flatten_new(1, -1), em_linear_new(64, 5, true)};
    em_module *net = em_sequential_new(mods, 6);
    assert_non_null(net);
    keylist all = {0};
    assert_int_equal(em_module_visit_params(net, collect, &all), EM_OK);
    assert_int_equal(em_module_visit_buffers(net, collect, &all), EM_OK);
    assert_int_equal(all.n, (int)fx_kw(b, "keys", 0));
    const char *names[16];
    for (int i = 0; i < all.n; i++) names[i] = all.k[i];
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/vision_cnn.safetensors", dir ? dir : "tests/fixtures");
    if (em_safetensors_load_into(path, names, all.t, (size_t)all.n, true) != EM_OK) fail_msg("load: %s", em_last_error());
    double nbt;
    assert_int_equal(em_item(em_module_get_buffer(net, "1.num_batches_tracked"), &nbt), EM_OK);
    assert_true(nbt == 3);
    em_module_train(net, false);
    em_scope_begin();
    em_tensor *logits = em_module_forward(net, leaf(b, "x", EM_F32, false));
    check(logits, b, "logits", 0, 1e-4);
    /* in training mode the batch statistics are used instead: other logits */
    em_module_train(net, true);
    em_tensor *lt = em_module_forward(net, leaf(b, "x", EM_F32, false));
    assert_non_null(lt);
    double *v = em_test_values(lt);
    const fx_tensor *want = fx_get(b, "logits");
    double diff = 0;
    for (int64_t i = 0; i < want->n; i++) diff = fmax(diff, fabs(v[i] - want->v[i]));
    free(v);
    assert_true(diff > 1e-3);
    em_scope_end();
    em_module_free(net);
}

/* ---- errors -------------------------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    /* batch norm */
    em_tensor *x13 = F32((1, 3), 1, 2, 3);
    em_tensor *rm = em_zeros(SHAPE(3), 1, EM_F32), *rv = em_ones(SHAPE(3), 1, EM_F32);
    em_test_assert_error(em_batch_norm(x13, rm, rv, NULL, NULL, true, 0.1, 1e-5), "more than 1 value per channel", "[1, 3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_batch_norm(em_ones(SHAPE(1, 3, 1, 1), 4, EM_F32), NULL, NULL, NULL, NULL, true, 0.1, 1e-5),
                         "more than 1 value per channel", "[1, 3, 1, 1]", NULL);
    assert_non_null(em_batch_norm(x13, rm, rv, NULL, NULL, false, 0.1, 1e-5)); /* eval is fine */
    em_tensor *x234 = em_ones(SHAPE(2, 3, 4), 3, EM_F32);
    em_test_assert_error(em_batch_norm(x234, NULL, NULL, NULL, NULL, false, 0.1, 1e-5), "eval", "running_mean", NULL);
    em_test_assert_error(em_batch_norm(x234, rm, NULL, NULL, NULL, true, 0.1, 1e-5), "both", NULL);
    em_test_assert_error(em_batch_norm(x234, NULL, NULL, em_ones(SHAPE(4), 1, EM_F32), NULL, true, 0.1, 1e-5), "weight of shape [4]",
                         "3 channels", "[2, 3, 4]", NULL);
    em_test_assert_error(em_batch_norm(em_ones(SHAPE(4), 1, EM_F32), NULL, NULL, NULL, NULL, true, 0.1, 1e-5), "[4]", NULL);
    em_module *bn2 = em_batch_norm2d_new(3, 1e-5, 0.1, true, true);
    em_test_assert_error(em_module_forward(bn2, x234), "BatchNorm2d", "4-D", "[2, 3, 4]", NULL);
    em_test_assert_error(em_module_forward(bn2, em_ones(SHAPE(1, 3, 1, 1), 4, EM_F32)), "more than 1 value per channel", NULL);
    em_test_assert_error(em_module_forward(bn2, em_ones(SHAPE(2, 4, 2, 2), 4, EM_F32)), "num_features = 3", "[2, 4, 2, 2]", NULL);
    double nbt;
    assert_int_equal(em_item(em_module_get_buffer(bn2, "num_batches_tracked"), &nbt), EM_OK);
    assert_true(nbt == 0); /* failed forwards count no batch */
    em_module_free(bn2);
    em_module *bn1 = em_batch_norm1d_new(3, 1e-5, 0.1, true, true);
    em_test_assert_error(em_module_forward(bn1, em_ones(SHAPE(2, 3, 2, 2), 4, EM_F32)), "BatchNorm1d", "[2, 3, 2, 2]", NULL);
    em_module_free(bn1);
    assert_null(em_batch_norm2d_new(0, 1e-5, 0.1, true, true));
    em_test_assert_error(NULL, "num_features", NULL);
    assert_null(em_batch_norm2d_new(3, 1e-5, -1, true, true));
    em_test_assert_error(NULL, "momentum", NULL);
    /* group norm */
    em_tensor *x263 = em_ones(SHAPE(2, 6, 3), 3, EM_F32);
    em_test_assert_error(em_group_norm(x263, 4, NULL, NULL, 1e-5), "6 channels", "[2, 6, 3]", "num_groups = 4", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_group_norm(x263, 0, NULL, NULL, 1e-5), "num_groups = 0", NULL);
    em_test_assert_error(em_group_norm(x263, 3, em_ones(SHAPE(3), 1, EM_F32), NULL, 1e-5), "weight of shape [3]", NULL);
    assert_null(em_group_norm_new(4, 6, 1e-5, true));
    em_test_assert_error(NULL, "num_channels (6)", "num_groups (4)", NULL);
    em_module *gn = em_group_norm_new(3, 6, 1e-5, true);
    em_test_assert_error(em_module_forward(gn, em_ones(SHAPE(2, 3, 3), 3, EM_F32)), "GroupNorm", "num_channels = 6", NULL);
    em_module_free(gn);
    /* interpolate */
    em_tensor *x4 = em_ones(SHAPE(1, 1, 2, 2), 4, EM_F32);
    em_test_assert_error(em_interpolate(x263, 4, 4, EM_INTERP_NEAREST, false), "[N, C, H, W]", "[2, 6, 3]", NULL);
    em_test_assert_error(em_interpolate(x4, 4, 4, EM_INTERP_NEAREST, true), "align_corners", NULL);
    em_test_assert_error(em_interpolate(x4, 0, 4, EM_INTERP_BILINEAR, false), "greater than 0", NULL);
    em_test_assert_error(em_interpolate(em_ones(SHAPE(1, 1, 2, 2), 4, EM_I64), 3, 3, EM_INTERP_BILINEAR, false), "float", NULL);
    assert_null(em_upsample_new(4, 4, EM_INTERP_NEAREST, true));
    /* pad modes */
    em_tensor *x123 = em_ones(SHAPE(1, 2, 3), 3, EM_F32);
    em_test_assert_error(em_pad_mode(x123, SHAPE(3, 0), 2, EM_PAD_REFLECT, 0), "reflect", "smaller", "[1, 2, 3]", "(3, 0)", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    assert_non_null(em_pad_mode(x123, SHAPE(2, 2), 2, EM_PAD_REFLECT, 0));
    em_test_assert_error(em_pad_mode(x123, SHAPE(4, 0), 2, EM_PAD_CIRCULAR, 0), "circular", "more than once", "[1, 2, 3]", NULL);
    assert_non_null(em_pad_mode(x123, SHAPE(3, 3), 2, EM_PAD_CIRCULAR, 0));
    em_test_assert_error(em_pad_mode(x123, SHAPE(-1, 0), 2, EM_PAD_REPLICATE, 0), "non-negative", "(-1, 0)", NULL);
    em_test_assert_error(em_pad_mode(x123, SHAPE(1, 1, 1), 3, EM_PAD_REPLICATE, 0), "2, 4 or 6 pads", "[1, 2, 3]", NULL);
    em_test_assert_error(em_pad_mode(x123, SHAPE(1, 1, 1, 1, 1, 1, 1, 1), 8, EM_PAD_REPLICATE, 0), "2, 4 or 6 pads", NULL);
    em_test_assert_error(em_pad_mode(em_ones(SHAPE(2, 0), 2, EM_F32), SHAPE(1, 1), 2, EM_PAD_REPLICATE, 0), "empty dim", NULL);
    em_test_assert_error(em_pad_mode(x123, SHAPE(1, 1), 2, (em_pad_mode_kind)9, 0), "unknown padding mode", NULL);
    /* module constructors */
    assert_null(em_conv2d_new(3, 8, 3, 3, &(em_conv_opts){.stride = {1, 1}, .dilation = {1, 1}, .padding_end = {-1, -1}, .groups = 2}, true));
    em_test_assert_error(NULL, "in_channels (3)", "groups (2)", NULL);
    assert_null(em_conv2d_new(3, 8, 0, 3, NULL, true));
    em_test_assert_error(NULL, "kernel size", NULL);
    em_conv_opts so = em_conv_opts_default();
    so.padding_same = true;
    so.stride[0] = 2;
    assert_null(em_conv2d_new(3, 8, 3, 3, &so, true));
    em_test_assert_error(NULL, "same", "strided", NULL);
    em_conv_opts op = em_conv_opts_default();
    op.output_padding[0] = 1;
    assert_null(em_conv_transpose2d_new(3, 8, 3, 3, &op, true));
    em_test_assert_error(NULL, "output_padding", NULL);
    assert_null(em_max_pool2d_new(NULL));
    em_test_assert_error(NULL, "kernel size", NULL);
    em_pool_opts pp = em_pool_opts_default(2, 2);
    pp.padding[0] = 2;
    assert_null(em_avg_pool2d_new(&pp));
    em_test_assert_error(NULL, "padding", "half", NULL);
    assert_null(em_adaptive_avg_pool2d_new(0, 2));
    assert_null(em_dropout2d_new(1.5));
    em_test_assert_error(NULL, "[0, 1]", NULL);
    /* a conv module given the wrong channels reports the front end's error */
    em_module *c = em_conv2d_new(3, 4, 3, 3, NULL, true);
    assert_null(em_module_forward(c, em_ones(SHAPE(1, 2, 5, 5), 4, EM_F32)));
    assert_true(strstr(em_last_error(), "[1, 2, 5, 5]") != NULL);
    em_module_free(c);
    em_scope_end();
}

/* ---- a small CNN trains, and its steps leak nothing ------------------------------------------ */

/* reflect pad -> conv-bn-relu-maxpool -> bilinear upsample -> head (GroupNorm, Flatten, Linear). */
static em_tensor *cnn_forward(em_module *m, const em_tensor *x)
{
    em_scope_begin();
    em_tensor *h = em_pad_mode(x, SHAPE(1, 1, 1, 1), 4, EM_PAD_REFLECT, 0);
    h = em_module_forward(em_module_get_child(m, "features"), h);
    h = em_interpolate(h, 5, 5, EM_INTERP_BILINEAR, false);
    em_tensor *y = em_keep(em_module_forward(em_module_get_child(m, "head"), h));
    em_scope_end();
    return y;
}
static const em_module_vtable CNN_VT = {"SmallCNN", cnn_forward, NULL};

static void test_cnn_trains_without_leaks(void **state)
{
    (void)state;
    em_manual_seed(5);
    em_pool_opts po = em_pool_opts_default(2, 2);
    em_module *m = em_module_new(&CNN_VT, NULL);
    assert_non_null(m);
    assert_int_equal(em_module_add_child(m, "features",
                                         em_sequential_new((em_module *[]){em_conv2d_new(2, 4, 3, 3, NULL, true),
                                                                           em_batch_norm2d_new(4, 1e-5, 0.1, true, true), em_relu_new(),
                                                                           em_max_pool2d_new(&po), em_dropout2d_new(0.1)},
                                                           5)),
                     EM_OK);
    assert_int_equal(em_module_add_child(m, "head",
                                         em_sequential_new((em_module *[]){em_group_norm_new(2, 4, 1e-5, true), em_flatten_new(1, -1),
                                                                           em_linear_new(100, 3, true)},
                                                           3)),
                     EM_OK);
    assert_int_equal(em_module_num_param_tensors(m), 8);
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    c.lr = 1e-2;
    em_optim *opt = em_optim_new_for_module(&c, m);
    assert_non_null(opt);
    em_tensor *x = em_rand_normal(SHAPE(6, 2, 8, 8), 4, EM_F32, 0, 1);
    int64_t t[6] = {0, 1, 2, 0, 1, 2};
    em_tensor *y = em_from_host(t, SHAPE(6), 1, EM_I64);
    em_stats s0 = {0};
    double first = 0, last = 0;
    for (int it = 0; it < 60; it++) {
        em_scope_begin();
        em_tensor *l = em_cross_entropy(em_module_forward(m, x), y, NULL);
        if (!l) fail_msg("step %d: %s", it, em_last_error());
        em_grads *g = em_backward(l);
        if (!g) fail_msg("step %d: %s", it, em_last_error());
        assert_int_equal(em_grads_count(g), 8);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        if (it == 0) assert_int_equal(em_item(l, &first), EM_OK);
        if (it == 59) assert_int_equal(em_item(l, &last), EM_OK);
        em_scope_end();
        if (it == 9) {
            em_sync();
            s0 = em_get_stats();
        }
    }
    em_test_assert_no_leak(&s0);
    if (!(last < 0.5 * first)) fail_msg("the CNN did not learn 6 samples: loss %g -> %g", first, last);
    double nbt;
    assert_int_equal(em_item(em_module_get_buffer(m, "features.1.num_batches_tracked"), &nbt), EM_OK);
    assert_true(nbt == 60);
    em_tensor_release(x);
    em_tensor_release(y);
    em_optim_free(opt);
    em_module_free(m);
}

/* em_checkpoint_save / _load keep the buffers (running statistics, num_batches_tracked). */
static void test_checkpoint_keeps_buffers(void **state)
{
    (void)state;
    em_manual_seed(3);
    em_module *a = em_sequential_new((em_module *[]){em_conv2d_new(2, 3, 3, 3, NULL, true), em_batch_norm2d_new(3, 1e-5, 0.1, true, true)}, 2);
    em_module *b = em_sequential_new((em_module *[]){em_conv2d_new(2, 3, 3, 3, NULL, true), em_batch_norm2d_new(3, 1e-5, 0.1, true, true)}, 2);
    assert_non_null(a);
    assert_non_null(b);
    em_scope_begin();
    for (int i = 0; i < 2; i++) assert_non_null(em_module_forward(a, em_rand_normal(SHAPE(4, 2, 5, 5), 4, EM_F32, 1.0, 2.0)));
    em_checkpoint_info info;
    memset(&info, 0, sizeof info);
    const char *path = em_test_tmp_path("bn.safetensors");
    if (em_checkpoint_save(path, a, NULL, NULL, &info, NULL, 0) != EM_OK) fail_msg("save: %s", em_last_error());
    if (em_checkpoint_load(path, b, NULL, NULL, &info) != EM_OK) fail_msg("load: %s", em_last_error());
    const char *keys[] = {"1.running_mean", "1.running_var", "1.num_batches_tracked"};
    for (int k = 0; k < 3; k++) {
        double *va = em_test_values(em_module_get_buffer(a, keys[k])), *vb = em_test_values(em_module_get_buffer(b, keys[k]));
        int64_t n = em_tensor_numel(em_module_get_buffer(a, keys[k]));
        for (int64_t e = 0; e < n; e++)
            if (va[e] != vb[e]) fail_msg("%s[%lld]: saved %g, loaded %g", keys[k], (long long)e, va[e], vb[e]);
        if (k == 2) assert_true(vb[0] == 2);
        if (k == 0) assert_true(vb[0] != 0); /* moved away from the initial zeros */
        free(va);
        free(vb);
    }
    assert_true(em_test_max_param_diff(a, b) == 0);
    em_scope_end();
    em_module_free(a);
    em_module_free(b);
}

static int teardown(void **state)
{
    fx_free(BS, NBS);
    BS = NULL;
    return em_test_teardown_tmpdir(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_norm_functional),
        cmocka_unit_test(test_batch_norm_modules_three_steps),
        cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_interpolate),
        cmocka_unit_test(test_pad_modes),
        cmocka_unit_test(test_module_keys_init_forward),
        cmocka_unit_test(test_dropout2d),
        cmocka_unit_test(test_pytorch_cnn_from_safetensors),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_cnn_trains_without_leaks),
        cmocka_unit_test(test_checkpoint_keeps_buffers),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, teardown);
}
