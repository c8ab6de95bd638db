/* Learning-rate schedulers as closed-form functions of the step number
 * (torch.optim.lr_scheduler's _get_closed_form_lr), plus a step counter. */
#include "ember/optim.h"
#include "tasks/tasks_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum sched_kind { K_CONST, K_STEP, K_MULTISTEP, K_EXP, K_COSINE, K_WARMUP_COSINE, K_NOAM, K_SEQ, K_CHAIN } sched_kind;

struct em_lr_scheduler {
    sched_kind kind;
    double base;     /* base lr (factor for Noam) */
    double gamma, eta_min;
    int64_t a, b;    /* step_size | T_max | warmup, total | d_model, warmup */
    int64_t *ms;     /* milestones */
    int nms;
    em_lr_scheduler **subs;
    int nsubs;
    int64_t t;       /* step counter */
};

static em_lr_scheduler *sched_new(sched_kind k, double base)
{
    em_lr_scheduler *s = calloc(1, sizeof *s);
    if (!s) return em__fail(EM_ERR_NOMEM, "lr scheduler: out of memory");
    s->kind = k;
    s->base = base;
    return s;
}

void em_lr_scheduler_free(em_lr_scheduler *s)
{
    if (!s) return;
    for (int i = 0; i < s->nsubs; i++) em_lr_scheduler_free(s->subs[i]);
    free(s->subs);
    free(s->ms);
    free(s);
}

em_lr_scheduler *em_lr_constant(double lr)
{
    if (!(lr >= 0)) return em__fail(EM_ERR_INVALID, "em_lr_constant: invalid learning rate %g", lr);
    return sched_new(K_CONST, lr);
}

em_lr_scheduler *em_lr_step(double base_lr, int64_t step_size, double gamma)
{
    if (step_size <= 0) return em__fail(EM_ERR_INVALID, "em_lr_step: step_size must be > 0, got %lld", (long long)step_size);
    em_lr_scheduler *s = sched_new(K_STEP, base_lr);
    if (s) {
        s->a = step_size;
        s->gamma = gamma;
    }
    return s;
}

em_lr_scheduler *em_lr_multistep(double base_lr, const int64_t *milestones, int n, double gamma)
{
    if (n < 0 || (n > 0 && !milestones)) return em__fail(EM_ERR_INVALID, "em_lr_multistep: bad milestone list (n = %d)", n);
    for (int i = 1; i < n; i++)
        if (milestones[i] <= milestones[i - 1])
            return em__fail(EM_ERR_INVALID, "em_lr_multistep: milestones must be increasing (%lld then %lld)", (long long)milestones[i - 1],
                            (long long)milestones[i]);
    em_lr_scheduler *s = sched_new(K_MULTISTEP, base_lr);
    if (!s) return NULL;
    s->gamma = gamma;
    s->nms = n;
    if (n > 0) {
        s->ms = malloc(sizeof *s->ms * (size_t)n);
        if (!s->ms) {
            free(s);
            return em__fail(EM_ERR_NOMEM, "em_lr_multistep: out of memory");
        }
        memcpy(s->ms, milestones, sizeof *s->ms * (size_t)n);
    }
    return s;
}

em_lr_scheduler *em_lr_exponential(double base_lr, double gamma)
{
    em_lr_scheduler *s = sched_new(K_EXP, base_lr);
    if (s) s->gamma = gamma;
    return s;
}

em_lr_scheduler *em_lr_cosine(double base_lr, int64_t T_max, double eta_min)
{
    if (T_max <= 0) return em__fail(EM_ERR_INVALID, "em_lr_cosine: T_max must be > 0, got %lld", (long long)T_max);
    em_lr_scheduler *s = sched_new(K_COSINE, base_lr);
    if (s) {
        s->a = T_max;
        s->eta_min = eta_min;
    }
    return s;
}

em_lr_scheduler *em_lr_warmup_cosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double eta_min)
{
    if (warmup_steps < 0 || total_steps <= warmup_steps)
        return em__fail(EM_ERR_INVALID, "em_lr_warmup_cosine: need 0 <= warmup_steps < total_steps, got %lld and %lld",
                        (long long)warmup_steps, (long long)total_steps);
    em_lr_scheduler *s = sched_new(K_WARMUP_COSINE, base_lr);
    if (s) {
        s->a = warmup_steps;
        s->b = total_steps;
        s->eta_min = eta_min;
    }
    return s;
}

em_lr_scheduler *em_lr_noam(double factor, int64_t d_model, int64_t warmup_steps)
{
    if (d_model <= 0 || warmup_steps <= 0)
        return em__fail(EM_ERR_INVALID, "em_lr_noam: d_model (%lld) and warmup_steps (%lld) must be > 0", (long long)d_model,
                        (long long)warmup_steps);
    em_lr_scheduler *s = sched_new(K_NOAM, factor);
    if (s) {
        s->a = d_model;
        s->b = warmup_steps;
    }
    return s;
}

static em_lr_scheduler *composite(sched_kind k, em_lr_scheduler *const *scheds, int n, const int64_t *ms, const char *fn)
{
    em_status st = EM_OK;
    if (n <= 0 || !scheds) st = em__set_error(EM_ERR_INVALID, "%s: needs at least one scheduler (n = %d)", fn, n);
    for (int i = 0; st == EM_OK && i < n; i++)
        if (!scheds[i]) st = em__set_error(EM_ERR_INVALID, "%s: scheduler %d is NULL", fn, i);
    if (st == EM_OK && k == K_SEQ && n > 1 && !ms) st = em__set_error(EM_ERR_INVALID, "%s: milestones is NULL", fn);
    for (int i = 1; st == EM_OK && k == K_SEQ && i < n - 1; i++)
        if (ms[i] <= ms[i - 1])
            st = em__set_error(EM_ERR_INVALID, "%s: milestones must be increasing (%lld then %lld)", fn, (long long)ms[i - 1], (long long)ms[i]);
    if (st == EM_OK && k == K_SEQ && n > 1 && ms[0] < 0) st = em__set_error(EM_ERR_INVALID, "%s: milestones must be >= 0", fn);
    em_lr_scheduler *s = NULL;
    if (st == EM_OK) {
        s = sched_new(k, scheds[0]->base);
        if (s) {
            s->subs = malloc(sizeof *s->subs * (size_t)n);
            s->ms = (k == K_SEQ && n > 1) ? malloc(sizeof *s->ms * (size_t)(n - 1)) : NULL;
            if (!s->subs || (k == K_SEQ && n > 1 && !s->ms)) {
                free(s->subs);
                free(s->ms);
                free(s);
                s = em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
            }
        }
    }
    if (!s) {
        for (int i = 0; scheds && i < n; i++) em_lr_scheduler_free(scheds[i]);
        return NULL;
    }
    memcpy(s->subs, scheds, sizeof *s->subs * (size_t)n);
    s->nsubs = n;
    if (s->ms) {
        memcpy(s->ms, ms, sizeof *s->ms * (size_t)(n - 1));
        s->nms = n - 1;
    }
    return s;
}

em_lr_scheduler *em_lr_sequential(em_lr_scheduler *const *scheds, int n, const int64_t *milestones)
{
    return composite(K_SEQ, scheds, n, milestones, "em_lr_sequential");
}

em_lr_scheduler *em_lr_chain(em_lr_scheduler *const *scheds, int n)
{
    return composite(K_CHAIN, scheds, n, NULL, "em_lr_chain");
}

double em_lr_scheduler_lr_at(const em_lr_scheduler *s, int64_t t)
{
    if (!s) return NAN;
    if (t < 0) t = 0;
    const double td = (double)t;
    switch (s->kind) {
    case K_CONST: return s->base;
    case K_STEP: return s->base * pow(s->gamma, (double)(t / s->a));
    case K_MULTISTEP: {
        int k = 0;
        while (k < s->nms && s->ms[k] <= t) k++; /* bisect_right */
        return s->base * pow(s->gamma, (double)k);
    }
    case K_EXP: return s->base * pow(s->gamma, td);
    case K_COSINE: return s->eta_min + (s->base - s->eta_min) * (1.0 + cos(M_PI * td / (double)s->a)) / 2.0;
    case K_WARMUP_COSINE: {
        if (t < s->a) return s->base * (td + 1.0) / (double)s->a; /* (t + 1) / warmup: no step at lr 0 */
        double p = (td - (double)s->a) / (double)(s->b - s->a);
        if (p > 1) p = 1;
        return s->eta_min + (s->base - s->eta_min) * (1.0 + cos(M_PI * p)) / 2.0;
    }
    case K_NOAM: {
        double st = t < 1 ? 1.0 : td;
        double w = (double)s->b;
        return s->base * pow((double)s->a, -0.5) * fmin(pow(st, -0.5), st * pow(w, -1.5));
    }
    case K_SEQ: {
        int k = 0;
        while (k < s->nms && s->ms[k] <= t) k++;
        return em_lr_scheduler_lr_at(s->subs[k], k > 0 ? t - s->ms[k - 1] : t);
    }
    case K_CHAIN: {
        double lr = em_lr_scheduler_lr_at(s->subs[0], t);
        for (int i = 1; i < s->nsubs; i++) lr *= em_lr_scheduler_lr_at(s->subs[i], t) / s->subs[i]->base;
        return lr;
    }
    }
    return NAN;
}

double em_lr_scheduler_get_lr(const em_lr_scheduler *s) { return s ? em_lr_scheduler_lr_at(s, s->t) : NAN; }

double em_lr_scheduler_step(em_lr_scheduler *s, em_optim *opt)
{
    if (!s) {
        em__set_error(EM_ERR_INVALID, "em_lr_scheduler_step: scheduler is NULL");
        return NAN;
    }
    s->t++;
    double lr = em_lr_scheduler_lr_at(s, s->t);
    if (opt) em_optim_set_lr(opt, lr);
    return lr;
}

int64_t em_lr_scheduler_get_step(const em_lr_scheduler *s) { return s ? s->t : -1; }

void em_lr_scheduler_set_step(em_lr_scheduler *s, int64_t t)
{
    if (s) s->t = t < 0 ? 0 : t;
}
