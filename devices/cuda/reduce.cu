/* CUDA kernels: reductions (SUM PROD MAX MIN ARGMAX ARGMIN ANY ALL LOGSUMEXP
 * VAR) and SOFTMAX / LOG_SOFTMAX.
 *
 * Reductions, contract of devices/cpu/reduce.c: in[0] is a strided view whose
 * first p.red.nkeep dims are kept and the remaining dims reduced; out[0] is
 * contiguous over the kept dims (nout = product of kept sizes, nred = product
 * of reduced sizes). Input dtypes f32, f64, i32, i64, u8, bool; output dtype
 * as the front end chose (sum/prod of ints: i64; arg*: i64; any/all: bool;
 * logsumexp/var: the float input dtype). Float inputs accumulate in double,
 * integer sums/products in wrapping int64. Semantics reproduced exactly:
 *   max/min/argmax/argmin: the first NaN wins (value NaN, its position);
 *     otherwise the extreme value, the first position on ties;
 *   logsumexp: NaN if any NaN, +inf if any +inf, -inf if all are -inf (or
 *     nred == 0), else m + log(sum exp(x - m));
 *   var: sum((x - mean)^2) / (nred - correction), +inf / NaN for a
 *     non-positive denominator as on the CPU (computed here with Welford /
 *     Chan updates, equal to the CPU's two-pass result up to rounding).
 *
 * Parallel layout: the kept dims and the reduced dims are each coalesced.
 *   - row mode (reduced elements unit-stride): a group of 32 threads (a warp;
 *     nred <= 1024) or 256 threads (a block) per output row;
 *   - column mode (the innermost kept dim is unit-stride and the reduced
 *     dims are not, e.g. summing a [B, N] matrix over B; or nred <= 16): a
 *     block of 32 x 8 threads covers 32 consecutive outputs, coalesced;
 *   - when there are too few outputs to fill the GPU, each row is split into
 *     chunks over gridDim.y, partial states go to the worker's workspace and
 *     a second kernel combines them in order.
 *
 * Softmax, contract of devices/cpu/reduce.c: in[0], out[0] of one shape (f32
 * or f64, both strided), along p.axis.dim: m = max (NaN propagates; -inf ->
 * 0), s = sum in double of exp(x - m) evaluated in the tensor dtype, then
 * y = exp(x - m) * (T)(1/s) or, for log_softmax, y = x - m - (T)log(s).
 * One warp per row (row length <= 1024) or one 256-thread block per row. */
#include "devices/cuda/emcuda.h"

#include <type_traits>

using namespace emc;

namespace {

constexpr long long kEmpty = 0x7fffffffffffffffLL;

template <typename T> __host__ __device__ constexpr bool is_fp() { return std::is_same<T, float>::value || std::is_same<T, double>::value; }

/* Reduction state (fields used depend on the kind):
 *   SUM/PROD  d0 (float) or i0 (int, wrapping)
 *   MAX..ARGMIN  d0 (float value) or i1 (int value), i0 = position (kEmpty)
 *   ANY/ALL   i0 flag
 *   LOGSUMEXP d0 = running max (NaN ignored), d1 = scaled sum, i0 = saw NaN
 *   VAR       d0 = count, d1 = mean, d2 = M2 */
struct State {
    double d0, d1, d2;
    long long i0, i1;
};

__device__ __forceinline__ State shfl_down(const State &s, int delta)
{
    State r;
    r.d0 = __shfl_down_sync(0xffffffffu, s.d0, delta);
    r.d1 = __shfl_down_sync(0xffffffffu, s.d1, delta);
    r.d2 = __shfl_down_sync(0xffffffffu, s.d2, delta);
    r.i0 = __shfl_down_sync(0xffffffffu, s.i0, delta);
    r.i1 = __shfl_down_sync(0xffffffffu, s.i1, delta);
    return r;
}

template <typename T> struct Red {
    int kind;

    __device__ __forceinline__ State init() const
    {
        State s{0, 0, 0, 0, 0};
        switch (kind) {
        case EM_OP_PROD: s.d0 = 1; s.i0 = 1; break;
        case EM_OP_MAX: case EM_OP_MIN: case EM_OP_ARGMAX: case EM_OP_ARGMIN: s.i0 = kEmpty; break;
        case EM_OP_ALL: s.i0 = 1; break;
        case EM_OP_LOGSUMEXP: s.d0 = -INFINITY; break;
        default: break;
        }
        return s;
    }

    __device__ __forceinline__ void add(State &s, T x, long long pos) const
    {
        switch (kind) {
        case EM_OP_SUM:
            if constexpr (is_fp<T>()) s.d0 += (double)x;
            else s.i0 = (long long)((unsigned long long)s.i0 + (unsigned long long)(long long)x);
            break;
        case EM_OP_PROD:
            if constexpr (is_fp<T>()) s.d0 *= (double)x;
            else s.i0 = (long long)((unsigned long long)s.i0 * (unsigned long long)(long long)x);
            break;
        case EM_OP_MAX: case EM_OP_MIN: case EM_OP_ARGMAX: case EM_OP_ARGMIN: {
            State c;
            c.i0 = pos;
            if constexpr (is_fp<T>()) c.d0 = (double)x;
            else c.i1 = (long long)x;
            merge(s, c);
            break;
        }
        case EM_OP_ANY: s.i0 |= (x != 0); break;
        case EM_OP_ALL: s.i0 &= (x != 0); break;
        case EM_OP_LOGSUMEXP: {
            const double v = (double)x;
            if (v != v) { s.i0 = 1; break; }
            if (v == -INFINITY) break;
            if (v == INFINITY) { s.d0 = INFINITY; break; }
            if (s.d0 == INFINITY) break;
            if (v > s.d0) {
                s.d1 = s.d0 == -INFINITY ? 0.0 : s.d1 * exp(s.d0 - v);
                s.d0 = v;
            }
            s.d1 += exp(v - s.d0);
            break;
        }
        case EM_OP_VAR: {
            const double v = (double)x;
            s.d0 += 1;
            const double d = v - s.d1;
            s.d1 += d / s.d0;
            s.d2 += d * (v - s.d1);
            break;
        }
        default: break;
        }
    }

    /* s <- s (+) o; position-aware where positions matter. */
    __device__ __forceinline__ void merge(State &s, const State &o) const
    {
        switch (kind) {
        case EM_OP_SUM:
            if constexpr (is_fp<T>()) s.d0 += o.d0;
            else s.i0 = (long long)((unsigned long long)s.i0 + (unsigned long long)o.i0);
            break;
        case EM_OP_PROD:
            if constexpr (is_fp<T>()) s.d0 *= o.d0;
            else s.i0 = (long long)((unsigned long long)s.i0 * (unsigned long long)o.i0);
            break;
        case EM_OP_MAX: case EM_OP_MIN: case EM_OP_ARGMAX: case EM_OP_ARGMIN: {
            if (o.i0 == kEmpty) break;
            if (s.i0 == kEmpty) { s = o; break; }
            const bool want_max = kind == EM_OP_MAX || kind == EM_OP_ARGMAX;
            bool take;
            if constexpr (is_fp<T>()) {
                const bool an = s.d0 != s.d0, bn = o.d0 != o.d0;
                if (an || bn) take = (an && bn) ? o.i0 < s.i0 : bn;
                else take = (want_max ? o.d0 > s.d0 : o.d0 < s.d0) || (o.d0 == s.d0 && o.i0 < s.i0);
            } else {
                take = (want_max ? o.i1 > s.i1 : o.i1 < s.i1) || (o.i1 == s.i1 && o.i0 < s.i0);
            }
            if (take) s = o;
            break;
        }
        case EM_OP_ANY: s.i0 |= o.i0; break;
        case EM_OP_ALL: s.i0 &= o.i0; break;
        case EM_OP_LOGSUMEXP:
            s.i0 |= o.i0;
            if (o.d0 == -INFINITY) break;
            if (s.d0 == -INFINITY) { s.d0 = o.d0; s.d1 = o.d1; break; }
            if (s.d0 == INFINITY || o.d0 == INFINITY) { s.d0 = INFINITY; break; }
            {
                const double m = s.d0 > o.d0 ? s.d0 : o.d0;
                s.d1 = s.d1 * exp(s.d0 - m) + o.d1 * exp(o.d0 - m);
                s.d0 = m;
            }
            break;
        case EM_OP_VAR:
            if (o.d0 == 0) break;
            if (s.d0 == 0) { s.d0 = o.d0; s.d1 = o.d1; s.d2 = o.d2; break; }
            {
                const double n = s.d0 + o.d0, delta = o.d1 - s.d1;
                s.d1 += delta * (o.d0 / n);
                s.d2 += o.d2 + delta * delta * (s.d0 * o.d0 / n);
                s.d0 = n;
            }
            break;
        default: break;
        }
    }
};

/* The CPU's st(): store v / iv into element i of an output of dtype odt. */
__device__ __forceinline__ void store_val(char *Y, int odt, long long i, double v, long long iv, bool use_i)
{
    switch (odt) {
    case EM_F32: ((float *)Y)[i] = (float)v; break;
    case EM_F64: ((double *)Y)[i] = v; break;
    case EM_I32: ((int32_t *)Y)[i] = use_i ? (int32_t)iv : (int32_t)v; break;
    case EM_I64: ((int64_t *)Y)[i] = use_i ? (int64_t)iv : (int64_t)v; break;
    case EM_U8: ((uint8_t *)Y)[i] = use_i ? (uint8_t)iv : (uint8_t)v; break;
    default: ((uint8_t *)Y)[i] = use_i ? iv != 0 : v != 0; break;
    }
}

struct OutInfo {
    char *Y;
    int odt;
    long long nred;
    double correction;
};

template <typename T> __device__ __forceinline__ void finalize(const Red<T> &r, const State &s, const OutInfo &oi, long long o)
{
    constexpr bool fp = is_fp<T>();
    switch (r.kind) {
    case EM_OP_SUM:
    case EM_OP_PROD: store_val(oi.Y, oi.odt, o, s.d0, s.i0, !fp); break;
    case EM_OP_MAX:
    case EM_OP_MIN:
        if (s.i0 == kEmpty) store_val(oi.Y, oi.odt, o, 0.0, 0, !fp);
        else store_val(oi.Y, oi.odt, o, s.d0, s.i1, !fp);
        break;
    case EM_OP_ARGMAX:
    case EM_OP_ARGMIN: ((int64_t *)oi.Y)[o] = s.i0 == kEmpty ? 0 : s.i0; break;
    case EM_OP_ANY:
    case EM_OP_ALL: ((uint8_t *)oi.Y)[o] = s.i0 != 0; break;
    case EM_OP_LOGSUMEXP: {
        double v;
        if (s.i0) v = NAN;
        else if (s.d0 == INFINITY || s.d0 == -INFINITY) v = s.d0;
        else v = s.d0 + log(s.d1);
        store_val(oi.Y, oi.odt, o, v, 0, false);
        break;
    }
    case EM_OP_VAR: {
        const double acc2 = s.d0 == 0 ? 0.0 : s.d2;
        const double denom = (double)oi.nred - oi.correction;
        const double v = denom > 0 ? acc2 / denom : (denom == 0 ? (acc2 > 0 ? INFINITY : NAN) : NAN);
        store_val(oi.Y, oi.odt, o, v, 0, false);
        break;
    }
    default: break;
    }
}

struct RedGeom {
    Geom keep; /* nout outputs */
    Geom red;  /* nred reduced elements */
};

/* Row mode: G threads (32 or 256) per output row; blockDim.x == 256. */
template <typename T, int G>
__global__ void __launch_bounds__(256) k_reduce_rows(RedGeom g, const T *__restrict__ X, Red<T> r, OutInfo oi, State *ws,
                                                     long long chunk)
{
    constexpr int kRows = 256 / G;
    __shared__ State sh[8];
    const long long nout = g.keep.n, nred = g.red.n;
    const int lane = threadIdx.x % G;
    const long long c = blockIdx.y, nsplit = gridDim.y;
    const long long j0 = c * chunk, j1 = j0 + chunk < nred ? j0 + chunk : nred;
    for (long long ob = (long long)blockIdx.x * kRows; ob < nout; ob += (long long)gridDim.x * kRows) {
        const long long o = ob + threadIdx.x / G;
        State s = r.init();
        if (o < nout) {
            long long ko[1];
            geom_offsets<1, long long>(g.keep, o, ko);
            const T *xr = X + ko[0];
            if (g.red.nd == 1) {
                const long long sr = g.red.st[0][0];
                for (long long j = j0 + lane; j < j1; j += G) r.add(s, xr[j * sr], j);
            } else {
                for (long long j = j0 + lane; j < j1; j += G) {
                    long long ro[1];
                    geom_offsets<1, long long>(g.red, j, ro);
                    r.add(s, xr[ro[0]], j);
                }
            }
        }
        /* reduce within the warp (all 32 lanes take part) */
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) {
            State t = shfl_down(s, d);
            r.merge(s, t);
        }
        if (G == 256) {
            const int w = threadIdx.x / 32;
            if ((threadIdx.x & 31) == 0) sh[w] = s;
            __syncthreads();
            if (threadIdx.x == 0)
                for (int i = 1; i < 8; i++) r.merge(s, sh[i]);
            __syncthreads();
        }
        if (lane == 0 && o < nout) {
            if (nsplit == 1) finalize(r, s, oi, o);
            else ws[o * nsplit + c] = s;
        }
    }
}

/* Column mode: block 32 x 8; threadIdx.x picks one of 32 consecutive
 * outputs, threadIdx.y strides over the reduced elements of chunk blockIdx.y. */
template <typename T>
__global__ void __launch_bounds__(256) k_reduce_cols(RedGeom g, const T *__restrict__ X, Red<T> r, OutInfo oi, State *ws,
                                                     long long chunk)
{
    __shared__ State sh[8][32];
    const long long nout = g.keep.n, nred = g.red.n;
    const long long c = blockIdx.y, nsplit = gridDim.y;
    const long long j0 = c * chunk, j1 = j0 + chunk < nred ? j0 + chunk : nred;
    for (long long ob = (long long)blockIdx.x * 32; ob < nout; ob += (long long)gridDim.x * 32) {
        const long long o = ob + threadIdx.x;
        State s = r.init();
        if (o < nout) {
            long long ko[1];
            geom_offsets<1, long long>(g.keep, o, ko);
            const T *xr = X + ko[0];
            for (long long j = j0 + threadIdx.y; j < j1; j += 8) {
                long long ro[1];
                geom_offsets<1, long long>(g.red, j, ro);
                r.add(s, xr[ro[0]], j);
            }
        }
        sh[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && o < nout) {
            for (int i = 1; i < 8; i++) r.merge(s, sh[i][threadIdx.x]);
            if (nsplit == 1) finalize(r, s, oi, o);
            else ws[o * nsplit + c] = s;
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void k_reduce_finish(long long nout, long long nsplit, const State *__restrict__ ws, Red<T> r, OutInfo oi)
{
    for (long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x; o < nout; o += (long long)gridDim.x * blockDim.x) {
        State s = ws[o * nsplit];
        for (long long c = 1; c < nsplit; c++) r.merge(s, ws[o * nsplit + c]);
        finalize(r, s, oi, o);
    }
}

template <typename T> void reduce_t(const em_kargs *k, void *buffers[])
{
    const em_tdesc &in = k->in[0], &out = k->out[0];
    const int nk = k->p.red.nkeep, nr = in.ndim - nk;
    RedGeom g;
    const int64_t *ks[1] = {in.strides};
    const int64_t *rs[1] = {in.strides + nk};
    g.keep = make_geom(nk, in.shape, 1, ks);
    g.red = make_geom(nr, in.shape + nk, 1, rs);
    const long long nout = g.keep.n, nred = g.red.n;
    if (nout <= 0) return;
    const T *X = (const T *)base(buffers, 0, in);
    OutInfo oi{base(buffers, 1, out), out.dtype, nred, k->p.red.correction};
    Red<T> r{k->kind};
    cudaStream_t s = stream();
    const int sms = sm_count();

    const bool keep_unit = nk > 0 && g.keep.shape[g.keep.nd - 1] > 1 && g.keep.st[0][g.keep.nd - 1] == 1;
    const bool red_unit = g.red.shape[g.red.nd - 1] <= 1 || g.red.st[0][g.red.nd - 1] == 1;
    const bool cols = nred <= 16 || (keep_unit && !red_unit);

    long long bx, per_split_min;
    if (cols) {
        bx = (nout + 31) / 32;
        per_split_min = 256;
    } else {
        const int G = nred <= 1024 ? 32 : 256;
        bx = (nout + (256 / G) - 1) / (256 / G);
        per_split_min = 4096;
    }
    long long nsplit = 1;
    size_t ws_bytes = 0;
    State *ws = (State *)workspace(&ws_bytes);
    if (ws && bx < 2LL * sms && nred >= 2 * per_split_min) {
        long long want = (4LL * sms + bx - 1) / bx;
        long long cap = nred / per_split_min;
        long long wcap = (long long)(ws_bytes / sizeof(State)) / nout;
        if (want > cap) want = cap;
        if (want > wcap) want = wcap;
        if (want > 65535) want = 65535;
        if (want > 1) nsplit = want;
    }
    long long chunk = nsplit > 1 ? (nred + nsplit - 1) / nsplit : (nred > 0 ? nred : 1);
    if (nsplit > 1) nsplit = (nred + chunk - 1) / chunk;
    const long long bx_cap = 65535LL * 16;
    dim3 grid((unsigned)(bx < bx_cap ? bx : bx_cap), (unsigned)nsplit);
    if (cols) {
        k_reduce_cols<T><<<grid, dim3(32, 8), 0, s>>>(g, X, r, oi, ws, chunk);
    } else if (nred <= 1024) {
        k_reduce_rows<T, 32><<<grid, 256, 0, s>>>(g, X, r, oi, ws, chunk);
    } else {
        k_reduce_rows<T, 256><<<grid, 256, 0, s>>>(g, X, r, oi, ws, chunk);
    }
    check_launch("reduce");
    if (nsplit > 1) {
        k_reduce_finish<T><<<grid_for(nout), kThreads, 0, s>>>(nout, nsplit, ws, r, oi);
        check_launch("reduce (finish)");
    }
}

/* ---- softmax ------------------------------------------------------------------ */

__device__ __forceinline__ float sm_exp(float x) { return expf(x); }
__device__ __forceinline__ double sm_exp(double x) { return exp(x); }

template <int G> __device__ __forceinline__ double group_sum(double v, double *sh)
{
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if (G == 32) return __shfl_sync(0xffffffffu, v, 0);
    const int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < G / 32; i++) t += sh[i];
    __syncthreads();
    return t;
}

/* max with NaN propagation */
__device__ __forceinline__ double nan_max(double a, double b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }

template <int G> __device__ __forceinline__ double group_max(double v, double *sh)
{
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) v = nan_max(v, __shfl_down_sync(0xffffffffu, v, d));
    if (G == 32) return __shfl_sync(0xffffffffu, v, 0);
    const int w = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    double t = sh[0];
    for (int i = 1; i < G / 32; i++) t = nan_max(t, sh[i]);
    __syncthreads();
    return t;
}

/* Geometry: the dims other than `dim`, operand 0 = y, 1 = x. */
template <typename T, int G>
__global__ void __launch_bounds__(256) k_softmax(Geom g, const T *__restrict__ X, T *__restrict__ Y, long long L, long long sx,
                                                 long long sy, int log_form)
{
    constexpr int kRows = 256 / G;
    __shared__ double sh[kRows][8];
    const int lane = threadIdx.x % G, grp = threadIdx.x / G;
    const long long rows = g.n;
    for (long long rb = (long long)blockIdx.x * kRows; rb < rows; rb += (long long)gridDim.x * kRows) {
        const long long row = rb + grp;
        const bool active = row < rows; /* warps of a partial last block idle, uniformly per group */
        long long off[2] = {0, 0};
        if (active) geom_offsets<2, long long>(g, row, off);
        const T *x = X + off[1];
        T *y = Y + off[0];
        double m = -INFINITY;
        if (active)
            for (long long j = lane; j < L; j += G) {
                const T v = x[j * sx];
                if ((double)v > m || v != v) m = (double)v;
            }
        m = group_max<G>(m, sh[grp]);
        T mt = (T)m;
        if (isinf(m) && m < 0) mt = 0;
        double s = 0;
        if (active)
            for (long long j = lane; j < L; j += G) s += (double)sm_exp(x[j * sx] - mt);
        s = group_sum<G>(s, sh[grp]);
        if (active) {
            if (log_form) {
                const T ls = (T)log(s);
                for (long long j = lane; j < L; j += G) y[j * sy] = x[j * sx] - mt - ls;
            } else {
                const T inv = (T)(1.0 / s);
                for (long long j = lane; j < L; j += G) y[j * sy] = sm_exp(x[j * sx] - mt) * inv;
            }
        }
    }
}

template <typename T> void softmax_t(const em_kargs *k, void *buffers[])
{
    const em_tdesc &in = k->in[0], &out = k->out[0];
    const int d = k->p.axis.dim, nd = in.ndim;
    const long long L = nd ? in.shape[d] : 1, sx = nd ? in.strides[d] : 1, sy = nd ? out.strides[d] : 1;
    int64_t shp[kMaxDims], stx[kMaxDims], sty[kMaxDims];
    int no = 0;
    for (int i = 0; i < nd; i++)
        if (i != d) {
            shp[no] = in.shape[i];
            stx[no] = in.strides[i];
            sty[no] = out.strides[i];
            no++;
        }
    const int64_t *st[2] = {sty, stx};
    Geom g = make_geom(no, shp, 2, st);
    if (g.n <= 0 || L <= 0) return;
    const T *X = (const T *)base(buffers, 0, in);
    T *Y = (T *)base(buffers, 1, out);
    cudaStream_t s = stream();
    const int log_form = k->kind == EM_OP_LOG_SOFTMAX;
    const long long cap = 65535LL * 16;
    if (L <= 1024) {
        long long blocks = (g.n + 7) / 8;
        k_softmax<T, 32><<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s>>>(g, X, Y, L, sx, sy, log_form);
    } else {
        long long blocks = g.n;
        k_softmax<T, 256><<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, s>>>(g, X, Y, L, sx, sy, log_form);
    }
    check_launch("softmax");
}

} // namespace

void em_cuda_reduce(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    /* Red<T> and store_val have no case for other kinds / output dtypes */
    if (k->kind < EM_OP_SUM || k->kind > EM_OP_VAR) {
        unsupported("reduce (op)", k->kind);
        return;
    }
    if (k->out[0].dtype < EM_F32 || k->out[0].dtype > EM_BOOL) {
        unsupported("reduce (output dtype)", k->out[0].dtype);
        return;
    }
    switch (k->in[0].dtype) {
    case EM_F32: reduce_t<float>(k, buffers); break;
    case EM_F64: reduce_t<double>(k, buffers); break;
    case EM_I32: reduce_t<int32_t>(k, buffers); break;
    case EM_I64: reduce_t<int64_t>(k, buffers); break;
    case EM_U8:
    case EM_BOOL: reduce_t<uint8_t>(k, buffers); break;
    default: unsupported("reduce (dtype)", k->in[0].dtype); break;
    }
}

void em_cuda_softmax(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    if (k->in[0].dtype == EM_F32) softmax_t<float>(k, buffers);
    else if (k->in[0].dtype == EM_F64) softmax_t<double>(k, buffers);
    else unsupported("softmax (dtype)", k->in[0].dtype);
}
