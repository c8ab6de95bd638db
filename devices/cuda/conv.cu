/* CUDA kernels of the conv and pool families. The contracts are at the top of
 * tasks/conv.c and tasks/pool.c; the CPU reference is devices/cpu/conv.c.
 * Operands are contiguous NCHW (a descriptor may have an offset), f32 or f64;
 * the conv ops also f16 and bf16 (issue #15: em__cuda_half's conv entry in
 * devices/cuda/kernels.cu; 16-bit storage, f32 accumulation, the result
 * rounded once to the 16-bit dtype, as the CPU's widened conv), and so do
 * the pool ops (em__cuda_half's pool entry: float compute, one rounding;
 * max pooling's value is one of the 16-bit inputs, a NaN made the quiet NaN
 * of devices/half.h, as the CPU's widened pooling makes it).
 *
 * ---- em_cuda_conv: CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_WEIGHT ----------------
 *
 * What runs when:
 *   - cuDNN (built with EMBER_HAVE_CUDNN, the default when CMake finds
 *     libcudnn): cudnnConvolutionForward / BackwardData / BackwardFilter
 *     (alpha 1, beta 0: every output written whole), groups through
 *     cudnnSetConvolutionGroupCount, cross-correlation as PyTorch.
 *   - our direct-convolution kernels (below) when the build has no cuDNN,
 *     when EMBER_CUDNN=0, or for a shape cuDNN's 4-d descriptors cannot
 *     express: a size or tensor element count beyond INT_MAX, or output sizes
 *     other than the ones cuDNN derives from the input (the contract lets a
 *     caller pass its own OH, OW). One thread per output element for CONV2D
 *     and CONV2D_BWD_DATA (a gather, no atomics), one block per dw element
 *     with a fixed-order tree reduction for CONV2D_BWD_WEIGHT: deterministic,
 *     slow.
 *   An error of cuDNN (or a shape it rejects) is reported through
 *   em__kernel_error with cuDNN's status string (when the algorithm picked
 *   fails at launch, the next one of the cache entry is tried first, and the
 *   first failure is reported if none runs); the direct kernels never stand
 *   in for a failing cuDNN call, with one exception: an f16 / bf16
 *   convolution that cuDNN does not support at all (no usable algorithm, or
 *   every algorithm refused at launch with a NOT_SUPPORTED status: cuDNN's
 *   16-bit support depends on the GPU) runs on the direct kernels, logged
 *   once per shape (EM_LOG_INFO) and remembered as an empty cache entry.
 *   The direct kernels in f16 / bf16 load the 16-bit bits exactly into
 *   float (devices/cuda/half.cuh), accumulate in float, round once at the
 *   store (the weight gradient's block tree is in float too).
 *
 * Math type (f32): CUDNN_FMA_MATH by default. cuDNN's CUDNN_DEFAULT_MATH lets
 * FP32 convolutions run as TF32 on Ampere and newer (H200 included), which the
 * FP32 cuBLAS setting of devices/cuda/matmul.cu does not do; when
 * em_get_float32_matmul_precision() is EM_MATMUL_HIGH (read once per
 * convolution, when its kernel runs; EMBER_TF32=1 sets it at em_init) it is
 * CUDNN_TENSOR_OP_MATH (TF32 tensor cores, as CUBLAS_TF32_TENSOR_OP_MATH).
 * CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION is never used (it may convert FP32
 * data down to FP16). f64: CUDNN_DEFAULT_MATH. f16 / bf16: HALF / BFLOAT16
 * tensor and filter descriptors, a convolution descriptor of compute type
 * FLOAT (f32 accumulation, cuDNN's PSEUDO_HALF_CONFIG /
 * PSEUDO_BFLOAT16_CONFIG, as PyTorch) and CUDNN_TENSOR_OP_MATH (tensor
 * cores; EM_MATMUL_HIGH is not needed, as cuBLAS's 16-bit GEMMs in
 * devices/cuda/matmul.cu), alpha and beta as float.
 *
 * Algorithm cache: one entry per (op kind, dtype, device, every size of x, w
 * and y, stride, pad, dilation, groups, math setting, pointer alignment),
 * shared by the workers (a mutex around a std::map). A miss asks cuDNN once:
 * cudnnGet*Algorithm_v7 (heuristics, with the workspace each algorithm
 * needs), grows the worker's workspace to the largest of those needs (at most
 * EMBER_CUDNN_WORKSPACE_MB, default 1024), waits for the worker's stream (the
 * inputs are then final and the output free) and measures with
 * cudnnFind*AlgorithmEx on the worker's own buffers and workspace
 * (EMBER_CUDNN_FIND=0 skips the measurement). The entry is the measured
 * algorithms that succeeded, fastest first, followed by the heuristic ones not
 * measured, each with its workspace size (cudnnGet*WorkspaceSize) and math
 * type. EMBER_CUDNN_DETERMINISTIC=1 keeps only deterministic algorithms.
 *
 * Workspace pool: per CUDA worker, device memory of that worker's GPU, used
 * only on its stream. It grows on demand (a cache entry whose first algorithm
 * needs more than the pool has): the new block is allocated stream-ordered
 * (cudaMallocAsync) and the old one freed stream-ordered (cudaFreeAsync), so
 * nothing waits; a device without memory pools waits for the stream instead.
 * If the growth fails, the next algorithm of the entry that fits is used; if
 * none fits, EM_ERR_NOMEM. The pool shrinks only after a measurement that
 * grew it more than 64 MiB beyond what the winner or any algorithm that ran
 * on this worker before needs (it is freed, and the run allocates what the
 * winner needs). It and the worker's cuDNN handle (created on the worker's first convolution, bound to
 * starpu_cuda_get_local_stream()) are freed by emc::conv_worker_stop(), which
 * em__cuda_shutdown runs on every CUDA worker.
 *
 * ---- em_cuda_pool: MAX_POOL2D, AVG_POOL2D, AVG_POOL2D_BWD (our kernels) -----
 *
 * One thread per output element for the forward ops (max pool's window scan
 * is row-major with the CPU's test `first || v > best || isnan(v)`), one
 * thread per dx element for AVG_POOL2D_BWD, gathering dy / div over the
 * windows that contain it in (oh, ow) order: the CPU's summation order, no
 * atomics. Fixed windows (stride, pad, dilation for max, ceil_mode via the
 * output size) and adaptive ones. Every read is inside its operand. */
#include "devices/cuda/emcuda.h"
#include "devices/cuda/conv_elem.cuh"
#include "devices/cuda/half.cuh"

#ifdef EMBER_HAVE_CUDNN
#include <cudnn.h>
#endif

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <stdlib.h>
#include <string.h>
#include <vector>

using namespace emc;
using namespace emc::convk;

namespace {

/* ========================================================================= */
/* conv geometry                                                              */
/* ========================================================================= */

/* x [N, C, H, W], w [O, C/g, KH, KW], y [N, O, OH, OW] (tasks/conv.c). */
ConvGeom conv_geometry(const em_kargs *k, const em_tdesc &x, const em_tdesc &w, const em_tdesc &y)
{
    ConvGeom g;
    g.N = x.shape[0], g.C = x.shape[1], g.H = x.shape[2], g.W = x.shape[3];
    g.O = w.shape[0], g.KH = w.shape[2], g.KW = w.shape[3];
    g.OH = y.shape[2], g.OW = y.shape[3];
    g.G = k->p.conv.groups;
    g.Cg = g.G > 0 ? g.C / g.G : 0, g.Og = g.G > 0 ? g.O / g.G : 0;
    g.sh = k->p.conv.stride[0], g.sw = k->p.conv.stride[1];
    g.ph = k->p.conv.pad[0], g.pw = k->p.conv.pad[1];
    g.dh = k->p.conv.dilation[0], g.dw = k->p.conv.dilation[1];
    return g;
}

/* ========================================================================= */
/* direct convolution kernels (no cuDNN)                                      */
/* ========================================================================= */

/* The access policy of 16-bit operands (conv_elem.cuh): uint16_t bits of
 * f16 / bf16 (the dtype picked at run time, H16 of half.cuh, so one
 * instantiation serves both), loaded exactly into float, products summed in
 * float, the result rounded once to nearest even (devices/half.h). */
struct Half16 {
    typedef float acc;
    H16 h;
    __device__ __forceinline__ float ld(uint16_t v) const { return h.ld(v); }
    __device__ __forceinline__ uint16_t st(float v) const { return h.st(v); }
};

/* One thread per output element (grid-stride); the math is conv_elem.cuh's.
 * T: the storage type (float, double, uint16_t), L: its access policy. */
template <typename T, typename L>
__global__ void k_conv_fwd(ConvGeom g, const T *__restrict__ x, const T *__restrict__ w, T *__restrict__ y, L ls)
{
    const long long total = g.N * g.O * g.OH * g.OW;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x)
        y[t] = ls.st(conv_fwd_at<T, L>(g, x, w, t, ls));
}

template <typename T, typename L>
__global__ void k_conv_bwd_data(ConvGeom g, const T *__restrict__ dy, const T *__restrict__ w, T *__restrict__ dx, L ls)
{
    const long long total = g.N * g.C * g.H * g.W;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x)
        dx[t] = ls.st(conv_bwd_data_at<T, L>(g, dy, w, t, ls));
}

/* One block per dw element: thread k sums the terms k, k + kThreads, ...,
 * then a fixed-order tree over the block (deterministic), in the
 * accumulation type; one rounding to T at the end. blockDim.x must be
 * kThreads (a power of two). */
template <typename T, typename L>
__global__ void k_conv_bwd_weight(ConvGeom g, const T *__restrict__ x, const T *__restrict__ dy, T *__restrict__ dw, L ls)
{
    typedef typename L::acc A;
    __shared__ A part[kThreads];
    const long long nel = g.O * g.Cg * g.KH * g.KW;
    for (long long e = blockIdx.x; e < nel; e += gridDim.x) {
        part[threadIdx.x] = conv_bwd_weight_part<T, L>(g, x, dy, e, threadIdx.x, blockDim.x, ls);
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) dw[e] = ls.st(part[0]);
        __syncthreads();
    }
}

template <typename T, typename L>
void direct_conv(const em_kargs *k, void *buffers[], const ConvGeom &g, L ls)
{
    const T *a = (const T *)base(buffers, 0, k->in[0]), *b = (const T *)base(buffers, 1, k->in[1]);
    T *out = (T *)base(buffers, 2, k->out[0]);
    cudaStream_t s = stream();
    if (k->kind == EM_OP_CONV2D) {
        k_conv_fwd<T, L><<<grid_for(g.N * g.O * g.OH * g.OW), kThreads, 0, s>>>(g, a, b, out, ls);
        check_launch("conv2d (direct kernel)");
    } else if (k->kind == EM_OP_CONV2D_BWD_DATA) {
        k_conv_bwd_data<T, L><<<grid_for(g.N * g.C * g.H * g.W), kThreads, 0, s>>>(g, a, b, out, ls);
        check_launch("conv2d_bwd_data (direct kernel)");
    } else {
        const long long nel = g.O * g.Cg * g.KH * g.KW, cap = (long long)sm_count() * 64;
        const unsigned blocks = (unsigned)(nel < cap ? (nel > 0 ? nel : 1) : cap);
        k_conv_bwd_weight<T, L><<<blocks, kThreads, 0, s>>>(g, a, b, out, ls);
        check_launch("conv2d_bwd_weight (direct kernel)");
    }
}

/* ========================================================================= */
/* cuDNN                                                                      */
/* ========================================================================= */

#ifdef EMBER_HAVE_CUDNN

struct Settings {
    bool use_cudnn;     /* EMBER_CUDNN, default 1 */
    bool find;          /* EMBER_CUDNN_FIND, default 1 */
    bool deterministic; /* EMBER_CUDNN_DETERMINISTIC, default 0 */
    size_t ws_cap;      /* EMBER_CUDNN_WORKSPACE_MB, default 1024 */
};

bool env_flag(const char *name, bool dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    return atoi(v) != 0;
}

const Settings &settings()
{
    static const Settings s = [] {
        Settings r;
        r.use_cudnn = env_flag("EMBER_CUDNN", true);
        r.find = env_flag("EMBER_CUDNN_FIND", true);
        r.deterministic = env_flag("EMBER_CUDNN_DETERMINISTIC", false);
        const char *mb = getenv("EMBER_CUDNN_WORKSPACE_MB");
        const long long m = mb ? atoll(mb) : 0;
        r.ws_cap = (size_t)(m > 0 ? m : 1024) << 20;
        return r;
    }();
    return s;
}

/* TF32 for the f32 convolution the calling worker runs now
 * (em_get_float32_matmul_precision, read once at its start by cudnn_conv:
 * the cache key and the math types of one call agree). */
thread_local bool t_tf32;

const char *kind_name(int kind)
{
    return kind == EM_OP_CONV2D ? "conv2d" : kind == EM_OP_CONV2D_BWD_DATA ? "conv2d_bwd_data" : "conv2d_bwd_weight";
}

em_status cudnn_em_status(cudnnStatus_t st)
{
    if (st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        return EM_ERR_NOMEM;
    if ((int)st >= 3000 && (int)st < 4000) return EM_ERR_UNSUPPORTED;
    return EM_ERR_DEVICE;
}

void cudnn_fail(const em_kargs *k, const char *call, cudnnStatus_t st)
{
    em__kernel_error(k, cudnn_em_status(st), "cuDNN %s: %s failed: %s (status %d)", kind_name(k->kind), call,
                     cudnnGetErrorString(st), (int)st);
}

/* Per-worker cuDNN state (indexed by StarPU worker id). */
struct Worker {
    cudnnHandle_t h;
    void *ws;
    size_t bytes;
    bool ws_async; /* ws came from cudaMallocAsync */
    int pools;     /* device supports memory pools: -1 unknown, 0, 1 */
    size_t peak;   /* the largest workspace an algorithm that ran here used */
};
Worker g_w[STARPU_NMAXWORKERS];

/* One algorithm of a cache entry. */
struct Algo {
    int algo;
    size_t ws;
    cudnnMathType_t math; /* the math type it runs with */
};

typedef std::array<long long, 24> Key;
std::mutex g_cache_mu;
std::map<Key, std::vector<Algo>> g_cache;

/* Frees w's workspace (stream-ordered when it came from the pool). */
void ws_release(Worker &w)
{
    if (w.ws) {
        cudaStream_t s = stream();
        if (w.ws_async)
            (void)cudaFreeAsync(w.ws, s);
        else {
            (void)cudaStreamSynchronize(s);
            (void)cudaFree(w.ws);
        }
    }
    w.ws = nullptr;
    w.bytes = 0;
    w.ws_async = false;
}

/* Grows w's workspace to at least @p need bytes (rounded up to 1 MiB). */
bool ws_grow(Worker &w, size_t need)
{
    if (need <= w.bytes) return true;
    const size_t mib = (size_t)1 << 20, sz = (need + mib - 1) / mib * mib;
    cudaStream_t s = stream();
    if (w.pools < 0) {
        int dev = 0, v = 0;
        w.pools = (cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && v)
                      ? 1
                      : 0;
        cudaGetLastError();
    }
    void *p = nullptr;
    if (w.pools) { /* the new block first: a failure keeps the old one */
        if (cudaMallocAsync(&p, sz, s) != cudaSuccess || !p) {
            cudaGetLastError();
            return false;
        }
    } else {
        if (cudaStreamSynchronize(s) != cudaSuccess || cudaMalloc(&p, sz) != cudaSuccess || !p) {
            cudaGetLastError();
            return false;
        }
    }
    ws_release(w);
    w.ws_async = w.pools != 0;
    w.ws = p;
    w.bytes = sz;
    return true;
}

/* The four descriptors of one convolution (destroyed with the object). */
struct Descs {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t c = nullptr;
    Descs() = default;
    Descs(const Descs &) = delete;
    Descs &operator=(const Descs &) = delete;
    ~Descs()
    {
        if (x) cudnnDestroyTensorDescriptor(x);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (c) cudnnDestroyConvolutionDescriptor(c);
    }
};

/* A perf result of any of the three kinds. */
struct Perf {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
};

constexpr int kMaxAlgos = 32; /* Find may list an algorithm once per math type */

template <typename P>
int to_perf(const P *p, int n, Perf *out)
{
    for (int i = 0; i < n; i++)
        out[i] = Perf{(int)p[i].algo, p[i].status, p[i].memory, p[i].determinism, p[i].mathType};
    return n;
}

/* Device pointers in the roles of cuDNN's calls: x, w, y (y is dy, w is dw,
 * x is dx where the kind says so). */
struct Ptrs {
    void *x, *w, *y;
};

cudnnStatus_t get_v7(int kind, cudnnHandle_t h, const Descs &d, Perf *out, int *n)
{
    cudnnStatus_t st;
    *n = 0;
    if (kind == EM_OP_CONV2D) {
        cudnnConvolutionFwdAlgoPerf_t p[kMaxAlgos];
        st = cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, kMaxAlgos, n, p);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    } else if (kind == EM_OP_CONV2D_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t p[kMaxAlgos];
        st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.c, d.x, kMaxAlgos, n, p);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t p[kMaxAlgos];
        st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.c, d.w, kMaxAlgos, n, p);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    }
    if (st != CUDNN_STATUS_SUCCESS || *n < 0 || *n > kMaxAlgos) *n = 0;
    return st;
}

cudnnStatus_t find_ex(int kind, cudnnHandle_t h, const Descs &d, const Ptrs &q, void *ws, size_t bytes, Perf *out, int *n)
{
    cudnnStatus_t st;
    *n = 0;
    if (kind == EM_OP_CONV2D) {
        cudnnConvolutionFwdAlgoPerf_t p[kMaxAlgos];
        st = cudnnFindConvolutionForwardAlgorithmEx(h, d.x, q.x, d.w, q.w, d.c, d.y, q.y, kMaxAlgos, n, p, ws, bytes);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    } else if (kind == EM_OP_CONV2D_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t p[kMaxAlgos];
        st = cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, q.w, d.y, q.y, d.c, d.x, q.x, kMaxAlgos, n, p, ws, bytes);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t p[kMaxAlgos];
        st = cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, q.x, d.y, q.y, d.c, d.w, q.w, kMaxAlgos, n, p, ws, bytes);
        if (st == CUDNN_STATUS_SUCCESS) to_perf(p, *n, out);
    }
    if (st != CUDNN_STATUS_SUCCESS || *n < 0 || *n > kMaxAlgos) *n = 0;
    return st;
}

cudnnStatus_t ws_size(int kind, cudnnHandle_t h, const Descs &d, int algo, size_t *bytes)
{
    *bytes = 0;
    if (kind == EM_OP_CONV2D)
        return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.c, d.y, (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (kind == EM_OP_CONV2D_BWD_DATA)
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.c, d.x, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.c, d.w, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

/* alpha 1, beta 0: double for f64, float for f32 and for f16 / bf16 (cuDNN's
 * rule: the scaling factors have the compute type's precision class, float
 * unless the data is double). */
cudnnStatus_t run(int kind, int dt, cudnnHandle_t h, const Descs &d, const Ptrs &q, int algo, void *ws, size_t bytes)
{
    const float f1 = 1.0f, f0 = 0.0f;
    const double d1 = 1.0, d0 = 0.0;
    const void *one = dt == EM_F64 ? (const void *)&d1 : (const void *)&f1;
    const void *zero = dt == EM_F64 ? (const void *)&d0 : (const void *)&f0;
    if (kind == EM_OP_CONV2D)
        return cudnnConvolutionForward(h, one, d.x, q.x, d.w, q.w, d.c, (cudnnConvolutionFwdAlgo_t)algo, ws, bytes, zero, d.y, q.y);
    if (kind == EM_OP_CONV2D_BWD_DATA)
        return cudnnConvolutionBackwardData(h, one, d.w, q.w, d.y, q.y, d.c, (cudnnConvolutionBwdDataAlgo_t)algo, ws, bytes, zero,
                                            d.x, q.x);
    return cudnnConvolutionBackwardFilter(h, one, d.x, q.x, d.y, q.y, d.c, (cudnnConvolutionBwdFilterAlgo_t)algo, ws, bytes, zero,
                                          d.w, q.w);
}

/* The math type asked of cuDNN for dtype @p dt, and whether a perf result's
 * math type is acceptable (and the one the algorithm then runs with).
 * f64: DEFAULT. f32: FMA, or TENSOR_OP (TF32) under t_tf32. f16 / bf16:
 * TENSOR_OP (16-bit products on tensor cores, accumulated in f32: the
 * convolution descriptor's compute type is FLOAT, cudnn_conv); a perf result
 * of any math type but ALLOW_CONVERSION is accepted and runs with its own
 * (DEFAULT and FMA are not less precise for 16-bit data). */
cudnnMathType_t requested_math(int dt)
{
    if (dt == EM_F64) return CUDNN_DEFAULT_MATH;
    if (is_half_dtype(dt)) return CUDNN_TENSOR_OP_MATH;
    return t_tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

bool math_ok(int dt, cudnnMathType_t m, cudnnMathType_t *run_with)
{
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false; /* may convert data down to f16 (bf16 included) */
    if (dt == EM_F32 && !t_tf32) {
        if (m == CUDNN_TENSOR_OP_MATH) return false;
        *run_with = CUDNN_FMA_MATH; /* never TF32 */
        return true;
    }
    *run_with = m;
    return true;
}

bool perf_ok(int dt, const Perf &p, cudnnMathType_t *run_with)
{
    if (p.status != CUDNN_STATUS_SUCCESS || p.algo < 0) return false;
    if (settings().deterministic && p.determinism != CUDNN_DETERMINISTIC) return false;
    return math_ok(dt, p.math, run_with);
}

void add_algo(std::vector<Algo> &v, int algo, size_t ws, cudnnMathType_t m)
{
    for (const Algo &a : v)
        if (a.algo == algo && a.math == m) return;
    v.push_back(Algo{algo, ws, m});
}

/* What choose() found. */
enum class Choice {
    ALGOS,  /* @p out holds the algorithms */
    FAILED, /* an error was reported */
    NONE,   /* f16 / bf16 only: cuDNN supports no algorithm for this convolution (not reported: the direct kernels run it) */
};

/* Fills @p out with the algorithms of a cache miss (see the file header). */
Choice choose(const em_kargs *k, int dt, Worker &w, Descs &d, const Ptrs &q, std::vector<Algo> &out)
{
    const int kind = k->kind;
    const Settings &S = settings();
    Perf heur[kMaxAlgos];
    int nh = 0;
    const cudnnStatus_t st_get = get_v7(kind, w.h, d, heur, &nh);
    if (S.find) {
        /* The workspace the candidates want, within the cap; if that much
         * cannot be had, the largest smaller need that can. */
        std::vector<size_t> needs;
        for (int i = 0; i < nh; i++) {
            cudnnMathType_t m;
            if (perf_ok(dt, heur[i], &m) && heur[i].memory <= S.ws_cap) needs.push_back(heur[i].memory);
        }
        size_t want = 0;
        for (size_t n : needs) want = n > want ? n : want;
        while (want > w.bytes && !ws_grow(w, want)) {
            size_t next = 0;
            for (size_t n : needs)
                if (n < want && n > next) next = n;
            want = next;
        }
        cudaError_t ce = cudaStreamSynchronize(stream());
        if (ce != cudaSuccess) {
            check(ce, "conv2d (waiting for the stream before cudnnFind)");
            return Choice::FAILED;
        }
        Perf found[kMaxAlgos];
        int nf = 0;
        const cudnnStatus_t st_find = find_ex(kind, w.h, d, q, w.ws, w.ws ? w.bytes : 0, found, &nf);
        if (st_find == CUDNN_STATUS_SUCCESS) {
            for (int i = 0; i < nf; i++) {
                cudnnMathType_t m;
                if (perf_ok(dt, found[i], &m) && found[i].memory <= w.bytes) add_algo(out, found[i].algo, found[i].memory, m);
            }
        } else {
            em_log_msg(EM_LOG_WARN, "cuDNN %s: cudnnFind*AlgorithmEx failed (%s); using cuDNN's heuristics", kind_name(kind),
                       cudnnGetErrorString(st_find));
        }
    }
    for (int i = 0; i < nh; i++) {
        cudnnMathType_t m;
        if (perf_ok(dt, heur[i], &m)) add_algo(out, heur[i].algo, heur[i].memory, m);
    }
    /* Exact workspace sizes under the math type each runs with. */
    std::vector<Algo> keep;
    for (const Algo &a : out) {
        size_t b = 0;
        if (cudnnSetConvolutionMathType(d.c, a.math) != CUDNN_STATUS_SUCCESS) continue;
        if (ws_size(kind, w.h, d, a.algo, &b) != CUDNN_STATUS_SUCCESS) continue;
        keep.push_back(Algo{a.algo, b > a.ws ? b : a.ws, a.math});
    }
    out.swap(keep);
    if (out.empty()) {
        if (is_half_dtype(dt) && (st_get == CUDNN_STATUS_SUCCESS || cudnn_em_status(st_get) == EM_ERR_UNSUPPORTED))
            return Choice::NONE;
        if (st_get != CUDNN_STATUS_SUCCESS)
            cudnn_fail(k, "cudnnGetConvolution*Algorithm_v7", st_get);
        else
            em__kernel_error(k, EM_ERR_UNSUPPORTED,
                             "cuDNN %s: no algorithm supports this convolution%s: %s (%d heuristic results, none usable)",
                             kind_name(kind), S.deterministic ? " deterministically (EMBER_CUDNN_DETERMINISTIC=1)" : "",
                             cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED), nh);
        return Choice::FAILED;
    }
    return Choice::ALGOS;
}

bool fits_int(long long v) { return v >= 0 && v <= INT_MAX; }

/* Largest power of two (at most 256) dividing every pointer. */
long long alignment(const Ptrs &q)
{
    const uintptr_t u = (uintptr_t)q.x | (uintptr_t)q.w | (uintptr_t)q.y;
    long long a = 1;
    while (a < 256 && !(u & (uintptr_t)a)) a <<= 1;
    return a;
}

/* Runs the convolution with cuDNN. Returns false, having done nothing, when
 * the shape is one for the direct kernels (see the header); true otherwise
 * (done, or an error reported). */
bool cudnn_conv(const em_kargs *k, void *buffers[], const ConvGeom &g, int dt)
{
    const int kind = k->kind;
    const long long dims[] = {g.N, g.C, g.H, g.W, g.O, g.Cg, g.KH, g.KW, g.OH, g.OW, g.G};
    for (long long v : dims)
        if (!fits_int(v)) return false;
    if (!fits_int(g.N * g.C * g.H * g.W) || !fits_int(g.N * g.O * g.OH * g.OW) || !fits_int(g.O * g.Cg * g.KH * g.KW)) return false;

    t_tf32 = dt == EM_F32 && em_get_float32_matmul_precision() == EM_MATMUL_HIGH;
    const int id = starpu_worker_get_id();
    if (id < 0 || id >= STARPU_NMAXWORKERS) {
        em__kernel_error(k, EM_ERR_RUNTIME, "cuDNN %s: not called from a StarPU worker", kind_name(kind));
        return true;
    }
    Worker &w = g_w[id];
    cudnnStatus_t st;
    if (!w.h) {
        if ((st = cudnnCreate(&w.h)) != CUDNN_STATUS_SUCCESS) {
            w.h = nullptr;
            cudnn_fail(k, "cudnnCreate", st);
            return true;
        }
        w.pools = -1;
    }
    if ((st = cudnnSetStream(w.h, stream())) != CUDNN_STATUS_SUCCESS) {
        cudnn_fail(k, "cudnnSetStream", st);
        return true;
    }

    /* Storage type of x, w, y and the compute type of the convolution: f64
     * DOUBLE / DOUBLE, f32 FLOAT / FLOAT, f16 HALF / FLOAT and bf16 BFLOAT16 /
     * FLOAT (cuDNN's PSEUDO_HALF_CONFIG and PSEUDO_BFLOAT16_CONFIG: f32
     * accumulation, as PyTorch's 16-bit convolutions). em_cuda_conv let only
     * these four dtypes through. */
    const cudnnDataType_t cdt = dt == EM_F64    ? CUDNN_DATA_DOUBLE
                                : dt == EM_F16  ? CUDNN_DATA_HALF
                                : dt == EM_BF16 ? CUDNN_DATA_BFLOAT16
                                                : CUDNN_DATA_FLOAT;
    const cudnnDataType_t compute = dt == EM_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    Descs d;
#define CK(call)                                                                                                      \
    do {                                                                                                              \
        if ((st = (call)) != CUDNN_STATUS_SUCCESS) {                                                                  \
            cudnn_fail(k, #call, st);                                                                                 \
            return true;                                                                                              \
        }                                                                                                             \
    } while (0)
    CK(cudnnCreateTensorDescriptor(&d.x));
    CK(cudnnCreateTensorDescriptor(&d.y));
    CK(cudnnCreateFilterDescriptor(&d.w));
    CK(cudnnCreateConvolutionDescriptor(&d.c));
    CK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, cdt, (int)g.N, (int)g.C, (int)g.H, (int)g.W));
    CK(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, cdt, (int)g.N, (int)g.O, (int)g.OH, (int)g.OW));
    CK(cudnnSetFilter4dDescriptor(d.w, cdt, CUDNN_TENSOR_NCHW, (int)g.O, (int)g.Cg, (int)g.KH, (int)g.KW));
    CK(cudnnSetConvolution2dDescriptor(d.c, (int)g.ph, (int)g.pw, (int)g.sh, (int)g.sw, (int)g.dh, (int)g.dw,
                                       CUDNN_CROSS_CORRELATION, compute));
    CK(cudnnSetConvolutionGroupCount(d.c, (int)g.G));
    CK(cudnnSetConvolutionMathType(d.c, requested_math(dt)));
    int n_ = 0, c_ = 0, h_ = 0, w_ = 0;
    CK(cudnnGetConvolution2dForwardOutputDim(d.c, d.x, d.w, &n_, &c_, &h_, &w_));
#undef CK
    if (n_ != g.N || c_ != g.O || h_ != g.OH || w_ != g.OW) return false; /* sizes cuDNN does not derive: direct kernels */

    /* buffers: in[0], in[1], out[0] in the roles of the kind */
    void *b0 = base(buffers, 0, k->in[0]), *b1 = base(buffers, 1, k->in[1]), *b2 = base(buffers, 2, k->out[0]);
    Ptrs q;
    if (kind == EM_OP_CONV2D)
        q = Ptrs{b0, b1, b2};
    else if (kind == EM_OP_CONV2D_BWD_DATA)
        q = Ptrs{b2, b1, b0}; /* dx, w, dy */
    else
        q = Ptrs{b0, b2, b1}; /* x, dw, dy */

    int dev = 0;
    cudaGetDevice(&dev);
    const Key key = {kind, dt, dev, g.N, g.C, g.H, g.W, g.O, g.Cg, g.KH, g.KW, g.OH, g.OW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.G,
                     t_tf32 ? 1 : 0, settings().deterministic ? 1 : 0, alignment(q), 0};
    std::vector<Algo> algos;
    bool hit = false;
    {
        std::lock_guard<std::mutex> lk(g_cache_mu);
        auto it = g_cache.find(key);
        if (it != g_cache.end()) {
            algos = it->second;
            hit = true;
        }
    }
    if (hit && algos.empty()) return false; /* a 16-bit shape cuDNN does not support: direct kernels */
    if (!hit) {
        const Choice c = choose(k, dt, w, d, q, algos);
        if (c == Choice::FAILED) return true;
        if (c == Choice::NONE) {
            em_log_msg(EM_LOG_INFO, "cuDNN %s (%s): no algorithm supports this convolution; using the direct kernels",
                       kind_name(kind), dt == EM_BF16 ? "bf16" : "f16");
            std::lock_guard<std::mutex> lk(g_cache_mu);
            g_cache[key] = std::vector<Algo>(); /* the empty entry: direct kernels */
            return false;
        }
        {
            std::lock_guard<std::mutex> lk(g_cache_mu);
            g_cache[key] = algos;
        }
        /* cudnnFind may have grown the pool for algorithms that lost: give
         * back what neither the winner nor an earlier shape uses (more than
         * 64 MiB above it). The run below grows it again if needed. */
        const size_t keep = algos[0].ws > w.peak ? algos[0].ws : w.peak;
        if (w.bytes > keep + ((size_t)64 << 20)) ws_release(w);
    }

    /* The first algorithm whose workspace the pool has or can grow to; an
     * algorithm cuDNN refuses at launch hands over to the next one. */
    const size_t cap = settings().ws_cap;
    size_t failed_grow = 0, over_cap = 0;
    cudnnStatus_t first_err = CUDNN_STATUS_SUCCESS;
    int err_algo = -1;
    std::vector<size_t> refused; /* indices of algorithms cuDNN refused at launch */
    for (size_t i = 0; i < algos.size(); i++) {
        const Algo &a = algos[i];
        if (a.ws > cap && a.ws > w.bytes) {
            over_cap++;
            continue;
        }
        if (!ws_grow(w, a.ws)) {
            if (a.ws > failed_grow) failed_grow = a.ws;
            continue;
        }
        if ((st = cudnnSetConvolutionMathType(d.c, a.math)) == CUDNN_STATUS_SUCCESS)
            st = run(kind, dt, w.h, d, q, a.algo, a.ws ? w.ws : nullptr, a.ws ? w.bytes : 0);
        if (st == CUDNN_STATUS_SUCCESS) {
            if (a.ws > w.peak) w.peak = a.ws;
            if (!refused.empty()) { /* later calls of this shape start with the one that ran */
                em_log_msg(EM_LOG_DEBUG, "cuDNN %s: algorithm %d failed (%s), algorithm %d ran", kind_name(kind), err_algo,
                           cudnnGetErrorString(first_err), a.algo);
                std::vector<Algo> rest;
                for (size_t j = 0; j < algos.size(); j++) {
                    bool bad = false;
                    for (size_t r : refused) bad = bad || r == j;
                    if (!bad) rest.push_back(algos[j]);
                }
                std::lock_guard<std::mutex> lk(g_cache_mu);
                g_cache[key] = rest;
            }
            return true;
        }
        refused.push_back(i);
        if (first_err == CUDNN_STATUS_SUCCESS) {
            first_err = st;
            err_algo = a.algo;
        }
    }
    if (first_err != CUDNN_STATUS_SUCCESS && is_half_dtype(dt) && refused.size() == algos.size() &&
        cudnn_em_status(first_err) == EM_ERR_UNSUPPORTED) {
        /* f16 / bf16: every algorithm refused the convolution as not
         * supported (cuDNN's 16-bit support depends on the GPU): the direct
         * kernels run it, from now on too. */
        em_log_msg(EM_LOG_INFO, "cuDNN %s (%s): algorithm %d failed (%s) and no other ran; using the direct kernels",
                   kind_name(kind), dt == EM_BF16 ? "bf16" : "f16", err_algo, cudnnGetErrorString(first_err));
        std::lock_guard<std::mutex> lk(g_cache_mu);
        g_cache[key] = std::vector<Algo>();
        return false;
    }
    if (first_err != CUDNN_STATUS_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cudnnConvolution%s (algorithm %d)",
                 kind == EM_OP_CONV2D ? "Forward" : kind == EM_OP_CONV2D_BWD_DATA ? "BackwardData" : "BackwardFilter", err_algo);
        cudnn_fail(k, what, first_err);
    } else if (failed_grow) {
        em__kernel_error(k, EM_ERR_NOMEM,
                         "cuDNN %s: out of device memory for the workspace: %zu bytes could not be allocated (pool %zu bytes; "
                         "%zu algorithm(s) need more than the cap of %zu bytes, EMBER_CUDNN_WORKSPACE_MB)",
                         kind_name(kind), failed_grow, w.bytes, over_cap, cap);
    } else {
        em__kernel_error(k, EM_ERR_NOMEM,
                         "cuDNN %s: every algorithm (%zu) needs more workspace than the cap of %zu bytes "
                         "(EMBER_CUDNN_WORKSPACE_MB)",
                         kind_name(kind), over_cap, cap);
    }
    return true;
}

#endif /* EMBER_HAVE_CUDNN */

/* ========================================================================= */
/* pooling kernels                                                            */
/* ========================================================================= */

/* T: the storage type (float, double, uint16_t), L: its access policy
 * (conv_elem.cuh; Half16 for f16 / bf16: float compute, one rounding). */
template <typename T, typename L>
__global__ void k_max_pool(PoolGeom g, const T *__restrict__ x, T *__restrict__ y, int64_t *__restrict__ idx, L ls)
{
    const long long total = g.NC * g.OH * g.OW;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x)
        max_pool_at<T, L>(g, x, t, &y[t], &idx[t], ls);
}

template <typename T, typename L>
__global__ void k_avg_pool(PoolGeom g, const T *__restrict__ x, T *__restrict__ y, L ls)
{
    const long long total = g.NC * g.OH * g.OW;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x)
        y[t] = ls.st(avg_pool_at<T, L>(g, x, t, ls));
}

/* One thread per dx element, gathering (no atomics). */
template <typename T, typename L>
__global__ void k_avg_pool_bwd(PoolGeom g, const T *__restrict__ dy, T *__restrict__ dx, L ls)
{
    const long long total = g.NC * g.H * g.W;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x)
        dx[t] = ls.st(avg_pool_bwd_at<T, L>(g, dy, t, ls));
}

PoolGeom pool_geometry(const em_kargs *k, const em_tdesc &X, const em_tdesc &Y)
{
    PoolGeom g;
    g.NC = X.shape[0] * X.shape[1], g.H = X.shape[2], g.W = X.shape[3];
    g.OH = Y.shape[2], g.OW = Y.shape[3];
    g.kh = k->p.pool.kernel[0], g.kw = k->p.pool.kernel[1];
    g.sh = k->p.pool.stride[0], g.sw = k->p.pool.stride[1];
    g.ph = k->p.pool.pad[0], g.pw = k->p.pool.pad[1];
    g.dh = k->p.pool.dilation[0], g.dw = k->p.pool.dilation[1];
    g.divisor = k->p.pool.divisor;
    g.adaptive = k->p.pool.adaptive;
    g.cip = k->p.pool.count_include_pad;
    return g;
}

template <typename T, typename L>
void pool_typed(const em_kargs *k, void *buffers[], L ls)
{
    cudaStream_t s = stream();
    if (k->kind == EM_OP_AVG_POOL2D_BWD) {
        const PoolGeom g = pool_geometry(k, k->out[0], k->in[0]);
        const long long n = g.NC * g.H * g.W;
        if (n == 0) return;
        k_avg_pool_bwd<T, L><<<grid_for(n), kThreads, 0, s>>>(g, (const T *)base(buffers, 0, k->in[0]), (T *)base(buffers, 1, k->out[0]),
                                                              ls);
        check_launch("avg_pool2d_bwd");
        return;
    }
    const PoolGeom g = pool_geometry(k, k->in[0], k->out[0]);
    const long long n = g.NC * g.OH * g.OW;
    if (n == 0) return;
    if (k->kind == EM_OP_MAX_POOL2D) {
        k_max_pool<T, L><<<grid_for(n), kThreads, 0, s>>>(g, (const T *)base(buffers, 0, k->in[0]), (T *)base(buffers, 1, k->out[0]),
                                                          (int64_t *)base(buffers, 2, k->out[1]), ls);
        check_launch("max_pool2d");
    } else {
        k_avg_pool<T, L><<<grid_for(n), kThreads, 0, s>>>(g, (const T *)base(buffers, 0, k->in[0]), (T *)base(buffers, 1, k->out[0]), ls);
        check_launch("avg_pool2d");
    }
}

/* A pooling op whose geometry a kernel would not survive (the front ends
 * guarantee it; checked so that no thread divides by zero or loops on a zero
 * step). */
bool pool_params_ok(const em_kargs *k)
{
    const auto &P = k->p.pool;
    if (P.adaptive) return true;
    if (P.stride[0] <= 0 || P.stride[1] <= 0 || P.kernel[0] <= 0 || P.kernel[1] <= 0 || P.pad[0] < 0 || P.pad[1] < 0) return false;
    if (k->kind == EM_OP_MAX_POOL2D && (P.dilation[0] <= 0 || P.dilation[1] <= 0)) return false;
    return true;
}

bool conv_params_ok(const ConvGeom &g)
{
    return g.G > 0 && g.C % g.G == 0 && g.O % g.G == 0 && g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0 && g.ph >= 0 &&
           g.pw >= 0;
}

} // namespace

/* ========================================================================= */
/* entry points                                                               */
/* ========================================================================= */

void em_cuda_conv(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int kind = k->kind;
    if (kind != EM_OP_CONV2D && kind != EM_OP_CONV2D_BWD_DATA && kind != EM_OP_CONV2D_BWD_WEIGHT) {
        unsupported("conv (op)", kind);
        return;
    }
    const int dt = k->in[0].dtype;
    if ((!is_fp_dtype(dt) && !is_half_dtype(dt)) || k->in[1].dtype != dt || k->out[0].dtype != dt) {
        unsupported("conv (dtype)", dt); /* f32, f64, f16, bf16 only, one dtype for all three operands */
        return;
    }
    if (k->in[0].ndim != 4 || k->in[1].ndim != 4 || k->out[0].ndim != 4) {
        em__kernel_error(k, EM_ERR_SHAPE, "CUDA conv: operands must be 4-D");
        return;
    }
    /* the descriptors in the roles x, w, y of the kind */
    const em_tdesc *X = &k->in[0], *Wd = &k->in[1], *Y = &k->out[0];
    if (kind == EM_OP_CONV2D_BWD_DATA)
        X = &k->out[0], Y = &k->in[0];
    else if (kind == EM_OP_CONV2D_BWD_WEIGHT)
        Wd = &k->out[0], Y = &k->in[1];
    const ConvGeom g = conv_geometry(k, *X, *Wd, *Y);
    if (!conv_params_ok(g) || Wd->shape[1] != g.Cg || Y->shape[0] != g.N || Y->shape[1] != g.O) {
        em__kernel_error(k, EM_ERR_INVALID,
                         "CUDA conv: inconsistent operands or parameters (groups %lld, stride %lld x %lld, dilation %lld x %lld)", g.G,
                         g.sh, g.sw, g.dh, g.dw);
        return;
    }
    const long long n_out = numel(k->out[0]);
    if (n_out == 0) return;
    if (numel(k->in[0]) == 0 || numel(k->in[1]) == 0) { /* an empty sum */
        check(cudaMemsetAsync(base(buffers, 2, k->out[0]), 0, (size_t)n_out * (size_t)dtype_size(dt), stream()),
              "conv (zeroing an output of empty sums)");
        return;
    }
#ifdef EMBER_HAVE_CUDNN
    if (settings().use_cudnn && cudnn_conv(k, buffers, g, dt)) return;
#endif
    switch (dt) {
    case EM_F32: direct_conv<float>(k, buffers, g, Plain<float>()); break;
    case EM_F64: direct_conv<double>(k, buffers, g, Plain<double>()); break;
    case EM_F16:
    case EM_BF16: direct_conv<uint16_t>(k, buffers, g, Half16{h16_of(dt)}); break; /* the dtype picks the converters */
    default: unsupported("conv (direct kernel dtype)", dt); break; /* excluded by the dtype check above */
    }
}

void em_cuda_pool(void *buffers[], void *cl_arg)
{
    const em_kargs *k = (const em_kargs *)cl_arg;
    const int kind = k->kind;
    if (kind != EM_OP_MAX_POOL2D && kind != EM_OP_AVG_POOL2D && kind != EM_OP_AVG_POOL2D_BWD) {
        unsupported("pool (op)", kind);
        return;
    }
    const int dt = k->in[0].dtype;
    if ((!is_fp_dtype(dt) && !is_half_dtype(dt)) || k->out[0].dtype != dt) {
        unsupported("pool (dtype)", dt); /* f32, f64, f16, bf16 only */
        return;
    }
    const em_tdesc &X = kind == EM_OP_AVG_POOL2D_BWD ? k->out[0] : k->in[0], &Y = kind == EM_OP_AVG_POOL2D_BWD ? k->in[0] : k->out[0];
    if (!pool_params_ok(k) || X.ndim != 4 || Y.ndim != 4 || X.shape[0] != Y.shape[0] || X.shape[1] != Y.shape[1] ||
        (kind == EM_OP_MAX_POOL2D && (k->n_out < 2 || k->out[1].dtype != EM_I64 || numel(k->out[1]) != numel(Y)))) {
        em__kernel_error(k, EM_ERR_INVALID, "CUDA pool: inconsistent operands or window parameters");
        return;
    }
    switch (dt) {
    case EM_F32: pool_typed<float>(k, buffers, Plain<float>()); break;
    case EM_F64: pool_typed<double>(k, buffers, Plain<double>()); break;
    case EM_F16:
    case EM_BF16: pool_typed<uint16_t>(k, buffers, Half16{h16_of(dt)}); break; /* the dtype picks the converters */
    default: unsupported("pool (dtype)", dt); break; /* excluded by the dtype check above */
    }
}

namespace emc {

void conv_worker_stop()
{
#ifdef EMBER_HAVE_CUDNN
    const int id = starpu_worker_get_id();
    if (id < 0 || id >= STARPU_NMAXWORKERS) return;
    Worker &w = g_w[id];
    ws_release(w);
    (void)cudaStreamSynchronize(stream());
    cudaGetLastError();
    if (w.h) cudnnDestroy(w.h);
    w.h = nullptr;
    w.pools = -1;
    w.peak = 0;
#endif
}

void conv_shutdown()
{
#ifdef EMBER_HAVE_CUDNN
    std::lock_guard<std::mutex> lk(g_cache_mu);
    g_cache.clear();
#endif
}

} // namespace emc
