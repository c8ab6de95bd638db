/* Benchmark: the CPU conv family (devices/cpu/conv.c) with its two f32 paths,
 * im2col + OpenBLAS and oneDNN (devices/cpu/conv_dnnl.c), side by side, and
 * PyTorch on the same shapes with as many threads as Ember has CPU workers
 * (bench/conv_torch.py through /usr/bin/python3, when it runs).
 *
 *   bench_conv_cpu            (EMBER_NCPU=1 by default: one worker, one core)
 *
 * Per shape: forward (one CONV2D task) and forward + backward (CONV2D,
 * CONV2D_BWD_DATA, CONV2D_BWD_WEIGHT: what conv2d's backward runs when x and w
 * both need their gradient; PyTorch: conv2d(x, w).backward(dy)), ms per call
 * from the submission to the end of em_sync, best of RUNS after WARMUP. The
 * oneDNN memory-format mode is EMBER_DNNL_FORMAT's (auto by default, any,
 * plain; devices/cpu/conv_dnnl.c). Links
 * the library's objects (the internal ops and the path switch). */
#include "bench/bench_util.h"
#include "devices/cpu/conv_dnnl.h"
#include "ember/ember.h"
#include "tasks/tasks_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 7
#define WARMUP 2

typedef struct shape {
    const char *name;
    int64_t x[4], w[4], stride, pad, groups;
} shape;

/* the same list as bench/conv_torch.py */
static const shape SHAPES[] = {
    {"conv1", {64, 1, 28, 28}, {32, 1, 3, 3}, 1, 0, 1},
    {"conv2", {64, 32, 26, 26}, {64, 32, 3, 3}, 1, 0, 1},
    {"c64x64", {32, 64, 32, 32}, {64, 64, 3, 3}, 1, 1, 1},
    {"dw64", {32, 64, 32, 32}, {64, 1, 3, 3}, 1, 1, 64},
    {"s2_64x128", {32, 64, 32, 32}, {128, 64, 3, 3}, 2, 1, 1},
    {"pw1x1", {32, 64, 32, 32}, {128, 64, 1, 1}, 1, 0, 1},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static void check(bool ok, const char *what)
{
    if (!ok || em_sync() != EM_OK) {
        fprintf(stderr, "%s failed: %s\n", what, em_last_error());
        exit(1);
    }
}

/* ms per call of forward (fb = 0) or forward + backward (fb = 1) */
static double bench(const shape *s, int fb)
{
    union em_op_params p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < 2; i++) p.conv.stride[i] = (int32_t)s->stride, p.conv.pad[i] = (int32_t)s->pad, p.conv.dilation[i] = 1;
    p.conv.groups = (int32_t)s->groups;
    const int64_t oh = (s->x[2] + 2 * s->pad - s->w[2]) / s->stride + 1, ow = (s->x[3] + 2 * s->pad - s->w[3]) / s->stride + 1;
    const int64_t ys[4] = {s->x[0], s->w[0], oh, ow};
    em_tensor *x = em_rand_uniform(s->x, 4, EM_F32, -1, 1), *w = em_rand_uniform(s->w, 4, EM_F32, -1, 1);
    em_tensor *dy = em_rand_uniform(ys, 4, EM_F32, -1, 1);
    check(x && w && dy, "setup");
    double best = 1e30;
    for (int r = 0; r < WARMUP + RUNS; r++) {
        const double t0 = now();
        em_tensor *y = em__conv2d_raw(x, w, &p, ys), *dx = NULL, *dw = NULL;
        if (fb) {
            dx = em__conv2d_bwd_data(dy, w, &p, s->x);
            dw = em__conv2d_bwd_weight(x, dy, &p, s->w);
        }
        check(y && (!fb || (dx && dw)), s->name);
        const double t = now() - t0;
        em_tensor_release(y), em_tensor_release(dx), em_tensor_release(dw);
        if (r >= WARMUP && t < best) best = t;
    }
    em_tensor_release(x), em_tensor_release(w), em_tensor_release(dy);
    return best * 1e3;
}

int main(void)
{
    /* PyTorch first, before StarPU's workers exist (idle workers poll) */
    setenv("EMBER_NCPU", "1", 0);
    const int nw = atoi(getenv("EMBER_NCPU")) > 0 ? atoi(getenv("EMBER_NCPU")) : 1;
    char cmd[1024];
    double tf[NSHAPES], tb[NSHAPES];
    int have_torch = 0;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/conv_torch.py %d 2>/dev/null", EMBER_BENCH_DIR, nw);
    FILE *f = popen(cmd, "r");
    if (f) {
        char name[64];
        double a, b;
        while (fscanf(f, "%63s %lf %lf", name, &a, &b) == 3)
            for (int i = 0; i < NSHAPES; i++)
                if (!strcmp(name, SHAPES[i].name)) tf[i] = a, tb[i] = b, have_torch++;
        pclose(f);
    }
    check(em_init(NULL) == EM_OK, "em_init");
    if (em_worker_count(EM_DEVICE_CPU) != nw) {
        fprintf(stderr, "expected %d CPU workers, got %d\n", nw, em_worker_count(EM_DEVICE_CPU));
        return 1;
    }
    const char *fmt = getenv("EMBER_DNNL_FORMAT");
    printf("CPU conv, f32, %d CPU worker(s), ms per call (best of %d); oneDNN formats: %s; torch %d thread(s)%s\n", nw, RUNS,
           fmt ? fmt : "auto", nw, have_torch == NSHAPES ? "" : " (torch did not run)");
    printf("%-10s %-32s | %9s %9s %9s | %9s %9s %9s\n", "shape", "x * w (stride, pad, groups)", "im2col", "onednn", "torch",
           "im2col", "onednn", "torch");
    printf("%-10s %-32s | %29s | %29s\n", "", "", "forward", "forward + backward");
    for (int i = 0; i < NSHAPES; i++) {
        const shape *s = &SHAPES[i];
        double r[2][2];
        for (int path = 0; path < 2; path++) {
            em__cpu_conv_set_path(path ? EM_CPU_CONV_ONEDNN : EM_CPU_CONV_IM2COL);
            r[path][0] = bench(s, 0);
            r[path][1] = bench(s, 1);
        }
        char geo[64];
        snprintf(geo, sizeof geo, "[%lld,%lld,%lld,%lld]*[%lld,%lld,%lld,%lld] (%lld,%lld,%lld)", (long long)s->x[0],
                 (long long)s->x[1], (long long)s->x[2], (long long)s->x[3], (long long)s->w[0], (long long)s->w[1],
                 (long long)s->w[2], (long long)s->w[3], (long long)s->stride, (long long)s->pad, (long long)s->groups);
        printf("%-10s %-32s | %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f\n", s->name, geo, r[0][0], r[1][0],
               have_torch == NSHAPES ? tf[i] : 0.0, r[0][1], r[1][1], have_torch == NSHAPES ? tb[i] : 0.0);
        fflush(stdout);
    }
    em__cpu_conv_set_path(-1);
    em_shutdown();
    return 0;
}
