/* OpenCL kernel of STEP: a captured step's recorded tasks queued in order on
 * the worker's queue by their own kernel functions (the contract:
 * em_step_plan, devices/kargs.h; built by tasks/capture.c). */
#include "devices/opencl/opencl.h"

void em_ocl_step(void *buffers[], void *cl_arg)
{
    const em_step_args *a = cl_arg;
    for (int i = 0; i < a->plan->n_ops; i++) {
        const em_step_op *o = &a->plan->ops[i];
        if ((unsigned)o->kind >= EM_OP_COUNT || !em__opencl_kernels[o->kind]) {
            em_ocl_error("step: op %d has no OpenCL kernel (kind %d)", i, o->kind);
            return;
        }
        em__step_run_op(a, o, buffers, em__opencl_kernels[o->kind]);
    }
}
