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
#define EM_KARGS_MAX_IN 8 /* SDPA_BWD: dout, q, k, v, o, lse, mask */
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
    /* BATCH_NORM, BATCH_NORM_BWD, LAYER_NORM (tasks/norm.c): eps added to the biased
     * variance; BATCH_NORM_RUNNING: momentum and unbias = M / (M - 1) */
    struct { double eps, momentum, unbias; } bn;
    /* SDPA, SDPA_BWD (tasks/attention.c, the kernel contract): scale of the
     * scores, dropout probability in [0, 1] (0: no dropout), Philox (seed,
     * offset) of the keep mask, causal (top-left aligned) and whether in[3]
     * (forward) / in[6] (backward) is an additive mask */
    struct { double scale, dropout_p; uint64_t seed, offset; int32_t is_causal, has_mask; } attn;
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


/* ---- fused element-wise programs (fusion/fusion.c; kind FUSED) -------------
 *
 * The kernel contract of a FUSED task: a chain of element-wise ops of
 * tasks/ops.def (EW1 / EWS / EWP unary kinds and EW2 binary kinds that are
 * not F_CMP), all of one shape and one float dtype, run as one kernel
 * (DESIGN.md §6). Registers hold one element each: registers 0..n_leaf-1
 * are the leaves (the task's inputs), register n_leaf + i the result of
 * instruction i. Instruction i computes its kind's float_expr of ops.def
 * with x = r[a] (unary) or a = r[a], b = r[b] (binary) and the scalars
 * sa, sb (its p.s.a / p.s.b, converted to T), exactly as the kind's own
 * kernel does, in T = float (EM_F32) or double (EM_F64).
 *
 * Buffers: leaves 0..n_leaf-1 (R; strided, broadcast dims have stride 0),
 * then outputs n_leaf..n_leaf+n_out-1 (W; contiguous from offset 0, numel
 * elements each). Output j holds register out_reg[j].
 *
 * cl_arg is an em_fused_args: its em_kargs header (kind = EM_OP_FUSED,
 * n_in = 0, n_out = 1, out[0] = the shape, for dispatch, messages and the
 * performance model's footprint), then the program. The program alone is
 * small enough (about 2 KiB) to be a CUDA kernel parameter. */
#define EM_FUSED_MAX_LEAVES 12
#define EM_FUSED_MAX_OUT 8
#define EM_FUSED_MAX_INSTR 32
#define EM_FUSED_MAX_REGS (EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_INSTR)

typedef struct em_fused_instr {
    int32_t kind; /* an EW1 / EWS / EWP / EW2 kind (enum em_op_kind), not F_CMP */
    int32_t a, b; /* operand registers (b unused by unary kinds) */
    int32_t pad_;
    double sa, sb; /* the op's p.s.a, p.s.b */
} em_fused_instr;

typedef struct em_fused_leaf {
    int64_t offset;                       /* in elements, from the buffer's start */
    int64_t strides[EM_KARGS_MAX_DIMS];   /* in elements, over shape[] (0 = broadcast) */
} em_fused_leaf;

typedef struct em_fused_prog {
    int32_t dtype; /* EM_F32 or EM_F64: every operand, and the compute type */
    int32_t ndim;  /* 1..EM_KARGS_MAX_DIMS */
    int32_t n_leaf, n_instr, n_out;
    int32_t pad_;
    int64_t numel;                      /* product of shape[], > 0 */
    int64_t shape[EM_KARGS_MAX_DIMS];   /* the shape of every operand (row-major) */
    em_fused_leaf leaf[EM_FUSED_MAX_LEAVES];
    em_fused_instr ins[EM_FUSED_MAX_INSTR];
    int32_t out_reg[EM_FUSED_MAX_OUT];
} em_fused_prog;

typedef struct em_fused_args {
    em_kargs k;
    em_fused_prog prog;
} em_fused_args;


/* ---- captured steps (tasks/capture.c; kind STEP) --------------------------
 *
 * The kernel contract of a STEP task: the tasks a captured step recorded
 * (em_capture_begin / em_capture_end, include/ember/core.h), replayed as ONE
 * task that runs their kernels in recorded order on the worker that runs it
 * (DESIGN.md §6). The STEP task's buffers are every distinct storage the
 * recorded tasks used, read-only ones first (R), then the written ones (RW).
 * Recorded task i (ops[i]) had nb buffers; its j-th is the STEP task's
 * buffer bufs[first_buf + j]; its kernel arguments are args (an em_kargs, or
 * the kind's own ones for F_OWN_ARGS kinds: em_fused_args), except that its
 * parameters are em_step_args.p[patch] when patch >= 0 (the parameters that
 * change from one replay to the next: an optimizer's step count and rate, a
 * random op's Philox offset). A CUDA worker runs each maximal run of
 * recorded tasks that are safe to capture and not patched as one CUDA graph
 * (captured at its first replay on that worker, again when a buffer moved),
 * the others as plain launches. */
#define EM_STEP_MAX_WORKERS 128 /* the per-worker state slots of a plan (StarPU's worker ids) */

typedef struct em_step_op {
    int32_t kind;      /* enum em_op_kind of the recorded task */
    int32_t nb;        /* its number of buffers */
    int32_t first_buf; /* its buffers: the STEP task's bufs[first_buf .. first_buf + nb) */
    int32_t patch;     /* -1, or the index of its replacement parameters in em_step_args.p */
    const void *args;  /* its kernel arguments (em_kargs, or em_fused_args for FUSED) */
} em_step_op;

typedef struct em_step_plan {
    int32_t n_ops, n_patch;
    int32_t n_bufs;                  /* the STEP task's buffers */
    const em_step_op *ops;
    const int32_t *bufs;             /* buffer indices of the ops, see em_step_op.first_buf */
    void *dev[EM_STEP_MAX_WORKERS];  /* per-worker backend state (CUDA graphs), made and freed by the
                                      * backend (em__cuda_step_release) */
} em_step_plan;

typedef struct em_step_args {
    em_kargs k;                  /* kind = EM_OP_STEP, n_in = n_out = 0 (dispatch, messages) */
    const em_step_plan *plan;    /* owned by the step (em_step_free), shared by its replays */
    int64_t replay;              /* 1 for the first replay, then 2, 3, ... */
    const union em_op_params *p; /* n_patch replacement parameters, in the same allocation */
} em_step_args;

#endif
