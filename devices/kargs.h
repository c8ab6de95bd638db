/* Kernel arguments: the plain struct every Ember codelet receives as cl_arg
 * (STARPU_CL_ARGS, freed by StarPU). Shared by tasks/ (which fills it) and
 * devices/ (which reads it), with the optimizer flags (end of file). No
 * StarPU, no autodiff, no modules here. */
#ifndef EMBER_KARGS_H
#define EMBER_KARGS_H

#include <stdint.h>

/* The few internals the white-box tests and benchmarks reach
 * (tests/CMakeLists.txt). Normally hidden like every em__ symbol (those
 * tests link the library's objects); a build with -DEMBER_TEST_EXPORTS=ON
 * (the GPU pack, scripts/gpu-pack.sh, where six private copies of the
 * objects would not fit the carry limit) exports them from libember.so and
 * links the tests to it. Not API either way. */
#ifdef EMBER_TEST_EXPORTS
#define EM_TEST_API __attribute__((visibility("default")))
#else
#define EM_TEST_API
#endif

#define EM_KARGS_MAX_DIMS 8
#define EM_KARGS_MAX_IN 8
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
    /* CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_WEIGHT: (h, w) pairs; padding is
     * symmetric (asymmetric padding is an explicit pad by the front end) */
    struct { int32_t stride[2], pad[2], dilation[2]; int32_t groups; } conv;
    /* MAX_POOL2D, AVG_POOL2D, AVG_POOL2D_BWD: (h, w) pairs; adaptive: windows
     * [floor(o*I/O), ceil((o+1)*I/O)) and the other fields unused;
     * divisor 0 = none (avg only) */
    struct { int32_t kernel[2], stride[2], pad[2], dilation[2]; int32_t adaptive, count_include_pad; int64_t divisor; } pool;
    /* BATCH_NORM, BATCH_NORM_BWD (tasks/norm.c): eps added to the biased batch
     * variance; BATCH_NORM_RUNNING: momentum and unbias = M / (M - 1) */
    struct { double eps, momentum, unbias; } bn;
    struct { double lr, beta1, beta2, eps, weight_decay, momentum, dampening, alpha;
             int64_t step; int32_t flags; } optim;
    struct { double scale, dropout_p; uint64_t seed, offset; int32_t is_causal, has_mask; } attn;
};

/** What a kernel receives. kind is an enum em_op_kind. */
typedef struct em_kargs {
    int32_t kind;
    int32_t n_in, n_out;
    em_tdesc in[EM_KARGS_MAX_IN];
    em_tdesc out[EM_KARGS_MAX_OUT];
    union em_op_params p;
} em_kargs;

/* ---- optimizer steps ----------------------------------------------------
 *
 * The kernel contract of the fused optimizer ops (tasks/ops.def: SGD_STEP,
 * ADAM_STEP, RMSPROP_STEP, ADAGRAD_STEP), shared by the front end
 * (optim/optim.c) and the kernels (devices/cpu, cuda, opencl optim).
 *
 * Buffers: in[0] = gradient, contiguous, same dtype (f32/f64) and numel as the
 * parameter; out[0] = parameter (contiguous, may have an offset); out[1..] =
 * state buffers (contiguous, fresh) in the order below, present when their
 * flag says so. All outputs are RW (F_INPLACE).
 *
 * Hyper-parameters in p.optim (doubles; the kernel rounds them to the tensor
 * dtype exactly where PyTorch does, so f32 results match torch.optim):
 *   SGD_STEP:     lr, momentum, dampening, weight_decay; flags MOMENTUM (out[1] =
 *                 momentum_buffer), INIT_BUF (first step: buffer = d_p), NESTEROV.
 *   ADAM_STEP:    lr, beta1, beta2, eps, weight_decay, step (1-based, after
 *                 increment); flags AMSGRAD (out[3] = max_exp_avg_sq),
 *                 DECOUPLED (AdamW: p *= 1 - lr*wd before the update).
 *   RMSPROP_STEP: lr, alpha, eps, weight_decay, momentum; flags MOMENTUM
 *                 (next out = momentum_buffer), CENTERED (next out = grad_avg).
 *   ADAGRAD_STEP: lr (already decayed: clr = lr / (1 + (step-1)*lr_decay)),
 *                 eps, weight_decay.
 * MAXIMIZE negates the gradient first (all kinds). */
enum {
    EM_OPTIM_F_MOMENTUM = 1 << 0,
    EM_OPTIM_F_INIT_BUF = 1 << 1,
    EM_OPTIM_F_NESTEROV = 1 << 2,
    EM_OPTIM_F_AMSGRAD = 1 << 3,
    EM_OPTIM_F_DECOUPLED = 1 << 4,
    EM_OPTIM_F_CENTERED = 1 << 5,
    EM_OPTIM_F_MAXIMIZE = 1 << 6,
};

#endif
