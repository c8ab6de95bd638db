/* How a kernel reports a failure (DESIGN.md §10). Shared by devices/cpu,
 * devices/cuda (C++) and devices/opencl; implemented in tasks/dispatch.c.
 *
 * A kernel never aborts and never prints: when it cannot do its work (a CUDA
 * or OpenCL error, a cuBLAS status, an op/dtype it was not built for) it
 * calls em__kernel_error and returns. The error becomes the process's sticky
 * error, which the next em_sync, em_to_host or em_item returns; its message
 * names the op, the device (cpu / cuda:N / opencl:N and the worker) and the
 * operand shapes and dtypes. The outputs of a failed kernel are undefined;
 * the process goes on. */
#ifndef EMBER_DEVICES_KERROR_H
#define EMBER_DEVICES_KERROR_H

#include "devices/kargs.h"
#include "ember/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Records a failure of the kernel described by @p k (NULL: the kernel the
 *  calling worker is running, as set by the dispatcher). @p fmt says what
 *  failed ("CUDA error in copy (memcpy): out of memory"). Only the first
 *  error until the next report is kept; later ones are counted. */
void em__kernel_error(const em_kargs *k, em_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
