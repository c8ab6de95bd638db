/* Thread-local error state and leveled logging. */
#include "runtime/runtime_internal.h"

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

em_status em__set_error(em_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(st, fmt, ap);
    va_end(ap);
    return st;
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
