/* Dynamic loss scaling (include/ember/amp.h), after torch.amp.GradScaler:
 * the same defaults, the same unscale (multiply by the float32 reciprocal of
 * the scale), the same update rule (torch._amp_update_scale_: ATen's
 * native/cuda/AmpKernels.cu / native/cpu/AmpGradScalerKernels.cpp). The
 * non-finite check stays on the device until the step's one read. */
#include "ember/amp.h"
#include "tasks/tasks_internal.h"

#include <math.h>
#include <stdlib.h>

struct em_grad_scaler {
    em_grad_scaler_config cfg;
    double scale;           /* a float32 value, as torch's scale tensor */
    int64_t tracker;        /* clean steps in a row since the last change (torch's _growth_tracker) */
    em_tensor *found;       /* i64 0-d: non-finite entries of this step's gradients (device), or NULL */
    int64_t found_host;     /* its value once read; -1 unread / none */
    bool unscaled, stepped; /* this step's stages (reset by update) */
};

em_grad_scaler_config em_grad_scaler_config_default(void)
{
    return (em_grad_scaler_config){.init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5, .growth_interval = 2000,
                                   .enabled = true};
}

em_grad_scaler *em_grad_scaler_new(const em_grad_scaler_config *cfg)
{
    em_grad_scaler_config c = cfg ? *cfg : em_grad_scaler_config_default();
    /* the scale is a float32 (torch's scale tensor): 1e300 would round to inf
     * (every step skipped, the back-off never leaving inf), 1e-50 to 0 */
    if (!(isfinite(c.init_scale) && c.init_scale > 0 && isfinite((float)c.init_scale) && (float)c.init_scale > 0))
        return em__fail(EM_ERR_INVALID, "em_grad_scaler_new: init_scale must be finite and > 0 in float32, got %g", c.init_scale);
    if (!(isfinite(c.growth_factor) && c.growth_factor > 1))
        return em__fail(EM_ERR_INVALID, "em_grad_scaler_new: growth_factor must be > 1, got %g", c.growth_factor);
    if (!(c.backoff_factor > 0 && c.backoff_factor < 1))
        return em__fail(EM_ERR_INVALID, "em_grad_scaler_new: backoff_factor must be in (0, 1), got %g", c.backoff_factor);
    if (c.growth_interval <= 0)
        return em__fail(EM_ERR_INVALID, "em_grad_scaler_new: growth_interval must be > 0, got %lld", (long long)c.growth_interval);
    em_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) return em__fail(EM_ERR_NOMEM, "em_grad_scaler_new: out of memory");
    s->cfg = c;
    s->scale = (double)(float)c.init_scale;
    s->found_host = -1;
    return s;
}

void em_grad_scaler_free(em_grad_scaler *s)
{
    if (!s) return;
    em_tensor_release(s->found);
    free(s);
}

em_tensor *em_grad_scaler_scale(em_grad_scaler *s, const em_tensor *loss)
{
    if (!s || !loss) return em__fail(EM_ERR_INVALID, "em_grad_scaler_scale: %s is NULL", !s ? "scaler" : "loss");
    if (!s->cfg.enabled) return em_reshape(loss, loss->shape, loss->ndim); /* the loss itself, as a view */
    em__autocast_suspend(); /* the scaler's own ops are not autocast's */
    em_tensor *r = em_mul_scalar(loss, s->scale);
    em__autocast_resume();
    return r;
}

em_status em_grad_scaler_unscale(em_grad_scaler *s, const em_optim *opt, em_grads *grads)
{
    const char *fn = "em_grad_scaler_unscale";
    if (!s || !opt || !grads)
        return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !s ? "scaler" : !opt ? "optimizer" : "grads");
    if (!s->cfg.enabled) return EM_OK;
    if (s->unscaled) return em__set_error(EM_ERR_STATE, "%s: already called since the last em_grad_scaler_update", fn);
    if (s->stepped) return em__set_error(EM_ERR_STATE, "%s: em_grad_scaler_step already ran this step", fn);
    /* torch: inv_scale = scale.double().reciprocal().float() */
    const double inv = (double)(float)(1.0 / s->scale);
    em_status st = EM_OK;
    em_tensor *count = NULL;
    em_no_grad_begin();
    em__autocast_suspend();
    em_scope_begin();
    const int n = em_optim_num_params(opt);
    for (int i = 0; i < n && st == EM_OK; i++) {
        em_tensor *p = em_optim_param(opt, i);
        em_tensor *g = p ? em_grad(grads, p) : NULL;
        if (!g) continue;
        /* g * 0 is 0 where g is finite and NaN where it is inf or NaN: the
         * non-finite entries are those != 0. Checked on the scaled values, as
         * torch's _amp_foreach_non_finite_check_and_unscale_. */
        em_tensor *bad = em_sum_all(em_ne_scalar(em_mul_scalar(g, 0.0), 0.0)); /* i64 0-d */
        em_tensor *u = em_mul_scalar(g, inv);
        if (!bad || !u) {
            st = em_last_status();
            break;
        }
        count = count ? em_add(count, bad) : bad;
        if (!count) {
            st = em_last_status();
            break;
        }
        st = em_grads_set(grads, p, u);
    }
    if (st == EM_OK && !count) count = em_scalar(0, EM_I64); /* no gradient at all: nothing non-finite */
    if (st == EM_OK && !count) st = em_last_status();
    if (st == EM_OK) {
        em_tensor_retain(count); /* ours past the scope */
        em_tensor_release(s->found);
        s->found = count;
        s->found_host = -1;
        s->unscaled = true;
    }
    em_scope_end();
    em__autocast_resume();
    em_no_grad_end();
    return st;
}

/* Reads the non-finite count of this step once (the step's host read). */
static em_status read_found(em_grad_scaler *s)
{
    if (s->found_host >= 0 || !s->found) return EM_OK;
    int64_t v = 0;
    em_status st = em_to_host(s->found, &v, sizeof v);
    if (st != EM_OK) return st;
    s->found_host = v;
    return EM_OK;
}

em_status em_grad_scaler_step(em_grad_scaler *s, em_optim *opt, const em_grads *grads, bool *stepped)
{
    const char *fn = "em_grad_scaler_step";
    if (stepped) *stepped = false;
    if (!s || !opt || !grads)
        return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !s ? "scaler" : !opt ? "optimizer" : "grads");
    if (!s->cfg.enabled) {
        em_status st = em_optim_step(opt, grads);
        if (st == EM_OK && stepped) *stepped = true;
        return st;
    }
    if (s->stepped) return em__set_error(EM_ERR_STATE, "%s: already called since the last em_grad_scaler_update", fn);
    /* unscale writes the unscaled gradients into the container (torch unscales p.grad in place) */
    em_status st = s->unscaled ? EM_OK : em_grad_scaler_unscale(s, opt, (em_grads *)grads);
    if (st == EM_OK) st = read_found(s);
    if (st != EM_OK) return st;
    s->stepped = true;
    if (s->found_host > 0) return EM_OK; /* skipped: the parameters and the optimizer's state stay as they are */
    st = em_optim_step(opt, grads);
    if (st == EM_OK && stepped) *stepped = true;
    return st;
}

em_status em_grad_scaler_update(em_grad_scaler *s)
{
    if (!s) return em__set_error(EM_ERR_INVALID, "em_grad_scaler_update: scaler is NULL");
    if (!s->cfg.enabled) return EM_OK;
    if (!s->unscaled)
        return em__set_error(EM_ERR_STATE, "em_grad_scaler_update: no inf checks were recorded since the last update (call "
                             "em_grad_scaler_step first)");
    em_status st = read_found(s);
    if (st != EM_OK) return st;
    if (s->found_host > 0) {
        s->scale = (double)(float)(s->scale * s->cfg.backoff_factor);
        s->tracker = 0;
    } else if (s->tracker + 1 == s->cfg.growth_interval) {
        float grown = (float)(s->scale * s->cfg.growth_factor);
        if (isfinite(grown)) s->scale = (double)grown; /* torch keeps the scale when growing overflows float32 */
        s->tracker = 0;
    } else {
        s->tracker++;
    }
    s->unscaled = s->stepped = false;
    return EM_OK;
}

double em_grad_scaler_get_scale(const em_grad_scaler *s)
{
    if (!s) return (double)em__set_error(EM_ERR_INVALID, "em_grad_scaler_get_scale: scaler is NULL");
    return s->cfg.enabled ? s->scale : 1.0;
}

int64_t em_grad_scaler_found_inf(em_grad_scaler *s)
{
    if (!s) return em__set_error(EM_ERR_INVALID, "em_grad_scaler_found_inf: scaler is NULL");
    if (read_found(s) != EM_OK) return em_last_status();
    return s->found_host;
}

em_status em_grad_scaler_get_state(const em_grad_scaler *s, em_grad_scaler_state *out)
{
    if (!s || !out) return em__set_error(EM_ERR_INVALID, "em_grad_scaler_get_state: %s is NULL", !s ? "scaler" : "out");
    out->scale = s->scale;
    out->growth_tracker = s->tracker;
    return EM_OK;
}

em_status em_grad_scaler_set_state(em_grad_scaler *s, const em_grad_scaler_state *st)
{
    if (!s || !st) return em__set_error(EM_ERR_INVALID, "em_grad_scaler_set_state: %s is NULL", !s ? "scaler" : "state");
    if (!(isfinite(st->scale) && st->scale > 0 && isfinite((float)st->scale) && (float)st->scale > 0))
        return em__set_error(EM_ERR_INVALID, "em_grad_scaler_set_state: scale must be finite and > 0 in float32, got %g", st->scale);
    if (st->growth_tracker < 0 || st->growth_tracker >= s->cfg.growth_interval)
        return em__set_error(EM_ERR_INVALID, "em_grad_scaler_set_state: growth tracker %lld is outside [0, growth_interval = %lld)",
                             (long long)st->growth_tracker, (long long)s->cfg.growth_interval);
    s->scale = (double)(float)st->scale;
    s->tracker = st->growth_tracker;
    return EM_OK;
}
