/* Ember optimizers, learning-rate schedulers and gradient clipping.
 *
 * Optimizers
 * ----------
 * An em_optim updates a fixed list of parameters (float leaf tensors, e.g.
 * from em_module_parameters) from the gradients of one backward pass:
 *
 *     em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
 *     c.lr = 1e-3;
 *     em_optim *opt = em_optim_new_for_module(&c, model);
 *     for (...) {
 *         em_scope_begin();
 *         em_tensor *loss = em_cross_entropy(em_module_forward(model, x), y, NULL);
 *         em_grads *g = em_backward(loss);
 *         em_clip_grad_norm(g, params, n, 1.0, 2.0);   // optional
 *         em_optim_step(opt, g);
 *         em_grads_free(g);
 *         em_scope_end();
 *     }
 *     em_optim_free(opt);
 *
 * There is no zero_grad: em_backward returns a fresh em_grads container each
 * time, so gradients never accumulate across steps (accumulate them yourself
 * with em_add + em_grads_set if you want that).
 *
 * Each parameter's update is ONE StarPU task running one fused kernel (param
 * and its state buffers updated in place), submitted asynchronously:
 * em_optim_step never waits. (A gradient that is not contiguous, or not in
 * the parameter's dtype, first costs one copy task; a parameter's first
 * update also fills its new state buffers.) Parameters without a gradient in the container
 * (unused, or frozen) are skipped and their step counters do not advance,
 * exactly as torch.optim skips p.grad is None.
 *
 * The updates follow torch.optim (SGD, Adam, AdamW, RMSprop, Adagrad) to the
 * operation: the first three steps match PyTorch 1.13 to 1e-6 relative
 * (tests/test_optim.c, fixtures from tests/fixtures/gen_optim_fixtures.py).
 *
 * State (for checkpoints)
 * -----------------------
 * State tensors are created lazily (zeros, or initial_accumulator_value for
 * Adagrad) at a parameter's first update, like torch.optim. Keys follow
 * torch.optim.Optimizer.state_dict(), with parameters numbered by their
 * position in the list given at construction:
 *     "state.<i>.momentum_buffer"   SGD (momentum != 0), RMSprop (momentum > 0)
 *     "state.<i>.exp_avg"           Adam/AdamW
 *     "state.<i>.exp_avg_sq"        Adam/AdamW
 *     "state.<i>.max_exp_avg_sq"    Adam/AdamW with amsgrad
 *     "state.<i>.square_avg"        RMSprop
 *     "state.<i>.grad_avg"          RMSprop centered
 *     "state.<i>.sum"               Adagrad
 * and the scalar "state.<i>.step" (em_optim_get_step / em_optim_set_step),
 * plus the group's "lr" (em_optim_get_lr / em_optim_set_lr). Scheduler state
 * is its step counter (em_lr_scheduler_get_step / set_step).
 *
 * Errors: NULL / negative em_status plus em_last_error(), never an abort.
 */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include "ember/autograd.h"
#include "ember/nn.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_optim em_optim;

typedef enum em_optim_kind {
    EM_OPTIM_SGD = 0,
    EM_OPTIM_ADAM = 1,
    EM_OPTIM_ADAMW = 2,
    EM_OPTIM_RMSPROP = 3,
    EM_OPTIM_ADAGRAD = 4,
} em_optim_kind;

/** Hyper-parameters (torch.optim argument names). Fields a kind does not use
 *  are ignored. Get the PyTorch defaults from em_optim_config_default. */
typedef struct em_optim_config {
    em_optim_kind kind;
    double lr;                /**< SGD 1e-3, Adam 1e-3, AdamW 1e-3, RMSprop 1e-2, Adagrad 1e-2 */
    double weight_decay;      /**< 0 (AdamW: 1e-2, decoupled); others: L2 added to the gradient */
    bool maximize;            /**< false: ascend instead of descend */
    /* SGD, RMSprop */
    double momentum;          /**< 0 */
    double dampening;         /**< 0 (SGD) */
    bool nesterov;            /**< false (SGD; needs momentum > 0 and dampening 0) */
    /* Adam, AdamW */
    double beta1, beta2;      /**< 0.9, 0.999 */
    double eps;               /**< Adam/AdamW/RMSprop 1e-8, Adagrad 1e-10 */
    bool amsgrad;             /**< false */
    /* RMSprop */
    double alpha;             /**< 0.99 */
    bool centered;            /**< false */
    /* Adagrad */
    double lr_decay;                  /**< 0 */
    double initial_accumulator_value; /**< 0 */
} em_optim_config;

/** The torch.optim defaults of @p kind (see the field comments). */
EM_API em_optim_config em_optim_config_default(em_optim_kind kind);
/** "SGD", "Adam", "AdamW", "RMSprop", "Adagrad". */
EM_API const char *em_optim_kind_name(em_optim_kind kind);

/** New optimizer over @p n parameters (each retained; float32/float64,
 *  contiguous, no duplicates). Errors: n == 0 ("empty parameter list"), bad
 *  hyper-parameters (negative lr/eps/momentum/weight_decay, betas outside
 *  [0, 1), nesterov without momentum or with dampening) -> NULL. */
EM_API em_optim *em_optim_new(const em_optim_config *cfg, em_tensor *const *params, int n);
/** Same over every parameter of @p m (em_module_parameters order). */
EM_API em_optim *em_optim_new_for_module(const em_optim_config *cfg, const em_module *m);
/** Shorthands with PyTorch defaults for the other fields. */
EM_API em_optim *em_sgd_new(em_tensor *const *params, int n, double lr, double momentum, double weight_decay);
EM_API em_optim *em_adam_new(em_tensor *const *params, int n, double lr);
EM_API em_optim *em_adamw_new(em_tensor *const *params, int n, double lr, double weight_decay);
/** Releases the parameters' references and the state. NULL is a no-op. */
EM_API void em_optim_free(em_optim *opt);

/** One update of every parameter that has a gradient in @p grads (one task
 *  each, asynchronous). Gradient shape must equal the parameter's
 *  (EM_ERR_SHAPE naming both); a gradient of another float dtype is cast. */
EM_API em_status em_optim_step(em_optim *opt, const em_grads *grads);

EM_API double em_optim_get_lr(const em_optim *opt);
/** Sets the learning rate used from the next step on (schedulers call this). */
EM_API em_status em_optim_set_lr(em_optim *opt, double lr);
EM_API const em_optim_config *em_optim_get_config(const em_optim *opt);
/** Gives parameter @p i (0-based, in the list given at construction) its own
 *  weight decay, used by every later step instead of the config's
 *  weight_decay (the same decay rule of the kind: decoupled for AdamW, L2
 *  for the others). This is torch.optim's two parameter groups of the
 *  nanoGPT recipe, e.g. decay 0.1 on matrices and embeddings and 0 on biases
 *  and norm weights: em_optim_set_param_weight_decay(opt, i, 0.0) for every
 *  i whose parameter has fewer than 2 dims. Not part of the optimizer's
 *  state (a checkpoint does not record it: set it again after rebuilding
 *  the optimizer). Errors: NULL optimizer, @p i out of range, a weight decay
 *  that is negative, inf or NaN (EM_ERR_INVALID naming it). */
EM_API em_status em_optim_set_param_weight_decay(em_optim *opt, int i, double weight_decay);
/** Parameter @p i's weight decay (its own, else the config's); NAN for a
 *  NULL optimizer or a bad index. */
EM_API double em_optim_get_param_weight_decay(const em_optim *opt, int i);
EM_API int em_optim_num_params(const em_optim *opt);
/** i-th parameter (borrowed), NULL when out of range. */
EM_API em_tensor *em_optim_param(const em_optim *opt, int i);

/** Calls @p cb for every state tensor that exists, parameter by parameter,
 *  with the keys above. Tensors are borrowed and live: save them, do not
 *  modify them. */
EM_API em_status em_optim_state_visit(const em_optim *opt, em_tensor_visitor cb, void *ud);
/** Restores a state tensor from a checkpoint: @p value (same shape as the
 *  parameter, any float dtype) is copied into the state named by @p key,
 *  creating it when needed. Unknown keys / names not used by this kind /
 *  bad index -> EM_ERR_INVALID; shape mismatch -> EM_ERR_SHAPE. */
EM_API em_status em_optim_state_set(em_optim *opt, const char *key, const em_tensor *value);
/** Per-parameter step counter ("state.<i>.step"): updates done so far; < 0
 *  on a bad index. */
EM_API int64_t em_optim_get_step(const em_optim *opt, int i);
EM_API em_status em_optim_set_step(em_optim *opt, int i, int64_t step);

/* ---- learning-rate schedulers ----------------------------------------------
 * A scheduler is a value: lr(t) is a pure function of the step (or epoch)
 * number t = 0, 1, 2, ... (closed forms of torch.optim.lr_scheduler). It also
 * carries a step counter so a training loop can just call
 * em_lr_scheduler_step() after each optimizer step (or epoch) and the
 * counter is the whole scheduler state for checkpoints. */

typedef struct em_lr_scheduler em_lr_scheduler;

/** lr(t) = lr. */
EM_API em_lr_scheduler *em_lr_constant(double lr);
/** StepLR: base_lr * gamma^floor(t / step_size). step_size > 0. */
EM_API em_lr_scheduler *em_lr_step(double base_lr, int64_t step_size, double gamma);
/** MultiStepLR: base_lr * gamma^(number of milestones <= t). Milestones
 *  strictly increasing, copied. */
EM_API em_lr_scheduler *em_lr_multistep(double base_lr, const int64_t *milestones, int n, double gamma);
/** ExponentialLR: base_lr * gamma^t. */
EM_API em_lr_scheduler *em_lr_exponential(double base_lr, double gamma);
/** CosineAnnealingLR (closed form of SGDR without restarts):
 *  eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2. T_max > 0. */
EM_API em_lr_scheduler *em_lr_cosine(double base_lr, int64_t T_max, double eta_min);
/** Linear warm-up then cosine decay, meant to be stepped once per optimizer
 *  step (t = number of steps done; the step t uses lr(t)). t < warmup:
 *  base_lr * (t + 1) / warmup, so the first step runs at base_lr / warmup
 *  (never at 0) and step warmup - 1 at base_lr; then with
 *  p = min(1, (t - warmup) / (total - warmup)):
 *  eta_min + (base_lr - eta_min) * (1 + cos(pi p)) / 2 (base_lr at t = warmup,
 *  eta_min from t = total on). PyTorch: SequentialLR([LinearLR(start_factor =
 *  1 / warmup, total_iters = warmup - 1), CosineAnnealingLR(T_max = total -
 *  warmup, eta_min)], milestones = [warmup]). 0 <= warmup < total, else
 *  EM_ERR_INVALID (NULL). */
EM_API em_lr_scheduler *em_lr_warmup_cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double eta_min);
/** Noam (Vaswani et al. 2017, "Attention is all you need", eq. 3):
 *  factor * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5), with t = max(t, 1). */
EM_API em_lr_scheduler *em_lr_noam(double factor, int64_t d_model, int64_t warmup_steps);
/** SequentialLR: scheds[0] until milestones[0], then scheds[1] restarted at
 *  t - milestones[0], ... (n schedulers, n - 1 increasing milestones).
 *  Takes ownership of the schedulers (also on failure). */
EM_API em_lr_scheduler *em_lr_sequential(em_lr_scheduler *const *scheds, int n, const int64_t *milestones);
/** ChainedScheduler-like product: lr(t) = lr_0(t) * prod_{i>0} lr_i(t) / lr_i(0),
 *  i.e. the first scheduler's value times the other schedulers' factors.
 *  Takes ownership (also on failure). */
EM_API em_lr_scheduler *em_lr_chain(em_lr_scheduler *const *scheds, int n);
EM_API void em_lr_scheduler_free(em_lr_scheduler *s);

/** lr at step @p t (t >= 0; negative t is treated as 0). */
EM_API double em_lr_scheduler_lr_at(const em_lr_scheduler *s, int64_t t);
/** lr at the current counter. */
EM_API double em_lr_scheduler_get_lr(const em_lr_scheduler *s);
/** Advances the counter by one and returns the new lr; when @p opt is not
 *  NULL also sets it there (em_optim_set_lr). */
EM_API double em_lr_scheduler_step(em_lr_scheduler *s, em_optim *opt);
EM_API int64_t em_lr_scheduler_get_step(const em_lr_scheduler *s);
EM_API void em_lr_scheduler_set_step(em_lr_scheduler *s, int64_t t);

/* ---- gradient clipping ------------------------------------------------------
 * Both work on the gradients of @p params found in @p grads (parameters
 * without a gradient are skipped) and replace them in the container
 * (em_grads_set) with clipped copies: tensors obtained from em_grad() before
 * the call keep their values. */

/** torch.nn.utils.clip_grad_value_: clamps every gradient element to
 *  [-clip_value, clip_value]. clip_value >= 0. */
EM_API em_status em_clip_grad_value(em_grads *grads, em_tensor *const *params, int n, double clip_value);
/** torch.nn.utils.clip_grad_norm_ over ALL gradients together:
 *  total = (sum_g ||g||_p^p)^(1/p) (p = norm_type; INFINITY = max |g|);
 *  coef = max_norm / (total + 1e-6); when coef < 1 every gradient is scaled
 *  by coef. Returns total (this waits for the norm), or a negative em_status
 *  (as double) on error with em_last_error() set. No gradients: returns 0. */
EM_API double em_clip_grad_norm(em_grads *grads, em_tensor *const *params, int n, double max_norm, double norm_type);
/** clip_grad_norm_ without waiting, as torch's (which never reads the norm
 *  on the host): the same total, computed on the device as a 0-d float32
 *  tensor, and every gradient multiplied by clamp(max_norm / (total + 1e-6),
 *  max = 1) in its own dtype — a multiplication by 1 when no clipping is
 *  needed, so the values equal em_clip_grad_norm's; a NaN or inf total
 *  propagates into the gradients, as torch. Only tasks are queued: a training
 *  loop that clips every step keeps the device busy while the host submits
 *  the next step. Returns the total (a new reference, tensor.h rules; read
 *  it with em_item when needed), or NULL on error (arguments as
 *  em_clip_grad_norm: EM_ERR_INVALID naming them). No gradients: a 0 total. */
EM_API em_tensor *em_clip_grad_norm_tensor(em_grads *grads, em_tensor *const *params, int n, double max_norm, double norm_type);

#ifdef __cplusplus
}
#endif
#endif
