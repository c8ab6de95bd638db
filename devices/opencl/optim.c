/* OpenCL host function for the fused optimizer steps (SGD_STEP, ADAM_STEP,
 * RMSPROP_STEP, ADAGRAD_STEP). Buffer contract: devices/kargs.h; kernel
 * contract: devices/opencl/optim.cl. The hyper-parameters are rounded to the
 * tensor dtype here exactly as devices/cpu/optim.c rounds them. */
#include "devices/opencl/opencl.h"

#include <math.h>

#define EM_OPTIM_HAS_WD (1 << 16) /* as optim.cl */

void em_ocl_optim(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int dt = k->out[0].dtype, kind = k->kind, fl = k->p.optim.flags;
    if ((kind != EM_OP_SGD_STEP && kind != EM_OP_ADAM_STEP && kind != EM_OP_RMSPROP_STEP &&
         kind != EM_OP_ADAGRAD_STEP) ||
        (dt != EM_F32 && dt != EM_F64) || k->in[0].dtype != dt || k->n_in != 1 || k->n_out < 1 ||
        k->n_out > EM_KARGS_MAX_OUT) {
        em_ocl_error("optim: unsupported op %d / dtype %d", kind, dt);
        return;
    }
    /* Which out[] index feeds the kernel's s1, s2, s3 (-1: placeholder). */
    int si[3] = {-1, -1, -1};
    switch (kind) {
    case EM_OP_SGD_STEP:
        if (fl & EM_OPTIM_F_MOMENTUM) si[0] = 1;
        break;
    case EM_OP_ADAM_STEP:
        si[0] = 1, si[1] = 2;
        if (fl & EM_OPTIM_F_AMSGRAD) si[2] = 3;
        break;
    case EM_OP_RMSPROP_STEP: {
        int next = 2;
        si[0] = 1;
        if (fl & EM_OPTIM_F_MOMENTUM) si[1] = next++;
        if (fl & EM_OPTIM_F_CENTERED) si[2] = next++;
        break;
    }
    case EM_OP_ADAGRAD_STEP: si[0] = 1; break;
    default: em_ocl_error("optim: unsupported op %d", kind); return;
    }
    for (int i = 0; i < 3; i++)
        if (si[i] >= k->n_out) {
            em_ocl_error("optim: op %s needs state buffer %d, the task has %d outputs", em__kernel_info[kind].name, si[i],
                         k->n_out);
            return;
        }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "optim")) return;
    const int kid = dt == EM_F32 ? EMK_optim_f32 : EMK_optim_f64;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    /* hyper-parameters, each rounded once to T from a double expression (as the CPU) */
    double h[9] = {0};
    const double lr = k->p.optim.lr, wd = k->p.optim.weight_decay;
    switch (kind) {
    case EM_OP_SGD_STEP:
        h[0] = wd, h[1] = k->p.optim.momentum, h[2] = 1.0 - k->p.optim.dampening, h[3] = -lr;
        break;
    case EM_OP_ADAM_STEP: {
        const double b1 = k->p.optim.beta1, b2 = k->p.optim.beta2, step = (double)k->p.optim.step;
        const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
        h[0] = wd, h[1] = 1.0 - lr * wd, h[2] = b1, h[3] = b2, h[4] = 1.0 - b1, h[5] = 1.0 - b2;
        h[6] = -(lr / bc1), h[7] = sqrt(bc2), h[8] = k->p.optim.eps;
        break;
    }
    case EM_OP_RMSPROP_STEP:
        h[0] = k->p.optim.alpha, h[1] = 1.0 - k->p.optim.alpha, h[2] = k->p.optim.eps, h[3] = wd,
        h[4] = k->p.optim.momentum, h[5] = -lr;
        break;
    case EM_OP_ADAGRAD_STEP: h[0] = wd, h[1] = k->p.optim.eps, h[2] = -lr; break;
    default: em_ocl_error("optim: unsupported op %d", kind); return;
    }
    const int kfl = fl | (wd != 0 ? EM_OPTIM_HAS_WD : 0);
    int64_t n = em_ocl_numel(&k->out[0]);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    em_ocl_arg_buf(&a, buffers[0]);
    em_ocl_arg_i64(&a, k->in[0].offset);
    em_ocl_arg_buf(&a, buffers[1]);
    em_ocl_arg_i64(&a, k->out[0].offset);
    for (int i = 0; i < 3; i++) {
        const int o = si[i] >= 0 ? si[i] : 0; /* placeholder: the parameter itself, never touched */
        em_ocl_arg_buf(&a, buffers[1 + o]);
        em_ocl_arg_i64(&a, k->out[o].offset);
    }
    em_ocl_arg_i64(&a, n);
    em_ocl_arg_i32(&a, kind);
    em_ocl_arg_i32(&a, kfl);
    for (int i = 0; i < 9; i++) em_ocl_arg_real(&a, dt, h[i]);
    em_ocl_launch_1d(&a, n, "optim");
}
