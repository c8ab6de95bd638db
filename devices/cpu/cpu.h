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

/* f16 / bf16 <-> f32 (devices/half.h, the same bits on every backend). */
#include "devices/half_host.h"
/* A float of a 16-bit float dtype's bits, and back. */
static inline float em_cpu_half_load(int dt, uint16_t h) { return dt == EM_BF16 ? em_bf16_bits_to_f32(h) : em_f16_bits_to_f32(h); }
static inline uint16_t em_cpu_half_store(int dt, float f) { return dt == EM_BF16 ? em_f32_to_bf16_bits(f) : em_f32_to_f16_bits(f); }

/* A kernel reached with an op kind or dtype it does not handle is an Ember
 * bug (front ends validate): it becomes the sticky error of the op (its
 * output is left undefined; devices/devices.h), never a crash. Callers return
 * right after it. */
static inline void em_cpu_bad_kind(const char *where, int kind)
{
    em__kernel_error(NULL, EM_ERR_RUNTIME, "internal error: CPU kernel %s got unsupported op/dtype %d", where, kind);
}

#endif
