/* CUDA kernels of the fused optimizer ops (SGD_STEP, ADAM_STEP, RMSPROP_STEP,
 * ADAGRAD_STEP). Buffer contract: devices/kargs.h —
 *   buffers[0] = gradient (in[0]), buffers[1] = parameter (out[0]),
 *   buffers[1 + j] = state out[j]; all contiguous, f32 or f64, numel of the
 *   parameter, each at its descriptor's offset; outputs updated in place.
 *
 * Same arithmetic as devices/cpu/optim.c, operation for operation: the
 * hyper-parameters are rounded on the host exactly as the CPU kernel rounds
 * them, and every multiply/add uses the round-to-nearest intrinsics so nvcc
 * does not contract them into FMAs (the CPU build has no FMA contraction);
 * sqrt and division are IEEE by default. f32/f64 results are therefore
 * bit-identical to the CPU kernel's. One thread per element. */
#include "devices/cuda/emcuda.h"

extern "C" {
}

#include <math.h>

using namespace emc;

namespace {

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float dsqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double dsqrt(double a) { return __dsqrt_rn(a); }
__device__ __forceinline__ float ddiv(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double ddiv(double a, double b) { return __ddiv_rn(a, b); }

template <typename T> struct SgdArgs {
    const T *g;
    T *p, *buf;
    T wd, mom, one_m_damp, neg_lr;
    int has_wd, init, nesterov, maximize;
};

template <typename T> __global__ void k_sgd(SgdArgs<T> a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T d = a.maximize ? -a.g[i] : a.g[i];
        if (a.has_wd) d = add(d, mul(a.wd, a.p[i]));
        if (a.buf) {
            T b;
            if (a.init) {
                b = d;
            } else {
                b = mul(a.buf[i], a.mom);
                b = add(b, mul(a.one_m_damp, d));
            }
            a.buf[i] = b;
            d = a.nesterov ? add(d, mul(a.mom, b)) : b;
        }
        a.p[i] = add(a.p[i], mul(a.neg_lr, d));
    }
}

template <typename T> struct AdamArgs {
    const T *g;
    T *p, *m, *v, *vmax;
    T wd, decay, tb1, tb2, one_m_b1, one_m_b2, neg_step_size, bc2_sqrt, eps;
    int decoupled, has_wd, maximize;
};

template <typename T> __global__ void k_adam(AdamArgs<T> a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T d = a.maximize ? -a.g[i] : a.g[i];
        T pi = a.p[i];
        if (a.decoupled) pi = mul(pi, a.decay);
        else if (a.has_wd) d = add(d, mul(a.wd, pi));
        T mi = mul(a.m[i], a.tb1);
        mi = add(mi, mul(a.one_m_b1, d));
        T vi = mul(a.v[i], a.tb2);
        vi = add(vi, mul(mul(a.one_m_b2, d), d));
        a.m[i] = mi;
        a.v[i] = vi;
        T den;
        if (a.vmax) {
            T mx = a.vmax[i];
            mx = (mx > vi || mx != mx) ? mx : vi;
            a.vmax[i] = mx;
            den = ddiv(dsqrt(mx), a.bc2_sqrt);
        } else {
            den = ddiv(dsqrt(vi), a.bc2_sqrt);
        }
        den = add(den, a.eps);
        a.p[i] = add(pi, ddiv(mul(a.neg_step_size, mi), den));
    }
}

template <typename T> struct RmsArgs {
    const T *g;
    T *p, *sq, *buf, *ga;
    T ta, one_m_a, eps, wd, mom, neg_lr;
    int has_wd, maximize;
};

template <typename T> __global__ void k_rmsprop(RmsArgs<T> a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T d = a.maximize ? -a.g[i] : a.g[i];
        if (a.has_wd) d = add(d, mul(a.wd, a.p[i]));
        T s = mul(a.sq[i], a.ta);
        s = add(s, mul(mul(a.one_m_a, d), d));
        a.sq[i] = s;
        T avg;
        if (a.ga) {
            T g2 = mul(a.ga[i], a.ta);
            g2 = add(g2, mul(a.one_m_a, d));
            a.ga[i] = g2;
            avg = dsqrt(add(s, mul(mul((T)(-1), g2), g2)));
        } else {
            avg = dsqrt(s);
        }
        avg = add(avg, a.eps);
        if (a.buf) {
            T b = mul(a.buf[i], a.mom);
            b = add(b, ddiv(d, avg));
            a.buf[i] = b;
            a.p[i] = add(a.p[i], mul(a.neg_lr, b));
        } else {
            a.p[i] = add(a.p[i], ddiv(mul(a.neg_lr, d), avg));
        }
    }
}

template <typename T> struct AdagradArgs {
    const T *g;
    T *p, *sum;
    T wd, eps, neg_clr;
    int has_wd, maximize;
};

template <typename T> __global__ void k_adagrad(AdagradArgs<T> a, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T d = a.maximize ? -a.g[i] : a.g[i];
        if (a.has_wd) d = add(d, mul(a.wd, a.p[i]));
        T s = add(a.sum[i], mul(mul((T)1, d), d));
        a.sum[i] = s;
        T sd = add(dsqrt(s), a.eps);
        a.p[i] = add(a.p[i], ddiv(mul(a.neg_clr, d), sd));
    }
}

/* Pointer to operand j of the outputs (buffer 1 + j) at its offset. */
template <typename T> T *outp(void *buffers[], const em_kargs *k, int j)
{
    return (T *)buf(buffers, 1 + j) + k->out[j].offset;
}

template <typename T> void optim_t(const em_kargs *k, void *buffers[], int64_t n)
{
    const T *g = (const T *)buf(buffers, 0) + k->in[0].offset;
    T *p = outp<T>(buffers, k, 0);
    const int fl = k->p.optim.flags;
    const int maximize = (fl & EM_OPTIM_F_MAXIMIZE) != 0;
    cudaStream_t s = stream();
    const unsigned grid = grid_for(n);
    switch (k->kind) {
    case EM_OP_SGD_STEP: {
        SgdArgs<T> a;
        a.g = g;
        a.p = p;
        a.buf = (fl & EM_OPTIM_F_MOMENTUM) ? outp<T>(buffers, k, 1) : nullptr;
        a.wd = (T)k->p.optim.weight_decay;
        a.mom = (T)k->p.optim.momentum;
        a.one_m_damp = (T)(1.0 - k->p.optim.dampening);
        a.neg_lr = (T)(-k->p.optim.lr);
        a.has_wd = k->p.optim.weight_decay != 0;
        a.init = (fl & EM_OPTIM_F_INIT_BUF) != 0;
        a.nesterov = (fl & EM_OPTIM_F_NESTEROV) != 0;
        a.maximize = maximize;
        k_sgd<T><<<grid, kThreads, 0, s>>>(a, n);
        break;
    }
    case EM_OP_ADAM_STEP: {
        AdamArgs<T> a;
        a.g = g;
        a.p = p;
        a.m = outp<T>(buffers, k, 1);
        a.v = outp<T>(buffers, k, 2);
        a.vmax = (fl & EM_OPTIM_F_AMSGRAD) ? outp<T>(buffers, k, 3) : nullptr;
        const double lr = k->p.optim.lr, b1 = k->p.optim.beta1, b2 = k->p.optim.beta2;
        const double step = (double)k->p.optim.step;
        a.decoupled = (fl & EM_OPTIM_F_DECOUPLED) != 0;
        a.maximize = maximize;
        a.has_wd = !a.decoupled && k->p.optim.weight_decay != 0;
        a.wd = (T)k->p.optim.weight_decay;
        a.decay = (T)(1.0 - lr * k->p.optim.weight_decay);
        a.tb1 = (T)b1;
        a.tb2 = (T)b2;
        a.one_m_b1 = (T)(1.0 - b1);
        a.one_m_b2 = (T)(1.0 - b2);
        const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
        a.neg_step_size = (T)(-(lr / bc1));
        a.bc2_sqrt = (T)sqrt(bc2);
        a.eps = (T)k->p.optim.eps;
        k_adam<T><<<grid, kThreads, 0, s>>>(a, n);
        break;
    }
    case EM_OP_RMSPROP_STEP: {
        RmsArgs<T> a;
        a.g = g;
        a.p = p;
        a.sq = outp<T>(buffers, k, 1);
        int next = 2;
        a.buf = a.ga = nullptr;
        if (fl & EM_OPTIM_F_MOMENTUM) a.buf = outp<T>(buffers, k, next++);
        if (fl & EM_OPTIM_F_CENTERED) a.ga = outp<T>(buffers, k, next);
        const double alpha = k->p.optim.alpha;
        a.ta = (T)alpha;
        a.one_m_a = (T)(1.0 - alpha);
        a.eps = (T)k->p.optim.eps;
        a.wd = (T)k->p.optim.weight_decay;
        a.mom = (T)k->p.optim.momentum;
        a.neg_lr = (T)(-k->p.optim.lr);
        a.has_wd = k->p.optim.weight_decay != 0;
        a.maximize = maximize;
        k_rmsprop<T><<<grid, kThreads, 0, s>>>(a, n);
        break;
    }
    case EM_OP_ADAGRAD_STEP: {
        AdagradArgs<T> a;
        a.g = g;
        a.p = p;
        a.sum = outp<T>(buffers, k, 1);
        a.wd = (T)k->p.optim.weight_decay;
        a.eps = (T)k->p.optim.eps;
        a.neg_clr = (T)(-k->p.optim.lr);
        a.has_wd = k->p.optim.weight_decay != 0;
        a.maximize = maximize;
        k_adagrad<T><<<grid, kThreads, 0, s>>>(a, n);
        break;
    }
    default: unsupported("optim (op)", k->kind); return;
    }
    check_launch("optim");
}

} // namespace

void em_cuda_optim(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int64_t n = numel(k->out[0]);
    if (n <= 0) return;
    if (k->out[0].dtype == EM_F32) optim_t<float>(k, buffers, n);
    else if (k->out[0].dtype == EM_F64) optim_t<double>(k, buffers, n);
    else unsupported("optim (dtype)", k->out[0].dtype);
}
