/* Helpers of the element-wise expressions of tasks/ops.def, written once in
 * the common subset of C, CUDA C++ and OpenCL C. Every backend compiles this
 * same text: devices/cpu/elementwise.c and devices/cuda/elementwise.cu
 * include it, cmake/embed_cl.cmake embeds it into the OpenCL program (after
 * devices/opencl/common.cl).
 *
 * Before including, a backend defines
 *   EW_FN            the qualifiers of a helper ("static inline",
 *                    "__device__ __forceinline__", "inline")
 *   em_i64, em_u64   64-bit signed / unsigned integer types
 * and has the standard math functions (exp, fmod, erf, ...) for float and
 * double. No #include here: OpenCL programs cannot include host files.
 *
 * Integer helpers take and return em_i64 (every integer dtype's values fit;
 * the kernel converts the result back to the tensor's type). Float helpers
 * are instantiated per type by EM_EW_FLOAT_HELPERS(T, S) as em_<name>_<S>;
 * each backend maps the generic name em_<name> used in ops.def to them
 * (C: _Generic, CUDA: overloads, OpenCL: #define per instantiation), from
 * the list EM_EW_FLOAT_HELPER_LIST. */
#ifndef EMBER_EW_MATH_H
#define EMBER_EW_MATH_H

/* x ** e for integers by squaring, wrapping like two's complement; e < 0 gives 0
 * except for x = 1 and -1 (never reached: the front end computes negative
 * exponents in f32). */
EW_FN em_i64 em_ipow(em_i64 x, em_i64 e)
{
    em_u64 r = 1, b = (em_u64)x;
    while (e > 0) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    return (em_i64)r;
}

/* Python's a % b (the sign of the divisor); b == 0 gives 0. */
EW_FN em_i64 em_irem(em_i64 a, em_i64 b)
{
    if (b == 0 || b == -1) return 0;
    em_i64 r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

/* C's fmod for integers (the sign of the dividend); b == 0 gives 0. */
EW_FN em_i64 em_ifmod(em_i64 a, em_i64 b)
{
    if (b == 0 || b == -1) return 0;
    return a % b;
}

/* Python's a // b (floor of the quotient); b == 0 gives 0. */
EW_FN em_i64 em_ifloordiv(em_i64 a, em_i64 b)
{
    if (b == 0) return 0;
    if (b == -1) return (em_i64)((em_u64)0 - (em_u64)a);
    em_i64 q = a / b;
    if (a % b != 0 && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

#define EM_EW_FLOAT_HELPER_LIST(X) X(pymod, 2) X(floordiv, 2) X(erfinv, 1) X(tanhsat, 1) X(xexpn, 1) X(geluc, 1)

/* em_pymod: Python's a % b, the sign of the divisor (torch.remainder).
 * em_floordiv: Python's a // b for floats (torch.floor_divide), as CPython's
 *   float floor division: the quotient of (a - fmod(a, b)) / b, moved down
 *   one when the remainder's sign differs from b's, then rounded to the
 *   nearest integer; b == 0 gives a / b (inf or nan); a zero result keeps the
 *   sign of a / b.
 * em_tanhsat: tanh(x), exactly +-1 where the correctly rounded tanh is
 *   (|x| > 9.02 in float, 19.07 in double): PoCL's float tanh stops one ulp
 *   short of 1 for every x (0.99999994 at x = 100), which expressions such as
 *   1 + tanh(u) (gelu_tanh) and 1 - tanh^2 (the backward of tanh, gelu_tanh,
 *   mish) turn into large errors, and the CPU and CUDA disagree with it.
 * em_xexpn: x * exp(x) for x <= 0 without the underflow of exp(x): below
 *   -80 (float) / -700 (double), where exp(x) alone would be subnormal or 0
 *   and lose the digits of a result that is still representable, it is
 *   (x * exp(x + 64)) * exp(-64) (x + 64 is exact there; 512 for double),
 *   rounded once into the subnormal range. -inf gives nan (-inf * 0), as
 *   PyTorch's silu. silu and mish use it for large negative x.
 * em_geluc: x / 2 * erfc(-x / sqrt 2), with the rounding error of the argument
 *   z = -x / sqrt 2 (1/sqrt 2 split into a rounded constant and its
 *   remainder, fma for the product's error dz) corrected to first order:
 *   erfc(z + dz) = erfc(z) - dz 2/sqrt(pi) exp(-z^2). erfc amplifies the
 *   relative error of its argument by about 2 z^2 (50 at x = -7: 10 ulps in
 *   float without the correction). 1 + erf(x / sqrt 2) would cancel for
 *   negative x.
 * em_erfinv: the inverse error function on [-1, 1] (+-inf at +-1, nan
 *   outside): M. Giles, "Approximating the erfinv function" (GPU Computing
 *   Gems, 2011), single-precision polynomials in w = -log((1 - x)(1 + x)),
 *   then, for double, Newton steps on erf(y) = x (two, which reach double precision from
 *   the single-precision start; in float the polynomial alone, as Giles). */
#define EM_EW_FLOAT_HELPERS(T, S)                                                                 \
    EW_FN T em_pymod_##S(T a, T b)                                                                \
    {                                                                                             \
        T r = fmod(a, b);                                                                         \
        return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;                                      \
    }                                                                                             \
    EW_FN T em_floordiv_##S(T a, T b)                                                             \
    {                                                                                             \
        if (b == 0) return a / b;                                                                 \
        T m = fmod(a, b);                                                                         \
        T d = (a - m) / b;                                                                        \
        if (m != 0 && ((b < 0) != (m < 0))) d -= (T)1;                                            \
        if (d == 0) return copysign((T)0, a / b);                                                 \
        T f = floor(d);                                                                           \
        if (d - f > (T)0.5) f += (T)1;                                                            \
        return f;                                                                                 \
    }                                                                                             \
    EW_FN T em_tanhsat_##S(T x)                                                                   \
    {                                                                                             \
        return fabs(x) > (sizeof(T) == 4 ? (T)9.02 : (T)19.07) ? copysign((T)1, x) : tanh(x);     \
    }                                                                                             \
    EW_FN T em_xexpn_##S(T x)                                                                     \
    {                                                                                             \
        if (sizeof(T) == 4 ? x < (T)-80 : x < (T)-700)                                            \
            return sizeof(T) == 4 ? x * exp(x + (T)64) * (T)1.60381089e-28                        \
                                  : x * exp(x + (T)512) * (T)4.3596236141622470e-223;             \
        return x * exp(x);                                                                        \
    }                                                                                             \
    EW_FN T em_geluc_##S(T x)                                                                      \
    {                                                                                             \
        const T ch = sizeof(T) == 4 ? (T)0.7071067690849304 : (T)0.7071067811865476;              \
        const T cl = sizeof(T) == 4 ? (T)1.2101617104478969e-8 : (T)-4.8336466567264565e-17;      \
        T z = -x * ch;                                                                            \
        T dz = fma(-x, ch, -z) - x * cl;                                                          \
        T e = erfc(z);                                                                            \
        if (dz != 0 && z == z && fabs(z) < (T)30) e -= dz * (T)1.1283791670955126 * exp(-z * z);  \
        return (T)0.5 * x * e;                                                                    \
    }                                                                                             \
    EW_FN T em_erfinv_##S(T x)                                                                    \
    {                                                                                             \
        if (x != x || x < (T)-1 || x > (T)1) return (T)NAN;                                       \
        if (x == (T)1) return (T)INFINITY;                                                        \
        if (x == (T)-1) return -(T)INFINITY;                                                      \
        T w = -log(((T)1 - x) * ((T)1 + x)), p;                                                   \
        if (w < (T)5) {                                                                           \
            w = w - (T)2.5;                                                                       \
            p = (T)2.81022636e-08;                                                                \
            p = (T)3.43273939e-07 + p * w;                                                        \
            p = (T)-3.5233877e-06 + p * w;                                                        \
            p = (T)-4.39150654e-06 + p * w;                                                       \
            p = (T)0.00021858087 + p * w;                                                         \
            p = (T)-0.00125372503 + p * w;                                                        \
            p = (T)-0.00417768164 + p * w;                                                        \
            p = (T)0.246640727 + p * w;                                                           \
            p = (T)1.50140941 + p * w;                                                            \
        } else {                                                                                  \
            w = sqrt(w) - (T)3;                                                                   \
            p = (T)-0.000200214257;                                                               \
            p = (T)0.000100950558 + p * w;                                                        \
            p = (T)0.00134934322 + p * w;                                                         \
            p = (T)-0.00367342844 + p * w;                                                        \
            p = (T)0.00573950773 + p * w;                                                         \
            p = (T)-0.0076224613 + p * w;                                                         \
            p = (T)0.00943887047 + p * w;                                                         \
            p = (T)1.00167406 + p * w;                                                            \
            p = (T)2.83297682 + p * w;                                                            \
        }                                                                                         \
        T y = p * x;                                                                              \
        /* double: 2 Newton steps; float: none (erf(y) - x has no significant digits near +-1) */ \
        for (int i = 0; i < (sizeof(T) == 8 ? 2 : 0); i++) {                                      \
            T d = (T)1.1283791670955126 * exp(-y * y); /* erf'(y) */                              \
            if (d > 0) y -= (erf(y) - x) / d;                                                     \
        }                                                                                         \
        return y;                                                                                 \
    }

#endif
