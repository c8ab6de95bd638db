/* Multi-process data parallelism: MPI start-up and shutdown, the collective
 * watchdog, parameter broadcast, configuration check and host collectives
 * (DESIGN.md §7). Gradient reduction tasks: allreduce.c. */
#include "dist/dist_internal.h"
#include "dist/nccl.h" /* [nccl] */
#include "tasks/tasks_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

MPI_Comm em__dist_comm_grad = MPI_COMM_NULL, em__dist_comm_ctl = MPI_COMM_NULL;
int em__dist_rank = 0, em__dist_world = 1;

static bool g_init;
static bool g_own_mpi;     /* we called MPI_Init_thread: we finalise */
static bool g_own_runtime; /* we called em_init: we shut it down */

/* ---- watchdog --------------------------------------------------------------- */

static double g_timeout_s = 120.0;
static pthread_t g_wd_thread;
static bool g_wd_running;
static pthread_mutex_t g_wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cond = PTHREAD_COND_INITIALIZER;
static bool g_wd_stop;
static struct {
    double start; /* monotonic seconds; 0 = idle */
    const char *what;
} g_slot[EM_DIST_NSLOTS];

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void em__dist_watch_begin(int slot, const char *what)
{
    __atomic_store_n(&g_slot[slot].what, what, __ATOMIC_RELAXED);
    double t = mono_s();
    __atomic_store(&g_slot[slot].start, &t, __ATOMIC_RELEASE);
}

void em__dist_watch_end(int slot)
{
    double z = 0;
    __atomic_store(&g_slot[slot].start, &z, __ATOMIC_RELEASE);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_wd_lock);
    while (!g_wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g_wd_cond, &g_wd_lock, &ts);
        if (g_wd_stop) break;
        double now = mono_s();
        for (int s = 0; s < EM_DIST_NSLOTS; s++) {
            double start;
            __atomic_load(&g_slot[s].start, &start, __ATOMIC_ACQUIRE);
            if (start > 0 && now - start > g_timeout_s) {
                const char *what = __atomic_load_n(&g_slot[s].what, __ATOMIC_RELAXED);
                fprintf(stderr,
                        "ember dist: rank %d of %d: collective '%s' did not complete within %.0f s "
                        "(EMBER_DIST_TIMEOUT): another rank died, hung or is running different code; aborting the job\n",
                        em__dist_rank, em__dist_world, what ? what : "?", g_timeout_s);
                fflush(stderr);
                MPI_Abort(MPI_COMM_WORLD, 3); /* ends every rank of the job */
            }
        }
    }
    pthread_mutex_unlock(&g_wd_lock);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------- */

bool em_dist_launched(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return true;
    }
    return false;
}

bool em_dist_is_initialized(void) { return g_init; }
int em_dist_rank(void) { return g_init ? em__dist_rank : 0; }
int em_dist_world_size(void) { return g_init ? em__dist_world : 1; }

/* [nccl] One GPU per rank. A rank asked to run on cuda:N (config or
 * EMBER_DEVICE) drives GPU (N + local rank) mod (GPUs on the host) and nothing
 * else: StarPU gets STARPU_WORKERS_CUDAID=<that GPU> and one CUDA worker
 * (STARPU_NCUDA=EMBER_NCUDA=1), set BEFORE em_init, and the process calls that
 * GPU cuda:0 (EMBER_DEVICE / c->device rewritten); the main thread's current
 * CUDA device becomes that GPU as well. So `mpirun -np 4 ember
 * train --device cuda:0` puts ranks 0..3 of a host on GPUs 0..3. Skipped when
 * STARPU_WORKERS_CUDAID is already set (the user chose) or with
 * EMBER_DIST_GPU_BIND=0. Returns the GPU, or -1 when nothing was bound. */
static int bind_gpu(em_config *c, int local_rank)
{
    const char *ds = getenv("EMBER_DEVICE") ? getenv("EMBER_DEVICE") : c->device;
    em_device d;
    if (!ds || em_device_parse(ds, &d) != EM_OK || d.kind != EM_DEVICE_CUDA) {
        em_clear_error();
        return -1;
    }
    const char *b = getenv("EMBER_DIST_GPU_BIND");
    if ((b && *b && atoi(b) == 0) || getenv("STARPU_WORKERS_CUDAID")) return -1;
    int n = em__dist_cuda_device_count();
    if (n <= 0 || d.index >= n) return -1; /* em_init reports the missing device */
    int gpu = (d.index + local_rank) % n;
    char v[16];
    snprintf(v, sizeof v, "%d", gpu);
    setenv("STARPU_WORKERS_CUDAID", v, 1);
    setenv("STARPU_NCUDA", "1", 1);
    setenv("EMBER_NCUDA", "1", 1);
    c->ncuda = 1;
    c->device = "cuda:0";
    if (getenv("EMBER_DEVICE")) setenv("EMBER_DEVICE", "cuda:0", 1);
    /* The main thread's CUDA calls (StarPU pins host buffers with cudaHostAlloc
     * there) go to this GPU too: no stray context on GPU 0 from every rank. */
    em__dist_cuda_set_device(gpu);
    return gpu;
}

static void free_comms(void)
{
    if (em__dist_comm_grad != MPI_COMM_NULL) MPI_Comm_free(&em__dist_comm_grad);
    if (em__dist_comm_ctl != MPI_COMM_NULL) MPI_Comm_free(&em__dist_comm_ctl);
}

em_status em_dist_init(int *argc, char ***argv, const em_config *cfg)
{
    if (g_init) return em__set_error(EM_ERR_STATE, "em_dist_init: already initialized (call em_dist_shutdown first)");
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return em__set_error(EM_ERR_RUNTIME, "em_dist_init: MPI_Init_thread failed");
        g_own_mpi = true;
    } else {
        MPI_Query_thread(&provided);
        g_own_mpi = false;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        if (g_own_mpi) MPI_Finalize();
        return em__set_error(EM_ERR_RUNTIME,
                             "em_dist_init: the MPI library gives thread level %d, but MPI_THREAD_MULTIPLE (%d) is needed "
                             "(gradient reductions call MPI from StarPU workers)",
                             provided, MPI_THREAD_MULTIPLE);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &em__dist_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &em__dist_world);
    MPI_Comm_dup(MPI_COMM_WORLD, &em__dist_comm_grad);
    MPI_Comm_dup(MPI_COMM_WORLD, &em__dist_comm_ctl);
    MPI_Comm local;
    int nlocal = 1, local_rank = 0; /* [nccl] local_rank: this rank's GPU */
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, em__dist_rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &nlocal);
        MPI_Comm_rank(local, &local_rank);
        MPI_Comm_free(&local);
    }

    const char *tv = getenv("EMBER_DIST_TIMEOUT");
    g_timeout_s = tv && *tv ? strtod(tv, NULL) : 120.0;
    const char *bv = getenv("EMBER_DIST_BUCKET_KB");
    if (bv && *bv) em_dist_set_bucket_bytes((size_t)strtoull(bv, NULL, 10) * 1024);

    em_status st = EM_OK;
    g_own_runtime = false;
    int gpu = -1; /* [nccl] */
    if (!em_is_initialized()) {
        em_config c = cfg ? *cfg : em_config_default();
        gpu = bind_gpu(&c, local_rank); /* [nccl] before em_init */
        if (nlocal > 1) {
            /* Ranks sharing a host: follow mpirun's binding and split the cores. */
            setenv("STARPU_WORKERS_GETBIND", "1", 0);
            if (c.ncpus < 0 && !getenv("EMBER_NCPU") && !getenv("STARPU_NCPU")) {
                long ncores = sysconf(_SC_NPROCESSORS_ONLN);
                c.ncpus = ncores / nlocal >= 1 ? (int)(ncores / nlocal) : 1;
            }
        }
        st = em_init(&c);
        g_own_runtime = st == EM_OK;
    }
    if (st == EM_OK) st = em__dist_tasks_init();
    if (st != EM_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        if (g_own_runtime) em_shutdown();
        free_comms();
        if (g_own_mpi) MPI_Finalize();
        return em__set_error(st, "em_dist_init (rank %d): %s", em__dist_rank, msg);
    }
    g_wd_stop = false;
    g_wd_running = g_timeout_s > 0 && pthread_create(&g_wd_thread, NULL, watchdog_main, NULL) == 0;
    g_init = true;
    /* [nccl] a collective: after the watchdog starts (a rank that failed
     * above never joins it); never fails, may fall back to the host path. */
    em__dist_nccl_init();
    char gpus[32] = "";
    if (gpu >= 0) snprintf(gpus, sizeof gpus, ", GPU %d", gpu);
    em_log_msg(EM_LOG_INFO, "dist: rank %d of %d (%d on this host), watchdog %.0f s%s", em__dist_rank, em__dist_world, nlocal,
               g_timeout_s, gpus);
    return EM_OK;
}

void em_dist_shutdown(void)
{
    if (!g_init) return;
    /* The watchdog still runs: waiting for the last tasks may wait for peers. */
    if (em_is_initialized()) em_sync();
    em__dist_tasks_shutdown();
    em__dist_nccl_shutdown(); /* [nccl] before the runtime stops */
    if (g_own_runtime && em_is_initialized()) em_shutdown();
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "finalize");
    MPI_Barrier(em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    if (g_wd_running) {
        pthread_mutex_lock(&g_wd_lock);
        g_wd_stop = true;
        pthread_cond_signal(&g_wd_cond);
        pthread_mutex_unlock(&g_wd_lock);
        pthread_join(g_wd_thread, NULL);
        g_wd_running = false;
    }
    free_comms();
    if (g_own_mpi) MPI_Finalize();
    g_init = false;
    em__dist_rank = 0;
    em__dist_world = 1;
}

void em_dist_abort(int code, const char *msg)
{
    if (msg) fprintf(stderr, "ember dist: rank %d of %d: %s\n", em_dist_rank(), em_dist_world_size(), msg);
    fflush(stderr);
    fflush(stdout);
    if (g_init) MPI_Abort(MPI_COMM_WORLD, code); /* MPI ends the job; the library itself never exits */
}

/* ---- host collectives -------------------------------------------------------- */

static em_status ctl_allreduce(void *vals, int64_t n, MPI_Datatype type, size_t elsize, MPI_Op op, const char *what)
{
    if (n < 0 || (n > 0 && !vals)) return em__set_error(EM_ERR_INVALID, "%s: bad arguments", what);
    if (!g_init || em__dist_world == 1 || n == 0) return EM_OK;
    em__dist_watch_begin(EM_DIST_SLOT_CTL, what);
    int rc = MPI_SUCCESS;
    for (int64_t off = 0; off < n && rc == MPI_SUCCESS; off += EM_DIST_MPI_CHUNK) {
        int64_t cnt = n - off < EM_DIST_MPI_CHUNK ? n - off : EM_DIST_MPI_CHUNK;
        rc = MPI_Allreduce(MPI_IN_PLACE, (char *)vals + (size_t)off * elsize, (int)cnt, type, op, em__dist_comm_ctl);
    }
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    return rc == MPI_SUCCESS ? EM_OK : em__set_error(EM_ERR_RUNTIME, "%s: MPI_Allreduce failed (%d)", what, rc);
}

em_status em_dist_allreduce_sum(double *vals, int n) { return ctl_allreduce(vals, n, MPI_DOUBLE, sizeof(double), MPI_SUM, "em_dist_allreduce_sum"); }
em_status em_dist_allreduce_max(double *vals, int n) { return ctl_allreduce(vals, n, MPI_DOUBLE, sizeof(double), MPI_MAX, "em_dist_allreduce_max"); }

em_status em_dist_barrier(void)
{
    if (!g_init || em__dist_world == 1) return EM_OK;
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "em_dist_barrier");
    int rc = MPI_Barrier(em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    return rc == MPI_SUCCESS ? EM_OK : em__set_error(EM_ERR_RUNTIME, "em_dist_barrier: MPI_Barrier failed (%d)", rc);
}

static em_status ctl_bcast(void *buf, size_t nbytes, const char *what)
{
    em__dist_watch_begin(EM_DIST_SLOT_CTL, what);
    int rc = MPI_SUCCESS;
    for (size_t off = 0; off < nbytes && rc == MPI_SUCCESS; off += (size_t)EM_DIST_MPI_CHUNK) {
        size_t cnt = nbytes - off < (size_t)EM_DIST_MPI_CHUNK ? nbytes - off : (size_t)EM_DIST_MPI_CHUNK;
        rc = MPI_Bcast((char *)buf + off, (int)cnt, MPI_BYTE, 0, em__dist_comm_ctl);
    }
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    return rc == MPI_SUCCESS ? EM_OK : em__set_error(EM_ERR_RUNTIME, "%s: MPI_Bcast failed (%d)", what, rc);
}

/* ---- module state: broadcast, divergence ------------------------------------ */

/* ---- a module's tensors as a list (dist_internal.h) --------------------------- */

static void tlist_add(const char *key, em_tensor *t, void *ud)
{
    em__dist_tlist *l = ud;
    if (l->oom) return;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        em_tensor **nt = realloc(l->t, sizeof *nt * (size_t)cap);
        if (nt) l->t = nt;
        const char **nk = realloc(l->key, sizeof *nk * (size_t)cap);
        if (nk) l->key = nk;
        if (!nt || !nk) {
            l->oom = true;
            return;
        }
        l->cap = cap;
    }
    l->key[l->n] = strdup(key ? key : "");
    l->t[l->n++] = t;
}

void em__dist_tlist_free(em__dist_tlist *l)
{
    for (int i = 0; i < l->n; i++) free((void *)l->key[i]);
    free(l->t);
    free(l->key);
    memset(l, 0, sizeof *l);
}

/* Parameters then buffers, in visiting order. */
em_status em__dist_module_state(const em_module *m, em__dist_tlist *l, const char *fn)
{
    memset(l, 0, sizeof *l);
    if (!m) return em__set_error(EM_ERR_INVALID, "%s: module is NULL", fn);
    if (em_module_visit_params(m, tlist_add, l) != EM_OK || em_module_visit_buffers(m, tlist_add, l) != EM_OK) {
        em__dist_tlist_free(l);
        return em_last_status();
    }
    if (l->oom) {
        em__dist_tlist_free(l);
        return em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn);
    }
    return EM_OK;
}

/* Every rank must hold the same number of tensors and bytes (cheap guard
 * before a broadcast that would otherwise mismatch). */
static em_status same_layout(const em__dist_tlist *l, const char *fn)
{
    double v[4] = {(double)l->n, 0, 0, 0};
    for (int i = 0; i < l->n; i++) v[1] += (double)em_tensor_numel(l->t[i]) * (double)em_dtype_size(em_tensor_dtype(l->t[i]));
    v[2] = -v[0];
    v[3] = -v[1];
    em_status st = em_dist_allreduce_max(v, 4);
    if (st != EM_OK) return st;
    if (v[0] != -v[2] || v[1] != -v[3])
        return em__set_error(EM_ERR_STATE,
                             "%s: the ranks hold different models (between %.0f and %.0f tensors, %.0f and %.0f bytes): "
                             "run em_dist_check_config first",
                             fn, -v[2], v[0], -v[3], v[1]);
    return EM_OK;
}

em_status em_dist_broadcast_params(em_module *m)
{
    em__dist_tlist l;
    em_status st = em__dist_module_state(m, &l, "em_dist_broadcast_params");
    if (st != EM_OK || !g_init || em__dist_world == 1) {
        em__dist_tlist_free(&l);
        return st;
    }
    st = same_layout(&l, "em_dist_broadcast_params");
    em_scope_begin();
    for (int i = 0; i < l.n && st == EM_OK; i++) {
        em_tensor *t = l.t[i];
        size_t nb = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
        if (nb == 0) continue;
        void *buf = malloc(nb);
        if (!buf) {
            st = em__set_error(EM_ERR_NOMEM, "em_dist_broadcast_params: out of memory (%zu bytes)", nb);
            break;
        }
        if (em__dist_rank == 0) st = em_to_host(t, buf, nb);
        /* Rank 0 may have failed to read: tell everybody before the broadcast. */
        double bad = st != EM_OK;
        if (em_dist_allreduce_max(&bad, 1) != EM_OK) st = em_last_status();
        else if (bad != 0 && st == EM_OK) st = em__set_error(EM_ERR_RUNTIME, "em_dist_broadcast_params: rank 0 could not read '%s'", l.key[i]);
        if (st == EM_OK) st = ctl_bcast(buf, nb, "parameter broadcast");
        if (st == EM_OK && em__dist_rank != 0) {
            em_no_grad_begin();
            em_tensor *src = em_from_host(buf, em_tensor_shape(t), em_tensor_ndim(t), em_tensor_dtype(t));
            st = src ? em_copy_(t, src) : em_last_status();
            em_no_grad_end();
        }
        free(buf);
    }
    em_scope_end();
    em__dist_tlist_free(&l);
    if (st == EM_OK) st = em_sync();
    return st;
}

em_status em_dist_param_divergence(const em_module *m, double *out)
{
    if (!out) return em__set_error(EM_ERR_INVALID, "em_dist_param_divergence: out is NULL");
    *out = 0;
    em__dist_tlist l;
    em_status st = em__dist_module_state(m, &l, "em_dist_param_divergence");
    if (st != EM_OK || !g_init || em__dist_world == 1) {
        em__dist_tlist_free(&l);
        return st;
    }
    st = same_layout(&l, "em_dist_param_divergence");
    double worst = 0;
    for (int i = 0; i < l.n && st == EM_OK; i++) {
        int64_t n = em_tensor_numel(l.t[i]);
        if (n == 0) continue;
        double *mine = malloc(sizeof(double) * (size_t)n), *r0 = malloc(sizeof(double) * (size_t)n);
        em_scope_begin();
        em_tensor *d = mine && r0 ? em_cast(l.t[i], EM_F64) : NULL;
        st = d ? em_to_host(d, mine, sizeof(double) * (size_t)n) : (mine && r0 ? em_last_status() : EM_ERR_NOMEM);
        em_scope_end();
        if (st == EM_OK) {
            memcpy(r0, mine, sizeof(double) * (size_t)n);
            st = ctl_bcast(r0, sizeof(double) * (size_t)n, "parameter divergence check");
        }
        for (int64_t j = 0; st == EM_OK && j < n; j++) {
            double e = fabs(mine[j] - r0[j]);
            if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
        }
        free(mine);
        free(r0);
    }
    em__dist_tlist_free(&l);
    if (st == EM_OK) st = em_dist_allreduce_max(&worst, 1);
    if (st == EM_OK) *out = worst;
    return st;
}

/* ---- configuration check ---------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

#define CFG_TEXT 200
typedef struct cfg_record {
    uint64_t model_hash, hp_hash;
    int64_t ntensors, nscalars;
    int64_t first_diff; /* first line of the model description differing from rank 0's; -1 none */
    char mine[CFG_TEXT], theirs[CFG_TEXT]; /* that line here and on rank 0 */
    char hp[CFG_TEXT * 2];
} cfg_record;

/* One line per parameter/buffer: "key float32 [784, 32]". */
static char *describe(const em__dist_tlist *l, int64_t *nscalars)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    *nscalars = 0;
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < l->n; i++) {
        char shape[256], line[600];
        em_shape_str(em_tensor_shape(l->t[i]), em_tensor_ndim(l->t[i]), shape, sizeof shape);
        int k = snprintf(line, sizeof line, "%s %s %s\n", l->key[i], em_dtype_name(em_tensor_dtype(l->t[i])), shape);
        if (k < 0) k = 0;
        if ((size_t)k >= sizeof line) k = (int)sizeof line - 1;
        if (len + (size_t)k + 1 > cap) {
            while (len + (size_t)k + 1 > cap) cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        memcpy(s + len, line, (size_t)k + 1);
        len += (size_t)k;
        *nscalars += em_tensor_numel(l->t[i]);
    }
    return s;
}

/* Copies line @p idx of @p text (without the newline) into out. */
static void nth_line(const char *text, int64_t idx, char *out, size_t n)
{
    const char *p = text;
    for (int64_t i = 0; i < idx && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (!p || !*p) {
        snprintf(out, n, "(none)");
        return;
    }
    size_t k = strcspn(p, "\n");
    if (k >= n) k = n - 1;
    memcpy(out, p, k);
    out[k] = 0;
}

/* true on every rank when @p ok is true on every rank; else EM_ERR_NOMEM
 * (naming the configuration check) on all of them. */
static em_status all_ok(bool ok)
{
    int v = ok ? 1 : 0;
    em_status st = ctl_allreduce(&v, 1, MPI_INT, sizeof v, MPI_MIN, "configuration check");
    if (st != EM_OK) return st;
    return v ? EM_OK : em__set_error(EM_ERR_NOMEM, "em_dist_check_config: out of memory on %s rank",
                                     ok ? "another" : "this");
}

em_status em_dist_check_config(const em_module *m, const char *hparams)
{
    em__dist_tlist l;
    em_status st = em__dist_module_state(m, &l, "em_dist_check_config");
    if (st != EM_OK) return st;
    if (!g_init || em__dist_world == 1) {
        em__dist_tlist_free(&l);
        return EM_OK;
    }
    cfg_record me;
    memset(&me, 0, sizeof me);
    char *text = describe(&l, &me.nscalars);
    me.ntensors = l.n;
    em__dist_tlist_free(&l);
    /* Every rank takes part in every collective below: an allocation that
     * fails on one rank is agreed on by all, which then return the error
     * together (a rank leaving the protocol alone would hang the others). */
    st = all_ok(text != NULL);
    if (st != EM_OK) {
        free(text);
        return st;
    }
    me.model_hash = fnv1a(0xcbf29ce484222325ULL, text, strlen(text));
    me.hp_hash = fnv1a(0xcbf29ce484222325ULL, hparams ? hparams : "", hparams ? strlen(hparams) : 0);
    snprintf(me.hp, sizeof me.hp, "%s", hparams ? hparams : "");

    /* Rank 0's description goes to everybody so each rank can name its first difference. */
    int64_t len0 = (int64_t)strlen(text) + 1;
    st = ctl_bcast(&len0, sizeof len0, "configuration check");
    char *text0 = st == EM_OK ? malloc((size_t)len0) : NULL;
    cfg_record *all = st == EM_OK ? malloc(sizeof *all * (size_t)em__dist_world) : NULL;
    if (st == EM_OK) st = all_ok(text0 && all);
    if (st == EM_OK) {
        if (em__dist_rank == 0) memcpy(text0, text, (size_t)len0);
        st = ctl_bcast(text0, (size_t)len0, "configuration check");
    }
    me.first_diff = -1;
    if (st == EM_OK && strcmp(text, text0) != 0) {
        const char *a = text, *b = text0;
        int64_t line = 0;
        while (*a && *a == *b) {
            if (*a == '\n') line++;
            a++;
            b++;
        }
        me.first_diff = line;
        nth_line(text, line, me.mine, sizeof me.mine);
        nth_line(text0, line, me.theirs, sizeof me.theirs);
    }
    free(text);
    free(text0);
    if (st != EM_OK) {
        free(all);
        return st;
    }
    em__dist_watch_begin(EM_DIST_SLOT_CTL, "configuration check");
    int rc = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, em__dist_comm_ctl);
    em__dist_watch_end(EM_DIST_SLOT_CTL);
    if (rc != MPI_SUCCESS) {
        free(all);
        return em__set_error(EM_ERR_RUNTIME, "em_dist_check_config: MPI_Allgather failed (%d)", rc);
    }
    st = EM_OK;
    for (int r = 1; r < em__dist_world && st == EM_OK; r++) {
        const cfg_record *a = &all[0], *b = &all[r];
        if (b->model_hash != a->model_hash) {
            st = em__set_error(EM_ERR_STATE,
                               "configuration mismatch across ranks: rank %d runs a different model than rank 0 "
                               "(rank 0: %lld tensors, %lld parameters; rank %d: %lld tensors, %lld parameters; "
                               "first difference at entry %lld: rank 0 '%s', rank %d '%s')",
                               r, (long long)a->ntensors, (long long)a->nscalars, r, (long long)b->ntensors,
                               (long long)b->nscalars, (long long)b->first_diff, b->theirs, r, b->mine);
        } else if (b->hp_hash != a->hp_hash) {
            st = em__set_error(EM_ERR_STATE,
                               "configuration mismatch across ranks: rank %d has different settings than rank 0 "
                               "(rank 0: '%s'; rank %d: '%s')",
                               r, a->hp, r, b->hp);
        }
    }
    free(all);
    return st;
}
