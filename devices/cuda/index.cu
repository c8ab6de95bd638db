/* CUDA kernels for the indexing ops: GATHER, INDEX_SELECT, SCATTER,
 * SCATTER_ADD, ONE_HOT. Contracts at the top of tasks/index.c (the CPU
 * reference is devices/cpu/index.c); index operands are i64.
 *
 *   GATHER       out[i][j][k] = a[i][index[i][j][k]][k]         (dim 1)
 *   INDEX_SELECT out[i][j][k] = a[i][index[j]][k]                (dim 1)
 *   SCATTER      out = self; out[i][index[i][j][k]][k] = src[i][j][k]
 *   SCATTER_ADD  out = self; out[i][index[i][j][k]][k] += src[i][j][k]
 *                (bool: |=)
 *   INDEX_ADD    out = self; out[i][index[j]][k] += src[i][j][k]   (dim 1)
 *   ONE_HOT      out[..., c] = (index[...] == c), i64
 *
 * Every index value is checked against its dim: out of range (or negative)
 * reads 0 (gather, index_select), is skipped (scatter*), or gives an all-zero
 * row (one_hot). Nothing is read or written out of bounds.
 *
 * Scatter determinism: the elements of index that share all coordinates but
 * `dim` (a "fibre") are the only ones that can hit the same output element,
 * so one thread handles one fibre and walks it in C order. Duplicate indices
 * thus keep the last write (scatter) and accumulate in the CPU's order
 * (scatter_add): results are bit-identical to the CPU's, with no atomics.
 *
 * index_add (1-D index [N] along dim, out [.., V, ..]): the pairs
 * (index[j], j) are sorted by a stable radix sort (CUB), so the j of one
 * output slice v form a segment in ascending order; the segments' starts
 * are binary searches in the sorted keys; then one thread per output
 * element (v, r) (r: the position in the other dims) computes self + the
 * segment's src values, added in ascending j: the CPU's order and bits,
 * with no atomics, for any distribution of the index. Out-of-range values
 * get the key V (past every segment) and are skipped. Scratch (keys, values,
 * offsets, CUB's temporary storage) comes from the worker's workspace
 * (EMBER_CUDA_WORKSPACE_MB, default 4: 16 N bytes + 4 (V + 1) + CUB's
 * temporary storage, under 1 MiB for N = 16384, V = 50257); when it does
 * not fit (or N or V >= 2^31 - 1) the fibre walk of scatter is used
 * instead: out = self, then one thread per r walking j in order (the same
 * bits, less parallel). Everything is queued on the worker's stream;
 * nothing waits. */
#include "devices/cuda/emcuda.h"

#include <cub/device/device_radix_sort.cuh>

using namespace emc;

namespace {

/* operands: 0 = out, 1 = index (dim stride as given), 2 = a (dim stride 0) */
template <typename T, typename IT>
__global__ void k_gather(Geom g, T *__restrict__ y, const int64_t *__restrict__ I, const T *__restrict__ a, int64_t n,
                         int64_t sd)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[3];
        geom_offsets<3, IT>(g, i, off);
        const int64_t v = I[off[1]];
        y[off[0]] = (v >= 0 && v < n) ? a[(int64_t)off[2] + v * sd] : (T)0;
    }
}

/* Fibres over index's dims other than dim: operands 0 = index, 1 = src,
 * 2 = out; L steps along dim with strides si (index), ss (src). */
template <typename T, int MODE> /* 0 = set, 1 = add, 2 = or */
__global__ void k_scatter(Geom g, const int64_t *__restrict__ I, const T *__restrict__ S, T *__restrict__ y, int64_t L,
                          int64_t si, int64_t ss, int64_t n, int64_t sd)
{
    for (long long f = blockIdx.x * (long long)blockDim.x + threadIdx.x; f < g.n; f += (long long)gridDim.x * blockDim.x) {
        long long off[3];
        geom_offsets<3, long long>(g, f, off);
        const int64_t *ip = I + off[0];
        const T *sp = S + off[1];
        T *yp = y + off[2];
        for (int64_t j = 0; j < L; j++) {
            const int64_t v = ip[j * si];
            if (v < 0 || v >= n) continue;
            T &dst = yp[v * sd];
            const T val = sp[j * ss];
            if (MODE == 0) dst = val;
            else if (MODE == 1) dst = (T)(dst + val);
            else dst = (T)(dst || val);
        }
    }
}

template <typename T>
__global__ void k_copy(Geom g, const T *__restrict__ x, T *__restrict__ y)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < g.n; i += (long long)gridDim.x * blockDim.x) {
        long long off[2];
        geom_offsets<2, long long>(g, i, off);
        y[off[0]] = x[off[1]];
    }
}

/* e-geometry over index's shape: 0 = index, 1 = out (its first nd dims). */
__global__ void k_one_hot(Geom g, const int64_t *__restrict__ I, int64_t *__restrict__ y, int64_t C, int64_t sc)
{
    const long long total = g.n * C;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const long long e = t / C, c = t % C;
        long long off[2];
        geom_offsets<2, long long>(g, e, off);
        y[off[1] + c * sc] = I[off[0]] == c ? 1 : 0;
    }
}

/* ---- index_add ------------------------------------------------------------ */

/* Sort input: key = index[j] when in [0, V), else V (sorts past every
 * segment); value = j. */
__global__ void k_ia_keys(const int64_t *__restrict__ I, int64_t si, int32_t N, int64_t V, uint32_t *__restrict__ keys,
                          int32_t *__restrict__ vals)
{
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < N; j += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = I[j * si];
        keys[j] = (uint32_t)((v >= 0 && v < V) ? v : V);
        vals[j] = (int32_t)j;
    }
}

/* off[v] = the first position of a key >= v in the sorted keys, v = 0..V:
 * segment v is [off[v], off[v + 1]). */
__global__ void k_ia_offsets(const uint32_t *__restrict__ keys, int32_t N, int64_t V, int32_t *__restrict__ off)
{
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v <= V; v += (int64_t)gridDim.x * blockDim.x) {
        int32_t lo = 0, hi = N;
        while (lo < hi) {
            const int32_t mid = lo + (hi - lo) / 2;
            if ((int64_t)keys[mid] < v) lo = mid + 1;
            else hi = mid;
        }
        off[v] = lo;
    }
}

template <typename T, int MODE> /* 1 = add, 2 = or */
__device__ __forceinline__ T ia_op(T a, T b)
{
    if (MODE == 2) return (T)(a || b);
    return (T)(a + b);
}

/* One thread per output element t = v * R + r (r: C order over the dims
 * other than dim, geometry g: 0 = out, 1 = self, 2 = src, dim removed):
 * y = self + the src rows of segment v, in ascending j. The loads of a
 * batch of 8 are issued before its (ordered) additions. */
template <typename T, int MODE, typename IT>
__global__ void k_ia_sum(Geom g, int64_t V, T *__restrict__ y, const T *__restrict__ self, const T *__restrict__ src,
                         int64_t sdo, int64_t sdf, int64_t sds, const int32_t *__restrict__ off,
                         const int32_t *__restrict__ perm)
{
    const IT R = (IT)g.n, total = (IT)V * R;
    for (IT t = blockIdx.x * (IT)blockDim.x + threadIdx.x; t < total; t += (IT)gridDim.x * blockDim.x) {
        const IT v = t / R, r = t - v * R;
        IT o[3];
        geom_offsets<3, IT>(g, r, o);
        T acc = self[o[1] + v * (IT)sdf];
        const T *sp = src + o[2];
        const int32_t e = off[v + 1];
        int32_t q = off[v];
        for (; q + 8 <= e; q += 8) {
            T x[8];
#pragma unroll
            for (int u = 0; u < 8; u++) x[u] = sp[(IT)perm[q + u] * (IT)sds];
#pragma unroll
            for (int u = 0; u < 8; u++) acc = ia_op<T, MODE>(acc, x[u]);
        }
        for (; q < e; q++) acc = ia_op<T, MODE>(acc, sp[(IT)perm[q] * (IT)sds]);
        y[o[0] + v * (IT)sdo] = acc;
    }
}

/* Fallback (no workspace for the sort): out already holds self; one thread
 * per r walks j = 0..N-1 in order (geometry g as k_ia_sum's). */
template <typename T, int MODE>
__global__ void k_ia_walk(Geom g, const int64_t *__restrict__ I, int64_t si, int64_t N, int64_t V, T *__restrict__ y,
                          const T *__restrict__ src, int64_t sdo, int64_t sds)
{
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < g.n; r += (long long)gridDim.x * blockDim.x) {
        long long o[3];
        geom_offsets<3, long long>(g, r, o);
        T *yp = y + o[0];
        const T *sp = src + o[2];
        for (int64_t j = 0; j < N; j++) {
            const int64_t v = I[j * si];
            if (v < 0 || v >= V) continue;
            yp[v * sdo] = ia_op<T, MODE>(yp[v * sdo], sp[j * sds]);
        }
    }
}

template <typename T> void gather_t(const Geom &g, void *y, const int64_t *I, const void *a, int64_t n, int64_t sd)
{
    if (geom_fits32(g))
        k_gather<T, int32_t><<<grid_for(g.n), kThreads, 0, stream()>>>(g, (T *)y, I, (const T *)a, n, sd);
    else
        k_gather<T, int64_t><<<grid_for(g.n), kThreads, 0, stream()>>>(g, (T *)y, I, (const T *)a, n, sd);
}

void gather(const em_kargs *k, void *buffers[], bool index_select)
{
    const em_tdesc &A = k->in[0], &Ix = k->in[1], &O = k->out[0];
    const int dim = k->p.axis.dim;
    if (dim < 0 || dim >= O.ndim) return;
    int64_t ist[kMaxDims], ast[kMaxDims];
    for (int d = 0; d < O.ndim; d++) {
        ast[d] = d == dim ? 0 : A.strides[d];
        ist[d] = index_select ? (d == dim ? Ix.strides[0] : 0) : Ix.strides[d];
    }
    const int64_t *st[3] = {O.strides, ist, ast};
    Geom g = make_geom(O.ndim, O.shape, 3, st);
    if (g.n == 0) return;
    char *y = base(buffers, 2, O);
    const int64_t *I = (const int64_t *)base(buffers, 1, Ix);
    const char *a = base(buffers, 0, A);
    const int64_t n = A.shape[dim], sd = A.strides[dim];
    switch (dtype_size(A.dtype)) {
    case 1: gather_t<uint8_t>(g, y, I, a, n, sd); break;
    case 2: gather_t<uint16_t>(g, y, I, a, n, sd); break;
    case 4: gather_t<uint32_t>(g, y, I, a, n, sd); break;
    case 8: gather_t<uint64_t>(g, y, I, a, n, sd); break;
    default: unsupported("gather (dtype)", A.dtype); return;
    }
    check_launch("gather");
}

template <typename T, int MODE>
void scatter_t(const Geom &g, const int64_t *I, const void *S, void *y, int64_t L, int64_t si, int64_t ss, int64_t n, int64_t sd)
{
    k_scatter<T, MODE><<<grid_for(g.n), kThreads, 0, stream()>>>(g, I, (const T *)S, (T *)y, L, si, ss, n, sd);
}

/* out <- self (same dtype, out's shape) on the worker's stream; false when
 * there is nothing more to do (an empty out, or an error recorded). */
bool copy_self(const em_tdesc &Sf, const char *self, const em_tdesc &O, char *y, const char *what)
{
    const int64_t *st[2] = {O.strides, Sf.strides};
    Geom g = make_geom(O.ndim, O.shape, 2, st);
    if (g.n == 0) return false;
    const int64_t es = dtype_size(O.dtype);
    cudaStream_t s = stream();
    if (geom_contig(g)) {
        check(cudaMemcpyAsync(y, self, (size_t)(g.n * es), cudaMemcpyDeviceToDevice, s), what);
        return true;
    }
    switch (es) {
    case 1: k_copy<uint8_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint8_t *)self, (uint8_t *)y); break;
    case 2: k_copy<uint16_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint16_t *)self, (uint16_t *)y); break;
    case 4: k_copy<uint32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint32_t *)self, (uint32_t *)y); break;
    case 8: k_copy<uint64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint64_t *)self, (uint64_t *)y); break;
    default: unsupported(what, O.dtype); return false;
    }
    check_launch(what);
    return true;
}

void scatter(const em_kargs *k, void *buffers[])
{
    const em_tdesc &Sf = k->in[0], &Ix = k->in[1], &Sr = k->in[2], &O = k->out[0];
    const int dim = k->p.axis.dim;
    const char *self = base(buffers, 0, Sf);
    const int64_t *I = (const int64_t *)base(buffers, 1, Ix);
    const char *src = base(buffers, 2, Sr);
    char *y = base(buffers, 3, O);
    const int64_t es = dtype_size(O.dtype);

    /* 1. out <- self */
    if (!copy_self(Sf, self, O, y, "scatter (copy)")) return;
    /* 2. fibres of index */
    const bool has_dim = dim >= 0 && dim < Ix.ndim;
    int64_t shp[kMaxDims], sti[kMaxDims], sts[kMaxDims], sto[kMaxDims];
    int nf = 0;
    for (int d = 0; d < Ix.ndim; d++) {
        if (d == dim) continue;
        shp[nf] = Ix.shape[d];
        sti[nf] = Ix.strides[d];
        sts[nf] = Sr.strides[d];
        sto[nf] = O.strides[d];
        nf++;
    }
    const int64_t *st3[3] = {sti, sts, sto};
    Geom g = make_geom(nf, shp, 3, st3);
    const int64_t L = has_dim ? Ix.shape[dim] : 1;
    if (g.n == 0 || L == 0) return;
    const int64_t si = has_dim ? Ix.strides[dim] : 0, ss = has_dim ? Sr.strides[dim] : 0;
    const int64_t n = has_dim ? O.shape[dim] : 1, sd = has_dim ? O.strides[dim] : 0;
    if (k->kind == EM_OP_SCATTER) {
        switch (es) {
        case 1: scatter_t<uint8_t, 0>(g, I, src, y, L, si, ss, n, sd); break;
        case 2: scatter_t<uint16_t, 0>(g, I, src, y, L, si, ss, n, sd); break;
        case 4: scatter_t<uint32_t, 0>(g, I, src, y, L, si, ss, n, sd); break;
        case 8: scatter_t<uint64_t, 0>(g, I, src, y, L, si, ss, n, sd); break;
        default: unsupported("scatter (dtype)", O.dtype); return;
        }
    } else {
        switch (O.dtype) {
        case EM_F32: scatter_t<float, 1>(g, I, src, y, L, si, ss, n, sd); break;
        case EM_F64: scatter_t<double, 1>(g, I, src, y, L, si, ss, n, sd); break;
        case EM_I32: scatter_t<int32_t, 1>(g, I, src, y, L, si, ss, n, sd); break;
        case EM_I64: scatter_t<int64_t, 1>(g, I, src, y, L, si, ss, n, sd); break;
        case EM_U8: scatter_t<uint8_t, 1>(g, I, src, y, L, si, ss, n, sd); break;
        case EM_BOOL: scatter_t<uint8_t, 2>(g, I, src, y, L, si, ss, n, sd); break;
        default: unsupported("scatter_add (dtype)", O.dtype); return;
        }
    }
    check_launch("scatter");
}

/* ---- index_add (host) ------------------------------------------------------- */

/* Largest |offset| operand k reaches over g (dims as collapsed). */
int64_t geom_extent(const Geom &g, int k)
{
    int64_t m = 0;
    for (int d = 0; d < g.nd; d++) m += (g.shape[d] - 1) * (g.st[k][d] < 0 ? -g.st[k][d] : g.st[k][d]);
    return m;
}

inline size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

struct IaArgs {
    Geom g;
    int64_t V, N, si, sdo, sdf, sds;
    const int64_t *I;
    const int32_t *off, *perm;
    const char *self, *src;
    char *y;
    bool fits32;
};

template <typename T, int MODE> void ia_sum_t(const IaArgs &a)
{
    const int64_t total = a.V * a.g.n;
    if (a.fits32)
        k_ia_sum<T, MODE, int32_t><<<grid_for(total), kThreads, 0, stream()>>>(a.g, a.V, (T *)a.y, (const T *)a.self, (const T *)a.src,
                                                                               a.sdo, a.sdf, a.sds, a.off, a.perm);
    else
        k_ia_sum<T, MODE, int64_t><<<grid_for(total), kThreads, 0, stream()>>>(a.g, a.V, (T *)a.y, (const T *)a.self, (const T *)a.src,
                                                                               a.sdo, a.sdf, a.sds, a.off, a.perm);
}

template <typename T, int MODE> void ia_walk_t(const IaArgs &a)
{
    k_ia_walk<T, MODE><<<grid_for(a.g.n), kThreads, 0, stream()>>>(a.g, a.I, a.si, a.N, a.V, (T *)a.y, (const T *)a.src, a.sdo, a.sds);
}

/* The kernel of dtype dt (sum: the segmented kernel, else the walk); false
 * for a dtype without one (nothing queued). */
bool ia_launch(int dt, const IaArgs &a, bool sum)
{
    switch (dt) {
    case EM_F32: sum ? ia_sum_t<float, 1>(a) : ia_walk_t<float, 1>(a); return true;
    case EM_F64: sum ? ia_sum_t<double, 1>(a) : ia_walk_t<double, 1>(a); return true;
    case EM_I32: sum ? ia_sum_t<int32_t, 1>(a) : ia_walk_t<int32_t, 1>(a); return true;
    case EM_I64: sum ? ia_sum_t<int64_t, 1>(a) : ia_walk_t<int64_t, 1>(a); return true;
    case EM_U8: sum ? ia_sum_t<uint8_t, 1>(a) : ia_walk_t<uint8_t, 1>(a); return true;
    case EM_BOOL: sum ? ia_sum_t<uint8_t, 2>(a) : ia_walk_t<uint8_t, 2>(a); return true;
    default: return false;
    }
}

bool ia_dtype_ok(int dt)
{
    return dt == EM_F32 || dt == EM_F64 || dt == EM_I32 || dt == EM_I64 || dt == EM_U8 || dt == EM_BOOL;
}

void index_add(const em_kargs *k, void *buffers[])
{
    const em_tdesc &Sf = k->in[0], &Ix = k->in[1], &Sr = k->in[2], &O = k->out[0];
    const int dim = k->p.axis.dim;
    if (dim < 0 || dim >= O.ndim || Ix.ndim != 1 || Sr.ndim != O.ndim || Sf.ndim != O.ndim) {
        unsupported("index_add (operands)", dim);
        return;
    }
    if (!ia_dtype_ok(O.dtype)) {
        unsupported("index_add (dtype)", O.dtype);
        return;
    }
    IaArgs a;
    a.V = O.shape[dim];
    a.N = Ix.shape[0];
    a.si = Ix.strides[0];
    a.sdo = O.strides[dim];
    a.sdf = Sf.strides[dim];
    a.sds = Sr.strides[dim];
    a.I = (const int64_t *)base(buffers, 1, Ix);
    a.self = base(buffers, 0, Sf);
    a.src = base(buffers, 2, Sr);
    a.y = base(buffers, 3, O);
    a.off = a.perm = nullptr;
    int64_t shp[kMaxDims], sto[kMaxDims], stf[kMaxDims], sts[kMaxDims];
    int nr = 0;
    for (int d = 0; d < O.ndim; d++) {
        if (d == dim) continue;
        shp[nr] = O.shape[d];
        sto[nr] = O.strides[d];
        stf[nr] = Sf.strides[d];
        sts[nr] = Sr.strides[d];
        nr++;
    }
    const int64_t *st3[3] = {sto, stf, sts};
    a.g = make_geom(nr, shp, 3, st3);
    if (a.g.n == 0 || a.V == 0) return; /* an empty out */
    if (a.N == 0) { /* nothing to add */
        copy_self(Sf, a.self, O, a.y, "index_add (copy)");
        return;
    }
    const int64_t av[3] = {a.sdo < 0 ? -a.sdo : a.sdo, a.sdf < 0 ? -a.sdf : a.sdf, a.sds < 0 ? -a.sds : a.sds};
    const int64_t dn[3] = {a.V - 1, a.V - 1, a.N - 1};
    a.fits32 = a.V * a.g.n < ((int64_t)1 << 30);
    for (int q = 0; q < 3 && a.fits32; q++) a.fits32 = geom_extent(a.g, q) + dn[q] * av[q] < INT32_MAX;
    cudaStream_t s = stream();

    /* The sort's scratch in the workspace: keys in/out (u32), values in/out
     * (i32), offsets (V + 1, i32), CUB's temporary storage. */
    bool sorted = false;
    size_t ws_bytes = 0;
    char *ws = (char *)workspace(&ws_bytes);
    if (ws && a.N < INT32_MAX && a.V < INT32_MAX) {
        int end_bit = 1;
        while (end_bit < 32 && ((int64_t)1 << end_bit) <= a.V) end_bit++; /* keys are 0..V */
        size_t temp_bytes = 0;
        cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                                                        (const int32_t *)nullptr, (int32_t *)nullptr, (int)a.N, 0, end_bit, s);
        const size_t kb = align256(sizeof(uint32_t) * (size_t)a.N), ob = align256(sizeof(int32_t) * (size_t)(a.V + 1));
        const size_t need = 4 * kb + ob + align256(temp_bytes);
        if (e == cudaSuccess && need <= ws_bytes) {
            uint32_t *kin = (uint32_t *)ws, *kout = (uint32_t *)(ws + kb);
            int32_t *vin = (int32_t *)(ws + 2 * kb), *vout = (int32_t *)(ws + 3 * kb);
            int32_t *off = (int32_t *)(ws + 4 * kb);
            void *temp = ws + 4 * kb + ob;
            k_ia_keys<<<grid_for(a.N), kThreads, 0, s>>>(a.I, a.si, (int32_t)a.N, a.V, kin, vin);
            check_launch("index_add (keys)");
            e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, kin, kout, vin, vout, (int)a.N, 0, end_bit, s);
            if (e != cudaSuccess) {
                check(e, "index_add (radix sort)");
                return;
            }
            k_ia_offsets<<<grid_for(a.V + 1), kThreads, 0, s>>>(kout, (int32_t)a.N, a.V, off);
            check_launch("index_add (offsets)");
            a.off = off;
            a.perm = vout;
            sorted = true;
        } else if (e != cudaSuccess) {
            cudaGetLastError(); /* the size query failed: take the walk */
        }
    }
    if (!sorted && !copy_self(Sf, a.self, O, a.y, "index_add (copy)")) return;
    if (!ia_launch(O.dtype, a, sorted)) {
        unsupported("index_add (dtype)", O.dtype);
        return;
    }
    check_launch(sorted ? "index_add (segment sums)" : "index_add (walk)");
}

void one_hot(const em_kargs *k, void *buffers[])
{
    const em_tdesc &Ix = k->in[0], &O = k->out[0];
    const int nd = Ix.ndim;
    const int64_t C = k->p.onehot.num_classes;
    if (C <= 0 || O.ndim != nd + 1) return;
    const int64_t *st[2] = {Ix.strides, O.strides};
    Geom g = make_geom(nd, Ix.shape, 2, st);
    if (g.n == 0) return;
    k_one_hot<<<grid_for(g.n * C), kThreads, 0, stream()>>>(g, (const int64_t *)base(buffers, 0, Ix),
                                                            (int64_t *)base(buffers, 1, O), C, O.strides[nd]);
    check_launch("one_hot");
}

} // namespace

void em_cuda_index(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    switch (k->kind) {
    case EM_OP_GATHER: gather(k, buffers, false); break;
    case EM_OP_INDEX_SELECT: gather(k, buffers, true); break;
    case EM_OP_SCATTER:
    case EM_OP_SCATTER_ADD: scatter(k, buffers); break;
    case EM_OP_INDEX_ADD: index_add(k, buffers); break;
    case EM_OP_ONE_HOT: one_hot(k, buffers); break;
    default: unsupported("index (op)", k->kind); break;
    }
}
