/* Gradient averaging as StarPU tasks (DESIGN.md §7).
 *
 * em_dist_allreduce_grads walks the parameters in reverse order (backward
 * produces the last layer's gradients first) and groups their gradients into
 * buckets of about em_dist_get_bucket_bytes() bytes. A bucket is a flat
 * contiguous tensor, and ONE task per bucket reads the bucket's gradients,
 * packs them into it (W access), calls MPI_Allreduce(MPI_IN_PLACE) on the
 * host buffer and scales by 1/world. The gradients handed back are views of
 * the bucket, so the optimizer reads the reduced values without a copy back.
 * A bucket holding a single gradient that owns its whole storage is reduced
 * in place, without packing.
 *
 * Nothing waits: the tasks are submitted right after backward returns, and
 * StarPU starts each reduction when the tasks producing its gradients finish,
 * while the remaining backward tasks still run; each optimizer update waits
 * only for its own bucket.
 *
 * Step fence: before the last bucket, a task that runs nowhere waits for
 * that bucket's gradients (the last ones backward produces) and writes the
 * step fence; the optimizer's updates read it (em_optim_step), so they run
 * after backward, overlapping the last reduction, instead of delaying the
 * last layers' backward on the GPU.
 *
 * Order: MPI matches collectives on a communicator by call order, and two
 * ready reduction tasks could start in different orders on different ranks.
 * Every reduction task therefore also takes a shared "token" handle in RW
 * mode, which chains them in submission order: the same on every rank.
 *
 * [nccl] When every rank runs on a CUDA device and the build has NCCL, the
 * same task runs on the rank's CUDA worker instead (cuda_allreduce_mean):
 * packing and an in-place ncclAllReduce on the worker's stream, nothing
 * leaves the GPU (dist/nccl.c). The token keeps the NCCL calls in the same
 * order on every rank. */
#include "dist/dist_internal.h"
#include "dist/nccl.h" /* [nccl] */
#include "runtime/internal.h"

#include <starpu.h>
#include <stdlib.h>
#include <string.h>

static size_t g_bucket_bytes = (size_t)25 << 20; /* 25 MiB, as PyTorch DDP's bucket_cap_mb */
static starpu_data_handle_t g_token;
static bool g_token_registered;
static void *g_fence; /* the step fence of em_dist_allreduce_grads */

void em_dist_set_bucket_bytes(size_t nbytes) { g_bucket_bytes = nbytes; }
size_t em_dist_get_bucket_bytes(void) { return g_bucket_bytes; }

/* Kernel arguments: a header and one piece per packed gradient. */
typedef struct ar_piece {
    int32_t buf;        /* index of the gradient's buffer */
    int64_t src_offset; /* elements, in that buffer       */
    int64_t dst_offset; /* elements, in the bucket        */
    int64_t count;
} ar_piece;

typedef struct ar_args {
    void *nccl_comm;  /* [nccl] NULL: the process communicator; else a replica's (replicas.c) */
    int32_t watch;    /* under the collective watchdog */
    int32_t dtype;    /* EM_F32 / EM_F64 */
    int32_t bucket;   /* index of the bucket's buffer (the one reduced) */
    int64_t offset;   /* elements: where the reduced range starts in it */
    int64_t count;    /* elements reduced */
    int32_t npieces;  /* 0: in place (no packing) */
    ar_piece pieces[];
} ar_args;

/* The CPU kernel: packs the gradients into the bucket, sums it in place
 * across ranks, then scales to the mean. */
static void cpu_allreduce_mean(void *buffers[], void *cl_arg)
{
    const ar_args *a = cl_arg;
    size_t es = a->dtype == EM_F64 ? sizeof(double) : sizeof(float);
    char *base = (char *)STARPU_VECTOR_GET_PTR(buffers[a->bucket]) + (size_t)a->offset * es;
    for (int i = 0; i < a->npieces; i++) {
        const ar_piece *p = &a->pieces[i];
        const char *src = (const char *)STARPU_VECTOR_GET_PTR(buffers[p->buf]) + (size_t)p->src_offset * es;
        memcpy(base + (size_t)p->dst_offset * es, src, (size_t)p->count * es);
    }
    MPI_Datatype type = a->dtype == EM_F64 ? MPI_DOUBLE : MPI_FLOAT;
    em__dist_watch_begin(EM_DIST_SLOT_GRAD, "gradient all-reduce");
    for (int64_t off = 0; off < a->count; off += EM_DIST_MPI_CHUNK) {
        int64_t cnt = a->count - off < EM_DIST_MPI_CHUNK ? a->count - off : EM_DIST_MPI_CHUNK;
        /* MPI's default error handler aborts the job on failure. */
        MPI_Allreduce(MPI_IN_PLACE, base + (size_t)off * es, (int)cnt, type, MPI_SUM, em__dist_comm_grad);
    }
    em__dist_watch_end(EM_DIST_SLOT_GRAD);
    if (a->dtype == EM_F64) {
        double *p = (double *)base, s = 1.0 / (double)em__dist_world;
        for (int64_t i = 0; i < a->count; i++) p[i] *= s;
    } else {
        float *p = (float *)base, s = (float)(1.0 / (double)em__dist_world);
        for (int64_t i = 0; i < a->count; i++) p[i] *= s;
    }
}

#if EM_DIST_NCCL
/* [nccl] The CUDA kernel: the same packing and mean, queued on the worker's
 * stream (device-to-device copies, ncclAllReduce with ncclAvg). */
static void cuda_allreduce_mean(void *buffers[], void *cl_arg)
{
    const ar_args *a = cl_arg;
    size_t es = a->dtype == EM_F64 ? sizeof(double) : sizeof(float);
    char *base = (char *)STARPU_VECTOR_GET_PTR(buffers[a->bucket]) + (size_t)a->offset * es;
    for (int i = 0; i < a->npieces; i++) {
        const ar_piece *p = &a->pieces[i];
        const char *src = (const char *)STARPU_VECTOR_GET_PTR(buffers[p->buf]) + (size_t)p->src_offset * es;
        em__dist_nccl_pack(base + (size_t)p->dst_offset * es, src, (size_t)p->count * es);
    }
    em__dist_nccl_allreduce_mean(base, a->count, a->dtype == EM_F64, a->nccl_comm, a->watch != 0);
}
#endif

static struct starpu_codelet g_cl_allreduce = {
#if EM_DIST_NCCL /* [nccl] */
    .where = STARPU_CPU | STARPU_CUDA,
    .cuda_funcs = {cuda_allreduce_mean},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#else
    .where = STARPU_CPU,
#endif
    .cpu_funcs = {cpu_allreduce_mean},
    .cpu_funcs_name = {"ember_dist_allreduce_mean"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS, /* gradients (R), bucket (W or RW), token (RW) */
    .name = "dist_allreduce_mean",
};

em_status em__dist_tasks_init(void)
{
    if (!g_token_registered) {
        starpu_void_data_register(&g_token);
        g_token_registered = true;
    }
    return EM_OK;
}

void em__dist_tasks_shutdown(void)
{
    if (g_token_registered && em_is_initialized()) starpu_data_unregister(g_token);
    g_token_registered = false;
    em__fence_free(&g_fence);
}

/* Submits one reduction task: @p nh handles with modes, the chain token is
 * appended. Takes ownership of @p a (freed by StarPU). */
static em_status submit_task(ar_args *a, size_t args_size, starpu_data_handle_t *h, enum starpu_data_access_mode *m, int nh,
                             const em__ar_target *tg)
{
    a->nccl_comm = tg->nccl_comm;
    a->watch = tg->watch;
    if (!tg->token) {
        free(a);
        return em__set_error(EM_ERR_STATE, "gradient all-reduce: no chain token (runtime restarted?)");
    }
    struct starpu_task *task = starpu_task_create();
    int nb = nh + 1;
    starpu_data_handle_t *dh = NULL;
    enum starpu_data_access_mode *dm = NULL;
    if (task && nb > STARPU_NMAXBUFS) { /* StarPU frees dyn_handles / dyn_modes with the task */
        dh = malloc(sizeof *dh * (size_t)nb);
        dm = malloc(sizeof *dm * (size_t)nb);
    }
    if (!task || (nb > STARPU_NMAXBUFS && (!dh || !dm))) {
        free(a);
        free(dh);
        free(dm);
        if (task) {
            task->destroy = 0;
            starpu_task_destroy(task);
        }
        return em__set_error(EM_ERR_NOMEM, "out of memory creating a task");
    }
    starpu_data_handle_t *H = dh ? dh : task->handles;
    enum starpu_data_access_mode *M = dm ? dm : task->modes;
    for (int i = 0; i < nh; i++) {
        H[i] = h[i];
        M[i] = m[i];
    }
    H[nh] = tg->token;
    M[nh] = STARPU_RW;
    task->dyn_handles = dh;
    task->dyn_modes = dm;
    task->nbuffers = nb;
    task->cl = &g_cl_allreduce;
    task->cl_arg = a;
    task->cl_arg_size = args_size;
    task->cl_arg_free = 1;
    task->priority = STARPU_MAX_PRIO; /* start the exchange as soon as the bucket is ready */
    /* [nccl] NCCL on the target's CUDA worker (for a rank: decided once,
     * alike on every rank, by em__dist_nccl_init), else MPI on a CPU worker. */
    int nccl_worker = tg->worker;
    if (nccl_worker >= 0) {
        task->where = STARPU_CUDA;
        task->execute_on_a_specific_worker = 1;
        task->workerid = (unsigned)nccl_worker;
    } else {
        task->where = STARPU_CPU;
    }
    task->detach = 1;
    em__trace_attach(task);
    int ret = starpu_task_submit(task);
    if (ret != 0) {
        task->destroy = 0;
        starpu_task_destroy(task);
        return em__set_error(EM_ERR_RUNTIME, "gradient all-reduce: task submission failed (%d)", ret);
    }
    __atomic_add_fetch(&em__tasks, 1, __ATOMIC_RELAXED);
    return EM_OK;
}

typedef struct entry {
    const em_tensor *param;
    em_tensor *grad; /* borrowed from g; after packing, a stale pointer */
} entry;

/* May gradient @p k be reduced where it lies? Only when nothing else can see
 * its storage: a contiguous tensor alone on it (one storage reference), and
 * the same tensor is not also the gradient of a parameter not packed yet
 * (entries before k were already replaced: their pointers may be stale, and
 * their old storages were counted by the refcount). */
static bool can_reduce_in_place(const entry *all, int k, int n)
{
    const em_tensor *t = all[k].grad;
    if (!em__covers_storage(t) || __atomic_load_n(&t->storage->refcount, __ATOMIC_RELAXED) != 1) return false;
    for (int i = k + 1; i < n; i++)
        if (all[i].grad == t) return false;
    return true;
}

/* Reduces entries [lo, hi) (same dtype) as one bucket: ONE task packs them
 * into a fresh flat tensor (W access: no fill needed), reduces and scales it;
 * the container then holds views of the bucket. */
static em_status flush_bucket(em_grads *g, const entry *all, int n, int lo, int hi, const em__ar_target *tg)
{
    if (hi <= lo) return EM_OK;
    em_dtype dt = em_tensor_dtype(all[lo].grad);
    if (hi - lo == 1 && can_reduce_in_place(all, lo, n)) {
        const em_tensor *t = all[lo].grad;
        ar_args *a = malloc(sizeof *a);
        if (!a) return em__set_error(EM_ERR_NOMEM, "out of memory");
        *a = (ar_args){.dtype = dt, .bucket = 0, .offset = t->offset, .count = em_tensor_numel(t), .npieces = 0};
        em_log_msg(EM_LOG_DEBUG, "dist: bucket of 1 gradient (%lld elements), reduced in place", (long long)a->count);
        starpu_data_handle_t h = t->storage->handle;
        enum starpu_data_access_mode m = STARPU_RW;
        return submit_task(a, sizeof *a, &h, &m, 1, tg);
    }
    int k = hi - lo;
    size_t asz = sizeof(ar_args) + sizeof(ar_piece) * (size_t)k;
    ar_args *a = malloc(asz);
    starpu_data_handle_t *h = malloc(sizeof *h * (size_t)(k + 1));
    enum starpu_data_access_mode *m = malloc(sizeof *m * (size_t)(k + 1));
    em_tensor **src = calloc((size_t)k, sizeof *src); /* contiguous sources, retained until submitted */
    em_tensor *flat = NULL;
    em_status st = a && h && m && src ? EM_OK : em__set_error(EM_ERR_NOMEM, "out of memory");
    int nh = 0;
    int64_t total = 0;
    for (int i = 0; i < k && st == EM_OK; i++) {
        const em_tensor *gr = all[lo + i].grad;
        src[i] = em_tensor_retain(em_contiguous(gr)); /* gr itself when contiguous; the scope keeps its own reference */
        if (!src[i]) {
            st = em_last_status();
            break;
        }
        int b = 0; /* one buffer per distinct storage */
        while (b < nh && h[b] != src[i]->storage->handle) b++;
        if (b == nh) {
            h[nh] = src[i]->storage->handle;
            m[nh++] = STARPU_R;
        }
        int64_t cnt = em_tensor_numel(src[i]);
        a->pieces[i] = (ar_piece){.buf = b, .src_offset = src[i]->offset, .dst_offset = total, .count = cnt};
        total += cnt;
    }
    if (st == EM_OK) {
        flat = em__tensor_new(dt, (const int64_t[]){total}, 1);
        if (!flat) st = em_last_status();
    }
    if (st == EM_OK) {
        a->dtype = dt;
        a->bucket = nh;
        a->offset = 0;
        a->count = total;
        a->npieces = k;
        h[nh] = flat->storage->handle;
        m[nh] = STARPU_W;
        em_log_msg(EM_LOG_DEBUG, "dist: bucket of %d gradients (%lld elements), packed", k, (long long)total);
        st = submit_task(a, asz, h, m, nh + 1, tg);
        a = NULL; /* owned by the task now */
    }
    /* The container now holds views of the reduced bucket (it drops the old
     * gradients; the task keeps their data alive until it has read them). */
    int64_t off = 0;
    for (int i = 0; i < k && st == EM_OK; i++) {
        const em_tensor *gr = src[i];
        int64_t strides[EM_MAX_DIMS];
        em__contiguous_strides(gr->shape, gr->ndim, strides);
        em_tensor *v = em__tensor_view(flat, gr->shape, strides, gr->ndim, off);
        st = v ? em_grads_set(g, all[lo + i].param, v) : em_last_status();
        em_tensor_release(v);
        off += em_tensor_numel(gr);
    }
    for (int i = 0; src && i < k; i++) em_tensor_release(src[i]);
    em_tensor_release(flat);
    free(src);
    free(a);
    free(h);
    free(m);
    return st;
}

/* The last bucket's gradients are the last ones backward produces: the fence
 * signalled once they exist tells the optimizer that backward is over
 * (see em_optim_step). Submitted before the bucket's reduction, which may
 * write a gradient in place. */
static em_status signal_fence(em_grads *g, const entry *last, int k, void **fence)
{
    em_tensor **t = malloc(sizeof *t * (size_t)k);
    if (!t) return em__set_error(EM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < k; i++) t[i] = last[i].grad;
    em_status st = em__fence_signal(fence, t, k);
    free(t);
    if (st == EM_OK) em__grads_set_fence(g, fence);
    return st;
}

em_status em_dist_allreduce_grads(em_grads *g, em_tensor *const *params, int n)
{
    if (!g || (n > 0 && !params) || n < 0) return em__set_error(EM_ERR_INVALID, "em_dist_allreduce_grads: bad arguments");
    if (em_dist_world_size() <= 1 || n == 0) return EM_OK;
    if (!g_token_registered)
        return em__set_error(EM_ERR_STATE, "em_dist_allreduce_grads: the runtime was restarted outside em_dist_init");
    em__ar_target tg = {.worker = em__dist_nccl_worker(), .token = g_token, .nccl_comm = NULL, .watch = true, .fence = &g_fence};
    return em__dist_reduce_grads(g, params, n, &tg);
}

em_status em__dist_reduce_grads(em_grads *g, em_tensor *const *params, int n, const em__ar_target *tg)
{
    entry *e = malloc(sizeof *e * (size_t)n);
    if (!e) return em__set_error(EM_ERR_NOMEM, "out of memory");
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
        if (!em_requires_grad(p)) continue;
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
        if (dt != EM_F32 && dt != EM_F64) {
            st = em__set_error(EM_ERR_DTYPE, "em_dist_allreduce_grads: gradient of parameter %d has dtype %s (float32/float64 only)",
                               i, em_dtype_name(dt));
            break;
        }
        e[ne++] = (entry){.param = p, .grad = gr};
    }
    /* Buckets: consecutive entries of one dtype up to the bucket size (a
     * gradient larger than the bucket gets its own). */
    int lo = 0;
    size_t bytes = 0;
    for (int i = 0; i < ne && st == EM_OK; i++) {
        em_dtype dt = em_tensor_dtype(e[i].grad);
        size_t nb = (size_t)em_tensor_numel(e[i].grad) * em_dtype_size(dt);
        if (i > lo && (em_tensor_dtype(e[lo].grad) != dt || bytes + nb > g_bucket_bytes)) {
            st = flush_bucket(g, e, ne, lo, i, tg);
            lo = i;
            bytes = 0;
        }
        bytes += nb;
    }
    if (st == EM_OK && tg->fence && ne > lo && em__fences_on()) st = signal_fence(g, e + lo, ne - lo, tg->fence);
    if (st == EM_OK) st = flush_bucket(g, e, ne, lo, ne, tg);
    em_no_grad_end();
    em_scope_end();
    free(e);
    return st;
}
