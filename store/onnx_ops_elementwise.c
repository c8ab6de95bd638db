/* ONNX operators, elementwise group (see store/onnx_internal.h): the
 * arithmetic, comparison, logical, bit-shift, bitwise, Cast / CastLike /
 * BitCast operators, the unary math functions and activations, Clip,
 * Dropout in inference, SwiGLU and the integer (De)QuantizeLinear /
 * DynamicQuantizeLinear. Semantics from onnx/docs/Operators.md (onnx
 * 1.23); each function names the opsets whose differences it handles.
 *
 * Integer types Ember holds widened (INT8 / INT16 / UINT16 in EM_I32,
 * UINT32 in EM_I64) are wrapped back into their range after arithmetic that
 * can leave it; UINT8 arithmetic is done in EM_I32 and wrapped, so that
 * Ember's u8 overflow rules do not matter. Composite float functions of
 * f32 / f16 / bf16 inputs (tan, the inverse and hyperbolic functions) are
 * evaluated in f64 and rounded once. */
#include "store/onnx_internal.h"

#include <math.h>
#include <string.h>

#define LN2 0.69314718055994530942

/* ---- type helpers ---- */

static bool is_float_type(int t) { return t == ONNX_FLOAT || t == ONNX_DOUBLE || t == ONNX_FLOAT16 || t == ONNX_BFLOAT16; }
static bool is_unsigned_type(int t)
{
    return t == ONNX_UINT8 || t == ONNX_UINT16 || t == ONNX_UINT32 || t == ONNX_UINT64 || t == ONNX_UINT4 || t == ONNX_UINT2;
}
static bool is_signed_int_type(int t)
{
    return t == ONNX_INT8 || t == ONNX_INT16 || t == ONNX_INT32 || t == ONNX_INT64 || t == ONNX_INT4 || t == ONNX_INT2;
}
static bool is_int_type(int t) { return is_unsigned_type(t) || is_signed_int_type(t); }

static int int_bits(int t)
{
    switch (t) {
    case ONNX_INT2: case ONNX_UINT2: return 2;
    case ONNX_INT4: case ONNX_UINT4: return 4;
    case ONNX_INT8: case ONNX_UINT8: return 8;
    case ONNX_INT16: case ONNX_UINT16: return 16;
    case ONNX_INT32: case ONNX_UINT32: return 32;
    default: return 64;
    }
}

static em_dtype holder(int t)
{
    em_dtype d = EM_F32;
    onnx_type_to_dtype(t, &d);
    return d;
}

static const char *tname(int t) { return em_onnx_type_name(t); }

/* Input i, required, of a float type. */
static em_tensor *in_float(onnx_ctx *c, int i)
{
    em_tensor *x = onnx_in_req(c, i);
    if (!x) return NULL;
    if (!is_float_type(onnx_in_type(c, i))) {
        em_set_error(EM_ERR_DTYPE, "input %d has type %s, the operator takes float types only", i, tname(onnx_in_type(c, i)));
        return NULL;
    }
    return x;
}

/* EM_ERR_SHAPE naming both shapes unless a and b broadcast together (checked
 * before a chain of ops, whose later steps would report only a NULL input). */
static em_status check_bcast(const em_tensor *a, const em_tensor *b)
{
    int na = em_tensor_ndim(a), nb = em_tensor_ndim(b), n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t da = i < n - na ? 1 : em_tensor_dim(a, i - (n - na)), db = i < n - nb ? 1 : em_tensor_dim(b, i - (n - nb));
        if (da != db && da != 1 && db != 1) {
            char sa[96], sb[96];
            return em_set_error(EM_ERR_SHAPE, "shapes %s and %s do not broadcast", em_shape_str(em_tensor_shape(a), na, sa, sizeof sa),
                                em_shape_str(em_tensor_shape(b), nb, sb, sizeof sb));
        }
    }
    return EM_OK;
}

/* Inputs 0 and 1, required, of one ONNX type and broadcastable shapes;
 * returns the type (0 + error otherwise). */
static int same_type2(onnx_ctx *c, em_tensor **a, em_tensor **b)
{
    *a = onnx_in_req(c, 0);
    *b = onnx_in_req(c, 1);
    if (!*a || !*b) return 0;
    int ta = onnx_in_type(c, 0), tb = onnx_in_type(c, 1);
    if (ta != tb) {
        em_set_error(EM_ERR_DTYPE, "inputs have types %s and %s, the operator takes one type", tname(ta), tname(tb));
        return 0;
    }
    return check_bcast(*a, *b) == EM_OK ? ta : 0;
}

/* The tensor integer arithmetic of type t is done in: UINT8 in EM_I32. */
static em_tensor *arith_in(em_tensor *x, int t) { return t == ONNX_UINT8 ? em_cast(x, EM_I32) : x; }

/* Result of integer arithmetic back in type t's range and holder dtype. */
static em_tensor *arith_out(em_tensor *r, int t)
{
    if (!r) return NULL;
    if (t == ONNX_UINT8) return em_cast(em_remainder_scalar(r, 256), EM_U8);
    if (t == ONNX_INT32 && em_tensor_dtype(r) == EM_I64) {
        em_tensor *w = em_add_scalar(em_remainder_scalar(em_add_scalar(r, 2147483648.0), 4294967296.0), -2147483648.0);
        return em_cast(w, EM_I32);
    }
    r = onnx_wrap_int(r, t);
    em_dtype h = holder(t);
    return r && em_tensor_dtype(r) != h ? em_cast(r, h) : r;
}

/* Float function of type t evaluated in f64 when t is narrower. */
static em_tensor *to_f64(em_tensor *x) { return em_tensor_dtype(x) == EM_F64 ? x : em_cast(x, EM_F64); }
static em_tensor *from_f64(em_tensor *r, int t)
{
    em_dtype h = holder(t);
    return r && em_tensor_dtype(r) != h ? em_cast(r, h) : r;
}

/* ---- binary arithmetic ---- */

typedef em_tensor *(*binfn)(const em_tensor *, const em_tensor *);

static em_status arith(onnx_ctx *c, binfn f)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "the operator does not take bool inputs");
    if (is_float_type(t)) return onnx_out(c, 0, f(a, b), t);
    return onnx_out(c, 0, arith_out(f(arith_in(a, t), arith_in(b, t)), t), t);
}

/* Add, Sub, Mul (7, 13, 14): numpy broadcasting (the broadcast / axis
 * attributes of opsets before 7 are outside Ember's range). */
static em_status op_add(onnx_ctx *c) { return arith(c, em_add); }
static em_status op_sub(onnx_ctx *c) { return arith(c, em_sub); }
static em_status op_mul(onnx_ctx *c) { return arith(c, em_mul); }

/* Integer division truncated toward zero (C, and numpy's division cast
 * back to the integer type, as the reference does). */
static em_tensor *trunc_div(em_tensor *a, em_tensor *b)
{
    em_tensor *q = em_floor_divide(a, b);
    em_tensor *r = em_remainder(a, b);
    /* floor and trunc differ where the remainder is non-zero and the signs differ */
    em_tensor *fix = em_logical_and(em_ne_scalar(r, 0), em_ne(em_lt_scalar(a, 0), em_lt_scalar(b, 0)));
    return em_add(q, em_cast(fix, em_tensor_dtype(q)));
}

/* Div (7, 13, 14): integer division truncates toward zero. */
static em_status op_div(onnx_ctx *c)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Div does not take bool inputs");
    if (is_float_type(t)) return onnx_out(c, 0, em_div(a, b), t);
    return onnx_out(c, 0, arith_out(trunc_div(arith_in(a, t), arith_in(b, t)), t), t);
}

/* Mod (10, 13, 28): fmod = 0 takes the sign of the divisor (Python's %),
 * fmod = 1 that of the dividend (C's fmod). Before opset 28 float inputs
 * require fmod = 1. */
static em_status op_mod(onnx_ctx *c)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Mod does not take bool inputs");
    int64_t fm = onnx_attr_int(c, "fmod", 0);
    if (fm != 0 && fm != 1) return em_set_error(EM_ERR_INVALID, "fmod must be 0 or 1, not %lld", (long long)fm);
    if (is_float_type(t) && fm == 0 && c->opset < 28)
        return em_set_error(EM_ERR_INVALID, "Mod of float inputs requires fmod = 1 before opset 28");
    binfn f = fm ? em_fmod : em_remainder;
    if (is_float_type(t)) return onnx_out(c, 0, f(a, b), t);
    return onnx_out(c, 0, arith_out(f(arith_in(a, t), arith_in(b, t)), t), t);
}

/* Pow (7, 12, 13, 15): the result has the base's type; from opset 12 the
 * exponent's type may differ. Computed in f64 (an integer result is then
 * truncated, as numpy's power cast back to the base's type). */
static em_status op_pow(onnx_ctx *c)
{
    em_tensor *a = onnx_in_req(c, 0), *b = onnx_in_req(c, 1);
    if (!a || !b) return em_last_status();
    int ta = onnx_in_type(c, 0), tb = onnx_in_type(c, 1);
    if (ta == ONNX_BOOL || tb == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Pow does not take bool inputs");
    if (c->opset < 12 && ta != tb) return em_set_error(EM_ERR_DTYPE, "Pow before opset 12 takes one type (%s and %s)", tname(ta), tname(tb));
    if (check_bcast(a, b) != EM_OK) return em_last_status();
    if (ta == tb && is_float_type(ta)) return onnx_out(c, 0, em_pow(a, b), ta);
    if (!is_float_type(ta) && !is_float_type(tb)) {
        /* integer ** integer: exact, by squaring (in i64, wrapping as C); a
         * negative exponent gives the truncated 1 / a^-e: 1 for a = 1, +-1
         * for a = -1, else 0 */
        em_tensor *base = em_cast(a, EM_I64), *e = em_cast(b, EM_I64);
        em_tensor *ek = em_abs(e), *r = em_ones_like(base), *two = em_scalar(2, EM_I64);
        if (!r) return em_last_status();
        for (int k = 0; k < 63; k++) {
            r = em_where(em_eq_scalar(em_remainder_scalar(ek, 2), 1), em_mul(r, base), r);
            if (k < 62) {
                base = em_mul(base, base);
                ek = em_floor_divide(ek, two);
            }
            if (!r) return em_last_status();
        }
        em_tensor *a64 = em_cast(a, EM_I64);
        em_tensor *inv = em_where(em_eq_scalar(em_abs(a64), 1), r, em_zeros_like(r));
        r = em_where(em_lt_scalar(e, 0), inv, r);
        return onnx_out(c, 0, arith_out(r, ta), ta);
    }
    em_tensor *r = em_pow(em_cast(a, EM_F64), em_cast(b, EM_F64));
    if (is_float_type(ta)) return onnx_out(c, 0, from_f64(r, ta), ta);
    /* float -> int: truncation toward zero, then the wrap into the type */
    return onnx_out(c, 0, arith_out(em_cast(r, EM_I64), ta), ta);
}

/* ---- variadic ---- */

/* Max, Min (8, 12, 13), Sum, Mean (8, 13): numpy broadcasting over all
 * inputs; NaN propagates through Max / Min. */
static em_status variadic(onnx_ctx *c, binfn f, bool wrap, bool mean)
{
    if (c->nin < 1) return em_set_error(EM_ERR_FORMAT, "the operator needs at least one input");
    em_tensor *acc = onnx_in_req(c, 0);
    if (!acc) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "the operator does not take bool inputs");
    if (mean && !is_float_type(t)) return em_set_error(EM_ERR_DTYPE, "Mean takes float types only, not %s", tname(t));
    bool ints = wrap && !is_float_type(t);
    if (ints) acc = arith_in(acc, t);
    for (int i = 1; i < c->nin; i++) {
        em_tensor *x = onnx_in_req(c, i);
        if (!x) return em_last_status();
        if (onnx_in_type(c, i) != t)
            return em_set_error(EM_ERR_DTYPE, "input %d has type %s, input 0 %s", i, tname(onnx_in_type(c, i)), tname(t));
        if (check_bcast(acc, x) != EM_OK) return em_last_status();
        acc = f(acc, ints ? arith_in(x, t) : x);
        if (!acc) return em_last_status();
    }
    if (ints) acc = arith_out(acc, t);
    else if (c->nin == 1) acc = em_reshape(acc, em_tensor_shape(acc), em_tensor_ndim(acc));
    if (mean && c->nin > 1) acc = em_div_scalar(acc, (double)c->nin);
    return onnx_out(c, 0, acc, t);
}

static em_status op_max(onnx_ctx *c) { return variadic(c, em_maximum, false, false); }
static em_status op_min(onnx_ctx *c) { return variadic(c, em_minimum, false, false); }
static em_status op_sum(onnx_ctx *c) { return variadic(c, em_add, true, false); }
static em_status op_mean(onnx_ctx *c) { return variadic(c, em_add, false, true); }

/* ---- comparisons and logic ---- */

static em_status compare(onnx_ctx *c, binfn f)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    return onnx_out(c, 0, f(a, b), ONNX_BOOL);
}

/* Equal (7, 11, 13, 19), Less / Greater (7, 9, 13), LessOrEqual /
 * GreaterOrEqual (12, 16); string inputs are refused at load. */
static em_status op_equal(onnx_ctx *c) { return compare(c, em_eq); }
static em_status op_less(onnx_ctx *c) { return compare(c, em_lt); }
static em_status op_greater(onnx_ctx *c) { return compare(c, em_gt); }
static em_status op_less_equal(onnx_ctx *c) { return compare(c, em_le); }
static em_status op_greater_equal(onnx_ctx *c) { return compare(c, em_ge); }

static em_status logic(onnx_ctx *c, binfn f)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    if (t != ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "the operator takes bool inputs, not %s", tname(t));
    return onnx_out(c, 0, f(a, b), ONNX_BOOL);
}

/* And, Or, Xor (7), Not (1). */
static em_status op_and(onnx_ctx *c) { return logic(c, em_logical_and); }
static em_status op_or(onnx_ctx *c) { return logic(c, em_logical_or); }
static em_status op_xor(onnx_ctx *c) { return logic(c, em_ne); }
static em_status op_not(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (onnx_in_type(c, 0) != ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Not takes bool input, not %s", tname(onnx_in_type(c, 0)));
    return onnx_out(c, 0, em_logical_not(x), ONNX_BOOL);
}

/* Where (9, 16): condition ? X : Y, all three broadcast. */
static em_status op_where(onnx_ctx *c)
{
    em_tensor *m = onnx_in_req(c, 0), *x = onnx_in_req(c, 1), *y = onnx_in_req(c, 2);
    if (!m || !x || !y) return em_last_status();
    if (onnx_in_type(c, 0) != ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "condition must be bool, not %s", tname(onnx_in_type(c, 0)));
    int t = onnx_in_type(c, 1);
    if (onnx_in_type(c, 2) != t) return em_set_error(EM_ERR_DTYPE, "X and Y have types %s and %s", tname(t), tname(onnx_in_type(c, 2)));
    if (check_bcast(m, x) != EM_OK || check_bcast(m, y) != EM_OK || check_bcast(x, y) != EM_OK) return em_last_status();
    return onnx_out(c, 0, em_where(m, x, y), t);
}

/* ---- bits ---- */

/* 2^s for an i64 tensor s in [0, 62]. */
static em_tensor *pow2(em_tensor *s) { return em_cast(em_exp2(em_cast(s, EM_F64)), EM_I64); }

/* BitShift (11: unsigned types; 28: signed types too, an arithmetic right
 * shift). A shift < 0 or >= the type's width gives what the sign extension
 * alone gives: -1 for a right shift of a negative value, else 0. Done in
 * i64 as a multiplication / floor division by powers of two (a shift by s
 * of a 64-bit type as two factors of at most 2^32). */
static em_status op_bitshift(onnx_ctx *c)
{
    em_tensor *x, *y;
    int t = same_type2(c, &x, &y);
    if (!t) return em_last_status();
    if (!is_int_type(t)) return em_set_error(EM_ERR_DTYPE, "BitShift takes integer inputs, not %s", tname(t));
    if (c->opset < 28 && !is_unsigned_type(t)) return em_set_error(EM_ERR_DTYPE, "BitShift before opset 28 takes unsigned types, not %s", tname(t));
    const char *dir = onnx_attr_string(c, "direction", NULL);
    if (!dir) return em_set_error(EM_ERR_FORMAT, "BitShift without the direction attribute");
    bool left = !strcmp(dir, "LEFT");
    if (!left && strcmp(dir, "RIGHT")) return em_set_error(EM_ERR_INVALID, "direction must be LEFT or RIGHT, not '%s'", dir);
    int w = int_bits(t);
    em_tensor *xi = em_cast(x, EM_I64), *s = em_cast(y, EM_I64);
    em_tensor *valid = em_logical_and(em_ge_scalar(s, 0), em_lt_scalar(s, w));
    em_tensor *sc = em_clamp(s, 0, w - 1);
    em_tensor *s1 = em_floor_divide(sc, em_scalar(2, EM_I64)), *s2 = em_sub(sc, s1);
    em_tensor *r;
    if (left) r = em_mul(em_mul(xi, pow2(s1)), pow2(s2));
    else r = em_floor_divide(em_floor_divide(xi, pow2(s1)), pow2(s2));
    em_tensor *fill = left ? em_zeros_like(xi) : em_neg(em_cast(em_lt_scalar(xi, 0), EM_I64));
    r = em_where(valid, r, fill);
    if (left) r = arith_out(r, t);
    else r = em_tensor_dtype(r) != holder(t) ? em_cast(r, holder(t)) : r;
    return onnx_out(c, 0, r, t);
}

/* BitwiseNot (18): ~x = -1 - x for signed types, (2^w - 1) - x for unsigned. */
static em_status op_bitwise_not(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (!is_int_type(t)) return em_set_error(EM_ERR_DTYPE, "BitwiseNot takes integer input, not %s", tname(t));
    if (t == ONNX_UINT64) return onnx_unsupported(c, "BitwiseNot of UINT64");
    double top = is_unsigned_type(t) ? ldexp(1.0, int_bits(t)) - 1 : -1;
    em_tensor *xi = arith_in(x, t);
    return onnx_out(c, 0, arith_out(em_rsub_scalar(xi, top), t), t);
}

/* BitwiseAnd / Or / Xor (18): bit by bit in i64, bit k of x being
 * floor(x / 2^k) mod 2 (two's complement for the signed types: the sign
 * bit weighs -2^(w-1)). */
enum { BW_AND, BW_OR, BW_XOR };
static em_status bitwise(onnx_ctx *c, int kind)
{
    em_tensor *a, *b;
    int t = same_type2(c, &a, &b);
    if (!t) return em_last_status();
    if (!is_int_type(t)) return em_set_error(EM_ERR_DTYPE, "the operator takes integer inputs, not %s", tname(t));
    int w = int_bits(t);
    if (t == ONNX_UINT64) return onnx_unsupported(c, "bitwise operators on UINT64");
    em_tensor *ai = em_cast(a, EM_I64), *bi = em_cast(b, EM_I64), *two = em_scalar(2, EM_I64);
    em_tensor *acc = NULL;
    for (int k = 0; k < w; k++) {
        /* bit k: the low bit of x shifted right k times (floor division by 2) */
        em_tensor *ba = em_remainder_scalar(ai, 2), *bb = em_remainder_scalar(bi, 2);
        em_tensor *bit;
        if (kind == BW_AND) bit = em_mul(ba, bb);
        else if (kind == BW_OR) bit = em_maximum(ba, bb);
        else bit = em_remainder_scalar(em_add(ba, bb), 2);
        double weight = ldexp(1.0, k);
        if (k == w - 1 && !is_unsigned_type(t)) weight = -weight;
        em_tensor *term = em_mul_scalar(bit, weight);
        acc = acc ? em_add(acc, term) : term;
        if (!acc) return em_last_status();
        if (k + 1 < w) {
            ai = em_floor_divide(ai, two);
            bi = em_floor_divide(bi, two);
        }
    }
    em_tensor *r = acc;
    em_dtype h = holder(t);
    if (r && em_tensor_dtype(r) != h) r = em_cast(r, h);
    return onnx_out(c, 0, r, t);
}
static em_status op_bitwise_and(onnx_ctx *c) { return bitwise(c, BW_AND); }
static em_status op_bitwise_or(onnx_ctx *c) { return bitwise(c, BW_OR); }
static em_status op_bitwise_xor(onnx_ctx *c) { return bitwise(c, BW_XOR); }

/* ---- Cast ---- */

/* Range of the 4 / 2-bit integer types. */
static bool sub_byte_range(int t, double *lo, double *hi)
{
    switch (t) {
    case ONNX_INT4: *lo = -8, *hi = 7; return true;
    case ONNX_UINT4: *lo = 0, *hi = 15; return true;
    case ONNX_INT2: *lo = -2, *hi = 1; return true;
    case ONNX_UINT2: *lo = 0, *hi = 3; return true;
    default: return false;
    }
}

/* The float8 types and FLOAT4E2M1, held as EM_F32 (every value exact). */
static bool is_f8_type(int t)
{
    return t == ONNX_FLOAT8E4M3FN || t == ONNX_FLOAT8E4M3FNUZ || t == ONNX_FLOAT8E5M2 || t == ONNX_FLOAT8E5M2FNUZ ||
           t == ONNX_FLOAT4E2M1;
}

/* x (float, held in its dtype) rounded to the grid of float8 / float4 type
 * t (held as EM_F32, every value exact): in f64, where x is exact, |x| =
 * k * 2^(e - m) with e = max(floor(log2 |x|), 1 - bias) and k rounded half
 * to even. Beyond the largest finite value M (after the rounding) and
 * +-inf: +-M when saturating (always for E2M1, which has no inf or NaN),
 * else +-inf for E5M2 and NaN for the types without inf. NaN stays NaN
 * (E2M1: -0, the reference's); the FNUZ types have no -0. */
static em_tensor *f8_round(em_tensor *x, int t, bool saturate)
{
    bool e5 = t == ONNX_FLOAT8E5M2 || t == ONNX_FLOAT8E5M2FNUZ;
    bool uz = t == ONNX_FLOAT8E4M3FNUZ || t == ONNX_FLOAT8E5M2FNUZ;
    bool f4 = t == ONNX_FLOAT4E2M1;
    int m = f4 ? 1 : e5 ? 2 : 3, bias = f4 ? 1 : (e5 ? 15 : 7) + uz;
    double M = f4 ? 6 : e5 ? 57344 : uz ? 240 : 448;
    if (f4) saturate = true;
    em_tensor *x64 = to_f64(x);
    em_tensor *a = em_abs(x64);
    em_tensor *s = em_logical_or(em_lt_scalar(x64, 0), em_logical_and(em_eq_scalar(x64, 0), em_lt_scalar(em_reciprocal(x64), 0)));
    em_tensor *fin = em_logical_and(em_lt_scalar(a, INFINITY), em_eq(a, a));
    em_tensor *af = em_where(fin, a, em_zeros_like(a)); /* finite stand-in */
    em_tensor *e = em_floor(em_log2(af));
    e = em_where(em_gt(em_exp2(e), af), em_sub_scalar(e, 1), e);
    e = em_where(em_le(em_exp2(em_add_scalar(e, 1)), af), em_add_scalar(e, 1), e);
    e = em_maximum_scalar(e, 1 - bias); /* also log2(0) = -inf */
    em_tensor *q = em_exp2(em_sub_scalar(e, m));
    em_tensor *r = em_mul(em_round(em_div(af, q)), q);
    em_tensor *over = em_logical_or(em_gt_scalar(r, M), em_eq_scalar(a, INFINITY));
    double ov = saturate ? M : e5 && !uz ? INFINITY : NAN;
    r = em_where(over, em_scalar(ov, EM_F64), r);
    if (uz) s = em_logical_and(s, em_gt_scalar(r, 0));
    r = em_where(s, em_neg(r), r);
    r = em_where(em_ne(x64, x64), f4 ? em_scalar(-0.0, EM_F64) : x64, r);
    return em_cast(r, EM_F32);
}

/* x (float) as FLOAT8E8M0 (2^k, k in [-127, 127], held as EM_F32), the
 * f32 exponent field E of |x| (x first rounded to f32, as the reference; 0
 * for f32 subnormals, whose value is then 2^-127) raised by one when round_mode
 * is up and x is not 2^(E - 127), or nearest and the f32 fraction is above
 * 1/2 (or exactly 1/2 with E > 0), the reference's rule; E = 255 is NaN.
 * Saturating: no raise past 2^127, +-inf gives 2^127 (the spec's table).
 * The sign is ignored (negative x is undefined in the spec). */
static em_tensor *e8m0_round(em_tensor *x, bool saturate, const char *rm)
{
    em_tensor *a = em_abs(em_cast(em_cast(x, EM_F32), EM_F64));
    em_tensor *fin = em_lt_scalar(a, INFINITY); /* false for NaN too */
    em_tensor *af = em_where(fin, a, em_zeros_like(a));
    em_tensor *normal = em_ge_scalar(af, ldexp(1.0, -126));
    em_tensor *e = em_floor(em_log2(em_where(normal, af, em_ones_like(af))));
    e = em_where(em_gt(em_exp2(e), af), em_sub_scalar(e, 1), e);
    e = em_where(em_le(em_exp2(em_add_scalar(e, 1)), af), em_add_scalar(e, 1), e);
    em_tensor *field = em_where(normal, em_add_scalar(e, 127), em_zeros_like(e));
    /* the f32 fraction: |x| / 2^e - 1 for normals, |x| / 2^-126 for the others */
    em_tensor *frac = em_where(normal, em_sub_scalar(em_div(af, em_exp2(e)), 1), em_mul_scalar(af, ldexp(1.0, 126)));
    em_tensor *up;
    if (!strcmp(rm, "up")) up = em_gt_scalar(frac, 0);
    else if (!strcmp(rm, "nearest"))
        up = em_logical_or(em_gt_scalar(frac, 0.5), em_logical_and(em_eq_scalar(frac, 0.5), em_gt_scalar(field, 0)));
    else up = em_lt_scalar(frac, -1); /* down: never */
    if (saturate) up = em_logical_and(up, em_lt_scalar(field, 254));
    field = em_where(up, em_add_scalar(field, 1), field);
    em_tensor *r = em_where(em_ge_scalar(field, 255), em_scalar(NAN, EM_F64), em_exp2(em_sub_scalar(field, 127)));
    r = em_where(em_eq_scalar(a, INFINITY), em_scalar(saturate ? ldexp(1.0, 127) : NAN, EM_F64), r);
    r = em_where(em_ne(a, a), a, r);
    return em_cast(r, EM_F32);
}

/* x (ONNX type from) converted to ONNX type to: float -> int truncates
 * toward zero, then wraps into the type as a C cast of an in-range value;
 * anything -> bool is x != 0. */
static em_tensor *cast_to(em_tensor *x, int from, int to, bool saturate)
{
    em_dtype dt;
    if (!onnx_type_to_dtype(to, &dt)) return NULL;
    if (to == ONNX_BOOL) return em_tensor_dtype(x) == EM_BOOL ? em_cast(x, EM_BOOL) : em_ne_scalar(x, 0);
    if (is_f8_type(to) && from != to) {
        if (!is_float_type(from) && !is_f8_type(from) && from != ONNX_FLOAT8E8M0) x = em_cast(x, EM_F64); /* integers: exact in f64 */
        return f8_round(x, to, saturate);
    }
    if (is_float_type(to) || to == ONNX_INT64) return em_cast(x, dt);
    if (from == to) return em_cast(x, dt);
    double lo, hi;
    if ((is_float_type(from) || is_f8_type(from) || from == ONNX_FLOAT8E8M0) && sub_byte_range(to, &lo, &hi)) {
        /* float -> 4 / 2-bit: truncated toward zero; out of range (NaN,
         * inf included) is undefined in the spec, 0 as the reference */
        em_tensor *tr = em_trunc(x);
        em_tensor *ok = em_logical_and(em_ge_scalar(tr, lo), em_le_scalar(tr, hi));
        return em_cast(em_where(ok, tr, em_zeros_like(tr)), dt);
    }
    /* a narrower integer type: through i64, then the wrap */
    em_tensor *i = em_cast(x, EM_I64);
    return arith_out(i, to);
}

static em_status cast_common(onnx_ctx *c, em_tensor *x, int from, int to)
{
    em_dtype dt;
    if (!onnx_type_to_dtype(to, &dt)) return onnx_unsupported(c, "cast to %s (type %d) is not supported", tname(to), to);
    const char *rm = onnx_attr_string(c, "round_mode", "up");
    if (strcmp(rm, "up") && strcmp(rm, "down") && strcmp(rm, "nearest"))
        return em_set_error(EM_ERR_INVALID, "round_mode must be up, down or nearest, not '%s'", rm);
    /* saturate (default 1) and round_mode concern the float8 / e8m0 targets only */
    bool sat = c->opset < 19 || onnx_attr_int(c, "saturate", 1) != 0;
    if (to == ONNX_FLOAT8E8M0 && from != to) {
        if (!sat)
            return onnx_unsupported(c, "cast to FLOAT8E8M0 with saturate 0 (the spec's NaN for x below 2^-127 and the reference's rounding disagree)");
        if (!is_float_type(from) && !is_f8_type(from)) x = em_cast(x, EM_F64);
        return onnx_out(c, 0, e8m0_round(x, sat, rm), to);
    }
    return onnx_out(c, 0, cast_to(x, from, to, sat), to);
}

/* Cast (6, 9, 13, 19, 21, 23, 24, 25, 28): to is an int from opset 6;
 * saturate (19) applies to the float8 targets (held as EM_F32, rounded by
 * f8_round) and FLOAT8E8M0, round_mode (28) to FLOAT8E8M0 (e8m0_round). */
static em_status op_cast(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    const Onnx__AttributeProto *a = onnx_attr(c, "to");
    if (!a || !a->has_i) return em_set_error(EM_ERR_FORMAT, "Cast without an int 'to' attribute");
    return cast_common(c, x, onnx_in_type(c, 0), (int)a->i);
}

/* CastLike (15, 19, 21, 23, 24, 25): to the type of input 1. */
static em_status op_castlike(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *like = onnx_in_req(c, 1);
    if (!x || !like) return em_last_status();
    return cast_common(c, x, onnx_in_type(c, 0), onnx_in_type(c, 1));
}

/* BitCast (26): the bit pattern reinterpreted as a type of the same width.
 * Composed from arithmetic, no host access to the data: a float's sign,
 * exponent field and mantissa are found in f64 (exact for every width:
 * log2 corrected against exact powers of two, the mantissa scaled to an
 * integer), giving the pattern as the signed integer of that width in i64;
 * the reverse builds the value from the fields. Integer <-> integer of one
 * width is the two's-complement wrap. A NaN input cannot be taken apart
 * this way (its sign and payload are not reachable by arithmetic): it is
 * refused at run time (one flag read to the host). A pattern that encodes a
 * NaN gives a quiet NaN (its payload is not kept). */
typedef struct fparams {
    int m, ebits;
} fparams;

static bool float_params(int t, fparams *p)
{
    switch (t) {
    case ONNX_FLOAT: *p = (fparams){23, 8}; return true;
    case ONNX_DOUBLE: *p = (fparams){52, 11}; return true;
    case ONNX_FLOAT16: *p = (fparams){10, 5}; return true;
    case ONNX_BFLOAT16: *p = (fparams){7, 8}; return true;
    default: return false;
    }
}

static int type_bits(int t)
{
    switch (t) {
    case ONNX_BOOL: case ONNX_INT8: case ONNX_UINT8: return 8;
    case ONNX_INT16: case ONNX_UINT16: case ONNX_FLOAT16: case ONNX_BFLOAT16: return 16;
    case ONNX_INT32: case ONNX_UINT32: case ONNX_FLOAT: return 32;
    case ONNX_INT64: case ONNX_UINT64: case ONNX_DOUBLE: return 64;
    default: return 0;
    }
}

/* rest + sign * (-2^(w-1)) without an intermediate 2^63 */
static em_tensor *apply_sign_bit(em_tensor *rest, em_tensor *s, int w)
{
    double h = -ldexp(1.0, w - 2);
    return em_where(s, em_add_scalar(em_add_scalar(rest, h), h), rest);
}

/* The pattern of float tensor x (type t, no NaN) as the signed w-bit integer, in i64. */
static em_tensor *float_to_bits(em_tensor *x, int t)
{
    fparams p = {0, 0};
    float_params(t, &p);
    int w = type_bits(t), bias = (1 << (p.ebits - 1)) - 1, emax = (1 << p.ebits) - 1;
    em_tensor *x64 = to_f64(x);
    em_tensor *a = em_abs(x64);
    em_tensor *s = em_logical_or(em_lt_scalar(x64, 0), em_logical_and(em_eq_scalar(x64, 0), em_lt_scalar(em_reciprocal(x64), 0)));
    em_tensor *e = em_floor(em_log2(a));
    e = em_where(em_gt(em_exp2(e), a), em_sub_scalar(e, 1), e);
    e = em_where(em_le(em_exp2(em_add_scalar(e, 1)), a), em_add_scalar(e, 1), e);
    em_tensor *normal = em_ge_scalar(e, 1 - bias);
    /* integers already where exp2 is exact; the rounding guards a device whose
     * exp2 is not, for the types narrower than f64 */
    em_tensor *mant_n = em_round(em_mul_scalar(em_sub_scalar(em_div(a, em_exp2(e)), 1), ldexp(1.0, p.m)));
    em_tensor *mant_s = em_round(em_mul_scalar(em_mul_scalar(a, ldexp(1.0, bias - 1)), ldexp(1.0, p.m)));
    em_tensor *zero = em_scalar(0, EM_F64);
    em_tensor *field = em_where(normal, em_add_scalar(e, bias), zero);
    em_tensor *mant = em_where(normal, mant_n, mant_s);
    em_tensor *inf = em_eq_scalar(a, INFINITY);
    field = em_where(inf, em_scalar(emax, EM_F64), field);
    mant = em_where(inf, zero, mant);
    em_tensor *rest = em_add(em_mul_scalar(em_cast(field, EM_I64), ldexp(1.0, p.m)), em_cast(mant, EM_I64));
    return apply_sign_bit(rest, s, w);
}

/* Float of type t from v (i64) holding a w-bit pattern as integer type vt. */
static em_tensor *bits_to_float(em_tensor *v, int vt, int t)
{
    fparams p = {0, 0};
    float_params(t, &p);
    int w = type_bits(t), bias = (1 << (p.ebits - 1)) - 1, emax = (1 << p.ebits) - 1;
    em_tensor *s, *rest;
    double h = ldexp(1.0, w - 2);
    if (is_unsigned_type(vt)) {
        s = em_ge_scalar(v, 2 * h);
        rest = em_where(s, em_sub_scalar(em_sub_scalar(v, h), h), v);
    } else {
        s = em_lt_scalar(v, 0);
        rest = em_where(s, em_add_scalar(em_add_scalar(v, h), h), v);
    }
    em_tensor *field = em_floor_divide(rest, em_scalar(ldexp(1.0, p.m), EM_I64));
    em_tensor *mant = em_remainder_scalar(rest, ldexp(1.0, p.m));
    em_tensor *mf = em_mul_scalar(em_cast(mant, EM_F64), ldexp(1.0, -p.m));
    em_tensor *ff = em_cast(field, EM_F64);
    em_tensor *normal = em_mul(em_add_scalar(mf, 1), em_exp2(em_sub_scalar(ff, bias)));
    em_tensor *sub = em_mul_scalar(mf, ldexp(1.0, 1 - bias));
    em_tensor *special = em_where(em_eq_scalar(mant, 0), em_scalar(INFINITY, EM_F64), em_scalar(NAN, EM_F64));
    em_tensor *val = em_where(em_eq_scalar(field, 0), sub, em_where(em_eq_scalar(field, emax), special, normal));
    val = em_where(s, em_neg(val), val);
    return from_f64(val, t);
}

static em_status op_bitcast(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    const Onnx__AttributeProto *a = onnx_attr(c, "to");
    if (!a || !a->has_i) return em_set_error(EM_ERR_FORMAT, "BitCast without an int 'to' attribute");
    int from = onnx_in_type(c, 0), to = (int)a->i;
    em_dtype dt;
    if (!onnx_type_to_dtype(to, &dt)) return onnx_unsupported(c, "BitCast to %s (type %d) is not supported", tname(to), to);
    if (type_bits(from) != type_bits(to) || !type_bits(from))
        return em_set_error(EM_ERR_INVALID, "BitCast from %s to %s: the widths differ", tname(from), tname(to));
    if (from == ONNX_UINT64 || to == ONNX_UINT64) return onnx_unsupported(c, "BitCast of UINT64");
    if (from == to) return onnx_out(c, 0, em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)), to);
    em_tensor *bits; /* the pattern as an i64 value of an integer type bt */
    int bt = from;
    if (is_float_type(from)) {
        double nan = 0;
        if (em_tensor_numel(x) > 0 && em_item(em_any(em_ne(x, x), NULL, 0, false), &nan) != EM_OK) return em_last_status();
        if (nan != 0) return onnx_unsupported(c, "BitCast of a NaN (its sign and payload are not reachable by Ember's ops)");
        bits = float_to_bits(x, from);
        bt = type_bits(from) == 16 ? ONNX_INT16 : type_bits(from) == 32 ? ONNX_INT32 : ONNX_INT64;
    } else {
        bits = em_cast(x, EM_I64);
    }
    if (is_float_type(to)) return onnx_out(c, 0, bits_to_float(bits, bt, to), to);
    if (to == ONNX_BOOL) return onnx_out(c, 0, em_ne_scalar(bits, 0), to);
    return onnx_out(c, 0, arith_out(bits, to), to);
}

/* ---- unary ---- */

typedef em_tensor *(*unfn)(const em_tensor *);

static em_status unary_float(onnx_ctx *c, unfn f)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, f(x), onnx_in_type(c, 0));
}

/* Sqrt, Exp, Log, Reciprocal, Tanh, Sigmoid, Ceil, Floor (6, 13), Cos,
 * Sin (7, 22), Round (11, 22: half to even), Erf (9, 13), Softsign (1,
 * 22), HardSwish (14, 22), Mish (18, 22): float types. */
static em_status op_sqrt(onnx_ctx *c) { return unary_float(c, em_sqrt); }
static em_status op_exp(onnx_ctx *c) { return unary_float(c, em_exp); }
static em_status op_log(onnx_ctx *c) { return unary_float(c, em_log); }
static em_status op_reciprocal(onnx_ctx *c) { return unary_float(c, em_reciprocal); }
static em_status op_tanh(onnx_ctx *c) { return unary_float(c, em_tanh); }
static em_status op_sigmoid(onnx_ctx *c) { return unary_float(c, em_sigmoid); }
static em_status op_ceil(onnx_ctx *c) { return unary_float(c, em_ceil); }
static em_status op_floor(onnx_ctx *c) { return unary_float(c, em_floor); }
static em_status op_round(onnx_ctx *c) { return unary_float(c, em_round); }
static em_status op_cos(onnx_ctx *c) { return unary_float(c, em_cos); }
static em_status op_sin(onnx_ctx *c) { return unary_float(c, em_sin); }
static em_status op_erf(onnx_ctx *c) { return unary_float(c, em_erf); }
static em_status op_softsign(onnx_ctx *c) { return unary_float(c, em_softsign); }
static em_status op_softplus(onnx_ctx *c) { return unary_float(c, em_softplus); }
static em_status op_hardswish(onnx_ctx *c) { return unary_float(c, em_hardswish); }
static em_status op_mish(onnx_ctx *c) { return unary_float(c, em_mish); }

/* Composite float functions, in f64. */
static em_tensor *f_tan(em_tensor *x) { return em_div(em_sin(x), em_cos(x)); }
static em_tensor *f_sqrt1m(em_tensor *x) /* sqrt((1 - x)(1 + x)) */
{
    return em_sqrt(em_mul(em_rsub_scalar(x, 1), em_add_scalar(x, 1)));
}
static em_tensor *f_asin(em_tensor *x) { return em_atan2(x, f_sqrt1m(x)); }
static em_tensor *f_acos(em_tensor *x) { return em_atan2(f_sqrt1m(x), x); }
static em_tensor *f_atan(em_tensor *x) { return em_atan2(x, em_ones_like(x)); }
static em_tensor *f_sinh(em_tensor *x)
{
    /* u = expm1(|x|): sinh|x| = u (u + 2) / (2 (u + 1)), accurate near 0;
     * large |x|: exp(|x| - ln 2) avoids the overflow of u * u */
    em_tensor *ax = em_abs(x);
    em_tensor *u = em_expm1(ax);
    em_tensor *small = em_div(em_mul(u, em_add_scalar(u, 2)), em_mul_scalar(em_add_scalar(u, 1), 2));
    em_tensor *big = em_exp(em_sub_scalar(ax, LN2));
    em_tensor *s = em_where(em_lt_scalar(ax, 20), small, big);
    /* sign of x (NaN stays NaN) */
    return em_where(em_lt_scalar(x, 0), em_neg(s), em_where(em_ne(x, x), x, s));
}
static em_tensor *f_cosh(em_tensor *x)
{
    em_tensor *ax = em_abs(x);
    em_tensor *e = em_exp(em_sub_scalar(ax, LN2));
    /* cosh = e^|x| / 2 + e^-|x| / 2 */
    return em_add(e, em_mul_scalar(em_exp(em_neg(ax)), 0.5));
}
static em_tensor *f_asinh(em_tensor *x)
{
    /* asinh|x| = log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); large |x|: log(2|x|) */
    em_tensor *ax = em_abs(x);
    em_tensor *x2 = em_mul(ax, ax);
    em_tensor *small = em_log1p(em_add(ax, em_div(x2, em_add_scalar(em_sqrt(em_add_scalar(x2, 1)), 1))));
    em_tensor *big = em_add_scalar(em_log(ax), LN2);
    em_tensor *s = em_where(em_lt_scalar(ax, 1e150), small, big);
    return em_where(em_lt_scalar(x, 0), em_neg(s), em_where(em_ne(x, x), x, s));
}
static em_tensor *f_acosh(em_tensor *x)
{
    /* log1p((x - 1) + sqrt((x - 1)(x + 1))); NaN below 1 from the sqrt */
    em_tensor *xm = em_sub_scalar(x, 1);
    em_tensor *small = em_log1p(em_add(xm, em_sqrt(em_mul(xm, em_add_scalar(x, 1)))));
    em_tensor *big = em_add_scalar(em_log(x), LN2);
    return em_where(em_lt_scalar(x, 1e150), small, big);
}
static em_tensor *f_atanh(em_tensor *x)
{
    /* 0.5 log1p(2x / (1 - x)) */
    return em_mul_scalar(em_log1p(em_div(em_mul_scalar(x, 2), em_rsub_scalar(x, 1))), 0.5);
}

typedef em_tensor *(*compfn)(em_tensor *);

static em_status unary_f64(onnx_ctx *c, compfn f)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    return onnx_out(c, 0, from_f64(f(to_f64(x)), t), t);
}

/* Tan, Asin, Acos, Atan (7, 22), Sinh, Cosh, Asinh, Acosh, Atanh (9, 22). */
static em_status op_tan(onnx_ctx *c) { return unary_f64(c, f_tan); }
static em_status op_asin(onnx_ctx *c) { return unary_f64(c, f_asin); }
static em_status op_acos(onnx_ctx *c) { return unary_f64(c, f_acos); }
static em_status op_atan(onnx_ctx *c) { return unary_f64(c, f_atan); }
static em_status op_sinh(onnx_ctx *c) { return unary_f64(c, f_sinh); }
static em_status op_cosh(onnx_ctx *c) { return unary_f64(c, f_cosh); }
static em_status op_asinh(onnx_ctx *c) { return unary_f64(c, f_asinh); }
static em_status op_acosh(onnx_ctx *c) { return unary_f64(c, f_acosh); }
static em_status op_atanh(onnx_ctx *c) { return unary_f64(c, f_atanh); }

/* Neg (6, 13): signed types and floats; Abs (6, 13): every numeric type. */
static em_status op_neg(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (is_float_type(t)) return onnx_out(c, 0, em_neg(x), t);
    if (!is_signed_int_type(t)) return em_set_error(EM_ERR_DTYPE, "Neg takes signed types, not %s", tname(t));
    return onnx_out(c, 0, arith_out(em_neg(x), t), t);
}

static em_status op_abs(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Abs does not take bool input");
    if (is_float_type(t)) return onnx_out(c, 0, em_abs(x), t);
    if (is_unsigned_type(t)) return onnx_out(c, 0, em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)), t);
    return onnx_out(c, 0, arith_out(em_abs(x), t), t);
}

/* Sign (9, 13): -1, 0, 1 (NaN stays NaN). */
static em_status op_sign(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Sign does not take bool input");
    em_tensor *s = em_sign(x);
    if (is_float_type(t)) s = em_where(em_ne(x, x), x, s);
    return onnx_out(c, 0, s, t);
}

/* IsNaN (9, 13, 20), IsInf (10, 20): detect_positive / detect_negative. */
static em_status op_isnan(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, em_ne(x, x), ONNX_BOOL);
}

static em_status op_isinf(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    bool pos = onnx_attr_int(c, "detect_positive", 1) != 0, neg = onnx_attr_int(c, "detect_negative", 1) != 0;
    em_tensor *r;
    if (pos && neg) r = em_eq_scalar(em_abs(x), INFINITY);
    else if (pos) r = em_eq_scalar(x, INFINITY);
    else if (neg) r = em_eq_scalar(x, -INFINITY);
    else r = em_zeros(em_tensor_shape(x), em_tensor_ndim(x), EM_BOOL);
    return onnx_out(c, 0, r, ONNX_BOOL);
}

/* ---- activations with attributes ---- */

/* Elu (6, 22): alpha 1. */
static em_status op_elu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, em_elu(x, onnx_attr_float(c, "alpha", 1.0)), 0);
}

/* Celu (12, 28): alpha 1. */
static em_status op_celu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, em_celu(x, onnx_attr_float(c, "alpha", 1.0)), 0);
}

/* Selu (6, 22): gamma * (x > 0 ? x : alpha (exp(x) - 1)). */
static em_status op_selu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    double alpha = onnx_attr_float(c, "alpha", 1.67326319217681884765625);
    double gamma = onnx_attr_float(c, "gamma", 1.05070102214813232421875);
    em_tensor *neg = em_mul_scalar(em_expm1(x), alpha);
    return onnx_out(c, 0, em_mul_scalar(em_where(em_gt_scalar(x, 0), x, neg), gamma), 0);
}

/* LeakyRelu (6, 16): alpha 0.01. */
static em_status op_leaky_relu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, em_leaky_relu(x, onnx_attr_float(c, "alpha", 0.01)), 0);
}

/* ThresholdedRelu (10, 22): x > alpha ? x : 0, alpha 1. */
static em_status op_thresholded_relu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    double alpha = onnx_attr_float(c, "alpha", 1.0);
    return onnx_out(c, 0, em_where(em_gt_scalar(x, alpha), x, em_zeros_like(x)), 0);
}

/* HardSigmoid (6, 22): max(0, min(1, alpha x + beta)), alpha 0.2, beta 0.5. */
static em_status op_hard_sigmoid(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    double alpha = onnx_attr_float(c, "alpha", 0.2), beta = onnx_attr_float(c, "beta", 0.5);
    return onnx_out(c, 0, em_clamp(em_add_scalar(em_mul_scalar(x, alpha), beta), 0, 1), 0);
}

/* Swish (24): x sigmoid(alpha x), alpha 1. */
static em_status op_swish(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    double alpha = onnx_attr_float(c, "alpha", 1.0);
    if (alpha == 1.0) return onnx_out(c, 0, em_silu(x), 0);
    return onnx_out(c, 0, em_mul(x, em_sigmoid(em_mul_scalar(x, alpha))), 0);
}

/* Gelu (20): approximate "none" (erf) or "tanh". */
static em_status op_gelu(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0);
    if (!x) return em_last_status();
    const char *ap = onnx_attr_string(c, "approximate", "none");
    if (!strcmp(ap, "none")) return onnx_out(c, 0, em_gelu(x), 0);
    /* in f64 for the narrower types: 1 + tanh(u) cancels in f32 for x < -5 */
    if (!strcmp(ap, "tanh")) return onnx_out(c, 0, from_f64(em_gelu_tanh(to_f64(x)), onnx_in_type(c, 0)), 0);
    return em_set_error(EM_ERR_INVALID, "approximate must be none or tanh, not '%s'", ap);
}

/* Shrink (9): x < -lambd ? x + bias : x > lambd ? x - bias : 0; lambd 0.5,
 * bias 0; numeric types. */
static em_status op_shrink(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Shrink does not take bool input");
    double lambd = onnx_attr_float(c, "lambd", 0.5), bias = onnx_attr_float(c, "bias", 0.0);
    em_tensor *xi = is_float_type(t) ? x : em_cast(x, EM_F64);
    em_tensor *lo = em_add_scalar(xi, bias), *hi = em_sub_scalar(xi, bias);
    em_tensor *r = em_where(em_lt_scalar(xi, -lambd), lo, em_where(em_gt_scalar(xi, lambd), hi, em_zeros_like(xi)));
    if (!is_float_type(t)) r = arith_out(em_cast(r, EM_I64), t);
    return onnx_out(c, 0, r, t);
}

/* PRelu (7, 9, 16): x < 0 ? slope x : x, slope broadcast to x. */
static em_status op_prelu(onnx_ctx *c)
{
    em_tensor *x, *s;
    int t = same_type2(c, &x, &s);
    if (!t) return em_last_status();
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "PRelu does not take bool inputs");
    em_tensor *r = em_where(em_lt_scalar(x, 0), em_mul(arith_in(x, t), arith_in(s, t)), arith_in(x, t));
    if (!r) return em_last_status();
    if (em_tensor_ndim(r) != em_tensor_ndim(x) || memcmp(em_tensor_shape(r), em_tensor_shape(x), sizeof(int64_t) * (size_t)em_tensor_ndim(x)))
        return em_set_error(EM_ERR_SHAPE, "slope does not broadcast to X's shape");
    return onnx_out(c, 0, is_float_type(t) ? r : arith_out(r, t), t);
}

/* SwiGLU (28): Swish_alpha(A) * B, A and B of one shape (no broadcasting). */
static em_status op_swiglu(onnx_ctx *c)
{
    em_tensor *a = in_float(c, 0), *b = in_float(c, 1);
    if (!a || !b) return em_last_status();
    if (onnx_in_type(c, 0) != onnx_in_type(c, 1))
        return em_set_error(EM_ERR_DTYPE, "A and B have types %s and %s", tname(onnx_in_type(c, 0)), tname(onnx_in_type(c, 1)));
    if (em_tensor_ndim(a) != em_tensor_ndim(b) || memcmp(em_tensor_shape(a), em_tensor_shape(b), sizeof(int64_t) * (size_t)em_tensor_ndim(a))) {
        char sa[96], sb[96];
        return em_set_error(EM_ERR_SHAPE, "A %s and B %s must have one shape", em_shape_str(em_tensor_shape(a), em_tensor_ndim(a), sa, sizeof sa),
                            em_shape_str(em_tensor_shape(b), em_tensor_ndim(b), sb, sizeof sb));
    }
    double alpha = onnx_attr_float(c, "alpha", 1.0);
    em_tensor *g = alpha == 1.0 ? em_silu(a) : em_mul(a, em_sigmoid(em_mul_scalar(a, alpha)));
    return onnx_out(c, 0, em_mul(g, b), onnx_in_type(c, 0));
}

/* ---- QuantizeLinear / DequantizeLinear ---- */

/* Scale or zero point v made broadcastable to x: a scalar (or one value)
 * per tensor; 1-D of x's dim @p axis per axis (opset 13); blocked (21,
 * block_size > 0): x's rank, dim axis of ceil(D / block_size), each value
 * repeated block_size times along axis. */
static em_tensor *q_param(onnx_ctx *c, em_tensor *v, em_tensor *x, const char *what)
{
    if (em_tensor_numel(v) == 1) return em_reshape(v, NULL, 0);
    int r = em_tensor_ndim(x), ax;
    if (c->opset < 13) {
        em_set_error(EM_ERR_SHAPE, "%s must be a scalar before opset 13", what);
        return NULL;
    }
    if (onnx_axis(c, onnx_attr_int(c, "axis", 1), r, &ax) != EM_OK) return NULL;
    int64_t block = c->opset >= 21 ? onnx_attr_int(c, "block_size", 0) : 0;
    int64_t d = em_tensor_dim(x, ax);
    char sv[96], sx[96];
    em_shape_str(em_tensor_shape(v), em_tensor_ndim(v), sv, sizeof sv);
    em_shape_str(em_tensor_shape(x), r, sx, sizeof sx);
    if (block < 0) {
        em_set_error(EM_ERR_INVALID, "block_size %lld is negative", (long long)block);
        return NULL;
    }
    if (block == 0) {
        if (em_tensor_ndim(v) != 1 || em_tensor_dim(v, 0) != d) {
            em_set_error(EM_ERR_SHAPE, "%s %s must be 1-D of x's dim %d (x %s)", what, sv, ax, sx);
            return NULL;
        }
        int64_t s[EM_MAX_DIMS];
        for (int i = 0; i < r; i++) s[i] = i == ax ? d : 1;
        return em_reshape(v, s, r);
    }
    int64_t nb = (d + block - 1) / block;
    bool ok = em_tensor_ndim(v) == r;
    for (int i = 0; ok && i < r; i++) ok = em_tensor_dim(v, i) == (i == ax ? nb : em_tensor_dim(x, i));
    if (!ok) {
        em_set_error(EM_ERR_SHAPE, "%s %s does not match x %s with block_size %lld on axis %d", what, sv, sx, (long long)block, ax);
        return NULL;
    }
    if (r + 1 > EM_MAX_DIMS) {
        onnx_unsupported(c, "blocked quantization of rank %d", r);
        return NULL;
    }
    int64_t e[EM_MAX_DIMS], m[EM_MAX_DIMS];
    for (int i = 0, j = 0; i < r; i++) {
        e[j++] = em_tensor_dim(v, i);
        if (i == ax) e[j++] = block;
        m[i] = i == ax ? nb * block : em_tensor_dim(v, i);
    }
    em_tensor *u = em_expand(em_unsqueeze(v, ax + 1), e, r + 1);
    return em_narrow(em_reshape(u, m, r), ax, 0, d);
}

static bool q_range(int t, double *lo, double *hi)
{
    switch (t) {
    case ONNX_UINT8: *lo = 0, *hi = 255; return true;
    case ONNX_INT8: *lo = -128, *hi = 127; return true;
    case ONNX_UINT16: *lo = 0, *hi = 65535; return true;
    case ONNX_INT16: *lo = -32768, *hi = 32767; return true;
    default: return sub_byte_range(t, lo, hi);
    }
}

/* QuantizeLinear (10, 13: axis, 19: saturate for float8, 21: block_size
 * and output_dtype, 23: precision): saturate(round_half_even(x / scale) +
 * zero_point) into the zero point's type (else output_dtype, else UINT8);
 * the division in the scale's type (or precision's). Integer targets only. */
static em_status op_quantize(onnx_ctx *c)
{
    em_tensor *x = in_float(c, 0), *scale = in_float(c, 1), *zp = onnx_in(c, 2);
    if (!x || !scale) return em_last_status();
    int t = zp ? onnx_in_type(c, 2) : 0;
    int64_t od = c->opset >= 21 ? onnx_attr_int(c, "output_dtype", 0) : 0;
    if (od && t && od != t) return em_set_error(EM_ERR_INVALID, "output_dtype %lld differs from the zero point's type %s", (long long)od, tname(t));
    if (!t) t = od ? (int)od : ONNX_UINT8;
    double lo = 0, hi = 0;
    bool f8 = is_f8_type(t);
    if (!f8 && !q_range(t, &lo, &hi)) return onnx_unsupported(c, "QuantizeLinear to %s (type %d)", tname(t), t);
    int64_t prec = c->opset >= 23 ? onnx_attr_int(c, "precision", 0) : 0;
    if (prec) {
        em_dtype pd;
        if (!is_float_type((int)prec) || !onnx_type_to_dtype((int)prec, &pd)) return onnx_unsupported(c, "precision %lld", (long long)prec);
        x = em_cast(x, pd);
        scale = em_cast(scale, pd);
    } else if (em_tensor_dtype(x) != em_tensor_dtype(scale)) {
        /* x / scale in the scale's type unless x's is wider (numpy's promotion, as the reference) */
        x = em_cast(x, em_dtype_size(em_tensor_dtype(x)) > em_dtype_size(em_tensor_dtype(scale)) ? em_tensor_dtype(x) : em_tensor_dtype(scale));
    }
    em_tensor *s = q_param(c, scale, x, "y_scale");
    if (!s) return em_last_status();
    if (f8) {
        /* float8: x / scale rounded to the type's grid; the zero point (which
         * must be 0 for these types) is not added, as the reference */
        bool sat = onnx_attr_int(c, "saturate", 1) != 0;
        em_tensor *q = em_div(x, s);
        if (zp && t == ONNX_FLOAT4E2M1) {
            /* FLOAT4E2M1: the zero point is added before the rounding, as the reference */
            em_tensor *z = q_param(c, zp, x, "y_zero_point");
            if (!z) return em_last_status();
            q = em_add(q, em_cast(z, em_tensor_dtype(q)));
        }
        return onnx_out(c, 0, f8_round(q, t, sat), t);
    }
    em_tensor *q = em_cast(em_round(em_div(x, s)), EM_F64);
    if (zp) {
        em_tensor *z = q_param(c, zp, x, "y_zero_point");
        if (!z) return em_last_status();
        q = em_add(q, em_cast(z, EM_F64));
    }
    return onnx_out(c, 0, em_cast(em_clamp(q, lo, hi), holder(t)), t);
}

/* DequantizeLinear (10, 13: axis, 19, 21: block_size, 23: output_dtype):
 * (x - zero_point) * scale in f32 (f64 for a double scale), given the
 * scale's type or output_dtype. Integer x only (float8 / 4-bit types are
 * refused at load). */
static em_status op_dequantize(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *scale = in_float(c, 1), *zp = onnx_in(c, 2);
    if (!x || !scale) return em_last_status();
    int tx = onnx_in_type(c, 0);
    bool f8 = is_f8_type(tx);
    if (!is_int_type(tx) && !f8) return onnx_unsupported(c, "DequantizeLinear of %s", tname(tx));
    if (f8) zp = NULL; /* must be 0 for float8 (the reference does not subtract it) */
    if (zp && onnx_in_type(c, 2) != tx) return em_set_error(EM_ERR_DTYPE, "x_zero_point has type %s, x %s", tname(onnx_in_type(c, 2)), tname(tx));
    int to = onnx_in_type(c, 1);
    int64_t od = c->opset >= 23 ? onnx_attr_int(c, "output_dtype", 0) : 0;
    if (od) {
        if (!is_float_type((int)od)) return em_set_error(EM_ERR_INVALID, "output_dtype %lld is not a float type", (long long)od);
        to = (int)od;
    }
    em_dtype cd = em_tensor_dtype(scale) == EM_F64 ? EM_F64 : EM_F32;
    em_tensor *dx = em_cast(x, cd);
    if (zp) {
        em_tensor *z = q_param(c, zp, x, "x_zero_point");
        if (!z) return em_last_status();
        dx = em_sub(dx, em_cast(z, cd));
    }
    em_tensor *s = q_param(c, scale, x, "x_scale");
    if (!s) return em_last_status();
    em_tensor *y = em_mul(dx, em_cast(s, cd));
    return onnx_out(c, 0, em_cast(y, holder(to)), to);
}

/* DynamicQuantizeLinear (11): uint8 with scale (max(0, max x) - min(0,
 * min x)) / 255 (1 / 255 when that range is 0) and zero point
 * round(clamp(-min / scale, 0, 255)); all in f32 on the device. */
static em_status op_dynamic_quantize(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (onnx_in_type(c, 0) != ONNX_FLOAT) return em_set_error(EM_ERR_DTYPE, "DynamicQuantizeLinear takes FLOAT input, not %s", tname(onnx_in_type(c, 0)));
    if (em_tensor_numel(x) == 0) return onnx_unsupported(c, "DynamicQuantizeLinear of an empty tensor");
    em_tensor *mx = em_maximum_scalar(em_max(x, NULL, 0, false), 0);
    em_tensor *mn = em_minimum_scalar(em_min(x, NULL, 0, false), 0);
    em_tensor *range = em_sub(mx, mn);
    range = em_where(em_eq_scalar(range, 0), em_ones_like(range), range);
    em_tensor *scale = em_div_scalar(range, 255);
    em_tensor *zp = em_round(em_clamp(em_rsub_scalar(em_div(mn, scale), 0), 0, 255));
    em_tensor *y = em_clamp(em_add(em_round(em_div(x, scale)), zp), 0, 255);
    em_status st = onnx_out(c, 0, em_cast(y, EM_U8), ONNX_UINT8);
    if (st == EM_OK) st = onnx_out(c, 1, scale, ONNX_FLOAT);
    if (st == EM_OK) st = onnx_out(c, 2, em_cast(zp, EM_U8), ONNX_UINT8);
    return st;
}

/* Clip (6: min / max attributes, defaults -FLT_MAX / FLT_MAX; 11, 12, 13: optional min / max inputs,
 * scalars of the input's type): min(max(x, min), max), so min > max gives
 * max everywhere, as numpy's clip. */
static em_status op_clip(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (t == ONNX_BOOL) return em_set_error(EM_ERR_DTYPE, "Clip does not take bool input");
    em_tensor *r = x;
    if (c->opset < 11) {
        /* float attributes, defaults the float's lowest and max (so +-inf become +-FLT_MAX) */
        r = em_maximum_scalar(r, onnx_attr_float(c, "min", -3.4028234663852886e38));
        r = em_minimum_scalar(r, onnx_attr_float(c, "max", 3.4028234663852886e38));
    } else {
        for (int i = 1; i <= 2; i++) {
            em_tensor *b = onnx_in(c, i);
            if (!b) continue;
            if (onnx_in_type(c, i) != t)
                return em_set_error(EM_ERR_DTYPE, "input %d has type %s, the input %s", i, tname(onnx_in_type(c, i)), tname(t));
            if (em_tensor_numel(b) != 1)
                return em_set_error(EM_ERR_SHAPE, "input %d (%s) must be a scalar, it has %lld values", i, i == 1 ? "min" : "max",
                                    (long long)em_tensor_numel(b));
            em_tensor *b0 = em_reshape(b, NULL, 0);
            r = i == 1 ? em_maximum(r, b0) : em_minimum(r, b0);
        }
    }
    if (r == x) r = em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
    return onnx_out(c, 0, r, t);
}

/* Dropout (7, 10: ratio attribute, no training; 12, 13, 22: ratio and
 * training_mode inputs). Inference, or training with ratio 0: output =
 * input, mask all true (before opset 10 the mask has the input's type:
 * ones). Training with a non-zero ratio draws numbers: unsupported. */
static em_status op_dropout(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int t = onnx_in_type(c, 0);
    if (c->opset >= 12 && onnx_in(c, 2)) {
        double train, ratio = 0.5;
        if (onnx_in_scalar(c, 2, &train) != EM_OK) return em_last_status();
        if (onnx_in(c, 1) && onnx_in_scalar(c, 1, &ratio) != EM_OK) return em_last_status();
        if (train != 0 && ratio != 0) return onnx_unsupported(c, "Dropout in training mode with ratio %g (random numbers)", ratio);
    }
    em_status st = onnx_out(c, 0, em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)), t);
    if (st != EM_OK || c->nout < 2 || c->node->out[1] < 0) return st;
    if (c->opset < 10) return onnx_out(c, 1, em_ones_like(x), t);
    return onnx_out(c, 1, em_ones(em_tensor_shape(x), em_tensor_ndim(x), EM_BOOL), ONNX_BOOL);
}

const onnx_op onnx_ops_elementwise[] = {
    {"Add", 7, op_add},
    {"Sub", 7, op_sub},
    {"Mul", 7, op_mul},
    {"Div", 7, op_div},
    {"Mod", 10, op_mod},
    {"Pow", 7, op_pow},
    {"Max", 8, op_max},
    {"Min", 8, op_min},
    {"Sum", 8, op_sum},
    {"Mean", 8, op_mean},
    {"Equal", 7, op_equal},
    {"Less", 7, op_less},
    {"Greater", 7, op_greater},
    {"LessOrEqual", 12, op_less_equal},
    {"GreaterOrEqual", 12, op_greater_equal},
    {"And", 7, op_and},
    {"Or", 7, op_or},
    {"Xor", 7, op_xor},
    {"Not", 1, op_not},
    {"Where", 9, op_where},
    {"BitShift", 11, op_bitshift},
    {"BitwiseNot", 18, op_bitwise_not},
    {"BitwiseAnd", 18, op_bitwise_and},
    {"BitwiseOr", 18, op_bitwise_or},
    {"BitwiseXor", 18, op_bitwise_xor},
    {"Cast", 6, op_cast},
    {"CastLike", 15, op_castlike},
    {"BitCast", 26, op_bitcast},
    {"Sqrt", 6, op_sqrt},
    {"Exp", 6, op_exp},
    {"Log", 6, op_log},
    {"Reciprocal", 6, op_reciprocal},
    {"Tanh", 6, op_tanh},
    {"Sigmoid", 6, op_sigmoid},
    {"Ceil", 6, op_ceil},
    {"Floor", 6, op_floor},
    {"Round", 11, op_round},
    {"Cos", 7, op_cos},
    {"Sin", 7, op_sin},
    {"Tan", 7, op_tan},
    {"Asin", 7, op_asin},
    {"Acos", 7, op_acos},
    {"Atan", 7, op_atan},
    {"Sinh", 9, op_sinh},
    {"Cosh", 9, op_cosh},
    {"Asinh", 9, op_asinh},
    {"Acosh", 9, op_acosh},
    {"Atanh", 9, op_atanh},
    {"Erf", 9, op_erf},
    {"Softsign", 1, op_softsign},
    {"Softplus", 1, op_softplus},
    {"HardSwish", 14, op_hardswish},
    {"Mish", 18, op_mish},
    {"Neg", 6, op_neg},
    {"Abs", 6, op_abs},
    {"Sign", 9, op_sign},
    {"IsNaN", 9, op_isnan},
    {"IsInf", 10, op_isinf},
    {"Elu", 6, op_elu},
    {"Celu", 12, op_celu},
    {"Selu", 6, op_selu},
    {"LeakyRelu", 6, op_leaky_relu},
    {"ThresholdedRelu", 10, op_thresholded_relu},
    {"HardSigmoid", 6, op_hard_sigmoid},
    {"Swish", 24, op_swish},
    {"Gelu", 20, op_gelu},
    {"Shrink", 9, op_shrink},
    {"PRelu", 7, op_prelu},
    {"Clip", 6, op_clip},
    {"SwiGLU", 28, op_swiglu},
    {"QuantizeLinear", 10, op_quantize},
    {"DequantizeLinear", 10, op_dequantize},
    {"DynamicQuantizeLinear", 11, op_dynamic_quantize},
    {"Dropout", 7, op_dropout},
    {NULL, 0, NULL},
};
