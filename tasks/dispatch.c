/* The codelets' kernel functions: one small dispatcher per backend.
 *
 * Every codelet of tasks/funnel.c runs em__{cpu,cuda,opencl}_dispatch, which
 * notes which kernel the worker runs (em__kernel_enter, for em__kernel_error), lets fault
 * injection (EMBER_FAULT_INJECT=kernel:N, runtime/fault.c) fail it, and calls
 * the real kernel from the tables by kargs->kind. The cost is one indirect
 * call, a thread-local store and a relaxed load per task. */
#include "tasks/tasks_internal.h"

#include <starpu.h>
#include <stdarg.h>
#include <stdio.h>

/* The sink of kernel reports: the sticky error, with the Ember device name. */
static void sink(em_status st, int worker, const char *op, const char *what, const char *ins, const char *outs)
{
    char dev[64];
    em__worker_str(worker, dev, sizeof dev);
    if (!op)
        em__sticky_error(st, "kernel on %s failed: %s", dev, what);
    else
        em__sticky_error(st, "op %s on %s failed: %s (inputs: %s; outputs: %s)", op, dev, what, ins, outs);
}

__attribute__((constructor)) static void install_sink(void) { em__kernel_set_error_sink(sink); }

void em__task_kernel_error(em_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    em__kernel_verror(NULL, st, fmt, ap);
    va_end(ap);
}

/* StarPU never fails a task whose data cannot fit on its device: it waits
 * for memory forever (measured: a 16 MiB op under STARPU_LIMIT_OPENCL_MEM=4
 * hangs em_sync). So an op placed on an accelerator whose operands alone
 * exceed that device's memory fails at submission, naming op, device and
 * shapes. (What fits alone but not next to other data is StarPU's to evict.) */
em_status em__task_fits(const em_op *op, void *const *handles, int n, int worker)
{
    if (starpu_worker_get_type(worker) == STARPU_CPU_WORKER) return EM_OK;
    starpu_ssize_t total = starpu_memory_get_total(starpu_worker_get_memory_node((unsigned)worker));
    if (total <= 0) return EM_OK;
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < i && handles[j] != handles[i]) j++;
        if (j == i) need += starpu_data_get_size((starpu_data_handle_t)handles[i]);
    }
    if (need <= (size_t)total) return EM_OK;
    em_kargs k;
    em__kargs_from_op(op, &k);
    char dev[64], ins[400] = "", outs[400] = "";
    em__kernel_operands(ins, sizeof ins, k.in, k.n_in);
    em__kernel_operands(outs, sizeof outs, k.out, k.n_out);
    return em__set_error(EM_ERR_NOMEM,
                         "op %s on %s: its operands need %zu bytes of device memory, more than the device's %lld "
                         "(inputs: %s; outputs: %s)",
                         em__optab[op->kind].name, em__worker_str(worker, dev, sizeof dev), need, (long long)total, ins,
                         outs);
}

static inline bool enter(void *cl_arg)
{
    em__kernel_enter(cl_arg);
    if (EM_FAULT(EM_FAULT_KERNEL)) {
        em__kernel_error(cl_arg, EM_ERR_DEVICE, "injected fault (EMBER_FAULT_INJECT=kernel:%lld)",
                         (long long)em__fault_at[EM_FAULT_KERNEL]);
        em__kernel_leave();
        return false;
    }
    return true;
}

void em__cpu_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__optab[((const em_kargs *)cl_arg)->kind].cpu(buffers, cl_arg);
    em__kernel_leave();
}

void em__cuda_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__cuda_kernels[((const em_kargs *)cl_arg)->kind](buffers, cl_arg);
    em__kernel_leave();
}

void em__opencl_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__opencl_kernels[((const em_kargs *)cl_arg)->kind](buffers, cl_arg);
    em__kernel_leave();
}
