/* One convolution layer, forward + backward (data and weight gradients),
 * through Ember (three StarPU tasks on cuda:0, cuDNN inside) against cuDNN
 * called directly on the same device (the fastest algorithm of each pass by
 * cudnnFind*, a workspace big enough for it), in one run, alternating the
 * two sides. f32, NCHW, TF32 off on both sides (EMBER_TF32 unset).
 *
 * Usage: bench_conv_cuda [N C H W O K stride pad] (default: 256 128 16 16
 *        128 3 1 1, a ResNet-18 layer at CIFAR size). Prints the median and
 *        the range of 5 rounds of 20 iterations per side. */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DNN(x)                                                                                         \
    do {                                                                                               \
        cudnnStatus_t s_ = (x);                                                                        \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                              \
            fprintf(stderr, "bench_conv_cuda: %s: %s\n", #x, cudnnGetErrorString(s_));                 \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)
#define CU(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "bench_conv_cuda: %s: %s\n", #x, cudaGetErrorString(e_));                  \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static int64_t N = 256, C = 128, H = 16, W = 16, O = 128, K = 3, S = 1, P = 1;

static double ember_round(int iters)
{
    em_scope_begin();
    em_tensor *x = em_rand_normal((int64_t[]){N, C, H, W}, 4, EM_F32, 0, 1);
    em_tensor *w = em_rand_normal((int64_t[]){O, C, K, K}, 4, EM_F32, 0, 0.05);
    CK(x && w && em_set_requires_grad(x, true) == EM_OK && em_set_requires_grad(w, true) == EM_OK);
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = o.stride[1] = S;
    o.padding[0] = o.padding[1] = P;
    em_tensor *y0 = em_conv2d(x, w, NULL, &o);
    CK(y0);
    em_tensor *dy = em_rand_normal(em_tensor_shape(y0), 4, EM_F32, 0, 1);
    CK(dy);
    double t0 = 0;
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) {
            CK(em_sync() == EM_OK);
            t0 = now();
        }
        em_scope_begin();
        em_tensor *y = em_conv2d(x, w, NULL, &o);
        /* backward of sum(y * dy): dy is the output gradient (the mul and the
         * sum run too: timed separately below and subtracted) */
        em_grads *g = em_backward(em_sum_all(em_mul(y, dy)));
        CK(g);
        em_grads_free(g);
        em_scope_end();
    }
    CK(em_sync() == EM_OK);
    double t = (now() - t0) / iters;
    /* the loss part alone (mul, sum, and their backward: a mul by dy) */
    em_tensor *yc = em_rand_normal(em_tensor_shape(y0), 4, EM_F32, 0, 1);
    CK(yc && em_set_requires_grad(yc, true) == EM_OK);
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) {
            CK(em_sync() == EM_OK);
            t0 = now();
        }
        em_scope_begin();
        em_grads *g = em_backward(em_sum_all(em_mul(yc, dy)));
        CK(g);
        em_grads_free(g);
        em_scope_end();
    }
    CK(em_sync() == EM_OK);
    double tl = (now() - t0) / iters;
    em_scope_end();
    return t - tl;
}

typedef struct direct {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnConvolutionFwdAlgo_t fa;
    cudnnConvolutionBwdDataAlgo_t da;
    cudnnConvolutionBwdFilterAlgo_t fla;
    float *x, *w, *y, *dx, *dw, *dy;
    void *ws;
    size_t wsb;
} direct;

static void direct_init(direct *d)
{
    memset(d, 0, sizeof *d);
    DNN(cudnnCreate(&d->h));
    DNN(cudnnCreateTensorDescriptor(&d->xd));
    DNN(cudnnCreateTensorDescriptor(&d->yd));
    DNN(cudnnCreateFilterDescriptor(&d->wd));
    DNN(cudnnCreateConvolutionDescriptor(&d->cd));
    const int64_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    DNN(cudnnSetTensor4dDescriptor(d->xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)N, (int)C, (int)H, (int)W));
    DNN(cudnnSetTensor4dDescriptor(d->yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)N, (int)O, (int)OH, (int)OW));
    DNN(cudnnSetFilter4dDescriptor(d->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)O, (int)C, (int)K, (int)K));
    DNN(cudnnSetConvolution2dDescriptor(d->cd, (int)P, (int)P, (int)S, (int)S, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(d->cd, CUDNN_FMA_MATH)); /* no TF32, as Ember without EMBER_TF32 */
    size_t nx = (size_t)(N * C * H * W), nw = (size_t)(O * C * K * K), ny = (size_t)(N * O * OH * OW);
    CU(cudaMalloc((void **)&d->x, nx * 4));
    CU(cudaMalloc((void **)&d->dx, nx * 4));
    CU(cudaMalloc((void **)&d->w, nw * 4));
    CU(cudaMalloc((void **)&d->dw, nw * 4));
    CU(cudaMalloc((void **)&d->y, ny * 4));
    CU(cudaMalloc((void **)&d->dy, ny * 4));
    CU(cudaMemset(d->x, 0, nx * 4));
    CU(cudaMemset(d->w, 0, nw * 4));
    CU(cudaMemset(d->dy, 0, ny * 4));
    d->wsb = (size_t)512 << 20;
    CU(cudaMalloc(&d->ws, d->wsb));
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fp;
    DNN(cudnnFindConvolutionForwardAlgorithmEx(d->h, d->xd, d->x, d->wd, d->w, d->cd, d->yd, d->y, 1, &got, &fp, d->ws, d->wsb));
    d->fa = fp.algo;
    cudnnConvolutionBwdDataAlgoPerf_t dp;
    DNN(cudnnFindConvolutionBackwardDataAlgorithmEx(d->h, d->wd, d->w, d->yd, d->dy, d->cd, d->xd, d->dx, 1, &got, &dp, d->ws,
                                                   d->wsb));
    d->da = dp.algo;
    cudnnConvolutionBwdFilterAlgoPerf_t wp;
    DNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(d->h, d->xd, d->x, d->yd, d->dy, d->cd, d->wd, d->dw, 1, &got, &wp, d->ws,
                                                     d->wsb));
    d->fla = wp.algo;
}

static double direct_round(direct *d, int iters)
{
    const float one = 1, zero = 0;
    double t0 = 0;
    for (int i = 0; i < iters + 3; i++) {
        if (i == 3) {
            CU(cudaDeviceSynchronize());
            t0 = now();
        }
        DNN(cudnnConvolutionForward(d->h, &one, d->xd, d->x, d->wd, d->w, d->cd, d->fa, d->ws, d->wsb, &zero, d->yd, d->y));
        DNN(cudnnConvolutionBackwardFilter(d->h, &one, d->xd, d->x, d->yd, d->dy, d->cd, d->fla, d->ws, d->wsb, &zero, d->wd,
                                           d->dw));
        DNN(cudnnConvolutionBackwardData(d->h, &one, d->wd, d->w, d->yd, d->dy, d->cd, d->da, d->ws, d->wsb, &zero, d->xd,
                                         d->dx));
    }
    CU(cudaDeviceSynchronize());
    return (now() - t0) / iters;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc == 9) {
        N = atoll(argv[1]), C = atoll(argv[2]), H = atoll(argv[3]), W = atoll(argv[4]);
        O = atoll(argv[5]), K = atoll(argv[6]), S = atoll(argv[7]), P = atoll(argv[8]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: bench_conv_cuda [N C H W O K stride pad]\n");
        return 2;
    }
    em_config cfg = em_config_default();
    cfg.device = "cuda:0";
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_conv_cuda: %s\n", em_last_error());
        return 1;
    }
    direct d;
    direct_init(&d);
    enum { R = 5, IT = 20 };
    double e[R], c[R];
    for (int r = 0; r < R; r++) { /* alternate the sides */
        e[r] = ember_round(IT);
        c[r] = direct_round(&d, IT);
    }
    qsort(e, R, sizeof e[0], cmp);
    qsort(c, R, sizeof c[0], cmp);
    const double flops = 3 * 2.0 * (double)(N * O) * (double)(((H + 2 * P - K) / S + 1) * ((W + 2 * P - K) / S + 1)) * (double)(C * K * K);
    printf("conv %lldx%lldx%lldx%lld -> %lld, %lldx%lld stride %lld pad %lld, forward + backward (f32):\n", (long long)N, (long long)C,
           (long long)H, (long long)W, (long long)O, (long long)K, (long long)K, (long long)S, (long long)P);
    printf("  Ember %.3f ms (range %.3f-%.3f, %.1f TFLOP/s), cuDNN direct %.3f ms (range %.3f-%.3f, %.1f TFLOP/s), ratio %.3f\n",
           e[R / 2] * 1e3, e[0] * 1e3, e[R - 1] * 1e3, flops / e[R / 2] * 1e-12, c[R / 2] * 1e3, c[0] * 1e3, c[R - 1] * 1e3,
           flops / c[R / 2] * 1e-12, c[R / 2] / e[R / 2]);
    em_shutdown();
    return 0;
}
