/* CUDA kernels that create data: FILL, ARANGE (and linspace), EYE,
 * RAND_UNIFORM, RAND_NORMAL, RAND_BERNOULLI.
 *
 * Contract (devices/cpu/fill.c): no inputs; out[0] is a fresh tensor whose
 * numel elements lie contiguously from its offset; any dtype f32, f64, f16,
 * bf16, i32, i64, u8, bool. Values are computed in double and stored with the
 * CPU's conversions ((int32_t)v, (uint8_t)(int64_t)v, v != 0 for bool; f16
 * and bf16: (float)v rounded to nearest even by devices/half.h, the CPU's
 * bits; the two share one instantiation, the dtype passed at run time).
 *   FILL      p.s.a everywhere
 *   ARANGE    start + step * i (p.range); linspace (p.range.linspace) takes
 *             the first half from start and the second half from end
 *             (one element: start)
 *   EYE       2-D [rows, cols]: 1 on the diagonal, 0 elsewhere
 *   RAND_*    element i uses Philox4x32-10 counter (p.rng.offset + i) under
 *             key p.rng.seed (devices/philox.h, shared with the CPU), so the
 *             numbers are the CPU's: uniform a + (b - a) * u; normal
 *             a + b * sqrt(-2 log u1) cos(2 pi u2) (Box-Muller); bernoulli
 *             u < a.
 * Products and sums use the round-to-nearest intrinsics (no FMA contraction)
 * so that arange and uniform draws are bit-identical to the CPU's; normal
 * draws go through the device's log/cos, within an ulp of the host libm. */
#include "devices/cuda/emcuda.h"
#include "devices/cuda/half.cuh"
#include "devices/philox.h"

#include <cmath>

using namespace emc;

namespace {

constexpr double kPi = 3.14159265358979323846;

/* Store<DT>::conv(v, h): the element of dtype DT for the double v; h is
 * the 16-bit dtype of Store<EM_F16>, which stands for f16 and bf16. */
template <int DT> struct Store;
template <> struct Store<EM_F32> {
    using T = float;
    __device__ static T conv(double v, H16) { return (float)v; }
};
template <> struct Store<EM_F64> {
    using T = double;
    __device__ static T conv(double v, H16) { return v; }
};
template <> struct Store<EM_F16> {
    using T = uint16_t;
    __device__ static T conv(double v, H16 h) { return h.st(d2f_as_cpu(v)); } /* a NaN keeps its sign, as on the CPU */
};
template <> struct Store<EM_I32> {
    using T = int32_t;
    __device__ static T conv(double v, H16) { return (int32_t)v; }
};
template <> struct Store<EM_I64> {
    using T = int64_t;
    __device__ static T conv(double v, H16) { return (int64_t)v; }
};
template <> struct Store<EM_U8> {
    using T = uint8_t;
    __device__ static T conv(double v, H16) { return (uint8_t)(int64_t)v; }
};
template <> struct Store<EM_BOOL> {
    using T = uint8_t;
    __device__ static T conv(double v, H16) { return v != 0; }
};

template <int DT> __global__ void k_fill(typename Store<DT>::T *y, int64_t n, double v, H16 h)
{
    const typename Store<DT>::T c = Store<DT>::conv(v, h);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) y[i] = c;
}

template <int DT>
__global__ void k_arange(typename Store<DT>::T *y, int64_t n, double start, double step, double end, int linspace, H16 h)
{
    const int64_t half = n / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double v;
        if (linspace && n == 1) /* torch.linspace(a, b, 1) == [a] */
            v = start;
        else if (linspace && i >= half)
            v = __dsub_rn(end, __dmul_rn(step, (double)(n - 1 - i)));
        else
            v = __dadd_rn(start, __dmul_rn(step, (double)i));
        y[i] = Store<DT>::conv(v, h);
    }
}

template <int DT> __global__ void k_eye(typename Store<DT>::T *y, int64_t rows, int64_t cols, H16 h)
{
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = Store<DT>::conv(i / cols == i % cols ? 1.0 : 0.0, h);
}

template <int DT>
__global__ void k_rand(typename Store<DT>::T *y, int64_t n, int kind, uint64_t seed, uint64_t off, double a, double b, H16 h)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t r[4];
        em_philox4x32_10(off + (uint64_t)i, seed, r);
        double v;
        if (kind == EM_OP_RAND_UNIFORM) {
            v = __dadd_rn(a, __dmul_rn(b - a, em_philox_u01(r[0])));
        } else if (kind == EM_OP_RAND_NORMAL) {
            double u1 = em_philox_u01_open0(r[0]), u2 = em_philox_u01(r[1]);
            double rad = sqrt(__dmul_rn(-2.0, log(u1)));
            double c = cos(__dmul_rn(2.0 * kPi, u2));
            v = __dadd_rn(a, __dmul_rn(__dmul_rn(b, rad), c));
        } else {
            v = em_philox_u01(r[0]) < a ? 1.0 : 0.0;
        }
        y[i] = Store<DT>::conv(v, h);
    }
}

template <int DT> void fill_t(const em_kargs *k, void *buffers[])
{
    using T = typename Store<DT>::T;
    const em_tdesc &o = k->out[0];
    T *y = (T *)base(buffers, 0, o);
    const int64_t n = numel(o);
    if (n <= 0) return;
    cudaStream_t s = stream();
    const unsigned grid = grid_for(n);
    const H16 h = h16_of(o.dtype);
    switch (k->kind) {
    case EM_OP_FILL:
        if (k->p.s.a == 0 && !std::signbit(k->p.s.a)) { /* as the CPU: memset unless -0.0 (its sign bit is kept) */
            check(cudaMemsetAsync(y, 0, (size_t)n * sizeof(T), s), "fill (memset)");
            return;
        }
        k_fill<DT><<<grid, kThreads, 0, s>>>(y, n, k->p.s.a, h);
        break;
    case EM_OP_ARANGE:
        k_arange<DT><<<grid, kThreads, 0, s>>>(y, n, k->p.range.start, k->p.range.step, k->p.range.end, k->p.range.linspace, h);
        break;
    case EM_OP_EYE:
        if (o.ndim != 2) return;
        k_eye<DT><<<grid, kThreads, 0, s>>>(y, o.shape[0], o.shape[1], h);
        break;
    case EM_OP_RAND_UNIFORM:
    case EM_OP_RAND_NORMAL:
    case EM_OP_RAND_BERNOULLI:
        k_rand<DT><<<grid, kThreads, 0, s>>>(y, n, k->kind, k->p.rng.seed, k->p.rng.offset, k->p.rng.a, k->p.rng.b, h);
        break;
    default: unsupported("fill (op)", k->kind); return;
    }
    check_launch("fill");
}

} // namespace

void em_cuda_fill(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    switch (k->out[0].dtype) {
    case EM_F32: fill_t<EM_F32>(k, buffers); break;
    case EM_F64: fill_t<EM_F64>(k, buffers); break;
    case EM_F16:
    case EM_BF16: fill_t<EM_F16>(k, buffers); break; /* both: Store<EM_F16> with the dtype at run time */
    case EM_I32: fill_t<EM_I32>(k, buffers); break;
    case EM_I64: fill_t<EM_I64>(k, buffers); break;
    case EM_U8: fill_t<EM_U8>(k, buffers); break;
    case EM_BOOL: fill_t<EM_BOOL>(k, buffers); break;
    default: unsupported("fill (dtype)", k->out[0].dtype); break;
    }
}
