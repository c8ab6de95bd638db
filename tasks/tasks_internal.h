/* Tasks internals (tasks/): op kinds and the op table, em_op, the funnel,
 * step fences, the front-end helpers. Used by tasks/ and the layers above
 * (autodiff/, nn/, optim/, ...); includes the runtime's internals and the
 * devices-side headers. runtime/ and devices/ never include it. */
#ifndef EMBER_TASKS_INTERNAL_H
#define EMBER_TASKS_INTERNAL_H

#include "devices/devices.h"
#include "devices/kargs.h"
#include "ember/autograd.h"
#include "runtime/runtime_internal.h"

/* ---- random streams (tasks/create.c) ------------------------------------ */

/* The calling thread draws random numbers from its own
 * Philox stream (seed, counter offset) until em__rng_thread_end, which
 * returns how many counters it used. */
void em__rng_thread_begin(uint64_t seed, uint64_t offset);
uint64_t em__rng_thread_end(void);
/* Reserves @p n Philox counters of the calling thread's stream (its own one
 * between em__rng_thread_begin / _end, else the global generator's):
 * *seed and *offset are the key and the first counter, the stream moves on
 * by n (the random ops and the fused attention's dropout). */
void em__rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset);

/* ---- ops (tasks/) --------------------------------------------------------- */

#define EM_OP_MAX_IN EM_KARGS_MAX_IN
#define EM_OP_MAX_OUT EM_KARGS_MAX_OUT

/* em_op.flags: how the door treats the op. */
enum {
    EM_OPF_NO_RECORD = 1u << 0, /* autodiff does not record it (internal copies, fills, tiles) */
    EM_OPF_ONE_TASK = 1u << 1,  /* exactly one task: the table's custom submit (tiling) is skipped */
    EM_OPF_RAW = EM_OPF_NO_RECORD | EM_OPF_ONE_TASK, /* a custom submitter's sub-task */
    EM_OPF_NO_FUSE = 1u << 2,   /* submitted now, never held by the fusion stream (fusion/'s own flushes) */
};
/* em_op.priority: StarPU's default is 0; EM_PRIO_MAX is the scheduler's highest. */
#define EM_PRIO_MAX 0x7fffffff
/* em_op.nodes entry: main memory (StarPU's STARPU_SPECIFIC_NODE_CPU; checked in tasks/funnel.c). */
#define EM_NODE_CPU (-2)

typedef struct em_capture em_capture; /* a step being captured (tasks/capture.c) */
/* em_op.capture: the op belongs to no capture (the fusion stream's flush of ops
 * held outside any) */
#define EM_NO_CAPTURE ((em_capture *)1)

typedef struct em_op {
    enum em_op_kind kind;
    int n_in, n_out;
    em_tensor *in[EM_OP_MAX_IN];   /* borrowed */
    em_tensor *out[EM_OP_MAX_OUT]; /* borrowed, already shaped */
    union em_op_params p;
    /* For autodiff: the user-facing inputs when the front end replaced them
     * (casts/broadcast views); NULL = same as in[]. */
    const em_tensor *orig_in[EM_OP_MAX_IN];
    /* ---- scheduling facts, read by the door (all zero: recorded, the
     * table's submit, default priority, no fence, the current device) ---- */
    unsigned flags;          /* EM_OPF_* */
    int priority;            /* of its task(s); 0 = StarPU's default, EM_PRIO_MAX = highest */
    void *after;             /* a fence (em__fence_signal) its task(s) wait for, or NULL */
    void *token;             /* a sync handle (em__sync_handle_new) its task writes: ops on one token
                              * run in submission order; a FENCE op signals it */
    const em_kargs *kargs;   /* EM_OPF_ONE_TASK: kernel arguments instead of em__kargs_from_op's
                              * (tiles; copied), or NULL */
    const em_placement *place; /* where it runs instead of the current device (em__placement), or NULL */
    /* variadic operands (F_COLLECTIVE: read-write; FENCE: read), any number */
    int n_var;
    em_tensor *const *var;   /* borrowed; the door copies the handles */
    int n_var_w;             /* F_OWN_ARGS (FUSED, STEP): the last n_var_w of var[] are written, the rest read */
    em_capture *capture;     /* the capture that records its task(s): NULL = the calling thread's (if any),
                              * EM_NO_CAPTURE = none (fusion/ sets it for the chains it flushes) */
    /* F_COLLECTIVE: the kernel's arguments instead of em_kargs: malloc'd,
     * owned by the door from the call on (freed with the task, or on failure) */
    void *args;
    size_t args_size;
    /* memory node (>= 0, or EM_NODE_CPU) of each buffer of the task, in the
     * door's order; the array must outlive the tasks; NULL = the worker's */
    const int *nodes;
} em_op;

typedef em_status (*em_submit_fn)(em_op *op);

typedef struct em_optab_entry {
    const char *name;
    const char *family; /* kernel family (ops.def), NULL for views */
    int n_in, n_out;
    unsigned flags;
    void (*cpu)(void *buffers[], void *cl_arg);
    em_submit_fn submit; /* custom submission (tiling); NULL = one task */
} em_optab_entry;

extern em_optab_entry em__optab[EM_OP_COUNT];

/** THE door: every task Ember submits goes through here, as an em_op: ops,
 *  internal copies and fills (EM_OPF_NO_RECORD), matmul tiles, optimizer
 *  steps, fences (FENCE), gradient all-reduces (F_COLLECTIVE). Nothing else
 *  calls StarPU's task API. Submits the task(s): none for a view, the
 *  table's custom submit (tiling) when there is one and the op is not
 *  EM_OPF_ONE_TASK, else one task; then lets autodiff record the op (F_DIFF
 *  kinds, unless EM_OPF_NO_RECORD) and returns the recorder's status. A
 *  custom submit hands its sub-tasks back to em__submit with EM_OPF_RAW (one
 *  task, not recorded), carrying the op's priority and fence. The task's
 *  buffers, in order: op->token (RW, or W for a FENCE), in[] (R), out[] (W,
 *  or RW when it does not cover its storage or the kind is F_INPLACE),
 *  var[] (RW for F_COLLECTIVE, else R), op->after (R). Kernels of ordinary
 *  ops thus see in[] then out[] from buffer 0. */
em_status em__submit(em_op *op);
/* Step fences: order the optimizer after the end of backward in
 * data-parallel training (dist/). A fence is a data-less StarPU handle.
 * em__fence_signal submits a FENCE op (runs nowhere) that reads every
 * tensor of @p after (each storage once) and writes the fence, registered
 * on first use into *fence. An op whose `after` is the fence waits for that
 * signal (the optimizer's updates: optim/optim.c). em__fence_free
 * unregisters a fence (after the tasks using it: starpu_data_unregister
 * waits). Not exported: tests/test_core.c links the library's objects
 * (ember_objs). */
EM_TEST_API em_status em__fence_signal(void **fence, em_tensor *const *after, int n);
/* false when EMBER_DIST_FENCE=0 (a diagnostic switch: no step fences). */
bool em__fences_on(void);
EM_TEST_API void em__fence_free(void **fence);
/* A data-less handle for em_op.token (chains ops in submission order), and
 * its release (waits for the tasks using it; no-op on NULL or after
 * em_shutdown). */
void *em__sync_handle_new(void);
void em__sync_handle_free(void **h);
/* Kernels of collectives (dist/: MPI on the host, the NCCL all-reduce on
 * CUDA), indexed by op; weak all-NULL defaults in tasks/funnel.c. */
extern em_kernel_fn em__dist_cpu_kernels[EM_OP_COUNT];
extern em_kernel_fn em__dist_cuda_kernels[EM_OP_COUNT];
/** Builds the kernel arguments of @p op. */
void em__kargs_from_op(const em_op *op, em_kargs *k);

/* ---- step capture (tasks/capture.c; DESIGN.md §6) -------------------------- */
/** The step the calling thread is capturing (em_capture_begin), or NULL. */
em_capture *em__capture_current(void);
/** The door's record of one task of @p op into capture @p c (task_submit, for
 *  every task while a capture is on): kernel arguments @p k (ordinary kinds;
 *  F_OWN_ARGS kinds carry op->args). A task that cannot be replayed makes
 *  the capture fail at em_capture_end, naming it. */
void em__capture_record(em_capture *c, const em_op *op, const em_kargs *k);
/** Parameters of a recorded task that change per replay: fn(ctx, p) gets a
 *  copy of @p ctx_size (<= 64) bytes of @p ctx and the recorded parameters,
 *  and sets this replay's (on the host, when em_step_replay submits). Applies
 *  to the last task of kind @p kind the calling thread recorded (the op just
 *  submitted: a widened op's f32 copies come after its own task); no-op
 *  outside a capture. Patches are applied in recording order.
 *  The optimizers (step count, learning rate) and the random ops (Philox
 *  offset) register one. */
typedef void (*em_capture_patch_fn)(void *ctx, union em_op_params *p);
void em__capture_patch_last(enum em_op_kind kind, em_capture_patch_fn fn, const void *ctx, size_t ctx_size);
/** Philox counters reserved during the capture, and those a patch advances
 *  per replay: em_capture_end refuses a step whose random draws no patch
 *  advances (they would repeat). */
void em__capture_rng(uint64_t reserved, uint64_t patched);
/** Makes the calling thread's capture (if any) fail at em_capture_end with
 *  reason @p why (a front end whose work a replay would get wrong). */
void em__capture_refuse(const char *why);

/** The fusion hook (fusion/fusion.c sets it at load time; DESIGN.md §6): the
 *  door offers it every op not flagged EM_OPF_NO_FUSE before submitting it.
 *  It either holds the op in the fusion stream (*taken = true: the door then
 *  only lets autodiff record it) or first submits what the stream holds
 *  that the op may depend on (*taken = false: the door goes on). A failure
 *  of that flush is returned, and is the op's error. */
extern em_status (*em__fusion_offer)(em_op *op, bool *taken);

/** Autodiff hooks (autodiff/tape.c sets them): the recorder, and the check of
 *  its backward table against the op table (run by em__codelets_init). */
extern em_status (*em__autodiff_record)(const em_op *op); /* a failure (no memory for the node) is the op's error */
extern em_status (*em__autodiff_check)(void);
/** Autodiff hook (autodiff/tape.c sets it): records out = cat(ins[0..n), dim)
 *  (em_cat calls it after submitting its copies; no-op when nothing needs a
 *  gradient). */
extern em_status (*em__autodiff_record_cat)(em_tensor *out, em_tensor *const *ins, int n, int dim);

/* What the codelets run (tasks/dispatch.c): fault injection, then the
 * kernel of kargs->kind from em__optab[].cpu / the device tables. */
void em__cpu_dispatch(void *buffers[], void *cl_arg);
void em__cuda_dispatch(void *buffers[], void *cl_arg);
void em__opencl_dispatch(void *buffers[], void *cl_arg);
/* A failure inside a kernel function that lives above devices/ (dist/'s
 * collectives): reported as em__kernel_error of the running kernel. */
void em__task_kernel_error(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* EM_OK unless the task's @p n handles cannot fit in the memory of the
 * accelerator that @p worker drives (then EM_ERR_NOMEM naming op, device,
 * shapes): StarPU would wait for that memory forever. */
em_status em__task_fits(const em_op *op, void *const *handles, int n, int worker);

/* Codelets (tasks/funnel.c). */
em_status em__codelets_init(void);
void em__codelets_shutdown(void);

/* Helpers for front ends (tasks/common.c). */
/** Broadcast shape of a and b into out; error names both shapes. */
em_status em__broadcast_shapes(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out,
                               int *nout, const char *op);
/** Strided view of t broadcast to shape (stride 0 on stretched dims). Not in any scope. */
em_tensor *em__broadcast_view(const em_tensor *t, const int64_t *shape, int ndim);
em_dtype em__promote(em_dtype a, em_dtype b);
/** Returns t itself (retained) if already @p dt, else a cast copy. Not in any scope. */
em_tensor *em__as_dtype(const em_tensor *t, em_dtype dt);
/** Single-output helper: builds an op, submits, returns out published or NULL. */
em_tensor *em__run1(enum em_op_kind kind, em_tensor *const *in, int n_in, em_tensor *out,
                    const union em_op_params *p, const em_tensor *const *orig_in);


/** Tiling over CPU workers (tasks/matmul.c): how many tasks an op of @p
 *  flops should be cut into — 1 unless the placement is CPU-only, there are
 *  >= 2 CPU workers, out[0] covers its storage (or is a dense permuted
 *  view of it, em__dense_storage) and flops exceeds the
 *  environment variable @p min_env (default @p min_dflt); then the variable
 *  @p tiles_env or the number of CPU workers, at most EM_MAX_TILES. */
#define EM_MAX_TILES 256
/** A view that holds every element of its storage exactly once, from offset
 *  0, in some order of its dims (a permutation of a contiguous tensor: the
 *  fused attention's [B, H, Tq, Dv] output over [B, Tq, H, Dv] memory). The
 *  door writes such an output with W like a contiguous one (tasks/funnel.c). */
bool em__dense_storage(const em_tensor *t);
int em__cpu_tiles(const em_op *op, double flops, const char *min_env, double min_dflt, const char *tiles_env);
/** Restricts operand descriptor @p d to [start, start + len) along @p dim. */
void em__tdesc_narrow(em_tdesc *d, int dim, int64_t start, int64_t len);
/** Submits one tile of @p op (EM_OPF_RAW: one task, not recorded; op's
 *  priority and fence) writing @p out with kernel arguments @p k (NULL: the
 *  op's own). */
em_status em__submit_tile(const em_op *op, em_tensor *out, const em_kargs *k);
/** COPY tasks placing tiles 1..T-1 (tmp[t], NULL = none) into op->out[0] at
 *  starts[t] along @p dim (tile 0 wrote the output itself). */
em_status em__place_tiles(const em_op *op, em_tensor *const *tmp, const int64_t *starts, int T, int dim);

/* Convolution and pooling ops with explicit output shapes (tasks/conv.c,
 * tasks/pool.c; contracts there): used by the front ends and the backward
 * rules. Inputs are made contiguous (unrecorded copies); scoped results. */
em_tensor *em__contiguous_operand(const em_tensor *t); /* tasks/common.c; unscoped: t retained, or a contiguous copy */
EM_TEST_API em_tensor *em__conv2d_raw(const em_tensor *x, const em_tensor *w, const union em_op_params *p, const int64_t *out_shape);
EM_TEST_API em_tensor *em__conv2d_bwd_data(const em_tensor *dy, const em_tensor *w, const union em_op_params *p, const int64_t *x_shape);
EM_TEST_API em_tensor *em__conv2d_bwd_weight(const em_tensor *x, const em_tensor *dy, const union em_op_params *p, const int64_t *w_shape);
em_tensor *em__avg_pool2d_bwd(const em_tensor *dy, const union em_op_params *p, const int64_t *x_shape);

/* Fused training-mode batch norm (tasks/norm.c; contracts there). x is
 * [N, C, *] f32/f64 with more than one value per channel, weight / bias [C]
 * of x's dtype (the caller passes ones / zeros when absent; they are the
 * recorded inputs). Returns y and sets *stats = [2, C] (batch mean, biased
 * variance; saved for the backward); scoped results. The backward computes
 * dx, dweight, dbias at once (scoped). */
em_tensor *em__batch_norm_train(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, double eps,
                                em_tensor **stats);
/* running_mean / running_var [C] (contiguous, stats' dtype) updated in place
 * from stats [2, C] (contiguous): the BATCH_NORM_RUNNING contract. */
em_status em__batch_norm_running(const em_tensor *stats, em_tensor *running_mean, em_tensor *running_var, double momentum,
                                 double unbias);
em_status em__batch_norm_bwd(const em_tensor *dy, const em_tensor *x, const em_tensor *stats, const em_tensor *weight,
                             double eps, em_tensor **dx, em_tensor **dweight, em_tensor **dbias);
/* Fused layer norm (tasks/norm.c; contracts there) over the last @p ndim
 * dims of x (float, any rank >= ndim), weight and bias of x's dtype holding
 * the normalized dims' N values (the recorded inputs; both required).
 * Returns y (x's shape and dtype) and sets *stats = [2, M] (mean, rstd of
 * each of the M rows; f32 for f16 / bf16 x; saved for the backward); scoped
 * results. NULL with EM_ERR_DTYPE / EM_ERR_SHAPE for operands that do not
 * fit. The backward gives dx (x's shape), dweight and dbias (weight's
 * shape) at once, from dy (x's dtype and element count), x, stats and
 * weight (scoped). */
em_tensor *em__layer_norm(const em_tensor *x, int ndim, const em_tensor *weight, const em_tensor *bias, double eps,
                          em_tensor **stats);
em_status em__layer_norm_bwd(const em_tensor *dy, const em_tensor *x, const em_tensor *stats, const em_tensor *weight,
                             em_tensor **dx, em_tensor **dweight, em_tensor **dbias);

/* Fused scaled-dot-product attention (tasks/attention.c; the kernel
 * contract there). em__sdpa: q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]
 * of one float dtype and one rank >= 2 with equal leading dims, D and Dv in
 * 1..256 (checked: EM_ERR_SHAPE / EM_ERR_DTYPE), mask NULL, bool (true =
 * take part) or float (additive), broadcastable to [..., Tq, Tk], not
 * requiring grad; not together with is_causal. scale > 0 (the caller
 * resolves torch's default). Dropout applies when training and
 * dropout_p > 0. Returns [..., Tq, Dv] (scoped), recorded for autodiff. */
EM_TEST_API em_tensor *em__sdpa(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask,
                                bool is_causal, double dropout_p, double scale, bool training);
/* The backward of one SDPA op (the rule bw_sdpa): dout [B, H, Tq, Dv], the
 * op's q, k, v, o (its output), lse (its aux output) and additive mask (or
 * NULL), its parameters; sets dq, dk, dv (scoped, contiguous). */
em_status em__sdpa_bwd(const em_tensor *dout, const em_tensor *q, const em_tensor *k, const em_tensor *v,
                       const em_tensor *o, const em_tensor *lse, const em_tensor *mask, const union em_op_params *p,
                       em_tensor **dq, em_tensor **dk, em_tensor **dv);

/* Autocast (tasks/amp.c; the semantics in include/ember/amp.h). */
/** The dtype an op of kind @p k whose inputs promote to @p natural computes
 *  in on the calling thread: the region's low dtype for F_AC_LOW kinds, f32
 *  for F_AC_F32 kinds, when autocast is on and @p natural is f32, f16 or
 *  bf16; else @p natural. THE one place the front ends ask. */
em_dtype em__autocast_dtype(enum em_op_kind k, em_dtype natural);
/** For a front end of kind @p k with inputs ins[0..n) (NULL entries
 *  skipped): when autocast wants another dtype for some f32/f16/bf16 input,
 *  sets cast[i] to a recorded em_cast of each such input (the others
 *  retained; new unscoped references the caller releases) and returns 1; 0
 *  when nothing needs a cast (cast[] untouched); -1 on error (nothing to
 *  release). The front end then runs again on cast[]. */
int em__autocast_inputs(enum em_op_kind k, const em_tensor *const *ins, int n, em_tensor **cast);
/** The autocast hook of a front end: when autocast wants other dtypes for
 *  the @p n inputs @p ins of kind @p kind, casts them into the array @p c
 *  (recorded casts) and returns CALL's result (the front end called again
 *  on c[]) after releasing c[]; NULL if a cast failed. Nothing happens when
 *  no input needs a cast. */
#define EM_AUTOCAST_RERUN(kind, ins, n, c, CALL)                                           \
    do {                                                                                     \
        int acr_ = em__autocast_inputs((kind), (ins), (n), (c));                             \
        if (acr_) {                                                                          \
            em_tensor *r_ = acr_ > 0 ? (CALL) : NULL;                                        \
            if (acr_ > 0)                                                                    \
                for (int i_ = 0; i_ < (n); i_++) em_tensor_release((c)[i_]);                 \
            return r_;                                                                       \
        }                                                                                    \
    } while (0)
/** Autocast off on this thread until the matching resume (em_backward). */
void em__autocast_suspend(void);
void em__autocast_resume(void);

/* sqrt with a zero gradient where the result is 0 (em_std; tasks/elementwise.c). */
em_tensor *em__sqrt_std(const em_tensor *a);

#endif
