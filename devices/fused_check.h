/* The host-side check of a FUSED task's program (devices/kargs.h, "fused
 * element-wise programs"), shared by the device kernels that interpret it
 * (devices/cuda/fused.cu, devices/opencl/fused.c): they check the whole
 * program before launching, so the device-side switch over the kinds never
 * meets one it has no case for, and a bad program fails loudly (the op's
 * sticky error) instead of computing garbage. Plain C that also compiles as
 * C++ (nvcc host code), like devices/collapse.h. */
#ifndef EMBER_DEVICES_FUSED_CHECK_H
#define EMBER_DEVICES_FUSED_CHECK_H

#include "devices/devices.h"
#include "devices/kargs.h"

#include <stdint.h>

/* The arity (1 unary, 2 binary) of a kind a fused program may contain: the
 * EW1 / EWS / EWP / EW2 lines of tasks/ops.def that are not F_CMP, the same
 * lines the interpreters render. 0 for every other kind. */
static inline int em_fused_arity(int kind)
{
    switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw) \
    case EM_OP_##E: return ((fl) & F_CMP) ? 0 : 1;
#define EW2(E, nm, fl, fx, ix, bw) \
    case EM_OP_##E: return ((fl) & F_CMP) ? 0 : 2;
#include "tasks/ops.def"
    default: return 0; /* not an element-wise kind: not fusable */
    }
}

/* NULL when @p k (the em_kargs header of an em_fused_args) and @p p form a
 * program the interpreters can run: kind FUSED, dtype f32 / f64, counts
 * within the EM_FUSED_MAX_* bounds (at least one leaf, instruction and
 * output), rank 1..EM_KARGS_MAX_DIMS, a positive shape whose product is
 * numel, every instruction of a fusable kind (em_fused_arity) reading only
 * registers written before it (leaves, earlier instructions), every out_reg
 * a register of the program. Otherwise what is wrong, with the offending
 * value in *bad (a kind, dtype, count, dim, instruction or output index). */
static inline const char *em_fused_check(const em_kargs *k, const em_fused_prog *p, int *bad)
{
    *bad = k->kind;
    if (k->kind != EM_OP_FUSED) return "fused: not a FUSED op";
    *bad = p->dtype;
    if (p->dtype != EM_F32 && p->dtype != EM_F64) return "fused: program dtype (f32 / f64 only)";
    *bad = p->ndim;
    if (p->ndim < 1 || p->ndim > EM_KARGS_MAX_DIMS) return "fused: program rank";
    *bad = p->n_leaf;
    if (p->n_leaf < 1 || p->n_leaf > EM_FUSED_MAX_LEAVES) return "fused: number of leaves";
    *bad = p->n_instr;
    if (p->n_instr < 1 || p->n_instr > EM_FUSED_MAX_INSTR) return "fused: number of instructions";
    *bad = p->n_out;
    if (p->n_out < 1 || p->n_out > EM_FUSED_MAX_OUT) return "fused: number of outputs";
    int64_t n = 1;
    for (int d = 0; d < p->ndim; d++) {
        *bad = d;
        if (p->shape[d] < 1) return "fused: shape (a dim < 1)";
        n *= p->shape[d];
    }
    *bad = p->ndim;
    if (n != p->numel) return "fused: numel is not the product of the shape";
    for (int j = 0; j < p->n_instr; j++) {
        const em_fused_instr *ins = &p->ins[j];
        const int ar = em_fused_arity(ins->kind);
        *bad = ins->kind;
        if (ar == 0) return "fused: instruction of a kind that cannot be fused";
        *bad = j;
        const int defined = p->n_leaf + j; /* registers written before instruction j */
        if (ins->a < 0 || ins->a >= defined || (ar == 2 && (ins->b < 0 || ins->b >= defined)))
            return "fused: instruction reads a register not yet written";
    }
    for (int o = 0; o < p->n_out; o++) {
        *bad = o;
        if (p->out_reg[o] < 0 || p->out_reg[o] >= p->n_leaf + p->n_instr) return "fused: output register";
    }
    *bad = 0;
    return NULL;
}

#endif
