/* CUDA kernels: element-wise unary / tensor-scalar / binary / where / copy+cast.
 *
 * Contracts (the same as devices/cpu/elementwise.c, whose expressions are
 * reproduced here one for one):
 *   unary  (NEG..GE_SCALAR)  in[0] x, out[0] y: one shape; x strided (may be a
 *          stride-0 broadcast view), y strided. dtype(y) = dtype(x), or bool
 *          for F_CMP kinds. Scalars p.s.a / p.s.b are rounded to x's dtype
 *          (integer comparisons use the doubles) exactly as on the CPU.
 *   binary (ADD..LOGICAL_OR) in[0] a, in[1] b (same dtype, already broadcast to
 *          out's shape with stride-0 views), out[0] y (a's dtype or bool).
 *   where  in[0] mask (bool), in[1] a, in[2] b, out[0] y: all of y's shape,
 *          a, b, y of one dtype (any element size 1/2/4/8).
 *   copy   in[0] x, out[0] y of one shape, any dtypes: y = (dtype(y)) x with
 *          the CPU's conversion rules (ints go through int64, floats through
 *          double; to bool is != 0; to f16/bf16 through f32, then rounded to
 *          nearest even by devices/half.h, bit-identical to the CPU); y may
 *          be a strided view into a larger storage and only its elements are
 *          written.
 * dtypes: f32, f64, f16, bf16, i32, i64, u8, bool (bool computes as u8,
 * except ADD = or, MUL = and, as the CPU kernel). f16 / bf16 are storage
 * types: each element is loaded as float (devices/half.h, exact), the f32
 * expression computed, and the result rounded back (comparisons give bool);
 * the two 16-bit dtypes share one instantiation (H16, devices/cuda/half.cuh),
 * a and b of a binary op and x and y of a non-comparison unary op have the
 * same 16-bit dtype (the front ends promote f16 with bf16 to f32).
 *
 * Paths: after merging dims that are contiguous in every operand, a fully
 * contiguous f32 op is one flat grid-stride loop (f32 -> f32 with float4
 * loads and stores when all pointers are 16-byte aligned), a contiguous
 * f16/bf16 -> same-dtype op with 16-byte aligned pointers moves 8 elements
 * (16 bytes) per step; anything else (other dtypes, contiguous or not) walks
 * the N-d index (one dim when contiguous) with 32-bit arithmetic when every
 * offset fits, 64-bit otherwise. Contiguous f32 <-> f16/bf16 casts move 4
 * elements per thread and step (float4 / 8 bytes) when aligned. */
#include "devices/cuda/emcuda.h"
#include "devices/cuda/half.cuh"

#include <type_traits>

using namespace emc;

namespace {

/* ---- the expressions of tasks/ops.def ---------------------------------------
 * exp(x), fmod(a, b), ... resolve to CUDA's float or double overloads; the
 * helpers come from devices/ew_math.h, shared with the CPU and OpenCL. */

#include "devices/cuda/ew_expr.cuh"
#define EW_NA (T)0 /* placeholder of F_FLOAT kinds: never run on integers */

template <typename T> __host__ __device__ constexpr bool is_fp() { return std::is_same<T, float>::value || std::is_same<T, double>::value; }

/* The unsigned tensor types make some integer expressions compare with 0. */
#pragma nv_diag_suppress 186

/* Whether the functor instantiation <T, OT> can be launched with a kind of
 * flags @p fl: the host picks OT = uint8_t for F_CMP kinds and OT = T for
 * the others, so apart from u8/bool (both in one) an instantiation compiles
 * only its own half of the cases; the other half returns 0, never run
 * (a third of the element-wise code less). */
template <typename T, typename OT> __host__ __device__ constexpr bool ew_runs(unsigned fl)
{
    return std::is_same<T, uint8_t>::value || (((fl & F_CMP) != 0) == std::is_same<OT, uint8_t>::value);
}

/* ---- unary functor ---------------------------------------------------------- */

/* y = f(x) for op kind `kind`, one case per EW1 line of tasks/ops.def; OT = T,
 * or uint8_t for F_CMP kinds. The host launches only EW1 kinds (unary_t). */
template <typename T, typename OT> struct UnaryF {
    int kind;
    T sa, sb;
    double da, db;

    __device__ __forceinline__ OT operator()(T x) const
    {
        if constexpr (is_fp<T>()) {
            switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw)                                   \
    case EM_OP_##E:                                                  \
        if constexpr (ew_runs<T, OT>(fl)) return (OT)(fx);           \
        else return (OT)0;
#include "tasks/ops.def"
            default: return (OT)0;
            }
        } else {
            switch (kind) {
#define EW1(E, nm, fl, fx, ix, bw)                                   \
    case EM_OP_##E:                                                  \
        if constexpr (ew_runs<T, OT>(fl)) return (OT)(ix);           \
        else return (OT)0;
#include "tasks/ops.def"
            default: return (OT)0;
            }
        }
    }
};

/* ---- binary functor --------------------------------------------------------- */

template <typename T, typename OT> struct BinaryF {
    int kind;
    bool is_bool; /* bool operands: ADD = or, MUL = and */

    __device__ __forceinline__ OT operator()(T a, T b) const
    {
        if constexpr (is_fp<T>()) {
            switch (kind) {
#define EW2(E, nm, fl, fx, ix, bw)                                   \
    case EM_OP_##E:                                                  \
        if constexpr (ew_runs<T, OT>(fl)) return (OT)(fx);           \
        else return (OT)0;
#include "tasks/ops.def"
            default: return (OT)0;
            }
        } else {
            if (is_bool) {
                if (kind == EM_OP_ADD) return (OT)((a != 0) || (b != 0));
                if (kind == EM_OP_MUL) return (OT)((a != 0) && (b != 0));
            }
            switch (kind) {
#define EW2(E, nm, fl, fx, ix, bw)                                   \
    case EM_OP_##E:                                                  \
        if constexpr (ew_runs<T, OT>(fl)) return (OT)(ix);           \
        else return (OT)0;
#include "tasks/ops.def"
            default: return (OT)0;
            }
        }
    }
};

/* ---- f16 / bf16 storage around the float functors ------------------------- */

/* x (16-bit bits) -> f(float x), rounded back to x's dtype unless OT is
 * uint8_t (a comparison's bool). */
template <typename F, typename OT> struct HalfUnaryF {
    F f;
    H16 h;
    __device__ __forceinline__ OT operator()(uint16_t x) const
    {
        if constexpr (std::is_same<OT, uint16_t>::value) return h.st(f(h.ld(x)));
        else return f(h.ld(x));
    }
};
template <typename F, typename OT> struct HalfBinaryF {
    F f;
    H16 h;
    __device__ __forceinline__ OT operator()(uint16_t a, uint16_t b) const
    {
        if constexpr (std::is_same<OT, uint16_t>::value) return h.st(f(h.ld(a), h.ld(b)));
        else return f(h.ld(a), h.ld(b));
    }
};

/* ---- generic kernels -------------------------------------------------------- */

template <typename T, typename OT, typename F>
__global__ void k_map1_flat(const T *__restrict__ x, OT *__restrict__ y, int64_t n, F f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = f(x[i]);
}

template <typename F>
__global__ void k_map1_f4(const float *__restrict__ x, float *__restrict__ y, int64_t n, F f)
{
    const int64_t n4 = n / 4;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float4 *y4 = reinterpret_cast<float4 *>(y);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = f(v.x);
        v.y = f(v.y);
        v.z = f(v.z);
        v.w = f(v.w);
        y4[i] = v;
    }
    for (int64_t i = n4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f(x[i]);
}

/* 16-bit -> 16-bit, 8 elements (16 bytes) per thread and step; x, y 16-byte aligned. */
__device__ __forceinline__ uint32_t u16_pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

template <typename F>
__global__ void k_map1_h8(const uint16_t *__restrict__ x, uint16_t *__restrict__ y, int64_t n, F f)
{
    const int64_t n8 = n / 8;
    const uint4 *x8 = reinterpret_cast<const uint4 *>(x);
    uint4 *y8 = reinterpret_cast<uint4 *>(y);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
        const uint4 v = x8[i];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; j++) r[j] = u16_pair(f((uint16_t)(w[j] & 0xffffu)), f((uint16_t)(w[j] >> 16)));
        y8[i] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    for (int64_t i = n8 * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f(x[i]);
}

/* operand 0 = y, 1 = x */
template <typename T, typename OT, typename IT, typename F>
__global__ void k_map1_nd(Geom g, const T *__restrict__ x, OT *__restrict__ y, F f)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[2];
        geom_offsets<2, IT>(g, i, off);
        y[off[0]] = f(x[off[1]]);
    }
}

template <typename T, typename OT, typename F>
__global__ void k_map2_flat(const T *__restrict__ a, const T *__restrict__ b, OT *__restrict__ y, int64_t n, F f)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = f(a[i], b[i]);
}

template <typename F>
__global__ void k_map2_f4(const float *__restrict__ a, const float *__restrict__ b, float *__restrict__ y, int64_t n, F f)
{
    const int64_t n4 = n / 4;
    const float4 *a4 = reinterpret_cast<const float4 *>(a);
    const float4 *b4 = reinterpret_cast<const float4 *>(b);
    float4 *y4 = reinterpret_cast<float4 *>(y);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 u = a4[i], v = b4[i], r;
        r.x = f(u.x, v.x);
        r.y = f(u.y, v.y);
        r.z = f(u.z, v.z);
        r.w = f(u.w, v.w);
        y4[i] = r;
    }
    for (int64_t i = n4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f(a[i], b[i]);
}

template <typename F>
__global__ void k_map2_h8(const uint16_t *__restrict__ a, const uint16_t *__restrict__ b, uint16_t *__restrict__ y, int64_t n, F f)
{
    const int64_t n8 = n / 8;
    const uint4 *a8 = reinterpret_cast<const uint4 *>(a);
    const uint4 *b8 = reinterpret_cast<const uint4 *>(b);
    uint4 *y8 = reinterpret_cast<uint4 *>(y);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
        const uint4 u = a8[i], v = b8[i];
        const uint32_t wa[4] = {u.x, u.y, u.z, u.w}, wb[4] = {v.x, v.y, v.z, v.w};
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            r[j] = u16_pair(f((uint16_t)(wa[j] & 0xffffu), (uint16_t)(wb[j] & 0xffffu)),
                            f((uint16_t)(wa[j] >> 16), (uint16_t)(wb[j] >> 16)));
        y8[i] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    for (int64_t i = n8 * 8 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = f(a[i], b[i]);
}

/* operand 0 = y, 1 = a, 2 = b */
template <typename T, typename OT, typename IT, typename F>
__global__ void k_map2_nd(Geom g, const T *__restrict__ a, const T *__restrict__ b, OT *__restrict__ y, F f)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[3];
        geom_offsets<3, IT>(g, i, off);
        y[off[0]] = f(a[off[1]], b[off[2]]);
    }
}

/* operand 0 = y, 1 = mask, 2 = a, 3 = b */
template <typename T, typename IT>
__global__ void k_where_nd(Geom g, const uint8_t *__restrict__ m, const T *__restrict__ a, const T *__restrict__ b,
                           T *__restrict__ y)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[4];
        geom_offsets<4, IT>(g, i, off);
        y[off[0]] = m[off[1]] ? a[off[2]] : b[off[3]];
    }
}

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Contiguous: f32 with float4 when aligned, else flat; f16/bf16 -> the same
 * dtype with 8 elements (16 bytes) per step when aligned. Everything else,
 * contiguous or not, takes the N-d path (one dim when contiguous: the same
 * addresses; no flat kernel per dtype keeps the object small). */
template <typename T, typename OT, typename F>
void launch_map1(const Geom &g, const T *x, OT *y, F f, const char *what)
{
    if (g.n == 0) return;
    cudaStream_t s = stream();
    if (geom_contig(g)) {
        if constexpr (std::is_same<T, float>::value) {
            if constexpr (std::is_same<OT, float>::value) {
                if (aligned16(x) && aligned16(y)) {
                    k_map1_f4<<<grid_for((g.n + 3) / 4), kThreads, 0, s>>>(x, y, g.n, f);
                    check_launch(what);
                    return;
                }
            }
            k_map1_flat<<<grid_for(g.n), kThreads, 0, s>>>(x, y, g.n, f);
            check_launch(what);
            return;
        } else if constexpr (std::is_same<T, uint16_t>::value && std::is_same<OT, uint16_t>::value) {
            if (aligned16(x) && aligned16(y)) {
                k_map1_h8<<<grid_for((g.n + 7) / 8), kThreads, 0, s>>>(x, y, g.n, f);
                check_launch(what);
                return;
            }
        }
    }
    if (geom_fits32(g)) {
        k_map1_nd<T, OT, int32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, x, y, f);
    } else {
        k_map1_nd<T, OT, int64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, x, y, f);
    }
    check_launch(what);
}

/* The paths of launch_map1. */
template <typename T, typename OT, typename F>
void launch_map2(const Geom &g, const T *a, const T *b, OT *y, F f, const char *what)
{
    if (g.n == 0) return;
    cudaStream_t s = stream();
    if (geom_contig(g)) {
        if constexpr (std::is_same<T, float>::value) {
            if constexpr (std::is_same<OT, float>::value) {
                if (aligned16(a) && aligned16(b) && aligned16(y)) {
                    k_map2_f4<<<grid_for((g.n + 3) / 4), kThreads, 0, s>>>(a, b, y, g.n, f);
                    check_launch(what);
                    return;
                }
            }
            k_map2_flat<<<grid_for(g.n), kThreads, 0, s>>>(a, b, y, g.n, f);
            check_launch(what);
            return;
        } else if constexpr (std::is_same<T, uint16_t>::value && std::is_same<OT, uint16_t>::value) {
            if (aligned16(a) && aligned16(b) && aligned16(y)) {
                k_map2_h8<<<grid_for((g.n + 7) / 8), kThreads, 0, s>>>(a, b, y, g.n, f);
                check_launch(what);
                return;
            }
        }
    }
    if (geom_fits32(g)) {
        k_map2_nd<T, OT, int32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, a, b, y, f);
    } else {
        k_map2_nd<T, OT, int64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, a, b, y, f);
    }
    check_launch(what);
}

template <typename T> void unary_t(const em_kargs *k, void *buffers[])
{
    const em_tdesc &in = k->in[0], &out = k->out[0];
    const int64_t *st[2] = {out.strides, in.strides};
    Geom g = make_geom(out.ndim, out.shape, 2, st);
    const T *x = (const T *)base(buffers, 0, in);
    if (is_cmp(k->kind) && !std::is_same<T, uint8_t>::value) {
        UnaryF<T, uint8_t> f{k->kind, (T)k->p.s.a, (T)k->p.s.b, k->p.s.a, k->p.s.b};
        launch_map1(g, x, (uint8_t *)base(buffers, 1, out), f, "unary");
    } else {
        UnaryF<T, T> f{k->kind, (T)k->p.s.a, (T)k->p.s.b, k->p.s.a, k->p.s.b};
        launch_map1(g, x, (T *)base(buffers, 1, out), f, "unary");
    }
}

template <typename T> void binary_t(const em_kargs *k, void *buffers[])
{
    const em_tdesc &a = k->in[0], &b = k->in[1], &out = k->out[0];
    const int64_t *st[3] = {out.strides, a.strides, b.strides};
    Geom g = make_geom(out.ndim, out.shape, 3, st);
    const T *pa = (const T *)base(buffers, 0, a), *pb = (const T *)base(buffers, 1, b);
    const bool is_bool = a.dtype == EM_BOOL;
    if (is_cmp(k->kind) && !std::is_same<T, uint8_t>::value) {
        BinaryF<T, uint8_t> f{k->kind, is_bool};
        launch_map2(g, pa, pb, (uint8_t *)base(buffers, 2, out), f, "binary");
    } else {
        BinaryF<T, T> f{k->kind, is_bool};
        launch_map2(g, pa, pb, (T *)base(buffers, 2, out), f, "binary");
    }
}

/* f16 / bf16: the float functors between 16-bit loads and stores (x and y, or
 * a, b and y, of one 16-bit dtype; comparisons give bool). */
void unary_h(const em_kargs *k, void *buffers[])
{
    const em_tdesc &in = k->in[0], &out = k->out[0];
    const bool cmp = is_cmp(k->kind);
    if (cmp ? out.dtype != EM_BOOL : out.dtype != in.dtype) {
        unsupported("unary (f16/bf16 output dtype)", out.dtype);
        return;
    }
    const int64_t *st[2] = {out.strides, in.strides};
    Geom g = make_geom(out.ndim, out.shape, 2, st);
    const uint16_t *x = (const uint16_t *)base(buffers, 0, in);
    const H16 h = h16_of(in.dtype);
    if (cmp) {
        HalfUnaryF<UnaryF<float, uint8_t>, uint8_t> f{{k->kind, (float)k->p.s.a, (float)k->p.s.b, k->p.s.a, k->p.s.b}, h};
        launch_map1(g, x, (uint8_t *)base(buffers, 1, out), f, "unary");
    } else {
        HalfUnaryF<UnaryF<float, float>, uint16_t> f{{k->kind, (float)k->p.s.a, (float)k->p.s.b, k->p.s.a, k->p.s.b}, h};
        launch_map1(g, x, (uint16_t *)base(buffers, 1, out), f, "unary");
    }
}

void binary_h(const em_kargs *k, void *buffers[])
{
    const em_tdesc &a = k->in[0], &b = k->in[1], &out = k->out[0];
    const bool cmp = is_cmp(k->kind);
    if (b.dtype != a.dtype || (cmp ? out.dtype != EM_BOOL : out.dtype != a.dtype)) {
        unsupported("binary (f16/bf16 operand dtypes)", b.dtype != a.dtype ? b.dtype : out.dtype);
        return;
    }
    const int64_t *st[3] = {out.strides, a.strides, b.strides};
    Geom g = make_geom(out.ndim, out.shape, 3, st);
    const uint16_t *pa = (const uint16_t *)base(buffers, 0, a), *pb = (const uint16_t *)base(buffers, 1, b);
    const H16 h = h16_of(a.dtype);
    if (cmp) {
        HalfBinaryF<BinaryF<float, uint8_t>, uint8_t> f{{k->kind, false}, h};
        launch_map2(g, pa, pb, (uint8_t *)base(buffers, 2, out), f, "binary");
    } else {
        HalfBinaryF<BinaryF<float, float>, uint16_t> f{{k->kind, false}, h};
        launch_map2(g, pa, pb, (uint16_t *)base(buffers, 2, out), f, "binary");
    }
}

/* ---- copy / cast ------------------------------------------------------------ */

template <typename T, typename IT>
__global__ void k_copy_nd(Geom g, const T *__restrict__ x, T *__restrict__ y)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[2];
        geom_offsets<2, IT>(g, i, off);
        y[off[0]] = x[off[1]];
    }
}

__device__ __forceinline__ bool is_int_dt(int dt) { return dt == EM_I32 || dt == EM_I64 || dt == EM_U8 || dt == EM_BOOL; }
__device__ __forceinline__ bool is_h16_dt(int dt) { return dt == EM_F16 || dt == EM_BF16; }

/* One element converted as devices/cpu/elementwise.c em_cpu_copy does. */
__device__ __forceinline__ void cast_one(int idt, int odt, const char *xp, char *yp)
{
    const bool int_src = is_int_dt(idt);
    int64_t iv = 0;
    double v;
    if (int_src) {
        if (idt == EM_I64) iv = *(const int64_t *)xp;
        else if (idt == EM_I32) iv = *(const int32_t *)xp;
        else iv = *(const uint8_t *)xp;
        v = (double)iv;
    } else if (is_h16_dt(idt)) {
        v = f2d_as_cpu(H16{idt == EM_BF16}.ld(*(const uint16_t *)xp));
    } else {
        v = idt == EM_F32 ? f2d_as_cpu(*(const float *)xp) : *(const double *)xp;
    }
    switch (odt) {
    case EM_F32: *(float *)yp = d2f_as_cpu(v); break;
    case EM_F64: *(double *)yp = v; break;
    case EM_F16:
    case EM_BF16: *(uint16_t *)yp = H16{odt == EM_BF16}.st(int_src ? (float)iv : d2f_as_cpu(v)); break; /* as the CPU's store_d */
    case EM_I32: *(int32_t *)yp = int_src ? (int32_t)iv : (int32_t)v; break;
    case EM_I64: *(int64_t *)yp = int_src ? iv : (int64_t)v; break;
    case EM_U8: *(uint8_t *)yp = int_src ? (uint8_t)iv : (uint8_t)(int64_t)v; break;
    case EM_BOOL: *(uint8_t *)yp = int_src ? iv != 0 : v != 0; break;
    default: break;
    }
}

template <typename IT>
__global__ void k_cast_nd(Geom g, const char *__restrict__ x, int idt, int is, char *__restrict__ y, int odt, int os)
{
    for (IT i = blockIdx.x * (IT)blockDim.x + threadIdx.x; i < (IT)g.n; i += (IT)gridDim.x * blockDim.x) {
        IT off[2];
        geom_offsets<2, IT>(g, i, off);
        cast_one(idt, odt, x + (int64_t)off[1] * is, y + (int64_t)off[0] * os);
    }
}

__global__ void k_f32_to_f64(const float *__restrict__ x, double *__restrict__ y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (double)x[i];
}
__global__ void k_f64_to_f32(const double *__restrict__ x, float *__restrict__ y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (float)x[i];
}

/* Contiguous f32 -> f16/bf16 and back, 4 elements per thread and step
 * (16-byte float4, 8-byte uint2) when @p vec (pointers aligned), the rest
 * (or everything) one by one. */
__global__ void k_f32_to_h16(const float *__restrict__ x, uint16_t *__restrict__ y, int64_t n, H16 h, bool vec)
{
    const int64_t n4 = vec ? n / 4 : 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    uint2 *y4 = reinterpret_cast<uint2 *>(y);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = x4[i];
        y4[i] = make_uint2(u16_pair(h.st(v.x), h.st(v.y)), u16_pair(h.st(v.z), h.st(v.w)));
    }
    for (int64_t i = n4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = h.st(x[i]);
}
__global__ void k_h16_to_f32(const uint16_t *__restrict__ x, float *__restrict__ y, int64_t n, H16 h, bool vec)
{
    const int64_t n4 = vec ? n / 4 : 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const uint2 *x4 = reinterpret_cast<const uint2 *>(x);
    float4 *y4 = reinterpret_cast<float4 *>(y);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
        const uint2 v = x4[i];
        y4[i] = make_float4(h.ld((uint16_t)(v.x & 0xffffu)), h.ld((uint16_t)(v.x >> 16)), h.ld((uint16_t)(v.y & 0xffffu)),
                            h.ld((uint16_t)(v.y >> 16)));
    }
    for (int64_t i = n4 * 4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) y[i] = h.ld(x[i]);
}

template <typename T> void copy_same(const Geom &g, const char *x, char *y)
{
    cudaStream_t s = stream();
    if (geom_fits32(g))
        k_copy_nd<T, int32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const T *)x, (T *)y);
    else
        k_copy_nd<T, int64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, (const T *)x, (T *)y);
    check_launch("copy");
}

} // namespace

void em_cuda_unary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int dt = k->in[0].dtype;
    if (!is_family(k->kind, F_EW, 1) || (!is_fp_dtype(dt) && !is_half_dtype(dt) && (op_flags(k->kind) & F_FLOAT))) {
        unsupported("unary", k->kind);
        return;
    }
    switch (dt) {
    case EM_F32: unary_t<float>(k, buffers); break;
    case EM_F64: unary_t<double>(k, buffers); break;
    case EM_F16:
    case EM_BF16: unary_h(k, buffers); break;
    case EM_I32: unary_t<int32_t>(k, buffers); break;
    case EM_I64: unary_t<int64_t>(k, buffers); break;
    case EM_U8:
    case EM_BOOL: unary_t<uint8_t>(k, buffers); break;
    default: unsupported("unary dtype", k->in[0].dtype);
    }
}

void em_cuda_binary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int dt = k->in[0].dtype;
    if (!is_family(k->kind, F_EW, 2) || (!is_fp_dtype(dt) && !is_half_dtype(dt) && (op_flags(k->kind) & F_FLOAT))) {
        unsupported("binary", k->kind);
        return;
    }
    switch (dt) {
    case EM_F32: binary_t<float>(k, buffers); break;
    case EM_F64: binary_t<double>(k, buffers); break;
    case EM_F16:
    case EM_BF16: binary_h(k, buffers); break;
    case EM_I32: binary_t<int32_t>(k, buffers); break;
    case EM_I64: binary_t<int64_t>(k, buffers); break;
    case EM_U8:
    case EM_BOOL: binary_t<uint8_t>(k, buffers); break;
    default: unsupported("binary dtype", k->in[0].dtype);
    }
}

void em_cuda_where(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const em_tdesc &m = k->in[0], &a = k->in[1], &b = k->in[2], &out = k->out[0];
    const int64_t *st[4] = {out.strides, m.strides, a.strides, b.strides};
    Geom g = make_geom(out.ndim, out.shape, 4, st);
    if (g.n == 0) return;
    const uint8_t *pm = (const uint8_t *)base(buffers, 0, m);
    const char *pa = base(buffers, 1, a), *pb = base(buffers, 2, b);
    char *py = base(buffers, 3, out);
    cudaStream_t s = stream();
    const bool f32 = geom_fits32(g);
    const unsigned grid = grid_for(g.n);
#define WHERE_LAUNCH(T)                                                                                              \
    do {                                                                                                             \
        if (f32)                                                                                                     \
            k_where_nd<T, int32_t><<<grid, kThreads, 0, s>>>(g, pm, (const T *)pa, (const T *)pb, (T *)py);          \
        else                                                                                                         \
            k_where_nd<T, int64_t><<<grid, kThreads, 0, s>>>(g, pm, (const T *)pa, (const T *)pb, (T *)py);          \
    } while (0)
    switch (dtype_size(out.dtype)) {
    case 1: WHERE_LAUNCH(uint8_t); break;
    case 2: WHERE_LAUNCH(uint16_t); break;
    case 4: WHERE_LAUNCH(uint32_t); break;
    case 8: WHERE_LAUNCH(uint64_t); break;
    default: unsupported("where element size", out.dtype); return;
    }
#undef WHERE_LAUNCH
    check_launch("where");
}

void em_cuda_copy(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const em_tdesc &in = k->in[0], &out = k->out[0];
    const int64_t *st[2] = {out.strides, in.strides};
    Geom g = make_geom(out.ndim, out.shape, 2, st);
    if (g.n == 0) return;
    const char *x = base(buffers, 0, in);
    char *y = base(buffers, 1, out);
    const int idt = in.dtype, odt = out.dtype;
    /* the conversions cast_one knows (its device-side default is unreachable) */
    auto known = [](int dt) {
        return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16 || dt == EM_I32 || dt == EM_I64 || dt == EM_U8 ||
               dt == EM_BOOL;
    };
    if (idt != odt && (!known(idt) || !known(odt))) {
        unsupported("copy (cast) dtype", known(idt) ? odt : idt);
        return;
    }
    const int64_t is = dtype_size(idt), os = dtype_size(odt);
    cudaStream_t s = stream();
    if (idt == odt) {
        if (geom_contig(g)) {
            check(cudaMemcpyAsync(y, x, (size_t)(g.n * is), cudaMemcpyDeviceToDevice, s), "copy (memcpy)");
            return;
        }
        switch (is) {
        case 1: copy_same<uint8_t>(g, x, y); break;
        case 2: copy_same<uint16_t>(g, x, y); break;
        case 4: copy_same<uint32_t>(g, x, y); break;
        case 8: copy_same<uint64_t>(g, x, y); break;
        default: unsupported("copy element size", idt);
        }
        return;
    }
    if (geom_contig(g) && idt == EM_F32 && odt == EM_F64) {
        k_f32_to_f64<<<grid_for(g.n), kThreads, 0, s>>>((const float *)x, (double *)y, g.n);
    } else if (geom_contig(g) && idt == EM_F64 && odt == EM_F32) {
        k_f64_to_f32<<<grid_for(g.n), kThreads, 0, s>>>((const double *)x, (float *)y, g.n);
    } else if (geom_contig(g) && idt == EM_F32 && is_half_dtype(odt)) {
        const bool vec = aligned16(x) && ((uintptr_t)y & 7u) == 0;
        k_f32_to_h16<<<grid_for(vec ? (g.n + 3) / 4 : g.n), kThreads, 0, s>>>((const float *)x, (uint16_t *)y, g.n, h16_of(odt), vec);
    } else if (geom_contig(g) && is_half_dtype(idt) && odt == EM_F32) {
        const bool vec = ((uintptr_t)x & 7u) == 0 && aligned16(y);
        k_h16_to_f32<<<grid_for(vec ? (g.n + 3) / 4 : g.n), kThreads, 0, s>>>((const uint16_t *)x, (float *)y, g.n, h16_of(idt), vec);
    } else if (geom_fits32(g)) {
        k_cast_nd<int32_t><<<grid_for(g.n), kThreads, 0, s>>>(g, x, idt, (int)is, y, odt, (int)os);
    } else {
        k_cast_nd<int64_t><<<grid_for(g.n), kThreads, 0, s>>>(g, x, idt, (int)is, y, odt, (int)os);
    }
    check_launch("copy (cast)");
}
