/* CUDA kernels of the norm family: fused training-mode batch norm forward and
 * backward, and its running-statistics update (contracts at the top of tasks/norm.c; CPU reference
 * devices/cpu/norm.c). x is seen as [N, C, L], contiguous; a channel's
 * M = N * L values are j = n * L + i. Sums are reduced in double (warp
 * shuffles, then shared memory).
 *
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

} // namespace

void em_cuda_norm(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
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
