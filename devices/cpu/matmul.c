/* CPU kernel for EM_OP_MATMUL.
 *
 *   out[b..., M, N] = sum_k A[b..., M, k] * B[b..., k, N]
 *
 * Operands (kargs, all three of the same rank nd >= 2, one dtype):
 *   in[0]  A  [batch..., M, K]   batch dims may be broadcast (stride 0)
 *   in[1]  B  [batch..., K, N]   idem
 *   out[0] C  [batch..., M, N]   rows of N contiguous (the matmul front end
 *                                gives a fresh contiguous tensor or a tile of it)
 * Offsets and strides are in elements from the start of each StarPU buffer.
 *
 * f32/f64 go to OpenBLAS (cblas_sgemm/cblas_dgemm, one thread inside the
 * worker: em_init sets openblas_set_num_threads(1)). A matrix is handed to
 * BLAS as it is when one of its two dims is unit-stride (row-major NoTrans
 * with lda = row stride, or Trans with lda = column stride); the front end
 * copies anything else first, and this kernel still has a plain strided loop
 * for the odd layout it might receive. i32/i64/u8 use a triple loop with an
 * int64 accumulator (wrapping on the final store, like torch); f16/bf16 are
 * converted to f32 for sgemm and rounded once (gemm_half). K == 0 gives
 * zeros; M == 0 or N == 0 does nothing. */
#include "devices/cpu/cpu.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Describes the strided [rows, cols] matrix (row stride sr, col stride sc) to
 * row-major BLAS: NoTrans when rows are unit-stride along cols (ld = sr), Trans
 * when it is stored column by column (ld = sc). Size-1 dims accept any stride.
 * false when BLAS cannot take it (both strides > 1, overlapping, broadcast) or
 * when ld does not fit BLAS's int. */
static bool blas_view(int64_t rows, int64_t cols, int64_t sr, int64_t sc, enum CBLAS_TRANSPOSE *tr, int64_t *ld)
{
    if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= max64(cols, 1))) {
        *tr = CblasNoTrans;
        *ld = rows <= 1 ? max64(cols, 1) : sr;
    } else if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= max64(rows, 1))) {
        *tr = CblasTrans;
        *ld = cols <= 1 ? max64(rows, 1) : sc;
    } else {
        return false;
    }
    return *ld <= INT_MAX;
}

/* One strided matrix product, M x K times K x N. Pointers are already at
 * element (0, 0) of each matrix. */
typedef struct mm {
    int64_t M, N, K;
    const char *a, *b;
    char *c;
    int64_t sam, sak, sbk, sbn, scm, scn;
} mm;

static void zero_out(const mm *p, size_t es)
{
    for (int64_t i = 0; i < p->M; i++)
        for (int64_t j = 0; j < p->N; j++) memset(p->c + (i * p->scm + j * p->scn) * (int64_t)es, 0, es);
}

/* Fallback for layouts BLAS cannot take: double accumulation. */
#define NAIVE_FLOAT(T)                                                                        \
    static void naive_##T(const mm *p)                                                        \
    {                                                                                         \
        const T *a = (const T *)p->a, *b = (const T *)p->b;                                   \
        T *c = (T *)p->c;                                                                     \
        for (int64_t i = 0; i < p->M; i++)                                                    \
            for (int64_t j = 0; j < p->N; j++) {                                              \
                double s = 0;                                                                 \
                for (int64_t q = 0; q < p->K; q++) s += (double)a[i * p->sam + q * p->sak] * (double)b[q * p->sbk + j * p->sbn]; \
                c[i * p->scm + j * p->scn] = (T)s;                                            \
            }                                                                                 \
    }
NAIVE_FLOAT(float)
NAIVE_FLOAT(double)

#define NAIVE_INT(T)                                                                          \
    static void naive_##T(const mm *p)                                                        \
    {                                                                                         \
        const T *a = (const T *)p->a, *b = (const T *)p->b;                                   \
        T *c = (T *)p->c;                                                                     \
        for (int64_t i = 0; i < p->M; i++)                                                    \
            for (int64_t j = 0; j < p->N; j++) {                                              \
                uint64_t s = 0; /* int64 arithmetic, wrapping without UB */                   \
                for (int64_t q = 0; q < p->K; q++)                                            \
                    s += (uint64_t)(int64_t)a[i * p->sam + q * p->sak] * (uint64_t)(int64_t)b[q * p->sbk + j * p->sbn]; \
                c[i * p->scm + j * p->scn] = (T)s;                                            \
            }                                                                                 \
    }
NAIVE_INT(int32_t)
NAIVE_INT(int64_t)
NAIVE_INT(uint8_t)

/* Float product through BLAS when the layouts allow it. Row-major C must be
 * unit-stride along N; a column-major C is handled as C^T = B^T A^T. */
static bool gemm_blas(int dt, const mm *p0)
{
    mm p = *p0;
    enum CBLAS_TRANSPOSE tc, ta, tb;
    int64_t ldc, lda, ldb;
    if (!blas_view(p.M, p.N, p.scm, p.scn, &tc, &ldc)) return false;
    if (tc == CblasTrans) {
        /* C^T [N, M] = B^T [N, K] * A^T [K, M] */
        mm q = {.M = p.N, .N = p.M, .K = p.K, .a = p.b, .b = p.a, .c = p.c,
                .sam = p.sbn, .sak = p.sbk, .sbk = p.sak, .sbn = p.sam, .scm = p.scn, .scn = p.scm};
        p = q;
        if (!blas_view(p.M, p.N, p.scm, p.scn, &tc, &ldc) || tc != CblasNoTrans) return false;
    }
    if (!blas_view(p.M, p.K, p.sam, p.sak, &ta, &lda)) return false;
    if (!blas_view(p.K, p.N, p.sbk, p.sbn, &tb, &ldb)) return false;
    if (p.M > INT_MAX || p.N > INT_MAX || p.K > INT_MAX || ldc > INT_MAX) return false;
    if (dt == EM_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (int)p.M, (int)p.N, (int)p.K, 1.0f, (const float *)p.a, (int)lda,
                    (const float *)p.b, (int)ldb, 0.0f, (float *)p.c, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (int)p.M, (int)p.N, (int)p.K, 1.0, (const double *)p.a, (int)lda,
                    (const double *)p.b, (int)ldb, 0.0, (double *)p.c, (int)ldc);
    return true;
}

/* f16 / bf16: each matrix converted to a contiguous f32 copy, cblas_sgemm
 * (f32 accumulation), the result rounded once into C — the values of the
 * f32 product of the widened inputs (no bf16 GEMM in Debian's OpenBLAS
 * 0.3.21: it has no cblas_sbgemm). */
static void gemm_half(int dt, const mm *p)
{
    const int64_t M = p->M, N = p->N, K = p->K;
    float *a = malloc(sizeof(float) * (size_t)(M * K + K * N + M * N));
    if (!a) {
        em__kernel_error(NULL, EM_ERR_NOMEM, "matmul: no memory for the f32 copies of a %lldx%lld by %lldx%lld %s product",
                         (long long)M, (long long)K, (long long)K, (long long)N, em_dtype_name((em_dtype)dt));
        return;
    }
    float *b = a + M * K, *c = b + K * N;
    const uint16_t *A = (const uint16_t *)p->a, *B = (const uint16_t *)p->b;
    uint16_t *C = (uint16_t *)p->c;
    for (int64_t i = 0; i < M; i++)
        for (int64_t q = 0; q < K; q++) a[i * K + q] = em_cpu_half_load(dt, A[i * p->sam + q * p->sak]);
    for (int64_t q = 0; q < K; q++)
        for (int64_t j = 0; j < N; j++) b[q * N + j] = em_cpu_half_load(dt, B[q * p->sbk + j * p->sbn]);
    mm f = {.M = M, .N = N, .K = K, .a = (const char *)a, .b = (const char *)b, .c = (char *)c,
            .sam = K, .sak = 1, .sbk = N, .sbn = 1, .scm = N, .scn = 1};
    if (!gemm_blas(EM_F32, &f)) naive_float(&f);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * p->scm + j * p->scn] = em_cpu_half_store(dt, c[i * N + j]);
    free(a);
}

static void mm_one(int dt, const mm *p)
{
    if (p->M == 0 || p->N == 0) return;
    if (p->K == 0) {
        zero_out(p, em_cpu_dtype_size(dt));
        return;
    }
    switch (dt) {
    case EM_F32: if (!gemm_blas(dt, p)) naive_float(p); break;
    case EM_F64: if (!gemm_blas(dt, p)) naive_double(p); break;
    case EM_I32: naive_int32_t(p); break;
    case EM_I64: naive_int64_t(p); break;
    case EM_U8: naive_uint8_t(p); break;
    case EM_F16:
    case EM_BF16: gemm_half(dt, p); break;
    default: em_cpu_bad_kind("matmul (dtype)", dt);
    }
}

void em_cpu_matmul(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *A = &k->in[0], *B = &k->in[1], *C = &k->out[0];
    const int nd = C->ndim;
    if (nd < 2 || A->ndim != nd || B->ndim != nd || A->dtype != C->dtype || B->dtype != C->dtype) {
        em_cpu_bad_kind("matmul (operand ranks/dtypes)", k->kind);
        return;
    }
    const int dt = C->dtype;
    const int64_t es = (int64_t)em_cpu_dtype_size(dt);
    const char *pa = em_cpu_ptr(buffers[0]);
    const char *pb = em_cpu_ptr(buffers[1]);
    char *pc = em_cpu_ptr(buffers[2]);

    mm p = {.M = C->shape[nd - 2], .N = C->shape[nd - 1], .K = A->shape[nd - 1],
            .sam = A->strides[nd - 2], .sak = A->strides[nd - 1],
            .sbk = B->strides[nd - 2], .sbn = B->strides[nd - 1],
            .scm = C->strides[nd - 2], .scn = C->strides[nd - 1]};
    const int nb = nd - 2;
    int64_t nbatch = 1;
    for (int d = 0; d < nb; d++) nbatch *= C->shape[d];
    if (nbatch == 0 || p.M == 0 || p.N == 0) return;

    /* Odometer over the batch dims. */
    int64_t idx[EM_KARGS_MAX_DIMS] = {0};
    int64_t oa = A->offset, ob = B->offset, oc = C->offset;
    for (int64_t it = 0; it < nbatch; it++) {
        p.a = pa + oa * es;
        p.b = pb + ob * es;
        p.c = pc + oc * es;
        mm_one(dt, &p);
        for (int d = nb - 1; d >= 0; d--) {
            if (++idx[d] < C->shape[d]) {
                oa += A->strides[d];
                ob += B->strides[d];
                oc += C->strides[d];
                break;
            }
            oa -= A->strides[d] * (C->shape[d] - 1);
            ob -= B->strides[d] * (C->shape[d] - 1);
            oc -= C->strides[d] * (C->shape[d] - 1);
            idx[d] = 0;
        }
    }
}
