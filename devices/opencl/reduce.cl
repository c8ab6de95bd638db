/* Reductions and softmax (semantics of devices/cpu/reduce.c).
 *
 * reduce: one work-group per output element, work-group size a power of two
 * (the host uses 32 for short rows, else the kernel's limit, at most 256).
 * Arguments:
 *   (__global uchar *x, long xboff, long xe,
 *    int nk, long8 kshape, long8 kst,      kept dims (collapsed), row-major order of out
 *    int nr, long8 rshape, long8 rst,      reduced dims (collapsed), row-major order = argmax position
 *    long nred,
 *    __global uchar *y, long yboff, long ye, out is contiguous from ye
 *    int idt, int odt, int op, acc_t correction,
 *    __local acc_t *lv, __local long *li, __local long *lx)   each wg entries
 * Float inputs accumulate in acc_t (double when the device has fp64), integer
 * inputs in long (wrapping). max/min/argmax/argmin pick, like the CPU's
 * sequential scan, the first NaN if any, else the first extreme value: the
 * (value, position) order used to combine partial results is total, so the
 * result does not depend on the work-group size.
 *
 * softmax_<T>: one work-group per row (the dims other than the softmax axis).
 *   (__global uchar *x, long xboff, long xe, __global uchar *y, long yboff, long ye,
 *    int no, long8 oshape, long8 oxst, long8 oyst,   other dims (collapsed)
 *    long L, long sx, long sy, int log_form, __local acc_t *lv) */

inline long em_roff(long j, int nr, const long *rs, const long *rt)
{
    long off = 0;
    for (int d = nr - 1; d > 0; d--) {
        long c = j % rs[d];
        j /= rs[d];
        off += c * rt[d];
    }
    return nr > 0 ? off + j * rt[0] : 0;
}

inline acc_t em_tree_prod(__local acc_t *lv, acc_t v)
{
    const int lid = get_local_id(0), wg = get_local_size(0);
    lv[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg >> 1; s > 0; s >>= 1) {
        if (lid < s) lv[lid] *= lv[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    acc_t r = lv[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* NaN-propagating max (logsumexp / softmax pass 1). */
inline acc_t em_nanmax(acc_t a, acc_t b) { return isnan(a) ? a : isnan(b) ? b : (a > b ? a : b); }

inline acc_t em_tree_nanmax(__local acc_t *lv, acc_t v)
{
    const int lid = get_local_id(0), wg = get_local_size(0);
    lv[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg >> 1; s > 0; s >>= 1) {
        if (lid < s) lv[lid] = em_nanmax(lv[lid], lv[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    acc_t r = lv[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* op: 0 = wrapping sum, 1 = wrapping product, 2 = or, 3 = and. */
inline long em_tree_long(__local long *li, long v, int op)
{
    const int lid = get_local_id(0), wg = get_local_size(0);
    li[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg >> 1; s > 0; s >>= 1) {
        if (lid < s) {
            long a = li[lid], b = li[lid + s];
            li[lid] = op == 0 ? (long)((ulong)a + (ulong)b) : op == 1 ? (long)((ulong)a * (ulong)b)
                    : op == 2 ? (long)(a || b) : (long)(a && b);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    long r = li[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* Is (va, ia) better than (vb, ib)? pos -1 = no element. Floats: NaN first. */
inline int em_better_f(acc_t va, long ia, acc_t vb, long ib, int want_max)
{
    if (ia < 0) return 0;
    if (ib < 0) return 1;
    const int na = isnan(va), nb = isnan(vb);
    if (na || nb) return na && nb ? ia < ib : na;
    if (va != vb) return want_max ? va > vb : va < vb;
    return ia < ib;
}
inline int em_better_i(long va, long ia, long vb, long ib, int want_max)
{
    if (ia < 0) return 0;
    if (ib < 0) return 1;
    if (va != vb) return want_max ? va > vb : va < vb;
    return ia < ib;
}

__kernel void em_reduce(__global const uchar *xb, long xboff, long xe, int nk, long8 kshape, long8 kst, int nr,
                        long8 rshape, long8 rst, long nred, __global uchar *yb, long yboff, long ye, int idt, int odt,
                        int op, acc_t corr, __local acc_t *lv, __local long *li, __local long *lx)
{
    EM_UNPACK(ks, kshape);
    EM_UNPACK(kt, kst);
    EM_UNPACK(rs, rshape);
    EM_UNPACK(rt, rst);
    __global const uchar *X = xb + xboff;
    __global uchar *Y = yb + yboff;
    const long g = get_group_id(0);
    const int lid = get_local_id(0), wg = get_local_size(0);
    const int is_float = idt == EM_DT_F32 || idt == EM_DT_F64;
    long base = xe;
    {
        long r = g;
        for (int d = nk - 1; d >= 0; d--) {
            long c = r % ks[d];
            r /= ks[d];
            base += c * kt[d];
        }
    }
    const long yo = ye + g;

    switch (op) {
    case EM_OP_SUM:
    case EM_OP_PROD: {
        const int prod = op == EM_OP_PROD;
        if (is_float) {
            acc_t acc = prod ? (acc_t)1 : (acc_t)0;
            for (long j = lid; j < nred; j += wg) {
                acc_t v = em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt));
                acc = prod ? acc * v : acc + v;
            }
            acc = prod ? em_tree_prod(lv, acc) : em_tree_sum(lv, acc);
            if (lid == 0) em_st_val(odt, Y, yo, acc, 0, 0);
        } else {
            ulong acc = prod ? 1 : 0;
            for (long j = lid; j < nred; j += wg) {
                ulong v = (ulong)em_ld_long(idt, X, base + em_roff(j, nr, rs, rt));
                acc = prod ? acc * v : acc + v;
            }
            long r = em_tree_long(li, (long)acc, prod);
            if (lid == 0) em_st_val(odt, Y, yo, 0, r, 1);
        }
        break;
    }
    case EM_OP_MAX:
    case EM_OP_MIN:
    case EM_OP_ARGMAX:
    case EM_OP_ARGMIN: {
        const int want_max = op == EM_OP_MAX || op == EM_OP_ARGMAX;
        acc_t bv = 0;
        long bi = 0, bp = -1;
        for (long j = lid; j < nred; j += wg) {
            const long e = base + em_roff(j, nr, rs, rt);
            if (is_float) {
                acc_t v = em_ld_acc(idt, X, e);
                if (em_better_f(v, j, bv, bp, want_max)) bv = v, bp = j;
            } else {
                long v = em_ld_long(idt, X, e);
                if (em_better_i(v, j, bi, bp, want_max)) bi = v, bp = j;
            }
        }
        lv[lid] = bv;
        li[lid] = bi;
        lx[lid] = bp;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = wg >> 1; s > 0; s >>= 1) {
            if (lid < s) {
                const int take = is_float ? em_better_f(lv[lid + s], lx[lid + s], lv[lid], lx[lid], want_max)
                                          : em_better_i(li[lid + s], lx[lid + s], li[lid], lx[lid], want_max);
                if (take) {
                    lv[lid] = lv[lid + s];
                    li[lid] = li[lid + s];
                    lx[lid] = lx[lid + s];
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (lid == 0) {
            long pos = lx[0];
            acc_t v = lv[0];
            long iv = li[0];
            if (pos < 0) pos = 0, v = 0, iv = 0; /* empty: as the CPU */
            if (op == EM_OP_MAX || op == EM_OP_MIN)
                em_st_val(odt, Y, yo, v, iv, !is_float);
            else
                ((__global long *)Y)[yo] = pos;
        }
        break;
    }
    case EM_OP_ANY:
    case EM_OP_ALL: {
        const int any = op == EM_OP_ANY;
        long flag = any ? 0 : 1;
        for (long j = lid; j < nred; j += wg) {
            const int nz = em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt)) != 0;
            flag = any ? (flag || nz) : (flag && nz);
        }
        flag = em_tree_long(li, flag, any ? 2 : 3);
        if (lid == 0) Y[yo] = (uchar)flag;
        break;
    }
    case EM_OP_LOGSUMEXP: {
        acc_t m = -ACC_INF;
        for (long j = lid; j < nred; j += wg) m = em_nanmax(m, em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt)));
        m = em_tree_nanmax(lv, m);
        if (isinf(m) || isnan(m)) {
            if (lid == 0) em_st_val(odt, Y, yo, nred == 0 ? -ACC_INF : m, 0, 0);
            break;
        }
        acc_t acc = 0;
        for (long j = lid; j < nred; j += wg) acc += exp(em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt)) - m);
        acc = em_tree_sum(lv, acc);
        if (lid == 0) em_st_val(odt, Y, yo, m + log(acc), 0, 0);
        break;
    }
    case EM_OP_VAR: {
        acc_t acc = 0;
        for (long j = lid; j < nred; j += wg) acc += em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt));
        const acc_t mean = em_tree_sum(lv, acc) / (acc_t)nred;
        acc_t acc2 = 0;
        for (long j = lid; j < nred; j += wg) {
            const acc_t dv = em_ld_acc(idt, X, base + em_roff(j, nr, rs, rt)) - mean;
            acc2 += dv * dv;
        }
        acc2 = em_tree_sum(lv, acc2);
        const acc_t denom = (acc_t)nred - corr;
        if (lid == 0)
            em_st_val(odt, Y, yo, denom > 0 ? acc2 / denom : (denom == 0 ? (acc2 > 0 ? ACC_INF : (acc_t)NAN) : (acc_t)NAN),
                      0, 0);
        break;
    }
    default: break;
    }
}

#define EM_DEF_SOFTMAX(T, S)                                                                       \
    __kernel void em_softmax_##S(__global const uchar *xb, long xboff, long xe, __global uchar *yb, long yboff, \
                                 long ye, int no, long8 oshape, long8 oxst, long8 oyst, long L, long sx, long sy, \
                                 int log_form, __local acc_t *lv)                                  \
    {                                                                                              \
        EM_UNPACK(sh, oshape);                                                                     \
        EM_UNPACK(s0, oxst);                                                                       \
        EM_UNPACK(s1, oyst);                                                                       \
        __global const T *X = (__global const T *)(xb + xboff);                                    \
        __global T *Y = (__global T *)(yb + yboff);                                                \
        const long row = get_group_id(0);                                                          \
        const int lid = get_local_id(0), wg = get_local_size(0);                                   \
        EM_OFFS2(row, no, sh, s0, xe, xo, s1, ye, yo)                                              \
        acc_t mm = -ACC_INF;                                                                       \
        for (long j = lid; j < L; j += wg) mm = em_nanmax(mm, (acc_t)X[xo + j * sx]);              \
        T m = (T)em_tree_nanmax(lv, mm);                                                           \
        if (isinf(m) && m < 0) m = 0;                                                              \
        acc_t s = 0;                                                                               \
        for (long j = lid; j < L; j += wg) s += (acc_t)exp(X[xo + j * sx] - m);                    \
        s = em_tree_sum(lv, s);                                                                    \
        if (log_form) {                                                                            \
            const T ls = (T)log(s);                                                                \
            for (long j = lid; j < L; j += wg) Y[yo + j * sy] = X[xo + j * sx] - m - ls;           \
        } else {                                                                                   \
            const T inv = (T)((acc_t)1 / s);                                                       \
            for (long j = lid; j < L; j += wg) Y[yo + j * sy] = exp(X[xo + j * sx] - m) * inv;     \
        }                                                                                          \
    }

EM_DEF_SOFTMAX(float, f32)
#ifdef EM_FP64
EM_DEF_SOFTMAX(double, f64)
#endif
