/* CPU kernels of the fused optimizer ops: one pass over a parameter updates it
 * and its state buffers in place. The buffer contract is in devices/kargs.h.
 *
 * Each update follows torch.optim's single-tensor implementation
 * (torch/optim/{sgd,adam,adamw,rmsprop,adagrad}.py, PyTorch 1.13): the same
 * operations in the same order, with the Python-float hyper-parameters
 * rounded to the tensor dtype where ATen rounds them, so float32 results agree
 * with PyTorch to a few ulps. The OpenCL kernels (devices/opencl/optim.cl) do
 * the same operations and are bit-identical to these (tests/test_opencl.c), so
 * the rounding here is frozen: no reciprocal in place of a division (not even
 * of sqrt(bias_correction2)), no reassociation, no FMA contraction (this file
 * is built with -ffp-contract=off, see CMakeLists.txt).
 *
 * Speed: the options never change inside a loop, so none is tested there.
 * Each kind has one always-inline element loop taking its options as
 * arguments; the *_spec functions call it with constant options, giving one
 * branch-free loop per combination, with restrict pointers, that the compiler
 * vectorises (-O3 -fno-math-errno, so sqrt is one instruction). Vector
 * division and sqrt are correctly rounded like the scalar ones: same bits.
 * MAXIMIZE multiplies the gradient by -1 (exact) instead of having loops of its own.
 * On x86 the loops are compiled twice, for the baseline ISA and for AVX2
 * (no FMA), and the CPU picks one at run time. */
#include "devices/cpu/cpu.h"

#include <math.h>

#ifdef __GNUC__
#define OPT_INLINE static inline __attribute__((always_inline))
#else
#define OPT_INLINE static inline
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define OPT_AVX2 1
#else
#define OPT_AVX2 0
#endif

/* SGD momentum modes */
enum { MOM_NONE, MOM_INIT, MOM_RUN };
/* Adam weight-decay modes */
enum { WD_NONE, WD_L2, WD_DECOUPLED };

/* One call's operands and options, hyper-parameters already rounded to T
 * (h[] as the OpenCL host's h0..h8, see optim.cl). */
#define OPT_ARGS(T)                                                                                  \
    typedef struct opt_args_##T {                                                                    \
        int64_t n;                                                                                   \
        const T *g;                                                                                  \
        T *p, *s1, *s2, *s3;                                                                         \
        T sgn; /* -1 with MAXIMIZE, else 1 */                                                        \
        T h[9];                                                                                      \
        int wd, mom, nesterov, amsgrad, centered;                                                    \
    } opt_args_##T;

/* Calls with constant options (used inside OPT_LOOPS, a = the opt_args). */
#define SGD_L(T, W, M, N)                                                                            \
    sgd_loop_##T(a->n, a->g, a->p, a->s1, a->sgn, a->h[0], a->h[1], a->h[2], a->h[3], W, M, N)
#define SGD_W(T, W)                                                                                  \
    do {                                                                                             \
        if (a->mom == MOM_NONE) SGD_L(T, W, MOM_NONE, 0);                                            \
        else if (a->mom == MOM_INIT && a->nesterov) SGD_L(T, W, MOM_INIT, 1);                        \
        else if (a->mom == MOM_INIT) SGD_L(T, W, MOM_INIT, 0);                                       \
        else if (a->nesterov) SGD_L(T, W, MOM_RUN, 1);                                               \
        else SGD_L(T, W, MOM_RUN, 0);                                                                \
    } while (0)
#define ADAM_L(T, W, A)                                                                              \
    adam_loop_##T(a->n, a->g, a->p, a->s1, a->s2, a->s3, a->sgn, a->h[0], a->h[1], a->h[2], a->h[3], \
                  a->h[4], a->h[5], a->h[6], a->h[7], a->h[8], W, A)
#define RMS_L(T, W, M, C)                                                                            \
    rmsprop_loop_##T(a->n, a->g, a->p, a->s1, a->s2, a->s3, a->sgn, a->h[0], a->h[1], a->h[2],       \
                     a->h[3], a->h[4], a->h[5], W, M, C)
#define RMS_W(T, W)                                                                                  \
    do {                                                                                             \
        if (a->mom && a->centered) RMS_L(T, W, 1, 1);                                                \
        else if (a->mom) RMS_L(T, W, 1, 0);                                                          \
        else if (a->centered) RMS_L(T, W, 0, 1);                                                     \
        else RMS_L(T, W, 0, 0);                                                                      \
    } while (0)
#define ADAGRAD_L(T, W) adagrad_loop_##T(a->n, a->g, a->p, a->s1, a->sgn, a->h[0], a->h[1], a->h[2], W)

#define OPT_LOOPS(T, S)                                                                              \
    OPT_INLINE void sgd_loop_##T(int64_t n, const T *restrict g, T *restrict p, T *restrict buf,     \
                                 T sgn, T wd, T mom, T one_m_damp, T neg_lr, const int has_wd,       \
                                 const int mode, const int nesterov)                                 \
    {                                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = sgn * g[i];                                                                        \
            if (has_wd) d = d + wd * p[i];                                                           \
            if (mode != MOM_NONE) {                                                                  \
                T b;                                                                                 \
                if (mode == MOM_INIT) {                                                              \
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
    OPT_INLINE void adam_loop_##T(int64_t n, const T *restrict g, T *restrict p, T *restrict m,      \
                                  T *restrict v, T *restrict vmax, T sgn, T wd, T decay, T tb1,      \
                                  T tb2, T one_m_b1, T one_m_b2, T neg_step_size, T bc2_sqrt, T eps, \
                                  const int wd_mode, const int amsgrad)                              \
    {                                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = sgn * g[i];                                                                        \
            T pi = p[i];                                                                             \
            if (wd_mode == WD_DECOUPLED) pi = pi * decay;                                            \
            else if (wd_mode == WD_L2) d = d + wd * pi;                                              \
            T mi = m[i] * tb1;                                                                       \
            mi = mi + one_m_b1 * d;                                                                  \
            T vi = v[i] * tb2;                                                                       \
            vi = vi + one_m_b2 * d * d;                                                              \
            m[i] = mi;                                                                               \
            v[i] = vi;                                                                               \
            if (amsgrad) {                                                                           \
                T mx = vmax[i];                                                                      \
                mx = ((mx > vi) | (mx != mx)) ? mx : vi; /* torch.maximum: NaN wins */               \
                vmax[i] = mx;                                                                        \
                vi = mx;                                                                             \
            }                                                                                        \
            T den = sqrt##S(vi) / bc2_sqrt;                                                          \
            den = den + eps;                                                                         \
            p[i] = pi + neg_step_size * mi / den;                                                    \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    OPT_INLINE void rmsprop_loop_##T(int64_t n, const T *restrict g, T *restrict p, T *restrict sq,  \
                                     T *restrict buf, T *restrict ga, T sgn, T ta, T one_m_a, T eps, \
                                     T wd, T mom, T neg_lr, const int has_wd, const int momentum,    \
                                     const int centered)                                             \
    {                                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = sgn * g[i];                                                                        \
            if (has_wd) d = d + wd * p[i];                                                           \
            T s = sq[i] * ta;                                                                        \
            s = s + one_m_a * d * d;                                                                 \
            sq[i] = s;                                                                               \
            T avg;                                                                                   \
            if (centered) {                                                                          \
                T av = ga[i] * ta;                                                                   \
                av = av + one_m_a * d;                                                               \
                ga[i] = av;                                                                          \
                avg = sqrt##S(s + (T)(-1) * av * av);                                                \
            } else {                                                                                 \
                avg = sqrt##S(s);                                                                    \
            }                                                                                        \
            avg = avg + eps;                                                                         \
            if (momentum) {                                                                          \
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
    OPT_INLINE void adagrad_loop_##T(int64_t n, const T *restrict g, T *restrict p, T *restrict sum, \
                                     T sgn, T wd, T eps, T neg_clr, const int has_wd)                \
    {                                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                            \
            T d = sgn * g[i];                                                                        \
            if (has_wd) d = d + wd * p[i];                                                           \
            T s = sum[i] + (T)1 * d * d;                                                             \
            sum[i] = s;                                                                              \
            T sd = sqrt##S(s) + eps;                                                                 \
            p[i] = p[i] + neg_clr * d / sd;                                                          \
        }                                                                                            \
    }                                                                                                \
                                                                                                     \
    /* one specialised loop per option combination */                                                \
    OPT_INLINE void sgd_spec_##T(const opt_args_##T *a)                                              \
    {                                                                                                \
        if (a->wd) SGD_W(T, 1);                                                                      \
        else SGD_W(T, 0);                                                                            \
    }                                                                                                \
    OPT_INLINE void adam_spec_##T(const opt_args_##T *a)                                             \
    {                                                                                                \
        if (a->wd == WD_DECOUPLED) {                                                                 \
            if (a->amsgrad) ADAM_L(T, WD_DECOUPLED, 1);                                              \
            else ADAM_L(T, WD_DECOUPLED, 0);                                                         \
        } else if (a->wd == WD_L2) {                                                                 \
            if (a->amsgrad) ADAM_L(T, WD_L2, 1);                                                     \
            else ADAM_L(T, WD_L2, 0);                                                                \
        } else {                                                                                     \
            if (a->amsgrad) ADAM_L(T, WD_NONE, 1);                                                   \
            else ADAM_L(T, WD_NONE, 0);                                                              \
        }                                                                                            \
    }                                                                                                \
    OPT_INLINE void rmsprop_spec_##T(const opt_args_##T *a)                                          \
    {                                                                                                \
        if (a->wd) RMS_W(T, 1);                                                                      \
        else RMS_W(T, 0);                                                                            \
    }                                                                                                \
    OPT_INLINE void adagrad_spec_##T(const opt_args_##T *a)                                          \
    {                                                                                                \
        if (a->wd) ADAGRAD_L(T, 1);                                                                  \
        else ADAGRAD_L(T, 0);                                                                        \
    }

/* The four kernels of one dtype, compiled for one ISA (ATTR: its target attribute). */
#define OPT_ISA(T, ISA, ATTR)                                                                        \
    ATTR static void sgd_##T##_##ISA(const opt_args_##T *a) { sgd_spec_##T(a); }                     \
    ATTR static void adam_##T##_##ISA(const opt_args_##T *a) { adam_spec_##T(a); }                   \
    ATTR static void rmsprop_##T##_##ISA(const opt_args_##T *a) { rmsprop_spec_##T(a); }             \
    ATTR static void adagrad_##T##_##ISA(const opt_args_##T *a) { adagrad_spec_##T(a); }

#if OPT_AVX2
#define OPT_ISAS(T)                                                                                  \
    OPT_ISA(T, base, )                                                                               \
    OPT_ISA(T, avx2, __attribute__((target("avx2"))))
#define OPT_PICK(name, T) (use_avx2 ? name##_##T##_avx2 : name##_##T##_base)
#else
#define OPT_ISAS(T) OPT_ISA(T, base, )
#define OPT_PICK(name, T) name##_##T##_base
#endif

/* Fills the opt_args from the kargs (every hyper-parameter rounded to T once,
 * from the same double expression as before and as the OpenCL host) and runs
 * the kernel. */
#define OPT_RUN(T)                                                                                   \
    static void run_##T(const em_kargs *k, void **bufs, int64_t n, int use_avx2)                     \
    {                                                                                                \
        (void)use_avx2;                                                                              \
        const int fl = k->p.optim.flags;                                                             \
        const double lr = k->p.optim.lr, wdd = k->p.optim.weight_decay;                              \
        opt_args_##T a = {0};                                                                        \
        a.n = n;                                                                                     \
        a.g = (const T *)bufs[0] + k->in[0].offset;                                                  \
        a.p = (T *)bufs[1] + k->out[0].offset;                                                       \
        a.sgn = (fl & EM_OPTIM_F_MAXIMIZE) ? (T)(-1) : (T)1;                                         \
        switch (k->kind) {                                                                           \
        case EM_OP_SGD_STEP:                                                                         \
            if (fl & EM_OPTIM_F_MOMENTUM) {                                                          \
                a.s1 = (T *)bufs[2] + k->out[1].offset;                                              \
                a.mom = (fl & EM_OPTIM_F_INIT_BUF) ? MOM_INIT : MOM_RUN;                             \
                a.nesterov = (fl & EM_OPTIM_F_NESTEROV) != 0;                                        \
            }                                                                                        \
            a.wd = wdd != 0;                                                                         \
            a.h[0] = (T)wdd, a.h[1] = (T)k->p.optim.momentum;                                        \
            a.h[2] = (T)(1.0 - k->p.optim.dampening), a.h[3] = (T)(-lr);                             \
            OPT_PICK(sgd, T)(&a);                                                                    \
            break;                                                                                   \
        case EM_OP_ADAM_STEP: {                                                                      \
            const double b1 = k->p.optim.beta1, b2 = k->p.optim.beta2;                               \
            const double step = (double)k->p.optim.step;                                             \
            const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);                       \
            a.s1 = (T *)bufs[2] + k->out[1].offset;                                                  \
            a.s2 = (T *)bufs[3] + k->out[2].offset;                                                  \
            if (fl & EM_OPTIM_F_AMSGRAD) {                                                           \
                a.s3 = (T *)bufs[4] + k->out[3].offset;                                              \
                a.amsgrad = 1;                                                                       \
            }                                                                                        \
            a.wd = (fl & EM_OPTIM_F_DECOUPLED) ? WD_DECOUPLED : wdd != 0 ? WD_L2 : WD_NONE;          \
            a.h[0] = (T)wdd, a.h[1] = (T)(1.0 - lr * wdd), a.h[2] = (T)b1, a.h[3] = (T)b2;           \
            a.h[4] = (T)(1.0 - b1), a.h[5] = (T)(1.0 - b2), a.h[6] = (T)(-(lr / bc1));               \
            a.h[7] = (T)sqrt(bc2), a.h[8] = (T)k->p.optim.eps;                                       \
            OPT_PICK(adam, T)(&a);                                                                   \
            break;                                                                                   \
        }                                                                                            \
        case EM_OP_RMSPROP_STEP: {                                                                   \
            int next = 2;                                                                            \
            a.s1 = (T *)bufs[2] + k->out[1].offset;                                                  \
            if (fl & EM_OPTIM_F_MOMENTUM) {                                                          \
                a.s2 = (T *)bufs[next + 1] + k->out[next].offset;                                    \
                a.mom = 1;                                                                           \
                next++;                                                                              \
            }                                                                                        \
            if (fl & EM_OPTIM_F_CENTERED) {                                                          \
                a.s3 = (T *)bufs[next + 1] + k->out[next].offset;                                    \
                a.centered = 1;                                                                      \
            }                                                                                        \
            a.wd = wdd != 0;                                                                         \
            a.h[0] = (T)k->p.optim.alpha, a.h[1] = (T)(1.0 - k->p.optim.alpha);                      \
            a.h[2] = (T)k->p.optim.eps, a.h[3] = (T)wdd, a.h[4] = (T)k->p.optim.momentum;            \
            a.h[5] = (T)(-lr);                                                                       \
            OPT_PICK(rmsprop, T)(&a);                                                                \
            break;                                                                                   \
        }                                                                                            \
        case EM_OP_ADAGRAD_STEP:                                                                     \
            a.s1 = (T *)bufs[2] + k->out[1].offset;                                                  \
            a.wd = wdd != 0;                                                                         \
            a.h[0] = (T)wdd, a.h[1] = (T)k->p.optim.eps, a.h[2] = (T)(-lr);                          \
            OPT_PICK(adagrad, T)(&a);                                                                \
            break;                                                                                   \
        default: em_cpu_bad_kind("optim", k->kind);                                                  \
        }                                                                                            \
    }

OPT_ARGS(float)
OPT_ARGS(double)
OPT_LOOPS(float, f)
OPT_LOOPS(double, )
OPT_ISAS(float)
OPT_ISAS(double)
OPT_RUN(float)
OPT_RUN(double)

void em_cpu_optim(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[1 + EM_KARGS_MAX_OUT];
    int nb = k->n_in + k->n_out;
    for (int i = 0; i < nb && i < 1 + EM_KARGS_MAX_OUT; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    int64_t n = 1;
    for (int d = 0; d < k->out[0].ndim; d++) n *= k->out[0].shape[d];
    const int dt = k->out[0].dtype;
    if (dt != EM_F32 && dt != EM_F64) {
        em_cpu_bad_kind("optim (dtype)", dt);
        return;
    }
#if OPT_AVX2
    const int use_avx2 = __builtin_cpu_supports("avx2");
#else
    const int use_avx2 = 0;
#endif
    if (dt == EM_F32) run_float(k, bufs, n, use_avx2);
    else run_double(k, bufs, n, use_avx2);
}
