/* Mixed precision (issue #15, include/ember/amp.h): autocast regions (the
 * dtype each op kind runs in, nesting, the per-thread stack, errors), an
 * autocast MLP + cross-entropy against the f32 run, em_grad_scaler against
 * PyTorch's GradScaler trajectory (tests/fixtures/amp_fixtures.txt, written
 * by tests/fixtures/gen_amp_fixtures.py), and the Learner's precision
 * (bf16: the loss falls; f16: the scaler's state makes a resume exact). */
#include "fixture.h"
#include "testutil.h"

#include "ember/amp.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static em_tensor *randn(const int64_t *shape, int nd)
{
    em_tensor *t = em_rand_normal(shape, nd, EM_F32, 0.0, 1.0);
    assert_non_null(t);
    return t;
}

#define DT(t, want) em_test_check_dtype((t), (want), #t)

/* ---- the region stack ------------------------------------------------------------ */

static void test_autocast_stack_and_errors(void **state)
{
    (void)state;
    assert_int_equal(em_autocast_dtype(), EM_F32);
    assert_int_equal(em_autocast_end(), EM_ERR_STATE); /* end without begin */
    assert_non_null(strstr(em_last_error(), "no autocast region"));
    assert_int_equal(em_autocast_begin(EM_I64), EM_ERR_DTYPE);
    assert_int_equal(em_autocast_begin(EM_F64), EM_ERR_DTYPE);
    assert_int_equal(em_autocast_begin((em_dtype)99), EM_ERR_DTYPE);
    assert_int_equal(em_autocast_dtype(), EM_F32); /* nothing was opened */
    assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
    assert_int_equal(em_autocast_dtype(), EM_BF16);
    assert_int_equal(em_autocast_begin(EM_F32), EM_OK); /* autocast(enabled=False) inside */
    assert_int_equal(em_autocast_dtype(), EM_F32);
    assert_int_equal(em_autocast_begin(EM_F16), EM_OK);
    assert_int_equal(em_autocast_dtype(), EM_F16);
    assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_dtype(), EM_F32);
    assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_dtype(), EM_BF16);
    assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_dtype(), EM_F32);
    /* depth limit */
    for (int i = 0; i < EM_AUTOCAST_MAX_DEPTH; i++) assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
    assert_int_equal(em_autocast_begin(EM_BF16), EM_ERR_STATE);
    for (int i = 0; i < EM_AUTOCAST_MAX_DEPTH; i++) assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_end(), EM_ERR_STATE);
}

typedef struct thread_seen {
    em_dtype at_start, inside, after;
    em_dtype matmul;
} thread_seen;

static void *other_thread(void *arg)
{
    thread_seen *s = arg;
    s->at_start = em_autocast_dtype(); /* the main thread's region is not ours */
    em_autocast_begin(EM_F16);
    s->inside = em_autocast_dtype();
    int64_t sh[2] = {2, 2};
    em_tensor *a = em_ones(sh, 2, EM_F32);
    em_tensor *m = a ? em_matmul(a, a) : NULL;
    s->matmul = m ? em_tensor_dtype(m) : EM_DTYPE_COUNT;
    em_tensor_release(m);
    em_tensor_release(a);
    em_autocast_end();
    s->after = em_autocast_dtype();
    return NULL;
}

static void test_autocast_per_thread(void **state)
{
    (void)state;
    assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
    thread_seen s = {0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &s), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(s.at_start, EM_F32);
    assert_int_equal(s.inside, EM_F16);
    assert_int_equal(s.matmul, EM_F16);
    assert_int_equal(s.after, EM_F32);
    assert_int_equal(em_autocast_dtype(), EM_BF16); /* ours is untouched */
    assert_int_equal(em_autocast_end(), EM_OK);
}

/* ---- what each kind runs in ---------------------------------------------------- */

static void test_autocast_picks_per_kind(void **state)
{
    (void)state;
    em_manual_seed(1);
    em_scope_begin();
    int64_t sa[2] = {4, 3}, sb[2] = {3, 5};
    em_tensor *a = randn(sa, 2), *b = randn(sb, 2);
    em_tensor *ref = em_matmul(a, b);
    DT(ref, EM_F32); /* no region: f32 */
    assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
    em_tensor *mm = em_matmul(a, b);
    DT(mm, EM_BF16);
    /* bf16 inputs (8 significant bits), f32 accumulation: within 2^-7 of the norm-sized terms */
    double *r = em_test_values(ref), *m = em_test_values(em_cast(mm, EM_F32)); /* em_test_values reads f32/f64 */
    double worst = 0;
    for (int i = 0; i < 20; i++) worst = fmax(worst, fabs(r[i] - m[i]));
    printf("autocast bf16 matmul [4,3]x[3,5]: max |bf16 - f32| = %.3g\n", worst);
    assert_true(worst < 0.05);
    free(r);
    free(m);
    em_tensor *low = em_cast(a, EM_BF16);
    DT(em_softmax(mm, 1), EM_F32);
    DT(em_log_softmax(mm, 1), EM_F32);
    DT(em_exp(low), EM_F32);
    DT(em_exp(a), EM_F32);
    DT(em_log(em_abs(low)), EM_F32);
    DT(em_pow_scalar(low, 3.0), EM_F32);
    DT(em_sum_all(low), EM_F32);
    DT(em_mean_all(low), EM_F32);
    DT(em_var(low, NULL, 0, 1.0, false), EM_F32);
    DT(em_add(low, a), EM_F32);    /* the usual promotion */
    DT(em_add(low, low), EM_BF16); /* no flag: stays low */
    DT(em_relu(low), EM_BF16);
    DT(em_max(low, NULL, 0, false), EM_BF16);
    DT(em_argmax(low, 1, false), EM_I64);
    /* composites: linear low (bias too), cross-entropy / layer norm / mse f32 */
    int64_t sw[2] = {5, 3}, sbias[1] = {5};
    em_tensor *w = randn(sw, 2), *bias = randn(sbias, 1);
    em_tensor *lin = em_linear(a, w, bias);
    DT(lin, EM_BF16);
    int64_t ys[1] = {4};
    int64_t yv[4] = {0, 4, 2, 1};
    em_tensor *y = em_from_host(yv, ys, 1, EM_I64);
    DT(em_cross_entropy(lin, y, NULL), EM_F32);
    DT(em_layer_norm(lin, 1, NULL, NULL, 1e-5), EM_F32);
    DT(em_mse_loss(lin, em_zeros((int64_t[]){4, 5}, 2, EM_F32), EM_REDUCTION_MEAN), EM_F32);
    /* conv2d low, batch norm f32 */
    int64_t sx[4] = {2, 3, 5, 5}, sk[4] = {4, 3, 3, 3};
    em_tensor *x4 = randn(sx, 4), *k4 = randn(sk, 4);
    em_tensor *cv = em_conv2d(x4, k4, NULL, NULL);
    DT(cv, EM_BF16);
    DT(em_batch_norm(cv, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), EM_F32);
    /* f64 is never cast (torch's is_eligible) */
    DT(em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64)), EM_F64);
    /* a disabled region inside */
    assert_int_equal(em_autocast_begin(EM_F32), EM_OK);
    DT(em_matmul(a, b), EM_F32);
    DT(em_sum_all(low), EM_BF16); /* autocast off: a sum keeps its input's dtype */
    assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_end(), EM_OK);
    assert_int_equal(em_autocast_begin(EM_F16), EM_OK);
    DT(em_matmul(a, b), EM_F16);
    DT(em_softmax(em_matmul(a, b), 0), EM_F32);
    assert_int_equal(em_autocast_end(), EM_OK);
    DT(em_matmul(a, b), EM_F32); /* closed again */
    em_scope_end();
}

/* ---- an MLP and cross-entropy under autocast against f32 ------------------------------- */

#define MLP_IN 12
#define MLP_H 32
#define MLP_OUT 5
#define MLP_N 16

static em_module *mlp(void)
{
    em_module *m = em_sequential_new(NULL, 0);
    assert_non_null(m);
    assert_int_equal(em_sequential_append(m, em_linear_new(MLP_IN, MLP_H, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_relu_new()), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(MLP_H, MLP_OUT, true)), EM_OK);
    return m;
}

/* loss and gradients of every parameter (host copies, caller frees) for one
 * forward in a region of @p dt (EM_F32: none); backward @p inside the region or after it. */
static double run_mlp(em_module *m, const em_tensor *x, const em_tensor *y, em_dtype dt, bool inside, double **grads, int64_t *ng,
                      em_dtype *logits_dt)
{
    em_tensor *ps[8];
    int np = em_module_parameters(m, ps, 8);
    em_scope_begin();
    if (dt != EM_F32) assert_int_equal(em_autocast_begin(dt), EM_OK);
    em_tensor *logits = em_module_forward(m, x);
    assert_non_null(logits);
    *logits_dt = em_tensor_dtype(logits);
    em_tensor *loss = em_cross_entropy(logits, y, NULL);
    assert_non_null(loss);
    DT(loss, EM_F32);
    if (dt != EM_F32 && !inside) assert_int_equal(em_autocast_end(), EM_OK);
    em_grads *g = em_backward(loss);
    assert_non_null(g);
    if (dt != EM_F32 && inside) assert_int_equal(em_autocast_end(), EM_OK);
    double l;
    assert_int_equal(em_item(loss, &l), EM_OK);
    int64_t total = 0;
    for (int i = 0; i < np; i++) total += em_tensor_numel(ps[i]);
    *grads = malloc(sizeof **grads * (size_t)total);
    assert_non_null(*grads);
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
        em_tensor *gi = em_grad(g, ps[i]);
        assert_non_null(gi);
        DT(gi, EM_F32); /* the parameter's dtype: back through the casts */
        double *v = em_test_values(gi);
        memcpy(*grads + off, v, sizeof *v * (size_t)em_tensor_numel(gi));
        off += em_tensor_numel(gi);
        free(v);
    }
    *ng = total;
    em_grads_free(g);
    em_scope_end();
    return l;
}

static void test_autocast_mlp_against_f32(void **state)
{
    (void)state;
    em_manual_seed(7);
    em_module *m = mlp();
    float xv[MLP_N * MLP_IN];
    int64_t yv[MLP_N];
    em_test_class_batch(3, MLP_N, MLP_IN, MLP_OUT, xv, yv);
    em_tensor *x = em_from_host(xv, (int64_t[]){MLP_N, MLP_IN}, 2, EM_F32);
    em_tensor *y = em_from_host(yv, (int64_t[]){MLP_N}, 1, EM_I64);
    double *g32, *gl, *gin;
    int64_t n32, nl, nin;
    em_dtype ld;
    double l32 = run_mlp(m, x, y, EM_F32, false, &g32, &n32, &ld);
    assert_int_equal(ld, EM_F32);
    const em_dtype lows[2] = {EM_BF16, EM_F16};
    /* bf16 keeps 8 significant bits (relative rounding 2^-9), f16 11 (2^-12); the stated
     * tolerances, relative to the f32 loss and to the largest f32 gradient entry: */
    const double loss_tol[2] = {2e-3, 5e-4}, grad_tol[2] = {2e-2, 3e-3};
    for (int k = 0; k < 2; k++) {
        double ll = run_mlp(m, x, y, lows[k], false, &gl, &nl, &ld);
        assert_int_equal(ld, lows[k]); /* the last Linear's output: low */
        assert_int_equal(nl, n32);
        double gmax = 0, gdiff = 0;
        for (int64_t i = 0; i < n32; i++) {
            gmax = fmax(gmax, fabs(g32[i]));
            gdiff = fmax(gdiff, fabs(gl[i] - g32[i]));
        }
        double lrel = fabs(ll - l32) / fabs(l32), grel = gdiff / gmax;
        printf("MLP %d-%d-%d + cross-entropy, autocast %s vs f32: loss %.6f vs %.6f (rel %.3g, tol %g); "
               "max grad diff / max |grad| = %.3g (tol %g)\n",
               MLP_IN, MLP_H, MLP_OUT, em_dtype_name(lows[k]), ll, l32, lrel, loss_tol[k], grel, grad_tol[k]);
        assert_true(lrel < loss_tol[k]);
        assert_true(grel < grad_tol[k]);
        assert_true(lrel > 0 || grel > 0); /* it really ran in low precision */
        /* backward called inside the region gives the same gradients (autocast is off in em_backward) */
        run_mlp(m, x, y, lows[k], true, &gin, &nin, &ld);
        assert_int_equal(nin, nl);
        for (int64_t i = 0; i < nl; i++) assert_true(gin[i] == gl[i]);
        free(gl);
        free(gin);
    }
    free(g32);
    em_tensor_release(x);
    em_tensor_release(y);
    em_module_free(m);
}

/* conv2d + batch norm under autocast(bf16): the conv runs in bf16, the
 * gradient reaches the f32 weight through the cast (in f32) and is close to
 * the f32 run's. */
static void test_autocast_conv_backward(void **state)
{
    (void)state;
    em_manual_seed(5);
    em_scope_begin();
    int64_t sx[4] = {2, 3, 6, 6}, sk[4] = {4, 3, 3, 3};
    em_tensor *x = randn(sx, 4), *w = randn(sk, 4);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    double *gw[2];
    for (int k = 0; k < 2; k++) {
        if (k) assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
        em_tensor *y = em_conv2d(x, w, NULL, NULL);
        DT(y, k ? EM_BF16 : EM_F32);
        em_tensor *z = em_batch_norm(y, NULL, NULL, NULL, NULL, true, 0.1, 1e-5);
        DT(z, EM_F32);
        em_tensor *loss = em_mean_all(em_square(z));
        if (k) assert_int_equal(em_autocast_end(), EM_OK);
        em_tensor *loss2 = em_mean_all(em_mul(em_relu(z), em_tanh(z)));
        em_grads *g = em_backward(em_add(loss, loss2));
        assert_non_null(g);
        DT(em_grad(g, w), EM_F32);
        gw[k] = em_test_values(em_grad(g, w));
        em_grads_free(g);
    }
    double gmax = 0, gdiff = 0;
    for (int i = 0; i < 4 * 27; i++) {
        gmax = fmax(gmax, fabs(gw[0][i]));
        gdiff = fmax(gdiff, fabs(gw[1][i] - gw[0][i]));
    }
    printf("conv2d 3->4 3x3 + batch norm, autocast bfloat16 vs f32: max weight-grad diff / max |grad| = %.3g (tol 5e-2)\n",
           gdiff / gmax);
    assert_true(gdiff / gmax < 5e-2);
    assert_true(gdiff > 0);
    free(gw[0]);
    free(gw[1]);
    em_scope_end();
}

/* ---- GradScaler against PyTorch ------------------------------------------------------- */

static void test_grad_scaler_torch_trajectory(void **state)
{
    (void)state;
    fx_block *bs;
    int nb = fx_load("amp_fixtures.txt", &bs);
    assert_true(nb >= 1);
    const fx_block *b = &bs[0];
    assert_string_equal(b->config, "gradscaler");
    em_grad_scaler_config c = em_grad_scaler_config_default();
    c.init_scale = fx_kw(b, "init_scale", NAN);
    c.growth_factor = fx_kw(b, "growth_factor", NAN);
    c.backoff_factor = fx_kw(b, "backoff_factor", NAN);
    c.growth_interval = (int64_t)fx_kw(b, "growth_interval", NAN);
    em_grad_scaler *gs = em_grad_scaler_new(&c);
    assert_non_null(gs);
    const fx_tensor *p0 = fx_get(b, "p0"), *ct = fx_get(b, "c"), *pt = fx_get(b, "p");
    const fx_tensor *sb = fx_get(b, "scale_before"), *fd = fx_get(b, "found"), *sa = fx_get(b, "scale_after"),
                    *tr = fx_get(b, "tracker");
    const int64_t T = ct->shape[0], D = ct->shape[1];
    em_tensor *p = fx_new(p0, EM_F32);
    assert_int_equal(em_set_requires_grad(p, true), EM_OK);
    em_optim *opt = em_sgd_new(&p, 1, fx_kw(b, "lr", NAN), fx_kw(b, "momentum", NAN), 0.0);
    assert_non_null(opt);
    printf("step  scale  skipped  (PyTorch: scale  skipped)\n");
    for (int64_t t = 0; t < T; t++) {
        em_scope_begin();
        const double scale = em_grad_scaler_get_scale(gs);
        assert_true(scale == sb->v[t]);
        em_tensor *ctd = em_from_host(ct->v + t * D, &D, 1, EM_F64);
        em_tensor *loss = em_sum_all(em_mul(p, em_cast(ctd, EM_F32)));
        em_grads *g = em_backward(em_grad_scaler_scale(gs, loss));
        assert_non_null(g);
        bool stepped = true;
        assert_int_equal(em_grad_scaler_step(gs, opt, g, &stepped), EM_OK);
        printf("%4lld  %6.0f  %d        (%6.0f  %d)\n", (long long)t + 1, scale, !stepped, sb->v[t], (int)fd->v[t]);
        assert_int_equal(!stepped, (int)fd->v[t]);
        assert_int_equal(em_grad_scaler_found_inf(gs) > 0, (int)fd->v[t]);
        assert_int_equal(em_grad_scaler_update(gs), EM_OK);
        assert_true(em_grad_scaler_get_scale(gs) == sa->v[t]);
        em_grad_scaler_state st;
        assert_int_equal(em_grad_scaler_get_state(gs, &st), EM_OK);
        assert_int_equal(st.growth_tracker, (int64_t)tr->v[t]);
        em_test_assert_close(p, pt->v + t * D, D, 1e-6, 1e-7); /* skipped steps leave p (and momentum) as they are */
        em_grads_free(g);
        em_scope_end();
    }
    em_optim_free(opt);
    em_tensor_release(p);
    em_grad_scaler_free(gs);
    fx_free(bs, nb);
}

static void test_grad_scaler_api(void **state)
{
    (void)state;
    em_grad_scaler_config c = em_grad_scaler_config_default();
    assert_true(c.init_scale == 65536.0 && c.growth_factor == 2.0 && c.backoff_factor == 0.5 && c.growth_interval == 2000 && c.enabled);
    em_grad_scaler_config bad = c;
    bad.growth_factor = 1.0;
    assert_null(em_grad_scaler_new(&bad));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    bad = c, bad.backoff_factor = 1.0;
    assert_null(em_grad_scaler_new(&bad));
    bad = c, bad.growth_interval = 0;
    assert_null(em_grad_scaler_new(&bad));
    bad = c, bad.init_scale = INFINITY;
    assert_null(em_grad_scaler_new(&bad));
    bad = c, bad.init_scale = 1e300; /* inf as the float32 scale */
    assert_null(em_grad_scaler_new(&bad));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    bad = c, bad.init_scale = 1e-50; /* 0 as the float32 scale */
    assert_null(em_grad_scaler_new(&bad));
    em_grad_scaler *gs = em_grad_scaler_new(NULL);
    assert_non_null(gs);
    assert_true(em_grad_scaler_get_scale(gs) == 65536.0);
    assert_int_equal(em_grad_scaler_update(gs), EM_ERR_STATE); /* no step yet */
    em_scope_begin();
    em_tensor *p = em_ones((int64_t[]){3}, 1, EM_F32);
    assert_int_equal(em_set_requires_grad(p, true), EM_OK);
    em_optim *opt = em_sgd_new(&p, 1, 0.1, 0.0, 0.0);
    em_tensor *loss = em_sum_all(em_mul_scalar(p, 3.0));
    em_tensor *scaled = em_grad_scaler_scale(gs, loss);
    double v;
    assert_int_equal(em_item(scaled, &v), EM_OK);
    assert_true(v == 9.0 * 65536.0);
    em_grads *g = em_backward(scaled);
    assert_int_equal(em_grad_scaler_unscale(gs, opt, g), EM_OK);
    em_test_expect(em_tensor_retain(em_grad(g, p)), EM_F32, (const double[]){3, 3, 3}, 3, 0, 0, "unscaled gradient");
    assert_int_equal(em_grad_scaler_unscale(gs, opt, g), EM_ERR_STATE); /* twice in one step */
    bool stepped;
    assert_int_equal(em_grad_scaler_step(gs, opt, g, &stepped), EM_OK);
    assert_true(stepped);
    assert_int_equal(em_grad_scaler_step(gs, opt, g, &stepped), EM_ERR_STATE); /* twice in one step */
    assert_int_equal(em_grad_scaler_update(gs), EM_OK);
    em_test_expect(em_tensor_retain(p), EM_F32, (const double[]){0.7, 0.7, 0.7}, 3, 1e-6, 0, "p after one step");
    em_grads_free(g);
    /* state: bad values refused; growth that overflows float32 keeps the scale (torch) */
    assert_int_equal(em_grad_scaler_set_state(gs, &(em_grad_scaler_state){.scale = -1, .growth_tracker = 0}), EM_ERR_INVALID);
    assert_int_equal(em_grad_scaler_set_state(gs, &(em_grad_scaler_state){.scale = 4, .growth_tracker = 2000}), EM_ERR_INVALID);
    assert_int_equal(em_grad_scaler_set_state(gs, &(em_grad_scaler_state){.scale = ldexp(1, 127), .growth_tracker = 1999}), EM_OK);
    /* finite as a double but not as the float32 scale: refused, the state unchanged */
    assert_int_equal(em_grad_scaler_set_state(gs, &(em_grad_scaler_state){.scale = 1e300, .growth_tracker = 0}), EM_ERR_INVALID);
    assert_int_equal(em_grad_scaler_set_state(gs, &(em_grad_scaler_state){.scale = 1e-50, .growth_tracker = 0}), EM_ERR_INVALID);
    assert_true(em_grad_scaler_get_scale(gs) == ldexp(1, 127));
    g = em_backward(em_grad_scaler_scale(gs, em_sum_all(em_mul_scalar(p, 1e-30))));
    assert_int_equal(em_grad_scaler_step(gs, opt, g, &stepped), EM_OK);
    assert_true(stepped);
    assert_int_equal(em_grad_scaler_update(gs), EM_OK);
    assert_true(em_grad_scaler_get_scale(gs) == ldexp(1, 127));
    em_grad_scaler_state st;
    em_grad_scaler_get_state(gs, &st);
    assert_int_equal(st.growth_tracker, 0);
    em_grads_free(g);
    em_grad_scaler_free(gs);
    /* disabled: the loss as it is, plain steps, scale 1 */
    c.enabled = false;
    gs = em_grad_scaler_new(&c);
    assert_true(em_grad_scaler_get_scale(gs) == 1.0);
    scaled = em_grad_scaler_scale(gs, loss);
    assert_int_equal(em_item(scaled, &v), EM_OK);
    assert_true(v == 9.0);
    assert_int_equal(em_grad_scaler_update(gs), EM_OK);
    em_grad_scaler_free(gs);
    assert_null(em_grad_scaler_scale(NULL, loss));
    em_optim_free(opt);
    em_scope_end();
}

/* ---- the Learner ------------------------------------------------------------------------- */

#define LN 96
#define LF 6
#define LK 3

static float g_x[LN * LF], g_xbig[LN * LF]; /* g_xbig = 1000 g_x: f16 weight gradients overflow at scale 65536 */
static int64_t g_y[LN];
static const float *g_data = g_x;

static em_status fit_precision(em_precision prec, const char *dir, int64_t epochs, int64_t stop_after, const char *resume,
                               em_epoch_metrics *hist, int *nh)
{
    em_manual_seed(21);
    em_module *m = em_sequential_new(NULL, 0);
    assert_int_equal(em_sequential_append(m, em_linear_new(LF, 16, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_relu_new()), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(16, LK, true)), EM_OK);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    oc.lr = 0.05;
    em_optim *opt = em_optim_new_for_module(&oc, m);
    em_dataset *ds = em_dataset_from_arrays(g_data, g_y, LN, (const int64_t[]){LF}, 1);
    assert_non_null(ds);
    em_loader_options lo = em_loader_options_default();
    lo.batch_size = 16;
    lo.shuffle = true;
    lo.seed = 4;
    em_loader *l = em_loader_new(ds, &lo);
    assert_non_null(l);
    em_learner_config cfg = em_learner_config_default();
    cfg.epochs = epochs;
    cfg.stop_after_epoch = stop_after;
    cfg.out_dir = dir;
    cfg.resume = resume;
    cfg.progress = 0;
    cfg.precision = prec;
    cfg.clip_grad_norm = prec == EM_PRECISION_F16 ? 5.0 : 0; /* f16: unscale before the clip */
    FILE *devnull = fopen("/dev/null", "w");
    cfg.log = devnull;
    em_status st = em_learner_fit(m, opt, NULL, l, l, &cfg, hist, 16, nh);
    fclose(devnull);
    em_loader_free(l);
    em_dataset_free(ds);
    em_optim_free(opt);
    em_module_free(m);
    return st;
}

static void test_learner_bf16_loss_falls(void **state)
{
    (void)state;
    em_epoch_metrics h[16];
    int nh = 0;
    em_epoch_metrics h32[16];
    int n32 = 0;
    assert_int_equal(fit_precision(EM_PRECISION_F32, NULL, 12, 0, NULL, h32, &n32), EM_OK);
    assert_int_equal(fit_precision(EM_PRECISION_BF16, NULL, 12, 0, NULL, h, &nh), EM_OK);
    assert_int_equal(nh, 12);
    printf("learner train loss by epoch, bf16:");
    for (int i = 0; i < nh; i++) printf(" %.4f", h[i].train_loss);
    printf(" (val accuracy %.3f)\n                                f32:", h[nh - 1].val_accuracy);
    for (int i = 0; i < n32; i++) printf(" %.4f", h32[i].train_loss);
    printf(" (val accuracy %.3f)\n", h32[n32 - 1].val_accuracy);
    assert_true(isfinite(h[nh - 1].train_loss));
    assert_true(h[nh - 1].train_loss < 0.75 * h[0].train_loss); /* it learns */
    assert_true(fabs(h[nh - 1].train_loss - h32[n32 - 1].train_loss) < 0.05); /* about as well as f32 */
    assert_true(h[nh - 1].train_loss != h32[n32 - 1].train_loss);          /* and it did run in bf16 */
    /* precision names */
    em_precision p = EM_PRECISION_F32;
    assert_int_equal(em_precision_parse("bf16", &p), EM_OK);
    assert_int_equal(p, EM_PRECISION_BF16);
    assert_int_equal(em_precision_parse("fp16", &p), EM_OK);
    assert_int_equal(p, EM_PRECISION_F16);
    assert_int_equal(em_precision_parse("tf32", &p), EM_OK);
    assert_int_equal(p, EM_PRECISION_TF32);
    assert_int_equal(em_precision_parse("int8", &p), EM_ERR_INVALID);
    assert_int_equal(p, EM_PRECISION_TF32); /* untouched */
    assert_int_equal(em_precision_parse(NULL, &p), EM_ERR_INVALID);
    for (int i = 0; i < EM_PRECISION_COUNT; i++) {
        assert_int_equal(em_precision_parse(em_precision_name((em_precision)i), &p), EM_OK);
        assert_int_equal(p, i);
    }
    assert_null(em_precision_name(EM_PRECISION_COUNT));
    assert_int_equal(fit_precision((em_precision)17, NULL, 1, 0, NULL, NULL, NULL), EM_ERR_INVALID);
}

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = false;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void test_learner_f16_scaler_resume(void **state)
{
    (void)state;
    char *full = strdup(em_test_tmp_path("f16_full")), *part = strdup(em_test_tmp_path("f16_part"));
    em_epoch_metrics h[16];
    int nh = 0;
    assert_int_equal(fit_precision(EM_PRECISION_F16, full, 3, 0, NULL, h, &nh), EM_OK);
    assert_int_equal(nh, 3);
    printf("learner f16 train loss by epoch: %.4f %.4f %.4f\n", h[0].train_loss, h[1].train_loss, h[2].train_loss);
    assert_true(h[2].train_loss < h[0].train_loss);
    char ck[4096], ck2[4096];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", full);
    em_st_file *f = em_safetensors_open(ck);
    assert_non_null(f);
    const char *sc = em_safetensors_metadata(f, "ember.grad_scaler.scale");
    const char *gt = em_safetensors_metadata(f, "ember.grad_scaler.growth_tracker");
    assert_non_null(sc);
    assert_non_null(gt);
    printf("f16 checkpoint: grad scaler scale %s, growth tracker %s (18 steps)\n", sc, gt);
    assert_string_equal(gt, "18"); /* 3 epochs x 6 batches, no overflow at this size */
    em_safetensors_close(f);
    /* stop after epoch 1, resume to 3: the same bytes */
    assert_int_equal(fit_precision(EM_PRECISION_F16, part, 3, 1, NULL, NULL, NULL), EM_OK);
    snprintf(ck2, sizeof ck2, "%s/checkpoint.safetensors", part);
    assert_int_equal(fit_precision(EM_PRECISION_F16, part, 3, 0, ck2, NULL, NULL), EM_OK);
    assert_true(same_file(ck, ck2));
    free(full);
    free(part);
}

/* f16 with inputs large enough that the scaled weight gradients overflow
 * f16 (65536 / 16 per sample times |x| ~ 1000, summed over 16 samples): the
 * first steps are skipped and the scale backs off until they fit; the run
 * stays finite. */
static void test_learner_f16_overflow_backs_off(void **state)
{
    (void)state;
    char *dir = strdup(em_test_tmp_path("f16_big"));
    g_data = g_xbig;
    em_epoch_metrics h[16];
    int nh = 0;
    em_status st = fit_precision(EM_PRECISION_F16, dir, 2, 0, NULL, h, &nh);
    g_data = g_x;
    assert_int_equal(st, EM_OK);
    char ck[4096];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", dir);
    em_st_file *f = em_safetensors_open(ck);
    assert_non_null(f);
    const double scale = strtod(em_safetensors_metadata(f, "ember.grad_scaler.scale"), NULL);
    const long long tracker = strtoll(em_safetensors_metadata(f, "ember.grad_scaler.growth_tracker"), NULL, 10);
    em_safetensors_close(f);
    const double k = log2(65536.0 / scale); /* back-offs = skipped steps (no growth within 2000 steps) */
    printf("learner f16, inputs x1000: scale 65536 -> %g after 12 steps (%g steps skipped, growth tracker %lld); "
           "train loss %.4f %.4f\n", scale, k, tracker, h[0].train_loss, h[1].train_loss);
    assert_true(scale < 65536.0);
    assert_true(k == floor(k));           /* halvings only */
    assert_true((double)tracker <= 12 - k); /* clean steps since the last back-off, at most all clean steps */
    assert_true(isfinite(h[0].train_loss) && isfinite(h[1].train_loss));
    free(dir);
}

int main(void)
{
    em_test_class_batch(9, LN, LF, LK, g_x, g_y);
    for (int i = 0; i < LN * LF; i++) g_xbig[i] = 1000.0f * g_x[i];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_autocast_stack_and_errors),
        cmocka_unit_test(test_autocast_per_thread),
        cmocka_unit_test(test_autocast_picks_per_kind),
        cmocka_unit_test(test_autocast_mlp_against_f32),
        cmocka_unit_test(test_autocast_conv_backward),
        cmocka_unit_test(test_grad_scaler_torch_trajectory),
        cmocka_unit_test(test_grad_scaler_api),
        cmocka_unit_test(test_learner_bf16_loss_falls),
        cmocka_unit_test(test_learner_f16_scaler_resume),
        cmocka_unit_test(test_learner_f16_overflow_backs_off),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
