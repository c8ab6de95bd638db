/* [nccl] Gradient all-reduce between GPU buffers with NCCL (DESIGN.md §7).
 *
 * When every rank runs on a CUDA device, the bucket task of allreduce.c runs
 * on the rank's CUDA worker instead of a CPU worker, and its CUDA
 * implementation queues everything on the worker's stream without
 * waiting (STARPU_CUDA_ASYNC):
 *   1. ncclAllReduce(in place, ncclAvg) of each gradient of the bucket, all
 *      in one ncclGroupStart/End (NCCL aggregates them into one launch; no
 *      packing copies): the sum over ranks scaled by 1/world in the same
 *      pass (for floating types NCCL multiplies each contribution by
 *      1/world while summing, so no separate scaling kernel and no second
 *      pass over the gradients; needs NCCL >= 2.10);
 *   2. cudaLaunchHostFunc: clears the watchdog slot once the collective has
 *      completed on the GPU, so a peer that dies or hangs still ends the job
 *      after EMBER_DIST_TIMEOUT (the NCCL kernel would wait forever).
 * The chain token of allreduce.c still serialises the bucket tasks in
 * submission order: every rank issues its NCCL collectives in the same order.
 * Gradients, bucket and optimizer state stay on the GPU.
 *
 * Set-up (em__dist_nccl_init, from em_dist_init after em_init, every rank):
 * MPI only bootstraps NCCL. The ranks first agree (MPI_Allreduce) that every
 * one of them runs on CUDA; rank 0 then calls ncclGetUniqueId and broadcasts
 * the id over the control communicator, and every rank calls
 * ncclCommInitRank INSIDE ITS CUDA WORKER (em__run_on_worker,
 * synchronous), so the communicator is bound to the device the bucket tasks
 * run on whatever the main thread's current device is (em_dist_init's
 * binding also makes the main thread current on that GPU, but a runtime
 * started before em_dist_init may not have). A second MPI_Allreduce
 * checks that every rank got a communicator; otherwise all of them fall back
 * to the host MPI path together (a mixed decision would hang).
 *
 * Which GPU: em_dist_init gives each rank one GPU before em_init
 * (STARPU_WORKERS_CUDAID = (N + local rank) mod GPUs for cuda:N, one CUDA
 * worker), so `mpirun -np 4 ember train --device cuda:0` uses GPUs 0..3.
 *
 * The library is loaded with dlopen at that point, not linked: libember
 * loads on machines without NCCL (and CPU-only processes never map the
 * 200 MB library). Tried in order: $EMBER_NCCL_LIB, libnccl.so.2,
 * libnccl.so (the loader's search path: LD_LIBRARY_PATH, ld.so.cache).
 *
 * Without NCCL in the build (EM_DIST_NCCL 0), without the library at run
 * time, or with EMBER_DIST_NCCL=0, the bucket task runs on a CPU worker:
 * StarPU moves the gradients to RAM, MPI reduces them there, and the
 * optimizer's tasks move them back; rank 0 says so once in the log.
 *
 * Assumes the ranks do not change device after em_dist_init (the path is
 * chosen there, once, for all ranks): a rank that later switches to the CPU
 * still reduces on its GPU (StarPU moves the data there), which is correct. */
#include "dist/nccl.h"
#include "dist/dist_internal.h"
#include "tasks/tasks_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(EMBER_HAVE_CUDA)
#include <cuda_runtime.h>
#endif
#if EM_DIST_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

int em__dist_cuda_device_count(void)
{
#if defined(EMBER_HAVE_CUDA)
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver / no device: clear the sticky error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

void em__dist_cuda_set_device(int device)
{
#if defined(EMBER_HAVE_CUDA)
    if (cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
#else
    (void)device;
#endif
}

/* The CUDA worker that runs this rank's collectives, or -1 when the rank does
 * not run its ops on one CUDA worker. Ops go to the GPU's first worker; with
 * several workers on that GPU (STARPU_NWORKER_PER_CUDA >= 2) the collectives
 * take the last one, whose stream is its own, so NCCL overlaps the backward
 * kernels instead of queueing behind them. */
int em__dist_collective_worker(int ops_worker)
{
    if (ops_worker < 0 || em__worker_kind(ops_worker) != EM_DEVICE_CUDA) return -1;
    int dev = em__worker_devid(ops_worker), w = ops_worker;
    int n = em__worker_total();
    for (int i = 0; i < n; i++)
        if (em__worker_kind(i) == EM_DEVICE_CUDA && em__worker_devid(i) == dev) w = i;
    return w;
}

static int cuda_worker(void)
{
    em_placement pl = em__placement(); /* a CUDA device: its worker */
    if (pl.worker < 0 || em__worker_kind(pl.worker) != EM_DEVICE_CUDA) return -1;
    return em__dist_collective_worker(pl.worker);
}

#if !EM_DIST_NCCL

void em__dist_nccl_init(void)
{
    if (em__dist_world > 1 && em__dist_rank == 0 && cuda_worker() >= 0)
        em_log_msg(EM_LOG_WARN,
                   "dist: this build has no NCCL: gradients on the GPU are all-reduced through host memory with MPI "
                   "(StarPU copies them to RAM and back every step)");
}
void em__dist_nccl_shutdown(void) {}
int em__dist_nccl_worker(void) { return -1; }
void em__dist_nccl_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *comm, bool watch)
{
    (void)p;
    (void)m;
    (void)f64;
    (void)comm;
    (void)watch;
}
bool em__dist_nccl_local_init(const int *devs, int n, void **comms, void **streams, char *why, size_t nwhy)
{
    (void)devs;
    (void)n;
    (void)comms;
    (void)streams;
    snprintf(why, nwhy, "this build has no NCCL");
    return false;
}
void em__dist_nccl_local_destroy(void **comms, void **streams, int n)
{
    (void)comms;
    (void)streams;
    (void)n;
}
void em__dist_nccl_group_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *const *comms, void *const *streams, int n)
{
    (void)p;
    (void)m;
    (void)f64;
    (void)comms;
    (void)streams;
    (void)n;
}

#else /* EM_DIST_NCCL */

static void fatal(const char *what, const char *err);

/* Collectives per ncclGroupStart/End at most: NCCL documents a limit of
 * 2048 operations in one group (older versions enforce it); a bucket of
 * more gradients is launched as several consecutive groups, alike on every
 * rank. */
#define EM_NCCL_GROUP_OPS 1024

static ncclComm_t g_comm;
static int g_worker = -1; /* StarPU worker owning g_comm; -1: host MPI path */

/* The NCCL entry points, from dlopen. */
static struct {
    void *lib;
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    const char *(*GetErrorString)(ncclResult_t);
} nc;

/* Loads libnccl once; false (with a reason in @p why) when unavailable. */
static bool load_nccl(char *why, size_t n)
{
    if (nc.lib) return true;
    const char *names[] = {getenv("EMBER_NCCL_LIB"), "libnccl.so.2", "libnccl.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        if (names[i] && *names[i]) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, n, "cannot load the NCCL library (%s; set EMBER_NCCL_LIB or LD_LIBRARY_PATH)", e ? e : "libnccl.so.2");
        return false;
    }
    *(void **)&nc.GetVersion = dlsym(lib, "ncclGetVersion");
    *(void **)&nc.GetUniqueId = dlsym(lib, "ncclGetUniqueId");
    *(void **)&nc.CommInitRank = dlsym(lib, "ncclCommInitRank");
    *(void **)&nc.CommInitAll = dlsym(lib, "ncclCommInitAll");
    *(void **)&nc.GroupStart = dlsym(lib, "ncclGroupStart");
    *(void **)&nc.GroupEnd = dlsym(lib, "ncclGroupEnd");
    *(void **)&nc.CommDestroy = dlsym(lib, "ncclCommDestroy");
    *(void **)&nc.AllReduce = dlsym(lib, "ncclAllReduce");
    *(void **)&nc.GetErrorString = dlsym(lib, "ncclGetErrorString");
    if (!nc.GetVersion || !nc.GetUniqueId || !nc.CommInitRank || !nc.CommInitAll || !nc.GroupStart || !nc.GroupEnd || !nc.CommDestroy || !nc.AllReduce || !nc.GetErrorString) {
        snprintf(why, n, "the NCCL library lacks an entry point");
        dlclose(lib);
        memset(&nc, 0, sizeof nc);
        return false;
    }
    nc.lib = lib;
    return true;
}

int em__dist_nccl_worker(void) { return g_worker; }

typedef struct nccl_job {
    ncclUniqueId id;
    int nranks, rank;
    int device;         /* the worker's CUDA device (filled in) */
    ncclResult_t res;
    ncclComm_t comm;
} nccl_job;

/* [nccl] The collectives' own stream (see prio_stream_new), and
 * two events that order it with the worker's stream (see
 * em__dist_nccl_allreduce_mean). Made on the NCCL worker, for its GPU. */
static cudaStream_t g_prio_stream;
static cudaEvent_t g_ev_ready, g_ev_done;

/* A non-blocking stream for the collectives (NULL on failure), at the
 * default (lowest) priority, as the compute streams; EMBER_DIST_HIGH_PRIORITY=1:
 * at the GPU's highest priority (for comparisons). With a high priority, the
 * NCCL kernels took SMs as soon as any freed up, stretching the backward
 * GEMM they overlap on the GPU that is behind (the critical one); at the
 * default priority they fill the SMs that the GEMM's last wave leaves idle.
 * 2 x H200, wide MLP, same lease: +5 % samples/s with mpirun, +9 % in one
 * process (docs/benchmarks.md). */
static cudaStream_t prio_stream_new(void)
{
    int least = 0, greatest = 0;
    cudaStream_t s = NULL;
    const char *env = getenv("EMBER_DIST_HIGH_PRIORITY");
    bool high = env && *env && atoi(env) != 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess ||
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high ? greatest : least) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return s;
}

static void init_on_worker(void *arg)
{
    nccl_job *j = arg;
    j->device = -1;
    cudaGetDevice(&j->device);
    j->res = nc.CommInitRank(&j->comm, j->nranks, j->id, j->rank);
    if (j->res != ncclSuccess) return;
    g_prio_stream = prio_stream_new();
    if (g_prio_stream && (cudaEventCreateWithFlags(&g_ev_ready, cudaEventDisableTiming) != cudaSuccess ||
                          cudaEventCreateWithFlags(&g_ev_done, cudaEventDisableTiming) != cudaSuccess)) {
        cudaGetLastError();
        cudaStreamDestroy(g_prio_stream);
        g_prio_stream = NULL; /* the collectives then use the worker's own stream */
    }
}

static void destroy_on_worker(void *arg)
{
    ncclComm_t *c = arg;
    nc.CommDestroy(*c);
    if (g_prio_stream) {
        cudaStreamDestroy(g_prio_stream);
        cudaEventDestroy(g_ev_ready);
        cudaEventDestroy(g_ev_done);
        g_prio_stream = NULL;
    }
}

static void log_host_path(const char *why)
{
    if (em__dist_rank == 0)
        em_log_msg(EM_LOG_WARN, "dist: %s: gradients on the GPU are all-reduced through host memory with MPI instead of NCCL", why);
}

void em__dist_nccl_init(void)
{
    g_worker = -1;
    if (em__dist_world <= 1) return;
    int worker = cuda_worker();
    const char *env = getenv("EMBER_DIST_NCCL");
    bool allowed = !(env && *env && atoi(env) == 0);
    int ver = 0;
    char why[512] = "NCCL disabled (EMBER_DIST_NCCL=0)";
    if (worker >= 0 && allowed && !load_nccl(why, sizeof why)) allowed = false;
    if (worker >= 0 && allowed && (nc.GetVersion(&ver) != ncclSuccess || ver < 21000)) {
        snprintf(why, sizeof why, "the NCCL library (version code %d) is older than 2.10 (no ncclAvg)", ver);
        allowed = false;
    }
    if (worker >= 0 && !allowed && em__dist_rank != 0) em_log_msg(EM_LOG_INFO, "dist: rank %d: %s", em__dist_rank, why);
    /* Agree first: {every rank wants NCCL, -(some rank runs on CUDA)}. */
    int v[2] = {worker >= 0 && allowed, -(worker >= 0)};
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "NCCL set-up");
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    if (rc != MPI_SUCCESS || !v[0]) {
        if (v[1] < 0)
            log_host_path(rc != MPI_SUCCESS ? "NCCL set-up failed (MPI)"
                          : !allowed && worker >= 0 ? why
                                                    : "not every rank runs on a CUDA device (or some rank cannot use NCCL)");
        return;
    }
    /* Rank 0 makes the id; MPI carries it (with a flag: rank 0 may fail). */
    struct {
        int ok;
        ncclUniqueId id;
    } boot;
    memset(&boot, 0, sizeof boot);
    if (em__dist_rank == 0) boot.ok = nc.GetUniqueId(&boot.id) == ncclSuccess;
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "NCCL set-up");
    rc = MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    if (rc != MPI_SUCCESS || !boot.ok) {
        log_host_path("ncclGetUniqueId failed on rank 0");
        return;
    }
    nccl_job job;
    memset(&job, 0, sizeof job);
    job.id = boot.id;
    job.nranks = em__dist_world;
    job.rank = em__dist_rank;
    job.res = ncclInternalError;
    /* ncclCommInitRank waits for every rank: under the watchdog. */
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "NCCL communicator initialisation (ncclCommInitRank)");
    em__run_on_worker(worker, init_on_worker, &job, "ember_nccl_init");
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    int ok = job.res == ncclSuccess;
    if (!ok)
        em_log_msg(EM_LOG_WARN, "dist: rank %d: ncclCommInitRank on GPU %d failed: %s", em__dist_rank, job.device,
                   nc.GetErrorString(job.res));
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "NCCL set-up");
    rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    if (rc != MPI_SUCCESS || !ok) {
        if (job.res == ncclSuccess) em__run_on_worker(worker, destroy_on_worker, &job.comm, "ember_nccl_destroy");
        log_host_path("NCCL communicator set-up failed on some rank");
        return;
    }
    g_comm = job.comm;
    g_worker = worker;
    em_log_msg(EM_LOG_INFO, "dist: rank %d: NCCL %d.%d.%d communicator of %d ranks on GPU %d (StarPU worker %d)", em__dist_rank,
               ver / 10000, ver / 100 % 100, ver % 100, em__dist_world, job.device, worker);
}

void em__dist_nccl_shutdown(void)
{
    if (g_worker < 0) return;
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "NCCL communicator destruction"); /* may wait for peers' proxies */
    if (em_is_initialized())
        em__run_on_worker(g_worker, destroy_on_worker, &g_comm, "ember_nccl_destroy");
    else
        nc.CommDestroy(g_comm);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    g_worker = -1;
}

/* ---- in-process replicas (replicas.c) ---------------------------------------- */

bool em__dist_nccl_local_init(const int *devs, int n, void **comms, void **streams, char *why, size_t nwhy)
{
    const char *env = getenv("EMBER_DIST_NCCL");
    if (env && *env && atoi(env) == 0) {
        snprintf(why, nwhy, "NCCL disabled (EMBER_DIST_NCCL=0)");
        return false;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devs[i] == devs[j]) {
                snprintf(why, nwhy, "two replicas share CUDA device %d (NCCL needs one GPU per rank)", devs[i]);
                return false;
            }
    if (!load_nccl(why, nwhy)) return false;
    int ver = 0;
    if (nc.GetVersion(&ver) != ncclSuccess || ver < 21000) {
        snprintf(why, nwhy, "the NCCL library (version code %d) is older than 2.10 (no ncclAvg)", ver);
        return false;
    }
    ncclComm_t *c = calloc((size_t)n, sizeof *c);
    if (!c) {
        snprintf(why, nwhy, "out of memory");
        return false;
    }
    int cur = -1;
    cudaGetDevice(&cur); /* ncclCommInitAll and the stream creation switch devices on this thread */
    ncclResult_t r = nc.CommInitAll(c, n, devs);
    bool ok = r == ncclSuccess;
    if (!ok) snprintf(why, nwhy, "ncclCommInitAll over %d GPUs failed: %s", n, nc.GetErrorString(r));
    for (int i = 0; i < n; i++) streams[i] = NULL;
    for (int i = 0; i < n && ok; i++) {
        cudaStream_t st = NULL;
        cudaError_t e = cudaSetDevice(devs[i]);
        if (e == cudaSuccess && !(st = prio_stream_new())) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            snprintf(why, nwhy, "cannot create a stream on GPU %d: %s", devs[i], cudaGetErrorString(e));
            cudaGetLastError();
            ok = false;
        } else {
            streams[i] = st;
        }
    }
    if (cur >= 0) cudaSetDevice(cur);
    if (!ok) {
        for (int i = 0; i < n; i++) {
            if (streams[i]) cudaStreamDestroy((cudaStream_t)streams[i]);
            streams[i] = NULL;
            if (r == ncclSuccess) nc.CommDestroy(c[i]);
        }
        free(c);
        return false;
    }
    for (int i = 0; i < n; i++) comms[i] = c[i];
    free(c);
    em_log_msg(EM_LOG_INFO, "replicas: NCCL %d.%d.%d communicator over %d GPUs of this process", ver / 10000, ver / 100 % 100,
               ver % 100, n);
    return true;
}

void em__dist_nccl_local_destroy(void **comms, void **streams, int n)
{
    for (int i = 0; i < n; i++) {
        if (comms[i]) nc.CommDestroy((ncclComm_t)comms[i]);
        if (streams[i]) cudaStreamDestroy((cudaStream_t)streams[i]);
        comms[i] = streams[i] = NULL;
    }
}

void em__dist_nccl_group_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *const *comms, void *const *streams, int n)
{
    int per = EM_NCCL_GROUP_OPS / n > 0 ? EM_NCCL_GROUP_OPS / n : 1; /* gradients per group */
    for (int j0 = 0; j0 < m; j0 += per) {
        ncclResult_t r = nc.GroupStart();
        for (int j = j0; j < m && j < j0 + per && r == ncclSuccess; j++)
            for (int k = 0; k < n && r == ncclSuccess; k++) {
                const em__nccl_piece *q = &p[(size_t)j * (size_t)n + (size_t)k];
                r = nc.AllReduce(q->ptr, q->ptr, (size_t)q->count, f64 ? ncclFloat64 : ncclFloat32, ncclAvg, (ncclComm_t)comms[k],
                                 (cudaStream_t)streams[k]);
            }
        ncclResult_t r2 = nc.GroupEnd();
        if (r != ncclSuccess) {
            fatal("ncclAllReduce (replicas)", nc.GetErrorString(r));
            return;
        }
        if (r2 != ncclSuccess) {
            fatal("ncclGroupEnd (replicas)", nc.GetErrorString(r2));
            return;
        }
    }
    /* No time limit here, unlike the cross-rank path and its watchdog: a
     * collective that never completes blocks this CPU worker. */
    for (int k = 0; k < n; k++) {
        cudaError_t e = cudaStreamSynchronize((cudaStream_t)streams[k]);
        if (e != cudaSuccess) {
            fatal("cudaStreamSynchronize after ncclAllReduce (replicas)", cudaGetErrorString(e));
            return;
        }
    }
}

/* ---- on the CUDA worker, inside the bucket task ----------------------------- */

/* A failed collective is the task's sticky error (DESIGN.md §10): the next
 * em_sync or host read of this process returns it; the library does not end
 * the job (em_dist_abort is the caller's choice). Peers left waiting for this
 * rank's part still end after EMBER_DIST_TIMEOUT through their watchdog. */
static void fatal(const char *what, const char *err)
{
    em__task_kernel_error(EM_ERR_DEVICE, "gradient all-reduce on the GPU: %s failed: %s", what, err);
}

static void CUDART_CB watch_end_cb(void *arg)
{
    (void)arg;
    em__dist_watch_end(EM_DIST_SLOT_GRAD);
}

void em__dist_nccl_allreduce_mean(const em__nccl_piece *p, int m, bool f64, void *comm, bool watch)
{
    /* The collectives run on their own stream (prio_stream_new), fenced by
     * events on both sides: they start after the work already queued on the
     * worker's stream, and that stream (whose completion StarPU tracks)
     * waits for them. On the worker's own stream they would wait for every
     * backward kernel queued before them. */
    cudaStream_t s = (cudaStream_t)em__cuda_local_stream(), cs = s;
    if (g_prio_stream && !comm) {
        cs = g_prio_stream;
        if (cudaEventRecord(g_ev_ready, s) != cudaSuccess || cudaStreamWaitEvent(cs, g_ev_ready, 0) != cudaSuccess) {
            fatal("ordering the collective stream", cudaGetErrorString(cudaGetLastError()));
            return;
        }
    }
    if (watch) em__dist_watch_begin(EM_DIST_SLOT_GRAD, "gradient all-reduce (NCCL)");
    for (int j0 = 0; j0 < m; j0 += EM_NCCL_GROUP_OPS) {
        ncclResult_t r = nc.GroupStart();
        for (int j = j0; j < m && j < j0 + EM_NCCL_GROUP_OPS && r == ncclSuccess; j++)
            r = nc.AllReduce(p[j].ptr, p[j].ptr, (size_t)p[j].count, f64 ? ncclFloat64 : ncclFloat32, ncclAvg,
                             comm ? (ncclComm_t)comm : g_comm, cs);
        ncclResult_t r2 = nc.GroupEnd();
        if (r != ncclSuccess || r2 != ncclSuccess) {
            if (watch) em__dist_watch_end(EM_DIST_SLOT_GRAD); /* nothing of this rank is left to watch */
            fatal(r != ncclSuccess ? "ncclAllReduce" : "ncclGroupEnd", nc.GetErrorString(r != ncclSuccess ? r : r2));
            return;
        }
    }
    /* The worker's stream waits for the collectives only, not for the
     * watchdog's host function queued after them (a host round trip). */
    if (cs != s && (cudaEventRecord(g_ev_done, cs) != cudaSuccess || cudaStreamWaitEvent(s, g_ev_done, 0) != cudaSuccess)) {
        if (watch) em__dist_watch_end(EM_DIST_SLOT_GRAD); /* nothing of this rank is left to watch */
        fatal("ordering the collective stream", cudaGetErrorString(cudaGetLastError()));
        return;
    }
    if (watch) {
        cudaError_t e = cudaLaunchHostFunc(cs, watch_end_cb, NULL);
        if (e != cudaSuccess) {
            em__dist_watch_end(EM_DIST_SLOT_GRAD); /* cannot watch this one */
            cudaGetLastError();
        }
    }
}

#endif /* EM_DIST_NCCL */
