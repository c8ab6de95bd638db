#include "tools/tools.h"

#include <stdio.h>
#include <string.h>

int em_tool_parse_optim(const char *name, em_optim_kind *out)
{
    static const struct { const char *n; em_optim_kind k; } t[] = {
        {"adam", EM_OPTIM_ADAM}, {"adamw", EM_OPTIM_ADAMW}, {"sgd", EM_OPTIM_SGD},
        {"rmsprop", EM_OPTIM_RMSPROP}, {"adagrad", EM_OPTIM_ADAGRAD}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(name, t[i].n)) {
            *out = t[i].k;
            return 0;
        }
    return -1;
}

int64_t em_tool_default_warmup(int64_t total_steps)
{
    if (total_steps <= 1) return 0;
    int64_t w = (total_steps + 9) / 10; /* ceil(0.1 * total), transformers' warmup_ratio = 0.1 */
    return w < total_steps ? w : total_steps - 1;
}

int em_tool_check_scheduler(const char *name, int64_t warmup, char *err, size_t nerr)
{
    static const char *const names[] = {"constant", "step", "cosine", "exponential", "warmup-cosine"};
    bool known = false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) known = known || !strcmp(name, names[i]);
    if (!known) {
        snprintf(err, nerr, "unknown scheduler '%s' (constant, step, cosine, exponential, warmup-cosine)", name);
        return -1;
    }
    if (warmup >= 0 && strcmp(name, "warmup-cosine") != 0) {
        snprintf(err, nerr, "--warmup applies to --scheduler warmup-cosine only (not '%s')", name);
        return -1;
    }
    return 0;
}

em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs, int64_t steps_per_epoch, int64_t warmup,
                                        bool *per_step, char *err, size_t nerr)
{
    *per_step = false;
    if (err && nerr) err[0] = 0;
    if (epochs < 1 || steps_per_epoch < 1) {
        snprintf(err, nerr, "scheduler: need at least one epoch and one step per epoch (got %lld and %lld)", (long long)epochs,
                 (long long)steps_per_epoch);
        return NULL;
    }
    if (em_tool_check_scheduler(name, warmup, err, nerr) != 0) return NULL;
    em_lr_scheduler *s = NULL;
    if (!strcmp(name, "constant")) s = em_lr_constant(lr);
    else if (!strcmp(name, "step")) s = em_lr_step(lr, epochs / 3 > 0 ? epochs / 3 : 1, 0.1);
    else if (!strcmp(name, "cosine")) s = em_lr_cosine(lr, epochs, 0.0);
    else if (!strcmp(name, "exponential")) s = em_lr_exponential(lr, 0.9);
    else if (!strcmp(name, "warmup-cosine")) {
        int64_t total = epochs * steps_per_epoch;
        if (warmup < 0) warmup = em_tool_default_warmup(total);
        if (warmup >= total) {
            snprintf(err, nerr, "--warmup %lld must be below the run's %lld optimizer steps (%lld epochs x %lld steps)",
                     (long long)warmup, (long long)total, (long long)epochs, (long long)steps_per_epoch);
            return NULL;
        }
        s = em_lr_warmup_cosine(lr, warmup, total, 0.0);
        *per_step = true;
    }
    if (!s) snprintf(err, nerr, "scheduler %s: %s", name, em_last_error());
    return s;
}
