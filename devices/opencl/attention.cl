/* Fused scaled-dot-product attention (the contract at the top of
 * tasks/attention.c; CPU reference devices/cpu/attention.c). Simple kernels,
 * one work-item per row, accumulating in T (float or double):
 *
 * em_sdpa_fwd_<T>     one work-item per query row (b, h, i): the online
 *     softmax over the keys one at a time (running max m and sum l, the
 *     accumulator rescaled when m grows), o = acc / l, lse = m + log l.
 * em_sdpa_bwd_dq_<T>  one per query row: delta_i = dout_i . o_i, then
 *     dq_i = scale sum_j p_ij (z_ij dout_i . v_j - delta_i) k_j with p
 *     recomputed from lse.
 * em_sdpa_bwd_dkv_<T> one per key row (b, h, j): dv_j = sum_i p_ij z_ij
 *     dout_i and dk_j = scale sum_i ds_ij q_i (delta_i recomputed).
 *
 * Every tensor is (buffer, byte offset, long8 d) with d.s0 its element
 * offset and d.s1 .. d.s4 its strides along B, H, the row and the column
 * (the last stride of q, k, v, o, dout is 1; the mask's may be anything,
 * 0 = broadcast). geo = (B, H, Tq, Tk, D, Dv). flags: 1 causal (j > i
 * masked), 2 has_mask (additive, -inf = masked), 4 dropout. Dropout keeps
 * (b, h, i, j) when (w0 >> 8) >= thr, w0 the first word of Philox at
 * counter offset + ((b H + h) Tq + i) Tk + j: thr = ceil(dropout_p 2^24)
 * (the host's), which is em_philox_u01(w0) >= dropout_p exactly. D, Dv <= 256. */

#define EM_SDPA_MAXD 256
#define EM_SDPA_AT(p, d, b, h, r) ((p) + (d).s0 + (b) * (d).s1 + (h) * (d).s2 + (r) * (d).s3)

inline bool em_sdpa_keep(ulong offset, ulong seed, uint thr, ulong e)
{
    uint w[4];
    em_philox4x32_10(offset + e, seed, w);
    return (w[0] >> 8) >= thr;
}

#define EM_DEF_SDPA(T, S)                                                                                          \
    /* s_ij of the contract: scale q_i . k_j (+ mask), -inf when causal masks it */                               \
    inline T em_sdpa_score_##S(__global const T *qi, __global const T *kj, __global const T *mrow, long8 md,       \
                               long i, long j, long D, T scale, int flags)                                          \
    {                                                                                                               \
        if ((flags & 1) && j > i) return -INFINITY;                                                                 \
        T acc = 0;                                                                                                  \
        for (long d = 0; d < D; d++) acc += qi[d] * kj[d];                                                          \
        acc *= scale;                                                                                               \
        if (flags & 2) acc += mrow[j * md.s4];                                                                      \
        return acc;                                                                                                 \
    }                                                                                                               \
    __kernel void em_sdpa_fwd_##S(__global const uchar *qb, long qboff, long8 qd, __global const uchar *kb,        \
                                  long kboff, long8 kd, __global const uchar *vb, long vboff, long8 vd,             \
                                  __global const uchar *mb, long mboff, long8 md, __global uchar *ob, long oboff,   \
                                  long8 od, __global uchar *lb, long lboff, long8 ld, long8 geo, T scale, uint thr, \
                                  ulong seed, ulong offset, T keep_scale, int flags)                                \
    {                                                                                                               \
        __global const T *Q = (__global const T *)(qb + qboff), *K = (__global const T *)(kb + kboff);              \
        __global const T *V = (__global const T *)(vb + vboff), *M = (__global const T *)(mb + mboff);              \
        __global T *O = (__global T *)(ob + oboff), *L = (__global T *)(lb + lboff);                                 \
        const long B = geo.s0, H = geo.s1, Tq = geo.s2, Tk = geo.s3, D = geo.s4, Dv = geo.s5;                       \
        T acc[EM_SDPA_MAXD];                                                                                        \
        EM_GRID_LOOP(row, B * H * Tq)                                                                               \
        {                                                                                                           \
            const long i = row % Tq, bh = row / Tq, h = bh % H, b = bh / H;                                         \
            __global const T *qi = EM_SDPA_AT(Q, qd, b, h, i);                                                      \
            __global const T *mrow = EM_SDPA_AT(M, md, b, h, i);                                                    \
            for (long d = 0; d < Dv; d++) acc[d] = 0;                                                               \
            T m = -INFINITY, l = 0;                                                                                 \
            const long jend = (flags & 1) ? min(Tk, i + 1) : Tk;                                                    \
            for (long j = 0; j < jend; j++) {                                                                       \
                const T s = em_sdpa_score_##S(qi, EM_SDPA_AT(K, kd, b, h, j), mrow, md, i, j, D, scale, flags);     \
                const T mx = s > m ? s : m;                                                                         \
                if (mx == -INFINITY) continue;                                                                      \
                const T alpha = exp(m - mx), p = exp(s - mx);                                                       \
                l = l * alpha + p;                                                                                  \
                m = mx;                                                                                             \
                T pz = p;                                                                                           \
                if ((flags & 4) && p != 0)                                                                          \
                    pz = em_sdpa_keep(offset, seed, thr, (ulong)(row * Tk + j)) ? p * keep_scale : (T)0;            \
                __global const T *vj = EM_SDPA_AT(V, vd, b, h, j);                                                  \
                for (long d = 0; d < Dv; d++) acc[d] = acc[d] * alpha + pz * vj[d];                                 \
            }                                                                                                       \
            __global T *oi = EM_SDPA_AT(O, od, b, h, i);                                                            \
            if (m == -INFINITY) {                                                                                   \
                L[ld.s0 + row] = -INFINITY;                                                                         \
                for (long d = 0; d < Dv; d++) oi[d] = NAN;                                                          \
            } else {                                                                                                \
                L[ld.s0 + row] = m + log(l);                                                                        \
                const T inv = (T)1 / l;                                                                             \
                for (long d = 0; d < Dv; d++) oi[d] = acc[d] * inv;                                                 \
            }                                                                                                       \
        }                                                                                                           \
    }                                                                                                               \
    __kernel void em_sdpa_bwd_dq_##S(__global const uchar *gb, long gboff, long8 gd, __global const uchar *qb,     \
                                     long qboff, long8 qd, __global const uchar *kb, long kboff, long8 kd,          \
                                     __global const uchar *vb, long vboff, long8 vd, __global const uchar *ob,      \
                                     long oboff, long8 od, __global const uchar *lb, long lboff, long8 ld,          \
                                     __global const uchar *mb, long mboff, long8 md, __global uchar *dqb,           \
                                     long dqboff, long8 dqd, long8 geo, T scale, uint thr, ulong seed,             \
                                     ulong offset, T keep_scale, int flags)                                         \
    {                                                                                                               \
        __global const T *G = (__global const T *)(gb + gboff), *Q = (__global const T *)(qb + qboff);              \
        __global const T *K = (__global const T *)(kb + kboff), *V = (__global const T *)(vb + vboff);              \
        __global const T *O = (__global const T *)(ob + oboff), *L = (__global const T *)(lb + lboff);              \
        __global const T *M = (__global const T *)(mb + mboff);                                                     \
        __global T *DQ = (__global T *)(dqb + dqboff);                                                              \
        const long B = geo.s0, H = geo.s1, Tq = geo.s2, Tk = geo.s3, D = geo.s4, Dv = geo.s5;                       \
        T acc[EM_SDPA_MAXD];                                                                                        \
        EM_GRID_LOOP(row, B * H * Tq)                                                                               \
        {                                                                                                           \
            const long i = row % Tq, bh = row / Tq, h = bh % H, b = bh / H;                                         \
            __global const T *qi = EM_SDPA_AT(Q, qd, b, h, i), *gi = EM_SDPA_AT(G, gd, b, h, i);                    \
            __global const T *oi = EM_SDPA_AT(O, od, b, h, i), *mrow = EM_SDPA_AT(M, md, b, h, i);                  \
            for (long d = 0; d < D; d++) acc[d] = 0;                                                                \
            const T lse = L[ld.s0 + row];                                                                           \
            if (lse != -INFINITY) {                                                                                 \
                T delta = 0;                                                                                        \
                for (long d = 0; d < Dv; d++) delta += gi[d] * oi[d];                                               \
                const long jend = (flags & 1) ? min(Tk, i + 1) : Tk;                                                \
                for (long j = 0; j < jend; j++) {                                                                   \
                    __global const T *kj = EM_SDPA_AT(K, kd, b, h, j);                                              \
                    const T p = exp(em_sdpa_score_##S(qi, kj, mrow, md, i, j, D, scale, flags) - lse);              \
                    if (p == 0) continue;                                                                           \
                    T dp = 0;                                                                                       \
                    const bool keep = !(flags & 4) || em_sdpa_keep(offset, seed, thr, (ulong)(row * Tk + j));       \
                    if (keep) {                                                                                     \
                        __global const T *vj = EM_SDPA_AT(V, vd, b, h, j);                                          \
                        for (long d = 0; d < Dv; d++) dp += gi[d] * vj[d];                                          \
                        if (flags & 4) dp *= keep_scale;                                                            \
                    }                                                                                               \
                    const T ds = p * (dp - delta) * scale;                                                          \
                    for (long d = 0; d < D; d++) acc[d] += ds * kj[d];                                              \
                }                                                                                                   \
            }                                                                                                       \
            __global T *dqi = EM_SDPA_AT(DQ, dqd, b, h, i);                                                         \
            for (long d = 0; d < D; d++) dqi[d] = acc[d];                                                           \
        }                                                                                                           \
    }                                                                                                               \
    __kernel void em_sdpa_bwd_dkv_##S(__global const uchar *gb, long gboff, long8 gd, __global const uchar *qb,    \
                                      long qboff, long8 qd, __global const uchar *kb, long kboff, long8 kd,         \
                                      __global const uchar *vb, long vboff, long8 vd, __global const uchar *ob,     \
                                      long oboff, long8 od, __global const uchar *lb, long lboff, long8 ld,         \
                                      __global const uchar *mb, long mboff, long8 md, __global uchar *dkb,          \
                                      long dkboff, long8 dkd, __global uchar *dvb, long dvboff, long8 dvd,          \
                                      long8 geo, T scale, uint thr, ulong seed, ulong offset, T keep_scale,         \
                                      int flags)                                                                    \
    {                                                                                                               \
        __global const T *G = (__global const T *)(gb + gboff), *Q = (__global const T *)(qb + qboff);              \
        __global const T *K = (__global const T *)(kb + kboff), *V = (__global const T *)(vb + vboff);              \
        __global const T *O = (__global const T *)(ob + oboff), *L = (__global const T *)(lb + lboff);              \
        __global const T *M = (__global const T *)(mb + mboff);                                                     \
        __global T *DK = (__global T *)(dkb + dkboff), *DV = (__global T *)(dvb + dvboff);                          \
        const long B = geo.s0, H = geo.s1, Tq = geo.s2, Tk = geo.s3, D = geo.s4, Dv = geo.s5;                       \
        T ak[EM_SDPA_MAXD], av[EM_SDPA_MAXD];                                                                       \
        EM_GRID_LOOP(col, B * H * Tk)                                                                               \
        {                                                                                                           \
            const long j = col % Tk, bh = col / Tk, h = bh % H, b = bh / H;                                         \
            __global const T *kj = EM_SDPA_AT(K, kd, b, h, j), *vj = EM_SDPA_AT(V, vd, b, h, j);                    \
            for (long d = 0; d < D; d++) ak[d] = 0;                                                                 \
            for (long d = 0; d < Dv; d++) av[d] = 0;                                                                \
            for (long i = (flags & 1) ? j : 0; i < Tq; i++) {                                                       \
                const long row = bh * Tq + i;                                                                       \
                const T lse = L[ld.s0 + row];                                                                       \
                if (lse == -INFINITY) continue;                                                                     \
                __global const T *qi = EM_SDPA_AT(Q, qd, b, h, i), *gi = EM_SDPA_AT(G, gd, b, h, i);                \
                __global const T *mrow = EM_SDPA_AT(M, md, b, h, i);                                                \
                const T p = exp(em_sdpa_score_##S(qi, kj, mrow, md, i, j, D, scale, flags) - lse);                  \
                if (p == 0) continue;                                                                               \
                __global const T *oi = EM_SDPA_AT(O, od, b, h, i);                                                  \
                T delta = 0, dp = 0;                                                                                \
                for (long d = 0; d < Dv; d++) delta += gi[d] * oi[d];                                               \
                const bool keep = !(flags & 4) || em_sdpa_keep(offset, seed, thr, (ulong)(row * Tk + j));           \
                if (keep) {                                                                                         \
                    const T pz = (flags & 4) ? p * keep_scale : p;                                                  \
                    for (long d = 0; d < Dv; d++) {                                                                 \
                        av[d] += pz * gi[d];                                                                        \
                        dp += gi[d] * vj[d];                                                                        \
                    }                                                                                               \
                    if (flags & 4) dp *= keep_scale;                                                                \
                }                                                                                                   \
                const T ds = p * (dp - delta) * scale;                                                              \
                for (long d = 0; d < D; d++) ak[d] += ds * qi[d];                                                   \
            }                                                                                                       \
            __global T *dkj = EM_SDPA_AT(DK, dkd, b, h, j), *dvj = EM_SDPA_AT(DV, dvd, b, h, j);                    \
            for (long d = 0; d < D; d++) dkj[d] = ak[d];                                                            \
            for (long d = 0; d < Dv; d++) dvj[d] = av[d];                                                           \
        }                                                                                                           \
    }

EM_DEF_SDPA(float, f32)
#ifdef EM_FP64
EM_DEF_SDPA(double, f64)
#endif
