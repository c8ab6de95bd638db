/* Element-wise kernels: unary / tensor-scalar, binary, where, copy+cast.
 * Semantics are those of devices/cpu/elementwise.c, operation by operation.
 *
 * Argument layout (host: devices/opencl/elementwise.c):
 *   one group per operand, inputs first then the output:
 *     (__global uchar *base, long boff, long eoff, long8 strides)
 *   then (int nd, long8 shape, long n) = the collapsed output shape and its
 *   element count, then the op kind and the kernel's extra arguments.
 *
 * unary_<T>(x, y, nd, shape, n, op, T sa, T sb)           float / double, y of T
 * ucmp_<T> (x, y, nd, shape, n, op, T sa)                 comparisons, logical_not: y uchar
 * unary_<I>(x, y, nd, shape, n, op, long8 sv)             int / long / uchar
 * ucmp_<I> (x, y, nd, shape, n, op, long8 sv)
 *     integer scalars are prepared on the host so no double is needed:
 *     sv.s0 = (T)a, sv.s1 = (T)b, sv.s2 = ceil(a), sv.s3 = floor(a),
 *     sv.s4 = floor(b) (saturated to long), sv.s5 = flags: 1 a is NaN,
 *     2 b is NaN, 4 a is integral. For an integer x: x < a <=> x < ceil(a),
 *     x <= a <=> x <= floor(a), x == a <=> a integral and x == a.
 * binary_<T>(a, b, y, nd, shape, n, op)                   y of T
 * bcmp_<T>  (a, b, y, nd, shape, n, op)                   y uchar
 * binary_bool(a, b, y, nd, shape, n, op)                  add = or, mul = and
 * where(mask, a, b, y, nd, shape, n, int elem_size)
 * copy(x, y, nd, shape, n, int in_dtype, int out_dtype)
 * Integer arithmetic wraps (done in ulong), like the CPU on two's complement. */

/* ---- float ops, T = float (S = f32) or double (S = f64) ------------------- */

#define EM_DEF_FLOAT_EW(T, S)                                                                      \
    inline T em_pymod_##S(T a, T b)                                                                \
    {                                                                                              \
        T r = fmod(a, b);                                                                          \
        return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;                                       \
    }                                                                                              \
    inline T em_fun_##S(int op, T x, T sa, T sb)                                                   \
    {                                                                                              \
        switch (op) {                                                                              \
        case EM_OP_NEG: return -x;                                                                 \
        case EM_OP_ABS: return fabs(x);                                                            \
        case EM_OP_SIGN: return (T)((x > 0) - (x < 0));                                            \
        case EM_OP_EXP: return exp(x);                                                             \
        case EM_OP_LOG: return log(x);                                                             \
        case EM_OP_LOG1P: return log1p(x);                                                         \
        case EM_OP_SQRT: return sqrt(x);                                                           \
        case EM_OP_RSQRT: return (T)1 / sqrt(x);                                                   \
        case EM_OP_RECIPROCAL: return (T)1 / x;                                                    \
        case EM_OP_SQUARE: return x * x;                                                           \
        case EM_OP_SIN: return sin(x);                                                             \
        case EM_OP_COS: return cos(x);                                                             \
        case EM_OP_TANH: return tanh(x);                                                           \
        case EM_OP_SIGMOID: return x >= 0 ? (T)1 / ((T)1 + exp(-x)) : exp(x) / ((T)1 + exp(x));    \
        case EM_OP_RELU: return x > 0 ? x : (T)0;                                                  \
        case EM_OP_GELU: return (T)0.5 * x * ((T)1 + erf(x * (T)0.70710678118654752440));          \
        case EM_OP_GELU_TANH:                                                                      \
            return (T)0.5 * x * ((T)1 + tanh((T)0.7978845608028654 * (x + (T)0.044715 * x * x * x))); \
        case EM_OP_SILU: return x >= 0 ? x / ((T)1 + exp(-x)) : x * exp(x) / ((T)1 + exp(x));       \
        case EM_OP_SOFTPLUS: return x > (T)20 ? x : log1p(exp(x));                                 \
        case EM_OP_ERF: return erf(x);                                                             \
        case EM_OP_FLOOR: return floor(x);                                                         \
        case EM_OP_CEIL: return ceil(x);                                                           \
        case EM_OP_ROUND: return rint(x);                                                          \
        case EM_OP_CLAMP: return x < sa ? sa : (x > sb ? sb : x);                                  \
        case EM_OP_POW_SCALAR:                                                                     \
            if (sa == (T)2) return x * x;                                                          \
            if (sa == (T)0.5) return sqrt(x);                                                      \
            return pow(x, sa);                                                                     \
        case EM_OP_LEAKY_RELU: return x >= 0 ? x : sa * x;                                         \
        case EM_OP_ELU: return x > 0 ? x : sa * expm1(x);                                          \
        case EM_OP_ADD_SCALAR: return x + sa;                                                      \
        case EM_OP_SUB_SCALAR: return x - sa;                                                      \
        case EM_OP_RSUB_SCALAR: return sa - x;                                                     \
        case EM_OP_MUL_SCALAR: return x * sa;                                                      \
        case EM_OP_DIV_SCALAR: return x / sa;                                                      \
        case EM_OP_MAXIMUM_SCALAR: return (x != x) ? x : (x > sa ? x : sa);                        \
        case EM_OP_MINIMUM_SCALAR: return (x != x) ? x : (x < sa ? x : sa);                        \
        case EM_OP_REMAINDER_SCALAR: return em_pymod_##S(x, sa);                                   \
        default: return x;                                                                         \
        }                                                                                          \
    }                                                                                              \
    inline uchar em_fcmp1_##S(int op, T x, T sa)                                                   \
    {                                                                                              \
        switch (op) {                                                                              \
        case EM_OP_LOGICAL_NOT: return x == 0;                                                     \
        case EM_OP_EQ_SCALAR: return x == sa;                                                      \
        case EM_OP_NE_SCALAR: return x != sa;                                                      \
        case EM_OP_LT_SCALAR: return x < sa;                                                       \
        case EM_OP_LE_SCALAR: return x <= sa;                                                      \
        case EM_OP_GT_SCALAR: return x > sa;                                                       \
        case EM_OP_GE_SCALAR: return x >= sa;                                                      \
        default: return 0;                                                                         \
        }                                                                                          \
    }                                                                                              \
    inline T em_fbin_##S(int op, T a, T b)                                                         \
    {                                                                                              \
        switch (op) {                                                                              \
        case EM_OP_ADD: return a + b;                                                              \
        case EM_OP_SUB: return a - b;                                                              \
        case EM_OP_MUL: return a * b;                                                              \
        case EM_OP_DIV: return a / b;                                                              \
        case EM_OP_POW: return pow(a, b);                                                          \
        case EM_OP_MAXIMUM: return (a != a || b != b) ? (a + b) : (a > b ? a : b);                 \
        case EM_OP_MINIMUM: return (a != a || b != b) ? (a + b) : (a < b ? a : b);                 \
        case EM_OP_REMAINDER: return em_pymod_##S(a, b);                                           \
        default: return a;                                                                         \
        }                                                                                          \
    }                                                                                              \
    inline uchar em_fcmp2_##S(int op, T a, T b)                                                    \
    {                                                                                              \
        switch (op) {                                                                              \
        case EM_OP_EQ: return a == b;                                                              \
        case EM_OP_NE: return a != b;                                                              \
        case EM_OP_LT: return a < b;                                                               \
        case EM_OP_LE: return a <= b;                                                              \
        case EM_OP_GT: return a > b;                                                               \
        case EM_OP_GE: return a >= b;                                                              \
        case EM_OP_LOGICAL_AND: return (a != 0) && (b != 0);                                       \
        case EM_OP_LOGICAL_OR: return (a != 0) || (b != 0);                                        \
        default: return 0;                                                                         \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_unary_##S(EM_OPND(x), EM_OPND_W(y), int nd, long8 shape, long n, int op, T sa, T sb) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, xst);                                                                        \
        __global T *Y = (__global T *)(yb + yboff);                                                \
        __global const T *X = (__global const T *)(xb + xboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS2(i, nd, sh, s0, ye, o0, s1, xe, o1)                                            \
            Y[o0] = em_fun_##S(op, X[o1], sa, sb);                                                 \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_ucmp_##S(EM_OPND(x), EM_OPND_W(y), int nd, long8 shape, long n, int op, T sa) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, xst);                                                                        \
        __global uchar *Y = yb + yboff;                                                            \
        __global const T *X = (__global const T *)(xb + xboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS2(i, nd, sh, s0, ye, o0, s1, xe, o1)                                            \
            Y[o0] = em_fcmp1_##S(op, X[o1], sa);                                                   \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_binary_##S(EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int op) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, ast);                                                                        \
        EM_UNPACK(s2, bst);                                                                        \
        __global T *Y = (__global T *)(yb + yboff);                                                \
        __global const T *A = (__global const T *)(ab + aboff);                                    \
        __global const T *B = (__global const T *)(bb + bboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS3(i, nd, sh, s0, ye, o0, s1, ae, o1, s2, be, o2)                                \
            Y[o0] = em_fbin_##S(op, A[o1], B[o2]);                                                 \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_bcmp_##S(EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int op) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, ast);                                                                        \
        EM_UNPACK(s2, bst);                                                                        \
        __global uchar *Y = yb + yboff;                                                            \
        __global const T *A = (__global const T *)(ab + aboff);                                    \
        __global const T *B = (__global const T *)(bb + bboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS3(i, nd, sh, s0, ye, o0, s1, ae, o1, s2, be, o2)                                \
            Y[o0] = em_fcmp2_##S(op, A[o1], B[o2]);                                                \
        }                                                                                          \
    }

EM_DEF_FLOAT_EW(float, f32)
#ifdef EM_FP64
EM_DEF_FLOAT_EW(double, f64)
#endif

/* ---- integer ops, values carried as long, stored as T ------------------------ */

inline long em_ipow(long x, long e)
{
    ulong r = 1, b = (ulong)x;
    while (e > 0) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (long)r;
}

/* Python-style remainder; b == 0 gives 0, b == -1 gives 0 (no overflow trap). */
inline long em_irem(long a, long b)
{
    if (b == 0 || b == -1) return 0;
    long r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

inline long em_iun(int op, long x, long8 sv)
{
    switch (op) {
    case EM_OP_NEG: return (long)(0UL - (ulong)x);
    case EM_OP_ABS: return x < 0 ? (long)(0UL - (ulong)x) : x;
    case EM_OP_SIGN: return (x > 0) - (x < 0);
    case EM_OP_SQUARE: return (long)((ulong)x * (ulong)x);
    case EM_OP_RELU: return x > 0 ? x : 0;
    case EM_OP_FLOOR:
    case EM_OP_CEIL:
    case EM_OP_ROUND: return x;
    case EM_OP_CLAMP:
        if (!(sv.s5 & 1) && x < sv.s2) return sv.s0;
        if (!(sv.s5 & 2) && x > sv.s4) return sv.s1;
        return x;
    case EM_OP_POW_SCALAR: return em_ipow(x, sv.s0);
    case EM_OP_ADD_SCALAR: return (long)((ulong)x + (ulong)sv.s0);
    case EM_OP_SUB_SCALAR: return (long)((ulong)x - (ulong)sv.s0);
    case EM_OP_RSUB_SCALAR: return (long)((ulong)sv.s0 - (ulong)x);
    case EM_OP_MUL_SCALAR: return (long)((ulong)x * (ulong)sv.s0);
    case EM_OP_MAXIMUM_SCALAR: return x > sv.s0 ? x : sv.s0;
    case EM_OP_MINIMUM_SCALAR: return x < sv.s0 ? x : sv.s0;
    case EM_OP_REMAINDER_SCALAR: return em_irem(x, sv.s0);
    default: return x;
    }
}

inline uchar em_icmp1(int op, long x, long8 sv)
{
    const int nan = (sv.s5 & 1) != 0, integral = (sv.s5 & 4) != 0;
    switch (op) {
    case EM_OP_LOGICAL_NOT: return x == 0;
    case EM_OP_EQ_SCALAR: return !nan && integral && x == sv.s3;
    case EM_OP_NE_SCALAR: return !(!nan && integral && x == sv.s3);
    case EM_OP_LT_SCALAR: return !nan && x < sv.s2;
    case EM_OP_LE_SCALAR: return !nan && x <= sv.s3;
    case EM_OP_GT_SCALAR: return !nan && x > sv.s3;
    case EM_OP_GE_SCALAR: return !nan && x >= sv.s2;
    default: return 0;
    }
}

inline long em_ibin(int op, long a, long b)
{
    switch (op) {
    case EM_OP_ADD: return (long)((ulong)a + (ulong)b);
    case EM_OP_SUB: return (long)((ulong)a - (ulong)b);
    case EM_OP_MUL: return (long)((ulong)a * (ulong)b);
    case EM_OP_MAXIMUM: return a > b ? a : b;
    case EM_OP_MINIMUM: return a < b ? a : b;
    case EM_OP_REMAINDER: return em_irem(a, b);
    default: return a;
    }
}

inline uchar em_icmp2(int op, long a, long b)
{
    switch (op) {
    case EM_OP_EQ: return a == b;
    case EM_OP_NE: return a != b;
    case EM_OP_LT: return a < b;
    case EM_OP_LE: return a <= b;
    case EM_OP_GT: return a > b;
    case EM_OP_GE: return a >= b;
    case EM_OP_LOGICAL_AND: return (a != 0) && (b != 0);
    case EM_OP_LOGICAL_OR: return (a != 0) || (b != 0);
    default: return 0;
    }
}

#define EM_DEF_INT_EW(T, S)                                                                        \
    __kernel void em_unary_##S(EM_OPND(x), EM_OPND_W(y), int nd, long8 shape, long n, int op, long8 sv) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, xst);                                                                        \
        __global T *Y = (__global T *)(yb + yboff);                                                \
        __global const T *X = (__global const T *)(xb + xboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS2(i, nd, sh, s0, ye, o0, s1, xe, o1)                                            \
            Y[o0] = (T)em_iun(op, (long)X[o1], sv);                                                \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_ucmp_##S(EM_OPND(x), EM_OPND_W(y), int nd, long8 shape, long n, int op, long8 sv) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, xst);                                                                        \
        __global uchar *Y = yb + yboff;                                                            \
        __global const T *X = (__global const T *)(xb + xboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS2(i, nd, sh, s0, ye, o0, s1, xe, o1)                                            \
            Y[o0] = em_icmp1(op, (long)X[o1], sv);                                                 \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_binary_##S(EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int op) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, ast);                                                                        \
        EM_UNPACK(s2, bst);                                                                        \
        __global T *Y = (__global T *)(yb + yboff);                                                \
        __global const T *A = (__global const T *)(ab + aboff);                                    \
        __global const T *B = (__global const T *)(bb + bboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS3(i, nd, sh, s0, ye, o0, s1, ae, o1, s2, be, o2)                                \
            Y[o0] = (T)em_ibin(op, (long)A[o1], (long)B[o2]);                                      \
        }                                                                                          \
    }                                                                                              \
    __kernel void em_bcmp_##S(EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int op) \
    {                                                                                              \
        EM_UNPACK(sh, shape);                                                                      \
        EM_UNPACK(s0, yst);                                                                        \
        EM_UNPACK(s1, ast);                                                                        \
        EM_UNPACK(s2, bst);                                                                        \
        __global uchar *Y = yb + yboff;                                                            \
        __global const T *A = (__global const T *)(ab + aboff);                                    \
        __global const T *B = (__global const T *)(bb + bboff);                                    \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            EM_OFFS3(i, nd, sh, s0, ye, o0, s1, ae, o1, s2, be, o2)                                \
            Y[o0] = em_icmp2(op, (long)A[o1], (long)B[o2]);                                        \
        }                                                                                          \
    }

EM_DEF_INT_EW(int, i32)
EM_DEF_INT_EW(long, i64)
EM_DEF_INT_EW(uchar, u8)

/* bool: add is logical or, mul logical and, the rest as uint8. */
__kernel void em_binary_bool(EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int op)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, yst);
    EM_UNPACK(s1, ast);
    EM_UNPACK(s2, bst);
    __global uchar *Y = yb + yboff;
    __global const uchar *A = ab + aboff;
    __global const uchar *B = bb + bboff;
    EM_GRID_LOOP(i, n)
    {
        EM_OFFS3(i, nd, sh, s0, ye, o0, s1, ae, o1, s2, be, o2)
        const long a = A[o1], b = B[o2];
        Y[o0] = op == EM_OP_ADD ? (uchar)((a != 0) || (b != 0))
              : op == EM_OP_MUL ? (uchar)((a != 0) && (b != 0)) : (uchar)em_ibin(op, a, b);
    }
}

/* where(mask, a, b): element-size generic (1, 4 or 8 bytes). */
__kernel void em_where(EM_OPND(m), EM_OPND(a), EM_OPND(b), EM_OPND_W(y), int nd, long8 shape, long n, int es)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, yst);
    EM_UNPACK(s1, mst);
    EM_UNPACK(s2, ast);
    EM_UNPACK(s3, bst);
    __global const uchar *M = mb + mboff;
    __global const uchar *A = ab + aboff;
    __global const uchar *B = bb + bboff;
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(i, n)
    {
        EM_OFFS4(i, nd, sh, s0, ye, o0, s1, me, o1, s2, ae, o2, s3, be, o3)
        const int take_a = M[o1] != 0;
        if (es == 4)
            ((__global uint *)Y)[o0] = take_a ? ((__global const uint *)A)[o2] : ((__global const uint *)B)[o3];
        else if (es == 8)
            ((__global ulong *)Y)[o0] = take_a ? ((__global const ulong *)A)[o2] : ((__global const ulong *)B)[o3];
        else
            Y[o0] = take_a ? A[o2] : B[o3];
    }
}

/* Strided copy with dtype conversion, as em_cpu_copy: integer sources convert
 * through int64 (to float through double when doubles exist), float sources
 * through double (float without fp64; the host never sends f64 then). */
__kernel void em_copy(EM_OPND(x), EM_OPND_W(y), int nd, long8 shape, long n, int idt, int odt)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, yst);
    EM_UNPACK(s1, xst);
    __global const uchar *X = xb + xboff;
    __global uchar *Y = yb + yboff;
    const int int_src = em_dt_is_int(idt);
    const int es = (idt == EM_DT_F64 || idt == EM_DT_I64) ? 8 : (idt == EM_DT_U8 || idt == EM_DT_BOOL) ? 1 : 4;
    EM_GRID_LOOP(i, n)
    {
        EM_OFFS2(i, nd, sh, s0, ye, o0, s1, xe, o1)
        if (idt == odt) {
            if (es == 4) ((__global uint *)Y)[o0] = ((__global const uint *)X)[o1];
            else if (es == 8) ((__global ulong *)Y)[o0] = ((__global const ulong *)X)[o1];
            else Y[o0] = X[o1];
        } else if (int_src) {
            const long iv = em_ld_long(idt, X, o1);
            em_st_val(odt, Y, o0, (acc_t)iv, iv, 1);
        } else {
            em_st_val(odt, Y, o0, em_ld_acc(idt, X, o1), 0, 0);
        }
    }
}
