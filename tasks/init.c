/* The tasks layer's start-up and shutdown, registered with the runtime at
 * load time (runtime/ calls nothing above it): the codelets from the op
 * table, then the device kernels' start/stop (devices/devices.h). */
#include "tasks/tasks_internal.h"

em_status (*em__autodiff_record_cat)(em_tensor *out, em_tensor *const *ins, int n, int dim);

static em_status tasks_init(void)
{
    em_status st = em__codelets_init();
    if (st == EM_OK) st = em__cuda_init();
    if (st == EM_OK) st = em__opencl_init();
    return st;
}

static void tasks_shutdown(void)
{
    em__opencl_shutdown();
    em__cuda_shutdown();
    em__codelets_shutdown();
}

/* em_print_devices: what the device backends add (OpenCL: f16 / bf16). */
static void tasks_describe(FILE *f) { em__opencl_describe(f); }

__attribute__((constructor)) static void register_tasks(void)
{
    static const em_runtime_hooks hooks = {
        .name = "tasks", .order = 10, .init = tasks_init, .shutdown = tasks_shutdown, .describe = tasks_describe};
    em__runtime_register(&hooks);
}
