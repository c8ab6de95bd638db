#include "tools/tools.h"

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

em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs)
{
    if (!strcmp(name, "constant")) return em_lr_constant(lr);
    if (!strcmp(name, "step")) return em_lr_step(lr, epochs / 3 > 0 ? epochs / 3 : 1, 0.1);
    if (!strcmp(name, "cosine")) return em_lr_cosine(lr, epochs, 0.0);
    if (!strcmp(name, "exponential")) return em_lr_exponential(lr, 0.9);
    if (!strcmp(name, "warmup-cosine")) return em_lr_warmup_cosine(lr, 1, epochs, 0.0);
    return NULL;
}
