/* The one submission door and the op table.
 *
 * Every task Ember submits is an em_op handed to em__submit(): op front ends
 * (they validate, allocate the outputs, build the op), their internal copies
 * and fills (EM_OPF_NO_RECORD), matmul tiles (the table's custom submit,
 * whose sub-tasks come back with EM_OPF_RAW), optimizer steps, step fences
 * (FENCE) and the gradient all-reduces of dist/ (F_COLLECTIVE kinds). The
 * scheduling facts travel with the op: priority, the fence it waits for
 * (after), the token it chains on, its placement and buffer nodes. The door
 * turns the op into StarPU task(s) through codelets generated from the op
 * table (tasks/ops.def) and lets autodiff record it. This file is the only
 * one that creates or submits StarPU tasks. */
#include "tasks/tasks_internal.h"

#include <pthread.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(EM_NODE_CPU == STARPU_SPECIFIC_NODE_CPU, "EM_NODE_CPU must be StarPU's STARPU_SPECIFIC_NODE_CPU");

/* CPU kernels (devices/cpu), one per kernel family of tasks/ops.def. */
#define em_cpu_NONE NULL       /* views and fences: no kernel */
#define em_cpu_collective NULL /* collectives: em__dist_cpu_kernels */

em_status em__matmul_submit(em_op *op); /* tasks/matmul.c: tiling */
em_status em__conv_submit(em_op *op);   /* tasks/conv.c: tiling over CPU workers */
em_status em__sdpa_submit(em_op *op);   /* tasks/attention.c: tiling over CPU workers */

em_optab_entry em__optab[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) \
    [EM_OP_##E] = {.name = #nm, .family = (fl) & F_VIEW ? NULL : #fam, .n_in = nin, .n_out = nout, .flags = fl, .cpu = em_cpu_##fam},
#include "tasks/ops.def"
};

em_status (*em__autodiff_record)(const em_op *op);
em_status (*em__fusion_offer)(em_op *op, bool *taken);
em_status (*em__autodiff_check)(void);

/* Weak defaults: a build without a device backend has no kernels for it. */
__attribute__((weak)) em_kernel_fn em__cuda_kernels[EM_OP_COUNT];
__attribute__((weak)) em_kernel_fn em__opencl_kernels[EM_OP_COUNT];
__attribute__((weak)) const bool em__cuda_half[EM_OP_COUNT];
__attribute__((weak)) const bool em__opencl_half[EM_OP_COUNT];
__attribute__((weak)) void em__opencl_describe(FILE *f) { (void)f; }
__attribute__((weak)) em_kernel_fn em__dist_cpu_kernels[EM_OP_COUNT];
__attribute__((weak)) em_kernel_fn em__dist_cuda_kernels[EM_OP_COUNT];
__attribute__((weak)) bool em__cuda_compiled(void) { return false; }
__attribute__((weak)) bool em__opencl_compiled(void) { return false; }
__attribute__((weak)) em_status em__cuda_init(void) { return EM_OK; }
__attribute__((weak)) void em__cuda_shutdown(void) {}
__attribute__((weak)) em_status em__opencl_init(void) { return EM_OK; }
__attribute__((weak)) void em__opencl_shutdown(void) {}

static struct starpu_codelet g_cl[EM_OP_COUNT];
static struct starpu_perfmodel g_model[EM_OP_COUNT];
static char g_symbol[EM_OP_COUNT][48];

/* History models are keyed by the shapes, not only the byte sizes: hash the
 * op kind, the operand descriptors and the params (NNTile's footprint idea). */
static uint32_t footprint(struct starpu_task *task)
{
    const em_kargs *k = task->cl_arg;
    uint32_t h = starpu_hash_crc32c_be_n(&k->kind, sizeof k->kind, 0);
    for (int i = 0; i < k->n_in; i++) {
        h = starpu_hash_crc32c_be_n(k->in[i].shape, sizeof(int64_t) * (size_t)k->in[i].ndim, h);
        h = starpu_hash_crc32c_be_n(&k->in[i].dtype, sizeof k->in[i].dtype, h);
    }
    for (int i = 0; i < k->n_out; i++) h = starpu_hash_crc32c_be_n(k->out[i].shape, sizeof(int64_t) * (size_t)k->out[i].ndim, h);
    if (k->kind == EM_OP_FUSED) { /* the program's kinds: one chain is not another */
        const em_fused_prog *p = &((const em_fused_args *)k)->prog;
        for (int i = 0; i < p->n_instr && i < EM_FUSED_MAX_INSTR; i++) h = starpu_hash_crc32c_be_n(&p->ins[i].kind, sizeof p->ins[i].kind, h);
        h = starpu_hash_crc32c_be_n(&p->n_out, sizeof p->n_out, h);
    }
    return h;
}

em_status em__codelets_init(void)
{
    em__optab[EM_OP_MATMUL].submit = em__matmul_submit;
    em__optab[EM_OP_CONV2D].submit = em__conv_submit;
    em__optab[EM_OP_CONV2D_BWD_DATA].submit = em__conv_submit;
    em__optab[EM_OP_CONV2D_BWD_WEIGHT].submit = em__conv_submit;
    em__optab[EM_OP_SDPA].submit = em__sdpa_submit;
    em__optab[EM_OP_SDPA_BWD].submit = em__sdpa_submit;
    if (em__autodiff_check) {
        em_status st = em__autodiff_check();
        if (st != EM_OK) return st;
    }
    for (int k = 0; k < EM_OP_COUNT; k++) {
        em_optab_entry *e = &em__optab[k];
        if (!e->name) return em__set_error(EM_ERR_RUNTIME, "op table entry %d is empty", k);
        if (e->flags & F_VIEW) continue;
        struct starpu_codelet *cl = &g_cl[k];
        memset(cl, 0, sizeof *cl);
        cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
        cl->name = e->name;
        if (e->flags & F_NOWHERE) { /* StarPU completes it once its dependencies are met, moving no data */
            cl->where = STARPU_NOWHERE;
            continue;
        }
        if (e->flags & F_COLLECTIVE) {
            /* dist/'s kernels (their own arguments, no em_kargs: no dispatcher,
             * no footprint, no model); CUDA only with NCCL */
            e->cpu = em__dist_cpu_kernels[k];
            if (!e->cpu) return em__set_error(EM_ERR_RUNTIME, "collective %s has no CPU kernel (dist/)", e->name);
            cl->cpu_funcs[0] = e->cpu;
            cl->cpu_funcs_name[0] = e->name;
            if (em__dist_cuda_kernels[k]) {
                cl->cuda_funcs[0] = em__dist_cuda_kernels[k];
                cl->cuda_flags[0] = STARPU_CUDA_ASYNC;
            }
            continue;
        }
        /* Every backend compiled in has a kernel for every task op: a missing
         * entry is a start-up error, never a silent fallback. */
        if (!e->cpu) return em__set_error(EM_ERR_RUNTIME, "op %s has no CPU kernel", e->name);
        if (em__cuda_compiled() && !em__cuda_kernels[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s (family %s) has no CUDA kernel", e->name, e->family);
        if (em__opencl_compiled() && !em__opencl_kernels[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s (family %s) has no OpenCL kernel", e->name, e->family);
        cl->cpu_funcs[0] = em__cpu_dispatch; /* runs e->cpu (tasks/dispatch.c) */
        cl->cpu_funcs_name[0] = e->name;
        if (em__cuda_kernels[k]) {
            cl->cuda_funcs[0] = em__cuda_dispatch;
            cl->cuda_flags[0] = STARPU_CUDA_ASYNC;
        }
        if (em__opencl_kernels[k]) {
            cl->opencl_funcs[0] = em__opencl_dispatch;
            cl->opencl_flags[0] = STARPU_OPENCL_ASYNC;
        }
        snprintf(g_symbol[k], sizeof g_symbol[k], "ember_%s", e->name);
        memset(&g_model[k], 0, sizeof g_model[k]);
        g_model[k].type = STARPU_HISTORY_BASED;
        g_model[k].symbol = g_symbol[k];
        g_model[k].footprint = footprint;
        cl->model = &g_model[k];
    }
    return EM_OK;
}

/* Codelets with per-buffer memory nodes (em_op.nodes): StarPU keeps the
 * nodes in the codelet, so the door keeps one codelet per (kind, nodes
 * array), made on first use, freed at shutdown (after every task). */
typedef struct node_codelet {
    struct node_codelet *next;
    enum em_op_kind kind;
    const int *nodes;
    struct starpu_codelet cl;
} node_codelet;
static node_codelet *g_node_cls;
static pthread_mutex_t g_node_mu = PTHREAD_MUTEX_INITIALIZER;

static struct starpu_codelet *codelet_with_nodes(enum em_op_kind kind, const int *nodes)
{
    pthread_mutex_lock(&g_node_mu);
    node_codelet *c = g_node_cls;
    while (c && !(c->kind == kind && c->nodes == nodes)) c = c->next;
    if (!c && (c = calloc(1, sizeof *c))) {
        c->kind = kind;
        c->nodes = nodes;
        c->cl = g_cl[kind];
        c->cl.model = NULL;
        c->cl.specific_nodes = 1;
        c->cl.dyn_nodes = (int *)nodes;
        c->next = g_node_cls;
        g_node_cls = c;
    }
    pthread_mutex_unlock(&g_node_mu);
    return c ? &c->cl : NULL;
}

void em__codelets_shutdown(void)
{
    /* em_shutdown calls this after starpu_task_wait_for_all */
    pthread_mutex_lock(&g_node_mu);
    while (g_node_cls) {
        node_codelet *c = g_node_cls;
        g_node_cls = c->next;
        free(c);
    }
    pthread_mutex_unlock(&g_node_mu);
}

void em__kargs_from_op(const em_op *op, em_kargs *k)
{
    memset(k, 0, sizeof *k);
    k->kind = op->kind;
    k->n_in = op->n_in;
    k->n_out = op->n_out;
    for (int i = 0; i < op->n_in; i++) em__tdesc(op->in[i], &k->in[i]);
    for (int i = 0; i < op->n_out; i++) em__tdesc(op->out[i], &k->out[i]);
    k->p = op->p;
}

bool em__fences_on(void)
{
    const char *v = getenv("EMBER_DIST_FENCE");
    return !(v && !strcmp(v, "0"));
}

void *em__sync_handle_new(void)
{
    starpu_data_handle_t h = NULL;
    starpu_void_data_register(&h);
    return h;
}

void em__sync_handle_free(void **h)
{
    if (*h && em_is_initialized()) starpu_data_unregister((starpu_data_handle_t)*h);
    *h = NULL;
}

em_status em__fence_signal(void **fence, em_tensor *const *after, int n)
{
    em_tensor **v = malloc(sizeof *v * (size_t)(n > 0 ? n : 1));
    if (!v) return em__set_error(EM_ERR_NOMEM, "out of memory creating a task");
    int nv = 0;
    for (int i = 0; i < n; i++) { /* each storage once */
        if (!after[i]) continue;
        int j = 0;
        while (j < nv && v[j]->storage != after[i]->storage) j++;
        if (j == nv) v[nv++] = after[i];
    }
    if (!*fence) *fence = em__sync_handle_new();
    em_op op = {.kind = EM_OP_FENCE, .flags = EM_OPF_NO_RECORD, .token = *fence, .n_var = nv, .var = v};
    em_status st = em__submit(&op);
    free(v);
    return st;
}

void em__fence_free(void **fence) { em__sync_handle_free(fence); }

static em_status task_nomem(struct starpu_task *task)
{
    if (task) {
        task->destroy = 0;
        starpu_task_destroy(task); /* frees cl_arg and the dyn arrays */
    }
    return em__set_error(EM_ERR_NOMEM, "out of memory creating a task");
}

/* ---- f16 / bf16 operands (DESIGN.md §7) ----------------------------------- */

static inline bool is_half(em_dtype d) { return d == EM_F16 || d == EM_BF16; }

static inline bool op_has_half(const em_op *op)
{
    for (int i = 0; i < op->n_in; i++)
        if (is_half(op->in[i]->dtype)) return true;
    for (int i = 0; i < op->n_out; i++)
        if (is_half(op->out[i]->dtype)) return true;
    return false;
}

/* The StarPU backends (STARPU_CPU | STARPU_CUDA | STARPU_OPENCL) of
 * placement @p pl that can run kind @p k with f16/bf16 operands: their
 * kernel loads and stores the 16-bit types (em__<backend>_half) and they
 * have workers. 0: none (the door widens the op). */
static unsigned half_where(enum em_op_kind k, em_placement pl)
{
    unsigned w = 0;
    if (em__cpu_half[k] && starpu_cpu_worker_get_count() > 0) w |= STARPU_CPU;
    if (em__cuda_half[k] && starpu_cuda_worker_get_count() > 0) w |= STARPU_CUDA;
    if (em__opencl_half[k] && starpu_opencl_worker_get_count() > 0) w |= STARPU_OPENCL;
    if (pl.where) w &= pl.where;
    if (pl.worker >= 0) {
        unsigned t = 0;
        switch (starpu_worker_get_type(pl.worker)) {
        case STARPU_CPU_WORKER: t = STARPU_CPU; break;
        case STARPU_CUDA_WORKER: t = STARPU_CUDA; break;
        case STARPU_OPENCL_WORKER: t = STARPU_OPENCL; break;
        default: break;
        }
        w &= t;
    }
    return w;
}

/* Placement, trace, submission (with the CPU fallback when the chosen
 * device has no kernel) of a task whose buffers and arguments are set. */
static inline em_status task_finish(struct starpu_task *task, const em_op *op, unsigned fl)
{
    task->priority = op->priority == EM_PRIO_MAX ? STARPU_MAX_PRIO : op->priority;
    em_placement pl = {0, -1};
    if (!(fl & F_NOWHERE)) { /* a fence runs nowhere: no placement, not traced, not counted */
        pl = op->place ? *op->place : em__placement();
        if (pl.where) task->where = (int32_t)pl.where;
        if (__builtin_expect(op_has_half(op), 0)) task->where = (int32_t)half_where(op->kind, pl); /* em__submit checked it is not 0 */
        if (pl.worker >= 0) {
            task->execute_on_a_specific_worker = 1;
            task->workerid = (unsigned)pl.worker;
            /* operands that can never fit the device: fail now, StarPU would wait forever */
            em_status fit = em__task_fits(op, (void *const *)(task->dyn_handles ? task->dyn_handles : task->handles),
                                          (int)task->nbuffers, pl.worker);
            if (fit != EM_OK) {
                task->destroy = 0;
                starpu_task_destroy(task); /* frees cl_arg and the dyn arrays */
                return fit;
            }
        }
        em__trace_attach(task);
    }
    task->detach = 1;
    int ret = starpu_task_submit(task);
    if (ret == -ENODEV && !op->place && pl.where != STARPU_CPU && !(fl & F_NOWHERE)) {
        /* No kernel for this op on the chosen device: run it on the CPU, explicitly. */
        em_log_msg(EM_LOG_DEBUG, "op %s has no kernel for the current device: running on CPU", em__optab[op->kind].name);
        task->where = STARPU_CPU;
        task->execute_on_a_specific_worker = 0;
        ret = starpu_task_submit(task);
    }
    if (ret != 0) {
        task->destroy = 0;
        starpu_task_destroy(task); /* frees cl_arg and the dyn arrays */
        return em__set_error(ret == -ENODEV ? EM_ERR_DEVICE : EM_ERR_RUNTIME, "op %s: task submission failed (%d)",
                             em__optab[op->kind].name, ret);
    }
    if (!(fl & F_NOWHERE)) __atomic_add_fetch(&em__tasks, 1, __ATOMIC_RELAXED);
    return EM_OK;
}

/* tasks_internal.h */
bool em__dense_storage(const em_tensor *t)
{
    if (t->offset != 0 || (size_t)em__numel(t->shape, t->ndim) * em_dtype_size(t->dtype) != t->storage->nbytes) return false;
    int64_t st[EM_MAX_DIMS], sz[EM_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1) continue;
        int j = n++;
        for (; j > 0 && st[j - 1] > t->strides[d]; j--) { /* insertion by stride */
            st[j] = st[j - 1];
            sz[j] = sz[j - 1];
        }
        st[j] = t->strides[d];
        sz[j] = t->shape[d];
    }
    int64_t want = 1;
    for (int j = 0; j < n; j++) {
        if (st[j] != want) return false;
        want *= sz[j];
    }
    return true;
}

/* The mode of output i: one that does not cover its whole storage keeps the
 * rest (RW); a contiguous one, or a dense permuted view of its storage, is
 * written whole (W). */
static inline enum starpu_data_access_mode out_mode(const em_op *op, int i, unsigned fl)
{
    if (fl & F_INPLACE) return STARPU_RW;
    return (em__covers_storage(op->out[i]) || em__dense_storage(op->out[i])) ? STARPU_W : STARPU_RW;
}

/* Any op: buffers token, in[], out[], var[], after (dynamic arrays beyond
 * STARPU_NMAXBUFS), the kind's codelet or one with op->nodes, kernel
 * arguments from op->args (F_COLLECTIVE, F_NOWHERE) or em_kargs. */
static __attribute__((noinline)) em_status task_submit_any(const em_op *op, unsigned fl)
{
    const bool own_args = fl & (F_COLLECTIVE | F_NOWHERE | F_OWN_ARGS);
    struct starpu_task *task = starpu_task_create();
    void *arg = op->args;
    size_t arg_size = op->args_size;
    if (!own_args) {
        em_kargs *k = malloc(sizeof *k);
        if (k) {
            if (op->kargs)
                *k = *op->kargs;
            else
                em__kargs_from_op(op, k);
        }
        arg = k;
        arg_size = sizeof *k;
    }
    if (!task || (!own_args && !arg)) {
        free(arg);
        return task_nomem(task);
    }
    task->cl_arg = arg;
    task->cl_arg_size = arg_size;
    task->cl_arg_free = arg != NULL;
    const int nb = (op->token != NULL) + op->n_in + op->n_out + op->n_var + (op->after != NULL);
    starpu_data_handle_t *H = task->handles;
    enum starpu_data_access_mode *M = task->modes;
    if (nb > STARPU_NMAXBUFS) { /* StarPU frees dyn_handles / dyn_modes with the task */
        H = task->dyn_handles = malloc(sizeof *H * (size_t)nb);
        M = task->dyn_modes = malloc(sizeof *M * (size_t)nb);
    }
    task->cl = op->nodes ? codelet_with_nodes(op->kind, op->nodes) : &g_cl[op->kind];
    if (!H || !M || !task->cl) return task_nomem(task);
    int b = 0;
    if (op->token) {
        H[b] = op->token;
        M[b++] = (fl & F_NOWHERE) ? STARPU_W : STARPU_RW;
    }
    for (int i = 0; i < op->n_in; i++, b++) {
        H[b] = op->in[i]->storage->handle;
        M[b] = STARPU_R;
    }
    for (int i = 0; i < op->n_out; i++, b++) {
        H[b] = op->out[i]->storage->handle;
        M[b] = out_mode(op, i, fl);
    }
    for (int i = 0; i < op->n_var; i++, b++) {
        H[b] = op->var[i]->storage->handle;
        M[b] = (fl & F_COLLECTIVE) ? STARPU_RW : ((fl & F_OWN_ARGS) && i >= op->n_var - op->n_var_w) ? ((fl & F_INPLACE) ? STARPU_RW : STARPU_W) : STARPU_R;
    }
    if (op->after) {
        H[b] = op->after;
        M[b++] = STARPU_R;
    }
    task->nbuffers = nb;
    return task_finish(task, op, fl);
}

/* One task for @p op: the door's only path to StarPU. An ordinary op (its
 * kind's codelet and em_kargs, in[] and out[] and maybe a fence, within
 * STARPU_NMAXBUFS) takes the short path, the per-op cost of every tensor
 * op; the rest task_submit_any. */
static em_status task_submit(const em_op *op)
{
    const unsigned fl = em__optab[op->kind].flags;
    em_capture *cap = op->capture ? op->capture : em__capture_current();
    if (__builtin_expect(cap != NULL && cap != EM_NO_CAPTURE, 0)) { /* recorded, then run as usual */
        em_kargs k;
        if (!(fl & (F_OWN_ARGS | F_COLLECTIVE | F_NOWHERE))) {
            if (op->kargs)
                k = *op->kargs;
            else
                em__kargs_from_op(op, &k);
        }
        em__capture_record(cap, op, &k);
    }
    const int nb = op->n_in + op->n_out;
    if (__builtin_expect((fl & (F_COLLECTIVE | F_NOWHERE)) || op->token || op->n_var || op->nodes ||
                             nb + (op->after != NULL) > STARPU_NMAXBUFS, 0))
        return task_submit_any(op, fl);
    struct starpu_task *task = starpu_task_create();
    em_kargs *k = malloc(sizeof *k);
    if (!task || !k) {
        free(k);
        return task_nomem(task);
    }
    if (op->kargs)
        *k = *op->kargs;
    else
        em__kargs_from_op(op, k);
    task->cl = &g_cl[op->kind];
    task->cl_arg = k;
    task->cl_arg_size = sizeof *k;
    task->cl_arg_free = 1;
    for (int i = 0; i < op->n_in; i++) {
        task->handles[i] = op->in[i]->storage->handle;
        task->modes[i] = STARPU_R;
    }
    for (int i = 0; i < op->n_out; i++) {
        task->handles[op->n_in + i] = op->out[i]->storage->handle;
        task->modes[op->n_in + i] = out_mode(op, i, fl);
    }
    task->nbuffers = nb;
    if (op->after) {
        task->handles[nb] = op->after;
        task->modes[nb] = STARPU_R;
        task->nbuffers = nb + 1;
    }
    return task_finish(task, op, fl);
}

/* A COPY (with cast) of @p src into @p dst, not recorded, with @p op's
 * placement, priority and fence. */
static em_status widen_copy(const em_op *op, em_tensor *src, em_tensor *dst)
{
    em_op c = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {src}, .out = {dst}, .flags = EM_OPF_RAW,
               .priority = op->priority, .after = op->after, .place = op->place};
    return em__submit(&c);
}

/* @p op, whose f16/bf16 operands no backend of its placement takes, run in
 * f32: each 16-bit input is copied to f32, each 16-bit output computed into
 * an f32 temporary (holding the output's values first for F_INPLACE kinds)
 * and rounded into the output. The values are those of a kernel that loads
 * T, computes in f32 and stores T, as DESIGN.md §7 asks, in three tasks
 * instead of one. Autodiff records @p op itself, with its own operands. */
static em_status submit_widened(em_op *op, unsigned fl)
{
    if (fl & F_COLLECTIVE)
        return em__set_error(EM_ERR_DTYPE, "op %s: f16/bf16 operands are not supported (cast to float32 first)",
                             em__optab[op->kind].name);
    if (op->kargs)
        return em__set_error(EM_ERR_DTYPE, "op %s: f16/bf16 operands with custom kernel arguments cannot be widened",
                             em__optab[op->kind].name);
    em_op w = *op;
    w.flags |= EM_OPF_NO_RECORD;
    em_tensor *tin[EM_OP_MAX_IN] = {0}, *tout[EM_OP_MAX_OUT] = {0};
    em_status st = EM_OK;
    for (int i = 0; i < op->n_in && st == EM_OK; i++) {
        if (!is_half(op->in[i]->dtype)) continue;
        tin[i] = em__tensor_new(EM_F32, op->in[i]->shape, op->in[i]->ndim);
        st = tin[i] ? widen_copy(op, op->in[i], tin[i]) : em_last_status();
        w.in[i] = tin[i];
    }
    for (int i = 0; i < op->n_out && st == EM_OK; i++) {
        if (!is_half(op->out[i]->dtype)) continue;
        tout[i] = em__tensor_new(EM_F32, op->out[i]->shape, op->out[i]->ndim);
        st = !tout[i] ? em_last_status() : (fl & F_INPLACE) ? widen_copy(op, op->out[i], tout[i]) : EM_OK;
        w.out[i] = tout[i];
    }
    if (st == EM_OK) st = em__submit(&w);
    for (int i = 0; i < op->n_out && st == EM_OK; i++)
        if (tout[i]) st = widen_copy(op, tout[i], op->out[i]);
    for (int i = 0; i < op->n_in; i++) em_tensor_release(tin[i]);
    for (int i = 0; i < op->n_out; i++) em_tensor_release(tout[i]);
    if (st != EM_OK) return st;
    if (em__autodiff_record && (fl & F_DIFF) && !(op->flags & EM_OPF_NO_RECORD)) return em__autodiff_record(op);
    return EM_OK;
}

em_status em__submit(em_op *op)
{
    const em_optab_entry *e = &em__optab[op->kind];
    if (em__fusion_offer && !(op->flags & EM_OPF_NO_FUSE)) {
        bool taken = false;
        em_status st = em__fusion_offer(op, &taken);
        if (st != EM_OK) return st;
        if (taken) /* held in the fusion stream: recorded now, run at the flush */
            return (em__autodiff_record && (e->flags & F_DIFF) && !(op->flags & EM_OPF_NO_RECORD)) ? em__autodiff_record(op)
                                                                                                     : EM_OK;
    }
    if (__builtin_expect(!(e->flags & (F_VIEW | F_NOWHERE)) && op_has_half(op), 0)) {
        em_placement pl = op->place ? *op->place : em__placement();
        if (!half_where(op->kind, pl)) {
            if (op->kind != EM_OP_COPY) return submit_widened(op, e->flags);
            /* the widening's own copies: on the CPU when the placement's
             * devices cannot convert (as the door's no-kernel fallback) */
            em_placement cpu = em__placement_cpu();
            if (op->place || !half_where(op->kind, cpu))
                return em__set_error(EM_ERR_DEVICE, "copy: no device of the placement converts f16/bf16");
            em_log_msg(EM_LOG_DEBUG, "copy of f16/bf16: no kernel on the current device, running on CPU");
            op->place = &cpu;
            em_status st = task_submit(op);
            op->place = NULL;
            return st;
        }
    }
    if (!(e->flags & F_VIEW)) {
        em_status st = (e->submit && !(op->flags & EM_OPF_ONE_TASK)) ? e->submit(op) : task_submit(op);
        if (st != EM_OK) return st;
    }
    if (em__autodiff_record && (e->flags & F_DIFF) && !(op->flags & EM_OPF_NO_RECORD)) return em__autodiff_record(op);
    return EM_OK;
}

em_tensor *em__run1(enum em_op_kind kind, em_tensor *const *in, int n_in, em_tensor *out, const union em_op_params *p,
                    const em_tensor *const *orig_in)
{
    em_op op = {.kind = kind, .n_in = n_in, .n_out = 1};
    for (int i = 0; i < n_in; i++) {
        op.in[i] = in[i];
        op.orig_in[i] = orig_in ? orig_in[i] : NULL;
    }
    op.out[0] = out;
    if (p) op.p = *p;
    if (em__submit(&op) != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return em__publish(out);
}
