/* The fused scaled-dot-product attention (SDPA / SDPA_BWD, tasks/attention.c)
 * against the composed math path (em__sdpa_math, nn/transformer.c), on the
 * CPU and on every OpenCL device (PoCL: main() makes an OpenCL worker appear
 * as tests/test_opencl.c does; none found is reported, not failed — CI's
 * test_opencl is the one that requires it).
 *
 * What is checked:
 *   (a) outputs and the gradients of q, k, v of sum(out * W), fused vs math,
 *       f64 (tight) and f32: causal (Tq = Tk, Tq < Tk, Tq > Tk), bool and
 *       additive masks (full and broadcast), odd lengths 1, 7, 33, 130, head
 *       dims 32, 64, 80, 128 and D != Dv, ranks 2, 3, 4 and 5, q / k / v as
 *       strided views of one [B, T, 3, H, D] buffer (GPT-2's layout) and a
 *       transposed (non-unit last stride) operand; f16 / bf16 against the
 *       f32 math path of the same rounded inputs; autocast (bf16 compute,
 *       f32 gradients);
 *   (b) a fully masked row gives NaN as the math path, and finite gradients
 *       (dq of that row exactly 0);
 *   (c) dropout: the keep mask is exactly the contract's (Philox of
 *       devices/philox.h at the reserved counters), the kept fraction is
 *       1 - p within 5 standard deviations, the output mean is unbiased
 *       (within 5 sd), the same generator state gives the same bits, and the
 *       gradient matches central finite differences under a fixed state;
 *   (a') all of (a) again with every op cut into CPU tiles (one task per CPU
 *       worker along B or H: EMBER_SDPA_TILE_MIN_FLOPS=0), and dropout's
 *       keep mask checked under both splits;
 *   (d) the fused op is one task; the public function falls back to the math
 *       path for D > 256 and for a mask that requires grad (whose gradient
 *       then exists); every error of em__sdpa names its problem. */
#include "testutil.h"

#include "devices/philox.h"
#include "ember/ember.h"
#include "nn/nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DEV 4
static em_test_dev g_devs[MAX_DEV];
static int g_ndev;

static uint64_t g_rng = 0x1234567887654321ULL;
static double urand(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* A fresh tensor of uniform values in [lo, hi] (caller-owned in the scope). */
static em_tensor *rnd(em_dtype dt, const int64_t *shape, int nd, double lo, double hi)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * urand();
    const bool half = dt == EM_F16 || dt == EM_BF16;
    em_tensor *t = em_test_make(half ? EM_F32 : dt, v, shape, nd);
    free(v);
    if (half) t = em_detach(em_cast(t, dt));
    assert_non_null(t);
    return t;
}

static em_grads *backward(em_tensor *loss, const char *what)
{
    em_grads *g = loss ? em_backward(loss) : NULL;
    if (!g) fail_msg("%s: backward: %s", what, em_last_error());
    return g;
}

static em_tensor *leaf(em_tensor *t)
{
    if (em_set_requires_grad(t, true) != EM_OK) fail_msg("em_set_requires_grad: %s", em_last_error());
    return t;
}

/* max |a - b| <= rtol * max(max|b|, 0.01) + atol, NaN where b is NaN (and
 * only there). The floor: a gradient that is 0 in exact arithmetic (q's with
 * one key, T = 1) is rounding noise on a device whose kernel sums in another
 * order (CUDA f64: 7.7e-17); the inputs are O(1), so 0.01 is far below any
 * real value. */
static double compare(const em_tensor *a, const em_tensor *b, double rtol, double atol, const char *what)
{
    if (!a || !b) fail_msg("%s: %s is NULL (%s)", what, !a ? "the fused result" : "the math result", em_last_error());
    const int64_t n = em_tensor_numel(b);
    assert_int_equal(em_tensor_numel(a), n);
    em_scope_begin(); /* em_test_values reads f32 / f64: 16-bit results are widened first (exactly) */
    double *va = em_test_values(em_cast(a, EM_F64)), *vb = em_test_values(em_cast(b, EM_F64));
    em_scope_end();
    double amax = 0, emax = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(vb[i])) amax = fmax(amax, fabs(vb[i]));
    for (int64_t i = 0; i < n; i++) {
        if (isnan(vb[i]) || isnan(va[i])) {
            if (isnan(vb[i]) != isnan(va[i])) fail_msg("%s[%lld]: %g, math path %g", what, (long long)i, va[i], vb[i]);
            continue;
        }
        const double e = fabs(va[i] - vb[i]);
        emax = fmax(emax, e);
        if (!(e <= rtol * fmax(amax, 0.01) + atol)) fail_msg("%s[%lld]: fused %.10g, math path %.10g (max |math| %.3g)", what, (long long)i, va[i], vb[i], amax);
    }
    free(va);
    free(vb);
    return amax > 0 ? emax / amax : emax;
}

/* ---- (a) fused vs math ------------------------------------------------------- */

enum { M_NONE, M_BOOL, M_ADD, M_BOOL_BCAST, M_ADD_BCAST, M_ADD_HEAD };

typedef struct cfg {
    const char *name;
    int nd;            /* 2..5 */
    int64_t lead[3];   /* leading dims (nd - 2 of them) */
    int64_t tq, tk, d, dv;
    int mask;
    bool causal;
    double scale; /* 0: 1 / sqrt(D) */
} cfg;

static const cfg g_cfgs[] = {
    {"causal T7 D32", 4, {2, 3}, 7, 7, 32, 32, M_NONE, true, 0},
    {"causal T1 D64", 4, {1, 2}, 1, 1, 64, 64, M_NONE, true, 0},
    {"plain T33 D80", 4, {1, 2}, 33, 33, 80, 80, M_NONE, false, 0},
    {"causal T130 D128", 4, {1, 1}, 130, 130, 128, 128, M_NONE, true, 0},
    {"causal Tq3 Tk8 (Tq < Tk)", 4, {2, 1}, 3, 8, 32, 32, M_NONE, true, 0},
    {"causal Tq9 Tk5 (Tq > Tk) D != Dv", 4, {1, 2}, 9, 5, 64, 16, M_NONE, true, 0},
    {"bool mask Tq5 Tk9 D32 Dv48", 4, {2, 2}, 5, 9, 32, 48, M_BOOL, false, 0},
    {"additive mask Tq7 Tk33", 4, {1, 3}, 7, 33, 32, 32, M_ADD, false, 0.3},
    {"bool mask broadcast [Tq, Tk]", 4, {2, 2}, 33, 7, 32, 32, M_BOOL_BCAST, false, 0},
    {"additive mask broadcast [1, Tk]", 4, {2, 2}, 6, 70, 64, 80, M_ADD_BCAST, false, 0},
    {"additive mask per head [H, 1, Tk]", 4, {2, 3}, 4, 9, 16, 24, M_ADD_HEAD, false, 0},
    {"rank 2 causal", 2, {0}, 7, 7, 32, 32, M_NONE, true, 0},
    {"rank 3 bool mask", 3, {3}, 5, 6, 32, 32, M_BOOL, false, 0},
    {"rank 5 additive mask broadcast", 5, {2, 2, 2}, 5, 7, 32, 32, M_ADD_BCAST, false, 0},
    {"rank 5 causal", 5, {2, 1, 2}, 33, 33, 80, 64, M_NONE, true, 0},
    {"B 1 H 4 (tiles along H)", 4, {1, 4}, 20, 20, 32, 32, M_ADD_HEAD, false, 0},
};

/* A mask of kind @p kind for scores [lead.., Tq, Tk] (never fully masking a row). */
static em_tensor *make_mask(const cfg *c, em_dtype dt)
{
    const int64_t tq = c->tq, tk = c->tk;
    int64_t shape[EM_MAX_DIMS];
    int nd = 0;
    switch (c->mask) {
    case M_NONE: return NULL;
    case M_BOOL:
    case M_ADD:
        for (int i = 0; i < c->nd - 2; i++) shape[nd++] = c->lead[i];
        shape[nd++] = tq;
        shape[nd++] = tk;
        break;
    case M_BOOL_BCAST: shape[nd++] = tq, shape[nd++] = tk; break;
    case M_ADD_BCAST: shape[nd++] = 1, shape[nd++] = tk; break;
    case M_ADD_HEAD: shape[nd++] = c->lead[c->nd - 3], shape[nd++] = 1, shape[nd++] = tk; break;
    default: fail_msg("unknown mask kind %d", c->mask);
    }
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    const int64_t cols = shape[nd - 1];
    double *v = malloc(sizeof(double) * (size_t)n);
    const bool is_bool = c->mask == M_BOOL || c->mask == M_BOOL_BCAST;
    for (int64_t i = 0; i < n; i++) {
        const bool keep = i % cols == (i / cols) % cols || urand() > 0.3; /* one key per row always kept */
        v[i] = is_bool ? keep : keep ? 2 * urand() - 1 : -INFINITY;
    }
    em_tensor *m = em_test_make(is_bool ? EM_BOOL : dt, v, shape, nd);
    free(v);
    assert_non_null(m);
    return m;
}

typedef struct run {
    em_tensor *out, *gq, *gk, *gv;
} run;

static run run_one(bool fused, em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *mask, const cfg *c, em_tensor *w, double scale)
{
    run r;
    r.out = fused ? em__sdpa(q, k, v, mask, c->causal, 0, scale, true) : em__sdpa_math(q, k, v, mask, c->causal, 0, scale, true);
    if (!r.out) fail_msg("%s (%s): %s", c->name, fused ? "fused" : "math", em_last_error());
    em_grads *g = em_backward(em_sum_all(em_mul(r.out, w)));
    if (!g) fail_msg("%s: backward: %s", c->name, em_last_error());
    r.gq = em_grad(g, q), r.gk = em_grad(g, k), r.gv = em_grad(g, v);
    assert_non_null(r.gq);
    assert_non_null(r.gk);
    assert_non_null(r.gv);
    em_tensor_retain(r.gq), em_tensor_retain(r.gk), em_tensor_retain(r.gv);
    em_grads_free(g);
    return r;
}

static void run_free(run *r)
{
    em_tensor_release(r->gq);
    em_tensor_release(r->gk);
    em_tensor_release(r->gv);
}

static double worst[2][2]; /* [f32, f64][out, grad] */

static void check_cfg(const cfg *c, em_dtype dt, int dev)
{
    em_scope_begin();
    int64_t qs[EM_MAX_DIMS], ks[EM_MAX_DIMS], vs[EM_MAX_DIMS], os[EM_MAX_DIMS];
    const int nd = c->nd;
    for (int i = 0; i < nd - 2; i++) qs[i] = ks[i] = vs[i] = os[i] = c->lead[i];
    qs[nd - 2] = os[nd - 2] = c->tq, ks[nd - 2] = vs[nd - 2] = c->tk;
    qs[nd - 1] = ks[nd - 1] = c->d, vs[nd - 1] = os[nd - 1] = c->dv;
    em_tensor *q = leaf(rnd(dt, qs, nd, -1, 1)), *k = leaf(rnd(dt, ks, nd, -1, 1)), *v = leaf(rnd(dt, vs, nd, -1, 1));
    em_tensor *mask = make_mask(c, dt), *w = rnd(dt, os, nd, -1, 1);
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d);
    assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
    run m = run_one(false, q, k, v, mask, c, w, scale);
    assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
    run f = run_one(true, q, k, v, mask, c, w, scale);
    assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
    em_test_assert_shape(f.out, nd, os);
    const bool f64 = dt == EM_F64;
    const double rtol = f64 ? 1e-11 : 2e-5, gtol = f64 ? 1e-10 : 1e-4;
    char what[160];
    snprintf(what, sizeof what, "%s %s on %s: output", c->name, em_dtype_name(dt), g_devs[dev].name);
    worst[f64][0] = fmax(worst[f64][0], compare(f.out, m.out, rtol, 0, what));
    const em_tensor *fg[3] = {f.gq, f.gk, f.gv}, *mg[3] = {m.gq, m.gk, m.gv};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s %s on %s: gradient of %c", c->name, em_dtype_name(dt), g_devs[dev].name, "qkv"[i]);
        worst[f64][1] = fmax(worst[f64][1], compare(fg[i], mg[i], gtol, 0, what));
    }
    run_free(&f);
    run_free(&m);
    em_scope_end();
}

static void test_fused_vs_math(void **state)
{
    (void)state;
    /* twice: op sizes deciding the CPU tiling (tasks/attention.c), then every
     * op cut into one task per CPU worker along B or H */
    for (int tiled = 0; tiled < 2; tiled++) {
        if (tiled) setenv("EMBER_SDPA_TILE_MIN_FLOPS", "0", 1);
        for (int dev = 0; dev < g_ndev; dev++)
            for (size_t i = 0; i < sizeof g_cfgs / sizeof g_cfgs[0]; i++) {
                check_cfg(&g_cfgs[i], EM_F64, dev);
                check_cfg(&g_cfgs[i], EM_F32, dev);
            }
        unsetenv("EMBER_SDPA_TILE_MIN_FLOPS");
    }
    printf("fused vs math, worst error / max|math|: f32 output %.3g, gradients %.3g; f64 output %.3g, gradients %.3g\n",
           worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
}

/* q, k, v as views of one [B, T, 3, H, D] buffer (GPT-2's split heads: B and H
 * strides unrelated, rows 3 H D apart), and a transposed operand whose last
 * stride is not 1 (the front end copies it). */
static void test_strided_views(void **state)
{
    (void)state;
    const int64_t B = 2, T = 9, H = 3, D = 16;
    const cfg c = {"strided views", 4, {B, H}, T, T, D, D, M_NONE, true, 0};
    for (int dev = 0; dev < g_ndev; dev++)
        for (int di = 0; di < 2; di++) {
            const em_dtype dt = di ? EM_F32 : EM_F64;
            em_scope_begin();
            em_tensor *qkv = leaf(rnd(dt, (int64_t[]){B, T, 3, H, D}, 5, -1, 1));
            em_tensor *kt = leaf(rnd(dt, (int64_t[]){B, H, D, T}, 4, -1, 1));
            em_tensor *w = rnd(dt, (int64_t[]){B, H, T, D}, 4, -1, 1);
            for (int pass = 0; pass < 2; pass++) {
                em_tensor *outs[2], *gq[2], *gk[2];
                for (int fused = 0; fused < 2; fused++) {
                    /* the views anew for each backward (a backward frees the graph it ran) */
                    em_tensor *h[3];
                    for (int i = 0; i < 3; i++) h[i] = em_permute(em_squeeze(em_narrow(qkv, 2, i, 1), 2), (int[]){0, 2, 1, 3}, 4); /* [B, H, T, D] */
                    em_tensor *kk = pass ? em_transpose(kt, -2, -1) /* last stride T */ : h[1];
                    assert_int_equal(em_set_device(fused ? g_devs[dev].d : em_device_cpu()), EM_OK);
                    outs[fused] = fused ? em__sdpa(h[0], kk, h[2], NULL, true, 0, 0.25, true)
                                        : em__sdpa_math(h[0], kk, h[2], NULL, true, 0, 0.25, true);
                    assert_non_null(outs[fused]);
                    em_grads *g = backward(em_sum_all(em_mul(outs[fused], w)), "strided views");
                    assert_non_null(g);
                    gq[fused] = em_tensor_retain(em_grad(g, qkv));
                    gk[fused] = pass ? em_tensor_retain(em_grad(g, kt)) : NULL;
                    em_grads_free(g);
                }
                assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
                const double tol = dt == EM_F64 ? 1e-11 : 1e-4;
                char what[128];
                snprintf(what, sizeof what, "%s (%s, %s) %s: output", c.name, pass ? "transposed k" : "qkv views",
                         em_dtype_name(dt), g_devs[dev].name);
                compare(outs[1], outs[0], tol, 0, what);
                snprintf(what, sizeof what, "%s (%s, %s) %s: gradient of the qkv buffer", c.name,
                         pass ? "transposed k" : "qkv views", em_dtype_name(dt), g_devs[dev].name);
                compare(gq[1], gq[0], tol, 0, what);
                if (pass) compare(gk[1], gk[0], tol, 0, "gradient of the transposed key");
                for (int i = 0; i < 2; i++) {
                    em_tensor_release(gq[i]);
                    em_tensor_release(gk[i]);
                }
            }
            em_scope_end();
        }
}

/* f16 / bf16: the fused op (native on CUDA, widened elsewhere) against the
 * f32 math path of the same rounded inputs. */
static void test_half(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int dev = 0; dev < g_ndev; dev++)
        for (int di = 0; di < 2; di++) {
            em_scope_begin();
            const int64_t s[4] = {2, 2, 17, 32};
            em_tensor *q = leaf(rnd(dts[di], s, 4, -1, 1)), *k = leaf(rnd(dts[di], s, 4, -1, 1)), *v = leaf(rnd(dts[di], s, 4, -1, 1));
            em_tensor *w = rnd(dts[di], s, 4, -1, 1);
            em_tensor *q32 = leaf(em_detach(em_cast(q, EM_F32))), *k32 = leaf(em_detach(em_cast(k, EM_F32))), *v32 = leaf(em_detach(em_cast(v, EM_F32)));
            em_tensor *w32 = em_cast(w, EM_F32);
            const cfg c = {"half", 4, {2, 2}, 17, 17, 32, 32, M_NONE, true, 0};
            run m = run_one(false, q32, k32, v32, NULL, &c, w32, 1.0 / sqrt(32.0));
            assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
            run f = run_one(true, q, k, v, NULL, &c, w, 1.0 / sqrt(32.0));
            assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
            assert_int_equal(em_tensor_dtype(f.out), dts[di]);
            assert_int_equal(em_tensor_dtype(f.gq), dts[di]);
            const double tol = dts[di] == EM_BF16 ? 2e-2 : 4e-3;
            char what[96];
            snprintf(what, sizeof what, "%s on %s: output", em_dtype_name(dts[di]), g_devs[dev].name);
            compare(f.out, m.out, tol, 0, what);
            snprintf(what, sizeof what, "%s on %s: gradient", em_dtype_name(dts[di]), g_devs[dev].name);
            compare(f.gq, m.gq, 3 * tol, 0, what);
            compare(f.gk, m.gk, 3 * tol, 0, what);
            compare(f.gv, m.gv, 3 * tol, 0, what);
            run_free(&f);
            run_free(&m);
            em_scope_end();
        }
}

/* Autocast: SDPA is a low-precision kind (F_AC_LOW, as matmul): f32 q, k, v
 * and an f32 additive mask compute in the region's dtype, the gradients come
 * back f32 through the casts; the math path under the same region agrees. */
static void test_autocast(void **state)
{
    (void)state;
    em_scope_begin();
    const int64_t s[4] = {2, 2, 9, 32};
    em_tensor *q = leaf(rnd(EM_F32, s, 4, -1, 1)), *k = leaf(rnd(EM_F32, s, 4, -1, 1)), *v = leaf(rnd(EM_F32, s, 4, -1, 1));
    em_tensor *mask = rnd(EM_F32, (int64_t[]){9, 9}, 2, -1, 1);
    assert_int_equal(em_autocast_begin(EM_BF16), EM_OK);
    em_tensor *f = em_scaled_dot_product_attention(q, k, v, mask, false, 0, 0, false);
    em_tensor *m = em__sdpa_math(q, k, v, mask, false, 0, 1 / sqrt(32.0), false);
    em_autocast_end();
    assert_non_null(f);
    assert_int_equal(em_tensor_dtype(f), EM_BF16);
    compare(f, m, 2e-2, 0, "autocast bf16: output");
    em_grads *g = backward(em_sum_all(em_cast(f, EM_F32)), "autocast");
    assert_int_equal(em_tensor_dtype(em_grad(g, q)), EM_F32);
    assert_int_equal(em_tensor_dtype(em_grad(g, v)), EM_F32);
    em_grads_free(g);
    em_scope_end();
}

/* ---- (b) fully masked rows --------------------------------------------------- */

static void test_fully_masked_row(void **state)
{
    (void)state;
    const int64_t s[4] = {1, 2, 4, 8}, ms[2] = {4, 5};
    for (int dev = 0; dev < g_ndev; dev++) {
        em_scope_begin();
        em_tensor *q = leaf(rnd(EM_F64, s, 4, -1, 1)), *k = leaf(rnd(EM_F64, (int64_t[]){1, 2, 5, 8}, 4, -1, 1));
        em_tensor *v = leaf(rnd(EM_F64, (int64_t[]){1, 2, 5, 8}, 4, -1, 1));
        double mv[20];
        for (int i = 0; i < 20; i++) mv[i] = i / 5 != 2; /* row 2: every key masked */
        em_tensor *mask = em_test_make(EM_BOOL, mv, ms, 2);
        em_tensor *m = em__sdpa_math(q, k, v, mask, false, 0, 0.5, true);
        assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
        em_tensor *f = em__sdpa(q, k, v, mask, false, 0, 0.5, true);
        em_grads *g = backward(em_sum_all(em_mul(f, rnd(EM_F64, s, 4, -1, 1))), "fully masked row");
        assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
        compare(f, m, 1e-12, 0, "fully masked row: output");
        double *fv = em_test_values(f);
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 8; d++) assert_true(isnan(fv[(h * 4 + 2) * 8 + d]));
        free(fv);
        assert_non_null(g);
        const em_tensor *gs[3] = {em_grad(g, q), em_grad(g, k), em_grad(g, v)};
        for (int i = 0; i < 3; i++) {
            double *gv = em_test_values(gs[i]);
            for (int64_t j = 0; j < em_tensor_numel(gs[i]); j++)
                if (!isfinite(gv[j])) fail_msg("fully masked row on %s: gradient %d[%lld] = %g", g_devs[dev].name, i, (long long)j, gv[j]);
            if (i == 0)
                for (int h = 0; h < 2; h++)
                    for (int d = 0; d < 8; d++) assert_true(gv[(h * 4 + 2) * 8 + d] == 0);
            free(gv);
        }
        em_grads_free(g);
        em_scope_end();
    }
}

/* ---- (c) dropout ------------------------------------------------------------- */

/* q = k = 0 (uniform p = 1 / Tk) and v = the identity (Dv = Tk): then
 * o[b,h,i,j] = z_ij / Tk, so o * Tk * (1 - p) is the keep mask itself. */
static void test_dropout_mask(void **state)
{
    (void)state;
    const int64_t T = 64;
    const double ps[3] = {0.1, 0.25, 0.6};
    /* B 2 H 2, then B 1 H 4: the CPU tiles split along B, then along H (the
     * counters of each tile shifted, tasks/attention.c) */
    setenv("EMBER_SDPA_TILE_MIN_FLOPS", "0", 1);
    for (int dev = 0; dev < g_ndev; dev++)
        for (int pi = 0; pi < 4; pi++) {
            const double p = ps[pi % 3];
            const int64_t B = pi < 3 ? 2 : 1, H = pi < 3 ? 2 : 4;
            em_scope_begin();
            em_tensor *q = em_zeros((int64_t[]){B, H, T, 8}, 4, EM_F64);
            em_tensor *v = em_expand(em_eye(T, T, EM_F64), (int64_t[]){B, H, T, T}, 4);
            em_manual_seed(1234 + (uint64_t)pi);
            uint64_t seed, off;
            em_rng_get_state(&seed, &off);
            assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
            em_tensor *o = em__sdpa(q, q, v, NULL, false, p, 1, true);
            assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
            assert_non_null(o);
            uint64_t seed2, off2;
            em_rng_get_state(&seed2, &off2);
            assert_true(seed2 == seed);
            assert_true(off2 == off + (uint64_t)(B * H * T * T)); /* B H Tq Tk counters reserved */
            double *ov = em_test_values(o);
            int64_t kept = 0, n = B * H * T * T;
            double sum = 0;
            for (int64_t e = 0; e < n; e++) {
                uint32_t w[4];
                em_philox4x32_10(off + (uint64_t)e, seed, w);
                const bool keep = em_philox_u01(w[0]) >= p;
                const double z = ov[e] * (double)T * (1 - p);
                if (fabs(z - (keep ? 1 : 0)) > 1e-12)
                    fail_msg("dropout p %g on %s: element %lld is %g x 1/((1-p) Tk), the contract says keep = %d", p, g_devs[dev].name,
                             (long long)e, z, keep);
                kept += keep;
                sum += ov[e];
            }
            free(ov);
            const double frac = (double)kept / (double)n, sd = sqrt(p * (1 - p) / (double)n);
            if (fabs(frac - (1 - p)) > 5 * sd) fail_msg("dropout p %g: kept fraction %g, expected %g +- %g", p, frac, 1 - p, 5 * sd);
            /* mean of o = mean(z) / Tk, E = 1 / Tk; sd of mean(z) = sqrt(p / (1 - p) / n) */
            const double mean = sum / (double)n * (double)T, msd = sqrt(p / (1 - p) / (double)n);
            if (fabs(mean - 1) > 5 * msd) fail_msg("dropout p %g: output mean x Tk %g, expected 1 +- %g", p, mean, 5 * msd);
            if (dev == 0) printf("dropout p %.2f: kept %.4f (expected %.2f, sd %.4f), mean x Tk %.4f (sd %.4f)\n", p, frac, 1 - p, sd, mean, msd);
            em_scope_end();
        }
    unsetenv("EMBER_SDPA_TILE_MIN_FLOPS");
}

/* p = 1 drops everything (o = 0); the same generator state gives the same
 * bits; another state other bits; eval mode (training false) no dropout. */
static void test_dropout_seed(void **state)
{
    (void)state;
    const int64_t s[4] = {1, 2, 9, 16};
    em_scope_begin();
    em_tensor *q = rnd(EM_F32, s, 4, -1, 1), *k = rnd(EM_F32, s, 4, -1, 1), *v = rnd(EM_F32, s, 4, -1, 1);
    for (int dev = 0; dev < g_ndev; dev++) {
        assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
        em_rng_set_state(77, 1000);
        em_tensor *a = em__sdpa(q, k, v, NULL, true, 0.3, 0.25, true);
        em_rng_set_state(77, 1000);
        em_tensor *b = em__sdpa(q, k, v, NULL, true, 0.3, 0.25, true);
        em_tensor *c = em__sdpa(q, k, v, NULL, true, 0.3, 0.25, true); /* the stream moved on */
        em_tensor *all = em__sdpa(q, k, v, NULL, true, 1.0, 0.25, true);
        em_tensor *eval = em__sdpa(q, k, v, NULL, true, 0.3, 0.25, false);
        em_tensor *none = em__sdpa(q, k, v, NULL, true, 0, 0.25, true);
        assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
        double *va = em_test_values(a), *vb = em_test_values(b), *vc = em_test_values(c), *vall = em_test_values(all);
        double *ve = em_test_values(eval), *vn = em_test_values(none);
        int diff = 0;
        for (int i = 0; i < 9 * 16 * 2; i++) {
            assert_true(va[i] == vb[i]);
            diff += va[i] != vc[i];
            assert_true(vall[i] == 0);
            assert_true(ve[i] == vn[i]);
        }
        assert_true(diff > 0);
        free(va), free(vb), free(vc), free(vall), free(ve), free(vn);
    }
    em_scope_end();
}

/* The loss under a fixed generator state (seed 5, offset 0). */
static double dropout_loss(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *w)
{
    em_rng_set_state(5, 0);
    em_scope_begin();
    double r = NAN;
    assert_int_equal(em_item(em_sum_all(em_mul(em__sdpa(q, k, v, NULL, false, 0.4, 0.5, true), w)), &r), EM_OK);
    em_scope_end();
    return r;
}

/* The gradient with dropout against central differences (f64, CPU and
 * every device): the keep mask is a function of the generator state alone,
 * so the loss is smooth in q, k, v for a fixed state. */
static void test_dropout_gradient(void **state)
{
    (void)state;
    const int64_t s[4] = {1, 2, 5, 4};
    for (int dev = 0; dev < g_ndev; dev++) {
        em_scope_begin();
        assert_int_equal(em_set_device(g_devs[dev].d), EM_OK);
        em_tensor *x[3] = {leaf(rnd(EM_F64, s, 4, -1, 1)), leaf(rnd(EM_F64, s, 4, -1, 1)), leaf(rnd(EM_F64, s, 4, -1, 1))};
        em_tensor *w = rnd(EM_F64, s, 4, -1, 1);
        em_rng_set_state(5, 0);
        em_grads *g = backward(em_sum_all(em_mul(em__sdpa(x[0], x[1], x[2], NULL, false, 0.4, 0.5, true), w)), "dropout");
        assert_non_null(g);
        double maxerr = 0;
        for (int t = 0; t < 3; t++) {
            double *an = em_test_values(em_grad(g, x[t]));
            double *xv = em_test_values(x[t]);
            const int64_t n = em_tensor_numel(x[t]);
            for (int64_t i = 0; i < n; i += 3) {
                const double h = 1e-6, x0 = xv[i];
                double lp, lm;
                xv[i] = x0 + h;
                em_tensor *xp = em_test_make(EM_F64, xv, s, 4);
                xv[i] = x0 - h;
                em_tensor *xm = em_test_make(EM_F64, xv, s, 4);
                xv[i] = x0;
                em_tensor *a[3] = {x[0], x[1], x[2]};
                a[t] = xp;
                lp = dropout_loss(a[0], a[1], a[2], w);
                a[t] = xm;
                lm = dropout_loss(a[0], a[1], a[2], w);
                const double fd = (lp - lm) / (2 * h), e = fabs(fd - an[i]);
                maxerr = fmax(maxerr, e);
                if (e > 1e-6 * fmax(1, fabs(fd)))
                    fail_msg("dropout gradient of %c[%lld] on %s: autodiff %.10g, finite differences %.10g", "qkv"[t], (long long)i,
                             g_devs[dev].name, an[i], fd);
            }
            free(an);
            free(xv);
        }
        em_grads_free(g);
        assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
        if (dev == 0) printf("dropout gradient vs central differences (h 1e-6): max error %.3g\n", maxerr);
        em_scope_end();
    }
}

/* ---- (d) the path taken, fallbacks, errors ------------------------------------ */

static void test_one_task_and_fallbacks(void **state)
{
    (void)state;
    em_scope_begin();
    const int64_t s[4] = {2, 2, 8, 16};
    em_tensor *q = rnd(EM_F32, s, 4, -1, 1), *k = rnd(EM_F32, s, 4, -1, 1), *v = rnd(EM_F32, s, 4, -1, 1);
    em_sync();
    const int64_t t0 = em_get_stats().tasks_submitted;
    em_tensor *o = em_scaled_dot_product_attention(q, k, v, NULL, true, 0, 0, false);
    assert_non_null(o);
    assert_int_equal(em_get_stats().tasks_submitted - t0, 1); /* one SDPA task */
    if (em_worker_count(EM_DEVICE_CPU) >= 2) { /* forced tiles: 2 SDPA tasks and the copies of tile 1's o and lse */
        assert_int_equal(em_set_device(em_device_cpu()), EM_OK); /* tiles are for CPU-only placements */
        setenv("EMBER_SDPA_TILE_MIN_FLOPS", "0", 1);
        setenv("EMBER_SDPA_TILES", "2", 1);
        const int64_t t1 = em_get_stats().tasks_submitted;
        assert_non_null(em_scaled_dot_product_attention(q, k, v, NULL, true, 0, 0, false));
        assert_int_equal(em_get_stats().tasks_submitted - t1, 4);
        unsetenv("EMBER_SDPA_TILE_MIN_FLOPS");
        unsetenv("EMBER_SDPA_TILES");
    }
    /* D > 256: the math path (the same numbers as em__sdpa_math) */
    const int64_t sl[4] = {1, 1, 3, 300};
    em_tensor *ql = rnd(EM_F64, sl, 4, -1, 1), *kl = rnd(EM_F64, sl, 4, -1, 1), *vl = rnd(EM_F64, sl, 4, -1, 1);
    compare(em_scaled_dot_product_attention(ql, kl, vl, NULL, false, 0, 0, false),
            em__sdpa_math(ql, kl, vl, NULL, false, 0, 1 / sqrt(300.0), false), 1e-14, 0, "D = 300 (math path)");
    em_test_assert_error(em__sdpa(ql, kl, vl, NULL, false, 0, 0.1, false), "head dims must be in 1..256", "D 300", NULL);
    /* a mask that requires grad: the math path, and the mask gets its gradient */
    em_tensor *am = leaf(rnd(EM_F32, (int64_t[]){8, 8}, 2, -1, 1));
    em_grads *g = backward(em_sum_all(em_scaled_dot_product_attention(q, k, v, am, false, 0, 0, false)), "mask with grad");
    assert_non_null(g);
    assert_non_null(em_grad(g, am));
    em_grads_free(g);
    em_test_assert_error(em__sdpa(q, k, v, am, false, 0, 0.25, false), "no gradient to the mask", NULL);
    em_scope_end();
}

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    const int64_t s[4] = {1, 2, 5, 8};
    em_tensor *q = rnd(EM_F32, s, 4, -1, 1), *k = rnd(EM_F32, s, 4, -1, 1);
    em_tensor *q64 = rnd(EM_F64, s, 4, -1, 1), *qi = em_cast(q, EM_I32);
    em_test_assert_error(em__sdpa(NULL, k, k, NULL, false, 0, 0.5, false), "query is NULL", NULL);
    em_test_assert_error(em__sdpa(q, k, NULL, NULL, false, 0, 0.5, false), "value is NULL", NULL);
    em_test_assert_error(em__sdpa(q64, k, k, NULL, false, 0, 0.5, false), "one float dtype", "float64", "float32", NULL);
    em_test_assert_error(em__sdpa(qi, qi, qi, NULL, false, 0, 0.5, false), "one float dtype", "int32", NULL);
    em_test_assert_error(em__sdpa(q, em_reshape(k, (int64_t[]){2, 5, 8}, 3), k, NULL, false, 0, 0.5, false), "one rank", NULL);
    em_test_assert_error(em__sdpa(q, rnd(EM_F32, (int64_t[]){1, 3, 5, 8}, 4, 0, 1), k, NULL, false, 0, 0.5, false),
                         "leading dim 1 differs", NULL);
    em_test_assert_error(em__sdpa(q, rnd(EM_F32, (int64_t[]){1, 2, 5, 4}, 4, 0, 1), k, NULL, false, 0, 0.5, false),
                         "does not match", NULL);
    em_test_assert_error(em__sdpa(q, k, rnd(EM_F32, (int64_t[]){1, 2, 6, 8}, 4, 0, 1), NULL, false, 0, 0.5, false),
                         "does not match", NULL);
    em_tensor *mb = em_ones((int64_t[]){5, 5}, 2, EM_BOOL);
    em_test_assert_error(em__sdpa(q, k, k, mb, true, 0, 0.5, false), "mask together with is_causal", NULL);
    em_test_assert_error(em__sdpa(q, k, k, em_ones((int64_t[]){5, 5}, 2, EM_I64), false, 0, 0.5, false), "mask must be bool or float",
                         "int64", NULL);
    em_test_assert_error(em__sdpa(q, k, k, em_ones((int64_t[]){1, 1, 1, 5, 5}, 5, EM_BOOL), false, 0, 0.5, false), "mask of rank 5",
                         NULL);
    em_test_assert_error(em__sdpa(q, k, k, em_ones((int64_t[]){4, 5}, 2, EM_F32), false, 0, 0.5, false), "em_expand", NULL);
    em_test_assert_error(em__sdpa(q, k, k, NULL, false, 0, 0, false), "scale must be finite and > 0", NULL);
    em_test_assert_error(em__sdpa(q, k, k, NULL, false, 0, INFINITY, false), "scale must be finite and > 0", NULL);
    em_test_assert_error(em__sdpa(q, k, k, NULL, false, 1.5, 0.5, true), "dropout_p must be in [0, 1]", NULL);
    em_test_assert_error(em__sdpa(q, k, k, NULL, false, NAN, 0.5, true), "dropout_p must be in [0, 1]", NULL);
    /* the public function keeps its own checks and messages */
    em_test_assert_error(em_scaled_dot_product_attention(q, k, rnd(EM_F32, (int64_t[]){1, 2, 6, 8}, 4, 0, 1), NULL, false, 0, 0, false),
                         "different lengths", NULL);
    em_scope_end();
}

int main(void)
{
    /* An OpenCL worker on PoCL when there is one (as tests/test_opencl.c). */
    setenv("STARPU_OPENCL_ON_CPUS", "1", 1);
    unsetenv("OCL_ICD_VENDORS");
    setenv("STARPU_NCPU", "2", 0);
    setenv("STARPU_SILENT", "1", 0);
    char cache[4096];
    const char *home = getenv("STARPU_HOME");
    snprintf(cache, sizeof cache, "%s/pocl-cache", home && *home ? home : ".");
    if (home && *home) mkdir(home, 0755);
    mkdir(cache, 0755);
    setenv("POCL_CACHE_DIR", cache, 0);
    if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "test_attention: em_init failed: %s\n", em_last_error());
        return 1;
    }
    g_ndev = em_test_list_devices(g_devs, MAX_DEV);
    printf("test_attention: devices:");
    for (int i = 0; i < g_ndev; i++) printf(" %s", g_devs[i].name);
    printf("%s; %d CPU workers\n", g_ndev == 1 ? " (no OpenCL worker: CPU only)" : "", em_worker_count(EM_DEVICE_CPU));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_vs_math),   cmocka_unit_test(test_strided_views),
        cmocka_unit_test(test_half),            cmocka_unit_test(test_autocast),
        cmocka_unit_test(test_fully_masked_row),
        cmocka_unit_test(test_dropout_mask),    cmocka_unit_test(test_dropout_seed),
        cmocka_unit_test(test_dropout_gradient), cmocka_unit_test(test_one_task_and_fallbacks),
        cmocka_unit_test(test_errors),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    em_shutdown();
    return r;
}
