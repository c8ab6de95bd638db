/* The CPU conv family's two f32 paths agree: oneDNN (devices/cpu/conv_dnnl.c)
 * against im2col + OpenBLAS (devices/cpu/conv.c) on forward (CONV2D),
 * backward data (CONV2D_BWD_DATA, also conv_transpose2d's forward) and
 * backward weight (CONV2D_BWD_WEIGHT), over groups, depthwise, dilation,
 * stride, padding, 1x1, one input channel, and output sizes the kernels take
 * from the descriptors (conv_transpose2d's output_padding; an output smaller
 * than PyTorch's, which oneDNN has no primitive for: im2col runs). Relative
 * tolerance 1e-4 of the largest |value|. Also: a oneDNN conv adds no thread
 * to the process (one OpenMP thread per worker). Skipped without oneDNN.
 * f64 stays on im2col and is checked against PyTorch by test_grad_pytorch. */
#include "devices/cpu/conv_dnnl.h"
#include "tasks/tasks_internal.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ccase {
    const char *name;
    int64_t x[4], w[4]; /* x [N, C, H, W], w [O, C/g, KH, KW] */
    int stride[2], pad[2], dil[2], groups;
    int64_t oh_less;    /* output this many rows/cols smaller than PyTorch's */
} ccase;

static const ccase CASES[] = {
    {"plain 3x3", {2, 3, 9, 8}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, 0},
    {"pad", {2, 5, 7, 9}, {6, 5, 3, 3}, {1, 1}, {1, 2}, {1, 1}, 1, 0},
    {"stride 2", {3, 4, 11, 10}, {8, 4, 3, 3}, {2, 2}, {1, 0}, {1, 1}, 1, 0},
    {"stride 2x3 no pad", {2, 16, 13, 14}, {16, 16, 3, 2}, {2, 3}, {0, 0}, {1, 1}, 1, 0},
    {"dilation", {2, 6, 12, 12}, {5, 6, 3, 3}, {1, 1}, {2, 1}, {2, 3}, 1, 0},
    {"groups 2", {2, 8, 10, 9}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2, 0},
    {"groups 4 stride dil", {2, 16, 15, 15}, {32, 4, 3, 3}, {2, 1}, {2, 2}, {2, 1}, 4, 0},
    {"depthwise", {2, 32, 12, 12}, {32, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 32, 0},
    {"depthwise x2 stride", {2, 16, 12, 12}, {32, 1, 5, 5}, {2, 2}, {2, 2}, {1, 1}, 16, 0},
    {"1x1", {2, 32, 7, 7}, {48, 32, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, 0},
    {"1x1 stride 2", {2, 16, 9, 9}, {24, 16, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1, 0},
    {"one input channel", {4, 1, 14, 14}, {32, 1, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, 0},
    {"wide 32->64", {2, 32, 10, 10}, {64, 32, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, 0},
    {"5x5 asymmetric kernel", {2, 8, 11, 13}, {8, 8, 5, 2}, {1, 2}, {2, 1}, {1, 1}, 1, 0},
    {"output smaller (im2col fallback)", {2, 4, 10, 10}, {4, 4, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1, 2},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static bool have_dnnl(void)
{
    em__cpu_conv_set_path(EM_CPU_CONV_ONEDNN);
    const bool ok = em__cpu_conv_path() == EM_CPU_CONV_ONEDNN;
    em__cpu_conv_set_path(-1);
    return ok;
}

static void params(const ccase *c, union em_op_params *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 2; i++) p->conv.stride[i] = c->stride[i], p->conv.pad[i] = c->pad[i], p->conv.dilation[i] = c->dil[i];
    p->conv.groups = c->groups;
}

static void out_shape(const ccase *c, int64_t *y)
{
    y[0] = c->x[0], y[1] = c->w[0];
    for (int i = 0; i < 2; i++)
        y[2 + i] = (c->x[2 + i] + 2 * c->pad[i] - c->dil[i] * (c->w[2 + i] - 1) - 1) / c->stride[i] + 1 - c->oh_less;
}

/* out = kind(a, b) on @p path, read to the host */
static double *run(int path, int kind, const ccase *c, em_tensor *a, em_tensor *b)
{
    union em_op_params p;
    params(c, &p);
    int64_t ys[4];
    out_shape(c, ys);
    em__cpu_conv_set_path(path);
    em_tensor *r = kind == EM_OP_CONV2D ? em__conv2d_raw(a, b, &p, ys)
                   : kind == EM_OP_CONV2D_BWD_DATA ? em__conv2d_bwd_data(a, b, &p, c->x)
                                                   : em__conv2d_bwd_weight(a, b, &p, c->w);
    assert_non_null(r);
    double *v = em_test_values(r);
    em_tensor_release(r);
    em__cpu_conv_set_path(-1);
    return v;
}

static void compare(const char *what, const ccase *c, const double *ref, const double *got, int64_t n)
{
    double scale = 1e-30, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(ref[i] - got[i]));
    if (!(worst <= 1e-4 * scale)) fail_msg("%s, %s: max |onednn - im2col| = %g, largest |im2col| %g", c->name, what, worst, scale);
}

static int64_t numel(const int64_t *s) { return s[0] * s[1] * s[2] * s[3]; }

static void test_paths_agree(void **state)
{
    (void)state;
    if (!have_dnnl()) skip();
    for (int i = 0; i < NCASES; i++) {
        const ccase *c = &CASES[i];
        int64_t ys[4];
        out_shape(c, ys);
        em_scope_begin();
        em_tensor *x = em_rand_uniform(c->x, 4, EM_F32, -1, 1), *w = em_rand_uniform(c->w, 4, EM_F32, -1, 1);
        em_tensor *dy = em_rand_uniform(ys, 4, EM_F32, -1, 1);
        assert_non_null(x), assert_non_null(w), assert_non_null(dy);
        static const int kinds[3] = {EM_OP_CONV2D, EM_OP_CONV2D_BWD_DATA, EM_OP_CONV2D_BWD_WEIGHT};
        static const char *names[3] = {"forward", "backward data", "backward weight"};
        for (int kk = 0; kk < 3; kk++) {
            em_tensor *a = kk == 1 ? dy : x, *b = kk == 2 ? dy : w;
            const int64_t n = kk == 0 ? numel(ys) : kk == 1 ? numel(c->x) : numel(c->w);
            double *ref = run(EM_CPU_CONV_IM2COL, kinds[kk], c, a, b);
            double *got = run(EM_CPU_CONV_ONEDNN, kinds[kk], c, a, b);
            compare(names[kk], c, ref, got, n);
            double *again = run(EM_CPU_CONV_ONEDNN, kinds[kk], c, a, b); /* the cached primitive */
            compare(names[kk], c, got, again, n);
            free(ref), free(got), free(again);
        }
        em_scope_end();
    }
}

/* conv_transpose2d (public API; CONV2D_BWD_DATA with output_padding, bias,
 * groups, dilation) and conv2d's autodiff gradients on both paths. */
static void test_public_ops_agree(void **state)
{
    (void)state;
    if (!have_dnnl()) skip();
    em_scope_begin();
    const int64_t xs[4] = {2, 6, 7, 8}, ws[4] = {6, 4, 3, 3}, bs[1] = {8};
    em_tensor *x = em_rand_uniform(xs, 4, EM_F32, -1, 1), *w = em_rand_uniform(ws, 4, EM_F32, -1, 1);
    em_tensor *b = em_rand_uniform(bs, 1, EM_F32, -1, 1);
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = 2, o.stride[1] = 3, o.padding[0] = 1, o.padding[1] = 2, o.output_padding[0] = 1, o.output_padding[1] = 2;
    o.dilation[1] = 2, o.groups = 2;
    double *v[2];
    int64_t n = 0;
    for (int path = 0; path < 2; path++) {
        em__cpu_conv_set_path(path);
        em_tensor *y = em_conv_transpose2d(x, w, b, &o);
        assert_non_null(y);
        n = em_tensor_numel(y);
        v[path] = em_test_values(y);
    }
    static const ccase c = {"conv_transpose2d output_padding", {0}, {0}, {0}, {0}, {0}, 0, 0};
    compare("forward", &c, v[0], v[1], n);
    free(v[0]), free(v[1]);

    /* conv2d forward + backward through autodiff */
    const int64_t xs2[4] = {3, 4, 9, 9}, ws2[4] = {8, 2, 3, 3};
    em_tensor *x2 = em_rand_uniform(xs2, 4, EM_F32, -1, 1), *w2 = em_rand_uniform(ws2, 4, EM_F32, -1, 1);
    assert_int_equal(em_set_requires_grad(x2, true), EM_OK);
    assert_int_equal(em_set_requires_grad(w2, true), EM_OK);
    em_conv_opts o2 = em_conv_opts_default();
    o2.stride[0] = 2, o2.padding[0] = o2.padding[1] = 1, o2.groups = 2;
    double *gx[2], *gw[2];
    for (int path = 0; path < 2; path++) {
        em__cpu_conv_set_path(path);
        em_tensor *y2 = em_conv2d(x2, w2, NULL, &o2);
        em_tensor *loss = em_sum(em_mul(y2, y2), NULL, 0, false);
        assert_non_null(loss);
        em_grads *g = em_backward(loss);
        assert_non_null(g);
        gx[path] = em_test_values(em_grad(g, x2));
        gw[path] = em_test_values(em_grad(g, w2));
        em_grads_free(g);
    }
    static const ccase c2 = {"conv2d autodiff (groups, stride, padding)", {0}, {0}, {0}, {0}, {0}, 0, 0};
    compare("input gradient", &c2, gx[0], gx[1], numel(xs2));
    compare("weight gradient", &c2, gw[0], gw[1], numel(ws2));
    free(gx[0]), free(gx[1]), free(gw[0]), free(gw[1]);
    em__cpu_conv_set_path(-1);
    em_scope_end();
}

static int threads_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    fclose(f);
    return n;
}

/* A oneDNN conv runs on its worker thread alone: OpenMP starts no team (the
 * workers set their OpenMP thread count to 1). */
static void test_one_thread_per_worker(void **state)
{
    (void)state;
    if (!have_dnnl()) skip();
    em_scope_begin();
    const int64_t xs[4] = {8, 32, 20, 20}, ws[4] = {32, 32, 3, 3};
    em_tensor *x = em_rand_uniform(xs, 4, EM_F32, -1, 1), *w = em_rand_uniform(ws, 4, EM_F32, -1, 1);
    assert_int_equal(em_sync(), EM_OK);
    const int before = threads_now();
    assert_true(before > 0);
    em__cpu_conv_set_path(EM_CPU_CONV_ONEDNN);
    em_conv_opts o = em_conv_opts_default();
    o.padding[0] = o.padding[1] = 1;
    for (int i = 0; i < 8; i++) assert_non_null(em_conv2d(x, w, NULL, &o)); /* spread over the workers */
    assert_int_equal(em_sync(), EM_OK);
    em__cpu_conv_set_path(-1);
    const int after = threads_now();
    if (after != before) fail_msg("threads: %d before the oneDNN convs, %d after", before, after);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread_per_worker),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_public_ops_agree),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
