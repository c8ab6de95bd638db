/* GPU benchmarks on cuda:0, each next to its anchor in the same run:
 *   1. SGEMM through Ember (one StarPU task, cuBLAS) vs cublasSgemm called directly;
 *   2. element-wise add bandwidth vs the device-to-device copy bandwidth;
 *   3. per-op cost of a chain of tiny adds (task overhead);
 *   4. MLP 784-256-10 training step throughput (Adam, cross-entropy, random
 *      data) at batch 64 and 512, in f32 and under bf16 autocast — the
 *      PyTorch side is bench/mlp_torch_gpu.py.
 *   5. (index_add mode only) the embedding backward: em_index_add of
 *      src [N, C] into zeros [V, C] vs the former path (the index expanded
 *      to [N, C], then scatter_add), with a bit-equality check of the two.
 * Usage: bench_cuda [gemm sizes...]   (needs a CUDA device; prints ratios)
 *        bench_cuda mlp|mlp-f32|mlp-bf16   the MLP rows only (all, f32, bf16)
 *        bench_cuda index_add              the index_add rows only */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double ember_gemm(int64_t n, int reps)
{
    em_scope_begin();
    em_tensor *a = em_rand_uniform((int64_t[]){n, n}, 2, EM_F32, -1, 1);
    em_tensor *b = em_rand_uniform((int64_t[]){n, n}, 2, EM_F32, -1, 1);
    CK(a && b);
    em_tensor *w = em_matmul(a, b); /* warm-up: data moves to the GPU, cuBLAS initialises */
    CK(w);
    em_sync();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        em_scope_begin();
        double t0 = now();
        em_tensor *c = em_matmul(a, b);
        CK(c);
        em_sync();
        double t = now() - t0;
        if (t < best) best = t;
        em_scope_end();
    }
    em_scope_end();
    return 2.0 * (double)n * n * n / best / 1e12;
}

static double cublas_gemm(int64_t n, int reps)
{
    float *a, *b, *c;
    size_t bytes = sizeof(float) * (size_t)(n * n);
    cudaMalloc((void **)&a, bytes);
    cudaMalloc((void **)&b, bytes);
    cudaMalloc((void **)&c, bytes);
    cudaMemset(a, 0, bytes);
    cudaMemset(b, 0, bytes);
    cublasHandle_t h;
    cublasCreate(&h);
    const float one = 1, zero = 0;
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, a, (int)n, b, (int)n, &zero, c, (int)n);
    cudaDeviceSynchronize();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, a, (int)n, b, (int)n, &zero, c, (int)n);
        cudaDeviceSynchronize();
        double t = now() - t0;
        if (t < best) best = t;
    }
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 2.0 * (double)n * n * n / best / 1e12;
}

static void bandwidth(void)
{
    const int64_t n = (int64_t)1 << 28; /* 256 Mi floats = 1 GiB per tensor */
    size_t bytes = sizeof(float) * (size_t)n;
    float *x, *y;
    cudaMalloc((void **)&x, bytes);
    cudaMalloc((void **)&y, bytes);
    cudaMemcpy(y, x, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double best_copy = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        cudaMemcpy(y, x, bytes, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        double t = now() - t0;
        if (t < best_copy) best_copy = t;
    }
    cudaFree(x);
    cudaFree(y);
    double copy_bw = 2.0 * (double)bytes / best_copy / 1e12;

    em_scope_begin();
    em_tensor *a = em_rand_uniform((int64_t[]){n}, 1, EM_F32, 0, 1);
    em_tensor *b = em_rand_uniform((int64_t[]){n}, 1, EM_F32, 0, 1);
    CK(em_add(a, b));
    em_sync();
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        em_scope_begin();
        double t0 = now();
        CK(em_add(a, b));
        em_sync();
        double t = now() - t0;
        if (t < best) best = t;
        em_scope_end();
    }
    em_scope_end();
    double add_bw = 3.0 * (double)bytes / best / 1e12;
    printf("elementwise add, %lld floats: Ember %.2f TB/s, device copy %.2f TB/s, fraction %.2f\n", (long long)n, add_bw,
           copy_bw, add_bw / copy_bw);
}

static void per_op(void)
{
    const int N = 5000;
    em_scope_begin();
    em_tensor *x = em_ones((int64_t[]){16}, 1, EM_F32);
    em_tensor *one = em_ones((int64_t[]){16}, 1, EM_F32);
    em_sync();
    double t0 = now();
    for (int i = 0; i < N; i++) {
        em_tensor *y = em_add(x, one);
        em_keep(y); /* hold only the chain head */
        x = y;
    }
    em_sync();
    double t = now() - t0;
    em_scope_end();
    printf("per-op cost (chain of %d tiny adds on cuda:0): %.1f us/op (bare CUDA launch anchor: 3.6 us)\n", N, t / N * 1e6);
}

/* bf16: the forward and loss under em_autocast_begin(EM_BF16), f32 weights
 * (bench/mlp_torch_gpu.py's bf16 rows: torch.autocast). */
static void mlp(int64_t batch, int steps, bool bf16)
{
    em_module *m;
    em_optim *opt;
    bench_mlp_new(784, 256, 10, &m, &opt);
    em_tensor *x = em_rand_normal((int64_t[]){batch, 784}, 2, EM_F32, 0, 1);
    em_tensor *yf = em_rand_uniform((int64_t[]){batch}, 1, EM_F32, 0, 10);
    em_tensor *y = em_cast(em_floor(yf), EM_I64);
    CK(x && y);
    double t0 = 0;
    for (int s = 0; s < steps + 20; s++) {
        if (s == 20) {
            em_sync();
            t0 = now();
        }
        bench_mlp_step(m, opt, x, y, bf16 ? EM_BF16 : -1);
    }
    em_sync();
    double t = now() - t0;
    printf("MLP 784-256-10 training%s, batch %lld: Ember %.0f samples/s (%.1f us/step)\n", bf16 ? " bf16 autocast" : "",
           (long long)batch, (double)batch * steps / t, t / steps * 1e6);
    em_optim_free(opt);
    em_module_free(m);
}

/* Microseconds per call of 20 calls issued back to back (one sync):
 * em_index_add (old = false) or the expanded index + scatter_add. */
static double time_embedding_bw(const em_tensor *self, const em_tensor *idx, const em_tensor *src, bool old)
{
    const int reps = 20;
    const int64_t N = em_tensor_shape(src)[0], C = em_tensor_shape(src)[1];
    em_sync();
    double t0 = now();
    em_scope_begin();
    for (int r = 0; r < reps; r++) {
        if (old)
            CK(em_scatter_add(self, 0, em_contiguous(em_expand(em_reshape(idx, (int64_t[]){N, 1}, 2), (int64_t[]){N, C}, 2)), src));
        else
            CK(em_index_add(self, 0, idx, src));
    }
    em_sync();
    double t = now() - t0;
    em_scope_end();
    return t / reps * 1e6;
}

static void index_add_rows(int64_t V, int64_t N, int64_t C)
{
    em_scope_begin();
    em_tensor *self = em_zeros((int64_t[]){V, C}, 2, EM_F32);
    em_tensor *src = em_rand_uniform((int64_t[]){N, C}, 2, EM_F32, -1, 1);
    em_tensor *idx = em_cast(em_floor(em_rand_uniform((int64_t[]){N}, 1, EM_F32, 0, (double)V)), EM_I64);
    CK(self && src && idx);
    em_tensor *ie = em_contiguous(em_expand(em_reshape(idx, (int64_t[]){N, 1}, 2), (int64_t[]){N, C}, 2));
    em_tensor *a = em_index_add(self, 0, idx, src), *b = em_scatter_add(self, 0, ie, src); /* warm-up */
    CK(a && b);
    size_t bytes = sizeof(float) * (size_t)(V * C);
    float *ha = malloc(bytes), *hb = malloc(bytes);
    CK(ha && hb && em_to_host(a, ha, bytes) == EM_OK && em_to_host(b, hb, bytes) == EM_OK);
    const bool same = !memcmp(ha, hb, bytes);
    free(ha);
    free(hb);
    const double t_ia = time_embedding_bw(self, idx, src, false), t_old = time_embedding_bw(self, idx, src, true);
    printf("index_add V %lld, N %lld, C %lld (f32, dim 0): %.1f us/call; expanded index + scatter_add %.1f us/call "
           "(ratio %.1f); results %s\n",
           (long long)V, (long long)N, (long long)C, t_ia, t_old, t_old / t_ia, same ? "bit-identical" : "DIFFER");
    em_scope_end();
}

int main(int argc, char **argv)
{
    em_config cfg = em_config_default();
    cfg.device = "cuda:0";
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_cuda: %s\n", em_last_error());
        return 1;
    }
    int64_t sizes[8] = {2048, 4096, 8192};
    int ns = 3;
    const char *mlp_only = NULL; /* "all", "f32", "bf16": the MLP rows only */
    if (argc > 1 && !strcmp(argv[1], "index_add")) {
        index_add_rows(256, 16384, 384);
        index_add_rows(50257, 16384, 768);
        em_shutdown();
        return 0;
    }
    if (argc > 1 && !strncmp(argv[1], "mlp", 3)) {
        mlp_only = !strcmp(argv[1], "mlp-f32") ? "f32" : !strcmp(argv[1], "mlp-bf16") ? "bf16" : "all";
        ns = 0;
    } else if (argc > 1) {
        ns = 0;
        for (int i = 1; i < argc && ns < 8; i++) sizes[ns++] = atoll(argv[i]);
    }
    for (int i = 0; i < ns; i++) {
        double e = ember_gemm(sizes[i], 5), c = cublas_gemm(sizes[i], 5);
        printf("SGEMM %lld^3: Ember %.1f TFLOP/s, cuBLAS direct %.1f TFLOP/s, ratio %.3f\n", (long long)sizes[i], e, c, e / c);
    }
    if (!mlp_only) {
        bandwidth();
        per_op();
    }
    for (int h = 0; h < 2; h++) {
        if (mlp_only && ((h == 0 && !strcmp(mlp_only, "bf16")) || (h == 1 && !strcmp(mlp_only, "f32")))) continue;
        mlp(64, 500, h == 1);
        mlp(512, 300, h == 1);
    }
    em_shutdown();
    return 0;
}
