/* Shared helpers for CPU kernels. */
#ifndef EMBER_CPU_H
#define EMBER_CPU_H

#include "devices/cpu/iter.h"
#include "devices/kargs.h"
#include "devices/devices.h"

#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>

/* Base pointer of a byte-vector StarPU buffer. */
static inline void *em_cpu_ptr(void *iface) { return (void *)STARPU_VECTOR_GET_PTR(iface); }

static inline size_t em_cpu_dtype_size(int dt) { return em_dtype_size((em_dtype)dt); }

/* A kernel reached with an op kind or dtype it does not handle is an Ember
 * bug (front ends validate): it becomes the sticky error of the op (its
 * output is left undefined; devices/devices.h), never a crash. Callers return
 * right after it. */
static inline void em_cpu_bad_kind(const char *where, int kind)
{
    em__kernel_error(NULL, EM_ERR_RUNTIME, "internal error: CPU kernel %s got unsupported op/dtype %d", where, kind);
}

#endif
