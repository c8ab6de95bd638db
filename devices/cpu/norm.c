/* CPU kernels of the norm family: fused training-mode batch norm forward and
 * backward, its running-statistics update, and fused layer norm forward and
 * backward (contracts at the top of tasks/norm.c). Per-channel (batch norm)
 * and per-row (layer norm) sums are accumulated in double, two passes over
 * x (mean, then the squared deviations), so large means do not cancel the
 * variance away. */
#include "devices/cpu/cpu.h"

#include <math.h>
#include <string.h>

/* x seen as [N, C, S]. */
static void bn_geometry(const em_tdesc *x, int64_t *N, int64_t *C, int64_t *S)
{
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) n *= x->shape[d];
    *N = x->shape[0];
    *C = x->shape[1];
    *S = *N * *C > 0 ? n / (*N * *C) : 0;
}

#define BN_IMPL(T)                                                                                                    \
    static void bn_fwd_##T(const em_kargs *k, void **bufs)                                                            \
    {                                                                                                                 \
        int64_t N, C, S;                                                                                              \
        bn_geometry(&k->in[0], &N, &C, &S);                                                                           \
        const T *x = (const T *)bufs[0] + k->in[0].offset;                                                            \
        const T *w = (const T *)bufs[1] + k->in[1].offset;                                                            \
        const T *b = (const T *)bufs[2] + k->in[2].offset;                                                            \
        T *y = (T *)bufs[3] + k->out[0].offset;                                                                       \
        T *st = (T *)bufs[4] + k->out[1].offset;                                                                      \
        const double M = (double)(N * S);                                                                             \
        for (int64_t c = 0; c < C; c++) {                                                                             \
            double s = 0;                                                                                             \
            for (int64_t n = 0; n < N; n++) {                                                                         \
                const T *xp = x + (n * C + c) * S;                                                                    \
                for (int64_t i = 0; i < S; i++) s += (double)xp[i];                                                   \
            }                                                                                                         \
            const double mean = M > 0 ? s / M : 0;                                                                    \
            double q = 0;                                                                                             \
            for (int64_t n = 0; n < N; n++) {                                                                         \
                const T *xp = x + (n * C + c) * S;                                                                    \
                for (int64_t i = 0; i < S; i++) {                                                                     \
                    const double d = (double)xp[i] - mean;                                                            \
                    q += d * d;                                                                                       \
                }                                                                                                     \
            }                                                                                                         \
            const double var = M > 0 ? q / M : 0;                                                                     \
            const double scale = (double)w[c] / sqrt(var + k->p.bn.eps), shift = (double)b[c];                        \
            for (int64_t n = 0; n < N; n++) {                                                                         \
                const T *xp = x + (n * C + c) * S;                                                                    \
                T *yp = y + (n * C + c) * S;                                                                          \
                for (int64_t i = 0; i < S; i++) yp[i] = (T)(((double)xp[i] - mean) * scale + shift);                  \
            }                                                                                                         \
            st[c] = (T)mean;                                                                                          \
            st[C + c] = (T)var;                                                                                       \
        }                                                                                                             \
    }                                                                                                                 \
    static void bn_bwd_##T(const em_kargs *k, void **bufs)                                                            \
    {                                                                                                                 \
        int64_t N, C, S;                                                                                              \
        bn_geometry(&k->in[1], &N, &C, &S);                                                                           \
        const T *dy = (const T *)bufs[0] + k->in[0].offset;                                                           \
        const T *x = (const T *)bufs[1] + k->in[1].offset;                                                            \
        const T *st = (const T *)bufs[2] + k->in[2].offset;                                                           \
        const T *w = (const T *)bufs[3] + k->in[3].offset;                                                            \
        T *dx = (T *)bufs[4] + k->out[0].offset;                                                                      \
        T *dw = (T *)bufs[5] + k->out[1].offset;                                                                      \
        T *db = (T *)bufs[6] + k->out[2].offset;                                                                      \
        const double M = (double)(N * S);                                                                             \
        for (int64_t c = 0; c < C; c++) {                                                                             \
            const double mean = (double)st[c], invstd = 1.0 / sqrt((double)st[C + c] + k->p.bn.eps);                 \
            double sdy = 0, sdyx = 0;                                                                                 \
            for (int64_t n = 0; n < N; n++) {                                                                         \
                const T *xp = x + (n * C + c) * S, *gp = dy + (n * C + c) * S;                                        \
                for (int64_t i = 0; i < S; i++) {                                                                     \
                    sdy += (double)gp[i];                                                                             \
                    sdyx += (double)gp[i] * ((double)xp[i] - mean);                                                   \
                }                                                                                                     \
            }                                                                                                         \
            sdyx *= invstd; /* sum(dy * xhat) */                                                                      \
            const double a = (double)w[c] * invstd, mdy = M > 0 ? sdy / M : 0, mdyx = M > 0 ? sdyx / M : 0;           \
            for (int64_t n = 0; n < N; n++) {                                                                         \
                const T *xp = x + (n * C + c) * S, *gp = dy + (n * C + c) * S;                                        \
                T *op = dx + (n * C + c) * S;                                                                         \
                for (int64_t i = 0; i < S; i++) {                                                                     \
                    const double xh = ((double)xp[i] - mean) * invstd;                                                \
                    op[i] = (T)(a * ((double)gp[i] - mdy - xh * mdyx));                                               \
                }                                                                                                     \
            }                                                                                                         \
            dw[c] = (T)sdyx;                                                                                          \
            db[c] = (T)sdy;                                                                                           \
        }                                                                                                             \
    }

BN_IMPL(float)
BN_IMPL(double)

/* BATCH_NORM_RUNNING: the composed update's roundings, step by step. */
#define BN_RUNNING_IMPL(T)                                                                                            \
    static void bn_running_##T(const em_kargs *k, void **bufs)                                                        \
    {                                                                                                                 \
        const int64_t C = k->out[0].shape[0];                                                                         \
        const T *st = (const T *)bufs[0] + k->in[0].offset;                                                           \
        T *rm = (T *)bufs[1] + k->out[0].offset;                                                                      \
        T *rv = (T *)bufs[2] + k->out[1].offset;                                                                      \
        const T m = (T)k->p.bn.momentum, keep = (T)(1.0 - k->p.bn.momentum), u = (T)k->p.bn.unbias;                   \
        for (int64_t c = 0; c < C; c++) {                                                                             \
            const T a = rm[c] * keep, b = st[c] * m;                                                                  \
            rm[c] = a + b;                                                                                            \
            const T v = st[C + c] * u;                                                                                \
            const T av = rv[c] * keep, bv = v * m;                                                                    \
            rv[c] = av + bv;                                                                                          \
        }                                                                                                             \
    }

BN_RUNNING_IMPL(float)
BN_RUNNING_IMPL(double)

/* Layer norm: x [M, N] rows (tasks/norm.c). M from stats' dim 1, N from
 * weight's element count; the caller checked that they fit every operand. */
static int64_t tdesc_numel(const em_tdesc *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Columns per block of the dweight / dbias sums (stack accumulators). */
#define LN_COLS 256

#define LN_IMPL(T)                                                                                                    \
    static void ln_fwd_##T(const em_kargs *k, void **bufs, int64_t M, int64_t N)                                      \
    {                                                                                                                 \
        const T *x = (const T *)bufs[0] + k->in[0].offset;                                                            \
        const T *w = (const T *)bufs[1] + k->in[1].offset;                                                            \
        const T *b = (const T *)bufs[2] + k->in[2].offset;                                                            \
        T *y = (T *)bufs[3] + k->out[0].offset;                                                                       \
        T *st = (T *)bufs[4] + k->out[1].offset;                                                                      \
        for (int64_t i = 0; i < M; i++) {                                                                             \
            const T *xp = x + i * N;                                                                                  \
            T *yp = y + i * N;                                                                                        \
            double s = 0;                                                                                             \
            for (int64_t j = 0; j < N; j++) s += (double)xp[j];                                                       \
            const double mean = N > 0 ? s / (double)N : 0;                                                            \
            double q = 0;                                                                                             \
            for (int64_t j = 0; j < N; j++) {                                                                         \
                const double d = (double)xp[j] - mean;                                                                \
                q += d * d;                                                                                           \
            }                                                                                                         \
            const double var = N > 0 ? q / (double)N : 0, rstd = 1.0 / sqrt(var + k->p.bn.eps);                       \
            for (int64_t j = 0; j < N; j++) yp[j] = (T)(((double)xp[j] - mean) * rstd * (double)w[j] + (double)b[j]); \
            st[i] = (T)mean;                                                                                          \
            st[M + i] = (T)rstd;                                                                                      \
        }                                                                                                             \
    }                                                                                                                 \
    static void ln_bwd_##T(const em_kargs *k, void **bufs, int64_t M, int64_t N)                                      \
    {                                                                                                                 \
        const T *dy = (const T *)bufs[0] + k->in[0].offset;                                                           \
        const T *x = (const T *)bufs[1] + k->in[1].offset;                                                            \
        const T *st = (const T *)bufs[2] + k->in[2].offset;                                                           \
        const T *w = (const T *)bufs[3] + k->in[3].offset;                                                            \
        T *dx = (T *)bufs[4] + k->out[0].offset;                                                                      \
        T *dw = (T *)bufs[5] + k->out[1].offset;                                                                      \
        T *db = (T *)bufs[6] + k->out[2].offset;                                                                      \
        for (int64_t i = 0; i < M; i++) {                                                                             \
            const T *xp = x + i * N, *gp = dy + i * N;                                                                \
            T *op = dx + i * N;                                                                                       \
            const double mean = (double)st[i], rstd = (double)st[M + i];                                              \
            double sg = 0, sgx = 0;                                                                                   \
            for (int64_t j = 0; j < N; j++) {                                                                         \
                const double g = (double)gp[j] * (double)w[j];                                                        \
                sg += g;                                                                                              \
                sgx += g * (((double)xp[j] - mean) * rstd);                                                           \
            }                                                                                                         \
            const double mg = sg / (double)N, mgx = sgx / (double)N; /* N > 0: the row has values */                 \
            for (int64_t j = 0; j < N; j++) {                                                                         \
                const double xh = ((double)xp[j] - mean) * rstd;                                                      \
                op[j] = (T)(rstd * ((double)gp[j] * (double)w[j] - mg - xh * mgx));                                   \
            }                                                                                                         \
        }                                                                                                             \
        /* column sums over the rows, in row order, LN_COLS columns at a time */                                     \
        for (int64_t j0 = 0; j0 < N; j0 += LN_COLS) {                                                                 \
            const int64_t nc = N - j0 < LN_COLS ? N - j0 : LN_COLS;                                                   \
            double aw[LN_COLS], ab[LN_COLS];                                                                          \
            for (int64_t j = 0; j < nc; j++) aw[j] = ab[j] = 0;                                                       \
            for (int64_t i = 0; i < M; i++) {                                                                         \
                const T *xp = x + i * N + j0, *gp = dy + i * N + j0;                                                  \
                const double mean = (double)st[i], rstd = (double)st[M + i];                                          \
                for (int64_t j = 0; j < nc; j++) {                                                                    \
                    const double g = (double)gp[j];                                                                   \
                    aw[j] += g * (((double)xp[j] - mean) * rstd);                                                     \
                    ab[j] += g;                                                                                       \
                }                                                                                                     \
            }                                                                                                         \
            for (int64_t j = 0; j < nc; j++) {                                                                        \
                dw[j0 + j] = (T)aw[j];                                                                                \
                db[j0 + j] = (T)ab[j];                                                                                \
            }                                                                                                         \
        }                                                                                                             \
    }

LN_IMPL(float)
LN_IMPL(double)

/* The [M, N] geometry of a LAYER_NORM / LAYER_NORM_BWD op, checked against
 * every operand (tasks/norm.c's contract); false when one does not fit. */
static bool ln_geometry(const em_kargs *k, bool fwd, int64_t *M, int64_t *N)
{
    const em_tdesc *x = fwd ? &k->in[0] : &k->in[1], *w = fwd ? &k->in[1] : &k->in[3];
    const em_tdesc *st = fwd ? &k->out[1] : &k->in[2];
    if (st->ndim != 2 || st->shape[0] != 2) return false;
    *M = st->shape[1];
    *N = tdesc_numel(w);
    const int64_t mn = *M * *N;
    if (tdesc_numel(x) != mn) return false;
    if (fwd) return tdesc_numel(&k->in[2]) == *N && tdesc_numel(&k->out[0]) == mn;
    return tdesc_numel(&k->in[0]) == mn && tdesc_numel(&k->out[0]) == mn && tdesc_numel(&k->out[1]) == *N &&
           tdesc_numel(&k->out[2]) == *N;
}

void em_cpu_norm(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int dt = k->in[0].dtype;
    if (dt != EM_F32 && dt != EM_F64) {
        em_cpu_bad_kind("norm dtype", dt);
        return;
    }
    const bool running = k->kind == EM_OP_BATCH_NORM_RUNNING;
    const bool ln = k->kind == EM_OP_LAYER_NORM || k->kind == EM_OP_LAYER_NORM_BWD;
    if ((k->kind != EM_OP_BATCH_NORM && k->kind != EM_OP_BATCH_NORM_BWD && !running && !ln) ||
        k->in[0].ndim < (running || ln ? 1 : 2)) {
        em_cpu_bad_kind("norm", k->kind);
        return;
    }
    const bool fwd = k->kind == EM_OP_BATCH_NORM || k->kind == EM_OP_LAYER_NORM;
    const int want_in = running ? 1 : fwd ? 3 : 4;
    const int want_out = running ? 2 : fwd ? 2 : 3;
    bool ok = k->n_in == want_in && k->n_out == want_out;
    for (int i = 0; ok && i < k->n_in; i++) ok = k->in[i].dtype == dt;
    for (int i = 0; ok && i < k->n_out; i++) ok = k->out[i].dtype == dt;
    if (!ok) {
        em_cpu_bad_kind("norm operands", k->kind);
        return;
    }
    int64_t M = 0, N = 0;
    if (ln && !ln_geometry(k, fwd, &M, &N)) {
        em_cpu_bad_kind("norm (layer_norm) shapes", k->kind);
        return;
    }
    void *bufs[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in + k->n_out; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    if (ln) {
        if (fwd && dt == EM_F32)
            ln_fwd_float(k, bufs, M, N);
        else if (fwd)
            ln_fwd_double(k, bufs, M, N);
        else if (dt == EM_F32)
            ln_bwd_float(k, bufs, M, N);
        else
            ln_bwd_double(k, bufs, M, N);
    } else if (running) {
        if (dt == EM_F32)
            bn_running_float(k, bufs);
        else
            bn_running_double(k, bufs);
    } else if (k->kind == EM_OP_BATCH_NORM) {
        if (dt == EM_F32)
            bn_fwd_float(k, bufs);
        else
            bn_fwd_double(k, bufs);
    } else {
        if (dt == EM_F32)
            bn_bwd_float(k, bufs);
        else
            bn_bwd_double(k, bufs);
    }
}
