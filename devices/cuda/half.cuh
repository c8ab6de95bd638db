/* f16 / bf16 on the CUDA side: devices/half.h's converters (the CPU's and
 * OpenCL's bits: round to nearest even, the CPU's NaN and overflow rules;
 * __float2half_rn differs on NaN) as device functions, and H16, the
 * load/store pair of one 16-bit dtype chosen at run time, so a kernel is
 * instantiated once for both (storage uint16_t, the bits), not once per
 * dtype. C++ (nvcc) only; include after emcuda.h. */
#ifndef EMBER_CUDA_HALF_CUH
#define EMBER_CUDA_HALF_CUH

#include <stdint.h>

#ifndef EW_FN /* elementwise.cu defines it the same way for devices/ew_math.h */
#define EW_FN __device__ __forceinline__ static
#define EMC_HALF_OWN_EW_FN
#endif
typedef uint32_t em_u32;
typedef uint16_t em_u16;
#define EM_F2U(f) __float_as_uint(f)
#define EM_U2F(u) __uint_as_float(u)
#include "devices/half.h"
#ifdef EMC_HALF_OWN_EW_FN
#undef EW_FN
#undef EMC_HALF_OWN_EW_FN
#endif

namespace emc {

inline bool is_half_dtype(int dt) { return dt == EM_F16 || dt == EM_BF16; }

/* The 16-bit float dtype of an operand, picked at run time (a uniform
 * branch per element: the kernels stay memory-bound). */
struct H16 {
    bool bf; /* true: bf16, false: f16 */
    __device__ __forceinline__ float ld(uint16_t h) const { return bf ? em_bf16_bits_to_f32(h) : em_f16_bits_to_f32(h); }
    __device__ __forceinline__ uint16_t st(float v) const { return bf ? em_f32_to_bf16_bits(v) : em_f32_to_f16_bits(v); }
};
inline H16 h16_of(int dt) { return H16{dt == EM_BF16}; }

/* (double)f and (float)d with the CPU's (x86 SSE) NaN results: sign and
 * payload kept, the NaN made quiet; other values as the plain conversions.
 * The casts that go through double (devices/cpu/elementwise.c load_d /
 * store_d, the fills) then give the CPU's bits for NaNs too, whatever the
 * device's cvt makes of them (f16 keeps a NaN's sign). */
__device__ __forceinline__ double f2d_as_cpu(float f)
{
    if (!isnan(f)) return (double)f;
    const uint32_t w = __float_as_uint(f);
    return __longlong_as_double((long long)(((unsigned long long)(w >> 31) << 63) | 0x7ff8000000000000ull |
                                            ((unsigned long long)(w & 0x3fffffu) << 29)));
}
__device__ __forceinline__ float d2f_as_cpu(double d)
{
    if (!isnan(d)) return (float)d;
    const unsigned long long b = (unsigned long long)__double_as_longlong(d);
    return __uint_as_float((uint32_t)((b >> 63) << 31) | 0x7fc00000u | (uint32_t)((b >> 29) & 0x3fffffu));
}

} // namespace emc

#endif
