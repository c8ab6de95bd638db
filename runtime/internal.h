/* Ember internals shared by runtime/, tasks/, autodiff/ and the layers above.
 * Nothing here includes <starpu.h>: the StarPU handle is an opaque pointer. */
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H

#include "ember/autograd.h"
#include "ember/core.h"
#include "ember/tensor.h"
#include "devices/kargs.h"

#include <stdarg.h>

/* ---- errors (runtime/error.c) ------------------------------------------- */

/** Records status + message for em_last_error(); returns @p st. */
em_status em__set_error(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Same, returns NULL (for tensor-returning functions). */
void *em__fail(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define EM_CHECK_NOT_NULL(p, fn)                                                   \
    do {                                                                           \
        if (!(p)) return em__fail(EM_ERR_INVALID, "%s: input '%s' is NULL", fn, #p); \
    } while (0)

/* ---- storage + tensor (runtime/tensor.c) -------------------------------- */

typedef struct em_storage {
    void *handle;      /* starpu_data_handle_t: a byte vector of nbytes */
    size_t nbytes;
    int refcount;
    int pool_class;    /* pool.c: the device it was made for (handles are recycled per device) */
} em_storage;

struct em_node;

struct em_tensor {
    int refcount;
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS];
    int64_t offset; /* in elements */
    em_storage *storage;
    /* autodiff */
    bool requires_grad;
    struct em_node *node; /* producer (owned reference), NULL for leaves */
    /* scopes */
    int scope_level; /* 0 = caller-owned, else depth of the owning scope */
};

/** New tensor with fresh (pooled) storage and contiguous strides, NOT in any
 *  scope (the caller owns it; em__publish hands it to the current scope).
 *  Validates rank and sizes. */
em_tensor *em__tensor_new(em_dtype dt, const int64_t *shape, int ndim);
/** New tensor header over @p base's storage (a view), not in any scope. */
em_tensor *em__tensor_view(const em_tensor *base, const int64_t *shape, const int64_t *strides,
                           int ndim, int64_t offset);
void em__contiguous_strides(const int64_t *shape, int ndim, int64_t *strides);
int64_t em__numel(const int64_t *shape, int ndim);
/** true when t covers its whole storage contiguously from offset 0. */
bool em__covers_storage(const em_tensor *t);
/* EMBER_TRACE task timeline (runtime/trace.c): init after starpu_init,
 * attach to every task before submission, shutdown writes the file. */
struct starpu_task;
void em__trace_init(void);
void em__trace_attach(struct starpu_task *t);
void em__trace_shutdown(void);
/* tasks/create.c: the calling thread draws random numbers from its own
 * Philox stream (seed, counter offset) until em__rng_thread_end, which
 * returns how many counters it used. */
void em__rng_thread_begin(uint64_t seed, uint64_t offset);
uint64_t em__rng_thread_end(void);
/* Frees the calling thread's scope stack (a thread that used Ember, before
 * it exits; its scopes must all be closed). */
void em__thread_exit(void);
/* Has the calling thread its own device (em_set_thread_device)? */
bool em__has_thread_device(void);
/** Normalises a possibly negative dim; -1 (and an error naming op, dim and
 *  shape) when out of range. */
int em__norm_dim(const em_tensor *t, int dim, int ndim_extra, const char *op);
/** Fills a tensor descriptor for kernels. */
void em__tdesc(const em_tensor *t, em_tdesc *d);

/* Storage pool (runtime/pool.c). */
em_storage *em__storage_acquire(size_t nbytes);
void em__storage_release(em_storage *s);
void em__pool_drain(void);

/* Stats. */
extern int64_t em__live_tensors, em__live_storages, em__handles, em__pooled, em__tasks;

/* Scopes. */
void em__scope_add(em_tensor *t);
void em__scope_remove(em_tensor *t);

/* ---- devices (runtime/runtime.c) ----------------------------------------- */

/** Where the next task goes: StarPU "where" mask + worker restriction. */
typedef struct em_placement {
    unsigned where;  /* STARPU_CPU | STARPU_CUDA | ... (0 = any) */
    int worker;      /* specific worker id, or -1 */
} em_placement;
em_placement em__placement(void);
int em__ncpu_workers(void);
/* For layers that do not include <starpu.h> (dist/), runtime/workers.c: */
em_placement em__placement_cpu(void);          /* any CPU worker */
em_placement em__placement_worker(int worker); /* exactly that worker */
int em__worker_total(void);                    /* workers of every kind */
em_device_kind em__worker_kind(int worker);    /* EM_DEVICE_AUTO when unknown */
int em__worker_devid(int worker);
int em__worker_memory_node(int worker);
/* Runs fn(arg) on @p worker and waits (starpu_execute_on_specific_workers). */
void em__run_on_worker(int worker, void (*fn)(void *), void *arg, const char *name);
/* In a kernel: the data pointer of buffer @p i (a byte vector). */
void *em__buffer_ptr(void *buffers[], int i);
/* In a CUDA kernel: the worker's stream (cudaStream_t); NULL without CUDA. */
void *em__cuda_local_stream(void);

/* ---- ops (tasks/) --------------------------------------------------------- */

enum em_op_kind {
#define X(E, name, nin, nout, flags, cpu) EM_OP_##E,
#include "tasks/ops.def"
#undef X
    EM_OP_COUNT
};

enum {
    F_EW = 1u << 0,
    F_VIEW = 1u << 1,
    F_DIFF = 1u << 2,
    F_CMP = 1u << 3,
    F_INPLACE = 1u << 4, /* outputs are read-modify-write (optimizer updates): always RW */
    F_COLLECTIVE = 1u << 5, /* a collective (dist/): operands in op->var (RW), kernel arguments in op->args,
                             * placed by op->place; no consistency case, no performance model */
    F_NOWHERE = 1u << 6,    /* runs nowhere (a fence): only orders other tasks */
};

#define EM_OP_MAX_IN EM_KARGS_MAX_IN
#define EM_OP_MAX_OUT EM_KARGS_MAX_OUT

/* em_op.flags: how the door treats the op. */
enum {
    EM_OPF_NO_RECORD = 1u << 0, /* autodiff does not record it (internal copies, fills, tiles) */
    EM_OPF_ONE_TASK = 1u << 1,  /* exactly one task: the table's custom submit (tiling) is skipped */
    EM_OPF_RAW = EM_OPF_NO_RECORD | EM_OPF_ONE_TASK, /* a custom submitter's sub-task */
};
/* em_op.priority: StarPU's default is 0; EM_PRIO_MAX is the scheduler's highest. */
#define EM_PRIO_MAX 0x7fffffff
/* em_op.nodes entry: main memory (StarPU's STARPU_SPECIFIC_NODE_CPU; checked in tasks/funnel.c). */
#define EM_NODE_CPU (-2)

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
 *  kinds, unless EM_OPF_NO_RECORD). A custom submit hands its sub-tasks back
 *  to em__submit with EM_OPF_RAW (one task, not recorded), carrying the op's
 *  priority and fence. The task's buffers, in order: op->token (RW, or W for
 *  a FENCE), in[] (R), out[] (W, or RW when it does not cover its storage or
 *  the kind is F_INPLACE), var[] (RW for F_COLLECTIVE, else R), op->after
 *  (R). Kernels of ordinary ops thus see in[] then out[] from buffer 0. */
em_status em__submit(em_op *op);
/* Step fences: order the optimizer after the end of backward in
 * data-parallel training (dist/). A fence is a data-less StarPU handle.
 * em__fence_signal submits a FENCE op (runs nowhere) that reads every
 * tensor of @p after (each storage once) and writes the fence, registered
 * on first use into *fence. An op whose `after` is the fence waits for that
 * signal (the optimizer's updates: optim/optim.c). em__fence_free
 * unregisters a fence (after the tasks using it: starpu_data_unregister
 * waits). Exported for tests/test_core.c only; not part of the public API. */
EM_API em_status em__fence_signal(void **fence, em_tensor *const *after, int n);
/* false when EMBER_DIST_FENCE=0 (a diagnostic switch: no step fences). */
bool em__fences_on(void);
EM_API void em__fence_free(void **fence);
/* A data-less handle for em_op.token (chains ops in submission order), and
 * its release (waits for the tasks using it; no-op on NULL or after
 * em_shutdown). */
void *em__sync_handle_new(void);
void em__sync_handle_free(void **h);
/* The fence after which a gradient container's values are the whole
 * backward's (set by the gradient all-reduce; the optimizer's ops wait for
 * it through em_op.after). The container keeps where its owner keeps the
 * handle, not the handle: once the owner frees the fence (dist shutdown sets
 * it to NULL), em__grads_fence returns NULL and the optimizer steps
 * without it. The slot itself must outlive the container's use. */
EM_API void em__grads_set_fence(em_grads *g, void *const *fence); /* exported for tests/test_core.c */
EM_API void *em__grads_fence(const em_grads *g);
/** Builds the kernel arguments of @p op. */
void em__kargs_from_op(const em_op *op, em_kargs *k);

/** Autodiff hook (autodiff/tape.c sets it). */
extern void (*em__autodiff_record)(const em_op *op);
/** Records out = cat(ins[0..n), dim) for autodiff (em_cat calls it after
 *  submitting its copies; no-op when nothing needs a gradient). */
void em__record_cat(em_tensor *out, em_tensor *const *ins, int n, int dim);

/* Device kernel tables, filled by devices/<dev>/ (a NULL entry = no kernel
 * for that op on that device; the funnel then runs it on the CPU and says so
 * in debug logs). Weak defaults (all NULL) live in tasks/funnel.c. */
typedef void (*em_kernel_fn)(void *buffers[], void *cl_arg);
extern em_kernel_fn em__cuda_kernels[EM_OP_COUNT];
extern em_kernel_fn em__opencl_kernels[EM_OP_COUNT];
/* CUDA kernels of collectives (dist/: the NCCL all-reduce), weak all-NULL default. */
extern em_kernel_fn em__dist_cuda_kernels[EM_OP_COUNT];
/* Device start/stop hooks, called by em_init/em_shutdown (weak no-op defaults). */
em_status em__cuda_init(void);
void em__cuda_shutdown(void);
em_status em__opencl_init(void);
void em__opencl_shutdown(void);

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
/** Takes an unscoped tensor into the current scope (public return value). */
em_tensor *em__publish(em_tensor *t);
/** Single-output helper: builds an op, submits, returns out published or NULL. */
em_tensor *em__run1(enum em_op_kind kind, em_tensor *const *in, int n_in, em_tensor *out,
                    const union em_op_params *p, const em_tensor *const *orig_in);

#endif
