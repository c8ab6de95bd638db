/* Convolution front ends: em_conv2d, em_conv1d, em_conv_transpose2d, and the
 * internal ops their gradients use (em__conv2d_raw, em__conv2d_bwd_data,
 * em__conv2d_bwd_weight).
 *
 * Kernel contracts (every backend; p.conv holds stride, pad, dilation as
 * (h, w) pairs and groups g; padding is symmetric, zeros outside the input).
 * All operands are f32 or f64 (one dtype per op; f16 / bf16 on the backends
 * whose em__<backend>_half conv entry says so, CUDA: 16-bit storage, f32
 * sums, one rounding, the door widens the op elsewhere) and contiguous (the front
 * end copies strided inputs; a descriptor may still have an offset). Sizes
 * come from the descriptors: x [N, C, H, W], w [O, C/g, KH, KW],
 * y / dy [N, O, OH, OW], Cg = C/g, Og = O/g, group of output channel o is
 * o / Og, and for input row h, output row oh, kernel row i:
 *     h = oh * stride_h - pad_h + i * dilation_h    (the same for columns)
 *
 *   CONV2D            in[0] = x, in[1] = w, out[0] = y:
 *       y[n,o,oh,ow] = sum_{c<Cg, i<KH, j<KW} x[n, (o/Og)*Cg + c, h, w] * w[o,c,i,j]
 *       over the (h, w) inside the input. OH, OW are the output descriptor's:
 *       the front end computes PyTorch's sizes, but a kernel must not assume
 *       them (the backward of conv_transpose2d passes its own).
 *   CONV2D_BWD_DATA   in[0] = dy, in[1] = w, out[0] = dx [N, C, H, W] (written
 *       whole): dx[n,c,h,w] = sum over (o in c's group, oh, ow, i, j) with
 *       h, w as above of dy[n,o,oh,ow] * w[o, c % Cg, i, j]. Also
 *       conv_transpose2d's forward (dy = its input, dx = its output).
 *   CONV2D_BWD_WEIGHT in[0] = x, in[1] = dy, out[0] = dw [O, Cg, KH, KW]
 *       (written whole): dw[o,c,i,j] = sum_{n, oh, ow} dy[n,o,oh,ow] *
 *       x[n, (o/Og)*Cg + c, h, w] over the (h, w) inside the input.
 *
 * The bias is not part of the ops: the front end adds it (a broadcast add)
 * and its gradient is the sum of dy over N, H, W.
 *
 * Output size (PyTorch, torch/nn/modules/conv.py):
 *     OH = floor((H + pad_top + pad_bottom - dilation*(KH-1) - 1) / stride) + 1
 * conv_transpose2d: OH = (H-1)*stride - 2*pad + dilation*(KH-1) + output_padding + 1.
 * Asymmetric padding (padding_end, or padding='same' with an even effective
 * kernel) pads the common part in the kernel and the rest explicitly (one
 * zero pad of the input, as PyTorch's _conv_forward does for 'same'). */
#include "tasks/tasks_internal.h"

#include <string.h>

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)

em_conv_opts em_conv_opts_default(void)
{
    em_conv_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < 2; i++) {
        o.stride[i] = 1;
        o.dilation[i] = 1;
        o.padding_end[i] = -1;
    }
    o.groups = 1;
    return o;
}

static bool float_dt(em_dtype dt) { return em_dtype_is_float(dt); }

/* Submits kind {a, b} -> out of @p shape with @p p (a, b contiguous copies
 * when needed; autodiff records the caller's a, b). Scoped result. */
static em_tensor *conv_op(enum em_op_kind kind, const em_tensor *a, const em_tensor *b, const int64_t *shape,
                          const union em_op_params *p)
{
    em_tensor *ac = em__contiguous_operand(a);
    em_tensor *bc = ac ? em__contiguous_operand(b) : NULL;
    em_tensor *out = bc ? em__tensor_new(a->dtype, shape, 4) : NULL;
    em_tensor *r = NULL;
    if (out) {
        em_tensor *in[2] = {ac, bc};
        const em_tensor *orig[2] = {a, b};
        r = em__run1(kind, in, 2, out, p, orig);
    }
    em_tensor_release(ac);
    em_tensor_release(bc);
    return r;
}

static void conv_params(union em_op_params *p, const int64_t *stride, const int64_t *pad, const int64_t *dil, int64_t groups)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 2; i++) {
        p->conv.stride[i] = (int32_t)stride[i];
        p->conv.pad[i] = (int32_t)pad[i];
        p->conv.dilation[i] = (int32_t)dil[i];
    }
    p->conv.groups = (int32_t)groups;
}

em_tensor *em__conv2d_raw(const em_tensor *x, const em_tensor *w, const union em_op_params *p, const int64_t *out_shape)
{
    return conv_op(EM_OP_CONV2D, x, w, out_shape, p);
}

em_tensor *em__conv2d_bwd_data(const em_tensor *dy, const em_tensor *w, const union em_op_params *p, const int64_t *x_shape)
{
    return conv_op(EM_OP_CONV2D_BWD_DATA, dy, w, x_shape, p);
}

em_tensor *em__conv2d_bwd_weight(const em_tensor *x, const em_tensor *dy, const union em_op_params *p, const int64_t *w_shape)
{
    return conv_op(EM_OP_CONV2D_BWD_WEIGHT, x, dy, w_shape, p);
}

/* Checks shared by conv2d and conv_transpose2d; @p what names the op. */
static bool check_common(const em_tensor *x, const em_tensor *w, const em_tensor *bias, const em_conv_opts *o, const char *what)
{
    char sx[200], sw[200], sb[200];
    if (!float_dt(x->dtype) || w->dtype != x->dtype || (bias && bias->dtype != x->dtype)) {
        em__fail(EM_ERR_DTYPE, "%s: input %s, weight %s%s%s must be one float dtype (float32 or float64)", what,
                 em_dtype_name(x->dtype), em_dtype_name(w->dtype), bias ? ", bias " : "", bias ? em_dtype_name(bias->dtype) : "");
        return false;
    }
    if (x->ndim != 4 || w->ndim != 4) {
        em__fail(EM_ERR_SHAPE, "%s: expected input [N, C, H, W] and a 4-D weight, got input %s and weight %s", what,
                 SHAPE_STR(x, sx), SHAPE_STR(w, sw));
        return false;
    }
    for (int i = 0; i < 2; i++)
        if (o->stride[i] <= 0 || o->dilation[i] <= 0 || o->padding[i] < 0 || o->stride[i] > INT32_MAX ||
            o->dilation[i] > INT32_MAX || o->padding[i] > INT32_MAX) {
            em__fail(EM_ERR_INVALID, "%s: stride (%lld, %lld) and dilation (%lld, %lld) must be > 0 and padding (%lld, %lld) >= 0", what,
                     (long long)o->stride[0], (long long)o->stride[1], (long long)o->dilation[0], (long long)o->dilation[1],
                     (long long)o->padding[0], (long long)o->padding[1]);
            return false;
        }
    if (o->groups <= 0 || o->groups > INT32_MAX) {
        em__fail(EM_ERR_INVALID, "%s: groups must be > 0, got %lld", what, (long long)o->groups);
        return false;
    }
    if (bias && (bias->ndim != 1)) {
        em__fail(EM_ERR_SHAPE, "%s: bias must be 1-D, got %s", what, SHAPE_STR(bias, sb));
        return false;
    }
    return true;
}

/* y + bias viewed as [1, O, 1, 1] (scoped), or y itself. */
static em_tensor *add_bias(em_tensor *y, const em_tensor *bias)
{
    if (!y || !bias) return y;
    int64_t bs[4] = {1, bias->shape[0], 1, 1};
    return em_add(y, em_reshape(bias, bs, 4));
}

em_tensor *em_conv2d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *opts)
{
    if (!x || !weight) return em__fail_null("em_conv2d: %s is NULL", !x ? "input" : "weight");
    {   /* autocast: conv2d (x, weight and bias) in the low dtype, as torch's conv2d */
        const em_tensor *ins[3] = {x, weight, bias};
        em_tensor *c[3];
        EM_AUTOCAST_RERUN(EM_OP_CONV2D, ins, 3, c, em_conv2d(c[0], c[1], c[2], opts));
    }
    em_conv_opts o = opts ? *opts : em_conv_opts_default();
    if (!check_common(x, weight, bias, &o, "em_conv2d")) return NULL;
    char sx[200], sw[200], sb[200];
    const int64_t N = x->shape[0], C = x->shape[1], O = weight->shape[0], g = o.groups;
    if (C % g || O % g || weight->shape[1] * g != C)
        return em__fail(EM_ERR_SHAPE,
                        "em_conv2d: input %s and weight %s do not fit groups=%lld (input channels and weight.shape[0] must be "
                        "divisible by groups, and weight.shape[1] = channels / groups)",
                        SHAPE_STR(x, sx), SHAPE_STR(weight, sw), (long long)g);
    if (bias && bias->shape[0] != O)
        return em__fail(EM_ERR_SHAPE, "em_conv2d: bias %s must have weight.shape[0] = %lld entries", SHAPE_STR(bias, sb), (long long)O);
    int64_t pb[2], pe[2], sym[2], ext_b[2], ext_e[2], out[4] = {N, O, 0, 0};
    if (o.padding_same) {
        if (o.stride[0] != 1 || o.stride[1] != 1)
            return em__fail(EM_ERR_INVALID, "em_conv2d: padding='same' needs stride 1, got (%lld, %lld)", (long long)o.stride[0],
                            (long long)o.stride[1]);
    }
    for (int i = 0; i < 2; i++) {
        const int64_t k = weight->shape[2 + i], eff = o.dilation[i] * (k - 1) + 1;
        if (o.padding_same) {
            pb[i] = (eff - 1) / 2;
            pe[i] = eff - 1 - pb[i];
        } else {
            pb[i] = o.padding[i];
            pe[i] = o.padding_end[i] < 0 ? o.padding[i] : o.padding_end[i];
        }
        sym[i] = pb[i] < pe[i] ? pb[i] : pe[i];
        ext_b[i] = pb[i] - sym[i];
        ext_e[i] = pe[i] - sym[i];
        const int64_t padded = x->shape[2 + i] + pb[i] + pe[i];
        if (k <= 0 || eff > padded)
            return em__fail(EM_ERR_SHAPE,
                            "em_conv2d: kernel %lldx%lld (dilation %lld, %lld) is larger than the padded input: input %s, weight %s, "
                            "padding (%lld, %lld, %lld, %lld)",
                            (long long)weight->shape[2], (long long)weight->shape[3], (long long)o.dilation[0], (long long)o.dilation[1],
                            SHAPE_STR(x, sx), SHAPE_STR(weight, sw), (long long)pb[0], (long long)pe[0], (long long)pb[1],
                            (long long)pe[1]);
        out[2 + i] = (padded - eff) / o.stride[i] + 1;
    }
    if (N == 0 || O == 0 || C == 0)
        return em__fail(EM_ERR_SHAPE, "em_conv2d: empty input %s or weight %s", SHAPE_STR(x, sx), SHAPE_STR(weight, sw));
    em_scope_begin();
    const em_tensor *xin = x;
    if (ext_b[0] || ext_e[0] || ext_b[1] || ext_e[1]) {
        int64_t pads[4] = {ext_b[1], ext_e[1], ext_b[0], ext_e[0]};
        xin = em_pad(x, pads, 4, 0.0);
    }
    union em_op_params p;
    conv_params(&p, o.stride, sym, o.dilation, g);
    em_tensor *y = xin ? em__conv2d_raw(xin, weight, &p, out) : NULL;
    y = em_keep(add_bias(y, bias));
    em_scope_end();
    return y;
}

em_tensor *em_conv1d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *opts)
{
    if (!x || !weight) return em__fail_null("em_conv1d: %s is NULL", !x ? "input" : "weight");
    char sx[200], sw[200];
    if (x->ndim != 3 || weight->ndim != 3)
        return em__fail(EM_ERR_SHAPE, "em_conv1d: expected input [N, C, L] and weight [O, C/groups, k], got input %s and weight %s",
                        SHAPE_STR(x, sx), SHAPE_STR(weight, sw));
    em_conv_opts o = opts ? *opts : em_conv_opts_default(), o2 = em_conv_opts_default();
    o2.stride[1] = o.stride[0];
    o2.padding[1] = o.padding[0];
    o2.padding_end[1] = o.padding_end[0];
    o2.dilation[1] = o.dilation[0];
    o2.groups = o.groups;
    o2.padding_same = o.padding_same;
    em_scope_begin();
    em_tensor *y = em_conv2d(em_unsqueeze(x, 2), em_unsqueeze(weight, 2), bias, &o2);
    y = em_keep(y ? em_squeeze(y, 2) : NULL);
    em_scope_end();
    return y;
}

em_tensor *em_conv_transpose2d(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, const em_conv_opts *opts)
{
    if (!x || !weight) return em__fail_null("em_conv_transpose2d: %s is NULL", !x ? "input" : "weight");
    {   /* autocast: conv_transpose2d (its forward kind is CONV2D_BWD_DATA) in the low dtype */
        const em_tensor *ins[3] = {x, weight, bias};
        em_tensor *c[3];
        EM_AUTOCAST_RERUN(EM_OP_CONV2D_BWD_DATA, ins, 3, c, em_conv_transpose2d(c[0], c[1], c[2], opts));
    }
    em_conv_opts o = opts ? *opts : em_conv_opts_default();
    if (!check_common(x, weight, bias, &o, "em_conv_transpose2d")) return NULL;
    char sx[200], sw[200], sb[200];
    if (o.padding_same || (o.padding_end[0] >= 0 && o.padding_end[0] != o.padding[0]) ||
        (o.padding_end[1] >= 0 && o.padding_end[1] != o.padding[1]))
        return em__fail(EM_ERR_INVALID, "em_conv_transpose2d: padding='same' and asymmetric padding are not supported (as PyTorch)");
    const int64_t N = x->shape[0], Cin = x->shape[1], g = o.groups, Cout = weight->shape[1] * g;
    if (Cin % g || weight->shape[0] != Cin)
        return em__fail(EM_ERR_SHAPE,
                        "em_conv_transpose2d: input %s and weight %s do not fit groups=%lld (weight.shape[0] must equal the input "
                        "channels, divisible by groups)",
                        SHAPE_STR(x, sx), SHAPE_STR(weight, sw), (long long)g);
    if (bias && bias->shape[0] != Cout)
        return em__fail(EM_ERR_SHAPE, "em_conv_transpose2d: bias %s must have %lld entries (output channels)", SHAPE_STR(bias, sb),
                        (long long)Cout);
    int64_t out[4] = {N, Cout, 0, 0};
    for (int i = 0; i < 2; i++) {
        const int64_t k = weight->shape[2 + i];
        if (o.output_padding[i] < 0 || o.output_padding[i] >= o.stride[i])
            return em__fail(EM_ERR_INVALID,
                            "em_conv_transpose2d: output_padding (%lld, %lld) must be >= 0 and smaller than stride (%lld, %lld)",
                            (long long)o.output_padding[0], (long long)o.output_padding[1], (long long)o.stride[0],
                            (long long)o.stride[1]);
        out[2 + i] = (x->shape[2 + i] - 1) * o.stride[i] - 2 * o.padding[i] + o.dilation[i] * (k - 1) + o.output_padding[i] + 1;
        if (k <= 0 || out[2 + i] <= 0)
            return em__fail(EM_ERR_SHAPE, "em_conv_transpose2d: input %s with weight %s and padding (%lld, %lld) gives an empty output",
                            SHAPE_STR(x, sx), SHAPE_STR(weight, sw), (long long)o.padding[0], (long long)o.padding[1]);
    }
    if (N == 0 || Cin == 0 || Cout == 0)
        return em__fail(EM_ERR_SHAPE, "em_conv_transpose2d: empty input %s or weight %s", SHAPE_STR(x, sx), SHAPE_STR(weight, sw));
    union em_op_params p;
    conv_params(&p, o.stride, o.padding, o.dilation, g);
    em_scope_begin();
    em_tensor *y = em__conv2d_bwd_data(x, weight, &p, out);
    y = em_keep(add_bias(y, bias));
    em_scope_end();
    return y;
}

/* ---- tiling over CPU workers ----------------------------------------------
 * A conv op on a CPU-only placement with >= 2 CPU workers and more than
 * EMBER_CONV_TILE_MIN_FLOPS (default 2e7) is cut along the batch dim N into
 * T tasks (EMBER_CONV_TILES, default one per CPU worker, at most N) that run
 * concurrently (em__cpu_tiles). As for matmul (tasks/matmul.c explains why
 * tiles are not StarPU partition children): CONV2D and CONV2D_BWD_DATA write
 * tile 0 straight into the output and tiles t >= 1 into temporaries that a
 * COPY then places; CONV2D_BWD_WEIGHT sums over N, so every tile writes a
 * partial weight gradient into a temporary and ADD tasks sum them into the
 * output (the extra traffic is T weight-sized tensors). */

static em_status submit_add(const em_op *op, em_tensor *a, em_tensor *b, em_tensor *out)
{
    em_op add = {.kind = EM_OP_ADD, .n_in = 2, .n_out = 1, .in = {a, b}, .out = {out},
                 .flags = EM_OPF_RAW, .priority = op->priority, .after = op->after};
    return em__submit(&add);
}

em_status em__conv_submit(em_op *op)
{
    const em_tensor *a = op->in[0], *b = op->in[1], *o = op->out[0];
    /* flops = 2 * (elements of the per-sample-summed side) * (the reduction length) */
    double flops = 2.0;
    if (op->kind == EM_OP_CONV2D)
        flops *= (double)em__numel(o->shape, 4) * (double)(b->shape[1] * b->shape[2] * b->shape[3]);
    else if (op->kind == EM_OP_CONV2D_BWD_DATA)
        flops *= (double)em__numel(a->shape, 4) * (double)(b->shape[1] * b->shape[2] * b->shape[3]);
    else
        flops *= (double)em__numel(b->shape, 4) * (double)(o->shape[1] * o->shape[2] * o->shape[3]);
    const int64_t N = a->shape[0];
    int T = em__cpu_tiles(op, flops, "EMBER_CONV_TILE_MIN_FLOPS", 2e7, "EMBER_CONV_TILES");
    if (T > N) T = (int)N;
    em_kargs k;
    if (T <= 1) return em__submit_tile(op, op->out[0], NULL);
    em__kargs_from_op(op, &k);
    const bool weight = op->kind == EM_OP_CONV2D_BWD_WEIGHT;
    /* temporaries stay alive until every task is submitted (see matmul) */
    em_tensor *tmp[EM_MAX_TILES] = {0};
    int64_t s0s[EM_MAX_TILES + 1];
    for (int t = 0; t <= T; t++) s0s[t] = N * t / T;
    em_status st = EM_OK;
    for (int t = 0; t < T && st == EM_OK; t++) {
        const int64_t s0 = s0s[t], rows = s0s[t + 1] - s0;
        em_kargs tk = k;
        em__tdesc_narrow(&tk.in[0], 0, s0, rows);
        if (weight) em__tdesc_narrow(&tk.in[1], 0, s0, rows);
        if (t == 0 && !weight) {
            em__tdesc_narrow(&tk.out[0], 0, s0, rows);
            st = em__submit_tile(op, op->out[0], &tk);
            continue;
        }
        int64_t shape[4];
        memcpy(shape, o->shape, sizeof shape);
        if (!weight) shape[0] = rows;
        if (!(tmp[t] = em__tensor_new(o->dtype, shape, 4))) {
            st = em_last_status();
            break;
        }
        em__tdesc(tmp[t], &tk.out[0]);
        st = em__submit_tile(op, tmp[t], &tk);
    }
    if (weight) { /* out = tmp[0] + tmp[1] + ... (left to right) */
        em_tensor *acc = tmp[0];
        for (int t = 1; t < T && st == EM_OK; t++) {
            em_tensor *dst = t == T - 1 ? op->out[0] : em__tensor_new(o->dtype, o->shape, 4);
            if (!dst) {
                st = em_last_status();
                break;
            }
            st = submit_add(op, acc, tmp[t], dst);
            if (acc != tmp[0]) em_tensor_release(acc);
            acc = dst;
        }
        if (acc != tmp[0] && acc != op->out[0]) em_tensor_release(acc);
    } else if (st == EM_OK) {
        st = em__place_tiles(op, tmp, s0s, T, 0);
    }
    for (int t = 0; t < T; t++) em_tensor_release(tmp[t]);
    return st;
}
