/* The op facts kernels may read (devices/devices.h), from tasks/ops.def. */
#include "devices/devices.h"

#include <stddef.h>

#define em_cpu_NONE NULL
#define em_cpu_collective NULL /* dist/ kernels, not devices/ */
const em_kernel_info em__kernel_info[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = {.name = #nm, .flags = fl, .n_in = nin, .cpu = em_cpu_##fam},
#include "tasks/ops.def"
};
