/* CPU kernels of the conv family (CONV2D, CONV2D_BWD_DATA,
 * CONV2D_BWD_WEIGHT; contracts at the top of tasks/conv.c): im2col +
 * OpenBLAS GEMM per sample and group, one BLAS thread inside the worker
 * (em_init sets openblas_set_num_threads(1)).
 *
 *   col[(c*KH + i)*KW + j][oh*OW + ow] = x[n, g*Cg + c, h, w]  (0 outside)
 *   forward:     y[n, g]  [Og, OH*OW]      = w[g] [Og, Cg*KH*KW] @ col
 *   bwd data:    col                       = w[g]^T @ dy[n, g], then col2im
 *                                            adds col back into dx[n, g]
 *   bwd weight:  dw[g] [Og, Cg*KH*KW]     += dy[n, g] @ col^T   (over n)
 * A 1x1 kernel with stride 1 and no padding uses x itself as col. The col
 * buffer (Cg*KH*KW*OH*OW elements) is the worker thread's, kept between
 * tasks; failing to get it is an EM_ERR_NOMEM kernel error.
 *
 * f32 convs go to oneDNN instead (devices/cpu/conv_dnnl.c) when the build
 * found it, unless EMBER_CPU_CONV=im2col; a shape oneDNN has no primitive
 * for comes back here. */
#include "devices/cpu/conv_dnnl.h"
#include "devices/cpu/cpu.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct geom {
    int64_t N, C, H, W, O, OH, OW, KH, KW, G, Cg, Og, K, P; /* K = Cg*KH*KW, P = OH*OW */
    int64_t sh, sw, ph, pw, dh, dw;
} geom;

static void geometry(const em_kargs *k, const em_tdesc *x, const em_tdesc *w, const em_tdesc *y, geom *g)
{
    g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
    g->O = w->shape[0], g->KH = w->shape[2], g->KW = w->shape[3];
    g->OH = y->shape[2], g->OW = y->shape[3];
    g->G = k->p.conv.groups;
    g->Cg = g->C / g->G, g->Og = g->O / g->G;
    g->K = g->Cg * g->KH * g->KW, g->P = g->OH * g->OW;
    g->sh = k->p.conv.stride[0], g->sw = k->p.conv.stride[1];
    g->ph = k->p.conv.pad[0], g->pw = k->p.conv.pad[1];
    g->dh = k->p.conv.dilation[0], g->dw = k->p.conv.dilation[1];
}

static bool direct_col(const geom *g)
{
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 && g->OH == g->H && g->OW == g->W;
}

/* floor(a / b) and ceil(a / b) for b > 0 and any sign of a. */
static inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

/* The output columns [*lo, *hi) whose input column ow*sw - pw + j*dw is
 * inside [0, W). */
static inline void valid_cols(const geom *g, int64_t j, int64_t *lo, int64_t *hi)
{
    const int64_t off = j * g->dw - g->pw; /* input column of ow = 0 */
    int64_t l = ceil_div(-off, g->sw), h = floor_div(g->W - 1 - off, g->sw) + 1;
    *lo = l < 0 ? 0 : l > g->OW ? g->OW : l;
    *hi = h > g->OW ? g->OW : h < *lo ? *lo : h;
}

/* The im2col / col2im loops and the GEMM calls, for T = float / double.
 * Rows of col are filled by runs: zeros left and right of the valid
 * columns, a memcpy (stride 1) or a strided gather in between. */
#define CONV_IMPL(T, GEMM)                                                                                              \
    static void im2col_##T(const geom *g, const T *x, T *col)                                                          \
    {                                                                                                                   \
        for (int64_t c = 0; c < g->Cg; c++)                                                                             \
            for (int64_t i = 0; i < g->KH; i++)                                                                         \
                for (int64_t j = 0; j < g->KW; j++) {                                                                   \
                    T *row = col + ((c * g->KH + i) * g->KW + j) * g->P;                                                \
                    const T *plane = x + c * g->H * g->W;                                                               \
                    int64_t lo, hi;                                                                                     \
                    valid_cols(g, j, &lo, &hi);                                                                         \
                    const int64_t off = j * g->dw - g->pw;                                                              \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                                                            \
                        const int64_t h = oh * g->sh - g->ph + i * g->dh;                                               \
                        T *r = row + oh * g->OW;                                                                        \
                        if (h < 0 || h >= g->H || lo >= hi) {                                                           \
                            memset(r, 0, sizeof(T) * (size_t)g->OW);                                                    \
                            continue;                                                                                   \
                        }                                                                                               \
                        const T *src = plane + h * g->W + off;                                                          \
                        if (lo) memset(r, 0, sizeof(T) * (size_t)lo);                                                   \
                        if (g->sw == 1)                                                                                 \
                            memcpy(r + lo, src + lo, sizeof(T) * (size_t)(hi - lo));                                    \
                        else                                                                                            \
                            for (int64_t ow = lo; ow < hi; ow++) r[ow] = src[ow * g->sw];                               \
                        if (hi < g->OW) memset(r + hi, 0, sizeof(T) * (size_t)(g->OW - hi));                            \
                    }                                                                                                   \
                }                                                                                                       \
    }                                                                                                                   \
    static void col2im_##T(const geom *g, const T *col, T *x)                                                          \
    {                                                                                                                   \
        for (int64_t c = 0; c < g->Cg; c++)                                                                             \
            for (int64_t i = 0; i < g->KH; i++)                                                                         \
                for (int64_t j = 0; j < g->KW; j++) {                                                                   \
                    const T *row = col + ((c * g->KH + i) * g->KW + j) * g->P;                                          \
                    T *plane = x + c * g->H * g->W;                                                                     \
                    int64_t lo, hi;                                                                                     \
                    valid_cols(g, j, &lo, &hi);                                                                         \
                    const int64_t off = j * g->dw - g->pw, sw = g->sw;                                                  \
                    for (int64_t oh = 0; oh < g->OH; oh++) {                                                            \
                        const int64_t h = oh * g->sh - g->ph + i * g->dh;                                               \
                        if (h < 0 || h >= g->H) continue;                                                               \
                        const T *r = row + oh * g->OW;                                                                  \
                        T *dst = plane + h * g->W + off;                                                                \
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow * sw] += r[ow];                                     \
                    }                                                                                                   \
                }                                                                                                       \
    }                                                                                                                   \
    /* The GEMM operand of one sample and group: its im2col in col, or the                                           \
     * input itself (col NULL: a 1x1 kernel, stride 1, no padding). */                                                 \
    static const T *cols_##T(const geom *g, const T *xg, T *col)                                                       \
    {                                                                                                                   \
        if (!col) return xg;                                                                                            \
        im2col_##T(g, xg, col);                                                                                         \
        return col;                                                                                                     \
    }                                                                                                                   \
    static void conv_##T(const em_kargs *k, void **bufs, T *col)                                                       \
    {                                                                                                                   \
        geom g;                                                                                                         \
        const int kind = k->kind;                                                                                       \
        if (kind == EM_OP_CONV2D) {                                                                                     \
            geometry(k, &k->in[0], &k->in[1], &k->out[0], &g);                                                          \
            const T *x = (const T *)bufs[0] + k->in[0].offset, *w = (const T *)bufs[1] + k->in[1].offset;               \
            T *y = (T *)bufs[2] + k->out[0].offset;                                                                     \
            for (int64_t n = 0; n < g.N; n++)                                                                           \
                for (int64_t gr = 0; gr < g.G; gr++) {                                                                  \
                    const T *c = cols_##T(&g, x + (n * g.C + gr * g.Cg) * g.H * g.W, col);                              \
                    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.Og, (int)g.P, (int)g.K, (T)1,               \
                         w + gr * g.Og * g.K, (int)g.K, c, (int)g.P, (T)0, y + (n * g.O + gr * g.Og) * g.P, (int)g.P);  \
                }                                                                                                       \
        } else if (kind == EM_OP_CONV2D_BWD_DATA) {                                                                     \
            geometry(k, &k->out[0], &k->in[1], &k->in[0], &g);                                                          \
            const T *dy = (const T *)bufs[0] + k->in[0].offset, *w = (const T *)bufs[1] + k->in[1].offset;              \
            T *dx = (T *)bufs[2] + k->out[0].offset;                                                                    \
            for (int64_t n = 0; n < g.N; n++)                                                                           \
                for (int64_t gr = 0; gr < g.G; gr++) {                                                                  \
                    T *dxg = dx + (n * g.C + gr * g.Cg) * g.H * g.W;                                                    \
                    T *c = col ? col : dxg;                                                                             \
                    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.K, (int)g.P, (int)g.Og, (T)1,                 \
                         w + gr * g.Og * g.K, (int)g.K, dy + (n * g.O + gr * g.Og) * g.P, (int)g.P, (T)0, c, (int)g.P); \
                    if (col) {                                                                                          \
                        memset(dxg, 0, sizeof(T) * (size_t)(g.Cg * g.H * g.W));                                         \
                        col2im_##T(&g, col, dxg);                                                                       \
                    }                                                                                                   \
                }                                                                                                       \
        } else {                                                                                                        \
            geometry(k, &k->in[0], &k->out[0], &k->in[1], &g);                                                          \
            const T *x = (const T *)bufs[0] + k->in[0].offset, *dy = (const T *)bufs[1] + k->in[1].offset;              \
            T *dw = (T *)bufs[2] + k->out[0].offset;                                                                    \
            for (int64_t n = 0; n < g.N; n++)                                                                           \
                for (int64_t gr = 0; gr < g.G; gr++) {                                                                  \
                    const T *c = cols_##T(&g, x + (n * g.C + gr * g.Cg) * g.H * g.W, col);                              \
                    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.Og, (int)g.K, (int)g.P, (T)1,                 \
                         dy + (n * g.O + gr * g.Og) * g.P, (int)g.P, c, (int)g.P, n ? (T)1 : (T)0,                     \
                         dw + gr * g.Og * g.K, (int)g.K);                                                               \
                }                                                                                                       \
        }                                                                                                               \
    }

CONV_IMPL(float, cblas_sgemm)
CONV_IMPL(double, cblas_dgemm)

/* The im2col buffer of the calling worker thread: kept between tasks (no
 * page faults on a fresh allocation per task), grown on demand, freed when
 * the thread ends (a pthread key destructor). NULL when out of memory. */
typedef struct col_buf {
    void *p;
    size_t bytes;
} col_buf;
static pthread_key_t g_col_key;
static pthread_once_t g_col_once = PTHREAD_ONCE_INIT;
static void col_free(void *v)
{
    col_buf *b = v;
    if (b) free(b->p);
    free(b);
}
static void col_key_init(void) { (void)pthread_key_create(&g_col_key, col_free); }
static void *col_get(size_t bytes)
{
    (void)pthread_once(&g_col_once, col_key_init);
    col_buf *b = pthread_getspecific(g_col_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(g_col_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->bytes < bytes) {
        free(b->p);
        b->bytes = 0;
        if (!(b->p = malloc(bytes))) return NULL;
        b->bytes = bytes;
    }
    return b->p;
}

void em_cpu_conv(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    if (k->kind != EM_OP_CONV2D && k->kind != EM_OP_CONV2D_BWD_DATA && k->kind != EM_OP_CONV2D_BWD_WEIGHT) {
        em_cpu_bad_kind("conv", k->kind);
        return;
    }
    geom g;
    if (k->kind == EM_OP_CONV2D)
        geometry(k, &k->in[0], &k->in[1], &k->out[0], &g);
    else if (k->kind == EM_OP_CONV2D_BWD_DATA)
        geometry(k, &k->out[0], &k->in[1], &k->in[0], &g);
    else
        geometry(k, &k->in[0], &k->out[0], &k->in[1], &g);
    const int dt = k->in[0].dtype;
    const size_t es = dt == EM_F32 ? sizeof(float) : dt == EM_F64 ? sizeof(double) : 0;
    if (!es) {
        em_cpu_bad_kind("conv dtype", dt);
        return;
    }
    void *bufs[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in + k->n_out; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    if (dt == EM_F32 && em__cpu_conv_path() == EM_CPU_CONV_ONEDNN && em__cpu_conv_dnnl(k, bufs)) return;
    void *col = NULL;
    if (!direct_col(&g)) {
        col = col_get(es * (size_t)(g.K * g.P > 0 ? g.K * g.P : 1));
        if (!col) {
            em__kernel_error(k, EM_ERR_NOMEM, "out of memory for the im2col buffer (%lld x %lld elements)", (long long)g.K,
                             (long long)g.P);
            return;
        }
    }
    if (dt == EM_F32)
        conv_float(k, bufs, (float *)col);
    else
        conv_double(k, bufs, (double *)col);
}

/* ---- pooling (contracts at the top of tasks/pool.c) ---------------------- */

/* Window [*lo, *hi) of output index o along a dim of size in (stride-1
 * positions for fixed windows; the caller steps by dilation). */
static inline void adaptive_range(int64_t o, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
    *lo = (o * in) / out;
    *hi = ((o + 1) * in + out - 1) / out;
}

#define POOL_IMPL(T)                                                                                                 \
    static void max_pool_##T(const em_kargs *k, void **bufs)                                                         \
    {                                                                                                                \
        const em_tdesc *X = &k->in[0], *Y = &k->out[0];                                                              \
        const T *x = (const T *)bufs[0] + X->offset;                                                                 \
        T *y = (T *)bufs[1] + Y->offset;                                                                             \
        int64_t *idx = (int64_t *)bufs[2] + k->out[1].offset;                                                        \
        const int64_t NC = X->shape[0] * X->shape[1], H = X->shape[2], W = X->shape[3], OH = Y->shape[2],            \
                      OW = Y->shape[3];                                                                              \
        const int ad = k->p.pool.adaptive;                                                                           \
        for (int64_t p = 0; p < NC; p++) {                                                                           \
            const T *xp = x + p * H * W;                                                                             \
            for (int64_t oh = 0; oh < OH; oh++)                                                                      \
                for (int64_t ow = 0; ow < OW; ow++) {                                                                \
                    int64_t h0, h1, w0, w1, dh = 1, dw = 1;                                                          \
                    if (ad) {                                                                                        \
                        adaptive_range(oh, H, OH, &h0, &h1);                                                         \
                        adaptive_range(ow, W, OW, &w0, &w1);                                                         \
                    } else {                                                                                         \
                        dh = k->p.pool.dilation[0], dw = k->p.pool.dilation[1];                                      \
                        h0 = oh * k->p.pool.stride[0] - k->p.pool.pad[0];                                            \
                        w0 = ow * k->p.pool.stride[1] - k->p.pool.pad[1];                                            \
                        h1 = h0 + (k->p.pool.kernel[0] - 1) * dh + 1;                                                \
                        w1 = w0 + (k->p.pool.kernel[1] - 1) * dw + 1;                                                \
                        while (h0 < 0) h0 += dh;                                                                     \
                        while (w0 < 0) w0 += dw;                                                                     \
                        if (h1 > H) h1 = H;                                                                          \
                        if (w1 > W) w1 = W;                                                                          \
                    }                                                                                                \
                    T best = 0;                                                                                      \
                    int64_t bi = -1;                                                                                 \
                    for (int64_t h = h0; h < h1; h += dh)                                                            \
                        for (int64_t w = w0; w < w1; w += dw) {                                                      \
                            const T v = xp[h * W + w];                                                               \
                            if (bi < 0 || v > best || v != v) {                               \
                                best = v;                                                                            \
                                bi = h * W + w;                                                                      \
                            }                                                                                        \
                        }                                                                                            \
                    y[(p * OH + oh) * OW + ow] = best;                                                               \
                    idx[(p * OH + oh) * OW + ow] = bi;                                                               \
                }                                                                                                    \
        }                                                                                                            \
    }                                                                                                                \
    /* The clipped window of (oh, ow) and its divisor (AVG_POOL2D's contract). */                                   \
    static T avg_window_##T(const em_kargs *k, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t oh, int64_t ow,  \
                            int64_t *h0, int64_t *h1, int64_t *w0, int64_t *w1)                                      \
    {                                                                                                                \
        if (k->p.pool.adaptive) {                                                                                    \
            adaptive_range(oh, H, OH, h0, h1);                                                                       \
            adaptive_range(ow, W, OW, w0, w1);                                                                       \
            return (T)((*h1 - *h0) * (*w1 - *w0));                                                                   \
        }                                                                                                            \
        const int64_t ph = k->p.pool.pad[0], pw = k->p.pool.pad[1];                                                  \
        int64_t hs = oh * k->p.pool.stride[0] - ph, ws = ow * k->p.pool.stride[1] - pw;                              \
        int64_t he = hs + k->p.pool.kernel[0], we = ws + k->p.pool.kernel[1];                                        \
        if (he > H + ph) he = H + ph;                                                                                \
        if (we > W + pw) we = W + pw;                                                                                \
        const int64_t pool = (he - hs) * (we - ws);                                                                  \
        if (hs < 0) hs = 0;                                                                                          \
        if (ws < 0) ws = 0;                                                                                          \
        if (he > H) he = H;                                                                                          \
        if (we > W) we = W;                                                                                          \
        *h0 = hs, *h1 = he, *w0 = ws, *w1 = we;                                                                      \
        if (k->p.pool.divisor) return (T)k->p.pool.divisor;                                                          \
        return (T)(k->p.pool.count_include_pad ? pool : (he - hs) * (we - ws));                                      \
    }                                                                                                                \
    static void avg_pool_##T(const em_kargs *k, void **bufs, bool backward)                                          \
    {                                                                                                                \
        const em_tdesc *X = backward ? &k->out[0] : &k->in[0], *Y = backward ? &k->in[0] : &k->out[0];               \
        const int64_t NC = X->shape[0] * X->shape[1], H = X->shape[2], W = X->shape[3], OH = Y->shape[2],            \
                      OW = Y->shape[3];                                                                              \
        T *x = (T *)bufs[backward ? 1 : 0] + X->offset;                                                              \
        T *y = (T *)bufs[backward ? 0 : 1] + Y->offset;                                                              \
        if (backward) memset(x, 0, sizeof(T) * (size_t)(NC * H * W));                                                \
        for (int64_t p = 0; p < NC; p++) {                                                                           \
            T *xp = x + p * H * W;                                                                                   \
            for (int64_t oh = 0; oh < OH; oh++)                                                                      \
                for (int64_t ow = 0; ow < OW; ow++) {                                                                \
                    int64_t h0, h1, w0, w1;                                                                          \
                    const T div = avg_window_##T(k, H, W, OH, OW, oh, ow, &h0, &h1, &w0, &w1);                       \
                    T *yo = y + (p * OH + oh) * OW + ow;                                                             \
                    if (backward) {                                                                                  \
                        const T v = *yo / div;                                                                       \
                        for (int64_t h = h0; h < h1; h++)                                                            \
                            for (int64_t w = w0; w < w1; w++) xp[h * W + w] += v;                                    \
                    } else {                                                                                         \
                        T s = 0;                                                                                     \
                        for (int64_t h = h0; h < h1; h++)                                                            \
                            for (int64_t w = w0; w < w1; w++) s += xp[h * W + w];                                    \
                        *yo = s / div;                                                                               \
                    }                                                                                                \
                }                                                                                                    \
        }                                                                                                            \
    }

POOL_IMPL(float)
POOL_IMPL(double)

void em_cpu_pool(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int dt = k->in[0].dtype;
    if (dt != EM_F32 && dt != EM_F64) {
        em_cpu_bad_kind("pool dtype", dt);
        return;
    }
    void *buffers_[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in + k->n_out; i++) buffers_[i] = em_cpu_ptr(buffers[i]);
    buffers = buffers_;
    switch (k->kind) {
    case EM_OP_MAX_POOL2D:
        if (dt == EM_F32)
            max_pool_float(k, buffers);
        else
            max_pool_double(k, buffers);
        break;
    case EM_OP_AVG_POOL2D:
    case EM_OP_AVG_POOL2D_BWD:
        if (dt == EM_F32)
            avg_pool_float(k, buffers, k->kind == EM_OP_AVG_POOL2D_BWD);
        else
            avg_pool_double(k, buffers, k->kind == EM_OP_AVG_POOL2D_BWD);
        break;
    default: em_cpu_bad_kind("pool", k->kind);
    }
}
