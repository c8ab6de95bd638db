/* Ember mixed precision (issue #15): autocast regions and dynamic loss
 * scaling, after torch.amp (torch.autocast and torch.amp.GradScaler).
 *
 * Autocast
 * --------
 *     em_autocast_begin(EM_BF16);
 *     em_tensor *logits = em_module_forward(model, x);   // matmuls in bf16
 *     em_tensor *loss = em_cross_entropy(logits, y, NULL); // log_softmax, sums in f32
 *     em_autocast_end();
 *     em_grads *g = em_backward(loss);                     // outside the region, as PyTorch advises
 *     em_optim_step(opt, g);                               // f32 parameters, f32 state
 *
 * Inside a region every op front end asks the op table (the F_AC_LOW /
 * F_AC_F32 flags of tasks/ops.def, one helper em__autocast_dtype in
 * tasks/amp.c) which dtype the op's kind computes in:
 *   - low (the region's dtype): matmul (so em_linear / nn Linear, whose bias
 *     is cast with it, as torch's linear), conv2d, conv1d, conv_transpose2d
 *     and the two conv backward kinds, and the fused scaled-dot-product
     attention (SDPA: q, k, v cast, an additive mask follows q's dtype;
     torch lists _scaled_dot_product_*_attention there too).
 *   - f32: softmax, log_softmax (so cross-entropy and NLL), exp, expm1, log,
 *     log1p, log2, pow, pow_scalar, rsqrt, reciprocal, softplus, erfinv,
 *     the reductions sum, prod, logsumexp, var (so mean, std, the norms
 *     and the mean / sum of every loss), and batch norm.
 *   - every other kind: the usual promotion of its inputs (add of a bf16
 *     and an f32 tensor gives f32, relu of bf16 stays bf16, max, argmax,
 *     gather, views keep their input's dtype).
 * The lists are torch.amp's CUDA op lists (docs "Automatic Mixed Precision
 * package - torch.amp", "CUDA Ops that can autocast to float16" and "... to
 * float32"); composite front ends (em_linear, em_cross_entropy,
 * em_layer_norm, em_mse_loss, ...) inherit them from the table ops they are
 * made of. One departure: torch leaves batch_norm off both lists (cuDNN takes
 * a half input with f32 statistics); Ember's batch norm wants its input and
 * its affine parameters in one dtype, so it runs in f32.
 *
 * The cast is a recorded em_cast of each float input (f32, f16, bf16) whose
 * dtype differs from the chosen one; f64 and integer inputs are never cast
 * (torch's is_eligible). Gradients therefore flow back through the casts'
 * backward to the f32 parameters: a parameter's gradient has the
 * parameter's dtype. Backward passes (em_backward) run with autocast off, so
 * each backward op runs in the dtype its forward op ran in (as PyTorch). No
 * cast cache: an f32 weight used twice in one region is cast twice.
 *
 * What stays f32: the model. Ember's autocast is torch.autocast's design:
 * the parameters stay f32 (they are the master weights), the optimizer's
 * state is f32, and only the compute of the listed kinds is low. Why: an
 * update lr * g is often below half an ulp of a bf16 weight (bf16 has 8
 * significant bits: 1 + 2^-9 rounds back to 1) and would be lost; Adam's
 * second moment underflows f16; and no separate master copy has to be kept
 * in sync, checkpointed or all-reduced. A model whose parameters are f16 or
 * bf16 (made so by the caller) still trains (the optimizer updates them in
 * their own dtype, with state of that dtype); that is pure low precision,
 * not mixed precision.
 *
 * Regions are per thread (a data-parallel replica's thread opens its own)
 * and nest as a stack of at most EM_AUTOCAST_MAX_DEPTH: the innermost
 * region decides. em_autocast_begin(EM_F32) opens a region with autocast
 * off, as torch.autocast(enabled=False) inside an enabled one.
 *
 * GradScaler
 * ----------
 * Dynamic loss scaling for f16 (torch.amp.GradScaler, same defaults and
 * the same rule): the loss is multiplied by the scale S before backward so
 * small f16 gradients do not flush to zero; the gradients are divided by S
 * before the step; a step whose gradients hold an inf or a NaN is skipped
 * and S backs off; after growth_interval clean steps in a row S grows.
 *     em_grad_scaler *gs = em_grad_scaler_new(NULL);       // PyTorch's defaults
 *     for (...) {
 *         em_autocast_begin(EM_F16);
 *         em_tensor *loss = em_cross_entropy(em_module_forward(model, x), y, NULL);
 *         em_autocast_end();
 *         em_grads *g = em_backward(em_grad_scaler_scale(gs, loss));
 *         em_grad_scaler_unscale(gs, opt, g);            // optional: before clipping
 *         em_clip_grad_norm(g, params, n, 1.0, 2.0);
 *         bool stepped;
 *         em_grad_scaler_step(gs, opt, g, &stepped);
 *         em_grad_scaler_update(gs);
 *         em_grads_free(g);
 *     }
 * The inf/NaN check runs on the device: unscale submits, per gradient, the
 * division by S and the count of its non-finite entries, all summed into
 * ONE int64 tensor; em_grad_scaler_step reads that tensor once (the step's
 * only host read). S itself lives on the host (it only changes in update,
 * from that one read), rounded to float32 after every change as PyTorch's
 * float32 scale tensor is.
 *
 * Errors: a negative em_status (or NULL) plus em_last_error(), never an
 * abort.
 */
#ifndef EMBER_AMP_H
#define EMBER_AMP_H

#include "ember/autograd.h"
#include "ember/optim.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Maximum nesting of autocast regions on one thread. */
#define EM_AUTOCAST_MAX_DEPTH 32

/** Opens an autocast region on the calling thread: EM_BF16 or EM_F16 turn
 *  autocast on with that low dtype, EM_F32 opens a region with autocast off
 *  (torch.autocast(enabled=False)). Errors: another dtype -> EM_ERR_DTYPE
 *  (nothing opened); more than EM_AUTOCAST_MAX_DEPTH open regions ->
 *  EM_ERR_STATE. Needs no runtime. */
EM_API em_status em_autocast_begin(em_dtype dt);
/** Closes the innermost region of the calling thread. EM_ERR_STATE when the
 *  thread has no open region. */
EM_API em_status em_autocast_end(void);
/** The low dtype autocast uses now on the calling thread: EM_BF16 or EM_F16
 *  inside an enabled region, EM_F32 when autocast is off (no region, an
 *  EM_F32 region innermost, or inside em_backward). */
EM_API em_dtype em_autocast_dtype(void);

/* ---- GradScaler ------------------------------------------------------------ */

typedef struct em_grad_scaler em_grad_scaler;

/** torch.amp.GradScaler's arguments. */
typedef struct em_grad_scaler_config {
    double init_scale;      /**< 65536 (2^16)                         */
    double growth_factor;   /**< 2: scale *= it after growth_interval clean steps (> 1) */
    double backoff_factor;  /**< 0.5: scale *= it after a step with inf/NaN (in (0, 1)) */
    int64_t growth_interval; /**< 2000 (> 0)                           */
    bool enabled;           /**< true; false: scale returns the loss, unscale and update do nothing, step steps */
} em_grad_scaler_config;

/** PyTorch's defaults (see the fields). */
EM_API em_grad_scaler_config em_grad_scaler_config_default(void);
/** A scaler (@p cfg NULL: the defaults). Errors (EM_ERR_INVALID naming the
 *  field): init_scale not finite and > 0 as a float32 (1e300, 1e-50 are refused), growth_factor <= 1,
 *  backoff_factor outside (0, 1), growth_interval <= 0. */
EM_API em_grad_scaler *em_grad_scaler_new(const em_grad_scaler_config *cfg);
/** NULL is a no-op. */
EM_API void em_grad_scaler_free(em_grad_scaler *s);

/** loss * scale, recorded (em_mul_scalar: backward multiplies by the scale
 *  too), as a new scoped tensor; disabled: loss itself (a reshape view). NULL loss
 *  -> NULL, EM_ERR_INVALID. */
EM_API em_tensor *em_grad_scaler_scale(em_grad_scaler *s, const em_tensor *loss);
/** Divides the gradient of every parameter of @p opt found in @p grads by
 *  the scale (the unscaled gradients replace them in the container;
 *  multiplied by the float32 reciprocal, as PyTorch) and counts their
 *  non-finite entries on the device into one tensor (no host read). Once per
 *  step: a second call before em_grad_scaler_update -> EM_ERR_STATE (as
 *  torch: "unscale_() has already been called"). Disabled: no-op. */
EM_API em_status em_grad_scaler_unscale(em_grad_scaler *s, const em_optim *opt, em_grads *grads);
/** Unscales when em_grad_scaler_unscale was not called this step (the
 *  unscaled gradients then replace the scaled ones in @p grads, as torch
 *  unscales p.grad in place, although the pointer is const), reads the
 *  non-finite count (ONE host read), and runs em_optim_step(opt, grads)
 *  only when it is 0: a skipped step leaves the parameters, the optimizer's
 *  state and its step counters as they are. *stepped (may be NULL) says
 *  whether it stepped. A second step before update -> EM_ERR_STATE.
 *  Disabled: em_optim_step. */
EM_API em_status em_grad_scaler_step(em_grad_scaler *s, em_optim *opt, const em_grads *grads, bool *stepped);
/** PyTorch's update (torch._amp_update_scale_): after a step with inf/NaN,
 *  scale *= backoff_factor and the growth tracker resets to 0; else the
 *  tracker counts the step, and when it reaches growth_interval, scale *=
 *  growth_factor (only if the result is finite in float32) and the tracker
 *  resets. EM_ERR_STATE when no em_grad_scaler_step (or unscale) ran since
 *  the last update. Disabled: no-op. */
EM_API em_status em_grad_scaler_update(em_grad_scaler *s);
/** The current scale (1.0 when disabled, as PyTorch); < 0 (EM_ERR_INVALID)
 *  for NULL. */
EM_API double em_grad_scaler_get_scale(const em_grad_scaler *s);
/** Non-finite gradient entries found in the last step's unscale (-1 before
 *  any; reads the device only if step has not read it yet). */
EM_API int64_t em_grad_scaler_found_inf(em_grad_scaler *s);

/** The checkpoint state: torch's state_dict()["scale"] and
 *  ["_growth_tracker"]. */
typedef struct em_grad_scaler_state {
    double scale;
    int64_t growth_tracker;
} em_grad_scaler_state;
EM_API em_status em_grad_scaler_get_state(const em_grad_scaler *s, em_grad_scaler_state *out);
/** Restores it (between steps). Errors: scale not finite and > 0 as a float32, tracker
 *  outside [0, growth_interval) -> EM_ERR_INVALID. */
EM_API em_status em_grad_scaler_set_state(em_grad_scaler *s, const em_grad_scaler_state *st);

#ifdef __cplusplus
}
#endif
#endif
