/* The kernel contract of the fused optimizer ops (tasks/ops.def: SGD_STEP,
 * ADAM_STEP, RMSPROP_STEP, ADAGRAD_STEP), shared by the front end
 * (optim/optim.c) and the kernels (devices/cpu/optim.c).
 *
 * Buffers: in[0] = gradient, contiguous, same dtype (f32/f64) and numel as the
 * parameter; out[0] = parameter (contiguous, may have an offset); out[1..] =
 * state buffers (contiguous, fresh) in the order below, present when their
 * flag says so. All outputs are RW (F_INPLACE).
 *
 * Hyper-parameters in p.optim (doubles; the kernel rounds them to the tensor
 * dtype exactly where PyTorch does, so f32 results match torch.optim):
 *   SGD_STEP:     lr, momentum, dampening, weight_decay; flags MOMENTUM (out[1] =
 *                 momentum_buffer), INIT_BUF (first step: buffer = d_p), NESTEROV.
 *   ADAM_STEP:    lr, beta1, beta2, eps, weight_decay, step (1-based, after
 *                 increment); flags AMSGRAD (out[3] = max_exp_avg_sq),
 *                 DECOUPLED (AdamW: p *= 1 - lr*wd before the update).
 *   RMSPROP_STEP: lr, alpha, eps, weight_decay, momentum; flags MOMENTUM
 *                 (next out = momentum_buffer), CENTERED (next out = grad_avg).
 *   ADAGRAD_STEP: lr (already decayed: clr = lr / (1 + (step-1)*lr_decay)),
 *                 eps, weight_decay.
 * MAXIMIZE negates the gradient first (all kinds). */
#ifndef EMBER_OPTIM_KARGS_H
#define EMBER_OPTIM_KARGS_H

enum {
    EM_OPTIM_F_MOMENTUM = 1 << 0,
    EM_OPTIM_F_INIT_BUF = 1 << 1,
    EM_OPTIM_F_NESTEROV = 1 << 2,
    EM_OPTIM_F_AMSGRAD = 1 << 3,
    EM_OPTIM_F_DECOUPLED = 1 << 4,
    EM_OPTIM_F_CENTERED = 1 << 5,
    EM_OPTIM_F_MAXIMIZE = 1 << 6,
};

#endif
