/* The setting in which the element-wise expressions of tasks/ops.def compile
 * as CUDA C++: the helpers of devices/ew_math.h for float and double, with
 * float / double overloads of each (exp(x), fmod(a, b), ... are CUDA's own
 * overloads). Included inside an anonymous namespace by the CUDA kernels that
 * render the expressions: devices/cuda/elementwise.cu (one kernel per kind)
 * and devices/cuda/fused.cu (fused chains). */
#ifndef EMBER_CUDA_EW_EXPR_CUH
#define EMBER_CUDA_EW_EXPR_CUH

#define EW_FN __device__ __forceinline__ static
typedef long long em_i64;
typedef unsigned long long em_u64;
#include "devices/ew_math.h"
EM_EW_FLOAT_HELPERS(float, f32)
EM_EW_FLOAT_HELPERS(double, f64)
#define EW_OVERLOAD_1(nm) \
    __device__ __forceinline__ float em_##nm(float x) { return em_##nm##_f32(x); } \
    __device__ __forceinline__ double em_##nm(double x) { return em_##nm##_f64(x); }
#define EW_OVERLOAD_2(nm) \
    __device__ __forceinline__ float em_##nm(float a, float b) { return em_##nm##_f32(a, b); } \
    __device__ __forceinline__ double em_##nm(double a, double b) { return em_##nm##_f64(a, b); }
#define EW_OVERLOAD(nm, arity) EW_OVERLOAD_##arity(nm)
EM_EW_FLOAT_HELPER_LIST(EW_OVERLOAD)

#endif
