/* CUDA kernel of FUSED: an interpreter of em_fused_prog (the contract:
 * devices/kargs.h, "fused element-wise programs").
 *
 * One kernel per compute type T (float, double) and index type (32-bit when
 * every offset fits, as devices/cuda/elementwise.cu). The program travels BY
 * VALUE as a kernel parameter (param space: every thread reads the same
 * words, no copy to device memory), with the pointers of the leaves and
 * outputs in a second by-value struct. Each thread of a grid-stride loop
 * takes one element i: it unravels i over the collapsed shape, loads every
 * leaf into its register, runs the instructions in order (a switch over the
 * kinds, one case per EW1 / EWS / EWP / EW2 line of tasks/ops.def that is
 * not F_CMP, whose float expression is rendered here exactly as in
 * elementwise.cu's functors) and stores the out_reg registers to the
 * contiguous outputs at i.
 *
 * Before launching, the host checks the whole program (em_fused_check,
 * devices/fused_check.h: dtype, counts, every kind fusable, every register
 * operand written before use, shape and numel consistent) and reports a bad
 * one with unsupported() (the sticky error of the op, as em_cuda_unary's bad
 * kind), queueing nothing; the
 * device switch therefore never meets a kind it has no case for. The shape
 * is collapsed over the leaves' strides (em_collapse_dims): contiguous
 * leaves make it one dim, so the unravel is one multiply-add per leaf. The
 * outputs are contiguous in the (unchanged) row-major order of the shape,
 * so element i of an output is at i whatever the collapse merged. */
#include "devices/cuda/emcuda.h"
#include "devices/fused_check.h"

using namespace emc;

namespace {

/* ---- the expressions of tasks/ops.def (as devices/cuda/elementwise.cu) ---- */

#include "devices/cuda/ew_expr.cuh"

/* The pointers of a launch: leaf l's element 0 (its offset applied), output
 * j's element 0. Unused entries are null. */
struct FusedPtrs {
    const void *leaf[EM_FUSED_MAX_LEAVES];
    void *out[EM_FUSED_MAX_OUT];
};

/* CUDA's classic limit on the parameters of a kernel is 4 KiB. */
static_assert(sizeof(em_fused_prog) < 4096, "em_fused_prog must fit a CUDA kernel parameter");
static_assert(sizeof(em_fused_prog) + sizeof(FusedPtrs) <= 4096, "the fused kernel's parameters exceed 4 KiB");

/* One instruction on the registers r: kind with operand registers ia, ib
 * (ib read by binary kinds only) and scalars sa, sb. The kinds are those of
 * em_fused_arity (devices/fused_check.h; the host checked); F_CMP lines
 * compile to nothing. The fields come by value so the program stays in
 * parameter space. */
template <typename T> __device__ __forceinline__ T run_instr(int kind, int ia, int ib, T sa, T sb, const T *r)
{
    (void)sa;
    (void)sb;
    switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw)                                                                                     \
    case EM_OP_##E:                                                                                                    \
        if constexpr (((fl) & F_CMP) == 0) {                                                                           \
            const T x = r[ia];                                                                                         \
            return (T)(fx);                                                                                            \
        }                                                                                                              \
        break;
#define EW2(E, nm, fl, fx, ix, bw)                                                                                     \
    case EM_OP_##E:                                                                                                    \
        if constexpr (((fl) & F_CMP) == 0) {                                                                           \
            const T a = r[ia], b = r[ib];                                                                              \
            return (T)(fx);                                                                                            \
        }                                                                                                              \
        break;
#include "tasks/ops.def"
    default: break; /* unreachable: em_cuda_fused checked every kind before launching */
    }
    return (T)0;
}

template <typename T, typename IT> __global__ void k_fused(em_fused_prog p, FusedPtrs ptr)
{
    const IT n = (IT)p.numel;
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < n; i += (IT)gridDim.x * blockDim.x) {
        /* i's coordinates over the collapsed shape (row-major) */
        IT c[kMaxDims];
        IT rest = i;
#pragma unroll
        for (int d = kMaxDims - 1; d >= 1; d--) {
            c[d] = 0;
            if (d < p.ndim) {
                const IT s = (IT)p.shape[d];
                c[d] = rest % s;
                rest /= s;
            }
        }
        c[0] = rest;
        T r[EM_FUSED_MAX_REGS];
        for (int l = 0; l < p.n_leaf; l++) {
            IT off = c[0] * (IT)p.leaf[l].strides[0];
#pragma unroll
            for (int d = 1; d < kMaxDims; d++)
                if (d < p.ndim) off += c[d] * (IT)p.leaf[l].strides[d];
            r[l] = ((const T *)ptr.leaf[l])[off];
        }
        for (int j = 0; j < p.n_instr; j++)
            r[p.n_leaf + j] = run_instr<T>(p.ins[j].kind, p.ins[j].a, p.ins[j].b, (T)p.ins[j].sa, (T)p.ins[j].sb, r);
        for (int o = 0; o < p.n_out; o++) ((T *)ptr.out[o])[i] = r[p.out_reg[o]];
    }
}

template <typename T> void fused_t(void *buffers[], const em_fused_prog &p)
{
    /* the collapsed copy: shape and leaf strides over the merged dims,
     * offsets applied to the pointers */
    em_fused_prog q = p;
    const int64_t *st[EM_FUSED_MAX_LEAVES] = {};
    for (int l = 0; l < p.n_leaf; l++) st[l] = p.leaf[l].strides;
    int64_t cst[EM_FUSED_MAX_LEAVES][EM_KARGS_MAX_DIMS];
    q.ndim = em_collapse_dims(p.ndim, p.shape, p.n_leaf, st, q.shape, cst);
    FusedPtrs ptr;
    memset(&ptr, 0, sizeof ptr);
    bool fits32 = p.numel < ((int64_t)1 << 30);
    for (int l = 0; l < p.n_leaf; l++) {
        memcpy(q.leaf[l].strides, cst[l], sizeof q.leaf[l].strides);
        q.leaf[l].offset = 0;
        ptr.leaf[l] = buf(buffers, l) + p.leaf[l].offset * (int64_t)sizeof(T);
        int64_t m = 0;
        for (int d = 0; d < q.ndim; d++) m += (q.shape[d] - 1) * (cst[l][d] < 0 ? -cst[l][d] : cst[l][d]);
        if (m >= INT32_MAX) fits32 = false;
    }
    for (int o = 0; o < p.n_out; o++) ptr.out[o] = buf(buffers, p.n_leaf + o);
    cudaStream_t s = stream();
    if (fits32)
        k_fused<T, int32_t><<<grid_for(p.numel), kThreads, 0, s>>>(q, ptr);
    else
        k_fused<T, int64_t><<<grid_for(p.numel), kThreads, 0, s>>>(q, ptr);
    check_launch("fused");
}

} // namespace

void em_cuda_fused(void *buffers[], void *cl_arg)
{
    const em_fused_args *fa = (const em_fused_args *)cl_arg;
    const em_fused_prog &p = fa->prog;
    int bad = 0;
    const char *fault = em_fused_check(&fa->k, &p, &bad);
    if (fault) {
        unsupported(fault, bad); /* "<fault>: unsupported op/dtype <bad>", queueing nothing */
        return;
    }
    if (p.dtype == EM_F32)
        fused_t<float>(buffers, p);
    else
        fused_t<double>(buffers, p);
}
