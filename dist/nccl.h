/* [nccl] Gradient all-reduce between GPU buffers with NCCL (dist/nccl.c),
 * shared by dist.c (GPU choice, communicator set-up) and allreduce.c (the
 * CUDA implementation of the bucket task). DESIGN.md §7.
 *
 * EM_DIST_NCCL is 1 when this build has NCCL (CMake found nccl.h and
 * libnccl: EMBER_HAVE_NCCL) and CUDA kernels (EMBER_HAVE_CUDA, which needs a
 * StarPU with CUDA: devices/cuda uses its CUDA API); 0 otherwise, and the
 * functions below then keep every reduction on the host MPI path. */
#ifndef EMBER_DIST_NCCL_H
#define EMBER_DIST_NCCL_H

#include "ember/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(EMBER_HAVE_NCCL) && defined(EMBER_HAVE_CUDA)
#define EM_DIST_NCCL 1
#else
#define EM_DIST_NCCL 0
#endif

/** CUDA devices this process can see (0 without CUDA in the build or
 *  without a GPU). Called before em_init to pick the rank's GPU. */
int em__dist_cuda_device_count(void);
/** Makes @p device current on the calling (main) thread, so that CUDA calls
 *  made there (StarPU's pinned host allocations, cudaHostAlloc) use this
 *  rank's GPU instead of creating a context on GPU 0. No-op without CUDA. */
void em__dist_cuda_set_device(int device);

/** After em_init, on every rank (a collective on the control communicator):
 *  when every rank runs on a CUDA device (and EMBER_DIST_NCCL is not 0),
 *  creates one NCCL communicator over all ranks on this rank's GPU. Never
 *  fails: anything missing or failing leaves the host MPI path, logged once
 *  (rank 0). */
void em__dist_nccl_init(void);
/** Destroys the communicator (before em_shutdown; waits for nothing). */
void em__dist_nccl_shutdown(void);
/** StarPU worker whose GPU holds the NCCL communicator, or -1 when gradient
 *  reductions take the host MPI path. The same decision on every rank. */
int em__dist_nccl_worker(void);

/** The CUDA worker that runs collectives for the GPU of CUDA worker
 *  @p ops_worker: the last worker on that GPU (its own stream when
 *  STARPU_NWORKER_PER_CUDA >= 2), or -1 when @p ops_worker is not CUDA. */
int em__dist_collective_worker(int ops_worker);

/** In-process replicas (replicas.c): one NCCL communicator per CUDA device
 *  of @p devs (n distinct CUDA device ids, ncclCommInitAll), comms[i] for
 *  devs[i], and one private non-blocking stream per device (streams[i]).
 *  false with a reason in @p why when NCCL is absent, too old, disabled
 *  (EMBER_DIST_NCCL=0), devices repeat, or set-up fails. */
bool em__dist_nccl_local_init(const int *devs, int n, void **comms, void **streams, char *why, size_t nwhy);
/** Destroys communicators and streams from em__dist_nccl_local_init (after em_sync). */
void em__dist_nccl_local_destroy(void **comms, void **streams, int n);
/** One gradient of a bucket for the kernels below: @p count float32 (or
 *  float64) elements at device pointer @p ptr, averaged in place. */
typedef struct em__nccl_piece {
    void *ptr;
    int64_t count;
} em__nccl_piece;

/** From ONE thread (a CPU worker): in-place ncclAvg of a bucket of @p m
 *  gradients over the n GPUs: p[j * n + k] is gradient j on GPU k (comms[k],
 *  streams[k]). Every GPU's collectives are launched together in one
 *  ncclGroupStart/End on the private streams (NCCL aggregates the m
 *  gradients into one launch per GPU, no packing copies), then this waits
 *  for the streams. Launching every GPU's part at once from one thread is
 *  what keeps a single process safe: with one launch per GPU from different
 *  threads, a GPU whose collective already runs waits for a launch that
 *  another thread's CUDA call (a cudaFree synchronising a device) can hold
 *  up (seen: a hang with staggered launches). Aborts the process on
 *  failure. */
void em__dist_nccl_group_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *const *comms, void *const *streams, int n);

/** Called by the CUDA implementation of the bucket task, on that worker;
 *  queues work and returns at once: the in-place mean over the ranks of
 *  @p comm (NULL: the process communicator of em__dist_nccl_init) of the
 *  @p m gradients @p p, in one NCCL group on the collective stream, ordered
 *  after the worker's stream (em__cuda_local_stream) and before its next work; @p watch:
 *  under the collective watchdog. */
void em__dist_nccl_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *comm, bool watch);

#endif
