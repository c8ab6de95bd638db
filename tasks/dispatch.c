/* The codelets' kernel functions: one small dispatcher per backend.
 *
 * Every codelet of tasks/funnel.c runs em__{cpu,cuda,opencl}_dispatch, which
 * notes which kernel the worker runs (for em__kernel_error), lets fault
 * injection (EMBER_FAULT_INJECT=kernel:N, runtime/fault.c) fail it, and calls
 * the real kernel from the tables by kargs->kind. The cost is one indirect
 * call, a thread-local store and a relaxed load per task. */
#include "devices/kerror.h"
#include "runtime/internal.h"

#include <starpu.h>
#include <stdio.h>

static _Thread_local const em_kargs *tl_kargs; /* the kernel the calling worker runs */

static void operands(char *buf, size_t n, const em_tdesc *d, int count)
{
    size_t k = 0;
    if (count == 0) snprintf(buf, n, "none");
    for (int i = 0; i < count && k < n; i++) {
        char s[160];
        em_shape_str(d[i].shape, d[i].ndim, s, sizeof s);
        k += (size_t)snprintf(buf + k, n - k, "%s%s %s", i ? ", " : "", s, em_dtype_name((em_dtype)d[i].dtype));
    }
}

void em__kernel_error(const em_kargs *k, em_status st, const char *fmt, ...)
{
    if (!k) k = tl_kargs;
    char what[512], dev[64], ins[400] = "", outs[400] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    em__worker_str(starpu_worker_get_id(), dev, sizeof dev);
    if (!k) {
        em__sticky_error(st, "kernel on %s failed: %s", dev, what);
        return;
    }
    operands(ins, sizeof ins, k->in, k->n_in);
    operands(outs, sizeof outs, k->out, k->n_out);
    em__sticky_error(st, "op %s on %s failed: %s (inputs: %s; outputs: %s)",
                     (unsigned)k->kind < EM_OP_COUNT ? em__optab[k->kind].name : "?", dev, what, ins, outs);
}

static inline bool enter(void *cl_arg)
{
    tl_kargs = cl_arg;
    if (EM_FAULT(EM_FAULT_KERNEL)) {
        em__kernel_error(cl_arg, EM_ERR_DEVICE, "injected fault (EMBER_FAULT_INJECT=kernel:%lld)",
                         (long long)em__fault_at[EM_FAULT_KERNEL]);
        tl_kargs = NULL;
        return false;
    }
    return true;
}

void em__cpu_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__optab[((const em_kargs *)cl_arg)->kind].cpu(buffers, cl_arg);
    tl_kargs = NULL;
}

void em__cuda_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__cuda_kernels[((const em_kargs *)cl_arg)->kind](buffers, cl_arg);
    tl_kargs = NULL;
}

void em__opencl_dispatch(void *buffers[], void *cl_arg)
{
    if (!enter(cl_arg)) return;
    em__opencl_kernels[((const em_kargs *)cl_arg)->kind](buffers, cl_arg);
    tl_kargs = NULL;
}
