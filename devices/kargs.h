/* Kernel arguments: the plain struct every Ember codelet receives as cl_arg
 * (STARPU_CL_ARGS, freed by StarPU). Shared by tasks/ (which fills it) and
 * devices/ (which reads it). No StarPU, no autodiff, no modules here. */
#ifndef EMBER_KARGS_H
#define EMBER_KARGS_H

#include <stdint.h>

#define EM_KARGS_MAX_DIMS 8
#define EM_KARGS_MAX_IN 4
#define EM_KARGS_MAX_OUT 4

/** One operand: dtype (em_dtype), rank, sizes, strides and offset in elements
 *  from the start of its StarPU buffer. */
typedef struct em_tdesc {
    int32_t dtype;
    int32_t ndim;
    int64_t offset;
    int64_t shape[EM_KARGS_MAX_DIMS];
    int64_t strides[EM_KARGS_MAX_DIMS];
} em_tdesc;

/** Op parameters (the union member used depends on the op kind). */
union em_op_params {
    struct { double a, b; int32_t i; } s;        /* scalars: clamp lo/hi, exponent, slope, fill */
    struct { int32_t nkeep; uint32_t mask; int32_t keepdim; double correction; } red; /* reductions: kept dims first, reduced last; mask = reduced dims of the original input */
    struct { int32_t dim; } axis;                  /* softmax, gather, scatter, index_select, cat */
    struct { int64_t start; int64_t step; int32_t dim; } slice;
    struct { double start, step, end; int64_t n; int32_t linspace; } range;
    struct { uint64_t seed, offset; double a, b; } rng; /* a,b: low/high, mean/std, p */
    struct { int64_t num_classes; } onehot;
    struct { int64_t perm[EM_KARGS_MAX_DIMS]; } perm;
    struct { double lr, beta1, beta2, eps, weight_decay, momentum, dampening, alpha;
             int64_t step; int32_t flags; } optim;
};

/** What a kernel receives. kind is an enum em_op_kind. */
typedef struct em_kargs {
    int32_t kind;
    int32_t n_in, n_out;
    em_tdesc in[EM_KARGS_MAX_IN];
    em_tdesc out[EM_KARGS_MAX_OUT];
    union em_op_params p;
} em_kargs;

#endif
