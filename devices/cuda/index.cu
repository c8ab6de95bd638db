/* CUDA kernels for the indexing ops: GATHER, INDEX_SELECT, SCATTER,
 * SCATTER_ADD, ONE_HOT. Contracts at the top of tasks/index.c (the CPU
 * reference is devices/cpu/index.c); index operands are i64.
 *
 *   GATHER       out[i][j][k] = a[i][index[i][j][k]][k]         (dim 1)
 *   INDEX_SELECT out[i][j][k] = a[i][index[j]][k]                (dim 1)
 *   SCATTER      out = self; out[i][index[i][j][k]][k] = src[i][j][k]
 *   SCATTER_ADD  out = self; out[i][index[i][j][k]][k] += src[i][j][k]
 *                (bool: |=)
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
 * (scatter_add): results are bit-identical to the CPU's, with no atomics. */
#include "devices/cuda/emcuda.h"

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

void scatter(const em_kargs *k, void *buffers[])
{
    const em_tdesc &Sf = k->in[0], &Ix = k->in[1], &Sr = k->in[2], &O = k->out[0];
    const int dim = k->p.axis.dim;
    const char *self = base(buffers, 0, Sf);
    const int64_t *I = (const int64_t *)base(buffers, 1, Ix);
    const char *src = base(buffers, 2, Sr);
    char *y = base(buffers, 3, O);
    const int64_t es = dtype_size(O.dtype);
    cudaStream_t s = stream();

    /* 1. out <- self */
    {
        const int64_t *st[2] = {O.strides, Sf.strides};
        Geom g = make_geom(O.ndim, O.shape, 2, st);
        if (g.n == 0) return;
        if (geom_contig(g)) {
            check(cudaMemcpyAsync(y, self, (size_t)(g.n * es), cudaMemcpyDeviceToDevice, s), "scatter (copy)");
        } else {
            switch (es) {
            case 1: k_copy<uint8_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint8_t *)self, (uint8_t *)y); break;
            case 2: k_copy<uint16_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint16_t *)self, (uint16_t *)y); break;
            case 4: k_copy<uint32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint32_t *)self, (uint32_t *)y); break;
            case 8: k_copy<uint64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const uint64_t *)self, (uint64_t *)y); break;
            default: unsupported("scatter (copy dtype)", O.dtype); return;
            }
            check_launch("scatter (copy)");
        }
    }
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
    case EM_OP_ONE_HOT: one_hot(k, buffers); break;
    default: unsupported("index (op)", k->kind); break;
    }
}
