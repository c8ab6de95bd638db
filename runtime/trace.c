/* Task timeline: EMBER_TRACE=FILE writes every task's execution span, per
 * StarPU worker, as a Chrome trace-event JSON file (open it in
 * https://ui.perfetto.dev or chrome://tracing) when the runtime stops.
 *
 * StarPU's task profiling is switched on (starpu_profiling_status_set) and
 * every task Ember submits gets a callback that copies its profiling record:
 * codelet name, worker, submission, start and end (StarPU's clock, CLOCK_MONOTONIC, so
 * the files of several processes on one host line up). For asynchronous CUDA
 * and OpenCL tasks the span runs from the launch to the moment the worker
 * saw the device finish, i.e. it includes time queued on the stream.
 *
 * Under an MPI launcher each rank writes FILE.rank<N>. The file is written
 * atomically (temporary file, then rename). Costs one callback and a mutex
 * per task while on; nothing when EMBER_TRACE is unset. At most 4 million
 * events are kept (the first ones). */
#include "runtime/runtime_internal.h"

#include <errno.h>
#include <pthread.h>
#include <starpu.h>
#include <starpu_profiling.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct trace_event {
    const char *name; /* codelet name: static storage */
    int worker;
    double submit_us, start_us, end_us;
} trace_event;

#define TRACE_MAX_EVENTS (4 << 20)

static bool g_on;
static char g_path[4096];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_event *g_ev;
static size_t g_n, g_cap, g_dropped;

static double ts_us(const struct timespec *t) { return (double)t->tv_sec * 1e6 + (double)t->tv_nsec * 1e-3; }

static void trace_cb(void *arg)
{
    (void)arg;
    struct starpu_task *t = starpu_task_get_current();
    if (!t || !t->profiling_info) return;
    const struct starpu_profiling_task_info *p = t->profiling_info;
    trace_event e = {.name = t->cl && t->cl->name ? t->cl->name : "task", .worker = p->workerid,
                     .submit_us = ts_us(&p->submit_time), .start_us = ts_us(&p->start_time), .end_us = ts_us(&p->end_time)};
    pthread_mutex_lock(&g_lock);
    if (g_n == g_cap && g_cap < TRACE_MAX_EVENTS) {
        size_t cap = g_cap ? g_cap * 2 : 65536;
        trace_event *ne = realloc(g_ev, sizeof *ne * cap);
        if (ne) {
            g_ev = ne;
            g_cap = cap;
        }
    }
    if (g_n < g_cap) g_ev[g_n++] = e;
    else g_dropped++;
    pthread_mutex_unlock(&g_lock);
}

void em__trace_init(void)
{
    const char *p = getenv("EMBER_TRACE");
    g_on = p && *p;
    if (!g_on) return;
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = getenv("PMI_RANK");
    if (rank && *rank) snprintf(g_path, sizeof g_path, "%s.rank%s", p, rank);
    else snprintf(g_path, sizeof g_path, "%s", p);
    /* say now, not after the whole run, when the file cannot be written */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", g_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        em_log_msg(EM_LOG_WARN, "trace: EMBER_TRACE=%s: cannot write %s (%s): no trace", p, g_path, strerror(errno));
        g_on = false;
        return;
    }
    fclose(f);
    unlink(tmp);
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    em_log_msg(EM_LOG_INFO, "trace: task timeline goes to %s at shutdown", g_path);
}

void em__trace_attach(struct starpu_task *t)
{
    if (!g_on || !t || t->callback_func) return;
    t->callback_func = trace_cb;
}

/* JSON string body for a codelet name (names are plain identifiers, but be safe). */
static void put_name(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s >= 0x20) fputc(*s, f);
}

void em__trace_shutdown(void)
{
    if (!g_on) return;
    g_on = false;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", g_path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        em_log_msg(EM_LOG_WARN, "trace: cannot write %s", tmp);
    } else {
        double t0 = 0;
        for (size_t i = 0; i < g_n; i++)
            if (i == 0 || g_ev[i].start_us < t0) t0 = g_ev[i].start_us;
        fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"ember_t0_us\":%.3f,\"dropped\":%zu},\"traceEvents\":[\n", t0, g_dropped);
        unsigned nw = starpu_worker_get_count();
        for (unsigned w = 0; w < nw; w++) {
            char name[128];
            starpu_worker_get_name((int)w, name, sizeof name);
            fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%u,\"args\":{\"name\":\"", (int)getpid(), w);
            put_name(f, name);
            fprintf(f, "\"}},\n");
        }
        for (size_t i = 0; i < g_n; i++) {
            const trace_event *e = &g_ev[i];
            fprintf(f, "{\"ph\":\"X\",\"name\":\"");
            put_name(f, e->name);
            fprintf(f, "\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"submit\":%.3f}}%s\n", (int)getpid(),
                    e->worker, e->start_us - t0, e->end_us > e->start_us ? e->end_us - e->start_us : 0.0, e->submit_us - t0,
                    i + 1 < g_n ? "," : "");
        }
        fprintf(f, "]}\n");
        bool ok = fflush(f) == 0 && !ferror(f);
        ok = fclose(f) == 0 && ok;
        if (ok && rename(tmp, g_path) == 0)
            em_log_msg(EM_LOG_INFO, "trace: %zu task spans written to %s", g_n, g_path);
        else {
            unlink(tmp);
            em_log_msg(EM_LOG_WARN, "trace: cannot write %s", g_path);
        }
    }
    free(g_ev);
    g_ev = NULL;
    g_n = g_cap = g_dropped = 0;
}
