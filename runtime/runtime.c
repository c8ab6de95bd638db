/* Process lifecycle: StarPU + hwloc start/stop, configuration, devices. */
#include "runtime/runtime_internal.h"

#include <cblas.h>
#include <ctype.h>
#include <limits.h>
#include <hwloc.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* OpenBLAS: one thread inside a worker (DESIGN.md §4). */
extern void openblas_set_num_threads(int);

static bool g_initialized;
static em_device g_device;               /* the process's device */
static _Thread_local bool tl_has_device; /* em_set_thread_device */
static _Thread_local em_device tl_device;
static char g_sched[64];

/* Upper layers' start/stop (em__runtime_register), in ascending order. */
#define MAX_HOOKS 8
static const em_runtime_hooks *g_hooks[MAX_HOOKS];
static int g_nhooks;

void em__runtime_register(const em_runtime_hooks *h)
{
    if (!h || g_nhooks == MAX_HOOKS) {
        fprintf(stderr, "ember: internal error: cannot register runtime hooks '%s'\n", h ? h->name : "?");
        return;
    }
    int i = g_nhooks++;
    while (i > 0 && g_hooks[i - 1]->order > h->order) {
        g_hooks[i] = g_hooks[i - 1];
        i--;
    }
    g_hooks[i] = h;
}

size_t em_dtype_size(em_dtype dt)
{
    static const size_t sz[EM_DTYPE_COUNT] = {4, 8, 4, 8, 1, 1, 2, 2};
    return (unsigned)dt < EM_DTYPE_COUNT ? sz[dt] : 0;
}

const char *em_dtype_name(em_dtype dt)
{
    static const char *names[EM_DTYPE_COUNT] = {"float32", "float64", "int32", "int64",
                                                "uint8",   "bool",    "float16", "bfloat16"};
    return (unsigned)dt < EM_DTYPE_COUNT ? names[dt] : "invalid";
}

bool em_dtype_is_float(em_dtype dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

em_device em_device_cpu(void) { return (em_device){EM_DEVICE_CPU, 0}; }
em_device em_device_cuda(int index) { return (em_device){EM_DEVICE_CUDA, index}; }
em_device em_device_opencl(int index) { return (em_device){EM_DEVICE_OPENCL, index}; }
em_device em_device_auto(void) { return (em_device){EM_DEVICE_AUTO, 0}; }

em_status em_device_parse(const char *s, em_device *out)
{
    if (!s || !out) return em__set_error(EM_ERR_INVALID, "em_device_parse: NULL argument");
    static const struct { const char *name; em_device_kind kind; } kinds[] = {
        {"cpu", EM_DEVICE_CPU}, {"cuda", EM_DEVICE_CUDA}, {"opencl", EM_DEVICE_OPENCL},
        {"hip", EM_DEVICE_HIP}, {"auto", EM_DEVICE_AUTO}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        size_t n = strlen(kinds[i].name);
        if (strncasecmp(s, kinds[i].name, n) != 0) continue;
        int index = 0;
        if (s[n] == ':') {
            char *end;
            long v = strtol(s + n + 1, &end, 10);
            if (end == s + n + 1 || *end || v < 0 || v > 255)
                return em__set_error(EM_ERR_INVALID, "bad device '%s': index must be a number >= 0", s);
            index = (int)v;
        } else if (s[n]) {
            continue;
        }
        *out = (em_device){kinds[i].kind, index};
        return EM_OK;
    }
    return em__set_error(EM_ERR_INVALID, "unknown device '%s' (expected cpu, cuda[:N], opencl[:N], hip[:N] or auto)", s);
}

const char *em_device_str(em_device d, char *buf, size_t n)
{
    static const char *names[] = {"cpu", "cuda", "opencl", "hip", "auto"};
    const char *name = (unsigned)d.kind <= EM_DEVICE_AUTO ? names[d.kind] : "?";
    if (d.kind == EM_DEVICE_CPU || d.kind == EM_DEVICE_AUTO)
        snprintf(buf, n, "%s", name);
    else
        snprintf(buf, n, "%s:%d", name, d.index);
    return buf;
}

static enum starpu_worker_archtype archtype_of(em_device_kind k)
{
    switch (k) {
    case EM_DEVICE_CUDA: return STARPU_CUDA_WORKER;
    case EM_DEVICE_OPENCL: return STARPU_OPENCL_WORKER;
#ifdef STARPU_USE_HIP
    case EM_DEVICE_HIP: return STARPU_HIP_WORKER;
#endif
    default: return STARPU_CPU_WORKER;
    }
}

/* First worker driving device (kind, index), or -1. Ember numbers the devices
 * of a kind 0, 1, ... in the order StarPU's workers drive them, whatever
 * StarPU's own device ids are (with several OpenCL platforms, PoCL may be
 * StarPU's OpenCL device 1 while it is Ember's opencl:0). */
static int find_worker(em_device d)
{
    enum starpu_worker_archtype at = archtype_of(d.kind);
    unsigned n = starpu_worker_get_count();
    int seen[STARPU_NMAXWORKERS], nseen = 0;
    for (unsigned w = 0; w < n; w++) {
        if (starpu_worker_get_type((int)w) != at) continue;
        int dev = starpu_worker_get_devid((int)w), k = 0;
        while (k < nseen && seen[k] != dev) k++;
        if (k == nseen) seen[nseen++] = dev;
        if (k == d.index) return (int)w;
    }
    return -1;
}

const char *em__worker_str(int worker, char *buf, size_t n)
{
    if (worker < 0 || (unsigned)worker >= starpu_worker_get_count()) {
        snprintf(buf, n, "no worker (the submitting thread)");
        return buf;
    }
    enum starpu_worker_archtype at = starpu_worker_get_type(worker);
    if (at == STARPU_CPU_WORKER) {
        snprintf(buf, n, "cpu (worker %d)", worker);
        return buf;
    }
    /* Ember's index of the device: its rank among the devices of that kind (find_worker). */
    int seen[STARPU_NMAXWORKERS], nseen = 0, index = -1, devid = starpu_worker_get_devid(worker);
    for (int w = 0; w <= worker; w++) {
        if (starpu_worker_get_type(w) != at) continue;
        int dev = starpu_worker_get_devid(w), k = 0;
        while (k < nseen && seen[k] != dev) k++;
        if (k == nseen) seen[nseen++] = dev;
        if (dev == devid) index = k;
    }
    const char *kind = at == STARPU_CUDA_WORKER ? "cuda" : at == STARPU_OPENCL_WORKER ? "opencl" : "device";
    snprintf(buf, n, "%s:%d (worker %d)", kind, index, worker);
    return buf;
}

int em_worker_count(em_device_kind kind)
{
    if (!g_initialized) return 0;
    if (kind == EM_DEVICE_AUTO) return (int)starpu_worker_get_count();
    if (kind == EM_DEVICE_HIP) return 0;
    return (int)starpu_worker_get_count_by_type(archtype_of(kind));
}

int em_device_count(em_device_kind kind)
{
    if (!g_initialized) return 0;
    if (kind == EM_DEVICE_CPU || kind == EM_DEVICE_AUTO) return em_worker_count(EM_DEVICE_CPU) > 0 || kind == EM_DEVICE_AUTO;
    if (kind == EM_DEVICE_HIP) return 0;
    int n = 0;
    while (find_worker((em_device){kind, n}) >= 0) n++;
    return n;
}

em_status em_devices_parse(const char *list, em_device *out, int max, int *n)
{
    if (!list || !out || !n || max < 1) return em__set_error(EM_ERR_INVALID, "em_devices_parse: bad arguments");
    *n = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item)
            return em__set_error(EM_ERR_INVALID, "bad device list '%s' (expected e.g. cuda:0,cuda:1 or cuda:all)", list);
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strchr(item, ':');
        if (colon && !strcasecmp(colon + 1, "all")) {
            *colon = 0;
            em_device d;
            if (em_device_parse(item, &d) != EM_OK) return em_last_status();
            if (!g_initialized) return em__set_error(EM_ERR_STATE, "device list '%s': '%s:all' needs the runtime (em_init first)", list, item);
            int cnt = em_device_count(d.kind);
            if (cnt == 0) return em__set_error(EM_ERR_DEVICE, "device list '%s': this process has no %s device", list, item);
            for (int i = 0; i < cnt; i++) {
                if (*n >= max) return em__set_error(EM_ERR_INVALID, "device list '%s': more than %d devices", list, max);
                out[(*n)++] = (em_device){d.kind, i};
            }
        } else {
            if (*n >= max) return em__set_error(EM_ERR_INVALID, "device list '%s': more than %d devices", list, max);
            if (em_device_parse(item, &out[*n]) != EM_OK) return em_last_status();
            (*n)++;
        }
        p += len;
        if (*p == ',' && !*++p)
            return em__set_error(EM_ERR_INVALID, "bad device list '%s': it ends with a comma", list);
    }
    if (*n == 0) return em__set_error(EM_ERR_INVALID, "empty device list");
    return EM_OK;
}

int em__ncpu_workers(void) { return em_worker_count(EM_DEVICE_CPU); }

static em_status check_device(em_device d)
{
    char buf[32];
    if (!g_initialized) return em__set_error(EM_ERR_STATE, "em_set_device: call em_init first");
#ifndef STARPU_USE_HIP
    if (d.kind == EM_DEVICE_HIP)
        return em__set_error(EM_ERR_DEVICE, "device %s is not available: this build of Ember has no HIP support",
                             em_device_str(d, buf, sizeof buf));
#endif
    if (d.kind != EM_DEVICE_AUTO && d.kind != EM_DEVICE_CPU && find_worker(d) < 0)
        return em__set_error(EM_ERR_DEVICE, "device %s is not available (this process has %d CPU, %d CUDA, %d OpenCL workers)",
                             em_device_str(d, buf, sizeof buf), em_worker_count(EM_DEVICE_CPU),
                             em_worker_count(EM_DEVICE_CUDA), em_worker_count(EM_DEVICE_OPENCL));
    if (d.kind == EM_DEVICE_CPU && em_worker_count(EM_DEVICE_CPU) == 0)
        return em__set_error(EM_ERR_DEVICE, "device cpu is not available: no CPU workers (EMBER_NCPU=0?)");
    return EM_OK;
}

em_status em_set_device(em_device d)
{
    em_status st = check_device(d);
    if (st != EM_OK) return st;
    if (tl_has_device) tl_device = d;
    else g_device = d;
    return EM_OK;
}

em_status em_set_thread_device(em_device d)
{
    em_status st = check_device(d);
    if (st != EM_OK) return st;
    tl_device = d;
    tl_has_device = true;
    return EM_OK;
}

void em_clear_thread_device(void) { tl_has_device = false; }

bool em__has_thread_device(void) { return tl_has_device; }

em_device em_get_device(void) { return tl_has_device ? tl_device : g_device; }

em_placement em__placement(void)
{
    em_placement p = {STARPU_CPU, -1};
    const em_device dev = em_get_device();
    switch (dev.kind) {
    case EM_DEVICE_CPU: p.where = STARPU_CPU; break;
    case EM_DEVICE_AUTO: p.where = STARPU_CPU | STARPU_CUDA | STARPU_OPENCL; break;
    case EM_DEVICE_CUDA: p.where = STARPU_CUDA; p.worker = find_worker(dev); break;
    case EM_DEVICE_OPENCL: p.where = STARPU_OPENCL; p.worker = find_worker(dev); break;
    default: break;
    }
    return p;
}

em_config em_config_default(void)
{
    return (em_config){.ncpus = -1, .ncuda = -1, .nopencl = -1, .sched = NULL, .device = NULL,
                       .log_level = EM_LOG_WARN, .starpu_verbose = false};
}

/* A worker count from the environment: unset or empty leaves *out; else the whole value must be an
 * integer >= -1 (-1: StarPU's default), or EM_ERR_INVALID naming the variable and its value. */
static em_status env_int(const char *name, int *out)
{
    const char *v = getenv(name);
    if (!v || !*v) return EM_OK;
    char *end = NULL;
    errno = 0;
    long x = isspace((unsigned char)*v) ? 0 : strtol(v, &end, 10);
    if (!end || end == v || *end || errno == ERANGE || x < -1 || x > INT_MAX)
        return em__set_error(EM_ERR_INVALID, "em_init: %s='%s' is not a worker count (expected an integer >= -1; -1 or unset: "
                             "StarPU's default)", name, v);
    *out = (int)x;
    return EM_OK;
}

/* mkdir -p @p path (modified in place and restored); 0 or -1 with errno. */
static int mkdir_p(char *path)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            int r = mkdir(path, 0755);
            *p = '/';
            if (r != 0 && errno != EEXIST) return -1;
        }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* true when @p dir exists or can be made, and a file can be created in it. */
static bool dir_writable(const char *dir)
{
    char path[4096], probe[4200];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return false;
    if (mkdir_p(path) != 0) return false;
    snprintf(probe, sizeof probe, "%s/.ember-probe-%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "w");
    if (!f) return false;
    fclose(f);
    unlink(probe);
    return true;
}

/* StarPU keeps its performance models and bus calibration in
 * $STARPU_PERF_MODEL_DIR, else $STARPU_HOME/.starpu/sampling, else
 * $HOME/.starpu/sampling, and aborts the process inside starpu_init when it
 * cannot create that directory (an unwritable or missing $HOME). Check it
 * first: when it is unusable and the user did not choose it through a
 * STARPU_ variable, fall back to $TMPDIR (or /tmp)/ember-starpu-UID with a
 * warning; otherwise, or when the fallback fails too, return an error naming
 * the directory instead of letting StarPU abort. */
static em_status ensure_starpu_dirs(void)
{
    char dir[4096];
    const char *pm = getenv("STARPU_PERF_MODEL_DIR"), *sh = getenv("STARPU_HOME"), *home = getenv("HOME");
    const char *chosen_by = pm && *pm ? "STARPU_PERF_MODEL_DIR" : sh && *sh ? "STARPU_HOME" : "HOME";
    int n = pm && *pm ? snprintf(dir, sizeof dir, "%s", pm)
            : sh && *sh ? snprintf(dir, sizeof dir, "%s/.starpu/sampling", sh)
            : home && *home ? snprintf(dir, sizeof dir, "%s/.starpu/sampling", home) : 0;
    if (n <= 0 || n >= (int)sizeof dir) dir[0] = 0;
    if (dir[0] && dir_writable(dir)) return EM_OK;
    if (strcmp(chosen_by, "HOME") != 0)
        return em__set_error(EM_ERR_IO, "em_init: StarPU's performance-model directory '%s' (from $%s) cannot be created or written",
                             dir, chosen_by);
    const char *tmp = getenv("TMPDIR");
    char fb[4096];
    snprintf(fb, sizeof fb, "%s/ember-starpu-%ld", tmp && *tmp ? tmp : "/tmp", (long)getuid());
    if (snprintf(dir, sizeof dir, "%s/.starpu/sampling", fb) >= (int)sizeof dir || !dir_writable(dir))
        return em__set_error(EM_ERR_IO, "em_init: $HOME ('%s') is not writable for StarPU's performance models, and neither is '%s'; "
                             "set STARPU_HOME to a writable directory", home ? home : "", fb);
    em_log_msg(EM_LOG_WARN, "$HOME ('%s') is not writable: StarPU's performance models go to %s (set STARPU_HOME to choose)",
               home ? home : "", fb);
    setenv("STARPU_HOME", fb, 1);
    return EM_OK;
}

/* em_set_float32_matmul_precision: read by the CUDA matmul and conv kernels
 * on their workers' threads (relaxed atomics: a flag, nothing else depends
 * on it). */
static int g_f32_matmul_precision = EM_MATMUL_HIGHEST;

void em_set_float32_matmul_precision(em_matmul_precision p)
{
    if (p != EM_MATMUL_HIGHEST && p != EM_MATMUL_HIGH) {
        em__set_error(EM_ERR_INVALID, "em_set_float32_matmul_precision: %d is not a precision (EM_MATMUL_HIGHEST = 0, EM_MATMUL_HIGH = 1)",
                      (int)p);
        return;
    }
    __atomic_store_n(&g_f32_matmul_precision, (int)p, __ATOMIC_RELAXED);
}

em_matmul_precision em_get_float32_matmul_precision(void)
{
    return (em_matmul_precision)__atomic_load_n(&g_f32_matmul_precision, __ATOMIC_RELAXED);
}

em_status em_init(const em_config *user)
{
    if (g_initialized) return em__set_error(EM_ERR_STATE, "em_init: already initialized (call em_shutdown first)");
    em_config cfg = user ? *user : em_config_default();
    const char *lv = getenv("EMBER_LOG");
    if (lv) {
        static const char *names[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (!strcasecmp(lv, names[i])) cfg.log_level = (em_log_level)i;
    }
    em_set_log_level(cfg.log_level);
    if (env_int("EMBER_NCPU", &cfg.ncpus) != EM_OK || env_int("EMBER_NCUDA", &cfg.ncuda) != EM_OK ||
        env_int("EMBER_NOPENCL", &cfg.nopencl) != EM_OK)
        return em_last_status();
    if (getenv("EMBER_SCHED")) cfg.sched = getenv("EMBER_SCHED");
    if (getenv("EMBER_DEVICE")) cfg.device = getenv("EMBER_DEVICE");
    const char *tf32 = getenv("EMBER_TF32"); /* a shortcut for em_set_float32_matmul_precision */
    if (tf32) em_set_float32_matmul_precision(atoi(tf32) == 1 ? EM_MATMUL_HIGH : EM_MATMUL_HIGHEST);
    const char *sv = getenv("EMBER_STARPU_VERBOSE"); /* any value but a number equal to 0 (as before: atoi) */
    if (sv) cfg.starpu_verbose = *sv ? atoi(sv) != 0 : true;

    em_device dev = em_device_cpu();
    if (cfg.device && em_device_parse(cfg.device, &dev) != EM_OK) return em_last_status();
    if (em__fault_inject(getenv("EMBER_FAULT_INJECT")) != EM_OK) return em_last_status();
    if (em__sticky_take("em_init") != EM_OK) em_clear_error(); /* nothing from an earlier run carries over */

    if (!cfg.starpu_verbose) setenv("STARPU_SILENT", "1", 0);
    /* CUDA workers queue up to 32 ready tasks on their stream instead of
     * StarPU's default 2 (measured on 2 x H200: +1% on one GPU, +4-5% with
     * data-parallel NCCL traffic). The user's own setting wins. */
    setenv("STARPU_CUDA_PIPELINE", "32", 0);
    if (ensure_starpu_dirs() != EM_OK) return em_last_status();

    struct starpu_conf conf;
    starpu_conf_init(&conf);
    if (cfg.ncpus >= 0) conf.ncpus = cfg.ncpus;
    if (cfg.ncuda >= 0) conf.ncuda = cfg.ncuda;
    if (cfg.nopencl >= 0) conf.nopencl = cfg.nopencl;
    /* StarPU's own STARPU_SCHED wins over our default, our EMBER_SCHED over both. */
    const char *sched = cfg.sched;
    if (!sched && !getenv("STARPU_SCHED")) sched = dev.kind == EM_DEVICE_AUTO ? "dmda" : "lws";
    if (sched) {
        snprintf(g_sched, sizeof g_sched, "%s", sched);
        conf.sched_policy_name = g_sched;
    }
    int ret = starpu_init(&conf);
    if (ret == -ENODEV) return em__set_error(EM_ERR_DEVICE, "em_init: StarPU found no worker to run tasks");
    if (ret != 0) return em__set_error(EM_ERR_RUNTIME, "em_init: starpu_init failed (%d)", ret);
    openblas_set_num_threads(1);
    g_initialized = true;
    em__trace_init();
    em_status st = EM_OK;
    for (int i = 0; i < g_nhooks && st == EM_OK; i++)
        if (g_hooks[i]->init) st = g_hooks[i]->init();
    if (st != EM_OK) {
        em_shutdown();
        return st;
    }
    g_device = em_device_cpu();
    if (dev.kind != EM_DEVICE_CPU) {
        st = em_set_device(dev);
        if (st != EM_OK) {
            em_shutdown();
            return st;
        }
    }
    em_log_msg(EM_LOG_INFO, "initialized: %u workers (%d CPU, %d CUDA, %d OpenCL), scheduler %s",
           starpu_worker_get_count(), em_worker_count(EM_DEVICE_CPU), em_worker_count(EM_DEVICE_CUDA),
           em_worker_count(EM_DEVICE_OPENCL), sched ? sched : (getenv("STARPU_SCHED") ? getenv("STARPU_SCHED") : "lws"));
    return EM_OK;
}

bool em_is_initialized(void) { return g_initialized; }

em_status em_sync(void)
{
    if (!g_initialized) return em__set_error(EM_ERR_STATE, "em_sync: runtime not initialized");
    em_status fst = em__fusion_flush ? em__fusion_flush() : EM_OK;
    int r = starpu_task_wait_for_all();
    if (fst != EM_OK) return fst;
    if (r != 0) return em__set_error(EM_ERR_RUNTIME, "starpu_task_wait_for_all failed (%d)", r);
    return em__sticky_take("em_sync");
}

void em_shutdown(void)
{
    if (!g_initialized) return;
    if (em__fusion_flush && em__fusion_flush() != EM_OK)
        em_log_msg(EM_LOG_WARN, "em_shutdown: submitting the held element-wise ops failed: %s", em_last_error());
    starpu_task_wait_for_all();
    em__trace_shutdown();
    em__pool_drain();
    for (int i = g_nhooks - 1; i >= 0; i--)
        if (g_hooks[i]->shutdown) g_hooks[i]->shutdown();
    starpu_shutdown();
    g_initialized = false;
    if (em__sticky_take("em_shutdown") != EM_OK) /* nobody read it: say so rather than lose it */
        em_log_msg(EM_LOG_WARN, "a kernel failed and no em_sync or host read reported it: %s", em_last_error());
}

static const char *worker_kind_name(enum starpu_worker_archtype t)
{
    switch (t) {
    case STARPU_CPU_WORKER: return "cpu";
    case STARPU_CUDA_WORKER: return "cuda";
    case STARPU_OPENCL_WORKER: return "opencl";
    default: return "other";
    }
}

void em_pause_workers(void)
{
    if (g_initialized) starpu_pause();
}

void em_resume_workers(void)
{
    if (g_initialized) starpu_resume();
}

void em_print_devices(FILE *f)
{
    if (!g_initialized) {
        fprintf(f, "ember: runtime not initialized\n");
        return;
    }
    char buf[32];
    fprintf(f, "Ember %s on StarPU %d.%d.%d\n", EMBER_VERSION_STRING, STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION,
            STARPU_RELEASE_VERSION);
    fprintf(f, "default device: %s\n", em_device_str(g_device, buf, sizeof buf));
    fprintf(f, "scheduler: %s\n", g_sched[0] ? g_sched : (getenv("STARPU_SCHED") ? getenv("STARPU_SCHED") : "lws"));
    unsigned n = starpu_worker_get_count();
    fprintf(f, "workers: %u (cpu %d, cuda %d, opencl %d)\n", n, em_worker_count(EM_DEVICE_CPU),
            em_worker_count(EM_DEVICE_CUDA), em_worker_count(EM_DEVICE_OPENCL));
    for (unsigned w = 0; w < n; w++) {
        char name[128];
        starpu_worker_get_name((int)w, name, sizeof name);
        enum starpu_worker_archtype t = starpu_worker_get_type((int)w);
        fprintf(f, "  worker %2u  %-6s device %d  memory node %u  %s\n", w, worker_kind_name(t),
                starpu_worker_get_devid((int)w), starpu_worker_get_memory_node(w), name);
    }
    for (int i = 0; i < g_nhooks; i++) /* the layers' facts about their devices (e.g. OpenCL's f16 / bf16) */
        if (g_hooks[i]->describe) g_hooks[i]->describe(f);
    unsigned nodes = starpu_memory_nodes_get_count();
    fprintf(f, "memory nodes: %u\n", nodes);
    for (unsigned m = 0; m < nodes; m++) {
        char name[64];
        starpu_memory_node_get_name(m, name, sizeof name);
        starpu_ssize_t sz = starpu_memory_get_total(m);
        if (sz > 0)
            fprintf(f, "  node %u  %s  %.1f GiB\n", m, name, (double)sz / (1024.0 * 1024 * 1024));
        else
            fprintf(f, "  node %u  %s\n", m, name);
    }
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
        int pk = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
        int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
        int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
        int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
        fprintf(f, "topology (hwloc): %d package(s), %d NUMA node(s), %d core(s), %d PU(s)\n", pk, numa, cores, pus);
        hwloc_obj_t root = hwloc_get_root_obj(topo);
        const char *cpu = hwloc_obj_get_info_by_name(root, "CPUModel");
        if (!cpu && pk > 0) cpu = hwloc_obj_get_info_by_name(hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0), "CPUModel");
        if (cpu) fprintf(f, "  cpu model: %s\n", cpu);
        hwloc_topology_destroy(topo);
    }
}

em_status (*em__fusion_flush)(void);
int64_t em__ops_fused, em__fused_tasks;

em_stats em_get_stats(void)
{
    if (g_initialized && em__fusion_flush) em__fusion_flush(); /* held ops hold tensors; a failure stays the last error */
    return (em_stats){em__live_tensors, em__live_storages, em__handles, em__pooled, em__tasks, em__ops_fused, em__fused_tasks};
}
