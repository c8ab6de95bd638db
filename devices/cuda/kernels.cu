/* Ember's CUDA backend: the kernel table, device start/stop, shared helpers.
 *
 * ops without a CUDA kernel:
 *   - none of the task ops of tasks/ops.def as of this writing. Every op
 *     whose CPU kernel family is listed in kFamilies below gets a CUDA kernel;
 *     an op added later with a NEW CPU kernel family (e.g. em_cpu_conv) maps to
 *     NULL here until a CUDA kernel is written for it, and the funnel then runs
 *     it on the CPU (tests/test_consistency.c lists it as "unsupported").
 *   - the view ops (VIEW_RESHAPE, VIEW_PERMUTE, VIEW_EXPAND, VIEW_SLICE,
 *     VIEW_ALIAS, VIEW_CAT) submit no task and need no kernel on any device.
 *
 * Table: em__cuda_kernels[kind] (runtime/internal.h) is filled at load time
 * from tasks/ops.def by mapping each op's CPU kernel family to the CUDA
 * function of the same family; tasks/funnel.c reads it in em__codelets_init()
 * and sets STARPU_CUDA_ASYNC for every non-NULL entry. The table is also
 * reachable through em__cuda_kernel_table() (exported, for the consistency
 * test, which cannot see the library's hidden symbols).
 *
 * em__cuda_init() (called by em_init after the codelets): cuBLAS handles on
 * every CUDA worker (starpu_cublas_init), their math mode (FP32 by default,
 * TF32 tensor-op math when EMBER_TF32=1), and a per-worker device workspace
 * (EMBER_CUDA_WORKSPACE_MB, default 4) used by split reductions.
 * em__cuda_shutdown() frees them (starpu_cublas_shutdown). */
#include "devices/cuda/emcuda.h"

#include <cublas_v2.h>
#include <starpu_cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct Family {
    const char *cpu;
    em_kernel_fn cuda;
};

/* CPU kernel family (tasks/ops.def, last column) -> CUDA kernel. */
const Family kFamilies[] = {
    {"em_cpu_unary", em_cuda_unary},     {"em_cpu_binary", em_cuda_binary}, {"em_cpu_where", em_cuda_where},
    {"em_cpu_reduce", em_cuda_reduce},   {"em_cpu_softmax", em_cuda_softmax}, {"em_cpu_matmul", em_cuda_matmul},
    {"em_cpu_copy", em_cuda_copy},       {"em_cpu_index", em_cuda_index},   {"em_cpu_fill", em_cuda_fill},
    {"em_cpu_optim", em_cuda_optim},
};

em_kernel_fn cuda_for(const char *cpu_family)
{
    for (const Family &f : kFamilies)
        if (!strcmp(f.cpu, cpu_family)) return f.cuda;
    return nullptr; /* NONE (views) or a family without a CUDA kernel yet */
}

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
    const char *tf32 = getenv("EMBER_TF32");
    cublasMath_t mode = (tf32 && atoi(tf32) == 1) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    cublasStatus_t st = cublasSetMathMode(starpu_cublas_get_local_handle(), mode);
    if (st != CUBLAS_STATUS_SUCCESS) em_log_msg(EM_LOG_WARN, "CUDA worker %d: cublasSetMathMode failed (%d)", id, (int)st);
}

void worker_stop(void *arg)
{
    (void)arg;
    int id = starpu_worker_get_id_check();
    WorkerState &w = g_worker[id];
    if (w.ws) cudaFree(w.ws);
    w.ws = nullptr;
    w.ws_bytes = 0;
}

} // namespace

/* ---- the table -------------------------------------------------------------- */

extern "C" {
em_kernel_fn em__cuda_kernels[EM_OP_COUNT] = {
#define X(E, name, nin, nout, flags, cpu) cuda_for(#cpu),
#include "tasks/ops.def"
#undef X
};

/* Test hook: the table above (libember hides its internal symbols). */
__attribute__((visibility("default"))) const em_kernel_fn *em__cuda_kernel_table(void) { return em__cuda_kernels; }

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
    starpu_cublas_shutdown();
    g_started = false;
}
}

namespace emc {

const unsigned op_flags[EM_OP_COUNT] = {
#define X(E, name, nin, nout, flags, cpu) (unsigned)(flags),
#include "tasks/ops.def"
#undef X
};

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
