/* The per-element index math of the CUDA conv/pool kernels
 * (devices/cuda/conv.cu; contracts at the top of tasks/conv.c and
 * tasks/pool.c). __host__ __device__ and free of StarPU and of the CUDA
 * runtime, so that a host program can check them against the CPU kernels.
 * Every read stays inside its operand: each index is bounds-checked against
 * the operand's sizes before it is used.
 *
 * Element access: the conv and pool functions take an access policy L
 * (template parameter, default Plain<T>) with the storage type T of the
 * operands, the accumulation type L::acc and L::ld (T -> acc); the kernels
 * store a result with L::st (acc -> T). Plain<T> is f32 / f64 accumulated in
 * their own type (the CPU kernels' types); devices/cuda/conv.cu adds the
 * 16-bit one (uint16_t bits of f16 / bf16, loaded exactly into float,
 * accumulated in float, rounded once at the store: the values of the CPU's
 * widened f32 conv, DESIGN.md §7). */
#ifndef EMBER_CUDA_CONV_ELEM_CUH
#define EMBER_CUDA_CONV_ELEM_CUH

#include <stdint.h>

namespace emc {
namespace convk {

/* x [N, C, H, W], w [O, Cg, KH, KW], y [N, O, OH, OW]; Cg = C/G, Og = O/G. */
struct ConvGeom {
    long long N, C, H, W, O, KH, KW, OH, OW, G, Cg, Og;
    long long sh, sw, ph, pw, dh, dw;
};

/* The access policy of f32 / f64 operands: accumulated in T itself. */
template <typename T>
struct Plain {
    typedef T acc;
    __host__ __device__ T ld(T v) const { return v; }
    __host__ __device__ T st(T v) const { return v; }
};

/* y[t], t = ((n*O + o)*OH + oh)*OW + ow:
 * sum_{c, i, j} x[n, (o/Og)*Cg + c, h, w] * w[o, c, i, j] over (h, w) inside x */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline typename L::acc conv_fwd_at(const ConvGeom &g, const T *__restrict__ x, const T *__restrict__ w, long long t,
                                                       const L &ls = L())
{
    long long r = t;
    const long long ow = r % g.OW;
    r /= g.OW;
    const long long oh = r % g.OH;
    r /= g.OH;
    const long long o = r % g.O, n = r / g.O;
    const T *xb = x + (n * g.C + (o / g.Og) * g.Cg) * g.H * g.W;
    const T *wb = w + o * g.Cg * g.KH * g.KW;
    typename L::acc acc = 0;
    for (long long c = 0; c < g.Cg; c++)
        for (long long i = 0; i < g.KH; i++) {
            const long long h = oh * g.sh - g.ph + i * g.dh;
            if (h < 0 || h >= g.H) continue;
            const T *xr = xb + (c * g.H + h) * g.W;
            const T *wr = wb + (c * g.KH + i) * g.KW;
            for (long long j = 0; j < g.KW; j++) {
                const long long wc = ow * g.sw - g.pw + j * g.dw;
                if (wc >= 0 && wc < g.W) acc += ls.ld(xr[wc]) * ls.ld(wr[j]);
            }
        }
    return acc;
}

/* dx[t], t = ((n*C + c)*H + h)*W + w: sum over o of c's group, i, j with
 * oh*sh - ph + i*dh = h, ow*sw - pw + j*dw = w (inside dy) of
 * dy[n,o,oh,ow] * w[o, c % Cg, i, j] */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline typename L::acc conv_bwd_data_at(const ConvGeom &g, const T *__restrict__ dy, const T *__restrict__ w,
                                                            long long t, const L &ls = L())
{
    long long r = t;
    const long long wc = r % g.W;
    r /= g.W;
    const long long h = r % g.H;
    r /= g.H;
    const long long c = r % g.C, n = r / g.C;
    const long long gr = c / g.Cg, cc = c % g.Cg;
    typename L::acc acc = 0;
    for (long long o = gr * g.Og; o < (gr + 1) * g.Og; o++) {
        const T *dyb = dy + (n * g.O + o) * g.OH * g.OW;
        const T *wb = w + (o * g.Cg + cc) * g.KH * g.KW;
        for (long long i = 0; i < g.KH; i++) {
            const long long nh = h + g.ph - i * g.dh;
            if (nh < 0 || nh % g.sh) continue;
            const long long oh = nh / g.sh;
            if (oh >= g.OH) continue;
            for (long long j = 0; j < g.KW; j++) {
                const long long nw = wc + g.pw - j * g.dw;
                if (nw < 0 || nw % g.sw) continue;
                const long long ow = nw / g.sw;
                if (ow >= g.OW) continue;
                acc += ls.ld(dyb[oh * g.OW + ow]) * ls.ld(wb[i * g.KW + j]);
            }
        }
    }
    return acc;
}

/* Part of dw[e], e = ((o*Cg + c)*KH + i)*KW + j: the terms q = q0, q0 + step,
 * ... < N*OH*OW (q = (n*OH + oh)*OW + ow) of
 * sum_{n, oh, ow} dy[n,o,oh,ow] * x[n, (o/Og)*Cg + c, h, w] over (h, w) inside x */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline typename L::acc conv_bwd_weight_part(const ConvGeom &g, const T *__restrict__ x, const T *__restrict__ dy,
                                                                long long e, long long q0, long long step, const L &ls = L())
{
    long long r = e;
    const long long j = r % g.KW;
    r /= g.KW;
    const long long i = r % g.KH;
    r /= g.KH;
    const long long c = r % g.Cg, o = r / g.Cg;
    const long long ci = (o / g.Og) * g.Cg + c;
    const long long red = g.N * g.OH * g.OW;
    typename L::acc acc = 0;
    for (long long q = q0; q < red; q += step) {
        long long s = q;
        const long long ow = s % g.OW;
        s /= g.OW;
        const long long oh = s % g.OH, n = s / g.OH;
        const long long h = oh * g.sh - g.ph + i * g.dh, wc = ow * g.sw - g.pw + j * g.dw;
        if (h < 0 || h >= g.H || wc < 0 || wc >= g.W) continue;
        acc += ls.ld(dy[((n * g.O + o) * g.OH + oh) * g.OW + ow]) * ls.ld(x[((n * g.C + ci) * g.H + h) * g.W + wc]);
    }
    return acc;
}

/* ---- pooling ---------------------------------------------------------------- */

/* x / dx [NC, H, W], y / dy [NC, OH, OW]; p.pool's fields. */
struct PoolGeom {
    long long NC, H, W, OH, OW;
    long long kh, kw, sh, sw, ph, pw, dh, dw, divisor;
    int adaptive, cip;
};

/* Adaptive window [lo, hi) of output index o (in, out > 0): inside [0, in). */
__host__ __device__ inline void adaptive_range(long long o, long long in, long long out, long long &lo, long long &hi)
{
    lo = (o * in) / out;
    hi = ((o + 1) * in + out - 1) / out;
}

/* y[t], idx[t], t = (p*OH + oh)*OW + ow: the maximum of the window scanned
 * row-major, NaN a maximum (the last NaN wins), else the first of equal
 * maxima; idx = h*W + w. An empty window (excluded by the front end) gives 0
 * and -1. */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline void max_pool_at(const PoolGeom &g, const T *__restrict__ x, long long t, T *best_out, int64_t *idx_out,
                                            const L &ls = L())
{
    long long r = t;
    const long long ow = r % g.OW;
    r /= g.OW;
    const long long oh = r % g.OH, p = r / g.OH;
    long long h0, h1, w0, w1, dh = 1, dw = 1;
    if (g.adaptive) {
        adaptive_range(oh, g.H, g.OH, h0, h1);
        adaptive_range(ow, g.W, g.OW, w0, w1);
    } else {
        dh = g.dh, dw = g.dw;
        h0 = oh * g.sh - g.ph;
        w0 = ow * g.sw - g.pw;
        h1 = h0 + (g.kh - 1) * dh + 1;
        w1 = w0 + (g.kw - 1) * dw + 1;
        if (h0 < 0) h0 += (-h0 + dh - 1) / dh * dh; /* the first tap inside the input */
        if (w0 < 0) w0 += (-w0 + dw - 1) / dw * dw;
        if (h1 > g.H) h1 = g.H;
        if (w1 > g.W) w1 = g.W;
    }
    const T *xp = x + p * g.H * g.W;
    typename L::acc best = 0;
    long long bi = -1;
    for (long long h = h0; h < h1; h += dh)
        for (long long w = w0; w < w1; w += dw) {
            const typename L::acc v = ls.ld(xp[h * g.W + w]);
            if (bi < 0 || v > best || v != v) {
                best = v;
                bi = h * g.W + w;
            }
        }
    *best_out = ls.st(best);
    *idx_out = bi;
}

/* The clipped window of (oh, ow), each bound inside [0, H) x [0, W), and its
 * divisor (AVG_POOL2D's contract; the CPU's avg_window). */
template <typename T>
__host__ __device__ inline T avg_window(const PoolGeom &g, long long oh, long long ow, long long &h0, long long &h1, long long &w0,
                                        long long &w1)
{
    if (g.adaptive) {
        adaptive_range(oh, g.H, g.OH, h0, h1);
        adaptive_range(ow, g.W, g.OW, w0, w1);
        return (T)((h1 - h0) * (w1 - w0));
    }
    long long hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    long long he = hs + g.kh, we = ws + g.kw;
    if (he > g.H + g.ph) he = g.H + g.ph;
    if (we > g.W + g.pw) we = g.W + g.pw;
    const long long pool = (he - hs) * (we - ws);
    if (hs < 0) hs = 0;
    if (ws < 0) ws = 0;
    if (he > g.H) he = g.H;
    if (we > g.W) we = g.W;
    h0 = hs, h1 = he, w0 = ws, w1 = we;
    if (g.divisor) return (T)g.divisor;
    return (T)(g.cip ? pool : (he - hs) * (we - ws));
}

/* y[t], t = (p*OH + oh)*OW + ow: the window's row-major sum / div, in
 * L::acc (stored by the kernel with L::st). */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline typename L::acc avg_pool_at(const PoolGeom &g, const T *__restrict__ x, long long t, const L &ls = L())
{
    typedef typename L::acc A;
    long long r = t;
    const long long ow = r % g.OW;
    r /= g.OW;
    const long long oh = r % g.OH, p = r / g.OH;
    long long h0, h1, w0, w1;
    const A div = avg_window<A>(g, oh, ow, h0, h1, w0, w1);
    const T *xp = x + p * g.H * g.W;
    A s = 0;
    for (long long h = h0; h < h1; h++)
        for (long long w = w0; w < w1; w++) s += ls.ld(xp[h * g.W + w]);
    return s / div;
}

/* dx[t], t = (p*H + h)*W + w: the sum, in (oh, ow) order (the CPU's order of
 * accumulation), of dy[p, oh, ow] / div(oh, ow) over the windows holding
 * (h, w). Candidate rows come from the window formulas, one more on each
 * side, clipped to [0, OH) x [0, OW); each is checked against its window.
 * In L::acc (stored by the kernel with L::st). */
template <typename T, typename L = Plain<T>>
__host__ __device__ inline typename L::acc avg_pool_bwd_at(const PoolGeom &g, const T *__restrict__ dy, long long t, const L &ls = L())
{
    typedef typename L::acc A;
    long long r = t;
    const long long wc = r % g.W;
    r /= g.W;
    const long long h = r % g.H, p = r / g.H;
    long long oh0, oh1, ow0, ow1; /* inclusive */
    if (g.adaptive) {
        oh0 = h * g.OH / g.H;
        oh1 = ((h + 1) * g.OH + g.H - 1) / g.H - 1;
        ow0 = wc * g.OW / g.W;
        ow1 = ((wc + 1) * g.OW + g.W - 1) / g.W - 1;
    } else { /* oh*sh - ph <= h < oh*sh - ph + kh */
        const long long ah = h + g.ph - g.kh, aw = wc + g.pw - g.kw;
        oh0 = ah < 0 ? 0 : ah / g.sh + 1;
        ow0 = aw < 0 ? 0 : aw / g.sw + 1;
        oh1 = (h + g.ph) / g.sh;
        ow1 = (wc + g.pw) / g.sw;
    }
    oh0 = oh0 > 0 ? oh0 - 1 : 0;
    ow0 = ow0 > 0 ? ow0 - 1 : 0;
    oh1 = oh1 + 1 < g.OH - 1 ? oh1 + 1 : g.OH - 1;
    ow1 = ow1 + 1 < g.OW - 1 ? ow1 + 1 : g.OW - 1;
    const T *dyp = dy + p * g.OH * g.OW;
    A s = 0;
    for (long long oh = oh0; oh <= oh1; oh++)
        for (long long ow = ow0; ow <= ow1; ow++) {
            long long h0, h1, w0, w1;
            const A div = avg_window<A>(g, oh, ow, h0, h1, w0, w1);
            if (h >= h0 && h < h1 && wc >= w0 && wc < w1) s += ls.ld(dyp[oh * g.OW + ow]) / div;
        }
    return s;
}

} // namespace convk
} // namespace emc

#endif
