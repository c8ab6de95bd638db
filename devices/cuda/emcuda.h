/* Shared helpers for Ember's CUDA kernels (the .cu files of devices/cuda). C++ (nvcc) only.
 *
 * Every kernel function here is a StarPU CUDA implementation
 *     void fn(void *buffers[], void *cl_arg)
 * run by a CUDA worker thread with the worker's device current. cl_arg is an
 * em_kargs (devices/kargs.h): one em_tdesc per operand (dtype, rank, shape,
 * strides and offset in ELEMENTS from the start of the StarPU byte vector).
 * Buffers come inputs first, then outputs. The device pointer of buffer i is
 * (char *)STARPU_VECTOR_GET_PTR(buffers[i]).
 *
 * Rules (StarPU notes §2.2): everything is queued on
 * starpu_cuda_get_local_stream() and nothing waits (the codelets carry
 * STARPU_CUDA_ASYNC); no cudaMalloc/cudaFree/synchronisation in a kernel
 * function: scratch memory is the per-worker workspace allocated once by
 * em__cuda_init(). The one exception is the cuDNN convolution (conv.cu): its
 * workspace pool grows stream-ordered (cudaMallocAsync / cudaFreeAsync), and
 * the first call of a new shape waits for the stream once to measure the
 * algorithms on the worker's buffers. A kernel never writes outside the elements its output
 * descriptor covers and never aborts: the front ends validate shapes and
 * dtypes; a failed launch, CUDA call or cuBLAS status becomes the sticky
 * error of the op (em__kernel_error, devices/devices.h) that the next
 * em_sync / em_to_host / em_item returns, naming op, device and shapes. */
#ifndef EMBER_CUDA_EMCUDA_H
#define EMBER_CUDA_EMCUDA_H

#include <cuda_runtime.h>
#include <starpu.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "devices/devices.h"
}
#include "devices/collapse.h"

namespace emc {

constexpr int kThreads = 256;
constexpr int kMaxDims = EM_KARGS_MAX_DIMS;

/* ---- op table facts, from tasks/ops.def ---------------------------------- */

inline unsigned op_flags(int kind) { return em__kernel_info[kind].flags; }
inline bool is_cmp(int kind) { return (op_flags(kind) & F_CMP) != 0; }
/* kind is a valid op with all of @p flags and @p n_in inputs (element-wise
 * kernels check their kind with it before launching). */
inline bool is_family(int kind, unsigned flags, int n_in)
{
    return kind >= 0 && kind < EM_OP_COUNT && (op_flags(kind) & flags) == flags && em__kernel_info[kind].n_in == n_in;
}
inline bool is_fp_dtype(int dt) { return dt == EM_F32 || dt == EM_F64; }

/* ---- buffers, stream, launch configuration ------------------------------- */

inline char *buf(void *buffers[], int i) { return (char *)STARPU_VECTOR_GET_PTR(buffers[i]); }
inline cudaStream_t stream() { return starpu_cuda_get_local_stream(); }

/* Element size of an em_dtype. */
inline int64_t dtype_size(int dt)
{
    switch (dt) {
    case EM_F64: case EM_I64: return 8;
    case EM_F32: case EM_I32: return 4;
    case EM_F16: case EM_BF16: return 2;
    default: return 1;
    }
}

inline int64_t numel(const em_tdesc &d)
{
    int64_t n = 1;
    for (int i = 0; i < d.ndim; i++) n *= d.shape[i];
    return n;
}

/* Pointer to element 0 of an operand: buffer + offset * element size. */
inline char *base(void *buffers[], int i, const em_tdesc &d) { return buf(buffers, i) + d.offset * dtype_size(d.dtype); }

/* SM count of the current worker's device (cached by em__cuda_init). */
int sm_count();
/* Grid size for a grid-stride loop over n items. */
inline unsigned grid_for(int64_t n, int threads = kThreads)
{
    int64_t b = (n + threads - 1) / threads;
    int64_t cap = (int64_t)sm_count() * 32; /* grid-stride loops beyond that */
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Per-worker scratch (device memory of the worker's GPU, valid for kernels
 * queued on the worker's stream). NULL when none could be allocated. */
void *workspace(size_t *bytes);

/* cuDNN state of the conv kernels (devices/cuda/conv.cu): conv_worker_stop
 * frees the calling CUDA worker's cuDNN handle and workspace pool (run on
 * every CUDA worker by em__cuda_shutdown); conv_shutdown then empties the
 * algorithm cache. No-ops in a build without cuDNN. */
void conv_worker_stop();
void conv_shutdown();

/* The fused attention ops (SDPA, SDPA_BWD; devices/cuda/attention.cu) without
 * StarPU: ptrs[i] = element 0 of operand i (inputs then outputs, offsets
 * already applied), queued on @p s. em_cuda_attention calls it; so does the
 * standalone harness (bench/attention_harness.cu). Reports through check() /
 * unsupported(). */
void attention_launch(const em_kargs *k, void *const *ptrs, cudaStream_t s);

/* Records a failed launch / CUDA call as the running op's sticky error. */
void check(cudaError_t e, const char *what);
inline void check_launch(const char *what) { check(cudaGetLastError(), what); }

/* Reports, the way check() reports a failed CUDA call (as
 * cudaErrorNotSupported), a kernel function reached with an op kind or dtype
 * it has no case for: an Ember bug, the front ends validate. The caller then
 * queues nothing. The CUDA counterpart of em_cpu_bad_kind. */
inline void unsupported(const char *where, int kind_or_dtype)
{
    char what[160];
    snprintf(what, sizeof what, "%s: unsupported op/dtype %d", where, kind_or_dtype);
    check(cudaErrorNotSupported, what);
}

/* ---- N-d geometry shared by element-wise style kernels ------------------- */

/* Up to 4 operands over one common shape, size-1 dims dropped and dims that
 * are contiguous in every operand merged (em_collapse_dims, devices/collapse.h,
 * the rule of devices/cpu/iter.h); beyond nd the shape is 1 and the strides
 * 0, and so are all strides of operands nops..3. After
 * coalescing, a contiguous tensor is one dim of stride 1. Offsets are not
 * part of it: kernels get pointers already moved to element 0. */
struct Geom {
    int nd;
    int nops;
    int64_t n;
    int64_t shape[kMaxDims];
    int64_t st[4][kMaxDims];
};

inline Geom make_geom(int ndim, const int64_t *shape, int nops, const int64_t *const *strides)
{
    Geom g;
    g.nops = nops;
    g.n = 1;
    for (int d = 0; d < ndim; d++) g.n *= shape[d];
    int nd = em_collapse_dims(ndim, shape, nops, strides, g.shape, g.st);
    for (int d = nd; d < kMaxDims; d++) {
        g.shape[d] = 1;
        for (int k = 0; k < 4; k++) g.st[k][d] = 0;
    }
    for (int k = nops; k < 4; k++)
        for (int d = 0; d < kMaxDims; d++) g.st[k][d] = 0;
    g.nd = nd;
    return g;
}

/* true when every operand is one unit-stride run (contiguous fast path). */
inline bool geom_contig(const Geom &g)
{
    if (g.nd != 1) return false;
    for (int k = 0; k < g.nops; k++)
        if (g.st[k][0] != 1 && g.n > 1) return false;
    return true;
}

/* 32-bit index math is safe when the element count plus one grid stride
 * (grid_for caps it far below 2^30) and every offset reached fit 31 bits. */
inline bool geom_fits32(const Geom &g)
{
    if (g.n >= (int64_t)1 << 30) return false;
    for (int k = 0; k < g.nops; k++) {
        int64_t m = 0;
        for (int d = 0; d < g.nd; d++) m += (g.shape[d] - 1) * (g.st[k][d] < 0 ? -g.st[k][d] : g.st[k][d]);
        if (m >= INT32_MAX) return false;
    }
    return true;
}

/* Element offsets of linear index i (C order over g.shape) for NOPS operands.
 * IT = int32_t when geom_fits32, else int64_t. */
template <int NOPS, typename IT>
__device__ __forceinline__ void geom_offsets(const Geom &g, IT i, IT off[NOPS])
{
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 1; d--) {
        if (d < g.nd) {
            IT s = (IT)g.shape[d];
            IT c = i % s;
            i /= s;
#pragma unroll
            for (int k = 0; k < NOPS; k++) off[k] += c * (IT)g.st[k][d];
        }
    }
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] += i * (IT)g.st[k][0];
}

} // namespace emc

/* The kernel functions (one per CPU kernel family of tasks/ops.def). */
void em_cuda_unary(void *buffers[], void *cl_arg);
void em_cuda_binary(void *buffers[], void *cl_arg);
void em_cuda_where(void *buffers[], void *cl_arg);
void em_cuda_copy(void *buffers[], void *cl_arg);
void em_cuda_reduce(void *buffers[], void *cl_arg);
void em_cuda_softmax(void *buffers[], void *cl_arg);
void em_cuda_matmul(void *buffers[], void *cl_arg);
void em_cuda_index(void *buffers[], void *cl_arg);
void em_cuda_fill(void *buffers[], void *cl_arg);
void em_cuda_optim(void *buffers[], void *cl_arg);
void em_cuda_conv(void *buffers[], void *cl_arg);
void em_cuda_pool(void *buffers[], void *cl_arg);
void em_cuda_norm(void *buffers[], void *cl_arg);
void em_cuda_attention(void *buffers[], void *cl_arg);
void em_cuda_step(void *buffers[], void *cl_arg); /* step.cu: a captured step (CUDA graphs) */
/* FUSED (devices/cuda/fused.cu): an interpreter of the em_fused_prog of an
 * em_fused_args cl_arg (devices/kargs.h), f32 or f64. */
void em_cuda_fused(void *buffers[], void *cl_arg);

#endif
