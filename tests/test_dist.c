/* Multi-process data parallelism (dist/): run as `mpirun -np 2 test_dist`
 * (CTest: test_dist_mpi2). Without a launcher it checks the single-process
 * behaviour (rank 0 of 1, every dist call a no-op).
 *
 * Every test runs its collectives unconditionally and agrees on the outcome
 * (all_ok) before asserting, so one rank failing an assertion never leaves
 * the other waiting in a collective. */
#include "testutil.h"

#include "ember/dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_world = 1;

/* true on every rank when @p ok holds on every rank (a collective). */
static bool all_ok(bool ok)
{
    double bad = ok ? 0 : 1;
    if (em_dist_allreduce_max(&bad, 1) != EM_OK) return false;
    return bad == 0;
}

/* ---- deterministic data, identical on every rank ---------------------------- */

#define F_IN 8
#define F_HID 16
#define F_OUT 4

/* x [n, F_IN], y [n] for step @p step. */
static void make_batch(int step, int64_t n, float *x, int64_t *y)
{
    em_test_class_batch(1234567u + (uint64_t)step * 977u, n, F_IN, F_OUT, x, y);
}

static em_module *make_mlp(int64_t hidden)
{
    em_module *mods[3] = {em_linear_new(F_IN, hidden, true), em_relu_new(), em_linear_new(hidden, F_OUT, true)};
    return em_sequential_new(mods, 3);
}

/* ---- tests ---------------------------------------------------------------- */

static void test_rank_and_world(void **state)
{
    (void)state;
    assert_int_equal(em_dist_world_size(), g_world);
    assert_int_equal(em_dist_rank(), g_rank);
    double v[2] = {(double)g_rank, 1.0};
    assert_int_equal(em_dist_allreduce_sum(v, 2), EM_OK);
    assert_true(v[0] == (double)g_world * (g_world - 1) / 2 && v[1] == g_world);
    double m = g_rank;
    assert_int_equal(em_dist_allreduce_max(&m, 1), EM_OK);
    assert_true(m == g_world - 1);
    assert_int_equal(em_dist_barrier(), EM_OK);
}

/* Replicas built from different seeds become identical after the broadcast. */
static void test_broadcast_params(void **state)
{
    (void)state;
    em_manual_seed(100 + (uint64_t)g_rank);
    em_module *m = make_mlp(F_HID);
    assert_non_null(m);
    double before = -1, after = -1;
    em_status s1 = em_dist_param_divergence(m, &before);
    em_status s2 = em_dist_broadcast_params(m);
    em_status s3 = em_dist_param_divergence(m, &after);
    bool ok = all_ok(s1 == EM_OK && s2 == EM_OK && s3 == EM_OK);
    em_module_free(m);
    assert_true(ok);
    if (g_world > 1) assert_true(before > 0);
    assert_true(after == 0.0);
}

/* The mean of (1+rank) over ranks, for f32 and f64 gradients, contiguous and
 * transposed, in every bucket mode. */
static void test_allreduce_values(void **state)
{
    (void)state;
    const size_t modes[] = {0, 64, (size_t)1 << 20};
    double want = (g_world + 1) / 2.0; /* mean of 1..world */
    bool ok = true;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        em_dist_set_bucket_bytes(modes[mi]);
        em_scope_begin();
        em_tensor *p32 = em_zeros(SHAPE(3, 5), 2, EM_F32), *p64 = em_zeros(SHAPE(7), 1, EM_F64);
        em_tensor *pt = em_zeros(SHAPE(4, 2), 2, EM_F32);
        em_set_requires_grad(p32, true);
        em_set_requires_grad(p64, true);
        em_set_requires_grad(pt, true);
        /* loss = sum(p32 * c) + sum(p64 * c) + sum(pt * c): every gradient is c = 1 + rank */
        double c = 1 + g_rank;
        em_tensor *loss = em_add(em_add(em_sum_all(em_mul_scalar(p32, c)), em_cast(em_sum_all(em_mul_scalar(p64, c)), EM_F32)),
                                 em_sum_all(em_mul_scalar(pt, c)));
        em_grads *g = em_backward(loss);
        ok = ok && g;
        if (g) {
            /* a non-contiguous gradient: the transpose of a [2, 4] tensor */
            em_tensor *nc = em_transpose(em_full(SHAPE(2, 4), 2, EM_F32, c), 0, 1);
            ok = ok && !em_tensor_is_contiguous(nc) && em_grads_set(g, pt, nc) == EM_OK;
            em_tensor *params[3] = {p32, p64, pt};
            ok = ok && em_dist_allreduce_grads(g, params, 3) == EM_OK;
            for (int i = 0; i < 3 && ok; i++) {
                em_tensor *gr = em_grad(g, params[i]);
                ok = gr && em_tensor_dtype(gr) == em_tensor_dtype(params[i]) && em_tensor_numel(gr) == em_tensor_numel(params[i]);
                double *v = ok ? em_test_values(gr) : NULL;
                for (int64_t j = 0; ok && j < em_tensor_numel(gr); j++) ok = fabs(v[j] - want) < 1e-6;
                free(v);
                if (ok) {
                    const int64_t *gs = em_tensor_shape(gr), *ps = em_tensor_shape(params[i]);
                    for (int d = 0; d < em_tensor_ndim(gr); d++) ok = ok && gs[d] == ps[d];
                }
            }
            em_grads_free(g);
        }
        em_scope_end();
    }
    em_dist_set_bucket_bytes((size_t)1 << 20);
    assert_true(all_ok(ok));
}

/* Gradients are averaged in place, so one that anything else sees is copied
 * first: a gradient that is a view into a tensor the caller keeps, or a
 * tensor the caller holds, leaves the caller's tensor untouched; one tensor
 * that is the gradient of two parameters gives both the average; a
 * parameter listed twice (tied weights) is reduced once. */
static void test_allreduce_in_place_safety(void **state)
{
    (void)state;
    double c = 1 + g_rank, want = (g_world + 1) / 2.0;
    bool ok = true;
    const size_t modes[] = {0, (size_t)1 << 20};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        em_dist_set_bucket_bytes(modes[mi]);
        em_scope_begin();
        em_tensor *pa = em_zeros(SHAPE(3, 5), 2, EM_F32), *pb = em_zeros(SHAPE(3, 5), 2, EM_F32), *pc = em_zeros(SHAPE(6), 1, EM_F32);
        em_tensor *params[4] = {pa, pb, pc, pa}; /* pa twice, as a module with tied weights lists it */
        for (int i = 0; i < 3; i++) em_set_requires_grad(params[i], true);
        em_grads *g = em_grads_new();
        em_tensor *shared = em_full(SHAPE(3, 5), 2, EM_F32, c);
        em_tensor *big = em_full(SHAPE(12), 1, EM_F32, c); /* the caller's tensor; pc's gradient is a view of it */
        ok = ok && g && shared && big && em_grads_set(g, pa, shared) == EM_OK && em_grads_set(g, pb, shared) == EM_OK &&
             em_grads_set(g, pc, em_narrow(big, 0, 3, 6)) == EM_OK;
        ok = ok && em_dist_allreduce_grads(g, params, 4) == EM_OK;
        for (int i = 0; i < 3 && ok; i++) {
            double *v = em_test_values(em_grad(g, params[i]));
            ok = v != NULL;
            for (int64_t j = 0; ok && j < em_tensor_numel(params[i]); j++) ok = fabs(v[j] - want) < 1e-6;
            free(v);
        }
        double *b = ok ? em_test_values(big) : NULL, *sh = ok ? em_test_values(shared) : NULL;
        ok = ok && b && sh;
        for (int64_t j = 0; ok && j < 12; j++) ok = b[j] == c;
        for (int64_t j = 0; ok && j < 15; j++) ok = sh[j] == c;
        free(b);
        free(sh);
        em_grads_free(g);
        em_scope_end();
    }
    em_dist_set_bucket_bytes((size_t)1 << 20);
    assert_true(all_ok(ok));
}

/* K optimizer steps with the batch split across ranks give the parameters of
 * K single-process steps on the whole batch (loss = mean, so the mean of the
 * ranks' gradients is the full-batch gradient). A parameter unused by the
 * loss gets zeros on every rank and stays put, as without a gradient. */
static void run_equivalence(em_optim_kind kind, size_t bucket_bytes, double *max_err, double *divergence, bool *ok_out)
{
    const int64_t B = 12; /* per rank */
    const int steps = 3;
    int64_t N = B * g_world;
    em_dist_set_bucket_bytes(bucket_bytes);
    em_manual_seed(7 + (uint64_t)g_rank); /* different on purpose: the broadcast must fix it */
    em_module *dm = make_mlp(F_HID), *ref = make_mlp(F_HID);
    bool ok = dm && ref && em_dist_broadcast_params(dm) == EM_OK;
    /* the reference replica starts from the broadcast parameters */
    em_tensor *pd[8], *pr[8];
    int np = ok ? em_module_parameters(dm, pd, 6) : 0;
    ok = ok && np == 4 && em_module_parameters(ref, pr, 6) == 4;
    em_no_grad_begin();
    for (int i = 0; ok && i < np; i++) ok = em_copy_(pr[i], pd[i]) == EM_OK;
    em_no_grad_end();
    /* an extra parameter that no loss uses */
    em_tensor *ud = em_ones(SHAPE(3), 1, EM_F32), *ur = em_ones(SHAPE(3), 1, EM_F32);
    em_set_requires_grad(ud, true);
    em_set_requires_grad(ur, true);
    pd[np] = ud;
    pr[np] = ur;
    em_optim_config oc = em_optim_config_default(kind);
    oc.lr = kind == EM_OPTIM_SGD ? 0.1 : 0.01;
    if (kind == EM_OPTIM_SGD) oc.momentum = 0.9;
    em_optim *od = ok ? em_optim_new(&oc, pd, np + 1) : NULL, *orf = ok ? em_optim_new(&oc, pr, np + 1) : NULL;
    ok = ok && od && orf;
    float *x = malloc(sizeof(float) * (size_t)(N * F_IN));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)N);
    float *xs = malloc(sizeof(float) * (size_t)(B * F_IN));
    int64_t *ys = malloc(sizeof(int64_t) * (size_t)B);
    for (int s = 0; ok && s < steps; s++) {
        make_batch(s, N, x, y);
        /* this rank's shard: rows rank, rank + world, ... (as the loader shards) */
        for (int64_t i = 0; i < B; i++) {
            memcpy(xs + i * F_IN, x + (i * g_world + g_rank) * F_IN, sizeof(float) * F_IN);
            ys[i] = y[i * g_world + g_rank];
        }
        em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_module_forward(dm, em_from_host(xs, SHAPE(B, F_IN), 2, EM_F32)),
                                           em_from_host(ys, SHAPE(B), 1, EM_I64), NULL);
        em_grads *g = loss ? em_backward(loss) : NULL;
        ok = g && em_dist_allreduce_grads(g, pd, np + 1) == EM_OK && (g_world == 1 || em_grad(g, ud)) &&
             em_optim_step(od, g) == EM_OK;
        em_grads_free(g);
        /* the single-process reference on the whole batch */
        em_tensor *lr = em_cross_entropy(em_module_forward(ref, em_from_host(x, SHAPE(N, F_IN), 2, EM_F32)),
                                         em_from_host(y, SHAPE(N), 1, EM_I64), NULL);
        em_grads *gr = lr ? em_backward(lr) : NULL;
        ok = ok && gr && em_optim_step(orf, gr) == EM_OK;
        em_grads_free(gr);
        em_scope_end();
    }
    /* the collectives run whatever happened above */
    *divergence = -1;
    if (em_dist_param_divergence(dm, divergence) != EM_OK) ok = false;
    double e = ok ? em_test_max_param_diff(dm, ref) : INFINITY;
    if (ok) {
        double *u = em_test_values(ud);
        for (int i = 0; i < 3; i++) e = fmax(e, fabs(u[i] - 1.0));
        free(u);
    }
    if (em_dist_allreduce_max(&e, 1) != EM_OK) ok = false;
    *max_err = e;
    *ok_out = ok;
    free(x);
    free(y);
    free(xs);
    free(ys);
    em_optim_free(od);
    em_optim_free(orf);
    em_tensor_release(ud);
    em_tensor_release(ur);
    em_module_free(dm);
    em_module_free(ref);
    em_dist_set_bucket_bytes((size_t)1 << 20);
}

static void test_steps_match_single_process(void **state)
{
    (void)state;
    const struct { em_optim_kind kind; size_t bucket; const char *name; } cases[] = {
        {EM_OPTIM_SGD, 0, "sgd, one reduction per tensor"},
        {EM_OPTIM_SGD, 300, "sgd, small buckets"},
        {EM_OPTIM_SGD, (size_t)1 << 20, "sgd, one bucket"},
        {EM_OPTIM_ADAM, 300, "adam, small buckets"},
    };
    bool all = true;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double err, div;
        bool ok;
        run_equivalence(cases[i].kind, cases[i].bucket, &err, &div, &ok);
        ok = all_ok(ok);
        if (g_rank == 0)
            printf("  %-32s max |dist - single| = %.3g, divergence across ranks = %.3g%s\n", cases[i].name, err, div,
                   ok ? "" : "  (FAILED to run)");
        all = all && ok && err < 2e-5 && div == 0.0;
    }
    assert_true(all);
}

/* The sharded loader covers the dataset exactly once per epoch over all ranks
 * (shard_even: at most once, the same count on every rank). */
static void test_sharded_loader_covers_dataset(void **state)
{
    (void)state;
    const int64_t n = 103;
    float *x = calloc((size_t)n, sizeof(float));
    int64_t *y = calloc((size_t)n, sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)i;
        y[i] = i % 3;
    }
    em_dataset *ds = em_dataset_from_arrays(x, y, n, SHAPE(1), 1);
    bool ok = ds != NULL;
    double *count = calloc((size_t)n, sizeof(double));
    for (int even = 0; even <= 1; even++) {
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            em_loader_options lo = em_loader_options_default();
            lo.batch_size = 10;
            lo.shuffle = true;
            lo.seed = 5;
            lo.rank = g_rank;
            lo.world_size = g_world;
            lo.shard_even = even;
            em_loader *l = ds ? em_loader_new(ds, &lo) : NULL;
            ok = ok && l && em_loader_start_epoch(l, epoch) == EM_OK;
            memset(count, 0, sizeof(double) * (size_t)n);
            double batches = 0;
            const em_batch *b;
            while (ok && (b = em_loader_next(l))) {
                batches++;
                for (int64_t i = 0; i < b->size; i++) {
                    ok = ok && b->indices[i] >= 0 && b->indices[i] < n && (int64_t)b->x[i] == b->indices[i];
                    if (ok) count[b->indices[i]] += 1;
                }
            }
            em_loader_free(l);
            double nb[2] = {batches, -batches};
            if (em_dist_allreduce_sum(count, (int)n) != EM_OK || em_dist_allreduce_max(nb, 2) != EM_OK) ok = false;
            double total = 0;
            for (int64_t i = 0; i < n; i++) {
                total += count[i];
                ok = ok && (even ? count[i] <= 1 : count[i] == 1);
            }
            ok = ok && total == (even ? (double)(n / g_world * g_world) : (double)n);
            if (even) ok = ok && nb[0] == -nb[1]; /* same number of steps on every rank */
            if (g_rank == 0 && epoch == 0)
                printf("  shard_even=%d: %.0f samples over %d ranks, %.0f-%.0f batches per rank\n", even, total, g_world, -nb[1], nb[0]);
        }
    }
    free(count);
    em_dataset_free(ds);
    free(x);
    free(y);
    assert_true(all_ok(ok));
}

static void test_config_mismatch_detected(void **state)
{
    (void)state;
    em_manual_seed(1);
    em_module *same = make_mlp(F_HID);
    /* the last rank builds another hidden size */
    em_module *diff = make_mlp(g_world > 1 && g_rank == g_world - 1 ? F_HID + 1 : F_HID);
    em_status s_ok = em_dist_check_config(same, "adam lr=0.001 batch=64");
    em_status s_model = em_dist_check_config(diff, "adam lr=0.001 batch=64");
    char msg_model[1024];
    snprintf(msg_model, sizeof msg_model, "%s", em_last_error());
    em_status s_hp = em_dist_check_config(same, g_rank == 0 ? "adam lr=0.001 batch=64" : "adam lr=0.002 batch=64");
    char msg_hp[1024];
    snprintf(msg_hp, sizeof msg_hp, "%s", em_last_error());
    em_module_free(same);
    em_module_free(diff);
    bool ok = s_ok == EM_OK;
    if (g_world > 1) {
        /* every rank reports it, with what differs */
        ok = ok && s_model == EM_ERR_STATE && strstr(msg_model, "mismatch") && strstr(msg_model, "different model") &&
             strstr(msg_model, "0.weight");
        ok = ok && s_hp == EM_ERR_STATE && strstr(msg_hp, "lr=0.001") && strstr(msg_hp, "lr=0.002");
        if (g_rank == 0) printf("  model: %s\n  settings: %s\n", msg_model, msg_hp);
    } else {
        ok = ok && s_model == EM_OK && s_hp == EM_OK;
    }
    assert_true(all_ok(ok));
}

int main(int argc, char **argv)
{
    bool launched = em_dist_launched();
    if (launched) {
        if (em_dist_init(&argc, &argv, NULL) != EM_OK) {
            fprintf(stderr, "em_dist_init failed: %s\n", em_last_error());
            return 1;
        }
    } else if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "em_init failed: %s\n", em_last_error());
        return 1;
    }
    g_rank = em_dist_rank();
    g_world = em_dist_world_size();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_and_world),
        cmocka_unit_test(test_broadcast_params),
        cmocka_unit_test(test_allreduce_values),
        cmocka_unit_test(test_allreduce_in_place_safety),
        cmocka_unit_test(test_steps_match_single_process),
        cmocka_unit_test(test_sharded_loader_covers_dataset),
        cmocka_unit_test(test_config_mismatch_detected),
    };
    char name[64];
    snprintf(name, sizeof name, "dist (rank %d of %d)", g_rank, g_world);
    int failed = _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
    /* Agree on the verdict so that every rank exits alike. */
    double f = failed;
    if (launched) em_dist_allreduce_max(&f, 1);
    if (launched) em_dist_shutdown();
    else em_shutdown();
    return (int)f;
}
