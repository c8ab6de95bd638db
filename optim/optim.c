/* Optimizers: SGD, Adam, AdamW, RMSprop, Adagrad (torch.optim semantics).
 * Each parameter's update is one fused task (tasks/ops.def *_STEP, kernels in
 * devices/cpu/optim.c, contract in devices/kargs.h). */
#include "ember/optim.h"
#include "autodiff/autodiff.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SLOTS 3

typedef struct pstate {
    em_tensor *param;          /* retained */
    em_tensor *st[MAX_SLOTS];  /* state buffers in kernel order, NULL until created */
    int64_t step;
    double wd;                 /* this parameter's weight decay (cfg.weight_decay unless overridden) */
    bool wd_own;               /* wd was set by em_optim_set_param_weight_decay */
} pstate;

struct em_optim {
    em_optim_config cfg;
    int n;
    pstate *ps;
    int nslots;
    const char *slot[MAX_SLOTS];
};

em_optim_config em_optim_config_default(em_optim_kind kind)
{
    em_optim_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.alpha = 0.99;
    c.eps = 1e-8;
    switch (kind) {
    case EM_OPTIM_SGD: c.lr = 1e-3; break;
    case EM_OPTIM_ADAM: c.lr = 1e-3; break;
    case EM_OPTIM_ADAMW: c.lr = 1e-3; c.weight_decay = 1e-2; break;
    case EM_OPTIM_RMSPROP: c.lr = 1e-2; break;
    case EM_OPTIM_ADAGRAD: c.lr = 1e-2; c.eps = 1e-10; break;
    }
    return c;
}

const char *em_optim_kind_name(em_optim_kind kind)
{
    switch (kind) {
    case EM_OPTIM_SGD: return "SGD";
    case EM_OPTIM_ADAM: return "Adam";
    case EM_OPTIM_ADAMW: return "AdamW";
    case EM_OPTIM_RMSPROP: return "RMSprop";
    case EM_OPTIM_ADAGRAD: return "Adagrad";
    }
    return "?";
}

/* torch.optim's argument checks. */
static em_status check_config(const em_optim_config *c)
{
    const char *k = em_optim_kind_name(c->kind);
    if (c->kind < EM_OPTIM_SGD || c->kind > EM_OPTIM_ADAGRAD)
        return em__set_error(EM_ERR_INVALID, "em_optim_new: unknown optimizer kind %d", (int)c->kind);
#define BAD(cond, ...) \
    if (cond) return em__set_error(EM_ERR_INVALID, __VA_ARGS__)
    BAD(!(c->lr >= 0), "%s: invalid learning rate %g (must be >= 0)", k, c->lr);
    BAD(!(c->weight_decay >= 0), "%s: invalid weight_decay %g (must be >= 0)", k, c->weight_decay);
    switch (c->kind) {
    case EM_OPTIM_SGD:
        BAD(!(c->momentum >= 0), "%s: invalid momentum %g (must be >= 0)", k, c->momentum);
        BAD(c->nesterov && (c->momentum <= 0 || c->dampening != 0), "%s: Nesterov momentum requires a momentum > 0 and zero dampening (got momentum %g, dampening %g)", k,
            c->momentum, c->dampening);
        break;
    case EM_OPTIM_ADAM:
    case EM_OPTIM_ADAMW:
        BAD(!(c->eps >= 0), "%s: invalid epsilon %g (must be >= 0)", k, c->eps);
        BAD(!(c->beta1 >= 0 && c->beta1 < 1), "%s: invalid beta1 %g (must be in [0, 1))", k, c->beta1);
        BAD(!(c->beta2 >= 0 && c->beta2 < 1), "%s: invalid beta2 %g (must be in [0, 1))", k, c->beta2);
        break;
    case EM_OPTIM_RMSPROP:
        BAD(!(c->eps >= 0), "%s: invalid epsilon %g (must be >= 0)", k, c->eps);
        BAD(!(c->momentum >= 0), "%s: invalid momentum %g (must be >= 0)", k, c->momentum);
        BAD(!(c->alpha >= 0), "%s: invalid alpha %g (must be >= 0)", k, c->alpha);
        break;
    case EM_OPTIM_ADAGRAD:
        BAD(!(c->eps >= 0), "%s: invalid epsilon %g (must be >= 0)", k, c->eps);
        BAD(!(c->lr_decay >= 0), "%s: invalid lr_decay %g (must be >= 0)", k, c->lr_decay);
        BAD(!(c->initial_accumulator_value >= 0), "%s: invalid initial_accumulator_value %g (must be >= 0)", k,
            c->initial_accumulator_value);
        break;
    }
#undef BAD
    return EM_OK;
}

/* State slot names in kernel buffer order (devices/kargs.h). */
static void set_slots(em_optim *o)
{
    const em_optim_config *c = &o->cfg;
    o->nslots = 0;
    switch (c->kind) {
    case EM_OPTIM_SGD:
        if (c->momentum != 0) o->slot[o->nslots++] = "momentum_buffer";
        break;
    case EM_OPTIM_ADAM:
    case EM_OPTIM_ADAMW:
        o->slot[o->nslots++] = "exp_avg";
        o->slot[o->nslots++] = "exp_avg_sq";
        if (c->amsgrad) o->slot[o->nslots++] = "max_exp_avg_sq";
        break;
    case EM_OPTIM_RMSPROP:
        o->slot[o->nslots++] = "square_avg";
        if (c->momentum > 0) o->slot[o->nslots++] = "momentum_buffer";
        if (c->centered) o->slot[o->nslots++] = "grad_avg";
        break;
    case EM_OPTIM_ADAGRAD:
        o->slot[o->nslots++] = "sum";
        break;
    }
}

em_optim *em_optim_new(const em_optim_config *cfg, em_tensor *const *params, int n)
{
    if (!cfg) return em__fail(EM_ERR_INVALID, "em_optim_new: config is NULL");
    if (check_config(cfg) != EM_OK) return NULL;
    const char *k = em_optim_kind_name(cfg->kind);
    if (n <= 0 || !params) return em__fail(EM_ERR_INVALID, "%s: optimizer got an empty parameter list", k);
    for (int i = 0; i < n; i++) {
        const em_tensor *p = params[i];
        char sb[160];
        if (!p) return em__fail(EM_ERR_INVALID, "%s: parameter %d is NULL", k, i);
        if (!em_dtype_is_float(p->dtype))
            return em__fail(EM_ERR_DTYPE, "%s: parameter %d must be a float dtype, got %s", k, i, em_dtype_name(p->dtype));
        if (!em_tensor_is_contiguous(p))
            return em__fail(EM_ERR_INVALID, "%s: parameter %d (shape %s) is not contiguous", k, i,
                            em_shape_str(p->shape, p->ndim, sb, sizeof sb));
        if (p->node) return em__fail(EM_ERR_INVALID, "%s: can't optimize a non-leaf tensor (parameter %d)", k, i);
        for (int j = 0; j < i; j++)
            if (params[j] == p) return em__fail(EM_ERR_INVALID, "%s: parameter %d appears twice in the list (also at %d)", k, i, j);
    }
    em_optim *o = calloc(1, sizeof *o);
    pstate *ps = calloc((size_t)n, sizeof *ps);
    if (!o || !ps) {
        free(o);
        free(ps);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory", k);
    }
    o->cfg = *cfg;
    o->n = n;
    o->ps = ps;
    set_slots(o);
    for (int i = 0; i < n; i++) ps[i].param = em_tensor_retain(params[i]);
    return o;
}

em_optim *em_optim_new_for_module(const em_optim_config *cfg, const em_module *m)
{
    int n = em_module_parameters(m, NULL, 0);
    if (n < 0) return NULL;
    if (n == 0)
        return em__fail(EM_ERR_INVALID, "%s: optimizer got an empty parameter list (module %s has no parameters)",
                        cfg ? em_optim_kind_name(cfg->kind) : "em_optim_new_for_module", em_module_type_name(m));
    em_tensor **ps = malloc(sizeof *ps * (size_t)n);
    if (!ps) return em__fail(EM_ERR_NOMEM, "em_optim_new_for_module: out of memory");
    em_module_parameters(m, ps, n);
    em_optim *o = em_optim_new(cfg, ps, n);
    free(ps);
    return o;
}

em_optim *em_sgd_new(em_tensor *const *params, int n, double lr, double momentum, double weight_decay)
{
    em_optim_config c = em_optim_config_default(EM_OPTIM_SGD);
    c.lr = lr;
    c.momentum = momentum;
    c.weight_decay = weight_decay;
    return em_optim_new(&c, params, n);
}

em_optim *em_adam_new(em_tensor *const *params, int n, double lr)
{
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    c.lr = lr;
    return em_optim_new(&c, params, n);
}

em_optim *em_adamw_new(em_tensor *const *params, int n, double lr, double weight_decay)
{
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAMW);
    c.lr = lr;
    c.weight_decay = weight_decay;
    return em_optim_new(&c, params, n);
}

void em_optim_free(em_optim *o)
{
    if (!o) return;
    for (int i = 0; i < o->n; i++) {
        em_tensor_release(o->ps[i].param);
        for (int s = 0; s < MAX_SLOTS; s++) em_tensor_release(o->ps[i].st[s]);
    }
    free(o->ps);
    free(o);
}

/* A caller-owned state tensor shaped like p, filled with v. */
static em_tensor *new_state(const em_tensor *p, double v)
{
    em_scope_begin();
    em_tensor *t = em_full(p->shape, p->ndim, p->dtype, v);
    em_tensor_retain(t);
    em_scope_end();
    return t;
}

static double slot_init_value(const em_optim *o, int slot)
{
    (void)slot;
    return o->cfg.kind == EM_OPTIM_ADAGRAD ? o->cfg.initial_accumulator_value : 0.0;
}

static bool same_shape(const em_tensor *a, const em_tensor *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}


/* The kind and parameters of parameter @p ps's update at step @p step
 * (1-based), from the optimizer's current configuration (a scheduler may
 * have changed the rate); @p fresh: its state buffers were just made. */
static enum em_op_kind step_params(const em_optim *o, const pstate *ps, int64_t step, bool fresh, union em_op_params *p)
{
    const em_optim_config *c = &o->cfg;
    enum em_op_kind kind = EM_OP_SGD_STEP;
    memset(p, 0, sizeof *p);
    int32_t fl = c->maximize ? EM_OPTIM_F_MAXIMIZE : 0;
    p->optim.lr = c->lr;
    p->optim.weight_decay = ps->wd_own ? ps->wd : c->weight_decay;
    p->optim.eps = c->eps;
    p->optim.step = step;
    switch (c->kind) {
    case EM_OPTIM_SGD:
        kind = EM_OP_SGD_STEP;
        p->optim.momentum = c->momentum;
        p->optim.dampening = c->dampening;
        if (c->momentum != 0) fl |= EM_OPTIM_F_MOMENTUM | (fresh ? EM_OPTIM_F_INIT_BUF : 0);
        if (c->nesterov) fl |= EM_OPTIM_F_NESTEROV;
        break;
    case EM_OPTIM_ADAM:
    case EM_OPTIM_ADAMW:
        kind = EM_OP_ADAM_STEP;
        p->optim.beta1 = c->beta1;
        p->optim.beta2 = c->beta2;
        if (c->amsgrad) fl |= EM_OPTIM_F_AMSGRAD;
        if (c->kind == EM_OPTIM_ADAMW) fl |= EM_OPTIM_F_DECOUPLED;
        break;
    case EM_OPTIM_RMSPROP:
        kind = EM_OP_RMSPROP_STEP;
        p->optim.alpha = c->alpha;
        p->optim.momentum = c->momentum;
        if (c->momentum > 0) fl |= EM_OPTIM_F_MOMENTUM;
        if (c->centered) fl |= EM_OPTIM_F_CENTERED;
        break;
    case EM_OPTIM_ADAGRAD:
        kind = EM_OP_ADAGRAD_STEP;
        /* torch: clr = lr / (1 + (step - 1) * lr_decay), in double */
        p->optim.lr = c->lr / (1.0 + (double)(step - 1) * c->lr_decay);
        break;
    }
    p->optim.flags = fl;
    return kind;
}

/* A captured update's replay (em__capture_patch_last): the parameter's next
 * step, counted on the optimizer as an eager em_optim_step would. */
typedef struct replay_ctx {
    em_optim *o;
    int i;
} replay_ctx;

static void replay_patch(void *ctx, union em_op_params *p)
{
    replay_ctx rc;
    memcpy(&rc, ctx, sizeof rc);
    pstate *ps = &rc.o->ps[rc.i];
    ps->step++;
    step_params(rc.o, ps, ps->step, false, p);
}

em_status em_optim_step(em_optim *o, const em_grads *grads)
{
    if (!o || !grads) return em__set_error(EM_ERR_INVALID, "em_optim_step: %s is NULL", !o ? "optimizer" : "grads");
    const char *k = em_optim_kind_name(o->cfg.kind);
    em_status st = EM_OK;
    em_tensor **gs = calloc((size_t)o->n, sizeof *gs);
    if (!gs) return em__set_error(EM_ERR_NOMEM, "%s: out of memory", k);
    em_no_grad_begin();
    em_scope_begin();
    /* Pass 1: validate every gradient and make it contiguous in the param's
     * dtype, so an error leaves every parameter untouched. */
    for (int i = 0; i < o->n && st == EM_OK; i++) {
        em_tensor *p = o->ps[i].param;
        em_tensor *g = em_grad(grads, p);
        if (!g) continue;
        char sp[160], sg[160];
        if (!same_shape(g, p)) {
            st = em__set_error(EM_ERR_SHAPE, "%s: gradient of shape %s does not match parameter %d of shape %s", k,
                               em_shape_str(g->shape, g->ndim, sg, sizeof sg), i, em_shape_str(p->shape, p->ndim, sp, sizeof sp));
            break;
        }
        if (!em_dtype_is_float(g->dtype)) {
            st = em__set_error(EM_ERR_DTYPE, "%s: gradient of parameter %d has non-float dtype %s", k, i, em_dtype_name(g->dtype));
            break;
        }
        if (g->dtype != p->dtype)
            g = em_cast(g, p->dtype);
        else if (!em_tensor_is_contiguous(g))
            g = em_contiguous(g);
        if (!g) {
            st = em_last_status();
            break;
        }
        gs[i] = g;
    }
    /* Pass 2: one fused task per parameter. In data-parallel training the
     * gradient all-reduce sets a fence on @p grads (dist/): the updates then
     * wait for the end of backward and yield to other ready tasks (priority
     * -1), so that a GPU runs the last layers' backward, whose gradients
     * are the last to be reduced, before the updates of layers already
     * reduced; those updates then overlap the last all-reduce instead of
     * delaying it. Without a fence, nothing changes. */
    void *fence = em__grads_fence(grads);
    for (int i = 0; i < o->n && st == EM_OK; i++) {
        if (!gs[i]) continue;
        pstate *ps = &o->ps[i];
        bool fresh = false;
        for (int s = 0; s < o->nslots; s++)
            if (!ps->st[s]) {
                ps->st[s] = new_state(ps->param, slot_init_value(o, s));
                if (!ps->st[s]) {
                    st = em_last_status();
                    break;
                }
                fresh = true;
            }
        if (st != EM_OK) break;
        if (fresh) /* a replay would zero the state again: capture after a first, eager step */
            em__capture_refuse("the optimizer created its state in this step (capture after a warm-up step)");
        int64_t step = ps->step + 1;
        em_op op;
        memset(&op, 0, sizeof op);
        op.n_in = 1;
        op.in[0] = gs[i];
        op.n_out = 1 + o->nslots;
        op.out[0] = ps->param;
        for (int s = 0; s < o->nslots; s++) op.out[1 + s] = ps->st[s];
        op.kind = step_params(o, ps, step, fresh, &op.p);
        op.after = fence;
        op.priority = fence ? -1 : 0;
        st = em__submit(&op);
        if (st == EM_OK) {
            ps->step = step;
            if (em__capture_current()) { /* a replay is the next step: its count and the current rate */
                const replay_ctx rc = {o, i};
                em__capture_patch_last(op.kind, replay_patch, &rc, sizeof rc);
            }
        }
    }
    em_scope_end();
    em_no_grad_end();
    free(gs);
    return st;
}

double em_optim_get_lr(const em_optim *o) { return o ? o->cfg.lr : NAN; }

em_status em_optim_set_lr(em_optim *o, double lr)
{
    if (!o) return em__set_error(EM_ERR_INVALID, "em_optim_set_lr: optimizer is NULL");
    if (!(lr >= 0)) return em__set_error(EM_ERR_INVALID, "em_optim_set_lr: invalid learning rate %g", lr);
    o->cfg.lr = lr;
    return EM_OK;
}

const em_optim_config *em_optim_get_config(const em_optim *o) { return o ? &o->cfg : NULL; }

em_status em_optim_set_param_weight_decay(em_optim *o, int i, double weight_decay)
{
    if (!o) return em__set_error(EM_ERR_INVALID, "em_optim_set_param_weight_decay: optimizer is NULL");
    if (i < 0 || i >= o->n)
        return em__set_error(EM_ERR_INVALID, "em_optim_set_param_weight_decay: parameter index %d out of range [0, %d)", i, o->n);
    if (!(weight_decay >= 0) || isinf(weight_decay))
        return em__set_error(EM_ERR_INVALID, "em_optim_set_param_weight_decay: invalid weight_decay %g (must be finite and >= 0)",
                             weight_decay);
    o->ps[i].wd = weight_decay;
    o->ps[i].wd_own = true;
    return EM_OK;
}

double em_optim_get_param_weight_decay(const em_optim *o, int i)
{
    if (!o || i < 0 || i >= o->n) return NAN;
    return o->ps[i].wd_own ? o->ps[i].wd : o->cfg.weight_decay;
}
int em_optim_num_params(const em_optim *o) { return o ? o->n : 0; }

em_tensor *em_optim_param(const em_optim *o, int i)
{
    if (!o || i < 0 || i >= o->n) return em__fail(EM_ERR_INVALID, "em_optim_param: index %d out of range", i);
    return o->ps[i].param;
}

/* ---- state ---------------------------------------------------------------------- */

em_status em_optim_state_visit(const em_optim *o, em_tensor_visitor cb, void *ud)
{
    if (!o || !cb) return em__set_error(EM_ERR_INVALID, "em_optim_state_visit: %s is NULL", !o ? "optimizer" : "callback");
    char key[96];
    for (int i = 0; i < o->n; i++) {
        const pstate *ps = &o->ps[i];
        bool any = ps->step > 0;
        for (int s = 0; s < o->nslots; s++) any = any || ps->st[s];
        if (!any) continue;
        /* the step counter as a 0-d float64 snapshot, as torch keeps "step" */
        em_scope_begin();
        em_tensor *stp = em_scalar((double)ps->step, EM_F64);
        if (stp) {
            snprintf(key, sizeof key, "state.%d.step", i);
            cb(key, stp, ud);
        }
        em_scope_end();
        if (!stp) return em_last_status();
        for (int s = 0; s < o->nslots; s++) {
            if (!ps->st[s]) continue;
            snprintf(key, sizeof key, "state.%d.%s", i, o->slot[s]);
            cb(key, ps->st[s], ud);
        }
    }
    return EM_OK;
}

/* Parses "state.<i>.<name>"; returns the index and the name. */
static em_status parse_key(const em_optim *o, const char *key, int *idx, const char **name)
{
    if (!key || strncmp(key, "state.", 6) != 0)
        return em__set_error(EM_ERR_INVALID, "em_optim_state_set: key '%s' does not start with 'state.'", key ? key : "(null)");
    char *end;
    errno = 0;
    long i = strtol(key + 6, &end, 10);
    if (end == key + 6 || *end != '.' || errno || i < 0 || i >= o->n)
        return em__set_error(EM_ERR_INVALID, "em_optim_state_set: key '%s' has no valid parameter index (0..%d)", key, o->n - 1);
    *idx = (int)i;
    *name = end + 1;
    return EM_OK;
}

em_status em_optim_state_set(em_optim *o, const char *key, const em_tensor *value)
{
    if (!o || !value) return em__set_error(EM_ERR_INVALID, "em_optim_state_set: %s is NULL", !o ? "optimizer" : "value");
    int i = 0;
    const char *name = "";
    em_status st = parse_key(o, key, &i, &name);
    if (st != EM_OK) return st;
    pstate *ps = &o->ps[i];
    if (!strcmp(name, "step")) {
        double v;
        if (em_tensor_numel(value) != 1)
            return em__set_error(EM_ERR_SHAPE, "em_optim_state_set: '%s' must hold one value, got %lld", key,
                                 (long long)em_tensor_numel(value));
        st = em_item(value, &v);
        if (st != EM_OK) return st;
        return em_optim_set_step(o, i, (int64_t)llround(v));
    }
    int s = 0;
    while (s < o->nslots && strcmp(o->slot[s], name)) s++;
    if (s == o->nslots)
        return em__set_error(EM_ERR_INVALID, "em_optim_state_set: %s (this configuration) has no state '%s' (key '%s')",
                             em_optim_kind_name(o->cfg.kind), name, key);
    char sv[160], sp[160];
    if (!same_shape(value, ps->param))
        return em__set_error(EM_ERR_SHAPE, "em_optim_state_set: '%s' of shape %s does not match parameter %d of shape %s", key,
                             em_shape_str(value->shape, value->ndim, sv, sizeof sv), i,
                             em_shape_str(ps->param->shape, ps->param->ndim, sp, sizeof sp));
    if (!em_dtype_is_float(value->dtype))
        return em__set_error(EM_ERR_DTYPE, "em_optim_state_set: '%s' must be float, got %s", key, em_dtype_name(value->dtype));
    if (!ps->st[s]) {
        ps->st[s] = new_state(ps->param, 0.0);
        if (!ps->st[s]) return em_last_status();
    }
    return em_copy_(ps->st[s], value);
}

int64_t em_optim_get_step(const em_optim *o, int i)
{
    if (!o || i < 0 || i >= o->n) return em__set_error(EM_ERR_INVALID, "em_optim_get_step: parameter index %d out of range", i);
    return o->ps[i].step;
}

em_status em_optim_set_step(em_optim *o, int i, int64_t step)
{
    if (!o || i < 0 || i >= o->n) return em__set_error(EM_ERR_INVALID, "em_optim_set_step: parameter index %d out of range", i);
    if (step < 0) return em__set_error(EM_ERR_INVALID, "em_optim_set_step: step must be >= 0, got %lld", (long long)step);
    o->ps[i].step = step;
    return EM_OK;
}
