/* Fused training-mode batch norm and fused layer norm (contracts at the top
 * of tasks/norm.c; CPU reference devices/cpu/norm.c). Sums accumulate in
 * acc_t (double when the device has fp64), in two passes (the mean, then
 * the squared deviations from it). Work-group sizes are powers of two.
 *
 * Batch norm: one work-group per channel; x / dy / y / dx [N, C, L]
 * contiguous from their element offsets, weight / bias / dweight / dbias
 * [C], stats [2, C].
 * em_bn_fwd_<T>(x, w, b, y, stats, N, C, L, eps, lv)        lv: wg acc_t
 * em_bn_bwd_<T>(dy, x, stats, w, dx, dw, db, N, C, L, eps, lv)   lv: 2 wg acc_t
 * em_bn_running_<T>(stats, rm, rv, C, m, keep, u)   grid-stride over C, in T
 *     with the composed update's roundings (FP_CONTRACT is off)
 *
 * Layer norm: x / y / dy / dx [M, N] rows, weight / bias / dweight / dbias
 * [N], stats [2, M] = (mean, rstd), all contiguous from their offsets.
 * em_ln_fwd_<T>(x, w, b, y, stats, M, N, eps, lv)   one work-group per row; lv: wg acc_t
 * em_ln_bwd_<T>(dy, x, stats, w, dx, M, N, lv)      one work-group per row (dx); lv: 2 wg acc_t
 * em_ln_bwd_wb_<T>(dy, x, stats, dw, db, M, N)      grid-stride over the N columns, each
 *     summing its M rows in order (dweight, dbias) */

/* Work-group sums of a and b at once (lv holds 2 wg entries). */
inline void em_bn_sum2(__local acc_t *lv, acc_t *a, acc_t *b)
{
    const int lid = get_local_id(0), wg = get_local_size(0);
    lv[lid] = *a;
    lv[wg + lid] = *b;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg >> 1; s > 0; s >>= 1) {
        if (lid < s) {
            lv[lid] += lv[lid + s];
            lv[wg + lid] += lv[wg + lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    *a = lv[0];
    *b = lv[wg];
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* Element j (0 <= j < N * L) of channel c. */
#define EM_BN_AT(j) ((((j) / L) * C + c) * L + (j) % L)

#define EM_DEF_BN(T, S)                                                                                            \
    __kernel void em_bn_fwd_##S(__global const uchar *xb, long xboff, long xe, __global const uchar *wb, long wboff, \
                                long we, __global const uchar *bb, long bboff, long be, __global uchar *yb,         \
                                long yboff, long ye, __global uchar *sb, long sboff, long se, long N, long C,       \
                                long L, acc_t eps, __local acc_t *lv)                                               \
    {                                                                                                               \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                                \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                               \
        __global const T *Bs = (__global const T *)(bb + bboff) + be;                                               \
        __global T *Y = (__global T *)(yb + yboff) + ye;                                                            \
        __global T *ST = (__global T *)(sb + sboff) + se;                                                           \
        const long c = get_group_id(0), M = N * L;                                                                  \
        const int lid = get_local_id(0), wg = get_local_size(0);                                                    \
        if (c >= C) return;                                                                                         \
        acc_t s = 0;                                                                                                \
        for (long j = lid; j < M; j += wg) s += (acc_t)X[EM_BN_AT(j)];                                              \
        const acc_t mean = M > 0 ? em_tree_sum(lv, s) / (acc_t)M : (acc_t)0;                                        \
        acc_t q = 0;                                                                                                \
        for (long j = lid; j < M; j += wg) {                                                                        \
            const acc_t d = (acc_t)X[EM_BN_AT(j)] - mean;                                                           \
            q += d * d;                                                                                             \
        }                                                                                                           \
        const acc_t var = M > 0 ? em_tree_sum(lv, q) / (acc_t)M : (acc_t)0;                                         \
        const acc_t scale = (acc_t)Wt[c] / sqrt(var + eps), shift = (acc_t)Bs[c];                                  \
        for (long j = lid; j < M; j += wg) {                                                                        \
            const long o = EM_BN_AT(j);                                                                             \
            Y[o] = (T)(((acc_t)X[o] - mean) * scale + shift);                                                       \
        }                                                                                                           \
        if (lid == 0) {                                                                                             \
            ST[c] = (T)mean;                                                                                        \
            ST[C + c] = (T)var;                                                                                     \
        }                                                                                                           \
    }                                                                                                               \
    __kernel void em_bn_bwd_##S(__global const uchar *gb, long gboff, long ge, __global const uchar *xb, long xboff, \
                                long xe, __global const uchar *sb, long sboff, long se, __global const uchar *wb,   \
                                long wboff, long we, __global uchar *dxb, long dxboff, long dxe,                     \
                                __global uchar *dwb, long dwboff, long dwe, __global uchar *dbb, long dbboff,        \
                                long dbe, long N, long C, long L, acc_t eps, __local acc_t *lv)                     \
    {                                                                                                               \
        __global const T *G = (__global const T *)(gb + gboff) + ge;                                                \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                                \
        __global const T *ST = (__global const T *)(sb + sboff) + se;                                               \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                               \
        __global T *DX = (__global T *)(dxb + dxboff) + dxe;                                                        \
        __global T *DW = (__global T *)(dwb + dwboff) + dwe;                                                        \
        __global T *DB = (__global T *)(dbb + dbboff) + dbe;                                                        \
        const long c = get_group_id(0), M = N * L;                                                                  \
        const int lid = get_local_id(0), wg = get_local_size(0);                                                    \
        if (c >= C) return;                                                                                         \
        const acc_t mean = (acc_t)ST[c], invstd = (acc_t)1 / sqrt((acc_t)ST[C + c] + eps);                         \
        acc_t sdy = 0, sdyx = 0;                                                                                    \
        for (long j = lid; j < M; j += wg) {                                                                        \
            const long o = EM_BN_AT(j);                                                                             \
            const acc_t g = (acc_t)G[o];                                                                            \
            sdy += g;                                                                                               \
            sdyx += g * ((acc_t)X[o] - mean);                                                                       \
        }                                                                                                           \
        em_bn_sum2(lv, &sdy, &sdyx);                                                                                \
        sdyx *= invstd;                                                                                             \
        const acc_t a = (acc_t)Wt[c] * invstd, mdy = M > 0 ? sdy / (acc_t)M : (acc_t)0,                             \
                    mdyx = M > 0 ? sdyx / (acc_t)M : (acc_t)0;                                                      \
        for (long j = lid; j < M; j += wg) {                                                                        \
            const long o = EM_BN_AT(j);                                                                             \
            const acc_t xh = ((acc_t)X[o] - mean) * invstd;                                                         \
            DX[o] = (T)(a * ((acc_t)G[o] - mdy - xh * mdyx));                                                       \
        }                                                                                                           \
        if (lid == 0) {                                                                                             \
            DW[c] = (T)sdyx;                                                                                        \
            DB[c] = (T)sdy;                                                                                         \
        }                                                                                                           \
    }

#define EM_DEF_BN_RUNNING(T, S)                                                                                    \
    __kernel void em_bn_running_##S(__global const uchar *sb, long sboff, long se, __global uchar *mb, long mboff,    \
                                    long me, __global uchar *vb, long vboff, long ve, long C, T m, T keep, T u)      \
    {                                                                                                               \
        __global const T *ST = (__global const T *)(sb + sboff) + se;                                               \
        __global T *RM = (__global T *)(mb + mboff) + me;                                                           \
        __global T *RV = (__global T *)(vb + vboff) + ve;                                                           \
        EM_GRID_LOOP(c, C)                                                                                          \
        {                                                                                                           \
            const T a = RM[c] * keep, b = ST[c] * m;                                                                \
            RM[c] = a + b;                                                                                          \
            const T v = ST[C + c] * u;                                                                              \
            const T av = RV[c] * keep, bv = v * m;                                                                  \
            RV[c] = av + bv;                                                                                        \
        }                                                                                                           \
    }

#define EM_DEF_LN(T, S)                                                                                            \
    __kernel void em_ln_fwd_##S(__global const uchar *xb, long xboff, long xe, __global const uchar *wb, long wboff, \
                                long we, __global const uchar *bb, long bboff, long be, __global uchar *yb,         \
                                long yboff, long ye, __global uchar *sb, long sboff, long se, long M, long N,       \
                                acc_t eps, __local acc_t *lv)                                                       \
    {                                                                                                               \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                               \
        __global const T *Bs = (__global const T *)(bb + bboff) + be;                                               \
        __global T *ST = (__global T *)(sb + sboff) + se;                                                           \
        const long r = get_group_id(0);                                                                             \
        const int lid = get_local_id(0), wg = get_local_size(0);                                                    \
        if (r >= M) return;                                                                                         \
        __global const T *X = (__global const T *)(xb + xboff) + xe + r * N;                                        \
        __global T *Y = (__global T *)(yb + yboff) + ye + r * N;                                                    \
        acc_t s = 0;                                                                                                \
        for (long j = lid; j < N; j += wg) s += (acc_t)X[j];                                                        \
        s = em_tree_sum(lv, s);                                                                                     \
        const acc_t mean = N > 0 ? s / (acc_t)N : (acc_t)0;                                                         \
        acc_t q = 0;                                                                                                \
        for (long j = lid; j < N; j += wg) {                                                                        \
            const acc_t d = (acc_t)X[j] - mean;                                                                     \
            q += d * d;                                                                                             \
        }                                                                                                           \
        q = em_tree_sum(lv, q);                                                                                     \
        const acc_t var = N > 0 ? q / (acc_t)N : (acc_t)0, rstd = (acc_t)1 / sqrt(var + eps);                       \
        for (long j = lid; j < N; j += wg) Y[j] = (T)(((acc_t)X[j] - mean) * rstd * (acc_t)Wt[j] + (acc_t)Bs[j]);    \
        if (lid == 0) {                                                                                             \
            ST[r] = (T)mean;                                                                                        \
            ST[M + r] = (T)rstd;                                                                                    \
        }                                                                                                           \
    }                                                                                                               \
    __kernel void em_ln_bwd_##S(__global const uchar *gb, long gboff, long ge, __global const uchar *xb, long xboff, \
                                long xe, __global const uchar *sb, long sboff, long se, __global const uchar *wb,   \
                                long wboff, long we, __global uchar *dxb, long dxboff, long dxe, long M, long N,     \
                                __local acc_t *lv)                                                                  \
    {                                                                                                               \
        __global const T *ST = (__global const T *)(sb + sboff) + se;                                               \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                               \
        const long r = get_group_id(0);                                                                             \
        const int lid = get_local_id(0), wg = get_local_size(0);                                                    \
        if (r >= M) return;                                                                                         \
        __global const T *G = (__global const T *)(gb + gboff) + ge + r * N;                                        \
        __global const T *X = (__global const T *)(xb + xboff) + xe + r * N;                                        \
        __global T *DX = (__global T *)(dxb + dxboff) + dxe + r * N;                                                \
        const acc_t mean = (acc_t)ST[r], rstd = (acc_t)ST[M + r];                                                   \
        acc_t sg = 0, sgx = 0;                                                                                      \
        for (long j = lid; j < N; j += wg) {                                                                        \
            const acc_t g = (acc_t)G[j] * (acc_t)Wt[j];                                                             \
            sg += g;                                                                                                \
            sgx += g * (((acc_t)X[j] - mean) * rstd);                                                               \
        }                                                                                                           \
        em_bn_sum2(lv, &sg, &sgx);                                                                                  \
        const acc_t mg = N > 0 ? sg / (acc_t)N : (acc_t)0, mgx = N > 0 ? sgx / (acc_t)N : (acc_t)0;                 \
        for (long j = lid; j < N; j += wg) {                                                                        \
            const acc_t xh = ((acc_t)X[j] - mean) * rstd;                                                           \
            DX[j] = (T)(rstd * ((acc_t)G[j] * (acc_t)Wt[j] - mg - xh * mgx));                                       \
        }                                                                                                           \
    }                                                                                                               \
    __kernel void em_ln_bwd_wb_##S(__global const uchar *gb, long gboff, long ge, __global const uchar *xb,         \
                                   long xboff, long xe, __global const uchar *sb, long sboff, long se,              \
                                   __global uchar *dwb, long dwboff, long dwe, __global uchar *dbb, long dbboff,    \
                                   long dbe, long M, long N)                                                        \
    {                                                                                                               \
        __global const T *G = (__global const T *)(gb + gboff) + ge;                                                \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                                \
        __global const T *ST = (__global const T *)(sb + sboff) + se;                                               \
        __global T *DW = (__global T *)(dwb + dwboff) + dwe;                                                        \
        __global T *DB = (__global T *)(dbb + dbboff) + dbe;                                                        \
        EM_GRID_LOOP(j, N)                                                                                          \
        {                                                                                                           \
            acc_t aw = 0, ab = 0;                                                                                   \
            for (long r = 0; r < M; r++) {                                                                          \
                const acc_t g = (acc_t)G[r * N + j];                                                                \
                aw += g * (((acc_t)X[r * N + j] - (acc_t)ST[r]) * (acc_t)ST[M + r]);                                \
                ab += g;                                                                                            \
            }                                                                                                       \
            DW[j] = (T)aw;                                                                                          \
            DB[j] = (T)ab;                                                                                          \
        }                                                                                                           \
    }

EM_DEF_BN(float, f32)
EM_DEF_BN_RUNNING(float, f32)
EM_DEF_LN(float, f32)
#ifdef EM_FP64
EM_DEF_BN(double, f64)
EM_DEF_BN_RUNNING(double, f64)
EM_DEF_LN(double, f64)
#endif
