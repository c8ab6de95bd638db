/* CPU kernels for the indexing ops: gather, index_select, scatter,
 * scatter_add, index_add, one_hot. The contracts are described at the top of
 * tasks/index.c. Index operands are i64. Every index value is checked against
 * the size of its dim before anything is written: an out-of-range (or
 * negative) value is the sticky kernel error EM_ERR_INVALID (reported by the
 * next em_sync / em_to_host / em_item), as PyTorch raises; the output is then
 * not written. Nothing is ever read or written out of bounds. */
#include "devices/cpu/cpu.h"

#include <inttypes.h>
#include <string.h>

/* Every value of the index operand D (i64, iterated over D's own shape) in
 * [0, n)? If not: the sticky kernel error naming the first bad value, and
 * false. */
static bool index_in_range(const em_kargs *k, const em_tdesc *D, const int64_t *I, int64_t n, int dim)
{
    const int64_t *st[1] = {D->strides};
    const int64_t off[1] = {D->offset};
    em_iter it;
    em_iter_init(&it, D->ndim, D->shape, 1, st, off);
    EM_ITER_FOREACH_ROW(&it)
    {
        const int64_t *ip = I + it.off[0];
        for (int64_t j = 0; j < it.inner; j++) {
            const int64_t v = ip[j * it.inner_st[0]];
            if (v < 0 || v >= n) {
                if (k->kind == EM_OP_ONE_HOT)
                    em__kernel_error(k, EM_ERR_INVALID, "%s: index %" PRId64 " is out of range for num_classes %" PRId64,
                                     em__kernel_info[k->kind].name, v, n);
                else
                    em__kernel_error(k, EM_ERR_INVALID, "%s: index %" PRId64 " is out of range for dim %d of size %" PRId64,
                                     em__kernel_info[k->kind].name, v, dim, n);
                return false;
            }
        }
    }
    return true;
}

/* ---- gather / index_select ------------------------------------------------ */

/* Iterates over out's shape with operands (out, index, a with its dim stride
 * zeroed); the selected element of a adds index * a.strides[dim]. */
#define GATHER_T(T)                                                                                   \
    do {                                                                                              \
        const T *A_ = (const T *)a;                                                                   \
        T *Y_ = (T *)y;                                                                               \
        EM_ITER_FOREACH_ROW(&it)                                                                      \
        {                                                                                             \
            const int64_t so_ = it.inner_st[0], si_ = it.inner_st[1], sa_ = it.inner_st[2];           \
            T *yp_ = Y_ + it.off[0];                                                                  \
            const int64_t *ip_ = I + it.off[1];                                                       \
            const T *ap_ = A_ + it.off[2];                                                            \
            for (int64_t j = 0; j < it.inner; j++) {                                                  \
                const int64_t v_ = ip_[j * si_];                                                      \
                yp_[j * so_] = (v_ >= 0 && v_ < n) ? ap_[j * sa_ + v_ * sd] : (T)0;                    \
            }                                                                                         \
        }                                                                                             \
    } while (0)

static void gather(const em_kargs *k, void **bufs, bool index_select)
{
    const em_tdesc *A = &k->in[0], *Ix = &k->in[1], *O = &k->out[0];
    const int dim = k->p.axis.dim;
    const void *a = bufs[0];
    const int64_t *I = (const int64_t *)bufs[1];
    void *y = bufs[2];
    int64_t ist[EM_KARGS_MAX_DIMS], ast[EM_KARGS_MAX_DIMS];
    for (int d = 0; d < O->ndim; d++) {
        ast[d] = d == dim ? 0 : A->strides[d];
        if (index_select)
            ist[d] = d == dim ? Ix->strides[0] : 0;
        else
            ist[d] = Ix->strides[d];
    }
    const int64_t *st[3] = {O->strides, ist, ast};
    const int64_t off[3] = {O->offset, Ix->offset, A->offset};
    em_iter it;
    em_iter_init(&it, O->ndim, O->shape, 3, st, off);
    const int64_t n = A->shape[dim], sd = A->strides[dim];
    if (!index_in_range(k, Ix, I, n, dim)) return;
    switch (em_cpu_dtype_size(A->dtype)) {
    case 1: GATHER_T(uint8_t); break;
    case 4: GATHER_T(uint32_t); break;
    case 8: GATHER_T(uint64_t); break;
    default: em_cpu_bad_kind("gather dtype", A->dtype);
    }
}

/* ---- scatter / scatter_add ------------------------------------------------ */

/* out <- self (same dtype), strided to strided. */
static void copy_same(const em_tdesc *S, const void *s, const em_tdesc *O, void *y)
{
    const int64_t *st[2] = {O->strides, S->strides};
    const int64_t off[2] = {O->offset, S->offset};
    em_iter it;
    em_iter_init(&it, O->ndim, O->shape, 2, st, off);
    const size_t es = em_cpu_dtype_size(O->dtype);
    EM_ITER_FOREACH_ROW(&it)
    {
        char *yp = (char *)y + it.off[0] * (int64_t)es;
        const char *sp = (const char *)s + it.off[1] * (int64_t)es;
        const int64_t so = it.inner_st[0], si = it.inner_st[1];
        if (so == 1 && si == 1) {
            memcpy(yp, sp, (size_t)it.inner * es);
        } else {
            for (int64_t j = 0; j < it.inner; j++) memcpy(yp + j * so * (int64_t)es, sp + j * si * (int64_t)es, es);
        }
    }
}

/* Iterates over index's shape with operands (index, src, out with its dim
 * stride zeroed). OP(dst, val) combines. */
#define SCATTER_T(T, OP)                                                                              \
    do {                                                                                              \
        const T *S_ = (const T *)src;                                                                 \
        T *Y_ = (T *)y;                                                                               \
        EM_ITER_FOREACH_ROW(&it)                                                                      \
        {                                                                                             \
            const int64_t si_ = it.inner_st[0], ss_ = it.inner_st[1], so_ = it.inner_st[2];           \
            const int64_t *ip_ = I + it.off[0];                                                       \
            const T *sp_ = S_ + it.off[1];                                                            \
            T *yp_ = Y_ + it.off[2];                                                                  \
            for (int64_t j = 0; j < it.inner; j++) {                                                  \
                const int64_t v_ = ip_[j * si_];                                                      \
                if (v_ < 0 || v_ >= n) continue;                                                      \
                OP(yp_[j * so_ + v_ * sd], sp_[j * ss_]);                                             \
            }                                                                                         \
        }                                                                                             \
    } while (0)

#define SET_(dst, v) ((dst) = (v))
#define ADD_(dst, v) ((dst) += (v))
#define OR_(dst, v) ((dst) = (uint8_t)((dst) || (v)))

static void scatter(const em_kargs *k, void **bufs)
{
    const em_tdesc *Sf = &k->in[0], *Ix = &k->in[1], *Sr = &k->in[2], *O = &k->out[0];
    const int dim = k->p.axis.dim;
    const int64_t *I = (const int64_t *)bufs[1];
    const void *src = bufs[2];
    void *y = bufs[3];
    if (!index_in_range(k, Ix, I, O->shape[dim], dim)) return;
    copy_same(Sf, bufs[0], O, y);
    int64_t ost[EM_KARGS_MAX_DIMS];
    for (int d = 0; d < O->ndim; d++) ost[d] = d == dim ? 0 : O->strides[d];
    const int64_t *st[3] = {Ix->strides, Sr->strides, ost};
    const int64_t off[3] = {Ix->offset, Sr->offset, O->offset};
    em_iter it;
    em_iter_init(&it, Ix->ndim, Ix->shape, 3, st, off);
    const int64_t n = O->shape[dim], sd = O->strides[dim];
    if (k->kind == EM_OP_SCATTER) {
        switch (em_cpu_dtype_size(O->dtype)) {
        case 1: SCATTER_T(uint8_t, SET_); break;
        case 4: SCATTER_T(uint32_t, SET_); break;
        case 8: SCATTER_T(uint64_t, SET_); break;
        default: em_cpu_bad_kind("scatter dtype", O->dtype);
        }
        return;
    }
    switch (O->dtype) {
    case EM_F32: SCATTER_T(float, ADD_); break;
    case EM_F64: SCATTER_T(double, ADD_); break;
    case EM_I32: SCATTER_T(int32_t, ADD_); break;
    case EM_I64: SCATTER_T(int64_t, ADD_); break;
    case EM_U8: SCATTER_T(uint8_t, ADD_); break;
    case EM_BOOL: SCATTER_T(uint8_t, OR_); break;
    default: em_cpu_bad_kind("scatter_add dtype", O->dtype);
    }
}

/* ---- index_add ---------------------------------------------------------------- */

/* For j = 0..N-1 in order, the slice j of src (dim removed) is added to the
 * slice index[j] of out; R0 is an iterator over the slice's shape with
 * operands (out, src) and offsets 0, copied for every j. Each output element
 * thus sums its contributions in ascending j. */
#define INDEX_ADD_T(T, OP)                                                                            \
    do {                                                                                              \
        const T *S_ = (const T *)src;                                                                 \
        T *Y_ = (T *)y;                                                                               \
        for (int64_t j = 0; j < N; j++) {                                                             \
            const int64_t v_ = I[j * si];                                                             \
            T *yb_ = Y_ + O->offset + v_ * sdo;                                                       \
            const T *sb_ = S_ + Sr->offset + j * sds;                                                 \
            if (R0.ndim == 1) { /* one row (a contiguous slice): no iterator copy */                  \
                const int64_t so_ = R0.inner_st[0], ss_ = R0.inner_st[1];                             \
                if (so_ == 1 && ss_ == 1) {                                                           \
                    for (int64_t c = 0; c < R0.inner; c++) OP(yb_[c], sb_[c]);                        \
                } else {                                                                              \
                    for (int64_t c = 0; c < R0.inner; c++) OP(yb_[c * so_], sb_[c * ss_]);            \
                }                                                                                     \
                continue;                                                                             \
            }                                                                                         \
            em_iter it = R0;                                                                          \
            EM_ITER_FOREACH_ROW(&it)                                                                  \
            {                                                                                         \
                T *yp_ = yb_ + it.off[0];                                                             \
                const T *sp_ = sb_ + it.off[1];                                                       \
                const int64_t so_ = it.inner_st[0], ss_ = it.inner_st[1];                             \
                if (so_ == 1 && ss_ == 1) {                                                           \
                    for (int64_t c = 0; c < it.inner; c++) OP(yp_[c], sp_[c]);                        \
                } else {                                                                              \
                    for (int64_t c = 0; c < it.inner; c++) OP(yp_[c * so_], sp_[c * ss_]);            \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    } while (0)

static void index_add(const em_kargs *k, void **bufs)
{
    const em_tdesc *Sf = &k->in[0], *Ix = &k->in[1], *Sr = &k->in[2], *O = &k->out[0];
    const int dim = k->p.axis.dim;
    const int64_t *I = (const int64_t *)bufs[1] + Ix->offset;
    const void *src = bufs[2];
    void *y = bufs[3];
    if (dim < 0 || dim >= O->ndim || Ix->ndim != 1 || Sr->ndim != O->ndim) {
        em_cpu_bad_kind("index_add operands (dim / rank)", dim);
        return;
    }
    if (!index_in_range(k, Ix, (const int64_t *)bufs[1], O->shape[dim], dim)) return;
    copy_same(Sf, bufs[0], O, y);
    const int64_t N = Ix->shape[0], si = Ix->strides[0], sdo = O->strides[dim], sds = Sr->strides[dim];
    int64_t shp[EM_KARGS_MAX_DIMS], sto[EM_KARGS_MAX_DIMS], sts[EM_KARGS_MAX_DIMS];
    int nr = 0;
    for (int d = 0; d < O->ndim; d++) {
        if (d == dim) continue;
        shp[nr] = O->shape[d];
        sto[nr] = O->strides[d];
        sts[nr] = Sr->strides[d];
        nr++;
    }
    const int64_t *st[2] = {sto, sts};
    const int64_t off[2] = {0, 0};
    em_iter R0;
    em_iter_init(&R0, nr, shp, 2, st, off);
    if (R0.done || N == 0) return;
    switch (O->dtype) {
    case EM_F32: INDEX_ADD_T(float, ADD_); break;
    case EM_F64: INDEX_ADD_T(double, ADD_); break;
    case EM_I32: INDEX_ADD_T(int32_t, ADD_); break;
    case EM_I64: INDEX_ADD_T(int64_t, ADD_); break;
    case EM_U8: INDEX_ADD_T(uint8_t, ADD_); break;
    case EM_BOOL: INDEX_ADD_T(uint8_t, OR_); break;
    default: em_cpu_bad_kind("index_add dtype", O->dtype);
    }
}

/* ---- one_hot ---------------------------------------------------------------- */

static void one_hot(const em_kargs *k, void **bufs)
{
    const em_tdesc *Ix = &k->in[0], *O = &k->out[0];
    const int64_t *I = (const int64_t *)bufs[0];
    int64_t *Y = (int64_t *)bufs[1];
    const int nd = Ix->ndim;
    const int64_t C = k->p.onehot.num_classes, sc = O->strides[nd];
    if (!index_in_range(k, Ix, I, C, 0)) return;
    const int64_t *st[2] = {Ix->strides, O->strides};
    const int64_t off[2] = {Ix->offset, O->offset};
    em_iter it;
    em_iter_init(&it, nd, Ix->shape, 2, st, off);
    EM_ITER_FOREACH_ROW(&it)
    {
        const int64_t si = it.inner_st[0], so = it.inner_st[1];
        for (int64_t j = 0; j < it.inner; j++) {
            const int64_t v = I[it.off[0] + j * si];
            int64_t *row = Y + it.off[1] + j * so;
            for (int64_t c = 0; c < C; c++) row[c * sc] = 0;
            if (v >= 0 && v < C) row[v * sc] = 1;
        }
    }
}

void em_cpu_index(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    void *bufs[EM_KARGS_MAX_IN + EM_KARGS_MAX_OUT];
    for (int i = 0; i < k->n_in + k->n_out; i++) bufs[i] = em_cpu_ptr(buffers[i]);
    switch (k->kind) {
    case EM_OP_GATHER: gather(k, bufs, false); break;
    case EM_OP_INDEX_SELECT: gather(k, bufs, true); break;
    case EM_OP_SCATTER:
    case EM_OP_SCATTER_ADD: scatter(k, bufs); break;
    case EM_OP_INDEX_ADD: index_add(k, bufs); break;
    case EM_OP_ONE_HOT: one_hot(k, bufs); break;
    default: em_cpu_bad_kind("index", k->kind);
    }
}
