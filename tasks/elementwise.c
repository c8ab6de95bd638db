/* Element-wise ops: unary, tensor-scalar, binary with broadcasting, where. */
#include "tasks/tasks_internal.h"

#include <math.h>
#include <string.h>

static bool float_math(enum em_op_kind k) { return (em__optab[k].flags & F_FLOAT) != 0; }

static bool supported(em_dtype dt)
{
    return (unsigned)dt < EM_DTYPE_COUNT;
}

/* Can an integer kernel of dtype dt take v as its scalar? The kernels
 * convert it with (T)v (the CPU's cast, OpenCL's int_cast, CUDA's host
 * cast), which is only defined, and only the same on every backend, for an
 * integral v in T's range (u8 / bool: in int32's, where every backend wraps
 * alike). Comparisons compare as doubles and take any value. */
static bool int_scalar_ok(em_dtype dt, double v)
{
    if (!isfinite(v) || v != floor(v)) return false;
    if (dt == EM_I64) return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    return v >= -2147483648.0 && v <= 2147483647.0;
}

/* Computes `kind` on a (with scalar params p). Scalar ops whose scalar is not
 * an integer of a's dtype's range (non-integral, +-inf, nan, too large)
 * promote integer inputs to f32; so do clamp's finite bounds. */
static em_tensor *unary(enum em_op_kind kind, const em_tensor *a, double sa, double sb, const char *name)
{
    if (!a) return em__fail_null("%s: input is NULL", name);
    if (!supported(a->dtype)) return em__fail(EM_ERR_DTYPE, "%s: dtype %s is not supported", name, em_dtype_name(a->dtype));
    em_tensor *ac[1]; /* autocast: exp, log, pow, ... in f32 */
    EM_AUTOCAST_RERUN(kind, &a, 1, ac, unary(kind, ac[0], sa, sb, name));
    em_dtype cdt = a->dtype;
    bool is_float = em_dtype_is_float(cdt);
    bool scalar_op = (em__optab[kind].flags & F_SCALAR) != 0;
    bool cmp = (em__optab[kind].flags & F_CMP) != 0;
    if (!is_float && (float_math(kind) || (scalar_op && cmp && sa != floor(sa)) ||
                      (scalar_op && !cmp && !int_scalar_ok(cdt, sa)) ||
                      ((kind == EM_OP_POW_SCALAR) && (!int_scalar_ok(cdt, sa) || sa < 0)) ||
                      (kind == EM_OP_CLAMP && ((isfinite(sa) && !int_scalar_ok(cdt, sa)) ||
                                               (isfinite(sb) && !int_scalar_ok(cdt, sb))))))
        cdt = EM_F32;
    /* bool arithmetic computes in int64 (as PyTorch's bool with an integer
     * scalar): a bool result could hold other values than 0 and 1 */
    if (cdt == EM_BOOL && (kind == EM_OP_NEG || kind == EM_OP_ADD_SCALAR || kind == EM_OP_SUB_SCALAR ||
                           kind == EM_OP_RSUB_SCALAR || kind == EM_OP_MUL_SCALAR || kind == EM_OP_SQUARE ||
                           kind == EM_OP_POW_SCALAR || kind == EM_OP_REMAINDER_SCALAR ||
                           kind == EM_OP_MAXIMUM_SCALAR || kind == EM_OP_MINIMUM_SCALAR || kind == EM_OP_CLAMP))
        cdt = kind == EM_OP_NEG ? EM_BOOL : EM_I64;
    if (a->dtype == EM_BOOL && (kind == EM_OP_SUB_SCALAR || kind == EM_OP_RSUB_SCALAR))
        return em__fail(EM_ERR_DTYPE, "%s: subtraction with a bool tensor is not supported (as PyTorch): cast to an integer dtype first",
                        name);
    if (cdt == EM_BOOL && kind == EM_OP_NEG)
        return em__fail(EM_ERR_DTYPE, "%s: negation of a bool tensor is not supported, use em_logical_not", name);
    em_dtype odt = (em__optab[kind].flags & F_CMP) ? EM_BOOL : cdt;
    em_tensor *in = em__as_dtype(a, cdt);
    if (!in) return NULL;
    em_tensor *out = em__tensor_new(odt, a->shape, a->ndim);
    if (!out) {
        em_tensor_release(in);
        return NULL;
    }
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.s.a = sa;
    p.s.b = sb;
    const em_tensor *orig[1] = {a};
    em_tensor *r = em__run1(kind, &in, 1, out, &p, orig);
    em_tensor_release(in);
    return r;
}

/* The generated front ends of tasks/ops.def: em_<name>(a) for EW1 lines,
 * em_<name>(a, s) for EWS lines (EWP lines have their own below). */
#define EW1(E, nm, fl, fx, ix, bw) \
    em_tensor *em_##nm(const em_tensor *a) { return unary(EM_OP_##E, a, 0, 0, "em_" #nm); }
#define EWS(E, nm, fl, fx, ix, bw) \
    em_tensor *em_##nm(const em_tensor *a, double s) { return unary(EM_OP_##E, a, s, 0, "em_" #nm); }
#define EWP(E, nm, fl, fx, ix, bw)
#include "tasks/ops.def"
/* sqrt whose gradient is 0 where the result is 0 (p.s.a = 1, which the kernel
 * ignores; autodiff/rules.c bw_sqrt reads it): em_std's, as PyTorch's
 * std_backward masks a zero std. */
em_tensor *em__sqrt_std(const em_tensor *a) { return unary(EM_OP_SQRT, a, 1.0, 0, "em_std"); }
em_tensor *em_clamp(const em_tensor *a, double lo, double hi)
{
    if (lo > hi) return em__fail(EM_ERR_INVALID, "em_clamp: min %g is greater than max %g", lo, hi);
    return unary(EM_OP_CLAMP, a, lo, hi, "em_clamp");
}
em_tensor *em_pow_scalar(const em_tensor *a, double e) { return unary(EM_OP_POW_SCALAR, a, e, 0, "em_pow_scalar"); }
em_tensor *em_leaky_relu(const em_tensor *a, double s) { return unary(EM_OP_LEAKY_RELU, a, s, 0, "em_leaky_relu"); }
em_tensor *em_elu(const em_tensor *a, double alpha) { return unary(EM_OP_ELU, a, alpha, 0, "em_elu"); }
em_tensor *em_celu(const em_tensor *a, double alpha)
{
    if (alpha == 0 || !isfinite(alpha)) return em__fail(EM_ERR_INVALID, "em_celu: alpha must be finite and non-zero, got %g", alpha);
    return unary(EM_OP_CELU, a, alpha, 1.0 / alpha, "em_celu");
}

/* n-ary element-wise: promote to one dtype, broadcast, one task. */
static em_tensor *nary(enum em_op_kind kind, const em_tensor *const *ins, int n, em_dtype cdt, em_dtype odt, const char *name,
                       const union em_op_params *p)
{
    int64_t shape[EM_MAX_DIMS];
    int nd = ins[0]->ndim;
    memcpy(shape, ins[0]->shape, sizeof(int64_t) * (size_t)nd);
    for (int i = 1; i < n; i++) {
        int64_t tmp[EM_MAX_DIMS];
        int ntmp;
        if (em__broadcast_shapes(shape, nd, ins[i]->shape, ins[i]->ndim, tmp, &ntmp, name) != EM_OK) return NULL;
        memcpy(shape, tmp, sizeof tmp);
        nd = ntmp;
    }
    em_tensor *views[EM_OP_MAX_IN] = {0};
    em_tensor *out = NULL, *r = NULL;
    for (int i = 0; i < n; i++) {
        em_dtype want = (kind == EM_OP_WHERE && i == 0) ? EM_BOOL : cdt;
        em_tensor *c = em__as_dtype(ins[i], want);
        if (!c) goto done;
        views[i] = em__broadcast_view(c, shape, nd);
        em_tensor_release(c);
        if (!views[i]) goto done;
    }
    out = em__tensor_new(odt, shape, nd);
    if (!out) goto done;
    r = em__run1(kind, views, n, out, p, ins);
done:
    for (int i = 0; i < n; i++) em_tensor_release(views[i]);
    return r;
}

static em_tensor *binary(enum em_op_kind kind, const em_tensor *a, const em_tensor *b, const char *name)
{
    if (!a || !b) return em__fail_null("%s: input %s is NULL", name, !a ? "a" : "b");
    if (!supported(a->dtype) || !supported(b->dtype))
        return em__fail(EM_ERR_DTYPE, "%s: dtype %s is not supported", name, em_dtype_name(supported(a->dtype) ? b->dtype : a->dtype));
    if (kind == EM_OP_SUB && (a->dtype == EM_BOOL || b->dtype == EM_BOOL))
        return em__fail(EM_ERR_DTYPE, "%s: subtraction with a bool tensor is not supported (as PyTorch): cast to an integer "
                        "dtype first", name);
    const em_tensor *ab[2] = {a, b};
    em_tensor *ac[2]; /* autocast: pow in f32 */
    EM_AUTOCAST_RERUN(kind, ab, 2, ac, binary(kind, ac[0], ac[1], name));
    em_dtype cdt = em__promote(a->dtype, b->dtype);
    if ((kind == EM_OP_REMAINDER || kind == EM_OP_FMOD || kind == EM_OP_FLOOR_DIVIDE) && cdt == EM_BOOL)
        return em__fail(EM_ERR_DTYPE, "%s: not supported for two bool tensors (as PyTorch): cast one to an integer dtype first", name);
    if (float_math(kind) && !em_dtype_is_float(cdt)) cdt = EM_F32;
    if (kind == EM_OP_POW && !em_dtype_is_float(cdt)) cdt = EM_F32;
    if (cdt == EM_BOOL && (kind == EM_OP_ADD || kind == EM_OP_SUB || kind == EM_OP_MUL || kind == EM_OP_REMAINDER))
        cdt = kind == EM_OP_SUB ? EM_I64 : cdt;
    em_dtype odt = (em__optab[kind].flags & F_CMP) ? EM_BOOL : cdt;
    const em_tensor *ins[2] = {a, b};
    return nary(kind, ins, 2, cdt, odt, name, NULL);
}

/* em_<name>(a, b) for every EW2 line of tasks/ops.def. */
#define EW2(E, nm, fl, fx, ix, bw) \
    em_tensor *em_##nm(const em_tensor *a, const em_tensor *b) { return binary(EM_OP_##E, a, b, "em_" #nm); }
#include "tasks/ops.def"

em_tensor *em_where(const em_tensor *mask, const em_tensor *a, const em_tensor *b)
{
    if (!mask || !a || !b) return em__fail_null("em_where: input %s is NULL", !mask ? "mask" : !a ? "a" : "b");
    em_dtype cdt = em__promote(a->dtype, b->dtype);
    const em_tensor *ins[3] = {mask, a, b};
    return nary(EM_OP_WHERE, ins, 3, cdt, cdt, "em_where", NULL);
}

em_tensor *em_masked_fill(const em_tensor *a, const em_tensor *mask, double value)
{
    if (!a || !mask) return em__fail_null("em_masked_fill: input %s is NULL", !a ? "a" : "mask");
    if (mask->dtype != EM_BOOL) return em__fail(EM_ERR_DTYPE, "em_masked_fill: mask must be bool, got %s", em_dtype_name(mask->dtype));
    int64_t shape[EM_MAX_DIMS];
    int nd;
    if (em__broadcast_shapes(a->shape, a->ndim, mask->shape, mask->ndim, shape, &nd, "em_masked_fill") != EM_OK) return NULL;
    if (nd != a->ndim || memcmp(shape, a->shape, sizeof(int64_t) * (size_t)nd) != 0) {
        char sa[160], sm[160];
        return em__fail(EM_ERR_SHAPE, "em_masked_fill: mask of shape %s does not broadcast to the input's shape %s",
                        em_shape_str(mask->shape, mask->ndim, sm, sizeof sm), em_shape_str(a->shape, a->ndim, sa, sizeof sa));
    }
    em_scope_begin();
    em_tensor *v = em_scalar(value, a->dtype);
    em_tensor *r = em_keep(em_where(mask, v, a));
    em_scope_end();
    return r;
}
