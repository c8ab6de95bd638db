/* FUSED: an interpreter of a fused element-wise program (the contract:
 * devices/kargs.h, "fused element-wise programs"; host:
 * devices/opencl/fused.c).
 *
 * em_fused_<S>(leaf buffers 0..11, output buffers 0..7, __constant prog,
 *              int nd, int n_leaf, int n_instr, int n_out, long n)
 *   every buffer as (__global uchar *base, long boff): boff already holds
 *   the operand's element offset (in bytes); unused ones are NULL, 0.
 *   prog: the compact program below, built per call by the host, shape and
 *   leaf strides collapsed over the leaves (devices/collapse.h), nd their
 *   rank; n = numel.
 * Work-item i of a grid-stride loop unravels i over the shape, loads each
 * leaf into its register, runs the instructions in order and stores the
 * out_reg registers to the contiguous outputs at i. An instruction is
 * em_fun_<S> (unary) or em_fbin_<S> (binary), the functions generated from
 * the float expressions of tasks/ops.def (devices/opencl/elementwise.c,
 * declared in elementwise.cl), with the scalars sa, sb already rounded to T
 * by the host. The host checked every kind (devices/fused_check.h), so the
 * generated functions' NaN default is never reached.
 *
 * The program is a __constant buffer, not a by-value argument: it is about
 * 2 KiB and PoCL's CL_DEVICE_MAX_PARAMETER_SIZE is 1024 bytes (the least
 * OpenCL allows). */

/* The compact program; the host's em_ocl_fused_head / em_ocl_fused_prog_<S>
 * (devices/opencl/fused.c) have the same layout (checked there). */
typedef struct em_fused_head {
    long shape[EM_MAXD];                       /* collapsed, 0 beyond nd */
    long st[EM_FUSED_MAX_LEAVES][EM_MAXD];     /* leaf strides over shape, elements */
    int ins[EM_FUSED_MAX_INSTR][4];            /* kind, register a, register b, arity (1, 2) */
    int out_reg[EM_FUSED_MAX_OUT];
} em_fused_head;

#define EM_FUSED_BUF(p) __global const uchar *p##b, long p##off
#define EM_FUSED_BUF_W(p) __global uchar *p##b, long p##off
#define EM_FUSED_BUFS                                                                              \
    EM_FUSED_BUF(l0), EM_FUSED_BUF(l1), EM_FUSED_BUF(l2), EM_FUSED_BUF(l3), EM_FUSED_BUF(l4),     \
    EM_FUSED_BUF(l5), EM_FUSED_BUF(l6), EM_FUSED_BUF(l7), EM_FUSED_BUF(l8), EM_FUSED_BUF(l9),     \
    EM_FUSED_BUF(l10), EM_FUSED_BUF(l11),                                                          \
    EM_FUSED_BUF_W(o0), EM_FUSED_BUF_W(o1), EM_FUSED_BUF_W(o2), EM_FUSED_BUF_W(o3),               \
    EM_FUSED_BUF_W(o4), EM_FUSED_BUF_W(o5), EM_FUSED_BUF_W(o6), EM_FUSED_BUF_W(o7)

#define EM_DEF_FUSED(T, S)                                                                         \
    typedef struct em_fused_prog_##S {                                                             \
        em_fused_head h;                                                                           \
        T s[EM_FUSED_MAX_INSTR][2]; /* sa, sb of each instruction, as T */                         \
    } em_fused_prog_##S;                                                                           \
    __kernel void em_fused_##S(EM_FUSED_BUFS, __constant em_fused_prog_##S *p, int nd, int n_leaf, \
                               int n_instr, int n_out, long n)                                     \
    {                                                                                              \
        __global const uchar *lp[EM_FUSED_MAX_LEAVES] = {                                          \
            l0b + l0off, l1b + l1off, l2b + l2off, l3b + l3off, l4b + l4off, l5b + l5off,          \
            l6b + l6off, l7b + l7off, l8b + l8off, l9b + l9off, l10b + l10off, l11b + l11off};     \
        __global uchar *op[EM_FUSED_MAX_OUT] = {o0b + o0off, o1b + o1off, o2b + o2off,             \
                                                o3b + o3off, o4b + o4off, o5b + o5off,             \
                                                o6b + o6off, o7b + o7off};                         \
        EM_GRID_LOOP(i, n)                                                                         \
        {                                                                                          \
            long c[EM_MAXD];                                                                       \
            long rest = i;                                                                         \
            for (int d = nd - 1; d > 0; d--) {                                                     \
                c[d] = rest % p->h.shape[d];                                                       \
                rest /= p->h.shape[d];                                                             \
            }                                                                                      \
            c[0] = rest;                                                                           \
            T r[EM_FUSED_MAX_REGS];                                                                \
            for (int l = 0; l < n_leaf; l++) {                                                     \
                long off = 0;                                                                      \
                for (int d = 0; d < nd; d++) off += c[d] * p->h.st[l][d];                          \
                r[l] = ((__global const T *)lp[l])[off];                                           \
            }                                                                                      \
            for (int j = 0; j < n_instr; j++) {                                                    \
                const int kind = p->h.ins[j][0], ra = p->h.ins[j][1], rb = p->h.ins[j][2];         \
                r[n_leaf + j] = p->h.ins[j][3] == 2 ? em_fbin_##S(kind, r[ra], r[rb])              \
                                                    : em_fun_##S(kind, r[ra], p->s[j][0], p->s[j][1]); \
            }                                                                                      \
            for (int o = 0; o < n_out; o++) ((__global T *)op[o])[i] = r[p->h.out_reg[o]];        \
        }                                                                                          \
    }

EM_DEF_FUSED(float, f32)
#ifdef EM_FP64
EM_DEF_FUSED(double, f64)
#endif
