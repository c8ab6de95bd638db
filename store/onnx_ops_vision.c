/* ONNX operators, vision group (see store/onnx_internal.h): convolution,
 * pooling, normalisation and resampling of NC<spatial> tensors. Semantics
 * from onnx/docs/Operators.md (onnx 1.23). 1-D and 2-D spatial inputs are
 * run as Ember's 2-D ops (1-D as height 1); 3-D inputs are unsupported
 * where Ember has no 3-D op. */
#include "store/onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static em_tensor *per_channel(const em_tensor *t, int r);
static em_tensor *convT_full(const em_tensor *x, const em_tensor *w, int nd, const int64_t *s, const int64_t *d, int64_t groups);

/* ---- spatial settings shared by Conv / ConvTranspose / the pools ---- */

typedef struct spatial {
    int nd;                      /* spatial dims of the ONNX input (1 to 3) */
    int64_t in[3], k[3], s[3], d[3], pb[3], pe[3], out[3];
} spatial;

/* Reads an INTS attribute of nd values into v (default def). */
static em_status ints_attr(onnx_ctx *c, const char *name, int nd, int64_t *v, int64_t def)
{
    const int64_t *a;
    int n = onnx_attr_ints(c, name, &a);
    for (int i = 0; i < nd; i++) v[i] = def;
    if (n < 0) return EM_OK;
    if (n != nd) return em_set_error(EM_ERR_INVALID, "attribute %s has %d values, expected %d", name, n, nd);
    for (int i = 0; i < nd; i++) v[i] = a[i];
    return EM_OK;
}

/* The spatial rank of x (rank - 2): 1 or 2 supported. */
static em_status spatial_rank(onnx_ctx *c, const em_tensor *x, int *nd, int max_nd)
{
    int r = em_tensor_ndim(x);
    if (r < 3) return em_set_error(EM_ERR_SHAPE, "input must be [N, C, spatial...], got rank %d", r);
    if (r - 2 > max_nd) return onnx_unsupported(c, "%d-D spatial input (only up to %d-D is supported here)", r - 2, max_nd);
    *nd = r - 2;
    return EM_OK;
}

/* Kernel (from kernel_shape or @p kdims), strides, dilations and the pads
 * (explicit or auto_pad) into sp; output size with floor or ceil rounding
 * (ceil drops a last window starting in the end padding). */
static em_status spatial_read(onnx_ctx *c, const em_tensor *x, const int64_t *kdims, bool ceil_mode, spatial *sp)
{
    em_status st = spatial_rank(c, x, &sp->nd, 3);
    if (st) return st;
    int nd = sp->nd;
    for (int i = 0; i < nd; i++) sp->in[i] = em_tensor_dim(x, 2 + i);
    if (onnx_has_attr(c, "kernel_shape")) {
        if ((st = ints_attr(c, "kernel_shape", nd, sp->k, 1))) return st;
    } else if (kdims) {
        for (int i = 0; i < nd; i++) sp->k[i] = kdims[i];
    } else {
        return em_set_error(EM_ERR_INVALID, "kernel_shape attribute is required");
    }
    if ((st = ints_attr(c, "strides", nd, sp->s, 1))) return st;
    if ((st = ints_attr(c, "dilations", nd, sp->d, 1))) return st;
    for (int i = 0; i < nd; i++)
        if (sp->k[i] < 1 || sp->s[i] < 1 || sp->d[i] < 1)
            return em_set_error(EM_ERR_INVALID, "kernel_shape, strides and dilations must be >= 1");
    const char *ap = onnx_attr_string(c, "auto_pad", "NOTSET");
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
        bool upper = !strcmp(ap, "SAME_UPPER");
        for (int i = 0; i < nd; i++) {
            int64_t o = (sp->in[i] + sp->s[i] - 1) / sp->s[i];
            int64_t ek = sp->d[i] * (sp->k[i] - 1) + 1;
            int64_t tot = (o - 1) * sp->s[i] + ek - sp->in[i];
            if (tot < 0) tot = 0;
            sp->pb[i] = upper ? tot / 2 : tot - tot / 2;
            sp->pe[i] = tot - sp->pb[i];
        }
    } else if (!strcmp(ap, "VALID")) {
        for (int i = 0; i < nd; i++) sp->pb[i] = sp->pe[i] = 0;
    } else if (!strcmp(ap, "NOTSET")) {
        const int64_t *p;
        int n = onnx_attr_ints(c, "pads", &p);
        if (n >= 0 && n != 2 * nd) return em_set_error(EM_ERR_INVALID, "pads has %d values, expected %d", n, 2 * nd);
        for (int i = 0; i < nd; i++) {
            sp->pb[i] = n < 0 ? 0 : p[i];
            sp->pe[i] = n < 0 ? 0 : p[nd + i];
            if (sp->pb[i] < 0 || sp->pe[i] < 0) return em_set_error(EM_ERR_INVALID, "negative pads");
        }
    } else {
        return em_set_error(EM_ERR_INVALID, "unknown auto_pad '%s'", ap);
    }
    for (int i = 0; i < nd; i++) {
        int64_t span = sp->in[i] + sp->pb[i] + sp->pe[i] - sp->d[i] * (sp->k[i] - 1) - 1;
        if (span < 0) return em_set_error(EM_ERR_SHAPE, "kernel larger than the padded input along spatial dim %d", i);
        int64_t o = span / sp->s[i] + 1;
        if (ceil_mode && span % sp->s[i]) {
            o++;
            if ((o - 1) * sp->s[i] >= sp->in[i] + sp->pb[i]) o--;
        }
        sp->out[i] = o;
    }
    return EM_OK;
}

/* 1-D spatial data as 2-D (height 1): [N, C, L] -> [N, C, 1, L]. */
static em_tensor *as2d(const em_tensor *x, int nd)
{
    return nd == 1 ? em_unsqueeze(x, 2) : em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
}
static em_tensor *from2d(em_tensor *y, int nd)
{
    return nd == 1 ? em_squeeze(y, 2) : y;
}
/* (h, w) pair of a spatial setting in 2-D form. */
static void pair(const int64_t *v, int nd, int64_t one, int64_t out[2])
{
    if (nd == 1) { out[0] = one; out[1] = v[0]; }
    else { out[0] = v[0]; out[1] = v[1]; }
}

static bool is_float(em_dtype dt)
{
    return dt == EM_F32 || dt == EM_F64;
}

/* ---- Conv (1, 11, 22) ---- */

/* The convolution of float x and w (bias b or NULL) with the node's
 * attributes; NULL + error on failure. */
static em_tensor *conv_core(onnx_ctx *c, em_tensor *x, em_tensor *w, em_tensor *b)
{
    if (em_tensor_ndim(w) != em_tensor_ndim(x)) {
        em_set_error(EM_ERR_SHAPE, "W rank %d differs from X rank %d", em_tensor_ndim(w), em_tensor_ndim(x));
        return NULL;
    }
    spatial sp;
    int64_t kd[3] = {1, 1, 1};
    for (int i = 0; i + 2 < em_tensor_ndim(w) && i < 3; i++) kd[i] = em_tensor_dim(w, 2 + i);
    if (spatial_read(c, x, kd, false, &sp)) return NULL;
    for (int i = 0; i < sp.nd; i++)
        if (sp.k[i] != em_tensor_dim(w, 2 + i)) {
            em_set_error(EM_ERR_SHAPE, "kernel_shape differs from W's shape");
            return NULL;
        }
    em_conv_opts o = em_conv_opts_default();
    o.groups = onnx_attr_int(c, "group", 1);
    if (sp.nd == 3) {
        /* depth padded explicitly; one 2-D convolution per kernel depth of
         * the depth slabs it reads, summed */
        for (int i = 0; i < 2; i++) {
            o.stride[i] = sp.s[1 + i];
            o.dilation[i] = sp.d[1 + i];
            o.padding[i] = sp.pb[1 + i];
            o.padding_end[i] = sp.pe[1 + i];
        }
        int64_t pd[6] = {0, 0, 0, 0, sp.pb[0], sp.pe[0]};
        em_tensor *xp = em_pad(x, pd, 6, 0.0);
        int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), OD = sp.out[0];
        int64_t s4[4] = {N * OD, C, em_tensor_dim(x, 3), em_tensor_dim(x, 4)};
        int perm[5] = {0, 2, 1, 3, 4};
        em_tensor *acc = NULL;
        for (int64_t kd = 0; kd < sp.k[0]; kd++) {
            int64_t st = kd * sp.d[0];
            em_tensor *sl = em_slice(xp, 2, st, st + (OD - 1) * sp.s[0] + 1, sp.s[0]);
            sl = em_reshape(em_contiguous(em_permute(sl, perm, 5)), s4, 4);
            em_tensor *t = em_conv2d(sl, em_squeeze(em_narrow(w, 2, kd, 1), 2), NULL, &o);
            acc = acc ? em_add(acc, t) : t;
        }
        if (!acc) return NULL;
        int64_t s5[5] = {N, OD, em_tensor_dim(acc, 1), em_tensor_dim(acc, 2), em_tensor_dim(acc, 3)};
        em_tensor *y = em_permute(em_reshape(acc, s5, 5), perm, 5);
        return b ? em_add(y, per_channel(b, 5)) : y;
    }
    pair(sp.s, sp.nd, 1, o.stride);
    pair(sp.d, sp.nd, 1, o.dilation);
    pair(sp.pb, sp.nd, 0, o.padding);
    pair(sp.pe, sp.nd, 0, o.padding_end);
    return from2d(em_conv2d(as2d(x, sp.nd), as2d(w, sp.nd), b, &o), sp.nd);
}

static em_status op_conv(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *w = onnx_in_req(c, 1), *b = onnx_in(c, 2);
    if (!x || !w) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (dt == EM_F16 || dt == EM_BF16) {
        em_tensor *y = conv_core(c, em_cast(x, EM_F32), em_cast(w, EM_F32), b ? em_cast(b, EM_F32) : NULL);
        return onnx_out(c, 0, y ? em_cast(y, dt) : NULL, 0);
    }
    if (!is_float(dt)) return onnx_unsupported(c, "Conv on %s input", em_dtype_name(dt));
    return onnx_out(c, 0, conv_core(c, x, w, b), 0);
}

/* A zero point (scalar or per output channel [M]) shaped to broadcast
 * against a weight of rank r (or a scalar). */
static em_tensor *zero_point(em_tensor *zp, int r)
{
    if (!zp) return NULL;
    em_tensor *z = em_cast(zp, EM_F64);
    if (em_tensor_numel(zp) == 1) return em_reshape(z, NULL, 0);
    int64_t s[EM_MAX_DIMS];
    for (int i = 0; i < r; i++) s[i] = 1;
    s[0] = em_tensor_numel(zp);
    return em_reshape(z, s, r);
}

/* ConvInteger (10): (x - x_zero_point) conv (w - w_zero_point) in int32,
 * computed exactly in f64. */
static em_status op_convinteger(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *w = onnx_in_req(c, 1);
    if (!x || !w) return em_last_status();
    em_tensor *xf = em_cast(x, EM_F64), *wf = em_cast(w, EM_F64);
    em_tensor *xz = zero_point(onnx_in(c, 2), 0), *wz = zero_point(onnx_in(c, 3), em_tensor_ndim(w));
    if (onnx_in(c, 2) && em_tensor_numel(onnx_in(c, 2)) != 1) return onnx_unsupported(c, "per-channel x_zero_point");
    if (xz) xf = em_sub(xf, xz);
    if (wz) wf = em_sub(wf, wz);
    em_tensor *y = conv_core(c, xf, wf, NULL);
    return onnx_out(c, 0, y ? em_cast(em_round(y), EM_I32) : NULL, ONNX_INT32);
}

/* QLinearConv (10): dequantised convolution (int32 bias in x_scale *
 * w_scale units) requantised with y_scale / y_zero_point, rounded half to
 * even and saturated to y's type. */
static em_status op_qlinearconv(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *xs = onnx_in_req(c, 1), *w = onnx_in_req(c, 3), *ws = onnx_in_req(c, 4), *ys = onnx_in_req(c, 6);
    if (!x || !xs || !w || !ws || !ys) return em_last_status();
    int r = em_tensor_ndim(w);
    em_tensor *xf = em_cast(x, EM_F64), *wf = em_cast(w, EM_F64);
    if (onnx_in(c, 2) && em_tensor_numel(onnx_in(c, 2)) != 1) return onnx_unsupported(c, "per-channel x_zero_point");
    em_tensor *xz = zero_point(onnx_in(c, 2), 0), *wz = zero_point(onnx_in(c, 5), r);
    if (xz) xf = em_sub(xf, xz);
    if (wz) wf = em_sub(wf, wz);
    em_tensor *b = onnx_in(c, 8);
    em_tensor *y = conv_core(c, xf, wf, b ? em_cast(b, EM_F64) : NULL);
    if (!y) return em_last_status();
    /* y * x_scale * w_scale / y_scale (w_scale per output channel) */
    int yr = em_tensor_ndim(y);
    em_tensor *wsc = em_cast(ws, EM_F64);
    if (em_tensor_numel(ws) > 1) {
        int64_t s[EM_MAX_DIMS];
        for (int i = 0; i < yr; i++) s[i] = 1;
        s[1] = em_tensor_numel(ws);
        wsc = em_reshape(wsc, s, yr);
    } else {
        wsc = em_reshape(wsc, NULL, 0);
    }
    em_tensor *scale = em_div(em_mul(em_reshape(em_cast(xs, EM_F64), NULL, 0), wsc), em_reshape(em_cast(ys, EM_F64), NULL, 0));
    y = em_round(em_mul(y, scale));
    em_tensor *yz = onnx_in(c, 7);
    int yt = yz ? onnx_in_type(c, 7) : ONNX_UINT8;
    if (yz) y = em_add(y, em_reshape(em_cast(yz, EM_F64), NULL, 0));
    double lo = yt == ONNX_INT8 ? -128 : 0, hi = yt == ONNX_INT8 ? 127 : 255;
    if (yt != ONNX_INT8 && yt != ONNX_UINT8) return onnx_unsupported(c, "QLinearConv output type %d", yt);
    em_dtype od;
    if (!onnx_type_to_dtype(yt, &od)) return onnx_unsupported(c, "QLinearConv output type %d", yt);
    return onnx_out(c, 0, em_cast(em_clamp(y, lo, hi), od), yt);
}

/* ---- MaxUnpool (9, 11, 22): X's values scattered at the flat indices I
 * into zeros of the output shape (output_shape input, else
 * (in - 1) * stride + kernel - pads). */
static em_status op_maxunpool(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *ind = onnx_in_req(c, 1);
    if (!x || !ind) return em_last_status();
    int r = em_tensor_ndim(x), nd = r - 2;
    if (nd < 1 || nd > 3) return em_set_error(EM_ERR_SHAPE, "X must be [N, C, spatial...] with 1 to 3 spatial dims, got rank %d", r);
    int64_t os[EM_MAX_DIMS], is[EM_MAX_DIMS];
    {
        int64_t k[3], s[3], p[6];
        em_status st;
        if ((st = ints_attr(c, "kernel_shape", nd, k, 1)) || (st = ints_attr(c, "strides", nd, s, 1)) || (st = ints_attr(c, "pads", 2 * nd, p, 0)))
            return st;
        if (!onnx_has_attr(c, "kernel_shape")) return em_set_error(EM_ERR_INVALID, "kernel_shape attribute is required");
        is[0] = em_tensor_dim(x, 0);
        is[1] = em_tensor_dim(x, 1);
        for (int i = 0; i < nd; i++) is[2 + i] = (em_tensor_dim(x, 2 + i) - 1) * s[i] + k[i] - p[i] - p[nd + i];
    }
    if (onnx_in(c, 2)) {
        int n = onnx_in_ints(c, 2, os, EM_MAX_DIMS);
        if (n < 0) return em_last_status();
        if (n != r) return em_set_error(EM_ERR_INVALID, "output_shape has %d values for rank %d", n, r);
        if (os[0] != is[0] || os[1] != is[1]) return em_set_error(EM_ERR_SHAPE, "output_shape's N and C differ from X's");
    } else {
        memcpy(os, is, sizeof is);
    }
    /* scattered into the inferred shape, then zero-extended (or cropped) at
     * the end of each spatial dim to output_shape */
    int64_t total = 1;
    for (int i = 0; i < r; i++) total *= is[i];
    int64_t nx = em_tensor_numel(x);
    em_tensor *flat = em_zeros(&total, 1, em_tensor_dtype(x));
    em_tensor *y = em_reshape(em_scatter(flat, 0, em_reshape(em_cast(ind, EM_I64), &nx, 1), em_reshape(x, &nx, 1)), is, r);
    int64_t pads[6] = {0, 0, 0, 0, 0, 0};
    for (int i = 0; i < nd; i++) pads[2 * (nd - 1 - i) + 1] = os[2 + i] - is[2 + i];
    return onnx_out(c, 0, em_pad(y, pads, 2 * nd, 0.0), 0);
}

/* ---- Col2Im (18): a grouped transposed convolution of the columns with
 * one-hot kernels (one per block position), cropped by the pads. 1-D and
 * 2-D images. */
static em_status op_col2im(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t img[4], blk[4];
    int ni = onnx_in_ints(c, 1, img, 4), nb = onnx_in_ints(c, 2, blk, 4);
    if (ni < 0 || nb < 0) return em_last_status();
    if (ni != nb || ni < 1) return em_set_error(EM_ERR_INVALID, "image_shape (%d values) and block_shape (%d) differ", ni, nb);
    if (ni > 3) return onnx_unsupported(c, "Col2Im of a %d-D image", ni);
    if (em_tensor_ndim(x) != 3) return em_set_error(EM_ERR_SHAPE, "input must be [N, C * prod(block_shape), L], got rank %d", em_tensor_ndim(x));
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt)) return onnx_unsupported(c, "Col2Im of %s input", em_dtype_name(dt));
    int nd = ni;
    int64_t s[3], d[3], p[6];
    em_status st;
    if ((st = ints_attr(c, "strides", nd, s, 1)) || (st = ints_attr(c, "dilations", nd, d, 1)) || (st = ints_attr(c, "pads", 2 * nd, p, 0)))
        return st;
    for (int i = 0; i < nd; i++)
        if (img[i] < 1 || blk[i] < 1 || s[i] < 1 || d[i] < 1 || p[i] < 0 || p[nd + i] < 0)
            return em_set_error(EM_ERR_INVALID, "image_shape, block_shape, strides and dilations must be >= 1 and pads >= 0 (dim %d: "
                                "image %lld, block %lld, stride %lld, dilation %lld)", i, (long long)img[i], (long long)blk[i],
                                (long long)s[i], (long long)d[i]);
    int64_t K = 1, L = 1, ol[3];
    for (int i = 0; i < nd; i++) {
        K *= blk[i];
        int64_t span = img[i] + p[i] + p[nd + i] - d[i] * (blk[i] - 1) - 1;
        if (span < 0) return em_set_error(EM_ERR_SHAPE, "block larger than the padded image");
        ol[i] = span / s[i] + 1;
        L *= ol[i];
    }
    int64_t N = em_tensor_dim(x, 0), CK = em_tensor_dim(x, 1);
    if (CK % K || em_tensor_dim(x, 2) != L)
        return em_set_error(EM_ERR_SHAPE, "input [%lld, %lld, %lld] does not match %lld blocks of %lld", (long long)N, (long long)CK,
                            (long long)em_tensor_dim(x, 2), (long long)L, (long long)K);
    int64_t C = CK / K;
    /* one-hot kernels: weight [C * K, 1, block...], channel c * K + k has a 1 at block position k */
    int64_t xs[5] = {N, CK, 1, 1, 1}, wsh[6] = {C, K, 1, 1, 1, 1}, w5[5] = {CK, 1, 1, 1, 1};
    for (int i = 0; i < nd; i++) {
        xs[2 + i] = ol[i];
        wsh[3 + i] = blk[i];
        w5[2 + i] = blk[i];
    }
    em_tensor *eye = em_reshape(em_eye(K, K, dt), wsh + 1, 2 + nd);
    em_tensor *w = em_reshape(em_contiguous(em_expand(em_unsqueeze(eye, 0), wsh, 3 + nd)), w5, 2 + nd);
    em_tensor *y = convT_full(em_reshape(x, xs, 2 + nd), w, nd, s, d, C);
    if (!y) return em_last_status();
    int64_t pads[6] = {0, 0, 0, 0, 0, 0};
    for (int i = 0; i < nd; i++) {
        int j = nd - 1 - i;
        pads[2 * j] = -p[i];
        int64_t full = (ol[i] - 1) * s[i] + d[i] * (blk[i] - 1) + 1;
        pads[2 * j + 1] = img[i] - (full - p[i]);
    }
    return onnx_out(c, 0, em_pad(y, pads, 2 * nd, 0.0), 0);
}

/* Full-size (unpadded) transposed convolution of x [N, C, spatial (nd)]
 * with w [C, M / groups, k...]: 1-D and 2-D directly, 3-D as one 2-D
 * transposed convolution per kernel depth, each placed at depth
 * i * stride + kd * dilation (zeros inserted between input depths). */
static em_tensor *convT_full(const em_tensor *x, const em_tensor *w, int nd, const int64_t *s, const int64_t *d, int64_t groups)
{
    em_conv_opts o = em_conv_opts_default();
    o.groups = groups;
    if (nd <= 2) {
        pair(s, nd, 1, o.stride);
        pair(d, nd, 1, o.dilation);
        return from2d(em_conv_transpose2d(as2d(x, nd), as2d(w, nd), NULL, &o), nd);
    }
    o.stride[0] = s[1];
    o.stride[1] = s[2];
    o.dilation[0] = d[1];
    o.dilation[1] = d[2];
    int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), D = em_tensor_dim(x, 2), H = em_tensor_dim(x, 3), W = em_tensor_dim(x, 4);
    int64_t k0 = em_tensor_dim(w, 2), fullD = (D - 1) * s[0] + d[0] * (k0 - 1) + 1, span = (D - 1) * s[0] + 1;
    int perm[5] = {0, 2, 1, 3, 4};
    int64_t x4[4] = {N * D, C, H, W};
    em_tensor *x2 = em_reshape(em_contiguous(em_permute(x, perm, 5)), x4, 4);
    em_tensor *acc = NULL;
    for (int64_t kd = 0; kd < k0; kd++) {
        em_tensor *t = em_conv_transpose2d(x2, em_squeeze(em_narrow(w, 2, kd, 1), 2), NULL, &o);
        if (!t) return NULL;
        int64_t M = em_tensor_dim(t, 1), OH = em_tensor_dim(t, 2), OW = em_tensor_dim(t, 3);
        int64_t s6[6] = {N, D, 1, M, OH, OW}, s5[5] = {N, D * s[0], M, OH, OW};
        int64_t p6[8] = {0, 0, 0, 0, 0, 0, 0, s[0] - 1};
        t = em_narrow(em_reshape(em_pad(em_reshape(t, s6, 6), p6, 8, 0.0), s5, 5), 1, 0, span);
        int64_t p5[8] = {0, 0, 0, 0, 0, 0, kd * d[0], fullD - span - kd * d[0]};
        t = em_pad(t, p5, 8, 0.0);
        acc = acc ? em_add(acc, t) : t;
    }
    return em_permute(acc, perm, 5);
}

/* ---- ConvTranspose (1, 11, 22) ----
 * Computed unpadded (full size (in - 1) * s + d * (k - 1) + 1), then the
 * begin pads cropped and the end pads cropped or, for output_padding /
 * output_shape, extended with zeros (no input reaches there), then the bias. */
static em_status op_conv_transpose(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *w = onnx_in_req(c, 1), *b = onnx_in(c, 2);
    if (!x || !w) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (dt == EM_F16 || dt == EM_BF16) {
        x = em_cast(x, EM_F32);
        w = em_cast(w, EM_F32);
        if (b) b = em_cast(b, EM_F32);
    } else if (!is_float(dt)) {
        return onnx_unsupported(c, "ConvTranspose on %s input", em_dtype_name(dt));
    }
    int nd = 0;
    em_status st = spatial_rank(c, x, &nd, 3);
    if (st) return st;
    if (em_tensor_ndim(w) != nd + 2) return em_set_error(EM_ERR_SHAPE, "W rank %d differs from X rank %d", em_tensor_ndim(w), nd + 2);
    int64_t in[3], k[3], s[3], d[3], op[3], pb[3], pe[3], full[3];
    for (int i = 0; i < nd; i++) { in[i] = em_tensor_dim(x, 2 + i); k[i] = em_tensor_dim(w, 2 + i); }
    if ((st = ints_attr(c, "strides", nd, s, 1)) || (st = ints_attr(c, "dilations", nd, d, 1)) ||
        (st = ints_attr(c, "output_padding", nd, op, 0)))
        return st;
    int64_t os[3];
    bool has_os = false;
    {
        const int64_t *v;
        int n = onnx_attr_ints(c, "output_shape", &v);
        if (n >= 0) {
            if (n != nd && n != nd + 2) return em_set_error(EM_ERR_INVALID, "output_shape has %d values", n);
            for (int i = 0; i < nd; i++) os[i] = v[n - nd + i];
            has_os = true;
        }
    }
    for (int i = 0; i < nd; i++) full[i] = (in[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1;
    const char *ap = onnx_attr_string(c, "auto_pad", "NOTSET");
    bool same = !strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER");
    const int64_t *p;
    int np = onnx_attr_ints(c, "pads", &p);
    if (np >= 0 && np != 2 * nd) return em_set_error(EM_ERR_INVALID, "pads has %d values, expected %d", np, 2 * nd);
    for (int i = 0; i < nd; i++) {
        if (same && np < 0) {
            int64_t target = has_os ? os[i] : in[i] * s[i];
            int64_t tot = full[i] + op[i] - target;
            pb[i] = !strcmp(ap, "SAME_UPPER") ? tot / 2 : tot - tot / 2;
            pe[i] = tot - pb[i];
        } else if (has_os && np < 0) {
            pb[i] = 0;
            pe[i] = full[i] + op[i] - os[i];
        } else {
            pb[i] = np < 0 ? 0 : p[i];
            pe[i] = np < 0 ? 0 : p[nd + i];
        }
    }
    em_tensor *y = convT_full(x, w, nd, s, d, onnx_attr_int(c, "group", 1));
    if (!y) return em_last_status();
    int64_t pads[6] = {0, 0, 0, 0, 0, 0};
    /* em_pad order: last dim first */
    for (int i = 0; i < nd; i++) {
        int j = nd - 1 - i;
        pads[2 * j] = -pb[i];
        pads[2 * j + 1] = op[i] - pe[i];
    }
    y = em_pad(y, pads, 2 * nd, 0.0);
    if (b && y) y = em_add(y, per_channel(b, nd + 2));
    return onnx_out(c, 0, em_cast(y, dt), 0);
}

/* ---- pools ----
 * The input is padded explicitly (the pads plus the ceil_mode extension:
 * -inf for max, 0 for sums), then reduced without padding. A 3-D pool
 * reduces depth first (max / sum of the kernel's depth slabs, which is
 * separable), then runs the 2-D pool on [N, C * oD, H, W]. */

/* em_pad pads (last dim first, 2 * nd values): all = explicit pads plus
 * the end extension that makes the padded length what the windows span;
 * expl = the explicit pads only (cropped to that length). */
static void pool_pads(const spatial *sp, int64_t all[6], int64_t expl[6])
{
    for (int i = 0; i < 6; i++) all[i] = expl[i] = 0;
    for (int i = 0; i < sp->nd; i++) {
        int j = sp->nd - 1 - i;
        int64_t need = (sp->out[i] - 1) * sp->s[i] + sp->d[i] * (sp->k[i] - 1) + 1;
        all[2 * j] = sp->pb[i];
        all[2 * j + 1] = need - sp->in[i] - sp->pb[i];
        expl[2 * j] = sp->pb[i];
        expl[2 * j + 1] = sp->pe[i] < all[2 * j + 1] ? sp->pe[i] : all[2 * j + 1];
    }
}

/* Max (is_max) or window sum of the padded xp [N, C, spatial...] ->
 * [N, C, out...]; indices (2-D form, padded plane) for max when asked. */
static em_tensor *pool_apply(const em_tensor *xp, const spatial *sp, bool is_max, em_tensor **idx, em_tensor **depth_idx)
{
    int nd = sp->nd, o0 = nd == 3 ? 1 : 0;
    int64_t N = em_tensor_dim(xp, 0), C = em_tensor_dim(xp, 1);
    em_tensor *t, *best = NULL;
    if (nd == 3) {
        em_tensor *acc = NULL;
        for (int64_t kd = 0; kd < sp->k[0]; kd++) {
            int64_t st = kd * sp->d[0];
            em_tensor *sl = em_slice(xp, 2, st, st + (sp->out[0] - 1) * sp->s[0] + 1, sp->s[0]);
            if (depth_idx && acc) best = em_where(em_gt(sl, acc), em_full_like(best, (double)kd), best);
            else if (depth_idx) best = em_zeros(em_tensor_shape(sl), 5, EM_I64);
            acc = acc ? (is_max ? em_maximum(acc, sl) : em_add(acc, sl)) : sl;
        }
        int64_t s4[4] = {N, C * sp->out[0], em_tensor_dim(xp, 3), em_tensor_dim(xp, 4)};
        t = em_reshape(acc, s4, 4);
    } else {
        t = as2d(xp, nd);
    }
    int64_t k2[2], s2[2], d2[2];
    pair(sp->k + o0, nd - o0, 1, k2);
    pair(sp->s + o0, nd - o0, 1, s2);
    pair(sp->d + o0, nd - o0, 1, d2);
    em_tensor *y;
    if (is_max) {
        em_pool_opts o = em_pool_opts_default(k2[0], k2[1]);
        memcpy(o.stride, s2, sizeof s2);
        memcpy(o.dilation, d2, sizeof d2);
        y = em_max_pool2d(t, &o, idx);
    } else {
        int64_t ws[4] = {em_tensor_dim(t, 1), 1, k2[0], k2[1]};
        em_conv_opts o = em_conv_opts_default();
        memcpy(o.stride, s2, sizeof s2);
        memcpy(o.dilation, d2, sizeof d2);
        o.groups = ws[0];
        y = em_conv2d(t, em_ones(ws, 4, em_tensor_dtype(t)), NULL, &o);
    }
    if (nd == 3) {
        int64_t s5[5] = {N, C, sp->out[0], sp->out[1], sp->out[2]};
        if (depth_idx && idx && *idx && best) {
            /* the kernel depth of each maximum, at the plane position the
             * 2-D pool chose, as an input depth */
            int64_t P = em_tensor_dim(xp, 3) * em_tensor_dim(xp, 4), s3[3] = {N, C * sp->out[0], P};
            int64_t q3[3] = {N, C * sp->out[0], sp->out[1] * sp->out[2]}, od[5] = {1, 1, sp->out[0], 1, 1};
            em_tensor *kd = em_reshape(em_gather(em_reshape(best, s3, 3), 2, em_reshape(*idx, q3, 3)), s5, 5);
            em_tensor *dz = em_reshape(em_mul_scalar(em_arange(0, (double)sp->out[0], 1, EM_I64), (double)sp->s[0]), od, 5);
            *depth_idx = em_sub_scalar(em_add(dz, em_mul_scalar(kd, (double)sp->d[0])), (double)sp->pb[0]);
            *idx = em_reshape(*idx, s5, 5);
        }
        return em_reshape(y, s5, 5);
    }
    return from2d(y, nd);
}

static em_status pool_read(onnx_ctx *c, const em_tensor *x, spatial *sp)
{
    return spatial_read(c, x, NULL, onnx_attr_int(c, "ceil_mode", 0) != 0, sp);
}

static em_status op_maxpool(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    spatial sp;
    em_status st = pool_read(c, x, &sp);
    if (st) return st;
    em_dtype dt = em_tensor_dtype(x);
    em_tensor *xf = x;
    if (!is_float(dt)) {
        if (dt == EM_I64) return onnx_unsupported(c, "MaxPool on int64 input");
        xf = em_cast(x, EM_F64);
    }
    bool want_idx = c->nout > 1 && c->node->out[1] >= 0;
    int64_t so = onnx_attr_int(c, "storage_order", 0);
    int64_t pads[6], pe[6];
    pool_pads(&sp, pads, pe);
    em_tensor *xp = em_pad(xf, pads, 2 * sp.nd, -INFINITY);
    em_tensor *idx = NULL, *didx = NULL;
    em_tensor *y = pool_apply(xp, &sp, true, want_idx ? &idx : NULL, want_idx ? &didx : NULL);
    if (!y) return em_last_status();
    if (xf != x) y = em_cast(y, dt);
    st = onnx_out(c, 0, y, 0);
    if (st || !want_idx) return st;
    /* padded-plane flat index -> ONNX's index into the whole input */
    int64_t Wp = em_tensor_dim(xp, -1), H = sp.nd == 1 ? 1 : sp.in[sp.nd - 2], W = sp.in[sp.nd - 1];
    int64_t ph = sp.nd == 1 ? 0 : sp.pb[sp.nd - 2], pw = sp.pb[sp.nd - 1];
    em_tensor *wp = em_scalar((double)Wp, EM_I64);
    em_tensor *hh = em_sub_scalar(em_floor_divide(idx, wp), (double)ph);
    em_tensor *ww = em_sub_scalar(em_remainder(idx, wp), (double)pw);
    int64_t D = sp.nd == 3 ? sp.in[0] : 1;
    em_tensor *pl;
    if (sp.nd == 3)
        pl = so ? em_add(em_add(didx, em_mul_scalar(hh, (double)D)), em_mul_scalar(ww, (double)(D * H)))
                : em_add(em_add(em_mul_scalar(didx, (double)(H * W)), em_mul_scalar(hh, (double)W)), ww);
    else
        pl = so ? em_add(em_mul_scalar(ww, (double)H), hh) : em_add(em_mul_scalar(hh, (double)W), ww);
    int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1);
    int64_t bs[5] = {N, C, 1, 1, 1};
    em_tensor *base = em_mul_scalar(em_reshape(em_arange(0, (double)(N * C), 1, EM_I64), bs, sp.nd == 3 ? 5 : 4), (double)(D * H * W));
    return onnx_out(c, 1, from2d(em_add(pl, base), sp.nd), ONNX_INT64);
}

/* AveragePool (count_include_pad) and LpPool (p): window sums over a
 * zero-padded input, divided by the count of the cells that count. */
static em_status avg_or_lp(onnx_ctx *c, bool lp)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    em_dtype dt = em_tensor_dtype(x);
    if (dt == EM_F16 || dt == EM_BF16) x = em_cast(x, EM_F32);
    else if (!is_float(dt)) return onnx_unsupported(c, "pooling of %s input", em_dtype_name(dt));
    spatial sp;
    em_status st = pool_read(c, x, &sp);
    if (st) return st;
    int64_t pads[6], pe[6];
    int np = 2 * sp.nd;
    pool_pads(&sp, pads, pe);
    double p = lp ? (double)onnx_attr_int(c, "p", 2) : 1.0;
    em_tensor *x2 = x;
    if (lp) x2 = p == 1.0 ? em_abs(x) : p == 2.0 ? em_square(x) : em_pow_scalar(em_abs(x), p);
    em_tensor *sum = pool_apply(em_pad(x2, pads, np, 0.0), &sp, false, NULL, NULL);
    em_tensor *y;
    if (lp) {
        y = p == 1.0 ? sum : p == 2.0 ? em_sqrt(sum) : em_pow_scalar(sum, 1.0 / p);
    } else {
        int64_t ms[5] = {1, 1, 1, 1, 1};
        for (int i = 0; i < sp.nd; i++) ms[2 + i] = sp.in[i];
        em_tensor *m = em_ones(ms, 2 + sp.nd, em_tensor_dtype(x));
        if (onnx_attr_int(c, "count_include_pad", 0)) {
            m = em_pad(m, pe, np, 1.0);
            int64_t rest[6];
            for (int i = 0; i < 6; i++) rest[i] = pads[i] - pe[i];
            m = em_pad(m, rest, np, 0.0);
        } else {
            m = em_pad(m, pads, np, 0.0);
        }
        y = em_div(sum, pool_apply(m, &sp, false, NULL, NULL));
    }
    return onnx_out(c, 0, em_cast(y, dt), 0);
}
static em_status op_avgpool(onnx_ctx *c) { return avg_or_lp(c, false); }
static em_status op_lppool(onnx_ctx *c) { return avg_or_lp(c, true); }

static em_status global_pool(onnx_ctx *c, int kind)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 3) return em_set_error(EM_ERR_SHAPE, "input must be [N, C, spatial...], got rank %d", r);
    int dims[EM_MAX_DIMS];
    for (int i = 2; i < r; i++) dims[i - 2] = i;
    em_tensor *y;
    if (kind == 0) y = em_mean(x, dims, r - 2, true);
    else if (kind == 1) y = em_max(x, dims, r - 2, true);
    else {
        double p = (double)onnx_attr_int(c, "p", 2);
        y = em_pow_scalar(em_sum(em_pow_scalar(em_abs(x), p), dims, r - 2, true), 1.0 / p);
    }
    return onnx_out(c, 0, y, 0);
}
static em_status op_global_avg(onnx_ctx *c) { return global_pool(c, 0); }
static em_status op_global_max(onnx_ctx *c) { return global_pool(c, 1); }
static em_status op_global_lp(onnx_ctx *c) { return global_pool(c, 2); }


/* ---- Resize (10, 11, 13, 18, 19) and Upsample (7, 9) ----
 * Separable, one axis at a time: for each output position the source
 * coordinate x_ori (coordinate_transformation_mode) and n taps around it
 * with the mode's coefficients (nearest / linear / cubic, antialias
 * widening the kernel by 1 / scale when downsampling, exclude_outside
 * renormalising, indices clamped to the edge) are computed on the host
 * from the sizes and attributes alone (never from X's values); the axis is
 * then sum_j w_j * index_select(X, idx_j) (nearest: one gather, any
 * dtype). tf_crop_and_resize positions outside the input take
 * extrapolation_value. */

typedef struct resize_cfg {
    int mode;            /* 0 nearest, 1 linear, 2 cubic */
    int nearest;         /* 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil */
    int ctm;             /* 0 half_pixel, 1 half_pixel_symmetric, 2 pytorch_half_pixel, 3 align_corners, 4 asymmetric, 5 tf_crop_and_resize */
    double a;            /* cubic_coeff_a */
    bool exclude_outside, antialias;
    double extrapolation;
} resize_cfg;

static double cubic_w(double x, double A)
{
    x = fabs(x);
    if (x <= 1) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0.0;
}

/* Coefficients for fractional position r (in (0, 1], 1 when integral) at
 * scale sc into co; returns the tap count. */
static int resize_coeffs(const resize_cfg *g, double r, double sc, double *co, int max)
{
    if (g->mode == 0) {
        bool hi;
        if (r == 1.0) hi = true;
        else if (g->nearest == 0) hi = r > 0.5;
        else if (g->nearest == 1) hi = r >= 0.5;
        else hi = g->nearest == 3;
        co[0] = hi ? 0 : 1;
        co[1] = hi ? 1 : 0;
        return 2;
    }
    if (!g->antialias || sc >= 1.0) {
        if (g->mode == 1) {
            co[0] = 1 - r;
            co[1] = r;
            return 2;
        }
        co[0] = cubic_w(r + 1, g->a);
        co[1] = cubic_w(r, g->a);
        co[2] = cubic_w(1 - r, g->a);
        co[3] = cubic_w(2 - r, g->a);
        return 4;
    }
    int start = (int)floor((g->mode == 1 ? -1.0 : -2.0) / sc) + 1;
    int n = 2 - 2 * start;
    if (n > max) return -1;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double x = sc * (start + i - r);
        co[i] = g->mode == 1 ? fmax(0.0, fmin(1.0, 1 - fabs(x))) : cubic_w(x, g->a);
        sum += co[i];
    }
    for (int i = 0; i < n; i++) co[i] /= sum;
    return n;
}

#define RESIZE_MAX_TAPS 256

/* Resizes dim @p ax of x to @p O with scale @p sc (roi r0..r1 for
 * tf_crop_and_resize): per tap j, the source index and weight of every
 * output position (computed on the host from the sizes and attributes
 * only), then out = sum_j w_j * index_select(x, ax, idx_j); nearest reads
 * one tap. */
static em_tensor *resize_axis(onnx_ctx *c, em_tensor *x, int ax, int64_t O, double sc, double r0, double r1, const resize_cfg *g)
{
    int64_t I = em_tensor_dim(x, ax);
    if (O < 1 || I < 1) {
        em_set_error(EM_ERR_SHAPE, "empty input or output along axis %d", ax);
        return NULL;
    }
    em_dtype dt = em_tensor_dtype(x);
    double co[RESIZE_MAX_TAPS];
    int n = resize_coeffs(g, 0.5, sc, co, RESIZE_MAX_TAPS);
    if (n < 0) {
        onnx_unsupported(c, "antialias kernel wider than %d taps", RESIZE_MAX_TAPS);
        return NULL;
    }
    int nt = g->mode == 0 ? 1 : n;
    int64_t *idx = calloc((size_t)(nt * O), sizeof(int64_t));
    double *wt = calloc((size_t)(nt * O), sizeof(double));
    double *mask = calloc((size_t)O, sizeof(double));
    if (!idx || !wt || !mask) {
        free(idx);
        free(wt);
        free(mask);
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    bool any_extra = false;
    double ow = sc * (double)I;
    for (int64_t y = 0; y < O; y++) {
        double xo, yd = (double)y;
        switch (g->ctm) {
        case 3: xo = ow == 1 ? 0.0 : yd * (double)(I - 1) / (ow - 1); break;
        case 4: xo = yd / sc; break;
        case 5:
            xo = ow == 1 ? (r1 - r0) * (double)(I - 1) / 2 : yd * (r1 - r0) * (double)(I - 1) / (ow - 1);
            xo += r0 * (double)(I - 1);
            break;
        case 2: xo = ow == 1 ? -0.5 : (yd + 0.5) / sc - 0.5; break;
        case 1: {
            double adj = (double)O / ow, center = (double)I / 2;
            xo = center * (1 - adj) + (yd + 0.5) / sc - 0.5;
            break;
        }
        default: xo = (yd + 0.5) / sc - 0.5; break;
        }
        if (g->ctm == 5 && (xo < 0 || xo > (double)(I - 1))) {
            mask[y] = 1;
            any_extra = true;
            continue; /* weights 0, index 0 */
        }
        double fl = floor(xo);
        double r = xo == fl ? 1.0 : xo - fl;
        resize_coeffs(g, r, sc, co, RESIZE_MAX_TAPS);
        int pw = (n + 1) / 2;
        double xp = xo + pw, pp = floor(xp), frac = xp - pp;
        int64_t off;
        if (n % 2 == 0) off = frac == 0 ? -(n / 2) : -(n / 2) + 1;
        else off = frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1;
        int64_t start = (int64_t)pp + off - pw;
        if (g->exclude_outside) {
            double sum = 0;
            for (int j = 0; j < n; j++) {
                int64_t id = start + j;
                if (id < 0 || id >= I) co[j] = 0;
                sum += co[j];
            }
            if (sum != 0)
                for (int j = 0; j < n; j++) co[j] /= sum;
        }
        for (int j = 0, t = 0; j < n; j++) {
            int64_t id = start + j;
            if (id < 0) id = 0;
            if (id >= I) id = I - 1;
            if (g->mode == 0) {
                if (co[j] == 1.0) {
                    idx[y] = id;
                    wt[y] = 1.0;
                }
                continue;
            }
            idx[t * O + y] = id;
            wt[t * O + y] = co[j];
            t++;
        }
    }
    int r = em_tensor_ndim(x);
    int64_t bs[EM_MAX_DIMS];
    for (int i = 0; i < r; i++) bs[i] = i == ax ? O : 1;
    em_tensor *out = NULL;
    for (int j = 0; j < nt; j++) {
        em_tensor *g1 = em_index_select(x, ax, em_from_host(idx + j * O, &O, 1, EM_I64));
        if (g->mode != 0) g1 = em_mul(g1, em_cast(em_from_host(wt + j * O, bs, r, EM_F64), dt));
        out = out ? em_add(out, g1) : g1;
    }
    if (any_extra && out) {
        em_tensor *mk = em_gt_scalar(em_from_host(mask, bs, r, EM_F64), 0.5);
        out = em_where(mk, em_full(bs, r, dt, g->extrapolation), out);
    }
    free(idx);
    free(wt);
    free(mask);
    return out;
}

/* Reads a small float input to the host (n values at most). */
static int in_floats(onnx_ctx *c, int i, double *buf, int max)
{
    em_tensor *t = onnx_in(c, i);
    if (!t) return 0;
    int64_t n = em_tensor_numel(t);
    if (n > max) return em_set_error(EM_ERR_INVALID, "input %d has %lld values, at most %d expected", i, (long long)n, max);
    if (n == 0) return 0;
    em_status st = em_to_host(em_cast(t, EM_F64), buf, (size_t)n * sizeof(double));
    return st ? st : (int)n;
}

static int lookup(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static em_status resize_run(onnx_ctx *c, em_tensor *x, const double *scales_in, int nscales, const int64_t *sizes_in, int nsizes,
                            const double *roi_in, int nroi, const resize_cfg *g)
{
    int r = em_tensor_dtype(x) == EM_BOOL ? -1 : em_tensor_ndim(x);
    if (r < 0) return onnx_unsupported(c, "Resize of bool input");
    em_dtype dt = em_tensor_dtype(x);
    bool integer = !is_float(dt) && dt != EM_F16 && dt != EM_BF16;
    /* integers: nearest gathers them as they are; linear / cubic compute in
     * f64 and round half to even, saturated to the type (as the spec's
     * reference does) */
    if (integer && g->mode != 0) x = em_cast(x, EM_F64);
    int axes[EM_MAX_DIMS], na = r;
    for (int i = 0; i < r; i++) axes[i] = i;
    const int64_t *av;
    int n = onnx_attr_ints(c, "axes", &av);
    if (n >= 0) {
        if (n > r) return em_set_error(EM_ERR_INVALID, "axes has %d values for rank %d", n, r);
        na = n;
        for (int i = 0; i < n; i++) {
            em_status st = onnx_axis(c, av[i], r, &axes[i]);
            if (st) return st;
        }
    }
    double sc[EM_MAX_DIMS], roi0[EM_MAX_DIMS], roi1[EM_MAX_DIMS];
    int64_t os[EM_MAX_DIMS];
    for (int i = 0; i < r; i++) {
        sc[i] = 1.0;
        os[i] = em_tensor_dim(x, i);
        roi0[i] = 0.0;
        roi1[i] = 1.0;
    }
    if (nroi > 0) {
        if (nroi != 2 * na) return em_set_error(EM_ERR_INVALID, "roi has %d values, expected %d", nroi, 2 * na);
        for (int i = 0; i < na; i++) {
            roi0[axes[i]] = roi_in[i];
            roi1[axes[i]] = roi_in[na + i];
        }
    }
    if (nsizes > 0) {
        if (nsizes != na) return em_set_error(EM_ERR_INVALID, "sizes has %d values, expected %d", nsizes, na);
        for (int i = 0; i < na; i++) {
            os[axes[i]] = sizes_in[i];
            sc[axes[i]] = (double)sizes_in[i] / (double)em_tensor_dim(x, axes[i]);
        }
        const char *pol = onnx_attr_string(c, "keep_aspect_ratio_policy", "stretch");
        if (strcmp(pol, "stretch")) {
            bool nl = !strcmp(pol, "not_larger");
            if (!nl && strcmp(pol, "not_smaller")) return em_set_error(EM_ERR_INVALID, "unknown keep_aspect_ratio_policy '%s'", pol);
            double s = sc[axes[0]];
            for (int i = 1; i < na; i++) s = nl ? fmin(s, sc[axes[i]]) : fmax(s, sc[axes[i]]);
            for (int i = 0; i < na; i++) {
                sc[axes[i]] = s;
                os[axes[i]] = (int64_t)(s * (double)em_tensor_dim(x, axes[i]) + 0.5);
            }
        }
    } else if (nscales > 0) {
        if (nscales != na) return em_set_error(EM_ERR_INVALID, "scales has %d values, expected %d", nscales, na);
        for (int i = 0; i < na; i++) {
            if (!(scales_in[i] > 0)) return em_set_error(EM_ERR_INVALID, "scales must be positive");
            sc[axes[i]] = scales_in[i];
            os[axes[i]] = (int64_t)(scales_in[i] * (double)em_tensor_dim(x, axes[i]));
        }
    } else {
        return em_set_error(EM_ERR_INVALID, "one of scales and sizes is required");
    }
    em_tensor *y = x;
    for (int i = 0; i < na && y; i++) {
        int d = axes[i];
        if (fabs(sc[d] - 1.0) < 1e-9 && os[d] == em_tensor_dim(y, d) && (g->ctm != 5 || (roi0[d] == 0.0 && roi1[d] == 1.0)))
            continue;
        y = resize_axis(c, y, d, os[d], sc[d], roi0[d], roi1[d], g);
    }
    if (y == x) y = em_reshape(x, em_tensor_shape(x), r);
    if (integer && g->mode != 0 && y) {
        double lo, hi;
        /* int64's top is the largest double below 2^63 (a cast of 2^63 overflows) */
        if (!onnx_int_range(onnx_in_type(c, 0), &lo, &hi) || onnx_in_type(c, 0) == ONNX_INT64)
            lo = -9223372036854775808.0, hi = 9223372036854774784.0;
        y = em_cast(em_clamp(em_round(y), lo, hi), dt);
    }
    return onnx_out(c, 0, y, 0);
}

static em_status op_resize(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    static const char *const modes[] = {"nearest", "linear", "cubic"};
    static const char *const nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    static const char *const ctms[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"};
    resize_cfg g;
    const char *s = onnx_attr_string(c, "mode", "nearest");
    if ((g.mode = lookup(s, modes, 3)) < 0) return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", s);
    double roi[2 * EM_MAX_DIMS], scales[EM_MAX_DIMS];
    int64_t sizes[EM_MAX_DIMS];
    int nroi = 0, ns = 0, nz = 0;
    if (c->opset < 11) {
        if (g.mode == 2) return em_set_error(EM_ERR_INVALID, "mode cubic before opset 11");
        g.nearest = 2;
        g.ctm = 4;
        g.a = -0.75;
        g.exclude_outside = g.antialias = false;
        g.extrapolation = 0;
        if ((ns = in_floats(c, 1, scales, EM_MAX_DIMS)) < 0) return em_last_status();
    } else {
        s = onnx_attr_string(c, "nearest_mode", "round_prefer_floor");
        if ((g.nearest = lookup(s, nms, 4)) < 0) return em_set_error(EM_ERR_INVALID, "unknown nearest_mode '%s'", s);
        s = onnx_attr_string(c, "coordinate_transformation_mode", "half_pixel");
        if ((g.ctm = lookup(s, ctms, 6)) < 0) {
            if (!strcmp(s, "tf_half_pixel_for_nn")) return onnx_unsupported(c, "coordinate_transformation_mode tf_half_pixel_for_nn");
            return em_set_error(EM_ERR_INVALID, "unknown coordinate_transformation_mode '%s'", s);
        }
        g.a = onnx_attr_float(c, "cubic_coeff_a", -0.75);
        g.exclude_outside = onnx_attr_int(c, "exclude_outside", 0) != 0;
        g.antialias = onnx_attr_int(c, "antialias", 0) != 0;
        g.extrapolation = onnx_attr_float(c, "extrapolation_value", 0.0);
        if (g.antialias && g.mode == 0) return em_set_error(EM_ERR_INVALID, "antialias with mode nearest");
        if (g.ctm == 5 && (nroi = in_floats(c, 1, roi, 2 * EM_MAX_DIMS)) < 0) return em_last_status();
        if ((ns = in_floats(c, 2, scales, EM_MAX_DIMS)) < 0) return em_last_status();
        if (onnx_in(c, 3) && em_tensor_numel(onnx_in(c, 3)) > 0) {
            if ((nz = onnx_in_ints(c, 3, sizes, EM_MAX_DIMS)) < 0) return em_last_status();
            if (ns > 0) return em_set_error(EM_ERR_INVALID, "both scales and sizes are given");
        }
    }
    return resize_run(c, x, scales, ns, sizes, nz, roi, nroi, &g);
}

static em_status op_upsample(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    resize_cfg g = {0, 2, 4, -0.75, false, false, 0.0};
    const char *s = onnx_attr_string(c, "mode", "nearest");
    if (!strcmp(s, "linear") || !strcmp(s, "bilinear")) g.mode = 1;
    else if (strcmp(s, "nearest")) return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", s);
    double scales[EM_MAX_DIMS];
    int ns;
    if (c->opset < 9) {
        const float *f;
        ns = onnx_attr_floats(c, "scales", &f);
        if (ns < 0) return em_set_error(EM_ERR_INVALID, "scales attribute is required");
        if (ns > EM_MAX_DIMS) return em_set_error(EM_ERR_INVALID, "too many scales");
        for (int i = 0; i < ns; i++) scales[i] = f[i];
    } else if ((ns = in_floats(c, 1, scales, EM_MAX_DIMS)) < 0) {
        return em_last_status();
    }
    return resize_run(c, x, scales, ns, NULL, 0, NULL, 0, &g);
}


/* ---- normalisation ---- */

/* A [C] tensor as [1, C, 1, ...] for rank r. */
static em_tensor *per_channel(const em_tensor *t, int r)
{
    int64_t s[EM_MAX_DIMS];
    for (int i = 0; i < r; i++) s[i] = 1;
    s[1] = em_tensor_numel(t);
    return em_reshape(t, s, r);
}

static em_status check_channel(const em_tensor *t, int64_t C, const char *what)
{
    if (em_tensor_numel(t) != C) return em_set_error(EM_ERR_SHAPE, "%s has %lld values for %lld channels", what, (long long)em_tensor_numel(t), (long long)C);
    return EM_OK;
}

/* BatchNormalization (1, 6, 7, 9, 14, 15): inference with the given
 * statistics; training_mode (14) normalises with the batch's mean and
 * biased variance and outputs running = stat * momentum + batch * (1 - momentum). */
static em_status op_batchnorm(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *sc = onnx_in_req(c, 1), *b = onnx_in_req(c, 2), *mean = onnx_in_req(c, 3), *var = onnx_in_req(c, 4);
    if (!x || !sc || !b || !mean || !var) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 2) return em_set_error(EM_ERR_SHAPE, "X must be [N, C, ...], got rank %d", r);
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "BatchNormalization of %s input", em_dtype_name(dt));
    int64_t C = em_tensor_dim(x, 1);
    em_status st;
    if ((st = check_channel(sc, C, "scale")) || (st = check_channel(b, C, "B")) || (st = check_channel(mean, C, "input_mean")) ||
        (st = check_channel(var, C, "input_var")))
        return st;
    double eps = onnx_attr_float(c, "epsilon", 1e-5);
    bool training = c->opset >= 14 ? onnx_attr_int(c, "training_mode", 0) != 0 : false;
    if (c->opset < 14) {
        for (int i = 1; i < c->nout; i++)
            if (c->node->out[i] >= 0) return onnx_unsupported(c, "training outputs of BatchNormalization before opset 14");
        if (c->opset < 9 && onnx_attr_int(c, "spatial", 1) == 0) return onnx_unsupported(c, "spatial = 0 (per-activation statistics)");
    }
    em_tensor *m = mean, *v = var;
    if (training) {
        int dims[EM_MAX_DIMS], nd = 0;
        for (int i = 0; i < r; i++)
            if (i != 1) dims[nd++] = i;
        m = em_mean(x, dims, nd, false);
        v = em_var(x, dims, nd, 0.0, false);
        double mom = onnx_attr_float(c, "momentum", 0.9);
        em_tensor *rm = em_add(em_mul_scalar(mean, mom), em_mul_scalar(em_cast(m, em_tensor_dtype(mean)), 1 - mom));
        em_tensor *rv = em_add(em_mul_scalar(var, mom), em_mul_scalar(em_cast(v, em_tensor_dtype(var)), 1 - mom));
        if ((st = onnx_out(c, 1, rm, onnx_in_type(c, 3))) || (st = onnx_out(c, 2, rv, onnx_in_type(c, 4)))) return st;
    }
    em_tensor *inv = em_rsqrt(em_add_scalar(em_cast(v, dt), eps));
    em_tensor *y = em_mul(em_sub(x, per_channel(em_cast(m, dt), r)), per_channel(em_mul(inv, em_cast(sc, dt)), r));
    y = em_add(y, per_channel(em_cast(b, dt), r));
    return onnx_out(c, 0, y, 0);
}

/* x [N, G, rest] normalised over the last dim. */
static em_tensor *norm_last(const em_tensor *x, double eps)
{
    int d = -1;
    em_tensor *m = em_mean(x, &d, 1, true);
    em_tensor *v = em_var(x, &d, 1, 0.0, true);
    return em_mul(em_sub(x, m), em_rsqrt(em_add_scalar(v, eps)));
}

/* InstanceNormalization (1, 6, 22): per (n, c) over the spatial dims. */
static em_status op_instancenorm(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *sc = onnx_in_req(c, 1), *b = onnx_in_req(c, 2);
    if (!x || !sc || !b) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 3) return em_set_error(EM_ERR_SHAPE, "input must be [N, C, spatial...], got rank %d", r);
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "InstanceNormalization of %s input", em_dtype_name(dt));
    int64_t C = em_tensor_dim(x, 1);
    em_status st;
    if ((st = check_channel(sc, C, "scale")) || (st = check_channel(b, C, "B"))) return st;
    int64_t s3[3] = {em_tensor_dim(x, 0), C, -1};
    em_tensor *y = em_reshape(norm_last(em_reshape(x, s3, 3), onnx_attr_float(c, "epsilon", 1e-5)), em_tensor_shape(x), r);
    y = em_add(em_mul(y, per_channel(em_cast(sc, dt), r)), per_channel(em_cast(b, dt), r));
    return onnx_out(c, 0, y, 0);
}

/* GroupNormalization (18, 21): scale / bias per group in 18, per channel in 21. */
static em_status op_groupnorm(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *sc = onnx_in_req(c, 1), *b = onnx_in_req(c, 2);
    if (!x || !sc || !b) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 2) return em_set_error(EM_ERR_SHAPE, "input must be [N, C, ...], got rank %d", r);
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "GroupNormalization of %s input", em_dtype_name(dt));
    int64_t C = em_tensor_dim(x, 1), G = onnx_attr_int(c, "num_groups", 0);
    if (G < 1 || C % G) return em_set_error(EM_ERR_INVALID, "num_groups %lld does not divide %lld channels", (long long)G, (long long)C);
    int64_t per = c->opset >= 21 ? C : G;
    em_status st;
    if ((st = check_channel(sc, per, "scale")) || (st = check_channel(b, per, "bias"))) return st;
    int64_t s3[3] = {em_tensor_dim(x, 0), G, -1};
    em_tensor *y = norm_last(em_reshape(x, s3, 3), onnx_attr_float(c, "epsilon", 1e-5));
    int64_t s4[4] = {em_tensor_dim(x, 0), G, C / G, -1}, p4[4] = {1, G, c->opset >= 21 ? C / G : 1, 1};
    y = em_reshape(y, s4, 4);
    y = em_add(em_mul(y, em_reshape(em_cast(sc, dt), p4, 4)), em_reshape(em_cast(b, dt), p4, 4));
    return onnx_out(c, 0, em_reshape(y, em_tensor_shape(x), r), 0);
}

/* LRN (1, 13): y = x / (bias + alpha / size * sum of squares over the
 * channel window [c - floor((size-1)/2), c + ceil((size-1)/2)])^beta. */
static em_status op_lrn(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 3) return em_set_error(EM_ERR_SHAPE, "input must be [N, C, ...], got rank %d", r);
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt)) return onnx_unsupported(c, "LRN of %s input", em_dtype_name(dt));
    int64_t size = onnx_attr_int(c, "size", 0);
    if (size < 1) return em_set_error(EM_ERR_INVALID, "size must be >= 1");
    double alpha = onnx_attr_float(c, "alpha", 1e-4), beta = onnx_attr_float(c, "beta", 0.75), bias = onnx_attr_float(c, "bias", 1.0);
    int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1);
    int64_t s4[4] = {N, 1, C, -1};
    em_tensor *sq = em_reshape(em_square(x), s4, 4);
    int64_t pads[4] = {0, 0, (size - 1) / 2, size - 1 - (size - 1) / 2};
    int64_t ws[4] = {1, 1, size, 1};
    em_tensor *sum = em_conv2d(em_pad(sq, pads, 4, 0.0), em_ones(ws, 4, dt), NULL, NULL);
    sum = em_reshape(sum, em_tensor_shape(x), r);
    em_tensor *den = em_pow_scalar(em_add_scalar(em_mul_scalar(sum, alpha / (double)size), bias), beta);
    return onnx_out(c, 0, em_div(x, den), 0);
}


/* ---- CausalConvWithState (27): depthwise causal 1-D convolution over
 * [past_state (zeros when absent), input], optional SiLU; present_state is
 * the last k - 1 positions of that concatenation. 16-bit inputs are
 * computed in f32. */
static em_status op_causal_conv(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *w = onnx_in_req(c, 1), *b = onnx_in(c, 2), *past = onnx_in(c, 3);
    if (!x || !w) return em_last_status();
    if (em_tensor_ndim(x) != 3 || em_tensor_ndim(w) != 3)
        return em_set_error(EM_ERR_SHAPE, "input and weight must be rank 3 (ranks %d and %d)", em_tensor_ndim(x), em_tensor_ndim(w));
    const char *act = onnx_attr_string(c, "activation", "none");
    bool silu = !strcmp(act, "silu") || !strcmp(act, "swish");
    if (!silu && strcmp(act, "none")) return em_set_error(EM_ERR_INVALID, "unknown activation '%s'", act);
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "CausalConvWithState of %s input", em_dtype_name(dt));
    em_dtype ct = is_float(dt) ? dt : EM_F32;
    int64_t B = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), L = em_tensor_dim(x, 2), k = em_tensor_dim(w, 2);
    if (em_tensor_dim(w, 0) != C || em_tensor_dim(w, 1) != 1 || k < 1)
        return em_set_error(EM_ERR_SHAPE, "weight must be [%lld, 1, k]", (long long)C);
    em_tensor *xs = em_cast(x, ct);
    em_tensor *padded;
    if (past) {
        if (em_tensor_ndim(past) != 3 || em_tensor_dim(past, 0) != B || em_tensor_dim(past, 1) != C || em_tensor_dim(past, 2) != k - 1)
            return em_set_error(EM_ERR_SHAPE, "past_state must be [%lld, %lld, %lld]", (long long)B, (long long)C, (long long)(k - 1));
        em_tensor *parts[2] = {em_cast(past, ct), xs};
        padded = k > 1 ? em_cat(parts, 2, 2) : xs;
    } else {
        int64_t pads[2] = {k - 1, 0};
        padded = em_pad(xs, pads, 2, 0.0);
    }
    if (!padded) return em_last_status();
    em_conv_opts o = em_conv_opts_default();
    o.groups = C;
    em_tensor *y = em_conv1d(padded, em_cast(w, ct), b ? em_cast(b, ct) : NULL, &o);
    if (silu) y = em_silu(y);
    em_status st = onnx_out(c, 0, em_cast(y, dt), 0);
    if (st) return st;
    em_tensor *ps;
    if (k > 1) ps = em_narrow(padded, 2, L, k - 1);
    else {
        int64_t s0[3] = {B, C, 0};
        ps = em_empty(s0, 3, ct);
    }
    return onnx_out(c, 1, em_cast(ps, dt), 0);
}


/* ---- GridSample (16, 20, 22): 1-D to 3-D spatial inputs. Per spatial dim
 * the grid coordinate is denormalised (align_corners), brought inside by
 * padding_mode (border: clamped, reflection: reflected), and split into
 * taps (nearest: 1, linear: 2, cubic: 4, Keys' A = -0.75) whose indices
 * are resolved by padding_mode (zeros: weight 0 outside); the output is the
 * weighted sum of em_gather reads over every combination of taps. */

/* Reflects v into [lo, hi] by its nearer border until inside. */
static em_tensor *reflect_t(em_tensor *v, double lo, double hi)
{
    double rng = hi - lo;
    if (rng <= 0) return em_full_like(v, lo);
    em_tensor *below = em_lt_scalar(v, lo), *above = em_gt_scalar(v, hi);
    em_tensor *dx = em_where(below, em_rsub_scalar(v, lo), em_sub_scalar(v, hi));
    em_tensor *n = em_trunc(em_div_scalar(dx, rng));
    em_tensor *r = em_sub(dx, em_mul_scalar(n, rng));
    em_tensor *even = em_eq_scalar(em_remainder_scalar(n, 2.0), 0.0);
    /* below: even -> lo + r, odd -> hi - r; above: even -> hi - r, odd -> lo + r */
    em_tensor *lo_r = em_add_scalar(r, lo), *hi_r = em_rsub_scalar(r, hi);
    em_tensor *fb = em_where(even, lo_r, hi_r), *fa = em_where(even, hi_r, lo_r);
    return em_where(below, fb, em_where(above, fa, v));
}

static em_tensor *cubic_near_t(em_tensor *u, double A)
{
    /* ((A + 2) u - (A + 3)) u^2 + 1 */
    return em_add_scalar(em_mul(em_sub_scalar(em_mul_scalar(u, A + 2), A + 3), em_square(u)), 1.0);
}
static em_tensor *cubic_far_t(em_tensor *u, double A)
{
    /* ((A u - 5 A) u + 8 A) u - 4 A */
    return em_sub_scalar(em_mul(em_add_scalar(em_mul(em_sub_scalar(em_mul_scalar(u, A), 5 * A), u), 8 * A), u), 4 * A);
}

static em_status op_gridsample(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *grid = onnx_in_req(c, 1);
    if (!x || !grid) return em_last_status();
    int r = em_tensor_ndim(x), nd = r - 2;
    if (nd < 1) return em_set_error(EM_ERR_SHAPE, "X must be [N, C, spatial...], got rank %d", r);
    if (nd > 3) return onnx_unsupported(c, "GridSample with %d spatial dims", nd);
    if (em_tensor_ndim(grid) != r || em_tensor_dim(grid, 0) != em_tensor_dim(x, 0) || em_tensor_dim(grid, r - 1) != nd)
        return em_set_error(EM_ERR_SHAPE, "grid must be [N, spatial..., %d] for X of rank %d", nd, r);
    const char *ms = onnx_attr_string(c, "mode", c->opset >= 20 ? "linear" : "bilinear");
    int mode;
    if (!strcmp(ms, "nearest")) mode = 0;
    else if (!strcmp(ms, "linear") || !strcmp(ms, "bilinear")) mode = 1;
    else if (!strcmp(ms, "cubic") || !strcmp(ms, "bicubic")) mode = 2;
    else return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", ms);
    if (mode == 2 && nd == 3) return onnx_unsupported(c, "cubic GridSample of 3-D input");
    const char *ps = onnx_attr_string(c, "padding_mode", "zeros");
    int pm;
    if (!strcmp(ps, "zeros")) pm = 0;
    else if (!strcmp(ps, "border")) pm = 1;
    else if (!strcmp(ps, "reflection")) pm = 2;
    else return em_set_error(EM_ERR_INVALID, "unknown padding_mode '%s'", ps);
    bool align = onnx_attr_int(c, "align_corners", 0) != 0;
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "GridSample of %s input", em_dtype_name(dt));
    em_dtype ct = is_float(dt) ? dt : EM_F32;
    int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), P = 1, Q = 1;
    for (int i = 0; i < nd; i++) {
        P *= em_tensor_dim(x, 2 + i);
        Q *= em_tensor_dim(grid, 1 + i);
    }
    int64_t gs[3] = {N, Q, nd}, xs[3] = {N, C, P};
    em_tensor *g = em_cast(em_reshape(grid, gs, 3), ct);
    em_tensor *xf = em_reshape(em_cast(x, ct), xs, 3);
    int nt = mode == 0 ? 1 : mode == 1 ? 2 : 4;
    em_tensor *tidx[3][4], *tw[3][4];
    int64_t stride = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int64_t L = em_tensor_dim(x, 2 + i);
        double lo = align ? 0.0 : -0.5, hi = align ? (double)L - 1 : (double)L - 0.5;
        em_tensor *v = em_squeeze(em_narrow(g, 2, nd - 1 - i, 1), 2);
        v = align ? em_mul_scalar(em_add_scalar(v, 1.0), ((double)L - 1) / 2.0)
                  : em_div_scalar(em_sub_scalar(em_mul_scalar(em_add_scalar(v, 1.0), (double)L), 1.0), 2.0);
        if (mode == 0) v = em_round(v);
        if (pm == 1) v = em_where(em_logical_or(em_lt_scalar(v, lo), em_gt_scalar(v, hi)), em_clamp(v, 0.0, (double)L - 1), v);
        else if (pm == 2) v = reflect_t(v, lo, hi);
        em_tensor *base = mode == 0 ? v : em_floor(v);
        em_tensor *t = em_sub(v, base);
        for (int j = 0; j < nt; j++) {
            em_tensor *id = em_add_scalar(base, (double)(j - (mode == 2 ? 1 : 0)));
            em_tensor *w = NULL;
            if (mode == 1) w = j == 0 ? em_rsub_scalar(t, 1.0) : t;
            else if (mode == 2) {
                if (j == 0) w = cubic_far_t(em_add_scalar(t, 1.0), -0.75);
                else if (j == 1) w = cubic_near_t(t, -0.75);
                else if (j == 2) w = cubic_near_t(em_rsub_scalar(t, 1.0), -0.75);
                else w = cubic_far_t(em_rsub_scalar(t, 2.0), -0.75);
            }
            if (pm == 0) {
                em_tensor *ok = em_logical_and(em_ge_scalar(id, 0.0), em_le_scalar(id, (double)L - 1));
                em_tensor *okf = em_cast(ok, ct);
                w = w ? em_mul(w, okf) : okf;
            } else if (pm == 2) {
                id = em_trunc(reflect_t(id, lo, hi));
            }
            id = em_clamp(id, 0.0, (double)L - 1);
            tidx[i][j] = em_mul_scalar(em_cast(id, EM_I64), (double)stride);
            tw[i][j] = w;
        }
        stride *= L;
    }
    int combos = 1;
    for (int i = 0; i < nd; i++) combos *= nt;
    em_tensor *acc = NULL;
    int64_t is3[3] = {N, 1, Q}, ex3[3] = {N, C, Q};
    for (int k = 0; k < combos; k++) {
        em_tensor *flat = NULL, *w = NULL;
        int rem = k;
        for (int i = 0; i < nd; i++) {
            int j = rem % nt;
            rem /= nt;
            flat = flat ? em_add(flat, tidx[i][j]) : tidx[i][j];
            if (tw[i][j]) w = w ? em_mul(w, tw[i][j]) : tw[i][j];
        }
        em_tensor *fi = em_contiguous(em_expand(em_reshape(flat, is3, 3), ex3, 3));
        em_tensor *gv = em_gather(xf, 2, fi);
        if (w) gv = em_mul(gv, em_reshape(w, is3, 3));
        acc = acc ? em_add(acc, gv) : gv;
    }
    int64_t os[EM_MAX_DIMS];
    os[0] = N;
    os[1] = C;
    for (int i = 0; i < nd; i++) os[2 + i] = em_tensor_dim(grid, 1 + i);
    return onnx_out(c, 0, em_cast(em_reshape(acc, os, r), dt), 0);
}


/* ---- AffineGrid (20): theta [N, nd, nd + 1] applied to the normalised
 * homogeneous coordinates (x, y[, z], 1) of a [spatial...] grid. */
static em_status op_affinegrid(onnx_ctx *c)
{
    em_tensor *theta = onnx_in_req(c, 0);
    if (!theta) return em_last_status();
    int64_t sz[5];
    int n = onnx_in_ints(c, 1, sz, 5);
    if (n < 0) return em_last_status();
    if (n != 4 && n != 5) return em_set_error(EM_ERR_INVALID, "size must have 4 or 5 values, got %d", n);
    int nd = n - 2;
    if (em_tensor_ndim(theta) != 3 || em_tensor_dim(theta, 0) != sz[0] || em_tensor_dim(theta, 1) != nd || em_tensor_dim(theta, 2) != nd + 1)
        return em_set_error(EM_ERR_SHAPE, "theta must be [%lld, %d, %d]", (long long)sz[0], nd, nd + 1);
    em_dtype dt = em_tensor_dtype(theta);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "AffineGrid of %s theta", em_dtype_name(dt));
    em_dtype ct = is_float(dt) ? dt : EM_F32;
    bool align = onnx_attr_int(c, "align_corners", 0) != 0;
    int64_t full[3], P = 1;
    for (int i = 0; i < nd; i++) {
        full[i] = sz[2 + i];
        if (full[i] < 1) return em_set_error(EM_ERR_INVALID, "size has an empty spatial dim");
        P *= full[i];
    }
    em_tensor *cols[4];
    for (int i = 0; i < nd; i++) {
        int64_t L = full[i];
        em_tensor *a = em_arange(0, (double)L, 1, ct);
        if (align) a = L > 1 ? em_sub_scalar(em_mul_scalar(a, 2.0 / (double)(L - 1)), 1.0) : em_full_like(a, -1.0);
        else a = em_sub_scalar(em_mul_scalar(em_add_scalar(em_mul_scalar(a, 2.0), 1.0), 1.0 / (double)L), 1.0);
        int64_t bs[3] = {1, 1, 1};
        bs[i] = L;
        em_tensor *e = em_reshape(em_expand(em_reshape(a, bs, nd), full, nd), &P, 1);
        cols[nd - 1 - i] = e; /* x is the last spatial dim */
    }
    cols[nd] = em_ones(&P, 1, ct);
    em_tensor *base = em_stack(cols, nd + 1, 1);                               /* [P, nd + 1] */
    em_tensor *gr = em_matmul(base, em_transpose(em_cast(theta, ct), 1, 2));   /* [N, P, nd] */
    int64_t os[5];
    os[0] = sz[0];
    for (int i = 0; i < nd; i++) os[1 + i] = full[i];
    os[1 + nd] = nd;
    return onnx_out(c, 0, em_cast(em_reshape(gr, os, nd + 2), dt), 0);
}


/* ---- RoiAlign (10, 16, 22): a fixed sampling_ratio x sampling_ratio grid
 * of bilinear samples per output bin (the spec's rules: samples outside
 * [-1, size] give 0, coordinates clamped at 0 and at the last pixel),
 * averaged (avg) or maxed (max, over the weighted corner terms, as the
 * spec's reference does). sampling_ratio 0 (an adaptive count that
 * depends on each roi's values) is unsupported. */

/* Bilinear corner indices / weights along one axis for coordinates v
 * (any shape) of a dim of size L. */
static void roi_axis(em_tensor *v, int64_t L, em_tensor **valid, em_tensor **lo, em_tensor **hi, em_tensor **wl, em_tensor **wh)
{
    *valid = em_logical_and(em_ge_scalar(v, -1.0), em_le_scalar(v, (double)L));
    em_tensor *y = em_maximum_scalar(v, 0.0);
    em_tensor *low = em_floor(y);
    em_tensor *edge = em_ge_scalar(low, (double)(L - 1));
    em_tensor *last = em_full_like(low, (double)(L - 1));
    low = em_where(edge, last, low);
    *hi = em_where(edge, last, em_add_scalar(low, 1.0));
    y = em_where(edge, low, y);
    *lo = low;
    *wh = em_sub(y, low);
    *wl = em_rsub_scalar(*wh, 1.0);
}

static em_status op_roialign(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *rois = onnx_in_req(c, 1), *bi = onnx_in_req(c, 2);
    if (!x || !rois || !bi) return em_last_status();
    if (em_tensor_ndim(x) != 4) return em_set_error(EM_ERR_SHAPE, "X must be [N, C, H, W], got rank %d", em_tensor_ndim(x));
    int64_t R = em_tensor_dim(rois, 0);
    if (em_tensor_ndim(rois) != 2 || em_tensor_dim(rois, 1) != 4 || em_tensor_numel(bi) != R)
        return em_set_error(EM_ERR_SHAPE, "rois must be [R, 4] and batch_indices [R]");
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "RoiAlign of %s input", em_dtype_name(dt));
    em_dtype ct = is_float(dt) ? dt : EM_F32;
    const char *ms = onnx_attr_string(c, "mode", "avg");
    bool is_max = !strcmp(ms, "max");
    if (!is_max && strcmp(ms, "avg")) return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", ms);
    const char *cm = onnx_attr_string(c, "coordinate_transformation_mode", c->opset >= 16 ? "half_pixel" : "output_half_pixel");
    bool half = !strcmp(cm, "half_pixel");
    if (!half && strcmp(cm, "output_half_pixel")) return em_set_error(EM_ERR_INVALID, "unknown coordinate_transformation_mode '%s'", cm);
    int64_t PH = onnx_attr_int(c, "output_height", 1), PW = onnx_attr_int(c, "output_width", 1), G = onnx_attr_int(c, "sampling_ratio", 0);
    double ss = onnx_attr_float(c, "spatial_scale", 1.0);
    if (PH < 1 || PW < 1) return em_set_error(EM_ERR_INVALID, "output_height and output_width must be >= 1");
    if (G <= 0) return onnx_unsupported(c, "sampling_ratio 0 (an adaptive sample count that depends on the roi values)");
    int64_t C = em_tensor_dim(x, 1), H = em_tensor_dim(x, 2), W = em_tensor_dim(x, 3);
    em_tensor *rf = em_cast(rois, ct);
    double off = half ? 0.5 : 0.0;
    em_tensor *co[4];
    for (int i = 0; i < 4; i++) co[i] = em_sub_scalar(em_mul_scalar(em_narrow(rf, 1, i, 1), ss), off); /* [R, 1] */
    em_tensor *rw = em_sub(co[2], co[0]), *rh = em_sub(co[3], co[1]);
    if (!half) {
        rw = em_maximum_scalar(rw, 1.0);
        rh = em_maximum_scalar(rh, 1.0);
    }
    /* relative sample positions p + (i + 0.5) / G for bin p, sample i */
    em_tensor *rel[2];
    int64_t P[2] = {PH, PW};
    for (int a = 0; a < 2; a++) {
        int64_t s1[2] = {P[a], 1}, s2[2] = {1, G}, flat = P[a] * G;
        em_tensor *t = em_add(em_reshape(em_arange(0, (double)P[a], 1, ct), s1, 2),
                              em_reshape(em_div_scalar(em_add_scalar(em_arange(0, (double)G, 1, ct), 0.5), (double)G), s2, 2));
        rel[a] = em_reshape(t, &flat, 1);
    }
    int64_t sy[3] = {R, PH * G, 1}, sx[3] = {R, 1, PW * G};
    em_tensor *yy = em_reshape(em_add(co[1], em_mul(em_div_scalar(rh, (double)PH), em_unsqueeze(rel[0], 0))), sy, 3);
    em_tensor *xx = em_reshape(em_add(co[0], em_mul(em_div_scalar(rw, (double)PW), em_unsqueeze(rel[1], 0))), sx, 3);
    em_tensor *vy, *ly, *hy, *wly, *why, *vx, *lx, *hx, *wlx, *whx;
    roi_axis(yy, H, &vy, &ly, &hy, &wly, &why);
    roi_axis(xx, W, &vx, &lx, &hx, &wlx, &whx);
    em_tensor *valid = em_cast(em_logical_and(vy, vx), ct); /* [R, PH*G, PW*G] */
    int64_t S = PH * G * PW * G;
    int64_t s3[3] = {R, 1, S}, e3[3] = {R, C, S}, xs[3] = {R, C, H * W};
    em_tensor *xb = em_reshape(em_index_select(em_cast(x, ct), 0, em_cast(em_reshape(bi, &R, 1), EM_I64)), xs, 3);
    em_tensor *ys2[2] = {ly, hy}, *xs2[2] = {lx, hx}, *wy2[2] = {wly, why}, *wx2[2] = {wlx, whx};
    em_tensor *acc = NULL;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            em_tensor *pos = em_add(em_mul_scalar(ys2[a], (double)W), xs2[b]);
            em_tensor *idx = em_contiguous(em_expand(em_reshape(em_cast(pos, EM_I64), s3, 3), e3, 3));
            em_tensor *w = em_reshape(em_mul(em_mul(wy2[a], wx2[b]), valid), s3, 3);
            em_tensor *t = em_mul(em_gather(xb, 2, idx), w);
            acc = acc ? (is_max ? em_maximum(acc, t) : em_add(acc, t)) : t;
        }
    int64_t s6[6] = {R, C, PH, G, PW, G};
    int dims[2] = {3, 5};
    em_tensor *y = em_reshape(acc, s6, 6);
    y = is_max ? em_max(y, dims, 2, false) : em_div_scalar(em_sum(y, dims, 2, false), (double)(G * G));
    return onnx_out(c, 0, em_cast(y, dt), 0);
}


/* ---- DeformConv (19, 22), 2-D: each kernel tap reads X at its regular
 * position plus the learned offset, bilinearly (corners outside the image
 * read 0), times the optional mask; the sampled columns are then
 * multiplied by W per group (an im2col convolution). */
static em_status op_deformconv(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *w = onnx_in_req(c, 1), *off = onnx_in_req(c, 2), *b = onnx_in(c, 3), *mask = onnx_in(c, 4);
    if (!x || !w || !off) return em_last_status();
    if (em_tensor_ndim(x) != 4) {
        if (em_tensor_ndim(x) < 3) return em_set_error(EM_ERR_SHAPE, "X must be [N, C, spatial...], got rank %d", em_tensor_ndim(x));
        return onnx_unsupported(c, "DeformConv with %d spatial dims (2-D only)", em_tensor_ndim(x) - 2);
    }
    em_dtype dt = em_tensor_dtype(x);
    if (!is_float(dt) && dt != EM_F16 && dt != EM_BF16) return onnx_unsupported(c, "DeformConv of %s input", em_dtype_name(dt));
    em_dtype ct = is_float(dt) ? dt : EM_F32;
    if (em_tensor_ndim(w) != 4 || em_tensor_ndim(off) != 4) return em_set_error(EM_ERR_SHAPE, "W and offset must be rank 4");
    int64_t N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), H = em_tensor_dim(x, 2), Wd = em_tensor_dim(x, 3);
    int64_t M = em_tensor_dim(w, 0), kh = em_tensor_dim(w, 2), kw = em_tensor_dim(w, 3), K = kh * kw;
    int64_t g = onnx_attr_int(c, "group", 1), og = onnx_attr_int(c, "offset_group", 1);
    int64_t s[2], d[2], p[4], ks[2];
    em_status st;
    if ((st = ints_attr(c, "strides", 2, s, 1)) || (st = ints_attr(c, "dilations", 2, d, 1)) || (st = ints_attr(c, "pads", 4, p, 0)) ||
        (st = ints_attr(c, "kernel_shape", 2, ks, 0)))
        return st;
    if (onnx_has_attr(c, "kernel_shape") && (ks[0] != kh || ks[1] != kw)) return em_set_error(EM_ERR_SHAPE, "kernel_shape differs from W's shape");
    if (g < 1 || og < 1 || C % g || M % g || C % og || em_tensor_dim(w, 1) * g != C)
        return em_set_error(EM_ERR_SHAPE, "channels (%lld in, %lld out) do not fit group %lld / offset_group %lld", (long long)C, (long long)M, (long long)g,
                            (long long)og);
    int64_t oh = (H + p[0] + p[2] - d[0] * (kh - 1) - 1) / s[0] + 1, ow = (Wd + p[1] + p[3] - d[1] * (kw - 1) - 1) / s[1] + 1, L = oh * ow;
    if (oh < 1 || ow < 1 || em_tensor_dim(off, 0) != N || em_tensor_dim(off, 1) != og * K * 2 || em_tensor_dim(off, 2) != oh || em_tensor_dim(off, 3) != ow)
        return em_set_error(EM_ERR_SHAPE, "offset must be [%lld, %lld, %lld, %lld]", (long long)N, (long long)(og * K * 2), (long long)oh, (long long)ow);
    /* regular positions: tap a * d + output i * s - pad, as [K, L] */
    em_tensor *pos[2];
    int64_t kk[2] = {kh, kw}, oo[2] = {oh, ow};
    for (int a = 0; a < 2; a++) {
        int64_t tk[2] = {kh, kw}, tl[2] = {oh, ow}, sk[2] = {1, 1}, sl[2] = {1, 1};
        sk[a] = kk[a];
        sl[a] = oo[a];
        em_tensor *tap = em_reshape(em_expand(em_reshape(em_mul_scalar(em_arange(0, (double)kk[a], 1, ct), (double)d[a]), sk, 2), tk, 2), &K, 1);
        em_tensor *out = em_reshape(em_expand(em_reshape(em_sub_scalar(em_mul_scalar(em_arange(0, (double)oo[a], 1, ct), (double)s[a]), (double)p[a]), sl, 2), tl, 2), &L, 1);
        int64_t c1[2] = {K, 1}, r1[2] = {1, L};
        pos[a] = em_add(em_reshape(tap, c1, 2), em_reshape(out, r1, 2));
    }
    int64_t os5[5] = {N, og, K, 2, L}, s4[4] = {N, og, K, L};
    em_tensor *o5 = em_reshape(em_cast(off, ct), os5, 5);
    em_tensor *py = em_add(em_reshape(em_narrow(o5, 3, 0, 1), s4, 4), pos[0]);
    em_tensor *px = em_add(em_reshape(em_narrow(o5, 3, 1, 1), s4, 4), pos[1]);
    em_tensor *mk = NULL;
    if (mask) {
        if (em_tensor_numel(mask) != N * og * K * L) return em_set_error(EM_ERR_SHAPE, "mask must be [%lld, %lld, %lld, %lld]", (long long)N, (long long)(og * K), (long long)oh, (long long)ow);
        mk = em_reshape(em_cast(mask, ct), s4, 4);
    }
    em_tensor *y0 = em_floor(py), *x0 = em_floor(px);
    em_tensor *ly = em_sub(py, y0), *lx = em_sub(px, x0);
    int64_t Cg = C / og, KL = K * L;
    int64_t xs4[4] = {N, og, Cg, H * Wd}, is4[4] = {N, og, 1, KL}, es4[4] = {N, og, Cg, KL};
    em_tensor *xf = em_reshape(em_cast(x, ct), xs4, 4);
    em_tensor *acc = NULL;
    for (int a = 0; a < 2; a++)
        for (int bb = 0; bb < 2; bb++) {
            em_tensor *yc = a ? em_add_scalar(y0, 1.0) : y0, *xc = bb ? em_add_scalar(x0, 1.0) : x0;
            em_tensor *wgt = em_mul(a ? ly : em_rsub_scalar(ly, 1.0), bb ? lx : em_rsub_scalar(lx, 1.0));
            em_tensor *ok = em_logical_and(em_logical_and(em_ge_scalar(yc, 0.0), em_le_scalar(yc, (double)(H - 1))),
                                           em_logical_and(em_ge_scalar(xc, 0.0), em_le_scalar(xc, (double)(Wd - 1))));
            wgt = em_mul(wgt, em_cast(ok, ct));
            if (mk) wgt = em_mul(wgt, mk);
            em_tensor *idx = em_add(em_mul_scalar(em_clamp(yc, 0.0, (double)(H - 1)), (double)Wd), em_clamp(xc, 0.0, (double)(Wd - 1)));
            idx = em_contiguous(em_expand(em_reshape(em_cast(idx, EM_I64), is4, 4), es4, 4));
            em_tensor *t = em_mul(em_gather(xf, 3, idx), em_reshape(wgt, is4, 4));
            acc = acc ? em_add(acc, t) : t;
        }
    /* acc [N, og, Cg, K * L] -> cols [N, g, (C / g) * K, L] */
    int64_t cs[4] = {N, g, (C / g) * K, L}, ws[4] = {1, g, M / g, (C / g) * K};
    em_tensor *cols = em_reshape(acc, cs, 4);
    em_tensor *y = em_matmul(em_reshape(em_cast(w, ct), ws, 4), cols); /* [N, g, M / g, L] */
    int64_t ys[4] = {N, M, oh, ow};
    y = em_reshape(y, ys, 4);
    if (b) y = em_add(y, per_channel(em_cast(b, ct), 4));
    return onnx_out(c, 0, em_cast(y, dt), 0);
}


/* NonMaxSuppression (10, 11): the number of selected boxes (the output's
 * first dim) depends on the box and score values, and Ember's ops need
 * every shape before they run. */
static em_status op_nms(onnx_ctx *c)
{
    return onnx_unsupported(c, "NonMaxSuppression: its output size depends on the input values (no data-dependent shapes in Ember's ops)");
}

const onnx_op onnx_ops_vision[] = {
    {"NonMaxSuppression", 10, op_nms},
    {"DeformConv", 19, op_deformconv},
    {"RoiAlign", 10, op_roialign},
    {"ConvInteger", 10, op_convinteger},
    {"QLinearConv", 10, op_qlinearconv},
    {"MaxUnpool", 9, op_maxunpool},
    {"Col2Im", 18, op_col2im},
    {"AffineGrid", 20, op_affinegrid},
    {"GridSample", 16, op_gridsample},
    {"CausalConvWithState", 27, op_causal_conv},
    {"BatchNormalization", 1, op_batchnorm},
    {"InstanceNormalization", 1, op_instancenorm},
    {"GroupNormalization", 18, op_groupnorm},
    {"LRN", 1, op_lrn},
    {"Resize", 10, op_resize},
    {"Upsample", 7, op_upsample},
    {"Conv", 1, op_conv},
    {"ConvTranspose", 1, op_conv_transpose},
    {"MaxPool", 1, op_maxpool},
    {"AveragePool", 1, op_avgpool},
    {"LpPool", 1, op_lppool},
    {"GlobalAveragePool", 1, op_global_avg},
    {"GlobalMaxPool", 1, op_global_max},
    {"GlobalLpPool", 1, op_global_lp},
    {NULL, 0, NULL},
};
