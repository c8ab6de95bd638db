/* Fault injection, for testing the error paths (DESIGN.md §10).
 *
 *   EMBER_FAULT_INJECT=kernel:N   the Nth op kernel run after em_init
 *                                 (counted over every backend: CPU, CUDA,
 *                                 OpenCL; the codelets of tasks/funnel.c, not
 *                                 dist's reduction or fence tasks) does not
 *                                 run and reports an injected device error
 *   EMBER_FAULT_INJECT=alloc:N    the Nth tracked allocation fails (tensor
 *                                 header, storage, autodiff node)
 *   EMBER_FAULT_INJECT=node:N     the Nth autodiff node allocation fails
 *
 * Several can be combined with commas ("kernel:3,node:1"). The variable is
 * read by em_init; em__fault_inject (exported for tests/test_faults.c, not
 * public API) re-arms the counters from a spec at any time. Each fault fires
 * once. When nothing is armed the checks cost one relaxed load of a global
 * (see em__fault_kernel / EM_FAULT_ALLOC in runtime/runtime_internal.h). */
#include "runtime/runtime_internal.h"

#include <stdlib.h>
#include <string.h>

int64_t em__fault_at[EM_FAULT_COUNT];
static int64_t g_seen[EM_FAULT_COUNT];

static const char *const g_names[EM_FAULT_COUNT] = {"kernel", "alloc", "node"};

const char *em__fault_name(int what) { return (unsigned)what < EM_FAULT_COUNT ? g_names[what] : "?"; }

bool em__fault_hit(int what)
{
    int64_t at = __atomic_load_n(&em__fault_at[what], __ATOMIC_RELAXED);
    if (at <= 0) return false;
    if (__atomic_add_fetch(&g_seen[what], 1, __ATOMIC_RELAXED) != at) return false;
    em_log_msg(EM_LOG_DEBUG, "fault injection: %s:%lld fires", g_names[what], (long long)at);
    return true;
}

em_status em__fault_inject(const char *spec)
{
    int64_t at[EM_FAULT_COUNT] = {0};
    const char *p = spec ? spec : "";
    while (*p) {
        const char *colon = strchr(p, ':');
        int what = -1;
        for (int i = 0; i < EM_FAULT_COUNT && colon; i++)
            if ((size_t)(colon - p) == strlen(g_names[i]) && !strncmp(p, g_names[i], (size_t)(colon - p))) what = i;
        char *end = NULL;
        long long n = colon ? strtoll(colon + 1, &end, 10) : 0;
        if (what < 0 || !end || end == colon + 1 || n < 1 || (*end && *end != ','))
            return em__set_error(EM_ERR_INVALID,
                                 "fault injection spec '%s': expected kernel:N, alloc:N or node:N (N >= 1), comma separated",
                                 spec);
        at[what] = n;
        p = *end ? end + 1 : end;
    }
    for (int i = 0; i < EM_FAULT_COUNT; i++) {
        __atomic_store_n(&em__fault_at[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&g_seen[i], 0, __ATOMIC_RELAXED);
    }
    for (int i = 0; i < EM_FAULT_COUNT; i++) __atomic_store_n(&em__fault_at[i], at[i], __ATOMIC_RELEASE);
    return EM_OK;
}
