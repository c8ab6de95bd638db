/* The op table (tasks/ops.def) as the tests see it: every kind's name and
 * flags, and a coverage check over the differentiable kinds. Only the
 * table's macros are used: no internal symbol of libember is linked. */
#ifndef EMBER_TEST_OPTABLE_H
#define EMBER_TEST_OPTABLE_H

#include "devices/devices.h" /* op kinds, F_* flags */

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
