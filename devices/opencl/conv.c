/* OpenCL host functions of the conv and pool families (tasks/conv.c,
 * tasks/pool.c hold the contracts). PLACEHOLDER while the OpenCL kernels are
 * written on their branch: every call reports an error. */
#include "devices/opencl/opencl.h"

void em_ocl_conv(void *buffers[], void *cl_arg)
{
    (void)buffers;
    em__kernel_error((const em_kargs *)cl_arg, EM_ERR_RUNTIME, "OpenCL conv kernels are not written yet");
}

void em_ocl_pool(void *buffers[], void *cl_arg)
{
    (void)buffers;
    em__kernel_error((const em_kargs *)cl_arg, EM_ERR_RUNTIME, "OpenCL pool kernels are not written yet");
}
