/* CUDA kernels of the norm family: fused training-mode batch norm forward and
 * backward, its running-statistics update, and fused layer norm forward and
 * backward (contracts at the top of tasks/norm.c; CPU reference
 * devices/cpu/norm.c). Sums are reduced in double (warp shuffles, then
 * shared memory), whatever the dtype.
 *
 * Batch norm: x is seen as [N, C, L], contiguous; a channel's M = N * L
 * values are j = n * L + i.
 *   - one block per channel (enough channels to fill the GPU, or no
 *     workspace): the block makes two passes for the statistics (the mean,
 *     then the squared deviations from it), then writes its outputs;
 *   - few channels (C < 4 x SMs): each channel is cut into P chunks over
 *     gridDim.y; a first kernel writes per-chunk partials to the worker's
 *     workspace (forward: count, chunk mean and M2 by two passes over the
 *     chunk; backward: sum(dy), sum(dy * (x - mean))), a second one merges the
 *     P partials of its channel in order (Chan's formula for the variance;
 *     every block merges them alike, so the result does not depend on which
 *     block) and writes its chunk of y / dx; chunk 0 writes the per-channel
 *     outputs.
 *
 * Layer norm: x is [M, N] rows, contiguous.
 *   - forward and dx: one warp per row (rows of up to 1024 values, 4 rows a
 *     block) or one block per row (longer rows: 256 threads, 512 beyond 8192
 *     values); two passes over the row for the mean and the variance, the
 *     row sums by xor shuffles (every lane gets the same bits) and, for
 *     block rows, the warps' sums added in warp order;
 *   - dweight / dbias: a column reduction. Blocks of 32 columns x 16 rows
 *     (coalesced row reads) cover the columns over gridDim.x and P chunks of
 *     rows over gridDim.y (P sized to give about 4 blocks per SM, within the
 *     workspace and the grid's y limit); each block sums its chunk in
 *     double, then its 16 row lanes in order, and writes the chunk's partial
 *     sums to the worker's workspace; a second kernel adds the P partials of
 *     each column in chunk order. P = 1 (no workspace, or one chunk
 *     suffices) writes dweight / dbias directly. No atomics: the result
 *     depends only on M, N, the SM count and the workspace size.
 * Everything is queued on the worker's stream; nothing waits. */
#include "devices/cuda/emcuda.h"

#include <math.h>

using namespace emc;

namespace {

constexpr int kBnThreads = 512; /* a multiple of 32 */

/* Block-wide sum of v; every thread gets it. sh: 32 doubles of shared memory. */
__device__ double block_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    const double r = sh[0];
    __syncthreads(); /* sh is reused by the next call */
    return r;
}

/* Runs BODY(o) for the element offsets o of channel c, this thread's share:
 * a row per batch index when rows are long, else one flat walk over N * L. */
#define BN_FOR_EACH(o, BODY)                                                                   \
    if (L >= (int64_t)blockDim.x) {                                                            \
        for (int64_t n_ = 0; n_ < N; n_++) {                                                   \
            const int64_t row_ = (n_ * C + c) * L;                                             \
            for (int64_t i_ = threadIdx.x; i_ < L; i_ += blockDim.x) {                         \
                const int64_t o = row_ + i_;                                                   \
                BODY;                                                                          \
            }                                                                                  \
        }                                                                                      \
    } else {                                                                                   \
        for (int64_t j_ = threadIdx.x; j_ < M; j_ += blockDim.x) {                             \
            const int64_t n_ = j_ / L;                                                         \
            const int64_t o = (n_ * C + c) * L + (j_ - n_ * L);                                \
            BODY;                                                                              \
        }                                                                                      \
    }

template <typename T>
__global__ void k_bn_fwd(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b, T *__restrict__ y,
                         T *__restrict__ st, int64_t N, int64_t C, int64_t L, double eps)
{
    __shared__ double sh[32];
    const int64_t c = blockIdx.x, M = N * L;
    double s = 0;
    BN_FOR_EACH(o, s += (double)x[o])
    const double mean = M > 0 ? block_sum(s, sh) / (double)M : 0.0;
    double q = 0;
    BN_FOR_EACH(o, { const double d = (double)x[o] - mean; q += d * d; })
    const double var = M > 0 ? block_sum(q, sh) / (double)M : 0.0;
    const double scale = (double)w[c] / sqrt(var + eps), shift = (double)b[c];
    BN_FOR_EACH(o, y[o] = (T)(((double)x[o] - mean) * scale + shift))
    if (threadIdx.x == 0) {
        st[c] = (T)mean;
        st[C + c] = (T)var;
    }
}

template <typename T>
__global__ void k_bn_bwd(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ st,
                         const T *__restrict__ w, T *__restrict__ dx, T *__restrict__ dw, T *__restrict__ db, int64_t N,
                         int64_t C, int64_t L, double eps)
{
    __shared__ double sh[32];
    const int64_t c = blockIdx.x, M = N * L;
    const double mean = (double)st[c], invstd = 1.0 / sqrt((double)st[C + c] + eps);
    double sdy = 0, sdyx = 0;
    BN_FOR_EACH(o, {
        const double g = (double)dy[o];
        sdy += g;
        sdyx += g * ((double)x[o] - mean);
    })
    sdy = block_sum(sdy, sh);
    sdyx = block_sum(sdyx, sh) * invstd; /* sum(dy * xhat) */
    const double a = (double)w[c] * invstd, mdy = M > 0 ? sdy / (double)M : 0.0, mdyx = M > 0 ? sdyx / (double)M : 0.0;
    BN_FOR_EACH(o, {
        const double xh = ((double)x[o] - mean) * invstd;
        dx[o] = (T)(a * ((double)dy[o] - mdy - xh * mdyx));
    })
    if (threadIdx.x == 0) {
        dw[c] = (T)sdyx;
        db[c] = (T)sdy;
    }
}

/* Runs BODY(o) for the element offsets o of channel c with j in [j0, j1),
 * this thread's share (stride blockDim.x; n, i stepped without divisions). */
#define BN_CHUNK_FOR(o, j0, j1, BODY)                                                          \
    {                                                                                          \
        const int64_t q_ = (int64_t)blockDim.x / L, r_ = (int64_t)blockDim.x % L;              \
        int64_t j_ = (j0) + threadIdx.x;                                                       \
        int64_t n_ = j_ / L, i_ = j_ - n_ * L;                                                 \
        for (; j_ < (j1); j_ += blockDim.x) {                                                  \
            const int64_t o = (n_ * C + c) * L + i_;                                           \
            BODY;                                                                              \
            n_ += q_;                                                                          \
            i_ += r_;                                                                          \
            if (i_ >= L) {                                                                     \
                i_ -= L;                                                                       \
                n_++;                                                                          \
            }                                                                                  \
        }                                                                                      \
    }

/* Chunk [j0, j1) of block (c = blockIdx.x, p = blockIdx.y). */
#define BN_CHUNK                                                                               \
    const int64_t c = blockIdx.x, p = blockIdx.y, P = gridDim.y, M = N * L;                    \
    const int64_t j0 = p * chunk, j1 = j0 + chunk < M ? j0 + chunk : M;                         \
    (void)P;

/* Split forward, pass 1: ws[3 * (c * P + p)] = (count, mean, M2) of the chunk. */
template <typename T>
__global__ void k_bn_fwd_part(const T *__restrict__ x, double *__restrict__ ws, int64_t N, int64_t C, int64_t L,
                              int64_t chunk)
{
    __shared__ double sh[32];
    BN_CHUNK
    const double cnt = j1 > j0 ? (double)(j1 - j0) : 0.0;
    double s = 0;
    BN_CHUNK_FOR(o, j0, j1, s += (double)x[o])
    s = block_sum(s, sh);
    const double m = cnt > 0 ? s / cnt : 0.0;
    double q = 0;
    BN_CHUNK_FOR(o, j0, j1, { const double d = (double)x[o] - m; q += d * d; })
    q = block_sum(q, sh);
    if (threadIdx.x == 0) {
        double *e = ws + 3 * (c * P + p);
        e[0] = cnt;
        e[1] = m;
        e[2] = q;
    }
}

/* Split forward, pass 2: merge the channel's partials, normalise the chunk. */
template <typename T>
__global__ void k_bn_fwd_apply(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b, T *__restrict__ y,
                               T *__restrict__ st, const double *__restrict__ ws, int64_t N, int64_t C, int64_t L,
                               int64_t chunk, double eps)
{
    BN_CHUNK
    double n = 0, mean = 0, m2 = 0;
    for (int64_t k = 0; k < P; k++) {
        const double *e = ws + 3 * (c * P + k);
        const double nb = e[0];
        if (nb <= 0) continue;
        const double nn = n + nb, delta = e[1] - mean;
        mean += delta * (nb / nn);
        m2 += e[2] + delta * delta * (n * nb / nn);
        n = nn;
    }
    const double var = n > 0 ? m2 / n : 0.0;
    const double scale = (double)w[c] / sqrt(var + eps), shift = (double)b[c];
    BN_CHUNK_FOR(o, j0, j1, y[o] = (T)(((double)x[o] - mean) * scale + shift))
    if (p == 0 && threadIdx.x == 0) {
        st[c] = (T)mean;
        st[C + c] = (T)var;
    }
}

/* Split backward, pass 1: ws[2 * (c * P + p)] = (sum(dy), sum(dy * (x - mean))) of the chunk. */
template <typename T>
__global__ void k_bn_bwd_part(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ st,
                              double *__restrict__ ws, int64_t N, int64_t C, int64_t L, int64_t chunk)
{
    __shared__ double sh[32];
    BN_CHUNK
    const double mean = (double)st[c];
    double sdy = 0, sdyx = 0;
    BN_CHUNK_FOR(o, j0, j1, {
        const double g = (double)dy[o];
        sdy += g;
        sdyx += g * ((double)x[o] - mean);
    })
    sdy = block_sum(sdy, sh);
    sdyx = block_sum(sdyx, sh);
    if (threadIdx.x == 0) {
        double *e = ws + 2 * (c * P + p);
        e[0] = sdy;
        e[1] = sdyx;
    }
}

/* Split backward, pass 2: sum the channel's partials in order, write the chunk of dx. */
template <typename T>
__global__ void k_bn_bwd_apply(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ st,
                               const T *__restrict__ w, T *__restrict__ dx, T *__restrict__ dw, T *__restrict__ db,
                               const double *__restrict__ ws, int64_t N, int64_t C, int64_t L, int64_t chunk, double eps)
{
    BN_CHUNK
    const double mean = (double)st[c], invstd = 1.0 / sqrt((double)st[C + c] + eps);
    double sdy = 0, sdyx = 0;
    for (int64_t k = 0; k < P; k++) {
        sdy += ws[2 * (c * P + k)];
        sdyx += ws[2 * (c * P + k) + 1];
    }
    sdyx *= invstd; /* sum(dy * xhat) */
    const double a = (double)w[c] * invstd, mdy = M > 0 ? sdy / (double)M : 0.0, mdyx = M > 0 ? sdyx / (double)M : 0.0;
    BN_CHUNK_FOR(o, j0, j1, {
        const double xh = ((double)x[o] - mean) * invstd;
        dx[o] = (T)(a * ((double)dy[o] - mdy - xh * mdyx));
    })
    if (p == 0 && threadIdx.x == 0) {
        dw[c] = (T)sdyx;
        db[c] = (T)sdy;
    }
}

/* BATCH_NORM_RUNNING, one thread per channel: the composed update's
 * roundings (the _rn intrinsics keep nvcc from contracting into FMAs). */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

template <typename T>
__global__ void k_bn_running(const T *__restrict__ st, T *__restrict__ rm, T *__restrict__ rv, int64_t C, T m, T keep, T u)
{
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        rm[c] = add_rn(mul_rn(rm[c], keep), mul_rn(st[c], m));
        rv[c] = add_rn(mul_rn(rv[c], keep), mul_rn(mul_rn(st[C + c], u), m));
    }
}

template <typename T> void launch_running(void *buffers[], const em_kargs *k, int64_t C)
{
    k_bn_running<T><<<grid_for(C), kThreads, 0, stream()>>>(
        (const T *)base(buffers, 0, k->in[0]), (T *)base(buffers, 1, k->out[0]), (T *)base(buffers, 2, k->out[1]), C,
        (T)k->p.bn.momentum, (T)(1.0 - k->p.bn.momentum), (T)k->p.bn.unbias);
}

/* Chunks per channel (1: one block per channel) and their length. */
static int64_t bn_splits(bool fwd, int64_t C, int64_t M, double **ws, int64_t *chunk)
{
    size_t ws_bytes = 0;
    *ws = (double *)workspace(&ws_bytes);
    const int64_t target = 4LL * sm_count(), per = fwd ? 3 : 2;
    int64_t P = 1;
    if (*ws && C < target) {
        P = (target + C - 1) / C;
        const int64_t cap = M / 4096; /* at least 4096 values per chunk */
        const int64_t wcap = (int64_t)(ws_bytes / (sizeof(double) * (size_t)per)) / C;
        if (P > cap) P = cap;
        if (P > wcap) P = wcap;
        if (P > 1024) P = 1024;
        if (P < 1) P = 1;
    }
    *chunk = (M + P - 1) / P;
    if (*chunk < 1) *chunk = 1;
    return P > 1 ? (M + *chunk - 1) / *chunk : 1; /* no empty chunk */
}

template <typename T> void launch(void *buffers[], const em_kargs *k, bool fwd, int64_t N, int64_t C, int64_t L)
{
    const double eps = k->p.bn.eps;
    double *ws = nullptr;
    int64_t chunk = 0;
    const int64_t P = bn_splits(fwd, C, N * L, &ws, &chunk);
    if (P > 1) {
        const dim3 grid((unsigned)C, (unsigned)P);
        if (fwd) {
            const T *x = (const T *)base(buffers, 0, k->in[0]);
            k_bn_fwd_part<T><<<grid, kBnThreads, 0, stream()>>>(x, ws, N, C, L, chunk);
            check_launch("batch_norm (partial statistics)");
            k_bn_fwd_apply<T><<<grid, kBnThreads, 0, stream()>>>(
                x, (const T *)base(buffers, 1, k->in[1]), (const T *)base(buffers, 2, k->in[2]), (T *)base(buffers, 3, k->out[0]),
                (T *)base(buffers, 4, k->out[1]), ws, N, C, L, chunk, eps);
        } else {
            const T *dy = (const T *)base(buffers, 0, k->in[0]), *x = (const T *)base(buffers, 1, k->in[1]);
            const T *st = (const T *)base(buffers, 2, k->in[2]);
            k_bn_bwd_part<T><<<grid, kBnThreads, 0, stream()>>>(dy, x, st, ws, N, C, L, chunk);
            check_launch("batch_norm_bwd (partial sums)");
            k_bn_bwd_apply<T><<<grid, kBnThreads, 0, stream()>>>(
                dy, x, st, (const T *)base(buffers, 3, k->in[3]), (T *)base(buffers, 4, k->out[0]), (T *)base(buffers, 5, k->out[1]),
                (T *)base(buffers, 6, k->out[2]), ws, N, C, L, chunk, eps);
        }
        return;
    }
    if (fwd) {
        k_bn_fwd<T><<<(unsigned)C, kBnThreads, 0, stream()>>>(
            (const T *)base(buffers, 0, k->in[0]), (const T *)base(buffers, 1, k->in[1]), (const T *)base(buffers, 2, k->in[2]),
            (T *)base(buffers, 3, k->out[0]), (T *)base(buffers, 4, k->out[1]), N, C, L, eps);
    } else {
        k_bn_bwd<T><<<(unsigned)C, kBnThreads, 0, stream()>>>(
            (const T *)base(buffers, 0, k->in[0]), (const T *)base(buffers, 1, k->in[1]), (const T *)base(buffers, 2, k->in[2]),
            (const T *)base(buffers, 3, k->in[3]), (T *)base(buffers, 4, k->out[0]), (T *)base(buffers, 5, k->out[1]),
            (T *)base(buffers, 6, k->out[2]), N, C, L, eps);
    }
}

/* ---- layer norm ---------------------------------------------------------- */

constexpr int kLnWarpMaxN = 1024;   /* rows up to this long: one warp per row */
constexpr int kLnWarpRows = 4;      /* rows (warps) per block then */
constexpr int kLnColTile = 32;      /* dweight / dbias: columns per block (threadIdx.x) */
constexpr int kLnColRows = 16;      /* rows in flight per block (threadIdx.y) */
constexpr int64_t kLnMinChunk = 64; /* rows per chunk of the column reduction, at least */

/* Sum of v over the blockDim.x threads of one row. Every thread of the row
 * gets the same bits (a xor butterfly adds the same pairs in every lane).
 * Rows wider than a warp (blockDim.y == 1, the launcher's invariant) add the
 * warps' sums in warp order through sh (32 doubles); those calls must be
 * reached by the whole block. */
__device__ double ln_row_sum(double v, double *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (blockDim.x == 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nwarps; i++) t += sh[i];
    __syncthreads(); /* sh is reused by the next call */
    return t;
}

/* Row r = blockIdx.x * blockDim.y + threadIdx.y; a row past M leaves with its
 * whole warp (warp rows) or its whole block (block rows), before any sync. */
template <typename T>
__global__ void k_ln_fwd(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b, T *__restrict__ y,
                         T *__restrict__ st, int64_t M, int64_t N, double eps)
{
    __shared__ double sh[32];
    const int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= M) return;
    const T *xr = x + r * N;
    T *yr = y + r * N;
    double s = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) s += (double)xr[j];
    s = ln_row_sum(s, sh);
    const double mean = N > 0 ? s / (double)N : 0.0;
    double q = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const double d = (double)xr[j] - mean;
        q += d * d;
    }
    q = ln_row_sum(q, sh);
    const double var = N > 0 ? q / (double)N : 0.0, rstd = 1.0 / sqrt(var + eps);
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) yr[j] = (T)(((double)xr[j] - mean) * rstd * (double)w[j] + (double)b[j]);
    if (threadIdx.x == 0) {
        st[r] = (T)mean;
        st[M + r] = (T)rstd;
    }
}

/* dx of row r (the rows as in k_ln_fwd). */
template <typename T>
__global__ void k_ln_bwd_dx(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ st,
                            const T *__restrict__ w, T *__restrict__ dx, int64_t M, int64_t N)
{
    __shared__ double sh[32];
    const int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= M) return;
    const T *xr = x + r * N, *gr = dy + r * N;
    T *dr = dx + r * N;
    const double mean = (double)st[r], rstd = (double)st[M + r];
    double sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const double g = (double)gr[j] * (double)w[j];
        sg += g;
        sgx += g * (((double)xr[j] - mean) * rstd);
    }
    sg = ln_row_sum(sg, sh);
    sgx = ln_row_sum(sgx, sh);
    const double mg = N > 0 ? sg / (double)N : 0.0, mgx = N > 0 ? sgx / (double)N : 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const double xh = ((double)xr[j] - mean) * rstd;
        dr[j] = (T)(rstd * ((double)gr[j] * (double)w[j] - mg - xh * mgx));
    }
}

/* dweight / dbias, pass 1: block (tile, p) sums columns j = tile * 32 +
 * threadIdx.x over rows [p * chunk, min((p + 1) * chunk, M)), each row lane
 * threadIdx.y taking every 16th row, then the 16 lanes in order. P = 1:
 * the sums are the outputs; else partials pw / pb [P, N] in the workspace. */
template <typename T>
__global__ void k_ln_bwd_wb_part(const T *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ st,
                                 double *__restrict__ pw, double *__restrict__ pb, T *__restrict__ dw, T *__restrict__ db,
                                 int64_t M, int64_t N, int64_t chunk)
{
    __shared__ double sw[kLnColRows][kLnColTile + 1], sb[kLnColRows][kLnColTile + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t j = (int64_t)blockIdx.x * kLnColTile + tx, p = blockIdx.y, P = gridDim.y;
    const int64_t r0 = p * chunk, r1 = r0 + chunk < M ? r0 + chunk : M;
    double aw = 0, ab = 0;
    if (j < N) {
        for (int64_t r = r0 + ty; r < r1; r += kLnColRows) {
            const double g = (double)dy[r * N + j];
            aw += g * (((double)x[r * N + j] - (double)st[r]) * (double)st[M + r]);
            ab += g;
        }
    }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && j < N) {
        double tw = 0, tb = 0;
        for (int i = 0; i < kLnColRows; i++) {
            tw += sw[i][tx];
            tb += sb[i][tx];
        }
        if (P == 1) {
            dw[j] = (T)tw;
            db[j] = (T)tb;
        } else {
            pw[p * N + j] = tw;
            pb[p * N + j] = tb;
        }
    }
}

/* dweight / dbias, pass 2: each column's P partials added in chunk order. */
template <typename T>
__global__ void k_ln_bwd_wb_final(const double *__restrict__ pw, const double *__restrict__ pb, T *__restrict__ dw,
                                  T *__restrict__ db, int64_t N, int64_t P)
{
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < N; j += (int64_t)gridDim.x * blockDim.x) {
        double tw = 0, tb = 0;
        for (int64_t p = 0; p < P; p++) {
            tw += pw[p * N + j];
            tb += pb[p * N + j];
        }
        dw[j] = (T)tw;
        db[j] = (T)tb;
    }
}

/* Block shape of the row kernels: a warp per row (kLnWarpRows rows a block)
 * for rows of up to kLnWarpMaxN values, else one block per row (blockDim.y
 * = 1, what ln_row_sum's shared sums need). Blocks: *blocks. */
static dim3 ln_row_block(int64_t M, int64_t N, int64_t *blocks)
{
    if (N <= kLnWarpMaxN) {
        *blocks = (M + kLnWarpRows - 1) / kLnWarpRows;
        return dim3(32, kLnWarpRows);
    }
    *blocks = M;
    return dim3(N <= 8192 ? 256 : 512, 1);
}

/* Row chunks of the dweight / dbias reduction (1: no partials) and their
 * length: about 4 blocks per SM over the column tiles, chunks of at least
 * kLnMinChunk rows, P * N partial pairs within the workspace, P <= 65535
 * (gridDim.y). */
static int64_t ln_col_splits(int64_t M, int64_t N, double **ws, int64_t *chunk)
{
    size_t ws_bytes = 0;
    *ws = (double *)workspace(&ws_bytes);
    const int64_t tiles = (N + kLnColTile - 1) / kLnColTile, target = 4LL * sm_count();
    int64_t P = 1;
    if (*ws && tiles < target && N > 0) {
        P = (target + tiles - 1) / tiles;
        const int64_t cap = M / kLnMinChunk;
        const int64_t wcap = (int64_t)(ws_bytes / (2 * sizeof(double) * (size_t)N));
        if (P > cap) P = cap;
        if (P > wcap) P = wcap;
        if (P > 65535) P = 65535;
        if (P < 1) P = 1;
    }
    *chunk = P > 1 ? (M + P - 1) / P : M;
    return P > 1 ? (M + *chunk - 1) / *chunk : 1; /* no empty chunk */
}

template <typename T> void launch_ln(void *buffers[], const em_kargs *k, bool fwd, int64_t M, int64_t N)
{
    int64_t blocks = 0;
    const dim3 rb = ln_row_block(M, N, &blocks);
    if (fwd) {
        if (M == 0) return; /* no row: y and stats are empty */
        k_ln_fwd<T><<<(unsigned)blocks, rb, 0, stream()>>>(
            (const T *)base(buffers, 0, k->in[0]), (const T *)base(buffers, 1, k->in[1]), (const T *)base(buffers, 2, k->in[2]),
            (T *)base(buffers, 3, k->out[0]), (T *)base(buffers, 4, k->out[1]), M, N, k->p.bn.eps);
        check_launch("layer_norm");
        return;
    }
    const T *dy = (const T *)base(buffers, 0, k->in[0]), *x = (const T *)base(buffers, 1, k->in[1]);
    const T *st = (const T *)base(buffers, 2, k->in[2]), *w = (const T *)base(buffers, 3, k->in[3]);
    T *dx = (T *)base(buffers, 4, k->out[0]), *dw = (T *)base(buffers, 5, k->out[1]), *db = (T *)base(buffers, 6, k->out[2]);
    if (N == 0) return; /* dx, dweight, dbias are empty */
    if (M > 0) {
        k_ln_bwd_dx<T><<<(unsigned)blocks, rb, 0, stream()>>>(dy, x, st, w, dx, M, N);
        check_launch("layer_norm_bwd (dx)");
    }
    double *ws = nullptr;
    int64_t chunk = 0;
    const int64_t P = ln_col_splits(M, N, &ws, &chunk);
    const dim3 grid((unsigned)((N + kLnColTile - 1) / kLnColTile), (unsigned)P);
    double *pw = P > 1 ? ws : nullptr, *pb = P > 1 ? ws + P * N : nullptr;
    k_ln_bwd_wb_part<T><<<grid, dim3(kLnColTile, kLnColRows), 0, stream()>>>(dy, x, st, pw, pb, dw, db, M, N, chunk);
    check_launch("layer_norm_bwd (dweight, dbias partial sums)");
    if (P > 1) {
        k_ln_bwd_wb_final<T><<<grid_for(N), kThreads, 0, stream()>>>(pw, pb, dw, db, N, P);
        check_launch("layer_norm_bwd (dweight, dbias)");
    }
}

/* LAYER_NORM / LAYER_NORM_BWD: M from stats' dim 1, N from weight's element
 * count, checked against every operand (tasks/norm.c's contract). */
void ln_run(void *buffers[], const em_kargs *k)
{
    const bool fwd = k->kind == EM_OP_LAYER_NORM;
    const em_tdesc &x = fwd ? k->in[0] : k->in[1], &w = fwd ? k->in[1] : k->in[3];
    const em_tdesc &st = fwd ? k->out[1] : k->in[2];
    const int dt = x.dtype;
    bool ok = is_fp_dtype(dt) && k->n_in == (fwd ? 3 : 4) && k->n_out == (fwd ? 2 : 3) && st.ndim == 2 && st.shape[0] == 2;
    for (int i = 0; ok && i < k->n_in; i++) ok = k->in[i].dtype == dt;
    for (int i = 0; ok && i < k->n_out; i++) ok = k->out[i].dtype == dt;
    const int64_t M = ok ? st.shape[1] : 0, N = ok ? numel(w) : 0;
    if (ok) {
        ok = numel(x) == M * N && numel(k->out[0]) == M * N;
        if (fwd)
            ok = ok && numel(k->in[2]) == N;
        else
            ok = ok && numel(k->in[0]) == M * N && numel(k->out[1]) == N && numel(k->out[2]) == N;
    }
    if (!ok) {
        unsupported("norm (layer_norm) operands", dt);
        return;
    }
    int64_t blocks = 0;
    ln_row_block(M, N, &blocks);
    if (blocks > 0x7fffffff || (N + kLnColTile - 1) / kLnColTile > 0x7fffffff) {
        unsupported("norm (layer_norm): rows or columns beyond the grid", k->kind);
        return;
    }
    if (dt == EM_F32)
        launch_ln<float>(buffers, k, fwd, M, N);
    else
        launch_ln<double>(buffers, k, fwd, M, N);
}

} // namespace

void em_cuda_norm(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    if (k->kind == EM_OP_LAYER_NORM || k->kind == EM_OP_LAYER_NORM_BWD) {
        ln_run(buffers, k);
        return;
    }
    if (k->kind == EM_OP_BATCH_NORM_RUNNING) {
        const int dt = k->in[0].dtype;
        const int64_t C = k->out[0].ndim == 1 ? k->out[0].shape[0] : -1;
        if (!is_fp_dtype(dt) || k->n_in != 1 || k->n_out != 2 || k->out[0].dtype != dt || k->out[1].dtype != dt || C < 0 ||
            numel(k->out[1]) != C || numel(k->in[0]) != 2 * C) {
            unsupported("norm (batch_norm_running) operands", dt);
            return;
        }
        if (C == 0) return;
        if (dt == EM_F32)
            launch_running<float>(buffers, k, C);
        else
            launch_running<double>(buffers, k, C);
        check_launch("batch_norm_running");
        return;
    }
    const bool fwd = k->kind == EM_OP_BATCH_NORM;
    if (!fwd && k->kind != EM_OP_BATCH_NORM_BWD) {
        unsupported("norm", k->kind);
        return;
    }
    const em_tdesc &x = fwd ? k->in[0] : k->in[1];
    const int dt = x.dtype;
    bool ok = is_fp_dtype(dt) && k->n_in == (fwd ? 3 : 4) && k->n_out == (fwd ? 2 : 3) && x.ndim >= 2;
    for (int i = 0; ok && i < k->n_in; i++) ok = k->in[i].dtype == dt;
    for (int i = 0; ok && i < k->n_out; i++) ok = k->out[i].dtype == dt;
    if (!ok) {
        unsupported("norm operands", dt);
        return;
    }
    const int64_t N = x.shape[0], C = x.shape[1];
    if (C == 0) return; /* no channel: nothing to write */
    const int64_t L = N > 0 ? numel(x) / (N * C) : 0;
    if (L == 0) { /* no values per channel: the front end refuses it when training */
        unsupported("norm: empty channels", k->kind);
        return;
    }
    if (C > 0x7fffffff) {
        unsupported("norm: channels beyond the grid", k->kind);
        return;
    }
    if (dt == EM_F32)
        launch<float>(buffers, k, fwd, N, C, L);
    else
        launch<double>(buffers, k, fwd, N, C, L);
    check_launch(fwd ? "batch_norm" : "batch_norm_bwd");
}
