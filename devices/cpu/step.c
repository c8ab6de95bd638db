/* CPU kernel of STEP: a captured step's recorded tasks run in order by one
 * worker (the contract: em_step_plan, devices/kargs.h; built by
 * tasks/capture.c). Each recorded task's kernel gets its own buffers (views
 * of the STEP task's) and its recorded arguments, or a copy with this
 * replay's parameters when they change per replay. */
#include "devices/cpu/cpu.h"

#include <string.h>

/* Runs op @p o of step @p a with kernel @p fn (a backend's table entry):
 * shared by the CPU, CUDA and OpenCL step kernels through em__step_run_op. */
void em__step_run_op(const em_step_args *a, const em_step_op *o, void *const *buffers, em_kernel_fn fn)
{
    enum { MAXB = 64 };
    void *sub[MAXB];
    void **b = o->nb <= MAXB ? sub : malloc(sizeof *b * (size_t)o->nb);
    if (!b) {
        em__kernel_error(NULL, EM_ERR_NOMEM, "step: out of memory for %d buffers", o->nb);
        return;
    }
    for (int j = 0; j < o->nb; j++) b[j] = buffers[a->plan->bufs[o->first_buf + j]];
    if (o->patch < 0) {
        em__kernel_enter(o->args);
        fn(b, (void *)o->args);
    } else { /* its kernel arguments are an em_kargs (tasks/capture.c patches no F_OWN_ARGS kind) */
        em_kargs k;
        memcpy(&k, o->args, sizeof k);
        k.p = a->p[o->patch];
        em__kernel_enter(&k);
        fn(b, &k);
    }
    em__kernel_leave();
    if (b != sub) free(b);
}

void em_cpu_step(void *buffers[], void *cl_arg)
{
    const em_step_args *a = cl_arg;
    for (int i = 0; i < a->plan->n_ops; i++) {
        const em_step_op *o = &a->plan->ops[i];
        if ((unsigned)o->kind >= EM_OP_COUNT || !em__kernel_info[o->kind].cpu) {
            em_cpu_bad_kind("step", o->kind);
            return;
        }
        em__step_run_op(a, o, buffers, em__kernel_info[o->kind].cpu);
    }
}
