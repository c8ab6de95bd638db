/* Ember OpenCL kernels: shared definitions, first in the program
 * (cmake/embed_cl.cmake concatenates the files in the order below).
 *
 * The host prepends "#define EM_OP_<KIND> <n>" for every op of tasks/ops.def
 * and "#define EM_DT_<DTYPE> <n>" for the dtypes (F32=0 F64=1 I32=2 I64=3
 * U8=4 BOOL=5 F16=6 BF16=7), and -DEM_TILE=<n> (matmul tile edge);
 * -DEM_NO_FP64 turns double support off even when the device has it (tests
 * use this to check the host fallback).
 *
 * Program order (CMakeLists.txt): this file, devices/ew_math.h,
 * devices/half.h (the f16 / bf16 converters), devices/opencl/dtype.cl (loads
 * and stores through a runtime dtype), then the other .cl files in name
 * order.
 *
 * f16 / bf16 are storage types: a kernel loads the 16 bits as ushort,
 * converts them with devices/half.h (the CPU's and CUDA's converters, so the
 * bits are the same everywhere), computes in float and converts back. No
 * cl_khr_fp16 is needed.
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

/* What devices/ew_math.h and devices/half.h (embedded next) need. */
#define EW_FN inline
typedef long em_i64;
typedef ulong em_u64;
typedef uint em_u32;
typedef ushort em_u16;
#define EM_F2U(f) as_uint(f)
#define EM_U2F(u) as_float(u)

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

/* Philox4x32-10 exactly as devices/philox.h (counter, 64-bit seed as key):
 * the random numbers of fill.cl's rand and of attention.cl's dropout. */
inline void em_philox4x32_10(ulong counter, ulong seed, uint *out)
{
    uint c0 = (uint)counter, c1 = (uint)(counter >> 32), c2 = 0, c3 = 0;
    uint k0 = (uint)seed, k1 = (uint)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        const ulong p0 = (ulong)0xD2511F53u * c0;
        const ulong p1 = (ulong)0xCD9E8D57u * c2;
        const uint n0 = (uint)(p1 >> 32) ^ c1 ^ k0;
        const uint n1 = (uint)p1;
        const uint n2 = (uint)(p0 >> 32) ^ c3 ^ k1;
        const uint n3 = (uint)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}
