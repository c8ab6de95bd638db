/* The single submission funnel and the op table.
 *
 * Every op function validates its inputs, allocates its outputs and builds an
 * em_op, then calls em__submit(). The funnel turns the op into StarPU task(s)
 * through codelets generated from the op table (tasks/ops.def) and lets
 * autodiff record it. */
#include "tasks/tasks_internal.h"

#include <starpu.h>
#include <stdlib.h>
#include <string.h>

/* CPU kernels (devices/cpu), one per kernel family of tasks/ops.def. */
void em_cpu_unary(void *buffers[], void *cl_arg);
void em_cpu_binary(void *buffers[], void *cl_arg);
void em_cpu_where(void *buffers[], void *cl_arg);
void em_cpu_reduce(void *buffers[], void *cl_arg);
void em_cpu_softmax(void *buffers[], void *cl_arg);
void em_cpu_matmul(void *buffers[], void *cl_arg);
void em_cpu_copy(void *buffers[], void *cl_arg);
void em_cpu_index(void *buffers[], void *cl_arg);
void em_cpu_fill(void *buffers[], void *cl_arg);
void em_cpu_optim(void *buffers[], void *cl_arg);
#define em_cpu_NONE NULL /* views: no task */

em_status em__matmul_submit(em_op *op); /* tasks/matmul.c: tiling */

em_optab_entry em__optab[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) \
    [EM_OP_##E] = {.name = #nm, .family = (fl) & F_VIEW ? NULL : #fam, .n_in = nin, .n_out = nout, .flags = fl, .cpu = em_cpu_##fam},
#include "tasks/ops.def"
};

em_status (*em__autodiff_record)(const em_op *op);
em_status (*em__autodiff_check)(void);

/* Weak defaults: a build without a device backend has no kernels for it. */
__attribute__((weak)) em_kernel_fn em__cuda_kernels[EM_OP_COUNT];
__attribute__((weak)) em_kernel_fn em__opencl_kernels[EM_OP_COUNT];
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
    return h;
}

em_status em__codelets_init(void)
{
    em__optab[EM_OP_MATMUL].submit = em__matmul_submit;
    if (em__autodiff_check) {
        em_status st = em__autodiff_check();
        if (st != EM_OK) return st;
    }
    for (int k = 0; k < EM_OP_COUNT; k++) {
        const em_optab_entry *e = &em__optab[k];
        if (!e->name) return em__set_error(EM_ERR_RUNTIME, "op table entry %d is empty", k);
        if (e->flags & F_VIEW) continue;
        /* Every backend compiled in has a kernel for every task op: a missing
         * entry is a start-up error, never a silent fallback. */
        if (!e->cpu) return em__set_error(EM_ERR_RUNTIME, "op %s has no CPU kernel", e->name);
        if (em__cuda_compiled() && !em__cuda_kernels[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s (family %s) has no CUDA kernel", e->name, e->family);
        if (em__opencl_compiled() && !em__opencl_kernels[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s (family %s) has no OpenCL kernel", e->name, e->family);
        struct starpu_codelet *cl = &g_cl[k];
        memset(cl, 0, sizeof *cl);
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
        cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
        cl->name = e->name;
        snprintf(g_symbol[k], sizeof g_symbol[k], "ember_%s", e->name);
        memset(&g_model[k], 0, sizeof g_model[k]);
        g_model[k].type = STARPU_HISTORY_BASED;
        g_model[k].symbol = g_symbol[k];
        g_model[k].footprint = footprint;
        cl->model = &g_model[k];
    }
    return EM_OK;
}

void em__codelets_shutdown(void) {}

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

static _Thread_local starpu_data_handle_t tl_after; /* em__submit_after */
static _Thread_local int tl_priority;                /* em__submit_priority */

void *em__submit_after(void *fence)
{
    void *prev = tl_after;
    tl_after = fence;
    return prev;
}

int em__submit_priority(int prio)
{
    int prev = tl_priority;
    tl_priority = prio;
    return prev;
}

/* The fence task has nothing to run: StarPU completes a STARPU_NOWHERE task
 * as soon as its dependencies are met, without moving its data. */
static struct starpu_codelet g_cl_fence = {
    .where = STARPU_NOWHERE,
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "fence",
};

bool em__fences_on(void)
{
    const char *v = getenv("EMBER_DIST_FENCE");
    return !(v && !strcmp(v, "0"));
}

em_status em__fence_signal(void **fence, em_tensor *const *after, int n)
{
    if (!*fence) starpu_void_data_register((starpu_data_handle_t *)fence);
    int nb = 0;
    starpu_data_handle_t *h = malloc(sizeof *h * (size_t)(n + 1));
    enum starpu_data_access_mode *m = malloc(sizeof *m * (size_t)(n + 1));
    struct starpu_task *task = h && m ? starpu_task_create() : NULL;
    if (!task) {
        free(h);
        free(m);
        return em__set_error(EM_ERR_NOMEM, "out of memory creating a task");
    }
    for (int i = 0; i < n; i++) { /* each storage once */
        if (!after[i]) continue;
        starpu_data_handle_t x = after[i]->storage->handle;
        int j = 0;
        while (j < nb && h[j] != x) j++;
        if (j == nb) {
            h[nb] = x;
            m[nb++] = STARPU_R;
        }
    }
    h[nb] = *fence;
    m[nb++] = STARPU_W;
    task->cl = &g_cl_fence;
    task->dyn_handles = h; /* StarPU frees them with the task */
    task->dyn_modes = m;
    task->nbuffers = nb;
    task->detach = 1;
    int ret = starpu_task_submit(task);
    if (ret != 0) {
        task->destroy = 0;
        starpu_task_destroy(task);
        return em__set_error(EM_ERR_RUNTIME, "fence: task submission failed (%d)", ret);
    }
    return EM_OK;
}

void em__fence_free(void **fence)
{
    if (*fence && em_is_initialized()) starpu_data_unregister((starpu_data_handle_t)*fence);
    *fence = NULL;
}

em_status em__task_submit(const em_op *op, const em_kargs *kin, void *const *handles_override)
{
    struct starpu_task *task = starpu_task_create();
    em_kargs *k = malloc(sizeof *k);
    if (!task || !k) {
        free(k);
        return em__set_error(EM_ERR_NOMEM, "out of memory creating a task");
    }
    if (kin)
        *k = *kin;
    else
        em__kargs_from_op(op, k);
    task->cl = &g_cl[op->kind];
    task->cl_arg = k;
    task->cl_arg_size = sizeof *k;
    task->cl_arg_free = 1;
    int nb = 0;
    for (int i = 0; i < op->n_in; i++, nb++) {
        task->handles[nb] = handles_override ? handles_override[nb] : op->in[i]->storage->handle;
        task->modes[nb] = STARPU_R;
    }
    for (int i = 0; i < op->n_out; i++, nb++) {
        task->handles[nb] = handles_override ? handles_override[nb] : op->out[i]->storage->handle;
        /* An output that does not cover its whole storage keeps the rest: RW. */
        task->modes[nb] = (!handles_override && !(em__optab[op->kind].flags & F_INPLACE) && em__covers_storage(op->out[i])) ? STARPU_W : STARPU_RW;
    }
    if (tl_after && nb < STARPU_NMAXBUFS) { /* em__submit_after; a task without room just keeps its data order */
        task->handles[nb] = tl_after;
        task->modes[nb++] = STARPU_R;
    }
    task->nbuffers = nb;
    task->priority = tl_priority;
    em_placement pl = em__placement();
    if (pl.where) task->where = (int32_t)pl.where;
    if (pl.worker >= 0) {
        task->execute_on_a_specific_worker = 1;
        task->workerid = (unsigned)pl.worker;
        em_status fit = em__task_fits(op, (void *const *)task->handles, nb, pl.worker);
        if (fit != EM_OK) {
            task->destroy = 0;
            starpu_task_destroy(task);
            return fit;
        }
    }
    task->detach = 1;
    em__trace_attach(task);
    int ret = starpu_task_submit(task);
    if (ret == -ENODEV && pl.where != STARPU_CPU) {
        /* No kernel for this op on the chosen device: run it on the CPU, explicitly. */
        em_log_msg(EM_LOG_DEBUG, "op %s has no kernel for the current device: running on CPU", em__optab[op->kind].name);
        task->where = STARPU_CPU;
        task->execute_on_a_specific_worker = 0;
        ret = starpu_task_submit(task);
    }
    if (ret != 0) {
        task->destroy = 0;
        starpu_task_destroy(task);
        return em__set_error(ret == -ENODEV ? EM_ERR_DEVICE : EM_ERR_RUNTIME, "op %s: task submission failed (%d)",
                             em__optab[op->kind].name, ret);
    }
    __atomic_add_fetch(&em__tasks, 1, __ATOMIC_RELAXED);
    return EM_OK;
}

em_status em__submit(em_op *op)
{
    const em_optab_entry *e = &em__optab[op->kind];
    if (!(e->flags & F_VIEW)) {
        em_status st = e->submit ? e->submit(op) : em__task_submit(op, NULL, NULL);
        if (st != EM_OK) return st;
    }
    if (em__autodiff_record && (e->flags & F_DIFF)) return em__autodiff_record(op);
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
