/* ONNX operators, core group: Identity, Constant and the ones every
 * exported MLP uses (MatMul, Gemm, Add, Relu, Reshape, Flatten). Semantics
 * from onnx/docs/Operators.md (onnx 1.23); each function names the opsets
 * whose differences it handles. */
#include "store/onnx_internal.h"

#include <string.h>

/* Identity (1, 13, 14, 16, 19, 21, 23, 24, 25): tensors only. */
static em_status op_identity(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    /* a view: a new reference in the op's scope (tensors are immutable here) */
    return onnx_out(c, 0, em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)), onnx_in_type(c, 0));
}

/* Constant (1, 9, 11, 12, 13, 19, 21, 23, 24, 25): value or value_float(s) /
 * value_int(s); string and sparse values are unsupported. */
static em_status op_constant(onnx_ctx *c)
{
    const Onnx__AttributeProto *a;
    if ((a = onnx_attr(c, "value"))) {
        int type = 0;
        em_tensor *t = onnx_attr_tensor(c, "value", &type);
        return onnx_out(c, 0, t, type);
    }
    if ((a = onnx_attr(c, "value_float"))) return onnx_out(c, 0, em_scalar(a->f, EM_F32), ONNX_FLOAT);
    if ((a = onnx_attr(c, "value_int"))) return onnx_out(c, 0, em_scalar((double)a->i, EM_I64), ONNX_INT64);
    if ((a = onnx_attr(c, "value_floats"))) {
        int64_t n = (int64_t)a->n_floats;
        return onnx_out(c, 0, em_from_host(a->floats, &n, 1, EM_F32), ONNX_FLOAT);
    }
    if ((a = onnx_attr(c, "value_ints"))) {
        int64_t n = (int64_t)a->n_ints;
        return onnx_out(c, 0, em_from_host(a->ints, &n, 1, EM_I64), ONNX_INT64);
    }
    if (onnx_has_attr(c, "value_string") || onnx_has_attr(c, "value_strings"))
        return onnx_unsupported(c, "string constants are not supported");
    if (onnx_has_attr(c, "sparse_value")) return onnx_unsupported(c, "sparse constants are not supported");
    return em_set_error(EM_ERR_FORMAT, "Constant without a value attribute");
}

/* MatMul (1, 9, 13): numpy matmul (1-D operands promoted and squeezed). */
static em_status op_matmul(onnx_ctx *c)
{
    em_tensor *a = onnx_in_req(c, 0), *b = onnx_in_req(c, 1);
    if (!a || !b) return em_last_status();
    return onnx_out(c, 0, em_matmul(a, b), 0);
}

/* Gemm (1, 6, 7, 9, 11, 13): Y = alpha * A' B' + beta * C, C broadcast to
 * [M, N] and optional from opset 11. */
static em_status op_gemm(onnx_ctx *c)
{
    em_tensor *a = onnx_in_req(c, 0), *b = onnx_in_req(c, 1), *cc = onnx_in(c, 2);
    if (!a || !b) return em_last_status();
    if (em_tensor_ndim(a) != 2 || em_tensor_ndim(b) != 2)
        return em_set_error(EM_ERR_SHAPE, "A and B must be 2-D (ranks %d and %d)", em_tensor_ndim(a), em_tensor_ndim(b));
    double alpha = onnx_attr_float(c, "alpha", 1.0), beta = onnx_attr_float(c, "beta", 1.0);
    if (onnx_attr_int(c, "transA", 0)) a = em_transpose(a, 0, 1);
    if (onnx_attr_int(c, "transB", 0)) b = em_transpose(b, 0, 1);
    if (c->opset < 7 && onnx_attr_int(c, "broadcast", 0) == 0 && cc)
        return onnx_unsupported(c, "Gemm before opset 7 without broadcast");
    em_tensor *y = em_matmul(a, b);
    if (alpha != 1.0) y = em_mul_scalar(y, alpha);
    if (cc && beta != 0.0) y = em_add(y, beta != 1.0 ? em_mul_scalar(cc, beta) : cc);
    return onnx_out(c, 0, y, 0);
}

/* Relu (6, 13, 14). */
static em_status op_relu(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    return onnx_out(c, 0, em_relu(x), 0);
}

/* Reshape (5, 13, 14, 19, 21, 23, 24, 25): 0 copies the input's dim unless
 * allowzero (14) is set; -1 is inferred. */
static em_status op_reshape(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t s[EM_MAX_DIMS + 1];
    int n = onnx_in_ints(c, 1, s, EM_MAX_DIMS + 1);
    if (n < 0) return em_last_status();
    if (n > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", n, EM_MAX_DIMS);
    bool allowzero = onnx_attr_int(c, "allowzero", 0) != 0;
    for (int i = 0; i < n; i++)
        if (s[i] == 0 && !allowzero) {
            if (i >= em_tensor_ndim(x)) return em_set_error(EM_ERR_SHAPE, "shape[%d] = 0 copies a dim the input (rank %d) lacks", i, em_tensor_ndim(x));
            s[i] = em_tensor_dim(x, i);
        }
    return onnx_out(c, 0, em_reshape(x, s, n), 0);
}

/* Flatten (1, 9, 11, 13, 21, 23, 24, 25): to 2-D around axis. */
static em_status op_flatten(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    int64_t axis = onnx_attr_int(c, "axis", 1);
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r) return em_set_error(EM_ERR_INVALID, "axis %lld is out of range for rank %d", (long long)onnx_attr_int(c, "axis", 1), r);
    int64_t a = 1, b = 1;
    for (int d = 0; d < r; d++) {
        if (d < axis) a *= em_tensor_dim(x, d);
        else b *= em_tensor_dim(x, d);
    }
    int64_t s[2] = {a, b};
    return onnx_out(c, 0, em_reshape(x, s, 2), 0);
}

const onnx_op onnx_ops_core[] = {
    {"Identity", 1, op_identity},
    {"Constant", 1, op_constant},
    {"MatMul", 1, op_matmul},
    {"Gemm", 7, op_gemm},
    {"Relu", 6, op_relu},
    {"Reshape", 5, op_reshape},
    {"Flatten", 1, op_flatten},
    {NULL, 0, NULL},
};
