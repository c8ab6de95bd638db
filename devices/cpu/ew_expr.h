/* The setting in which the element-wise expressions of tasks/ops.def compile
 * as CPU C: the helpers of devices/ew_math.h for float and double, picked by
 * type as tgmath.h picks exp(x), fmod(a, b), ... (CUDA and OpenCL overload
 * them). Included by the CPU kernels that render the expressions:
 * devices/cpu/elementwise.c (one kernel per kind) and devices/cpu/fused.c
 * (fused chains). Include after <tgmath.h>. */
#ifndef EMBER_CPU_EW_EXPR_H
#define EMBER_CPU_EW_EXPR_H

/* Helpers of the expressions (devices/ew_math.h); tgmath.h makes exp(x),
 * fmod(a, b), ... pick the float or double function, as in CUDA and OpenCL. */
#define EW_FN static inline
typedef int64_t em_i64;
typedef uint64_t em_u64;
#include "devices/ew_math.h"
EM_EW_FLOAT_HELPERS(float, f32)
EM_EW_FLOAT_HELPERS(double, f64)
#define em_pymod(a_, b_) _Generic((a_), float: em_pymod_f32, default: em_pymod_f64)(a_, b_)
#define em_floordiv(a_, b_) _Generic((a_), float: em_floordiv_f32, default: em_floordiv_f64)(a_, b_)
#define em_erfinv(x_) _Generic((x_), float: em_erfinv_f32, default: em_erfinv_f64)(x_)
#define em_tanhsat(x_) _Generic((x_), float: em_tanhsat_f32, default: em_tanhsat_f64)(x_)
#define em_xexpn(x_) _Generic((x_), float: em_xexpn_f32, default: em_xexpn_f64)(x_)
#define em_geluc(x_) _Generic((x_), float: em_geluc_f32, default: em_geluc_f64)(x_)
#define EW_NA (T)0 /* placeholder of F_FLOAT kinds: their integer case is never run */

#endif
