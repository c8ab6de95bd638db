/* Data-parallel replicas inside one process, one per device (DESIGN.md §7;
 * the API and the two reduction paths are described in include/ember/dist.h).
 *
 * NCCL path: one communicator per GPU (ncclCommInitAll), one chain token per
 * replica, and em__dist_reduce_grads (allreduce.c) run once per replica with
 * that replica's target: the same buckets, packing and in-place ncclAvg as
 * the cross-rank path, on the GPU's collective worker. Each GPU issues its
 * collectives in the same (submission) order, so they match.
 *
 * Tasks path: per gradient, ADD tasks on device 0 sum the replicas'
 * gradients (StarPU moves each to device 0), one MUL task scales by 1/n, and
 * one COPY task per other replica brings the mean back to its device. Every
 * replica then holds a copy of the same tensor: bit-identical updates. */
#include "dist/dist_internal.h"
#include "dist/nccl.h" /* [nccl] */
#include "runtime/internal.h"

#include <math.h>
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
    void **comms;                 /* [nccl] [n] */
    starpu_data_handle_t *tokens; /* [nccl] [n] chain tokens */
    int *workers;                 /* [nccl] [n] collective worker of each GPU */
};

int em_replicas_count(const em_replicas *r) { return r ? r->n : 0; }
em_module *em_replicas_model(const em_replicas *r, int i) { return r && i >= 0 && i < r->n ? r->models[i] : NULL; }
em_optim *em_replicas_optim(const em_replicas *r, int i) { return r && i >= 0 && i < r->n ? r->opts[i] : NULL; }
em_device em_replicas_device(const em_replicas *r, int i)
{
    return r && i >= 0 && i < r->n ? r->devs[i] : em_device_cpu();
}
const char *em_replicas_path(const em_replicas *r) { return r && r->nccl ? "nccl" : "tasks"; }

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
    if (k > 0 && em_optim_get_config(o)->kind != em_optim_get_config(r->opts[0])->kind)
        return em__set_error(EM_ERR_INVALID, "em_replicas_new: optimizer %d is %s, optimizer 0 is %s", k,
                             em_optim_kind_name(em_optim_get_config(o)->kind),
                             em_optim_kind_name(em_optim_get_config(r->opts[0])->kind));
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
    em_device saved = em_get_device();
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
    em_set_device(saved);
    em__dist_tlist_free(&src);
    if (st == EM_OK) st = em_sync();
    return st;
}

/* [nccl] Communicators, tokens and collective workers when every replica is
 * on its own CUDA GPU and NCCL loads; false (logged) otherwise. */
static bool setup_nccl(em_replicas *r)
{
    int devs[EM_REPLICAS_MAX];
    char why[512] = "";
    em_device saved = em_get_device();
    bool ok = true;
    for (int k = 0; k < r->n && ok; k++) {
        if (r->devs[k].kind != EM_DEVICE_CUDA || em_set_device(r->devs[k]) != EM_OK) {
            snprintf(why, sizeof why, "not every replica is on a CUDA device");
            ok = false;
            break;
        }
        int w = em__placement().worker;
        r->workers[k] = em__dist_collective_worker(w);
        devs[k] = w >= 0 ? starpu_worker_get_devid(w) : -1;
        if (r->workers[k] < 0) {
            snprintf(why, sizeof why, "replica %d has no CUDA worker", k);
            ok = false;
        }
    }
    em_set_device(saved);
    em_clear_error();
    if (ok) ok = em__dist_nccl_local_init(devs, r->n, r->comms, why, sizeof why);
    if (!ok) {
        bool all_cuda = true;
        for (int k = 0; k < r->n; k++) all_cuda = all_cuda && r->devs[k].kind == EM_DEVICE_CUDA;
        em_log_msg(all_cuda ? EM_LOG_WARN : EM_LOG_INFO,
                   "replicas: %s: gradients are averaged by ADD/COPY tasks through device 0 instead of NCCL", why);
        return false;
    }
    for (int k = 0; k < r->n; k++) starpu_void_data_register(&r->tokens[k]);
    return true;
}

void em_replicas_free(em_replicas *r)
{
    if (!r) return;
    if (em_is_initialized()) em_sync();
    if (r->nccl) {
        em__dist_nccl_local_destroy(r->comms, r->n);
        if (em_is_initialized())
            for (int k = 0; k < r->n; k++) starpu_data_unregister(r->tokens[k]);
    }
    free(r->models);
    free(r->opts);
    free(r->devs);
    free(r->params);
    free(r->comms);
    free(r->tokens);
    free(r->workers);
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
    for (int k = 0; k < n; k++)
        if (!models[k] || !opts[k]) return em__fail(EM_ERR_INVALID, "em_replicas_new: %s %d is NULL", !models[k] ? "model" : "optimizer", k);
    em_device saved = em_get_device();
    for (int k = 0; k < n; k++) /* every device exists (the error names it) */
        if (em_set_device(devices[k]) != EM_OK) {
            em_status st = em_last_status();
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_set_device(saved);
            return em__fail(st, "em_replicas_new: replica %d: %s", k, msg);
        }
    em_set_device(saved);
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
        r->tokens = calloc((size_t)n, sizeof *r->tokens);
        r->workers = calloc((size_t)n, sizeof *r->workers);
    }
    if (!r || !r->models || !r->opts || !r->devs || !r->params || !r->comms || !r->tokens || !r->workers) {
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

/* Tasks path: see the header of this file. */
static em_status reduce_with_tasks(em_replicas *r, em_grads *const *g)
{
    em_status st = EM_OK;
    const int n = r->n, np = r->np;
    const double scale = 1.0 / (double)n;
    for (int i = np - 1; i >= 0 && st == EM_OK; i--) { /* last layers' gradients are ready first */
        const em_tensor *p0 = r->params[i];
        if (!em_requires_grad(p0)) continue;
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
        st = em_set_device(r->devs[0]);
        em_tensor *sum = gk[0];
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

em_status em_replicas_allreduce_grads(em_replicas *r, em_grads *const *g)
{
    if (!r || !g) return em__set_error(EM_ERR_INVALID, "em_replicas_allreduce_grads: NULL argument");
    for (int k = 0; k < r->n; k++)
        if (!g[k]) return em__set_error(EM_ERR_INVALID, "em_replicas_allreduce_grads: gradients of replica %d are NULL", k);
    if (r->n == 1 || r->np == 0) return EM_OK;
    em_device saved = em_get_device();
    em_status st = EM_OK;
    em_scope_begin();
    em_no_grad_begin();
    if (r->nccl) {
        for (int k = 0; k < r->n && st == EM_OK; k++) {
            em__ar_target tg = {.worker = r->workers[k], .token = r->tokens[k], .nccl_comm = r->comms[k], .watch = false};
            st = em_set_device(r->devs[k]); /* packing copies and zeros go to replica k's device */
            if (st == EM_OK) st = em__dist_reduce_grads(g[k], r->params + (size_t)k * (size_t)r->np, r->np, &tg);
        }
        /* A replica failing after another submitted its collectives would
         * leave those waiting forever on the GPU: nothing sensible remains. */
        if (st != EM_OK && em_last_status() != EM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "gradient all-reduce between replicas failed half-way: %s", em_last_error());
            em_dist_abort(5, msg);
        }
    } else {
        st = reduce_with_tasks(r, g);
    }
    em_no_grad_end();
    em_scope_end();
    em_set_device(saved);
    return st;
}

em_status em_replicas_divergence(const em_replicas *r, double *out)
{
    if (!r || !out) return em__set_error(EM_ERR_INVALID, "em_replicas_divergence: NULL argument");
    *out = 0;
    em__dist_tlist ref;
    em_status st = em__dist_module_state(r->models[0], &ref, "em_replicas_divergence");
    double worst = 0;
    em_device saved = em_get_device();
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
    em_set_device(saved);
    em__dist_tlist_free(&ref);
    if (st == EM_OK) *out = worst;
    return st;
}
