/* Fused scaled-dot-product attention: em__sdpa (em_scaled_dot_product_attention's
 * fused path, nn/transformer.c) and em__sdpa_bwd (its backward rule bw_sdpa,
 * autodiff/rules.c). One task forward (SDPA) and one backward (SDPA_BWD)
 * instead of the composed matmul / masked_fill / softmax / dropout / matmul
 * chain, and no [Tq, Tk] score tensor in memory.
 *
 * Kernel contract (every backend: devices/cpu/attention.c, devices/cuda/
 * attention.cu, devices/opencl/attention.c + attention.cl). The family is
 * `attention`: each backend defines em_<backend>_attention(buffers, cl_arg);
 * the buffers are the n_in inputs then the n_out outputs, in order, and
 * cl_arg is an em_kargs whose parameters are p.attn = {scale, dropout_p,
 * seed, offset, is_causal, has_mask}. SDPA has 3 inputs, or 4 with the mask;
 * SDPA_BWD 6, or 7 with the mask (ops.def gives the maxima).
 *
 * Shapes and layouts. Every operand is a 4-D descriptor [B, H, T, D] (the
 * front end reshapes rank 2, 3 and 5+ inputs; it makes an operand contiguous
 * only when it cannot be seen as 4-D with a unit last stride). Element
 * strides are arbitrary — the B and H strides need not be related, since q,
 * k and v are typically views into one [B, T, 3, H, D] buffer — except the
 * last dim of q, k, v, dout and o, whose stride is 1. Offsets are in
 * elements, as for every operand.
 *   q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv], one dtype T in
 *   {f32, f64, f16, bf16}; 1 <= D, Dv <= 256; Tq, Tk >= 1.
 *   mask (optional, when has_mask): ADDITIVE, dtype T, descriptor
 *   [B, H, Tq, Tk] whose strides may be 0 on any dim (broadcast); -inf means
 *   masked. (The front end turns a bool mask into 0 / -inf.)
 *   o [B, H, Tq, Dv], dtype T, strides as its descriptor says: the front end
 *   lays a 4-D output out as [B, Tq, H, Dv] in memory so that merging the
 *   heads afterwards is a view; kernels honour out[0]'s strides.
 *   lse [B, H, Tq], contiguous, f32 when T is f32, f16 or bf16, f64 when T
 *   is f64.
 * 16 bits: native on CUDA (load T, compute in f32, store T). On the CPU and
 * OpenCL the door widens the op (their kernels only see f32 / f64).
 *
 * Forward (SDPA). Accumulate in f32 (f64 for f64). For each (b, h, i):
 *   s_ij = scale * sum_d q[b,h,i,d] k[b,h,j,d]  (+ mask[b,h,i,j] when has_mask)
 *   is_causal: s_ij = -inf for j > i (top-left aligned: torch's
 *   tril(ones(Tq, Tk)), also when Tq != Tk)
 *   m_i = max_j s_ij,  l_i = sum_j exp(s_ij - m_i),  lse_i = m_i + log(l_i)
 *   p_ij = exp(s_ij - lse_i)
 *   keep_ij = dropout_p == 0 || u_ij >= dropout_p, with u_ij =
 *   em_philox_u01(w[0]) where em_philox4x32_10(offset + e, seed, w) and
 *   e = ((b H + h) Tq + i) Tk + j (devices/philox.h). u_ij is a multiple of
 *   2^-24, so u_ij >= dropout_p is the same test as
 *   (w[0] >> 8) >= ceil(dropout_p 2^24) (the OpenCL kernels use that form).
 *   z_ij = keep_ij ? 1 / (1 - dropout_p) : 0   (dropout_p == 1: every z = 0)
 *   o[b,h,i,:] = sum_j p_ij z_ij v[b,h,j,:]
 * computed with the online softmax over key tiles (a running max and sum,
 * the accumulator rescaled when the max grows: Milakov & Gimelshein 2018,
 * FlashAttention, Dao et al. 2022): never a Tq x Tk buffer in memory. A row
 * whose keys are all masked (every s_ij = -inf) gives lse_i = -inf and
 * o = NaN (torch's math path gives NaN too). dropout_p is only > 0 in
 * training; the front end takes (seed, offset) from the global generator
 * (em__rng_reserve) and reserves B H Tq Tk counters.
 *
 * Backward (SDPA_BWD). in = dout [B, H, Tq, Dv], q, k, v, o, lse, [mask];
 * out = dq [B, H, Tq, D], dk [B, H, Tk, D], dv [B, H, Tk, Dv], contiguous,
 * dtype T, written whole. The same parameters as the forward (the same seed
 * and offset regenerate the same keep mask). FlashAttention-2's backward
 * (Dao 2023, Algorithm 2):
 *   delta_i = sum_d dout[i,d] o[i,d]
 *   p_ij  = exp(s_ij - lse_i)          (0 where s_ij = -inf)
 *   dv_j  = sum_i p_ij z_ij dout_i
 *   dp_ij = z_ij (dout_i . v_j)
 *   ds_ij = p_ij (dp_ij - delta_i)
 *   dq_i  = scale sum_j ds_ij k_j
 *   dk_j  = scale sum_i ds_ij q_i
 * No gradient flows to the mask (the public function uses the composed math
 * path when the mask requires grad). Rows with lse_i = -inf contribute
 * nothing: kernels skip them (their o is NaN, and 0 * NaN must not reach dq,
 * dk, dv). */
#include "tasks/tasks_internal.h"

#include <math.h>
#include <string.h>

/* An unscoped reference to t if it is a 4-D operand with a unit last stride,
 * else to a contiguous copy (NULL on failure). */
static em_tensor *unit_last(const em_tensor *t)
{
    if (t->ndim == 4 && (t->strides[3] == 1 || t->shape[3] == 1)) return em_tensor_retain((em_tensor *)t);
    return em__contiguous_operand(t);
}

/* The 4-D view [B, H, T, D] of a rank nd >= 2 tensor (scoped): rank 2 gets
 * B = H = 1, rank 3 B = 1, rank 5+ merges the leading dims into B. */
static em_tensor *as4(const em_tensor *t)
{
    if (!t) return NULL; /* the failed op before it set the error */
    if (t->ndim == 4) return (em_tensor *)t;
    const int nd = t->ndim;
    int64_t s[4] = {1, 1, t->shape[nd - 2], t->shape[nd - 1]};
    if (nd == 3) s[1] = t->shape[0];
    if (nd >= 5) {
        s[1] = t->shape[nd - 3];
        s[0] = em__numel(t->shape, nd - 3);
    }
    return em_reshape(t, s, 4);
}

em_tensor *em__sdpa(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask, bool is_causal,
                    double dropout_p, double scale, bool training)
{
    static const char *fn = "em_scaled_dot_product_attention (fused)";
    if (!q || !k || !v) return em__fail(EM_ERR_INVALID, "%s: %s is NULL", fn, !q ? "query" : !k ? "key" : "value");
    const em_tensor *ins[3] = {q, k, v};
    em_tensor *ac[3]; /* autocast: attention in the region's low dtype, as matmul */
    EM_AUTOCAST_RERUN(EM_OP_SDPA, ins, 3, ac, em__sdpa(ac[0], ac[1], ac[2], mask, is_causal, dropout_p, scale, training));
    const int nd = q->ndim;
    const em_dtype dt = q->dtype;
    if (!em_dtype_is_float(dt) || k->dtype != dt || v->dtype != dt)
        return em__fail(EM_ERR_DTYPE, "%s: query, key and value must have one float dtype, got %s, %s, %s", fn,
                        em_dtype_name(dt), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
    if (nd < 2 || k->ndim != nd || v->ndim != nd)
        return em__fail(EM_ERR_SHAPE, "%s: query, key and value must have one rank >= 2, got %d, %d, %d", fn, nd, k->ndim,
                        v->ndim);
    for (int d = 0; d < nd - 2; d++)
        if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d])
            return em__fail(EM_ERR_SHAPE, "%s: leading dim %d differs (query %lld, key %lld, value %lld)", fn, d,
                            (long long)q->shape[d], (long long)k->shape[d], (long long)v->shape[d]);
    const int64_t Tq = q->shape[nd - 2], Tk = k->shape[nd - 2], D = q->shape[nd - 1], Dv = v->shape[nd - 1];
    if (k->shape[nd - 1] != D || v->shape[nd - 2] != Tk)
        return em__fail(EM_ERR_SHAPE, "%s: key [.., %lld, %lld] does not match query [.., %lld, %lld] / value [.., %lld, %lld]",
                        fn, (long long)Tk, (long long)k->shape[nd - 1], (long long)Tq, (long long)D,
                        (long long)v->shape[nd - 2], (long long)Dv);
    if (D < 1 || D > 256 || Dv < 1 || Dv > 256 || Tq < 1 || Tk < 1)
        return em__fail(EM_ERR_SHAPE, "%s: head dims must be in 1..256 and lengths >= 1, got D %lld, Dv %lld, Tq %lld, Tk %lld", fn,
                        (long long)D, (long long)Dv, (long long)Tq, (long long)Tk);
    if (mask && is_causal) return em__fail(EM_ERR_INVALID, "%s: an explicit mask together with is_causal", fn);
    if (mask && mask->requires_grad) return em__fail(EM_ERR_INVALID, "%s: the fused op gives no gradient to the mask", fn);
    if (mask && mask->dtype != EM_BOOL && !em_dtype_is_float(mask->dtype))
        return em__fail(EM_ERR_DTYPE, "%s: mask must be bool or float, got %s", fn, em_dtype_name(mask->dtype));
    if (!(scale > 0) || !isfinite(scale)) return em__fail(EM_ERR_INVALID, "%s: scale must be finite and > 0, got %g", fn, scale);
    if (!(dropout_p >= 0 && dropout_p <= 1)) return em__fail(EM_ERR_INVALID, "%s: dropout_p must be in [0, 1], got %g", fn, dropout_p);

    em_scope_begin();
    em_tensor *q4 = as4(q), *k4 = as4(k), *v4 = as4(v), *m4 = NULL;
    const int64_t B = q4 ? q4->shape[0] : 0, H = q4 ? q4->shape[1] : 0;
    if (mask) {
        /* additive, of q's dtype, broadcast (stride 0) to the scores [.., Tq, Tk], then 4-D */
        em_tensor *am = mask->dtype == EM_BOOL
                            ? em_masked_fill(em_zeros(mask->shape, mask->ndim, dt), em_logical_not(mask), -INFINITY)
                            : em_cast(mask, dt);
        int64_t ss[EM_MAX_DIMS];
        memcpy(ss, q->shape, sizeof(int64_t) * (size_t)nd);
        ss[nd - 1] = Tk;
        if (am && am->ndim > nd) am = em__fail(EM_ERR_SHAPE, "%s: mask of rank %d for scores of rank %d", fn, am->ndim, nd);
        m4 = am ? as4(em_expand(am, ss, nd)) : NULL;
        if (!m4) {
            em_scope_end();
            return NULL;
        }
    }
    em_tensor *in[4] = {q4 ? unit_last(q4) : NULL, k4 ? unit_last(k4) : NULL, v4 ? unit_last(v4) : NULL, m4};
    if (!in[0] || !in[1] || !in[2]) {
        for (int i = 0; i < 3; i++) em_tensor_release(in[i]);
        em_scope_end();
        return NULL;
    }
    /* o: [B, Tq, H, Dv] in memory for a 4-D output (merging the heads is then
     * a view), seen as [B, H, Tq, Dv]; lse [B, H, Tq] f32 (f64 for f64) */
    em_tensor *o = NULL;
    if (nd == 4) {
        const int64_t mem[4] = {B, Tq, H, Dv};
        const int64_t shp[4] = {B, H, Tq, Dv}, st[4] = {Tq * H * Dv, Dv, H * Dv, 1};
        em_tensor *base = em__tensor_new(dt, mem, 4);
        o = base ? em__tensor_view(base, shp, st, 4, 0) : NULL;
        em_tensor_release(base);
    } else {
        const int64_t shp[4] = {B, H, Tq, Dv};
        o = em__tensor_new(dt, shp, 4);
    }
    const int64_t ls[3] = {B, H, Tq};
    em_tensor *lse = o ? em__tensor_new(dt == EM_F64 ? EM_F64 : EM_F32, ls, 3) : NULL;
    /* autodiff records the 4-D operands, not the unrecorded unit-stride copies */
    em_op op = {.kind = EM_OP_SDPA, .n_in = mask ? 4 : 3, .n_out = 2, .in = {in[0], in[1], in[2], in[3]}, .out = {o, lse},
                .orig_in = {q4, k4, v4, m4}};
    op.p.attn.scale = scale;
    op.p.attn.is_causal = is_causal;
    op.p.attn.has_mask = mask != NULL;
    if (training && dropout_p > 0) {
        op.p.attn.dropout_p = dropout_p;
        em__rng_reserve((uint64_t)(B * H * Tq * Tk), &op.p.attn.seed, &op.p.attn.offset);
    }
    em_status s = lse ? em__submit(&op) : em_last_status();
    for (int i = 0; i < 3; i++) em_tensor_release(in[i]);
    em_tensor_release(lse); /* the node keeps it (F_SAVE_AUX) when recorded */
    if (s != EM_OK) {
        em_tensor_release(o);
        em_scope_end();
        return NULL;
    }
    em_tensor *r = em__publish(o);
    if (nd != 4) {
        int64_t os[EM_MAX_DIMS];
        memcpy(os, q->shape, sizeof(int64_t) * (size_t)nd);
        os[nd - 1] = Dv;
        r = em_reshape(r, os, nd);
    }
    if (r) em_keep(r);
    em_scope_end();
    return r;
}

em_status em__sdpa_bwd(const em_tensor *dout, const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                       const em_tensor *lse, const em_tensor *mask, const union em_op_params *p, em_tensor **dq,
                       em_tensor **dk, em_tensor **dv)
{
    *dq = *dk = *dv = NULL;
    const em_tensor *orig[5] = {dout, q, k, v, o};
    em_tensor *in[7] = {0};
    bool ok = true;
    for (int i = 0; i < 5 && ok; i++) ok = (in[i] = unit_last(orig[i])) != NULL;
    if (ok) {
        in[5] = em_tensor_retain((em_tensor *)lse);
        in[6] = mask ? em_tensor_retain((em_tensor *)mask) : NULL;
    }
    em_tensor *out[3] = {0};
    if (ok) ok = (out[0] = em__tensor_new(q->dtype, q->shape, 4)) != NULL;
    if (ok) ok = (out[1] = em__tensor_new(k->dtype, k->shape, 4)) != NULL;
    if (ok) ok = (out[2] = em__tensor_new(v->dtype, v->shape, 4)) != NULL;
    em_status s = em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    if (ok) {
        em_op op = {.kind = EM_OP_SDPA_BWD, .n_in = mask ? 7 : 6, .n_out = 3, .out = {out[0], out[1], out[2]},
                    .p = *p, .flags = EM_OPF_NO_RECORD};
        for (int i = 0; i < 7; i++) op.in[i] = in[i];
        s = em__submit(&op);
    }
    for (int i = 0; i < 7; i++) em_tensor_release(in[i]);
    if (!ok || s != EM_OK) {
        for (int i = 0; i < 3; i++) em_tensor_release(out[i]);
        return s;
    }
    *dq = em__publish(out[0]);
    *dk = em__publish(out[1]);
    *dv = em__publish(out[2]);
    return EM_OK;
}

/* ---- tiling over CPU workers ------------------------------------------------
 * An SDPA or SDPA_BWD op on a CPU-only placement with >= 2 CPU workers and
 * more than EMBER_SDPA_TILE_MIN_FLOPS (default 2e6) is cut along B (or H
 * when it has more entries) into T tasks (EMBER_SDPA_TILES, default one per
 * CPU worker, at most the dim's size) that run concurrently
 * (em__cpu_tiles). As for matmul (tasks/matmul.c explains why tiles are not
 * StarPU partition children): tile 0 writes its slice of every output
 * straight into the outputs, tiles t >= 1 into temporaries that COPY tasks
 * then place. Each tile's kernel sees narrowed descriptors, so the dropout
 * counters e = ((b H + h) Tq + i) Tk + j of the contract are shifted by the
 * tile's offset: a split along B adds b0 H Tq Tk; a split along H is only
 * taken without dropout or with B = 1 (then h0 Tq Tk). */
em_status em__sdpa_submit(em_op *op)
{
    const bool fwd = op->kind == EM_OP_SDPA;
    const em_tensor *q = op->in[fwd ? 0 : 1];
    const int64_t B = q->shape[0], H = q->shape[1], Tq = q->shape[2], D = q->shape[3];
    const int64_t Tk = op->in[fwd ? 1 : 2]->shape[2], Dv = op->in[fwd ? 2 : 3]->shape[3];
    /* forward 2 Tq Tk (D + Dv) per head (scores, p v), backward about twice that */
    const double flops = (fwd ? 2.0 : 5.0) * (double)(B * H) * (double)Tq * (double)Tk * (double)(D + Dv);
    int T = em__cpu_tiles(op, flops, "EMBER_SDPA_TILE_MIN_FLOPS", 2e6, "EMBER_SDPA_TILES");
    const bool dropout = op->p.attn.dropout_p > 0;
    int dim = (B >= T || B >= H || (dropout && B > 1)) ? 0 : 1;
    const int64_t len = dim == 0 ? B : H;
    if (T > len) T = (int)len;
    em_op sub = *op;
    sub.flags |= EM_OPF_RAW;
    if (T <= 1) return em__submit(&sub);
    em_kargs k;
    em__kargs_from_op(op, &k);
    /* temporaries stay alive until every task is submitted (see matmul) */
    em_tensor *tmp[EM_MAX_TILES][3];
    memset(tmp, 0, sizeof tmp);
    int64_t s0s[EM_MAX_TILES + 1];
    for (int t = 0; t <= T; t++) s0s[t] = len * t / T;
    const uint64_t per = (uint64_t)(dim == 0 ? H : 1) * (uint64_t)Tq * (uint64_t)Tk; /* counters per index of dim */
    em_status st = EM_OK;
    for (int t = 0; t < T && st == EM_OK; t++) {
        const int64_t s0 = s0s[t], rows = s0s[t + 1] - s0;
        em_kargs tk = k;
        for (int i = 0; i < tk.n_in; i++) em__tdesc_narrow(&tk.in[i], dim, s0, rows);
        for (int i = 0; i < tk.n_out; i++) em__tdesc_narrow(&tk.out[i], dim, s0, rows);
        tk.p.attn.offset += (uint64_t)s0 * per;
        em_op ts = sub;
        ts.kargs = &tk;
        for (int i = 0; t > 0 && i < op->n_out && st == EM_OK; i++) {
            const em_tensor *o = op->out[i];
            int64_t shape[4];
            memcpy(shape, o->shape, sizeof(int64_t) * (size_t)o->ndim);
            shape[dim] = rows;
            if (!(tmp[t][i] = em__tensor_new(o->dtype, shape, o->ndim))) {
                st = em_last_status();
                break;
            }
            em__tdesc(tmp[t][i], &tk.out[i]);
            ts.out[i] = tmp[t][i];
        }
        if (st == EM_OK) st = em__submit(&ts);
    }
    /* place tiles 1..T-1 */
    for (int t = 1; t < T && st == EM_OK; t++)
        for (int i = 0; i < op->n_out && st == EM_OK; i++) {
            const em_tensor *o = op->out[i];
            em_tensor *view = em__tensor_view(o, tmp[t][i]->shape, o->strides, o->ndim, o->offset + s0s[t] * o->strides[dim]);
            if (!view) {
                st = em_last_status();
                break;
            }
            em_op cop = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {tmp[t][i]}, .out = {view},
                         .flags = EM_OPF_RAW, .priority = op->priority, .after = op->after};
            st = em__submit(&cop);
            em_tensor_release(view);
        }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < 3; i++) em_tensor_release(tmp[t][i]);
    return st;
}
