/* Thread-local error state and leveled logging. */
#include "runtime/runtime_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char tl_msg[1024];
static _Thread_local em_status tl_status = EM_OK;
static em_log_level g_log_level = EM_LOG_WARN;

static void vset(em_status st, const char *fmt, va_list ap)
{
    tl_status = st;
    vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    em_log_msg(EM_LOG_DEBUG, "error %s: %s", em_status_str(st), tl_msg);
}


void *em__fail_null(const char *fmt, ...)
{
    const em_status pending = em_last_status();
    if (pending == EM_ERR_NOMEM || pending == EM_ERR_DEVICE || pending == EM_ERR_RUNTIME) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vset(EM_ERR_INVALID, fmt, ap);
    va_end(ap);
    return NULL;
}

em_status em_set_error(em_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(st, fmt, ap);
    va_end(ap);
    return st;
}

void *em__fail(em_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(st, fmt, ap);
    va_end(ap);
    return NULL;
}

/* ---- the sticky error of kernels (DESIGN.md §10) ---------------------------
 * A kernel runs on a StarPU worker, long after the op that submitted it has
 * returned, so it cannot hand its failure back to the caller: it records it
 * here (process-wide, first error wins; later ones are only counted) and the
 * next host read or sync (em_sync, em_to_host, em_item, ...) returns it and
 * clears the slot. g_sticky_set lets those readers skip the lock when there
 * is nothing to report. */

static pthread_mutex_t g_sticky_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_sticky_set;      /* read without the lock (atomic) */
static em_status g_sticky_st;
static char g_sticky_msg[1024];
static int g_sticky_more;     /* errors recorded after the first */

void em__sticky_error(em_status st, const char *fmt, ...)
{
    pthread_mutex_lock(&g_sticky_lock);
    if (g_sticky_set) {
        g_sticky_more++;
    } else {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_sticky_msg, sizeof g_sticky_msg, fmt, ap);
        va_end(ap);
        g_sticky_st = st;
        g_sticky_more = 0;
        __atomic_store_n(&g_sticky_set, 1, __ATOMIC_RELEASE);
        em_log_msg(EM_LOG_DEBUG, "kernel error recorded: %s", g_sticky_msg);
    }
    pthread_mutex_unlock(&g_sticky_lock);
}

em_status em__sticky_take(const char *where)
{
    if (!__atomic_load_n(&g_sticky_set, __ATOMIC_ACQUIRE)) return EM_OK;
    pthread_mutex_lock(&g_sticky_lock);
    em_status st = EM_OK;
    if (g_sticky_set) {
        st = g_sticky_st;
        if (g_sticky_more)
            em__set_error(st, "%s: %s (and %d more kernel error%s after it)", where, g_sticky_msg, g_sticky_more,
                          g_sticky_more > 1 ? "s" : "");
        else
            em__set_error(st, "%s: %s", where, g_sticky_msg);
        g_sticky_set = 0;
        g_sticky_msg[0] = 0;
        g_sticky_more = 0;
    }
    pthread_mutex_unlock(&g_sticky_lock);
    return st;
}

const char *em_last_error(void) { return tl_msg; }
em_status em_last_status(void) { return tl_status; }
void em_clear_error(void)
{
    tl_msg[0] = 0;
    tl_status = EM_OK;
}

const char *em_status_str(em_status s)
{
    switch (s) {
    case EM_OK: return "ok";
    case EM_ERR_INVALID: return "invalid argument";
    case EM_ERR_SHAPE: return "shape mismatch";
    case EM_ERR_DTYPE: return "dtype error";
    case EM_ERR_NOMEM: return "out of memory";
    case EM_ERR_IO: return "I/O error";
    case EM_ERR_FORMAT: return "bad format";
    case EM_ERR_DEVICE: return "device error";
    case EM_ERR_RUNTIME: return "runtime error";
    case EM_ERR_STATE: return "invalid state";
    case EM_ERR_UNSUPPORTED: return "unsupported";
    case EM_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown status";
}

void em_set_log_level(em_log_level lvl) { g_log_level = lvl; }
em_log_level em_get_log_level(void) { return g_log_level; }

void em_log_msg(em_log_level lvl, const char *fmt, ...)
{
    if (lvl > g_log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[ember %s] ", names[lvl]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
