/* OpenCL host function of the attention family: fused scaled-dot-product
 * attention forward (SDPA) and backward (SDPA_BWD). Operand contract: the
 * top of tasks/attention.c; kernels: devices/opencl/attention.cl (one
 * work-item per query row forward and for dq, one per key row for dk / dv).
 * f32, and f64 where the program has fp64; otherwise the CPU reference runs
 * on mapped buffers (em_ocl_host_fallback). f16 / bf16 ops are widened by
 * the door (EM_OCL_HALF_attention is false). */
#include "devices/opencl/opencl.h"

#include <math.h>

/* A [B, H, rows, cols] descriptor of dtype dt with unit last stride. */
static bool desc_ok(const em_tdesc *t, int dt, int64_t B, int64_t H, int64_t rows, int64_t cols, bool any_last)
{
    return t->dtype == dt && t->ndim == 4 && t->shape[0] == B && t->shape[1] == H && t->shape[2] == rows &&
           t->shape[3] == cols && (any_last || t->strides[3] == 1 || cols == 1);
}

static bool lse_ok(const em_tdesc *t, int dt, int64_t B, int64_t H, int64_t Tq)
{
    return t->dtype == dt && t->ndim == 3 && t->shape[0] == B && t->shape[1] == H && t->shape[2] == Tq &&
           (Tq == 1 || t->strides[2] == 1) && (H == 1 || t->strides[1] == Tq) && (B == 1 || t->strides[0] == H * Tq);
}

/* buffer, byte offset, long8 (element offset, strides) */
static void arg_tensor(em_ocl_args *a, void *iface, const em_tdesc *t)
{
    int64_t d[8] = {t->offset, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < t->ndim && i < 4; i++) d[1 + i] = t->strides[i];
    em_ocl_arg_buf(a, iface);
    em_ocl_arg_long8(a, d, 8);
}

/* The scalars every kernel takes after geo. */
static void arg_params(em_ocl_args *a, const em_kargs *k, int dt)
{
    const double p = k->p.attn.dropout_p;
    em_ocl_arg_real(a, dt, k->p.attn.scale);
    /* keep iff (w0 >> 8) >= ceil(p 2^24), i.e. (w0 >> 8) / 2^24 >= p exactly */
    const uint32_t thr = (uint32_t)ceil(p * 16777216.0);
    EM_OCL_ARG(a, thr);
    em_ocl_arg_u64(a, k->p.attn.seed);
    em_ocl_arg_u64(a, k->p.attn.offset);
    em_ocl_arg_real(a, dt, p < 1 ? 1.0 / (1.0 - p) : 0.0);
    const int32_t flags = (k->p.attn.is_causal ? 1 : 0) | (k->p.attn.has_mask ? 2 : 0) | (p > 0 ? 4 : 0);
    em_ocl_arg_i32(a, flags);
}

void em_ocl_attention(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const bool fwd = k->kind == EM_OP_SDPA;
    if (!fwd && k->kind != EM_OP_SDPA_BWD) {
        em_ocl_error("attention: unsupported op %d", k->kind);
        return;
    }
    const bool has_mask = k->p.attn.has_mask != 0;
    const int nq = fwd ? 0 : 1;
    const em_tdesc *q = &k->in[nq], *kk = &k->in[nq + 1], *v = &k->in[nq + 2];
    const int dt = q->dtype;
    bool ok = (dt == EM_F32 || dt == EM_F64) && k->n_in == (fwd ? 3 : 6) + has_mask && k->n_out == (fwd ? 2 : 3) &&
              q->ndim == 4 && kk->ndim == 4 && v->ndim == 4;
    const int64_t B = ok ? q->shape[0] : 0, H = ok ? q->shape[1] : 0, Tq = ok ? q->shape[2] : 0, D = ok ? q->shape[3] : 0;
    const int64_t Tk = ok ? kk->shape[2] : 0, Dv = ok ? v->shape[3] : 0;
    ok = ok && Tq >= 1 && Tk >= 1 && D >= 1 && D <= 256 && Dv >= 1 && Dv <= 256 && desc_ok(q, dt, B, H, Tq, D, false) &&
         desc_ok(kk, dt, B, H, Tk, D, false) && desc_ok(v, dt, B, H, Tk, Dv, false);
    const em_tdesc *mask = has_mask ? &k->in[fwd ? 3 : 6] : NULL;
    if (ok && mask) ok = desc_ok(mask, dt, B, H, Tq, Tk, true);
    if (ok && fwd) ok = desc_ok(&k->out[0], dt, B, H, Tq, Dv, false) && lse_ok(&k->out[1], dt, B, H, Tq);
    if (ok && !fwd)
        ok = desc_ok(&k->in[0], dt, B, H, Tq, Dv, false) && desc_ok(&k->in[4], dt, B, H, Tq, Dv, false) &&
             lse_ok(&k->in[5], dt, B, H, Tq) && desc_ok(&k->out[0], dt, B, H, Tq, D, false) &&
             desc_ok(&k->out[1], dt, B, H, Tk, D, false) && desc_ok(&k->out[2], dt, B, H, Tk, Dv, false);
    if (!ok) {
        em_ocl_error("attention (op %s): unsupported operands (dtype %d, ranks %d/%d/%d) or shapes",
                     em__kernel_info[k->kind].name, q->dtype, q->ndim, kk->ndim, v->ndim);
        return;
    }
    if (B * H == 0) return;
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "attention")) return;
    const bool f32 = dt == EM_F32;
    const int64_t geo[8] = {B, H, Tq, Tk, D, Dv, 0, 0};
    /* the mask's buffer, or q's as a placeholder the kernels never read */
    void *mbuf = buffers[has_mask ? (fwd ? 3 : 6) : nq];
    const em_tdesc none = {.dtype = dt, .ndim = 4};
    const em_tdesc *md = mask ? mask : &none;
    if (fwd) {
        const int kid = f32 ? EMK_sdpa_fwd_f32 : EMK_sdpa_fwd_f64;
        if (!c.d->k[kid]) {
            em_ocl_host_fallback(buffers, k);
            return;
        }
        em_ocl_args a = em_ocl_args_begin(&c, kid);
        for (int i = 0; i < 3; i++) arg_tensor(&a, buffers[i], &k->in[i]);
        arg_tensor(&a, mbuf, md);
        arg_tensor(&a, buffers[k->n_in], &k->out[0]);
        arg_tensor(&a, buffers[k->n_in + 1], &k->out[1]);
        em_ocl_arg_long8(&a, geo, 8);
        arg_params(&a, k, dt);
        em_ocl_launch_1d(&a, B * H * Tq, "sdpa");
        return;
    }
    const int kq = f32 ? EMK_sdpa_bwd_dq_f32 : EMK_sdpa_bwd_dq_f64, kkv = f32 ? EMK_sdpa_bwd_dkv_f32 : EMK_sdpa_bwd_dkv_f64;
    if (!c.d->k[kq] || !c.d->k[kkv]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        em_ocl_args a = em_ocl_args_begin(&c, pass == 0 ? kq : kkv);
        for (int i = 0; i < 6; i++) arg_tensor(&a, buffers[i], &k->in[i]);
        arg_tensor(&a, mbuf, md);
        if (pass == 0) {
            arg_tensor(&a, buffers[k->n_in], &k->out[0]);
        } else {
            arg_tensor(&a, buffers[k->n_in + 1], &k->out[1]);
            arg_tensor(&a, buffers[k->n_in + 2], &k->out[2]);
        }
        em_ocl_arg_long8(&a, geo, 8);
        arg_params(&a, k, dt);
        if (!em_ocl_launch_1d(&a, B * H * (pass == 0 ? Tq : Tk), pass == 0 ? "sdpa_bwd (dq)" : "sdpa_bwd (dk, dv)")) return;
    }
}
