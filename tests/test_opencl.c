/* OpenCL backend tests (devices/opencl), run on PoCL in CI.
 *
 * main() makes an OpenCL worker appear before em_init: STARPU_OPENCL_ON_CPUS=1
 * (StarPU ignores CPU OpenCL devices otherwise), OCL_ICD_VENDORS unset (CTest
 * sets it to /nonexistent so the other tests skip OpenCL), one CPU worker
 * unless STARPU_NCPU says otherwise, and POCL_CACHE_DIR under the build tree
 * (kernels compile once, ~2 s, then come from the cache). No OpenCL worker
 * after em_init is a FAILURE, not a skip: CI guarantees PoCL.
 *
 * What is checked:
 *   (a) a chain of ops alternating between the CPU and the OpenCL worker gives
 *       the pure-CPU result, and data really crossed the RAM <-> OpenCL bus in
 *       both directions (StarPU's per-bus transfer counters);
 *   (b) every op with an OpenCL kernel matches the CPU kernel on random inputs
 *       (broadcast and transposed views, all dtypes the front end accepts),
 *       and its result really came from the OpenCL node (bytes moved
 *       OpenCL -> RAM when it was read back); exact ops must agree bit for
 *       bit, transcendental ones within a few ulps;
 *   (c) the Philox random ops give the same numbers on both devices;
 *   (d) the host fallback of a device without fp64 (EMBER_OPENCL_NO_FP64=1,
 *       runtime restarted) still matches the CPU;
 *   (e) f16 / bf16: the unary, binary, where, copy and fill kernels take
 *       them natively (one task, no widening), bit-identical to the CPU
 *       (the converters of devices/half.h; f32 math within a few ulps), and
 *       `ember devices` (em_print_devices) says so for the device.
 * The general every-op-on-every-device check lives in tests/test_consistency.c;
 * this file keeps to OpenCL specifics.
 *
 * The bus counters are read through dlsym from the StarPU library libember
 * already loaded (the test target links Ember only), with StarPU's own
 * declarations when <starpu.h> is on the include path. */
#include "testutil.h"
#include "ember/autograd.h"
#include "ember/optim.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<starpu.h>)
#include <starpu.h>
#define HAVE_STARPU_H 1
#endif
#endif
#ifndef HAVE_STARPU_H
/* Mirror of StarPU 1.4's struct starpu_profiling_bus_info and node kinds. */
struct starpu_profiling_bus_info {
    struct timespec start_time;
    struct timespec total_time;
    long long transferred_bytes;
    int transfer_count;
};
#define STARPU_CPU_RAM 1
#define STARPU_OPENCL_RAM 3
#endif

/* ---- StarPU bus counters -------------------------------------------------------- */

static struct {
    int (*count)(void);
    int (*src)(int);
    int (*dst)(int);
    int (*info)(int, struct starpu_profiling_bus_info *);
    int (*kind)(unsigned);
} g_bus;

static void bus_load(void)
{
    g_bus.count = (int (*)(void))dlsym(RTLD_DEFAULT, "starpu_bus_get_count");
    g_bus.src = (int (*)(int))dlsym(RTLD_DEFAULT, "starpu_bus_get_src");
    g_bus.dst = (int (*)(int))dlsym(RTLD_DEFAULT, "starpu_bus_get_dst");
    g_bus.info = (int (*)(int, struct starpu_profiling_bus_info *))dlsym(RTLD_DEFAULT, "starpu_bus_get_profiling_info");
    g_bus.kind = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "starpu_node_get_kind");
}

/* Bytes moved RAM -> OpenCL and OpenCL -> RAM since the last call (reading
 * the counters resets them). */
static void bus_bytes(long long *to_dev, long long *to_host)
{
    *to_dev = *to_host = 0;
    if (!g_bus.count || !g_bus.src || !g_bus.dst || !g_bus.info || !g_bus.kind) fail_msg("StarPU bus API not found");
    int n = g_bus.count();
    for (int b = 0; b < n; b++) {
        struct starpu_profiling_bus_info bi;
        memset(&bi, 0, sizeof bi);
        g_bus.info(b, &bi);
        int ks = g_bus.kind((unsigned)g_bus.src(b)), kd = g_bus.kind((unsigned)g_bus.dst(b));
        if (ks == STARPU_CPU_RAM && kd == STARPU_OPENCL_RAM) *to_dev += bi.transferred_bytes;
        if (ks == STARPU_OPENCL_RAM && kd == STARPU_CPU_RAM) *to_host += bi.transferred_bytes;
    }
}

static void bus_reset(void)
{
    long long a, b;
    bus_bytes(&a, &b);
}

/* ---- inputs ------------------------------------------------------------------------ */

static uint64_t g_state = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return (double)(g_state >> 11) * (1.0 / 9007199254740992.0);
}

/* kind: 0 continuous in [lo, hi), 1 multiples of 1/8 in [lo, hi) (exact
 * comparisons hit equal values), 2 continuous with NaN/inf sprinkled in. */
static em_tensor *make(em_dtype dt, const int64_t *shape, int nd, double lo, double hi, int kind)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    size_t es = em_dtype_size(dt);
    char *buf = calloc((size_t)(n ? n : 1), es);
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * urand();
        if (kind == 1) v = floor(v * 8) / 8;
        if (kind == 2 && i % 7 == 3) v = (i % 3 == 0) ? NAN : (i % 3 == 1 ? INFINITY : -INFINITY);
        char *p = buf + i * (int64_t)es;
        switch (dt) {
        case EM_F32: *(float *)p = (float)v; break;
        case EM_F64: *(double *)p = v; break;
        case EM_I32: *(int32_t *)p = (int32_t)floor(v); break;
        case EM_I64: *(int64_t *)p = (int64_t)floor(v); break;
        case EM_U8: *(uint8_t *)p = (uint8_t)(int64_t)floor(v < 0 ? 0 : v); break;
        default: *(uint8_t *)p = v > (lo + hi) / 2; break;
        }
    }
    em_tensor *t = em_from_host(buf, shape, nd, dt);
    free(buf);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

/* ---- comparison ------------------------------------------------------------------------ */

static void set_dev(em_device d)
{
    if (em_set_device(d) != EM_OK) fail_msg("em_set_device: %s", em_last_error());
}

static int g_checked;

/* Compares a CPU and an OpenCL result. Integers and bools must be equal;
 * floats within atol + rtol*|cpu| (0, 0 = bit-identical, NaN == NaN). */
static void compare(const char *what, const em_tensor *c, const em_tensor *o, double rtol, double atol)
{
    if (!c && !o) return; /* the front end refuses this dtype: nothing to compare */
    if (!c || !o) fail_msg("%s: %s result is NULL: %s", what, c ? "OpenCL" : "CPU", em_last_error());
    char s1[128], s2[128];
    if (em_tensor_dtype(c) != em_tensor_dtype(o) || em_tensor_ndim(c) != em_tensor_ndim(o) ||
        (em_tensor_ndim(c) &&
         memcmp(em_tensor_shape(c), em_tensor_shape(o), sizeof(int64_t) * (size_t)em_tensor_ndim(c))))
        fail_msg("%s: CPU gives %s %s, OpenCL %s %s", what, em_dtype_name(em_tensor_dtype(c)),
                 em_shape_str(em_tensor_shape(c), em_tensor_ndim(c), s1, sizeof s1), em_dtype_name(em_tensor_dtype(o)),
                 em_shape_str(em_tensor_shape(o), em_tensor_ndim(o), s2, sizeof s2));
    const em_dtype dt = em_tensor_dtype(c);
    const int64_t n = em_tensor_numel(c);
    const size_t es = em_dtype_size(dt);
    char *rc = malloc((size_t)(n ? n : 1) * es), *ro = malloc((size_t)(n ? n : 1) * es);
    if (em_to_host(c, rc, (size_t)n * es) != EM_OK || em_to_host(o, ro, (size_t)n * es) != EM_OK)
        fail_msg("%s: em_to_host: %s", what, em_last_error());
    for (int64_t i = 0; i < n; i++) {
        const char *pc = rc + i * (int64_t)es, *po = ro + i * (int64_t)es;
        bool ok;
        double vc = 0, vo = 0;
        if (dt == EM_F32 || dt == EM_F64) {
            vc = dt == EM_F32 ? *(const float *)pc : *(const double *)pc;
            vo = dt == EM_F32 ? *(const float *)po : *(const double *)po;
            if (rtol == 0 && atol == 0)
                ok = !memcmp(pc, po, es) || (isnan(vc) && isnan(vo));
            else
                ok = (isnan(vc) && isnan(vo)) || vc == vo || fabs(vc - vo) <= atol + rtol * fabs(vc);
        } else {
            ok = !memcmp(pc, po, es);
            vc = dt == EM_I64 ? (double)*(const int64_t *)pc : dt == EM_I32 ? *(const int32_t *)pc : *(const uint8_t *)pc;
            vo = dt == EM_I64 ? (double)*(const int64_t *)po : dt == EM_I32 ? *(const int32_t *)po : *(const uint8_t *)po;
        }
        if (!ok) {
            free(rc), free(ro);
            fail_msg("%s (%s %s): element %lld: CPU %.17g, OpenCL %.17g", what, em_dtype_name(dt),
                     em_shape_str(em_tensor_shape(c), em_tensor_ndim(c), s1, sizeof s1), (long long)i, vc, vo);
        }
    }
    free(rc), free(ro);
    g_checked++;
}

/* Runs EXPR on the CPU, then on the OpenCL device, and compares; the OpenCL
 * result must have come back over the bus. Everything in one scope. */
#define CHECK(what, ...) CHECK_(what, __VA_ARGS__) /* expands EXACT / TF32 first */
#define CHECK_(what, rtol, atol, EXPR)                                                                 \
    do {                                                                                            \
        em_scope_begin();                                                                           \
        set_dev(em_device_cpu());                                                                   \
        em_tensor *rc_ = (EXPR);                                                                    \
        if (rc_) em_sync();                                                                         \
        bus_reset();                                                                                \
        set_dev(em_device_opencl(0));                                                               \
        em_tensor *ro_ = (EXPR);                                                                    \
        set_dev(em_device_cpu());                                                                   \
        compare(what, rc_, ro_, rtol, atol);                                                        \
        if (ro_ && em_tensor_numel(ro_) > 0) {                                                      \
            long long up_, down_;                                                                   \
            bus_bytes(&up_, &down_);                                                                \
            if (down_ <= 0) fail_msg("%s: the result did not come from the OpenCL device", what);    \
        }                                                                                           \
        em_scope_end();                                                                             \
    } while (0)

#define EXACT 0, 0
#define TF32 2e-5, 1e-6 /* transcendental f32: a few ulps of OpenCL's built-ins */
#define TF64 1e-12, 1e-14

static const em_dtype FLOATS[] = {EM_F32, EM_F64};
static const em_dtype INTS[] = {EM_I32, EM_I64, EM_U8};
static const em_dtype ALL[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- (a) CPU <-> OpenCL chain ------------------------------------------------------------ */

static em_tensor *chain(const em_tensor *x, const em_tensor *y, const em_tensor *w, bool alternate)
{
    em_device ocl = alternate ? em_device_opencl(0) : em_device_cpu();
    set_dev(em_device_cpu());
    em_tensor *a = em_exp(em_mul_scalar(x, 0.1));
    set_dev(ocl);
    em_tensor *b = em_add(a, y); /* y broadcast */
    set_dev(em_device_cpu());
    em_tensor *c = em_relu(em_sub_scalar(b, 1.0));
    set_dev(ocl);
    em_tensor *d = em_matmul(c, w);
    set_dev(em_device_cpu());
    em_tensor *e = em_softmax(d, -1);
    set_dev(ocl);
    em_tensor *f = em_sum(e, (const int[]){0}, 1, false);
    set_dev(em_device_cpu());
    em_tensor *g = em_mul(f, em_sqrt(em_abs(f)));
    set_dev(ocl);
    em_tensor *h = em_log_softmax(g, 0);
    set_dev(em_device_cpu());
    return h;
}

static void test_chain_cpu_opencl(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = make(EM_F32, SHAPE(64, 48), 2, -2, 2, 0);
    em_tensor *y = make(EM_F32, SHAPE(48), 1, 0, 1, 0);
    em_tensor *w = make(EM_F32, SHAPE(48, 32), 2, -0.5, 0.5, 0);
    em_tensor *ref = chain(x, y, w, false);
    assert_non_null(ref);
    em_sync();
    bus_reset();
    em_tensor *got = chain(x, y, w, true);
    assert_non_null(got);
    compare("cpu/opencl chain", ref, got, 1e-5, 1e-6);
    long long to_dev, to_host;
    bus_bytes(&to_dev, &to_host);
    print_message("chain: %lld bytes RAM -> OpenCL, %lld bytes OpenCL -> RAM\n", to_dev, to_host);
    assert_true(to_dev > 0);
    assert_true(to_host > 0);
    /* at least the inputs went up and the four OpenCL results came back */
    assert_true(to_dev >= (long long)(64 * 48 * 4));
    em_scope_end();
}

/* ---- (b) op by op --------------------------------------------------------------------- */

typedef em_tensor *(*un_fn)(const em_tensor *);
typedef em_tensor *(*sc_fn)(const em_tensor *, double);
typedef em_tensor *(*bin_fn)(const em_tensor *, const em_tensor *);

static void test_unary_float(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        un_fn f;
        double lo, hi;
        bool exact;
    } ops[] = {
        {"neg", em_neg, -4, 4, true},         {"abs", em_abs, -4, 4, true},
        {"sign", em_sign, -2, 2, true},       {"exp", em_exp, -5, 5, false},
        {"log", em_log, 0.01, 10, false},     {"log1p", em_log1p, -0.9, 5, false},
        {"sqrt", em_sqrt, 0, 10, true},       {"rsqrt", em_rsqrt, 0.01, 10, true},
        {"reciprocal", em_reciprocal, 0.1, 4, true}, {"square", em_square, -4, 4, true},
        {"sin", em_sin, -6, 6, false},        {"cos", em_cos, -6, 6, false},
        {"tanh", em_tanh, -4, 4, false},      {"sigmoid", em_sigmoid, -8, 8, false},
        {"relu", em_relu, -4, 4, true},       {"gelu", em_gelu, -4, 4, false},
        {"gelu_tanh", em_gelu_tanh, -4, 4, false}, {"silu", em_silu, -6, 6, false},
        {"softplus", em_softplus, -10, 25, false}, {"erf", em_erf, -3, 3, false},
        {"floor", em_floor, -4, 4, true},     {"ceil", em_ceil, -4, 4, true},
        {"round", em_round, -4, 4, true},     {"logical_not", em_logical_not, -1, 1, true},
    };
    for (int d = 0; d < NELEM(FLOATS); d++)
        for (int i = 0; i < NELEM(ops); i++) {
            char what[64];
            snprintf(what, sizeof what, "%s(%s)", ops[i].name, em_dtype_name(FLOATS[d]));
            /* exact ops on eighths (equal values, exact halves); sqrt-like ones on continuous values */
            const bool eighths = ops[i].exact && ops[i].f != em_sqrt && ops[i].f != em_rsqrt && ops[i].f != em_reciprocal;
            em_tensor *x = make(FLOATS[d], SHAPE(5, 33), 2, ops[i].lo, ops[i].hi, eighths ? 1 : 0);
            em_tensor *xt = em_transpose(x, 0, 1); /* strided input */
            if (ops[i].exact)
                CHECK(what, EXACT, ops[i].f(xt));
            else if (FLOATS[d] == EM_F32)
                CHECK(what, TF32, ops[i].f(xt));
            else
                CHECK(what, TF64, ops[i].f(xt));
            em_tensor_release(xt);
            em_tensor_release(x);
        }
    /* with parameters */
    for (int d = 0; d < NELEM(FLOATS); d++) {
        const em_dtype dt = FLOATS[d];
        const bool f32 = dt == EM_F32;
        em_scope_begin();
        em_tensor *x = make(dt, SHAPE(4, 3, 11), 3, -3, 3, 1);
        em_tensor *xc = make(dt, SHAPE(4, 3, 11), 3, -3, 3, 0);
        em_tensor *xp = make(dt, SHAPE(4, 3, 11), 3, 0.1, 3, 0);
        CHECK("clamp", EXACT, em_clamp(x, -0.5, 0.75));
        CHECK("pow_scalar 2", EXACT, em_pow_scalar(x, 2));
        CHECK("pow_scalar 0.5", EXACT, em_pow_scalar(xp, 0.5));
        CHECK("pow_scalar 3.3", f32 ? 1e-5 : 1e-12, 0, em_pow_scalar(xp, 3.3));
        CHECK("leaky_relu", EXACT, em_leaky_relu(xc, 0.1));
        CHECK("elu", f32 ? 1e-5 : 1e-12, 1e-7, em_elu(xc, 1.5));
        static const struct {
            const char *name;
            sc_fn f;
        } sc[] = {
            {"add_scalar", em_add_scalar}, {"sub_scalar", em_sub_scalar}, {"rsub_scalar", em_rsub_scalar},
            {"mul_scalar", em_mul_scalar}, {"div_scalar", em_div_scalar}, {"maximum_scalar", em_maximum_scalar},
            {"minimum_scalar", em_minimum_scalar}, {"remainder_scalar", em_remainder_scalar},
            {"eq_scalar", em_eq_scalar}, {"ne_scalar", em_ne_scalar}, {"lt_scalar", em_lt_scalar},
            {"le_scalar", em_le_scalar}, {"gt_scalar", em_gt_scalar}, {"ge_scalar", em_ge_scalar},
        };
        em_tensor *xs = make(dt, SHAPE(4, 3, 11), 3, -3, 3, 2); /* with NaN / inf */
        for (int i = 0; i < NELEM(sc); i++) {
            CHECK(sc[i].name, EXACT, sc[i].f(x, 0.75));
            CHECK(sc[i].name, EXACT, sc[i].f(xc, -1.3));
            CHECK(sc[i].name, EXACT, sc[i].f(xs, 0.5));
        }
        em_scope_end();
    }
}

static void test_unary_int(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        un_fn f;
    } ops[] = {
        {"neg", em_neg}, {"abs", em_abs}, {"sign", em_sign}, {"square", em_square}, {"relu", em_relu},
        {"floor", em_floor}, {"ceil", em_ceil}, {"round", em_round}, {"logical_not", em_logical_not},
    };
    static const struct {
        const char *name;
        sc_fn f;
    } sc[] = {
        {"add_scalar", em_add_scalar}, {"sub_scalar", em_sub_scalar}, {"rsub_scalar", em_rsub_scalar},
        {"mul_scalar", em_mul_scalar}, {"maximum_scalar", em_maximum_scalar}, {"minimum_scalar", em_minimum_scalar},
        {"remainder_scalar", em_remainder_scalar}, {"eq_scalar", em_eq_scalar}, {"ne_scalar", em_ne_scalar},
        {"lt_scalar", em_lt_scalar}, {"le_scalar", em_le_scalar}, {"gt_scalar", em_gt_scalar},
        {"ge_scalar", em_ge_scalar}, {"div_scalar", em_div_scalar},
    };
    static const double svals[] = {2, -3, 2.5, -0.5, 0};
    for (int d = 0; d < NELEM(INTS); d++) {
        const em_dtype dt = INTS[d];
        em_scope_begin();
        em_tensor *x = make(dt, SHAPE(6, 17), 2, dt == EM_U8 ? 0 : -20, 20, 0);
        em_tensor *xt = em_transpose(x, 0, 1);
        for (int i = 0; i < NELEM(ops); i++) CHECK(ops[i].name, EXACT, ops[i].f(xt));
        CHECK("clamp", EXACT, em_clamp(xt, -3.5, 5));
        CHECK("clamp", EXACT, em_clamp(xt, 2, 7.5));
        CHECK("pow_scalar", EXACT, em_pow_scalar(xt, 2));
        CHECK("pow_scalar", EXACT, em_pow_scalar(xt, 3));
        for (int i = 0; i < NELEM(sc); i++)
            for (int v = 0; v < NELEM(svals); v++) {
                if (sc[i].f == em_remainder_scalar && svals[v] == 0) continue;
                if (sc[i].f == em_div_scalar && svals[v] == 0) continue;
                CHECK(sc[i].name, EXACT, sc[i].f(xt, svals[v]));
            }
        em_scope_end();
    }
}

static void test_binary(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        bin_fn f;
        bool exact_float;
    } ops[] = {
        {"add", em_add, true},         {"sub", em_sub, true},         {"mul", em_mul, true},
        {"div", em_div, true},         {"pow", em_pow, false},        {"maximum", em_maximum, true},
        {"minimum", em_minimum, true}, {"remainder", em_remainder, true}, {"eq", em_eq, true},
        {"ne", em_ne, true},           {"lt", em_lt, true},           {"le", em_le, true},
        {"gt", em_gt, true},           {"ge", em_ge, true},           {"logical_and", em_logical_and, true},
        {"logical_or", em_logical_or, true},
    };
    for (int d = 0; d < NELEM(ALL); d++) {
        const em_dtype dt = ALL[d];
        const bool fl = dt == EM_F32 || dt == EM_F64;
        em_scope_begin();
        /* broadcast: [3, 1, 5] op [4, 5] -> [3, 4, 5]; b nonzero for div/remainder */
        em_tensor *a = make(dt, SHAPE(3, 1, 5), 3, dt == EM_U8 ? 0 : -6, 6, fl ? 1 : 0);
        em_tensor *b = make(dt, SHAPE(4, 5), 2, 0.5, 5, fl ? 1 : 0);
        em_tensor *bt = em_transpose(make(dt, SHAPE(5, 4), 2, 0.5, 5, 1), 0, 1); /* strided [4, 5] */
        em_tensor *an = make(dt, SHAPE(3, 4, 5), 3, -3, 3, 2);                   /* NaN / inf */
        for (int i = 0; i < NELEM(ops); i++) {
            if (!fl && (ops[i].f == em_pow)) continue;
            /* the integer operands may hold zeros: an integer remainder by zero is an error on the
             * CPU and 0 on OpenCL (deliberate; test_edges_opencl covers the integer remainder) */
            if (!fl && ops[i].f == em_remainder) continue;
            char what[64];
            snprintf(what, sizeof what, "%s(%s)", ops[i].name, em_dtype_name(dt));
            const double rt = ops[i].exact_float ? 0 : (dt == EM_F32 ? 1e-5 : 1e-12);
            const double at = ops[i].exact_float ? 0 : 1e-30;
            CHECK(what, rt, at, ops[i].f(a, b));
            CHECK(what, rt, at, ops[i].f(bt, a));
            if (fl && ops[i].f != em_pow) CHECK(what, rt, at, ops[i].f(an, bt));
        }
        em_scope_end();
    }
}

static void test_where(void **state)
{
    (void)state;
    for (int d = 0; d < NELEM(ALL); d++) {
        em_scope_begin();
        em_tensor *m = make(EM_BOOL, SHAPE(4, 5), 2, 0, 1, 0);
        em_tensor *a = make(ALL[d], SHAPE(3, 4, 5), 3, -9, 9, 0);
        em_tensor *b = make(ALL[d], SHAPE(5), 1, -9, 9, 0);
        CHECK("where", EXACT, em_where(m, a, b));
        em_tensor *mt = em_transpose(make(EM_BOOL, SHAPE(5, 4), 2, 0, 1, 0), 0, 1);
        CHECK("where (transposed mask)", EXACT, em_where(mt, a, b));
        CHECK("masked_fill", EXACT, em_masked_fill(a, m, 2.0));
        em_scope_end();
    }
}

static void test_copy_cast(void **state)
{
    (void)state;
    for (int s = 0; s < NELEM(ALL); s++) {
        em_scope_begin();
        em_tensor *x = make(ALL[s], SHAPE(7, 9), 2, ALL[s] == EM_U8 ? 0 : -200, 200, 0);
        em_tensor *xt = em_transpose(x, 0, 1);
        for (int d = 0; d < NELEM(ALL); d++) {
            if (d == s) continue; /* em_cast to the same dtype returns its input: no task */
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", em_dtype_name(ALL[s]), em_dtype_name(ALL[d]));
            CHECK(what, EXACT, em_cast(xt, ALL[d]));
        }
        CHECK("contiguous(transpose)", EXACT, em_contiguous(xt));
        CHECK("contiguous(slice step 2)", EXACT, em_contiguous(em_slice(x, 1, 1, 9, 2)));
        em_scope_end();
    }
    /* copy into a strided view of an existing tensor (output RW, strided) */
    em_scope_begin();
    em_tensor *src = make(EM_F32, SHAPE(3, 4), 2, -1, 1, 0);
    em_tensor *base_host = make(EM_F32, SHAPE(4, 6), 2, -1, 1, 0);
    em_tensor *res[2];
    for (int dev = 0; dev < 2; dev++) {
        set_dev(dev ? em_device_opencl(0) : em_device_cpu());
        em_tensor *dst = em_add_scalar(base_host, 0); /* fresh copy on that device */
        em_tensor *view = em_transpose(em_slice(dst, 1, 0, 6, 2), 0, 1); /* [3, 4] strided */
        if (em_copy_(view, src) != EM_OK) fail_msg("em_copy_: %s", em_last_error());
        res[dev] = dst;
    }
    set_dev(em_device_cpu());
    compare("copy_ into strided view", res[0], res[1], EXACT);
    em_scope_end();
}

static void test_reductions(void **state)
{
    (void)state;
    static const int d1[] = {1}, d02[] = {0, 2}, d2[] = {2};
    static const struct {
        const int *dims;
        int n;
    } dsets[] = {{d1, 1}, {d02, 2}, {d2, 1}, {NULL, 0}};
    for (int t = 0; t < NELEM(ALL); t++) {
        const em_dtype dt = ALL[t];
        const bool fl = dt == EM_F32 || dt == EM_F64;
        const double rt = dt == EM_F32 ? 1e-5 : 1e-12, at = dt == EM_F32 ? 1e-5 : 1e-12;
        em_scope_begin();
        em_tensor *x = make(dt, SHAPE(6, 7, 5), 3, dt == EM_U8 ? 0 : -4, 4, fl ? 0 : 0);
        em_tensor *xt = em_transpose(x, 0, 2);
        em_tensor *xp = make(dt, SHAPE(6, 7, 5), 3, dt == EM_U8 ? 0 : -2, 3, 0);
        for (int s = 0; s < NELEM(dsets); s++)
            for (int keep = 0; keep < 2; keep++) {
                const int *dims = dsets[s].dims;
                const int nd = dsets[s].n;
                CHECK("sum", rt, at, em_sum(xt, dims, nd, keep));
                CHECK("mean", rt, at, em_mean(xt, dims, nd, keep));
                CHECK("max", EXACT, em_max(xt, dims, nd, keep));
                CHECK("min", EXACT, em_min(xt, dims, nd, keep));
                CHECK("any", EXACT, em_any(xt, dims, nd, keep));
                CHECK("all", EXACT, em_all(xt, dims, nd, keep));
                CHECK("logsumexp", rt, at, em_logsumexp(xt, dims, nd, keep));
                CHECK("var", rt, at, em_var(xt, dims, nd, 1.0, keep));
                CHECK("std", rt, at, em_std(xt, dims, nd, 0.0, keep));
                if (s < 2) CHECK("prod", fl ? rt : 0, fl ? at : 0, em_prod(xp, dims, nd, keep));
            }
        for (int dim = -1; dim < 3; dim++) {
            CHECK("argmax", EXACT, em_argmax(xt, dim, false));
            CHECK("argmin", EXACT, em_argmin(xt, dim, true));
        }
        CHECK("sum_all", rt, at, em_sum_all(x));
        em_scope_end();
    }
    /* large, ties and NaN */
    em_scope_begin();
    em_tensor *big = make(EM_F32, SHAPE(100003), 1, -1, 1, 0);
    CHECK("sum 100003", 1e-6, 1e-6, em_sum_all(big));
    CHECK("max 100003", EXACT, em_max(big, NULL, 0, false));
    CHECK("argmax 100003", EXACT, em_argmax(big, 0, false));
    em_tensor *ties = make(EM_F32, SHAPE(37, 300), 2, -2, 2, 1); /* eighths: many ties */
    CHECK("argmax ties", EXACT, em_argmax(ties, 1, false));
    CHECK("argmin ties", EXACT, em_argmin(ties, 0, false));
    em_tensor *nan = make(EM_F64, SHAPE(9, 50), 2, -2, 2, 2); /* NaN / inf */
    CHECK("max nan", EXACT, em_max(nan, (const int[]){1}, 1, false));
    CHECK("argmax nan", EXACT, em_argmax(nan, 1, false));
    CHECK("argmin nan", EXACT, em_argmin(nan, 0, false));
    CHECK("logsumexp nan", EXACT, em_logsumexp(nan, (const int[]){1}, 1, false));
    em_tensor *big64 = make(EM_I64, SHAPE(3, 70001), 2, -1e12, 1e12, 0);
    CHECK("sum i64", EXACT, em_sum(big64, (const int[]){1}, 1, false));
    em_scope_end();
}

static void test_softmax(void **state)
{
    (void)state;
    for (int t = 0; t < NELEM(FLOATS); t++) {
        const em_dtype dt = FLOATS[t];
        const double rt = dt == EM_F32 ? 1e-5 : 1e-12, at = dt == EM_F32 ? 1e-6 : 1e-14;
        em_scope_begin();
        em_tensor *x = make(dt, SHAPE(4, 9, 33), 3, -6, 6, 0);
        em_tensor *xt = em_transpose(x, 0, 2);
        for (int d = -1; d < 3; d++) {
            CHECK("softmax", rt, at, em_softmax(x, d));
            CHECK("log_softmax", rt, at, em_log_softmax(x, d));
            CHECK("softmax (transposed)", rt, at, em_softmax(xt, d));
            CHECK("log_softmax (transposed)", rt, at, em_log_softmax(xt, d));
        }
        em_tensor *xs = make(dt, SHAPE(5, 700), 2, -3, 3, 2); /* NaN / inf */
        CHECK("softmax nan/inf", rt, at, em_softmax(xs, 1));
        em_tensor *ninf = em_full(SHAPE(3, 4), 2, dt, -INFINITY);
        CHECK("softmax all -inf", rt, at, em_softmax(ninf, 1));
        em_scope_end();
    }
}

static void test_matmul(void **state)
{
    (void)state;
    for (int t = 0; t < NELEM(ALL); t++) {
        const em_dtype dt = ALL[t];
        const double rt = dt == EM_F32 ? 1e-5 : dt == EM_F64 ? 1e-12 : 0, at = dt == EM_F32 ? 1e-5 : dt == EM_F64 ? 1e-12 : 0;
        const double lo = dt == EM_U8 ? 0 : -3, hi = 3;
        em_scope_begin();
        em_tensor *a = make(dt, SHAPE(5, 7), 2, lo, hi, 0);
        em_tensor *b = make(dt, SHAPE(7, 3), 2, lo, hi, 0);
        CHECK("matmul 5x7x3", rt, at, em_matmul(a, b));
        em_tensor *ab = make(dt, SHAPE(2, 3, 37, 19), 4, lo, hi, 0);
        em_tensor *bb = make(dt, SHAPE(19, 21), 2, lo, hi, 0);
        CHECK("matmul batched broadcast", rt, at, em_matmul(ab, bb));
        em_tensor *bb3 = make(dt, SHAPE(3, 19, 4), 3, lo, hi, 0);
        CHECK("matmul batch broadcast both", rt, at, em_matmul(ab, bb3));
        em_tensor *at_ = em_transpose(make(dt, SHAPE(7, 5), 2, lo, hi, 0), 0, 1);
        em_tensor *bt_ = em_transpose(make(dt, SHAPE(3, 7), 2, lo, hi, 0), 0, 1);
        CHECK("matmul transposed", rt, at, em_matmul(at_, bt_));
        em_tensor *v = make(dt, SHAPE(7), 1, lo, hi, 0);
        CHECK("matmul dot", rt, at, em_matmul(v, v));
        CHECK("matmul mv", rt, at, em_matmul(a, v));
        em_tensor *big_a = make(dt, SHAPE(70, 130), 2, lo, hi, 0);
        em_tensor *big_b = make(dt, SHAPE(130, 45), 2, lo, hi, 0);
        CHECK("matmul 70x130x45", rt, at, em_matmul(big_a, big_b));
        em_tensor *e1 = make(dt, SHAPE(3, 0), 2, lo, hi, 0), *e2 = make(dt, SHAPE(0, 4), 2, lo, hi, 0);
        CHECK("matmul K=0", EXACT, em_matmul(e1, e2));
        em_scope_end();
    }
}

static void test_index(void **state)
{
    (void)state;
    for (int t = 0; t < NELEM(ALL); t++) {
        const em_dtype dt = ALL[t];
        em_scope_begin();
        em_tensor *a = make(dt, SHAPE(4, 6, 3), 3, dt == EM_U8 ? 0 : -9, 9, 0);
        /* indices in range: an out-of-range one is an error on the CPU and 0 / skipped on OpenCL
         * (DELIBERATE 'index-range', checked by test_edges_opencl) */
        em_tensor *idx_ok = make(EM_I64, SHAPE(4, 5, 3), 3, 0, 6, 0);
        CHECK("gather", EXACT, em_gather(a, 1, idx_ok));
        em_tensor *at = em_transpose(a, 0, 2), *it = make(EM_I64, SHAPE(2, 6, 4), 3, 0, 3, 0);
        CHECK("gather (transposed input)", EXACT, em_gather(at, 0, it));
        em_tensor *i1 = make(EM_I64, SHAPE(5), 1, 0, 6, 0);
        CHECK("index_select", EXACT, em_index_select(a, 1, i1));
        em_tensor *i0 = make(EM_I64, SHAPE(7), 1, 0, 4, 0);
        CHECK("index_select dim 0", EXACT, em_index_select(a, 0, i0));
        em_tensor *src = make(dt, SHAPE(4, 5, 3), 3, dt == EM_U8 ? 0 : -9, 9, 0);
        CHECK("scatter (duplicates)", EXACT, em_scatter(a, 1, idx_ok, src));
        CHECK("scatter_add (duplicates)", EXACT, em_scatter_add(a, 1, idx_ok, src));
        em_tensor *i2 = make(EM_I64, SHAPE(4, 6, 5), 3, 0, 3, 0), *s2 = make(dt, SHAPE(4, 6, 5), 3, 0, 9, 0);
        CHECK("scatter_add dim 2", EXACT, em_scatter_add(a, 2, i2, s2));
        em_scope_end();
    }
    em_scope_begin();
    em_tensor *oh64 = make(EM_I64, SHAPE(3, 7), 2, 0, 4, 0), *oh32 = make(EM_I32, SHAPE(9), 1, 0, 6, 0);
    CHECK("one_hot", EXACT, em_one_hot(oh64, 4));
    CHECK("one_hot (i32 index)", EXACT, em_one_hot(oh32, 6));
    em_scope_end();
}

static void test_creation(void **state)
{
    (void)state;
    for (int t = 0; t < NELEM(ALL); t++) {
        const em_dtype dt = ALL[t];
        em_scope_begin();
        CHECK("full", EXACT, em_full(SHAPE(3, 5, 7), 3, dt, 3.75));
        CHECK("full negative", EXACT, em_full(SHAPE(11), 1, dt, -2.0));
        CHECK("zeros", EXACT, em_zeros(SHAPE(4, 4), 2, dt));
        CHECK("ones", EXACT, em_ones(SHAPE(1000), 1, dt));
        CHECK("eye", EXACT, em_eye(4, 6, dt));
        CHECK("eye tall", EXACT, em_eye(7, 3, dt));
        if (dt != EM_BOOL) {
            CHECK("arange", EXACT, em_arange(-3, 17, 0.5, dt));
            CHECK("arange int step", EXACT, em_arange(0, 50, 3, dt));
            CHECK("linspace", EXACT, em_linspace(-1, 2.5, 37, dt));
        }
        em_scope_end();
    }
}

/* ---- (e) f16 / bf16 ------------------------------------------------------------------ */

/* Tasks that EXPR submits on the OpenCL device (after its inputs exist). */
#define TASKS_ON_OPENCL(n, EXPR)                                                                   \
    do {                                                                                            \
        em_scope_begin();                                                                           \
        set_dev(em_device_opencl(0));                                                               \
        const int64_t t0_ = em_get_stats().tasks_submitted;                                          \
        em_tensor *r_ = (EXPR);                                                                     \
        (n) = em_get_stats().tasks_submitted - t0_;                                                 \
        if (!r_ || em_sync() != EM_OK) fail_msg("%s: %s", #EXPR, em_last_error());                  \
        set_dev(em_device_cpu());                                                                   \
        em_scope_end();                                                                             \
    } while (0)

static void test_half(void **state)
{
    (void)state;
    static const em_dtype H[] = {EM_F16, EM_BF16};
    for (int h = 0; h < 2; h++) {
        const em_dtype dt = H[h];
        em_scope_begin();
        set_dev(em_device_cpu());
        em_tensor *x = em_cast(make(EM_F32, SHAPE(6, 9), 2, -3, 3, 0), dt);
        em_tensor *y = em_cast(make(EM_F32, SHAPE(9), 1, 0.5, 2, 0), dt);
        em_tensor *d = em_cast(make(EM_F32, SHAPE(6, 9), 2, -2, 2, 1), dt); /* multiples of 1/8: ties */
        em_tensor *m = make(EM_BOOL, SHAPE(6, 1), 2, 0, 1, 0);
        em_tensor *xt = em_transpose(x, 0, 1);
        if (!x || !y || !d || !m || !xt) fail_msg("inputs: %s", em_last_error());
        /* exact: the same float operation, rounded by the same converter */
        CHECK("neg", EXACT, em_neg(xt));
        CHECK("abs", EXACT, em_abs(x));
        CHECK("relu", EXACT, em_relu(xt));
        CHECK("add (broadcast)", EXACT, em_add(x, y));
        CHECK("mul", EXACT, em_mul(xt, em_transpose(d, 0, 1)));
        CHECK("div", EXACT, em_div(x, y));
        CHECK("mul_scalar", EXACT, em_mul_scalar(x, 0.3));
        CHECK("clamp", EXACT, em_clamp(x, -0.5, 0.7));
        CHECK("lt", EXACT, em_lt(d, em_transpose(em_transpose(d, 0, 1), 0, 1)));
        CHECK("ge_scalar", EXACT, em_ge_scalar(d, 0.25));
        CHECK("where (broadcast mask)", EXACT, em_where(m, x, d));
        CHECK("full", EXACT, em_full(SHAPE(5, 7), 2, dt, 2.3));
        CHECK("eye", EXACT, em_eye(4, 6, dt));
        CHECK("arange", EXACT, em_arange(-3, 17, 0.3, dt));
        CHECK("rand_uniform", EXACT, (em_manual_seed(1234), em_rand_uniform(SHAPE(300), 1, dt, -1, 2)));
        CHECK("rand_normal", EXACT, (em_manual_seed(7), em_rand_normal(SHAPE(300), 1, dt, 1.5, 2.0)));
        for (int o = 0; o < NELEM(ALL); o++) {
            char what[64];
            snprintf(what, sizeof what, "cast %s -> %s", em_dtype_name(dt), em_dtype_name(ALL[o]));
            CHECK(what, EXACT, em_cast(xt, ALL[o]));
            snprintf(what, sizeof what, "cast %s -> %s", em_dtype_name(ALL[o]), em_dtype_name(dt));
            em_tensor *src = make(ALL[o], SHAPE(9, 6), 2, -200, 200, 0);
            CHECK(what, EXACT, em_cast(em_transpose(src, 0, 1), dt));
        }
        CHECK("cast f16 <-> bf16", EXACT, em_cast(x, dt == EM_F16 ? EM_BF16 : EM_F16));
        CHECK("contiguous(transpose)", EXACT, em_contiguous(xt));
        /* f32 math of OpenCL's built-ins: at most one 16-bit rounding apart */
        CHECK("exp", dt == EM_F16 ? 1e-3 : 8e-3, 0, em_cast(em_exp(x), EM_F32));
        CHECK("sigmoid", dt == EM_F16 ? 1e-3 : 8e-3, 0, em_cast(em_sigmoid(xt), EM_F32));
        /* native: one task each on the OpenCL device; a reduction is widened */
        int64_t n = 0;
        TASKS_ON_OPENCL(n, em_add(x, y));
        if (n != 1) fail_msg("%s add on OpenCL: %lld tasks, expected 1 (a native 16-bit kernel)", em_dtype_name(dt), (long long)n);
        TASKS_ON_OPENCL(n, em_exp(x));
        if (n != 1) fail_msg("%s exp on OpenCL: %lld tasks, expected 1", em_dtype_name(dt), (long long)n);
        TASKS_ON_OPENCL(n, em_cast(x, EM_F32));
        if (n != 1) fail_msg("%s cast on OpenCL: %lld tasks, expected 1", em_dtype_name(dt), (long long)n);
        TASKS_ON_OPENCL(n, em_sum(x, (const int[]){1}, 1, false));
        if (n < 3) fail_msg("%s sum on OpenCL: %lld tasks, expected the widened op (copy, f32 sum, copy)", em_dtype_name(dt), (long long)n);
        CHECK("sum (widened)", EXACT, em_sum(x, (const int[]){1}, 1, false));
        em_scope_end();
    }
    /* ember devices: one line for the device, under 80 columns */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) fail_msg("open_memstream failed");
    em_print_devices(f);
    fclose(f);
    const char *l = strstr(buf, "  opencl:0  f16/bf16: converted in kernel (cl_khr_fp16: ");
    if (!l) fail_msg("em_print_devices has no f16/bf16 line for opencl:0:\n%s", buf);
    const char *e = strchr(l, '\n');
    if (!e || e - l > 80 || (strncmp(e - 4, "yes)", 4) && strncmp(e - 3, "no)", 3)))
        fail_msg("em_print_devices: bad f16/bf16 line: %.*s", e ? (int)(e - l) : 100, l);
    free(buf);
}

/* One optimizer, 3 steps, on the current device; returns the parameter. */
static em_tensor *optim_run(const em_optim_config *cfg, const em_tensor *p0, const em_tensor *const *grads)
{
    em_tensor *p = em_add_scalar(p0, 0);
    em_set_requires_grad(p, true);
    em_optim *opt = em_optim_new(cfg, &p, 1);
    if (!opt) fail_msg("em_optim_new: %s", em_last_error());
    for (int s = 0; s < 3; s++) {
        em_device dev = em_get_device();
        set_dev(em_device_cpu()); /* gradient = grads[s], exactly (d sum(p*g)/dp) */
        em_tensor *loss = em_sum_all(em_mul(p, grads[s]));
        em_grads *g = em_backward(loss);
        if (!g) fail_msg("em_backward: %s", em_last_error());
        set_dev(dev);
        if (em_optim_step(opt, g) != EM_OK) fail_msg("em_optim_step: %s", em_last_error());
        em_grads_free(g);
    }
    em_sync();
    em_optim_free(opt);
    return p;
}

static void test_optim(void **state)
{
    (void)state;
    em_optim_config cfgs[7];
    cfgs[0] = em_optim_config_default(EM_OPTIM_SGD);
    cfgs[0].lr = 0.1, cfgs[0].momentum = 0.9, cfgs[0].nesterov = true, cfgs[0].weight_decay = 0.01;
    cfgs[1] = em_optim_config_default(EM_OPTIM_SGD);
    cfgs[1].lr = 0.05, cfgs[1].momentum = 0.5, cfgs[1].dampening = 0.3, cfgs[1].maximize = true;
    cfgs[2] = em_optim_config_default(EM_OPTIM_ADAM);
    cfgs[2].lr = 0.01, cfgs[2].amsgrad = true, cfgs[2].weight_decay = 0.1;
    cfgs[3] = em_optim_config_default(EM_OPTIM_ADAMW);
    cfgs[3].lr = 0.02;
    cfgs[4] = em_optim_config_default(EM_OPTIM_RMSPROP);
    cfgs[4].momentum = 0.7, cfgs[4].centered = true, cfgs[4].weight_decay = 0.05;
    cfgs[5] = em_optim_config_default(EM_OPTIM_RMSPROP);
    cfgs[6] = em_optim_config_default(EM_OPTIM_ADAGRAD);
    cfgs[6].lr_decay = 0.1, cfgs[6].weight_decay = 0.01;
    for (int t = 0; t < NELEM(FLOATS); t++)
        for (int c = 0; c < NELEM(cfgs); c++) {
            em_scope_begin();
            const em_dtype dt = FLOATS[t];
            em_tensor *p0 = make(dt, SHAPE(13, 7), 2, -1, 1, 0);
            em_tensor *g[3];
            for (int s = 0; s < 3; s++) g[s] = make(dt, SHAPE(13, 7), 2, -1, 1, 0);
            set_dev(em_device_cpu());
            em_tensor *pc = optim_run(&cfgs[c], p0, (const em_tensor *const *)g);
            bus_reset();
            set_dev(em_device_opencl(0));
            em_tensor *po = optim_run(&cfgs[c], p0, (const em_tensor *const *)g);
            set_dev(em_device_cpu());
            char what[64];
            snprintf(what, sizeof what, "%s step x3 (%s)", em_optim_kind_name(cfgs[c].kind), em_dtype_name(dt));
            compare(what, pc, po, EXACT);
            long long up, down;
            bus_bytes(&up, &down);
            if (down <= 0) fail_msg("%s: the parameter was not updated on the OpenCL device", what);
            em_scope_end();
        }
}

/* ---- (c) RNG --------------------------------------------------------------------------- */

static void test_rng_identical(void **state)
{
    (void)state;
    for (int t = 0; t < NELEM(FLOATS); t++) {
        const em_dtype dt = FLOATS[t];
        em_scope_begin();
        CHECK("rand_uniform", EXACT, (em_manual_seed(1234), em_rand_uniform(SHAPE(3, 1001), 2, dt, -2, 5)));
        CHECK("rand_bernoulli", EXACT, (em_manual_seed(99), em_rand_bernoulli(SHAPE(4097), 1, dt, 0.3)));
        /* Box-Muller through OpenCL's double log/cos: bit-identical in f32,
         * within an ulp or two in f64 */
        CHECK("rand_normal", dt == EM_F32 ? 0 : 1e-15, dt == EM_F32 ? 0 : 1e-15,
              (em_manual_seed(7), em_rand_normal(SHAPE(50, 200), 2, dt, 1.5, 2.0)));
        /* the generator's offset advances identically: a second draw after
         * the same first one matches too */
        CHECK("rand_uniform (second draw)", EXACT,
              (em_manual_seed(5), em_rand_uniform(SHAPE(10), 1, dt, 0, 1), em_rand_uniform(SHAPE(333), 1, dt, 0, 1)));
        em_scope_end();
    }
    em_scope_begin();
    CHECK("rand_bernoulli u8", EXACT, (em_manual_seed(3), em_rand_bernoulli(SHAPE(300), 1, EM_U8, 0.5)));
    em_scope_end();
}

/* ---- (d) host fallback without fp64 ------------------------------------------------------ */

static void test_no_fp64_fallback(void **state)
{
    (void)state;
    em_shutdown();
    setenv("EMBER_OPENCL_NO_FP64", "1", 1);
    em_status st = em_init(NULL);
    unsetenv("EMBER_OPENCL_NO_FP64");
    if (st != EM_OK) fail_msg("em_init (no fp64): %s", em_last_error());
    assert_true(em_worker_count(EM_DEVICE_OPENCL) > 0);
    em_scope_begin();
    em_tensor *x = make(EM_F64, SHAPE(6, 10), 2, -3, 3, 0);
    em_tensor *y = make(EM_F64, SHAPE(10), 1, 0.5, 3, 0);
    em_tensor *xf = make(EM_F32, SHAPE(6, 10), 2, -3, 3, 0);
    CHECK("f64 exp (fallback)", EXACT, em_exp(x));
    CHECK("f64 div (fallback)", EXACT, em_div(x, y));
    CHECK("f64 sum (fallback)", EXACT, em_sum(x, (const int[]){1}, 1, false));
    CHECK("f64 softmax (fallback)", EXACT, em_softmax(x, 0));
    CHECK("f64 matmul (fallback)", EXACT, em_matmul(x, em_transpose(x, 0, 1)));
    CHECK("f32 -> f64 cast (fallback)", EXACT, em_cast(xf, EM_F64));
    CHECK("f64 where (native bit move)", EXACT, em_where(em_gt_scalar(xf, 0), x, em_neg(x)));
    CHECK("f64 full (native pattern)", EXACT, em_full(SHAPE(5, 5), 2, EM_F64, 0.1));
    CHECK("rand_normal (fallback)", EXACT, (em_manual_seed(11), em_rand_normal(SHAPE(999), 1, EM_F32, 0, 1)));
    CHECK("arange (fallback)", EXACT, em_arange(0, 5, 0.25, EM_F32));
    CHECK("f32 sum without fp64 accumulators", 1e-5, 1e-5, em_sum(xf, (const int[]){0}, 1, false));
    CHECK("f32 exp without fp64", TF32, em_exp(xf));
    em_tensor *idx = make(EM_I64, SHAPE(6, 4), 2, 0, 10, 0), *src = make(EM_F64, SHAPE(6, 4), 2, -1, 1, 0);
    CHECK("f64 scatter_add (fallback)", EXACT, em_scatter_add(x, 1, idx, src));
    CHECK("f64 argmax (fallback)", EXACT, em_argmax(x, 1, false));
    /* an in-place (RW) op through the fallback: Adam on f64 */
    em_optim_config cfg = em_optim_config_default(EM_OPTIM_ADAM);
    cfg.lr = 0.05;
    const em_tensor *g[3] = {src, em_neg(src), em_mul_scalar(src, 0.5)};
    set_dev(em_device_cpu());
    em_tensor *pc = optim_run(&cfg, src, g);
    set_dev(em_device_opencl(0));
    em_tensor *po = optim_run(&cfg, src, g);
    set_dev(em_device_cpu());
    compare("f64 adam step x3 (fallback)", pc, po, EXACT);
    em_scope_end();
}

static int setup(void **state)
{
    (void)state;
    return 0;
}

int main(void)
{
    /* An OpenCL worker on PoCL: must be set before StarPU starts. */
    setenv("STARPU_OPENCL_ON_CPUS", "1", 1);
    unsetenv("OCL_ICD_VENDORS");
    setenv("STARPU_NCPU", "1", 0);
    setenv("STARPU_SILENT", "1", 0);
    char cache[4096];
    const char *home = getenv("STARPU_HOME");
    snprintf(cache, sizeof cache, "%s/pocl-cache", home && *home ? home : ".");
    if (home && *home) mkdir(home, 0755);
    mkdir(cache, 0755);
    setenv("POCL_CACHE_DIR", cache, 0);

    if (em_init(NULL) != EM_OK) {
        fprintf(stderr, "test_opencl: em_init failed: %s\n", em_last_error());
        return 1;
    }
    if (em_worker_count(EM_DEVICE_OPENCL) == 0) {
        fprintf(stderr, "test_opencl: FAILED: no OpenCL worker (PoCL missing? STARPU_OPENCL_ON_CPUS ignored?)\n");
        em_print_devices(stderr);
        em_shutdown();
        return 1;
    }
    bus_load();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_cpu_opencl), cmocka_unit_test(test_unary_float), cmocka_unit_test(test_unary_int),
        cmocka_unit_test(test_binary),           cmocka_unit_test(test_where),       cmocka_unit_test(test_copy_cast),
        cmocka_unit_test(test_reductions),       cmocka_unit_test(test_softmax),     cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_index),            cmocka_unit_test(test_creation),    cmocka_unit_test(test_optim),
        cmocka_unit_test(test_rng_identical),    cmocka_unit_test(test_half),
        cmocka_unit_test(test_no_fp64_fallback),
    };
    int failed = cmocka_run_group_tests(tests, setup, NULL);
    fprintf(stderr, "test_opencl: %d CPU/OpenCL comparisons\n", g_checked);
    em_shutdown();
    return failed;
}
