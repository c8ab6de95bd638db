/* 16-bit and TF32 GEMMs on cuda:0 through Ember next to cuBLAS called
 * directly, and the bf16 element-wise bandwidth next to a device copy.
 *
 *   bench_gemm_half [sizes...]        (default 4096 8192; needs a CUDA device)
 *
 * GEMM rows: C = A·B, square n×n×n, for bf16 and f16 (A, B, C of that type,
 * f32 accumulation) and TF32 (f32 A, B, C with
 * em_set_float32_matmul_precision(EM_MATMUL_HIGH)). The Ember side times G
 * em_matmul calls (one StarPU task each, G = 20 at n <= 4096, else 5)
 * submitted back to back and one em_sync, on the host clock; the direct side
 * times G cublasGemmEx calls of the same types, operand order and math mode
 * (CUBLAS_COMPUTE_32F; 16-bit: default math without reduced-precision
 * reductions, as devices/cuda/matmul.cu; TF32: CUBLAS_COMPUTE_32F_FAST_TF32)
 * between two cudaEvents, on the same data. Both warm up first, then 5
 * rounds alternate which side goes first; a row prints the median and range
 * of the TFLOP/s (2n³ flops per GEMM) of each side and the ratio of the
 * medians (Ember / direct).
 *
 * Checks (once per dtype at the first size, printed as "check"): Ember's C
 * against the direct C (max |diff|; 0 when cuBLAS picks the same algorithm
 * for both), and against an f32 GEMM (EM_MATMUL_HIGHEST) of the same
 * (rounded) inputs: max |diff| / max |C_f32|, about 2^-9 for bf16 and 2^-11
 * for f16 (the rounding of C), and for TF32 clearly above the FP32 level
 * (1e-6) — below it, TF32 did not run.
 *
 * Bandwidth row: bf16 em_add(a, b) of 256 MiB per operand (8 adds per
 * timing, one em_sync), GB/s = (2 read + 1 written) × 256 MiB / time, against
 * cudaMemcpy device-to-device of 256 MiB (GB/s = 2 × 256 MiB / time, event
 * timing), 5 alternating rounds, medians and their fraction.
 *
 * Device memory: at most about 3 GiB (8192² f32: A, B, 5 outputs on the
 * Ember side, A, B, C direct). */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 5

#define CU(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)
#define CB(x)                                                                    \
    do {                                                                         \
        cublasStatus_t s_ = (x);                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                       \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

typedef struct {
    const char *name;
    em_dtype dt;      /* Ember dtype of A, B, C */
    cudaDataType ty;  /* the same for cuBLAS */
    bool tf32;        /* f32 with EM_MATMUL_HIGH */
} gemm_kind;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n, double *lo, double *hi)
{
    double s[ROUNDS * 4];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    *lo = s[0];
    *hi = s[n - 1];
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* ---- direct cuBLAS ------------------------------------------------------------ */

typedef struct {
    cublasHandle_t h;
    cudaEvent_t e0, e1;
    void *A, *B, *C;
    int n;
    const gemm_kind *k;
} direct;

/* Row-major C = A·B as Ember runs it: column-major C^T = B^T A^T. */
static void direct_gemm(const direct *d)
{
    const float one = 1.0f, zero = 0.0f;
    const cublasComputeType_t ct = d->k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CB(cublasGemmEx(d->h, CUBLAS_OP_N, CUBLAS_OP_N, d->n, d->n, d->n, &one, d->B, d->k->ty, d->n, d->A, d->k->ty, d->n, &zero,
                    d->C, d->k->ty, d->n, ct, CUBLAS_GEMM_DEFAULT));
}

static double direct_round(const direct *d, int g)
{
    CU(cudaEventRecord(d->e0, 0));
    for (int i = 0; i < g; i++) direct_gemm(d);
    CU(cudaEventRecord(d->e1, 0));
    CU(cudaEventSynchronize(d->e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, d->e0, d->e1));
    return 2.0 * (double)d->n * d->n * d->n * g / (ms * 1e-3) / 1e12;
}

/* ---- Ember -------------------------------------------------------------------- */

static double ember_round(em_tensor *a, em_tensor *b, int64_t n, int g)
{
    em_scope_begin();
    double t0 = now();
    for (int i = 0; i < g; i++) CK(em_matmul(a, b));
    CK(em_sync() == EM_OK);
    double t = now() - t0;
    em_scope_end();
    return 2.0 * (double)n * n * n * g / t / 1e12;
}

/* max |x| of a tensor of any float dtype, as a double */
static double max_abs(const em_tensor *x)
{
    em_scope_begin();
    double v = 0;
    CK(em_item(em_max(em_abs(em_cast(x, EM_F32)), NULL, 0, false), &v) == EM_OK);
    em_scope_end();
    return v;
}

static void check(const gemm_kind *k, em_tensor *a, em_tensor *b, const direct *d, int64_t n)
{
    em_scope_begin();
    em_tensor *c = em_matmul(a, b);
    CK(c);
    CK(em_sync() == EM_OK); /* a kernel reads the precision setting when it runs */
    /* the direct C, brought into Ember */
    direct_gemm(d);
    CU(cudaDeviceSynchronize());
    size_t bytes = (size_t)(n * n) * em_dtype_size(k->dt);
    void *host = malloc(bytes);
    CK(host);
    CU(cudaMemcpy(host, d->C, bytes, cudaMemcpyDeviceToHost));
    em_tensor *cd = em_from_host(host, (int64_t[]){n, n}, 2, k->dt);
    free(host);
    CK(cd);
    double vs_direct = max_abs(em_sub(em_cast(c, EM_F32), em_cast(cd, EM_F32)));
    /* f32 reference of the same inputs, full FP32 */
    em_matmul_precision keep = em_get_float32_matmul_precision();
    em_set_float32_matmul_precision(EM_MATMUL_HIGHEST);
    em_tensor *ref = em_matmul(em_cast(a, EM_F32), em_cast(b, EM_F32));
    CK(ref);
    CK(em_sync() == EM_OK);
    double rel = max_abs(em_sub(em_cast(c, EM_F32), ref)) / max_abs(ref);
    em_set_float32_matmul_precision(keep);
    const char *expect = k->tf32 ? "TF32: > 1e-6 and < 5e-3" : k->dt == EM_BF16 ? "< 1e-2" : "< 2e-3";
    bool ok = k->tf32 ? rel > 1e-6 && rel < 5e-3 : rel < (k->dt == EM_BF16 ? 1e-2 : 2e-3);
    printf("check %s %lld^3: Ember vs direct max|diff| %.3g; vs f32 GEMM max|diff|/max|C| %.3g (expect %s) %s\n", k->name,
           (long long)n, vs_direct, rel, expect, ok ? "ok" : "FAILED");
    em_scope_end();
}

static void gemm_row(const gemm_kind *k, int64_t n, bool do_check)
{
    const int g = n <= 4096 ? 20 : 5;
    em_scope_begin();
    em_manual_seed(1);
    em_tensor *a = em_cast(em_rand_uniform((int64_t[]){n, n}, 2, EM_F32, -1, 1), k->dt);
    em_tensor *b = em_cast(em_rand_uniform((int64_t[]){n, n}, 2, EM_F32, -1, 1), k->dt);
    CK(a && b);
    CK(em_sync() == EM_OK);

    direct d = {.n = (int)n, .k = k};
    size_t bytes = (size_t)(n * n) * em_dtype_size(k->dt);
    CU(cudaMalloc(&d.A, bytes));
    CU(cudaMalloc(&d.B, bytes));
    CU(cudaMalloc(&d.C, bytes));
    void *host = malloc(bytes);
    CK(host);
    CK(em_to_host(a, host, bytes) == EM_OK);
    CU(cudaMemcpy(d.A, host, bytes, cudaMemcpyHostToDevice));
    CK(em_to_host(b, host, bytes) == EM_OK);
    CU(cudaMemcpy(d.B, host, bytes, cudaMemcpyHostToDevice));
    free(host);
    CB(cublasCreate(&d.h));
    CB(cublasSetMathMode(d.h, k->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                      : k->dt == EM_F32 ? CUBLAS_DEFAULT_MATH
                                                        : (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    CU(cudaEventCreate(&d.e0));
    CU(cudaEventCreate(&d.e1));

    em_matmul_precision keep = em_get_float32_matmul_precision();
    em_set_float32_matmul_precision(k->tf32 ? EM_MATMUL_HIGH : EM_MATMUL_HIGHEST);
    /* warm-up: cuBLAS heuristics, StarPU's allocation cache for the outputs */
    ember_round(a, b, n, g);
    direct_round(&d, g);
    if (do_check) check(k, a, b, &d, n);
    double te[ROUNDS], td[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        if (r % 2 == 0) {
            te[r] = ember_round(a, b, n, g);
            td[r] = direct_round(&d, g);
        } else {
            td[r] = direct_round(&d, g);
            te[r] = ember_round(a, b, n, g);
        }
    }
    em_set_float32_matmul_precision(keep);
    double elo, ehi, dlo, dhi;
    double em = median(te, ROUNDS, &elo, &ehi), dm = median(td, ROUNDS, &dlo, &dhi);
    printf("GEMM %-4s %5lld^3: Ember %6.1f TFLOP/s [%.1f-%.1f], cuBLAS direct %6.1f [%.1f-%.1f], ratio %.3f (%d rounds of %d GEMMs)\n",
           k->name, (long long)n, em, elo, ehi, dm, dlo, dhi, em / dm, ROUNDS, g);
    fflush(stdout);

    CU(cudaEventDestroy(d.e0));
    CU(cudaEventDestroy(d.e1));
    CB(cublasDestroy(d.h));
    CU(cudaFree(d.A));
    CU(cudaFree(d.B));
    CU(cudaFree(d.C));
    em_scope_end();
}

/* ---- bandwidth ------------------------------------------------------------------ */

static void bandwidth(void)
{
    const size_t bytes = (size_t)256 << 20; /* per operand */
    const int64_t n = (int64_t)(bytes / 2);
    const int g = 8;
    em_scope_begin();
    em_tensor *a = em_rand_uniform((int64_t[]){n}, 1, EM_BF16, -1, 1);
    em_tensor *b = em_rand_uniform((int64_t[]){n}, 1, EM_BF16, -1, 1);
    CK(a && b);
    void *x, *y;
    CU(cudaMalloc(&x, bytes));
    CU(cudaMalloc(&y, bytes));
    CU(cudaMemset(x, 1, bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double te[ROUNDS], tc[ROUNDS];
    for (int r = -1; r < ROUNDS; r++) { /* r = -1: warm-up */
        for (int side = 0; side < 2; side++) {
            if ((side == 0) == (r % 2 == 0 || r < 0)) {
                em_scope_begin();
                double t0 = now();
                for (int i = 0; i < g; i++) CK(em_add(a, b));
                CK(em_sync() == EM_OK);
                double t = now() - t0;
                em_scope_end();
                if (r >= 0) te[r] = 3.0 * (double)bytes * g / t / 1e9;
            } else {
                CU(cudaEventRecord(e0, 0));
                for (int i = 0; i < g; i++) CU(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, 0));
                CU(cudaEventRecord(e1, 0));
                CU(cudaEventSynchronize(e1));
                float ms = 0;
                CU(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 0) tc[r] = 2.0 * (double)bytes * g / (ms * 1e-3) / 1e9;
            }
        }
    }
    double elo, ehi, clo, chi;
    double em = median(te, ROUNDS, &elo, &ehi), cm = median(tc, ROUNDS, &clo, &chi);
    printf("elementwise bf16 add, 256 MiB per operand: Ember %.0f GB/s [%.0f-%.0f], cudaMemcpy D2D %.0f GB/s [%.0f-%.0f], "
           "fraction %.3f (%d rounds of %d)\n",
           em, elo, ehi, cm, clo, chi, em / cm, ROUNDS, g);
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    CU(cudaFree(x));
    CU(cudaFree(y));
    em_scope_end();
}

int main(int argc, char **argv)
{
    em_config cfg = em_config_default();
    cfg.device = "cuda:0";
    if (em_init(&cfg) != EM_OK || em_set_device(em_device_cuda(0)) != EM_OK) { /* cuda:0 even under EMBER_DEVICE=cpu */
        fprintf(stderr, "bench_gemm_half: %s\n", em_last_error());
        return 1;
    }
    int64_t sizes[8] = {4096, 8192};
    int ns = 2;
    if (argc > 1) {
        ns = 0;
        for (int i = 1; i < argc && ns < 8; i++) sizes[ns++] = atoll(argv[i]);
    }
    static const gemm_kind kinds[] = {
        {"bf16", EM_BF16, CUDA_R_16BF, false},
        {"f16", EM_F16, CUDA_R_16F, false},
        {"tf32", EM_F32, CUDA_R_32F, true},
    };
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < ns; i++) gemm_row(&kinds[k], sizes[i], i == 0);
    bandwidth();
    em_shutdown();
    return 0;
}
