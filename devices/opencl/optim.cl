/* Fused optimizer steps (semantics of devices/cpu/optim.c; buffer contract in
 * devices/kargs.h). The host rounds every hyper-parameter to T exactly as
 * the CPU kernel does and passes them as h0..h8; with FP_CONTRACT off and
 * correctly rounded division/sqrt the update is bit-identical to the CPU.
 *
 * optim_<T>(g, p, s1, s2, s3, long n, int op, int flags, T h0 .. T h8)
 *   each buffer as (__global uchar *base, long boff, long eoff), contiguous;
 *   flags = EM_OPTIM_F_* | EM_OPTIM_HAS_WD (1 << 16: weight decay != 0).
 *   SGD_STEP:     s1 = momentum_buffer;           h0 wd, h1 momentum, h2 1-dampening, h3 -lr
 *   ADAM_STEP:    s1 = exp_avg, s2 = exp_avg_sq, s3 = max_exp_avg_sq;
 *                 h0 wd, h1 1-lr*wd, h2 beta1, h3 beta2, h4 1-beta1, h5 1-beta2,
 *                 h6 -lr/bias_correction1, h7 sqrt(bias_correction2), h8 eps
 *   RMSPROP_STEP: s1 = square_avg, s2 = momentum_buffer, s3 = grad_avg;
 *                 h0 alpha, h1 1-alpha, h2 eps, h3 wd, h4 momentum, h5 -lr
 *   ADAGRAD_STEP: s1 = sum; h0 wd, h1 eps, h2 -lr
 * A state buffer whose flag is off is a placeholder and never touched. */
#define EM_OPTIM_HAS_WD (1 << 16)

#define EM_DEF_OPTIM(T, S)                                                                         \
    __kernel void em_optim_##S(__global const uchar *gb, long gboff, long ge, __global uchar *pb, long pboff, long pe, \
                               __global uchar *ab, long aboff, long ae, __global uchar *bb, long bboff, long be,     \
                               __global uchar *cb, long cboff, long ce, long n, int op, int fl, T h0, T h1, T h2,   \
                               T h3, T h4, T h5, T h6, T h7, T h8)                                                  \
    {                                                                                              \
        __global const T *g = (__global const T *)(gb + gboff) + ge;                               \
        __global T *p = (__global T *)(pb + pboff) + pe;                                           \
        __global T *s1 = (__global T *)(ab + aboff) + ae;                                          \
        __global T *s2 = (__global T *)(bb + bboff) + be;                                          \
        __global T *s3 = (__global T *)(cb + cboff) + ce;                                          \
        const int maximize = (fl & EM_OPTIM_F_MAXIMIZE) != 0, has_wd = (fl & EM_OPTIM_HAS_WD) != 0; \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            T d = maximize ? -g[i] : g[i];                                                         \
            if (op == EM_OP_SGD_STEP) {                                                            \
                if (has_wd) d = d + h0 * p[i];                                                     \
                if (fl & EM_OPTIM_F_MOMENTUM) {                                                    \
                    T b;                                                                           \
                    if (fl & EM_OPTIM_F_INIT_BUF) {                                                \
                        b = d;                                                                     \
                    } else {                                                                       \
                        b = s1[i] * h1;                                                            \
                        b = b + h2 * d;                                                            \
                    }                                                                              \
                    s1[i] = b;                                                                     \
                    d = (fl & EM_OPTIM_F_NESTEROV) ? d + h1 * b : b;                               \
                }                                                                                  \
                p[i] = p[i] + h3 * d;                                                              \
            } else if (op == EM_OP_ADAM_STEP) {                                                    \
                T pi = p[i];                                                                       \
                if (fl & EM_OPTIM_F_DECOUPLED) pi = pi * h1;                                       \
                else if (has_wd) d = d + h0 * pi;                                                  \
                T mi = s1[i] * h2;                                                                 \
                mi = mi + h4 * d;                                                                  \
                T vi = s2[i] * h3;                                                                 \
                vi = vi + h5 * d * d;                                                              \
                s1[i] = mi;                                                                        \
                s2[i] = vi;                                                                        \
                T den;                                                                             \
                if (fl & EM_OPTIM_F_AMSGRAD) {                                                     \
                    T mx = s3[i];                                                                  \
                    mx = (mx > vi || mx != mx) ? mx : vi;                                          \
                    s3[i] = mx;                                                                    \
                    den = sqrt(mx) / h7;                                                           \
                } else {                                                                           \
                    den = sqrt(vi) / h7;                                                           \
                }                                                                                  \
                den = den + h8;                                                                    \
                p[i] = pi + h6 * mi / den;                                                         \
            } else if (op == EM_OP_RMSPROP_STEP) {                                                 \
                if (has_wd) d = d + h3 * p[i];                                                     \
                T s = s1[i] * h0;                                                                  \
                s = s + h1 * d * d;                                                                \
                s1[i] = s;                                                                         \
                T avg;                                                                             \
                if (fl & EM_OPTIM_F_CENTERED) {                                                    \
                    T a = s3[i] * h0;                                                              \
                    a = a + h1 * d;                                                                \
                    s3[i] = a;                                                                     \
                    avg = sqrt(s + (T)(-1) * a * a);                                               \
                } else {                                                                           \
                    avg = sqrt(s);                                                                 \
                }                                                                                  \
                avg = avg + h2;                                                                    \
                if (fl & EM_OPTIM_F_MOMENTUM) {                                                    \
                    T b = s2[i] * h4;                                                              \
                    b = b + d / avg;                                                               \
                    s2[i] = b;                                                                     \
                    p[i] = p[i] + h5 * b;                                                          \
                } else {                                                                           \
                    p[i] = p[i] + h5 * d / avg;                                                    \
                }                                                                                  \
            } else if (op == EM_OP_ADAGRAD_STEP) {                                                 \
                if (has_wd) d = d + h0 * p[i];                                                     \
                T s = s1[i] + (T)1 * d * d;                                                        \
                s1[i] = s;                                                                         \
                T sd = sqrt(s) + h1;                                                               \
                p[i] = p[i] + h2 * d / sd;                                                         \
            }                                                                                      \
        }                                                                                          \
    }

EM_DEF_OPTIM(float, f32)
#ifdef EM_FP64
EM_DEF_OPTIM(double, f64)
#endif
