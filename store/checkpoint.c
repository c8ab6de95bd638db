/* Checkpoints: model + optimizer state + scheduler + progress in one
 * SafeTensors file, written atomically (em_safetensors_save). */
#include "ember/train.h"
#include "runtime/runtime_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct named {
    char **names;
    em_tensor **ts;
    size_t n, cap;
    const char *prefix;
    em_status st;
} named;

static void collect(const char *key, em_tensor *t, void *ud)
{
    named *c = ud;
    if (c->st != EM_OK) return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 32;
        char **nn = realloc(c->names, sizeof *nn * cap);
        if (nn) c->names = nn;
        em_tensor **nt = realloc(c->ts, sizeof *nt * cap);
        if (nt) c->ts = nt;
        if (!nn || !nt) {
            c->st = em__set_error(EM_ERR_NOMEM, "out of memory");
            return;
        }
        c->cap = cap;
    }
    size_t len = strlen(c->prefix) + strlen(key) + 1;
    char *s = malloc(len);
    if (!s) {
        c->st = em__set_error(EM_ERR_NOMEM, "out of memory");
        return;
    }
    snprintf(s, len, "%s%s", c->prefix, key);
    c->names[c->n] = s;
    c->ts[c->n] = em_tensor_retain(t); /* visitors may hand out temporaries */
    c->n++;
}

static void named_free(named *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->names[i]);
        em_tensor_release(c->ts[i]);
    }
    free(c->names);
    free(c->ts);
}

#define META_MAX 64

em_status em_checkpoint_save(const char *path, const em_module *model, const em_optim *opt, const em_lr_scheduler *sched,
                             const em_checkpoint_info *info, const em_st_kv *meta, size_t n_meta)
{
    if (!path || !model) return em__set_error(EM_ERR_INVALID, "em_checkpoint_save: %s is NULL", !path ? "path" : "model");
    if (n_meta > META_MAX - 16) return em__set_error(EM_ERR_INVALID, "em_checkpoint_save: too many metadata entries");
    named c = {.prefix = "model."};
    em_module_visit_params(model, collect, &c);
    if (c.st == EM_OK) em_module_visit_buffers(model, collect, &c); /* BatchNorm's running statistics, as PyTorch's state_dict */
    if (opt && c.st == EM_OK) {
        c.prefix = "optim.";
        em_optim_state_visit(opt, collect, &c);
    }
    if (c.st != EM_OK) {
        named_free(&c);
        return c.st;
    }
    char vals[16][48];
    em_st_kv kv[META_MAX];
    size_t k = 0;
    em_checkpoint_info z = {0};
    if (!info) info = &z;
#define PUT(K_, fmt, v)                                          \
    do {                                                         \
        snprintf(vals[k], sizeof vals[k], fmt, v);               \
        kv[k] = (em_st_kv){.key = K_, .value = vals[k]};         \
        k++;                                                     \
    } while (0)
    PUT("ember.format", "%s", "checkpoint-1");
    PUT("ember.epoch", "%" PRId64, info->epoch);
    PUT("ember.step", "%" PRId64, info->step);
    PUT("ember.best_metric", "%.17g", info->best_metric);
    PUT("ember.best_epoch", "%" PRId64, info->best_epoch);
    PUT("ember.bad_epochs", "%" PRId64, info->bad_epochs);
    PUT("ember.rng_seed", "%" PRIu64, info->rng_seed);
    PUT("ember.rng_offset", "%" PRIu64, info->rng_offset);
    PUT("ember.sched_step", "%" PRId64, sched ? em_lr_scheduler_get_step(sched) : (int64_t)0);
    PUT("ember.lr", "%.17g", opt ? em_optim_get_lr(opt) : 0.0);
    PUT("ember.optim_kind", "%s", opt ? em_optim_kind_name(em_optim_get_config(opt)->kind) : "none");
    PUT("ember.optim_nparams", "%d", opt ? em_optim_num_params(opt) : 0);
#undef PUT
    /* per-parameter step counters in one comma-separated string */
    char *steps = NULL;
    if (opt) {
        int np = em_optim_num_params(opt);
        steps = malloc((size_t)np * 21 + 2);
        if (!steps) {
            named_free(&c);
            return em__set_error(EM_ERR_NOMEM, "out of memory");
        }
        size_t pos = 0;
        steps[0] = 0;
        for (int i = 0; i < np; i++)
            pos += (size_t)snprintf(steps + pos, 22, i ? ",%" PRId64 : "%" PRId64, em_optim_get_step(opt, i));
        kv[k++] = (em_st_kv){.key = "ember.optim_steps", .value = steps};
    }
    for (size_t i = 0; i < n_meta; i++) kv[k++] = meta[i];
    em_status st = em_safetensors_save(path, (const char *const *)c.names, c.ts, c.n, kv, k);
    free(steps);
    named_free(&c);
    return st;
}

/* Strict metadata values: a missing key leaves the default (files of older
 * versions), a malformed one is an error naming the key. */
static em_status meta_i64(const em_st_file *f, const char *path, const char *key, int64_t min, int64_t *out)
{
    const char *s = em_safetensors_metadata(f, key);
    if (!s) return EM_OK;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < min)
        return em__set_error(EM_ERR_FORMAT, "%s: metadata '%s' is \"%.40s\", not an integer >= %lld", path, key, s,
                             (long long)min);
    *out = v;
    return EM_OK;
}

static em_status meta_u64(const em_st_file *f, const char *path, const char *key, uint64_t *out)
{
    const char *s = em_safetensors_metadata(f, key);
    if (!s) return EM_OK;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-')
        return em__set_error(EM_ERR_FORMAT, "%s: metadata '%s' is \"%.40s\", not an unsigned integer", path, key, s);
    *out = v;
    return EM_OK;
}

static em_status meta_f64(const em_st_file *f, const char *path, const char *key, double *out, bool *present)
{
    const char *s = em_safetensors_metadata(f, key);
    if (present) *present = s != NULL;
    if (!s) return EM_OK;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end)
        return em__set_error(EM_ERR_FORMAT, "%s: metadata '%s' is \"%.40s\", not a number", path, key, s);
    *out = v;
    return EM_OK;
}

/* Restores every optim.* tensor of @p f into @p opt. */
static em_status apply_optim_state(const em_st_file *f, const char *path, em_optim *opt)
{
    em_status st = EM_OK;
    for (size_t i = 0; i < em_safetensors_count(f) && st == EM_OK; i++) {
        const em_st_tensor *t = em_safetensors_at(f, i);
        if (strncmp(t->name, "optim.", 6)) continue;
        em_tensor *v = em_safetensors_tensor(f, t->name);
        if (!v) return em_last_status();
        em__scope_remove(v);
        st = em_optim_state_set(opt, t->name + 6, v);
        if (st != EM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", em_last_error());
            em__set_error(st, "%s: optimizer state '%s': %s", path, t->name, why);
        }
        em_tensor_release(v);
    }
    return st;
}

em_status em_checkpoint_load(const char *path, em_module *model, em_optim *opt, em_lr_scheduler *sched,
                             em_checkpoint_info *info)
{
    if (!path || !model) return em__set_error(EM_ERR_INVALID, "em_checkpoint_load: %s is NULL", !path ? "path" : "model");
    em_st_file *f = em_safetensors_open(path);
    if (!f) return em_last_status();
    em_status st = EM_OK;
    int64_t *steps = NULL;
    named c = {.prefix = "model."};
    const char *fmt = em_safetensors_metadata(f, "ember.format");
    if (!fmt || strcmp(fmt, "checkpoint-1") != 0) {
        st = em__set_error(EM_ERR_FORMAT, "%s: not an Ember checkpoint (metadata 'ember.format' is %s)", path,
                           fmt ? fmt : "missing");
        goto out;
    }
    /* Everything is checked before anything is written, so that a failed
     * load leaves the model, optimizer and scheduler as they were: first the
     * metadata, */
    em_checkpoint_info ci = {0};
    int64_t sched_step = 0;
    double lr = 0;
    bool has_lr = false;
    if ((st = meta_i64(f, path, "ember.epoch", 0, &ci.epoch)) || (st = meta_i64(f, path, "ember.step", 0, &ci.step)) ||
        (st = meta_i64(f, path, "ember.best_epoch", INT64_MIN, &ci.best_epoch)) ||
        (st = meta_i64(f, path, "ember.bad_epochs", 0, &ci.bad_epochs)) ||
        (st = meta_f64(f, path, "ember.best_metric", &ci.best_metric, NULL)) ||
        (st = meta_u64(f, path, "ember.rng_seed", &ci.rng_seed)) ||
        (st = meta_u64(f, path, "ember.rng_offset", &ci.rng_offset)) ||
        (st = meta_i64(f, path, "ember.sched_step", 0, &sched_step)) ||
        (st = meta_f64(f, path, "ember.lr", &lr, &has_lr)))
        goto out;
    /* then the model: every parameter and buffer key present with its shape; no extra model.* keys */
    em_module_visit_params(model, collect, &c);
    if (c.st == EM_OK) em_module_visit_buffers(model, collect, &c);
    if (c.st != EM_OK) {
        st = c.st;
        goto out;
    }
    size_t nfile_model = 0;
    for (size_t i = 0; i < em_safetensors_count(f); i++)
        if (!strncmp(em_safetensors_at(f, i)->name, "model.", 6)) nfile_model++;
    if (nfile_model != c.n) {
        for (size_t i = 0; i < em_safetensors_count(f); i++) {
            const char *nm = em_safetensors_at(f, i)->name;
            if (strncmp(nm, "model.", 6)) continue;
            bool known = false;
            for (size_t j = 0; j < c.n && !known; j++) known = !strcmp(c.names[j], nm);
            if (!known) {
                st = em__set_error(EM_ERR_FORMAT, "%s: unexpected key '%s' (a checkpoint of another model? it has %zu model "
                                   "tensors, this model %zu)", path, nm, nfile_model, c.n);
                goto out;
            }
        }
    }
    /* then the optimizer: its kind, parameter count, step counters, and each
     * state tensor tried on a scratch optimizer over the same parameters */
    int np = opt ? em_optim_num_params(opt) : 0;
    if (opt) {
        const char *kind = em_safetensors_metadata(f, "ember.optim_kind");
        if (kind && strcmp(kind, em_optim_kind_name(em_optim_get_config(opt)->kind)) != 0) {
            st = em__set_error(EM_ERR_FORMAT, "%s: optimizer state is for %s, this run uses %s", path, kind,
                               em_optim_kind_name(em_optim_get_config(opt)->kind));
            goto out;
        }
        int64_t fnp = np;
        if ((st = meta_i64(f, path, "ember.optim_nparams", 0, &fnp))) goto out;
        if (kind && strcmp(kind, "none") && fnp != np) {
            st = em__set_error(EM_ERR_FORMAT, "%s: the checkpoint's optimizer has %lld parameters, this one %d", path,
                               (long long)fnp, np);
            goto out;
        }
        const char *s = em_safetensors_metadata(f, "ember.optim_steps");
        if (s && np > 0) {
            steps = calloc((size_t)np, sizeof *steps);
            if (!steps) {
                st = em__set_error(EM_ERR_NOMEM, "out of memory");
                goto out;
            }
            const char *p = s;
            for (int i = 0; i < np; i++) {
                char *end;
                errno = 0;
                long long v = strtoll(p, &end, 10);
                if (end == p || errno || v < 0 || (*end != (i + 1 < np ? ',' : '\0'))) {
                    st = em__set_error(EM_ERR_FORMAT,
                                       "%s: metadata 'ember.optim_steps' is not %d comma-separated integers >= 0 "
                                       "(entry %d of \"%.60s\")",
                                       path, np, i, s);
                    goto out;
                }
                steps[i] = v;
                p = end + (*end == ',');
            }
        }
        em_tensor **params = malloc((size_t)(np ? np : 1) * sizeof *params);
        if (!params) {
            st = em__set_error(EM_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int i = 0; i < np; i++) params[i] = em_optim_param(opt, i);
        em_optim *scratch = em_optim_new(em_optim_get_config(opt), params, np);
        free(params);
        if (!scratch) {
            st = em_last_status() < 0 ? em_last_status() : EM_ERR_RUNTIME;
            goto out;
        }
        st = apply_optim_state(f, path, scratch);
        em_optim_free(scratch);
        if (st != EM_OK) goto out;
    }
    /* now write: the model (em_safetensors_load_from checks every shape and
     * dtype before its first copy), then the optimizer, the scheduler */
    st = em_safetensors_load_from(f, (const char *const *)c.names, c.ts, c.n, false);
    if (st != EM_OK) goto out;
    if (opt) {
        st = apply_optim_state(f, path, opt);
        for (int i = 0; steps && st == EM_OK && i < np; i++) st = em_optim_set_step(opt, i, steps[i]);
        if (st == EM_OK && has_lr) st = em_optim_set_lr(opt, lr);
        if (st != EM_OK) goto out;
    }
    if (sched && em_safetensors_metadata(f, "ember.sched_step")) em_lr_scheduler_set_step(sched, sched_step);
    if (info) *info = ci;
out:
    named_free(&c);
    free(steps);
    em_safetensors_close(f);
    return st;
}
