/* StarPU worker and buffer queries for the layers that do not include
 * <starpu.h> (dist/). Tasks are not created here: only tasks/funnel.c
 * submits them (the one door). */
#include "runtime/runtime_internal.h"

#include <starpu.h>

em_placement em__placement_cpu(void) { return (em_placement){STARPU_CPU, -1}; }

em_placement em__placement_worker(int worker)
{
    em_placement p = {0, worker};
    switch (em__worker_kind(worker)) {
    case EM_DEVICE_CPU: p.where = STARPU_CPU; break;
    case EM_DEVICE_CUDA: p.where = STARPU_CUDA; break;
    case EM_DEVICE_OPENCL: p.where = STARPU_OPENCL; break;
    default: p.worker = -1; break;
    }
    return p;
}

int em__worker_total(void) { return (int)starpu_worker_get_count(); }

em_device_kind em__worker_kind(int worker)
{
    if (worker < 0 || worker >= (int)starpu_worker_get_count()) return EM_DEVICE_AUTO;
    switch (starpu_worker_get_type(worker)) {
    case STARPU_CPU_WORKER: return EM_DEVICE_CPU;
    case STARPU_CUDA_WORKER: return EM_DEVICE_CUDA;
    case STARPU_OPENCL_WORKER: return EM_DEVICE_OPENCL;
    default: return EM_DEVICE_AUTO;
    }
}

int em__worker_devid(int worker) { return starpu_worker_get_devid(worker); }

int em__worker_memory_node(int worker) { return (int)starpu_worker_get_memory_node((unsigned)worker); }

void em__run_on_worker(int worker, void (*fn)(void *), void *arg, const char *name)
{
    unsigned w = (unsigned)worker;
    starpu_execute_on_specific_workers(fn, arg, 1, &w, name);
}

void *em__buffer_ptr(void *buffers[], int i) { return (void *)STARPU_VECTOR_GET_PTR(buffers[i]); }

void *em__cuda_local_stream(void)
{
#ifdef STARPU_USE_CUDA
    return (void *)starpu_cuda_get_local_stream();
#else
    return NULL;
#endif
}
