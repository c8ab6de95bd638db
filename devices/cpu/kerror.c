/* Kernel failure reports (devices/devices.h): the kernel a worker runs, its
 * operands formatted for the message, and the sink tasks/ installs. */
#include "devices/devices.h"

#include <starpu.h>
#include <stdarg.h>
#include <stdio.h>

static _Thread_local const em_kargs *tl_kargs; /* the kernel the calling worker runs */
static em_kernel_error_sink g_sink;

void em__kernel_set_error_sink(em_kernel_error_sink sink) { g_sink = sink; }
void em__kernel_enter(const em_kargs *k) { tl_kargs = k; }
void em__kernel_leave(void) { tl_kargs = NULL; }

static _Thread_local int tl_trial = -1; /* errors counted since em__kernel_trial_begin, -1 outside a trial */
void em__kernel_trial_begin(void) { tl_trial = 0; }
int em__kernel_trial_end(void)
{
    const int n = tl_trial;
    tl_trial = -1;
    return n;
}

void em__kernel_operands(char *buf, size_t n, const em_tdesc *d, int count)
{
    size_t k = 0;
    if (count == 0) snprintf(buf, n, "none");
    for (int i = 0; i < count && k < n; i++) {
        k += (size_t)snprintf(buf + k, n - k, "%s[", i ? ", " : "");
        for (int j = 0; j < d[i].ndim && k < n; j++)
            k += (size_t)snprintf(buf + k, n - k, "%s%lld", j ? ", " : "", (long long)d[i].shape[j]);
        if (k < n) k += (size_t)snprintf(buf + k, n - k, "] %s", em_dtype_name((em_dtype)d[i].dtype));
    }
}

void em__kernel_error(const em_kargs *k, em_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    em__kernel_verror(k, st, fmt, ap);
    va_end(ap);
}

void em__kernel_verror(const em_kargs *k, em_status st, const char *fmt, va_list ap)
{
    if (tl_trial >= 0) {
        tl_trial++;
        return;
    }
    if (!k) k = tl_kargs;
    char what[512], ins[400] = "", outs[400] = "";
    vsnprintf(what, sizeof what, fmt, ap);
    const char *op = NULL;
    if (k) {
        em__kernel_operands(ins, sizeof ins, k->in, k->n_in);
        em__kernel_operands(outs, sizeof outs, k->out, k->n_out);
        op = (unsigned)k->kind < EM_OP_COUNT ? em__kernel_info[k->kind].name : "?";
    }
    if (g_sink) g_sink(st, starpu_worker_get_id(), op, what, ins, outs);
}
