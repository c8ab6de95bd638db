/* Benchmark: f32 matrix product through Ember (em_matmul + em_sync, tiled over
 * the CPU workers) against cblas_sgemm called directly with as many OpenBLAS
 * threads as Ember has CPU workers.
 *
 *   bench_matmul [n ...]        (default: 1024 2048)
 *
 * For each n: C[n, n] = A[n, n] B[n, n], uniform(-1, 1) inputs. Each side does
 * 2 warm-up runs then reports the best of RUNS timed runs (wall clock; for
 * Ember the time from the em_matmul call to the end of em_sync). GFLOP/s =
 * 2 n^3 / time. The bf16 columns: the same product with bf16 inputs and
 * output through Ember (the CPU kernel converts to f32 for sgemm and rounds
 * once: its cost over f32 is the conversions). Results go to stdout;
 * docs/benchmarks.md records them. */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

extern void openblas_set_num_threads(int);

#define RUNS 7
#define WARMUP 2

static double bench_ember(int64_t n, em_dtype dt)
{
    const int64_t shape[2] = {n, n};
    em_tensor *a = em_rand_uniform(shape, 2, dt, -1, 1);
    em_tensor *b = em_rand_uniform(shape, 2, dt, -1, 1);
    if (!a || !b || em_sync() != EM_OK) {
        fprintf(stderr, "setup failed: %s\n", em_last_error());
        exit(1);
    }
    double best = 1e30;
    for (int r = 0; r < WARMUP + RUNS; r++) {
        double t0 = now();
        em_tensor *c = em_matmul(a, b);
        if (!c || em_sync() != EM_OK) {
            fprintf(stderr, "em_matmul failed: %s\n", em_last_error());
            exit(1);
        }
        double t = now() - t0;
        em_tensor_release(c);
        if (r >= WARMUP && t < best) best = t;
    }
    em_tensor_release(a);
    em_tensor_release(b);
    return best;
}

static double bench_blas(int64_t n, int nthreads)
{
    float *a = malloc(sizeof(float) * (size_t)(n * n));
    float *b = malloc(sizeof(float) * (size_t)(n * n));
    float *c = malloc(sizeof(float) * (size_t)(n * n));
    if (!a || !b || !c) exit(1);
    srand(1);
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)rand() / (float)RAND_MAX * 2 - 1;
        b[i] = (float)rand() / (float)RAND_MAX * 2 - 1;
    }
    openblas_set_num_threads(nthreads);
    double best = 1e30;
    for (int r = 0; r < WARMUP + RUNS; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n, b, (int)n, 0.0f,
                    c, (int)n);
        double t = now() - t0;
        if (r >= WARMUP && t < best) best = t;
    }
    openblas_set_num_threads(1); /* Ember's workers run OpenBLAS single-threaded */
    free(a), free(b), free(c);
    usleep(200000); /* let OpenBLAS's server threads stop spinning */
    return best;
}

static int start(void)
{
    em_config cfg = em_config_default();
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        exit(1);
    }
    return em_worker_count(EM_DEVICE_CPU);
}

int main(int argc, char **argv)
{
    int64_t sizes[16] = {1024, 2048};
    int ns = 2;
    if (argc > 1) {
        ns = 0;
        for (int i = 1; i < argc && ns < 16; i++) sizes[ns++] = atoll(argv[i]);
    }
    /* Idle StarPU CPU workers poll (measured: 2 cores busy while idle), so
     * direct OpenBLAS runs while the runtime is down: start once to learn the
     * worker count, stop, time OpenBLAS, start again for Ember. */
    int nw = start();
    em_shutdown();
    double tb[16];
    for (int i = 0; i < ns; i++) tb[i] = bench_blas(sizes[i], nw);
    start();
    const char *tiles = getenv("EMBER_MATMUL_TILES");
    printf("bench_matmul: f32 C = A B, %d CPU workers, OpenBLAS direct with %d threads, tiles %s, best of %d runs\n", nw,
           nw, tiles ? tiles : "default", RUNS);
    printf("%6s %12s %12s %12s %12s %8s %12s %8s\n", "n", "ember_ms", "ember_GF/s", "blas_ms", "blas_GF/s", "ratio",
           "bf16_GF/s", "bf16/f32");
    for (int i = 0; i < ns; i++) {
        int64_t n = sizes[i];
        double flops = 2.0 * (double)n * (double)n * (double)n;
        double te = bench_ember(n, EM_F32), th = bench_ember(n, EM_BF16);
        printf("%6lld %12.2f %12.1f %12.2f %12.1f %8.3f %12.1f %8.3f\n", (long long)n, te * 1e3, flops / te * 1e-9, tb[i] * 1e3,
               flops / tb[i] * 1e-9, tb[i] / te, flops / th * 1e-9, te / th);
        fflush(stdout);
    }
    em_shutdown();
    return 0;
}
