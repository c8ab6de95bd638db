/* Shared by the benchmark programs: a monotonic clock and a check that ends
 * the program with Ember's last error. */
#ifndef EMBER_BENCH_UTIL_H
#define EMBER_BENCH_UTIL_H

#include "ember/ember.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/** Seconds on CLOCK_MONOTONIC. */
static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/** Evaluates @p x; when false, prints the expression and em_last_error()
 *  (prefixed by the benchmark's source file) and exits 1. */
#define CK(x)                                                                         \
    do {                                                                              \
        if (!(x)) {                                                                   \
            fprintf(stderr, "%s: %s failed: %s\n", __FILE__, #x, em_last_error());    \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#endif
