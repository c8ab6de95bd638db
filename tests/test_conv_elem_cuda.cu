/* The per-element math of the CUDA conv/pool kernels (devices/cuda/conv_elem.cuh),
 * run on the host against reference loops written from the kernel contracts
 * (tasks/conv.c, tasks/pool.c) in their scatter form, the CPU kernels' order:
 *   - conv: forward, data gradient (the kernels gather per dx element; the
 *     reference scatters per dy element) and weight gradient (the kernels'
 *     256-way split of the sum and its tree are replayed), f64 to 1e-12 and
 *     f32 to 1e-5 (relative); and through the 16-bit access policy of
 *     conv.cu's Half16 written again for the host (uint16_t bits of f16 /
 *     bf16, devices/half.h's converters, float accumulation): the float sums
 *     against the reference of the same 16-bit values, to 1e-5, so every
 *     operand is read through the policy and summed in float;
 *   - pooling: max (NaNs and ties in the input; values and indices), avg and
 *     the avg data gradient (gathered over the windows holding each element,
 *     against the reference's scatter), all bit-identical, f32 and f64, over
 *     random fixed windows (stride, padding, dilation for max, ceil_mode,
 *     count_include_pad, divisor) and adaptive ones (more outputs than inputs
 *     included); and in f16 / bf16 through the host Half16 policy, bit for
 *     bit against the f32 functions on the same 16-bit values rounded once
 *     (the CPU's widened pooling), NaNs included for max.
 * Buffers are exactly the operands' sizes, so an out-of-bounds read shows
 * under the sanitizers. No GPU needed: it runs wherever nvcc builds the CUDA
 * kernels. Exit status = number of failing checks (0: pass). */
#include "devices/cuda/conv_elem.cuh"

#include <math.h>
#include <stdint.h>
#include <random>
#include <stdio.h>
#include <string.h>
#include <type_traits>
#include <vector>

using namespace emc::convk;

/* devices/half.h, called on the host only (__host__ __device__ because the
 * conv_elem.cuh functions that call the policy are) */
__host__ __device__ static inline uint32_t host_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
__host__ __device__ static inline float host_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define EW_FN __host__ __device__ static inline
typedef uint32_t em_u32;
typedef uint16_t em_u16;
#define EM_F2U(f) host_f2u(f)
#define EM_U2F(u) host_u2f(u)
#include "devices/half.h"

/* conv.cu's Half16 on the host: f16 / bf16 bits, float accumulation. */
struct HostHalf16 {
    typedef float acc;
    bool bf;
    __host__ __device__ float ld(uint16_t v) const { return bf ? em_bf16_bits_to_f32(v) : em_f16_bits_to_f32(v); }
    __host__ __device__ uint16_t st(float v) const { return bf ? em_f32_to_bf16_bits(v) : em_f32_to_f16_bits(v); }
};

static std::mt19937_64 g_rng(20261201);
static int g_fails;

static long long ri(long long lo, long long hi) { return std::uniform_int_distribution<long long>(lo, hi)(g_rng); }

template <typename T>
static void fill(std::vector<T> &v, bool nans)
{
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto &e : v) {
        e = (T)u(g_rng);
        if (ri(0, 7) == 0) e = (T)ri(-2, 2); /* ties */
        if (nans && ri(0, 9) == 0) e = (T)NAN;
    }
}

template <typename T>
static bool close_to(T a, T b, double tol)
{
    return fabs((double)a - (double)b) <= tol * (1 + fabs((double)b));
}

template <typename T>
static bool same(T a, T b)
{
    return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}

static void fail(const char *what, long long t, double got, double want)
{
    if (g_fails++ < 20) printf("FAIL %s: element %lld: %.17g, reference %.17g\n", what, t, got, want);
}

/* ---- conv ------------------------------------------------------------------- */

/* Values in [-1, 1] and some small integers (exact ties), stored through
 * the policy (16-bit: rounded once). */
template <typename T, typename L>
static void fill_ls(std::vector<T> &v, const L &ls)
{
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto &e : v) {
        e = ls.st((typename L::acc)u(g_rng));
        if (ri(0, 7) == 0) e = ls.st((typename L::acc)ri(-2, 2));
    }
}

/* The reference sums in double over the values the policy loads. */
template <typename T, typename L = Plain<T>>
static void conv_case(double tol, const L &ls = L())
{
    ConvGeom g;
    g.N = ri(1, 3), g.G = ri(1, 3);
    g.Cg = ri(1, 3), g.Og = ri(1, 3);
    g.C = g.G * g.Cg, g.O = g.G * g.Og;
    g.H = ri(1, 9), g.W = ri(1, 9), g.KH = ri(1, 4), g.KW = ri(1, 4);
    g.sh = ri(1, 3), g.sw = ri(1, 3), g.ph = ri(0, 3), g.pw = ri(0, 3), g.dh = ri(1, 3), g.dw = ri(1, 3);
    const long long spanh = g.H + 2 * g.ph - g.dh * (g.KH - 1) - 1, spanw = g.W + 2 * g.pw - g.dw * (g.KW - 1) - 1;
    if (spanh < 0 || spanw < 0) return;
    g.OH = spanh / g.sh + 1 + ri(0, 1) * ri(-1, 0); /* the contract allows other output sizes (smaller here) */
    g.OW = spanw / g.sw + 1;
    if (g.OH <= 0) return;
    std::vector<T> x(g.N * g.C * g.H * g.W), w(g.O * g.Cg * g.KH * g.KW), dy(g.N * g.O * g.OH * g.OW);
    fill_ls(x, ls), fill_ls(w, ls), fill_ls(dy, ls);
    std::vector<double> y(dy.size(), 0), dx(x.size(), 0), dw(w.size(), 0);
    for (long long n = 0; n < g.N; n++)
        for (long long o = 0; o < g.O; o++)
            for (long long oh = 0; oh < g.OH; oh++)
                for (long long ow = 0; ow < g.OW; ow++)
                    for (long long c = 0; c < g.Cg; c++)
                        for (long long i = 0; i < g.KH; i++)
                            for (long long j = 0; j < g.KW; j++) {
                                const long long h = oh * g.sh - g.ph + i * g.dh, wc = ow * g.sw - g.pw + j * g.dw;
                                if (h < 0 || h >= g.H || wc < 0 || wc >= g.W) continue;
                                const long long xi = ((n * g.C + (o / g.Og) * g.Cg + c) * g.H + h) * g.W + wc;
                                const long long wi = ((o * g.Cg + c) * g.KH + i) * g.KW + j;
                                const long long yi = ((n * g.O + o) * g.OH + oh) * g.OW + ow;
                                const double xv = ls.ld(x[xi]), wv = ls.ld(w[wi]), dyv = ls.ld(dy[yi]);
                                y[yi] += xv * wv;
                                dx[xi] += dyv * wv;
                                dw[wi] += dyv * xv;
                            }
    typedef typename L::acc A;
    for (long long t = 0; t < (long long)y.size(); t++) {
        const A v = conv_fwd_at<T, L>(g, x.data(), w.data(), t, ls);
        if (!close_to<double>(v, y[t], tol)) fail("conv2d", t, v, y[t]);
    }
    for (long long t = 0; t < (long long)dx.size(); t++) {
        const A v = conv_bwd_data_at<T, L>(g, dy.data(), w.data(), t, ls);
        if (!close_to<double>(v, dx[t], tol)) fail("conv2d_bwd_data", t, v, dx[t]);
    }
    const int nt = 256; /* k_conv_bwd_weight's kThreads */
    for (long long e = 0; e < (long long)dw.size(); e++) {
        A part[nt];
        for (int q = 0; q < nt; q++) part[q] = conv_bwd_weight_part<T, L>(g, x.data(), dy.data(), e, q, nt, ls);
        for (int s = nt / 2; s > 0; s >>= 1)
            for (int q = 0; q < s; q++) part[q] += part[q + s];
        if (!close_to<double>(part[0], dw[e], tol)) fail("conv2d_bwd_weight", e, part[0], dw[e]);
    }
}

/* ---- pooling ------------------------------------------------------------------ */

/* Window bounds of the reference (tasks/pool.c's contract, written again). */
static void ref_range(const PoolGeom &g, int dim, long long o, long long &lo, long long &hi, long long &step)
{
    const long long in = dim ? g.W : g.H, out = dim ? g.OW : g.OH;
    step = 1;
    if (g.adaptive) {
        lo = o * in / out;
        hi = ((o + 1) * in + out - 1) / out;
        return;
    }
    const long long s = dim ? g.sw : g.sh, p = dim ? g.pw : g.ph, k = dim ? g.kw : g.kh, d = dim ? g.dw : g.dh;
    step = d;
    lo = o * s - p;
    hi = lo + (k - 1) * d + 1;
    while (lo < 0) lo += d;
    if (hi > in) hi = in;
}

template <typename T>
static T ref_avg_window(const PoolGeom &g, long long oh, long long ow, long long *b)
{
    if (g.adaptive) {
        long long st;
        ref_range(g, 0, oh, b[0], b[1], st);
        ref_range(g, 1, ow, b[2], b[3], st);
        return (T)((b[1] - b[0]) * (b[3] - b[2]));
    }
    long long hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
    long long he = hs + g.kh < g.H + g.ph ? hs + g.kh : g.H + g.ph, we = ws + g.kw < g.W + g.pw ? ws + g.kw : g.W + g.pw;
    const long long pool = (he - hs) * (we - ws);
    hs = hs < 0 ? 0 : hs, ws = ws < 0 ? 0 : ws, he = he > g.H ? g.H : he, we = we > g.W ? g.W : we;
    b[0] = hs, b[1] = he, b[2] = ws, b[3] = we;
    if (g.divisor) return (T)g.divisor;
    return (T)(g.cip ? pool : (he - hs) * (we - ws));
}

/* The 16-bit pooling of the values of @p x / @p dy rounded to f16 or bf16
 * (HostHalf16) against the f32 functions on those rounded values, rounded
 * once: the same bits (the widened op's). max only when @p max_only. */
static void pool_half_check(const PoolGeom &g, const std::vector<float> &x, const std::vector<float> &dy, bool max_only, bool bf)
{
    const HostHalf16 ls{bf};
    std::vector<uint16_t> xh(x.size()), dyh(dy.size());
    std::vector<float> xf(x.size()), dyf(dy.size());
    for (size_t i = 0; i < x.size(); i++) xh[i] = ls.st(x[i]), xf[i] = ls.ld(xh[i]);
    for (size_t i = 0; i < dy.size(); i++) dyh[i] = ls.st(dy[i]), dyf[i] = ls.ld(dyh[i]);
    for (long long t = 0; t < (long long)dy.size(); t++) {
        if (max_only) {
            float vf;
            uint16_t vh;
            int64_t i32, i16;
            max_pool_at<float>(g, xf.data(), t, &vf, &i32);
            max_pool_at<uint16_t, HostHalf16>(g, xh.data(), t, &vh, &i16, ls);
            if (vh != ls.st(vf) || i16 != i32) fail(bf ? "max_pool2d (bf16)" : "max_pool2d (f16)", t, ls.ld(vh), vf);
        } else {
            const float vf = avg_pool_at<float>(g, xf.data(), t), vh = avg_pool_at<uint16_t, HostHalf16>(g, xh.data(), t, ls);
            if (ls.st(vh) != ls.st(vf)) fail(bf ? "avg_pool2d (bf16)" : "avg_pool2d (f16)", t, vh, vf);
        }
    }
    if (max_only) return;
    for (long long t = 0; t < (long long)x.size(); t++) {
        const float vf = avg_pool_bwd_at<float>(g, dyf.data(), t), vh = avg_pool_bwd_at<uint16_t, HostHalf16>(g, dyh.data(), t, ls);
        if (ls.st(vh) != ls.st(vf)) fail(bf ? "avg_pool2d_bwd (bf16)" : "avg_pool2d_bwd (f16)", t, vh, vf);
    }
}

template <typename T>
static void pool_case()
{
    PoolGeom g;
    memset(&g, 0, sizeof g);
    g.NC = ri(1, 2) * ri(1, 3), g.H = ri(1, 10), g.W = ri(1, 10);
    g.adaptive = ri(0, 3) == 0;
    bool dilated = false;
    if (g.adaptive) {
        g.OH = ri(1, 2 * g.H + 1), g.OW = ri(1, 2 * g.W + 1);
    } else { /* tasks/pool.c's fixed_geometry */
        const bool ceil_mode = ri(0, 1);
        dilated = ri(0, 2) == 0;
        for (int i = 0; i < 2; i++) {
            const long long k = ri(1, 5), s = ri(1, 4), p = ri(0, k / 2), d = dilated ? ri(1, 3) : 1, in = i ? g.W : g.H;
            const long long span = in + 2 * p - (d * (k - 1) + 1);
            if (span < 0) return;
            long long n = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
            if (ceil_mode && (n - 1) * s >= in + p) n--;
            if (n <= 0) return;
            (i ? g.OW : g.OH) = n;
            (i ? g.kw : g.kh) = k, (i ? g.sw : g.sh) = s, (i ? g.pw : g.ph) = p, (i ? g.dw : g.dh) = d;
        }
        g.cip = (int)ri(0, 1);
        g.divisor = ri(0, 3) == 0 ? ri(1, 7) : 0;
    }
    std::vector<T> x(g.NC * g.H * g.W), dy(g.NC * g.OH * g.OW);
    fill(x, true), fill(dy, false);
    for (long long t = 0; t < (long long)dy.size(); t++) { /* max */
        const long long ow = t % g.OW, oh = t / g.OW % g.OH, p = t / (g.OW * g.OH);
        long long h0, h1, sh, w0, w1, sw;
        ref_range(g, 0, oh, h0, h1, sh);
        ref_range(g, 1, ow, w0, w1, sw);
        T best = 0;
        long long bi = -1;
        for (long long h = h0; h < h1; h += sh)
            for (long long w = w0; w < w1; w += sw) {
                const T v = x[(p * g.H + h) * g.W + w];
                if (bi < 0 || v > best || isnan(v)) best = v, bi = h * g.W + w;
            }
        T v;
        int64_t idx;
        max_pool_at<T>(g, x.data(), t, &v, &idx);
        if (!same(v, best)) fail("max_pool2d", t, v, best);
        if (idx != bi) fail("max_pool2d indices", t, (double)idx, (double)bi);
    }
    if constexpr (std::is_same<T, float>::value) /* the 16-bit policy, from the f32 case's values */
        for (int bf = 0; bf < 2; bf++) pool_half_check(g, x, dy, true, bf);
    if (dilated) return; /* avg pooling has no dilation */
    fill(x, false);
    std::vector<T> dx(x.size(), 0);
    for (long long t = 0; t < (long long)dy.size(); t++) { /* avg and its gradient (scatter) */
        const long long ow = t % g.OW, oh = t / g.OW % g.OH, p = t / (g.OW * g.OH);
        long long b[4];
        const T div = ref_avg_window<T>(g, oh, ow, b);
        T s = 0;
        for (long long h = b[0]; h < b[1]; h++)
            for (long long w = b[2]; w < b[3]; w++) s += x[(p * g.H + h) * g.W + w];
        const T v = avg_pool_at<T>(g, x.data(), t), want = s / div;
        if (!same(v, want)) fail("avg_pool2d", t, v, want);
        const T gv = dy[t] / div;
        for (long long h = b[0]; h < b[1]; h++)
            for (long long w = b[2]; w < b[3]; w++) dx[(p * g.H + h) * g.W + w] += gv;
    }
    for (long long t = 0; t < (long long)dx.size(); t++) {
        const T v = avg_pool_bwd_at<T>(g, dy.data(), t);
        if (!same(v, dx[t])) fail("avg_pool2d_bwd", t, v, dx[t]);
    }
    if constexpr (std::is_same<T, float>::value)
        for (int bf = 0; bf < 2; bf++) pool_half_check(g, x, dy, false, bf);
}

int main()
{
    for (int i = 0; i < 2000; i++) {
        conv_case<double>(1e-12);
        conv_case<float>(1e-5);
        conv_case<uint16_t>(1e-5, HostHalf16{false}); /* f16 */
        conv_case<uint16_t>(1e-5, HostHalf16{true});  /* bf16 */
    }
    for (int i = 0; i < 10000; i++) {
        pool_case<double>();
        pool_case<float>();
    }
    printf("test_conv_elem_cuda: %d failure(s)\n", g_fails);
    return g_fails ? 1 : 0;
}
