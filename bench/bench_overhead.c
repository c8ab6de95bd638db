/* Benchmark: per-op overhead of Ember on tiny tensors.
 *
 *   bench_overhead [nops]      (default 10000)
 *
 * A dependency chain acc = acc + one of nops em_add calls on f32 tensors of 1
 * and of 16 elements, each step inside em_scope_begin / em_keep /
 * em_scope_end, then one em_sync; next to the same loop in plain C. Reports
 * microseconds per op: submission only (time until the loop returns) and
 * total (until em_sync returns). Best of 3 chains after one warm-up chain. */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void chain(int64_t n, int nops, double *submit_s, double *total_s)
{
    const int64_t shape[1] = {n};
    em_tensor *acc = em_zeros(shape, 1, EM_F32);
    em_tensor *one = em_ones(shape, 1, EM_F32);
    if (!acc || !one || em_sync() != EM_OK) {
        fprintf(stderr, "setup: %s\n", em_last_error());
        exit(1);
    }
    double t0 = now();
    for (int i = 0; i < nops; i++) {
        em_scope_begin();
        em_tensor *next = em_keep(em_add(acc, one));
        em_scope_end();
        if (!next) {
            fprintf(stderr, "em_add: %s\n", em_last_error());
            exit(1);
        }
        em_tensor_release(acc);
        acc = next;
    }
    double t1 = now();
    em_sync();
    double t2 = now();
    if (n == 1) {
        double v = 0;
        if (em_item(acc, &v) != EM_OK) fprintf(stderr, "em_item: %s\n", em_last_error());
        else if (v != (double)nops) fprintf(stderr, "wrong result %g\n", v);
    }
    em_tensor_release(acc);
    em_tensor_release(one);
    *submit_s = t1 - t0;
    *total_s = t2 - t0;
}

static double plain(int64_t n, int nops)
{
    float *acc = calloc((size_t)n, sizeof(float)), *one = malloc(sizeof(float) * (size_t)n);
    for (int64_t j = 0; j < n; j++) one[j] = 1;
    double t0 = now();
    for (int i = 0; i < nops; i++) {
        for (int64_t j = 0; j < n; j++) acc[j] += one[j];
        __asm__ __volatile__("" ::"r"(acc) : "memory"); /* keep every step */
    }
    double t = now() - t0;
    if (acc[0] != (float)nops) fprintf(stderr, "plain: wrong result\n");
    free(acc), free(one);
    return t;
}

int main(int argc, char **argv)
{
    int nops = argc > 1 ? atoi(argv[1]) : 10000;
    em_config cfg = em_config_default();
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    printf("bench_overhead: chain of %d em_add (scoped) + em_sync, %d CPU workers, best of 3\n", nops,
           em_worker_count(EM_DEVICE_CPU));
    printf("%6s %16s %16s %14s %10s\n", "numel", "submit_us/op", "total_us/op", "plain_us/op", "ratio");
    const int64_t sizes[2] = {1, 16};
    for (int s = 0; s < 2; s++) {
        double bs = 1e30, bt = 1e30, bp = 1e30;
        for (int r = 0; r < 4; r++) {
            double ts, tt;
            chain(sizes[s], nops, &ts, &tt);
            double tp = plain(sizes[s], nops);
            if (r == 0) continue;
            if (ts < bs) bs = ts;
            if (tt < bt) bt = tt;
            if (tp < bp) bp = tp;
        }
        printf("%6lld %16.2f %16.2f %14.4f %10.0f\n", (long long)sizes[s], bs / nops * 1e6, bt / nops * 1e6,
               bp / nops * 1e6, bt / bp);
    }
    em_stats st = em_get_stats();
    printf("live tensors after the chains: %lld\n", (long long)st.live_tensors);
    em_shutdown();
    return 0;
}
