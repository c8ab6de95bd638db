/* Data-parallel replicas inside one process, one per device (DESIGN.md §7;
 * the API and the two reduction paths are described in include/ember/dist.h).
 *
 * NCCL path. Gradients are bucketed as across ranks (reverse parameter order,
 * em__dist_bucket_end) and averaged in place, without packing (a gradient
 * that does not own its storage is first copied: em__dist_own_grads). ONE
 * task per bucket, on a CPU worker, gets every replica's gradients of the
 * bucket in that replica's GPU memory (em_op.nodes: StarPU specific nodes) and
 * launches the in-place ncclAvg of all of them on all GPUs in one NCCL
 * group, on private streams, and waits for them. One launch for all GPUs
 * from one thread is what a single process needs (see nccl.h); the group
 * tasks are chained by a token, so collectives keep submission order.
 *
 * The last reduction signals each replica's step fence first (see
 * em_dist_allreduce_grads in include/ember/dist.h).
 *
 * Tasks path: per gradient, ADD tasks on device 0 sum the replicas'
 * gradients (StarPU moves each to device 0), one MUL task scales by 1/n, and
 * one COPY task per other replica brings the mean back to its device. Every
 * replica then holds a copy of the same tensor: bit-identical updates. */
#include "dist/dist_internal.h"
#include "dist/nccl.h" /* [nccl] */
#include "autodiff/autodiff.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EM_REPLICAS_MAX 64

struct em_replicas {
    int n, np;           /* replicas; parameter tensors per replica */
    em_module **models;  /* borrowed */
    em_optim **opts;     /* borrowed */
    em_device *devs;
    em_tensor **params;  /* [n][np], borrowed from the models */
    bool nccl;
    void **comms;               /* [nccl] [n] one communicator per GPU */
    void **streams;             /* [nccl] [n] private stream per GPU */
    void *token;                /* [nccl] em_op.token: chains the group ops */
    int *nodes;                 /* [nccl] [1 + n * np] memory node of each buffer of a group op (em_op.nodes):
                                 * the token, then gradient j of replica k as buffer 1 + j * n + k */
    /* em_replicas_run: threads 1..n-1, one job at a time */
    pthread_t *threads;
    int nthreads;                /* started */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;                /* job number */
    bool running;                /* inside em_replicas_run */
    int pending;                 /* threads still working on job gen */
    bool stop;
    em_replica_fn fn;
    void *ctx;
    em_status *st;               /* [n] */
    uint64_t rng_seed, rng_offset; /* the global random state when the run started */
    uint64_t rng_used[EM_REPLICAS_MAX]; /* counters each replica drew */
    char (*msg)[512];            /* [n] */
    void **fences;               /* [n] step fence of each replica (em__fence_signal) */
};

/* [nccl] Arguments of one group task (one allocation): entry j * n + k is
 * gradient j of the bucket on replica k, buffer 1 + j * n + k. */
typedef struct group_args {
    const em_replicas *r;
    int32_t f64, m;          /* dtype; gradients per replica */
    int64_t *offset;         /* [m * n] elements, where each gradient starts in its buffer */
    em__nccl_piece pieces[]; /* [m * n] element counts; the kernel fills in the pointers */
} group_args;

/* The CPU kernel of REPLICAS_ALLREDUCE_MEAN (tasks/ops.def). */
void em_dist_cpu_replicas_allreduce_mean(void *buffers[], void *cl_arg)
{
    group_args *a = cl_arg;
    size_t es = a->f64 ? sizeof(double) : sizeof(float);
    int total = a->m * a->r->n;
    for (int i = 0; i < total; i++) a->pieces[i].ptr = (char *)em__buffer_ptr(buffers, 1 + i) + (size_t)a->offset[i] * es;
    em__dist_nccl_group_allreduce_mean(a->pieces, a->m, a->f64 != 0, a->r->comms, a->r->streams, a->r->n);
}

/* The functions below switch devices with em_set_device; inside a guard
 * that only changes the calling thread's device (em_set_thread_device), never
 * the process's, which other threads may be using. */
typedef struct dev_guard {
    bool had;
    em_device saved;
} dev_guard;

static dev_guard guard_begin(void)
{
    dev_guard g = {em__has_thread_device(), em_get_device()};
    em_set_thread_device(g.saved);
    em_clear_error();
    return g;
}

static void guard_end(const dev_guard *g)
{
    if (g->had) em_set_thread_device(g->saved);
    else em_clear_thread_device();
}

int em_replicas_count(const em_replicas *r) { return r ? r->n : 0; }
em_module *em_replicas_model(const em_replicas *r, int i) { return r && i >= 0 && i < r->n ? r->models[i] : NULL; }
em_optim *em_replicas_optim(const em_replicas *r, int i) { return r && i >= 0 && i < r->n ? r->opts[i] : NULL; }
em_device em_replicas_device(const em_replicas *r, int i)
{
    return r && i >= 0 && i < r->n ? r->devs[i] : em_device_cpu();
}
const char *em_replicas_path(const em_replicas *r) { return !r || r->n < 2 ? "none" : r->nccl ? "nccl" : "tasks"; }

/* Same parameter/buffer keys, shapes and dtypes as replica 0? */
static em_status same_architecture(em_module *const *models, int n)
{
    em__dist_tlist ref;
    em_status st = em__dist_module_state(models[0], &ref, "em_replicas_new");
    for (int k = 1; k < n && st == EM_OK; k++) {
        em__dist_tlist l;
        st = em__dist_module_state(models[k], &l, "em_replicas_new");
        if (st != EM_OK) break;
        if (l.n != ref.n)
            st = em__set_error(EM_ERR_INVALID, "em_replicas_new: replica %d has %d parameter/buffer tensors, replica 0 has %d", k,
                               l.n, ref.n);
        for (int i = 0; i < l.n && st == EM_OK; i++) {
            const em_tensor *a = ref.t[i], *b = l.t[i];
            bool same = !strcmp(ref.key[i], l.key[i]) && em_tensor_dtype(a) == em_tensor_dtype(b) &&
                        em_tensor_ndim(a) == em_tensor_ndim(b);
            for (int d = 0; same && d < em_tensor_ndim(a); d++) same = em_tensor_shape(a)[d] == em_tensor_shape(b)[d];
            if (!same) {
                char sa[96], sb[96];
                st = em__set_error(EM_ERR_INVALID, "em_replicas_new: replica %d differs from replica 0 at '%s' (%s %s) vs '%s' (%s %s)",
                                   k, l.key[i], em_dtype_name(em_tensor_dtype(b)), em_shape_str(b->shape, b->ndim, sb, sizeof sb),
                                   ref.key[i], em_dtype_name(em_tensor_dtype(a)), em_shape_str(a->shape, a->ndim, sa, sizeof sa));
            }
        }
        em__dist_tlist_free(&l);
    }
    em__dist_tlist_free(&ref);
    return st;
}

/* opts[k] updates exactly models[k]'s parameters? */
static em_status optimizer_matches(const em_replicas *r, int k)
{
    const em_optim *o = r->opts[k];
    if (em_optim_num_params(o) != r->np)
        return em__set_error(EM_ERR_INVALID, "em_replicas_new: optimizer %d has %d parameters, model %d has %d", k,
                             em_optim_num_params(o), k, r->np);
    for (int i = 0; i < r->np; i++) {
        const em_tensor *p = r->params[(size_t)k * (size_t)r->np + (size_t)i];
        bool found = false;
        for (int j = 0; j < r->np && !found; j++) found = em_optim_param(o, j) == p;
        if (!found)
            return em__set_error(EM_ERR_INVALID, "em_replicas_new: optimizer %d does not update parameter %d of model %d "
                                 "(build each replica's optimizer over its own model)", k, i, k);
    }
    const em_optim_config *c = em_optim_get_config(o), *c0 = em_optim_get_config(r->opts[0]);
    if (k > 0 && c->kind != c0->kind)
        return em__set_error(EM_ERR_INVALID, "em_replicas_new: optimizer %d is %s, optimizer 0 is %s", k, em_optim_kind_name(c->kind),
                             em_optim_kind_name(c0->kind));
    /* every setting but the learning rate (the Learner copies replica 0's each step) */
    if (k > 0 && (c->weight_decay != c0->weight_decay || c->maximize != c0->maximize || c->momentum != c0->momentum ||
                  c->dampening != c0->dampening || c->nesterov != c0->nesterov || c->beta1 != c0->beta1 || c->beta2 != c0->beta2 ||
                  c->eps != c0->eps || c->amsgrad != c0->amsgrad || c->alpha != c0->alpha || c->centered != c0->centered ||
                  c->lr_decay != c0->lr_decay || c->initial_accumulator_value != c0->initial_accumulator_value))
        return em__set_error(EM_ERR_INVALID, "em_replicas_new: optimizer %d has other settings than optimizer 0 (momentum, weight "
                             "decay, betas, eps, ...): the replicas would drift apart", k);
    return EM_OK;
}

typedef struct state_copy {
    em_optim *dst;
    em_status st;
} state_copy;

static void copy_state_cb(const char *key, em_tensor *t, void *ud)
{
    state_copy *c = ud;
    if (c->st == EM_OK) c->st = em_optim_state_set(c->dst, key, t);
}

em_status em_replicas_broadcast(em_replicas *r)
{
    if (!r) return em__set_error(EM_ERR_INVALID, "em_replicas_broadcast: NULL group");
    if (r->n == 1) return EM_OK;
    em__dist_tlist src;
    em_status st = em__dist_module_state(r->models[0], &src, "em_replicas_broadcast");
    dev_guard guard = guard_begin();
    em_scope_begin();
    em_no_grad_begin();
    for (int k = 1; k < r->n && st == EM_OK; k++) {
        em__dist_tlist dst;
        st = em_set_device(r->devs[k]);
        if (st == EM_OK) st = em__dist_module_state(r->models[k], &dst, "em_replicas_broadcast");
        if (st != EM_OK) break;
        for (int i = 0; i < dst.n && i < src.n && st == EM_OK; i++) st = em_copy_(dst.t[i], src.t[i]);
        em__dist_tlist_free(&dst);
        state_copy c = {.dst = r->opts[k], .st = EM_OK};
        if (st == EM_OK) st = em_optim_state_visit(r->opts[0], copy_state_cb, &c);
        if (st == EM_OK) st = c.st;
        for (int i = 0; i < r->np && st == EM_OK; i++) st = em_optim_set_step(r->opts[k], i, em_optim_get_step(r->opts[0], i));
        if (st == EM_OK) st = em_optim_set_lr(r->opts[k], em_optim_get_lr(r->opts[0]));
    }
    em_no_grad_end();
    em_scope_end();
    guard_end(&guard);
    em__dist_tlist_free(&src);
    if (st == EM_OK) st = em_sync();
    return st;
}

/* [nccl] Communicators, streams, token and the group codelet when every
 * replica is on its own CUDA GPU, NCCL loads and a CPU worker exists to run
 * the group tasks; false (logged) otherwise. */
static bool setup_nccl(em_replicas *r)
{
    int devs[EM_REPLICAS_MAX];
    char why[512] = "";
    int node[EM_REPLICAS_MAX];
    r->nodes = calloc(1 + (size_t)r->n * (size_t)(r->np > 0 ? r->np : 1), sizeof *r->nodes);
    if (!r->nodes) return false;
    dev_guard guard = guard_begin();
    bool ok = true;
    for (int k = 0; k < r->n && ok; k++) {
        if (r->devs[k].kind != EM_DEVICE_CUDA || em_set_device(r->devs[k]) != EM_OK) {
            snprintf(why, sizeof why, "not every replica is on a CUDA device");
            ok = false;
            break;
        }
        int w = em__placement().worker;
        devs[k] = w >= 0 ? em__worker_devid(w) : -1;
        node[k] = w >= 0 ? em__worker_memory_node(w) : -1;
        if (w < 0) {
            snprintf(why, sizeof why, "replica %d has no CUDA worker", k);
            ok = false;
        }
    }
    guard_end(&guard);
    em_clear_error();
    if (ok && em_worker_count(EM_DEVICE_CPU) == 0) {
        snprintf(why, sizeof why, "no CPU worker to launch the NCCL groups (EMBER_NCPU=0)");
        ok = false;
    }
    if (ok) ok = em__dist_nccl_local_init(devs, r->n, r->comms, r->streams, why, sizeof why);
    if (!ok) {
        bool all_cuda = true;
        for (int k = 0; k < r->n; k++) all_cuda = all_cuda && r->devs[k].kind == EM_DEVICE_CUDA;
        em_log_msg(all_cuda ? EM_LOG_WARN : EM_LOG_INFO,
                   "replicas: %s: gradients are averaged by ADD/COPY tasks through device 0 instead of NCCL", why);
        return false;
    }
    r->nodes[0] = EM_NODE_CPU; /* the token (no data) */
    for (size_t i = 0; i < (size_t)r->n * (size_t)(r->np > 0 ? r->np : 1); i++) r->nodes[1 + i] = node[i % (size_t)r->n];
    r->token = em__sync_handle_new();
    return true;
}

/* ---- em_replicas_run ------------------------------------------------------- */

typedef struct thread_arg {
    em_replicas *r;
    int i;
} thread_arg;

/* Replica i's random stream in a run: replica 0 continues the global stream
 * (so one replica draws what the model alone would), replica i > 0 uses the
 * global counter under its own key. Deterministic whatever the threads'
 * timing; the run then advances the global counter past what any used. */
static uint64_t replica_seed(uint64_t seed, int i)
{
    if (i == 0) return seed;
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (uint64_t)i; /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void run_one(em_replicas *r, int i)
{
    em__rng_thread_begin(replica_seed(r->rng_seed, i), r->rng_offset);
    em_clear_error(); /* a failure without a message must not show an old one */
    em_status st = em_set_thread_device(r->devs[i]);
    if (st == EM_OK) st = r->fn(r, i, r->ctx);
    r->st[i] = st;
    if (st != EM_OK) snprintf(r->msg[i], sizeof r->msg[i], "%s", em_last_error());
    em_clear_thread_device();
    r->rng_used[i] = em__rng_thread_end();
}

static void *replica_thread(void *p)
{
    thread_arg a = *(thread_arg *)p;
    free(p);
    em_replicas *r = a.r;
    uint64_t seen = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->gen == seen) pthread_cond_wait(&r->go, &r->mu);
        if (r->stop) break;
        seen = r->gen;
        pthread_mutex_unlock(&r->mu);
        run_one(r, a.i);
        pthread_mutex_lock(&r->mu);
        if (--r->pending == 0) pthread_cond_signal(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    em__thread_exit(); /* this thread's scope stack */
    return NULL;
}

static void stop_threads(em_replicas *r)
{
    if (!r->threads) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->nthreads; i++) pthread_join(r->threads[i], NULL);
    free(r->threads);
    r->threads = NULL;
    r->nthreads = 0;
    r->stop = false; /* a later em_replicas_run starts new threads */
}

static em_status run_all(em_replicas *r, em_replica_fn fn, void *ctx);

em_status em_replicas_run(em_replicas *r, em_replica_fn fn, void *ctx)
{
    if (!r || !fn) return em__set_error(EM_ERR_INVALID, "em_replicas_run: NULL argument");
    if (__atomic_exchange_n(&r->running, true, __ATOMIC_ACQ_REL))
        return em__set_error(EM_ERR_STATE, "em_replicas_run: already running for this group (called from a replica function "
                             "or from two threads at once)");
    em_status st = run_all(r, fn, ctx);
    __atomic_store_n(&r->running, false, __ATOMIC_RELEASE);
    return st;
}

static em_status run_all(em_replicas *r, em_replica_fn fn, void *ctx)
{
    if (r->n > 1 && !r->threads) { /* start the threads on first use */
        r->threads = calloc((size_t)r->n - 1, sizeof *r->threads);
        if (!r->threads) return em__set_error(EM_ERR_NOMEM, "em_replicas_run: out of memory");
        for (int i = 1; i < r->n; i++) {
            thread_arg *a = malloc(sizeof *a);
            if (a) *a = (thread_arg){r, i};
            if (!a || pthread_create(&r->threads[i - 1], NULL, replica_thread, a) != 0) {
                free(a);
                stop_threads(r);
                return em__set_error(EM_ERR_RUNTIME, "em_replicas_run: cannot start the thread of replica %d", i);
            }
            r->nthreads++;
        }
    }
    r->fn = fn;
    r->ctx = ctx;
    em_rng_get_state(&r->rng_seed, &r->rng_offset);
    pthread_mutex_lock(&r->mu);
    r->pending = r->n - 1;
    r->gen++;
    pthread_cond_broadcast(&r->go);
    pthread_mutex_unlock(&r->mu);
    /* replica 0 here; this thread's own device setting (if any) comes back after */
    dev_guard guard = guard_begin();
    run_one(r, 0); /* ends with em_clear_thread_device */
    guard_end(&guard);
    pthread_mutex_lock(&r->mu);
    while (r->pending > 0) pthread_cond_wait(&r->done, &r->mu);
    pthread_mutex_unlock(&r->mu);
    uint64_t used = 0;
    for (int i = 0; i < r->n; i++) used = r->rng_used[i] > used ? r->rng_used[i] : used;
    em_rng_set_state(r->rng_seed, r->rng_offset + used);
    for (int i = 0; i < r->n; i++)
        if (r->st[i] != EM_OK) return em__set_error(r->st[i], "replica %d: %s", i, r->msg[i]);
    return EM_OK;
}

void em_replicas_free(em_replicas *r)
{
    if (!r) return;
    stop_threads(r);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->go);
    pthread_cond_destroy(&r->done);
    if (em_is_initialized()) em_sync();
    if (r->nccl) {
        em__dist_nccl_local_destroy(r->comms, r->streams, r->n);
        em__sync_handle_free(&r->token);
    }
    free(r->models);
    free(r->opts);
    free(r->devs);
    free(r->params);
    free(r->comms);
    free(r->streams);
    free(r->nodes);
    free(r->st);
    free(r->msg);
    for (int k = 0; r->fences && k < r->n; k++) em__fence_free(&r->fences[k]);
    free(r->fences);
    free(r);
}

em_replicas *em_replicas_new(em_module *const *models, em_optim *const *opts, const em_device *devices, int n)
{
    if (!models || !opts || !devices || n < 1 || n > EM_REPLICAS_MAX)
        return em__fail(EM_ERR_INVALID, "em_replicas_new: need 1 to %d replicas with models, optimizers and devices (got n=%d)",
                        EM_REPLICAS_MAX, n);
    if (!em_is_initialized()) return em__fail(EM_ERR_STATE, "em_replicas_new: call em_init first");
    if (n > 1 && em_dist_world_size() > 1)
        return em__fail(EM_ERR_STATE, "em_replicas_new: %d replicas per rank under mpirun (%d ranks) is not supported yet: "
                        "run one rank per device instead", n, em_dist_world_size());
    for (int k = 0; k < n; k++) {
        if (!models[k] || !opts[k]) return em__fail(EM_ERR_INVALID, "em_replicas_new: %s %d is NULL", !models[k] ? "model" : "optimizer", k);
        for (int j = 0; j < k; j++)
            if (models[j] == models[k] || opts[j] == opts[k])
                return em__fail(EM_ERR_INVALID, "em_replicas_new: replicas %d and %d share one %s: each replica needs its own copy", j,
                                k, models[j] == models[k] ? "model" : "optimizer");
    }
    dev_guard guard = guard_begin();
    for (int k = 0; k < n; k++) /* every device exists (the error names it) */
        if (em_set_device(devices[k]) != EM_OK) {
            em_status st = em_last_status();
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            guard_end(&guard);
            return em__fail(st, "em_replicas_new: replica %d: %s", k, msg);
        }
    guard_end(&guard);
    if (same_architecture(models, n) != EM_OK) return NULL;
    em_replicas *r = calloc(1, sizeof *r);
    int np = em_module_num_param_tensors(models[0]);
    if (r) {
        r->n = n;
        r->np = np;
        r->models = malloc(sizeof *r->models * (size_t)n);
        r->opts = malloc(sizeof *r->opts * (size_t)n);
        r->devs = malloc(sizeof *r->devs * (size_t)n);
        r->params = calloc((size_t)n * (size_t)(np > 0 ? np : 1), sizeof *r->params);
        r->comms = calloc((size_t)n, sizeof *r->comms);
        r->streams = calloc((size_t)n, sizeof *r->streams);
        r->st = calloc((size_t)n, sizeof *r->st);
        r->msg = calloc((size_t)n, sizeof *r->msg);
        r->fences = calloc((size_t)n, sizeof *r->fences);
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->go, NULL);
        pthread_cond_init(&r->done, NULL);
    }
    if (!r || !r->models || !r->opts || !r->devs || !r->params || !r->comms || !r->streams || !r->st || !r->msg || !r->fences) {
        em_replicas_free(r);
        return em__fail(EM_ERR_NOMEM, "em_replicas_new: out of memory");
    }
    for (int k = 0; k < n; k++) {
        r->models[k] = models[k];
        r->opts[k] = opts[k];
        r->devs[k] = devices[k];
        em_module_parameters(models[k], r->params + (size_t)k * (size_t)np, np);
    }
    for (int k = 0; k < n; k++)
        if (optimizer_matches(r, k) != EM_OK) {
            em_status st = em_last_status();
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_replicas_free(r);
            em__set_error(st, "%s", msg);
            return NULL;
        }
    if (em_replicas_broadcast(r) != EM_OK) {
        em_status st = em_last_status();
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_replicas_free(r);
        em__set_error(st, "em_replicas_new: copying replica 0 into the others: %s", msg);
        return NULL;
    }
    if (n > 1) r->nccl = setup_nccl(r);
    char buf[32];
    em_log_msg(EM_LOG_INFO, "replicas: %d on %s%s, gradients averaged by %s", n, em_device_str(devices[0], buf, sizeof buf),
               n > 1 ? ", ..." : "", em_replicas_path(r));
    return r;
}

/* Gradient of replica k's parameter i (zeros on device k when it got none). */
static em_tensor *grad_or_zeros(em_grads *g, const em_tensor *p)
{
    em_tensor *gr = em_grad(g, p);
    if (gr) return gr;
    gr = em_zeros_like(p);
    if (!gr || em_grads_set(g, p, gr) != EM_OK) return NULL;
    return em_grad(g, p);
}

/* Step fences: once replica k's tensors after[k][0..cnt) (its part of the
 * last reduction, whose gradients backward produces last) exist, replica k's
 * fence is signalled and set on g[k]: em_optim_step then waits for the end
 * of backward (see there). Submitted before the reduction that may write
 * them in place. */
static em_status signal_fences(em_replicas *r, em_grads *const *g, em_tensor *const *const *after, int cnt)
{
    em_status st = EM_OK;
    for (int k = 0; k < r->n && st == EM_OK; k++) {
        st = em__fence_signal(&r->fences[k], after[k], cnt);
        if (st == EM_OK) em__grads_set_fence(g[k], &r->fences[k]);
    }
    return st;
}

/* Tasks path: see the header of this file. */
static em_status reduce_with_tasks(em_replicas *r, em_grads *const *g)
{
    em_status st = EM_OK;
    const int n = r->n, np = r->np;
    const double scale = 1.0 / (double)n;
    int first = 0; /* the last gradient reduced */
    while (first < np && (!em_requires_grad(r->params[first]) || em__dist_listed_later(r->params, first, np))) first++;
    for (int i = np - 1; i >= 0 && st == EM_OK; i--) { /* last layers' gradients are ready first */
        const em_tensor *p0 = r->params[i];
        if (!em_requires_grad(p0) || em__dist_listed_later(r->params, i, np)) continue; /* tied: once */
        em_tensor *gk[EM_REPLICAS_MAX] = {0};
        for (int k = 0; k < n && st == EM_OK; k++) {
            st = em_set_device(r->devs[k]);
            gk[k] = st == EM_OK ? grad_or_zeros(g[k], r->params[(size_t)k * (size_t)np + (size_t)i]) : NULL;
            if (st == EM_OK && !gk[k]) st = em_last_status();
            em_dtype dt = gk[k] ? em_tensor_dtype(gk[k]) : EM_F32;
            if (st == EM_OK && dt != EM_F32 && dt != EM_F64)
                st = em__set_error(EM_ERR_DTYPE, "em_replicas_allreduce_grads: gradient of parameter %d has dtype %s (float32/float64 only)",
                                   i, em_dtype_name(dt));
        }
        if (st != EM_OK) break;
        if (i == first && em__fences_on()) {
            em_tensor *const *after[EM_REPLICAS_MAX];
            for (int k = 0; k < n; k++) after[k] = &gk[k];
            st = signal_fences(r, g, after, 1);
        }
        if (st == EM_OK) st = em_set_device(r->devs[0]);
        em_tensor *sum = st == EM_OK ? gk[0] : NULL;
        for (int k = 1; k < n && sum; k++) sum = em_add(sum, gk[k]);
        em_tensor *mean = sum ? em_mul_scalar(sum, scale) : NULL;
        if (!mean) {
            st = em_last_status();
            break;
        }
        for (int k = 1; k < n && st == EM_OK; k++) {
            st = em_set_device(r->devs[k]);
            em_tensor *c = st == EM_OK ? em_empty(em_tensor_shape(mean), em_tensor_ndim(mean), em_tensor_dtype(mean)) : NULL;
            if (st == EM_OK) st = c ? em_copy_(c, mean) : em_last_status();
            if (st == EM_OK) st = em_grads_set(g[k], r->params[(size_t)k * (size_t)np + (size_t)i], c);
        }
        if (st == EM_OK) st = em_grads_set(g[0], p0, mean);
    }
    return st;
}

/* [nccl] Gradients [lo, hi) of the reverse-order lists as one bucket: replica
 * k's are gs[k * stride + lo .. hi), of parameters ps[k * stride + ...], out
 * of m per replica.
 * Each replica's gradients are made its own (em__dist_own_grads), the last
 * bucket (@p last) signals the step fences, then ONE group task averages
 * them all in place. */
static em_status nccl_bucket(em_replicas *r, em_grads *const *g, const em_tensor **ps, em_tensor **gs, int stride, int m, int lo,
                             int hi, bool last)
{
    const int n = r->n, cnt = hi - lo;
    em_status st = EM_OK;
    for (int k = 0; k < n && st == EM_OK; k++) {
        st = em_set_device(r->devs[k]);
        if (st == EM_OK) st = em__dist_own_grads(g[k], ps + (size_t)k * (size_t)stride, gs + (size_t)k * (size_t)stride, lo, hi, m);
    }
    if (st == EM_OK && last && em__fences_on()) {
        em_tensor *const *after[EM_REPLICAS_MAX];
        for (int k = 0; k < n; k++) after[k] = gs + (size_t)k * (size_t)stride + lo;
        st = signal_fences(r, g, after, cnt);
    }
    if (st != EM_OK) return st;
    /* one NCCL group for all GPUs: the token, then every gradient RW on its own GPU */
    size_t total = (size_t)cnt * (size_t)n, asz = sizeof(group_args) + (sizeof(em__nccl_piece) + sizeof(int64_t)) * total;
    group_args *a = calloc(1, asz);
    em_tensor **v = malloc(sizeof *v * total);
    if (!a || !v) {
        free(a);
        free(v);
        return em__set_error(EM_ERR_NOMEM, "replicas: out of memory");
    }
    a->r = r;
    a->f64 = em_tensor_dtype(gs[lo]) == EM_F64;
    a->m = cnt;
    a->offset = (int64_t *)(void *)&a->pieces[total];
    for (int j = 0; j < cnt; j++)
        for (int k = 0; k < n; k++) {
            em_tensor *t = gs[(size_t)k * (size_t)stride + (size_t)(lo + j)];
            size_t e = (size_t)j * (size_t)n + (size_t)k;
            v[e] = t;
            a->offset[e] = t->offset;
            a->pieces[e].count = em_tensor_numel(t);
        }
    em_placement pl = em__placement_cpu(); /* one thread launches every GPU's part */
    em_op op = {.kind = EM_OP_REPLICAS_ALLREDUCE_MEAN,
                .flags = EM_OPF_NO_RECORD,
                .priority = EM_PRIO_MAX,
                .token = r->token,
                .place = &pl,
                .nodes = r->nodes,
                .n_var = (int)total,
                .var = v,
                .args = a,
                .args_size = asz};
    st = em__submit(&op); /* owns a */
    free(v);
    return st;
}

/* [nccl] Buckets of consecutive (reverse-order) gradients by DDP's rule
 * (em__dist_bucket_end), the same on every replica. */
static em_status reduce_with_nccl(em_replicas *r, em_grads *const *g)
{
    const int n = r->n, np = r->np;
    const em_tensor **ps = malloc(sizeof *ps * (size_t)n * (size_t)np);
    em_tensor **gs = malloc(sizeof *gs * (size_t)n * (size_t)np);
    size_t *nbytes = malloc(sizeof *nbytes * (size_t)np);
    em_dtype *dts = malloc(sizeof *dts * (size_t)np);
    em_status st = ps && gs && nbytes && dts ? EM_OK : em__set_error(EM_ERR_NOMEM, "out of memory");
    int m = 0; /* gradients per replica */
    for (int i = np - 1; i >= 0 && st == EM_OK; i--) {
        if (!em_requires_grad(r->params[i]) || em__dist_listed_later(r->params, i, np)) continue; /* tied: once */
        for (int k = 0; k < n && st == EM_OK; k++) {
            const em_tensor *p = r->params[(size_t)k * (size_t)np + (size_t)i];
            st = em_set_device(r->devs[k]);
            em_tensor *gr = st == EM_OK ? grad_or_zeros(g[k], p) : NULL;
            if (st == EM_OK && !gr) st = em_last_status();
            em_dtype dt = gr ? em_tensor_dtype(gr) : EM_F32;
            if (st == EM_OK && (dt != em_tensor_dtype(r->params[i]) || (dt != EM_F32 && dt != EM_F64)))
                st = em__set_error(EM_ERR_DTYPE, "em_replicas_allreduce_grads: gradient of parameter %d has dtype %s (float32/float64 "
                                   "of the parameter's dtype only)", i, em_dtype_name(dt));
            if (st == EM_OK) {
                ps[(size_t)k * (size_t)np + (size_t)m] = p;
                gs[(size_t)k * (size_t)np + (size_t)m] = gr;
            }
        }
        if (st == EM_OK) {
            dts[m] = em_tensor_dtype(r->params[i]);
            nbytes[m] = (size_t)em_tensor_numel(r->params[i]) * em_dtype_size(dts[m]);
            m++;
        }
    }
    for (int lo = 0; lo < m && st == EM_OK;) {
        int hi = em__dist_bucket_end(nbytes, dts, lo, m);
        st = nccl_bucket(r, g, ps, gs, np, m, lo, hi, hi == m);
        lo = hi;
    }
    free(ps);
    free(gs);
    free(nbytes);
    free(dts);
    return st;
}

em_status em_replicas_allreduce_grads(em_replicas *r, em_grads *const *g)
{
    if (!r || !g) return em__set_error(EM_ERR_INVALID, "em_replicas_allreduce_grads: NULL argument");
    for (int k = 0; k < r->n; k++)
        if (!g[k]) return em__set_error(EM_ERR_INVALID, "em_replicas_allreduce_grads: gradients of replica %d are NULL", k);
    if (r->n == 1 || r->np == 0) return EM_OK;
    dev_guard guard = guard_begin();
    em_status st = EM_OK;
    em_scope_begin();
    em_no_grad_begin();
    if (r->nccl) {
        st = reduce_with_nccl(r, g);
    } else {
        st = reduce_with_tasks(r, g);
    }
    em_no_grad_end();
    em_scope_end();
    guard_end(&guard);
    return st;
}

em_status em_replicas_divergence(const em_replicas *r, double *out)
{
    if (!r || !out) return em__set_error(EM_ERR_INVALID, "em_replicas_divergence: NULL argument");
    *out = 0;
    em__dist_tlist ref;
    em_status st = em__dist_module_state(r->models[0], &ref, "em_replicas_divergence");
    double worst = 0;
    dev_guard guard = guard_begin();
    em_no_grad_begin();
    for (int k = 1; k < r->n && st == EM_OK; k++) {
        em__dist_tlist l;
        st = em__dist_module_state(r->models[k], &l, "em_replicas_divergence");
        if (st == EM_OK) st = em_set_device(r->devs[0]);
        for (int i = 0; i < l.n && i < ref.n && st == EM_OK; i++) {
            int64_t numel = em_tensor_numel(l.t[i]);
            if (numel == 0) continue;
            em_scope_begin();
            em_tensor *d = em_abs(em_sub(em_cast(l.t[i], EM_F64), em_cast(ref.t[i], EM_F64)));
            em_tensor *m = d ? em_max(em_reshape(d, &numel, 1), (const int[]){0}, 1, false) : NULL;
            double v = 0;
            st = m ? em_item(m, &v) : em_last_status();
            em_scope_end();
            if (st == EM_OK && (v > worst || isnan(v))) worst = isnan(v) ? INFINITY : v;
        }
        em__dist_tlist_free(&l);
    }
    em_no_grad_end();
    guard_end(&guard);
    em__dist_tlist_free(&ref);
    if (st == EM_OK) *out = worst;
    return st;
}
