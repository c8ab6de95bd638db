/* Pooling front ends: em_max_pool2d, em_avg_pool2d, em_adaptive_avg_pool2d,
 * em_adaptive_max_pool2d, and em__avg_pool2d_bwd for the backward rule.
 *
 * Kernel contracts (every backend). Operands are f32 or f64 (one dtype; f16 /
 * bf16 where em__<backend>_half's pool entry says so, CUDA: f32 compute, one
 * rounding; the door widens the op elsewhere),
 * contiguous (a descriptor may have an offset): x / dx [N, C, H, W], y / dy
 * [N, C, OH, OW] (sizes from the descriptors). p.pool holds (h, w) pairs.
 * The window of output row oh (columns alike):
 *   fixed    (adaptive = 0): rows h = oh*stride - pad + i*dilation, i < kernel,
 *            those with 0 <= h < H (the rest is padding);
 *   adaptive (adaptive = 1): rows [floor(oh*H/OH), ceil((oh+1)*H/OH)).
 *
 *   MAX_POOL2D     in[0] = x, out[0] = y, out[1] = idx (i64, y's shape):
 *       y = the maximum over the window's rows and columns, scanned row-major;
 *       a NaN is a maximum (the last NaN wins), else the first of equal
 *       maxima (ATen's test: v > best || isnan(v)); idx = h*W + w of that element (PyTorch's return_indices).
 *       The front end guarantees every window holds an input element.
 *   AVG_POOL2D     in[0] = x, out[0] = y (dilation is 1):
 *       fixed: with hs = oh*stride - pad, he = min(hs + kernel, H + pad),
 *       pool = (he - hs) * (we - ws) (clipped to the padded input), then
 *       hs, he clipped to [0, H): y = sum(x over the clipped window) / div,
 *       div = divisor if divisor != 0, else pool if count_include_pad, else
 *       (he - hs) * (we - ws) after clipping (ATen AvgPool2d.cpp);
 *       adaptive: the mean over the window.
 *   AVG_POOL2D_BWD in[0] = dy, out[0] = dx (written whole): each dy element
 *       adds dy / div to every x element of its clipped window (the adjoint
 *       of AVG_POOL2D).
 *
 * Output size, fixed windows (PyTorch's pooling_output_shape):
 *   eff = dilation*(kernel-1) + 1
 *   OH  = floor_or_ceil((H + 2*pad - eff) / stride) + 1, and with ceil_mode
 *         OH - 1 more when the last window would start in the end padding
 *         ((OH-1)*stride >= H + pad).
 * pad <= kernel/2 (PyTorch's rule), which with the above keeps every window
 * non-empty. */
#include "tasks/tasks_internal.h"

#include <string.h>

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)

em_pool_opts em_pool_opts_default(int64_t kh, int64_t kw)
{
    em_pool_opts o;
    memset(&o, 0, sizeof o);
    o.kernel_size[0] = o.stride[0] = kh;
    o.kernel_size[1] = o.stride[1] = kw;
    o.dilation[0] = o.dilation[1] = 1;
    o.count_include_pad = true;
    return o;
}

static bool check_input(const em_tensor *x, const char *what)
{
    char sx[200];
    if (!em_dtype_is_float(x->dtype)) {
        em__fail(EM_ERR_DTYPE, "%s: input must be a float dtype, got %s", what, em_dtype_name(x->dtype));
        return false;
    }
    if (x->ndim != 4 || x->shape[0] == 0 || x->shape[1] == 0 || x->shape[2] == 0 || x->shape[3] == 0) {
        em__fail(EM_ERR_SHAPE, "%s: expected a non-empty input [N, C, H, W], got %s", what, SHAPE_STR(x, sx));
        return false;
    }
    return true;
}

/* Validates @p o for x and computes the output shape and the kernel params. */
static bool fixed_geometry(const em_tensor *x, const em_pool_opts *o, bool is_max, const char *what, int64_t *out,
                           union em_op_params *p)
{
    char sx[200];
    memset(p, 0, sizeof *p);
    out[0] = x->shape[0];
    out[1] = x->shape[1];
    for (int i = 0; i < 2; i++) {
        const int64_t k = o->kernel_size[i], s = o->stride[i] ? o->stride[i] : k, pad = o->padding[i];
        const int64_t d = is_max ? o->dilation[i] : 1, in = x->shape[2 + i];
        if (k <= 0 || s <= 0 || d <= 0 || pad < 0 || k > INT32_MAX || s > INT32_MAX || d > INT32_MAX)
            return em__fail(EM_ERR_INVALID, "%s: kernel_size (%lld, %lld), stride and dilation must be > 0 and padding >= 0", what,
                            (long long)o->kernel_size[0], (long long)o->kernel_size[1]),
                   false;
        if (pad > k / 2)
            return em__fail(EM_ERR_INVALID, "%s: padding (%lld, %lld) must be at most half of kernel_size (%lld, %lld)", what,
                            (long long)o->padding[0], (long long)o->padding[1], (long long)o->kernel_size[0],
                            (long long)o->kernel_size[1]),
                   false;
        if (!is_max && o->dilation[i] != 1 && o->dilation[i] != 0)
            return em__fail(EM_ERR_INVALID, "%s: avg pooling has no dilation (got %lld)", what, (long long)o->dilation[i]), false;
        const int64_t eff = d * (k - 1) + 1, span = in + 2 * pad - eff;
        int64_t n;
        if (span < 0) {
            n = 0;
        } else {
            n = (o->ceil_mode ? (span + s - 1) / s : span / s) + 1;
            if (o->ceil_mode && (n - 1) * s >= in + pad) n--;
        }
        if (n <= 0)
            return em__fail(EM_ERR_SHAPE,
                            "%s: kernel_size (%lld, %lld) with dilation (%lld, %lld) and padding (%lld, %lld) is larger than the "
                            "padded input %s: the output would be empty",
                            what, (long long)o->kernel_size[0], (long long)o->kernel_size[1], (long long)(is_max ? o->dilation[0] : 1),
                            (long long)(is_max ? o->dilation[1] : 1), (long long)o->padding[0], (long long)o->padding[1],
                            SHAPE_STR(x, sx)),
                   false;
        out[2 + i] = n;
        p->pool.kernel[i] = (int32_t)k;
        p->pool.stride[i] = (int32_t)s;
        p->pool.pad[i] = (int32_t)pad;
        p->pool.dilation[i] = (int32_t)d;
    }
    p->pool.count_include_pad = o->count_include_pad;
    if (!is_max) {
        if (o->divisor_override < 0)
            return em__fail(EM_ERR_INVALID, "%s: divisor_override must be > 0 (0 = none), got %lld", what,
                            (long long)o->divisor_override),
                   false;
        p->pool.divisor = o->divisor_override;
    }
    return true;
}

static bool adaptive_geometry(const em_tensor *x, int64_t oh, int64_t ow, const char *what, int64_t *out, union em_op_params *p)
{
    if (oh <= 0 || ow <= 0)
        return em__fail(EM_ERR_INVALID, "%s: output size (%lld, %lld) must be > 0", what, (long long)oh, (long long)ow), false;
    memset(p, 0, sizeof *p);
    p->pool.adaptive = 1;
    out[0] = x->shape[0];
    out[1] = x->shape[1];
    out[2] = oh;
    out[3] = ow;
    return true;
}

static em_tensor *max_pool(const em_tensor *x, const int64_t *shape, const union em_op_params *p, em_tensor **indices)
{
    if (indices) *indices = NULL;
    em_tensor *xc = em__contiguous_operand(x);
    if (!xc) return NULL;
    em_tensor *y = em__tensor_new(x->dtype, shape, 4);
    em_tensor *idx = y ? em__tensor_new(EM_I64, shape, 4) : NULL;
    if (!idx) {
        em_tensor_release(y);
        em_tensor_release(xc);
        return NULL;
    }
    em_op op = {.kind = EM_OP_MAX_POOL2D, .n_in = 1, .n_out = 2, .in = {xc}, .out = {y, idx}, .p = *p, .orig_in = {x}};
    em_status st = em__submit(&op);
    em_tensor_release(xc);
    if (st != EM_OK) {
        em_tensor_release(y);
        em_tensor_release(idx);
        return NULL;
    }
    if (indices)
        *indices = em__publish(idx);
    else
        em_tensor_release(idx); /* the autodiff node keeps its own reference */
    return em__publish(y);
}

static em_tensor *avg_pool(enum em_op_kind kind, const em_tensor *x, const int64_t *shape, const union em_op_params *p)
{
    em_tensor *xc = em__contiguous_operand(x);
    em_tensor *y = xc ? em__tensor_new(x->dtype, shape, 4) : NULL;
    em_tensor *r = NULL;
    if (y) {
        em_tensor *in[1] = {xc};
        const em_tensor *orig[1] = {x};
        r = em__run1(kind, in, 1, y, p, orig);
    }
    em_tensor_release(xc);
    return r;
}

em_tensor *em__avg_pool2d_bwd(const em_tensor *dy, const union em_op_params *p, const int64_t *x_shape)
{
    return avg_pool(EM_OP_AVG_POOL2D_BWD, dy, x_shape, p);
}

em_tensor *em_max_pool2d(const em_tensor *x, const em_pool_opts *o, em_tensor **indices)
{
    if (indices) *indices = NULL;
    if (!x || !o) return em__fail_null("em_max_pool2d: %s is NULL", !x ? "input" : "options");
    if (!check_input(x, "em_max_pool2d")) return NULL;
    int64_t shape[4];
    union em_op_params p;
    if (!fixed_geometry(x, o, true, "em_max_pool2d", shape, &p)) return NULL;
    return max_pool(x, shape, &p, indices);
}

em_tensor *em_adaptive_max_pool2d(const em_tensor *x, int64_t oh, int64_t ow, em_tensor **indices)
{
    if (indices) *indices = NULL;
    if (!x) return em__fail_null("em_adaptive_max_pool2d: input is NULL");
    if (!check_input(x, "em_adaptive_max_pool2d")) return NULL;
    int64_t shape[4];
    union em_op_params p;
    if (!adaptive_geometry(x, oh, ow, "em_adaptive_max_pool2d", shape, &p)) return NULL;
    return max_pool(x, shape, &p, indices);
}

em_tensor *em_avg_pool2d(const em_tensor *x, const em_pool_opts *o)
{
    if (!x || !o) return em__fail_null("em_avg_pool2d: %s is NULL", !x ? "input" : "options");
    if (!check_input(x, "em_avg_pool2d")) return NULL;
    int64_t shape[4];
    union em_op_params p;
    if (!fixed_geometry(x, o, false, "em_avg_pool2d", shape, &p)) return NULL;
    return avg_pool(EM_OP_AVG_POOL2D, x, shape, &p);
}

em_tensor *em_adaptive_avg_pool2d(const em_tensor *x, int64_t oh, int64_t ow)
{
    if (!x) return em__fail_null("em_adaptive_avg_pool2d: input is NULL");
    if (!check_input(x, "em_adaptive_avg_pool2d")) return NULL;
    int64_t shape[4];
    union em_op_params p;
    if (!adaptive_geometry(x, oh, ow, "em_adaptive_avg_pool2d", shape, &p)) return NULL;
    return avg_pool(EM_OP_AVG_POOL2D, x, shape, &p);
}
