/* Shared by the benchmark programs: a monotonic clock and a check that ends
 * the program with Ember's last error. */
#ifndef EMBER_BENCH_UTIL_H
#define EMBER_BENCH_UTIL_H

#include "ember/ember.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/** Seconds on CLOCK_MONOTONIC. */
static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/** Evaluates @p x; when false, prints the expression and em_last_error()
 *  (prefixed by the benchmark's source file) and exits 1. */
#define CK(x)                                                                         \
    do {                                                                              \
        if (!(x)) {                                                                   \
            fprintf(stderr, "%s: %s failed: %s\n", __FILE__, #x, em_last_error());    \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/** Sorts @p v[0..n) in place and returns its median (n > 0); *lo / *hi get
 *  the smallest and the largest value. */
static inline int bench_cmp_double_(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static inline double bench_median(double *v, int n, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof v[0], bench_cmp_double_);
    *lo = v[0];
    *hi = v[n - 1];
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/** The benchmarks' MLP: Linear(in, hidden) + ReLU + Linear(hidden, out)
 *  (bias on both), seeded with em_manual_seed(0), and an Adam optimizer
 *  (default config) over its parameters. Exits 1 on failure. */
static inline void bench_mlp_new(int64_t in, int64_t hidden, int64_t out, em_module **m, em_optim **opt)
{
    em_manual_seed(0);
    *m = em_sequential_new(NULL, 0);
    CK(*m);
    CK(em_sequential_append(*m, em_linear_new(in, hidden, true)) == EM_OK);
    CK(em_sequential_append(*m, em_relu_new()) == EM_OK);
    CK(em_sequential_append(*m, em_linear_new(hidden, out, true)) == EM_OK);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    *opt = em_optim_new_for_module(&oc, *m);
    CK(*opt);
}

/** One training step: cross-entropy of m(x) against the class indices y
 *  (i64), backward, optimizer step; inside its own scope, no sync. With
 *  @p low (EM_BF16 / EM_F16, or -1 for none) the forward and the loss run
 *  under em_autocast_begin(low). */
static inline void bench_mlp_step(em_module *m, em_optim *opt, const em_tensor *x, const em_tensor *y, int low)
{
    em_cross_entropy_opts ce = em_cross_entropy_opts_default();
    em_scope_begin();
    if (low >= 0) CK(em_autocast_begin((em_dtype)low) == EM_OK);
    em_tensor *loss = em_cross_entropy(em_module_forward(m, x), y, &ce);
    if (low >= 0) CK(em_autocast_end() == EM_OK);
    CK(loss);
    em_grads *g = em_backward(loss);
    CK(g);
    CK(em_optim_step(opt, g) == EM_OK);
    em_grads_free(g);
    em_scope_end();
}

#endif
