/* Ember OpenCL kernels: shared definitions. This file must sort first among
 * devices/opencl/<name>.cl files (cmake/embed_cl.cmake concatenates them in name order).
 *
 * The host prepends "#define EM_OP_<KIND> <n>" for every op of tasks/ops.def
 * and "#define EM_DT_<DTYPE> <n>" for the dtypes (F32=0 F64=1 I32=2 I64=3
 * U8=4 BOOL=5), and -DEM_TILE=<n> (matmul tile edge); -DEM_NO_FP64 turns
 * double support off even when the device has it (tests use this to check
 * the host fallback).
 *
 * Conventions of every kernel:
 *   - a buffer is passed as (__global uchar *base, long boff): base is the
 *     StarPU cl_mem, boff its byte offset (STARPU_VECTOR_GET_OFFSET);
 *   - element offsets/strides are in elements of the operand's dtype, shapes
 *     and strides of up to 8 dims travel as long8 (unused lanes 0);
 *   - 1-D kernels are grid-stride loops over n items, so any global size works;
 *   - nothing reads or writes outside the element set the descriptors name.
 *
 * Floating point: FP_CONTRACT is OFF (no silent a*b+c -> fma), so arithmetic
 * sequences give the same roundings as the CPU reference kernels (gcc on
 * x86-64 does not contract either); the host builds with
 * -cl-fp32-correctly-rounded-divide-sqrt when the device supports it. */
#pragma OPENCL FP_CONTRACT OFF

#if defined(cl_khr_fp64) && !defined(EM_NO_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define EM_FP64 1
typedef double acc_t;
#define ACC_INF ((double)INFINITY)
#else
typedef float acc_t;
#define ACC_INF INFINITY
#endif

#define EM_MAXD 8

/* What devices/ew_math.h (embedded next) needs. */
#define EW_FN inline
typedef long em_i64;
typedef ulong em_u64;

/* Unpacks a long8 into a private array. */
#define EM_UNPACK(arr, v) long arr[EM_MAXD]; vstore8((v), 0, arr)

/* Linear index i of a collapsed shape -> element offsets of 1..4 operands. */
#define EM_OFFS1(i, nd, sh, s0, e0, o0)                                                          \
    long o0 = (e0);                                                                              \
    {                                                                                            \
        long r_ = (i);                                                                           \
        for (int d_ = (nd) - 1; d_ > 0; d_--) {                                                  \
            long c_ = r_ % sh[d_];                                                               \
            r_ /= sh[d_];                                                                        \
            o0 += c_ * s0[d_];                                                                   \
        }                                                                                        \
        o0 += r_ * s0[0];                                                                        \
    }
#define EM_OFFS2(i, nd, sh, s0, e0, o0, s1, e1, o1)                                              \
    long o0 = (e0), o1 = (e1);                                                                   \
    {                                                                                            \
        long r_ = (i);                                                                           \
        for (int d_ = (nd) - 1; d_ > 0; d_--) {                                                  \
            long c_ = r_ % sh[d_];                                                               \
            r_ /= sh[d_];                                                                        \
            o0 += c_ * s0[d_];                                                                   \
            o1 += c_ * s1[d_];                                                                   \
        }                                                                                        \
        o0 += r_ * s0[0];                                                                        \
        o1 += r_ * s1[0];                                                                        \
    }
#define EM_OFFS3(i, nd, sh, s0, e0, o0, s1, e1, o1, s2, e2, o2)                                  \
    long o0 = (e0), o1 = (e1), o2 = (e2);                                                        \
    {                                                                                            \
        long r_ = (i);                                                                           \
        for (int d_ = (nd) - 1; d_ > 0; d_--) {                                                  \
            long c_ = r_ % sh[d_];                                                               \
            r_ /= sh[d_];                                                                        \
            o0 += c_ * s0[d_];                                                                   \
            o1 += c_ * s1[d_];                                                                   \
            o2 += c_ * s2[d_];                                                                   \
        }                                                                                        \
        o0 += r_ * s0[0];                                                                        \
        o1 += r_ * s1[0];                                                                        \
        o2 += r_ * s2[0];                                                                        \
    }
#define EM_OFFS4(i, nd, sh, s0, e0, o0, s1, e1, o1, s2, e2, o2, s3, e3, o3)                      \
    long o0 = (e0), o1 = (e1), o2 = (e2), o3 = (e3);                                             \
    {                                                                                            \
        long r_ = (i);                                                                           \
        for (int d_ = (nd) - 1; d_ > 0; d_--) {                                                  \
            long c_ = r_ % sh[d_];                                                               \
            r_ /= sh[d_];                                                                        \
            o0 += c_ * s0[d_];                                                                   \
            o1 += c_ * s1[d_];                                                                   \
            o2 += c_ * s2[d_];                                                                   \
            o3 += c_ * s3[d_];                                                                   \
        }                                                                                        \
        o0 += r_ * s0[0];                                                                        \
        o1 += r_ * s1[0];                                                                        \
        o2 += r_ * s2[0];                                                                        \
        o3 += r_ * s3[0];                                                                        \
    }

/* One strided operand: base, byte offset, element offset, strides. */
#define EM_OPND(p) __global const uchar *p##b, long p##boff, long p##e, long8 p##st
#define EM_OPND_W(p) __global uchar *p##b, long p##boff, long p##e, long8 p##st

#define EM_GRID_LOOP(i, n) for (long i = get_global_id(0); i < (n); i += get_global_size(0))

/* Work-group tree sum of v (power-of-two work-group; every work-item gets
 * the sum; lv holds one acc_t per work-item). Used by the reductions and the
 * batch-norm kernels. */
inline acc_t em_tree_sum(__local acc_t *lv, acc_t v)
{
    const int lid = get_local_id(0), wg = get_local_size(0);
    lv[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = wg >> 1; s > 0; s >>= 1) {
        if (lid < s) lv[lid] += lv[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    acc_t r = lv[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* Typed loads/stores through a runtime dtype (uniform branches). */
inline acc_t em_ld_acc(int dt, __global const uchar *b, long i)
{
    switch (dt) {
    case EM_DT_F32: return (acc_t)((__global const float *)b)[i];
#ifdef EM_FP64
    case EM_DT_F64: return ((__global const double *)b)[i];
#endif
    case EM_DT_I32: return (acc_t)((__global const int *)b)[i];
    case EM_DT_I64: return (acc_t)((__global const long *)b)[i];
    default: return (acc_t)b[i];
    }
}

/* As the CPU's ldi: floats truncate toward zero. */
inline long em_ld_long(int dt, __global const uchar *b, long i)
{
    switch (dt) {
    case EM_DT_I32: return ((__global const int *)b)[i];
    case EM_DT_I64: return ((__global const long *)b)[i];
    case EM_DT_F32: return (long)((__global const float *)b)[i];
#ifdef EM_FP64
    case EM_DT_F64: return (long)((__global const double *)b)[i];
#endif
    default: return b[i];
    }
}

/* As the CPU reduce's st(): use_i picks the integer value. */
inline void em_st_val(int dt, __global uchar *b, long i, acc_t v, long iv, int use_i)
{
    switch (dt) {
    case EM_DT_F32: ((__global float *)b)[i] = (float)v; break;
#ifdef EM_FP64
    case EM_DT_F64: ((__global double *)b)[i] = v; break;
#endif
    case EM_DT_I32: ((__global int *)b)[i] = use_i ? (int)iv : (int)v; break;
    case EM_DT_I64: ((__global long *)b)[i] = use_i ? iv : (long)v; break;
    case EM_DT_U8: b[i] = use_i ? (uchar)iv : (uchar)(long)v; break;
    default: b[i] = use_i ? (iv != 0) : (v != 0); break;
    }
}

inline int em_dt_is_int(int dt) { return dt == EM_DT_I32 || dt == EM_DT_I64 || dt == EM_DT_U8 || dt == EM_DT_BOOL; }
