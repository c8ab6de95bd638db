/* The op facts kernels may read (devices/devices.h), from tasks/ops.def. */
#include "devices/devices.h"

#include <stddef.h>

#define NONE NULL
const em_kernel_info em__kernel_info[EM_OP_COUNT] = {
#define X(E, nm, nin, nout, fl, fn) [EM_OP_##E] = {.name = nm, .flags = fl, .cpu = fn},
#include "tasks/ops.def"
#undef X
};
