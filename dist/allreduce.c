/* Gradient averaging as ops of the table (DESIGN.md §7): ALLREDUCE_MEAN,
 * an F_COLLECTIVE kind, submitted through the one door (tasks/funnel.c).
 *
 * em_dist_allreduce_grads walks the parameters in reverse order (backward
 * produces the last layer's gradients first) and groups their gradients into
 * buckets by PyTorch DDP's rule (em__dist_bucket_end). ONE op (one task) per bucket
 * averages every gradient of the bucket in place (RW access): on a CPU
 * worker one MPI_Allreduce(MPI_IN_PLACE) per gradient on its host buffer and
 * a scaling by 1/world. Nothing is packed: a gradient that is not contiguous
 * and alone on its storage is first replaced, in the container, by a
 * contiguous private copy (a COPY task), so the reduction never writes
 * storage that something else sees.
 *
 * Nothing waits: the tasks are submitted right after backward returns, and
 * StarPU starts each reduction when the tasks producing its gradients finish,
 * while the remaining backward tasks still run; each optimizer update waits
 * only for its own bucket.
 *
 * Step fence: before the last bucket, a FENCE op (runs nowhere) waits for
 * that bucket's gradients (the last ones backward produces) and writes the
 * step fence; the optimizer's updates read it (em_optim_step), so they run
 * after backward, overlapping the last reduction, instead of delaying the
 * last layers' backward on the GPU.
 *
 * Order: MPI matches collectives on a communicator by call order, and two
 * ready reduction tasks could start in different orders on different ranks.
 * Every reduction op therefore also has a shared token (em_op.token, taken
 * RW), which chains them in submission order: the same on every rank.
 *
 * [nccl] When every rank runs on a CUDA device and the build has NCCL, the
 * same task runs on the rank's CUDA worker instead (cuda_allreduce_mean):
 * the bucket's in-place ncclAllReduce calls in one NCCL group, nothing
 * leaves the GPU (dist/nccl.c). The token keeps the NCCL calls in the same
 * order on every rank. */
#include "dist/dist_internal.h"
#include "dist/nccl.h" /* [nccl] */
#include "autodiff/autodiff.h"

#include <stdlib.h>
#include <string.h>

static size_t g_bucket_bytes = (size_t)25 << 20; /* 25 MiB, as PyTorch DDP's bucket_cap_mb */
static void *g_token; /* em__sync_handle_new */
static void *g_fence; /* the step fence of em_dist_allreduce_grads */

void em_dist_set_bucket_bytes(size_t nbytes) { g_bucket_bytes = nbytes; }
size_t em_dist_get_bucket_bytes(void) { return g_bucket_bytes; }

/* Kernel arguments of an ALLREDUCE_MEAN op: buffer 0 is the chain token,
 * gradient i of the bucket is buffer 1 + i, reduced in place. */
typedef struct ar_args {
    void *nccl_comm;  /* [nccl] NULL: the process communicator; else a replica's (replicas.c) */
    int32_t watch;    /* under the collective watchdog */
    int32_t dtype;    /* EM_F32 / EM_F64 */
    int32_t npieces;
    int64_t *offset;  /* [npieces] elements, where gradient i starts in its buffer (inside this allocation) */
    em__nccl_piece pieces[]; /* [npieces] element counts; [nccl] the CUDA kernel fills in the pointers */
} ar_args;

/* One allocation holding the header, pieces[n] and offset[n]. */
static ar_args *ar_args_new(int n, size_t *size)
{
    *size = sizeof(ar_args) + (sizeof(em__nccl_piece) + sizeof(int64_t)) * (size_t)n;
    ar_args *a = calloc(1, *size);
    if (a) {
        a->npieces = n;
        a->offset = (int64_t *)(void *)&a->pieces[n];
    }
    return a;
}

/* The CPU kernel of ALLREDUCE_MEAN (tasks/ops.def): sums each gradient in
 * place across ranks, then scales it to the mean. */
void em_dist_cpu_allreduce_mean(void *buffers[], void *cl_arg)
{
    const ar_args *a = cl_arg;
    size_t es = a->dtype == EM_F64 ? sizeof(double) : sizeof(float);
    MPI_Datatype type = a->dtype == EM_F64 ? MPI_DOUBLE : MPI_FLOAT;
    em__dist_watch_begin(EM_DIST_SLOT_GRAD, "gradient all-reduce");
    for (int i = 0; i < a->npieces; i++) {
        char *base = (char *)em__buffer_ptr(buffers, 1 + i) + (size_t)a->offset[i] * es;
        int64_t count = a->pieces[i].count;
        for (int64_t off = 0; off < count; off += EM_DIST_MPI_CHUNK) {
            int64_t cnt = count - off < EM_DIST_MPI_CHUNK ? count - off : EM_DIST_MPI_CHUNK;
            /* MPI's default error handler aborts the job on failure. */
            MPI_Allreduce(MPI_IN_PLACE, base + (size_t)off * es, (int)cnt, type, MPI_SUM, em__dist_comm_grad);
        }
    }
    em__dist_watch_end(EM_DIST_SLOT_GRAD);
    for (int i = 0; i < a->npieces; i++) {
        char *base = (char *)em__buffer_ptr(buffers, 1 + i) + (size_t)a->offset[i] * es;
        int64_t count = a->pieces[i].count;
        if (a->dtype == EM_F64) {
            double *p = (double *)base, s = 1.0 / (double)em__dist_world;
            for (int64_t k = 0; k < count; k++) p[k] *= s;
        } else {
            float *p = (float *)base, s = (float)(1.0 / (double)em__dist_world);
            for (int64_t k = 0; k < count; k++) p[k] *= s;
        }
    }
}

#if EM_DIST_NCCL
/* [nccl] The CUDA kernel of ALLREDUCE_MEAN: the bucket's in-place ncclAvg
 * calls, in one NCCL group queued after the worker's stream (dist/nccl.c). */
static void cuda_allreduce_mean(void *buffers[], void *cl_arg)
{
    ar_args *a = cl_arg;
    size_t es = a->dtype == EM_F64 ? sizeof(double) : sizeof(float);
    for (int i = 0; i < a->npieces; i++) a->pieces[i].ptr = (char *)em__buffer_ptr(buffers, 1 + i) + (size_t)a->offset[i] * es;
    em__dist_nccl_allreduce_mean(a->pieces, a->npieces, a->dtype == EM_F64, a->nccl_comm, a->watch != 0);
}

/* The door's codelet takes this as the CUDA implementation (tasks/funnel.c). */
em_kernel_fn em__dist_cuda_kernels[EM_OP_COUNT] = {[EM_OP_ALLREDUCE_MEAN] = cuda_allreduce_mean};
#endif

/* The door's codelets take these as the collectives' CPU kernels (tasks/funnel.c). */
void em_dist_cpu_replicas_allreduce_mean(void *buffers[], void *cl_arg); /* dist/replicas.c */
em_kernel_fn em__dist_cpu_kernels[EM_OP_COUNT] = {
    [EM_OP_ALLREDUCE_MEAN] = em_dist_cpu_allreduce_mean,
    [EM_OP_REPLICAS_ALLREDUCE_MEAN] = em_dist_cpu_replicas_allreduce_mean,
};

em_status em__dist_tasks_init(void)
{
    if (!g_token) g_token = em__sync_handle_new();
    return EM_OK;
}

void em__dist_tasks_shutdown(void)
{
    em__sync_handle_free(&g_token);
    em__fence_free(&g_fence);
}

/* Submits one ALLREDUCE_MEAN op over @p grads[0..k) (their kernel arguments
 * in @p a) through the door. Takes ownership of @p a. */
static em_status submit_reduction(ar_args *a, size_t args_size, em_tensor *const *grads, int k, const em__ar_target *tg)
{
    a->nccl_comm = tg->nccl_comm;
    a->watch = tg->watch;
    if (!tg->token) {
        free(a);
        return em__set_error(EM_ERR_STATE, "gradient all-reduce: no chain token (runtime restarted?)");
    }
    /* [nccl] NCCL on the target's CUDA worker (for a rank: decided once,
     * alike on every rank, by em__dist_nccl_init), else MPI on a CPU worker. */
    em_placement pl = tg->worker >= 0 ? em__placement_worker(tg->worker) : em__placement_cpu();
    em_op op = {.kind = EM_OP_ALLREDUCE_MEAN,
                .flags = EM_OPF_NO_RECORD,
                .priority = EM_PRIO_MAX, /* start the exchange as soon as the bucket is ready */
                .token = tg->token,
                .place = &pl,
                .n_var = k,
                .var = grads,
                .args = a,
                .args_size = args_size};
    return em__submit(&op); /* owns a */
}

int em__dist_bucket_end(const size_t *nbytes, const em_dtype *dtypes, int lo, int n)
{
    size_t cap = g_bucket_bytes;
    if (lo == 0 && cap > EM_DIST_FIRST_BUCKET_BYTES) cap = EM_DIST_FIRST_BUCKET_BYTES;
    size_t sum = 0;
    int i = lo;
    while (i < n && (i == lo || dtypes[i] == dtypes[lo])) {
        sum += nbytes[i++];
        if (sum >= cap) break;
    }
    return i;
}

bool em__dist_listed_later(em_tensor *const *params, int i, int n)
{
    for (int j = i + 1; j < n; j++)
        if (params[j] == params[i]) return true;
    return false;
}

em_status em__dist_own_grads(em_grads *g, const em_tensor *const *params, em_tensor **grads, int lo, int hi, int n)
{
    for (int k = lo; k < hi; k++) {
        em_tensor *t = grads[k];
        /* the container's reference only: no caller, scope or other gradient sees it */
        bool own = em__covers_storage(t) && __atomic_load_n(&t->storage->refcount, __ATOMIC_RELAXED) == 1 &&
                   __atomic_load_n(&t->refcount, __ATOMIC_RELAXED) == 1;
        for (int i = k + 1; i < n && own; i++) own = grads[i] != t;
        if (own) continue;
        em_tensor *c = em_empty(em_tensor_shape(t), em_tensor_ndim(t), em_tensor_dtype(t));
        em_status st = c ? em_copy_(c, t) : em_last_status();
        if (st == EM_OK) st = em_grads_set(g, params[k], c);
        if (st != EM_OK) return st;
        grads[k] = em_grad(g, params[k]);
        em_log_msg(EM_LOG_DEBUG, "dist: gradient %d copied before its in-place reduction (not contiguous, or shares its storage)", k);
    }
    return EM_OK;
}

/* Reduces gradients [lo, hi) (one dtype, own storages: em__dist_own_grads)
 * as one bucket: ONE task averages them all in place. */
static em_status flush_bucket(em_tensor *const *grads, int lo, int hi, const em__ar_target *tg)
{
    int k = hi - lo;
    size_t asz;
    ar_args *a = ar_args_new(k, &asz);
    if (!a) return em__set_error(EM_ERR_NOMEM, "out of memory");
    a->dtype = em_tensor_dtype(grads[lo]);
    int64_t total = 0;
    for (int i = 0; i < k; i++) {
        const em_tensor *t = grads[lo + i];
        a->offset[i] = t->offset;
        a->pieces[i].count = em_tensor_numel(t);
        total += a->pieces[i].count;
    }
    em_log_msg(EM_LOG_DEBUG, "dist: bucket of %d gradient(s), %lld elements, reduced in place", k, (long long)total);
    return submit_reduction(a, asz, grads + lo, k, tg); /* owns a */
}

em_status em_dist_allreduce_grads(em_grads *g, em_tensor *const *params, int n)
{
    if (!g || (n > 0 && !params) || n < 0) return em__set_error(EM_ERR_INVALID, "em_dist_allreduce_grads: bad arguments");
    if (em_dist_world_size() <= 1 || n == 0) return EM_OK;
    if (!g_token)
        return em__set_error(EM_ERR_STATE, "em_dist_allreduce_grads: the runtime was restarted outside em_dist_init");
    em__ar_target tg = {.worker = em__dist_nccl_worker(), .token = g_token, .nccl_comm = NULL, .watch = true, .fence = &g_fence};
    return em__dist_reduce_grads(g, params, n, &tg);
}

em_status em__dist_reduce_grads(em_grads *g, em_tensor *const *params, int n, const em__ar_target *tg)
{
    const em_tensor **ps = malloc(sizeof *ps * (size_t)n);
    em_tensor **gs = malloc(sizeof *gs * (size_t)n);
    size_t *nbytes = malloc(sizeof *nbytes * (size_t)n);
    em_dtype *dts = malloc(sizeof *dts * (size_t)n);
    if (!ps || !gs || !nbytes || !dts) {
        free(ps);
        free(gs);
        free(nbytes);
        free(dts);
        return em__set_error(EM_ERR_NOMEM, "out of memory");
    }
    em_status st = EM_OK;
    int ne = 0;
    em_scope_begin();
    em_no_grad_begin();
    /* Reverse order: the last layers' gradients are produced first. */
    for (int i = n - 1; i >= 0 && st == EM_OK; i--) {
        em_tensor *p = params[i];
        if (!p) {
            st = em__set_error(EM_ERR_INVALID, "em_dist_allreduce_grads: parameter %d is NULL", i);
            break;
        }
        if (!em_requires_grad(p) || em__dist_listed_later(params, i, n)) continue; /* a tied parameter is reduced once */
        em_tensor *gr = em_grad(g, p);
        if (!gr) {
            /* Unused on this rank: contribute zeros so every rank reduces the same list. */
            gr = em_zeros_like(p);
            if (!gr || em_grads_set(g, p, gr) != EM_OK) {
                st = em_last_status();
                break;
            }
            gr = em_grad(g, p);
        }
        em_dtype dt = em_tensor_dtype(gr);
        if (dt != em_tensor_dtype(p) || (dt != EM_F32 && dt != EM_F64)) {
            st = em__set_error(EM_ERR_DTYPE,
                               "em_dist_allreduce_grads: gradient of parameter %d has dtype %s (float32/float64 of the "
                               "parameter's dtype %s only)", i, em_dtype_name(dt), em_dtype_name(em_tensor_dtype(p)));
            break;
        }
        if (em_tensor_numel(gr) != em_tensor_numel(p)) {
            st = em__set_error(EM_ERR_SHAPE, "em_dist_allreduce_grads: gradient of parameter %d has %lld elements, the parameter %lld",
                               i, (long long)em_tensor_numel(gr), (long long)em_tensor_numel(p));
            break;
        }
        ps[ne] = p;
        gs[ne] = gr;
        nbytes[ne] = (size_t)em_tensor_numel(gr) * em_dtype_size(dt);
        dts[ne++] = dt;
    }
    for (int lo = 0; lo < ne && st == EM_OK;) {
        int hi = em__dist_bucket_end(nbytes, dts, lo, ne);
        st = em__dist_own_grads(g, ps, gs, lo, hi, ne);
        /* The last bucket's gradients are the last ones backward produces:
         * the fence signalled once they exist tells the optimizer that
         * backward is over (see em_optim_step). Submitted before the
         * reduction, which writes them in place. */
        if (st == EM_OK && hi == ne && tg->fence && em__fences_on()) {
            st = em__fence_signal(tg->fence, gs + lo, hi - lo);
            if (st == EM_OK) em__grads_set_fence(g, tg->fence);
        }
        if (st == EM_OK) st = flush_bucket(gs, lo, hi, tg);
        lo = hi;
    }
    em_no_grad_end();
    em_scope_end();
    free(ps);
    free(gs);
    free(nbytes);
    free(dts);
    return st;
}
