/* Ember's CUDA backend: the kernel table, device start/stop, shared helpers.
 *
 * Table: em__cuda_kernels[kind] (devices/devices.h) holds em_cuda_<family>
 * for every op of tasks/ops.def (the family column), so a family without a
 * CUDA kernel function is a build error, and em__codelets_init refuses to
 * start when an entry of a task op is NULL. Only the view ops (VIEW_*),
 * which submit no task, have none. The consistency test reads it directly
 * (it links the library's objects, not libember.so).
 *
 * em__cuda_half[kind] (devices/devices.h): the families whose CUDA kernels
 * load and store f16 / bf16 themselves (unary, binary, where, copy, fill,
 * matmul, conv: cuDNN's 16-bit convolutions or the direct kernels, f32
 * accumulation, and pool: float compute; devices/cuda/conv.cu); the door
 * widens the other ops' 16-bit operands to f32.
 *
 * em__cuda_init() (called by the tasks layer's start-up, after the codelets): cuBLAS handles on
 * every CUDA worker (starpu_cublas_init) and a per-worker device workspace
 * (EMBER_CUDA_WORKSPACE_MB, default 4) used by split reductions. The math
 * mode of a handle is set by the matmul kernel before each cuBLAS call
 * (devices/cuda/matmul.cu: f32 follows em_get_float32_matmul_precision).
 * em__cuda_shutdown() frees them (starpu_cublas_shutdown), and the cuDNN
 * handles and workspace pools the conv kernels create on a worker's first
 * convolution (devices/cuda/conv.cu, emc::conv_worker_stop). */
#include "devices/cuda/emcuda.h"

#include <cublas_v2.h>
#include <starpu_cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* Per-worker state, indexed by StarPU worker id. */
struct WorkerState {
    void *ws;
    size_t ws_bytes;
    int sms;
};
WorkerState g_worker[STARPU_NMAXWORKERS];
bool g_started;

void worker_start(void *arg)
{
    (void)arg;
    int id = starpu_worker_get_id_check();
    WorkerState &w = g_worker[id];
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 80;
    w.sms = sms;
    const char *mb = getenv("EMBER_CUDA_WORKSPACE_MB");
    size_t bytes = (size_t)(mb && atoi(mb) > 0 ? atoi(mb) : 4) << 20;
    w.ws = nullptr;
    w.ws_bytes = 0;
    if (cudaMalloc(&w.ws, bytes) == cudaSuccess) {
        w.ws_bytes = bytes;
    } else {
        cudaGetLastError();
        w.ws = nullptr;
        em_log_msg(EM_LOG_WARN, "CUDA worker %d: no %zu-byte workspace; split reductions disabled", id, bytes);
    }
    cublasStatus_t st = cublasSetMathMode(starpu_cublas_get_local_handle(), CUBLAS_DEFAULT_MATH); /* matmul.cu sets it per call */
    if (st != CUBLAS_STATUS_SUCCESS) em_log_msg(EM_LOG_WARN, "CUDA worker %d: cublasSetMathMode failed (%d)", id, (int)st);
}

void worker_stop(void *arg)
{
    (void)arg;
    int id = starpu_worker_get_id_check();
    WorkerState &w = g_worker[id];
    emc::conv_worker_stop(); /* cuDNN handle and workspace pool (conv.cu) */
    if (w.ws) cudaFree(w.ws);
    w.ws = nullptr;
    w.ws_bytes = 0;
}

} // namespace

/* ---- the table -------------------------------------------------------------- */

extern "C" {
/* [op] -> em_cuda_<family> (tasks/ops.def): a family without a CUDA
 * kernel function is a build error. */
#define em_cuda_NONE nullptr
#define em_cuda_collective nullptr /* dist/ kernels (em__dist_cuda_kernels) */
em_kernel_fn em__cuda_kernels[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = em_cuda_##fam,
#include "tasks/ops.def"
};
bool em__cuda_compiled(void) { return true; }

/* Families whose CUDA kernels take f16 / bf16 operands (devices/devices.h). */
#define EM_CUDA_HALF_unary true
#define EM_CUDA_HALF_binary true
#define EM_CUDA_HALF_where true
#define EM_CUDA_HALF_copy true
#define EM_CUDA_HALF_fill true
#define EM_CUDA_HALF_matmul true
#define EM_CUDA_HALF_reduce false
#define EM_CUDA_HALF_softmax false
#define EM_CUDA_HALF_index false
#define EM_CUDA_HALF_optim false
#define EM_CUDA_HALF_conv true /* CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_WEIGHT */
#define EM_CUDA_HALF_pool true /* MAX_POOL2D, AVG_POOL2D, AVG_POOL2D_BWD */
#define EM_CUDA_HALF_norm false
#define EM_CUDA_HALF_attention true /* SDPA, SDPA_BWD: load T, compute in f32, store T */
#define EM_CUDA_HALF_step false /* its recorded tasks were widened when recorded */
#define EM_CUDA_HALF_fused false /* FUSED: f32 / f64 programs only (fusion/ fuses no 16-bit op) */
#define EM_CUDA_HALF_collective false
#define EM_CUDA_HALF_NONE false
/* a definition (the declaration in devices/devices.h gives it external
 * linkage), overriding the weak all-false default of tasks/funnel.c */
const bool em__cuda_half[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = EM_CUDA_HALF_##fam,
#include "tasks/ops.def"
};

em_status em__cuda_init(void)
{
    if (g_started) return EM_OK;
    if (starpu_cuda_worker_get_count() == 0) return EM_OK;
    starpu_cublas_init();
    starpu_execute_on_each_worker(worker_start, nullptr, STARPU_CUDA);
    g_started = true;
    return EM_OK;
}

void em__cuda_shutdown(void)
{
    if (!g_started) return;
    starpu_execute_on_each_worker(worker_stop, nullptr, STARPU_CUDA);
    emc::conv_shutdown();
    starpu_cublas_shutdown();
    g_started = false;
}
}

namespace emc {


int sm_count()
{
    int id = starpu_worker_get_id();
    if (id >= 0 && id < STARPU_NMAXWORKERS && g_worker[id].sms > 0) return g_worker[id].sms;
    return 80;
}

void *workspace(size_t *bytes)
{
    int id = starpu_worker_get_id();
    if (id < 0 || id >= STARPU_NMAXWORKERS || !g_worker[id].ws) {
        *bytes = 0;
        return nullptr;
    }
    *bytes = g_worker[id].ws_bytes;
    return g_worker[id].ws;
}

void check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return;
    em__kernel_error(nullptr, e == cudaErrorMemoryAllocation ? EM_ERR_NOMEM : EM_ERR_DEVICE, "CUDA error in %s: %s (%s)",
                     what, cudaGetErrorString(e), cudaGetErrorName(e));
}

} // namespace emc
