/* devices/half.h's f16 / bf16 <-> f32 converters for host C code: the CPU
 * kernels (devices/cpu/cpu.h), the runtime's printing and em_item
 * (runtime/tensor.c), the tests. Supplies what half.h asks of its includer
 * (EW_FN, em_u32, em_u16, EM_F2U, EM_U2F) with memcpy bit casts. */
#ifndef EMBER_HALF_HOST_H
#define EMBER_HALF_HOST_H

#include <stdint.h>
#include <string.h>

static inline uint32_t em_half_host_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float em_half_host_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#ifndef EW_FN
#define EW_FN static inline
#endif
typedef uint32_t em_u32;
typedef uint16_t em_u16;
#define EM_F2U(f) em_half_host_f2u(f)
#define EM_U2F(u) em_half_host_u2f(u)
#include "devices/half.h"

#endif
