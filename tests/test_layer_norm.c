/* The fused layer norm (LAYER_NORM / LAYER_NORM_BWD, tasks/norm.c), which
 * em_layer_norm runs when weight and bias are given, against the composed
 * math it replaced (mean, x - mean, the biased variance, rsqrt, scale and
 * shift as ordinary ops, written out here): outputs and the gradients of x,
 * weight and bias, for shapes [1, 1], [3, 7] and [4, 5, 384] (the last one
 * normalized over one and over its last two dims), several eps, f64 and
 * f32, contiguous and transposed inputs; which inputs get a gradient; the
 * 16-bit and autocast dtypes; the task counts (one task forward). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* em_layer_norm's former body with weight and bias: ordinary ops only. */
static em_tensor *composed(const em_tensor *x, int ndim, const em_tensor *w, const em_tensor *b, double eps)
{
    int nd = em_tensor_ndim(x), dims[8];
    for (int i = 0; i < ndim; i++) dims[i] = nd - ndim + i;
    em_tensor *mean = em_mean(x, dims, ndim, true);
    em_tensor *xc = em_sub(x, mean);
    em_tensor *var = em_mean(em_square(xc), dims, ndim, true);
    em_tensor *y = em_mul(xc, em_rsqrt(em_add_scalar(var, eps)));
    return em_add(em_mul(y, w), b);
}

/* A leaf of dtype dt: N(mu, sd^2) values, requiring a gradient when @p grad. */
static em_tensor *leaf(const int64_t *shape, int nd, em_dtype dt, double mu, double sd, bool grad)
{
    em_tensor *t = em_cast(em_rand_normal(shape, nd, EM_F64, mu, sd), dt);
    assert_non_null(t);
    t = em_detach(t);
    if (grad) assert_int_equal(em_set_requires_grad(t, true), EM_OK);
    return t;
}

/* max |a - b| <= atol + rtol * max |b| over the tensors (as f64); prints the worst. */
static void assert_near(const em_tensor *a, const em_tensor *b, double rtol, double atol, const char *what)
{
    assert_non_null(a);
    assert_non_null(b);
    int64_t n = em_tensor_numel(b);
    assert_int_equal(em_tensor_numel(a), n);
    double *va = em_test_values(a), *vb = em_test_values(b);
    double worst = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(va[i]) || !isfinite(vb[i])) fail_msg("%s: element %lld not finite (%g vs %g)", what, (long long)i, va[i], vb[i]);
        worst = fmax(worst, fabs(va[i] - vb[i]));
        mag = fmax(mag, fabs(vb[i]));
    }
    free(va);
    free(vb);
    if (worst > atol + rtol * mag) fail_msg("%s: max error %.3g over max magnitude %.3g (tolerance %.3g)", what, worst, mag, atol + rtol * mag);
}

typedef struct ln_case {
    int nd;
    int64_t shape[3];
    int ndim; /* normalized dims */
} ln_case;

static const ln_case cases[] = {
    {2, {1, 1}, 1},
    {2, {3, 7}, 1},
    {3, {4, 5, 384}, 1},
    {3, {4, 5, 384}, 2},
};
static const double epss[] = {1e-5, 1e-3, 0.5};

/* One case: em_layer_norm (fused) and composed() on the same leaves of dt,
 * loss = sum(y * R); outputs and gradients compared. The reference is the
 * composed math in f64 on the same (dt-rounded) values. */
static void run_case(const ln_case *c, double eps, em_dtype dt, bool transposed, double rtol, double atol)
{
    char what[160];
    em_scope_begin();
    const int nd = c->nd, ndim = c->ndim;
    const int64_t *ws = c->shape + nd - ndim;
    int64_t xs[3];
    memcpy(xs, c->shape, sizeof xs);
    if (transposed) { /* x made as [.., b, a] and transposed: a non-contiguous input */
        xs[nd - 1] = c->shape[nd - 2];
        xs[nd - 2] = c->shape[nd - 1];
    }
    em_tensor *x = leaf(xs, nd, dt, 3, 2, true); /* off zero: the two-pass variance */
    em_tensor *w = leaf(ws, ndim, dt, 1, 0.5, true), *b = leaf(ws, ndim, dt, 0, 0.5, true);
    em_tensor *xin = transposed ? em_transpose(x, nd - 2, nd - 1) : x;
    em_tensor *r = em_rand_normal(c->shape, nd, EM_F64, 0, 1);
    em_tensor *yf = em_layer_norm(xin, ndim, w, b, eps);
    assert_non_null(yf);
    assert_int_equal(em_tensor_dtype(yf), dt);
    em_test_assert_shape(yf, nd, c->shape);
    em_grads *gf = em_backward(em_sum_all(em_mul(em_cast(yf, EM_F64), r)));
    assert_non_null(gf);
    /* the reference: composed math in f64 on leaves holding the same values */
    em_tensor *x64 = em_detach(em_cast(x, EM_F64)), *w64 = em_detach(em_cast(w, EM_F64)), *b64 = em_detach(em_cast(b, EM_F64));
    em_set_requires_grad(x64, true);
    em_set_requires_grad(w64, true);
    em_set_requires_grad(b64, true);
    em_tensor *yc = composed(transposed ? em_transpose(x64, nd - 2, nd - 1) : x64, ndim, w64, b64, eps);
    em_grads *gc = em_backward(em_sum_all(em_mul(yc, r)));
    assert_non_null(gc);
    const char *dn = em_dtype_name(dt);
    snprintf(what, sizeof what, "%s shape [%lld, %lld%s] ndim %d eps %g%s: y", dn, (long long)c->shape[0], (long long)c->shape[1],
             nd > 2 ? ", 384" : "", ndim, eps, transposed ? " (transposed x)" : "");
    assert_near(yf, yc, rtol, atol, what);
    size_t l = strlen(what) - 1;
    what[l] = 0;
    strcat(what, "dx");
    assert_near(em_grad(gf, x), em_grad(gc, x64), rtol, atol, what);
    what[l] = 0;
    strcat(what, "dweight");
    assert_near(em_grad(gf, w), em_grad(gc, w64), rtol, atol, what);
    what[l] = 0;
    strcat(what, "dbias");
    assert_near(em_grad(gf, b), em_grad(gc, b64), rtol, atol, what);
    em_test_assert_shape(em_grad(gf, w), ndim, ws);
    em_grads_free(gf);
    em_grads_free(gc);
    em_scope_end();
}

static void test_fused_matches_composed(void **state)
{
    (void)state;
    em_manual_seed(11);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t e = 0; e < sizeof epss / sizeof epss[0]; e++) {
            run_case(&cases[i], epss[e], EM_F64, false, 1e-11, 1e-12);
            run_case(&cases[i], epss[e], EM_F32, false, 2e-6, 2e-6);
            if (cases[i].shape[cases[i].nd - 1] > 1) run_case(&cases[i], epss[e], EM_F64, true, 1e-11, 1e-12);
        }
}

/* Only the inputs that require a gradient get one (the rule drops the others). */
static void test_gradients_only_where_required(void **state)
{
    (void)state;
    em_scope_begin();
    em_manual_seed(3);
    const int64_t s[2] = {3, 6}, n[1] = {6};
    em_tensor *x = leaf(s, 2, EM_F32, 0, 1, false), *w = leaf(n, 1, EM_F32, 1, 0.2, true), *b = leaf(n, 1, EM_F32, 0, 1, false);
    em_grads *g = em_backward(em_sum_all(em_square(em_layer_norm(x, 1, w, b, 1e-5))));
    assert_non_null(g);
    assert_non_null(em_grad(g, w));
    assert_null(em_grad(g, x));
    assert_null(em_grad(g, b));
    em_grads_free(g);
    em_tensor *x2 = leaf(s, 2, EM_F32, 0, 1, true);
    g = em_backward(em_sum_all(em_square(em_layer_norm(x2, 1, em_detach(w), b, 1e-5))));
    assert_non_null(g);
    assert_non_null(em_grad(g, x2));
    assert_null(em_grad(g, w));
    em_grads_free(g);
    em_scope_end();
}

/* The dtypes em_layer_norm had: a 16-bit x with f32 weight / bias gives the
 * f32 norm of the widened x; all-bf16 gives bf16, near the f32 result;
 * inside autocast the result is f32; mixed f32 / f64 (composed) gives f64. */
static void test_dtypes(void **state)
{
    (void)state;
    em_scope_begin();
    em_manual_seed(5);
    const int64_t s[2] = {4, 64}, n[1] = {64};
    em_tensor *xf = leaf(s, 2, EM_F32, 10, 1, false), *w = leaf(n, 1, EM_F32, 1, 0.2, false), *b = leaf(n, 1, EM_F32, 0, 0.2, false);
    em_tensor *xh = em_cast(xf, EM_BF16), *wh = em_cast(w, EM_BF16), *bh = em_cast(b, EM_BF16);
    em_tensor *y = em_layer_norm(xh, 1, w, b, 1e-5);
    assert_int_equal(em_tensor_dtype(y), EM_F32);
    assert_near(y, em_layer_norm(em_cast(xh, EM_F32), 1, w, b, 1e-5), 0, 0, "bf16 x, f32 affine");
    em_tensor *yh = em_layer_norm(xh, 1, wh, bh, 1e-5);
    assert_int_equal(em_tensor_dtype(yh), EM_BF16);
    em_tensor *ref = em_layer_norm(em_cast(xh, EM_F32), 1, em_cast(wh, EM_F32), em_cast(bh, EM_F32), 1e-5);
    assert_near(yh, em_cast(ref, EM_BF16), 0, 0, "bf16 everything: the f32 result rounded once");
    em_autocast_begin(EM_BF16);
    assert_int_equal(em_tensor_dtype(em_layer_norm(xh, 1, wh, bh, 1e-5)), EM_F32);
    assert_int_equal(em_tensor_dtype(em_layer_norm(xf, 1, w, b, 1e-5)), EM_F32);
    em_autocast_end();
    em_tensor *w64 = em_cast(w, EM_F64);
    assert_int_equal(em_tensor_dtype(em_layer_norm(xf, 1, w64, b, 1e-5)), EM_F64);
    em_scope_end();
}

/* One task forward for contiguous operands; the backward far fewer than the
 * composed form's. Printed: the counts of a forward + backward, fused and
 * composed (the loss's own tasks included in both). */
static void test_task_counts(void **state)
{
    (void)state;
    em_scope_begin();
    em_manual_seed(7);
    const int64_t s[3] = {2, 8, 384}, n[1] = {384};
    em_tensor *x = leaf(s, 3, EM_F32, 0, 1, true), *w = leaf(n, 1, EM_F32, 1, 0.2, true), *b = leaf(n, 1, EM_F32, 0, 0.2, true);
    em_sync();
    int64_t t0 = em_get_stats().tasks_submitted;
    em_tensor *y = em_layer_norm(x, 1, w, b, 1e-5);
    int64_t t1 = em_get_stats().tasks_submitted;
    em_grads *g = em_backward(em_sum_all(y));
    assert_non_null(g);
    int64_t t2 = em_get_stats().tasks_submitted;
    em_grads_free(g);
    em_tensor *yc = composed(x, 1, w, b, 1e-5);
    int64_t t3 = em_get_stats().tasks_submitted;
    g = em_backward(em_sum_all(yc));
    assert_non_null(g);
    int64_t t4 = em_get_stats().tasks_submitted;
    em_grads_free(g);
    printf("[layer_norm] tasks: fused forward %lld, backward (with the loss) %lld; composed forward %lld, backward %lld\n",
           (long long)(t1 - t0), (long long)(t2 - t1), (long long)(t3 - t2), (long long)(t4 - t3));
    assert_int_equal(t1 - t0, 1);
    assert_true(t2 - t1 + 5 < t4 - t3);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_matches_composed),
        cmocka_unit_test(test_gradients_only_where_required),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_task_counts),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
