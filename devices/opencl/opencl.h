/* Shared internals of the OpenCL kernels (devices/opencl/<name>.c).
 *
 * One OpenCL program per OpenCL device, built once by em__opencl_init from
 * the embedded sources (em_cl_source: every devices/opencl/<name>.cl, concatenated
 * in name order, common.cl first) behind a generated prefix that #defines the
 * op kinds (EM_OP_*) and dtype codes (EM_DT_*) so the .cl code and
 * tasks/ops.def can never drift apart.
 *
 * Host functions follow one pattern:
 *   em_ocl_ctx c;  if (!em_ocl_enter(&c, k, "what")) return;   // device of the calling worker
 *   em_ocl_args a = em_ocl_args_begin(&c, EMK_xxx);            // takes the device lock
 *   ...arguments...
 *   em_ocl_launch(&a, 1, gsize, lsize, "what");                // enqueues, releases the lock
 * Kernels only enqueue on the worker's in-order queue: the codelets are
 * STARPU_OPENCL_ASYNC, and StarPU itself puts a marker after the function
 * returns and waits for it (src/drivers/opencl/driver_opencl.c,
 * _starpu_opencl_execute_job), so nothing here calls clFinish.
 *
 * When the device cannot run a case natively (an f64 operand or a double
 * computation on a device without cl_khr_fp64, or EMBER_OPENCL_NO_FP64=1 for
 * testing that path), em_ocl_host_fallback maps the buffers and runs the CPU
 * reference kernel on them: slower, never wrong. */
#ifndef EMBER_OPENCL_H
#define EMBER_OPENCL_H

#include "devices/kargs.h"
#include "devices/devices.h"

#include <CL/cl.h>
#include <pthread.h>
#include <starpu.h>
#include <stdbool.h>

/* Every kernel of the program, by name. Kernels marked F64 exist only when
 * the program was built with double support. */
/* The element-wise functions of the program, generated from the expressions
 * of tasks/ops.def (devices/opencl/elementwise.c); malloc'd, NULL with a
 * reason in err when an expression cannot be rendered for OpenCL. */
char *em_ocl_ew_source(bool fp64, char *err, size_t errlen);

#define EM_OCL_KERNEL_LIST(X)                                                                     \
    X(unary_f32) X(ucmp_f32) X(binary_f32) X(bcmp_f32)                                            \
    X(unary_f64) X(ucmp_f64) X(binary_f64) X(bcmp_f64)                                            \
    X(unary_i32) X(ucmp_i32) X(binary_i32) X(bcmp_i32)                                            \
    X(unary_i64) X(ucmp_i64) X(binary_i64) X(bcmp_i64)                                            \
    X(unary_u8) X(ucmp_u8) X(binary_u8) X(bcmp_u8)                                                \
    X(unary_f16) X(ucmp_f16) X(binary_f16) X(bcmp_f16)                                            \
    X(unary_bf16) X(ucmp_bf16) X(binary_bf16) X(bcmp_bf16) X(binary_bool)                         \
    X(where) X(copy)                                                                              \
    X(reduce) X(softmax_f32) X(softmax_f64)                                                       \
    X(matmul_f32) X(matmul_f64) X(matmul_i32) X(matmul_i64) X(matmul_u8)                          \
    X(fill_pattern) X(eye) X(arange) X(rand)                                                      \
    X(gather) X(scatter) X(one_hot)                                                \
    X(optim_f32) X(optim_f64)                                                                     \
    X(conv2d_fwd_f32) X(conv2d_bwd_data_f32) X(conv2d_bwd_weight_f32) X(conv2d_bwd_weight_red_f32)  \
    X(conv2d_fwd_f64) X(conv2d_bwd_data_f64) X(conv2d_bwd_weight_f64) X(conv2d_bwd_weight_red_f64)  \
    X(max_pool_f32) X(avg_pool_f32) X(avg_pool_bwd_f32)                                           \
    X(max_pool_f64) X(avg_pool_f64) X(avg_pool_bwd_f64)                                           \
    X(bn_fwd_f32) X(bn_bwd_f32) X(bn_running_f32) X(bn_fwd_f64) X(bn_bwd_f64) X(bn_running_f64)    \
    X(ln_fwd_f32) X(ln_bwd_f32) X(ln_bwd_wb_f32) X(ln_fwd_f64) X(ln_bwd_wb_f64) X(ln_bwd_f64) \
    X(sdpa_fwd_f32) X(sdpa_bwd_dq_f32) X(sdpa_bwd_dkv_f32) X(sdpa_fwd_f64) X(sdpa_bwd_dq_f64) X(sdpa_bwd_dkv_f64) \
    X(fused_f32) X(fused_f64)

enum em_ocl_kernel_id {
#define X(n) EMK_##n,
    EM_OCL_KERNEL_LIST(X)
#undef X
    EMK_COUNT
};

/* Per device: built program, kernels, and a lock that serialises
 * clSetKernelArg + enqueue of one kernel object. */
typedef struct em_ocl_dev {
    bool ready;
    bool fp64;        /* program built with double support */
    bool fp16;        /* the device has cl_khr_fp16 (unused: f16 / bf16 are converted in the kernels) */
    cl_context ctx;
    cl_device_id dev;
    cl_program prog;
    size_t max_wg;    /* device max work-group size */
    int tile;         /* matmul tile edge (16, or 8 on small devices) */
    cl_kernel k[EMK_COUNT];
    size_t kwg[EMK_COUNT]; /* per-kernel usable work-group size (power of 2) */
    pthread_mutex_t lock;
} em_ocl_dev;

extern em_ocl_dev em__ocl_devs[STARPU_MAXOPENCLDEVS];

/* Context of one kernel call, on the calling OpenCL worker. */
typedef struct em_ocl_ctx {
    em_ocl_dev *d;
    cl_command_queue q;
    int devid;
} em_ocl_ctx;

/* Fills @p c for the calling worker. false (and an error recorded) when the
 * device has no program: the caller must return without touching anything. */
bool em_ocl_enter(em_ocl_ctx *c, const em_kargs *k, const char *what);

/* Kernel argument builder. The device lock is held from begin to launch. */
typedef struct em_ocl_args {
    em_ocl_ctx *c;
    cl_kernel k;
    int id;
    cl_uint i;
    cl_int err;
} em_ocl_args;

em_ocl_args em_ocl_args_begin(em_ocl_ctx *c, int kernel_id);
void em_ocl_arg(em_ocl_args *a, size_t size, const void *value);
#define EM_OCL_ARG(a, v) em_ocl_arg((a), sizeof(v), &(v))
void em_ocl_arg_i32(em_ocl_args *a, int32_t v);
void em_ocl_arg_i64(em_ocl_args *a, int64_t v);
void em_ocl_arg_u64(em_ocl_args *a, uint64_t v);
/* A real scalar as the kernel's acc_t (double when fp64, else float). */
void em_ocl_arg_acc(em_ocl_args *a, double v);
/* A real scalar of dtype dt (float for F32, double for F64). */
void em_ocl_arg_real(em_ocl_args *a, int dt, double v);
void em_ocl_arg_long8(em_ocl_args *a, const int64_t *v, int n);
/* A StarPU vector buffer: cl_mem, then its byte offset (long). */
void em_ocl_arg_buf(em_ocl_args *a, void *iface);
/* __local scratch of @p bytes. */
void em_ocl_arg_local(em_ocl_args *a, size_t bytes);
/* Enqueues with global sizes g (rounded up to multiples of l when l is
 * given; l == NULL lets the runtime choose), releases the lock. Returns
 * false (error recorded) on failure. A zero global size enqueues nothing. */
bool em_ocl_launch(em_ocl_args *a, cl_uint dims, const size_t *g, const size_t *l, const char *what);
/* 1-D grid-stride launch over n items with the kernel's work-group size. */
bool em_ocl_launch_1d(em_ocl_args *a, int64_t n, const char *what);
/* The same, returning the kernel's event in *ev when it was enqueued (the
 * caller releases it); *ev is NULL when nothing was enqueued (failure, or
 * n == 0). */
bool em_ocl_launch_1d_ev(em_ocl_args *a, int64_t n, cl_event *ev, const char *what);

/* Runs the CPU reference kernel of k->kind on mapped copies of the buffers. */
void em_ocl_host_fallback(void *buffers[], const em_kargs *k);
/* The same for a kind whose buffers are not k->n_in + k->n_out (FUSED: its
 * leaves and outputs): nb buffers, at most EM_OCL_FALLBACK_MAX_BUFS. */
#define EM_OCL_FALLBACK_MAX_BUFS (EM_FUSED_MAX_LEAVES + EM_FUSED_MAX_OUT)
void em_ocl_host_fallback_n(void *buffers[], int nb, const em_kargs *k);

/* Dimension collapsing for strided iteration (em_collapse_dims of
 * devices/collapse.h, the rule of the CPU's em_iter and CUDA's make_geom): drops
 * size-1 dims and merges neighbours that are contiguous in every operand.
 * Writes the collapsed shape and strides (padded to 8 with 0) and returns the
 * collapsed rank (>= 1). */
int em_ocl_collapse(int ndim, const int64_t *shape, int nops, const int64_t *const *strides, int64_t *oshape,
                    int64_t ost[][EM_KARGS_MAX_DIMS]);

int64_t em_ocl_numel(const em_tdesc *t);
static inline size_t em_ocl_dtsize(int dt) { return em_dtype_size((em_dtype)dt); }
/* Records a failure of the running kernel as the op's sticky error
 * (em__kernel_error, devices/devices.h): kernels never abort, the next
 * em_sync / host read returns it. */
void em_ocl_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Host functions of the codelets (one per op family). */
void em_ocl_unary(void *buffers[], void *cl_arg);
void em_ocl_binary(void *buffers[], void *cl_arg);
void em_ocl_where(void *buffers[], void *cl_arg);
void em_ocl_copy(void *buffers[], void *cl_arg);
void em_ocl_reduce(void *buffers[], void *cl_arg);
void em_ocl_softmax(void *buffers[], void *cl_arg);
void em_ocl_matmul(void *buffers[], void *cl_arg);
void em_ocl_fill(void *buffers[], void *cl_arg);
void em_ocl_index(void *buffers[], void *cl_arg);
void em_ocl_optim(void *buffers[], void *cl_arg);
void em_ocl_conv(void *buffers[], void *cl_arg);
void em_ocl_pool(void *buffers[], void *cl_arg);
void em_ocl_norm(void *buffers[], void *cl_arg);
void em_ocl_attention(void *buffers[], void *cl_arg);
void em_ocl_step(void *buffers[], void *cl_arg); /* step.c: a captured step */
/* FUSED (devices/opencl/fused.c): an interpreter of the em_fused_prog of an
 * em_fused_args cl_arg (devices/kargs.h), f32 or f64. */
void em_ocl_fused(void *buffers[], void *cl_arg);

/* Enqueues a same-dtype/any-dtype strided copy in -> out (used by COPY and by
 * SCATTER's first step). Lock must NOT be held. */
bool em_ocl_copy_enqueue(em_ocl_ctx *c, void *in_iface, const em_tdesc *in, void *out_iface, const em_tdesc *out);

/* CLBlast GEMM (devices/opencl/matmul.c) is compiled in when
 * EMBER_HAVE_CLBLAST is defined. */
void em_ocl_matmul_shutdown(void);

#endif
