/* CUDA kernels of the conv and pool families (tasks/conv.c, tasks/pool.c
 * hold the contracts). PLACEHOLDER while the CUDA kernels are written on
 * their branch: every call reports an error (never a silent return). */
#include "devices/cuda/emcuda.h"

void em_cuda_conv(void *buffers[], void *cl_arg)
{
    (void)buffers;
    em__kernel_error((const em_kargs *)cl_arg, EM_ERR_RUNTIME, "CUDA conv kernels are not written yet");
}

void em_cuda_pool(void *buffers[], void *cl_arg)
{
    (void)buffers;
    em__kernel_error((const em_kargs *)cl_arg, EM_ERR_RUNTIME, "CUDA pool kernels are not written yet");
}
