/* Element-wise fusion (issue #17; fusion/fusion.c) through the public API:
 * em_set_fusion / em_fusion_enabled and the stats it counts
 * (em_stats.fused_tasks, ops_fused).
 *
 * Training equivalence: a small MLP (Linear + ReLU + Linear, Adam) and a
 * model with LayerNorm, GELU and dropout, each trained 30 steps from the same
 * seed (three batches in turn) with fusion off and on: the loss curves must agree within 1e-5
 * relative (every step), and with fusion on FUSED tasks must have run (with
 * it off none). The learner's resume byte-identity runs in both modes as
 * ctest entries (test_learner, and test_learner_fusion_off with
 * EMBER_FUSION=0).
 *
 * The stream's edge cases, each run with fusion off and on and compared
 * (within 1e-6 relative, f32): an intermediate read on the host mid-chain,
 * an intermediate kept and read after the chain, views and a broadcast of a
 * pending output used as inputs, em_set_fusion(false) with ops pending, a
 * chain across a matmul, a chain under autodiff (the gradients compared too),
 * two threads each running a chain on its own data (against the same chains
 * run on one thread). Each case with fusion on must run FUSED tasks
 * (otherwise it tests nothing). Runs on the current device (EMBER_DEVICE). */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Host values from a 64-bit LCG in [-2, 2). */
static void fill(uint64_t seed, float *v, int64_t n)
{
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        v[i] = (float)((double)(s >> 11) * (1.0 / 9007199254740992.0) * 4 - 2);
    }
}

static em_tensor *make(uint64_t seed, const int64_t *shape, int nd)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    fill(seed, v, n);
    em_tensor *t = em_from_host(v, shape, nd, EM_F32);
    free(v);
    assert_non_null(t);
    return t;
}

/* Appends t's values to out[*n...] (out holds cap values). */
static void grab(const em_tensor *t, double *out, int64_t *n, int64_t cap)
{
    assert_non_null(t);
    double *v = em_test_values(t);
    const int64_t k = em_tensor_numel(t);
    assert_true(*n + k <= cap);
    memcpy(out + *n, v, sizeof(double) * (size_t)k);
    *n += k;
    free(v);
}

static void assert_same(const double *a, const double *b, int64_t n, double rtol, double atol, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs(a[i] - b[i]), tol = atol + rtol * fabs(a[i]);
        if (!(d <= tol) && !(isnan(a[i]) && isnan(b[i])))
            fail_msg("%s: value %lld: fusion on %.9g, off %.9g", what, (long long)i, b[i], a[i]);
    }
}

/* ---- training equivalence ---------------------------------------------------- */

#define TR_STEPS 30
#define TR_BATCH 16
#define TR_IN 20
#define TR_CLASSES 5

static em_module *mlp_model(void)
{
    em_module *m = em_sequential_new(NULL, 0);
    assert_non_null(m);
    assert_int_equal(em_sequential_append(m, em_linear_new(TR_IN, 32, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_relu_new()), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(32, TR_CLASSES, true)), EM_OK);
    return m;
}

static em_module *norm_model(void)
{
    em_module *m = em_sequential_new(NULL, 0);
    assert_non_null(m);
    assert_int_equal(em_sequential_append(m, em_linear_new(TR_IN, 24, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_layer_norm_new((const int64_t[]){24}, 1, 1e-5, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_gelu_new(false)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_dropout_new(0.1)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(24, 24, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_gelu_new(true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(24, TR_CLASSES, true)), EM_OK);
    return m;
}

/* Trains a fresh model of @p build (seed 7) TR_STEPS steps with fusion
 * @p fusion; loss[i] = step i's loss; returns the FUSED tasks counted. */
static int64_t train(em_module *(*build)(void), bool fusion, double *loss)
{
    const bool was = em_set_fusion(fusion);
    em_manual_seed(7);
    em_module *m = build();
    em_module_train(m, true);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    oc.lr = 0.01;
    em_optim *opt = em_optim_new_for_module(&oc, m);
    assert_non_null(opt);
    float x[TR_BATCH * TR_IN];
    int64_t y[TR_BATCH];
    const em_stats s0 = em_get_stats();
    for (int s = 0; s < TR_STEPS; s++) {
        em_test_class_batch(100 + (uint64_t)(s % 3), TR_BATCH, TR_IN, TR_CLASSES, x, y);
        em_scope_begin();
        em_tensor *xt = em_from_host(x, (const int64_t[]){TR_BATCH, TR_IN}, 2, EM_F32);
        em_tensor *yt = em_from_host(y, (const int64_t[]){TR_BATCH}, 1, EM_I64);
        em_tensor *l = em_cross_entropy(em_module_forward(m, xt), yt, NULL);
        assert_non_null(l);
        em_grads *g = em_backward(l);
        assert_non_null(g);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        assert_int_equal(em_item(l, &loss[s]), EM_OK);
        em_scope_end();
    }
    const em_stats s1 = em_get_stats();
    em_optim_free(opt);
    em_module_free(m);
    em_set_fusion(was);
    return s1.fused_tasks - s0.fused_tasks;
}

static void check_training(em_module *(*build)(void), const char *name)
{
    double off[TR_STEPS], on[TR_STEPS];
    const int64_t f_off = train(build, false, off), f_on = train(build, true, on);
    printf("fusion: %s: loss %.6f -> %.6f (off), %.6f -> %.6f (on); FUSED tasks: off %lld, on %lld\n", name, off[0],
           off[TR_STEPS - 1], on[0], on[TR_STEPS - 1], (long long)f_off, (long long)f_on);
    assert_int_equal(f_off, 0);
    if (f_on <= 0) fail_msg("%s: fusion on, but no FUSED task ran in %d steps", name, TR_STEPS);
    for (int s = 0; s < TR_STEPS; s++)
        if (!(fabs(on[s] - off[s]) <= 1e-5 * fabs(off[s])))
            fail_msg("%s: step %d: loss %.9g with fusion on, %.9g off (relative %.3g > 1e-5)", name, s, on[s], off[s],
                     fabs(on[s] - off[s]) / fabs(off[s]));
    assert_true(off[TR_STEPS - 1] < off[0]); /* it trained */
}

static void test_train_mlp(void **state)
{
    (void)state;
    check_training(mlp_model, "MLP 20-32-5");
}

static void test_train_norm_gelu_dropout(void **state)
{
    (void)state;
    check_training(norm_model, "Linear+LayerNorm+GELU+Dropout+Linear+GELU(tanh)+Linear");
}

/* ---- the stream's edge cases --------------------------------------------------- */

#define CAP 4096

/* A scenario writes what it computed into out (n values); run with fusion off
 * and on, the values must agree and the fused run must count FUSED tasks. */
typedef void (*scenario_fn)(double *out, int64_t *n);

static void run_scenario(scenario_fn f, const char *name)
{
    static double a[CAP], b[CAP];
    int64_t na = 0, nb = 0;
    const bool was = em_set_fusion(false);
    em_stats s0 = em_get_stats();
    f(a, &na);
    em_stats s1 = em_get_stats();
    assert_int_equal(s1.fused_tasks - s0.fused_tasks, 0);
    em_set_fusion(true);
    s0 = em_get_stats();
    f(b, &nb);
    s1 = em_get_stats();
    em_set_fusion(was);
    printf("fusion: %s: %lld values, fusion on: %lld FUSED tasks, %lld ops fused\n", name, (long long)nb,
           (long long)(s1.fused_tasks - s0.fused_tasks), (long long)(s1.ops_fused - s0.ops_fused));
    assert_int_equal(na, nb);
    if (s1.fused_tasks - s0.fused_tasks <= 0) fail_msg("%s: fusion on, but no FUSED task ran", name);
    assert_same(a, b, na, 1e-6, 1e-7, name);
}

/* an intermediate read on the host (em_to_host) mid-chain, then the chain goes on from it */
static void sc_host_read(double *out, int64_t *n)
{
    em_scope_begin();
    em_tensor *x = make(1, (const int64_t[]){16, 33}, 2);
    em_tensor *a = em_gelu(em_add_scalar(em_mul_scalar(x, 0.7), 0.1));
    float mid[16 * 33];
    assert_int_equal(em_to_host(a, mid, sizeof mid), EM_OK);
    for (int i = 0; i < 16 * 33; i++) out[(*n)++] = mid[i];
    em_tensor *b = em_sigmoid(em_sub(em_tanh(a), x));
    double it = 0;
    assert_int_equal(em_item(em_sum_all(em_mul(b, a)), &it), EM_OK); /* em_item mid-way too */
    out[(*n)++] = it;
    grab(em_mul_scalar(b, 3), out, n, CAP);
    em_scope_end();
}

/* an intermediate kept alive (retained) past the chain and read after it; the
 * others released as soon as they are used (nobody references them) */
static void sc_retained(double *out, int64_t *n)
{
    em_tensor *x = make(2, (const int64_t[]){7, 9, 5}, 3);
    em_tensor *a = em_mul_scalar(x, 1.5);
    em_tensor *b = em_tanh(a);
    em_tensor *kept = em_tensor_retain(b);
    em_tensor_release(a);
    em_tensor *c = em_add(b, x);
    em_tensor_release(b); /* kept still holds it */
    em_tensor *d = em_silu(c);
    em_tensor_release(c);
    em_tensor *e = em_rsub_scalar(d, 1);
    em_tensor_release(d);
    grab(e, out, n, CAP);
    grab(kept, out, n, CAP);
    em_tensor_release(e);
    em_tensor_release(kept);
    em_tensor_release(x);
}

/* views of pending outputs as inputs: a slice (strided), a transpose, and a
 * row of a pending output broadcast against the whole */
static void sc_views(double *out, int64_t *n)
{
    em_scope_begin();
    em_tensor *x = make(3, (const int64_t[]){12, 12}, 2);
    em_tensor *a = em_softsign(em_mul_scalar(x, 2)); /* pending */
    em_tensor *row = em_narrow(a, 0, 3, 1);          /* [1, 12] view of it */
    em_tensor *b = em_sub(a, row);                   /* broadcast */
    em_tensor *t = em_transpose(b, 0, 1);            /* a permuted view of a pending output */
    em_tensor *c = em_mul(em_exp(t), a);
    em_tensor *s = em_slice(c, 1, 1, 12, 2);         /* [12, 6], stride 2 */
    em_tensor *e = em_expand(em_narrow(em_relu(x), 1, 0, 1), (const int64_t[]){12, 6}, 2); /* a column broadcast */
    em_tensor *f = em_add(em_sqrt(em_add_scalar(em_abs(s), 0.5)), e);
    grab(f, out, n, CAP);
    grab(b, out, n, CAP);
    em_scope_end();
}

/* em_set_fusion(false) with ops pending: they run (flushed), the chain goes on eager */
static void sc_switch_off(double *out, int64_t *n)
{
    const bool on = em_fusion_enabled();
    em_scope_begin();
    em_tensor *x = make(4, (const int64_t[]){64, 17}, 2);
    em_tensor *a = em_sigmoid(em_add_scalar(em_mul_scalar(x, -1.25), 0.3));
    em_tensor *b = em_mul(a, x);
    const em_stats s0 = em_get_stats();
    const bool prev = em_set_fusion(false);
    assert_int_equal(prev, on);
    assert_false(em_fusion_enabled());
    const em_stats s1 = em_get_stats();
    assert_true(s1.fused_tasks >= s0.fused_tasks);
    em_tensor *c = em_log1p(em_square(b));
    em_tensor *d = em_sub(c, a);
    grab(d, out, n, CAP);
    em_set_fusion(on);
    assert_int_equal(em_fusion_enabled(), on);
    em_scope_end();
}

/* a chain across a non-fusable op: element-wise, matmul, element-wise */
static void sc_matmul(double *out, int64_t *n)
{
    em_scope_begin();
    em_tensor *x = make(5, (const int64_t[]){8, 32}, 2);
    em_tensor *w = make(6, (const int64_t[]){32, 16}, 2);
    em_tensor *bias = make(7, (const int64_t[]){16}, 1);
    em_tensor *h = em_mul_scalar(em_gelu(em_add_scalar(x, 0.2)), 0.5);
    em_tensor *y = em_matmul(h, w);
    em_tensor *z = em_tanh(em_mul_scalar(em_add(y, bias), 0.25));
    em_tensor *z2 = em_add(z, em_matmul(em_sigmoid(h), w));
    grab(z2, out, n, CAP);
    em_scope_end();
}

/* a chain under autodiff: forward, backward (the backward's own
 * element-wise chains fuse too), gradients compared */
static void sc_autodiff(double *out, int64_t *n)
{
    em_scope_begin();
    em_tensor *x = make(8, (const int64_t[]){10, 24}, 2);
    em_tensor *w = make(9, (const int64_t[]){24}, 1);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    em_tensor *h = em_gelu_tanh(em_add(em_mul_scalar(x, 0.8), w));
    em_tensor *g = em_mul(em_sigmoid(h), em_softplus(em_sub(h, w)));
    em_tensor *loss = em_sum_all(em_mul(g, em_tanh(x)));
    em_grads *gr = em_backward(loss);
    assert_non_null(gr);
    grab(loss, out, n, CAP);
    grab(em_grad(gr, x), out, n, CAP);
    grab(em_grad(gr, w), out, n, CAP);
    em_grads_free(gr);
    em_scope_end();
}

/* the two threads' chain: values from @p seed */
static void thread_chain(uint64_t seed, double *out, int64_t *n)
{
    em_scope_begin();
    em_tensor *x = make(seed, (const int64_t[]){32, 40}, 2);
    em_tensor *bias = make(seed + 1, (const int64_t[]){1, 40}, 2);
    em_tensor *v = x;
    for (int i = 0; i < 12; i++) {
        em_scope_begin();
        em_tensor *y = i % 3 == 0 ? em_add(v, bias) : i % 3 == 1 ? em_tanh(em_mul_scalar(v, 1.1)) : em_sub_scalar(v, 0.05);
        assert_non_null(y);
        em_keep(y);
        em_scope_end();
        v = y;
    }
    grab(v, out, n, CAP);
    em_scope_end();
}

typedef struct thread_job {
    uint64_t seed;
    double out[CAP];
    int64_t n;
} thread_job;

static void *thread_main(void *p)
{
    thread_job *j = p;
    for (int r = 0; r < 5; r++) { /* several rounds: the two streams interleave */
        j->n = 0;
        thread_chain(j->seed, j->out, &j->n);
    }
    em_thread_exit();
    return NULL;
}

/* two threads, each running a chain on its own data at the same time
 * (em_* may be called from several threads; the stream is shared) */
static void sc_threads(double *out, int64_t *n)
{
    static thread_job jobs[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        jobs[i].seed = 20 + 10 * (uint64_t)i;
        jobs[i].n = 0;
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        /* the same chain on this thread alone, with fusion off: the reference */
        static double ref[CAP];
        int64_t nr = 0;
        const bool was = em_set_fusion(false);
        thread_chain(jobs[i].seed, ref, &nr);
        em_set_fusion(was);
        assert_int_equal(nr, jobs[i].n);
        assert_same(ref, jobs[i].out, nr, 1e-6, 1e-7, "a thread's chain against the same chain on one thread");
        memcpy(out + *n, jobs[i].out, sizeof(double) * (size_t)jobs[i].n);
        *n += jobs[i].n;
    }
}

static void test_host_read(void **state) { (void)state; run_scenario(sc_host_read, "host read mid-chain"); }
static void test_retained(void **state) { (void)state; run_scenario(sc_retained, "intermediate retained past the chain"); }
static void test_views(void **state) { (void)state; run_scenario(sc_views, "views and broadcast of pending outputs"); }
static void test_switch_off(void **state) { (void)state; run_scenario(sc_switch_off, "em_set_fusion(false) with ops pending"); }
static void test_matmul(void **state) { (void)state; run_scenario(sc_matmul, "chain across matmul"); }
static void test_autodiff(void **state) { (void)state; run_scenario(sc_autodiff, "chain under autodiff, gradients"); }
static void test_threads(void **state) { (void)state; run_scenario(sc_threads, "two threads, a chain each"); }

/* Leaks: the fused runs leave no tensor or handle behind. */
/* A chain held in the stream reads a parameter that a replayed step then
 * updates: the chain was submitted before the replay, so it must see the
 * parameter as it was (em_step_replay flushes the stream first; before the
 * fix the chain ran after the STEP task and read the updated values). */
static void test_chain_before_replay(void **state)
{
    (void)state;
    if (!em_capture_enabled()) skip();
    const bool was = em_set_fusion(true);
    const float w0[4] = {1, 2, 3, 4};
    em_tensor *w = em_from_host(w0, (const int64_t[]){4}, 1, EM_F32);
    assert_non_null(w);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    em_optim *opt = em_sgd_new(&w, 1, 0.1, 0, 0);
    assert_non_null(opt);
    em_step *step = NULL;
    for (int s = 0; s < 2; s++) { /* a warm-up step, then the captured one */
        if (s == 1) assert_int_equal(em_capture_begin(), EM_OK);
        em_scope_begin();
        em_grads *g = em_backward(em_sum_all(em_square(w)));
        assert_non_null(g);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        em_scope_end();
        if (s == 1) assert_non_null(step = em_capture_end());
    }
    float before[4], after[4], y[4];
    assert_int_equal(em_to_host(w, before, sizeof before), EM_OK);
    const em_stats s0 = em_get_stats();
    em_tensor *y1 = em_mul_scalar(w, 10.0), *y2 = em_add_scalar(y1, 1.0); /* held: reads w now */
    assert_int_equal(em_step_replay(step), EM_OK);                      /* writes w */
    assert_int_equal(em_to_host(y2, y, sizeof y), EM_OK);
    assert_int_equal(em_to_host(w, after, sizeof after), EM_OK);
    const em_stats s1 = em_get_stats();
    assert_true(s1.fused_tasks > s0.fused_tasks); /* the chain was fused (else this tests nothing) */
    for (int i = 0; i < 4; i++) {
        if (fabsf(y[i] - (before[i] * 10 + 1)) > 1e-5f)
            fail_msg("value %d: %g, want %g (w before the replay %g, after %g)", i, y[i], before[i] * 10 + 1, before[i], after[i]);
        assert_true(after[i] != before[i]); /* the replay did update w */
    }
    em_tensor_release(y1);
    em_tensor_release(y2);
    em_step_free(step);
    em_optim_free(opt);
    em_tensor_release(w);
    em_set_fusion(was);
}

static void test_no_leak(void **state)
{
    (void)state;
    const em_stats before = em_get_stats();
    const bool was = em_set_fusion(true);
    double v[CAP];
    int64_t n = 0;
    sc_retained(v, &n);
    n = 0;
    sc_views(v, &n);
    em_set_fusion(was);
    em_test_assert_no_leak(&before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_mlp),     cmocka_unit_test(test_train_norm_gelu_dropout),
        cmocka_unit_test(test_host_read),     cmocka_unit_test(test_retained),
        cmocka_unit_test(test_views),         cmocka_unit_test(test_switch_off),
        cmocka_unit_test(test_matmul),        cmocka_unit_test(test_autodiff),
        cmocka_unit_test(test_threads),       cmocka_unit_test(test_chain_before_replay),
        cmocka_unit_test(test_no_leak),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
