/* Benchmark: training-mode BatchNorm2d forward + backward, the fused
 * BATCH_NORM / BATCH_NORM_BWD / BATCH_NORM_RUNNING ops (em_batch_norm) next
 * to the composed form they replaced (mean, sub, square, mean, add_scalar,
 * rsqrt, mul, running updates, affine mul / add; autodiff through each).
 *
 *   bench_batch_norm [iters] [N C H W]     (default 20, 64 64 32 32; f32)
 *
 * One iteration: y = bn(x) with running statistics and weight / bias that
 * require grad, loss = sum(y * W), em_backward, em_sync. Reports the mean and
 * best time per iteration (after 2 warm-ups), the tasks submitted per
 * iteration, and the largest difference between the two forms' y and input
 * gradient. The device is EMBER_DEVICE's (e.g. cuda:0). */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The composed training-mode batch norm of em_batch_norm before the fused ops. */
static em_tensor *bn_composed(em_tensor *x, em_tensor *rm, em_tensor *rv, em_tensor *w, em_tensor *b, double momentum, double eps)
{
    int64_t c = em_tensor_dim(x, 1), cs[4] = {1, c, 1, 1};
    int dims[3] = {0, 2, 3};
    int64_t count = em_tensor_numel(x) / c;
    em_tensor *mean = em_mean(x, dims, 3, true);
    em_tensor *xc = em_sub(x, mean);
    em_tensor *var = em_mean(em_square(xc), dims, 3, true);
    em_tensor *y = em_mul(xc, em_rsqrt(em_add_scalar(var, eps)));
    em_no_grad_begin();
    em_copy_(rm, em_add(em_mul_scalar(rm, 1 - momentum), em_mul_scalar(em_reshape(mean, &c, 1), momentum)));
    em_copy_(rv, em_add(em_mul_scalar(rv, 1 - momentum),
                        em_mul_scalar(em_mul_scalar(em_reshape(var, &c, 1), (double)count / (double)(count - 1)), momentum)));
    em_no_grad_end();
    y = em_mul(y, em_reshape(w, cs, 4));
    return em_add(y, em_reshape(b, cs, 4));
}

static double max_diff(em_tensor *a, em_tensor *b)
{
    double d = -1;
    em_scope_begin();
    em_tensor *m = em_max(em_abs(em_sub(em_cast(a, EM_F64), em_cast(b, EM_F64))), NULL, 0, false); /* every dim */
    if (m && em_item(m, &d) != EM_OK) d = -1;
    em_scope_end();
    return d;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    int64_t xs[4] = {64, 64, 32, 32};
    if (argc > 5)
        for (int i = 0; i < 4; i++) xs[i] = atoll(argv[2 + i]);
    if (iters < 1 || em_init(NULL) != EM_OK) {
        fprintf(stderr, "usage: bench_batch_norm [iters] [N C H W]; %s\n", em_last_error());
        return 1;
    }
    const int64_t c = xs[1];
    em_tensor *x = em_rand_normal(xs, 4, EM_F32, 0.5, 2), *W = em_rand_normal(xs, 4, EM_F32, 0, 1);
    em_tensor *w = em_rand_uniform(&c, 1, EM_F32, 0.5, 1.5), *b = em_rand_normal(&c, 1, EM_F32, 0, 1);
    em_tensor *rm = em_zeros(&c, 1, EM_F32), *rv = em_ones(&c, 1, EM_F32);
    if (!x || !W || !w || !b || !rm || !rv || em_set_requires_grad(x, true) != EM_OK || em_set_requires_grad(w, true) != EM_OK ||
        em_set_requires_grad(b, true) != EM_OK || em_sync() != EM_OK) {
        fprintf(stderr, "setup: %s\n", em_last_error());
        return 1;
    }
    printf("batch norm [%lld, %lld, %lld, %lld] f32 on %s, forward + backward\n", (long long)xs[0], (long long)xs[1],
           (long long)xs[2], (long long)xs[3], getenv("EMBER_DEVICE") ? getenv("EMBER_DEVICE") : "the default device");
    em_tensor *ys[2] = {NULL, NULL}, *gx[2] = {NULL, NULL};
    for (int mode = 0; mode < 2; mode++) {
        double best = 1e30, tot = 0;
        long long tasks = 0;
        for (int it = 0; it < iters + 2; it++) {
            em_stats s0 = em_get_stats();
            double t0 = now();
            em_scope_begin();
            em_tensor *y = mode ? em_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5) : bn_composed(x, rm, rv, w, b, 0.1, 1e-5);
            em_grads *g = y ? em_backward(em_sum_all(em_mul(y, W))) : NULL;
            if (!g) {
                fprintf(stderr, "%s: %s\n", mode ? "fused" : "composed", em_last_error());
                return 1;
            }
            if (it == 0) {
                ys[mode] = em_keep(y);
                gx[mode] = em_keep(em_add_scalar(em_grad(g, x), 0.0)); /* a copy: em_grad is borrowed */
            }
            em_grads_free(g);
            em_scope_end();
            if (em_sync() != EM_OK) {
                fprintf(stderr, "%s: %s\n", mode ? "fused" : "composed", em_last_error());
                return 1;
            }
            const double dt = now() - t0;
            if (it >= 2) {
                tot += dt;
                if (dt < best) best = dt;
                tasks = (long long)(em_get_stats().tasks_submitted - s0.tasks_submitted);
            }
        }
        printf("  %-8s  mean %8.3f ms  best %8.3f ms  %3lld tasks / iteration\n", mode ? "fused" : "composed",
               1e3 * tot / iters, 1e3 * best, tasks);
    }
    printf("  largest |fused - composed|: y %.3g, dx %.3g\n", max_diff(ys[0], ys[1]), max_diff(gx[0], gx[1]));
    em_shutdown();
    return 0;
}
