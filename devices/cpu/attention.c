/* CPU kernels of the attention family: fused scaled-dot-product attention
 * forward (SDPA) and backward (SDPA_BWD), f32 and f64 (the door widens f16 /
 * bf16 ops: these kernels only see f32 / f64). The contract (shapes,
 * strides, the online softmax, dropout's Philox counters, FlashAttention-2's
 * backward) is at the top of tasks/attention.c; the loops are in
 * devices/cpu/attention_impl.inc, instantiated once per type. This is the
 * CPU reference every other backend is compared with (tests/test_consistency.c)
 * and itself is checked against the composed math path (tests/test_attention.c). */
#include "devices/cpu/cpu.h"
#include "devices/philox.h"

#include <math.h>
#include <string.h>
#include <tgmath.h> /* exp / log of the compute type (expf for float) */

/* Query rows per block and keys per tile (the score buffer is AT_BR x AT_BC). */
#define AT_BR 16
#define AT_BC 64

/* The geometry both kernels read, from the descriptors. */
typedef struct at_geom {
    const em_kargs *k;
    int n_in, has_mask, causal;
    int64_t B, H, Tq, Tk, D, Dv;
    /* row strides (elements) of q, k, v, o / dout, o (backward), dq, dk, dv */
    int64_t q_st, k_st, v_st, o_st, g_st, oi_st, dq_st, dk_st, dv_st;
    int64_t m_si, m_sj; /* the mask's strides along i and j (any, 0 = broadcast) */
    int64_t l_s0, l_s1, l_s2; /* lse's strides (contiguous per the contract; a CPU tile's is a narrowed view) */
    double scale, dropout_p, keep_scale;
    uint64_t seed, offset;
} at_geom;

#define AT_T float
#define AT_SFX f32
#include "devices/cpu/attention_impl.inc"
#undef AT_T
#undef AT_SFX
#define AT_T double
#define AT_SFX f64
#include "devices/cpu/attention_impl.inc"
#undef AT_T
#undef AT_SFX

/* A [B, H, rows, cols] descriptor of dtype dt with unit last stride (or a
 * single column). */
static bool at_desc(const em_tdesc *t, int dt, int64_t B, int64_t H, int64_t rows, int64_t cols)
{
    return t->dtype == dt && t->ndim == 4 && t->shape[0] == B && t->shape[1] == H && t->shape[2] == rows &&
           t->shape[3] == cols && (t->strides[3] == 1 || cols == 1);
}

/* The mask: [B, H, Tq, Tk] of dtype dt, any strides. */
static bool at_mask(const em_tdesc *t, int dt, int64_t B, int64_t H, int64_t Tq, int64_t Tk)
{
    return t->dtype == dt && t->ndim == 4 && t->shape[0] == B && t->shape[1] == H && t->shape[2] == Tq && t->shape[3] == Tk;
}

/* lse: [B, H, Tq] of dtype dt (contiguous from the front end; a CPU tile
 * (tasks/attention.c) sees a narrowed view, so the strides are honoured). */
static bool at_lse(const em_tdesc *t, int dt, int64_t B, int64_t H, int64_t Tq)
{
    return t->dtype == dt && t->ndim == 3 && t->shape[0] == B && t->shape[1] == H && t->shape[2] == Tq;
}

/* Checks the operands against the contract and fills g; false: not an
 * operand set of the contract (an Ember bug: the front end builds them). */
static bool at_geometry(const em_kargs *k, at_geom *g)
{
    memset(g, 0, sizeof *g);
    g->k = k;
    const bool fwd = k->kind == EM_OP_SDPA;
    g->has_mask = k->p.attn.has_mask != 0;
    g->n_in = k->n_in;
    if (k->n_in != (fwd ? 3 : 6) + g->has_mask || k->n_out != (fwd ? 2 : 3)) return false;
    const em_tdesc *q = &k->in[fwd ? 0 : 1], *kk = &k->in[fwd ? 1 : 2], *v = &k->in[fwd ? 2 : 3];
    const int dt = q->dtype;
    if (q->ndim != 4 || kk->ndim != 4 || v->ndim != 4) return false;
    g->B = q->shape[0], g->H = q->shape[1], g->Tq = q->shape[2], g->D = q->shape[3];
    g->Tk = kk->shape[2], g->Dv = v->shape[3];
    if (g->B < 0 || g->H < 0 || g->Tq < 1 || g->Tk < 1 || g->D < 1 || g->D > 256 || g->Dv < 1 || g->Dv > 256) return false;
    if (!at_desc(q, dt, g->B, g->H, g->Tq, g->D) || !at_desc(kk, dt, g->B, g->H, g->Tk, g->D) ||
        !at_desc(v, dt, g->B, g->H, g->Tk, g->Dv))
        return false;
    const em_tdesc *mask = g->has_mask ? &k->in[fwd ? 3 : 6] : NULL;
    if (mask && !at_mask(mask, dt, g->B, g->H, g->Tq, g->Tk)) return false;
    g->q_st = q->strides[2], g->k_st = kk->strides[2], g->v_st = v->strides[2];
    if (mask) g->m_si = mask->strides[2], g->m_sj = mask->strides[3];
    if (fwd) {
        if (!at_desc(&k->out[0], dt, g->B, g->H, g->Tq, g->Dv) || !at_lse(&k->out[1], dt, g->B, g->H, g->Tq)) return false;
        g->o_st = k->out[0].strides[2];
        g->l_s0 = k->out[1].strides[0], g->l_s1 = k->out[1].strides[1], g->l_s2 = k->out[1].strides[2];
    } else {
        if (!at_desc(&k->in[0], dt, g->B, g->H, g->Tq, g->Dv) || !at_desc(&k->in[4], dt, g->B, g->H, g->Tq, g->Dv) ||
            !at_lse(&k->in[5], dt, g->B, g->H, g->Tq) || !at_desc(&k->out[0], dt, g->B, g->H, g->Tq, g->D) ||
            !at_desc(&k->out[1], dt, g->B, g->H, g->Tk, g->D) || !at_desc(&k->out[2], dt, g->B, g->H, g->Tk, g->Dv))
            return false;
        g->g_st = k->in[0].strides[2], g->oi_st = k->in[4].strides[2];
        g->l_s0 = k->in[5].strides[0], g->l_s1 = k->in[5].strides[1], g->l_s2 = k->in[5].strides[2];
        g->dq_st = k->out[0].strides[2], g->dk_st = k->out[1].strides[2], g->dv_st = k->out[2].strides[2];
    }
    g->causal = k->p.attn.is_causal != 0;
    g->scale = k->p.attn.scale;
    g->dropout_p = k->p.attn.dropout_p;
    if (!(g->dropout_p >= 0 && g->dropout_p <= 1)) return false;
    g->keep_scale = g->dropout_p < 1 ? 1.0 / (1.0 - g->dropout_p) : 0.0;
    g->seed = k->p.attn.seed, g->offset = k->p.attn.offset;
    return true;
}

void em_cpu_attention(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    if (k->kind != EM_OP_SDPA && k->kind != EM_OP_SDPA_BWD) {
        em_cpu_bad_kind("attention", k->kind);
        return;
    }
    const int dt = k->in[k->kind == EM_OP_SDPA ? 0 : 1].dtype;
    if (dt != EM_F32 && dt != EM_F64) {
        em_cpu_bad_kind("attention dtype", dt);
        return;
    }
    at_geom g;
    if (!at_geometry(k, &g)) {
        em_cpu_bad_kind("attention operands", k->kind);
        return;
    }
    void *bufs[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in + k->n_out; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    const size_t es = dt == EM_F32 ? sizeof(float) : sizeof(double);
    /* forward: scores (AT_BR x AT_BC), accumulator (AT_BR x Dv), m and l
     * (2 AT_BR), the transposed key tile (D x AT_BC); backward: scores and
     * dp (2 AT_BR x AT_BC), transposed key and value tiles ((D + Dv) x
     * AT_BC), delta (AT_BR) */
    const size_t tile = (size_t)AT_BR * AT_BC;
    const size_t n = k->kind == EM_OP_SDPA ? tile + (size_t)AT_BR * (size_t)g.Dv + 2 * AT_BR + (size_t)g.D * AT_BC
                                           : 2 * tile + (size_t)(g.D + g.Dv) * AT_BC + AT_BR;
    void *scratch = malloc(n * es);
    if (!scratch) {
        em__kernel_error(NULL, EM_ERR_NOMEM, "%s: out of memory for %zu bytes of scratch", em__kernel_info[k->kind].name,
                         n * es);
        return;
    }
#define AT_RUN(T, SFX)                                                                                                \
    do {                                                                                                              \
        T *s_ = scratch;                                                                                              \
        if (k->kind == EM_OP_SDPA) {                                                                                  \
            T *acc_ = s_ + tile, *ml_ = acc_ + (size_t)AT_BR * (size_t)g.Dv, *kt_ = ml_ + 2 * AT_BR;                   \
            at_forward_##SFX(&g, bufs, s_, acc_, ml_, kt_);                                                           \
        } else {                                                                                                      \
            T *dp_ = s_ + tile, *kt_ = dp_ + tile, *vt_ = kt_ + (size_t)g.D * AT_BC, *delta_ = vt_ + (size_t)g.Dv * AT_BC; \
            at_backward_##SFX(&g, bufs, s_, dp_, kt_, vt_, delta_);                                                   \
        }                                                                                                             \
    } while (0)
    if (dt == EM_F32)
        AT_RUN(float, f32);
    else
        AT_RUN(double, f64);
#undef AT_RUN
    free(scratch);
}
