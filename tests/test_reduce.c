/* Tests of reductions (sum, mean, prod, max, min, argmax, argmin, var, std,
 * logsumexp, any, all) and softmax / log_softmax, against a reference
 * reducer written here in double precision. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------- */

#define DIMS(...) ((const int[]){__VA_ARGS__}), ((int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)))

static void check_shape(const em_tensor *t, const int64_t *shape, int nd, const char *what)
{
    char a[128], b[128];
    if (em_tensor_ndim(t) != nd || (nd && memcmp(em_tensor_shape(t), shape, sizeof(int64_t) * (size_t)nd)))
        fail_msg("%s: shape %s, expected %s", what, em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), a, sizeof a),
                 em_shape_str(shape, nd, b, sizeof b));
}

/* Checks dtype + values of r, then releases it. */
#define EXPECT(r, dt, what, ...) em_test_expect(r, dt, VALS(__VA_ARGS__), 0, 0, what)

/* ---- reference reducer ------------------------------------------------------- */

typedef enum rop { R_SUM, R_MEAN, R_PROD, R_MAX, R_MIN, R_VAR0, R_VAR1, R_STD1, R_LSE, R_ANY, R_ALL, R_ARGMAX, R_ARGMIN } rop;

static double ref_apply(rop op, const double *v, int64_t n)
{
    double a = 0, m;
    int64_t best = 0;
    switch (op) {
    case R_SUM: for (int64_t i = 0; i < n; i++) a += v[i]; return a;
    case R_MEAN: for (int64_t i = 0; i < n; i++) a += v[i]; return a / (double)n;
    case R_PROD: a = 1; for (int64_t i = 0; i < n; i++) a *= v[i]; return a;
    case R_MAX: m = v[0]; for (int64_t i = 1; i < n; i++) if (v[i] > m || isnan(v[i])) m = v[i]; return m;
    case R_MIN: m = v[0]; for (int64_t i = 1; i < n; i++) if (v[i] < m || isnan(v[i])) m = v[i]; return m;
    case R_VAR0:
    case R_VAR1:
    case R_STD1: {
        double mean = ref_apply(R_MEAN, v, n), ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
        double var = ss / (double)(n - (op == R_VAR0 ? 0 : 1));
        return op == R_STD1 ? sqrt(var) : var;
    }
    case R_LSE:
        m = -INFINITY;
        for (int64_t i = 0; i < n; i++) m = fmax(m, v[i]);
        for (int64_t i = 0; i < n; i++) a += exp(v[i] - m);
        return m + log(a);
    case R_ANY: for (int64_t i = 0; i < n; i++) if (v[i] != 0) return 1; return 0;
    case R_ALL: for (int64_t i = 0; i < n; i++) if (v[i] == 0) return 0; return 1;
    case R_ARGMAX: for (int64_t i = 1; i < n; i++) if (v[i] > v[best]) best = i; return (double)best;
    case R_ARGMIN: for (int64_t i = 1; i < n; i++) if (v[i] < v[best]) best = i; return (double)best;
    }
    return NAN;
}

/* Reduces x (C order, shape[nd]) over the dims in mask; out is in C order over
 * the kept dims. Returns the number of outputs. */
static int64_t ref_reduce(const double *x, const int64_t *shape, int nd, const bool *mask, rop op, double *out)
{
    int64_t st[EM_MAX_DIMS], s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
    int kd[EM_MAX_DIMS], rd[EM_MAX_DIMS], nk = 0, nr = 0;
    int64_t nout = 1, nred = 1;
    for (int d = 0; d < nd; d++) {
        if (mask[d]) {
            rd[nr++] = d;
            nred *= shape[d];
        } else {
            kd[nk++] = d;
            nout *= shape[d];
        }
    }
    double *buf = malloc(sizeof(double) * (size_t)(nred ? nred : 1));
    for (int64_t o = 0; o < nout; o++) {
        int64_t base = 0, rem = o;
        for (int i = nk - 1; i >= 0; i--) {
            base += (rem % shape[kd[i]]) * st[kd[i]];
            rem /= shape[kd[i]];
        }
        for (int64_t r = 0; r < nred; r++) {
            int64_t off = base, rr = r;
            for (int i = nr - 1; i >= 0; i--) {
                off += (rr % shape[rd[i]]) * st[rd[i]];
                rr /= shape[rd[i]];
            }
            buf[r] = x[off];
        }
        out[o] = ref_apply(op, buf, nred);
    }
    free(buf);
    return nout;
}

/* Test data [2,3,4]: small integers and halves with ties, one negative run. */
static void data234(double *x)
{
    for (int i = 0; i < 24; i++) x[i] = ((i * 7) % 11 - 5) * 0.5;
}

typedef struct red_case {
    const char *name;
    rop op;
    em_tensor *(*fn)(const em_tensor *, const int *, int, bool);
    bool to_bool;
} red_case;

static em_tensor *f_var0(const em_tensor *a, const int *d, int n, bool k) { return em_var(a, d, n, 0, k); }
static em_tensor *f_var1(const em_tensor *a, const int *d, int n, bool k) { return em_var(a, d, n, 1, k); }
static em_tensor *f_std1(const em_tensor *a, const int *d, int n, bool k) { return em_std(a, d, n, 1, k); }

static const red_case REDS[] = {
    {"sum", R_SUM, em_sum, false},       {"mean", R_MEAN, em_mean, false}, {"prod", R_PROD, em_prod, false},
    {"max", R_MAX, em_max, false},       {"min", R_MIN, em_min, false},    {"var(c=0)", R_VAR0, f_var0, false},
    {"var(c=1)", R_VAR1, f_var1, false}, {"std(c=1)", R_STD1, f_std1, false}, {"logsumexp", R_LSE, em_logsumexp, false},
    {"any", R_ANY, em_any, true},        {"all", R_ALL, em_all, true},
};
#define N_REDS ((int)(sizeof REDS / sizeof REDS[0]))

/* Every op x every dim subset (given as positive and as negative dims, and as
 * ndims == 0 for "all") x keepdim, on a [2,3,4] tensor of dtype dt. */
static void run_reduce_table(em_dtype dt, double rtol, double atol)
{
    double x[24];
    data234(x);
    if (dt == EM_F32)
        for (int i = 0; i < 24; i++) x[i] = (double)(float)x[i];
    const int64_t shape[3] = {2, 3, 4};
    em_tensor *t = em_test_make(dt, x, shape, 3);
    for (int c = 0; c < N_REDS; c++)
        for (int subset = 0; subset < 9; subset++) /* 1..7: dim subsets, 8: ndims == 0 */
            for (int keep = 0; keep < 2; keep++)
                for (int neg = 0; neg < 2; neg++) {
                    if (subset == 0) continue;
                    bool mask[3];
                    int dims[3], nd = 0;
                    for (int d = 0; d < 3; d++) {
                        mask[d] = subset == 8 || (subset >> d & 1);
                        if (subset != 8 && mask[d]) dims[nd++] = neg ? d - 3 : d;
                    }
                    /* list the dims in reverse order sometimes: order must not matter */
                    if (neg && nd > 1) {
                        int tmp = dims[0];
                        dims[0] = dims[nd - 1];
                        dims[nd - 1] = tmp;
                    }
                    double want[24];
                    int64_t n = ref_reduce(x, shape, 3, mask, REDS[c].op, want);
                    if (dt == EM_F32 && !REDS[c].to_bool)
                        for (int64_t i = 0; i < n; i++) want[i] = (double)(float)want[i];
                    int64_t oshape[3];
                    int ond = 0;
                    for (int d = 0; d < 3; d++)
                        if (!mask[d]) oshape[ond++] = shape[d];
                        else if (keep) oshape[ond++] = 1;
                    char what[96];
                    snprintf(what, sizeof what, "%s(%s, subset %d%s%s)", REDS[c].name, em_dtype_name(dt), subset,
                             keep ? ", keepdim" : "", neg ? ", negative dims" : "");
                    em_tensor *r = REDS[c].fn(t, subset == 8 ? NULL : dims, nd, keep);
                    if (!r) fail_msg("%s: %s", what, em_last_error());
                    check_shape(r, oshape, ond, what);
                    em_test_expect(r, REDS[c].to_bool ? EM_BOOL : dt, want, n, rtol, atol, what);
                }
    em_tensor_release(t);
}

static void test_reduce_table_f32(void **state)
{
    (void)state;
    run_reduce_table(EM_F32, 2e-6, 1e-6);
}

static void test_reduce_table_f64(void **state)
{
    (void)state;
    run_reduce_table(EM_F64, 1e-13, 1e-13);
}

/* ---- specific values ----------------------------------------------------------- */

static void test_sum_mean_basic(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *r = em_sum(x, DIMS(0), false);
    check_shape(r, SHAPE(3), 1, "sum dim 0");
    EXPECT(r, EM_F32, "sum dim 0", 5, 7, 9);
    r = em_sum(x, DIMS(1), true);
    check_shape(r, SHAPE(2, 1), 2, "sum dim 1 keepdim");
    EXPECT(r, EM_F32, "sum dim 1 keepdim", 6, 15);
    r = em_sum(x, DIMS(-1), false);
    check_shape(r, SHAPE(2), 1, "sum dim -1");
    EXPECT(r, EM_F32, "sum dim -1", 6, 15);
    r = em_sum(x, NULL, 0, false);
    check_shape(r, NULL, 0, "sum all");
    EXPECT(r, EM_F32, "sum all", 21);
    r = em_sum(x, NULL, 0, true);
    check_shape(r, SHAPE(1, 1), 2, "sum all keepdim");
    EXPECT(r, EM_F32, "sum all keepdim", 21);
    r = em_sum(x, DIMS(0, 1), false);
    check_shape(r, NULL, 0, "sum dims 0,1");
    EXPECT(r, EM_F32, "sum dims 0,1", 21);
    r = em_sum_all(x);
    check_shape(r, NULL, 0, "sum_all");
    EXPECT(r, EM_F32, "sum_all", 21);
    r = em_mean(x, DIMS(0), false);
    EXPECT(r, EM_F32, "mean dim 0", 2.5, 3.5, 4.5);
    r = em_mean(x, DIMS(1), true);
    check_shape(r, SHAPE(2, 1), 2, "mean keepdim");
    EXPECT(r, EM_F32, "mean dim 1", 2, 5);
    r = em_mean_all(x);
    check_shape(r, NULL, 0, "mean_all");
    EXPECT(r, EM_F32, "mean_all", 3.5);
    EXPECT(em_prod(x, DIMS(1), false), EM_F32, "prod dim 1", 6, 120);
    EXPECT(em_max(x, DIMS(0), false), EM_F32, "max dim 0", 4, 5, 6);
    EXPECT(em_min(x, DIMS(1), false), EM_F32, "min dim 1", 1, 4);
    /* 0-d input */
    em_tensor *s = em_scalar(2.5, EM_F32);
    r = em_sum(s, NULL, 0, false);
    check_shape(r, NULL, 0, "sum 0-d");
    EXPECT(r, EM_F32, "sum 0-d", 2.5);
    EXPECT(em_sum(s, DIMS(0), false), EM_F32, "sum 0-d dim 0", 2.5);
    EXPECT(em_mean(s, DIMS(-1), false), EM_F32, "mean 0-d dim -1", 2.5);
    EXPECT(em_argmax(s, 0, false), EM_I64, "argmax 0-d", 0);
    /* f32 accumulates in a wider type: 1e8 + many ones */
    em_tensor *ones = em_ones(SHAPE(1000), 1, EM_F32);
    em_tensor *cat = em_add(ones, em_scalar(0, EM_F32));
    EXPECT(em_sum(cat, NULL, 0, false), EM_F32, "sum 1000 ones", 1000);
    em_tensor *ramp = em_arange(0, 100000, 1, EM_F32);
    EXPECT(em_sum_all(ramp), EM_F32, "sum 0..99999", (double)(float)4999950000.0);
    em_scope_end();
}

static void test_int_reductions(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *i = T(EM_I32, (2), 2147483647, 1);
    em_tensor *s = em_sum(i, NULL, 0, false);
    em_test_check_dtype(s, EM_I64, "sum(i32)");
    int64_t v = 0;
    assert_int_equal(em_to_host(s, &v, sizeof v), EM_OK);
    assert_true(v == 2147483648LL); /* no int32 overflow */
    EXPECT(em_sum(T(EM_U8, (3), 200, 100, 250), NULL, 0, false), EM_I64, "sum(u8)", 550);
    EXPECT(em_sum(T(EM_BOOL, (2, 3), 1, 0, 1, 1, 1, 0), DIMS(1), false), EM_I64, "sum(bool) counts", 2, 2);
    const int64_t big[3] = {((int64_t)1 << 62), 3, -2};
    em_tensor *l = em_from_host(big, SHAPE(3), 1, EM_I64);
    s = em_sum(l, NULL, 0, false);
    assert_int_equal(em_to_host(s, &v, sizeof v), EM_OK);
    assert_true(v == ((int64_t)1 << 62) + 1); /* exact, not via double */
    em_tensor *mx = em_max(l, NULL, 0, false);
    em_test_check_dtype(mx, EM_I64, "max(i64)");
    assert_int_equal(em_to_host(mx, &v, sizeof v), EM_OK);
    assert_true(v == ((int64_t)1 << 62));
    em_tensor *m = T(EM_I32, (2, 3), 3, -7, 5, 0, 9, -1);
    EXPECT(em_max(m, DIMS(1), false), EM_I32, "max(i32)", 5, 9);
    EXPECT(em_min(m, DIMS(0), true), EM_I32, "min(i32)", 0, -7, -1);
    EXPECT(em_prod(m, DIMS(1), false), EM_I64, "prod(i32) -> i64", -105, 0);
    EXPECT(em_prod(T(EM_I32, (3), 100000, 100000, 3), NULL, 0, false), EM_I64, "prod(i32) no overflow", 3e10);
    EXPECT(em_argmax(m, 1, false), EM_I64, "argmax(i32)", 2, 1);
    EXPECT(em_any(m, DIMS(1), false), EM_BOOL, "any(i32)", 1, 1);
    EXPECT(em_all(m, DIMS(1), false), EM_BOOL, "all(i32)", 1, 0);
    EXPECT(em_max(T(EM_U8, (3), 7, 255, 0), NULL, 0, false), EM_U8, "max(u8)", 255);
    EXPECT(em_max(T(EM_BOOL, (3), 0, 1, 0), NULL, 0, false), EM_BOOL, "max(bool)", 1);
    /* mean of an integer tensor is an error, as in PyTorch */
    em_clear_error();
    em_test_assert_error(em_mean(m, DIMS(0), false), "int32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_mean_all(T(EM_I64, (2), 1, 2)), "int64", NULL);
    em_test_assert_error(em_mean_all(T(EM_BOOL, (2), 1, 0)), "bool", NULL);
    em_scope_end();
}

static void test_argmax_argmin(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, 3, 3, 5, 5, 0);
    em_tensor *r = em_argmax(x, 1, false);
    check_shape(r, SHAPE(2), 1, "argmax");
    EXPECT(r, EM_I64, "argmax dim 1 (first of ties)", 1, 0);
    EXPECT(em_argmin(x, 1, false), EM_I64, "argmin dim 1", 0, 2);
    EXPECT(em_argmax(x, 0, false), EM_I64, "argmax dim 0", 1, 1, 0);
    EXPECT(em_argmin(x, -2, false), EM_I64, "argmin dim -2", 0, 0, 1);
    r = em_argmax(x, 1, true);
    check_shape(r, SHAPE(2, 1), 2, "argmax keepdim");
    EXPECT(r, EM_I64, "argmax keepdim", 1, 0);
    EXPECT(em_argmax(F32((5), 2, 2, 2, 2, 2), 0, false), EM_I64, "argmax all equal", 0);
    EXPECT(em_argmin(F32((4), 4, -1, 3, -1), 0, false), EM_I64, "argmin ties", 1);
    /* NaN wins (torch.argmax returns the NaN's index) */
    EXPECT(em_argmax(F32((4), 1, NAN, 7, NAN), 0, false), EM_I64, "argmax nan", 1);
    EXPECT(em_argmin(F32((3), 1, NAN, -7), 0, false), EM_I64, "argmin nan", 1);
    /* [2,3,4] against the reference, every dim, with ties */
    double d[24];
    data234(d);
    em_tensor *t = em_test_make(EM_F64, d, SHAPE(2, 3, 4), 3);
    for (int dim = 0; dim < 3; dim++) {
        bool mask[3] = {dim == 0, dim == 1, dim == 2};
        double wmax[12], wmin[12];
        int64_t n = ref_reduce(d, SHAPE(2, 3, 4), 3, mask, R_ARGMAX, wmax);
        ref_reduce(d, SHAPE(2, 3, 4), 3, mask, R_ARGMIN, wmin);
        char what[64];
        snprintf(what, sizeof what, "argmax [2,3,4] dim %d", dim);
        em_test_expect(em_argmax(t, dim, false), EM_I64, wmax, n, 0, 0, what);
        snprintf(what, sizeof what, "argmin [2,3,4] dim %d", dim - 3);
        em_test_expect(em_argmin(t, dim - 3, true), EM_I64, wmin, n, 0, 0, what);
    }
    em_test_assert_error(em_argmax(x, 2, false), "dim 2", NULL);
    em_scope_end();
}

static void test_var_std(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F64((2, 4), 1, 2, 3, 4, 2, 4, 6, 8);
    /* torch.var default: correction = 1 */
    em_test_expect(em_var(x, DIMS(1), 1, false), EM_F64, VALS(5.0 / 3, 20.0 / 3), 1e-15, 0, "var c=1");
    em_test_expect(em_var(x, DIMS(1), 0, false), EM_F64, VALS(1.25, 5), 1e-15, 0, "var c=0");
    em_test_expect(em_std(x, DIMS(1), 1, false), EM_F64, VALS(sqrt(5.0 / 3), sqrt(20.0 / 3)), 1e-15, 0, "std c=1");
    em_test_expect(em_std(x, DIMS(1), 0, true), EM_F64, VALS(sqrt(1.25), sqrt(5.0)), 1e-15, 0, "std c=0");
    em_tensor *r = em_std(x, DIMS(1), 0, true);
    check_shape(r, SHAPE(2, 1), 2, "std keepdim");
    em_tensor_release(r);
    em_test_expect(em_var(x, DIMS(0), 1, false), EM_F64, VALS(0.5, 2, 4.5, 8), 1e-15, 0, "var dim 0");
    em_test_expect(em_var(x, NULL, 0, 1, false), EM_F64, VALS(ref_apply(R_VAR1, (const double[]){1, 2, 3, 4, 2, 4, 6, 8}, 8)),
           1e-15, 0, "var all");
    /* large offset: a naive sum-of-squares formula loses everything here */
    em_tensor *off = F64((4), 1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 4);
    em_test_expect(em_var(off, NULL, 0, 1, false), EM_F64, VALS(5.0 / 3), 1e-9, 0, "var with offset");
    em_tensor *off32 = F32((4), 10000 + 1, 10000 + 2, 10000 + 3, 10000 + 4);
    em_test_expect(em_var(off32, NULL, 0, 0, false), EM_F32, VALS(1.25), 1e-6, 0, "var f32 with offset");
    /* one element with correction 1: nan (PyTorch warns and returns nan) */
    em_test_expect(em_var(F32((1), 3), NULL, 0, 1, false), EM_F32, VALS(NAN), 0, 0, "var of one element");
    em_test_expect(em_var(F32((1), 3), NULL, 0, 0, false), EM_F32, VALS(0), 0, 0, "var c=0 of one element");
    em_test_expect(em_std(F32((2, 1), 3, 4), DIMS(1), 1, false), EM_F32, VALS(NAN, NAN), 0, 0, "std of one element");
    /* error paths keep the real message (not the message of a later op) */
    em_clear_error();
    em_test_assert_error(em_std(x, DIMS(5), 1, false), "dim 5", NULL);
    em_test_assert_error(em_var(x, DIMS(1, 1), 1, false), "dim 1", NULL);
    em_scope_end();
}

static void test_logsumexp(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 2), 1000, 1000, -1000, -1000);
    em_test_expect(em_logsumexp(x, DIMS(1), false), EM_F32, VALS(1000 + log(2.0), -1000 + log(2.0)), 1e-6, 0, "lse large");
    em_tensor *y = F64((3), 1000, 0, -INFINITY);
    em_test_expect(em_logsumexp(y, NULL, 0, false), EM_F64, VALS(1000), 1e-15, 0, "lse 1000, 0, -inf");
    em_tensor *z = F32((2, 3), 1, 2, 3, -INFINITY, -INFINITY, -INFINITY);
    em_test_expect(em_logsumexp(z, DIMS(1), true), EM_F32, VALS(3 + log(1 + exp(-1.0) + exp(-2.0)), -INFINITY), 1e-6, 0,
           "lse with -inf row");
    em_test_expect(em_logsumexp(F32((2), INFINITY, 1), NULL, 0, false), EM_F32, VALS(INFINITY), 0, 0, "lse +inf");
    em_test_expect(em_logsumexp(F32((2), NAN, 1), NULL, 0, false), EM_F32, VALS(NAN), 0, 0, "lse nan");
    em_test_expect(em_logsumexp(F32((2, 2), 0, 0, 0, 0), DIMS(0), false), EM_F32, VALS(log(2.0), log(2.0)), 1e-6, 0, "lse dim 0");
    /* integer input gives f32 */
    em_test_expect(em_logsumexp(T(EM_I32, (2), 0, 0), NULL, 0, false), EM_F32, VALS(log(2.0)), 1e-6, 0, "lse(i32)");
    em_scope_end();
}

static void test_any_all(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *b = T(EM_BOOL, (2, 3), 1, 0, 1, 0, 0, 0);
    EXPECT(em_any(b, DIMS(1), false), EM_BOOL, "any dim 1", 1, 0);
    EXPECT(em_all(b, DIMS(0), false), EM_BOOL, "all dim 0", 0, 0, 0);
    EXPECT(em_any(b, NULL, 0, false), EM_BOOL, "any", 1);
    EXPECT(em_all(T(EM_BOOL, (3), 1, 1, 1), NULL, 0, false), EM_BOOL, "all true", 1);
    em_tensor *r = em_any(b, DIMS(0), true);
    check_shape(r, SHAPE(1, 3), 2, "any keepdim");
    EXPECT(r, EM_BOOL, "any dim 0", 1, 0, 1);
    /* floats: non-zero (and nan) is true */
    EXPECT(em_all(F32((3), 0.5, -2, NAN), NULL, 0, false), EM_BOOL, "all f32", 1);
    EXPECT(em_any(F32((2), 0, -0.0), NULL, 0, false), EM_BOOL, "any zeros", 0);
    em_scope_end();
}

static void test_nan_propagation(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, NAN, 3, 4, 5, 6);
    EXPECT(em_max(x, DIMS(1), false), EM_F32, "max nan", NAN, 6);
    EXPECT(em_min(x, DIMS(1), false), EM_F32, "min nan", NAN, 4);
    EXPECT(em_sum(x, DIMS(1), false), EM_F32, "sum nan", NAN, 15);
    EXPECT(em_max(F32((3), NAN, 1, 2), NULL, 0, false), EM_F32, "max leading nan", NAN);
    EXPECT(em_max(F32((3), -INFINITY, -INFINITY, -INFINITY), NULL, 0, false), EM_F32, "max -inf", -INFINITY);
    em_scope_end();
}

static void test_zero_size(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *e = em_zeros(SHAPE(0, 3), 2, EM_F32);
    em_tensor *r = em_sum(e, DIMS(0), false);
    check_shape(r, SHAPE(3), 1, "sum over size-0 dim");
    EXPECT(r, EM_F32, "sum over size-0 dim", 0, 0, 0);
    r = em_sum(e, NULL, 0, false);
    check_shape(r, NULL, 0, "sum all size-0");
    EXPECT(r, EM_F32, "sum all size-0", 0);
    r = em_sum(e, DIMS(1), false);
    check_shape(r, SHAPE(0), 1, "sum keeping the size-0 dim");
    em_tensor_release(r);
    EXPECT(em_prod(e, DIMS(0), false), EM_F32, "prod over size-0 dim", 1, 1, 1);
    EXPECT(em_any(e, DIMS(0), false), EM_BOOL, "any over size-0", 0, 0, 0);
    EXPECT(em_all(e, DIMS(0), false), EM_BOOL, "all over size-0", 1, 1, 1);
    EXPECT(em_logsumexp(e, DIMS(0), false), EM_F32, "logsumexp over size-0", -INFINITY, -INFINITY, -INFINITY);
    EXPECT(em_mean(e, DIMS(0), false), EM_F32, "mean over size-0 (nan)", NAN, NAN, NAN);
    EXPECT(em_sum(em_zeros(SHAPE(0), 1, EM_I32), NULL, 0, false), EM_I64, "int sum of nothing", 0);
    /* max over a size-0 dim has no identity: error naming the shape */
    em_clear_error();
    em_test_assert_error(em_max(e, DIMS(0), false), "[0, 3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_min(e, NULL, 0, false), "[0, 3]", NULL);
    em_test_assert_error(em_argmax(e, 0, false), "[0, 3]", NULL);
    em_test_assert_error(em_argmin(e, -2, true), "[0, 3]", NULL);
    /* ... but over the other dim it is fine (empty result) */
    r = em_max(e, DIMS(1), false);
    assert_non_null(r);
    check_shape(r, SHAPE(0), 1, "max keeping the size-0 dim");
    em_tensor_release(r);
    r = em_argmax(e, 1, true);
    assert_non_null(r);
    check_shape(r, SHAPE(0, 1), 2, "argmax keeping the size-0 dim");
    em_tensor_release(r);
    em_scope_end();
}

static void test_dim_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_clear_error();
    em_test_assert_error(em_sum(x, DIMS(2), false), "dim 2", "[2, 3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    em_test_assert_error(em_sum(x, DIMS(-3), false), "dim -3", NULL);
    em_test_assert_error(em_mean(x, DIMS(0, 7), false), "dim 7", NULL);
    em_test_assert_error(em_max(x, DIMS(5), true), "dim 5", NULL);
    em_test_assert_error(em_var(x, DIMS(-9), 1, false), "dim -9", NULL);
    em_test_assert_error(em_logsumexp(x, DIMS(2), false), "dim 2", NULL);
    em_test_assert_error(em_any(x, DIMS(3), false), "dim 3", NULL);
    em_test_assert_error(em_argmin(x, -3, false), "dim -3", NULL);
    em_test_assert_error(em_softmax(x, 2), "dim 2", NULL);
    em_test_assert_error(em_log_softmax(x, -3), "dim -3", NULL);
    em_test_assert_error(em_sum(em_scalar(1, EM_F32), DIMS(1), false), "dim 1", NULL);
    /* repeated dims, also when spelled differently */
    em_test_assert_error(em_sum(x, DIMS(1, 1), false), "dim 1", NULL);
    em_test_assert_error(em_sum(x, DIMS(1, -1), false), "more than once", NULL);
    em_test_assert_error(em_mean(x, DIMS(0, -2), false), "more than once", NULL);
    em_test_assert_error(em_prod(x, DIMS(0, 1, 0), false), "more than once", NULL);
    em_test_assert_error(em_sum(x, NULL, 1, false), "NULL", NULL);
    em_scope_end();
}

/* ---- softmax ------------------------------------------------------------------- */

static void ref_softmax(const double *x, int rows, int cols, int dim, bool log_form, double *out)
{
    int L = dim == 1 ? cols : rows, M = dim == 1 ? rows : cols;
    for (int m = 0; m < M; m++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < L; j++) mx = fmax(mx, dim == 1 ? x[m * cols + j] : x[j * cols + m]);
        for (int j = 0; j < L; j++) s += exp((dim == 1 ? x[m * cols + j] : x[j * cols + m]) - mx);
        for (int j = 0; j < L; j++) {
            int idx = dim == 1 ? m * cols + j : j * cols + m;
            out[idx] = log_form ? x[idx] - mx - log(s) : exp(x[idx] - mx) / s;
        }
    }
}

static void test_softmax(void **state)
{
    (void)state;
    em_scope_begin();
    const double xv[6] = {1, 2, 3, -1, 0, 4};
    for (int dt = 0; dt < 2; dt++) {
        em_dtype d = dt ? EM_F64 : EM_F32;
        double tol = dt ? 1e-14 : 2e-6;
        em_tensor *x = em_test_make(d, xv, SHAPE(2, 3), 2);
        for (int dim = 0; dim < 2; dim++)
            for (int lf = 0; lf < 2; lf++) {
                double want[6];
                ref_softmax(xv, 2, 3, dim, lf, want);
                char what[64];
                snprintf(what, sizeof what, "%s(%s, dim %d)", lf ? "log_softmax" : "softmax", em_dtype_name(d), dim);
                em_tensor *r = lf ? em_log_softmax(x, dim) : em_softmax(x, dim - 2); /* also negative dims */
                check_shape(r, SHAPE(2, 3), 2, what);
                em_test_expect(r, d, want, 6, tol, tol, what);
            }
        /* rows sum to 1 */
        em_tensor *s = em_sum(em_softmax(x, 1), DIMS(1), false);
        em_test_expect(s, d, VALS(1, 1), tol, 0, "softmax rows sum to 1");
        s = em_sum(em_softmax(x, 0), DIMS(0), false);
        em_test_expect(s, d, VALS(1, 1, 1), tol, 0, "softmax columns sum to 1");
        /* exp(log_softmax) == softmax */
        em_tensor *a = em_exp(em_log_softmax(x, 1)), *b = em_softmax(x, 1);
        double *va = em_test_values(a), *vb = em_test_values(b);
        for (int i = 0; i < 6; i++) assert_true(fabs(va[i] - vb[i]) < 1e-6);
        free(va);
        free(vb);
    }
    em_scope_end();
}

static void test_softmax_stability(void **state)
{
    (void)state;
    em_scope_begin();
    /* 1000s do not overflow */
    em_tensor *x = F32((2, 3), 1000, 1001, 1002, -1000, -1001, -1002);
    double z = 1 + exp(-1.0) + exp(-2.0);
    em_test_expect(em_softmax(x, 1), EM_F32, VALS(exp(-2.0) / z, exp(-1.0) / z, 1 / z, 1 / z, exp(-1.0) / z, exp(-2.0) / z), 1e-6,
           1e-7, "softmax of 1000s");
    em_test_expect(em_log_softmax(x, 1), EM_F32,
           VALS(-2 - log(z), -1 - log(z), -log(z), -log(z), -1 - log(z), -2 - log(z)), 1e-6, 1e-6, "log_softmax of 1000s");
    em_test_expect(em_softmax(x, 0), EM_F32, VALS(1, 1, 1, 0, 0, 0), 0, 1e-7, "softmax dim 0 of +-1000");
    em_test_expect(em_log_softmax(x, 0), EM_F32, VALS(0, 0, 0, -2000, -2002, -2004), 1e-6, 1e-6, "log_softmax dim 0 of +-1000");
    /* -inf entries (masked attention): zero probability, -inf log-probability */
    em_tensor *m = F32((2, 3), -INFINITY, 0, 0, 1, -INFINITY, 1);
    em_test_expect(em_softmax(m, 1), EM_F32, VALS(0, 0.5, 0.5, 0.5, 0, 0.5), 1e-6, 0, "softmax with -inf");
    em_test_expect(em_log_softmax(m, 1), EM_F32, VALS(-INFINITY, -log(2.0), -log(2.0), -log(2.0), -INFINITY, -log(2.0)), 1e-6, 0,
           "log_softmax with -inf");
    /* a fully masked row gives nan, as in PyTorch */
    em_test_expect(em_softmax(F32((1, 2), -INFINITY, -INFINITY), 1), EM_F32, VALS(NAN, NAN), 0, 0, "softmax all -inf");
    /* f64 extremes */
    em_tensor *d = F64((3), 1e300, 0, -1e300);
    em_test_expect(em_softmax(d, 0), EM_F64, VALS(1, 0, 0), 0, 0, "softmax f64 extremes");
    em_scope_end();
}

static void test_softmax_misc(void **state)
{
    (void)state;
    em_scope_begin();
    /* int input -> f32 */
    em_tensor *i = T(EM_I32, (3), 0, 0, 0);
    em_test_expect(em_softmax(i, 0), EM_F32, VALS(1.0 / 3, 1.0 / 3, 1.0 / 3), 1e-6, 0, "softmax(i32)");
    /* 0-d: softmax is 1, log_softmax 0 */
    em_test_expect(em_softmax(em_scalar(5, EM_F32), 0), EM_F32, VALS(1), 0, 0, "softmax 0-d");
    em_test_expect(em_log_softmax(em_scalar(5, EM_F32), -1), EM_F32, VALS(0), 0, 0, "log_softmax 0-d");
    /* 3-D along the middle dim */
    double xv[24];
    data234(xv);
    em_tensor *x = em_test_make(EM_F64, xv, SHAPE(2, 3, 4), 3);
    em_tensor *s = em_softmax(x, 1);
    check_shape(s, SHAPE(2, 3, 4), 3, "softmax 3-D");
    double *v = em_test_values(s);
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 4; c++) {
            double mx = -INFINITY, z = 0;
            for (int b = 0; b < 3; b++) mx = fmax(mx, xv[a * 12 + b * 4 + c]);
            for (int b = 0; b < 3; b++) z += exp(xv[a * 12 + b * 4 + c] - mx);
            for (int b = 0; b < 3; b++) {
                double want = exp(xv[a * 12 + b * 4 + c] - mx) / z;
                if (fabs(v[a * 12 + b * 4 + c] - want) > 1e-14) fail_msg("softmax 3-D [%d,%d,%d]", a, b, c);
            }
        }
    free(v);
    /* a length-1 softmax dim gives ones */
    em_test_expect(em_softmax(F32((2, 1), 3, -7), 1), EM_F32, VALS(1, 1), 0, 0, "softmax over size-1 dim");
    em_scope_end();
}

/* ---- non-contiguous inputs ------------------------------------------------------ */

static void test_strided_inputs(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *xt = em_transpose(x, 0, 1); /* [3,2]: 1 4 / 2 5 / 3 6 */
    assert_non_null(xt);
    assert_false(em_tensor_is_contiguous(xt));
    em_tensor *r = em_sum(xt, DIMS(0), false);
    check_shape(r, SHAPE(2), 1, "sum(transpose) dim 0");
    EXPECT(r, EM_F32, "sum(transpose) dim 0", 6, 15);
    r = em_sum(xt, DIMS(1), true);
    check_shape(r, SHAPE(3, 1), 2, "sum(transpose) dim 1");
    EXPECT(r, EM_F32, "sum(transpose) dim 1", 5, 7, 9);
    EXPECT(em_sum_all(xt), EM_F32, "sum_all(transpose)", 21);
    EXPECT(em_max(xt, DIMS(1), false), EM_F32, "max(transpose)", 4, 5, 6);
    EXPECT(em_argmax(xt, 0, false), EM_I64, "argmax(transpose)", 2, 2);
    EXPECT(em_argmin(xt, 1, false), EM_I64, "argmin(transpose)", 0, 0, 0);
    EXPECT(em_mean(xt, DIMS(0), false), EM_F32, "mean(transpose)", 2, 5);
    EXPECT(em_prod(xt, DIMS(1), false), EM_F32, "prod(transpose)", 4, 10, 18);
    em_test_expect(em_var(xt, DIMS(0), 1, false), EM_F32, VALS(1, 1), 1e-6, 0, "var(transpose)");
    double z0 = exp(1.0) + exp(2.0) + exp(3.0), z1 = exp(4.0) + exp(5.0) + exp(6.0);
    em_test_expect(em_softmax(xt, 0), EM_F32, VALS(exp(1.0) / z0, exp(4.0) / z1, exp(2.0) / z0, exp(5.0) / z1, exp(3.0) / z0, exp(6.0) / z1),
           1e-6, 1e-7, "softmax(transpose) dim 0");
    em_test_expect(em_log_softmax(xt, 1), EM_F32,
           VALS(1 - 4 - log(1 + exp(-3.0)), -log(1 + exp(-3.0)), 2 - 5 - log(1 + exp(-3.0)), -log(1 + exp(-3.0)),
                3 - 6 - log(1 + exp(-3.0)), -log(1 + exp(-3.0))),
           1e-6, 1e-6, "log_softmax(transpose) dim 1");
    em_test_expect(em_logsumexp(xt, DIMS(0), false), EM_F32, VALS(log(z0), log(z1)), 1e-6, 0, "logsumexp(transpose)");

    /* 3-D permutation against the reference */
    double d[24];
    data234(d);
    em_tensor *t = em_test_make(EM_F64, d, SHAPE(2, 3, 4), 3);
    em_tensor *p = em_transpose(t, 0, 2); /* [4,3,2] */
    double pd[24];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++) pd[(a * 3 + b) * 2 + c] = d[c * 12 + b * 4 + a];
    for (int subset = 1; subset < 8; subset++) {
        bool mask[3];
        int dims[3], nd = 0;
        for (int k = 0; k < 3; k++) {
            mask[k] = subset >> k & 1;
            if (mask[k]) dims[nd++] = k;
        }
        double want[24];
        int64_t n = ref_reduce(pd, SHAPE(4, 3, 2), 3, mask, R_SUM, want);
        em_test_expect(em_sum(p, dims, nd, false), EM_F64, want, n, 1e-14, 1e-14, "sum(transpose 3-D)");
        n = ref_reduce(pd, SHAPE(4, 3, 2), 3, mask, R_MAX, want);
        em_test_expect(em_max(p, dims, nd, true), EM_F64, want, n, 0, 0, "max(transpose 3-D)");
        n = ref_reduce(pd, SHAPE(4, 3, 2), 3, mask, R_VAR1, want);
        em_test_expect(em_var(p, dims, nd, 1, false), EM_F64, want, n, 1e-13, 1e-13, "var(transpose 3-D)");
    }

    /* slices (offset + step) */
    em_tensor *v = F32((10), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9);
    em_tensor *odd = em_slice(v, 0, 1, 10, 2); /* 1 3 5 7 9 */
    EXPECT(em_sum_all(odd), EM_F32, "sum(odd slice)", 25);
    EXPECT(em_argmax(odd, 0, false), EM_I64, "argmax(odd slice)", 4);
    EXPECT(em_min(em_slice(v, 0, 4, 7, 1), NULL, 0, false), EM_F32, "min(v[4:7])", 4);
    em_tensor *cols = em_slice(x, 1, 0, 3, 2); /* [2,2]: 1 3 / 4 6 */
    EXPECT(em_sum(cols, DIMS(1), false), EM_F32, "sum(column slice)", 4, 10);
    em_test_expect(em_softmax(em_slice(x, 1, 1, 2, 1), 0), EM_F32, VALS(1 / (1 + exp(3.0)), 1 / (1 + exp(-3.0))), 1e-6, 1e-7,
           "softmax(column)");
    /* expanded (stride-0) input */
    em_tensor *ex = em_expand(F32((1, 3), 1, 2, 3), SHAPE(4, 3), 2);
    assert_non_null(ex);
    EXPECT(em_sum(ex, DIMS(0), false), EM_F32, "sum(expand) dim 0", 4, 8, 12);
    EXPECT(em_sum(ex, DIMS(1), false), EM_F32, "sum(expand) dim 1", 6, 6, 6, 6);
    EXPECT(em_argmax(ex, 0, false), EM_I64, "argmax(expand) ties", 0, 0, 0);
    em_test_expect(em_var(ex, DIMS(0), 1, false), EM_F32, VALS(0, 0, 0), 0, 0, "var(expand)");
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_table_f32),
        cmocka_unit_test(test_reduce_table_f64),
        cmocka_unit_test(test_sum_mean_basic),
        cmocka_unit_test(test_int_reductions),
        cmocka_unit_test(test_argmax_argmin),
        cmocka_unit_test(test_var_std),
        cmocka_unit_test(test_logsumexp),
        cmocka_unit_test(test_any_all),
        cmocka_unit_test(test_nan_propagation),
        cmocka_unit_test(test_zero_size),
        cmocka_unit_test(test_dim_errors),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_softmax_stability),
        cmocka_unit_test(test_softmax_misc),
        cmocka_unit_test(test_strided_inputs),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
