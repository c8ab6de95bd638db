#include "tools/tools.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
            snprintf(err, nerr, "--warmup %lld must be below the run's %lld optimizer step%s (%lld epoch%s x %lld step%s)",
                     (long long)warmup, (long long)total, total == 1 ? "" : "s", (long long)epochs, epochs == 1 ? "" : "s",
                     (long long)steps_per_epoch, steps_per_epoch == 1 ? "" : "s");
            return NULL;
        }
        s = em_lr_warmup_cosine(lr, warmup, total, 0.0);
        *per_step = true;
    }
    if (!s) snprintf(err, nerr, "scheduler %s: %s", name, em_last_error());
    return s;
}

/* ---- strict command-line values (usage errors exit 2) ---- */

/* The accepted range of an integer flag, e.g. "an integer >= 1", "an integer in [1, 256]". */
static void i64_range(char *buf, size_t n, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX) snprintf(buf, n, "an integer >= %lld", (long long)lo);
    else snprintf(buf, n, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
}

int em_tool_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char range[96];
    i64_range(range, sizeof range, lo, hi);
    char *end = NULL;
    errno = 0;
    long long v = s && *s && !isspace((unsigned char)*s) ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || !end || end == s || *end) {
        fprintf(stderr, "ember %s: %s: '%s' is not an integer (expected %s)\n", cmd, flag, s ? s : "", range);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "ember %s: %s: %s is out of range (expected %s)\n", cmd, flag, s, range);
        return -1;
    }
    *out = v;
    return 0;
}

int em_tool_parse_f64(const char *cmd, const char *flag, const char *s, double lo, bool lo_open, double hi, bool hi_open,
                      double *out)
{
    char range[96];
    if (isinf(hi)) snprintf(range, sizeof range, "a finite number %s %g", lo_open ? ">" : ">=", lo);
    else snprintf(range, sizeof range, "a number in %s%g, %g%s", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
    char *end = NULL;
    errno = 0;
    double v = s && *s && !isspace((unsigned char)*s) ? strtod(s, &end) : 0;
    if (!s || !*s || !end || end == s || *end) {
        fprintf(stderr, "ember %s: %s: '%s' is not a number (expected %s)\n", cmd, flag, s ? s : "", range);
        return -1;
    }
    if (!isfinite(v)) {
        fprintf(stderr, "ember %s: %s: '%s' is not a finite number (expected %s)\n", cmd, flag, s, range);
        return -1;
    }
    if (v < lo || (lo_open && v == lo) || v > hi || (hi_open && v == hi)) {
        fprintf(stderr, "ember %s: %s: %s is out of range (expected %s)\n", cmd, flag, s, range);
        return -1;
    }
    *out = v;
    return 0;
}

int em_tool_bad_option(const char *cmd, int c, int argc, char **argv)
{
    const char *arg = optind >= 1 && optind <= argc ? argv[optind - 1] : "";
    char name[128];
    if (!strncmp(arg, "--", 2)) {
        snprintf(name, sizeof name, "%s", arg);
        char *eq = strchr(name, '=');
        if (eq) *eq = 0;
    } else if (optopt > 0 && optopt < 128) {
        snprintf(name, sizeof name, "-%c", optopt);
    } else {
        snprintf(name, sizeof name, "%s", arg);
    }
    if (c == ':') fprintf(stderr, "ember %s: %s needs a value (see 'ember %s --help')\n", cmd, name, cmd);
    else fprintf(stderr, "ember %s: unknown option '%s' (see 'ember %s --help')\n", cmd, name, cmd);
    return 2;
}

int em_tool_no_operands(const char *cmd, int argc, char **argv)
{
    if (optind >= argc) return 0;
    fprintf(stderr, "ember %s: unexpected argument '%s' (see 'ember %s --help')\n", cmd, argv[optind], cmd);
    return 2;
}
