/* f16 / bf16 on CUDA (issue #15): the CUDA kernels that load and store the
 * 16-bit types themselves (copy/cast, unary, binary, where, fill, matmul,
 * conv, pool; devices/cuda/) against the CPU's on the same inputs, and the
 * f32 matmul precision setting (em_set_float32_matmul_precision).
 *
 * Casts, fills, where and the IEEE operations (+ - * /, neg, abs, relu,
 * comparisons, maximum) must give the CPU's bits; transcendental functions
 * within one 16-bit ulp (the device's float exp/tanh may differ from the
 * host libm's by a float ulp, which the rounding to 16 bits can push over a
 * rounding boundary); matmul within the rounding of the f32 sum (the CPU
 * widens it: f32 copies, f32 GEMM, rounding copy), conv2d and its data and
 * weight gradients likewise (the CPU widens them; CUDA runs cuDNN's 16-bit
 * convolutions, or its direct kernels under EMBER_CUDNN=0: the ctest entry
 * test_cuda_half_direct); pooling (max with its indices, avg, adaptive avg,
 * the avg gradient) must give the CPU's bits: float compute in the CPU's
 * order, one rounding. Operands cover contiguous
 * aligned tensors (the vectorised paths), odd lengths (their tails), an
 * unaligned narrow view, a transpose and a broadcast (the N-d paths).
 * Without a CUDA worker the device cases are skipped; the setter's own cases
 * run everywhere. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool g_cuda;

static int setup(void **state)
{
    int r = em_test_setup(state);
    g_cuda = em_worker_count(EM_DEVICE_CUDA) > 0;
    return r;
}

static void on(em_device_kind k)
{
    assert_int_equal(em_set_device(k == EM_DEVICE_CUDA ? em_device_cuda(0) : em_device_cpu()), EM_OK);
}

/* The bytes of t (any dtype, contiguous or a view: a contiguous copy first). */
static void *bytes_of(const em_tensor *t, size_t *n)
{
    em_scope_begin();
    em_tensor *c = em_contiguous(t);
    assert_non_null(c);
    *n = (size_t)em_tensor_numel(c) * em_dtype_size(em_tensor_dtype(c));
    void *buf = malloc(*n ? *n : 1);
    assert_non_null(buf);
    assert_int_equal(em_to_host(c, buf, *n), EM_OK);
    em_scope_end();
    return buf;
}

/* A NaN of dtype @p dt, from its bits (f16 / bf16; other dtypes: false). */
static bool nan_bits(em_dtype dt, unsigned long long b)
{
    if (dt == EM_F16) return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
    if (dt == EM_BF16) return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
    return false;
}

/* Bit equality; with @p nan_any two 16-bit NaNs match whatever their bits
 * (the NaN an arithmetic op makes is the device's: x86 and NVIDIA GPUs
 * differ in its sign, which f16 keeps). */
static void assert_bits(const em_tensor *cpu, const em_tensor *gpu, bool nan_any, const char *what)
{
    assert_non_null(cpu);
    assert_non_null(gpu);
    assert_int_equal(em_tensor_dtype(cpu), em_tensor_dtype(gpu));
    assert_int_equal(em_tensor_numel(cpu), em_tensor_numel(gpu));
    size_t n1, n2;
    unsigned char *a = bytes_of(cpu, &n1), *b = bytes_of(gpu, &n2);
    assert_int_equal(n1, n2);
    const size_t es = em_dtype_size(em_tensor_dtype(cpu));
    for (size_t i = 0; i < n1; i += es)
        if (memcmp(a + i, b + i, es)) {
            unsigned long long x = 0, y = 0;
            memcpy(&x, a + i, es);
            memcpy(&y, b + i, es);
            if (nan_any && nan_bits(em_tensor_dtype(cpu), x) && nan_bits(em_tensor_dtype(cpu), y)) continue;
            fail_msg("%s (%s): element %zu: CPU bits 0x%llx, CUDA 0x%llx", what, em_dtype_name(em_tensor_dtype(cpu)), i / es, x,
                     y);
        }
    free(a);
    free(b);
}
static void assert_same_bits(const em_tensor *cpu, const em_tensor *gpu, const char *what) { assert_bits(cpu, gpu, false, what); }

/* Values as doubles (any dtype). */
static double *values(const em_tensor *t)
{
    em_scope_begin();
    double *v = em_test_values(em_cast(t, EM_F64));
    em_scope_end();
    return v;
}

/* |cpu - gpu| <= ulps 16-bit ulps at the value (NaN matches NaN). */
static void assert_close_ulps(const em_tensor *cpu, const em_tensor *gpu, double ulps, const char *what)
{
    assert_non_null(cpu);
    assert_non_null(gpu);
    const em_dtype dt = em_tensor_dtype(cpu);
    assert_int_equal(dt, em_tensor_dtype(gpu));
    const double eps = dt == EM_BF16 ? 0x1p-7 : 0x1p-10; /* spacing at 1 */
    const int64_t n = em_tensor_numel(cpu);
    double *a = values(cpu), *b = values(gpu);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (a[i] == b[i]) continue;
        const double m = fmax(fabs(a[i]), fabs(b[i]));
        const double ulp = eps * (m > 0x1p-14 ? exp2(floor(log2(m))) : 0x1p-14);
        if (!(fabs(a[i] - b[i]) <= ulps * ulp))
            fail_msg("%s (%s): element %lld: CPU %.9g, CUDA %.9g", what, em_dtype_name(dt), (long long)i, a[i], b[i]);
    }
    free(a);
    free(b);
}

/* Bits of special f32 values: zeros, ones, f16 limits and ties, subnormals,
 * bf16 ties, infinities, NaNs with payloads. */
static const uint32_t k_special[] = {
    0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x3f000000u, 0x477fe000u, /* 65504 */
    0x477ff000u, /* 65520: f16 inf */ 0x477fefffu, 0x33800000u, /* 2^-24 */ 0x33000000u, /* 2^-25: tie to 0 */
    0x33000001u, 0x387fc000u, /* largest f16 subnormal */ 0x38800000u, 0x3f808000u, /* 1 + 2^-8: bf16 tie */
    0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
    0x7fa00000u, /* signalling NaN */ 0x3eaaaaabu, 0xc2c80000u, /* -100 */ 0x4479ffffu, 0x3a83126fu,
};
#define NSPECIAL ((int64_t)(sizeof k_special / sizeof k_special[0]))

/* Finite values within [-130, 130] (casts to integers are defined for them). */
static em_tensor *finite_f32(int64_t n, uint64_t seed)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    assert_non_null(v);
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) * 0x1p-53;
        v[i] = (float)(i % 7 == 0 ? floor(260 * u - 130) : 260 * u - 130); /* some integers (exact ties) */
    }
    em_tensor *t = em_from_host(v, (int64_t[]){n}, 1, EM_F32);
    free(v);
    return t;
}

static em_tensor *special_f32(void)
{
    return em_from_host(k_special, (int64_t[]){NSPECIAL}, 1, EM_F32);
}

static const em_dtype k_all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
static const em_dtype k_half[] = {EM_F16, EM_BF16};

/* ---- copy / cast ---------------------------------------------------------------- */

static void test_cast(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    em_scope_begin();
    on(EM_DEVICE_CPU);
    em_tensor *fin = finite_f32(1003, 1), *spec = special_f32();
    for (size_t i = 0; i < sizeof k_all / sizeof k_all[0]; i++)
        for (size_t j = 0; j < sizeof k_all / sizeof k_all[0]; j++) {
            const em_dtype s = k_all[i], d = k_all[j];
            if (s != EM_F16 && s != EM_BF16 && d != EM_F16 && d != EM_BF16) continue;
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", em_dtype_name(s), em_dtype_name(d));
            /* the source, made on the CPU: both sides start from its bits */
            on(EM_DEVICE_CPU);
            const bool float_to_int = em_dtype_is_float(s) && !em_dtype_is_float(d) && d != EM_BOOL;
            em_tensor *src = em_cast(em_dtype_is_float(s) && !float_to_int ? em_cat((em_tensor *[]){fin, spec}, 2, 0) : fin, s);
            assert_non_null(src);
            em_tensor *c = em_cast(src, d);
            on(EM_DEVICE_CUDA);
            em_tensor *g = em_cast(src, d);
            assert_same_bits(c, g, what);
            /* strided (every other element) and unaligned (offset 1) sources */
            em_tensor *sv = em_slice(src, 0, 1, em_tensor_dim(src, 0), 2);
            em_tensor *nv = em_narrow(src, 0, 1, em_tensor_dim(src, 0) - 1);
            em_tensor *g2 = em_cast(sv, d), *g3 = em_cast(nv, d);
            on(EM_DEVICE_CPU);
            assert_same_bits(em_cast(sv, d), g2, what);
            assert_same_bits(em_cast(nv, d), g3, what);
        }
    on(EM_DEVICE_CPU);
    em_scope_end();
}

/* ---- unary, binary, where ------------------------------------------------------- */

typedef em_tensor *(*op1_fn)(const em_tensor *);
typedef em_tensor *(*op2_fn)(const em_tensor *, const em_tensor *);

static em_tensor *sqrt_abs(const em_tensor *a) { return em_sqrt(em_abs(a)); }
static em_tensor *add_s(const em_tensor *a) { return em_add_scalar(a, 0.3); }
static em_tensor *mul_s(const em_tensor *a) { return em_mul_scalar(a, -1.7); }

static void check_unary(op1_fn f, const char *name, bool exact, em_tensor *x)
{
    on(EM_DEVICE_CPU);
    em_tensor *c = f(x);
    on(EM_DEVICE_CUDA);
    em_tensor *g = f(x);
    on(EM_DEVICE_CPU);
    if (exact) assert_bits(c, g, true, name);
    else assert_close_ulps(c, g, 1, name);
}

static void test_unary(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    static const struct {
        op1_fn f;
        const char *name;
        bool exact;
    } ops[] = {
        {em_neg, "neg", true},   {em_abs, "abs", true},    {em_relu, "relu", true},       {sqrt_abs, "sqrt(abs)", true},
        {add_s, "add_scalar", true}, {mul_s, "mul_scalar", true}, {em_exp, "exp", false}, {em_tanh, "tanh", false},
        {em_sigmoid, "sigmoid", false}, {em_gelu, "gelu", false},
    };
    em_scope_begin();
    on(EM_DEVICE_CPU);
    em_tensor *base = em_mul_scalar(finite_f32(4099, 2), 0.05); /* [-6.5, 6.5] */
    for (size_t h = 0; h < 2; h++) {
        em_tensor *x = em_cast(base, k_half[h]);
        em_tensor *xt = em_transpose(em_reshape(em_narrow(x, 0, 0, 4096), (int64_t[]){64, 64}, 2), 0, 1);
        em_tensor *xn = em_narrow(x, 0, 3, 4000);
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            check_unary(ops[i].f, ops[i].name, ops[i].exact, x);
            check_unary(ops[i].f, ops[i].name, ops[i].exact, xt);
            check_unary(ops[i].f, ops[i].name, ops[i].exact, xn);
        }
        /* comparisons give bool */
        on(EM_DEVICE_CPU);
        em_tensor *c = em_gt_scalar(x, 0.25);
        on(EM_DEVICE_CUDA);
        em_tensor *g = em_gt_scalar(x, 0.25);
        on(EM_DEVICE_CPU);
        assert_same_bits(c, g, "gt_scalar");
        /* specials through neg and abs */
        em_tensor *sp = em_cast(special_f32(), k_half[h]);
        check_unary(em_neg, "neg (specials)", true, sp);
        check_unary(em_abs, "abs (specials)", true, sp);
    }
    em_scope_end();
}

static void check_binary(op2_fn f, const char *name, em_tensor *a, em_tensor *b)
{
    on(EM_DEVICE_CPU);
    em_tensor *c = f(a, b);
    on(EM_DEVICE_CUDA);
    em_tensor *g = f(a, b);
    on(EM_DEVICE_CPU);
    assert_bits(c, g, true, name); /* x / 0 may make a NaN */
}

static void test_binary_where(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    static const struct {
        op2_fn f;
        const char *name;
    } ops[] = {{em_add, "add"}, {em_sub, "sub"}, {em_mul, "mul"}, {em_div, "div"}, {em_maximum, "maximum"}, {em_lt, "lt"},
               {em_eq, "eq"}};
    em_scope_begin();
    on(EM_DEVICE_CPU);
    for (size_t h = 0; h < 2; h++) {
        const em_dtype dt = k_half[h];
        em_tensor *a = em_cast(em_reshape(finite_f32(3 * 1001, 3), (int64_t[]){3, 1001}, 2), dt);
        em_tensor *b = em_cast(em_reshape(finite_f32(3 * 1001, 4), (int64_t[]){3, 1001}, 2), dt);
        em_tensor *row = em_cast(finite_f32(1001, 5), dt);          /* broadcast over the rows */
        em_tensor *an = em_narrow(a, 1, 1, 1000), *bn = em_narrow(b, 1, 0, 1000); /* unaligned */
        em_tensor *a8 = em_cast(finite_f32(4096, 6), dt), *b8 = em_cast(finite_f32(4096, 7), dt); /* aligned, 8 | n */
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            check_binary(ops[i].f, ops[i].name, a, b);
            check_binary(ops[i].f, ops[i].name, a, row);
            check_binary(ops[i].f, ops[i].name, an, bn);
            check_binary(ops[i].f, ops[i].name, a8, b8);
        }
        /* where: a bool mask, 2-byte elements */
        em_tensor *m = em_gt_scalar(a, 0);
        on(EM_DEVICE_CPU);
        em_tensor *c = em_where(m, a, b);
        on(EM_DEVICE_CUDA);
        em_tensor *g = em_where(m, a, b);
        on(EM_DEVICE_CPU);
        assert_same_bits(c, g, "where");
    }
    em_scope_end();
}

/* ---- fill ----------------------------------------------------------------------------- */

static void test_fill(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    em_scope_begin();
    for (size_t h = 0; h < 2; h++) {
        const em_dtype dt = k_half[h];
        em_tensor *c[8], *g[8];
        for (int side = 0; side < 2; side++) {
            on(side ? EM_DEVICE_CUDA : EM_DEVICE_CPU);
            em_tensor **o = side ? g : c;
            o[0] = em_full((int64_t[]){1001}, 1, dt, 3.14159265358979);
            o[1] = em_full((int64_t[]){1001}, 1, dt, 1e6); /* f16: inf */
            o[2] = em_arange(-3, 250, 0.37, dt);
            o[3] = em_linspace(-2, 7, 333, dt);
            o[4] = em_eye(13, 17, dt);
            em_manual_seed(42);
            o[5] = em_rand_uniform((int64_t[]){4097}, 1, dt, -2, 3);
            o[6] = em_rand_bernoulli((int64_t[]){4097}, 1, dt, 0.3);
            o[7] = em_rand_normal((int64_t[]){4097}, 1, dt, 1, 2);
        }
        on(EM_DEVICE_CPU);
        static const char *names[] = {"full", "full (overflow)", "arange", "linspace", "eye", "rand_uniform", "rand_bernoulli"};
        for (int i = 0; i < 7; i++) assert_same_bits(c[i], g[i], names[i]);
        assert_close_ulps(c[7], g[7], 1, "rand_normal");
    }
    em_scope_end();
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* max |cpu - gpu| / max |cpu| of two results of one shape */
static double rel_diff(const em_tensor *c, const em_tensor *g)
{
    assert_non_null(c);
    assert_non_null(g);
    assert_int_equal(em_tensor_dtype(c), em_tensor_dtype(g));
    const int64_t n = em_tensor_numel(c);
    assert_int_equal(n, em_tensor_numel(g));
    double *a = values(c), *b = values(g), d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs(a[i] - b[i]));
        m = fmax(m, fabs(a[i]));
    }
    free(a);
    free(b);
    return m > 0 ? d / m : d;
}

static void check_matmul(em_tensor *a, em_tensor *b, double tol, const char *what)
{
    on(EM_DEVICE_CPU);
    em_tensor *c = em_matmul(a, b);
    on(EM_DEVICE_CUDA);
    em_tensor *g = em_matmul(a, b);
    on(EM_DEVICE_CPU);
    assert_non_null(g);
    assert_int_equal(em_tensor_dtype(g), em_tensor_dtype(a));
    const double r = rel_diff(c, g);
    if (!(r <= tol)) fail_msg("%s (%s): max|CPU - CUDA| / max|CPU| = %.3g > %.3g", what, em_dtype_name(em_tensor_dtype(a)), r, tol);
}

static em_tensor *rnd(em_dtype dt, const int64_t *shape, int nd, uint64_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return em_cast(em_reshape(em_mul_scalar(finite_f32(n, seed), 1.0 / 130), shape, nd), dt);
}

static void test_matmul(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    em_scope_begin();
    on(EM_DEVICE_CPU);
    for (size_t h = 0; h < 2; h++) {
        const em_dtype dt = k_half[h];
        const double tol = dt == EM_BF16 ? 1.6e-2 : 2e-3; /* two roundings of C at most, differently summed */
        check_matmul(rnd(dt, (int64_t[]){64, 96}, 2, 10), rnd(dt, (int64_t[]){96, 48}, 2, 11), tol, "matmul 2-d");
        check_matmul(rnd(dt, (int64_t[]){3, 33, 17}, 3, 12), rnd(dt, (int64_t[]){3, 17, 29}, 3, 13), tol, "matmul batched");
        check_matmul(rnd(dt, (int64_t[]){2, 3, 8, 16}, 4, 14), rnd(dt, (int64_t[]){16, 8}, 2, 15), tol, "matmul broadcast B");
        check_matmul(rnd(dt, (int64_t[]){4, 1, 8, 16}, 4, 16), rnd(dt, (int64_t[]){3, 16, 5}, 3, 17), tol, "matmul broadcast A");
        check_matmul(em_transpose(rnd(dt, (int64_t[]){40, 24}, 2, 18), 0, 1), rnd(dt, (int64_t[]){40, 31}, 2, 19), tol,
                     "matmul A^T");
        check_matmul(rnd(dt, (int64_t[]){24, 40}, 2, 20), em_transpose(rnd(dt, (int64_t[]){31, 40}, 2, 21), 0, 1), tol,
                     "matmul B^T");
        check_matmul(rnd(dt, (int64_t[]){100}, 1, 22), rnd(dt, (int64_t[]){100, 7}, 2, 23), tol, "matmul vector");
        /* K = 0: zeros */
        on(EM_DEVICE_CUDA);
        em_tensor *z = em_matmul(em_zeros((int64_t[]){4, 0}, 2, dt), em_zeros((int64_t[]){0, 5}, 2, dt));
        on(EM_DEVICE_CPU);
        assert_non_null(z);
        double *zv = values(z);
        for (int i = 0; i < 20; i++) assert_true(zv[i] == 0);
        free(zv);
    }
    em_scope_end();
}

/* ---- conv2d and its gradients ------------------------------------------------------ */

/* One geometry: y = conv2d(x, w) and, through autograd of sum(y * r), dx
 * (CONV2D_BWD_DATA of r) and dw (CONV2D_BWD_WEIGHT of x and r), on the CPU
 * (widened: f32 conv of the same 16-bit inputs, each result rounded once) and
 * on CUDA (native 16-bit: f32 accumulation, one rounding); dy = 1 * r is
 * exact, so both backward convs see the same 16-bit operands. Tolerance
 * (max|CPU - CUDA| / max|CPU|): the two f32 sums differ in order (and
 * cuDNN's algorithm), so their roundings to 16 bits may land on neighbouring
 * values: one 16-bit ulp at the largest output is 2^-7 (bf16) / 2^-10 (f16)
 * of it at most; allowed 2e-2 (bf16) and 4e-3 (f16), a few ulps, for
 * algorithms whose transforms (Winograd, FFT) add their own rounding. */
static void check_conv(em_dtype dt, const int64_t *xs, const int64_t *ws, const em_conv_opts *o, uint64_t seed, const char *what)
{
    const double tol = dt == EM_BF16 ? 2e-2 : 4e-3;
    on(EM_DEVICE_CPU);
    em_tensor *x = rnd(dt, xs, 4, seed), *w = rnd(dt, ws, 4, seed + 1);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    assert_int_equal(em_set_requires_grad(w, true), EM_OK);
    em_tensor *y[2], *dx[2], *dw[2], *r = NULL;
    em_grads *g[2];
    for (int side = 0; side < 2; side++) {
        on(side ? EM_DEVICE_CUDA : EM_DEVICE_CPU);
        y[side] = em_conv2d(x, w, NULL, o);
        assert_non_null(y[side]);
        assert_int_equal(em_tensor_dtype(y[side]), dt);
        if (side == 0) r = rnd(dt, em_tensor_shape(y[0]), 4, seed + 2); /* on the CPU */
        g[side] = em_backward(em_sum_all(em_mul(y[side], r)));
        assert_non_null(g[side]);
        dx[side] = em_grad(g[side], x);
        dw[side] = em_grad(g[side], w);
        assert_non_null(dx[side]);
        assert_non_null(dw[side]);
        assert_int_equal(em_sync(), EM_OK); /* a kernel error (cuDNN's included) shows here */
    }
    on(EM_DEVICE_CPU);
    const char *names[3] = {"conv2d", "conv2d_bwd_data (dx)", "conv2d_bwd_weight (dw)"};
    em_tensor *cpu[3] = {y[0], dx[0], dw[0]}, *gpu[3] = {y[1], dx[1], dw[1]};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(em_tensor_dtype(gpu[i]), dt);
        const double d = rel_diff(cpu[i], gpu[i]);
        if (!(d <= tol))
            fail_msg("%s, %s (%s): max|CPU - CUDA| / max|CPU| = %.3g > %.3g", what, names[i], em_dtype_name(dt), d, tol);
    }
    em_grads_free(g[0]);
    em_grads_free(g[1]);
}

static void test_conv(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    const char *cudnn = getenv("EMBER_CUDNN");
    print_message("conv2d in f16 / bf16: %s\n", cudnn && atoi(cudnn) == 0 ? "direct kernels (EMBER_CUDNN=0)" : "cuDNN (when built with it)");
    em_scope_begin();
    for (size_t h = 0; h < 2; h++) {
        const em_dtype dt = k_half[h];
        em_conv_opts o = em_conv_opts_default();
        o.padding[0] = o.padding[1] = 1; /* 3x3, padding 1 */
        check_conv(dt, (int64_t[]){2, 4, 9, 8}, (int64_t[]){6, 4, 3, 3}, &o, 40, "3x3 padding 1");
        o = em_conv_opts_default();
        o.stride[0] = o.stride[1] = 2; /* 5x5, stride 2, no padding */
        check_conv(dt, (int64_t[]){2, 3, 16, 15}, (int64_t[]){8, 3, 5, 5}, &o, 43, "5x5 stride 2");
        o = em_conv_opts_default();
        o.groups = 2, o.stride[0] = 2, o.padding[0] = 1, o.padding[1] = 2, o.dilation[1] = 2; /* groups 2, mixed */
        check_conv(dt, (int64_t[]){2, 4, 11, 10}, (int64_t[]){6, 2, 3, 3}, &o, 46, "groups 2, stride (2, 1), padding (1, 2), dilation (1, 2)");
        o = em_conv_opts_default();
        check_conv(dt, (int64_t[]){3, 8, 7, 7}, (int64_t[]){16, 8, 1, 1}, &o, 49, "1x1");
        o = em_conv_opts_default();
        o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1; /* 1x1 stride 2 with padding: zero border outputs */
        check_conv(dt, (int64_t[]){2, 8, 6, 6}, (int64_t[]){8, 8, 1, 1}, &o, 52, "1x1 stride 2 padding 1");
        o = em_conv_opts_default();
        o.padding[0] = o.padding[1] = 1; /* the MNIST CNN's second conv: tensor-core sizes, long weight-gradient sums */
        check_conv(dt, (int64_t[]){16, 32, 14, 14}, (int64_t[]){64, 32, 3, 3}, &o, 55, "32 -> 64 channels, 14x14, 3x3 padding 1");
    }
    on(EM_DEVICE_CPU);
    em_scope_end();
}

/* ---- pooling ------------------------------------------------------------------------ */

/* y = f(x) and, through autograd of sum(y * r), dx, on the CPU (widened) and
 * on CUDA (native): the same bits (max: a 16-bit input and its index; avg
 * and its gradient: float sums in the CPU's order, one division, one
 * rounding; backward of max pooling is scatter_add, widened). */
typedef em_tensor *(*pool_fn)(const em_tensor *x, em_tensor **idx);
static em_tensor *max_3s2p1(const em_tensor *x, em_tensor **idx)
{
    em_pool_opts o = em_pool_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1;
    return em_max_pool2d(x, &o, idx);
}
static em_tensor *max_2(const em_tensor *x, em_tensor **idx)
{
    em_pool_opts o = em_pool_opts_default(2, 2);
    return em_max_pool2d(x, &o, idx);
}
static em_tensor *max_dil(const em_tensor *x, em_tensor **idx)
{
    em_pool_opts o = em_pool_opts_default(3, 2);
    o.stride[0] = o.stride[1] = 1, o.padding[0] = 1, o.dilation[0] = 2, o.dilation[1] = 3;
    return em_max_pool2d(x, &o, idx);
}
static em_tensor *avg_3s2p1(const em_tensor *x, em_tensor **idx)
{
    (void)idx;
    em_pool_opts o = em_pool_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1, o.count_include_pad = false;
    return em_avg_pool2d(x, &o);
}
static em_tensor *avg_ceil_div(const em_tensor *x, em_tensor **idx)
{
    (void)idx;
    em_pool_opts o = em_pool_opts_default(2, 3);
    o.ceil_mode = true, o.stride[1] = 2, o.padding[1] = 1, o.divisor_override = 5;
    return em_avg_pool2d(x, &o);
}
static em_tensor *adaptive_avg(const em_tensor *x, em_tensor **idx)
{
    (void)idx;
    return em_adaptive_avg_pool2d(x, 4, 3);
}

static void check_pool(em_dtype dt, pool_fn f, bool max, const int64_t *xs, uint64_t seed, const char *what)
{
    on(EM_DEVICE_CPU);
    em_tensor *x = rnd(dt, xs, 4, seed);
    if (max) x = em_round(em_mul_scalar(x, 8)); /* ties: integers in [-8, 8] */
    assert_non_null(x);
    assert_int_equal(em_set_requires_grad(x, true), EM_OK);
    em_tensor *y[2], *idx[2] = {NULL, NULL}, *dx[2], *r = NULL;
    em_grads *g[2];
    for (int side = 0; side < 2; side++) {
        on(side ? EM_DEVICE_CUDA : EM_DEVICE_CPU);
        y[side] = f(x, max ? &idx[side] : NULL);
        assert_non_null(y[side]);
        if (side == 0) r = rnd(dt, em_tensor_shape(y[0]), 4, seed + 1);
        g[side] = em_backward(em_sum_all(em_mul(y[side], r)));
        assert_non_null(g[side]);
        dx[side] = em_grad(g[side], x);
        assert_non_null(dx[side]);
        assert_int_equal(em_sync(), EM_OK);
    }
    on(EM_DEVICE_CPU);
    char nm[96];
    snprintf(nm, sizeof nm, "%s", what);
    assert_same_bits(y[0], y[1], nm);
    if (max) assert_same_bits(idx[0], idx[1], "max_pool2d indices");
    snprintf(nm, sizeof nm, "%s gradient", what);
    assert_same_bits(dx[0], dx[1], nm);
    em_grads_free(g[0]);
    em_grads_free(g[1]);
}

static void test_pool(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    em_scope_begin();
    for (size_t h = 0; h < 2; h++) {
        const em_dtype dt = k_half[h];
        check_pool(dt, max_3s2p1, true, (int64_t[]){2, 3, 9, 8}, 60, "max_pool2d 3x3 stride 2 padding 1");
        check_pool(dt, max_2, true, (int64_t[]){4, 8, 14, 14}, 61, "max_pool2d 2x2");
        check_pool(dt, max_dil, true, (int64_t[]){2, 3, 9, 8}, 62, "max_pool2d dilated");
        check_pool(dt, avg_3s2p1, false, (int64_t[]){2, 3, 9, 8}, 63, "avg_pool2d 3x3 stride 2 (count_include_pad false)");
        check_pool(dt, avg_ceil_div, false, (int64_t[]){1, 2, 7, 7}, 64, "avg_pool2d ceil_mode, divisor 5");
        check_pool(dt, adaptive_avg, false, (int64_t[]){2, 3, 9, 8}, 65, "adaptive_avg_pool2d 4x3");
    }
    on(EM_DEVICE_CPU);
    em_scope_end();
}

/* ---- the f32 matmul precision setting ------------------------------------------------- */

static void test_precision_setting(void **state)
{
    (void)state;
    const char *tf = getenv("EMBER_TF32"); /* em_init applied it */
    assert_int_equal(em_get_float32_matmul_precision(), tf && atoi(tf) == 1 ? EM_MATMUL_HIGH : EM_MATMUL_HIGHEST);
    em_set_float32_matmul_precision(EM_MATMUL_HIGH);
    assert_int_equal(em_get_float32_matmul_precision(), EM_MATMUL_HIGH);
    em_clear_error();
    em_set_float32_matmul_precision((em_matmul_precision)7);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "em_set_float32_matmul_precision"));
    assert_int_equal(em_get_float32_matmul_precision(), EM_MATMUL_HIGH);
    em_clear_error();
    em_set_float32_matmul_precision(EM_MATMUL_HIGHEST);
    assert_int_equal(em_get_float32_matmul_precision(), EM_MATMUL_HIGHEST);
}

static void test_tf32(void **state)
{
    (void)state;
    if (!g_cuda) skip();
    em_scope_begin();
    on(EM_DEVICE_CPU);
    em_tensor *a = rnd(EM_F32, (int64_t[]){256, 1024}, 2, 30), *b = rnd(EM_F32, (int64_t[]){1024, 256}, 2, 31);
    em_tensor *ref = em_matmul(em_cast(a, EM_F64), em_cast(b, EM_F64));
    on(EM_DEVICE_CUDA);
    em_tensor *full = em_matmul(a, b);
    assert_int_equal(em_sync(), EM_OK); /* the setting is read when the kernel runs */
    em_set_float32_matmul_precision(EM_MATMUL_HIGH);
    em_tensor *tf = em_matmul(a, b);
    assert_int_equal(em_sync(), EM_OK);
    em_set_float32_matmul_precision(EM_MATMUL_HIGHEST);
    em_tensor *full2 = em_matmul(a, b);
    on(EM_DEVICE_CPU);
    const double r_full = rel_diff(ref, em_cast(full, EM_F64)), r_tf = rel_diff(ref, em_cast(tf, EM_F64));
    const double r_full2 = rel_diff(ref, em_cast(full2, EM_F64));
    print_message("f32 matmul vs f64: HIGHEST %.3g, HIGH (TF32) %.3g, HIGHEST again %.3g\n", r_full, r_tf, r_full2);
    assert_true(r_full < 1e-5 && r_full2 < 1e-5);
    assert_true(r_tf > 1e-5 && r_tf < 5e-3); /* TF32 ran: a 10-bit mantissa shows */
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precision_setting), cmocka_unit_test(test_cast),   cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary_where),      cmocka_unit_test(test_fill),   cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_tf32),              cmocka_unit_test(test_conv),   cmocka_unit_test(test_pool),
    };
    return cmocka_run_group_tests(tests, setup, em_test_teardown);
}
