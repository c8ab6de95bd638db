/* Benchmark: element-wise fusion (issue #17), eager (em_set_fusion(false))
 * against fused (em_set_fusion(true)) in the same run, on one device.
 *
 *   1. A chain of N element-wise ops (N = 1, 4, 8, 16, 32) on an f32 tensor
 *      [rows, cols] (default [256, 1024]), written as user code does it:
 *      x = op(x), the previous x released. The ops cycle through mul_scalar,
 *      add of a broadcast bias row [1, cols], gelu, sub_scalar, tanh,
 *      mul_scalar, sigmoid, add_scalar. One timing is the mean of K chains
 *      from the same input, each followed by em_sync (its result still
 *      referenced, so it is computed and written; chains are not batched
 *      together); R rounds
 *      alternate the two sides (eager first in even rounds, fused first in
 *      odd ones). Printed per side: the median and the range (min..max) of
 *      the R rounds in us per chain, us per op (the chain's median / N), the
 *      ratio eager / fused, and what em_get_stats counted per chain: tasks
 *      submitted, FUSED tasks, ops that ran inside FUSED tasks.
 *   2. The MLP 784-256-10 training step (Linear + ReLU + Linear, cross-
 *      entropy, Adam: bench_util.h's bench_mlp_new / bench_mlp_step, as
 *      bench_cuda) at batch B (default 64), eager vs fused the same way: R
 *      rounds of S steps, us per step median and range, tasks per step.
 *      Each side has its own model (same seed), so the two train the same
 *      numbers. Then the step captured (em_capture_begin / em_capture_end,
 *      fusion on) and replayed (em_step_replay): R rounds of S replays after
 *      the eager / fused rounds (not alternated with them), tasks per replay.
 *
 * Usage: bench_fusion [--device cpu|cuda:0|opencl:0] [--shape ROWS COLS]
 *                     [--rounds R] [--reps K] [--batch B] [--steps S]
 *                     [--chain-only] [--mlp-only]
 * Defaults: cpu, 256 1024, R 5, K 20, B 64, S 50. */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUNDS 64

/* The chain's ops, cycled through in this order. */
static em_tensor *op_mul_a(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_mul_scalar(x, 0.9); }
static em_tensor *op_add_bias(const em_tensor *x, const em_tensor *bias) { return em_add(x, bias); }
static em_tensor *op_gelu(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_gelu(x); }
static em_tensor *op_sub(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_sub_scalar(x, 0.1); }
static em_tensor *op_tanh(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_tanh(x); }
static em_tensor *op_mul_b(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_mul_scalar(x, 1.5); }
static em_tensor *op_sigmoid(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_sigmoid(x); }
static em_tensor *op_add_s(const em_tensor *x, const em_tensor *bias) { (void)bias; return em_add_scalar(x, -0.25); }

static em_tensor *(*const g_ops[])(const em_tensor *, const em_tensor *) = {
    op_mul_a, op_add_bias, op_gelu, op_sub, op_tanh, op_mul_b, op_sigmoid, op_add_s,
};
#define N_OPS ((int)(sizeof g_ops / sizeof g_ops[0]))

typedef struct counts {
    double tasks, fused_tasks, ops_fused; /* per chain or per step */
} counts;

static counts count_since(const em_stats *a, const em_stats *b, int per)
{
    return (counts){(double)(b->tasks_submitted - a->tasks_submitted) / per, (double)(b->fused_tasks - a->fused_tasks) / per,
                    (double)(b->ops_fused - a->ops_fused) / per};
}

/* Seconds per chain of @p n ops: the mean of @p reps chains from x0, each
 * one followed by em_sync (so chains are not batched together: each is the
 * user's x = op(x) loop, then a wait for its result); *cnt: the stats per
 * chain. */
static double time_chain(const em_tensor *x0, const em_tensor *bias, int n, int reps, counts *cnt)
{
    CK(em_sync() == EM_OK);
    const em_stats s0 = em_get_stats();
    const double t0 = now();
    for (int r = 0; r < reps; r++) {
        em_tensor *x = NULL;
        for (int i = 0; i < n; i++) {
            em_tensor *y = g_ops[i % N_OPS](x ? x : x0, bias);
            CK(y);
            if (x) em_tensor_release(x);
            x = y;
        }
        CK(em_sync() == EM_OK); /* x is still referenced: its values are written */
        em_tensor_release(x);
    }
    const double t = now() - t0;
    const em_stats s1 = em_get_stats();
    *cnt = count_since(&s0, &s1, reps);
    return t / reps;
}

static void chains(int64_t rows, int64_t cols, int rounds, int reps)
{
    static const int lengths[] = {1, 4, 8, 16, 32};
    em_manual_seed(1);
    em_tensor *x0 = em_rand_normal((int64_t[]){rows, cols}, 2, EM_F32, 0, 1);
    em_tensor *bias = em_rand_normal((int64_t[]){1, cols}, 2, EM_F32, 0, 1);
    CK(x0 && bias && em_sync() == EM_OK);
    printf("chain of N element-wise ops on f32 [%lld, %lld] (x = op(x), the old x released; em_sync after each chain), "
           "%d rounds of %d chains, sides alternating\n",
           (long long)rows, (long long)cols, rounds, reps);
    printf("%4s %-6s %12s %22s %10s %8s %9s %12s %11s\n", "N", "side", "us/chain", "range (min..max)", "us/op", "ratio",
           "tasks/ch", "fused_tasks", "ops_fused");
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int n = lengths[li];
        double t[2][MAX_ROUNDS];
        counts c[2] = {{0}};
        /* warm-up of both sides (kernels built, buffers allocated) */
        for (int side = 0; side < 2; side++) {
            em_set_fusion(side == 1);
            time_chain(x0, bias, n, reps, &c[side]);
        }
        for (int r = 0; r < rounds; r++)
            for (int j = 0; j < 2; j++) {
                const int side = (r % 2) ? 1 - j : j;
                em_set_fusion(side == 1);
                t[side][r] = time_chain(x0, bias, n, reps, &c[side]);
            }
        double med[2], lo[2], hi[2];
        for (int side = 0; side < 2; side++) med[side] = bench_median(t[side], rounds, &lo[side], &hi[side]);
        for (int side = 0; side < 2; side++)
            printf("%4d %-6s %12.1f %10.1f..%-10.1f %10.2f %8s %9.1f %12.1f %11.1f\n", n, side ? "fused" : "eager",
                   med[side] * 1e6, lo[side] * 1e6, hi[side] * 1e6, med[side] * 1e6 / n, "", c[side].tasks, c[side].fused_tasks,
                   c[side].ops_fused);
        printf("%4d %-6s %12s %22s %10s %8.2f\n", n, "ratio", "", "", "", med[0] / med[1]);
    }
    em_tensor_release(x0);
    em_tensor_release(bias);
}

/* Seconds per step over @p steps steps; *cnt: the stats per step. */
static double time_steps(em_module *m, em_optim *opt, const em_tensor *x, const em_tensor *y, int steps, counts *cnt)
{
    CK(em_sync() == EM_OK);
    const em_stats s0 = em_get_stats();
    const double t0 = now();
    for (int s = 0; s < steps; s++) bench_mlp_step(m, opt, x, y, -1);
    CK(em_sync() == EM_OK);
    const double t = now() - t0;
    const em_stats s1 = em_get_stats();
    *cnt = count_since(&s0, &s1, steps);
    return t / steps;
}

/* The same step captured (em_capture_begin / em_capture_end, fusion on)
 * after 10 warm-up steps of its own model (same seed; the optimizer's state
 * exists before the capture), then replayed: R rounds of S replays (the same
 * batch: the captured inputs are x and y), us per step median and range,
 * tasks per replay. Refused captures are printed with their reason. */
static void captured_rows(int64_t batch, int rounds, int steps, const em_tensor *x, const em_tensor *y, double eager_med,
                          double fused_med)
{
    (void)batch;
    if (!em_capture_enabled()) {
        printf("captured: off (EMBER_CAPTURE=0)\n");
        return;
    }
    em_module *m;
    em_optim *opt;
    bench_mlp_new(784, 256, 10, &m, &opt);
    const bool was = em_set_fusion(true);
    counts c;
    time_steps(m, opt, x, y, 10, &c);
    CK(em_capture_begin() == EM_OK);
    bench_mlp_step(m, opt, x, y, -1);
    em_step *st = em_capture_end();
    if (!st) {
        printf("captured: refused: %s\n", em_last_error());
    } else {
        double t[MAX_ROUNDS];
        for (int i = 0; i < 10; i++) CK(em_step_replay(st) == EM_OK); /* warm-up (CUDA graphs built) */
        for (int r = 0; r < rounds; r++) {
            CK(em_sync() == EM_OK);
            const em_stats s0 = em_get_stats();
            const double t0 = now();
            for (int i = 0; i < steps; i++) CK(em_step_replay(st) == EM_OK);
            CK(em_sync() == EM_OK);
            t[r] = (now() - t0) / steps;
            const em_stats s1 = em_get_stats();
            c = count_since(&s0, &s1, steps);
        }
        double lo, hi;
        const double med = bench_median(t, rounds, &lo, &hi);
        printf("%-6s %12.1f %10.1f..%-10.1f %10.1f   (%lld tasks recorded, replayed as one)\n", "capt.", med * 1e6, lo * 1e6,
               hi * 1e6, c.tasks, (long long)em_step_task_count(st));
        printf("ratio eager / captured: %.2f, fused / captured: %.2f (captured rounds run after the eager and fused ones, "
               "not alternated with them)\n",
               eager_med / med, fused_med / med);
        em_step_free(st);
    }
    em_set_fusion(was);
    em_optim_free(opt);
    em_module_free(m);
}

static void mlp_rows(int64_t batch, int rounds, int steps)
{
    em_module *m[2];
    em_optim *opt[2];
    for (int side = 0; side < 2; side++) bench_mlp_new(784, 256, 10, &m[side], &opt[side]);
    em_tensor *x = em_rand_normal((int64_t[]){batch, 784}, 2, EM_F32, 0, 1);
    em_tensor *yf = em_rand_uniform((int64_t[]){batch}, 1, EM_F32, 0, 10);
    em_tensor *fl = yf ? em_floor(yf) : NULL;
    em_tensor *y = fl ? em_cast(fl, EM_I64) : NULL;
    CK(x && y);
    double t[2][MAX_ROUNDS];
    counts c[2] = {{0}};
    for (int side = 0; side < 2; side++) { /* warm-up: 10 steps each */
        em_set_fusion(side == 1);
        time_steps(m[side], opt[side], x, y, 10, &c[side]);
    }
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 2; j++) {
            const int side = (r % 2) ? 1 - j : j;
            em_set_fusion(side == 1);
            t[side][r] = time_steps(m[side], opt[side], x, y, steps, &c[side]);
        }
    printf("MLP 784-256-10 training step (Linear+ReLU+Linear, cross-entropy, Adam), batch %lld, %d rounds of %d steps\n",
           (long long)batch, rounds, steps);
    printf("%-6s %12s %22s %10s %12s %11s\n", "side", "us/step", "range (min..max)", "tasks/st", "fused_tasks", "ops_fused");
    double med[2], lo[2], hi[2];
    for (int side = 0; side < 2; side++) {
        med[side] = bench_median(t[side], rounds, &lo[side], &hi[side]);
        printf("%-6s %12.1f %10.1f..%-10.1f %10.1f %12.1f %11.1f\n", side ? "fused" : "eager", med[side] * 1e6, lo[side] * 1e6,
               hi[side] * 1e6, c[side].tasks, c[side].fused_tasks, c[side].ops_fused);
    }
    printf("ratio eager / fused: %.2f\n", med[0] / med[1]);
    captured_rows(batch, rounds, steps, x, y, med[0], med[1]);
    em_tensor_release(x);
    em_tensor_release(yf);
    em_tensor_release(fl);
    em_tensor_release(y);
    for (int side = 0; side < 2; side++) {
        em_optim_free(opt[side]);
        em_module_free(m[side]);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_fusion [--device cpu|cuda:0|opencl:0] [--shape ROWS COLS] [--rounds R] [--reps K] "
                    "[--batch B] [--steps S] [--chain-only] [--mlp-only]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    int64_t rows = 256, cols = 1024, batch = 64;
    int rounds = 5, reps = 20, steps = 50;
    bool do_chain = true, do_mlp = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 2 < argc) {
            rows = atoll(argv[++i]);
            cols = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chain-only"))
            do_mlp = false;
        else if (!strcmp(argv[i], "--mlp-only"))
            do_chain = false;
        else
            usage();
    }
    if (rows < 1 || cols < 1 || batch < 1 || rounds < 1 || rounds > MAX_ROUNDS || reps < 1 || steps < 1) usage();
    em_config cfg = em_config_default();
    cfg.device = device;
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_fusion: em_init: %s\n", em_last_error());
        return 1;
    }
    const bool fusion_default = em_fusion_enabled();
    printf("bench_fusion: device %s, %d CPU workers, fusion by default %s\n", device, em_worker_count(EM_DEVICE_CPU),
           fusion_default ? "on" : "off (EMBER_FUSION=0)");
    if (do_chain) chains(rows, cols, rounds, reps);
    if (do_mlp) mlp_rows(batch, rounds, steps);
    em_set_fusion(fusion_default);
    em_shutdown();
    return 0;
}
