/* Direct 2-D convolution kernels (contracts at the top of tasks/conv.c; CPU
 * reference devices/cpu/conv.c, im2col + GEMM). Operands are contiguous
 * with an element offset; the host passes the geometry as two long8:
 *   g0 = (N, C, H, W, O, OH, OW, KH)    g1 = (KW, G, sh, sw, ph, pw, dh, dw)
 * with x / dx [N, C, H, W], w / dw [O, C/G, KH, KW], y / dy [N, O, OH, OW];
 * input row h = oh*sh - ph + i*dh (columns alike). Sums run over the
 * positions inside the input only (the contract's definition; the loop
 * bounds are clipped up front, so padded positions cost nothing and are
 * never read).
 *
 * em_conv2d_fwd_<T>(x, w, y, g0, g1, n)        one work-item per y element:
 *     y = sum over (c < Cg, i, j), in that order, of x * w;
 * em_conv2d_bwd_data_<T>(dy, w, dx, g0, g1, n)  one work-item per dx element:
 *     for each (i, j) whose output position (oh, ow) exists (h + ph - i*dh
 *     divisible by sh and the quotient < OH, columns alike), a partial sum
 *     over the group's output channels o, added to the result in (i, j)
 *     order (the CPU's w^T @ dy then col2im);
 * em_conv2d_bwd_weight_<T>(x, dy, dw, g0, g1, n) one work-item per dw
 *     element: per sample n a partial sum over (oh, ow) of dy * x, added in
 *     n order (the CPU's GEMM with beta = 1 after the first sample);
 * em_conv2d_bwd_weight_red_<T>(x, dy, dw, g0, g1, n, __local T *lv) one
 *     work-group (power-of-2 size) per dw element (grid-stride over
 *     groups): the group's work-items take the N * OH rows of the sum in
 *     turn, then a tree sum in local memory; the host picks it for few
 *     weight elements with long sums.
 * f32 accumulates in float (as sgemm), f64 in double; results agree with
 * the CPU to rounding (the summation orders differ from OpenBLAS's). */

/* With positions q = k*step - a (k >= 0): the first k with q >= 0, and the
 * end (exclusive, at most kmax) of the k with q < n. */
inline long em_conv_lo(long a, long step) { return a > 0 ? (a + step - 1) / step : 0; }
inline long em_conv_hi(long a, long n, long step, long kmax)
{
    const long e = n + a > 0 ? (n + a + step - 1) / step : 0;
    return e < kmax ? e : kmax;
}

#define EM_CONV_GEOM                                                                               \
    EM_UNPACK(ga, g0);                                                                             \
    EM_UNPACK(gb, g1);                                                                             \
    const long N = ga[0], C = ga[1], H = ga[2], W = ga[3], O = ga[4], OH = ga[5], OW = ga[6];     \
    const long KH = ga[7], KW = gb[0], G = gb[1], sh = gb[2], sw = gb[3], ph = gb[4], pw = gb[5];  \
    const long dh = gb[6], dw = gb[7];                                                             \
    const long Cg = C / G, Og = O / G;                                                             \
    (void)N;

#define EM_DEF_CONV(T, S)                                                                                    \
    __kernel void em_conv2d_fwd_##S(__global const uchar *xb, long xboff, long xe, __global const uchar *wb, \
                                    long wboff, long we, __global uchar *yb, long yboff, long ye, long8 g0,  \
                                    long8 g1, long n)                                                        \
    {                                                                                                        \
        EM_CONV_GEOM                                                                                         \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                         \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                        \
        __global T *Y = (__global T *)(yb + yboff) + ye;                                                     \
        EM_GRID_LOOP(t, n)                                                                                   \
        {                                                                                                    \
            const long ow = t % OW, r1 = t / OW, oh = r1 % OH, r2 = r1 / OH, o = r2 % O, nn = r2 / O;        \
            __global const T *xg = X + (nn * C + (o / Og) * Cg) * H * W;                                     \
            __global const T *wo = Wt + o * Cg * KH * KW;                                                    \
            /* kernel rows / columns whose input position is inside the input */                             \
            const long i0 = em_conv_lo(ph - oh * sh, dh), i1 = em_conv_hi(ph - oh * sh, H, dh, KH);          \
            const long j0 = em_conv_lo(pw - ow * sw, dw), j1 = em_conv_hi(pw - ow * sw, W, dw, KW);          \
            T acc = 0;                                                                                       \
            for (long c = 0; c < Cg; c++)                                                                    \
                for (long i = i0; i < i1; i++) {                                                             \
                    const long xr = (c * H + oh * sh - ph + i * dh) * W + ow * sw - pw;                      \
                    __global const T *wr = wo + (c * KH + i) * KW;                                           \
                    for (long j = j0; j < j1; j++) acc = acc + xg[xr + j * dw] * wr[j];                       \
                }                                                                                            \
            Y[t] = acc;                                                                                      \
        }                                                                                                    \
    }                                                                                                        \
    __kernel void em_conv2d_bwd_data_##S(__global const uchar *db, long dboff, long de, __global const uchar *wb, \
                                         long wboff, long we, __global uchar *xb, long xboff, long xe, long8 g0, \
                                         long8 g1, long n)                                                   \
    {                                                                                                        \
        EM_CONV_GEOM                                                                                         \
        __global const T *DY = (__global const T *)(db + dboff) + de;                                        \
        __global const T *Wt = (__global const T *)(wb + wboff) + we;                                        \
        __global T *DX = (__global T *)(xb + xboff) + xe;                                                    \
        EM_GRID_LOOP(t, n)                                                                                   \
        {                                                                                                    \
            const long w = t % W, r1 = t / W, h = r1 % H, r2 = r1 / H, c = r2 % C, nn = r2 / C;              \
            const long gr = c / Cg, cc = c % Cg;                                                             \
            __global const T *dyg = DY + (nn * O + gr * Og) * OH * OW;                                       \
            __global const T *wg = Wt + (gr * Og * Cg + cc) * KH * KW;                                       \
            T acc = 0;                                                                                       \
            for (long i = 0; i < KH; i++) {                                                                  \
                const long th = h + ph - i * dh;                                                             \
                if (th < 0 || th % sh) continue;                                                             \
                const long oh = th / sh;                                                                     \
                if (oh >= OH) continue;                                                                      \
                for (long j = 0; j < KW; j++) {                                                              \
                    const long tw = w + pw - j * dw;                                                         \
                    if (tw < 0 || tw % sw) continue;                                                         \
                    const long ow = tw / sw;                                                                 \
                    if (ow >= OW) continue;                                                                  \
                    T s = 0;                                                                                 \
                    for (long o = 0; o < Og; o++)                                                            \
                        s = s + wg[(o * Cg * KH + i) * KW + j] * dyg[(o * OH + oh) * OW + ow];               \
                    acc = acc + s;                                                                           \
                }                                                                                            \
            }                                                                                                \
            DX[t] = acc;                                                                                     \
        }                                                                                                    \
    }                                                                                                        \
    __kernel void em_conv2d_bwd_weight_##S(__global const uchar *xb, long xboff, long xe,                    \
                                           __global const uchar *db, long dboff, long de, __global uchar *wb, \
                                           long wboff, long we, long8 g0, long8 g1, long n)                  \
    {                                                                                                        \
        EM_CONV_GEOM                                                                                         \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                         \
        __global const T *DY = (__global const T *)(db + dboff) + de;                                        \
        __global T *DW = (__global T *)(wb + wboff) + we;                                                    \
        EM_GRID_LOOP(t, n)                                                                                   \
        {                                                                                                    \
            const long j = t % KW, r1 = t / KW, i = r1 % KH, r2 = r1 / KH, c = r2 % Cg, o = r2 / Cg;         \
            const long xc = (o / Og) * Cg + c;                                                               \
            /* output rows / columns whose input position is inside the input */                             \
            const long oh0 = em_conv_lo(ph - i * dh, sh), oh1 = em_conv_hi(ph - i * dh, H, sh, OH);          \
            const long ow0 = em_conv_lo(pw - j * dw, sw), ow1 = em_conv_hi(pw - j * dw, W, sw, OW);          \
            T acc = 0;                                                                                       \
            for (long nn = 0; nn < N; nn++) {                                                                \
                __global const T *xp = X + (nn * C + xc) * H * W;                                            \
                __global const T *dyp = DY + (nn * O + o) * OH * OW;                                         \
                T s = 0;                                                                                     \
                for (long oh = oh0; oh < oh1; oh++) {                                                        \
                    const long xr = (oh * sh - ph + i * dh) * W - pw + j * dw;                               \
                    __global const T *dr = dyp + oh * OW;                                                    \
                    for (long ow = ow0; ow < ow1; ow++) s = s + dr[ow] * xp[xr + ow * sw];                   \
                }                                                                                            \
                acc = nn ? acc + s : s;                                                                      \
            }                                                                                                \
            DW[t] = acc;                                                                                     \
        }                                                                                                    \
    }                                                                                                        \
    __kernel void em_conv2d_bwd_weight_red_##S(__global const uchar *xb, long xboff, long xe,                    \
                                               __global const uchar *db, long dboff, long de, __global uchar *wb,\
                                               long wboff, long we, long8 g0, long8 g1, long n, __local T *lv)   \
    {                                                                                                            \
        EM_CONV_GEOM                                                                                             \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                             \
        __global const T *DY = (__global const T *)(db + dboff) + de;                                            \
        __global T *DW = (__global T *)(wb + wboff) + we;                                                        \
        const int lid = get_local_id(0), L = get_local_size(0);                                                  \
        for (long t = get_group_id(0); t < n; t += get_num_groups(0)) {                                          \
            const long j = t % KW, r1 = t / KW, i = r1 % KH, r2 = r1 / KH, c = r2 % Cg, o = r2 / Cg;             \
            const long xc = (o / Og) * Cg + c;                                                                   \
            const long oh0 = em_conv_lo(ph - i * dh, sh), oh1 = em_conv_hi(ph - i * dh, H, sh, OH);              \
            const long ow0 = em_conv_lo(pw - j * dw, sw), ow1 = em_conv_hi(pw - j * dw, W, sw, OW);              \
            const long nr = oh1 > oh0 ? oh1 - oh0 : 0, rows = N * nr;                                            \
            T s = 0;                                                                                             \
            for (long r = lid; r < rows; r += L) { /* row r: sample r / nr, output row oh0 + r % nr */           \
                const long nn = r / nr, oh = oh0 + r % nr;                                                       \
                __global const T *xp = X + (nn * C + xc) * H * W;                                                \
                __global const T *dr = DY + ((nn * O + o) * OH + oh) * OW;                                       \
                const long xr = (oh * sh - ph + i * dh) * W - pw + j * dw;                                       \
                for (long ow = ow0; ow < ow1; ow++) s = s + dr[ow] * xp[xr + ow * sw];                           \
            }                                                                                                    \
            lv[lid] = s;                                                                                         \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                        \
            for (int h = L / 2; h > 0; h >>= 1) {                                                                \
                if (lid < h) lv[lid] = lv[lid] + lv[lid + h];                                                    \
                barrier(CLK_LOCAL_MEM_FENCE);                                                                    \
            }                                                                                                    \
            if (lid == 0) DW[t] = lv[0];                                                                         \
            barrier(CLK_LOCAL_MEM_FENCE);                                                                        \
        }                                                                                                        \
    }

EM_DEF_CONV(float, f32)
#ifdef EM_FP64
EM_DEF_CONV(double, f64)
#endif
