/* Op consistency across devices (the idea of ggml's test-backend-ops).
 *
 * For every op kind of tasks/ops.def there is a case below: a small function
 * that builds fresh pseudo-random inputs (a host generator reset for every
 * run, so every device sees the same numbers) and calls the public API
 * (em_add, em_sum, em_matmul, ...). Each case runs
 *   - twice on the CPU (em_set_device(em_device_cpu())): the two runs must be
 *     bit-identical (determinism), and the first is the reference;
 *   - once on every other device present (each CUDA and OpenCL device with a
 *     worker): forward outputs and, for differentiable ops, the input
 *     gradients of sum_i sum(out_i * w_i) (em_backward, w_i random) are
 *     compared with the CPU's, with tolerances per dtype (g_tol below, the
 *     one place; integers and bools exact); a NaN/Inf where the CPU has a
 *     finite value is a failure.
 * 16 bits: every case whose dtypes include f32 also runs in f16 and bf16
 * (add_half_dtypes; one_hot, integer-only, cannot). Inputs are generated as
 * for f32 and rounded to the 16-bit dtype on the host (devices/half.h, the
 * library's converters), so every device sees the same 16-bit inputs;
 * gradients are 16-bit too. Each device is compared with the CPU's 16-bit
 * result, and the CPU's 16-bit result with its f32 result of the same
 * inputs (the case run in f32 on the values rounded to 16 bits, then each
 * f32 result rounded to 16 bits): that checks the CPU's 16-bit kernels and
 * the door's widening (f32 kernel between rounding copies) themselves.
 * An op that fails to run in 16 bits is a FAIL like any other. Measured
 * (PoCL, 2026-12-02, 1221 variants, seeds from the op names), worst error
 * as a fraction of the tolerance: f16 device vs CPU 0.044 (about 1 f16 ulp:
 * libm differences surviving the rounding), bf16 device vs CPU 0
 * (bit-identical), f16 CPU vs f32 rounded 0.74 and bf16 0.59 (gelu_tanh's
 * gradient); f32 device vs CPU 0.058, f64 0.0012. The end of a run prints
 * these. Run time (2 cores,
 * shared, so CPU time): CPU only 2.5 s -> 5.8 s (wall 1.9 -> 4.5 s), with
 * PoCL 5.7 s -> 15.7 s (wall 3.7 -> 9.5 s), 753 -> 1205 case variants,
 * plus PoCL's first build of the program when it changed.
 * Every case runs once with contiguous inputs and once with strided inputs:
 * views (offset, non-unit strides) cut out of a larger tensor whose other
 * elements hold a sentinel; after the run the whole larger tensor must be
 * unchanged (kernels must not write into their inputs). Element-wise kinds
 * without an explicit row get the generic case of their front end
 * (fill_default_cases), so a new activation is tested on every device with
 * no new line here unless its inputs need a domain. Ops that write into
 * views (em_copy_ into a slice, the optimizer steps on a parameter that is a
 * slice of a larger tensor) check that the sentinel around the view survives.
 *
 * The result is a table (op, device, status) with status ok / FAIL /
 * unsupported; "unsupported" means the device's kernel table has no entry
 * for the op (em__cuda_kernels / em__opencl_kernels, read directly: the test
 * links the library's objects, libember.so hides them): such ops still run (the funnel falls back
 * to the CPU) and are listed explicitly, never skipped. Any FAIL fails the
 * test. A case table missing an op kind fails the test too, so a new op in
 * tasks/ops.def cannot be forgotten.
 *
 * Environment: EMBER_CONSISTENCY_OPS=name,name,... restricts the ops run;
 * EMBER_CONSISTENCY_VERBOSE=1 prints every variant; EMBER_CONSISTENCY_EXACT=1
 * demands bit-identical device results (a diagnostic); EMBER_TF32=1 loosens the
 * f32 matmul tolerance (TF32 tensor cores on CUDA). */
#define _GNU_SOURCE
#include "testutil.h"

#include "ember/ember.h"
#include "devices/devices.h" /* enum em_op_kind, F_* flags, the device kernel tables */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* f16 / bf16 <-> f32: the library's converters (devices/half.h, the same
 * bits as every backend), to make 16-bit inputs and round f32 results. */
#include "devices/half_host.h"

static bool is_half_dt(int dt) { return dt == EM_F16 || dt == EM_BF16; }
static uint16_t half_bits(int dt, double v)
{
    return dt == EM_BF16 ? em_f32_to_bf16_bits((float)v) : em_f32_to_f16_bits((float)v);
}
static double half_value(int dt, uint16_t h) { return dt == EM_BF16 ? em_bf16_bits_to_f32(h) : em_f16_bits_to_f32(h); }
/* v rounded to f32, then to the 16-bit dtype dt (as a cast does). */
static double round_half(int dt, double v) { return half_value(dt, half_bits(dt, v)); }

/* ---- tolerances: the one place ------------------------------------------------
 * A float result passes when |got - ref| <= atol' + rtol * |ref| (both times
 * the case's tol_scale), atol' = atol, or for the 16-bit dtypes (of_max)
 * atol * max(1, the largest |ref| of the tensor): every op of a 16-bit run
 * rounds its output (2^-11 relative for f16, 2^-8 for bf16), so a sum of
 * rounded terms that cancels (a broadcast operand's gradient, a difference
 * of statistics) is off by the terms' rounding, not the result's. Integers
 * and bools must be equal. The same table serves a device against the CPU
 * in one dtype, and the CPU's 16-bit result against its f32 result of the
 * same inputs rounded to 16 bits. The worst error / tolerance of a run is
 * printed at its end (the header says what was measured). */
typedef struct dt_tol {
    double rtol, atol;
    bool of_max; /* atol scales with the tensor's largest magnitude */
} dt_tol;
static const dt_tol g_tol[EM_DTYPE_COUNT] = {
    [EM_F32] = {1e-4, 1e-5, false},
    [EM_F64] = {1e-9, 1e-11, false},
    [EM_F16] = {1e-2, 1e-3, true},
    [EM_BF16] = {2e-2, 1e-2, true},
};

/* ---- the op table (from tasks/ops.def, as the library builds it) ----------- */

typedef struct op_info {
    const char *name;
    int n_in, n_out;
    unsigned flags;
} op_info;

static const op_info g_ops[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = {#nm, nin, nout, fl},
#include "tasks/ops.def"
};

/* ---- case context ------------------------------------------------------------ */

#define MAX_T 24
#define END (-1)

typedef struct guard {
    em_tensor *t;      /* retained */
    double *expect;    /* expected values (C order of t) */
    unsigned char *mask; /* elements to check (NULL = all) */
    int64_t n;
    const char *what;
} guard;

typedef struct ctx {
    int kind;
    int dt;      /* the case's main dtype */
    int strided; /* layout variant: inputs are strided views */
    bool made_strided;
    uint64_t rng;
    em_tensor *grad_in[MAX_T];
    int n_grad;
    em_tensor *outs[MAX_T]; /* retained */
    int n_out;
    guard guards[MAX_T];
    int n_guard;
    bool no_backward;
    double tol_scale; /* multiplies the float tolerances (1 by default) */
    int round_to;     /* -1, or f16 / bf16: f32 inputs hold values rounded to it (the f32 reference of a 16-bit run) */
    char err[512];
} ctx;

typedef bool (*case_fn)(ctx *c);

#define MAX_DTS 10
typedef struct op_case {
    case_fn fn;
    int dts[MAX_DTS]; /* dtype variants, END-terminated (f16 / bf16 added where f32 is: add_half_dtypes) */
    double tol_scale;
} op_case;

static uint64_t rng_next(ctx *c)
{
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 2685821657736338717ULL;
}
static double rng_u01(ctx *c) { return (double)(rng_next(c) >> 11) * (1.0 / 9007199254740992.0); }

static bool fail_case(ctx *c, const char *what)
{
    if (!c->err[0]) snprintf(c->err, sizeof c->err, "%s failed: %s", what, em_last_error());
    return false;
}

/* Registers an output to compare (retained until the run ends). */
static bool out(ctx *c, em_tensor *t, const char *what)
{
    if (!t) return fail_case(c, what);
    if (c->n_out >= MAX_T) return fail_case(c, "too many outputs");
    c->outs[c->n_out++] = em_tensor_retain(t);
    return true;
}

static void add_guard(ctx *c, em_tensor *t, double *expect, unsigned char *mask, int64_t n, const char *what)
{
    if (c->n_guard >= MAX_T) {
        free(expect);
        free(mask);
        return;
    }
    c->guards[c->n_guard++] = (guard){em_tensor_retain(t), expect, mask, n, what};
}

/* Input flags. */
enum {
    IN_GRAD = 1 << 0,     /* requires grad (float dtypes only) */
    IN_DISCRETE = 1 << 1, /* floats from {lo, lo + 0.5, ..., hi}: equalities happen */
    IN_NONZERO = 1 << 2,  /* random sign times [lo, hi] */
    IN_CONTIG = 1 << 3,   /* contiguous even in the strided variant */
};

static const double SENTINEL = -777.25;

static void pack(em_dtype dt, void *dst, int64_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)dst)[i] = (float)v; break;
    case EM_F64: ((double *)dst)[i] = v; break;
    case EM_I32: ((int32_t *)dst)[i] = (int32_t)v; break;
    case EM_I64: ((int64_t *)dst)[i] = (int64_t)v; break;
    case EM_U8: ((uint8_t *)dst)[i] = (uint8_t)(int64_t)v; break;
    case EM_F16:
    case EM_BF16: ((uint16_t *)dst)[i] = half_bits(dt, v); break;
    default: ((uint8_t *)dst)[i] = v != 0; break;
    }
}
static double unpack(em_dtype dt, const void *src, int64_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)src)[i];
    case EM_F64: return ((const double *)src)[i];
    case EM_I32: return ((const int32_t *)src)[i];
    case EM_I64: return (double)((const int64_t *)src)[i];
    case EM_F16:
    case EM_BF16: return half_value(dt, ((const uint16_t *)src)[i]);
    default: return ((const uint8_t *)src)[i];
    }
}

static double gen_value(ctx *c, em_dtype dt, double lo, double hi, int flags)
{
    double u = rng_u01(c);
    if (dt == EM_BOOL) return u < 0.5 ? 0.0 : 1.0;
    if (!em_dtype_is_float(dt)) {
        double a = ceil(lo), b = floor(hi);
        double v = a + floor(u * (b - a + 1));
        return v > b ? b : v;
    }
    if (flags & IN_DISCRETE) {
        double k = floor(u * (floor((hi - lo) * 2) + 1));
        return lo + 0.5 * k;
    }
    if (flags & IN_NONZERO) {
        double s = rng_u01(c) < 0.5 ? -1.0 : 1.0;
        return s * (lo + (hi - lo) * u);
    }
    return lo + (hi - lo) * u;
}

static bool read_values(const em_tensor *t, double **vals, int64_t *n)
{
    int64_t cnt = em_tensor_numel(t);
    size_t es = em_dtype_size(em_tensor_dtype(t));
    void *raw = malloc((size_t)(cnt ? cnt : 1) * es);
    double *v = malloc(sizeof(double) * (size_t)(cnt ? cnt : 1));
    if (!raw || !v || em_to_host(t, raw, (size_t)cnt * es) != EM_OK) {
        free(raw);
        free(v);
        return false;
    }
    for (int64_t i = 0; i < cnt; i++) v[i] = unpack(em_tensor_dtype(t), raw, i);
    free(raw);
    *vals = v;
    *n = cnt;
    return true;
}

/* A fresh input of @p shape. In the strided variant (and unless IN_CONTIG),
 * it is a view with an offset and non-unit strides into a larger tensor
 * whose other elements hold SENTINEL; that tensor is guarded. */
static em_tensor *input(ctx *c, int dti, const int64_t *shape, int nd, double lo, double hi, int flags)
{
    em_dtype dt = (em_dtype)dti;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = gen_value(c, dt, lo, hi, flags);
    if (dt == EM_F32 && c->round_to >= 0) /* the f32 reference of a 16-bit run: the same values */
        for (int64_t i = 0; i < n; i++) v[i] = round_half(c->round_to, v[i]);
    em_tensor *t = NULL;
    size_t es = em_dtype_size(dt);
    const bool can_stride = !(flags & IN_CONTIG) && nd > 0 && n > 0;
    if (can_stride) c->made_strided = true; /* the strided variant differs from the contiguous one */
    if (!c->strided || !can_stride) {
        void *raw = malloc((size_t)(n ? n : 1) * es);
        for (int64_t i = 0; i < n; i++) pack(dt, raw, i, v[i]);
        t = em_from_host(raw, shape, nd, dt);
        free(raw);
    } else {
        /* base: dim 0 padded by one on each side (rank >= 2), last dim 2n+1
         * (view takes every other element starting at 1) */
        int64_t bs[EM_MAX_DIMS], bst[EM_MAX_DIMS];
        for (int i = 0; i < nd; i++) bs[i] = shape[i];
        if (nd >= 2) bs[0] = shape[0] + 2;
        bs[nd - 1] = 2 * shape[nd - 1] + 1;
        int64_t bn = 1;
        for (int i = nd - 1; i >= 0; i--) {
            bst[i] = bn;
            bn *= bs[i];
        }
        double *bv = malloc(sizeof(double) * (size_t)bn);
        for (int64_t i = 0; i < bn; i++) bv[i] = dt == EM_BOOL ? 1.0 : em_dtype_is_float(dt) ? SENTINEL : 77.0;
        for (int64_t i = 0; i < n; i++) {
            int64_t r = i, off = 0;
            for (int d = nd - 1; d >= 0; d--) {
                int64_t ci = r % shape[d];
                r /= shape[d];
                int64_t bi = (d == nd - 1) ? 1 + 2 * ci : (d == 0 && nd >= 2) ? ci + 1 : ci;
                off += bi * bst[d];
            }
            bv[off] = v[i];
        }
        void *raw = malloc((size_t)bn * es);
        for (int64_t i = 0; i < bn; i++) pack(dt, raw, i, bv[i]);
        /* the guard expects the values as stored (rounded to dt) */
        for (int64_t i = 0; i < bn; i++) bv[i] = unpack(dt, raw, i);
        em_tensor *base = em_from_host(raw, bs, nd, dt);
        free(raw);
        if (base) {
            em_scope_begin();
            em_tensor *a = nd >= 2 ? em_narrow(base, 0, 1, shape[0]) : base;
            em_tensor *b = a ? em_slice(a, nd - 1, 1, 1 + 2 * shape[nd - 1], 2) : NULL;
            t = b ? em_keep(b) : NULL;
            em_scope_end();
            add_guard(c, base, bv, NULL, bn, "strided input's storage");
            bv = NULL;
        }
        free(bv);
    }
    free(v);
    if (!t) {
        fail_case(c, "creating an input");
        return NULL;
    }
    if ((flags & IN_GRAD) && em_dtype_is_float(dt)) {
        if (em_set_requires_grad(t, true) != EM_OK) {
            fail_case(c, "em_set_requires_grad");
            return NULL;
        }
        if (c->n_grad < MAX_T) c->grad_in[c->n_grad++] = t;
    }
    return t;
}

/* Contiguous i64 index tensor with values in [lo, hi]. */
static em_tensor *index_input(ctx *c, const int64_t *shape, int nd, int64_t lo, int64_t hi)
{
    return input(c, EM_I64, shape, nd, (double)lo, (double)hi, 0);
}

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define N(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define IN(c, dt, shp, lo, hi, fl) input((c), (dt), S shp, N shp, (lo), (hi), (fl))
#define OUT(c, expr) do { if (!out((c), (expr), #expr)) return false; } while (0)
#define REQ(c, t) do { if (!(t)) return false; } while (0)

/* ---- cases ---------------------------------------------------------------------- */

static bool is_float_dt(int dt) { return dt == EM_F32 || dt == EM_F64 || is_half_dt(dt); }

/* A tensor of dtype c->dt holding @p n values (as stored in that dtype). */
static em_tensor *from_values(ctx *c, const double *v, int64_t n, const int64_t *shape, int nd)
{
    void *raw = malloc((size_t)n * em_dtype_size((em_dtype)c->dt));
    if (!raw) return NULL;
    for (int64_t i = 0; i < n; i++) pack((em_dtype)c->dt, raw, i, v[i]);
    em_tensor *t = em_from_host(raw, shape, nd, (em_dtype)c->dt);
    free(raw);
    return t;
}
static int grad_flag(int dt) { return is_float_dt(dt) ? IN_GRAD : 0; }
/* A 16-bit run, or the f32 reference of one (whose inputs must be the same). */
static bool half_run(const ctx *c) { return is_half_dt(c->dt) || c->round_to >= 0; }

typedef em_tensor *(*unary_fn)(const em_tensor *);

/* The public function of every EW1 kind of tasks/ops.def. */
static unary_fn unary_of(int kind)
{
    switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw) case EM_OP_##E: return em_##nm;
#define EWS(E, nm, fl, fx, ix, bw)
#define EWP(E, nm, fl, fx, ix, bw)
#include "tasks/ops.def"
    default: return NULL;
    }
}

/* unary math: a [13, 37] in the op's domain; plus a large contiguous input
 * (float4 path, several blocks) */
static bool case_unary(ctx *c)
{
    double lo = -3, hi = 3;
    int fl = grad_flag(c->dt);
    switch (c->kind) {
    case EM_OP_LOG: case EM_OP_LOG2: case EM_OP_SQRT: case EM_OP_RSQRT: lo = 0.1; break;
    case EM_OP_ERFINV: lo = -0.95, hi = 0.95; break;
    case EM_OP_HARDSWISH: case EM_OP_HARDSIGMOID: lo = -5, hi = 5; break; /* every piece */
    case EM_OP_LOG1P: lo = -0.5; break;
    case EM_OP_RECIPROCAL: lo = 0.2, hi = 2, fl |= IN_NONZERO; break;
    case EM_OP_SOFTPLUS: lo = -25, hi = 25; break; /* both branches of x > 20 */
    case EM_OP_LOGICAL_NOT: lo = -1, hi = 1, fl |= IN_DISCRETE; break;
    default: break;
    }
    if (!is_float_dt(c->dt) && lo > 0) lo = 1;
    unary_fn f = unary_of(c->kind);
    if (!f) return fail_case(c, "no public function for this unary kind");
    em_tensor *a = IN(c, c->dt, (13, 37), lo, hi, fl);
    REQ(c, a);
    OUT(c, f(a));
    em_tensor *b = IN(c, c->dt, (5000), lo, hi, IN_CONTIG);
    REQ(c, b);
    OUT(c, f(b));
    return true;
}

static bool case_clamp(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (13, 37), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    if (is_float_dt(c->dt)) {
        OUT(c, em_clamp(a, -0.5, 0.7));
        OUT(c, em_clamp(a, -INFINITY, 1.25));
    } else {
        OUT(c, em_clamp(a, -2, 1));
        OUT(c, em_clamp(a, -1.5, 2.5)); /* non-integral bounds: f32 path */
    }
    return true;
}

static bool case_pow_scalar(ctx *c)
{
    if (!is_float_dt(c->dt)) {
        em_tensor *a = IN(c, c->dt, (13, 37), -4, 4, 0);
        REQ(c, a);
        OUT(c, em_pow_scalar(a, 3));
        OUT(c, em_pow_scalar(a, 0.5));
        return true;
    }
    em_tensor *a = IN(c, c->dt, (13, 37), 0.2, 2, IN_GRAD);
    REQ(c, a);
    OUT(c, em_pow_scalar(a, 2.5));
    OUT(c, em_pow_scalar(a, 2));
    OUT(c, em_pow_scalar(a, 0.5));
    OUT(c, em_pow_scalar(a, -1.5));
    return true;
}

static bool case_leaky_elu(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (13, 37), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    if (c->kind == EM_OP_LEAKY_RELU) {
        OUT(c, em_leaky_relu(a, 0.1));
    } else if (c->kind == EM_OP_CELU) {
        OUT(c, em_celu(a, 1.0));
        OUT(c, em_celu(a, 0.5));
    } else {
        OUT(c, em_elu(a, 1.0));
        OUT(c, em_elu(a, 0.3));
    }
    return true;
}

typedef em_tensor *(*scalar_fn)(const em_tensor *, double);

/* The public function of every EWS kind of tasks/ops.def. */
static scalar_fn scalar_of(int kind)
{
    switch (kind) {
#define EWS(E, nm, fl, fx, ix, bw) case EM_OP_##E: return em_##nm;
#define EW1(E, nm, fl, fx, ix, bw)
#include "tasks/ops.def"
    default: return NULL;
    }
}

static bool case_scalar(ctx *c)
{
    scalar_fn f = scalar_of(c->kind);
    const bool cmp = (g_ops[c->kind].flags & F_CMP) != 0;
    em_tensor *a = IN(c, c->dt, (13, 37), -3, 3, (cmp ? IN_DISCRETE : 0) | grad_flag(c->dt));
    REQ(c, a);
    if (cmp) {
        OUT(c, f(a, 0.5));
        OUT(c, f(a, 1));
        return true;
    }
    if (is_float_dt(c->dt)) {
        OUT(c, f(a, 1.5));
        OUT(c, f(a, -0.75));
    } else {
        OUT(c, f(a, 2));
        OUT(c, f(a, -3));
        OUT(c, f(a, 0.5)); /* non-integral scalar: f32 path */
    }
    return true;
}

typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);

/* The public function of every EW2 kind of tasks/ops.def. */
static binary_fn binary_of(int kind)
{
    switch (kind) {
#define EW2(E, nm, fl, fx, ix, bw) case EM_OP_##E: return em_##nm;
#include "tasks/ops.def"
    default: return NULL;
    }
}

/* a [13, 37] op b [37] (broadcast) and a op a2 [13, 37] (same shape, contiguous
 * and large: float4 path) */
static bool case_binary(ctx *c)
{
    binary_fn f = binary_of(c->kind);
    const bool cmp = (g_ops[c->kind].flags & F_CMP) != 0;
    int fa = grad_flag(c->dt) | (cmp ? IN_DISCRETE : 0), fb = fa;
    double alo = -3, ahi = 3, blo = -3, bhi = 3;
    switch (c->kind) {
    case EM_OP_DIV: blo = 0.5, bhi = 2, fb |= IN_NONZERO; break;
    case EM_OP_REMAINDER: case EM_OP_FMOD: case EM_OP_FLOOR_DIVIDE:
        blo = 0.5, bhi = 2, fb |= IN_NONZERO;
        /* 16 bits: a quotient a / b near an integer would round to it in a
         * 16-bit intermediate (the backward's) and step the result;
         * multiples of 0.5 keep quotients exact or >= 1/4 from one */
        if (half_run(c)) fa |= IN_DISCRETE, fb |= IN_DISCRETE;
        break;
    case EM_OP_POW: alo = 0.2, ahi = 2, blo = -1.5, bhi = 1.5; break;
    default: break;
    }
    if (!is_float_dt(c->dt) && (c->kind == EM_OP_DIV || c->kind == EM_OP_REMAINDER || c->kind == EM_OP_FMOD ||
                                c->kind == EM_OP_FLOOR_DIVIDE))
        blo = 1, bhi = 3, alo = c->kind == EM_OP_DIV ? alo : 1; /* integer division by zero is an error on the CPU */
    em_tensor *a = IN(c, c->dt, (13, 37), alo, ahi, fa);
    em_tensor *b = IN(c, c->dt, (37), blo, bhi, fb);
    REQ(c, a);
    REQ(c, b);
    OUT(c, f(a, b));
    em_tensor *bc = IN(c, c->dt, (13, 1), blo, bhi, fb);
    REQ(c, bc);
    OUT(c, f(bc, a)); /* broadcast on the left operand, other axis */
    em_tensor *a2 = IN(c, c->dt, (64, 80), alo, ahi, IN_CONTIG | fa);
    em_tensor *b2 = IN(c, c->dt, (64, 80), blo, bhi, IN_CONTIG | fb);
    REQ(c, a2);
    REQ(c, b2);
    OUT(c, f(a2, b2));
    return true;
}

static bool case_where(ctx *c)
{
    em_tensor *m = IN(c, EM_BOOL, (13, 1), 0, 1, 0);
    em_tensor *a = IN(c, c->dt, (13, 37), -3, 3, grad_flag(c->dt));
    em_tensor *b = IN(c, c->dt, (37), -3, 3, grad_flag(c->dt));
    em_tensor *m2 = IN(c, EM_BOOL, (13, 37), 0, 1, 0);
    REQ(c, m);
    REQ(c, a);
    REQ(c, b);
    REQ(c, m2);
    OUT(c, em_where(m, a, b));
    OUT(c, em_where(m2, b, a));
    OUT(c, em_masked_fill(a, m2, 9.5));
    return true;
}

/* Reductions over several layouts: rows (warp / block per row), columns,
 * everything (split over blocks), keepdim, 3-D with two reduced dims. */
static bool case_reduce(ctx *c)
{
    const int k = c->kind;
    const int fl = (g_ops[k].flags & F_DIFF) ? grad_flag(c->dt) : 0;
    double lo = -2, hi = 2;
    int extra = 0;
    if (k == EM_OP_PROD) lo = 0.6, hi = 1.4;
    if (k == EM_OP_ANY || k == EM_OP_ALL) lo = 0, hi = 1, extra = IN_DISCRETE;
    if ((k == EM_OP_ARGMAX || k == EM_OP_ARGMIN || k == EM_OP_MAX || k == EM_OP_MIN) && !is_float_dt(c->dt)) lo = 0, hi = 3; /* ties */
    em_tensor *a = IN(c, c->dt, (6, 37), lo, hi, fl | extra);
    em_tensor *big = k == EM_OP_PROD ? NULL : IN(c, c->dt, (3, 20000), lo, hi, fl | extra | IN_CONTIG);
    em_tensor *wide = k == EM_OP_PROD ? NULL : IN(c, c->dt, (4, 3000), lo, hi, fl | extra);
    em_tensor *tall = IN(c, c->dt, (300, 5), lo, hi, fl | extra);
    em_tensor *cube = IN(c, c->dt, (4, 5, 6), lo, hi, fl | extra);
    REQ(c, a);
    REQ(c, tall);
    REQ(c, cube);
    if (k != EM_OP_PROD) {
        REQ(c, big);
        REQ(c, wide);
    }
    const int d1[1] = {1}, d0[1] = {0}, d02[2] = {0, 2}, dm1[1] = {-1};
    switch (k) {
    case EM_OP_ARGMAX:
    case EM_OP_ARGMIN: {
        em_tensor *(*f)(const em_tensor *, int, bool) = k == EM_OP_ARGMAX ? em_argmax : em_argmin;
        OUT(c, f(a, 1, false));
        OUT(c, f(a, 0, true));
        OUT(c, f(big, 1, false));
        OUT(c, f(wide, -1, false));
        OUT(c, f(tall, 0, false));
        OUT(c, f(cube, 1, false));
        if (is_float_dt(c->dt)) { /* NaN: the first NaN wins */
            const double nanv[8] = {1, NAN, 3, NAN, -1, 2, 2, 0};
            em_tensor *t = from_values(c, nanv, 8, S(2, 4), 2);
            REQ(c, t);
            OUT(c, f(t, 1, false));
            OUT(c, f(t, 0, false));
        }
        return true;
    }
    case EM_OP_VAR:
        OUT(c, em_var(a, d1, 1, 1.0, false));
        OUT(c, em_var(a, d0, 1, 0.0, true));
        OUT(c, em_var(big, NULL, 0, 1.0, false));
        OUT(c, em_var(wide, dm1, 1, 1.0, false));
        OUT(c, em_var(tall, d0, 1, 1.0, false));
        OUT(c, em_var(cube, d02, 2, 1.0, false));
        return true;
    default: break;
    }
    em_tensor *(*f)(const em_tensor *, const int *, int, bool) = NULL;
    switch (k) {
    case EM_OP_SUM: f = em_sum; break;
    case EM_OP_PROD: f = em_prod; break;
    case EM_OP_MAX: f = em_max; break;
    case EM_OP_MIN: f = em_min; break;
    case EM_OP_ANY: f = em_any; break;
    case EM_OP_ALL: f = em_all; break;
    case EM_OP_LOGSUMEXP: f = em_logsumexp; break;
    default: return fail_case(c, "case_reduce: unexpected kind");
    }
    OUT(c, f(a, d1, 1, false));
    OUT(c, f(a, d0, 1, true));
    OUT(c, f(tall, d0, 1, false)); /* column mode */
    OUT(c, f(cube, d02, 2, false));
    if (k != EM_OP_PROD) {
        OUT(c, f(big, NULL, 0, false)); /* everything: split over blocks */
        OUT(c, f(big, d1, 1, false));
        OUT(c, f(wide, dm1, 1, true)); /* block per row */
    }
    if (k == EM_OP_LOGSUMEXP && is_float_dt(c->dt)) { /* -inf rows, +inf */
        const double v[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, 1, INFINITY, 2, 3};
        em_tensor *t = from_values(c, v, 8, S(2, 4), 2);
        REQ(c, t);
        OUT(c, f(t, d1, 1, false));
    }
    if (k == EM_OP_SUM && is_float_dt(c->dt)) OUT(c, em_mean(a, d1, 1, false));
    return true;
}

static bool case_softmax(ctx *c)
{
    em_tensor *(*f)(const em_tensor *, int) = c->kind == EM_OP_SOFTMAX ? em_softmax : em_log_softmax;
    em_tensor *a = IN(c, c->dt, (6, 37), -4, 4, grad_flag(c->dt));
    em_tensor *b = IN(c, c->dt, (3, 1500), -4, 4, grad_flag(c->dt));
    em_tensor *d = IN(c, c->dt, (3, 4, 5), -4, 4, grad_flag(c->dt));
    REQ(c, a);
    REQ(c, b);
    REQ(c, d);
    OUT(c, f(a, -1));
    OUT(c, f(a, 0)); /* strided rows */
    OUT(c, f(b, 1)); /* block per row */
    OUT(c, f(d, 1));
    return true;
}

static bool case_matmul(ctx *c)
{
    const int fl = grad_flag(c->dt);
    const double lo = is_float_dt(c->dt) ? -1 : -3, hi = is_float_dt(c->dt) ? 1 : 3;
    em_tensor *a = IN(c, c->dt, (5, 7), lo, hi, fl);
    em_tensor *b = IN(c, c->dt, (7, 3), lo, hi, fl);
    em_tensor *bt = IN(c, c->dt, (3, 7), lo, hi, fl | IN_CONTIG); /* used transposed */
    em_tensor *x = IN(c, c->dt, (2, 3, 4, 6), lo, hi, fl | IN_CONTIG);
    em_tensor *w = IN(c, c->dt, (6, 5), lo, hi, fl);
    em_tensor *p = IN(c, c->dt, (2, 1, 4, 6), lo, hi, fl);
    em_tensor *q = IN(c, c->dt, (3, 6, 2), lo, hi, fl);
    em_tensor *v = IN(c, c->dt, (7), lo, hi, fl);
    em_tensor *big_a = IN(c, c->dt, (64, 96), lo, hi, fl | IN_CONTIG);
    em_tensor *big_b = IN(c, c->dt, (96, 80), lo, hi, fl);
    REQ(c, a);
    REQ(c, b);
    REQ(c, bt);
    REQ(c, x);
    REQ(c, w);
    REQ(c, p);
    REQ(c, q);
    REQ(c, v);
    REQ(c, big_a);
    REQ(c, big_b);
    em_tensor *btt = em_transpose(bt, 0, 1);
    REQ(c, btt);
    OUT(c, em_matmul(a, b));
    OUT(c, em_matmul(a, btt));                    /* Trans operand */
    OUT(c, em_matmul(em_transpose(b, 0, 1), em_transpose(a, 0, 1))); /* both transposed */
    OUT(c, em_matmul(x, w));                      /* batch folds into M */
    OUT(c, em_matmul(p, q));                      /* broadcast batch */
    OUT(c, em_matmul(a, v));                      /* 2-D x 1-D */
    OUT(c, em_matmul(v, b));                      /* 1-D x 2-D */
    OUT(c, em_matmul(v, v));                      /* dot */
    OUT(c, em_matmul(big_a, big_b));
    return true;
}

static bool case_copy(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *a = IN(c, c->dt, (9, 11), -3, 3, fl);
    REQ(c, a);
    OUT(c, em_contiguous(em_transpose(a, 0, 1)));
    /* every dtype pair (a cast to the same dtype too, so that a 16-bit run and
     * its f32 reference give the same list) */
    static const int casts[] = {EM_F32, EM_F64, EM_I32, EM_I64, EM_U8, EM_BOOL, EM_F16, EM_BF16};
    for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++) OUT(c, em_cast(a, (em_dtype)casts[i]));
    /* em_copy_ into a strided slice of a sentinel-filled tensor: the sentinel
     * around the slice must survive */
    if (is_float_dt(c->dt) || c->dt == EM_I32 || c->dt == EM_I64) {
        const int64_t R = 7, C = 9;
        double *fillv = malloc(sizeof(double) * (size_t)(R * C));
        void *raw = malloc((size_t)(R * C) * em_dtype_size((em_dtype)c->dt));
        for (int64_t i = 0; i < R * C; i++) {
            pack((em_dtype)c->dt, raw, i, is_float_dt(c->dt) ? SENTINEL : 77.0);
            fillv[i] = unpack((em_dtype)c->dt, raw, i); /* as stored (rounded in 16 bits) */
        }
        em_tensor *dst = em_from_host(raw, S(7, 9), 2, (em_dtype)c->dt);
        free(raw);
        if (!dst) {
            free(fillv);
            return fail_case(c, "em_from_host");
        }
        em_tensor *view = em_slice(em_narrow(dst, 0, 2, 4), 1, 1, 9, 3); /* rows 2..5, cols 1, 4, 7 */
        em_tensor *src = IN(c, c->dt, (4, 3), -3, 3, 0);
        unsigned char *mask = calloc((size_t)(R * C), 1);
        for (int64_t r = 0; r < R; r++)
            for (int64_t q = 0; q < C; q++) mask[r * C + q] = !(r >= 2 && r < 6 && q >= 1 && (q - 1) % 3 == 0);
        add_guard(c, dst, fillv, mask, R * C, "em_copy_ destination around the slice");
        if (!view || !src || em_copy_(view, src) != EM_OK) return fail_case(c, "em_copy_");
        OUT(c, dst);
        em_tensor *b = IN(c, c->dt, (3), -3, 3, 0);
        REQ(c, b);
        if (em_copy_(em_narrow(view, 0, 1, 2), b) != EM_OK) return fail_case(c, "em_copy_ (broadcast)");
        OUT(c, dst);
    }
    return true;
}

static bool case_gather(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (6, 8), -3, 3, grad_flag(c->dt));
    em_tensor *i1 = index_input(c, S(6, 5), 2, 0, 7); /* in range: an out-of-range index is an error on the CPU (test_edges) */
    em_tensor *i0 = index_input(c, S(4, 8), 2, 0, 5);
    REQ(c, a);
    REQ(c, i1);
    REQ(c, i0);
    OUT(c, em_gather(a, 1, i1));
    OUT(c, em_gather(a, 0, i0));
    return true;
}

static bool case_index_select(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (7, 5), -3, 3, grad_flag(c->dt));
    em_tensor *i = index_input(c, S(9), 1, 0, 6);
    em_tensor *j = index_input(c, S(4), 1, 0, 4);
    REQ(c, a);
    REQ(c, i);
    REQ(c, j);
    OUT(c, em_index_select(a, 0, i));
    OUT(c, em_index_select(a, 1, j));
    return true;
}

static bool case_scatter(ctx *c)
{
    em_tensor *(*f)(const em_tensor *, int, const em_tensor *, const em_tensor *) =
        c->kind == EM_OP_SCATTER ? em_scatter : em_scatter_add;
    const int fl = grad_flag(c->dt);
    em_tensor *self = IN(c, c->dt, (6, 8), -3, 3, fl);
    em_tensor *src = IN(c, c->dt, (6, 5), -3, 3, fl);
    em_tensor *i1 = index_input(c, S(6, 5), 2, 0, 7); /* duplicates; out-of-range values: test_edges */
    em_tensor *src0 = IN(c, c->dt, (9, 8), -3, 3, fl);
    em_tensor *i0 = index_input(c, S(9, 8), 2, 0, 5);
    REQ(c, self);
    REQ(c, src);
    REQ(c, i1);
    REQ(c, src0);
    REQ(c, i0);
    OUT(c, f(self, 1, i1, src));
    OUT(c, f(self, 0, i0, src0));
    return true;
}

/* index_add: duplicates (in range: out of range is a CPU error, tested in
 * test_index), dim 0, a middle dim, long segments (~50 rows per output
 * slice: CUDA's sorted segments, its batches of 8 and the tail) and a long
 * index (CUDA's fallback). */
static bool case_index_add(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *self = IN(c, c->dt, (7, 5), -3, 3, fl);
    em_tensor *src = IN(c, c->dt, (9, 5), -3, 3, fl);
    em_tensor *i0 = index_input(c, S(9), 1, 0, 6);
    em_tensor *self1 = IN(c, c->dt, (3, 4, 5), -3, 3, fl);
    em_tensor *src1 = IN(c, c->dt, (3, 6, 5), -3, 3, fl);
    em_tensor *i1 = index_input(c, S(6), 1, 0, 3);
    em_tensor *self2 = IN(c, c->dt, (4, 6), -3, 3, fl);
    em_tensor *src2 = IN(c, c->dt, (203, 6), -3, 3, fl);
    em_tensor *i2 = index_input(c, S(203), 1, 0, 3);
    REQ(c, self);
    REQ(c, src);
    REQ(c, i0);
    REQ(c, self1);
    REQ(c, src1);
    REQ(c, i1);
    REQ(c, self2);
    REQ(c, src2);
    REQ(c, i2);
    OUT(c, em_index_add(self, 0, i0, src));
    OUT(c, em_index_add(self1, 1, i1, src1));
    OUT(c, em_index_add(self2, 0, i2, src2));
    /* N = 270000 > the default 4 MiB CUDA workspace's 16 N bytes: CUDA's
     * fallback (the fibre walk), ~90000 rows summed per output element */
    em_tensor *self3 = IN(c, c->dt, (3), -3, 3, 0);
    em_tensor *src3 = IN(c, c->dt, (270000), -3, 3, 0);
    em_tensor *i3 = index_input(c, S(270000), 1, 0, 2);
    REQ(c, self3);
    REQ(c, src3);
    REQ(c, i3);
    OUT(c, em_index_add(self3, 0, i3, src3));
    return true;
}

static bool case_one_hot(ctx *c)
{
    em_tensor *i = index_input(c, S(4, 6), 2, 0, 4);
    REQ(c, i);
    OUT(c, em_one_hot(i, 5));
    em_tensor *j = index_input(c, S(300), 1, 0, 9);
    REQ(c, j);
    OUT(c, em_one_hot(j, 10));
    return true;
}

/* ---- convolution and pooling ---- */

/* The gradient of sum(y * w) with respect to @p x (w a fixed random tensor of
 * y's shape), computed inside the case: the kernels of the non-differentiable
 * backward kinds (CONV2D_BWD_WEIGHT, AVG_POOL2D_BWD) only run there. */
static bool out_grad(ctx *c, em_tensor *y, em_tensor *x, const char *what)
{
    if (!y) return fail_case(c, what);
    em_tensor *w = input(c, em_tensor_dtype(y), em_tensor_shape(y), em_tensor_ndim(y), -1, 1, IN_CONTIG);
    em_tensor *loss = w ? em_sum_all(em_mul(y, w)) : NULL;
    em_grads *g = loss ? em_backward(loss) : NULL;
    if (!g) return fail_case(c, what);
    bool ok = out(c, em_grad(g, x), what);
    em_grads_free(g);
    return ok;
}

static bool case_conv(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *x = IN(c, c->dt, (2, 4, 7, 6), -2, 2, fl);
    em_tensor *w = IN(c, c->dt, (6, 2, 3, 3), -1, 1, fl);
    em_tensor *b = IN(c, c->dt, (6), -1, 1, fl);
    em_tensor *x1 = IN(c, c->dt, (1, 3, 5, 5), -2, 2, fl);
    em_tensor *w1 = IN(c, c->dt, (4, 3, 1, 1), -1, 1, fl);
    REQ(c, x);
    REQ(c, w);
    REQ(c, b);
    REQ(c, x1);
    REQ(c, w1);
    em_conv_opts o = em_conv_opts_default(), d = em_conv_opts_default();
    o.groups = 2, o.stride[0] = 2, o.padding[0] = 1, o.padding[1] = 2, o.dilation[1] = 2;
    if (c->kind == EM_OP_CONV2D) {
        em_tensor *xd = IN(c, c->dt, (2, 3, 6, 5), -2, 2, fl);
        em_tensor *wd = IN(c, c->dt, (3, 1, 2, 2), -1, 1, fl);
        em_tensor *xl = IN(c, c->dt, (2, 3, 9), -2, 2, fl);
        em_tensor *wl = IN(c, c->dt, (4, 3, 3), -1, 1, fl);
        REQ(c, xd);
        REQ(c, wd);
        REQ(c, xl);
        REQ(c, wl);
        OUT(c, em_conv2d(x, w, b, &o));
        OUT(c, em_conv2d(x1, w1, NULL, &d)); /* 1x1: no im2col on the CPU */
        em_conv_opts s = em_conv_opts_default();
        s.groups = 3, s.padding_same = true; /* depthwise, even kernel: asymmetric padding */
        OUT(c, em_conv2d(xd, wd, NULL, &s));
        em_conv_opts a = em_conv_opts_default();
        a.stride[1] = 2, a.padding[0] = 2, a.padding_end[0] = 0, a.padding[1] = 1;
        OUT(c, em_conv2d(x1, w1, NULL, &a));
        em_conv_opts l = em_conv_opts_default();
        l.stride[0] = 2, l.padding[0] = 1, l.dilation[0] = 2;
        OUT(c, em_conv1d(xl, wl, NULL, &l));
        return true;
    }
    if (c->kind == EM_OP_CONV2D_BWD_DATA) { /* conv_transpose2d's forward */
        em_tensor *xt = IN(c, c->dt, (2, 4, 3, 4), -2, 2, fl);
        em_tensor *wt = IN(c, c->dt, (4, 3, 3, 3), -1, 1, fl);
        em_tensor *bt = IN(c, c->dt, (3), -1, 1, fl);
        em_tensor *wg = IN(c, c->dt, (4, 2, 3, 3), -1, 1, fl);
        REQ(c, xt);
        REQ(c, wt);
        REQ(c, bt);
        REQ(c, wg);
        em_conv_opts t = em_conv_opts_default();
        t.stride[0] = t.stride[1] = 2, t.padding[0] = t.padding[1] = 1, t.output_padding[0] = t.output_padding[1] = 1;
        OUT(c, em_conv_transpose2d(xt, wt, bt, &t));
        em_conv_opts tg = em_conv_opts_default();
        tg.groups = 2, tg.stride[0] = 2, tg.padding[1] = 1, tg.output_padding[0] = 1, tg.dilation[1] = 2;
        OUT(c, em_conv_transpose2d(xt, wg, NULL, &tg));
        return true;
    }
    /* CONV2D_BWD_WEIGHT: weight gradients */
    c->no_backward = true;
    if (!out_grad(c, em_conv2d(x, w, b, &o), w, "weight gradient (groups, stride, dilation)")) return false;
    return out_grad(c, em_conv2d(x1, w1, NULL, &d), w1, "weight gradient (1x1)");
}

static bool case_pool(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *x = IN(c, c->dt, (2, 3, 9, 8), -2, 2, fl);
    em_tensor *t = IN(c, c->dt, (1, 2, 7, 7), -1, 1, fl | IN_DISCRETE); /* ties */
    REQ(c, x);
    REQ(c, t);
    em_pool_opts o = em_pool_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1;
    em_pool_opts ceil2 = em_pool_opts_default(2, 3);
    ceil2.ceil_mode = true, ceil2.stride[1] = 2, ceil2.padding[1] = 1;
    if (c->kind == EM_OP_MAX_POOL2D) {
        em_tensor *idx = NULL;
        OUT(c, em_max_pool2d(x, &o, &idx));
        OUT(c, idx);
        OUT(c, em_max_pool2d(t, &ceil2, &idx));
        OUT(c, idx);
        em_pool_opts dl = em_pool_opts_default(3, 2);
        dl.stride[0] = dl.stride[1] = 1, dl.padding[0] = 1, dl.dilation[0] = 2, dl.dilation[1] = 3;
        OUT(c, em_max_pool2d(x, &dl, NULL));
        OUT(c, em_adaptive_max_pool2d(x, 4, 3, &idx));
        OUT(c, idx);
        return true;
    }
    em_pool_opts ex = o, dv = ceil2;
    ex.count_include_pad = false;
    dv.divisor_override = 5;
    if (c->kind == EM_OP_AVG_POOL2D) {
        OUT(c, em_avg_pool2d(x, &o));
        OUT(c, em_avg_pool2d(x, &ex));
        OUT(c, em_avg_pool2d(t, &ceil2));
        OUT(c, em_avg_pool2d(t, &dv));
        OUT(c, em_adaptive_avg_pool2d(x, 4, 3));
        OUT(c, em_adaptive_avg_pool2d(t, 9, 10)); /* more outputs than inputs: overlapping windows */
        return true;
    }
    /* AVG_POOL2D_BWD: input gradients */
    c->no_backward = true;
    if (!out_grad(c, em_avg_pool2d(x, &ex), x, "avg_pool2d gradient (count_include_pad false)")) return false;
    if (!out_grad(c, em_avg_pool2d(t, &dv), t, "avg_pool2d gradient (ceil, divisor)")) return false;
    return out_grad(c, em_adaptive_avg_pool2d(t, 9, 10), t, "adaptive_avg_pool2d gradient");
}

/* More conv / pool variants, written with the OpenCL kernels (the table runs
 * them after case_conv / case_pool): mixed strides, dilations and paddings
 * per axis, 'same' padding with dilation, conv_transpose with dilation and
 * output_padding on both axes, max pooling's NaN rule (a NaN is a maximum,
 * the last NaN wins) and ceil_mode with dilation, avg pooling windows that
 * overlap (stride < kernel) with each divisor rule. */
static em_conv_opts conv_opts_x(int64_t s0, int64_t s1, int64_t p0, int64_t p1, int64_t d0, int64_t d1, int64_t g)
{
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = s0, o.stride[1] = s1;
    o.padding[0] = p0, o.padding[1] = p1;
    o.dilation[0] = d0, o.dilation[1] = d1;
    o.groups = g;
    return o;
}

static bool case_conv_extra(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *x = IN(c, c->dt, (2, 4, 9, 8), -1, 1, fl);
    REQ(c, x);
    if (c->kind == EM_OP_CONV2D) {
        em_tensor *w = IN(c, c->dt, (6, 4, 3, 3), -1, 1, fl);
        em_tensor *wg = IN(c, c->dt, (6, 2, 3, 2), -1, 1, fl);
        em_tensor *wd = IN(c, c->dt, (8, 1, 2, 3), -1, 1, fl);
        REQ(c, w);
        REQ(c, wg);
        REQ(c, wd);
        em_conv_opts o = conv_opts_x(2, 3, 1, 2, 2, 1, 2);
        OUT(c, em_conv2d(x, wg, NULL, &o));
        o = conv_opts_x(2, 1, 1, 0, 1, 2, 4); /* 2 outputs per input channel */
        OUT(c, em_conv2d(x, wd, NULL, &o));
        o = conv_opts_x(1, 2, 0, 1, 1, 1, 1);
        o.padding_end[0] = 2;
        OUT(c, em_conv2d(x, w, NULL, &o));
        o = conv_opts_x(1, 1, 0, 0, 2, 2, 1);
        o.padding_same = true;
        OUT(c, em_conv2d(x, w, NULL, &o));
        return true;
    }
    if (c->kind == EM_OP_CONV2D_BWD_DATA) {
        em_tensor *xt = IN(c, c->dt, (2, 4, 5, 6), -1, 1, fl);
        em_tensor *w = IN(c, c->dt, (4, 3, 3, 3), -1, 1, fl);
        em_tensor *wg = IN(c, c->dt, (4, 2, 2, 3), -1, 1, fl);
        REQ(c, xt);
        REQ(c, w);
        REQ(c, wg);
        em_conv_opts o = conv_opts_x(2, 3, 1, 1, 1, 1, 1);
        o.output_padding[0] = 1, o.output_padding[1] = 2;
        OUT(c, em_conv_transpose2d(xt, w, NULL, &o));
        o = conv_opts_x(2, 2, 1, 0, 2, 1, 2);
        o.output_padding[0] = 1;
        OUT(c, em_conv_transpose2d(xt, wg, NULL, &o));
        return true;
    }
    em_tensor *xw = IN(c, c->dt, (3, 4, 10, 7), -1, 1, fl);
    em_tensor *w = IN(c, c->dt, (6, 2, 3, 3), -1, 1, fl);
    REQ(c, xw);
    REQ(c, w);
    em_conv_opts o = conv_opts_x(2, 1, 2, 1, 1, 2, 2);
    if (!out_grad(c, em_conv2d(xw, w, NULL, &o), w, "weight gradient (stride, padding, dilation per axis)")) return false;
    if (!out_grad(c, em_conv2d(xw, w, NULL, &o), xw, "input gradient (stride, padding, dilation per axis)")) return false;
    /* few weights, long sums (N * OH * OW >= 4096): OpenCL's work-group reduction */
    em_tensor *xl = IN(c, c->dt, (2, 2, 46, 46), -1, 1, fl);
    em_tensor *wl = IN(c, c->dt, (4, 1, 3, 3), -1, 1, fl);
    REQ(c, xl);
    REQ(c, wl);
    o = conv_opts_x(1, 1, 1, 2, 1, 2, 2);
    return out_grad(c, em_conv2d(xl, wl, NULL, &o), wl, "weight gradient (long sums, groups, dilation)");
}

static em_pool_opts pool_opts_x(int64_t k0, int64_t k1, int64_t s0, int64_t s1, int64_t p0, int64_t p1)
{
    em_pool_opts o = em_pool_opts_default(k0, k1);
    o.stride[0] = s0, o.stride[1] = s1;
    o.padding[0] = p0, o.padding[1] = p1;
    return o;
}

static bool case_pool_extra(ctx *c)
{
    const int fl = grad_flag(c->dt);
    if (c->kind == EM_OP_MAX_POOL2D) {
        em_tensor *x = IN(c, c->dt, (2, 3, 9, 10), -2, 2, fl | IN_DISCRETE);
        REQ(c, x);
        em_tensor *idx = NULL;
        em_pool_opts o = pool_opts_x(3, 2, 2, 1, 1, 1);
        o.dilation[0] = 2, o.ceil_mode = true;
        OUT(c, em_max_pool2d(x, &o, &idx));
        OUT(c, idx);
        o = pool_opts_x(3, 3, 2, 3, 1, 0);
        o.ceil_mode = true; /* a last window in the end padding is dropped */
        OUT(c, em_max_pool2d(x, &o, &idx));
        OUT(c, idx);
        OUT(c, em_adaptive_max_pool2d(x, 9, 10, &idx));
        OUT(c, idx);
        const double v[16] = {1, NAN, 3, 2, NAN, 0, 5, 5, -1, -1, -1, NAN, 7, NAN, 4, 4};
        void *raw = malloc(16 * em_dtype_size((em_dtype)c->dt));
        for (int i = 0; i < 16; i++) pack((em_dtype)c->dt, raw, i, v[i]);
        em_tensor *xn = em_from_host(raw, S(1, 1, 4, 4), 4, (em_dtype)c->dt);
        free(raw);
        REQ(c, xn);
        o = pool_opts_x(2, 2, 2, 2, 0, 0);
        OUT(c, em_max_pool2d(xn, &o, &idx));
        OUT(c, idx);
        o = pool_opts_x(3, 3, 1, 1, 1, 1);
        OUT(c, em_max_pool2d(xn, &o, &idx));
        OUT(c, idx);
        return true;
    }
    em_tensor *x = IN(c, c->dt, (2, 3, 11, 8), -1, 1, fl);
    REQ(c, x);
    em_pool_opts a = pool_opts_x(3, 2, 2, 1, 1, 1), b = pool_opts_x(4, 3, 3, 2, 2, 1), d = pool_opts_x(3, 2, 1, 2, 1, 1);
    a.ceil_mode = true, a.count_include_pad = false;
    b.ceil_mode = true;
    d.divisor_override = 7;
    if (c->kind == EM_OP_AVG_POOL2D) {
        OUT(c, em_avg_pool2d(x, &a));
        OUT(c, em_avg_pool2d(x, &b));
        OUT(c, em_avg_pool2d(x, &d));
        OUT(c, em_adaptive_avg_pool2d(x, 5, 7));
        OUT(c, em_adaptive_avg_pool2d(x, 1, 1));
        return true;
    }
    if (!out_grad(c, em_avg_pool2d(x, &a), x, "avg_pool2d gradient (overlap, ceil, count_include_pad false)")) return false;
    if (!out_grad(c, em_avg_pool2d(x, &b), x, "avg_pool2d gradient (ceil, padding)")) return false;
    if (!out_grad(c, em_avg_pool2d(x, &d), x, "avg_pool2d gradient (overlap, divisor)")) return false;
    if (!out_grad(c, em_adaptive_avg_pool2d(x, 4, 5), x, "adaptive_avg_pool2d gradient")) return false;
    return out_grad(c, em_adaptive_avg_pool2d(x, 13, 3), x, "adaptive_avg_pool2d gradient (more rows than the input)");
}

static bool case_conv_all(ctx *c) { return case_conv(c) && case_conv_extra(c); }
static bool case_pool_all(ctx *c) { return case_pool(c) && case_pool_extra(c); }

/* Training-mode batch norm (the fused BATCH_NORM / BATCH_NORM_BWD /
 * BATCH_NORM_RUNNING ops):
 * [N, C, H, W] with running statistics, [N, C] with a weight only, a 5-D
 * input without affine parameters, long channel rows (the CUDA kernel walks
 * them row by row) and an input far from zero (the two-pass variance). */
static bool case_batch_norm(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *x = IN(c, c->dt, (4, 3, 5, 6), -2, 2, fl);
    em_tensor *w = IN(c, c->dt, (3), -1.5, 1.5, fl);
    em_tensor *b = IN(c, c->dt, (3), -1, 1, fl);
    em_tensor *x2 = IN(c, c->dt, (6, 4), -2, 2, fl);
    em_tensor *w2 = IN(c, c->dt, (4), 0.5, 1.5, fl);
    em_tensor *x5 = IN(c, c->dt, (2, 2, 3, 2, 2), -2, 2, fl);
    em_tensor *xl = IN(c, c->dt, (2, 3, 40, 16), -2, 2, fl);
    em_tensor *xo = IN(c, c->dt, (3, 2, 4, 4), 50, 54, fl);
    REQ(c, x);
    REQ(c, w);
    REQ(c, b);
    REQ(c, x2);
    REQ(c, w2);
    REQ(c, x5);
    REQ(c, xl);
    REQ(c, xo);
    if (c->kind != EM_OP_BATCH_NORM_BWD) { /* BATCH_NORM, BATCH_NORM_RUNNING (rm, rv) */
        em_tensor *rm = IN(c, c->dt, (3), -0.5, 0.5, IN_CONTIG), *rv = IN(c, c->dt, (3), 0.5, 1.5, IN_CONTIG);
        REQ(c, rm);
        REQ(c, rv);
        OUT(c, em_batch_norm(x, rm, rv, w, b, true, 0.1, 1e-5));
        OUT(c, rm);
        OUT(c, rv);
        em_tensor *rm2 = IN(c, c->dt, (4), -0.5, 0.5, IN_CONTIG), *rv2 = IN(c, c->dt, (4), 0.5, 1.5, IN_CONTIG);
        REQ(c, rm2);
        REQ(c, rv2);
        OUT(c, em_batch_norm(x2, rm2, rv2, w2, NULL, true, 0.3, 1e-3));
        OUT(c, rm2);
        OUT(c, rv2);
        OUT(c, em_batch_norm(x5, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
        OUT(c, em_batch_norm(xl, NULL, NULL, NULL, b, true, 0.1, 1e-5));
        OUT(c, em_batch_norm(xo, NULL, NULL, NULL, NULL, true, 0.1, 1e-5));
        return true;
    }
    /* BATCH_NORM_BWD: the gradients, computed inside the case */
    c->no_backward = true;
    if (!out_grad(c, em_batch_norm(x, NULL, NULL, w, b, true, 0.1, 1e-5), x, "batch_norm input gradient")) return false;
    if (!out_grad(c, em_batch_norm(x, NULL, NULL, w, b, true, 0.1, 1e-5), w, "batch_norm weight gradient")) return false;
    if (!out_grad(c, em_batch_norm(x, NULL, NULL, w, b, true, 0.1, 1e-5), b, "batch_norm bias gradient")) return false;
    if (!out_grad(c, em_batch_norm(x2, NULL, NULL, w2, NULL, true, 0.1, 1e-3), x2, "batch_norm [N, C] gradient")) return false;
    if (!out_grad(c, em_batch_norm(x5, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), x5, "batch_norm 5-D gradient")) return false;
    if (!out_grad(c, em_batch_norm(xl, NULL, NULL, NULL, b, true, 0.1, 1e-5), xl, "batch_norm long rows gradient")) return false;
    return out_grad(c, em_batch_norm(xo, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), xo, "batch_norm offset input gradient");
}

/* Layer norm (the fused LAYER_NORM / LAYER_NORM_BWD ops: em_layer_norm with
 * weight and bias): rows of 7 values (CUDA: a warp per row, idle lanes),
 * 384 normalized over two dims, 2048 (CUDA: a block per row), an input far
 * from zero (the two-pass variance), and 1024 rows of 24 (CUDA: the
 * dweight / dbias column reduction in row chunks, then their sum). */
static bool case_layer_norm(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *x = IN(c, c->dt, (3, 7), -2, 2, fl);
    em_tensor *w = IN(c, c->dt, (7), 0.5, 1.5, fl);
    em_tensor *b = IN(c, c->dt, (7), -1, 1, fl);
    em_tensor *x2 = IN(c, c->dt, (2, 3, 128), -2, 2, fl);
    em_tensor *w2 = IN(c, c->dt, (3, 128), -1.5, 1.5, fl);
    em_tensor *b2 = IN(c, c->dt, (3, 128), -1, 1, fl);
    em_tensor *xl = IN(c, c->dt, (3, 2048), -2, 2, fl);
    em_tensor *wl = IN(c, c->dt, (2048), 0.5, 1.5, fl);
    em_tensor *bl = IN(c, c->dt, (2048), -1, 1, fl);
    em_tensor *xo = IN(c, c->dt, (5, 16), 50, 54, fl);
    em_tensor *wo = IN(c, c->dt, (16), 0.5, 1.5, fl);
    em_tensor *bo = IN(c, c->dt, (16), -1, 1, fl);
    em_tensor *xm = IN(c, c->dt, (1024, 24), -2, 2, fl);
    em_tensor *wm = IN(c, c->dt, (24), 0.5, 1.5, fl);
    em_tensor *bm = IN(c, c->dt, (24), -1, 1, fl);
    REQ(c, x);
    REQ(c, w);
    REQ(c, b);
    REQ(c, x2);
    REQ(c, w2);
    REQ(c, b2);
    REQ(c, xl);
    REQ(c, wl);
    REQ(c, bl);
    REQ(c, xo);
    REQ(c, wo);
    REQ(c, bo);
    REQ(c, xm);
    REQ(c, wm);
    REQ(c, bm);
    if (c->kind == EM_OP_LAYER_NORM) {
        OUT(c, em_layer_norm(x, 1, w, b, 1e-5));
        OUT(c, em_layer_norm(x2, 2, w2, b2, 1e-3));
        OUT(c, em_layer_norm(xl, 1, wl, bl, 1e-5));
        OUT(c, em_layer_norm(xo, 1, wo, bo, 1e-5));
        OUT(c, em_layer_norm(xm, 1, wm, bm, 1e-5));
        return true;
    }
    /* LAYER_NORM_BWD: the gradients, computed inside the case */
    c->no_backward = true;
    if (!out_grad(c, em_layer_norm(x, 1, w, b, 1e-5), x, "layer_norm input gradient")) return false;
    if (!out_grad(c, em_layer_norm(x, 1, w, b, 1e-5), w, "layer_norm weight gradient")) return false;
    if (!out_grad(c, em_layer_norm(x, 1, w, b, 1e-5), b, "layer_norm bias gradient")) return false;
    if (!out_grad(c, em_layer_norm(x2, 2, w2, b2, 1e-3), x2, "layer_norm 2-dim input gradient")) return false;
    if (!out_grad(c, em_layer_norm(x2, 2, w2, b2, 1e-3), w2, "layer_norm 2-dim weight gradient")) return false;
    if (!out_grad(c, em_layer_norm(xl, 1, wl, bl, 1e-5), xl, "layer_norm long rows input gradient")) return false;
    if (!out_grad(c, em_layer_norm(xl, 1, wl, bl, 1e-5), wl, "layer_norm long rows weight gradient")) return false;
    if (!out_grad(c, em_layer_norm(xo, 1, wo, bo, 1e-5), xo, "layer_norm offset input gradient")) return false;
    if (!out_grad(c, em_layer_norm(xm, 1, wm, bm, 1e-5), xm, "layer_norm many rows input gradient")) return false;
    if (!out_grad(c, em_layer_norm(xm, 1, wm, bm, 1e-5), wm, "layer_norm many rows weight gradient")) return false;
    return out_grad(c, em_layer_norm(xm, 1, wm, bm, 1e-5), bm, "layer_norm many rows bias gradient");
}

/* Fused scaled-dot-product attention (SDPA / SDPA_BWD, tasks/attention.c):
 * causal with Tq = Tk and Tq != Tk both ways, a bool mask, an additive mask
 * broadcast from [H, 1, Tk] with -inf entries, D != Dv, a rank-3 input, odd
 * lengths, and dropout (the generator is reset for every run, so every
 * device draws the same keep mask: the contract's Philox counters). */
static bool case_sdpa(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *q = IN(c, c->dt, (2, 3, 7, 16), -1, 1, fl), *k = IN(c, c->dt, (2, 3, 7, 16), -1, 1, fl);
    em_tensor *v = IN(c, c->dt, (2, 3, 7, 24), -1, 1, fl);
    em_tensor *qs = IN(c, c->dt, (1, 2, 3, 32), -1, 1, fl), *kl = IN(c, c->dt, (1, 2, 9, 32), -1, 1, fl);
    em_tensor *vl = IN(c, c->dt, (1, 2, 9, 8), -1, 1, fl);
    em_tensor *q3 = IN(c, c->dt, (3, 33, 16), -1, 1, fl), *v3 = IN(c, c->dt, (3, 33, 16), -1, 1, fl);
    em_tensor *mb = IN(c, c->dt, (3, 9), -1, 1, 0), *ma = IN(c, c->dt, (2, 1, 9), -1, 1, 0);
    REQ(c, q);
    REQ(c, k);
    REQ(c, v);
    REQ(c, qs);
    REQ(c, kl);
    REQ(c, vl);
    REQ(c, q3);
    REQ(c, v3);
    REQ(c, mb);
    REQ(c, ma);
    em_tensor *bmask = em_ge_scalar(mb, -0.5);                           /* bool [Tq, Tk], true = take part */
    em_tensor *amask = em_masked_fill(ma, em_lt_scalar(ma, -0.7), -INFINITY); /* additive [H, 1, Tk] */
    REQ(c, bmask);
    REQ(c, amask);
    em_tensor *r[6] = {
        em_scaled_dot_product_attention(q, k, v, NULL, true, 0, 0, false),
        em_scaled_dot_product_attention(qs, kl, vl, NULL, true, 0, 0, false),  /* Tq < Tk */
        em_scaled_dot_product_attention(kl, qs, em_narrow(qs, 3, 0, 8), NULL, true, 0, 0.3, false), /* Tq > Tk */
        em_scaled_dot_product_attention(qs, kl, vl, bmask, false, 0, 0, false),
        em_scaled_dot_product_attention(qs, kl, vl, amask, false, 0, 0, false),
        em_scaled_dot_product_attention(q3, q3, v3, NULL, false, 0.25, 0, true), /* rank 3, dropout */
    };
    static const char *const what[6] = {"sdpa causal, D != Dv", "sdpa causal Tq < Tk", "sdpa causal Tq > Tk",
                                        "sdpa bool mask", "sdpa additive broadcast mask", "sdpa rank 3 with dropout"};
    if (c->kind == EM_OP_SDPA) {
        for (int i = 0; i < 6; i++)
            if (!out(c, r[i], what[i])) return false;
        return true;
    }
    /* SDPA_BWD: the gradients, computed inside the case */
    c->no_backward = true;
    em_tensor *const gx[6][3] = {{q, k, v}, {qs, kl, vl}, {kl, qs, NULL}, {qs, kl, vl}, {qs, kl, vl}, {q3, v3, NULL}};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3 && gx[i][j]; j++) {
            em_manual_seed(20240601); /* the dropout variant: the same keep mask on every device */
            em_tensor *y = i == 0   ? em_scaled_dot_product_attention(q, k, v, NULL, true, 0, 0, false)
                           : i == 1 ? em_scaled_dot_product_attention(qs, kl, vl, NULL, true, 0, 0, false)
                           : i == 2 ? em_scaled_dot_product_attention(kl, qs, em_narrow(qs, 3, 0, 8), NULL, true, 0, 0.3, false)
                           : i == 3 ? em_scaled_dot_product_attention(qs, kl, vl, bmask, false, 0, 0, false)
                           : i == 4 ? em_scaled_dot_product_attention(qs, kl, vl, amask, false, 0, 0, false)
                                    : em_scaled_dot_product_attention(q3, q3, v3, NULL, false, 0.25, 0, true);
            if (!out_grad(c, y, gx[i][j], what[i])) return false;
        }
    return true;
}

static bool case_fill(ctx *c)
{
    OUT(c, em_full(S(5, 7), 2, (em_dtype)c->dt, 2.5));
    OUT(c, em_full(S(1000), 1, (em_dtype)c->dt, -1));
    OUT(c, em_zeros(S(3, 5), 2, (em_dtype)c->dt));
    OUT(c, em_ones(S(4), 1, (em_dtype)c->dt));
    return true;
}

static bool case_arange(ctx *c)
{
    if (is_float_dt(c->dt)) {
        OUT(c, em_arange(-2, 7.5, 0.7, (em_dtype)c->dt));
        OUT(c, em_linspace(-1, 2, 17, (em_dtype)c->dt));
        OUT(c, em_linspace(0, 1, 1000, (em_dtype)c->dt));
        OUT(c, em_linspace(3, 5, 1, (em_dtype)c->dt));
    } else {
        OUT(c, em_arange(-5, 300, 3, (em_dtype)c->dt));
    }
    return true;
}

static bool case_eye(ctx *c)
{
    OUT(c, em_eye(4, 6, (em_dtype)c->dt));
    OUT(c, em_eye(5, 0, (em_dtype)c->dt));
    OUT(c, em_eye(7, 3, (em_dtype)c->dt));
    return true;
}

static bool case_rand(ctx *c)
{
    switch (c->kind) {
    case EM_OP_RAND_UNIFORM:
        OUT(c, em_rand_uniform(S(33, 17), 2, (em_dtype)c->dt, -1, 2));
        OUT(c, em_rand_uniform(S(1000), 1, (em_dtype)c->dt, 0, 1));
        break;
    case EM_OP_RAND_NORMAL:
        OUT(c, em_rand_normal(S(33, 17), 2, (em_dtype)c->dt, 0.5, 2));
        OUT(c, em_rand_normal(S(1000), 1, (em_dtype)c->dt, 0, 1));
        break;
    default:
        OUT(c, em_rand_bernoulli(S(33, 17), 2, (em_dtype)c->dt, 0.3));
        break;
    }
    return true;
}

static bool case_view_reshape(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (6, 10), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    OUT(c, em_reshape(a, S(3, 20), 2));
    OUT(c, em_reshape(em_transpose(a, 0, 1), S(-1), 1)); /* copy path */
    OUT(c, em_flatten(a, 0, 1));
    OUT(c, em_unsqueeze(a, 1));
    return true;
}

static bool case_view_permute(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (2, 3, 4), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    OUT(c, em_permute(a, (const int[]){2, 0, 1}, 3));
    OUT(c, em_transpose(a, 0, 2));
    return true;
}

static bool case_view_expand(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (1, 7), -3, 3, grad_flag(c->dt));
    em_tensor *b = IN(c, c->dt, (5, 1), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    REQ(c, b);
    OUT(c, em_expand(a, S(5, 7), 2));
    OUT(c, em_expand(b, S(2, 5, 7), 3));
    return true;
}

static bool case_view_slice(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (6, 10), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    OUT(c, em_slice(a, 1, 1, 8, 2));
    OUT(c, em_narrow(a, 0, 2, 3));
    em_tensor *parts[4];
    int np = em_chunk(a, 3, 0, parts, 4);
    if (np < 0) return fail_case(c, "em_chunk");
    for (int i = 0; i < np; i++) OUT(c, parts[i]); /* published: the scope owns them */
    return true;
}

static bool case_view_alias(ctx *c)
{
    em_tensor *a = IN(c, c->dt, (6, 10), -3, 3, grad_flag(c->dt));
    REQ(c, a);
    OUT(c, em_squeeze(a, 0)); /* dim of size 6: an alias */
    OUT(c, em_cast(a, (em_dtype)c->dt));
    return true;
}

static bool case_view_cat(ctx *c)
{
    const int fl = grad_flag(c->dt);
    em_tensor *a = IN(c, c->dt, (4, 3), -3, 3, fl);
    em_tensor *b = IN(c, c->dt, (4, 5), -3, 3, fl);
    em_tensor *d = IN(c, c->dt, (4, 3), -3, 3, fl);
    REQ(c, a);
    REQ(c, b);
    REQ(c, d);
    em_tensor *ab[3] = {a, b, d};
    OUT(c, em_cat(ab, 3, 1));
    em_tensor *ad[2] = {a, d};
    OUT(c, em_stack(ad, 2, 0));
    OUT(c, em_pad(a, S(1, 2, 0, 1), 4, 0.5));
    return true;
}

/* Optimizer steps: a parameter that is a contiguous slice (rows 1..6) of a
 * sentinel-filled [8, 9] tensor, three steps on loss = sum(p * w + p * p);
 * outputs are the parameter, every state tensor and the whole storage
 * (sentinel rows 0 and 7 must survive). */
typedef struct state_list {
    ctx *c;
    bool ok;
} state_list;

static void visit_state(const char *key, em_tensor *t, void *ud)
{
    state_list *s = ud;
    (void)key;
    if (s->ok && !out(s->c, t, "optimizer state")) s->ok = false;
}

static bool optim_run(ctx *c, const em_optim_config *cfg)
{
    const em_dtype dt = (em_dtype)c->dt;
    const int64_t R = 8, C = 9;
    double *expect = malloc(sizeof(double) * (size_t)(R * C));
    unsigned char *mask = calloc((size_t)(R * C), 1);
    void *raw = malloc((size_t)(R * C) * em_dtype_size(dt));
    for (int64_t i = 0; i < R * C; i++) {
        double v = (i < C || i >= (R - 1) * C) ? SENTINEL : gen_value(c, dt, -1, 1, 0);
        pack(dt, raw, i, v);
        expect[i] = unpack(dt, raw, i);
        mask[i] = i < C || i >= (R - 1) * C;
    }
    em_tensor *base = em_from_host(raw, S(8, 9), 2, dt);
    free(raw);
    if (!base) {
        free(expect);
        free(mask);
        return fail_case(c, "em_from_host");
    }
    add_guard(c, base, expect, mask, R * C, "storage around an optimizer parameter");
    em_tensor *p = em_narrow(base, 0, 1, R - 2);
    if (!p || em_set_requires_grad(p, true) != EM_OK) return fail_case(c, "parameter view");
    /* |w| in [4, 5] with either sign: the gradient w + 2p stays away from 0
     * (|p| <= 1 moves by less than 0.6 in 3 Adam / RMSprop / Adagrad steps),
     * where their sign-like updates jump and a 16-bit rounding of a
     * near-zero gradient flipped one (RMSprop in bf16, 15 % off) */
    em_tensor *w = IN(c, dt, (6, 9), 4, 5, IN_CONTIG | IN_NONZERO);
    REQ(c, w);
    em_optim *opt = em_optim_new(cfg, &p, 1);
    if (!opt) return fail_case(c, "em_optim_new");
    bool ok = true;
    for (int step = 0; step < 3 && ok; step++) {
        em_scope_begin();
        em_tensor *loss = em_sum_all(em_add(em_mul(p, w), em_mul(p, p)));
        em_grads *g = loss ? em_backward(loss) : NULL;
        if (!g || em_optim_step(opt, g) != EM_OK) ok = fail_case(c, "optimizer step");
        em_grads_free(g);
        em_scope_end();
    }
    if (ok) ok = out(c, p, "parameter");
    state_list sl = {c, true};
    if (ok && em_optim_state_visit(opt, visit_state, &sl) != EM_OK) ok = fail_case(c, "em_optim_state_visit");
    if (ok) ok = sl.ok;
    if (ok) ok = out(c, base, "parameter storage");
    em_optim_free(opt);
    return ok;
}

static bool case_optim(ctx *c)
{
    c->no_backward = true;
    em_optim_config cfg;
    switch (c->kind) {
    case EM_OP_SGD_STEP:
        cfg = em_optim_config_default(EM_OPTIM_SGD);
        cfg.lr = 0.1;
        if (!optim_run(c, &cfg)) return false;
        cfg.momentum = 0.9;
        cfg.nesterov = true;
        cfg.weight_decay = 0.01;
        if (!optim_run(c, &cfg)) return false;
        cfg.nesterov = false;
        cfg.dampening = 0.1;
        cfg.maximize = true;
        return optim_run(c, &cfg);
    case EM_OP_ADAM_STEP:
        cfg = em_optim_config_default(EM_OPTIM_ADAM);
        cfg.lr = 0.05;
        if (!optim_run(c, &cfg)) return false;
        cfg.amsgrad = true;
        cfg.weight_decay = 0.01;
        if (!optim_run(c, &cfg)) return false;
        cfg = em_optim_config_default(EM_OPTIM_ADAMW);
        cfg.lr = 0.05;
        return optim_run(c, &cfg);
    case EM_OP_RMSPROP_STEP:
        cfg = em_optim_config_default(EM_OPTIM_RMSPROP);
        if (!optim_run(c, &cfg)) return false;
        cfg.centered = true;
        cfg.momentum = 0.9;
        cfg.weight_decay = 0.01;
        return optim_run(c, &cfg);
    case EM_OP_ADAGRAD_STEP:
        cfg = em_optim_config_default(EM_OPTIM_ADAGRAD);
        cfg.lr = 0.1;
        cfg.weight_decay = 0.01;
        cfg.lr_decay = 0.01;
        cfg.initial_accumulator_value = 0.1;
        return optim_run(c, &cfg);
    default: return fail_case(c, "case_optim: unexpected kind");
    }
}

/* ---- the case table: one entry per op kind ------------------------------------- */

#define D_F32 EM_F32
#define D_F64 EM_F64
#define D_I32 EM_I32
#define D_I64 EM_I64
#define D_U8 EM_U8
#define D_BOOL EM_BOOL
#define FLOATS {D_F32, D_F64, END}
#define FLOAT_MATH {D_F32, D_F64, D_I32, END}      /* ints: promoted to f32 by the front end */
#define INT_OK {D_F32, D_F64, D_I32, D_I64, END}
#define ALL_NUM {D_F32, D_F64, D_I32, D_I64, D_U8, END}

static bool case_fused(ctx *c); /* below: it uses the comparison */
static bool case_step(ctx *c);

static op_case g_cases[EM_OP_COUNT] = {
    [EM_OP_NEG] = {case_unary, INT_OK, 1},
    [EM_OP_ABS] = {case_unary, INT_OK, 1},
    [EM_OP_SIGN] = {case_unary, INT_OK, 1},
    [EM_OP_EXP] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_LOG] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_LOG1P] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_SQRT] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_RSQRT] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_RECIPROCAL] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_SQUARE] = {case_unary, ALL_NUM, 1},
    [EM_OP_SIN] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_COS] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_TANH] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_SIGMOID] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_RELU] = {case_unary, INT_OK, 1},
    [EM_OP_GELU] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_GELU_TANH] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_SILU] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_SOFTPLUS] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_ERF] = {case_unary, FLOAT_MATH, 1},
    [EM_OP_FLOOR] = {case_unary, INT_OK, 1},
    [EM_OP_CEIL] = {case_unary, INT_OK, 1},
    [EM_OP_ROUND] = {case_unary, INT_OK, 1},
    [EM_OP_CLAMP] = {case_clamp, INT_OK, 1},
    [EM_OP_POW_SCALAR] = {case_pow_scalar, INT_OK, 1},
    [EM_OP_LEAKY_RELU] = {case_leaky_elu, FLOAT_MATH, 1},
    [EM_OP_ELU] = {case_leaky_elu, FLOAT_MATH, 1},
    [EM_OP_LOGICAL_NOT] = {case_unary, {D_F32, D_I32, D_BOOL, END}, 1},
    [EM_OP_ADD_SCALAR] = {case_scalar, ALL_NUM, 1},
    [EM_OP_SUB_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_RSUB_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_MUL_SCALAR] = {case_scalar, ALL_NUM, 1},
    [EM_OP_DIV_SCALAR] = {case_scalar, FLOAT_MATH, 1},
    [EM_OP_MAXIMUM_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_MINIMUM_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_REMAINDER_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_EQ_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_NE_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_LT_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_LE_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_GT_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_GE_SCALAR] = {case_scalar, INT_OK, 1},
    [EM_OP_ADD] = {case_binary, {D_F32, D_F64, D_I32, D_I64, D_U8, D_BOOL, END}, 1},
    [EM_OP_SUB] = {case_binary, {D_F32, D_F64, D_I32, D_I64, END}, 1}, /* bool: an error, as PyTorch */
    [EM_OP_MUL] = {case_binary, {D_F32, D_F64, D_I32, D_I64, D_U8, D_BOOL, END}, 1},
    [EM_OP_DIV] = {case_binary, FLOAT_MATH, 1},
    [EM_OP_POW] = {case_binary, FLOAT_MATH, 1},
    [EM_OP_MAXIMUM] = {case_binary, INT_OK, 1},
    [EM_OP_MINIMUM] = {case_binary, INT_OK, 1},
    [EM_OP_REMAINDER] = {case_binary, INT_OK, 1},
    [EM_OP_CELU] = {case_leaky_elu, FLOAT_MATH, 1},
    [EM_OP_EQ] = {case_binary, INT_OK, 1},
    [EM_OP_NE] = {case_binary, INT_OK, 1},
    [EM_OP_LT] = {case_binary, INT_OK, 1},
    [EM_OP_LE] = {case_binary, INT_OK, 1},
    [EM_OP_GT] = {case_binary, INT_OK, 1},
    [EM_OP_GE] = {case_binary, INT_OK, 1},
    [EM_OP_LOGICAL_AND] = {case_binary, {D_F32, D_I32, D_BOOL, END}, 1},
    [EM_OP_LOGICAL_OR] = {case_binary, {D_F32, D_I32, D_BOOL, END}, 1},
    [EM_OP_WHERE] = {case_where, {D_F32, D_F64, D_I32, D_I64, D_U8, END}, 1},
    [EM_OP_SUM] = {case_reduce, {D_F32, D_F64, D_I32, D_U8, END}, 1},
    [EM_OP_PROD] = {case_reduce, {D_F32, D_F64, D_I32, END}, 1},
    [EM_OP_MAX] = {case_reduce, {D_F32, D_F64, D_I32, END}, 1},
    [EM_OP_MIN] = {case_reduce, {D_F32, D_F64, D_I64, END}, 1},
    [EM_OP_ARGMAX] = {case_reduce, {D_F32, D_F64, D_I32, END}, 1},
    [EM_OP_ARGMIN] = {case_reduce, {D_F32, D_I64, END}, 1},
    [EM_OP_ANY] = {case_reduce, {D_F32, D_I32, D_BOOL, END}, 1},
    [EM_OP_ALL] = {case_reduce, {D_F32, D_I32, D_BOOL, END}, 1},
    [EM_OP_LOGSUMEXP] = {case_reduce, FLOATS, 1},
    [EM_OP_VAR] = {case_reduce, FLOATS, 1},
    [EM_OP_SOFTMAX] = {case_softmax, FLOATS, 1},
    [EM_OP_LOG_SOFTMAX] = {case_softmax, FLOATS, 1},
    [EM_OP_MATMUL] = {case_matmul, {D_F32, D_F64, D_I32, D_I64, END}, 4},
    [EM_OP_COPY] = {case_copy, {D_F32, D_F64, D_I32, D_I64, D_U8, D_BOOL, END}, 1},
    [EM_OP_GATHER] = {case_gather, {D_F32, D_F64, D_I32, D_BOOL, END}, 1},
    [EM_OP_SCATTER] = {case_scatter, {D_F32, D_F64, D_I64, D_U8, END}, 1},
    [EM_OP_SCATTER_ADD] = {case_scatter, {D_F32, D_F64, D_I32, END}, 1},
    [EM_OP_INDEX_SELECT] = {case_index_select, {D_F32, D_F64, D_I64, D_U8, END}, 1},
    [EM_OP_ONE_HOT] = {case_one_hot, {D_I64, END}, 1},
    [EM_OP_INDEX_ADD] = {case_index_add, {D_F32, D_F64, D_I32, D_I64, END}, 1},
    [EM_OP_CONV2D] = {case_conv_all, {D_F32, D_F64, END}, 1},
    [EM_OP_CONV2D_BWD_DATA] = {case_conv_all, {D_F32, D_F64, END}, 1},
    [EM_OP_CONV2D_BWD_WEIGHT] = {case_conv_all, {D_F32, D_F64, END}, 1},
    [EM_OP_MAX_POOL2D] = {case_pool_all, {D_F32, D_F64, END}, 1},
    [EM_OP_AVG_POOL2D] = {case_pool_all, {D_F32, D_F64, END}, 1},
    [EM_OP_AVG_POOL2D_BWD] = {case_pool_all, {D_F32, D_F64, END}, 1},
    [EM_OP_BATCH_NORM] = {case_batch_norm, {D_F32, D_F64, END}, 1},
    [EM_OP_BATCH_NORM_BWD] = {case_batch_norm, {D_F32, D_F64, END}, 1},
    [EM_OP_BATCH_NORM_RUNNING] = {case_batch_norm, {D_F32, D_F64, END}, 1},
    [EM_OP_LAYER_NORM] = {case_layer_norm, {D_F32, D_F64, END}, 1},
    [EM_OP_LAYER_NORM_BWD] = {case_layer_norm, {D_F32, D_F64, END}, 1},
    [EM_OP_SDPA] = {case_sdpa, {D_F32, D_F64, END}, 1},
    [EM_OP_SDPA_BWD] = {case_sdpa, {D_F32, D_F64, END}, 1},
    [EM_OP_FILL] = {case_fill, {D_F32, D_F64, D_I32, D_I64, D_U8, D_BOOL, END}, 1},
    [EM_OP_ARANGE] = {case_arange, {D_F32, D_F64, D_I32, D_I64, END}, 1},
    [EM_OP_EYE] = {case_eye, {D_F32, D_F64, D_I64, D_BOOL, END}, 1},
    [EM_OP_RAND_UNIFORM] = {case_rand, FLOATS, 1},
    [EM_OP_RAND_NORMAL] = {case_rand, FLOATS, 1},
    [EM_OP_RAND_BERNOULLI] = {case_rand, {D_F32, D_F64, D_BOOL, END}, 1},
    [EM_OP_STEP] = {case_step, FLOATS, 1}, /* f32 and f64: a captured training step */
    [EM_OP_FUSED] = {case_fused, FLOATS, 1}, /* f32 and f64 only: what fusion covers (no 16-bit variants) */
    [EM_OP_VIEW_RESHAPE] = {case_view_reshape, {D_F32, D_I64, END}, 1},
    [EM_OP_VIEW_PERMUTE] = {case_view_permute, {D_F32, D_F64, END}, 1},
    [EM_OP_VIEW_EXPAND] = {case_view_expand, {D_F32, D_I32, END}, 1},
    [EM_OP_VIEW_SLICE] = {case_view_slice, {D_F32, D_U8, END}, 1},
    [EM_OP_VIEW_ALIAS] = {case_view_alias, {D_F32, D_I32, END}, 1},
    [EM_OP_VIEW_CAT] = {case_view_cat, {D_F32, D_F64, D_I64, END}, 1},
    [EM_OP_SGD_STEP] = {case_optim, FLOATS, 1},
    [EM_OP_ADAM_STEP] = {case_optim, FLOATS, 1},
    [EM_OP_RMSPROP_STEP] = {case_optim, FLOATS, 1},
    [EM_OP_ADAGRAD_STEP] = {case_optim, FLOATS, 1},
};

/* ---- running and comparing ------------------------------------------------------- */

typedef struct tvals {
    em_dtype dt;
    int64_t n;
    double *v; /* NULL: missing (e.g. no gradient) */
    const char *what;
} tvals;

typedef struct run_result {
    int n;
    tvals t[2 * MAX_T];
} run_result;

static void result_free(run_result *r)
{
    for (int i = 0; i < r->n; i++) free(r->t[i].v);
    r->n = 0;
}

static bool record(run_result *r, const em_tensor *t, const char *what, char *err, size_t errn)
{
    if (r->n >= 2 * MAX_T) return true;
    tvals *tv = &r->t[r->n++];
    tv->what = what;
    tv->v = NULL;
    tv->n = -1;
    tv->dt = EM_F32;
    if (!t) return true;
    tv->dt = em_tensor_dtype(t);
    if (!read_values(t, &tv->v, &tv->n)) {
        snprintf(err, errn, "reading %s back: %s", what, em_last_error());
        return false;
    }
    return true;
}

/* Deterministic seed of a case variant (identical on every device), from
 * the op's name (FNV-1a), not its enum value: an op inserted into
 * tasks/ops.def does not change the inputs of the ops after it. */
static uint64_t variant_seed(int kind, int dt, int strided)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = g_ops[kind].name; p && *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    uint64_t s = 0x9E3779B97F4A7C15ULL ^ (h * 0xBF58476D1CE4E5B9ULL) ^ ((uint64_t)(dt + 3) << 40) ^ ((uint64_t)strided << 56);
    return s ? s : 1;
}

/* Runs case @p kind in dtype @p dt on @p dev. seed_dt picks the inputs'
 * seed (dt, or the 16-bit dtype whose f32 reference this run is, with
 * round_to = that dtype: f32 inputs then hold the 16-bit values; -1: none). */
static bool run_variant(int kind, int dt, int seed_dt, int round_to, int strided, em_device dev, run_result *r,
                        bool *made_strided, char *err, size_t errn)
{
    memset(r, 0, sizeof *r);
    err[0] = 0;
    if (em_set_device(dev) != EM_OK) {
        snprintf(err, errn, "em_set_device: %s", em_last_error());
        return false;
    }
    em_manual_seed(20240601);
    ctx *c = calloc(1, sizeof *c);
    c->kind = kind;
    c->dt = dt;
    c->strided = strided;
    c->rng = variant_seed(kind, seed_dt, strided);
    c->tol_scale = 1;
    c->round_to = round_to;
    em_clear_error();
    em_scope_begin();
    bool ok = g_cases[kind].fn(c);
    if (!ok) snprintf(err, errn, "%s", c->err[0] ? c->err : em_last_error());
    for (int i = 0; ok && i < c->n_out; i++) ok = record(r, c->outs[i], "output", err, errn);
    /* backward of sum_i sum(out_i * w_i) */
    if (ok && (g_ops[kind].flags & F_DIFF) && !c->no_backward && c->n_grad > 0) {
        em_tensor *loss = NULL;
        for (int i = 0; ok && i < c->n_out; i++) {
            em_tensor *o = c->outs[i];
            if (!em_dtype_is_float(em_tensor_dtype(o)) || !em_requires_grad(o)) continue;
            em_tensor *w = input(c, em_tensor_dtype(o), em_tensor_shape(o), em_tensor_ndim(o), -1, 1, IN_CONTIG);
            em_tensor *term = w ? em_sum_all(em_mul(o, w)) : NULL;
            if (!term) {
                snprintf(err, errn, "building the loss: %s", em_last_error());
                ok = false;
                break;
            }
            loss = loss ? em_add(loss, term) : term;
        }
        if (ok && loss) {
            em_grads *g = em_backward(loss);
            if (!g) {
                snprintf(err, errn, "em_backward: %s", em_last_error());
                ok = false;
            }
            for (int i = 0; ok && i < c->n_grad; i++) ok = record(r, em_grad(g, c->grad_in[i]), "input gradient", err, errn);
            em_grads_free(g);
        }
    }
    if (ok) em_sync();
    /* guards */
    for (int gi = 0; gi < c->n_guard; gi++) {
        guard *gd = &c->guards[gi];
        double *v = NULL;
        int64_t n = 0;
        if (ok && !read_values(gd->t, &v, &n)) {
            snprintf(err, errn, "reading %s: %s", gd->what, em_last_error());
            ok = false;
        }
        for (int64_t i = 0; ok && i < n && i < gd->n; i++) {
            if (gd->mask && !gd->mask[i]) continue;
            if (!(v[i] == gd->expect[i] || (isnan(v[i]) && isnan(gd->expect[i])))) {
                snprintf(err, errn, "%s was overwritten: element %lld is %.9g, expected %.9g", gd->what, (long long)i, v[i],
                         gd->expect[i]);
                ok = false;
            }
        }
        free(v);
        free(gd->expect);
        free(gd->mask);
        em_tensor_release(gd->t);
    }
    for (int i = 0; i < c->n_out; i++) em_tensor_release(c->outs[i]);
    em_scope_end();
    *made_strided = c->made_strided;
    free(c);
    em_set_device(em_device_cpu());
    return ok;
}

static double g_tf32_scale = 1;

/* The worst |got - ref| / (atol + rtol |ref|) seen per dtype whose
 * tolerance applied (ratio 0: no difference seen) and kind of comparison: [0] a device against
 * the CPU, [1] the CPU's 16-bit result against its f32 reference rounded.
 * Printed at the end: how much of the tolerance the results use. */
typedef struct worst {
    bool seen; /* some element was compared under this tolerance */
    double ratio;
    int kind;
    char where[48];
} worst;
static worst g_worst[EM_DTYPE_COUNT][2];

/* Compares @p got with the reference @p ref tensor by tensor. rounded: ref is
 * the f32 reference of the 16-bit run @p got (run dtype @p run_dt): an f32
 * reference tensor where got has a 16-bit one is rounded to that dtype, and
 * the float tolerances are @p run_dt's; otherwise each tensor's own dtype
 * picks them and dtypes must match. */
static bool compare_ex(int kind, int run_dt, const run_result *ref, const run_result *got, bool exact, bool rounded,
                       char *why, size_t n)
{
    const char *who = rounded ? "the f32 reference rounded" : "the CPU";
    if (ref->n != got->n) {
        snprintf(why, n, "%d result tensors, %s has %d", got->n, who, ref->n);
        return false;
    }
    double scale = g_cases[kind].tol_scale > 0 ? g_cases[kind].tol_scale : 1;
    if (kind == EM_OP_MATMUL) scale *= g_tf32_scale;
    for (int t = 0; t < ref->n; t++) {
        const tvals *a = &ref->t[t], *b = &got->t[t];
        const bool round_ref = rounded && a->dt == EM_F32 && is_half_dt(b->dt);
        if ((a->v == NULL) != (b->v == NULL) || a->n != b->n || (a->dt != b->dt && !round_ref)) {
            snprintf(why, n, "%s #%d: %s/%lld elements/%s, %s has %s/%lld/%s", b->what, t, b->v ? "present" : "missing",
                     (long long)b->n, em_dtype_name(b->dt), who, a->v ? "present" : "missing", (long long)a->n,
                     em_dtype_name(a->dt));
            return false;
        }
        if (!a->v) continue;
        const int tdt = rounded && em_dtype_is_float(b->dt) ? run_dt : (int)b->dt;
        double rtol = 0, atol = 0;
        if (!exact && em_dtype_is_float(b->dt) && (unsigned)tdt < EM_DTYPE_COUNT) {
            rtol = g_tol[tdt].rtol * scale, atol = g_tol[tdt].atol * scale;
            if (g_tol[tdt].of_max) {
                double mx = 1;
                for (int64_t i = 0; i < a->n; i++)
                    if (isfinite(a->v[i]) && fabs(a->v[i]) > mx) mx = fabs(a->v[i]);
                atol *= mx;
            }
        }
        for (int64_t i = 0; i < a->n; i++) {
            const double x = round_ref ? round_half(b->dt, a->v[i]) : a->v[i], y = b->v[i];
            bool ok;
            const char *reason = "differs";
            if (isnan(x)) {
                ok = isnan(y);
            } else if (isinf(x)) {
                ok = x == y;
            } else if (!isfinite(y)) {
                ok = false;
                reason = rounded ? "is NaN/Inf where the f32 reference is finite" : "is NaN/Inf where the CPU has a finite value";
            } else {
                const double tol = atol + rtol * fabs(x), d = fabs(x - y);
                ok = d <= tol;
                if (tol > 0) {
                    worst *w = &g_worst[tdt][rounded];
                    w->seen = true;
                    if (d / tol > w->ratio) {
                        w->ratio = d / tol;
                        w->kind = kind;
                        snprintf(w->where, sizeof w->where, "%s #%d: %.6g vs %.6g", b->what, t, y, x);
                    }
                }
            }
            if (!ok) {
                snprintf(why, n, "%s #%d (%s, %lld elements) element %lld %s: %.9g vs %s %.9g", b->what, t,
                         em_dtype_name(b->dt), (long long)a->n, (long long)i, reason, y, rounded ? "f32 rounded" : "CPU", x);
                return false;
            }
        }
    }
    return true;
}

static bool compare(int kind, int run_dt, const run_result *ref, const run_result *got, bool exact, char *why, size_t n)
{
    return compare_ex(kind, run_dt, ref, got, exact, false, why, n);
}

/* ---- fused element-wise chains (issue #17; fusion/fusion.c, kind FUSED) --------
 *
 * The fusable kinds are the EW1 / EWS / EWP / EW2 kinds of tasks/ops.def
 * that are not F_CMP, on f32 or f64. A chain step applies one of them; its
 * operands are values: the leaves (inputs) or earlier results. To keep the
 * chains comparable across devices within the usual tolerance (a chain of
 * ops carries each device's last-ulp differences forward), a kind gets its
 * operand through a few ops of its own class:
 *   FK_LEAF   discontinuous kinds (floor, remainder, threshold_backward, ...):
 *             applied to leaves only (exact inputs, no ulp to step over);
 *             a divisor is |leaf| + 0.5;
 *   FK_POS    log, sqrt, reciprocal, pow_scalar, ...: the operand is
 *             |x| + 0.5;
 *   FK_UNIT   erfinv: tanh(x) * 0.9;
 *   FK_SQUASH exp, exp2, expm1: tanh(x) * 3;
 *   FK_DIV    div: the divisor is |x| + 0.5;  FK_POW  pow: the base is |x| + 0.5;
 *   FK_PLAIN  the rest, on any value.
 * Those guard ops are chain steps too (and fusable). */
enum { FK_PLAIN, FK_LEAF, FK_POS, FK_UNIT, FK_SQUASH, FK_DIV, FK_POW };

typedef struct fkind {
    int kind;
    int arity; /* 1 (EW1 / EWS / EWP) or 2 (EW2) */
    int cls;
} fkind;

static int fkind_class(int kind)
{
    static const char *const leaf[] = {"sign", "floor", "ceil", "round", "trunc", "remainder_scalar", "remainder",
                                       "fmod", "floor_divide", "threshold_backward"};
    static const char *const pos[] = {"log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "pow_scalar"};
    static const char *const squash[] = {"exp", "exp2", "expm1"};
    const char *nm = g_ops[kind].name;
    for (size_t i = 0; i < sizeof leaf / sizeof leaf[0]; i++)
        if (!strcmp(nm, leaf[i])) return FK_LEAF;
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (!strcmp(nm, pos[i])) return FK_POS;
    for (size_t i = 0; i < sizeof squash / sizeof squash[0]; i++)
        if (!strcmp(nm, squash[i])) return FK_SQUASH;
    if (!strcmp(nm, "erfinv")) return FK_UNIT;
    if (kind == EM_OP_DIV) return FK_DIV;
    if (kind == EM_OP_POW) return FK_POW;
    return FK_PLAIN;
}

static fkind g_fkinds[EM_OP_COUNT];
static int g_n_fkinds;

static void list_fusable_kinds(void)
{
    if (g_n_fkinds) return;
#define FK_ADD(E, ar)                                                                        \
    if (!(g_ops[EM_OP_##E].flags & F_CMP))                                                   \
        g_fkinds[g_n_fkinds++] = (fkind){EM_OP_##E, ar, fkind_class(EM_OP_##E)};
#define EW1(E, nm, fl, fx, ix, bw) FK_ADD(E, 1)
#define EWS(E, nm, fl, fx, ix, bw) FK_ADD(E, 1)
#define EWP(E, nm, fl, fx, ix, bw) FK_ADD(E, 1)
#define EW2(E, nm, fl, fx, ix, bw) FK_ADD(E, 2)
#include "tasks/ops.def"
#undef FK_ADD
}

/* A chain step: value n_leaf + i = kind(v[a], s0, s1) or kind(v[a], v[b]). */
#define CH_MAX_LEAF 6
#define CH_MAX_STEP 40
typedef struct cstep {
    int kind;
    int a, b;
    double s0, s1; /* scalars: EWS's, EWP's parameters */
} cstep;

typedef struct chain_spec {
    int dt;
    int nd;
    int64_t shape[4];
    int n_leaf;
    int64_t lshape[CH_MAX_LEAF][4]; /* each leaf's shape: the chain's, or 1 in some dims (broadcast) */
    int lnd[CH_MAX_LEAF];
    bool lstrided[CH_MAX_LEAF]; /* a view (every other element of a larger tensor's last dim) */
    int n_step;
    cstep st[CH_MAX_STEP];
    bool keep[CH_MAX_LEAF + CH_MAX_STEP]; /* results read after the chain (the last always) */
} chain_spec;

/* Appends a step; returns its value index. */
static int ch_push(chain_spec *s, int kind, int a, int b, double s0, double s1)
{
    if (s->n_step >= CH_MAX_STEP) return a;
    s->st[s->n_step] = (cstep){kind, a, b, s0, s1};
    return s->n_leaf + s->n_step++;
}

/* v -> |v| + 0.5 */
static int ch_pos(chain_spec *s, int v)
{
    return ch_push(s, EM_OP_ADD_SCALAR, ch_push(s, EM_OP_ABS, v, -1, 0, 0), -1, 0.5, 0);
}
/* v -> tanh(v) * k */
static int ch_squash(chain_spec *s, int v, double k)
{
    return ch_push(s, EM_OP_MUL_SCALAR, ch_push(s, EM_OP_TANH, v, -1, 0, 0), -1, k, 0);
}

/* The scalars of an EWS / EWP kind (random where the kind allows). */
static void ch_scalars(ctx *c, int kind, double *s0, double *s1)
{
    double u = 0.5 + 1.5 * rng_u01(c), sg = rng_u01(c) < 0.5 ? -1 : 1;
    *s0 = sg * u;
    *s1 = 0;
    switch (kind) {
    case EM_OP_CLAMP: *s0 = -0.5 - rng_u01(c), *s1 = 0.25 + rng_u01(c); break;
    case EM_OP_POW_SCALAR: {
        static const double ex[] = {0.5, 1, 2, 2.5, -1.5, 3};
        *s0 = ex[rng_next(c) % 6];
        break;
    }
    case EM_OP_LEAKY_RELU: *s0 = 0.1; break;
    case EM_OP_ELU: case EM_OP_CELU: *s0 = u; break;
    default: break;
    }
}

/* A random value index among the leaves that have the chain's full shape
 * (leaf 0 always has it). */
static int ch_full_leaf(ctx *c, const chain_spec *s)
{
    int full[CH_MAX_LEAF], n = 0;
    for (int i = 0; i < s->n_leaf; i++) {
        bool f = s->lnd[i] == s->nd;
        for (int d = 0; f && d < s->nd; d++) f = s->lshape[i][d] == s->shape[d];
        if (f) full[n++] = i;
    }
    return full[rng_next(c) % (uint64_t)n];
}

/* Appends one step of kind @p fk (with its class's guard ops); cur is the
 * chain's current value. Returns the new current value. */
static int ch_step(ctx *c, chain_spec *s, const fkind *fk, int cur)
{
    const int nvals = s->n_leaf + s->n_step;
    double s0, s1;
    ch_scalars(c, fk->kind, &s0, &s1);
    if (fk->arity == 1) {
        int x = cur;
        switch (fk->cls) {
        case FK_LEAF: x = ch_full_leaf(c, s); break;
        case FK_POS: x = ch_pos(s, cur); break;
        case FK_UNIT: x = ch_squash(s, cur, 0.9); break;
        case FK_SQUASH: x = ch_squash(s, cur, 3); break;
        default: break;
        }
        const int r = ch_push(s, fk->kind, x, -1, s0, s1);
        /* a discontinuous kind's result joins the chain through an add */
        return fk->cls == FK_LEAF ? ch_push(s, EM_OP_ADD, cur, r, 0, 0) : r;
    }
    /* the other operand: a leaf (any shape: broadcast) or an earlier value */
    int other = (int)(rng_next(c) % (uint64_t)nvals);
    if (fk->cls == FK_LEAF) {
        const int a = ch_full_leaf(c, s), b = (int)(rng_next(c) % (uint64_t)s->n_leaf);
        const int d = fk->kind == EM_OP_THRESHOLD_BACKWARD ? b : ch_pos(s, b);
        const int r = ch_push(s, fk->kind, a, d, 0, 0);
        return ch_push(s, EM_OP_ADD, cur, r, 0, 0);
    }
    if (fk->cls == FK_DIV) return ch_push(s, fk->kind, cur, ch_pos(s, other), 0, 0);
    if (fk->cls == FK_POW) return ch_push(s, fk->kind, ch_pos(s, cur), ch_squash(s, other, 1.5), 0, 0);
    return rng_u01(c) < 0.5 ? ch_push(s, fk->kind, cur, other, 0, 0) : ch_push(s, fk->kind, other, cur, 0, 0);
}

/* A random chain of @p len kinds (2..8) in dtype @p dt. */
static void ch_random(ctx *c, chain_spec *s, int dt, int len)
{
    memset(s, 0, sizeof *s);
    s->dt = dt;
    if (rng_u01(c) < 0.2) { /* a larger one: the kernels' vector paths, several blocks */
        s->nd = 2;
        s->shape[0] = 33 + (int64_t)(rng_next(c) % 40);
        s->shape[1] = 65 + (int64_t)(rng_next(c) % 70);
    } else {
        s->nd = 1 + (int)(rng_next(c) % 4);
        for (int d = 0; d < s->nd; d++) s->shape[d] = 1 + (int64_t)(rng_next(c) % 6);
    }
    s->n_leaf = 1 + (int)(rng_next(c) % 4);
    for (int i = 0; i < s->n_leaf; i++) {
        /* leaf 0: the full shape; the others: broadcast dims (1) and maybe fewer leading dims */
        const int drop = i == 0 ? 0 : (int)(rng_next(c) % (uint64_t)s->nd);
        s->lnd[i] = s->nd - drop;
        for (int d = 0; d < s->lnd[i]; d++) {
            const int64_t full = s->shape[d + drop];
            s->lshape[i][d] = (i > 0 && rng_u01(c) < 0.4) ? 1 : full;
        }
        s->lstrided[i] = rng_u01(c) < 0.3;
    }
    int cur = 0;
    for (int k = 0; k < len; k++) cur = ch_step(c, s, &g_fkinds[rng_next(c) % (uint64_t)g_n_fkinds], cur);
    s->keep[cur] = true;
    /* sometimes an intermediate is kept and read after the chain too (a second output) */
    if (s->n_step > 2 && rng_u01(c) < 0.5) s->keep[s->n_leaf + (int)(rng_next(c) % (uint64_t)(s->n_step - 1))] = true;
}

/* Leaf i's values: the stream of @p c (a fixed seed: the same on every
 * device). A strided leaf is every other element of the last dim of a
 * tensor twice as wide (the others hold SENTINEL). Inside a scope: the
 * caller retains what it keeps. */
static em_tensor *ch_leaf(ctx *c, const chain_spec *s, int i)
{
    int64_t bshape[4], m = 1;
    const int nd = s->lnd[i];
    for (int d = 0; d < nd; d++) bshape[d] = s->lshape[i][d];
    if (s->lstrided[i]) bshape[nd - 1] *= 2;
    for (int d = 0; d < nd; d++) m *= bshape[d];
    const em_dtype dt = (em_dtype)s->dt;
    void *raw = malloc((size_t)m * em_dtype_size(dt));
    if (!raw) return NULL;
    for (int64_t j = 0; j < m; j++) pack(dt, raw, j, (s->lstrided[i] && j % 2) ? SENTINEL : -2 + 4 * rng_u01(c));
    em_tensor *t = em_from_host(raw, bshape, nd, dt);
    free(raw);
    return s->lstrided[i] && t ? em_slice(t, nd - 1, 0, bshape[nd - 1], 2) : t;
}

static em_tensor *ch_apply(const cstep *st, em_tensor *const *v)
{
    const em_tensor *a = v[st->a];
    switch (st->kind) {
    case EM_OP_CLAMP: return em_clamp(a, st->s0, st->s1);
    case EM_OP_POW_SCALAR: return em_pow_scalar(a, st->s0);
    case EM_OP_LEAKY_RELU: return em_leaky_relu(a, st->s0);
    case EM_OP_ELU: return em_elu(a, st->s0);
    case EM_OP_CELU: return em_celu(a, st->s0);
    default: break; /* the generated front ends below */
    }
    unary_fn u = unary_of(st->kind);
    if (u) return u(a);
    scalar_fn f = scalar_of(st->kind);
    if (f) return f(a, st->s0);
    binary_fn b = binary_of(st->kind);
    if (b) return b(a, v[st->b]);
    em_clear_error();
    fprintf(stderr, "consistency: chain step of kind '%s': no call for it in ch_apply (an EWP kind? add its case)\n",
            g_ops[st->kind].name);
    return NULL;
}

/* Runs chain @p s on @p dev with fusion on or off: each value is released
 * after its last use unless kept (then nobody references it: the stream
 * need not write it). r: the kept values in
 * order. *fused: FUSED tasks the chain gave (em_get_stats before and after). */
static bool ch_run(const chain_spec *s, uint64_t seed, em_device dev, bool fusion, run_result *r, int64_t *fused, char *err,
                   size_t errn)
{
    memset(r, 0, sizeof *r);
    *fused = 0;
    if (em_set_device(dev) != EM_OK) {
        snprintf(err, errn, "em_set_device: %s", em_last_error());
        return false;
    }
    const bool was = em_set_fusion(fusion);
    ctx lc = {.rng = seed};
    em_tensor *v[CH_MAX_LEAF + CH_MAX_STEP] = {0};
    int last_use[CH_MAX_LEAF + CH_MAX_STEP];
    const int nv = s->n_leaf + s->n_step;
    for (int i = 0; i < nv; i++) last_use[i] = -1;
    for (int i = 0; i < s->n_step; i++) {
        last_use[s->st[i].a] = i;
        if (s->st[i].b >= 0) last_use[s->st[i].b] = i;
    }
    bool ok = true;
    /* every value is created in a scope of its own and retained: this
     * function owns each one (inside a caller's scope too) */
    for (int i = 0; ok && i < s->n_leaf; i++) {
        em_scope_begin();
        em_tensor *t = ch_leaf(&lc, s, i);
        v[i] = t ? em_tensor_retain(t) : NULL;
        em_scope_end();
        if (!v[i]) {
            snprintf(err, errn, "leaf %d: %s", i, em_last_error());
            ok = false;
        }
    }
    const em_stats st0 = em_get_stats();
    for (int i = 0; ok && i < s->n_step; i++) {
        em_scope_begin();
        em_tensor *y = ch_apply(&s->st[i], v);
        if (y) em_tensor_retain(y);
        em_scope_end();
        if (!y) {
            snprintf(err, errn, "step %d (%s): %s", i, g_ops[s->st[i].kind].name, em_last_error());
            ok = false;
            break;
        }
        v[s->n_leaf + i] = y;
        for (int j = 0; j < nv; j++) /* release what no later step reads (and nobody keeps) */
            if (v[j] && last_use[j] == i && !s->keep[j]) {
                em_tensor_release(v[j]);
                v[j] = NULL;
            }
    }
    const em_stats st1 = em_get_stats(); /* flushes the stream */
    *fused = st1.fused_tasks - st0.fused_tasks;
    for (int j = 0; ok && j < nv; j++)
        if (s->keep[j]) ok = record(r, v[j], "chain value", err, errn);
    for (int j = 0; j < nv; j++)
        if (v[j]) em_tensor_release(v[j]);
    em_set_fusion(was);
    em_set_device(em_device_cpu());
    return ok;
}

/* The FUSED kind's case: for every fusable kind, a chain through it (its
 * class's guard ops, then a product with another input) with fusion on;
 * the chain must have run as FUSED task(s) (em_get_stats().fused_tasks
 * grows), and its result must equal the same chain with fusion off on the
 * same device within the dtype's tolerance. The CPU-vs-device comparison
 * of the fused results is the harness's. */
static bool case_fused(ctx *c)
{
    list_fusable_kinds();
    enum { PER = 13 * 37 };
    double *all = malloc(sizeof(double) * (size_t)g_n_fkinds * PER);
    if (!all) return fail_case(c, "malloc");
    const bool was = em_set_fusion(true);
    bool ok = true;
    for (int k = 0; ok && k < g_n_fkinds; k++) {
        const fkind *fk = &g_fkinds[k];
        chain_spec s;
        memset(&s, 0, sizeof s);
        s.dt = c->dt;
        s.nd = 2;
        s.shape[0] = 13, s.shape[1] = 37;
        s.n_leaf = 3;
        for (int i = 0; i < 3; i++) {
            s.lnd[i] = 2;
            s.lshape[i][0] = i == 2 ? 1 : 13; /* leaf 2 is a broadcast row */
            s.lshape[i][1] = 37;
            s.lstrided[i] = c->strided && i == 0;
        }
        c->made_strided = true;
        int cur = ch_step(c, &s, fk, 0);
        cur = ch_push(&s, EM_OP_MUL, cur, 1, 0, 0);
        s.keep[cur] = true;
        const uint64_t seed = rng_next(c) | 1;
        run_result fu, ea;
        int64_t nf = 0, nf_eager = 0;
        char err[400], why[400];
        const em_device dev = em_get_device();
        if (!ch_run(&s, seed, dev, true, &fu, &nf, err, sizeof err)) {
            snprintf(c->err, sizeof c->err, "chain through %s (fusion on): %s", g_ops[fk->kind].name, err);
            ok = false;
            break;
        }
        if (!ch_run(&s, seed, dev, false, &ea, &nf_eager, err, sizeof err)) {
            snprintf(c->err, sizeof c->err, "chain through %s (fusion off): %s", g_ops[fk->kind].name, err);
            result_free(&fu);
            ok = false;
            break;
        }
        em_set_device(dev);
        if (nf < 1) {
            snprintf(c->err, sizeof c->err, "chain through %s (%d ops): no FUSED task ran (fused_tasks did not grow)",
                     g_ops[fk->kind].name, s.n_step);
            ok = false;
        } else if (nf_eager != 0) {
            snprintf(c->err, sizeof c->err, "chain through %s with fusion off: %lld FUSED task(s) ran", g_ops[fk->kind].name,
                     (long long)nf_eager);
            ok = false;
        } else if (!compare(EM_OP_FUSED, c->dt, &ea, &fu, false, why, sizeof why)) {
            snprintf(c->err, sizeof c->err, "chain through %s: fused vs eager: %s", g_ops[fk->kind].name, why);
            ok = false;
        }
        /* the fused results, one row per kind, are this case's output (compared
         * with the CPU's by the harness) */
        if (ok && (fu.n != 1 || fu.t[0].n != PER)) {
            snprintf(c->err, sizeof c->err, "chain through %s: %d results of %lld values", g_ops[fk->kind].name, fu.n,
                     (long long)(fu.n ? fu.t[0].n : 0));
            ok = false;
        }
        if (ok) memcpy(all + (size_t)k * PER, fu.t[0].v, sizeof(double) * PER);
        result_free(&fu);
        result_free(&ea);
    }
    em_set_fusion(was);
    if (ok) {
        em_tensor *t = from_values(c, all, (int64_t)g_n_fkinds * PER, (const int64_t[]){g_n_fkinds, PER}, 2);
        ok = out(c, t, "fused chains (a row per kind)");
        em_tensor_release(t);
    }
    free(all);
    return ok;
}

/* ---- captured steps (issue #17; tasks/capture.c, kind STEP) -------------------
 *
 * A small training step — matmul, bias, relu, a dropout-style random mask,
 * squared loss, backward, Adam (its step count patched per replay), so the
 * recording holds tiles, fused chains, reductions, a random op and
 * optimizer updates — run 5 times on 5 batches: eagerly, and with step 2
 * captured and steps 3..5 replayed (each batch copied into the captured
 * input). The replayed run must equal the eager one on this device (same
 * kernels: within 1e-6 relative in f32, 1e-12 in f64); its parameters and
 * loss are the case's outputs, compared with the CPU's by the harness. */
static bool step_run(ctx *c, bool capture, em_tensor *const *xs, em_tensor **w_out, em_tensor **loss_out, int64_t *ntask)
{
    const em_dtype dt = (em_dtype)c->dt;
    em_manual_seed(1234);
    em_tensor *w = em_zeros(S(9, 5), 2, dt), *b = em_zeros(S(5), 1, dt); /* fresh copies: each run trains its own */
    em_tensor *x = em_zeros(S(6, 9), 2, dt);
    if (!w || !b || !x || em_copy_(w, xs[5]) != EM_OK || em_copy_(b, xs[6]) != EM_OK ||
        em_set_requires_grad(w, true) != EM_OK || em_set_requires_grad(b, true) != EM_OK)
        return fail_case(c, "step parameters");
    em_tensor *params[2] = {w, b};
    em_optim_config cfg = em_optim_config_default(EM_OPTIM_ADAM);
    cfg.lr = 0.05;
    em_optim *opt = em_optim_new(&cfg, params, 2);
    if (!opt) return fail_case(c, "em_optim_new");
    em_step *step = NULL;
    em_tensor *loss = NULL;
    bool ok = true;
    for (int k = 0; k < 5 && ok; k++) {
        if (em_copy_(x, xs[k]) != EM_OK) ok = fail_case(c, "em_copy_ of a batch");
        if (ok && step) {
            if (em_step_replay(step) != EM_OK) ok = fail_case(c, "em_step_replay");
            continue;
        }
        if (ok && capture && k == 1 && em_capture_begin() != EM_OK) ok = fail_case(c, "em_capture_begin");
        if (!ok) break;
        em_scope_begin();
        em_tensor *h = em_relu(em_add(em_matmul(x, w), b));
        em_tensor *mask = em_mul_scalar(em_cast(em_rand_bernoulli(S(6, 5), 2, EM_BOOL, 0.8), dt), 1.25);
        em_tensor *l = em_keep(em_mean_all(em_square(em_mul(h, mask))));
        em_grads *g = l ? em_backward(l) : NULL;
        if (!g || em_optim_step(opt, g) != EM_OK) ok = fail_case(c, "step");
        em_grads_free(g);
        em_scope_end();
        em_tensor_release(loss);
        loss = l;
        if (ok && capture && k == 1) {
            step = em_capture_end();
            if (!step) ok = fail_case(c, "em_capture_end");
            else *ntask = em_step_task_count(step);
        }
    }
    if (ok && em_sync() != EM_OK) ok = fail_case(c, "em_sync after the steps");
    em_step_free(step);
    em_optim_free(opt);
    em_tensor_release(x);
    em_tensor_release(b);
    *w_out = w;
    *loss_out = loss;
    return ok;
}

static bool step_close(ctx *c, const em_tensor *a, const em_tensor *b, const char *what)
{
    const int64_t n = em_tensor_numel(a);
    double *va = malloc(sizeof(double) * (size_t)n), *vb = malloc(sizeof(double) * (size_t)n);
    em_tensor *ca = em_cast(a, EM_F64), *cb = em_cast(b, EM_F64);
    bool ok = va && vb && ca && cb && em_to_host(ca, va, sizeof(double) * (size_t)n) == EM_OK &&
              em_to_host(cb, vb, sizeof(double) * (size_t)n) == EM_OK;
    const double tol = c->dt == EM_F64 ? 1e-12 : 1e-6;
    for (int64_t i = 0; ok && i < n; i++)
        if (!(fabs(va[i] - vb[i]) <= tol * (1 + fabs(va[i])))) {
            snprintf(c->err, sizeof c->err, "captured step: %s[%lld] = %.9g replayed vs %.9g eager", what, (long long)i,
                     vb[i], va[i]);
            ok = false;
        }
    if (!va || !vb || !ca || !cb) ok = fail_case(c, "step_close");
    free(va);
    free(vb);
    em_tensor_release(ca);
    em_tensor_release(cb);
    return ok;
}

static bool case_step(ctx *c)
{
    c->no_backward = true;
    em_tensor *xs[7];
    for (int k = 0; k < 5; k++) {
        xs[k] = IN(c, c->dt, (6, 9), -1, 1, IN_CONTIG);
        REQ(c, xs[k]);
    }
    xs[5] = IN(c, c->dt, (9, 5), -0.5, 0.5, IN_CONTIG);
    xs[6] = IN(c, c->dt, (5), -0.1, 0.1, IN_CONTIG);
    REQ(c, xs[5]);
    REQ(c, xs[6]);
    em_tensor *we = NULL, *le = NULL, *wc = NULL, *lc = NULL;
    int64_t ntask = 0, unused = 0;
    bool ok = true;
    if (c->dt == EM_F32) {
        /* the f16 step (widened ops: their f32 copies are recorded too), captured vs
         * eager on this device; not an output (5 Adam steps in f16 drift from the
         * f32 reference beyond the 16-bit tolerance) */
        em_tensor *hx[7] = {0};
        for (int k = 0; k < 7 && ok; k++) ok = (hx[k] = em_cast(xs[k], EM_F16)) != NULL;
        const int dt = c->dt;
        c->dt = EM_F16;
        if (ok) ok = step_run(c, false, hx, &we, &le, &unused) && step_run(c, true, hx, &wc, &lc, &ntask);
        if (ok) ok = step_close(c, we, wc, "f16 weight") && step_close(c, le, lc, "f16 loss");
        c->dt = dt;
        for (int k = 0; k < 7; k++) em_tensor_release(hx[k]);
        em_tensor_release(we);
        em_tensor_release(le);
        em_tensor_release(wc);
        em_tensor_release(lc);
        we = le = wc = lc = NULL;
        if (!ok) return false;
    }
    ok = step_run(c, false, xs, &we, &le, &unused) && step_run(c, true, xs, &wc, &lc, &ntask);
    if (ok && ntask < 8) {
        snprintf(c->err, sizeof c->err, "captured step: %lld recorded tasks (expected the whole step)", (long long)ntask);
        ok = false;
    }
    if (ok) ok = step_close(c, we, wc, "weight") && step_close(c, le, lc, "loss");
    if (ok) ok = out(c, wc, "weight after 3 replays") && out(c, lc, "loss of the last replay");
    em_tensor_release(we);
    em_tensor_release(le);
    em_tensor_release(wc);
    em_tensor_release(lc);
    return ok;
}

/* ---- devices ---------------------------------------------------------------------- */

#define MAX_DEV 16

typedef struct dev_entry {
    em_device dev;
    char name[32];
    const em_kernel_fn *table; /* kernel table of that device kind; NULL = unknown */
    bool table_known;
} dev_entry;

/* The device kernel tables (devices/devices.h): this test links the library's
 * objects (ember_objs, tests/CMakeLists.txt), so it reads them directly; a
 * build without a backend has tasks/funnel.c's weak all-NULL tables. */
static const em_kernel_fn *kernel_table(em_device_kind kind, bool *known)
{
    *known = true;
    return kind == EM_DEVICE_CUDA ? em__cuda_kernels : em__opencl_kernels;
}

static int list_devices(dev_entry *devs)
{
    int n = 0;
    static const struct {
        em_device_kind kind;
        const char *label;
    } kinds[] = {{EM_DEVICE_CUDA, "CUDA"}, {EM_DEVICE_OPENCL, "OpenCL"}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int workers = em_worker_count(kinds[k].kind);
        if (workers <= 0) {
            printf("consistency: %s: absent (no %s worker in this process)\n", kinds[k].label, kinds[k].label);
            continue;
        }
        bool known;
        const em_kernel_fn *table = kernel_table(kinds[k].kind, &known);
        int found = 0;
        for (int i = 0; i < MAX_DEV && n < MAX_DEV; i++) {
            em_device d = {kinds[k].kind, i};
            if (em_set_device(d) != EM_OK) continue;
            devs[n].dev = d;
            em_device_str(d, devs[n].name, sizeof devs[n].name);
            devs[n].table = table;
            devs[n].table_known = known;
            n++;
            found++;
        }
        em_set_device(em_device_cpu());
        printf("consistency: %s: %d worker(s), %d device(s) tested%s\n", kinds[k].label, workers, found,
               known ? "" : " (kernel table not exported: unsupported ops cannot be told apart, marked ok*)");
    }
    return n;
}

static bool op_selected(const char *name)
{
    const char *sel = getenv("EMBER_CONSISTENCY_OPS");
    if (!sel || !*sel) return true;
    size_t ln = strlen(name);
    for (const char *p = sel; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == ln && !strncmp(p, name, ln)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* ---- tests ------------------------------------------------------------------------- */

/* Every case whose dtypes include f32 also runs in f16 and bf16 (the
 * 16-bit storage types); the others (integer-only ops: one_hot) cannot. */
static void add_half_dtypes(void)
{
    for (int k = 0; k < EM_OP_COUNT; k++) {
        int *d = g_cases[k].dts, n = 0;
        bool f32 = false, done = false;
        if (!g_cases[k].fn || k == EM_OP_FUSED || k == EM_OP_STEP) continue; /* fusion: f32 and f64 only; step: below */
        while (n < MAX_DTS && d[n] != END) {
            f32 = f32 || d[n] == EM_F32;
            done = done || is_half_dt(d[n]);
            n++;
        }
        if (!f32 || done) continue;
        if (n + 3 > MAX_DTS) fail_msg("op '%s': no room for f16 / bf16 in its dtype list (MAX_DTS)", g_ops[k].name);
        d[n] = EM_F16;
        d[n + 1] = EM_BF16;
        d[n + 2] = END;
    }
}

/* An element-wise kind of the table without a row above gets the generic
 * case of its kind of front end (EW1: case_unary, EWS: case_scalar, EW2:
 * case_binary) over the float dtypes and i32 (promoted) for F_FLOAT kinds,
 * every numeric dtype but u8 otherwise. Its input domain, if it needs one,
 * is a line in case_unary / case_binary. */
static void add_half_dtypes(void);
static void fill_default_cases(void)
{
    static const int float_math[MAX_DTS] = FLOAT_MATH, int_ok[MAX_DTS] = INT_OK;
    for (int k = 0; k < EM_OP_COUNT; k++) {
        if (g_cases[k].fn) continue;
        case_fn fn = unary_of(k) ? case_unary : scalar_of(k) ? case_scalar : binary_of(k) ? case_binary : NULL;
        if (!fn) continue;
        g_cases[k].fn = fn;
        memcpy(g_cases[k].dts, (g_ops[k].flags & F_FLOAT) ? float_math : int_ok, sizeof g_cases[k].dts);
        g_cases[k].tol_scale = 1;
    }
    add_half_dtypes();
}

/* Every op kind of tasks/ops.def must have a case (new ops cannot be forgotten),
 * except collectives and fences (F_COLLECTIVE, F_NOWHERE: no tensor math to
 * compare; test_dist, test_dist_mpi2 and test_replicas cover them). */
static void test_case_table_complete(void **state)
{
    (void)state;
    fill_default_cases();
    int missing = 0;
    for (int k = 0; k < EM_OP_COUNT; k++) {
        if (!g_ops[k].name) fail_msg("op table entry %d has no name", k);
        if (g_ops[k].flags & (F_COLLECTIVE | F_NOWHERE)) {
            if (g_cases[k].fn) fail_msg("op '%s' is a collective or a fence: it has no consistency case", g_ops[k].name);
            continue;
        }
        if (!g_cases[k].fn) {
            fprintf(stderr, "consistency: op '%s' (kind %d) has no case in tests/test_consistency.c\n", g_ops[k].name, k);
            missing++;
        }
    }
    if (missing) fail_msg("%d op kind(s) of tasks/ops.def have no consistency case", missing);
    /* An element-wise kind without an integer expression (EW_NA) must be float
     * math (F_FLOAT: the front end promotes integers), else its integer kernels
     * would compute the placeholder. */
    int bad = 0;
#define EW_ROW_CHECK(nm, fl, ix)                                                                   \
    if (!strcmp(#ix, "EW_NA") && !((fl) & F_FLOAT)) {                                              \
        fprintf(stderr, "consistency: op '%s' has no integer expression but is not F_FLOAT\n", #nm); \
        bad++;                                                                                     \
    }
#define EW1(E, nm, fl, fx, ix, bw) EW_ROW_CHECK(nm, fl, ix)
#define EW2(E, nm, fl, fx, ix, bw) EW_ROW_CHECK(nm, fl, ix)
#include "tasks/ops.def"
#undef EW_ROW_CHECK
    if (bad) fail_msg("%d element-wise op kind(s) lack an integer expression without F_FLOAT", bad);
}

enum { ST_NONE, ST_OK, ST_OK_UNKNOWN, ST_UNSUPPORTED, ST_FAIL };

static void test_consistency_all(void **state)
{
    (void)state;
    const char *tf = getenv("EMBER_TF32");
    if (tf && atoi(tf) == 1) g_tf32_scale = 300;
    const bool verbose = getenv("EMBER_CONSISTENCY_VERBOSE") && atoi(getenv("EMBER_CONSISTENCY_VERBOSE"));
    fill_default_cases();
    /* diagnostic: require bit-identical results on the devices too */
    const bool exact_devices = getenv("EMBER_CONSISTENCY_EXACT") && atoi(getenv("EMBER_CONSISTENCY_EXACT"));
    dev_entry devs[MAX_DEV];
    const int ndev = list_devices(devs);
    const em_stats st0 = em_get_stats();
    if (ndev == 0) printf("consistency: no device besides the CPU: running the CPU-vs-CPU determinism check only\n");
    /* CI sets EMBER_CONSISTENCY_REQUIRE=opencl (or cuda): a missing device then fails instead of passing quietly */
    const char *req = getenv("EMBER_CONSISTENCY_REQUIRE");
    if (req && !strcmp(req, "opencl") && em_worker_count(EM_DEVICE_OPENCL) == 0)
        fail_msg("EMBER_CONSISTENCY_REQUIRE=opencl but this process has no OpenCL worker");
    if (req && !strcmp(req, "cuda") && em_worker_count(EM_DEVICE_CUDA) == 0)
        fail_msg("EMBER_CONSISTENCY_REQUIRE=cuda but this process has no CUDA worker");

    static int status[EM_OP_COUNT][1 + MAX_DEV];
    static char first_err[EM_OP_COUNT][1 + MAX_DEV][700];
    memset(status, 0, sizeof status);
    int nfail = 0, nrun = 0;
    char err[512], why[400];

    for (int k = 0; k < EM_OP_COUNT; k++) {
        if (!g_cases[k].fn || !op_selected(g_ops[k].name)) continue;
        for (int col = 0; col <= ndev; col++) {
            bool unsupported = col > 0 && !(g_ops[k].flags & F_VIEW) && devs[col - 1].table_known &&
                               (!devs[col - 1].table || !devs[col - 1].table[k]);
            status[k][col] = unsupported ? ST_UNSUPPORTED : (col > 0 && !devs[col - 1].table_known) ? ST_OK_UNKNOWN : ST_OK;
        }
        for (int di = 0; di < MAX_DTS && g_cases[k].dts[di] != END; di++) {
            const int dt = g_cases[k].dts[di];
            for (int strided = 0; strided < 2; strided++) {
                run_result ref, again;
                bool made = false;
                nrun++;
                bool ok = run_variant(k, dt, dt, -1, strided, em_device_cpu(), &ref, &made, err, sizeof err);
                if (ok) {
                    bool made2;
                    ok = run_variant(k, dt, dt, -1, strided, em_device_cpu(), &again, &made2, err, sizeof err);
                    if (ok && !compare(k, dt, &ref, &again, true, why, sizeof why)) {
                        snprintf(err, sizeof err, "CPU run twice differs: %s", why);
                        ok = false;
                    }
                    result_free(&again);
                }
                /* 16 bits: the CPU's result against its f32 result of the same
                 * inputs (rounded to 16 bits), rounded to 16 bits */
                bool ref_ok = ok;
                if (ok && is_half_dt(dt)) {
                    run_result r32;
                    bool m32;
                    ref_ok = run_variant(k, EM_F32, dt, dt, strided, em_device_cpu(), &r32, &m32, err, sizeof err);
                    if (!ref_ok) {
                        char e2[sizeof err];
                        memcpy(e2, err, sizeof e2);
                        e2[400] = 0;
                        snprintf(err, sizeof err, "its f32 reference failed: %.400s", e2);
                    } else if (!compare_ex(k, dt, &r32, &ref, false, true, why, sizeof why)) {
                        snprintf(err, sizeof err, "against its f32 reference: %.400s", why);
                        ref_ok = false;
                    }
                    result_free(&r32);
                }
                const char *lay = strided ? "strided" : "contiguous";
                if (!ok || !ref_ok) {
                    if (status[k][0] != ST_FAIL) {
                        snprintf(first_err[k][0], sizeof first_err[k][0], "%s %s: %s", em_dtype_name((em_dtype)dt), lay, err);
                        nfail++;
                    }
                    status[k][0] = ST_FAIL;
                } else if (verbose) {
                    printf("  %-16s %-8s %-10s cpu: ok (%d tensors)\n", g_ops[k].name, em_dtype_name((em_dtype)dt), lay, ref.n);
                }
                for (int d = 0; ok && d < ndev; d++) {
                    run_result got;
                    bool m3;
                    bool dok = run_variant(k, dt, dt, -1, strided, devs[d].dev, &got, &m3, err, sizeof err);
                    if (dok && !compare(k, dt, &ref, &got, exact_devices, why, sizeof why)) {
                        snprintf(err, sizeof err, "%s", why);
                        dok = false;
                    }
                    result_free(&got);
                    if (!dok) {
                        if (status[k][d + 1] != ST_FAIL) {
                            snprintf(first_err[k][d + 1], sizeof first_err[k][d + 1], "%s %s: %s",
                                     em_dtype_name((em_dtype)dt), lay, err);
                            nfail++;
                        }
                        status[k][d + 1] = ST_FAIL;
                    } else if (verbose) {
                        printf("  %-16s %-8s %-10s %s: ok\n", g_ops[k].name, em_dtype_name((em_dtype)dt), lay, devs[d].name);
                    }
                }
                result_free(&ref);
                if (!made) break; /* no strided input in this case: the strided variant is the same run */
            }
        }
    }

    /* the table */
    static const char *st_name[] = {"-", "ok", "ok*", "unsupported", "FAIL"};
    printf("\n%-18s %-12s", "op", "cpu (det.)");
    for (int d = 0; d < ndev; d++) printf(" %-12s", devs[d].name);
    printf("\n");
    for (int k = 0; k < EM_OP_COUNT; k++) {
        if (!status[k][0]) continue;
        printf("%-18s %-12s", g_ops[k].name, st_name[status[k][0]]);
        for (int d = 0; d < ndev; d++) printf(" %-12s", st_name[status[k][d + 1]]);
        printf("\n");
    }
    int nuns = 0;
    for (int d = 0; d < ndev; d++) {
        int cnt = 0;
        for (int k = 0; k < EM_OP_COUNT; k++)
            if (status[k][d + 1] == ST_UNSUPPORTED) {
                if (!cnt) printf("unsupported on %s (no kernel: ran on the CPU):", devs[d].name);
                printf(" %s", g_ops[k].name);
                cnt++;
            }
        if (cnt) printf("\n");
        nuns += cnt;
    }
    bool all_known = true;
    for (int d = 0; d < ndev; d++) all_known = all_known && devs[d].table_known;
    if (!nuns && ndev && all_known) printf("every task op has a kernel on every device tested\n");
    if (!all_known) printf("ok*: the device's kernel table is not exported (em__<dev>_kernel_table): results match, but an op may have run on the CPU\n");
    for (int k = 0; k < EM_OP_COUNT; k++)
        for (int col = 0; col <= ndev; col++)
            if (status[k][col] == ST_FAIL)
                printf("FAIL %s on %s: %s\n", g_ops[k].name, col ? devs[col - 1].name : "cpu", first_err[k][col]);
    const em_stats st1 = em_get_stats();
    if (st1.live_tensors != st0.live_tensors)
        printf("consistency: note: %lld live tensors before the cases, %lld after (a leak in some op?)\n",
               (long long)st0.live_tensors, (long long)st1.live_tensors);
    printf("consistency: worst error / tolerance (1 = at the tolerance):\n");
    for (int dt = 0; dt < EM_DTYPE_COUNT; dt++)
        for (int r = 0; r < 2; r++)
            if (g_worst[dt][r].seen)
                printf("  %-8s %-18s %-6.3g (rtol %g, atol %g%s) %s%s%s\n", em_dtype_name((em_dtype)dt),
                       r ? "CPU vs f32 rounded" : "device vs CPU", g_worst[dt][r].ratio, g_tol[dt].rtol, g_tol[dt].atol,
                       g_tol[dt].of_max ? " x max|ref|" : "", g_worst[dt][r].where[0] ? g_ops[g_worst[dt][r].kind].name : "all equal",
                       g_worst[dt][r].where[0] ? ", " : "", g_worst[dt][r].where);
    printf("consistency: %d case variants, %d device(s) besides the CPU, %d failure(s)\n", nrun, ndev, nfail);
    fflush(stdout);
    if (nfail) fail_msg("%d op/device pair(s) FAIL (see the table above)", nfail);
}

/* The fused mode (EMBER_CONSISTENCY_FUSED=1; ctest test_consistency_fused and
 * _opencl, which also set EMBER_FUSION=1): random chains of 2..8 fusable
 * element-wise kinds (any of the table's EW1 / EWS / EWP / EW2 kinds that is
 * not F_CMP, with their class's guard ops: see fkind above), random shapes
 * with broadcast and strided leaves, in f32 and f64, some with an
 * intermediate read after the chain, each released after its last use
 * otherwise. Reference: the chain with fusion off on the CPU. Each chain runs
 * with fusion on on the CPU and on every other device, and must equal the
 * reference within the dtype's tolerance (g_tol); with fusion off on each
 * device too (the eager baseline of the same comparison). Fails when a
 * fused result differs, or when no chain of a device and dtype ran as a
 * FUSED task. EMBER_CONSISTENCY_CHAINS: chains per dtype (default 60). */
static void test_fused_chains(void **state)
{
    (void)state;
    list_fusable_kinds();
    fill_default_cases();
    const char *nc = getenv("EMBER_CONSISTENCY_CHAINS");
    const int nchains = nc && atoi(nc) > 0 ? atoi(nc) : 60;
    dev_entry devs[MAX_DEV];
    const int ndev = list_devices(devs);
    const char *req = getenv("EMBER_CONSISTENCY_REQUIRE");
    if (req && !strcmp(req, "opencl") && em_worker_count(EM_DEVICE_OPENCL) == 0)
        fail_msg("EMBER_CONSISTENCY_REQUIRE=opencl but this process has no OpenCL worker");
    if (req && !strcmp(req, "cuda") && em_worker_count(EM_DEVICE_CUDA) == 0)
        fail_msg("EMBER_CONSISTENCY_REQUIRE=cuda but this process has no CUDA worker");
    printf("consistency (fused chains): fusion %s by default, %d fusable kinds, %d chains per dtype\n",
           em_fusion_enabled() ? "on" : "off", g_n_fkinds, nchains);
    static const int dts[] = {EM_F32, EM_F64};
    int nfail = 0, nrun = 0;
    char err[512], why[400];
    for (size_t di = 0; di < 2; di++) {
        const int dt = dts[di];
        int64_t fused_total[1 + MAX_DEV] = {0}, with_fused[1 + MAX_DEV] = {0};
        int64_t ops_total = 0;
        for (int ci = 0; ci < nchains; ci++) {
            ctx gen = {.rng = variant_seed(EM_OP_FUSED, dt, 0) ^ ((uint64_t)(ci + 1) * 0x9E3779B97F4A7C15ULL)};
            if (!gen.rng) gen.rng = 1;
            chain_spec s;
            ch_random(&gen, &s, dt, 2 + (int)(rng_next(&gen) % 7));
            const uint64_t seed = rng_next(&gen) | 1;
            ops_total += s.n_step;
            char desc[400];
            int dl = snprintf(desc, sizeof desc, "chain %d (%s, %d leaves, [", ci, em_dtype_name((em_dtype)dt), s.n_leaf);
            for (int d = 0; d < s.nd; d++) dl += snprintf(desc + dl, sizeof desc - (size_t)dl, d ? ",%lld" : "%lld", (long long)s.shape[d]);
            dl += snprintf(desc + dl, sizeof desc - (size_t)dl, "]):");
            for (int i = 0; i < s.n_step && dl < (int)sizeof desc - 20; i++)
                dl += snprintf(desc + dl, sizeof desc - (size_t)dl, " %s", g_ops[s.st[i].kind].name);
            run_result ref;
            int64_t nf;
            nrun++;
            if (!ch_run(&s, seed, em_device_cpu(), false, &ref, &nf, err, sizeof err)) {
                printf("FAIL %s: the eager CPU reference: %s\n", desc, err);
                nfail++;
                continue;
            }
            if (nf != 0) {
                printf("FAIL %s: fusion off, yet %lld FUSED task(s) ran\n", desc, (long long)nf);
                nfail++;
            }
            for (int col = 0; col <= ndev; col++) {
                const em_device dev = col ? devs[col - 1].dev : em_device_cpu();
                const char *dname = col ? devs[col - 1].name : "cpu";
                for (int fusion = (col ? 0 : 1); fusion < 2; fusion++) {
                    run_result got;
                    if (!ch_run(&s, seed, dev, fusion == 1, &got, &nf, err, sizeof err)) {
                        printf("FAIL %s on %s (fusion %s): %s\n", desc, dname, fusion ? "on" : "off", err);
                        nfail++;
                        continue;
                    }
                    if (fusion) {
                        fused_total[col] += nf;
                        with_fused[col] += nf > 0;
                    }
                    if (!compare(EM_OP_FUSED, dt, &ref, &got, false, why, sizeof why)) {
                        printf("FAIL %s on %s (fusion %s) vs eager CPU: %s\n", desc, dname, fusion ? "on" : "off", why);
                        nfail++;
                    } else if (getenv("EMBER_CONSISTENCY_VERBOSE") && atoi(getenv("EMBER_CONSISTENCY_VERBOSE"))) {
                        printf("  ok %s on %s (fusion %s, %lld FUSED tasks)\n", desc, dname, fusion ? "on" : "off", (long long)nf);
                    }
                    result_free(&got);
                }
            }
            result_free(&ref);
        }
        for (int col = 0; col <= ndev; col++) {
            const char *dname = col ? devs[col - 1].name : "cpu";
            printf("consistency (fused chains): %s %s: %d chains (%lld ops), %lld ran as FUSED task(s), %lld FUSED tasks\n",
                   em_dtype_name((em_dtype)dt), dname, nchains, (long long)ops_total, (long long)with_fused[col],
                   (long long)fused_total[col]);
            if (with_fused[col] == 0) {
                printf("FAIL %s on %s: no chain ran as a FUSED task\n", em_dtype_name((em_dtype)dt), dname);
                nfail++;
            }
        }
    }
    for (int dt = 0; dt < EM_DTYPE_COUNT; dt++)
        if (g_worst[dt][0].seen)
            printf("  %-8s worst error / tolerance %.3g (rtol %g, atol %g) %s\n", em_dtype_name((em_dtype)dt), g_worst[dt][0].ratio,
                   g_tol[dt].rtol, g_tol[dt].atol, g_worst[dt][0].where);
    printf("consistency (fused chains): %d chains, %d device(s) besides the CPU, %d failure(s)\n", nrun, ndev, nfail);
    fflush(stdout);
    if (nfail) fail_msg("%d fused chain comparison(s) FAIL (see above)", nfail);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a timeout */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case_table_complete),
        cmocka_unit_test(test_consistency_all),
    };
    /* the fused mode: random element-wise chains, fused vs eager (test_fused_chains) */
    const struct CMUnitTest fused[] = {
        cmocka_unit_test(test_fused_chains), /* (the case table's completeness: the plain mode's) */
    };
    const char *fm = getenv("EMBER_CONSISTENCY_FUSED");
    if (fm && atoi(fm) == 1) return cmocka_run_group_tests(fused, em_test_setup, em_test_teardown);
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
