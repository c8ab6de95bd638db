/* 2-D pooling kernels (contracts at the top of tasks/pool.c; CPU reference
 * devices/cpu/conv.c, POOL_IMPL). Operands are contiguous with an element
 * offset; x / dx [N, C, H, W] and y / dy [N, C, OH, OW] are seen as NC
 * planes. The host passes the geometry as two long8:
 *   g0 = (NC, H, W, OH, OW, adaptive, count_include_pad, divisor)
 *   g1 = (kh, kw, sh, sw, ph, pw, dh, dw)      (unused when adaptive)
 *
 * em_max_pool_<T>(x, y, idx, g0, g1, n)   one work-item per y element: the
 *     window scanned row-major from its first element inside the input,
 *     best replaced when v > best || isnan(v) (the last NaN wins, else the
 *     first of equal maxima); idx (i64) = h*W + w of the winner;
 * em_avg_pool_<T>(x, y, g0, g1, n)        one work-item per y element: the
 *     sum over the clipped window in row-major order, divided by the
 *     contract's divisor;
 * em_avg_pool_bwd_<T>(dy, dx, g0, g1, n)  one work-item per dx element: it
 *     gathers dy / div over the windows that contain it, in row-major
 *     (oh, ow) order, which is the order the CPU's scatter adds them in
 *     (no atomics; the same roundings as the CPU). */

/* Adaptive window [lo, hi) of output index o over in inputs. */
inline void em_pool_adaptive(long o, long in, long out, long *lo, long *hi)
{
    *lo = (o * in) / out;
    *hi = ((o + 1) * in + out - 1) / out;
}

#define EM_POOL_GEOM                                                                             \
    EM_UNPACK(ga, g0);                                                                           \
    EM_UNPACK(gb, g1);                                                                           \
    const long H = ga[1], W = ga[2], OH = ga[3], OW = ga[4];                                     \
    const int adaptive = ga[5] != 0, cip = ga[6] != 0;                                           \
    const long divisor = ga[7];                                                                  \
    const long kh = gb[0], kw = gb[1], sh = gb[2], sw = gb[3], ph = gb[4], pw = gb[5];           \
    const long dh = gb[6], dw = gb[7];                                                           \
    (void)cip;                                                                                   \
    (void)divisor;                                                                               \
    (void)dh;                                                                                    \
    (void)dw;

/* AVG_POOL2D's clipped window of (oh, ow) and its divisor (T). */
#define EM_AVG_WINDOW(T, oh, ow, h0, h1, w0, w1, div)                                            \
    long h0, h1, w0, w1;                                                                         \
    T div;                                                                                       \
    if (adaptive) {                                                                              \
        em_pool_adaptive((oh), H, OH, &h0, &h1);                                                 \
        em_pool_adaptive((ow), W, OW, &w0, &w1);                                                 \
        div = (T)((h1 - h0) * (w1 - w0));                                                        \
    } else {                                                                                     \
        h0 = (oh) * sh - ph;                                                                     \
        w0 = (ow) * sw - pw;                                                                     \
        h1 = min(h0 + kh, H + ph);                                                               \
        w1 = min(w0 + kw, W + pw);                                                               \
        const long pool_ = (h1 - h0) * (w1 - w0);                                                \
        h0 = max(h0, 0L);                                                                        \
        w0 = max(w0, 0L);                                                                        \
        h1 = min(h1, H);                                                                         \
        w1 = min(w1, W);                                                                         \
        div = divisor ? (T)divisor : (T)(cip ? pool_ : (h1 - h0) * (w1 - w0));                   \
    }

#define EM_DEF_POOL(T, S)                                                                                     \
    __kernel void em_max_pool_##S(__global const uchar *xb, long xboff, long xe, __global uchar *yb, long yboff, \
                                  long ye, __global uchar *ib, long iboff, long ie, long8 g0, long8 g1, long n) \
    {                                                                                                         \
        EM_POOL_GEOM                                                                                          \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                          \
        __global T *Y = (__global T *)(yb + yboff) + ye;                                                      \
        __global long *I = (__global long *)(ib + iboff) + ie;                                                \
        EM_GRID_LOOP(t, n)                                                                                    \
        {                                                                                                     \
            const long ow = t % OW, r1 = t / OW, oh = r1 % OH, p = r1 / OH;                                   \
            __global const T *xp = X + p * H * W;                                                             \
            long h0, h1, w0, w1, sth = 1, stw = 1;                                                            \
            if (adaptive) {                                                                                   \
                em_pool_adaptive(oh, H, OH, &h0, &h1);                                                        \
                em_pool_adaptive(ow, W, OW, &w0, &w1);                                                        \
            } else {                                                                                          \
                sth = dh, stw = dw;                                                                           \
                h0 = oh * sh - ph;                                                                            \
                w0 = ow * sw - pw;                                                                            \
                h1 = min(h0 + (kh - 1) * dh + 1, H);                                                          \
                w1 = min(w0 + (kw - 1) * dw + 1, W);                                                          \
                if (h0 < 0) h0 += ((-h0 + dh - 1) / dh) * dh;                                                 \
                if (w0 < 0) w0 += ((-w0 + dw - 1) / dw) * dw;                                                 \
            }                                                                                                 \
            T best = 0;                                                                                       \
            long bi = -1;                                                                                     \
            for (long h = h0; h < h1; h += sth)                                                               \
                for (long w = w0; w < w1; w += stw) {                                                         \
                    const T v = xp[h * W + w];                                                                \
                    if (bi < 0 || v > best || isnan(v)) {                                                     \
                        best = v;                                                                             \
                        bi = h * W + w;                                                                       \
                    }                                                                                         \
                }                                                                                             \
            Y[t] = best;                                                                                      \
            I[t] = bi;                                                                                        \
        }                                                                                                     \
    }                                                                                                         \
    __kernel void em_avg_pool_##S(__global const uchar *xb, long xboff, long xe, __global uchar *yb, long yboff, \
                                  long ye, long8 g0, long8 g1, long n)                                        \
    {                                                                                                         \
        EM_POOL_GEOM                                                                                          \
        __global const T *X = (__global const T *)(xb + xboff) + xe;                                          \
        __global T *Y = (__global T *)(yb + yboff) + ye;                                                      \
        EM_GRID_LOOP(t, n)                                                                                    \
        {                                                                                                     \
            const long ow = t % OW, r1 = t / OW, oh = r1 % OH, p = r1 / OH;                                   \
            __global const T *xp = X + p * H * W;                                                             \
            EM_AVG_WINDOW(T, oh, ow, h0, h1, w0, w1, div)                                                     \
            T s = 0;                                                                                          \
            for (long h = h0; h < h1; h++)                                                                    \
                for (long w = w0; w < w1; w++) s = s + xp[h * W + w];                                         \
            Y[t] = s / div;                                                                                   \
        }                                                                                                     \
    }                                                                                                         \
    __kernel void em_avg_pool_bwd_##S(__global const uchar *db, long dboff, long de, __global uchar *xb,       \
                                      long xboff, long xe, long8 g0, long8 g1, long n)                        \
    {                                                                                                         \
        EM_POOL_GEOM                                                                                          \
        __global const T *DY = (__global const T *)(db + dboff) + de;                                         \
        __global T *DX = (__global T *)(xb + xboff) + xe;                                                     \
        EM_GRID_LOOP(t, n)                                                                                    \
        {                                                                                                     \
            const long w = t % W, r1 = t / W, h = r1 % H, p = r1 / H;                                         \
            __global const T *dyp = DY + p * OH * OW;                                                         \
            long oh0, oh1, ow0, ow1; /* candidate output rows / columns [lo, hi) */                           \
            if (adaptive) {                                                                                   \
                oh0 = (h * OH) / H;                                                                           \
                oh1 = ((h + 1) * OH + H - 1) / H;                                                             \
                ow0 = (w * OW) / W;                                                                           \
                ow1 = ((w + 1) * OW + W - 1) / W;                                                             \
            } else {                                                                                          \
                /* oh*sh - ph <= h < oh*sh - ph + kh */                                                       \
                oh0 = h + ph - kh < 0 ? 0 : (h + ph - kh) / sh + 1;                                           \
                oh1 = (h + ph) / sh + 1;                                                                      \
                ow0 = w + pw - kw < 0 ? 0 : (w + pw - kw) / sw + 1;                                           \
                ow1 = (w + pw) / sw + 1;                                                                      \
            }                                                                                                 \
            oh1 = min(oh1, OH);                                                                               \
            ow1 = min(ow1, OW);                                                                               \
            T acc = 0;                                                                                        \
            for (long oh = oh0; oh < oh1; oh++)                                                               \
                for (long ow = ow0; ow < ow1; ow++) {                                                         \
                    EM_AVG_WINDOW(T, oh, ow, h0, h1, w0, w1, div)                                             \
                    if (h < h0 || h >= h1 || w < w0 || w >= w1) continue;                                     \
                    acc = acc + dyp[oh * OW + ow] / div;                                                      \
                }                                                                                             \
            DX[t] = acc;                                                                                      \
        }                                                                                                     \
    }

EM_DEF_POOL(float, f32)
#ifdef EM_FP64
EM_DEF_POOL(double, f64)
#endif
