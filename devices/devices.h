/* What the kernels (devices/) see of the rest of Ember, and what tasks/ sees
 * of the kernels: the op kinds (tasks/ops.def is the table every kernel table
 * is indexed by), the op flags, the CPU kernels the table names, one table of
 * kernels per accelerator and the device start/stop hooks.
 *
 * devices/ include this header, devices/kargs.h (the kernel arguments),
 * <ember/core.h> (dtypes, status, logging, em_set_error) and their own
 * headers; nothing else of Ember (scripts/check-layers.py checks it). No
 * StarPU here: kernels include <starpu.h> themselves. C and C++ (nvcc). */
#ifndef EMBER_DEVICES_H
#define EMBER_DEVICES_H

#include "devices/kargs.h"
#include <stdarg.h>
#include "ember/core.h"

#ifdef __cplusplus
extern "C" {
#endif

enum em_op_kind {
#define OP(E, nm, nin, nout, fl, fam, bw) EM_OP_##E,
#include "tasks/ops.def"
    EM_OP_COUNT
};

/* Op flags (the flags column of tasks/ops.def). */
enum {
    F_EW = 1u << 0,
    F_VIEW = 1u << 1,
    F_DIFF = 1u << 2,
    F_CMP = 1u << 3,
    F_INPLACE = 1u << 4,  /* outputs are read-modify-write (optimizer updates): always RW */
    F_FLOAT = 1u << 5,    /* float math: integer inputs are promoted to f32 by the front end */
    F_SAVE_OUT = 1u << 6, /* the backward function reads the op's output */
    F_SCALAR = 1u << 7,   /* tensor-scalar op (EWS): the scalar is p.s.a */
    F_COLLECTIVE = 1u << 8, /* a collective (dist/): operands in em_op.var (RW), kernel arguments in
                             * em_op.args, placed by em_op.place; no consistency case, no performance model */
    F_NOWHERE = 1u << 9,    /* runs nowhere (a fence): only orders other tasks */
    F_SAVE_AUX = 1u << 10,  /* the backward function reads the op's out[1] (max_pool2d's indices) */
    /* Autocast (include/ember/amp.h, tasks/amp.c em__autocast_dtype): inside an
     * em_autocast_begin(EM_BF16 / EM_F16) region, the front end casts the op's
     * f32/f16/bf16 inputs (recorded em_cast) to the region's low dtype (F_AC_LOW)
     * or to f32 (F_AC_F32) before it allocates the output; f64 and integer
     * inputs are left alone, as torch.autocast. Neither flag: the usual
     * promotion. The lists follow torch.amp's CUDA op lists ("ops that can
     * autocast to float16" / "to float32"). */
    F_AC_LOW = 1u << 11,    /* autocast runs it in the low dtype (matmul, conv) */
    F_AC_F32 = 1u << 12,    /* autocast runs it in f32 (softmax, exp/log, pow, sums, norms) */
    F_OWN_ARGS = 1u << 13,  /* FUSED, STEP: operands in em_op.var (the last n_var_w written: W, RW
                             * with F_INPLACE), kernel arguments (starting with an em_kargs) in em_op.args */
};

/** A StarPU kernel function: buffers (inputs, then outputs), cl_arg an em_kargs. */
typedef void (*em_kernel_fn)(void *buffers[], void *cl_arg);

/* CPU kernels (devices/cpu): em_cpu_<family> for each kernel family of
 * tasks/ops.def (CUDA: em_cuda_<family>, OpenCL: em_ocl_<family>). */
void em_cpu_unary(void *buffers[], void *cl_arg);
void em_cpu_binary(void *buffers[], void *cl_arg);
void em_cpu_where(void *buffers[], void *cl_arg);
void em_cpu_reduce(void *buffers[], void *cl_arg);
void em_cpu_softmax(void *buffers[], void *cl_arg);
void em_cpu_matmul(void *buffers[], void *cl_arg);
void em_cpu_copy(void *buffers[], void *cl_arg);
void em_cpu_index(void *buffers[], void *cl_arg);
void em_cpu_fill(void *buffers[], void *cl_arg);
void em_cpu_optim(void *buffers[], void *cl_arg);
void em_cpu_conv(void *buffers[], void *cl_arg);
void em_cpu_pool(void *buffers[], void *cl_arg);
void em_cpu_norm(void *buffers[], void *cl_arg);
void em_cpu_attention(void *buffers[], void *cl_arg);
void em_cpu_fused(void *buffers[], void *cl_arg); /* the contract: em_fused_prog (devices/kargs.h) */
void em_cpu_step(void *buffers[], void *cl_arg);  /* the contract: em_step_plan (devices/kargs.h) */

/** What a kernel may know of an op kind: its name (messages), its flags, its
 *  number of inputs and its CPU kernel (host fallbacks). Built from
 *  tasks/ops.def by devices/cpu/kernel_info.c. */
typedef struct em_kernel_info {
    const char *name;
    unsigned flags;
    int n_in;
    em_kernel_fn cpu; /* NULL for views */
} em_kernel_info;
extern const em_kernel_info em__kernel_info[EM_OP_COUNT];

/* Device kernel tables [op], filled by devices/<dev>/ from the family column
 * of tasks/ops.def (NULL only for views). Weak defaults (all NULL, backend
 * not compiled) live in tasks/funnel.c; em__<dev>_compiled() says whether
 * the backend is compiled in, and em__codelets_init then refuses to start
 * when a task op has no entry. */
EM_TEST_API extern em_kernel_fn em__cuda_kernels[EM_OP_COUNT];
EM_TEST_API extern em_kernel_fn em__opencl_kernels[EM_OP_COUNT];
/* Which kernels load and store f16 / bf16 themselves, per backend [op], from
 * the family column (each backend lists its half families next to its
 * kernel table: CPU devices/cpu/kernel_info.c, CUDA devices/cuda/kernels.cu,
 * OpenCL devices/opencl/opencl.c; weak all-false defaults in
 * tasks/funnel.c). The door runs a task with f16/bf16 operands only on the
 * backends whose entry is true, and widens the op (f32 copies in, the f32
 * kernel, rounding copies out: the same values, three tasks) when none of
 * its placement's backends has one (DESIGN.md §7). */
EM_TEST_API extern const bool em__cpu_half[EM_OP_COUNT];
EM_TEST_API extern const bool em__cuda_half[EM_OP_COUNT];
EM_TEST_API extern const bool em__opencl_half[EM_OP_COUNT];
bool em__cuda_compiled(void);
bool em__opencl_compiled(void);
/* Device start/stop hooks, called by the tasks layer's start-up and shutdown
 * (tasks/init.c; weak no-op defaults in tasks/funnel.c). */
em_status em__cuda_init(void);
void em__cuda_shutdown(void);
em_status em__opencl_init(void);
void em__opencl_shutdown(void);
/* One line per OpenCL device with a program for `ember devices`
 * (em_print_devices): how it stores f16 / bf16 (weak no-op default in
 * tasks/funnel.c). */
void em__opencl_describe(FILE *f);

/* ---- how a kernel reports a failure (DESIGN.md §10) ---------------------
 * A kernel never aborts and never prints: when it cannot do its work (a CUDA
 * or OpenCL error, a cuBLAS status, an op/dtype it was not built for) it
 * calls em__kernel_error and returns. The error becomes the process's sticky
 * error, which the next em_sync, em_to_host or em_item returns; its message
 * names the op, the device (cpu / cuda:N / opencl:N and the worker) and the
 * operand shapes and dtypes. The outputs of a failed kernel are undefined;
 * the process goes on. Implemented in devices/cpu/kerror.c; the dispatchers
 * of tasks/ bracket every kernel with em__kernel_enter / em__kernel_leave and
 * set the sink that turns the report into the sticky error. */

/** Records a failure of the kernel described by @p k (NULL: the kernel the
 *  calling worker is running, as set by em__kernel_enter). @p fmt says what
 *  failed ("CUDA error in copy (memcpy): out of memory"). Only the first
 *  error until the next report is kept; later ones are counted. */
void em__kernel_error(const em_kargs *k, em_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** The same with a va_list. */
void em__kernel_verror(const em_kargs *k, em_status st, const char *fmt, va_list ap);
/** The calling worker starts / ends running the kernel of @p k. */
void em__kernel_enter(const em_kargs *k);
void em__kernel_leave(void);
/* Trial runs (a CUDA graph capture of a step, devices/cuda/step.cu): between
 * em__kernel_trial_begin and em__kernel_trial_end, kernel errors of the
 * calling thread are counted instead of reported; _end returns the count. */
/* Runs recorded task @p o of the step replay @p a (devices/kargs.h, STEP)
 * with kernel @p fn of the calling backend, on its buffers among the STEP
 * task's @p buffers (devices/cpu/step.c; the CPU, CUDA and OpenCL step
 * kernels use it). */
void em__step_run_op(const em_step_args *a, const em_step_op *o, void *const *buffers, em_kernel_fn fn);
void em__kernel_trial_begin(void);
int em__kernel_trial_end(void);
/** Formats "[2, 3] float32, [3] int64" (or "none") for @p count operands. */
void em__kernel_operands(char *buf, size_t n, const em_tdesc *d, int count);
/** Where reports go (set by tasks/ at start-up): st, the StarPU worker that
 *  ran the kernel, the op's name (NULL when unknown), what failed, and the
 *  formatted inputs and outputs. */
typedef void (*em_kernel_error_sink)(em_status st, int worker, const char *op, const char *what, const char *ins,
                                     const char *outs);
void em__kernel_set_error_sink(em_kernel_error_sink sink);

#ifdef __cplusplus
}
#endif
#endif
