/* Gradient clipping (torch.nn.utils.clip_grad_value_ / clip_grad_norm_). The
 * clipped gradients replace the originals in the em_grads container. */
#include "ember/optim.h"
#include "tasks/tasks_internal.h"

#include <math.h>
#include <stdlib.h>

em_status em_clip_grad_value(em_grads *grads, em_tensor *const *params, int n, double clip_value)
{
    if (!grads || (n > 0 && !params))
        return em__set_error(EM_ERR_INVALID, "em_clip_grad_value: %s is NULL", !grads ? "grads" : "params");
    if (!(clip_value >= 0)) return em__set_error(EM_ERR_INVALID, "em_clip_grad_value: clip_value must be >= 0, got %g", clip_value);
    em_status st = EM_OK;
    em_no_grad_begin();
    em_scope_begin();
    for (int i = 0; i < n && st == EM_OK; i++) {
        if (!params[i]) continue;
        em_tensor *g = em_grad(grads, params[i]);
        if (!g) continue;
        em_tensor *c = em_clamp(g, -clip_value, clip_value);
        st = c ? em_grads_set(grads, params[i], c) : em_last_status();
    }
    em_scope_end();
    em_no_grad_end();
    return st;
}

double em_clip_grad_norm(em_grads *grads, em_tensor *const *params, int n, double max_norm, double norm_type)
{
    const char *fn = "em_clip_grad_norm";
    if (!grads || (n > 0 && !params)) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !grads ? "grads" : "params");
    if (!(max_norm >= 0)) return em__set_error(EM_ERR_INVALID, "%s: max_norm must be >= 0, got %g", fn, max_norm);
    if (!(norm_type > 0)) return em__set_error(EM_ERR_INVALID, "%s: norm_type must be > 0 (or INFINITY), got %g", fn, norm_type);
    em_tensor **parts = calloc((size_t)(n > 0 ? n : 1), sizeof *parts);
    if (!parts) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn);
    const bool inf = isinf(norm_type);
    em_status st = EM_OK;
    double total = 0;
    int count = 0;
    em_no_grad_begin();
    em_scope_begin();
    /* Submit every per-gradient reduction first, then read them: one wait. */
    for (int i = 0; i < n && st == EM_OK; i++) {
        em_tensor *g = params[i] ? em_grad(grads, params[i]) : NULL;
        if (!g) continue;
        /* a 16-bit gradient's powers in f32: in f16 the square of 300
         * overflows (norm inf: every gradient zeroed) and that of 1e-4
         * flushes to 0 */
        if (em_dtype_size(em_tensor_dtype(g)) == 2) g = em_cast(g, EM_F32);
        em_tensor *a = em_abs(g);
        em_tensor *r;
        if (inf)
            r = em_max(a, NULL, 0, false);
        else if (norm_type == 2.0)
            r = em_sum_all(em_square(g));
        else if (norm_type == 1.0)
            r = em_sum_all(a);
        else
            r = em_sum_all(em_pow_scalar(a, norm_type));
        if (!r) st = em_last_status();
        parts[i] = r;
        count++;
    }
    for (int i = 0; i < n && st == EM_OK; i++) {
        if (!parts[i]) continue;
        double v;
        st = em_item(parts[i], &v);
        if (st != EM_OK) break;
        if (inf)
            total = (v > total || isnan(v)) ? v : total;
        else
            total += v;
    }
    if (st == EM_OK && !inf) total = norm_type == 2.0 ? sqrt(total) : norm_type == 1.0 ? total : pow(total, 1.0 / norm_type);
    if (st == EM_OK && count > 0) {
        double coef = max_norm / (total + 1e-6);
        /* torch multiplies by clamp(coef, max=1): a NaN/inf norm propagates */
        if (!(coef >= 1.0))
            for (int i = 0; i < n && st == EM_OK; i++) {
                if (!parts[i]) continue;
                em_tensor *c = em_mul_scalar(em_grad(grads, params[i]), coef);
                st = c ? em_grads_set(grads, params[i], c) : em_last_status();
            }
    }
    em_scope_end();
    em_no_grad_end();
    free(parts);
    return st == EM_OK ? total : (double)st;
}

em_tensor *em_clip_grad_norm_nowait(em_grads *grads, em_tensor *const *params, int n, double max_norm, double norm_type)
{
    const char *fn = "em_clip_grad_norm_nowait";
    if (!grads || (n > 0 && !params)) return em__fail(EM_ERR_INVALID, "%s: %s is NULL", fn, !grads ? "grads" : "params");
    if (!(max_norm >= 0)) return em__fail(EM_ERR_INVALID, "%s: max_norm must be >= 0, got %g", fn, max_norm);
    if (!(norm_type > 0)) return em__fail(EM_ERR_INVALID, "%s: norm_type must be > 0 (or INFINITY), got %g", fn, norm_type);
    const bool inf = isinf(norm_type);
    em_tensor *acc = NULL, *out = NULL;
    bool ok = true;
    em_no_grad_begin();
    em_scope_begin();
    for (int i = 0; i < n && ok; i++) {
        em_tensor *g = params[i] ? em_grad(grads, params[i]) : NULL;
        if (!g) continue;
        /* 16-bit gradients' powers in f32, as em_clip_grad_norm */
        if (em_tensor_dtype(g) != EM_F32) g = em_cast(g, EM_F32);
        em_tensor *r;
        if (inf) r = em_max(em_abs(g), NULL, 0, false);
        else if (norm_type == 2.0) r = em_sum_all(em_square(g));
        else if (norm_type == 1.0) r = em_sum_all(em_abs(g));
        else r = em_sum_all(em_pow_scalar(em_abs(g), norm_type));
        acc = !r ? NULL : !acc ? r : inf ? em_maximum(acc, r) : em_add(acc, r);
        ok = acc != NULL;
    }
    if (ok && !acc) {
        out = em_scalar(0.0, EM_F32); /* no gradient: nothing to clip */
    } else if (ok) {
        em_tensor *total = inf || norm_type == 1.0 ? acc : norm_type == 2.0 ? em_sqrt(acc) : em_pow_scalar(acc, 1.0 / norm_type);
        /* coef = clamp(max_norm / (total + 1e-6), max = 1), torch's clip_coef_clamped */
        em_tensor *coef = total ? em_minimum_scalar(em_mul_scalar(em_reciprocal(em_add_scalar(total, 1e-6)), max_norm), 1.0) : NULL;
        ok = coef != NULL;
        for (int i = 0; i < n && ok; i++) {
            em_tensor *g = params[i] ? em_grad(grads, params[i]) : NULL;
            if (!g) continue;
            em_tensor *c = em_tensor_dtype(coef) == em_tensor_dtype(g) ? coef : em_cast(coef, em_tensor_dtype(g));
            em_tensor *scaled = c ? em_mul(g, c) : NULL;
            ok = scaled && em_grads_set(grads, params[i], scaled) == EM_OK;
        }
        out = ok ? total : NULL;
    }
    if (out) em_keep(out);
    em_scope_end();
    em_no_grad_end();
    return out;
}
