/* CPU kernels: element-wise unary / tensor-scalar / binary / where / copy+cast.
 * Inputs are strided (broadcast views have stride 0), outputs are strided. */
#include "devices/cpu/cpu.h"

#include <math.h>
#include <tgmath.h>

/* Row loop over 2 operands (y = out, x = in): x is stored as S and loaded
 * as LD(s) of compute type T_, y stored as OS from ST(value).
 * LOOP1 is the plain case (storage = compute type). */
#define EW_ID(v) (v)
#define LOOP1X(T_, S, OS, LD, ST, EXPR)                                                    \
    do {                                                                                   \
        typedef T_ T;                                                                      \
        const S *X_ = (const S *)bufs[0];                                                  \
        OS *Y_ = (OS *)bufs[1];                                                            \
        const int64_t *st_[2] = {k->out[0].strides, k->in[0].strides};                    \
        const int64_t off_[2] = {k->out[0].offset, k->in[0].offset};                       \
        em_iter it_;                                                                       \
        em_iter_init(&it_, k->out[0].ndim, k->out[0].shape, 2, st_, off_);                 \
        EM_ITER_FOREACH_ROW(&it_)                                                          \
        {                                                                                  \
            OS *y_ = Y_ + it_.off[0];                                                      \
            const S *xp_ = X_ + it_.off[1];                                                \
            const int64_t so_ = it_.inner_st[0], si_ = it_.inner_st[1], n_ = it_.inner;    \
            if (so_ == 1 && si_ == 1)                                                      \
                for (int64_t j = 0; j < n_; j++) {                                         \
                    const T x = LD(xp_[j]);                                                \
                    (void)x;                                                               \
                    y_[j] = ST(EXPR);                                                      \
                }                                                                          \
            else                                                                           \
                for (int64_t j = 0; j < n_; j++) {                                         \
                    const T x = LD(xp_[j * si_]);                                          \
                    (void)x;                                                               \
                    y_[j * so_] = ST(EXPR);                                                \
                }                                                                          \
        }                                                                                  \
    } while (0)
#define LOOP1(T_, OT, EXPR) LOOP1X(T_, T_, OT, EW_ID, (OT), EXPR)

/* Row loop over 3 operands (y = out, a, b), as LOOP1X. */
#define LOOP2X(T_, S, OS, LD, ST, EXPR)                                                                       \
    do {                                                                                         \
        typedef T_ T;                                                                                         \
        const S *A_ = (const S *)bufs[0];                                                        \
        const S *B_ = (const S *)bufs[1];                                                        \
        OS *Y_ = (OS *)bufs[2];                                                                  \
        const int64_t *st_[3] = {k->out[0].strides, k->in[0].strides, k->in[1].strides};        \
        const int64_t off_[3] = {k->out[0].offset, k->in[0].offset, k->in[1].offset};            \
        em_iter it_;                                                                             \
        em_iter_init(&it_, k->out[0].ndim, k->out[0].shape, 3, st_, off_);                       \
        EM_ITER_FOREACH_ROW(&it_)                                                                \
        {                                                                                        \
            OS *y_ = Y_ + it_.off[0];                                                            \
            const S *ap_ = A_ + it_.off[1], *bp_ = B_ + it_.off[2];                              \
            const int64_t so_ = it_.inner_st[0], sa_ = it_.inner_st[1], sb_ = it_.inner_st[2];   \
            const int64_t n_ = it_.inner;                                                        \
            if (so_ == 1 && sa_ == 1 && sb_ == 1)                                                \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = LD(ap_[j]), b = LD(bp_[j]);                                              \
                    (void)a, (void)b;                                                            \
                    y_[j] = ST(EXPR);                                                          \
                }                                                                                \
            else if (so_ == 1 && sa_ == 1 && sb_ == 0) {                                         \
                const T b = LD(bp_[0]);                                                              \
                (void)b;                                                                         \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = LD(ap_[j]);                                                          \
                    (void)a;                                                                     \
                    y_[j] = ST(EXPR);                                                          \
                }                                                                                \
            } else                                                                               \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = LD(ap_[j * sa_]), b = LD(bp_[j * sb_]);                                  \
                    (void)a, (void)b;                                                            \
                    y_[j * so_] = ST(EXPR);                                                    \
                }                                                                                \
        }                                                                                        \
    } while (0)
#define LOOP2(T_, OT, EXPR) LOOP2X(T_, T_, OT, EW_ID, (OT), EXPR)

/* ---- unary and binary: rendered from the expressions of tasks/ops.def ---- */

#include "devices/cpu/ew_expr.h"

/* One unary and one binary function per dtype: devices/cpu/ew_kernels.inc
 * with T and whether it is a float type. */
#define EW_T float
#define EW_NAME float
#define EW_IS_FLOAT 1
#include "devices/cpu/ew_kernels.inc"
#define EW_T double
#define EW_NAME double
#define EW_IS_FLOAT 1
#include "devices/cpu/ew_kernels.inc"
#define EW_T float /* f16 and bf16: stored as 16 bits, computed in f32 */
#define EW_S uint16_t
#define EW_NAME f16
#define EW_IS_FLOAT 1
#define EW_LD(h) em_f16_bits_to_f32(h)
#define EW_ST(v) em_f32_to_f16_bits((float)(v))
#include "devices/cpu/ew_kernels.inc"
#define EW_T float
#define EW_S uint16_t
#define EW_NAME bf16
#define EW_IS_FLOAT 1
#define EW_LD(h) em_bf16_bits_to_f32(h)
#define EW_ST(v) em_f32_to_bf16_bits((float)(v))
#include "devices/cpu/ew_kernels.inc"
#define EW_T int32_t
#define EW_NAME int32_t
#define EW_IS_FLOAT 0
#include "devices/cpu/ew_kernels.inc"
#define EW_T int64_t
#define EW_NAME int64_t
#define EW_IS_FLOAT 0
#include "devices/cpu/ew_kernels.inc"
#define EW_T uint8_t
#define EW_NAME uint8_t
#define EW_IS_FLOAT 0
#include "devices/cpu/ew_kernels.inc"

/* Integer remainder / fmod / floor_divide by zero: the sticky kernel error
 * (reported by the next em_sync / em_to_host / em_item), as PyTorch's CPU
 * raises ZeroDivisionError; the output is not written. The expressions
 * themselves (devices/ew_math.h) give 0 for it and never trap, which is what
 * the CUDA and OpenCL kernels return (they cannot report a per-element
 * condition without a synchronisation). */
static bool int_div_kind(int kind)
{
    return kind == EM_OP_REMAINDER || kind == EM_OP_FMOD || kind == EM_OP_FLOOR_DIVIDE;
}

#define HAS_ZERO_T(T)                                                                                \
    do {                                                                                             \
        const T *B_ = (const T *)b;                                                                  \
        EM_ITER_FOREACH_ROW(&it)                                                                     \
        for (int64_t j = 0; j < it.inner; j++)                                                       \
            if (B_[it.off[0] + j * it.inner_st[0]] == 0) return true;                                \
    } while (0)

/* Does operand d (of the output's shape) hold a zero? */
static bool has_zero(const em_kargs *k, const em_tdesc *d, const void *b)
{
    const int64_t *st[1] = {d->strides};
    const int64_t off[1] = {d->offset};
    em_iter it;
    em_iter_init(&it, k->out[0].ndim, k->out[0].shape, 1, st, off);
    switch (d->dtype) {
    case EM_I32: HAS_ZERO_T(int32_t); break;
    case EM_I64: HAS_ZERO_T(int64_t); break;
    case EM_U8:
    case EM_BOOL: HAS_ZERO_T(uint8_t); break;
    default: break;
    }
    return false;
}

static int64_t numel(const em_tdesc *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}

static bool int_div_by_zero(const em_kargs *k, const char *what)
{
    em__kernel_error(k, EM_ERR_INVALID, "integer %s by zero (%s)", what, em__kernel_info[k->kind].name);
    return true;
}

void em_cpu_unary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[2] = {em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1])};
    if (k->kind == EM_OP_REMAINDER_SCALAR && !em_dtype_is_float((em_dtype)k->in[0].dtype) &&
        (int64_t)k->p.s.a == 0 && numel(&k->out[0]) > 0) { /* f16 / bf16 are floats: no error, as f32 */
        int_div_by_zero(k, "remainder");
        return;
    }
    switch (k->in[0].dtype) {
    case EM_F32: unary_float(k, bufs); break;
    case EM_F64: unary_double(k, bufs); break;
    case EM_F16: unary_f16(k, bufs); break;
    case EM_BF16: unary_bf16(k, bufs); break;
    case EM_I32: unary_int32_t(k, bufs); break;
    case EM_I64: unary_int64_t(k, bufs); break;
    case EM_U8:
    case EM_BOOL: unary_uint8_t(k, bufs); break;
    default: em_cpu_bad_kind("unary dtype", k->in[0].dtype);
    }
}

/* bool: add is logical or, mul logical and, the rest as uint8. */
static void binary_bool(const em_kargs *k, void **bufs)
{
    switch (k->kind) {
    case EM_OP_ADD: LOOP2(uint8_t, uint8_t, (a != 0) || (b != 0)); break;
    case EM_OP_MUL: LOOP2(uint8_t, uint8_t, (a != 0) && (b != 0)); break;
    default: binary_uint8_t(k, bufs);
    }
}

void em_cpu_binary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[3] = {em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1]), em_cpu_ptr(buffers[2])};
    if (int_div_kind(k->kind) && !em_dtype_is_float((em_dtype)k->in[1].dtype) && has_zero(k, &k->in[1], bufs[1])) {
        int_div_by_zero(k, k->kind == EM_OP_FLOOR_DIVIDE ? "division" : "remainder");
        return;
    }
    switch (k->in[0].dtype) {
    case EM_F32: binary_float(k, bufs); break;
    case EM_F64: binary_double(k, bufs); break;
    case EM_F16: binary_f16(k, bufs); break;
    case EM_BF16: binary_bf16(k, bufs); break;
    case EM_I32: binary_int32_t(k, bufs); break;
    case EM_I64: binary_int64_t(k, bufs); break;
    case EM_U8: binary_uint8_t(k, bufs); break;
    case EM_BOOL: binary_bool(k, bufs); break;
    default: em_cpu_bad_kind("binary dtype", k->in[0].dtype);
    }
}

/* where(mask, a, b): element size generic. */
#define WHERE_T(T)                                                                                        \
    do {                                                                                                  \
        const uint8_t *M = bufs[0];                                                                       \
        const T *A = bufs[1], *B = bufs[2];                                                               \
        T *Y = bufs[3];                                                                                   \
        const int64_t *st[4] = {k->out[0].strides, k->in[0].strides, k->in[1].strides, k->in[2].strides}; \
        const int64_t off[4] = {k->out[0].offset, k->in[0].offset, k->in[1].offset, k->in[2].offset};     \
        em_iter it;                                                                                       \
        em_iter_init(&it, k->out[0].ndim, k->out[0].shape, 4, st, off);                                   \
        EM_ITER_FOREACH_ROW(&it)                                                                          \
        for (int64_t j = 0; j < it.inner; j++)                                                            \
            Y[it.off[0] + j * it.inner_st[0]] = M[it.off[1] + j * it.inner_st[1]]                         \
                ? A[it.off[2] + j * it.inner_st[2]] : B[it.off[3] + j * it.inner_st[3]];                  \
    } while (0)

void em_cpu_where(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[4] = {em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1]), em_cpu_ptr(buffers[2]), em_cpu_ptr(buffers[3])};
    switch (em_cpu_dtype_size(k->out[0].dtype)) {
    case 1: WHERE_T(uint8_t); break;
    case 2: WHERE_T(uint16_t); break;
    case 4: WHERE_T(uint32_t); break;
    case 8: WHERE_T(uint64_t); break;
    default: em_cpu_bad_kind("where dtype", k->out[0].dtype);
    }
}

/* ---- copy with cast --------------------------------------------------------- */

static inline double load_d(int dt, const char *p)
{
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_I32: return *(const int32_t *)p;
    case EM_I64: return (double)*(const int64_t *)p;
    case EM_F16:
    case EM_BF16: return em_cpu_half_load(dt, *(const uint16_t *)p);
    default: return *(const uint8_t *)p;
    }
}

static inline void store_d(int dt, char *p, double v, int64_t iv, bool use_i)
{
    switch (dt) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
    case EM_F16:
    case EM_BF16: *(uint16_t *)p = em_cpu_half_store(dt, use_i ? (float)iv : (float)v); break;
    case EM_I32: *(int32_t *)p = use_i ? (int32_t)iv : (int32_t)v; break;
    case EM_I64: *(int64_t *)p = use_i ? iv : (int64_t)v; break;
    case EM_U8: *(uint8_t *)p = use_i ? (uint8_t)iv : (uint8_t)(int64_t)v; break;
    case EM_BOOL: *(uint8_t *)p = use_i ? iv != 0 : v != 0; break;
    }
}

void em_cpu_copy(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const char *X = em_cpu_ptr(buffers[0]);
    char *Y = em_cpu_ptr(buffers[1]);
    int idt = k->in[0].dtype, odt = k->out[0].dtype;
    size_t is = em_cpu_dtype_size(idt), os = em_cpu_dtype_size(odt);
    const int64_t *st[2] = {k->out[0].strides, k->in[0].strides};
    const int64_t off[2] = {k->out[0].offset, k->in[0].offset};
    em_iter it;
    em_iter_init(&it, k->out[0].ndim, k->out[0].shape, 2, st, off);
    bool int_src = idt == EM_I64 || idt == EM_I32 || idt == EM_U8 || idt == EM_BOOL;
    EM_ITER_FOREACH_ROW(&it)
    {
        char *y = Y + it.off[0] * (int64_t)os;
        const char *x = X + it.off[1] * (int64_t)is;
        int64_t so = it.inner_st[0], si = it.inner_st[1], n = it.inner;
        if (idt == odt) {
            if (so == 1 && si == 1) {
                memcpy(y, x, (size_t)n * is);
            } else if (is == 2) {
                for (int64_t j = 0; j < n; j++) ((uint16_t *)y)[j * so] = ((const uint16_t *)x)[j * si];
            } else if (is == 4) {
                for (int64_t j = 0; j < n; j++) ((uint32_t *)y)[j * so] = ((const uint32_t *)x)[j * si];
            } else if (is == 8) {
                for (int64_t j = 0; j < n; j++) ((uint64_t *)y)[j * so] = ((const uint64_t *)x)[j * si];
            } else {
                for (int64_t j = 0; j < n; j++) y[j * so] = x[j * si];
            }
        } else if (idt == EM_F32 && odt == EM_F64 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((double *)y)[j] = ((const float *)x)[j];
        } else if (idt == EM_F64 && odt == EM_F32 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((float *)y)[j] = (float)((const double *)x)[j];
        } else if (idt == EM_F32 && odt == EM_BF16 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((uint16_t *)y)[j] = em_f32_to_bf16_bits(((const float *)x)[j]);
        } else if (idt == EM_F32 && odt == EM_F16 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((uint16_t *)y)[j] = em_f32_to_f16_bits(((const float *)x)[j]);
        } else if (idt == EM_BF16 && odt == EM_F32 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((float *)y)[j] = em_bf16_bits_to_f32(((const uint16_t *)x)[j]);
        } else if (idt == EM_F16 && odt == EM_F32 && so == 1 && si == 1) {
            for (int64_t j = 0; j < n; j++) ((float *)y)[j] = em_f16_bits_to_f32(((const uint16_t *)x)[j]);
        } else {
            for (int64_t j = 0; j < n; j++) {
                const char *xp = x + j * si * (int64_t)is;
                int64_t iv = 0;
                if (int_src) {
                    if (idt == EM_I64) iv = *(const int64_t *)xp;
                    else if (idt == EM_I32) iv = *(const int32_t *)xp;
                    else iv = *(const uint8_t *)xp;
                }
                store_d(odt, y + j * so * (int64_t)os, int_src ? (double)iv : load_d(idt, xp), iv, int_src);
            }
        }
    }
}
