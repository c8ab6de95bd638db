/* CPU kernel of FUSED: a chain of element-wise ops run as one task (the
 * contract: em_fused_prog, devices/kargs.h; built by fusion/fusion.c).
 *
 * A block interpreter: the operands' dims are collapsed (devices/collapse.h),
 * each row of the innermost dim is cut into blocks of EM_FB elements, and
 * every instruction runs over a whole block of its register (one switch per
 * instruction and block, then a plain loop the compiler vectorizes), so the
 * per-element cost is that of the expressions. The expressions are
 * tasks/ops.def's own, rendered as devices/cpu/elementwise.c renders them:
 * the values are those of the kinds' own kernels. */
#include "devices/cpu/cpu.h"

#include <math.h>
#include <tgmath.h>

#include "devices/cpu/ew_expr.h"

#define EM_FB 256 /* elements per block */

static bool fused_kind_ok(int kind)
{
    switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw) \
    case EM_OP_##E: return !((fl) & F_CMP);
#define EW2(E, nm, fl, fx, ix, bw) \
    case EM_OP_##E: return !((fl) & F_CMP);
#include "tasks/ops.def"
    default: return false;
    }
}

/* One instruction over a block of n elements: D = expr(A[, B]), one case per
 * EW1 / EW2 line of ops.def (F_CMP kinds never reach it: checked first). */
#define FUSED_EW1(E, fx)                                                                                  \
    case EM_OP_##E:                                                                                       \
        for (int j = 0; j < n; j++) {                                                                     \
            const T x = A[j];                                                                             \
            (void)x;                                                                                      \
            D[j] = (T)(fx);                                                                               \
        }                                                                                                 \
        break;
#define FUSED_EW2(E, fx)                                                                                  \
    case EM_OP_##E:                                                                                       \
        for (int j = 0; j < n; j++) {                                                                     \
            const T a = A[j], b = B[j];                                                                   \
            (void)a, (void)b;                                                                             \
            D[j] = (T)(fx);                                                                               \
        }                                                                                                 \
        break;
#define FUSED_APPLY_HEAD(T_)                                                                              \
    static void apply_##T_(int kind, T_ *restrict D, const T_ *restrict A, const T_ *restrict B, int n,  \
                           double dsa, double dsb)                                                        \
    {                                                                                                     \
        typedef T_ T;                                                                                     \
        const T sa = (T)dsa, sb = (T)dsb;                                                                 \
        const double da = dsa, db = dsb;                                                                  \
        (void)sa, (void)sb, (void)da, (void)db, (void)B;                                                  \
        switch (kind) {
#define FUSED_APPLY_TAIL                                                                                  \
        default: em_cpu_bad_kind("fused", kind); /* not reached: em_cpu_fused checks every kind first */ \
        }                                                                                                 \
    }

typedef float f32;
typedef double f64;

FUSED_APPLY_HEAD(f32)
#define EW1(E, nm, fl, fx, ix, bw) FUSED_EW1(E, fx)
#define EW2(E, nm, fl, fx, ix, bw) FUSED_EW2(E, fx)
#include "tasks/ops.def"
FUSED_APPLY_TAIL

FUSED_APPLY_HEAD(f64)
#define EW1(E, nm, fl, fx, ix, bw) FUSED_EW1(E, fx)
#define EW2(E, nm, fl, fx, ix, bw) FUSED_EW2(E, fx)
#include "tasks/ops.def"
FUSED_APPLY_TAIL

static void contiguous_strides(const int64_t *shape, int ndim, int64_t *st)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

/* The interpreter for one compute type T_ (= the storage type). */
#define FUSED_RUN(T_)                                                                                      \
    static void run_##T_(const em_fused_prog *p, void *const *ptr)                                         \
    {                                                                                                      \
        const int nl = p->n_leaf, no = p->n_out, nops = nl + no;                                           \
        const int64_t *st[EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT];                                         \
        int64_t cst[EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT][EM_KARGS_MAX_DIMS], ost[EM_KARGS_MAX_DIMS];   \
        int64_t shape[EM_KARGS_MAX_DIMS];                                                                  \
        contiguous_strides(p->shape, p->ndim, ost);                                                 \
        for (int l = 0; l < nl; l++) st[l] = p->leaf[l].strides;                                           \
        for (int o = 0; o < no; o++) st[nl + o] = ost;                                                     \
        const int nd = em_collapse_dims(p->ndim, p->shape, nops, st, shape, cst);                          \
        const int64_t inner = shape[nd - 1], rows = p->numel / inner;                                      \
        T_ R[EM_FUSED_MAX_REGS][EM_FB];                                                                    \
        int64_t idx[EM_KARGS_MAX_DIMS] = {0}, off[EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT];                  \
        for (int k = 0; k < nops; k++) off[k] = k < nl ? p->leaf[k].offset : 0;                            \
        for (int64_t r = 0; r < rows; r++) {                                                               \
            for (int64_t j0 = 0; j0 < inner; j0 += EM_FB) {                                                \
                const int n = (int)(inner - j0 < EM_FB ? inner - j0 : EM_FB);                              \
                for (int l = 0; l < nl; l++) {                                                             \
                    const T_ *src = (const T_ *)ptr[l] + off[l];                                           \
                    const int64_t s = cst[l][nd - 1];                                                      \
                    T_ *d = R[l];                                                                          \
                    if (s == 1)                                                                            \
                        memcpy(d, src + j0, sizeof(T_) * (size_t)n);                                       \
                    else if (s == 0)                                                                       \
                        for (int j = 0; j < n; j++) d[j] = src[0];                                         \
                    else                                                                                   \
                        for (int j = 0; j < n; j++) d[j] = src[(j0 + j) * s];                              \
                }                                                                                          \
                for (int i = 0; i < p->n_instr; i++) {                                                     \
                    const em_fused_instr *in = &p->ins[i];                                                 \
                    apply_##T_(in->kind, R[nl + i], R[in->a], R[in->b], n, in->sa, in->sb);                \
                }                                                                                          \
                for (int o = 0; o < no; o++)                                                               \
                    memcpy((T_ *)ptr[nl + o] + off[nl + o] + j0, R[p->out_reg[o]], sizeof(T_) * (size_t)n); \
            }                                                                                              \
            for (int d = nd - 2; d >= 0; d--) { /* next row */                                             \
                if (++idx[d] < shape[d]) {                                                                 \
                    for (int k = 0; k < nops; k++) off[k] += cst[k][d];                                    \
                    break;                                                                                 \
                }                                                                                          \
                for (int k = 0; k < nops; k++) off[k] -= cst[k][d] * (shape[d] - 1);                       \
                idx[d] = 0;                                                                                \
            }                                                                                              \
        }                                                                                                  \
    }

FUSED_RUN(f32)
FUSED_RUN(f64)

void em_cpu_fused(void *buffers[], void *cl_arg)
{
    const em_fused_args *fa = cl_arg;
    const em_fused_prog *p = &fa->prog;
    if (p->n_leaf < 1 || p->n_leaf > EM_FUSED_MAX_LEAVES || p->n_instr < 1 || p->n_instr > EM_FUSED_MAX_INSTR ||
        p->n_out < 1 || p->n_out > EM_FUSED_MAX_OUT || p->ndim < 1 || p->ndim > EM_KARGS_MAX_DIMS || p->numel < 1) {
        em_cpu_bad_kind("fused (program size)", p->n_instr);
        return;
    }
    for (int i = 0; i < p->n_instr; i++) {
        const em_fused_instr *in = &p->ins[i];
        const int nreg = p->n_leaf + i;
        if (!fused_kind_ok(in->kind) || in->a < 0 || in->a >= nreg || in->b < 0 || in->b >= nreg) {
            em_cpu_bad_kind("fused (instruction)", in->kind);
            return;
        }
    }
    for (int o = 0; o < p->n_out; o++)
        if (p->out_reg[o] < 0 || p->out_reg[o] >= p->n_leaf + p->n_instr) {
            em_cpu_bad_kind("fused (output register)", p->out_reg[o]);
            return;
        }
    void *ptr[EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT];
    for (int k = 0; k < p->n_leaf + p->n_out; k++) ptr[k] = em_cpu_ptr(buffers[k]);
    switch (p->dtype) {
    case EM_F32: run_f32(p, ptr); break;
    case EM_F64: run_f64(p, ptr); break;
    default: em_cpu_bad_kind("fused dtype", p->dtype);
    }
}
