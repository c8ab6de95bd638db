/* Data-parallel replicas in one process (em_replicas, dist/replicas.c).
 *
 * Devices: EMBER_TEST_REPLICA_DEVICES (default "cpu,cpu": two replicas on the
 * CPU, the tasks path). CI also runs it as test_replicas_opencl with
 * "cpu,opencl:0" (PoCL: two memory nodes, StarPU moves the gradients), and
 * the GPU machine with "cuda:0,cuda:1" and EMBER_TEST_REPLICA_PATH=nccl (the
 * test then fails unless the NCCL path was taken).
 *
 * The core check: K optimizer steps of the replicas, each on its share of
 * the batch, give the parameters of K single-model steps on the whole batch
 * (also with unequal shares, weighted as the Learner does), and the replicas
 * stay bit-identical. */
#include "testutil.h"

#include "ember/dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F_IN 8
#define F_HID 16
#define F_OUT 4
#define MAXR 8

static em_device g_dev[MAXR];

/* An error status with a message, from a replica thread. */
static em_status em__test_fail(const char *fmt, int k)
{
    char msg[128];
    snprintf(msg, sizeof msg, fmt, k);
    fprintf(stderr, "%s\n", msg);
    return EM_ERR_STATE;
}
static int g_n;

static int setup(void **state)
{
    if (em_test_setup(state) != 0) return -1;
    const char *list = getenv("EMBER_TEST_REPLICA_DEVICES");
    if (em_devices_parse(list && *list ? list : "cpu,cpu", g_dev, MAXR, &g_n) != EM_OK) {
        fprintf(stderr, "EMBER_TEST_REPLICA_DEVICES: %s\n", em_last_error());
        return -1;
    }
    char b[32];
    fprintf(stderr, "test_replicas: %d replicas:", g_n);
    for (int i = 0; i < g_n; i++) fprintf(stderr, " %s", em_device_str(g_dev[i], b, sizeof b));
    fprintf(stderr, "\n");
    return 0;
}

/* x [n, F_IN], y [n] for step @p step. */
static void make_batch(int step, int64_t n, float *x, int64_t *y)
{
    em_test_class_batch(7654321u + (uint64_t)step * 131u, n, F_IN, F_OUT, x, y);
}

static em_module *make_mlp(void)
{
    em_module *mods[3] = {em_linear_new(F_IN, F_HID, true), em_relu_new(), em_linear_new(F_HID, F_OUT, true)};
    return em_sequential_new(mods, 3);
}

/* A group of g_n replicas with optimizers of @p kind; m[0] is built from
 * seed 1, the others from other seeds (em_replicas_new must copy m[0]). */
static em_replicas *make_group(em_optim_kind kind, em_module **m, em_optim **o)
{
    em_optim_config oc = em_optim_config_default(kind);
    oc.lr = kind == EM_OPTIM_SGD ? 0.1 : 0.01;
    if (kind == EM_OPTIM_SGD) oc.momentum = 0.9;
    for (int k = 0; k < g_n; k++) {
        em_manual_seed(1 + (uint64_t)k * 1000);
        m[k] = make_mlp();
        assert_non_null(m[k]);
        o[k] = em_optim_new_for_module(&oc, m[k]);
        assert_non_null(o[k]);
    }
    em_replicas *r = em_replicas_new(m, o, g_dev, g_n);
    if (!r) fail_msg("em_replicas_new: %s", em_last_error());
    const char *want = getenv("EMBER_TEST_REPLICA_PATH");
    if (want && *want && strcmp(want, em_replicas_path(r)) != 0)
        fail_msg("reduction path is '%s', EMBER_TEST_REPLICA_PATH wants '%s'", em_replicas_path(r), want);
    return r;
}

static void free_group(em_replicas *r, em_module **m, em_optim **o)
{
    em_replicas_free(r);
    for (int k = 0; k < g_n; k++) {
        em_optim_free(o[k]);
        em_module_free(m[k]);
    }
}

/* One replica's forward and backward for em_replicas_run (its own thread). */
typedef struct share_ctx {
    const float *x;
    const int64_t *y;
    int64_t B;
    em_module **m;
    em_grads **g;
} share_ctx;

static em_status share_fn(em_replicas *r, int k, void *p)
{
    share_ctx *c = p;
    int n = em_replicas_count(r);
    int64_t base = c->B / n, extra = c->B % n, cnt = base + (k < extra), lo = (int64_t)k * base + (k < extra ? k : extra);
    if (em_get_device().kind != g_dev[k].kind || em_get_device().index != g_dev[k].index)
        return em__test_fail("replica %d runs on the wrong device", k);
    if (cnt == 0) {
        c->g[k] = em_grads_new();
        return c->g[k] ? EM_OK : em_last_status();
    }
    em_scope_begin();
    em_tensor *loss = em_cross_entropy(em_module_forward(c->m[k], em_from_host(c->x + lo * F_IN, SHAPE(cnt, F_IN), 2, EM_F32)),
                                       em_from_host(c->y + lo, SHAPE(cnt), 1, EM_I64), NULL);
    if (loss && cnt * n != c->B) loss = em_mul_scalar(loss, (double)(cnt * n) / (double)c->B);
    c->g[k] = loss ? em_backward(loss) : NULL;
    em_scope_end();
    return c->g[k] ? EM_OK : em_last_status();
}

/* K steps: replicas on shares of a batch of @p B samples (contiguous shares,
 * sizes differ by at most one, losses weighted by n*share/B) against one
 * model on the whole batch. */
static void run_equivalence(em_optim_kind kind, int64_t B, double tol, bool threaded)
{
    const int steps = 3;
    em_module *m[MAXR], *ref;
    em_optim *o[MAXR], *oref;
    em_replicas *r = make_group(kind, m, o);
    double div0 = -1;
    assert_int_equal(em_replicas_divergence(r, &div0), EM_OK);
    assert_true(div0 == 0.0); /* em_replicas_new copied replica 0 */
    em_manual_seed(99);
    ref = make_mlp();
    em_tensor *pr[8], *p0[8];
    int np = em_module_parameters(ref, pr, 8);
    assert_int_equal(em_module_parameters(m[0], p0, 8), np);
    em_no_grad_begin();
    for (int i = 0; i < np; i++) assert_int_equal(em_copy_(pr[i], p0[i]), EM_OK);
    em_no_grad_end();
    em_optim_config oc = *em_optim_get_config(o[0]);
    oref = em_optim_new_for_module(&oc, ref);
    assert_non_null(oref);
    float *x = malloc(sizeof(float) * (size_t)(B * F_IN));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)B);
    for (int s = 0; s < steps; s++) {
        make_batch(s, B, x, y);
        em_scope_begin();
        em_grads *g[MAXR] = {0};
        int64_t base = B / g_n, extra = B % g_n, lo = 0;
        share_ctx sc = {x, y, B, m, g};
        if (threaded) assert_int_equal(em_replicas_run(r, share_fn, &sc), EM_OK);
        for (int k = 0; k < g_n && !threaded; k++) {
            int64_t cnt = base + (k < extra);
            assert_int_equal(em_set_device(g_dev[k]), EM_OK);
            if (cnt == 0) {
                g[k] = em_grads_new();
            } else {
                em_tensor *loss = em_cross_entropy(em_module_forward(m[k], em_from_host(x + lo * F_IN, SHAPE(cnt, F_IN), 2, EM_F32)),
                                                   em_from_host(y + lo, SHAPE(cnt), 1, EM_I64), NULL);
                assert_non_null(loss);
                if (cnt * g_n != B) loss = em_mul_scalar(loss, (double)(cnt * g_n) / (double)B);
                g[k] = em_backward(loss);
            }
            assert_non_null(g[k]);
            lo += cnt;
        }
        assert_int_equal(em_replicas_allreduce_grads(r, g), EM_OK);
        for (int k = 0; k < g_n; k++) {
            assert_int_equal(em_set_device(g_dev[k]), EM_OK);
            assert_int_equal(em_optim_step(o[k], g[k]), EM_OK);
            em_grads_free(g[k]);
        }
        assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
        em_tensor *loss = em_cross_entropy(em_module_forward(ref, em_from_host(x, SHAPE(B, F_IN), 2, EM_F32)),
                                           em_from_host(y, SHAPE(B), 1, EM_I64), NULL);
        em_grads *gr = em_backward(loss);
        assert_non_null(gr);
        assert_int_equal(em_optim_step(oref, gr), EM_OK);
        em_grads_free(gr);
        em_scope_end();
    }
    double err = em_test_max_param_diff(m[0], ref), div = -1;
    assert_int_equal(em_replicas_divergence(r, &div), EM_OK);
    fprintf(stderr, "  %s, batch %lld over %d replicas (%s, %s): |replica - whole-batch model| = %.3g, divergence %.3g\n",
            em_optim_kind_name(kind), (long long)B, g_n, em_replicas_path(r), threaded ? "em_replicas_run" : "one thread", err, div);
    assert_true(err < tol);
    assert_true(div == 0.0);
    free(x);
    free(y);
    em_optim_free(oref);
    em_module_free(ref);
    free_group(r, m, o);
}

/* SGD steps are linear in the gradient, so they catch a wrong mean or a
 * wrong share weight (a sum instead of a mean is off by 0.05 here); Adam
 * normalises the gradient away and only checks the plumbing of its state.
 * The whole-batch model runs on the CPU; replicas on other devices differ by
 * their kernels' rounding. */
static void test_sgd_equal_shares(void **state)
{
    (void)state;
    run_equivalence(EM_OPTIM_SGD, 16, 1e-5, false);
    run_equivalence(EM_OPTIM_SGD, 16, 1e-5, true);
}

static void test_sgd_unequal_shares(void **state)
{
    (void)state;
    run_equivalence(EM_OPTIM_SGD, 7, 1e-5, false); /* 4 + 3 for two replicas */
    run_equivalence(EM_OPTIM_SGD, 7, 1e-5, true);
}

static void test_adam_equal_shares(void **state)
{
    (void)state;
    run_equivalence(EM_OPTIM_ADAM, 16, 1e-5, true);
}

static void test_adam_unequal_shares(void **state)
{
    (void)state;
    run_equivalence(EM_OPTIM_ADAM, 7, 1e-5, false);
}

static void test_fewer_samples_than_replicas(void **state)
{
    (void)state;
    run_equivalence(EM_OPTIM_SGD, 1, 1e-5, true); /* replica 1.. get nothing: zeros */
}

/* A gradient that one replica lacks counts as zeros: the mean is g0 / n. */
static void test_missing_gradient_is_zero(void **state)
{
    (void)state;
    em_module *m[MAXR];
    em_optim *o[MAXR];
    em_replicas *r = make_group(EM_OPTIM_SGD, m, o);
    em_scope_begin();
    em_grads *g[MAXR];
    em_tensor *p[MAXR][8];
    int np = 0;
    for (int k = 0; k < g_n; k++) {
        np = em_module_parameters(m[k], p[k], 8);
        g[k] = em_grads_new();
        assert_non_null(g[k]);
    }
    assert_int_equal(em_set_device(g_dev[0]), EM_OK);
    assert_int_equal(em_grads_set(g[0], p[0][np - 1], em_full(em_tensor_shape(p[0][np - 1]), 1, EM_F32, 3.0)), EM_OK);
    assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
    assert_int_equal(em_replicas_allreduce_grads(r, g), EM_OK);
    for (int k = 0; k < g_n; k++) {
        em_tensor *last = em_grad(g[k], p[k][np - 1]), *first = em_grad(g[k], p[k][0]);
        assert_non_null(last);
        assert_non_null(first);
        double *v = em_test_values(last), *z = em_test_values(first);
        for (int64_t j = 0; j < em_tensor_numel(last); j++) assert_true(fabs(v[j] - 3.0 / g_n) < 1e-6);
        for (int64_t j = 0; j < em_tensor_numel(first); j++) assert_true(z[j] == 0.0);
        free(v);
        free(z);
        em_grads_free(g[k]);
    }
    em_scope_end();
    free_group(r, m, o);
}

/* em_replicas_broadcast repairs a replica that drifted, optimizer state included. */
static void test_broadcast(void **state)
{
    (void)state;
    if (g_n < 2) skip();
    em_module *m[MAXR];
    em_optim *o[MAXR];
    em_replicas *r = make_group(EM_OPTIM_ADAM, m, o);
    em_tensor *p1[8];
    em_module_parameters(m[1], p1, 8);
    em_scope_begin();
    em_no_grad_begin();
    assert_int_equal(em_copy_(p1[0], em_full(em_tensor_shape(p1[0]), 2, EM_F32, 5.0)), EM_OK);
    em_no_grad_end();
    em_scope_end();
    em_optim_set_lr(o[0], 0.123);
    double d = 0;
    assert_int_equal(em_replicas_divergence(r, &d), EM_OK);
    assert_true(d > 0);
    assert_int_equal(em_replicas_broadcast(r), EM_OK);
    assert_int_equal(em_replicas_divergence(r, &d), EM_OK);
    assert_true(d == 0.0);
    assert_true(em_optim_get_lr(o[1]) == 0.123);
    free_group(r, m, o);
}

static em_status failing_fn(em_replicas *r, int k, void *p)
{
    (void)r;
    (void)p;
    if (k == em_replicas_count(r) - 1) {
        em_scope_begin();
        em_tensor *bad = em_add(em_zeros(SHAPE(2), 1, EM_F32), em_zeros(SHAPE(3), 1, EM_F32)); /* shape error */
        em_scope_end();
        if (!bad) return em_last_status();
    }
    return EM_OK;
}

static em_status nested_fn(em_replicas *r, int k, void *p)
{
    (void)p;
    if (k != 0) return EM_OK;
    return em_replicas_run(r, nested_fn, NULL) == EM_ERR_STATE ? EM_OK : EM_ERR_RUNTIME; /* must be refused */
}

/* em_replicas_run from inside a replica function is refused, and the group still works after. */
static void test_run_not_reentrant(void **state)
{
    (void)state;
    em_module *m[MAXR];
    em_optim *o[MAXR];
    em_replicas *r = make_group(EM_OPTIM_SGD, m, o);
    assert_int_equal(em_replicas_run(r, nested_fn, NULL), EM_OK);
    assert_int_equal(em_replicas_run(r, nested_fn, NULL), EM_OK);
    free_group(r, m, o);
}

/* A replica's error comes back to the caller with the replica named. */
static void test_run_error(void **state)
{
    (void)state;
    em_module *m[MAXR];
    em_optim *o[MAXR];
    em_replicas *r = make_group(EM_OPTIM_SGD, m, o);
    em_status st = em_replicas_run(r, failing_fn, NULL);
    assert_int_equal(st, EM_ERR_SHAPE);
    char want[32];
    snprintf(want, sizeof want, "replica %d: ", g_n - 1);
    assert_non_null(strstr(em_last_error(), want));
    assert_int_equal(em_replicas_run(r, failing_fn, NULL), EM_ERR_SHAPE); /* the threads still work */
    free_group(r, m, o);
}

/* Random numbers inside em_replicas_run: one stream per replica, the same on
 * every run from the same seed, replica 0's equal to the global stream's. */
typedef struct rng_ctx {
    double v[MAXR][16];
} rng_ctx;

static em_status draw_fn(em_replicas *r, int k, void *p)
{
    (void)r;
    rng_ctx *c = p;
    em_scope_begin();
    em_tensor *t = em_rand_uniform(SHAPE(16), 1, EM_F64, 0, 1);
    em_status st = t ? em_to_host(t, c->v[k], sizeof c->v[k]) : em_last_status();
    em_scope_end();
    return st;
}

static void test_rng_streams(void **state)
{
    (void)state;
    em_module *m[MAXR];
    em_optim *o[MAXR];
    em_replicas *r = make_group(EM_OPTIM_SGD, m, o);
    rng_ctx a, b;
    em_manual_seed(42);
    assert_int_equal(em_replicas_run(r, draw_fn, &a), EM_OK);
    uint64_t seed, off;
    em_rng_get_state(&seed, &off);
    assert_true(seed == 42 && off == 16); /* moved past what each replica drew */
    em_manual_seed(42);
    assert_int_equal(em_replicas_run(r, draw_fn, &b), EM_OK);
    assert_memory_equal(&a, &b, sizeof(double) * 16 * (size_t)g_n); /* reproducible */
    em_manual_seed(42);
    em_scope_begin();
    double *ref = em_test_values(em_rand_uniform(SHAPE(16), 1, EM_F64, 0, 1));
    em_scope_end();
    assert_memory_equal(a.v[0], ref, sizeof(double) * 16); /* replica 0 = the global stream */
    free(ref);
    for (int k = 1; k < g_n; k++) assert_memory_not_equal(a.v[k], a.v[0], sizeof(double) * 16);
    free_group(r, m, o);
}

static void test_errors(void **state)
{
    (void)state;
    em_module *m[2];
    em_optim *o[2];
    em_optim_config oc = em_optim_config_default(EM_OPTIM_SGD);
    em_module *mods[3] = {em_linear_new(F_IN, F_HID + 1, true), em_relu_new(), em_linear_new(F_HID + 1, F_OUT, true)};
    m[0] = make_mlp();
    m[1] = em_sequential_new(mods, 3);
    o[0] = em_optim_new_for_module(&oc, m[0]);
    o[1] = em_optim_new_for_module(&oc, m[1]);
    em_device d[2] = {em_device_cpu(), em_device_cpu()};
    /* different architectures: names the replica and the key */
    assert_null(em_replicas_new(m, o, d, 2));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "replica 1"));
    assert_non_null(strstr(em_last_error(), "0.weight"));
    /* an optimizer over another model's parameters */
    em_module *m2[2] = {m[0], make_mlp()};
    em_optim *wrong = em_optim_new_for_module(&oc, m[0]);
    em_optim *o2[2] = {o[0], wrong};
    assert_null(em_replicas_new(m2, o2, d, 2));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "optimizer 1"));
    em_optim_free(wrong);
    /* a device that does not exist */
    em_device bad[2] = {em_device_cpu(), em_device_cuda(7)};
    o2[1] = em_optim_new_for_module(&oc, m2[1]);
    assert_null(em_replicas_new(m2, o2, bad, 2));
    assert_int_equal(em_last_status(), EM_ERR_DEVICE);
    assert_non_null(strstr(em_last_error(), "cuda:7"));
    assert_null(em_replicas_new(m2, o2, d, 0));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    /* one model (or optimizer) for two replicas */
    em_module *same_m[2] = {m2[0], m2[0]};
    em_optim *same_o[2] = {o2[0], o2[0]};
    assert_null(em_replicas_new(same_m, same_o, d, 2));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "share one model"));
    /* optimizers with other settings would make the replicas drift apart */
    em_optim_config oc2 = em_optim_config_default(EM_OPTIM_SGD);
    oc2.momentum = 0.5;
    em_optim *o3[2] = {o2[0], em_optim_new_for_module(&oc2, m2[1])};
    assert_null(em_replicas_new(m2, o3, d, 2));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "other settings"));
    em_optim_free(o3[1]);
    /* HIP is not in this build */
    em_device hip[2] = {em_device_cpu(), {EM_DEVICE_HIP, 0}};
    assert_null(em_replicas_new(m2, o2, hip, 2));
    assert_int_equal(em_last_status(), EM_ERR_DEVICE);
    /* the process's device is left alone */
    assert_int_equal(em_get_device().kind, EM_DEVICE_CPU);
    em_optim_free(o2[1]);
    em_module_free(m2[1]);
    for (int k = 0; k < 2; k++) {
        em_optim_free(o[k]);
        em_module_free(m[k]);
    }
}

static void test_device_lists(void **state)
{
    (void)state;
    em_device d[8];
    int n = 0;
    assert_int_equal(em_devices_parse("cpu,cuda:1,opencl:0", d, 8, &n), EM_OK);
    assert_int_equal(n, 3);
    assert_true(d[1].kind == EM_DEVICE_CUDA && d[1].index == 1 && d[2].kind == EM_DEVICE_OPENCL);
    assert_int_equal(em_devices_parse("cpu:all", d, 8, &n), EM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(em_devices_parse("cpu,,cpu", d, 8, &n), EM_ERR_INVALID);
    assert_int_equal(em_devices_parse("cpu,", d, 8, &n), EM_ERR_INVALID);
    assert_int_equal(em_devices_parse("tpu:0", d, 8, &n), EM_ERR_INVALID);
    assert_int_equal(em_devices_parse("cpu,cpu,cpu", d, 2, &n), EM_ERR_INVALID);
    if (em_device_count(EM_DEVICE_CUDA) == 0) {
        assert_int_equal(em_devices_parse("cuda:all", d, 8, &n), EM_ERR_DEVICE);
        assert_non_null(strstr(em_last_error(), "no cuda device"));
    } else {
        assert_int_equal(em_devices_parse("cuda:all", d, 8, &n), EM_OK);
        assert_int_equal(n, em_device_count(EM_DEVICE_CUDA));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_lists),
        cmocka_unit_test(test_sgd_equal_shares),
        cmocka_unit_test(test_sgd_unequal_shares),
        cmocka_unit_test(test_adam_equal_shares),
        cmocka_unit_test(test_adam_unequal_shares),
        cmocka_unit_test(test_fewer_samples_than_replicas),
        cmocka_unit_test(test_missing_gradient_is_zero),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_run_error),
        cmocka_unit_test(test_rng_streams),
        cmocka_unit_test(test_run_not_reentrant),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, em_test_teardown);
}
