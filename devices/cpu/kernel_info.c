/* The op facts kernels may read (devices/devices.h), from tasks/ops.def. */
#include "devices/devices.h"

#include <stdbool.h>
#include <stddef.h>

#define em_cpu_NONE NULL
#define em_cpu_collective NULL /* dist/ kernels, not devices/ */
const em_kernel_info em__kernel_info[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = {.name = #nm, .flags = fl, .n_in = nin, .cpu = em_cpu_##fam},
#include "tasks/ops.def"
};

/* Families whose CPU kernels take f16 / bf16 operands (devices/devices.h). */
#define EM_CPU_HALF_unary true
#define EM_CPU_HALF_binary true
#define EM_CPU_HALF_where true
#define EM_CPU_HALF_copy true
#define EM_CPU_HALF_fill true
#define EM_CPU_HALF_reduce false
#define EM_CPU_HALF_softmax false
#define EM_CPU_HALF_matmul true
#define EM_CPU_HALF_index false
#define EM_CPU_HALF_optim false
#define EM_CPU_HALF_conv false
#define EM_CPU_HALF_pool false
#define EM_CPU_HALF_norm false
#define EM_CPU_HALF_attention false
#define EM_CPU_HALF_fused false
#define EM_CPU_HALF_step false   /* its recorded tasks were widened when recorded */ /* f32 / f64 chains only (fusion/fusion.c) */
#define EM_CPU_HALF_collective false
#define EM_CPU_HALF_NONE false
const bool em__cpu_half[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = EM_CPU_HALF_##fam,
#include "tasks/ops.def"
};
