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

/* The sticky error of kernels (runtime/error.c): kernels record their
 * failure with em__kernel_error (devices/kerror.h, tasks/dispatch.c), which
 * lands here: process-wide, first error wins. em__sticky_take moves it into
 * the calling thread's em_last_error (prefixed "where: "), clears the slot
 * and returns its status; EM_OK when no kernel failed. Called by every host
 * read and sync (em_sync, em_to_host, em_item, ...). */
void em__sticky_error(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
em_status em__sticky_take(const char *where);

/* Fault injection (runtime/fault.c; EMBER_FAULT_INJECT=kernel:N,alloc:N,node:N
 * read by em_init). EM_FAULT(w) is true when this is the armed Nth event of
 * kind w; it costs one relaxed load when nothing is armed. */
enum { EM_FAULT_KERNEL, EM_FAULT_ALLOC, EM_FAULT_NODE, EM_FAULT_COUNT };
extern int64_t em__fault_at[EM_FAULT_COUNT];
bool em__fault_hit(int what);
const char *em__fault_name(int what);
#define EM_FAULT(w) (__builtin_expect(__atomic_load_n(&em__fault_at[(w)], __ATOMIC_RELAXED) != 0, 0) && em__fault_hit(w))
/* Re-arms the counters from a spec ("" disarms). Exported for tests/test_faults.c only. */
EM_API em_status em__fault_inject(const char *spec);

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
/** "cpu (worker 2)", "cuda:0 (worker 3)", "opencl:1 (worker 4)": the Ember
 *  device a StarPU worker drives, for error messages. */
const char *em__worker_str(int worker, char *buf, size_t n);

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
};

#define EM_OP_MAX_IN EM_KARGS_MAX_IN
#define EM_OP_MAX_OUT EM_KARGS_MAX_OUT

typedef struct em_op {
    enum em_op_kind kind;
    int n_in, n_out;
    em_tensor *in[EM_OP_MAX_IN];   /* borrowed */
    em_tensor *out[EM_OP_MAX_OUT]; /* borrowed, already shaped */
    union em_op_params p;
    /* For autodiff: the user-facing inputs when the front end replaced them
     * (casts/broadcast views); NULL = same as in[]. */
    const em_tensor *orig_in[EM_OP_MAX_IN];
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

/** THE funnel: every op goes through here. Submits the task(s) (unless the op
 *  is a view), then lets autodiff record the op. */
em_status em__submit(em_op *op);
/** Submits one task for @p op (used by the funnel and by tiling submitters).
 *  @p k may be NULL (built from op); when given it is copied. handles[] may
 *  override the tensors' handles (partition children). */
em_status em__task_submit(const em_op *op, const em_kargs *k, void *const *handles_override);
/* Step fences: order the optimizer after the end of backward in
 * data-parallel training (dist/). A fence is a data-less StarPU handle
 * (starpu_void_data_register). em__fence_signal submits a task that runs
 * nowhere once every tensor of @p after has been produced, and writes the
 * fence (registered on first use into *fence). While a thread has a fence
 * set with em__submit_after, every task it submits through em__task_submit
 * also reads the fence, so it waits for that signal; it also gets the
 * thread's priority (em__submit_priority, default 0: StarPU's default).
 * Both return the previous value. em__fence_free unregisters a fence
 * (after the tasks using it: starpu_data_unregister waits). Exported for
 * tests/test_core.c only; not part of the public API. */
EM_API em_status em__fence_signal(void **fence, em_tensor *const *after, int n);
/* false when EMBER_DIST_FENCE=0 (a diagnostic switch: no step fences). */
bool em__fences_on(void);
EM_API void *em__submit_after(void *fence);
EM_API int em__submit_priority(int prio);
EM_API void em__fence_free(void **fence);
/* The fence after which a gradient container's values are the whole
 * backward's (set by the gradient all-reduce; the optimizer waits for it
 * through em__submit_after). The container keeps where its owner keeps the
 * handle, not the handle: once the owner frees the fence (dist shutdown sets
 * it to NULL), em__grads_fence returns NULL and the optimizer steps
 * without it. The slot itself must outlive the container's use. */
EM_API void em__grads_set_fence(em_grads *g, void *const *fence); /* exported for tests/test_core.c */
EM_API void *em__grads_fence(const em_grads *g);
/** Builds the kernel arguments of @p op. */
void em__kargs_from_op(const em_op *op, em_kargs *k);

/** Autodiff hook (autodiff/tape.c sets it). A failure (out of memory for the
 *  node) is an error of the op: em__submit returns it. */
extern em_status (*em__autodiff_record)(const em_op *op);
/** Records out = cat(ins[0..n), dim) for autodiff (em_cat calls it after
 *  submitting its copies; EM_OK without doing anything when nothing needs a
 *  gradient; an error when the node cannot be recorded). */
em_status em__record_cat(em_tensor *out, em_tensor *const *ins, int n, int dim);

/* Device kernel tables, filled by devices/<dev>/ (a NULL entry = no kernel
 * for that op on that device; the funnel then runs it on the CPU and says so
 * in debug logs). Weak defaults (all NULL) live in tasks/funnel.c. */
typedef void (*em_kernel_fn)(void *buffers[], void *cl_arg);
extern em_kernel_fn em__cuda_kernels[EM_OP_COUNT];
extern em_kernel_fn em__opencl_kernels[EM_OP_COUNT];
/* What the codelets run (tasks/dispatch.c): fault injection, then the
 * kernel of kargs->kind from em__optab[].cpu / the tables above. */
void em__cpu_dispatch(void *buffers[], void *cl_arg);
void em__cuda_dispatch(void *buffers[], void *cl_arg);
void em__opencl_dispatch(void *buffers[], void *cl_arg);
/* EM_OK unless the task's @p n handles cannot fit in the memory of the
 * accelerator that @p worker drives (then EM_ERR_NOMEM naming op, device,
 * shapes): StarPU would wait for that memory forever. */
em_status em__task_fits(const em_op *op, void *const *handles, int n, int worker);
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
