/* CPU kernels: element-wise unary / tensor-scalar / binary / where / copy+cast.
 * Inputs are strided (broadcast views have stride 0), outputs are strided. */
#include "devices/cpu/cpu.h"

#include <math.h>

/* Row loop over 2 operands (y = out, x = in). */
#define LOOP1(T, OT, EXPR)                                                                 \
    do {                                                                                   \
        const T *X_ = (const T *)bufs[0];                                                  \
        OT *Y_ = (OT *)bufs[1];                                                            \
        const int64_t *st_[2] = {k->out[0].strides, k->in[0].strides};                    \
        const int64_t off_[2] = {k->out[0].offset, k->in[0].offset};                       \
        em_iter it_;                                                                       \
        em_iter_init(&it_, k->out[0].ndim, k->out[0].shape, 2, st_, off_);                 \
        EM_ITER_FOREACH_ROW(&it_)                                                          \
        {                                                                                  \
            OT *y_ = Y_ + it_.off[0];                                                      \
            const T *xp_ = X_ + it_.off[1];                                                \
            const int64_t so_ = it_.inner_st[0], si_ = it_.inner_st[1], n_ = it_.inner;    \
            if (so_ == 1 && si_ == 1)                                                      \
                for (int64_t j = 0; j < n_; j++) {                                         \
                    const T x = xp_[j];                                                    \
                    y_[j] = (OT)(EXPR);                                                    \
                }                                                                          \
            else                                                                           \
                for (int64_t j = 0; j < n_; j++) {                                         \
                    const T x = xp_[j * si_];                                              \
                    y_[j * so_] = (OT)(EXPR);                                              \
                }                                                                          \
        }                                                                                  \
    } while (0)

/* Row loop over 3 operands (y = out, a, b). */
#define LOOP2(T, OT, EXPR)                                                                       \
    do {                                                                                         \
        const T *A_ = (const T *)bufs[0];                                                        \
        const T *B_ = (const T *)bufs[1];                                                        \
        OT *Y_ = (OT *)bufs[2];                                                                  \
        const int64_t *st_[3] = {k->out[0].strides, k->in[0].strides, k->in[1].strides};        \
        const int64_t off_[3] = {k->out[0].offset, k->in[0].offset, k->in[1].offset};            \
        em_iter it_;                                                                             \
        em_iter_init(&it_, k->out[0].ndim, k->out[0].shape, 3, st_, off_);                       \
        EM_ITER_FOREACH_ROW(&it_)                                                                \
        {                                                                                        \
            OT *y_ = Y_ + it_.off[0];                                                            \
            const T *ap_ = A_ + it_.off[1], *bp_ = B_ + it_.off[2];                              \
            const int64_t so_ = it_.inner_st[0], sa_ = it_.inner_st[1], sb_ = it_.inner_st[2];   \
            const int64_t n_ = it_.inner;                                                        \
            if (so_ == 1 && sa_ == 1 && sb_ == 1)                                                \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = ap_[j], b = bp_[j];                                              \
                    y_[j] = (OT)(EXPR);                                                          \
                }                                                                                \
            else if (so_ == 1 && sa_ == 1 && sb_ == 0) {                                         \
                const T b = bp_[0];                                                              \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = ap_[j];                                                          \
                    y_[j] = (OT)(EXPR);                                                          \
                }                                                                                \
            } else                                                                               \
                for (int64_t j = 0; j < n_; j++) {                                               \
                    const T a = ap_[j * sa_], b = bp_[j * sb_];                                  \
                    y_[j * so_] = (OT)(EXPR);                                                    \
                }                                                                                \
        }                                                                                        \
    } while (0)

/* Float unary ops, T = float (S = f suffix) or double (S empty). */
#define FLOAT_UNARY(T, S)                                                                            \
    static void unary_##T(const em_kargs *k, void **bufs)                                            \
    {                                                                                                \
        const T sa = (T)k->p.s.a, sb = (T)k->p.s.b;                                                  \
        (void)sb;                                                                                    \
        switch (k->kind) {                                                                           \
        case EM_OP_NEG: LOOP1(T, T, -x); break;                                                      \
        case EM_OP_ABS: LOOP1(T, T, fabs##S(x)); break;                                              \
        case EM_OP_SIGN: LOOP1(T, T, (x > 0) - (x < 0)); break;                                      \
        case EM_OP_EXP: LOOP1(T, T, exp##S(x)); break;                                               \
        case EM_OP_LOG: LOOP1(T, T, log##S(x)); break;                                               \
        case EM_OP_LOG1P: LOOP1(T, T, log1p##S(x)); break;                                           \
        case EM_OP_SQRT: LOOP1(T, T, sqrt##S(x)); break;                                             \
        case EM_OP_RSQRT: LOOP1(T, T, (T)1 / sqrt##S(x)); break;                                     \
        case EM_OP_RECIPROCAL: LOOP1(T, T, (T)1 / x); break;                                         \
        case EM_OP_SQUARE: LOOP1(T, T, x * x); break;                                                \
        case EM_OP_SIN: LOOP1(T, T, sin##S(x)); break;                                               \
        case EM_OP_COS: LOOP1(T, T, cos##S(x)); break;                                               \
        case EM_OP_TANH: LOOP1(T, T, tanh##S(x)); break;                                             \
        case EM_OP_SIGMOID:                                                                          \
            LOOP1(T, T, x >= 0 ? (T)1 / ((T)1 + exp##S(-x)) : exp##S(x) / ((T)1 + exp##S(x)));       \
            break;                                                                                   \
        case EM_OP_RELU: LOOP1(T, T, x > 0 ? x : (T)0); break;                                       \
        case EM_OP_GELU: LOOP1(T, T, (T)0.5 * x * ((T)1 + erf##S(x * (T)M_SQRT1_2))); break;        \
        case EM_OP_GELU_TANH:                                                                        \
            LOOP1(T, T, (T)0.5 * x * ((T)1 + tanh##S((T)0.7978845608028654 * (x + (T)0.044715 * x * x * x)))); \
            break;                                                                                   \
        case EM_OP_SILU:                                                                             \
            LOOP1(T, T, x >= 0 ? x / ((T)1 + exp##S(-x)) : x * exp##S(x) / ((T)1 + exp##S(x)));      \
            break;                                                                                   \
        case EM_OP_SOFTPLUS: LOOP1(T, T, x > (T)20 ? x : log1p##S(exp##S(x))); break;               \
        case EM_OP_ERF: LOOP1(T, T, erf##S(x)); break;                                               \
        case EM_OP_FLOOR: LOOP1(T, T, floor##S(x)); break;                                           \
        case EM_OP_CEIL: LOOP1(T, T, ceil##S(x)); break;                                             \
        case EM_OP_ROUND: LOOP1(T, T, nearbyint##S(x)); break;                                       \
        case EM_OP_CLAMP: LOOP1(T, T, x < sa ? sa : (x > sb ? sb : x)); break;                       \
        case EM_OP_POW_SCALAR:                                                                       \
            if (sa == (T)2) LOOP1(T, T, x * x);                                                      \
            else if (sa == (T)0.5) LOOP1(T, T, sqrt##S(x));                                          \
            else LOOP1(T, T, pow##S(x, sa));                                                         \
            break;                                                                                   \
        case EM_OP_LEAKY_RELU: LOOP1(T, T, x >= 0 ? x : sa * x); break;                              \
        case EM_OP_ELU: LOOP1(T, T, x > 0 ? x : sa * expm1##S(x)); break;                            \
        case EM_OP_LOGICAL_NOT: LOOP1(T, uint8_t, x == 0); break;                                    \
        case EM_OP_ADD_SCALAR: LOOP1(T, T, x + sa); break;                                           \
        case EM_OP_SUB_SCALAR: LOOP1(T, T, x - sa); break;                                           \
        case EM_OP_RSUB_SCALAR: LOOP1(T, T, sa - x); break;                                          \
        case EM_OP_MUL_SCALAR: LOOP1(T, T, x * sa); break;                                           \
        case EM_OP_DIV_SCALAR: LOOP1(T, T, x / sa); break;                                           \
        case EM_OP_MAXIMUM_SCALAR: LOOP1(T, T, (x != x) ? x : (x > sa ? x : sa)); break;             \
        case EM_OP_MINIMUM_SCALAR: LOOP1(T, T, (x != x) ? x : (x < sa ? x : sa)); break;             \
        case EM_OP_REMAINDER_SCALAR: LOOP1(T, T, em_fmod_py##S(x, sa)); break;                       \
        case EM_OP_EQ_SCALAR: LOOP1(T, uint8_t, x == sa); break;                                     \
        case EM_OP_NE_SCALAR: LOOP1(T, uint8_t, x != sa); break;                                     \
        case EM_OP_LT_SCALAR: LOOP1(T, uint8_t, x < sa); break;                                      \
        case EM_OP_LE_SCALAR: LOOP1(T, uint8_t, x <= sa); break;                                     \
        case EM_OP_GT_SCALAR: LOOP1(T, uint8_t, x > sa); break;                                      \
        case EM_OP_GE_SCALAR: LOOP1(T, uint8_t, x >= sa); break;                                     \
        default: em_cpu_bad_kind("unary", k->kind);                                                  \
        }                                                                                            \
    }

static inline float em_fmod_pyf(float a, float b)
{
    float r = fmodf(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline double em_fmod_py(double a, double b)
{
    double r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
FLOAT_UNARY(float, f)
FLOAT_UNARY(double, )

#define IREM(T) \
    static inline T irem_##T(T a, T b) \
    { \
        if (b == 0) return 0; \
        T r = (T)(a % b); \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r; \
    }
IREM(int32_t)
IREM(int64_t)
IREM(uint8_t)

static inline int64_t ipow(int64_t x, int64_t e)
{
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return r;
}

/* Integer unary ops (float-only math never reaches here: the front end casts). */
#define INT_UNARY(T)                                                                       \
    static void unary_##T(const em_kargs *k, void **bufs)                                  \
    {                                                                                      \
        const T sa = (T)k->p.s.a, sb = (T)k->p.s.b;                                        \
        const double da = k->p.s.a, db = k->p.s.b;                                         \
        (void)sb;                                                                          \
        switch (k->kind) {                                                                 \
        case EM_OP_NEG: LOOP1(T, T, -x); break;                                            \
        case EM_OP_ABS: LOOP1(T, T, x < 0 ? -x : x); break;                                \
        case EM_OP_SIGN: LOOP1(T, T, (x > 0) - (x < 0)); break;                            \
        case EM_OP_SQUARE: LOOP1(T, T, x * x); break;                                      \
        case EM_OP_RELU: LOOP1(T, T, x > 0 ? x : 0); break;                                \
        case EM_OP_FLOOR: case EM_OP_CEIL: case EM_OP_ROUND: LOOP1(T, T, x); break;        \
        case EM_OP_CLAMP: LOOP1(T, T, x < da ? (T)da : (x > db ? (T)db : x)); break;       \
        case EM_OP_POW_SCALAR: LOOP1(T, T, ipow(x, (int64_t)sa)); break;                   \
        case EM_OP_LOGICAL_NOT: LOOP1(T, uint8_t, x == 0); break;                          \
        case EM_OP_ADD_SCALAR: LOOP1(T, T, x + sa); break;                                 \
        case EM_OP_SUB_SCALAR: LOOP1(T, T, x - sa); break;                                 \
        case EM_OP_RSUB_SCALAR: LOOP1(T, T, sa - x); break;                                \
        case EM_OP_MUL_SCALAR: LOOP1(T, T, x * sa); break;                                 \
        case EM_OP_MAXIMUM_SCALAR: LOOP1(T, T, x > sa ? x : sa); break;                    \
        case EM_OP_MINIMUM_SCALAR: LOOP1(T, T, x < sa ? x : sa); break;                    \
        case EM_OP_REMAINDER_SCALAR: LOOP1(T, T, irem_##T(x, sa)); break;                  \
        case EM_OP_EQ_SCALAR: LOOP1(T, uint8_t, x == da); break;                           \
        case EM_OP_NE_SCALAR: LOOP1(T, uint8_t, x != da); break;                           \
        case EM_OP_LT_SCALAR: LOOP1(T, uint8_t, x < da); break;                            \
        case EM_OP_LE_SCALAR: LOOP1(T, uint8_t, x <= da); break;                           \
        case EM_OP_GT_SCALAR: LOOP1(T, uint8_t, x > da); break;                            \
        case EM_OP_GE_SCALAR: LOOP1(T, uint8_t, x >= da); break;                           \
        default: em_cpu_bad_kind("unary(int)", k->kind);                                   \
        }                                                                                  \
    }
INT_UNARY(int32_t)
INT_UNARY(int64_t)
INT_UNARY(uint8_t)

void em_cpu_unary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[2] = {em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1])};
    switch (k->in[0].dtype) {
    case EM_F32: unary_float(k, bufs); break;
    case EM_F64: unary_double(k, bufs); break;
    case EM_I32: unary_int32_t(k, bufs); break;
    case EM_I64: unary_int64_t(k, bufs); break;
    case EM_U8:
    case EM_BOOL: unary_uint8_t(k, bufs); break;
    default: em_cpu_bad_kind("unary dtype", k->in[0].dtype);
    }
}

#define FLOAT_BINARY(T, S)                                                                   \
    static void binary_##T(const em_kargs *k, void **bufs)                                   \
    {                                                                                        \
        switch (k->kind) {                                                                   \
        case EM_OP_ADD: LOOP2(T, T, a + b); break;                                           \
        case EM_OP_SUB: LOOP2(T, T, a - b); break;                                           \
        case EM_OP_MUL: LOOP2(T, T, a * b); break;                                           \
        case EM_OP_DIV: LOOP2(T, T, a / b); break;                                           \
        case EM_OP_POW: LOOP2(T, T, pow##S(a, b)); break;                                    \
        case EM_OP_MAXIMUM: LOOP2(T, T, (a != a || b != b) ? (a + b) : (a > b ? a : b)); break; \
        case EM_OP_MINIMUM: LOOP2(T, T, (a != a || b != b) ? (a + b) : (a < b ? a : b)); break; \
        case EM_OP_REMAINDER: LOOP2(T, T, em_fmod_py##S(a, b)); break;                       \
        case EM_OP_EQ: LOOP2(T, uint8_t, a == b); break;                                     \
        case EM_OP_NE: LOOP2(T, uint8_t, a != b); break;                                     \
        case EM_OP_LT: LOOP2(T, uint8_t, a < b); break;                                      \
        case EM_OP_LE: LOOP2(T, uint8_t, a <= b); break;                                     \
        case EM_OP_GT: LOOP2(T, uint8_t, a > b); break;                                      \
        case EM_OP_GE: LOOP2(T, uint8_t, a >= b); break;                                     \
        case EM_OP_LOGICAL_AND: LOOP2(T, uint8_t, (a != 0) && (b != 0)); break;              \
        case EM_OP_LOGICAL_OR: LOOP2(T, uint8_t, (a != 0) || (b != 0)); break;               \
        default: em_cpu_bad_kind("binary", k->kind);                                         \
        }                                                                                    \
    }
FLOAT_BINARY(float, f)
FLOAT_BINARY(double, )

#define INT_BINARY(T, BOOLNORM)                                                              \
    static void binary_##T(const em_kargs *k, void **bufs)                                   \
    {                                                                                        \
        switch (k->kind) {                                                                   \
        case EM_OP_ADD: LOOP2(T, T, BOOLNORM(a + b)); break;                                 \
        case EM_OP_SUB: LOOP2(T, T, a - b); break;                                           \
        case EM_OP_MUL: LOOP2(T, T, a * b); break;                                           \
        case EM_OP_MAXIMUM: LOOP2(T, T, a > b ? a : b); break;                               \
        case EM_OP_MINIMUM: LOOP2(T, T, a < b ? a : b); break;                               \
        case EM_OP_REMAINDER: LOOP2(T, T, irem_##T(a, b)); break;                            \
        case EM_OP_EQ: LOOP2(T, uint8_t, a == b); break;                                     \
        case EM_OP_NE: LOOP2(T, uint8_t, a != b); break;                                     \
        case EM_OP_LT: LOOP2(T, uint8_t, a < b); break;                                      \
        case EM_OP_LE: LOOP2(T, uint8_t, a <= b); break;                                     \
        case EM_OP_GT: LOOP2(T, uint8_t, a > b); break;                                      \
        case EM_OP_GE: LOOP2(T, uint8_t, a >= b); break;                                     \
        case EM_OP_LOGICAL_AND: LOOP2(T, uint8_t, (a != 0) && (b != 0)); break;              \
        case EM_OP_LOGICAL_OR: LOOP2(T, uint8_t, (a != 0) || (b != 0)); break;               \
        default: em_cpu_bad_kind("binary(int)", k->kind);                                    \
        }                                                                                    \
    }
#define NOP_(x) (x)
#define BOOL_(x) ((x) != 0)
INT_BINARY(int32_t, NOP_)
INT_BINARY(int64_t, NOP_)
INT_BINARY(uint8_t, NOP_)
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
    switch (k->in[0].dtype) {
    case EM_F32: binary_float(k, bufs); break;
    case EM_F64: binary_double(k, bufs); break;
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
    default: return *(const uint8_t *)p;
    }
}

static inline void store_d(int dt, char *p, double v, int64_t iv, bool use_i)
{
    switch (dt) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
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
