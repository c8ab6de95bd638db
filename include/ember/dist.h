/* Ember data-parallel training across processes (MPI), DESIGN.md §7.
 *
 * Launch N copies with `mpirun -np N`; each process (rank) holds a full replica
 * of the model, reads its own shard of every batch (em_loader_options rank /
 * world_size / shard_even) and, after each backward pass, averages the
 * gradients with the other ranks before the optimizer step, so every replica
 * applies the same update and stays identical.
 *
 *     em_dist_init(&argc, &argv, NULL);               // MPI, then em_init
 *     em_module *m = build_model();
 *     if (em_dist_check_config(m, "adam lr=1e-3 batch=64") != EM_OK) ... // same model + settings everywhere?
 *     em_dist_broadcast_params(m);                     // replicas start identical
 *     ... loader with .rank = em_dist_rank(), .world_size = em_dist_world_size(), .shard_even = true
 *     em_grads *g = em_backward(loss);
 *     em_dist_allreduce_grads(g, params, n);           // submits tasks, never waits
 *     em_optim_step(opt, g);
 *     ...
 *     em_dist_shutdown();                              // em_shutdown, then MPI_Finalize
 *
 * Gradient averaging is made of StarPU tasks like every other op: gradients
 * are grouped into buckets, in reverse parameter order (the order backward
 * produces them) and by PyTorch DDP's rule (a bucket closes once it holds at
 * least the bucket size; the first one at 1 MiB), and ONE task per bucket
 * averages its gradients in place: MPI_Allreduce on the host buffers and a
 * scaling by 1/world, or, when every rank runs on a GPU and NCCL loads, the
 * bucket's ncclAllReduce(ncclAvg) calls in one NCCL group on the GPU. Nothing
 * is packed; a gradient that is not contiguous or shares its storage with
 * another tensor is first replaced by a private copy. A bucket is reduced
 * as soon as its own gradients are ready while the rest of backward still
 * runs; the optimizer update of a parameter starts once its bucket is
 * reduced. The reduction tasks are chained, so they issue their collectives
 * in the same order on every rank.
 *
 * Collectives never hang forever: a watchdog thread aborts the whole job
 * (MPI_Abort, with a message naming the rank and the collective) when one
 * does not complete within EMBER_DIST_TIMEOUT seconds (default 120). A rank
 * that dies makes mpirun end the others.
 *
 * Without em_dist_init (a plain single process) rank is 0, world size is 1 and
 * every function below is a cheap no-op, so code can call them unconditionally.
 */
#ifndef EMBER_DIST_H
#define EMBER_DIST_H

#include "ember/autograd.h"
#include "ember/nn.h"
#include "ember/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/** true when the process seems to run under an MPI launcher (mpirun/srun set
 *  OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) with more than one rank. */
EM_API bool em_dist_launched(void);

/** Initialises MPI (MPI_Init_thread with MPI_THREAD_MULTIPLE: gradient
 *  reductions call MPI from StarPU workers), starts the watchdog, then the
 *  Ember runtime with @p cfg (NULL = defaults + environment) unless it is
 *  already running. Ranks sharing a host split its cores: when neither
 *  EMBER_NCPU nor STARPU_NCPU is set, each rank gets cores/local_ranks CPU
 *  workers (at least 1), and STARPU_WORKERS_GETBIND defaults to 1 so workers
 *  follow mpirun's binding. @p argc/@p argv may be NULL. Calling it twice is
 *  an EM_ERR_STATE error. */
EM_API em_status em_dist_init(int *argc, char ***argv, const em_config *cfg);
/** Waits for all tasks, stops the runtime (em_shutdown) and finalises MPI.
 *  No-op without em_dist_init. */
EM_API void em_dist_shutdown(void);
/** Ends the whole job now (MPI_Abort with @p code, which stops every rank)
 *  after printing @p msg (may be NULL) with the rank. Without em_dist_init
 *  there is no job to end: it prints and returns, and the caller decides
 *  (the library never calls exit). */
EM_API void em_dist_abort(int code, const char *msg);
EM_API bool em_dist_is_initialized(void);
/** This process's rank (0 without em_dist_init). */
EM_API int em_dist_rank(void);
/** Number of ranks (1 without em_dist_init). */
EM_API int em_dist_world_size(void);

/** Copies every parameter and buffer of @p m from rank 0 to all ranks (call
 *  on every rank, after building the model and before the first step). Waits. */
EM_API em_status em_dist_broadcast_params(em_module *m);

/** Largest absolute difference between this rank's parameters (and buffers)
 *  and rank 0's, over all ranks (the same value on every rank): 0 when all
 *  replicas are identical. Waits; for tests and sanity checks. */
EM_API em_status em_dist_param_divergence(const em_module *m, double *max_abs_diff);

/** Checks that every rank runs the same model and settings: all ranks gather
 *  a hash of @p m's parameter keys, dtypes and shapes and of @p hparams (a
 *  caller-made string of the hyper-parameters that must agree, e.g.
 *  "adam lr=0.001 batch=64 seed=0"; may be NULL). On any difference every
 *  rank gets EM_ERR_STATE with a message naming the first differing rank and
 *  what differs (model summary or settings), so all can exit cleanly. */
EM_API em_status em_dist_check_config(const em_module *m, const char *hparams);

/** Bucket size for em_dist_allreduce_grads and the NCCL path of
 *  em_replicas_allreduce_grads, in bytes (default 25 MiB as PyTorch DDP's
 *  bucket_cap_mb, or EMBER_DIST_BUCKET_KB). As in DDP, gradients join a
 *  bucket until it holds at least this many bytes (the first bucket closes
 *  at 1 MiB, or this size when smaller), so a larger gradient ends the
 *  bucket it joins. 0: one reduction per gradient tensor. */
EM_API void em_dist_set_bucket_bytes(size_t nbytes);
EM_API size_t em_dist_get_bucket_bytes(void);

/** Averages the gradients of @p params (n tensors, the same list in the same
 *  order on every rank) across ranks, replacing each entry of @p g with the
 *  mean. The container's gradients are averaged in place when nothing else
 *  references them (the usual case after em_backward); a gradient that the
 *  caller or another tensor still sees (a retained tensor, a view, one
 *  tensor shared by two parameters, a non-contiguous one) is first replaced
 *  in @p g by a private copy, so tensors obtained before the call keep their
 *  values. Only submits tasks (one reduction task per bucket, and those
 *  COPY tasks): it returns before backward's tasks have run, and the
 *  optimizer's tasks wait for the reductions through ordinary data
 *  dependencies. Parameters that do not require grad are skipped, and a
 *  parameter listed twice (tied weights) is reduced once; a parameter that
 *  requires grad but got no gradient on this rank contributes zeros (and
 *  then has a gradient, possibly zero, on every rank, keeping replicas
 *  identical). Gradients must be float32/float64 of their parameter's dtype
 *  and element count (EM_ERR_DTYPE / EM_ERR_SHAPE naming the parameter
 *  otherwise). No-op when world size is 1.
 *  Step fence: @p g also gets a fence, signalled once the gradients of the
 *  last bucket (the last ones backward produces) exist; em_optim_step on
 *  @p g makes its updates wait for it, at a low task priority, so that the
 *  GPU finishes backward before updating the layers already reduced and
 *  those updates overlap the last reduction (2 ranks on 2 H200s: +4 to 6 %
 *  samples/s for the wide MLP of docs/benchmarks.md; within the noise for
 *  the one-process form). EMBER_DIST_FENCE=0 turns the fence off (for
 *  comparisons). After em_dist_shutdown, em_optim_step on @p g runs without
 *  the fence. */
EM_API em_status em_dist_allreduce_grads(em_grads *g, em_tensor *const *params, int n);

/** Sums @p n doubles element-wise across ranks, in place (a collective: call
 *  on every rank; waits). E.g. epoch metrics: {loss_sum, correct, samples}. */
EM_API em_status em_dist_allreduce_sum(double *vals, int n);
/** Maximum of @p n doubles across ranks, in place (collective; waits). */
EM_API em_status em_dist_allreduce_max(double *vals, int n);
/** Waits for every rank (collective). */
EM_API em_status em_dist_barrier(void);

/* ---- one process, several devices (no mpirun) -------------------------------
 *
 * Data-parallel replicas inside one process, one per device (DESIGN.md §7):
 * the caller builds n copies of the model and one optimizer per copy;
 * replica i runs its share of every batch on devices[i] (em_set_device before
 * its forward, backward and optimizer step); em_replicas_allreduce_grads then
 * averages the gradients of all replicas, so every optimizer applies the same
 * update and the replicas stay identical. Submission only queues tasks and
 * StarPU runs each replica's tasks on its own device's workers at the same
 * time; em_replicas_run also gives each replica its own submitting thread.
 * Storage handles are recycled per device (runtime/pool.c), so replicas
 * never wait on each other except in the gradient reduction.
 *
 *     em_module *m[2] = {build(), build()};
 *     em_optim *o[2] = {em_adam_new(...m[0]...), em_adam_new(...m[1]...)};
 *     em_device d[2] = {em_device_cuda(0), em_device_cuda(1)};
 *     em_replicas *r = em_replicas_new(m, o, d, 2);   // copies m[0] into m[1]
 *     each step, for i in 0..1: em_set_device(d[i]); loss_i = ... half i of the batch ...;
 *                               g[i] = em_backward(loss_i);
 *     em_replicas_allreduce_grads(r, g);              // submits tasks, never waits
 *     for i in 0..1: em_set_device(d[i]); em_optim_step(o[i], g[i]);
 *
 * The mean of the replicas' gradients equals the gradient of the mean loss
 * over the whole batch when the shares have equal sizes; for unequal shares
 * scale replica i's loss by n * share_i / batch before backward (the Learner
 * does). Two reduction paths, chosen once by em_replicas_new:
 *  - NCCL, when every device is a distinct CUDA GPU, libnccl (>= 2.10)
 *    loads and a CPU worker exists: gradients are bucketed as across ranks
 *    (em_dist_get_bucket_bytes); per bucket, ONE task on a CPU worker
 *    launches the in-place ncclAllReduce(ncclAvg) of every gradient of the
 *    bucket on every GPU in one NCCL group, on private streams, and waits
 *    for it (no packing; one launch for all
 *    GPUs from one thread: per-GPU launches from different threads hung);
 *  - tasks, otherwise (CPU, OpenCL, mixed devices, no NCCL): per gradient,
 *    the replicas' gradients are summed on device 0 by ADD tasks (StarPU moves
 *    the data), scaled by 1/n, and copied back to each device by a COPY task.
 * Both give every replica bit-identical averaged gradients.
 *
 * Not supported yet: several replicas per rank under mpirun (world size > 1);
 * em_replicas_new then fails with EM_ERR_STATE. Use one rank per GPU. */
typedef struct em_replicas em_replicas;

/** Groups @p n replicas (1 <= n <= 64): models[i] (BORROWED, same
 *  architecture: same parameter keys, shapes, dtypes), opts[i] (BORROWED,
 *  over exactly models[i]'s parameters, same kind and settings) and
 *  devices[i] (every one must exist: EM_ERR_DEVICE naming it). Copies replica
 *  0's parameters, buffers and optimizer state into the others and waits.
 *  Errors (NULL + em_last_error()): EM_ERR_INVALID (bad arguments, models of
 *  different architectures naming the replica and key, an optimizer over
 *  other tensors), EM_ERR_DEVICE, EM_ERR_STATE (under mpirun with n > 1).
 *  Leaves the process's current device as it was. */
EM_API em_replicas *em_replicas_new(em_module *const *models, em_optim *const *opts, const em_device *devices, int n);
/** Waits for pending tasks, then frees the group (not the models, optimizers). */
EM_API void em_replicas_free(em_replicas *r);
EM_API int em_replicas_count(const em_replicas *r);
EM_API em_module *em_replicas_model(const em_replicas *r, int i);
EM_API em_optim *em_replicas_optim(const em_replicas *r, int i);
EM_API em_device em_replicas_device(const em_replicas *r, int i);
/** "nccl" or "tasks": the reduction path chosen by em_replicas_new ("none"
 *  for a single replica). */
EM_API const char *em_replicas_path(const em_replicas *r);

/** Copies replica 0's parameters, buffers, optimizer state, step counters and
 *  learning rate into every other replica, and waits (e.g. after loading a
 *  checkpoint into replica 0). */
EM_API em_status em_replicas_broadcast(em_replicas *r);

/** Replaces each g[i] (the gradients of replica i, from em_backward; one
 *  container per replica, in replica order) with the mean over the replicas.
 *  Only submits tasks: returns before backward's tasks have run. Parameters
 *  that do not require grad are skipped; a gradient missing in some replica
 *  counts as zeros there. float32/float64 gradients. No-op for one replica.
 *  Each g[i] gets replica i's step fence, as em_dist_allreduce_grads; it is
 *  owned by @p r: g[i] must not be passed to em_optim_step after
 *  em_replicas_free(r). */
EM_API em_status em_replicas_allreduce_grads(em_replicas *r, em_grads *const *g);

/** Work of one replica in em_replicas_run: @p i is the replica. Return
 *  EM_OK, or an error status with em_last_error() set (on that thread). */
typedef em_status (*em_replica_fn)(em_replicas *r, int i, void *ctx);

/** Runs fn(r, i, ctx) for every replica at once: replica 0 on the calling
 *  thread, replica i > 0 on the group's thread i (started on first use, kept
 *  until em_replicas_free), each with the replica's device as its thread
 *  device (em_set_thread_device), and waits for all of them. Submitting a
 *  replica's forward and backward is serial CPU work; with one thread per
 *  replica the n submissions overlap, so a small model's step does not grow
 *  n-fold. Thread-local state (scopes, no-grad, errors) is per thread: @p fn
 *  opens and closes its own scope and no-grad region; tensors it keeps for
 *  the caller (e.g. gradients) must be referenced by something that
 *  outlives its scope. Random numbers (dropout, em_rand_*) drawn inside
 *  @p fn come from one stream per replica: replica 0 continues the global
 *  generator, replica i > 0 uses the same counters under its own key, and
 *  the global counter then moves past what any replica used; so a seeded run
 *  gives the same numbers whatever the threads' timing. Returns EM_OK, or
 *  the first failing replica's status with its message prefixed by
 *  "replica i: ". Not reentrant. */
EM_API em_status em_replicas_run(em_replicas *r, em_replica_fn fn, void *ctx);

/** Largest absolute difference between any replica's parameters and buffers
 *  and replica 0's (0 when identical). Waits; for tests and checks. */
EM_API em_status em_replicas_divergence(const em_replicas *r, double *max_abs_diff);

#ifdef __cplusplus
}
#endif
#endif
