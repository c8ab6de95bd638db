/* Tests of optimizers (against torch.optim fixtures), learning-rate
 * schedulers, gradient clipping, optimizer state save/restore and errors.
 * Fixtures: tests/fixtures/optim_fixtures.txt, written by
 * tests/fixtures/gen_optim_fixtures.py (found through EMBER_TEST_DATA). */
#include "fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------- */

/* A gradient container holding @p g as the gradient of leaf @p p (made by a
 * trivial backward, then replaced with em_grads_set). */
static em_grads *grads_with(em_tensor *p, em_tensor *g)
{
    em_grads *gr = em_backward(em_sum_all(p));
    if (!gr) fail_msg("em_backward: %s", em_last_error());
    if (em_grads_set(gr, p, g) != EM_OK) fail_msg("em_grads_set: %s", em_last_error());
    return gr;
}

static em_optim_config config_from(const fx_block *b)
{
    char kind[32];
    sscanf(b->head, "opt %31s", kind);
    em_optim_kind k = !strcmp(kind, "sgd")       ? EM_OPTIM_SGD
                      : !strcmp(kind, "adam")    ? EM_OPTIM_ADAM
                      : !strcmp(kind, "adamw")   ? EM_OPTIM_ADAMW
                      : !strcmp(kind, "rmsprop") ? EM_OPTIM_RMSPROP
                                                 : EM_OPTIM_ADAGRAD;
    em_optim_config c = em_optim_config_default(k);
    c.lr = fx_kw(b, "lr", c.lr);
    c.momentum = fx_kw(b, "momentum", c.momentum);
    c.dampening = fx_kw(b, "dampening", c.dampening);
    c.nesterov = fx_kw(b, "nesterov", 0) != 0;
    c.maximize = fx_kw(b, "maximize", 0) != 0;
    c.weight_decay = fx_kw(b, "weight_decay", c.weight_decay);
    c.beta1 = fx_kw(b, "beta1", c.beta1);
    c.beta2 = fx_kw(b, "beta2", c.beta2);
    c.eps = fx_kw(b, "eps", c.eps);
    c.amsgrad = fx_kw(b, "amsgrad", 0) != 0;
    c.alpha = fx_kw(b, "alpha", c.alpha);
    c.centered = fx_kw(b, "centered", 0) != 0;
    c.lr_decay = fx_kw(b, "lr_decay", c.lr_decay);
    c.initial_accumulator_value = fx_kw(b, "initial_accumulator_value", c.initial_accumulator_value);
    return c;
}

static void assert_close_msg(const em_tensor *t, const double *want, int64_t n, double rtol, double atol, const char *what)
{
    double *v = em_test_values(t);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(v[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            double got = v[i];
            free(v);
            fail_msg("%s: element %lld: got %.9g, expected %.9g (rel err %.3g)", what, (long long)i, got, want[i],
                     fabs(got - want[i]) / fabs(want[i]));
        }
    free(v);
}

/* ---- optimizers vs PyTorch ---------------------------------------------------------- */

static void test_optim_matches_pytorch(void **state)
{
    (void)state;
    fx_block *bs;
    int n = fx_load("optim_fixtures.txt", &bs);
    assert_true(n >= 32);
    int checked = 0;
    for (int i = 0; i < n; i++) {
        const fx_block *b = &bs[i];
        em_dtype dt = !strcmp(b->dtype, "float32") ? EM_F32 : EM_F64;
        em_optim_config c = config_from(b);
        em_tensor *p = fx_new(fx_get(b, "param0"), dt);
        assert_int_equal(em_set_requires_grad(p, true), EM_OK);
        em_optim *opt = em_optim_new(&c, &p, 1);
        if (!opt) fail_msg("%s: em_optim_new: %s", b->config, em_last_error());
        for (int s = 1; s <= 3; s++) {
            char gname[16], pname[16], what[128];
            snprintf(gname, sizeof gname, "grad%d", s);
            snprintf(pname, sizeof pname, "param%d", s);
            em_scope_begin();
            em_grads *g = grads_with(p, fx_new(fx_get(b, gname), dt));
            if (em_optim_step(opt, g) != EM_OK) fail_msg("%s: step %d: %s", b->config, s, em_last_error());
            em_grads_free(g);
            em_scope_end();
            const fx_tensor *want = fx_get(b, pname);
            snprintf(what, sizeof what, "%s (%s) after step %d", b->config, b->dtype, s);
            /* 1e-6 relative; a tiny absolute floor for values that cancel to ~0 */
            assert_close_msg(p, want->v, want->n, 1e-6, dt == EM_F32 ? 1e-7 : 1e-12, what);
            assert_int_equal(em_optim_get_step(opt, 0), s);
        }
        em_optim_free(opt);
        em_tensor_release(p);
        checked++;
    }
    assert_int_equal(checked, n);
    fx_free(bs, n);
}

/* One task per parameter update (once the state exists), no waiting. */
static void test_optim_one_task_per_param(void **state)
{
    (void)state;
    em_module *m = em_sequential_new((em_module *[]){em_linear_new(4, 3, true), em_linear_new(3, 2, true)}, 2);
    assert_non_null(m);
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    c.amsgrad = true;
    em_optim *opt = em_optim_new_for_module(&c, m);
    assert_non_null(opt);
    assert_int_equal(em_optim_num_params(opt), 4);
    em_tensor *x = em_ones(SHAPE(5, 4), 2, EM_F32);
    for (int it = 0; it < 2; it++) {
        em_scope_begin();
        em_grads *g = em_backward(em_sum_all(em_module_forward(m, x)));
        assert_non_null(g);
        em_sync();
        int64_t before = em_get_stats().tasks_submitted;
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        int64_t tasks = em_get_stats().tasks_submitted - before;
        if (it == 1) assert_int_equal(tasks, 4); /* first step also fills the new state buffers */
        em_grads_free(g);
        em_scope_end();
    }
    em_tensor_release(x);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_optim_skips_params_without_grad(void **state)
{
    (void)state;
    em_tensor *a = F32((2), 1, 2);
    em_tensor *b = F32((2), 3, 4);
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    em_tensor *ps[2] = {a, b};
    em_optim *opt = em_sgd_new(ps, 2, 0.5, 0.9, 0);
    assert_non_null(opt);
    em_scope_begin();
    em_grads *g = em_backward(em_sum_all(a)); /* b gets no gradient */
    assert_null(em_grad(g, b));
    assert_int_equal(em_optim_step(opt, g), EM_OK);
    em_grads_free(g);
    em_scope_end();
    em_test_assert_close(a, VALS(0.5, 1.5), 0, 1e-7);
    em_test_assert_close(b, VALS(3, 4), 0, 0);
    assert_int_equal(em_optim_get_step(opt, 0), 1);
    assert_int_equal(em_optim_get_step(opt, 1), 0);
    em_optim_free(opt);
    em_tensor_release(a);
    em_tensor_release(b);
}

static void test_optim_set_lr(void **state)
{
    (void)state;
    em_tensor *p = F64((3), 1, 2, 3);
    em_set_requires_grad(p, true);
    em_optim *opt = em_sgd_new(&p, 1, 0.1, 0, 0);
    assert_true(em_optim_get_lr(opt) == 0.1);
    assert_int_equal(em_optim_set_lr(opt, 0.25), EM_OK);
    em_scope_begin();
    em_grads *g = grads_with(p, F64((3), 4, 4, 8));
    assert_int_equal(em_optim_step(opt, g), EM_OK);
    em_grads_free(g);
    em_scope_end();
    em_test_assert_close(p, VALS(0, 1, 1), 0, 1e-12);
    assert_int_equal(em_optim_set_lr(opt, -1), EM_ERR_INVALID);
    em_optim_free(opt);
    em_tensor_release(p);
}

static void test_optim_errors(void **state)
{
    (void)state;
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    assert_null(em_optim_new(&c, NULL, 0));
    assert_non_null(strstr(em_last_error(), "empty parameter list"));
    em_module *relu = em_relu_new();
    assert_null(em_optim_new_for_module(&c, relu));
    assert_non_null(strstr(em_last_error(), "empty parameter list"));
    em_module_free(relu);

    em_tensor *p = F32((2, 2), 1, 2, 3, 4);
    em_set_requires_grad(p, true);
    c.lr = -1;
    assert_null(em_optim_new(&c, &p, 1));
    assert_non_null(strstr(em_last_error(), "learning rate"));
    c = em_optim_config_default(EM_OPTIM_ADAM);
    c.beta2 = 1.0;
    assert_null(em_optim_new(&c, &p, 1));
    assert_non_null(strstr(em_last_error(), "beta2"));
    c = em_optim_config_default(EM_OPTIM_SGD);
    c.nesterov = true;
    assert_null(em_optim_new(&c, &p, 1));
    assert_non_null(strstr(em_last_error(), "Nesterov"));
    em_tensor *dup[2] = {p, p};
    assert_null(em_sgd_new(dup, 2, 0.1, 0, 0));
    assert_non_null(strstr(em_last_error(), "twice"));
    em_tensor *ip = em_zeros(SHAPE(2), 1, EM_I64);
    assert_null(em_sgd_new(&ip, 1, 0.1, 0, 0));
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_tensor_release(ip);

    /* a gradient of the wrong shape: error naming both shapes, nothing updated */
    em_optim *opt = em_sgd_new(&p, 1, 0.1, 0, 0);
    assert_non_null(opt);
    em_scope_begin();
    em_grads *g = em_backward(em_sum_all(p));
    assert_int_equal(em_grads_set(g, p, F32((4), 1, 1, 1, 1)), EM_OK);
    assert_int_equal(em_optim_step(opt, g), EM_ERR_SHAPE);
    assert_non_null(strstr(em_last_error(), "[4]"));
    assert_non_null(strstr(em_last_error(), "[2, 2]"));
    em_grads_free(g);
    em_scope_end();
    em_test_assert_close(p, VALS(1, 2, 3, 4), 0, 0);
    assert_int_equal(em_optim_step(opt, NULL), EM_ERR_INVALID);
    em_optim_free(opt);
    em_tensor_release(p);
}

/* ---- state save / restore ------------------------------------------------------------- */

typedef struct saved {
    char keys[16][64];
    em_tensor *t[16];
    int n;
} saved;

static void save_cb(const char *key, em_tensor *t, void *ud)
{
    saved *s = ud;
    assert_true(s->n < 16);
    snprintf(s->keys[s->n], sizeof s->keys[0], "%s", key);
    /* a copy: a checkpoint writer would store the bytes */
    em_scope_begin();
    s->t[s->n] = em_tensor_retain(em_mul_scalar(t, 1.0));
    em_scope_end();
    s->n++;
}

static void test_optim_state_roundtrip(void **state)
{
    (void)state;
    const double init[4] = {0.5, -1.0, 2.0, 0.25};
    const double grads[3][4] = {{1, -2, 3, 0.5}, {0.1, 0.2, -0.3, 0.4}, {-1, 1, -1, 1}};
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    c.lr = 0.1;
    c.amsgrad = true;
    em_tensor *p = em_from_host(init, SHAPE(4), 1, EM_F64);
    em_tensor *q = em_from_host(init, SHAPE(4), 1, EM_F64);
    em_set_requires_grad(p, true);
    em_set_requires_grad(q, true);
    em_optim *a = em_optim_new(&c, &p, 1);
    em_optim *b = em_optim_new(&c, &q, 1);
    saved s = {0};
    assert_int_equal(em_optim_state_visit(a, save_cb, &s), EM_OK);
    assert_int_equal(s.n, 0); /* no state before the first step */
    for (int k = 0; k < 2; k++) {
        em_scope_begin();
        em_grads *g = grads_with(p, em_from_host(grads[k], SHAPE(4), 1, EM_F64));
        assert_int_equal(em_optim_step(a, g), EM_OK);
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(em_optim_state_visit(a, save_cb, &s), EM_OK);
    assert_int_equal(s.n, 4);
    assert_string_equal(s.keys[0], "state.0.step");
    assert_string_equal(s.keys[1], "state.0.exp_avg");
    assert_string_equal(s.keys[2], "state.0.exp_avg_sq");
    assert_string_equal(s.keys[3], "state.0.max_exp_avg_sq");
    /* restore into b (whose param is p's current value) */
    assert_int_equal(em_copy_(q, p), EM_OK);
    for (int i = 0; i < s.n; i++)
        if (em_optim_state_set(b, s.keys[i], s.t[i]) != EM_OK) fail_msg("state_set %s: %s", s.keys[i], em_last_error());
    assert_int_equal(em_optim_get_step(b, 0), 2);
    for (int k = 0; k < 2; k++) {
        em_optim *o = k ? b : a;
        em_tensor *t = k ? q : p;
        em_scope_begin();
        em_grads *g = grads_with(t, em_from_host(grads[2], SHAPE(4), 1, EM_F64));
        assert_int_equal(em_optim_step(o, g), EM_OK);
        em_grads_free(g);
        em_scope_end();
    }
    double *vp = em_test_values(p);
    em_test_assert_close(q, vp, 4, 0, 0); /* bit-identical continuation */
    free(vp);
    /* bad keys */
    assert_int_equal(em_optim_state_set(b, "state.0.momentum_buffer", s.t[1]), EM_ERR_INVALID);
    assert_int_equal(em_optim_state_set(b, "state.7.exp_avg", s.t[1]), EM_ERR_INVALID);
    assert_int_equal(em_optim_state_set(b, "bogus", s.t[1]), EM_ERR_INVALID);
    em_tensor *wrong = em_zeros(SHAPE(3), 1, EM_F64);
    assert_int_equal(em_optim_state_set(b, "state.0.exp_avg", wrong), EM_ERR_SHAPE);
    em_tensor_release(wrong);
    for (int i = 0; i < s.n; i++) em_tensor_release(s.t[i]);
    em_optim_free(a);
    em_optim_free(b);
    em_tensor_release(p);
    em_tensor_release(q);
}

/* ---- schedulers ----------------------------------------------------------------------- */

#define LR_EQ(s, t, want) assert_true(fabs(em_lr_scheduler_lr_at(s, t) - (want)) <= 1e-12 * fabs(want) + 1e-15)

static void test_schedulers(void **state)
{
    (void)state;
    em_lr_scheduler *s = em_lr_constant(0.1);
    LR_EQ(s, 0, 0.1);
    LR_EQ(s, 1000, 0.1);
    em_lr_scheduler_free(s);

    s = em_lr_step(1.0, 3, 0.5); /* StepLR(step_size=3, gamma=0.5) */
    LR_EQ(s, 0, 1.0);
    LR_EQ(s, 2, 1.0);
    LR_EQ(s, 3, 0.5);
    LR_EQ(s, 5, 0.5);
    LR_EQ(s, 6, 0.25);
    em_lr_scheduler_free(s);

    s = em_lr_multistep(0.1, (const int64_t[]){2, 5}, 2, 0.1);
    LR_EQ(s, 0, 0.1);
    LR_EQ(s, 1, 0.1);
    LR_EQ(s, 2, 0.01);
    LR_EQ(s, 4, 0.01);
    LR_EQ(s, 5, 0.001);
    LR_EQ(s, 100, 0.001);
    em_lr_scheduler_free(s);

    s = em_lr_exponential(2.0, 0.9);
    LR_EQ(s, 0, 2.0);
    LR_EQ(s, 1, 1.8);
    LR_EQ(s, 3, 2.0 * 0.729);
    em_lr_scheduler_free(s);

    s = em_lr_cosine(1.0, 10, 0.1);
    LR_EQ(s, 0, 1.0);
    LR_EQ(s, 5, 0.55);  /* 0.1 + 0.9 * (1 + cos(pi/2)) / 2 */
    LR_EQ(s, 10, 0.1);
    LR_EQ(s, 2, 0.1 + 0.9 * (1 + cos(M_PI * 0.2)) / 2);
    em_lr_scheduler_free(s);

    s = em_lr_warmup_cosine(1.0, 4, 14, 0.0);
    LR_EQ(s, 0, 0.25); /* (t + 1) / warmup: the first step is not at lr 0 */
    LR_EQ(s, 1, 0.5);
    LR_EQ(s, 3, 1.0);
    LR_EQ(s, 4, 1.0);
    LR_EQ(s, 9, 0.5);
    LR_EQ(s, 14, 0.0);
    LR_EQ(s, 20, 0.0);
    em_lr_scheduler_free(s);

    s = em_lr_noam(2.0, 512, 4000);
    double k = 2.0 / sqrt(512.0);
    LR_EQ(s, 0, k * 1.0 / pow(4000, 1.5));         /* t treated as 1 */
    LR_EQ(s, 100, k * 100 / pow(4000, 1.5));       /* warm-up: linear */
    LR_EQ(s, 4000, k / sqrt(4000.0));              /* peak */
    LR_EQ(s, 16000, k / sqrt(16000.0));            /* decay: 1/sqrt(t) */
    em_lr_scheduler_free(s);

    /* sequential: linear-ish warm-up by exponential then step decay, restarted at the milestone */
    em_lr_scheduler *parts[2] = {em_lr_constant(0.01), em_lr_step(0.1, 2, 0.5)};
    s = em_lr_sequential(parts, 2, (const int64_t[]){3});
    assert_non_null(s);
    LR_EQ(s, 0, 0.01);
    LR_EQ(s, 2, 0.01);
    LR_EQ(s, 3, 0.1);
    LR_EQ(s, 4, 0.1);
    LR_EQ(s, 5, 0.05);
    /* the counter */
    assert_int_equal(em_lr_scheduler_get_step(s), 0);
    em_tensor *p = F32((1), 1);
    em_set_requires_grad(p, true);
    em_optim *opt = em_sgd_new(&p, 1, em_lr_scheduler_get_lr(s), 0, 0);
    for (int i = 0; i < 3; i++) em_lr_scheduler_step(s, opt);
    assert_int_equal(em_lr_scheduler_get_step(s), 3);
    assert_true(fabs(em_optim_get_lr(opt) - 0.1) < 1e-15);
    em_lr_scheduler_set_step(s, 5);
    assert_true(fabs(em_lr_scheduler_get_lr(s) - 0.05) < 1e-15);
    em_optim_free(opt);
    em_tensor_release(p);
    em_lr_scheduler_free(s);

    /* chain: product of factors (exponential decay times a step schedule) */
    em_lr_scheduler *ch[2] = {em_lr_exponential(1.0, 0.5), em_lr_step(3.0, 2, 0.1)};
    s = em_lr_chain(ch, 2);
    LR_EQ(s, 0, 1.0);
    LR_EQ(s, 1, 0.5);
    LR_EQ(s, 2, 0.25 * 0.1);
    em_lr_scheduler_free(s);

    /* errors */
    assert_null(em_lr_step(1.0, 0, 0.1));
    assert_null(em_lr_multistep(1.0, (const int64_t[]){5, 3}, 2, 0.1));
    assert_non_null(strstr(em_last_error(), "increasing"));
    assert_null(em_lr_warmup_cosine(1.0, 10, 10, 0));
    assert_null(em_lr_noam(1.0, 0, 10));
    assert_null(em_lr_sequential(NULL, 0, NULL));
}

/* ---- clipping ---------------------------------------------------------------------------- */

static void test_clip_grad_norm(void **state)
{
    (void)state;
    em_tensor *a = F32((2), 0, 0);
    em_tensor *b = F32((1), 0);
    em_tensor *c = F32((1), 0); /* no gradient: skipped */
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    em_set_requires_grad(c, true);
    em_tensor *ps[3] = {a, b, c};
    em_scope_begin();
    em_grads *g = em_backward(em_add(em_sum_all(a), em_sum_all(b)));
    assert_non_null(g);
    em_grads_set(g, a, F32((2), 3, 4));
    em_grads_set(g, b, F32((1), 12));
    em_tensor *old_a = em_tensor_retain(em_grad(g, a));
    /* total = sqrt(9 + 16 + 144) = 13; max_norm 26 -> no change */
    double tot = em_clip_grad_norm(g, ps, 3, 26.0, 2.0);
    assert_true(fabs(tot - 13.0) < 1e-5);
    em_test_assert_close(em_grad(g, a), VALS(3, 4), 1e-6, 0);
    /* max_norm 6.5 -> scale 6.5 / (13 + 1e-6) */
    tot = em_clip_grad_norm(g, ps, 3, 6.5, 2.0);
    assert_true(fabs(tot - 13.0) < 1e-5);
    double coef = 6.5 / (13.0 + 1e-6);
    em_test_assert_close(em_grad(g, a), VALS(3 * coef, 4 * coef), 1e-6, 0);
    em_test_assert_close(em_grad(g, b), VALS(12 * coef), 1e-6, 0);
    em_test_assert_close(old_a, VALS(3, 4), 0, 0); /* the old tensor is untouched */
    em_tensor_release(old_a);
    /* inf norm: max |g| = 6 * 6.5/13 ~ 6 */
    tot = em_clip_grad_norm(g, ps, 3, 1.0, INFINITY);
    assert_true(fabs(tot - 12 * coef) < 1e-5);
    em_test_assert_close(em_grad(g, b), VALS(1.0 / (12 * coef + 1e-6) * 12 * coef), 1e-5, 0);
    /* 1-norm */
    em_grads_set(g, a, F32((2), 3, -4));
    em_grads_set(g, b, F32((1), 12));
    tot = em_clip_grad_norm(g, ps, 3, 100.0, 1.0);
    assert_true(fabs(tot - 19.0) < 1e-5);
    /* clip by value */
    assert_int_equal(em_clip_grad_value(g, ps, 3, 3.5), EM_OK);
    em_test_assert_close(em_grad(g, a), VALS(3, -3.5), 0, 0);
    em_test_assert_close(em_grad(g, b), VALS(3.5), 0, 0);
    assert_null(em_grad(g, c));
    /* errors */
    assert_true(em_clip_grad_norm(g, ps, 3, -1.0, 2.0) < 0);
    assert_true(em_clip_grad_norm(NULL, ps, 3, 1.0, 2.0) < 0);
    assert_int_equal(em_clip_grad_value(g, ps, 3, -1), EM_ERR_INVALID);
    em_grads_free(g);
    em_scope_end();
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
}

/* The no-wait form gives the sync form's totals and gradients (2, 1 and inf
 * norms, clipping and not), a NaN total propagates, and bad arguments fail. */
static void test_clip_grad_norm_tensor(void **state)
{
    (void)state;
    em_tensor *a = F32((2), 0, 0), *b = F32((1), 0), *c = F32((1), 0);
    em_set_requires_grad(a, true);
    em_set_requires_grad(b, true);
    em_set_requires_grad(c, true);
    em_tensor *ps[3] = {a, b, c};
    static const double cases[][2] = {{26.0, 2.0}, {6.5, 2.0}, {1.0, INFINITY}, {100.0, 1.0}, {3.0, 1.0}, {2.0, 3.0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        em_scope_begin();
        em_grads *g1 = em_backward(em_add(em_sum_all(a), em_sum_all(b)));
        em_grads *g2 = em_backward(em_add(em_sum_all(a), em_sum_all(b)));
        assert_non_null(g1);
        assert_non_null(g2);
        em_grads_set(g1, a, F32((2), 3, -4));
        em_grads_set(g1, b, F32((1), 12));
        em_grads_set(g2, a, F32((2), 3, -4));
        em_grads_set(g2, b, F32((1), 12));
        const double want = em_clip_grad_norm(g1, ps, 3, cases[k][0], cases[k][1]);
        em_tensor *tot = em_clip_grad_norm_tensor(g2, ps, 3, cases[k][0], cases[k][1]);
        assert_non_null(tot);
        assert_int_equal(em_tensor_ndim(tot), 0);
        double got;
        assert_int_equal(em_item(tot, &got), EM_OK);
        assert_true(fabs(got - want) <= 1e-6 * want);
        for (int t = 0; t < 2; t++) {
            double d;
            em_tensor *p = t ? b : a;
            assert_int_equal(em_item(em_max(em_abs(em_sub(em_grad(g2, p), em_grad(g1, p))), NULL, 0, false), &d), EM_OK);
            assert_true(d <= 1e-6);
        }
        assert_null(em_grad(g2, c));
        /* a NaN gradient: NaN total, NaN everywhere (torch's behaviour) */
        em_grads_set(g2, b, F32((1), NAN));
        tot = em_clip_grad_norm_tensor(g2, ps, 3, cases[k][0], cases[k][1]);
        assert_int_equal(em_item(tot, &got), EM_OK);
        assert_true(isnan(got));
        double ga;
        assert_int_equal(em_item(em_sum_all(em_grad(g2, a)), &ga), EM_OK);
        assert_true(isnan(ga));
        em_grads_free(g1);
        em_grads_free(g2);
        em_scope_end();
    }
    em_scope_begin();
    em_grads *g = em_backward(em_sum_all(a));
    assert_null(em_clip_grad_norm_tensor(g, ps, 3, -1.0, 2.0));
    assert_non_null(strstr(em_last_error(), "max_norm"));
    assert_null(em_clip_grad_norm_tensor(g, ps, 3, 1.0, 0.0));
    assert_null(em_clip_grad_norm_tensor(NULL, ps, 3, 1.0, 2.0));
    em_tensor *none = em_clip_grad_norm_tensor(g, &c, 1, 1.0, 2.0); /* no gradient: total 0 */
    double z = -1;
    assert_int_equal(em_item(none, &z), EM_OK);
    assert_true(z == 0);
    em_grads_free(g);
    em_scope_end();
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optim_matches_pytorch),
        cmocka_unit_test(test_optim_one_task_per_param),
        cmocka_unit_test(test_optim_skips_params_without_grad),
        cmocka_unit_test(test_optim_set_lr),
        cmocka_unit_test(test_optim_errors),
        cmocka_unit_test(test_optim_state_roundtrip),
        cmocka_unit_test(test_schedulers),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_clip_grad_norm_tensor),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
