/* Shared by the dist layer only: the communicators and the collective watchdog. */
#ifndef EMBER_DIST_INTERNAL_H
#define EMBER_DIST_INTERNAL_H

#include "ember/dist.h"

#include <mpi.h>
#include <stdbool.h>

/* Two duplicates of MPI_COMM_WORLD: gradient reductions run inside StarPU
 * tasks (on workers) while control collectives (broadcast, metrics, config
 * check) run on the calling thread; MPI orders collectives per communicator,
 * so the two streams must not share one. */
extern MPI_Comm em__dist_comm_grad, em__dist_comm_ctl;
extern int em__dist_rank, em__dist_world;

/* Watchdog slots: a collective in progress is registered with its start time;
 * the watchdog thread aborts the job when one exceeds EMBER_DIST_TIMEOUT. */
enum { EM_DIST_SLOT_GRAD = 0, EM_DIST_SLOT_CTL = 1, EM_DIST_NSLOTS = 2 };
void em__dist_watch_begin(int slot, const char *what);
void em__dist_watch_end(int slot);

/* allreduce.c: the chain token (registered after em_init). */
em_status em__dist_tasks_init(void);
void em__dist_tasks_shutdown(void);

/* Where a list of gradients is reduced (allreduce.c): the process's own
 * reduction across ranks, or one replica's share of an in-process reduction
 * (replicas.c). */
typedef struct em__ar_target {
    int worker;                 /* [nccl] CUDA worker running the NCCL call; -1: a CPU worker, MPI */
    void *token;                /* em_op.token: chains this target's reductions in submission order */
    void *nccl_comm;            /* [nccl] NULL: the process communicator */
    bool watch;                 /* under the collective watchdog */
    void **fence;               /* NULL, or the step fence (em__fence_signal) to signal before the last bucket */
} em__ar_target;
/* Buckets the gradients of @p params (reverse order, zeros for missing ones,
 * float32/float64; em__dist_bucket_end) and submits one reduction task per
 * bucket to @p tg, which averages its gradients in place (after
 * em__dist_own_grads). Only submits. */
em_status em__dist_reduce_grads(em_grads *g, em_tensor *const *params, int n, const em__ar_target *tg);

/* PyTorch DDP's first bucket cap (torch.distributed's
 * _DEFAULT_FIRST_BUCKET_BYTES): small, so the first reduction starts early. */
#define EM_DIST_FIRST_BUCKET_BYTES ((size_t)1 << 20)
/* The bucket that starts at gradient @p lo of a list of @p n (nbytes[i],
 * dtypes[i] per gradient, in reduction order) ends before the returned
 * index. PyTorch DDP's rule (reducer.cpp, compute_bucket_assignment_by_size):
 * gradients join the open bucket until it holds at least its cap
 * (EM_DIST_FIRST_BUCKET_BYTES, or less when em_dist_get_bucket_bytes() is
 * smaller, for the first bucket; em_dist_get_bucket_bytes() after), so a
 * gradient larger than the cap closes the bucket it joins; a change of
 * dtype closes it too. Cap 0: one gradient per bucket. */
int em__dist_bucket_end(const size_t *nbytes, const em_dtype *dtypes, int lo, int n);
/* Does params[i] appear again in params[i+1 .. n)? (A parameter tied to
 * another, e.g. shared weights, is listed twice; it is reduced once.) */
bool em__dist_listed_later(em_tensor *const *params, int i, int n);
/* Makes grads[lo..hi) (the gradients of params[lo..hi) in @p g) safe to
 * average in place: a gradient that is not contiguous, shares its storage,
 * is referenced by anything but the container (the caller, a scope,
 * another container) or is also grads[j] for some j in (k, n) is replaced,
 * in @p g and grads[], by a contiguous private copy (a COPY task on the
 * current device). The parameters must be distinct. */
em_status em__dist_own_grads(em_grads *g, const em_tensor *const *params, em_tensor **grads, int lo, int hi, int n);

/* A module's parameters then buffers, in visiting order, with their keys
 * (copied). */
typedef struct em__dist_tlist {
    em_tensor **t;
    const char **key;
    int n, cap;
    bool oom;
} em__dist_tlist;
em_status em__dist_module_state(const em_module *m, em__dist_tlist *l, const char *fn);
void em__dist_tlist_free(em__dist_tlist *l);

/* Largest element count passed to one MPI call. */
#define EM_DIST_MPI_CHUNK ((int64_t)1 << 30)

#endif
