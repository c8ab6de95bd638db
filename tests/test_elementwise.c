/* Tests of element-wise ops: unary math, tensor-scalar, binary with
 * broadcasting, dtype promotion, comparisons/logical ops, where, masked_fill,
 * and strided (view) inputs. Reference values come from C math in double. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------- */


/* Checks values + dtype of r against want[n], then releases r. */
#define EXPECT(r, dt, what, ...) em_test_expect(r, dt, VALS(__VA_ARGS__), 0, 0, what)

static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

/* ---- reference functions (double) -------------------------------------------- */

static double r_neg(double x) { return -x; }
static double r_sign(double x) { return (x > 0) - (x < 0); }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_recip(double x) { return 1 / x; }
static double r_square(double x) { return x * x; }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0; }
static double r_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double r_round(double x)
{
    /* half to even, written out (not via the FPU rounding mode) */
    double f = floor(x), d = x - f;
    if (d > 0.5) return f + 1;
    if (d < 0.5) return f;
    return fmod(f, 2) == 0 ? f : f + 1;
}
static double r_clamp(double x) { return x < -1 ? -1 : x > 2 ? 2 : x; }
static double r_pow3(double x) { return x * x * x; }
static double r_pow2(double x) { return x * x; }
static double r_pow_half(double x) { return sqrt(x); }
static double r_pow_m1(double x) { return 1 / x; }
static double r_pow_15(double x) { return pow(x, 1.5); }
static double r_leaky(double x) { return x >= 0 ? x : 0.1 * x; }
static double r_elu(double x) { return x > 0 ? x : 1.5 * (exp(x) - 1); }
static double r_lnot(double x) { return x == 0; }

static em_tensor *f_clamp(const em_tensor *a) { return em_clamp(a, -1, 2); }
static em_tensor *f_pow3(const em_tensor *a) { return em_pow_scalar(a, 3); }
static em_tensor *f_pow2(const em_tensor *a) { return em_pow_scalar(a, 2); }
static em_tensor *f_pow_half(const em_tensor *a) { return em_pow_scalar(a, 0.5); }
static em_tensor *f_pow_m1(const em_tensor *a) { return em_pow_scalar(a, -1); }
static em_tensor *f_pow_15(const em_tensor *a) { return em_pow_scalar(a, 1.5); }
static em_tensor *f_leaky(const em_tensor *a) { return em_leaky_relu(a, 0.1); }
static em_tensor *f_elu(const em_tensor *a) { return em_elu(a, 1.5); }

typedef struct unary_case {
    const char *name;
    em_tensor *(*fn)(const em_tensor *);
    double (*ref)(double);
    bool to_bool;
} unary_case;

static const unary_case UNARY[] = {
    {"neg", em_neg, r_neg, false},
    {"abs", em_abs, fabs, false},
    {"sign", em_sign, r_sign, false},
    {"exp", em_exp, exp, false},
    {"log", em_log, log, false},
    {"log1p", em_log1p, log1p, false},
    {"sqrt", em_sqrt, sqrt, false},
    {"rsqrt", em_rsqrt, r_rsqrt, false},
    {"reciprocal", em_reciprocal, r_recip, false},
    {"square", em_square, r_square, false},
    {"sin", em_sin, sin, false},
    {"cos", em_cos, cos, false},
    {"tanh", em_tanh, tanh, false},
    {"sigmoid", em_sigmoid, r_sigmoid, false},
    {"relu", em_relu, r_relu, false},
    {"gelu", em_gelu, r_gelu, false},
    {"gelu_tanh", em_gelu_tanh, r_gelu_tanh, false},
    {"silu", em_silu, r_silu, false},
    {"softplus", em_softplus, r_softplus, false},
    {"erf", em_erf, erf, false},
    {"floor", em_floor, floor, false},
    {"ceil", em_ceil, ceil, false},
    {"round", em_round, r_round, false},
    {"clamp(-1,2)", f_clamp, r_clamp, false},
    {"pow_scalar(3)", f_pow3, r_pow3, false},
    {"pow_scalar(2)", f_pow2, r_pow2, false},
    {"pow_scalar(0.5)", f_pow_half, r_pow_half, false},
    {"pow_scalar(-1)", f_pow_m1, r_pow_m1, false},
    {"pow_scalar(1.5)", f_pow_15, r_pow_15, false},
    {"leaky_relu(0.1)", f_leaky, r_leaky, false},
    {"elu(1.5)", f_elu, r_elu, false},
    {"logical_not", em_logical_not, r_lnot, true},
};
#define N_UNARY ((int)(sizeof UNARY / sizeof UNARY[0]))

/* negatives, zero, halves (rounding), large magnitudes (overflow/stability) */
static const double XS[] = {-100, -30, -3.7, -2.5, -1.5, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 1.5, 2.5, 3.7, 30, 100};
#define NX ((int64_t)(sizeof XS / sizeof XS[0]))

static void run_unary_table(em_dtype dt, double rtol, double atol)
{
    em_tensor *x = em_test_make(dt, XS, &(int64_t){NX}, 1);
    for (int c = 0; c < N_UNARY; c++) {
        double want[NX];
        for (int64_t i = 0; i < NX; i++) {
            double xi = dt == EM_F32 ? (double)(float)XS[i] : XS[i];
            double r = UNARY[c].ref(xi);
            want[i] = (dt == EM_F32 && !UNARY[c].to_bool) ? (double)(float)r : r; /* overflow to inf as f32 does */
        }
        char what[64];
        snprintf(what, sizeof what, "%s(%s)", UNARY[c].name, em_dtype_name(dt));
        em_tensor *r = UNARY[c].fn(x);
        em_test_assert_shape(r, 1, &(int64_t){NX});
        em_test_expect(r, UNARY[c].to_bool ? EM_BOOL : dt, want, NX, rtol, atol, what);
    }
    em_tensor_release(x);
}

static void test_unary_f32(void **state)
{
    (void)state;
    run_unary_table(EM_F32, 2e-6, 1e-6);
}

static void test_unary_f64(void **state)
{
    (void)state;
    run_unary_table(EM_F64, 1e-13, 1e-14);
}

static void test_unary_2d_shape(void **state)
{
    (void)state;
    em_tensor *x = F32((2, 3), -1, 0, 1, 2, -2, 3);
    em_tensor *r = em_relu(x);
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    EXPECT(r, EM_F32, "relu 2d", 0, 0, 1, 2, 0, 3);
    em_tensor *s = em_scalar(-2.5, EM_F32);
    em_tensor *sa = em_abs(s);
    assert_int_equal(em_tensor_ndim(sa), 0);
    EXPECT(sa, EM_F32, "abs 0-d", 2.5);
    em_tensor *e = em_zeros(SHAPE(0, 3), 2, EM_F32);
    em_tensor *ee = em_exp(e);
    em_test_assert_shape(ee, 2, SHAPE(0, 3));
    em_tensor_release(ee);
    em_tensor_release(e);
    em_tensor_release(s);
    em_tensor_release(x);
}

static void test_stability(void **state)
{
    (void)state;
    em_tensor *x = F32((4), -100, 100, -1000, 1000);
    /* sigmoid, softplus, silu never overflow to nan */
    em_test_expect(em_sigmoid(x), EM_F32, VALS(1 / (1 + exp(100.0)), 1, 0, 1), 1e-6, 1e-44, "sigmoid");
    em_test_expect(em_softplus(x), EM_F32, VALS(exp(-100.0), 100, 0, 1000), 1e-6, 1e-30, "softplus");
    em_test_expect(em_silu(x), EM_F32, VALS(-100 * exp(-100.0), 100, -0.0, 1000), 1e-6, 1e-30, "silu");
    em_test_expect(em_tanh(x), EM_F32, VALS(-1, 1, -1, 1), 0, 0, "tanh");
    em_test_expect(em_gelu(x), EM_F32, VALS(-0.0, 100, -0.0, 1000), 0, 1e-30, "gelu");
    em_test_expect(em_exp(x), EM_F32, VALS((double)(float)exp(-100.0), INFINITY, 0, INFINITY), 1e-5, 1e-44, "exp");
    em_tensor *d = F64((4), -100, 100, -1000, 1000);
    em_test_expect(em_sigmoid(d), EM_F64, VALS(1 / (1 + exp(100.0)), 1, 0, 1), 1e-14, 0, "sigmoid f64");
    em_test_expect(em_softplus(d), EM_F64, VALS(log1p(exp(-100.0)), 100, 0, 1000), 1e-14, 0, "softplus f64");
    em_tensor_release(x);
    em_tensor_release(d);
}

static void test_round_half_even(void **state)
{
    (void)state;
    em_tensor *x = F32((10), 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 2.4, 2.6, -2.6);
    EXPECT(em_round(x), EM_F32, "round", 0, 2, 2, 4, -0.0, -2, -2, 2, 3, -3);
    EXPECT(em_floor(x), EM_F32, "floor", 0, 1, 2, 3, -1, -2, -3, 2, 2, -3);
    EXPECT(em_ceil(x), EM_F32, "ceil", 1, 2, 3, 4, -0.0, -1, -2, 3, 3, -2);
    em_tensor *d = F64((3), 0.5, 1.5, 2.5);
    EXPECT(em_round(d), EM_F64, "round f64", 0, 2, 2);
    em_tensor_release(x);
    em_tensor_release(d);
}

static void test_unary_int_inputs(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *i = T(EM_I32, (4), -2, 0, 1, 4);
    em_tensor *l = T(EM_I64, (3), 0, 1, 4);
    em_tensor *u = T(EM_U8, (3), 0, 1, 4);
    em_tensor *b = T(EM_BOOL, (2), 0, 1);
    /* float math promotes to f32 */
    em_test_expect(em_exp(i), EM_F32, VALS(exp(-2.0), 1, exp(1.0), exp(4.0)), 1e-6, 0, "exp(i32)");
    EXPECT(em_sqrt(l), EM_F32, "sqrt(i64)", 0, 1, 2);
    EXPECT(em_sqrt(u), EM_F32, "sqrt(u8)", 0, 1, 2);
    em_test_expect(em_sigmoid(b), EM_F32, VALS(0.5, 1 / (1 + exp(-1.0))), 1e-6, 0, "sigmoid(bool)");
    EXPECT(em_reciprocal(l), EM_F32, "reciprocal(i64)", INFINITY, 1, 0.25);
    em_test_expect(em_log(i), EM_F32, VALS(NAN, -INFINITY, 0, log(4.0)), 1e-6, 0, "log(i32)");
    em_test_expect(em_tanh(i), EM_F32, VALS(tanh(-2.0), 0, tanh(1.0), tanh(4.0)), 1e-6, 0, "tanh(i32)");
    em_test_expect(em_gelu(l), EM_F32, VALS(0, r_gelu(1), r_gelu(4)), 1e-6, 0, "gelu(i64)");
    em_test_expect(em_elu(i, 1.0), EM_F32, VALS(exp(-2.0) - 1, 0, 1, 4), 1e-6, 0, "elu(i32)");
    /* integer-preserving ops keep the dtype */
    EXPECT(em_neg(i), EM_I32, "neg(i32)", 2, 0, -1, -4);
    EXPECT(em_abs(i), EM_I32, "abs(i32)", 2, 0, 1, 4);
    EXPECT(em_sign(i), EM_I32, "sign(i32)", -1, 0, 1, 1);
    EXPECT(em_square(i), EM_I32, "square(i32)", 4, 0, 1, 16);
    EXPECT(em_relu(i), EM_I32, "relu(i32)", 0, 0, 1, 4);
    EXPECT(em_floor(i), EM_I32, "floor(i32)", -2, 0, 1, 4);
    EXPECT(em_round(l), EM_I64, "round(i64)", 0, 1, 4);
    EXPECT(em_clamp(i, -1, 2), EM_I32, "clamp(i32)", -1, 0, 1, 2);
    EXPECT(em_clamp(i, -INFINITY, 2), EM_I32, "clamp(i32, -inf, 2)", -2, 0, 1, 2);
    EXPECT(em_clamp(i, 0, INFINITY), EM_I32, "clamp(i32, 0, inf)", 0, 0, 1, 4);
    EXPECT(em_pow_scalar(i, 2), EM_I32, "pow(i32, 2)", 4, 0, 1, 16);
    EXPECT(em_pow_scalar(l, 3), EM_I64, "pow(i64, 3)", 0, 1, 64);
    EXPECT(em_pow_scalar(l, 0.5), EM_F32, "pow(i64, 0.5)", 0, 1, 2);
    EXPECT(em_logical_not(i), EM_BOOL, "logical_not(i32)", 0, 1, 0, 0);
    EXPECT(em_logical_not(b), EM_BOOL, "logical_not(bool)", 1, 0);
    /* a scalar an integer kernel cannot take ((T)s undefined: +-inf, out of
     * range) promotes to f32, as a non-integral one does */
    EXPECT(em_add_scalar(i, INFINITY), EM_F32, "add_scalar(i32, inf)", INFINITY, INFINITY, INFINITY, INFINITY);
    EXPECT(em_add_scalar(i, 1e10), EM_F32, "add_scalar(i32, 1e10)", 1e10, 1e10, 1e10, 1e10);
    EXPECT(em_maximum_scalar(i, 1e10), EM_F32, "maximum_scalar(i32, 1e10)", 1e10, 1e10, 1e10, 1e10);
    EXPECT(em_clamp(i, 1e10, 1e11), EM_F32, "clamp(i32, 1e10, 1e11)", 1e10, 1e10, 1e10, 1e10);
    EXPECT(em_pow_scalar(i, INFINITY), EM_F32, "pow(i32, inf)", INFINITY, 0, 1, INFINITY);
    EXPECT(em_add_scalar(l, 1e18), EM_I64, "add_scalar(i64, 1e18)", 1e18, 1e18 + 1, 1e18 + 4);
    /* bool with an integer scalar computes in i64 (a bool holds only 0 and 1) */
    EXPECT(em_maximum_scalar(b, 5), EM_I64, "maximum_scalar(bool, 5)", 5, 5);
    EXPECT(em_clamp(b, 3, 7), EM_I64, "clamp(bool, 3, 7)", 3, 3);
    em_tensor_release(i);
    em_tensor_release(l);
    em_tensor_release(u);
    em_tensor_release(b);
    em_scope_end();
}

/* ---- tensor-scalar ----------------------------------------------------------- */

static void test_scalar_ops_float(void **state)
{
    (void)state;
    em_tensor *x = F32((5), -3, -1.5, 0, 2, 4);
    EXPECT(em_add_scalar(x, 1.5), EM_F32, "add_scalar", -1.5, 0, 1.5, 3.5, 5.5);
    EXPECT(em_sub_scalar(x, 1.5), EM_F32, "sub_scalar", -4.5, -3, -1.5, 0.5, 2.5);
    EXPECT(em_rsub_scalar(x, 1), EM_F32, "rsub_scalar", 4, 2.5, 1, -1, -3);
    EXPECT(em_mul_scalar(x, -2), EM_F32, "mul_scalar", 6, 3, -0.0, -4, -8);
    EXPECT(em_div_scalar(x, 4), EM_F32, "div_scalar", -0.75, -0.375, 0, 0.5, 1);
    EXPECT(em_div_scalar(x, 0), EM_F32, "div_scalar 0", -INFINITY, -INFINITY, NAN, INFINITY, INFINITY);
    EXPECT(em_maximum_scalar(x, 0), EM_F32, "maximum_scalar", 0, 0, 0, 2, 4);
    EXPECT(em_minimum_scalar(x, 0), EM_F32, "minimum_scalar", -3, -1.5, 0, 0, 0);
    EXPECT(em_remainder_scalar(x, 2), EM_F32, "remainder_scalar(2)", 1, 0.5, 0, 0, 0);
    EXPECT(em_remainder_scalar(x, -2), EM_F32, "remainder_scalar(-2)", -1, -1.5, 0, 0, 0);
    EXPECT(em_remainder_scalar(x, 2.5), EM_F32, "remainder_scalar(2.5)", 2, 1, 0, 2, 1.5);
    EXPECT(em_eq_scalar(x, 2), EM_BOOL, "eq_scalar", 0, 0, 0, 1, 0);
    EXPECT(em_ne_scalar(x, 2), EM_BOOL, "ne_scalar", 1, 1, 1, 0, 1);
    EXPECT(em_lt_scalar(x, 0), EM_BOOL, "lt_scalar", 1, 1, 0, 0, 0);
    EXPECT(em_le_scalar(x, 0), EM_BOOL, "le_scalar", 1, 1, 1, 0, 0);
    EXPECT(em_gt_scalar(x, 0), EM_BOOL, "gt_scalar", 0, 0, 0, 1, 1);
    EXPECT(em_ge_scalar(x, 2), EM_BOOL, "ge_scalar", 0, 0, 0, 1, 1);
    em_tensor *n = F32((2), NAN, 1);
    EXPECT(em_maximum_scalar(n, 0), EM_F32, "maximum_scalar nan", NAN, 1);
    EXPECT(em_minimum_scalar(n, 5), EM_F32, "minimum_scalar nan", NAN, 1);
    EXPECT(em_eq_scalar(n, NAN), EM_BOOL, "eq nan", 0, 0);
    EXPECT(em_ne_scalar(n, NAN), EM_BOOL, "ne nan", 1, 1);
    em_tensor *d = F64((3), 1e300, -2, 0.1);
    em_test_expect(em_mul_scalar(d, 10), EM_F64, VALS(1e301, -20, 1.0), 1e-15, 0, "mul_scalar f64");
    em_test_expect(em_add_scalar(d, 0.2), EM_F64, VALS(1e300, -1.8, 0.1 + 0.2), 1e-15, 0, "add_scalar f64");
    em_tensor_release(x);
    em_tensor_release(n);
    em_tensor_release(d);
}

static void test_scalar_ops_int(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = T(EM_I32, (5), -3, -1, 0, 2, 7);
    EXPECT(em_add_scalar(x, 2), EM_I32, "add_scalar(i32, 2)", -1, 1, 2, 4, 9);
    EXPECT(em_add_scalar(x, 0.5), EM_F32, "add_scalar(i32, 0.5)", -2.5, -0.5, 0.5, 2.5, 7.5);
    EXPECT(em_sub_scalar(x, 3), EM_I32, "sub_scalar(i32)", -6, -4, -3, -1, 4);
    EXPECT(em_rsub_scalar(x, 10), EM_I32, "rsub_scalar(i32)", 13, 11, 10, 8, 3);
    EXPECT(em_rsub_scalar(x, 0.5), EM_F32, "rsub_scalar(i32, 0.5)", 3.5, 1.5, 0.5, -1.5, -6.5);
    EXPECT(em_mul_scalar(x, -3), EM_I32, "mul_scalar(i32)", 9, 3, 0, -6, -21);
    EXPECT(em_mul_scalar(x, 0.5), EM_F32, "mul_scalar(i32, 0.5)", -1.5, -0.5, 0, 1, 3.5);
    EXPECT(em_div_scalar(x, 2), EM_F32, "div_scalar(i32) is true division", -1.5, -0.5, 0, 1, 3.5);
    EXPECT(em_maximum_scalar(x, 0), EM_I32, "maximum_scalar(i32)", 0, 0, 0, 2, 7);
    EXPECT(em_minimum_scalar(x, 0), EM_I32, "minimum_scalar(i32)", -3, -1, 0, 0, 0);
    EXPECT(em_remainder_scalar(x, 2), EM_I32, "remainder_scalar(i32, 2)", 1, 1, 0, 0, 1);
    EXPECT(em_remainder_scalar(x, -2), EM_I32, "remainder_scalar(i32, -2)", -1, -1, 0, 0, -1);
    EXPECT(em_remainder_scalar(x, 3), EM_I32, "remainder_scalar(i32, 3)", 0, 2, 0, 2, 1);
    EXPECT(em_eq_scalar(x, 2), EM_BOOL, "eq_scalar(i32)", 0, 0, 0, 1, 0);
    EXPECT(em_lt_scalar(x, 0), EM_BOOL, "lt_scalar(i32)", 1, 1, 0, 0, 0);
    EXPECT(em_lt_scalar(x, 1.5), EM_BOOL, "lt_scalar(i32, 1.5)", 1, 1, 1, 0, 0);
    EXPECT(em_ge_scalar(x, -0.5), EM_BOOL, "ge_scalar(i32, -0.5)", 0, 0, 1, 1, 1);
    EXPECT(em_gt_scalar(x, 2), EM_BOOL, "gt_scalar(i32)", 0, 0, 0, 0, 1);
    EXPECT(em_le_scalar(x, -1), EM_BOOL, "le_scalar(i32)", 1, 1, 0, 0, 0);
    EXPECT(em_ne_scalar(x, 0), EM_BOOL, "ne_scalar(i32)", 1, 1, 0, 1, 1);
    em_tensor *l = T(EM_I64, (2), 4611686018427387904.0, -5); /* 2^62: integer math stays exact */
    EXPECT(em_add_scalar(l, 1), EM_I64, "add_scalar(i64)", 4611686018427387905.0, -4);
    int64_t big[2];
    em_tensor *lb = em_add_scalar(l, 1);
    assert_int_equal(em_to_host(lb, big, sizeof big), EM_OK);
    assert_true(big[0] == ((int64_t)1 << 62) + 1);
    assert_true(big[1] == -4);
    em_tensor_release(lb);
    em_tensor *b = T(EM_BOOL, (2), 0, 1);
    EXPECT(em_add_scalar(b, 1), EM_I64, "add_scalar(bool, 1)", 1, 2);
    EXPECT(em_mul_scalar(b, 0.5), EM_F32, "mul_scalar(bool, 0.5)", 0, 0.5);
    EXPECT(em_eq_scalar(b, 1), EM_BOOL, "eq_scalar(bool)", 0, 1);
    em_tensor *u = T(EM_U8, (3), 0, 5, 250);
    EXPECT(em_add_scalar(u, 10), EM_U8, "add_scalar(u8) wraps", 10, 15, 4);
    em_tensor_release(x);
    em_tensor_release(l);
    em_tensor_release(b);
    em_tensor_release(u);
    em_scope_end();
}

/* ---- binary -------------------------------------------------------------------- */

static const double A8[] = {-3, -2.5, -1, 0, 1, 2, 3, 7.5};
static const double B8[] = {2, -2, 3, 1, -4, 2, -2, 0.5};

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_max(double a, double b) { return a > b ? a : b; }
static double r_min(double a, double b) { return a < b ? a : b; }
static double r_rem(double a, double b) { return a - b * floor(a / b); } /* Python's % */
static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_lt(double a, double b) { return a < b; }
static double r_le(double a, double b) { return a <= b; }
static double r_gt(double a, double b) { return a > b; }
static double r_ge(double a, double b) { return a >= b; }
static double r_and(double a, double b) { return a != 0 && b != 0; }
static double r_or(double a, double b) { return a != 0 || b != 0; }

typedef struct binary_case {
    const char *name;
    em_tensor *(*fn)(const em_tensor *, const em_tensor *);
    double (*ref)(double, double);
    bool to_bool;
} binary_case;

static const binary_case BINARY[] = {
    {"add", em_add, r_add, false},       {"sub", em_sub, r_sub, false},
    {"mul", em_mul, r_mul, false},       {"div", em_div, r_div, false},
    {"pow", em_pow, pow, false},         {"maximum", em_maximum, r_max, false},
    {"minimum", em_minimum, r_min, false}, {"remainder", em_remainder, r_rem, false},
    {"eq", em_eq, r_eq, true},           {"ne", em_ne, r_ne, true},
    {"lt", em_lt, r_lt, true},           {"le", em_le, r_le, true},
    {"gt", em_gt, r_gt, true},           {"ge", em_ge, r_ge, true},
    {"logical_and", em_logical_and, r_and, true}, {"logical_or", em_logical_or, r_or, true},
};
#define N_BINARY ((int)(sizeof BINARY / sizeof BINARY[0]))

static void run_binary_table(em_dtype dt, double rtol)
{
    em_tensor *a = em_test_make(dt, A8, SHAPE(8), 1), *b = em_test_make(dt, B8, SHAPE(8), 1);
    for (int c = 0; c < N_BINARY; c++) {
        double want[8];
        for (int i = 0; i < 8; i++) {
            double r = BINARY[c].ref(A8[i], B8[i]);
            want[i] = (dt == EM_F32 && !BINARY[c].to_bool) ? (double)(float)r : r;
        }
        char what[64];
        snprintf(what, sizeof what, "%s(%s)", BINARY[c].name, em_dtype_name(dt));
        em_test_expect(BINARY[c].fn(a, b), BINARY[c].to_bool ? EM_BOOL : dt, want, 8, rtol, 0, what);
    }
    em_tensor_release(a);
    em_tensor_release(b);
}

static void test_binary_f32(void **state)
{
    (void)state;
    run_binary_table(EM_F32, 1e-6);
}

static void test_binary_f64(void **state)
{
    (void)state;
    run_binary_table(EM_F64, 1e-15);
}

static void test_binary_special_values(void **state)
{
    (void)state;
    em_tensor *a = F32((5), 1, -1, 0, NAN, 2);
    em_tensor *b = F32((5), 0, 0, 0, 1, NAN);
    EXPECT(em_div(a, b), EM_F32, "div by 0", INFINITY, -INFINITY, NAN, NAN, NAN);
    EXPECT(em_maximum(a, b), EM_F32, "maximum nan", 1, 0, 0, NAN, NAN);
    EXPECT(em_minimum(a, b), EM_F32, "minimum nan", 0, -1, 0, NAN, NAN);
    EXPECT(em_eq(a, b), EM_BOOL, "eq nan", 0, 0, 1, 0, 0);
    EXPECT(em_ne(a, b), EM_BOOL, "ne nan", 1, 1, 0, 1, 1);
    EXPECT(em_remainder(a, b), EM_F32, "remainder by 0", NAN, NAN, NAN, NAN, NAN);
    em_tensor *p = F32((4), 2, 0, -2, 4), *e = F32((4), -1, 0, 3, 0.5);
    EXPECT(em_pow(p, e), EM_F32, "pow", 0.5, 1, -8, 2);
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(p);
    em_tensor_release(e);
}

static void test_binary_int(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = T(EM_I32, (6), -3, 3, -7, 7, 5, 0), *b = T(EM_I32, (6), 2, -2, 2, -3, 5, 4);
    EXPECT(em_add(a, b), EM_I32, "add(i32)", -1, 1, -5, 4, 10, 4);
    EXPECT(em_sub(a, b), EM_I32, "sub(i32)", -5, 5, -9, 10, 0, -4);
    EXPECT(em_mul(a, b), EM_I32, "mul(i32)", -6, -6, -14, -21, 25, 0);
    em_test_expect(em_div(a, b), EM_F32, VALS(-1.5, -1.5, -3.5, -7.0 / 3, 1, 0), 1e-6, 0, "div(i32) true division");
    EXPECT(em_maximum(a, b), EM_I32, "maximum(i32)", 2, 3, 2, 7, 5, 4);
    EXPECT(em_minimum(a, b), EM_I32, "minimum(i32)", -3, -2, -7, -3, 5, 0);
    /* Python-sign remainder: remainder(-3, 2) = 1, remainder(3, -2) = -1 */
    EXPECT(em_remainder(a, b), EM_I32, "remainder(i32)", 1, -1, 1, -2, 0, 0);
    EXPECT(em_eq(a, b), EM_BOOL, "eq(i32)", 0, 0, 0, 0, 1, 0);
    EXPECT(em_lt(a, b), EM_BOOL, "lt(i32)", 1, 0, 1, 0, 0, 1);
    EXPECT(em_ge(a, b), EM_BOOL, "ge(i32)", 0, 1, 0, 1, 1, 0);
    EXPECT(em_logical_and(a, b), EM_BOOL, "logical_and(i32)", 1, 1, 1, 1, 1, 0);
    EXPECT(em_logical_or(a, T(EM_I32, (6), 0, 0, 0, 0, 0, 0)), EM_BOOL, "logical_or(i32)", 1, 1, 1, 1, 1, 0);
    em_tensor *fa = F32((4), -3, 3, -3.5, 5.25), *fb = F32((4), 2, -2, 2, -2);
    EXPECT(em_remainder(fa, fb), EM_F32, "remainder(f32)", 1, -1, 0.5, -0.75);
    const int64_t p53 = ((int64_t)1 << 53) + 1;
    em_tensor *la = em_from_host((const int64_t[]){p53, -p53}, SHAPE(2), 1, EM_I64), *lb = T(EM_I64, (2), 0, 1);
    int64_t out[2];
    em_tensor *ls = em_add(la, lb);
    em_test_check_dtype(ls, EM_I64, "add(i64)");
    assert_int_equal(em_to_host(ls, out, sizeof out), EM_OK);
    assert_true(out[0] == ((int64_t)1 << 53) + 1); /* no detour through double */
    assert_true(out[1] == -((int64_t)1 << 53));
    em_tensor_release(ls);
    em_tensor *u1 = T(EM_U8, (2), 200, 3), *u2 = T(EM_U8, (2), 100, 5);
    EXPECT(em_add(u1, u2), EM_U8, "add(u8) wraps", 44, 8);
    EXPECT(em_sub(u1, u2), EM_U8, "sub(u8) wraps", 100, 254);
    em_tensor *all[] = {a, b, fa, fb, la, lb, u1, u2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
    em_scope_end();
}

/* The element-wise kinds added with #13, at the edges, against values printed
 * by torch 1.13 (float64; -0.0 is checked as 0: em_test_expect compares values). */
static void test_new_kinds_edges(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *f = F64((10), -7.5, -7.5, 7.5, 7.5, 5.0, -0.0, 1.0, -1.0, INFINITY, 3.0);
    em_tensor *g = F64((10), 2.0, -2.0, 2.0, -2.0, 0.0, 3.0, 0.0, 0.0, 2.0, INFINITY);
    /* torch.div(f, g, rounding_mode="floor") and torch.fmod(f, g) */
    EXPECT(em_floor_divide(f, g), EM_F64, "floor_divide(f64)", -4, 3, 3, -4, INFINITY, 0, INFINITY, -INFINITY, NAN, 0);
    EXPECT(em_fmod(f, g), EM_F64, "fmod(f64)", -1.5, -1.5, 1.5, 1.5, NAN, 0, NAN, NAN, NAN, 3);
    double z[1];
    em_tensor *zq = em_floor_divide(F64((1), -0.0), F64((1), 3.0));
    assert_int_equal(em_to_host(zq, z, sizeof z), EM_OK);
    assert_true(z[0] == 0 && signbit(z[0])); /* -0.0 // 3 = -0.0, as Python */
    em_tensor *i = T(EM_I64, (6), -7, -7, 7, 7, 0, -1), *j = T(EM_I64, (6), 2, -2, 2, -2, 3, 3);
    EXPECT(em_floor_divide(i, j), EM_I64, "floor_divide(i64)", -4, 3, 3, -4, 0, -1);
    EXPECT(em_fmod(i, j), EM_I64, "fmod(i64)", -1, -1, 1, 1, 0, -1);
    /* integer division by zero: the CPU kernel's sticky error, reported by the next read (PyTorch raises) */
    {
        em_tensor *q = em_floor_divide(T(EM_I32, (2), 5, -5), T(EM_I32, (2), 0, 0));
        int32_t qv[2];
        if (em_get_device().kind == EM_DEVICE_CPU) assert_int_equal(em_to_host(q, qv, sizeof qv), EM_ERR_INVALID);
        else em_to_host(q, qv, sizeof qv); /* CUDA / OpenCL: 0, no error */
    }
    EXPECT(em_trunc(F64((4), -2.7, -0.5, 0.5, 2.7)), EM_F64, "trunc", -2, 0, 0, 2);
    EXPECT(em_trunc(T(EM_I32, (2), -3, 4)), EM_I32, "trunc(i32)", -3, 4);
    em_test_expect(em_erfinv(F64((6), -1.0, 1.0, 1.5, 0.0, 0.5, -0.999)), EM_F64,
                   VALS(-INFINITY, INFINITY, NAN, 0.0, 0.4769362762044699, -2.3267537655135153), 1e-14, 0, "erfinv(f64)");
    /* f32: against the exact values of the f32 inputs (torch.erfinv in float64);
     * torch's own f32 result is 3.9e-6 off at 0.999999, ours 2.6e-7 at most */
    em_test_expect(em_erfinv(F32((3), 0.3f, -0.9f, 0.999999f)), EM_F32,
                   VALS(0.2724627261055238, -1.163087071945772, 3.4570747260298265), 5e-7, 0, "erfinv(f32)");
    em_test_expect(em_atan2(F64((5), 1.0, -1.0, 0.0, -0.0, 1.0), F64((5), -1.0, -1.0, -1.0, -1.0, 0.0)), EM_F64,
                   VALS(2.356194490192345, -2.356194490192345, M_PI, -M_PI, M_PI / 2), 1e-15, 0, "atan2");
    em_test_expect(em_atan2(T(EM_I32, (1), 1), T(EM_I32, (1), 1)), EM_F32, VALS(M_PI / 4), 1e-7, 0, "atan2(i32) -> f32");
    em_tensor *x = F64((6), -4.0, -3.0, -1.0, 0.0, 3.0, 4.0);
    em_test_expect(em_hardswish(x), EM_F64, VALS(0, 0, -0.3333333333333333, 0, 3, 4), 1e-15, 0, "hardswish");
    em_test_expect(em_hardsigmoid(x), EM_F64, VALS(0, 0, 0.3333333333333333, 0.5, 1, 1), 1e-15, 0, "hardsigmoid");
    em_test_expect(em_logsigmoid(F64((3), -100.0, 0.0, 100.0)), EM_F64, VALS(-100.0, -0.6931471805599453, -3.720075976020836e-44),
                   1e-14, 0, "logsigmoid (stable at both ends)");
    em_test_expect(em_mish(F64((3), -30.0, 0.0, 30.0)), EM_F64, VALS(-2.807286890651921e-12, 0.0, 30.0), 1e-12, 0, "mish");
    assert_null(em_celu(x, 0.0));
    assert_non_null(strstr(em_last_error(), "alpha"));
    em_scope_end();
}

static void test_logical_bool(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = T(EM_BOOL, (4), 0, 0, 1, 1), *b = T(EM_BOOL, (4), 0, 1, 0, 1);
    EXPECT(em_logical_and(a, b), EM_BOOL, "and", 0, 0, 0, 1);
    EXPECT(em_logical_or(a, b), EM_BOOL, "or", 0, 1, 1, 1);
    EXPECT(em_logical_not(a), EM_BOOL, "not", 1, 1, 0, 0);
    EXPECT(em_eq(a, b), EM_BOOL, "eq(bool)", 1, 0, 0, 1);
    EXPECT(em_ne(a, b), EM_BOOL, "ne(bool)", 0, 1, 1, 0);
    EXPECT(em_lt(a, b), EM_BOOL, "lt(bool)", 0, 1, 0, 0);
    /* float inputs: non-zero is true, nan is true */
    em_tensor *f = F32((4), 0, -0.5, NAN, 0), *g = F32((4), 2, 0, 1, 0);
    EXPECT(em_logical_and(f, g), EM_BOOL, "and(f32)", 0, 0, 1, 0);
    EXPECT(em_logical_or(f, g), EM_BOOL, "or(f32)", 1, 1, 1, 0);
    EXPECT(em_logical_not(f), EM_BOOL, "not(f32)", 1, 0, 0, 1);
    /* mixed dtypes */
    EXPECT(em_logical_and(a, g), EM_BOOL, "and(bool, f32)", 0, 0, 1, 0);
    em_tensor *all[] = {a, b, f, g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
    em_scope_end();
}

/* ---- broadcasting ------------------------------------------------------------- */

static void test_broadcast(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *c31 = F32((3, 1), 1, 2, 3), *r14 = F32((1, 4), 10, 20, 30, 40);
    em_tensor *r = em_add(c31, r14);
    em_test_assert_shape(r, 2, SHAPE(3, 4));
    EXPECT(r, EM_F32, "[3,1]+[1,4]", 11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43);
    r = em_sub(r14, c31);
    em_test_assert_shape(r, 2, SHAPE(3, 4));
    EXPECT(r, EM_F32, "[1,4]-[3,1]", 9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37);

    em_tensor *m23 = F32((2, 3), 1, 2, 3, 4, 5, 6), *v3 = F32((3), 10, 20, 30);
    r = em_add(m23, v3);
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    EXPECT(r, EM_F32, "[2,3]+[3]", 11, 22, 33, 14, 25, 36);
    r = em_div(v3, m23);
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    em_test_expect(r, EM_F32, VALS(10, 10, 10, 2.5, 4, 5), 1e-6, 0, "[3]/[2,3]");

    em_tensor *s = em_scalar(2, EM_F32), *m22 = F32((2, 2), 1, 2, 3, 4);
    r = em_mul(s, m22);
    em_test_assert_shape(r, 2, SHAPE(2, 2));
    EXPECT(r, EM_F32, "0-d * [2,2]", 2, 4, 6, 8);
    r = em_sub(m22, s);
    EXPECT(r, EM_F32, "[2,2] - 0-d", -1, 0, 1, 2);
    r = em_add(s, s);
    assert_int_equal(em_tensor_ndim(r), 0);
    EXPECT(r, EM_F32, "0-d + 0-d", 4);

    em_tensor *one = F32((1), 5), *five = F32((5), 1, 2, 3, 4, 5);
    r = em_add(one, five);
    em_test_assert_shape(r, 1, SHAPE(5));
    EXPECT(r, EM_F32, "[1]+[5]", 6, 7, 8, 9, 10);
    r = em_ge(five, one);
    em_test_assert_shape(r, 1, SHAPE(5));
    EXPECT(r, EM_BOOL, "[5]>=[1]", 0, 0, 0, 0, 1);

    /* size-0 dims */
    em_tensor *z03 = em_zeros(SHAPE(0, 3), 2, EM_F32), *o13 = F32((1, 3), 1, 2, 3);
    r = em_add(z03, o13);
    em_test_assert_shape(r, 2, SHAPE(0, 3));
    assert_int_equal(em_tensor_numel(r), 0);
    em_tensor_release(r);
    em_tensor *z30 = em_zeros(SHAPE(3, 0), 2, EM_F32), *c31b = F32((3, 1), 1, 2, 3);
    r = em_mul(c31b, z30);
    em_test_assert_shape(r, 2, SHAPE(3, 0));
    em_tensor_release(r);

    /* rank-3 broadcast of both operands: [2,1,3] + [4,1] -> [2,4,3] */
    em_tensor *x213 = F32((2, 1, 3), 0, 1, 2, 3, 4, 5), *y41 = F32((4, 1), 0, 10, 20, 30);
    r = em_add(x213, y41);
    em_test_assert_shape(r, 3, SHAPE(2, 4, 3));
    double want[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++) want[(i * 4 + j) * 3 + k] = (i * 3 + k) + 10 * j;
    em_test_expect(r, EM_F32, want, 24, 0, 0, "[2,1,3]+[4,1]");

    /* incompatible shapes name both shapes */
    em_tensor *m24 = em_zeros(SHAPE(2, 4), 2, EM_F32);
    em_clear_error();
    em_test_assert_error(em_add(m23, m24), "[2, 3]", "[2, 4]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_mul(m23, F32((2), 1, 2)), "[2, 3]", "[2]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_eq(z03, m23), "[0, 3]", "[2, 3]", NULL);
    em_test_assert_error(em_where(T(EM_BOOL, (4), 1, 0, 1, 0), m23, m23), "[4]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);

    em_tensor *all[] = {c31, r14, m23, v3, s, m22, one, five, z03, o13, z30, c31b, x213, y41, m24};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
    em_scope_end();
}

/* ---- dtype promotion ---------------------------------------------------------- */

static void test_promotion(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *i32 = T(EM_I32, (2), 3, -4), *i64 = T(EM_I64, (2), 10, 20), *f32 = F32((2), 0.5, 0.25),
              *f64 = F64((2), 0.125, 1e-10), *u8 = T(EM_U8, (2), 250, 1), *bl = T(EM_BOOL, (2), 1, 0),
              *bl2 = T(EM_BOOL, (2), 1, 1);
    em_test_expect(em_add(i32, f32), EM_F32, VALS(3.5, -3.75), 0, 0, "i32+f32");
    em_test_expect(em_add(f32, i32), EM_F32, VALS(3.5, -3.75), 0, 0, "f32+i32");
    em_test_expect(em_add(i32, i64), EM_I64, VALS(13, 16), 0, 0, "i32+i64");
    em_test_expect(em_add(bl, bl2), EM_BOOL, VALS(1, 1), 0, 0, "bool+bool");
    em_test_expect(em_mul(bl, bl2), EM_BOOL, VALS(1, 0), 0, 0, "bool*bool");
    em_test_expect(em_add(u8, i32), EM_I32, VALS(253, -3), 0, 0, "u8+i32 (no u8 wrap)");
    em_test_expect(em_add(u8, bl), EM_U8, VALS(251, 1), 0, 0, "u8+bool");
    em_test_expect(em_add(bl, i32), EM_I32, VALS(4, -4), 0, 0, "bool+i32");
    em_test_expect(em_div(i32, T(EM_I32, (2), 2, 8)), EM_F32, VALS(1.5, -0.5), 0, 0, "i32/i32");
    em_test_expect(em_div(i64, i64), EM_F32, VALS(1, 1), 0, 0, "i64/i64");
    em_test_expect(em_lt(i32, f32), EM_BOOL, VALS(0, 1), 0, 0, "i32<f32");
    em_test_expect(em_eq(f32, f64), EM_BOOL, VALS(0, 0), 0, 0, "f32==f64");
    em_test_expect(em_add(f32, f64), EM_F64, VALS(0.625, 0.25 + 1e-10), 1e-15, 0, "f32+f64");
    em_test_expect(em_add(i64, f32), EM_F32, VALS(10.5, 20.25), 0, 0, "i64+f32");
    em_test_expect(em_mul(i64, f64), EM_F64, VALS(1.25, 2e-9), 1e-15, 0, "i64*f64");
    em_test_expect(em_maximum(u8, i64), EM_I64, VALS(250, 20), 0, 0, "maximum(u8,i64)");
    em_test_expect(em_sub(f64, u8), EM_F64, VALS(0.125 - 250, 1e-10 - 1), 1e-15, 0, "f64-u8");
    em_test_expect(em_where(bl, i32, f32), EM_F32, VALS(3, 0.25), 0, 0, "where(i32, f32)");
    em_test_expect(em_where(bl, i32, i64), EM_I64, VALS(3, 20), 0, 0, "where(i32, i64)");
    em_test_expect(em_where(bl, f32, f64), EM_F64, VALS(0.5, 1e-10), 1e-15, 0, "where(f32, f64)");
    em_scope_end();
}

/* ---- where / masked_fill ------------------------------------------------------- */

static void test_where(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *m = T(EM_BOOL, (2, 3), 1, 0, 1, 0, 1, 0);
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6), *b = F32((2, 3), -1, -2, -3, -4, -5, -6);
    EXPECT(em_where(m, a, b), EM_F32, "where", 1, -2, 3, -4, 5, -6);
    /* broadcast mask [2,1] and scalar b */
    em_tensor *mc = T(EM_BOOL, (2, 1), 1, 0);
    em_tensor *r = em_where(mc, a, em_scalar(0, EM_F32));
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    em_test_expect(r, EM_F32, VALS(1, 2, 3, 0, 0, 0), 0, 0, "where [2,1] mask");
    /* mask [3] against [2,1] a and [1,3] b: all three broadcast to [2,3] */
    em_tensor *m3 = T(EM_BOOL, (3), 0, 1, 0), *a21 = F32((2, 1), 7, 8), *b13 = F32((1, 3), 0, 10, 20);
    r = em_where(m3, a21, b13);
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    em_test_expect(r, EM_F32, VALS(0, 7, 20, 0, 8, 20), 0, 0, "where all broadcast");
    /* mask from a comparison; f64 and i64 payloads */
    em_tensor *x = F64((4), -1, 2, -3, 4);
    em_test_expect(em_where(em_gt_scalar(x, 0), x, em_neg(x)), EM_F64, VALS(1, 2, 3, 4), 0, 0, "abs via where");
    em_tensor *li = em_from_host((const int64_t[]){((int64_t)1 << 53) + 1, 1, 2}, SHAPE(3), 1, EM_I64);
    int64_t got[3];
    em_tensor *wl = em_where(T(EM_BOOL, (3), 1, 0, 0), li, T(EM_I64, (3), 0, 5, 6));
    assert_int_equal(em_to_host(wl, got, sizeof got), EM_OK);
    assert_true(got[0] == ((int64_t)1 << 53) + 1 && got[1] == 5 && got[2] == 6);
    em_tensor *bb = em_where(T(EM_BOOL, (2), 1, 0), T(EM_BOOL, (2), 0, 0), T(EM_BOOL, (2), 1, 1));
    em_test_expect(bb, EM_BOOL, VALS(0, 1), 0, 0, "where(bool)");
    em_scope_end();
}

static void test_masked_fill(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *m = T(EM_BOOL, (2, 3), 0, 1, 0, 1, 0, 0);
    em_tensor *r = em_masked_fill(a, m, -INFINITY);
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    em_test_expect(r, EM_F32, VALS(1, -INFINITY, 3, -INFINITY, 5, 6), 0, 0, "masked_fill");
    em_tensor *m13 = T(EM_BOOL, (1, 3), 1, 0, 1);
    em_test_expect(em_masked_fill(a, m13, 0.5), EM_F32, VALS(0.5, 2, 0.5, 0.5, 5, 0.5), 0, 0, "masked_fill [1,3] mask");
    em_tensor *i = T(EM_I32, (3), 1, 2, 3);
    em_test_expect(em_masked_fill(i, T(EM_BOOL, (3), 1, 0, 0), 9), EM_I32, VALS(9, 2, 3), 0, 0, "masked_fill(i32)");
    em_test_expect(em_masked_fill(a, em_scalar(1, EM_BOOL), 7), EM_F32, VALS(7, 7, 7, 7, 7, 7), 0, 0, "masked_fill 0-d mask");
    /* a itself is unchanged */
    em_test_expect(em_contiguous(a), EM_F32, VALS(1, 2, 3, 4, 5, 6), 0, 0, "input unchanged");

    em_clear_error();
    em_test_assert_error(em_masked_fill(a, F32((2, 3), 0, 1, 0, 1, 0, 0), 0), "bool", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_masked_fill(a, T(EM_I64, (3), 0, 1, 0), 0), "int64", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    /* the mask must broadcast to a's shape (not the other way round) */
    em_test_assert_error(em_masked_fill(F32((3), 1, 2, 3), T(EM_BOOL, (2, 3), 1, 1, 1, 1, 1, 1), 0), "[2, 3]", "[3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_masked_fill(a, T(EM_BOOL, (2), 1, 0), 0), "[2]", NULL);
    em_scope_end();
}

/* ---- errors ------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = F32((2), 1, 2);
    em_clear_error();
    em_test_assert_error(em_add(NULL, x), "em_add", NULL);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    em_test_assert_error(em_exp(NULL), "em_exp", NULL);
    em_test_assert_error(em_clamp(x, 2, 1), "em_clamp", NULL);
    em_test_assert_error(em_neg(T(EM_BOOL, (2), 1, 0)), "bool", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_exp(em_zeros(SHAPE(2), 1, EM_DTYPE_COUNT)), NULL); /* creation fails, exp(NULL) fails cleanly */
    em_test_assert_error(em_add(x, em_add(x, F32((3), 1, 2, 3))), NULL);
    assert_msg_has("em_add");
    em_scope_end();
}

/* ---- strided (view) inputs ----------------------------------------------------- */

static void test_view_inputs(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6);
    em_tensor *at = em_transpose(a, 0, 1); /* [3,2]: 1 4 / 2 5 / 3 6 */
    assert_non_null(at);
    em_test_assert_shape(at, 2, SHAPE(3, 2));
    assert_false(em_tensor_is_contiguous(at));
    EXPECT(em_neg(at), EM_F32, "neg(transpose)", -1, -4, -2, -5, -3, -6);
    em_test_expect(em_exp(at), EM_F32, VALS(exp(1.0), exp(4.0), exp(2.0), exp(5.0), exp(3.0), exp(6.0)), 1e-6, 0, "exp(transpose)");
    em_tensor *b = F32((3, 2), 10, 20, 30, 40, 50, 60);
    EXPECT(em_add(at, b), EM_F32, "transpose + contiguous", 11, 24, 32, 45, 53, 66);
    EXPECT(em_add(b, at), EM_F32, "contiguous + transpose", 11, 24, 32, 45, 53, 66);
    EXPECT(em_mul(at, at), EM_F32, "transpose * transpose", 1, 16, 4, 25, 9, 36);
    /* transpose broadcast against a row */
    EXPECT(em_sub(at, F32((2), 1, 4)), EM_F32, "transpose - row", 0, 0, 1, 1, 2, 2);
    /* cast of a strided view */
    EXPECT(em_add(at, T(EM_I32, (3, 2), 1, 1, 1, 1, 1, 1)), EM_F32, "transpose + i32", 2, 5, 3, 6, 4, 7);
    em_tensor *ai = T(EM_I32, (2, 3), 1, 2, 3, 4, 5, 6);
    em_test_expect(em_sqrt(em_transpose(ai, 0, 1)), EM_F32, VALS(1, 2, sqrt(2.0), sqrt(5.0), sqrt(3.0), sqrt(6.0)), 1e-6, 0,
           "sqrt(i32 transpose)");

    /* slices with an offset and a step */
    em_tensor *v = F32((8), 0, 1, 2, 3, 4, 5, 6, 7);
    em_tensor *odd = em_slice(v, 0, 1, 8, 2); /* 1 3 5 7 */
    em_tensor *even = em_slice(v, 0, 0, 8, 2);
    assert_non_null(odd);
    assert_non_null(even);
    EXPECT(em_add(odd, even), EM_F32, "odd + even", 1, 5, 9, 13);
    EXPECT(em_square(odd), EM_F32, "square(odd)", 1, 9, 25, 49);
    EXPECT(em_gt(odd, F32((4), 2, 2, 6, 6)), EM_BOOL, "gt(odd)", 0, 1, 0, 1);
    em_tensor *tail = em_slice(v, 0, 5, 8, 1); /* offset 5 */
    EXPECT(em_mul_scalar(tail, 2), EM_F32, "mul_scalar(tail)", 10, 12, 14);
    em_tensor *col = em_slice(a, 1, 1, 2, 1); /* [2,1]: 2 5 */
    em_tensor *r = em_add(col, F32((1, 3), 0, 10, 20));
    em_test_assert_shape(r, 2, SHAPE(2, 3));
    EXPECT(r, EM_F32, "column slice broadcast", 2, 12, 22, 5, 15, 25);
    em_tensor *mask = em_slice(T(EM_BOOL, (4), 1, 0, 0, 1), 0, 0, 4, 3); /* [1, 1] */
    EXPECT(em_where(mask, F32((2), 1, 2), F32((2), -1, -2)), EM_F32, "where(strided mask)", 1, 2);
    /* slice of a transpose */
    em_tensor *ts = em_slice(at, 0, 1, 3, 1); /* rows 1..2 of [3,2]: 2 5 / 3 6 */
    EXPECT(em_add_scalar(ts, 0.5), EM_F32, "slice of transpose", 2.5, 5.5, 3.5, 6.5);
    /* expanded (stride-0) input */
    em_tensor *ex = em_expand(F32((1, 3), 1, 2, 3), SHAPE(2, 3), 2);
    assert_non_null(ex);
    EXPECT(em_mul(ex, a), EM_F32, "expand * a", 1, 4, 9, 4, 10, 18);
    EXPECT(em_relu(em_neg(ex)), EM_F32, "relu(neg(expand))", 0, 0, 0, 0, 0, 0);
    /* the inputs were not modified */
    EXPECT(em_contiguous(a), EM_F32, "a unchanged", 1, 2, 3, 4, 5, 6);
    EXPECT(em_contiguous(v), EM_F32, "v unchanged", 0, 1, 2, 3, 4, 5, 6, 7);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_f32),
        cmocka_unit_test(test_unary_f64),
        cmocka_unit_test(test_unary_2d_shape),
        cmocka_unit_test(test_stability),
        cmocka_unit_test(test_round_half_even),
        cmocka_unit_test(test_unary_int_inputs),
        cmocka_unit_test(test_scalar_ops_float),
        cmocka_unit_test(test_scalar_ops_int),
        cmocka_unit_test(test_binary_f32),
        cmocka_unit_test(test_binary_f64),
        cmocka_unit_test(test_binary_special_values),
        cmocka_unit_test(test_binary_int),
        cmocka_unit_test(test_new_kinds_edges),
        cmocka_unit_test(test_logical_bool),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_promotion),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_masked_fill),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_view_inputs),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
