/* CPU kernels: reductions and softmax / log_softmax.
 * Reductions: in[0] has its kept dims first (p.red.nkeep of them) and the
 * reduced dims last; out[0] is contiguous over the kept dims. Float inputs
 * accumulate in double, integer inputs in int64. */
#include "devices/cpu/cpu.h"

#include <math.h>

static inline double ld(int dt, const char *base, int64_t i)
{
    switch (dt) {
    case EM_F32: return ((const float *)base)[i];
    case EM_F64: return ((const double *)base)[i];
    case EM_I32: return ((const int32_t *)base)[i];
    case EM_I64: return (double)((const int64_t *)base)[i];
    default: return ((const uint8_t *)base)[i];
    }
}
static inline int64_t ldi(int dt, const char *base, int64_t i)
{
    switch (dt) {
    case EM_I32: return ((const int32_t *)base)[i];
    case EM_I64: return ((const int64_t *)base)[i];
    case EM_F32: return (int64_t)((const float *)base)[i];
    case EM_F64: return (int64_t)((const double *)base)[i];
    default: return ((const uint8_t *)base)[i];
    }
}
static inline void st(int dt, char *base, int64_t i, double v, int64_t iv, bool use_i)
{
    switch (dt) {
    case EM_F32: ((float *)base)[i] = (float)v; break;
    case EM_F64: ((double *)base)[i] = v; break;
    case EM_I32: ((int32_t *)base)[i] = use_i ? (int32_t)iv : (int32_t)v; break;
    case EM_I64: ((int64_t *)base)[i] = use_i ? iv : (int64_t)v; break;
    case EM_U8: ((uint8_t *)base)[i] = use_i ? (uint8_t)iv : (uint8_t)v; break;
    default: ((uint8_t *)base)[i] = use_i ? iv != 0 : v != 0; break;
    }
}

/* Fast path: f32 sum over the last (unit-stride) dim. */
static inline double sum_f32_contig(const float *x, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        s0 += x[j];
        s1 += x[j + 1];
        s2 += x[j + 2];
        s3 += x[j + 3];
    }
    for (; j < n; j++) s0 += x[j];
    return (s0 + s1) + (s2 + s3);
}

void em_cpu_reduce(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *in = &k->in[0];
    const char *X = em_cpu_ptr(buffers[0]);
    char *Y = em_cpu_ptr(buffers[1]);
    const int dt = in->dtype, odt = k->out[0].dtype;
    const int nk = k->p.red.nkeep, nr = in->ndim - nk;
    const bool is_float = dt == EM_F32 || dt == EM_F64;
    int64_t nred = 1;
    for (int i = nk; i < in->ndim; i++) nred *= in->shape[i];
    int64_t nout = 1;
    for (int i = 0; i < nk; i++) nout *= in->shape[i];
    int64_t oidx[EM_KARGS_MAX_DIMS] = {0};
    int64_t obase = in->offset;
    const int64_t *rst[1] = {in->strides + nk};
    for (int64_t o = 0; o < nout; o++) {
        em_iter it;
        const int64_t off0[1] = {obase};
        em_iter_init(&it, nr, in->shape + nk, 1, rst, off0);
        double acc = 0, acc2 = 0, best = 0;
        int64_t iacc = 0, argbest = 0, pos = 0;
        bool first = true, flag = false;
        switch (k->kind) {
        case EM_OP_SUM:
            if (is_float) {
                EM_ITER_FOREACH_ROW(&it)
                {
                    if (dt == EM_F32 && it.inner_st[0] == 1)
                        acc += sum_f32_contig((const float *)X + it.off[0], it.inner);
                    else
                        for (int64_t j = 0; j < it.inner; j++) acc += ld(dt, X, it.off[0] + j * it.inner_st[0]);
                }
            } else {
                EM_ITER_FOREACH_ROW(&it)
                for (int64_t j = 0; j < it.inner; j++) iacc += ldi(dt, X, it.off[0] + j * it.inner_st[0]);
            }
            st(odt, Y, o, acc, iacc, !is_float);
            break;
        case EM_OP_PROD:
            acc = 1;
            iacc = 1;
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) {
                if (is_float) acc *= ld(dt, X, it.off[0] + j * it.inner_st[0]);
                else iacc *= ldi(dt, X, it.off[0] + j * it.inner_st[0]);
            }
            st(odt, Y, o, acc, iacc, !is_float);
            break;
        case EM_OP_MAX:
        case EM_OP_MIN:
        case EM_OP_ARGMAX:
        case EM_OP_ARGMIN: {
            bool want_max = k->kind == EM_OP_MAX || k->kind == EM_OP_ARGMAX;
            int64_t ibest = 0;
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++, pos++) {
                int64_t e = it.off[0] + j * it.inner_st[0];
                if (is_float) {
                    double v = ld(dt, X, e);
                    if (first || (!isnan(best) && (isnan(v) || (want_max ? v > best : v < best)))) {
                        best = v;
                        argbest = pos;
                    }
                } else {
                    int64_t v = ldi(dt, X, e);
                    if (first || (want_max ? v > ibest : v < ibest)) {
                        ibest = v;
                        argbest = pos;
                    }
                }
                first = false;
            }
            if (k->kind == EM_OP_MAX || k->kind == EM_OP_MIN)
                st(odt, Y, o, best, ibest, !is_float);
            else
                ((int64_t *)Y)[o] = argbest;
            break;
        }
        case EM_OP_ANY:
        case EM_OP_ALL:
            flag = k->kind == EM_OP_ALL;
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) {
                bool nz = ld(dt, X, it.off[0] + j * it.inner_st[0]) != 0;
                if (k->kind == EM_OP_ANY) flag |= nz;
                else flag &= nz;
            }
            ((uint8_t *)Y)[o] = flag;
            break;
        case EM_OP_LOGSUMEXP: {
            best = -INFINITY;
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) {
                double v = ld(dt, X, it.off[0] + j * it.inner_st[0]);
                if (v > best || isnan(v)) best = v;
            }
            if (isinf(best) || isnan(best)) {
                st(odt, Y, o, nred == 0 ? -INFINITY : best, 0, false);
                break;
            }
            em_iter_init(&it, nr, in->shape + nk, 1, rst, off0);
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) acc += exp(ld(dt, X, it.off[0] + j * it.inner_st[0]) - best);
            st(odt, Y, o, best + log(acc), 0, false);
            break;
        }
        case EM_OP_VAR: {
            /* two-pass: mean, then sum of squared deviations / (n - correction) */
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) acc += ld(dt, X, it.off[0] + j * it.inner_st[0]);
            double mean = acc / (double)nred;
            em_iter_init(&it, nr, in->shape + nk, 1, rst, off0);
            EM_ITER_FOREACH_ROW(&it)
            for (int64_t j = 0; j < it.inner; j++) {
                double dv = ld(dt, X, it.off[0] + j * it.inner_st[0]) - mean;
                acc2 += dv * dv;
            }
            double denom = (double)nred - k->p.red.correction;
            st(odt, Y, o, denom > 0 ? acc2 / denom : (denom == 0 ? (acc2 > 0 ? INFINITY : NAN) : NAN), 0, false);
            break;
        }
        default: em_cpu_bad_kind("reduce", k->kind); return;
        }
        /* next kept index */
        for (int d = nk - 1; d >= 0; d--) {
            obase += in->strides[d];
            if (++oidx[d] < in->shape[d]) break;
            obase -= in->strides[d] * in->shape[d];
            oidx[d] = 0;
        }
    }
}

/* softmax / log_softmax along p.axis.dim; in and out may be strided. */
#define SOFTMAX_T(T, S)                                                                              \
    static void softmax_##T(const em_kargs *k, const T *X, T *Y)                                     \
    {                                                                                                \
        const em_tdesc *in = &k->in[0], *out = &k->out[0];                                           \
        int d = k->p.axis.dim, nd = in->ndim;                                                        \
        int64_t L = nd ? in->shape[d] : 1, sx = nd ? in->strides[d] : 1, sy = nd ? out->strides[d] : 1; \
        int64_t shp[EM_KARGS_MAX_DIMS], stx[EM_KARGS_MAX_DIMS], sty[EM_KARGS_MAX_DIMS];               \
        int no = 0;                                                                                  \
        for (int i = 0; i < nd; i++)                                                                 \
            if (i != d) {                                                                            \
                shp[no] = in->shape[i];                                                              \
                stx[no] = in->strides[i];                                                            \
                sty[no] = out->strides[i];                                                           \
                no++;                                                                                \
            }                                                                                        \
        shp[no] = 1;                                                                                 \
        stx[no] = sty[no] = 0;                                                                       \
        no++;                                                                                        \
        const int64_t *sts[2] = {sty, stx};                                                          \
        const int64_t offs[2] = {out->offset, in->offset};                                           \
        em_iter it;                                                                                  \
        em_iter_init(&it, no, shp, 2, sts, offs);                                                    \
        bool log_form = k->kind == EM_OP_LOG_SOFTMAX;                                                \
        EM_ITER_FOREACH_ROW(&it)                                                                     \
        for (int64_t r = 0; r < it.inner; r++) {                                                     \
            const T *x = X + it.off[1] + r * it.inner_st[1];                                         \
            T *y = Y + it.off[0] + r * it.inner_st[0];                                               \
            T m = -INFINITY;                                                                         \
            for (int64_t j = 0; j < L; j++)                                                          \
                if (x[j * sx] > m || x[j * sx] != x[j * sx]) m = x[j * sx];                          \
            if (isinf(m) && m < 0) m = 0;                                                            \
            double s = 0;                                                                            \
            for (int64_t j = 0; j < L; j++) s += exp##S(x[j * sx] - m);                              \
            if (log_form) {                                                                          \
                T ls = (T)log(s);                                                                    \
                for (int64_t j = 0; j < L; j++) y[j * sy] = x[j * sx] - m - ls;                      \
            } else {                                                                                 \
                T inv = (T)(1.0 / s);                                                                \
                for (int64_t j = 0; j < L; j++) y[j * sy] = exp##S(x[j * sx] - m) * inv;             \
            }                                                                                        \
        }                                                                                            \
    }
SOFTMAX_T(float, f)
SOFTMAX_T(double, )

void em_cpu_softmax(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    if (k->in[0].dtype == EM_F32)
        softmax_float(k, em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1]));
    else if (k->in[0].dtype == EM_F64)
        softmax_double(k, em_cpu_ptr(buffers[0]), em_cpu_ptr(buffers[1]));
    else
        em_cpu_bad_kind("softmax dtype", k->in[0].dtype);
}
