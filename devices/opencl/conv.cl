/* Direct 2-D convolution kernels (contracts at the top of tasks/conv.c; CPU
 * reference devices/cpu/conv.c, im2col + GEMM). Operands are contiguous
 * with an element offset; the host passes the geometry as two long8:
 *   g0 = (N, C, H, W, O, OH, OW, KH)    g1 = (KW, G, sh, sw, ph, pw, dh, dw)
 * with x / dx [N, C, H, W], w / dw [O, C/G, KH, KW], y / dy [N, O, OH, OW];
 * input row h = oh*sh - ph + i*dh (columns alike).
 *
 * em_conv2d_fwd_<T>(x, w, y, g0, g1, n)       one work-item per y element:
 *     y = sum over (c < Cg, i < KH, j < KW), in that order, of x * w, with
 *     x = 0 outside the input (the CPU's im2col zeros: a padded position
 *     still multiplies its weight, so an infinite weight gives NaN there as
 *     with the GEMM);
 * em_conv2d_bwd_data_<T>(dy, w, dx, g0, g1, n) one work-item per dx element:
 *     for each (i, j) whose output position (oh, ow) exists (h + ph - i*dh
 *     divisible by sh and the quotient < OH, columns alike), a partial sum
 *     over the group's output channels o, added to the result in (i, j)
 *     order (the CPU's w^T @ dy then col2im);
 * em_conv2d_bwd_weight_<T>(x, dy, dw, g0, g1, n) one work-item per dw
 *     element: per sample n a partial sum over (oh, ow) of dy * x (x = 0
 *     outside the input), added in n order (the CPU's GEMM with beta = 1
 *     after the first sample).
 * f32 accumulates in float (as sgemm), f64 in double. */

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
            T acc = 0;                                                                                       \
            for (long c = 0; c < Cg; c++)                                                                    \
                for (long i = 0; i < KH; i++) {                                                              \
                    const long h = oh * sh - ph + i * dh;                                                    \
                    const int hin = h >= 0 && h < H;                                                         \
                    for (long j = 0; j < KW; j++) {                                                          \
                        const long w = ow * sw - pw + j * dw;                                                \
                        const T xv = (hin && w >= 0 && w < W) ? xg[(c * H + h) * W + w] : (T)0;              \
                        acc = acc + xv * wo[(c * KH + i) * KW + j];                                          \
                    }                                                                                        \
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
            T acc = 0;                                                                                       \
            for (long nn = 0; nn < N; nn++) {                                                                \
                __global const T *xp = X + (nn * C + xc) * H * W;                                            \
                __global const T *dyp = DY + (nn * O + o) * OH * OW;                                         \
                T s = 0;                                                                                     \
                for (long oh = 0; oh < OH; oh++) {                                                           \
                    const long h = oh * sh - ph + i * dh;                                                    \
                    const int hin = h >= 0 && h < H;                                                         \
                    for (long ow = 0; ow < OW; ow++) {                                                       \
                        const long w = ow * sw - pw + j * dw;                                                \
                        const T xv = (hin && w >= 0 && w < W) ? xp[h * W + w] : (T)0;                        \
                        s = s + dyp[oh * OW + ow] * xv;                                                      \
                    }                                                                                        \
                }                                                                                            \
                acc = nn ? acc + s : s;                                                                      \
            }                                                                                                \
            DW[t] = acc;                                                                                     \
        }                                                                                                    \
    }

EM_DEF_CONV(float, f32)
#ifdef EM_FP64
EM_DEF_CONV(double, f64)
#endif
