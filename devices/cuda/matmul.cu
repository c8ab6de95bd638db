/* CUDA kernel for EM_OP_MATMUL.
 *
 *   out[b..., M, N] = sum_k A[b..., M, k] * B[b..., k, N]
 *
 * Contract (devices/cpu/matmul.c): in[0] = A [batch..., M, K], in[1] = B
 * [batch..., K, N], out[0] = C [batch..., M, N], one rank nd >= 2 and one
 * dtype; batch dims may be broadcast (stride 0); offsets and strides in
 * elements. f32/f64: cuBLAS (cublas{S,D}gemm[StridedBatched]); f16/bf16:
 * cublasGemmEx / cublasGemmStridedBatchedEx with A, B, C of that type
 * (CUDA_R_16F / CUDA_R_16BF), CUBLAS_COMPUTE_32F (products accumulated in
 * f32, alpha 1 and beta 0 as floats), the result rounded to the 16-bit type
 * once. A matrix goes to cuBLAS as it is when one of its
 * two dims is unit-stride (row-major NoTrans with ld = row stride, or Trans
 * with ld = column stride), the same rule as the CPU kernel; row-major
 * products run as the column-major C^T = B^T A^T (and a column-major C is
 * first rewritten as C^T = B^T A^T, as the CPU does). Batches:
 *   - batch dims are coalesced; a batch whose strides are uniform is ONE
 *     cublas{S,D}gemmStridedBatched call (stride 0 for a broadcast operand),
 *     other batch layouts loop over the outer dims on the host;
 *   - when B is broadcast over the batch and A, C stack their batch over M
 *     (x[B, T, D] @ W), the batch folds into M: one plain gemm.
 * Layouts cuBLAS cannot take, sizes beyond int, and i32/i64/u8 use a plain
 * kernel (floats accumulate in double, f16/bf16 loaded exactly and the sum
 * rounded to f32, then to the 16-bit type; integers in wrapping int64, as the
 * CPU). K == 0 gives zeros; M == 0 or N == 0 writes nothing.
 * cuBLAS math mode, set on the worker's handle before every cuBLAS call (so
 * it follows the setting of the moment the kernel runs):
 *   f32       em_get_float32_matmul_precision(): EM_MATMUL_HIGHEST ->
 *             CUBLAS_DEFAULT_MATH (full FP32; no TF32), EM_MATMUL_HIGH ->
 *             CUBLAS_TF32_TENSOR_OP_MATH (TF32 tensor cores, f32 accumulate;
 *             EMBER_TF32=1 sets HIGH at em_init);
 *   f16/bf16  CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
 *             (tensor cores; split-K partial sums stay f32, as DESIGN.md §7);
 *   f64       CUBLAS_DEFAULT_MATH.
 * A failed cublasSetMathMode is reported like a failed GEMM. */
#include "devices/cuda/emcuda.h"
#include "devices/cuda/half.cuh"

#include <cublas_v2.h>
#include <limits.h>
#include <starpu_cublas_v2.h>
#include <stdio.h>

using namespace emc;

namespace {

/* Same rule as devices/cpu/matmul.c blas_view: NoTrans when rows are
 * unit-stride along cols (ld = sr), Trans when stored column by column
 * (ld = sc). */
bool blas_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool *trans, int64_t *ld)
{
    auto mx = [](int64_t a, int64_t b) { return a > b ? a : b; };
    if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= mx(cols, 1))) {
        *trans = false;
        *ld = rows <= 1 ? mx(cols, 1) : sr;
    } else if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= mx(rows, 1))) {
        *trans = true;
        *ld = cols <= 1 ? mx(rows, 1) : sc;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

struct MM {
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn, scm, scn;
};

/* Plain kernel: one thread per C element, grid-stride over (N, M, batch).
 * Batch geometry operands: 0 = A, 1 = B, 2 = C. */
/* Element loads and stores of the plain float kernel (uint16_t: f16/bf16 bits). */
template <typename T> __device__ __forceinline__ double mm_ld(T v, H16) { return (double)v; }
__device__ __forceinline__ double mm_ld(uint16_t v, H16 h) { return (double)h.ld(v); }
template <typename T> __device__ __forceinline__ T mm_st(double s, H16) { return (T)s; }
template <> __device__ __forceinline__ uint16_t mm_st<uint16_t>(double s, H16 h) { return h.st(d2f_as_cpu(s)); }

template <typename T, bool FP>
__global__ void k_mm_naive(Geom bg, MM p, const T *__restrict__ A, const T *__restrict__ B, T *__restrict__ C, H16 h)
{
    for (long long b = blockIdx.z; b < bg.n; b += gridDim.z) {
        long long off[3];
        geom_offsets<3, long long>(bg, b, off);
        const T *a = A + off[0];
        const T *bb = B + off[1];
        T *c = C + off[2];
        for (long long i = blockIdx.y * (long long)blockDim.y + threadIdx.y; i < p.M; i += (long long)gridDim.y * blockDim.y)
            for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < p.N; j += (long long)gridDim.x * blockDim.x) {
                if constexpr (FP) {
                    double s = 0;
                    for (long long q = 0; q < p.K; q++) s += mm_ld(a[i * p.sam + q * p.sak], h) * mm_ld(bb[q * p.sbk + j * p.sbn], h);
                    c[i * p.scm + j * p.scn] = mm_st<T>(s, h);
                } else {
                    unsigned long long s = 0;
                    for (long long q = 0; q < p.K; q++)
                        s += (unsigned long long)(long long)a[i * p.sam + q * p.sak] *
                             (unsigned long long)(long long)bb[q * p.sbk + j * p.sbn];
                    c[i * p.scm + j * p.scn] = (T)s;
                }
            }
    }
}

template <typename T, bool FP> void mm_naive(const Geom &bg, const MM &p, const T *A, const T *B, T *C, H16 h)
{
    dim3 block(16, 16);
    auto cl = [](long long v, long long cap) { return (unsigned)(v < 1 ? 1 : v > cap ? cap : v); };
    dim3 grid(cl((p.N + 15) / 16, 65535), cl((p.M + 15) / 16, 65535), cl(bg.n, 65535));
    k_mm_naive<T, FP><<<grid, block, 0, stream()>>>(bg, p, A, B, C, h);
    check_launch("matmul (plain kernel)");
}

void report(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        em__kernel_error(nullptr, st == CUBLAS_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM : EM_ERR_DEVICE, "cuBLAS status %d in %s",
                         (int)st, what);
}

/* C = A B (column-major, cuBLAS's operands) for count matrices spaced sA, sB,
 * sC elements apart; ty: the CUDA type of f16/bf16 operands (uint16_t). */
cublasStatus_t gemm_sb(float, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
                       int lda, long long sA, const void *B, int ldb, long long sB, void *C, int ldc, long long sC, int count,
                       cudaDataType)
{
    const float one = 1.0f, zero = 0.0f;
    if (count == 1)
        return cublasSgemm(h, ta, tb, m, n, k, &one, (const float *)A, lda, (const float *)B, ldb, &zero, (float *)C, ldc);
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, &one, (const float *)A, lda, sA, (const float *)B, ldb, sB, &zero,
                                     (float *)C, ldc, sC, count);
}
cublasStatus_t gemm_sb(double, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
                       int lda, long long sA, const void *B, int ldb, long long sB, void *C, int ldc, long long sC, int count,
                       cudaDataType)
{
    const double one = 1.0, zero = 0.0;
    if (count == 1)
        return cublasDgemm(h, ta, tb, m, n, k, &one, (const double *)A, lda, (const double *)B, ldb, &zero, (double *)C, ldc);
    return cublasDgemmStridedBatched(h, ta, tb, m, n, k, &one, (const double *)A, lda, sA, (const double *)B, ldb, sB, &zero,
                                     (double *)C, ldc, sC, count);
}
cublasStatus_t gemm_sb(uint16_t, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A,
                       int lda, long long sA, const void *B, int ldb, long long sB, void *C, int ldc, long long sC, int count,
                       cudaDataType ty)
{
    const float one = 1.0f, zero = 0.0f; /* CUBLAS_COMPUTE_32F: float scalars */
    if (count == 1)
        return cublasGemmEx(h, ta, tb, m, n, k, &one, A, ty, lda, B, ty, ldb, &zero, C, ty, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT);
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &one, A, ty, lda, sA, B, ty, ldb, sB, &zero, C, ty, ldc, sC, count,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* The math mode of a cuBLAS GEMM of dtype @p dt (see the header). */
cublasMath_t math_mode(int dt)
{
    if (dt == EM_F32)
        return em_get_float32_matmul_precision() == EM_MATMUL_HIGH ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    if (dt == EM_F16 || dt == EM_BF16) return (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    return CUBLAS_DEFAULT_MATH;
}

/* cuBLAS path for dtype @p dt; false when the layout or sizes do not fit
 * (caller falls back). */
template <typename T> bool mm_blas(const Geom &bg0, const MM &p0, const T *A, const T *B, T *C, int dt)
{
    MM p = p0;
    Geom bg = bg0;
    bool tc, ta, tb;
    int64_t ldc, lda, ldb;
    if (!blas_view(p.M, p.N, p.scm, p.scn, &tc, &ldc)) return false;
    if (tc) {
        /* C^T [N, M] = B^T [N, K] * A^T [K, M]: swap operands (and their batch strides). */
        MM q = {p.N, p.M, p.K, p.sbn, p.sbk, p.sak, p.sam, p.scn, p.scm};
        p = q;
        const T *t = A;
        A = B;
        B = t;
        for (int d = 0; d < kMaxDims; d++) {
            int64_t s = bg.st[0][d];
            bg.st[0][d] = bg.st[1][d];
            bg.st[1][d] = s;
        }
        if (!blas_view(p.M, p.N, p.scm, p.scn, &tc, &ldc) || tc) return false;
    }
    if (!blas_view(p.M, p.K, p.sam, p.sak, &ta, &lda)) return false;
    if (!blas_view(p.K, p.N, p.sbk, p.sbn, &tb, &ldb)) return false;

    /* Fold a broadcast-B batch into M: A and C stack their batches along M. */
    int64_t M = p.M;
    long long count = bg.n;
    const int nbd = bg.nd;
    if (count > 1 && nbd == 1 && bg.st[1][0] == 0 && !ta && bg.st[0][0] == p.M * lda && bg.st[2][0] == p.M * ldc) {
        M = p.M * count;
        count = 1;
    }
    if (M > INT_MAX || p.N > INT_MAX || p.K > INT_MAX) return false;

    cublasHandle_t h = starpu_cublas_get_local_handle();
    const cublasStatus_t mst = cublasSetMathMode(h, math_mode(dt));
    if (mst != CUBLAS_STATUS_SUCCESS) {
        report(mst, "matmul (cublasSetMathMode)");
        return true;
    }
    const cudaDataType ty = dt == EM_BF16 ? CUDA_R_16BF : CUDA_R_16F; /* used by the f16/bf16 gemm only */
    const cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (count == 1) {
        /* batch of one (or folded): plain gemm at batch element 0 */
        report(gemm_sb(T(), h, opB, opA, (int)p.N, (int)M, (int)p.K, B, (int)ldb, 0, A, (int)lda, 0, C, (int)ldc, 0, 1, ty),
               "matmul (cublas gemm)");
        return true;
    }
    /* Strided batched over the innermost coalesced batch dim, host loop over the rest. */
    const int64_t inner = bg.shape[nbd - 1];
    const long long sA = bg.st[0][nbd - 1], sB = bg.st[1][nbd - 1], sC = bg.st[2][nbd - 1];
    const long long outer = count / inner;
    for (long long o = 0; o < outer; o++) {
        long long offA = 0, offB = 0, offC = 0, r = o;
        for (int d = nbd - 2; d >= 0; d--) {
            long long c = r % bg.shape[d];
            r /= bg.shape[d];
            offA += c * bg.st[0][d];
            offB += c * bg.st[1][d];
            offC += c * bg.st[2][d];
        }
        for (long long i0 = 0; i0 < inner; i0 += INT_MAX) {
            const int cnt = (int)(inner - i0 < INT_MAX ? inner - i0 : INT_MAX);
            report(gemm_sb(T(), h, opB, opA, (int)p.N, (int)p.M, (int)p.K, B + offB + i0 * sB, (int)ldb, sB, A + offA + i0 * sA,
                           (int)lda, sA, C + offC + i0 * sC, (int)ldc, sC, cnt, ty),
                   "matmul (cublas gemm strided batched)");
        }
    }
    return true;
}

template <typename T, bool FP> void matmul_t(const em_kargs *k, void *buffers[])
{
    const em_tdesc &Ad = k->in[0], &Bd = k->in[1], &Cd = k->out[0];
    const int nd = Cd.ndim;
    MM p = {Cd.shape[nd - 2], Cd.shape[nd - 1], Ad.shape[nd - 1],
            Ad.strides[nd - 2], Ad.strides[nd - 1], Bd.strides[nd - 2], Bd.strides[nd - 1],
            Cd.strides[nd - 2], Cd.strides[nd - 1]};
    const int64_t *st[3] = {Ad.strides, Bd.strides, Cd.strides};
    Geom bg = make_geom(nd - 2, Cd.shape, 3, st);
    if (bg.n == 0 || p.M == 0 || p.N == 0) return;
    const T *A = (const T *)base(buffers, 0, Ad);
    const T *B = (const T *)base(buffers, 1, Bd);
    T *C = (T *)base(buffers, 2, Cd);
    if constexpr (FP) {
        if (p.K > 0 && mm_blas<T>(bg, p, A, B, C, Cd.dtype)) return;
    }
    mm_naive<T, FP>(bg, p, A, B, C, h16_of(Cd.dtype));
}

} // namespace

void em_cuda_matmul(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const em_tdesc &C = k->out[0];
    if (C.ndim < 2 || k->in[0].ndim != C.ndim || k->in[1].ndim != C.ndim || k->in[0].dtype != C.dtype ||
        k->in[1].dtype != C.dtype) {
        unsupported("matmul (operand ranks/dtypes)", k->kind);
        return;
    }
    switch (C.dtype) {
    case EM_F32: matmul_t<float, true>(k, buffers); break;
    case EM_F64: matmul_t<double, true>(k, buffers); break;
    case EM_F16:
    case EM_BF16: matmul_t<uint16_t, true>(k, buffers); break; /* both: the dtype picks the CUDA type at run time */
    case EM_I32: matmul_t<int32_t, false>(k, buffers); break;
    case EM_I64: matmul_t<int64_t, false>(k, buffers); break;
    case EM_U8: matmul_t<uint8_t, false>(k, buffers); break;
    default: unsupported("matmul (dtype)", C.dtype); break;
    }
}
