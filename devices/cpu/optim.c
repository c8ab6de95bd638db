/* CPU kernels of the fused optimizer ops: one pass over a parameter updates it
 * and its state buffers in place. The buffer contract is in optim/optim_kargs.h.
 *
 * Each update follows torch.optim's single-tensor implementation
 * (torch/optim/{sgd,adam,adamw,rmsprop,adagrad}.py, PyTorch 1.13): the same
 * operations in the same order, with the Python-float hyper-parameters
 * rounded to the tensor dtype where ATen rounds them, so float32 results agree
 * with PyTorch to a few ulps. */
#include "devices/cpu/cpu.h"
#include "optim/optim_kargs.h"

#include <math.h>

#define OPTIM_KERNELS(T, S)                                                                          \
    static void sgd_##T(const em_kargs *k, void **bufs, int64_t n)                                   \
    {                                                                                                \
        const T *g = (const T *)bufs[0] + k->in[0].offset;                                           \
        T *p = (T *)bufs[1] + k->out[0].offset;                                                      \
        const int fl = k->p.optim.flags;                                                             \
        T *buf = (fl & EM_OPTIM_F_MOMENTUM) ? (T *)bufs[2] + k->out[1].offset : NULL;                \
        const T wd = (T)k->p.optim.weight_decay, mom = (T)k->p.optim.momentum;                       \
        const T one_m_damp = (T)(1.0 - k->p.optim.dampening), neg_lr = (T)(-k->p.optim.lr);          \
        const int has_wd = k->p.optim.weight_decay != 0, init = fl & EM_OPTIM_F_INIT_BUF;             \
        const int nesterov = fl & EM_OPTIM_F_NESTEROV, maximize = fl & EM_OPTIM_F_MAXIMIZE;          \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = maximize ? -g[i] : g[i];                                                           \
            if (has_wd) d = d + wd * p[i];                                                           \
            if (buf) {                                                                               \
                T b;                                                                                 \
                if (init) {                                                                          \
                    b = d;                                                                           \
                } else {                                                                             \
                    b = buf[i] * mom;                                                                \
                    b = b + one_m_damp * d;                                                          \
                }                                                                                    \
                buf[i] = b;                                                                          \
                d = nesterov ? d + mom * b : b;                                                      \
            }                                                                                        \
            p[i] = p[i] + neg_lr * d;                                                                \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    static void adam_##T(const em_kargs *k, void **bufs, int64_t n)                                  \
    {                                                                                                \
        const T *g = (const T *)bufs[0] + k->in[0].offset;                                           \
        T *p = (T *)bufs[1] + k->out[0].offset;                                                      \
        T *m = (T *)bufs[2] + k->out[1].offset;                                                      \
        T *v = (T *)bufs[3] + k->out[2].offset;                                                      \
        const int fl = k->p.optim.flags;                                                             \
        T *vmax = (fl & EM_OPTIM_F_AMSGRAD) ? (T *)bufs[4] + k->out[3].offset : NULL;                \
        const double lr = k->p.optim.lr, b1 = k->p.optim.beta1, b2 = k->p.optim.beta2;               \
        const double step = (double)k->p.optim.step;                                                 \
        const int decoupled = fl & EM_OPTIM_F_DECOUPLED, maximize = fl & EM_OPTIM_F_MAXIMIZE;        \
        const int has_wd = !decoupled && k->p.optim.weight_decay != 0;                               \
        const T wd = (T)k->p.optim.weight_decay, decay = (T)(1.0 - lr * k->p.optim.weight_decay);    \
        const T tb1 = (T)b1, tb2 = (T)b2, one_m_b1 = (T)(1.0 - b1), one_m_b2 = (T)(1.0 - b2);        \
        const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);                           \
        const T neg_step_size = (T)(-(lr / bc1)), bc2_sqrt = (T)sqrt(bc2), eps = (T)k->p.optim.eps;   \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = maximize ? -g[i] : g[i];                                                           \
            T pi = p[i];                                                                             \
            if (decoupled) pi = pi * decay;                                                          \
            else if (has_wd) d = d + wd * pi;                                                        \
            T mi = m[i] * tb1;                                                                       \
            mi = mi + one_m_b1 * d;                                                                  \
            T vi = v[i] * tb2;                                                                       \
            vi = vi + one_m_b2 * d * d;                                                              \
            m[i] = mi;                                                                               \
            v[i] = vi;                                                                               \
            T den;                                                                                   \
            if (vmax) {                                                                              \
                T mx = vmax[i];                                                                      \
                mx = (mx > vi || mx != mx) ? mx : vi;                                                \
                vmax[i] = mx;                                                                        \
                den = sqrt##S(mx) / bc2_sqrt;                                                        \
            } else {                                                                                 \
                den = sqrt##S(vi) / bc2_sqrt;                                                        \
            }                                                                                        \
            den = den + eps;                                                                         \
            p[i] = pi + neg_step_size * mi / den;                                                    \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    static void rmsprop_##T(const em_kargs *k, void **bufs, int64_t n)                               \
    {                                                                                                \
        const T *g = (const T *)bufs[0] + k->in[0].offset;                                           \
        T *p = (T *)bufs[1] + k->out[0].offset;                                                      \
        T *sq = (T *)bufs[2] + k->out[1].offset;                                                     \
        const int fl = k->p.optim.flags;                                                             \
        int next = 2;                                                                                \
        T *buf = NULL, *ga = NULL;                                                                   \
        if (fl & EM_OPTIM_F_MOMENTUM) {                                                              \
            buf = (T *)bufs[next + 1] + k->out[next].offset;                                         \
            next++;                                                                                  \
        }                                                                                            \
        if (fl & EM_OPTIM_F_CENTERED) ga = (T *)bufs[next + 1] + k->out[next].offset;                \
        const double alpha = k->p.optim.alpha;                                                       \
        const T ta = (T)alpha, one_m_a = (T)(1.0 - alpha), eps = (T)k->p.optim.eps;                  \
        const T wd = (T)k->p.optim.weight_decay, mom = (T)k->p.optim.momentum;                       \
        const T neg_lr = (T)(-k->p.optim.lr);                                                        \
        const int has_wd = k->p.optim.weight_decay != 0, maximize = fl & EM_OPTIM_F_MAXIMIZE;        \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = maximize ? -g[i] : g[i];                                                           \
            if (has_wd) d = d + wd * p[i];                                                           \
            T s = sq[i] * ta;                                                                        \
            s = s + one_m_a * d * d;                                                                 \
            sq[i] = s;                                                                               \
            T avg;                                                                                   \
            if (ga) {                                                                                \
                T a = ga[i] * ta;                                                                    \
                a = a + one_m_a * d;                                                                 \
                ga[i] = a;                                                                           \
                avg = sqrt##S(s + (T)(-1) * a * a);                                                  \
            } else {                                                                                 \
                avg = sqrt##S(s);                                                                    \
            }                                                                                        \
            avg = avg + eps;                                                                         \
            if (buf) {                                                                               \
                T b = buf[i] * mom;                                                                  \
                b = b + d / avg;                                                                     \
                buf[i] = b;                                                                          \
                p[i] = p[i] + neg_lr * b;                                                            \
            } else {                                                                                 \
                p[i] = p[i] + neg_lr * d / avg;                                                      \
            }                                                                                        \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    static void adagrad_##T(const em_kargs *k, void **bufs, int64_t n)                               \
    {                                                                                                \
        const T *g = (const T *)bufs[0] + k->in[0].offset;                                           \
        T *p = (T *)bufs[1] + k->out[0].offset;                                                      \
        T *sum = (T *)bufs[2] + k->out[1].offset;                                                    \
        const int fl = k->p.optim.flags;                                                             \
        const T wd = (T)k->p.optim.weight_decay, eps = (T)k->p.optim.eps;                            \
        const T neg_clr = (T)(-k->p.optim.lr);                                                       \
        const int has_wd = k->p.optim.weight_decay != 0, maximize = fl & EM_OPTIM_F_MAXIMIZE;        \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = maximize ? -g[i] : g[i];                                                           \
            if (has_wd) d = d + wd * p[i];                                                           \
            T s = sum[i] + (T)1 * d * d;                                                             \
            sum[i] = s;                                                                              \
            T sd = sqrt##S(s) + eps;                                                                 \
            p[i] = p[i] + neg_clr * d / sd;                                                          \
        }                                                                                            \
    }

OPTIM_KERNELS(float, f)
OPTIM_KERNELS(double, )

void em_cpu_optim(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[1 + EM_KARGS_MAX_OUT];
    int nb = k->n_in + k->n_out;
    for (int i = 0; i < nb && i < 1 + EM_KARGS_MAX_OUT; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    int64_t n = 1;
    for (int d = 0; d < k->out[0].ndim; d++) n *= k->out[0].shape[d];
    const int dt = k->out[0].dtype;
    if (dt != EM_F32 && dt != EM_F64) em_cpu_bad_kind("optim (dtype)", dt);
    const int f32 = dt == EM_F32;
    switch (k->kind) {
    case EM_OP_SGD_STEP: f32 ? sgd_float(k, bufs, n) : sgd_double(k, bufs, n); break;
    case EM_OP_ADAM_STEP: f32 ? adam_float(k, bufs, n) : adam_double(k, bufs, n); break;
    case EM_OP_RMSPROP_STEP: f32 ? rmsprop_float(k, bufs, n) : rmsprop_double(k, bufs, n); break;
    case EM_OP_ADAGRAD_STEP: f32 ? adagrad_float(k, bufs, n) : adagrad_double(k, bufs, n); break;
    default: em_cpu_bad_kind("optim", k->kind);
    }
}
