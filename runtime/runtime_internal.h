/* Runtime internals (runtime/): errors, the tensor object and its storage,
 * the pool, placement, stats, scopes, the trace and the hooks through which
 * the layers above plug in. Used by runtime/ and every layer above it; the
 * layers above tasks/ get it through tasks/tasks_internal.h. Nothing here
 * includes <starpu.h>: the StarPU handle is an opaque pointer. Nothing here
 * names tasks/, autodiff/ or anything above (scripts/check-layers.py). */
#ifndef EMBER_RUNTIME_INTERNAL_H
#define EMBER_RUNTIME_INTERNAL_H

#include "devices/kargs.h"
#include "ember/core.h"
#include "ember/tensor.h"

#include <stdarg.h>

/* ---- errors (runtime/error.c) ------------------------------------------- */

/** Records status + message for em_last_error(); returns @p st. */
#define em__set_error em_set_error /* the public em_set_error (ember/core.h): one definition */
/** Same, returns NULL (for tensor-returning functions). */
void *em__fail(em_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** A tensor op given a NULL input: returns NULL, keeping the calling
 *  thread's pending error when it is an out-of-memory, device or runtime
 *  failure (the failure of the op that produced the NULL: a chain of ops, a
 *  backward rule, reports that cause, not "input is NULL"), else records
 *  EM_ERR_INVALID with the message (an argument error of an earlier call is
 *  not taken for the cause). */
void *em__fail_null(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The sticky error of kernels (runtime/error.c): kernels record their
 * failure with em__kernel_error (devices/devices.h, devices/cpu/kerror.c, the sink in tasks/dispatch.c), which
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
/* Re-arms the counters from a spec ("" disarms). Not exported: tests/test_faults.c
 * links the library's objects (ember_objs). */
EM_TEST_API em_status em__fault_inject(const char *spec);

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
    int held;        /* references of internal holders (em__tensor_hold): never the scope's */
};

/** An internal reference (the fusion stream's) that is not the caller's:
 *  counted in refcount and in held, so a caller's em_tensor_release of a
 *  scoped tensor still takes it out of its scope. em__tensor_unhold drops it
 *  (the tensor is freed when it was the last reference). */
em_tensor *em__tensor_hold(em_tensor *t);
void em__tensor_unhold(em_tensor *t);

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
extern int64_t em__ops_fused, em__fused_tasks; /* fusion/fusion.c counts them */

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
/** "cpu (worker 2)", "cuda:0 (worker 3)", "opencl:1 (worker 4)": the Ember
 *  device a StarPU worker drives, for error messages. */
const char *em__worker_str(int worker, char *buf, size_t n);

/** Takes an unscoped tensor into the current scope (public return value). */
em_tensor *em__publish(em_tensor *t);

/* ---- hooks: upper layers plug into the runtime (runtime/runtime.c) ------- */

/** Start/stop of a layer above the runtime. em_init calls every registered
 *  init after starpu_init in ascending order (stopping at the first failure,
 *  then shutting down); em_shutdown calls every shutdown in descending order
 *  before starpu_shutdown (so a shutdown must cope with a failed or missing
 *  init). */
/** The fusion stream's flush (fusion/fusion.c sets it; NULL without it):
 *  submits the element-wise ops it holds. The runtime calls it before every
 *  host read, wait and count of what was submitted (em_to_host, em_sync,
 *  em_get_stats, em_shutdown), so a host never sees a held op's output
 *  unwritten. Returns that submission's error. */
extern em_status (*em__fusion_flush)(void);
/** Host reads (em_to_host, em_item) by the calling thread: a captured step
 *  must not make any (tasks/capture.c). */
extern _Thread_local int64_t em__host_reads;

typedef struct em_runtime_hooks {
    const char *name; /* the layer, for messages */
    int order;        /* tasks/: 10 */
    em_status (*init)(void); /* NULL = nothing to start */
    void (*shutdown)(void);  /* NULL = nothing to stop */
    void (*describe)(FILE *f); /* NULL = nothing to add; else lines about its devices for em_print_devices */
} em_runtime_hooks;
/** Registers @p h (static storage), from a constructor of the layer so that
 *  it is in place before em_init. At most 8. */
void em__runtime_register(const em_runtime_hooks *h);
/** Sets the function that frees a tensor's producer node when the tensor is
 *  freed (autodiff/tape.c, at load time); unset, nodes are not freed. */
void em__runtime_set_node_release(void (*fn)(struct em_node *n));

#endif
