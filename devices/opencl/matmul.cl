/* Tiled matrix product (semantics of devices/cpu/matmul.c):
 *   C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]
 * Work-group EM_TILE x EM_TILE (dim 0 = n, dim 1 = m), dim 2 = batch index;
 * the host launches ceil(N / EM_BT) x ceil(M / EM_BT) groups (times EM_TILE).
 * A group computes an EM_BT x EM_BT tile of C (EM_BT = 4 * EM_TILE), each
 * work-item a 4 x 4 block of it (rows ty + 16 i, columns tx + 16 j for the
 * default tile), from EM_KT-deep slices of A and B staged in local memory.
 * Any strides (transposed or broadcast views need no copy). Each C element
 * sums its K products in increasing k order.
 * Arguments:
 *   (__global uchar *a, long aboff, long ae, __global uchar *b, long bboff, long be,
 *    __global uchar *c, long cboff, long ce,
 *    long M, long N, long K, long sam, long sak, long sbk, long sbn, long scm, long scn,
 *    int nb, long8 bshape, long8 bsa, long8 bsb, long8 bsc)   batch dims (collapsed)
 * f32 accumulates in float (as sgemm), f64 in double, integers in ulong
 * (int64 wrap-around, stored truncated to the dtype, as the CPU). K == 0
 * gives zeros. */
#ifndef EM_TILE
#define EM_TILE 16
#endif
#define EM_RB 4                     /* outputs per work-item per dim */
#define EM_BT (EM_TILE * EM_RB)     /* C tile edge per work-group */
#define EM_KT 16                    /* K chunk through local memory */

#define EM_DEF_MATMUL(T, ACC, S)                                                                   \
    __kernel __attribute__((reqd_work_group_size(EM_TILE, EM_TILE, 1))) void em_matmul_##S(        \
        __global const uchar *ab, long aboff, long ae, __global const uchar *bb, long bboff, long be, \
        __global uchar *cb, long cboff, long ce, long M, long N, long K, long sam, long sak, long sbk, \
        long sbn, long scm, long scn, int nb, long8 bshape, long8 bsa, long8 bsb, long8 bsc)       \
    {                                                                                              \
        __local T As[EM_KT][EM_BT + 1];                                                            \
        __local T Bs[EM_KT][EM_BT + 1];                                                            \
        EM_UNPACK(sh, bshape);                                                                     \
        EM_UNPACK(s0, bsa);                                                                        \
        EM_UNPACK(s1, bsb);                                                                        \
        EM_UNPACK(s2, bsc);                                                                        \
        __global const T *A = (__global const T *)(ab + aboff);                                    \
        __global const T *B = (__global const T *)(bb + bboff);                                    \
        __global T *C = (__global T *)(cb + cboff);                                                \
        const int tx = get_local_id(0), ty = get_local_id(1), lid = ty * EM_TILE + tx;              \
        const long col0 = (long)get_group_id(0) * EM_BT, row0 = (long)get_group_id(1) * EM_BT;     \
        const long bi = get_global_id(2);                                                          \
        EM_OFFS3(bi, nb, sh, s0, ae, oa, s1, be, ob, s2, ce, oc)                                   \
        ACC acc[EM_RB][EM_RB];                                                                     \
        for (int i = 0; i < EM_RB; i++)                                                            \
            for (int j = 0; j < EM_RB; j++) acc[i][j] = 0;                                         \
        for (long k0 = 0; k0 < K; k0 += EM_KT) {                                                   \
            for (int l = lid; l < EM_BT * EM_KT; l += EM_TILE * EM_TILE) {                         \
                const int m = l / EM_KT, kk = l % EM_KT;                                           \
                const long r = row0 + m, q = k0 + kk;                                              \
                As[kk][m] = (r < M && q < K) ? A[oa + r * sam + q * sak] : (T)0;                   \
            }                                                                                      \
            for (int l = lid; l < EM_BT * EM_KT; l += EM_TILE * EM_TILE) {                         \
                const int kk = l / EM_BT, n = l % EM_BT;                                           \
                const long q = k0 + kk, cc = col0 + n;                                             \
                Bs[kk][n] = (q < K && cc < N) ? B[ob + q * sbk + cc * sbn] : (T)0;                 \
            }                                                                                      \
            barrier(CLK_LOCAL_MEM_FENCE);                                                          \
            for (int kk = 0; kk < EM_KT; kk++) {                                                   \
                T av[EM_RB], bv[EM_RB];                                                            \
                for (int i = 0; i < EM_RB; i++) av[i] = As[kk][ty + i * EM_TILE];                 \
                for (int j = 0; j < EM_RB; j++) bv[j] = Bs[kk][tx + j * EM_TILE];                  \
                for (int i = 0; i < EM_RB; i++)                                                    \
                    for (int j = 0; j < EM_RB; j++) acc[i][j] = EM_MM_STEP_##S(acc[i][j], av[i], bv[j]); \
            }                                                                                      \
            barrier(CLK_LOCAL_MEM_FENCE);                                                          \
        }                                                                                          \
        for (int i = 0; i < EM_RB; i++) {                                                          \
            const long r = row0 + ty + i * EM_TILE;                                                \
            for (int j = 0; j < EM_RB; j++) {                                                      \
                const long cc = col0 + tx + j * EM_TILE;                                           \
                if (r < M && cc < N) C[oc + r * scm + cc * scn] = (T)acc[i][j];                    \
            }                                                                                      \
        }                                                                                          \
    }

#define EM_MM_STEP_f32(acc, a, b) ((acc) + (a) * (b))
#define EM_MM_STEP_f64(acc, a, b) ((acc) + (a) * (b))
#define EM_MM_STEP_i32(acc, a, b) ((acc) + (ulong)(long)(a) * (ulong)(long)(b))
#define EM_MM_STEP_i64(acc, a, b) ((acc) + (ulong)(long)(a) * (ulong)(long)(b))
#define EM_MM_STEP_u8(acc, a, b) ((acc) + (ulong)(long)(a) * (ulong)(long)(b))

EM_DEF_MATMUL(float, float, f32)
#ifdef EM_FP64
EM_DEF_MATMUL(double, double, f64)
#endif
EM_DEF_MATMUL(int, ulong, i32)
EM_DEF_MATMUL(long, ulong, i64)
EM_DEF_MATMUL(uchar, ulong, u8)
