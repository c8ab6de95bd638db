/* The op table (tasks/ops.def) as the tests see it: every kind's name and
 * flags, and a coverage check over the differentiable kinds. Only the
 * table's macros are used: no internal symbol of libember is linked. */
#ifndef EMBER_TEST_OPTABLE_H
#define EMBER_TEST_OPTABLE_H

#include "devices/devices.h" /* op kinds, F_* flags */
#include "ember/ember.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct em_test_kind {
    const char *name;
    unsigned flags;
} em_test_kind;

static const em_test_kind em_test_kinds[] = {
#define OP(E, nm, nin, nout, fl, fam, bw) {#nm, fl},
#include "tasks/ops.def"
};

/* The element-wise kinds by their public functions: em_<name> for every
 * EW1 (unary), EWS (tensor op scalar) and EW2 (binary) line of the table. */
typedef struct em_test_ew1_fn {
    const char *name;
    em_tensor *(*f)(const em_tensor *);
} em_test_ew1_fn;
typedef struct em_test_ews_fn {
    const char *name;
    em_tensor *(*f)(const em_tensor *, double);
} em_test_ews_fn;
typedef struct em_test_ew2_fn {
    const char *name;
    em_tensor *(*f)(const em_tensor *, const em_tensor *);
} em_test_ew2_fn;

__attribute__((unused)) static const em_test_ew1_fn em_test_ew1_fns[] = {
#define EW1(E, nm, fl, fx, ix, bw) {#nm, em_##nm},
#define EWS(E, nm, fl, fx, ix, bw)
#define EWP(E, nm, fl, fx, ix, bw)
#define EW2(E, nm, fl, fx, ix, bw)
#define OP(E, nm, nin, nout, fl, fam, bw)
#include "tasks/ops.def"
};
__attribute__((unused)) static const em_test_ews_fn em_test_ews_fns[] = {
#define EWS(E, nm, fl, fx, ix, bw) {#nm, em_##nm},
#define EW1(E, nm, fl, fx, ix, bw)
#define EWP(E, nm, fl, fx, ix, bw)
#define EW2(E, nm, fl, fx, ix, bw)
#define OP(E, nm, nin, nout, fl, fam, bw)
#include "tasks/ops.def"
};
__attribute__((unused)) static const em_test_ew2_fn em_test_ew2_fns[] = {
#define EW2(E, nm, fl, fx, ix, bw) {#nm, em_##nm},
#define EW1(E, nm, fl, fx, ix, bw)
#define EWS(E, nm, fl, fx, ix, bw)
#define EWP(E, nm, fl, fx, ix, bw)
#define OP(E, nm, nin, nout, fl, fam, bw)
#include "tasks/ops.def"
};

/* Counts (and prints, prefixed by @p who) the F_DIFF kinds for which
 * covered(name, ctx) is false. */
static inline int em_test_uncovered_diff_kinds(bool (*covered)(const char *name, void *ctx), void *ctx, const char *who)
{
    int missing = 0;
    for (size_t k = 0; k < sizeof em_test_kinds / sizeof em_test_kinds[0]; k++) {
        if (!(em_test_kinds[k].flags & F_DIFF) || covered(em_test_kinds[k].name, ctx)) continue;
        printf("%s: differentiable op '%s' has no case\n", who, em_test_kinds[k].name);
        missing++;
    }
    return missing;
}

#endif
