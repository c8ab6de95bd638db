/* Data-parallel scaling benchmark (DESIGN.md §7): trains an MLP on random
 * data for a fixed number of steps under the dist API and prints the global
 * throughput (samples/s over all ranks). Run it under mpirun, one rank per
 * GPU; each rank drives GPU <local rank> (em_dist_init binds it):
 *
 *   mpirun -np 4 -x NCCL_NVLS_ENABLE=0 bench_scaling --device cuda:0 \
 *       --hidden 4096,4096,4096 --batch 512 --steps 100
 *
 * Alone (no mpirun) it is rank 0 of 1: the single-GPU baseline, same code.
 * Each step: forward, cross-entropy, backward, em_dist_allreduce_grads
 * (NCCL between GPU buffers when the ranks run on CUDA and NCCL is there, MPI
 * on host buffers otherwise), Adam step. --warmup steps are run first and not
 * timed; the timed part starts and ends with em_sync + a barrier, and the
 * slowest rank's time counts. Every rank has its own random batch (seeded by
 * rank), so the averaging matters; at the end the replicas must still be
 * identical (divergence printed; non-zero is a bug).
 *
 * One process, several devices (no mpirun): --devices cuda:0,cuda:1 (or
 * cuda:all) runs one replica per device (em_replicas: NCCL between the GPUs
 * when available) with the same step; each replica has its own random batch.
 *
 * Options: --in N (784) --hidden LIST (4096,4096,4096) --classes N (10)
 *          --batch N per rank or replica (512) --steps N (100) --warmup N (20)
 *          --device DEV (default: EMBER_DEVICE, else cpu) --label NAME (wide)
 *          --devices LIST (replicas in this process)
 * Output (rank 0): a human line and one machine line
 *   RESULT label=wide ranks=2 replicas=1 batch=512 steps=100 params=... samples_per_s=... ms_per_step=... divergence=0 */
#include "bench/bench_util.h"
#include "ember/dist.h"
#include "ember/ember.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "bench_scaling: %s: %s", what, em_last_error());
    em_dist_abort(1, msg);
    exit(1); /* without mpirun */
}

static int parse_list(const char *s, int64_t *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* One replica's share of a step (em_replicas_run: its own thread and device). */
typedef struct bench_job {
    em_module **models;
    em_optim **opts;
    em_tensor **x, **y;
    em_grads **g;
    const em_cross_entropy_opts *ce;
} bench_job;

static em_status forward_backward(em_replicas *r, int i, void *p)
{
    (void)r;
    bench_job *j = p;
    em_scope_begin();
    em_tensor *loss = em_cross_entropy(em_module_forward(j->models[i], j->x[i]), j->y[i], j->ce);
    j->g[i] = loss ? em_backward(loss) : NULL;
    em_scope_end();
    return j->g[i] ? EM_OK : em_last_status();
}

static em_status optimizer_step(em_replicas *r, int i, void *p)
{
    (void)r;
    bench_job *j = p;
    em_status st = em_optim_step(j->opts[i], j->g[i]);
    em_grads_free(j->g[i]);
    j->g[i] = NULL;
    return st;
}

int main(int argc, char **argv)
{
    int64_t in = 784, classes = 10, batch = 512, hs[16];
    int steps = 100, warmup = 20;
    const char *hidden = "4096,4096,4096", *label = "wide";
    const char *device = NULL; /* EMBER_DEVICE, else cpu (like the other benchmarks) */
    const char *devices = NULL; /* replicas in this process */
    char first[64] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_scaling: %s needs a value (see the header of bench/bench_scaling.c)\n", a);
            return 2;
        }
        if (!strcmp(a, "--in")) in = atoll(v);
        else if (!strcmp(a, "--hidden")) hidden = v;
        else if (!strcmp(a, "--classes")) classes = atoll(v);
        else if (!strcmp(a, "--batch")) batch = atoll(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--label")) label = v;
        else if (!strcmp(a, "--devices")) devices = v;
        else {
            fprintf(stderr, "bench_scaling: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    int nh = parse_list(hidden, hs, 14);
    if (nh < 0 || in < 1 || classes < 1 || batch < 1 || steps < 1 || warmup < 0) {
        fprintf(stderr, "bench_scaling: bad arguments\n");
        return 2;
    }

    if (devices) { /* replica 0's device is the process's default device */
        snprintf(first, sizeof first, "%.*s", (int)strcspn(devices, ","), devices);
        char *all = strstr(first, ":all");
        if (all) strcpy(all, ":0");
        device = first;
    }
    em_config cfg = em_config_default();
    cfg.device = device;
    /* one process driving several devices: no MPI (em_dist_init would bind this process to one GPU) */
    if (devices ? em_init(&cfg) != EM_OK : em_dist_init(&argc, &argv, &cfg) != EM_OK) {
        fprintf(stderr, "bench_scaling: %s\n", em_last_error());
        return 1;
    }
    const int rank = em_dist_rank(), world = em_dist_world_size();

    em_device devs[64];
    int R = 1;
    if (devices && em_devices_parse(devices, devs, 64, &R) != EM_OK) die("--devices");
    if (!devices) devs[0] = em_get_device();

    /* The model: in -> hidden... -> classes, ReLU between; same init everywhere. */
    em_manual_seed(0);
    em_module *models[64];
    em_optim *opts[64];
    char spec[256];
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    for (int r = 0; r < R; r++) {
        em_module *mm = em_sequential_new(NULL, 0);
        int64_t prev = in;
        int k = snprintf(spec, sizeof spec, "%lld", (long long)in);
        for (int i = 0; i < nh; i++) {
            em_sequential_append(mm, em_linear_new(prev, hs[i], true));
            em_sequential_append(mm, em_relu_new());
            prev = hs[i];
            k += snprintf(spec + k, sizeof spec - (size_t)k, "-%lld", (long long)hs[i]);
        }
        em_sequential_append(mm, em_linear_new(prev, classes, true));
        snprintf(spec + k, sizeof spec - (size_t)k, "-%lld", (long long)classes);
        models[r] = mm;
        opts[r] = mm ? em_optim_new_for_module(&oc, mm) : NULL;
        if (!mm || !opts[r]) die("building the model");
    }
    em_module *m = models[0];
    em_replicas *rep = NULL;
    if (devices && !(rep = em_replicas_new(models, opts, devs, R))) die("replicas");
    char hp[512];
    snprintf(hp, sizeof hp, "mlp=%s batch=%lld steps=%d warmup=%d", spec, (long long)batch, steps, warmup);
    if (em_dist_check_config(m, hp) != EM_OK) die("configuration check");
    if (em_dist_broadcast_params(m) != EM_OK) die("parameter broadcast");
    int np = em_module_parameters(m, NULL, 0);
    em_tensor **params = malloc(sizeof *params * (size_t)(np > 0 ? np : 1));
    if (!params) die("out of memory");
    em_module_parameters(m, params, np);

    /* Each rank's / replica's random batch (made on its device, kept for every step). */
    em_tensor *x[64], *y[64];
    for (int r = 0; r < R; r++) {
        if (rep && em_set_device(devs[r]) != EM_OK) die("device");
        em_manual_seed(1000 + (uint64_t)rank * 64 + (uint64_t)r);
        x[r] = em_rand_normal((int64_t[]){batch, in}, 2, EM_F32, 0, 1);
        em_tensor *yf = em_rand_uniform((int64_t[]){batch}, 1, EM_F32, 0, (double)classes);
        y[r] = yf ? em_cast(em_floor(yf), EM_I64) : NULL;
        if (!x[r] || !y[r]) die("making the data");
    }
    if (rep) em_set_device(devs[0]);
    em_cross_entropy_opts ce = em_cross_entropy_opts_default();
    em_grads *g[64] = {0};
    bench_job job = {models, opts, x, y, g, &ce};

    double t0 = 0, init_s = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            if (em_sync() != EM_OK || em_dist_barrier() != EM_OK) die("sync");
            t0 = now();
        }
        if (s == 0) init_s = now();
        em_scope_begin();
        if (rep) { /* one thread per replica submits its forward/backward and its step */
            if (em_replicas_run(rep, forward_backward, &job) != EM_OK) die("forward/backward");
            if (em_replicas_allreduce_grads(rep, g) != EM_OK) die("gradient all-reduce (replicas)");
            if (em_replicas_run(rep, optimizer_step, &job) != EM_OK) die("optimizer step");
        } else {
            if (forward_backward(NULL, 0, &job) != EM_OK) die("forward/backward");
            if (em_dist_allreduce_grads(g[0], params, np) != EM_OK) die("gradient all-reduce");
            if (optimizer_step(NULL, 0, &job) != EM_OK) die("optimizer step");
        }
        em_scope_end();
        if (s == 0) {
            if (em_sync() != EM_OK) die("sync");
            init_s = now() - init_s;
        }
    }
    if (em_sync() != EM_OK) die("sync");
    double t = now() - t0;
    if (em_dist_allreduce_max(&t, 1) != EM_OK) die("timing");
    double div = 0;
    if (rep ? em_replicas_divergence(rep, &div) != EM_OK : em_dist_param_divergence(m, &div) != EM_OK) die("divergence check");
    double sps = (double)batch * world * R * steps / t;
    char dev[32];
    if (rank == 0) {
        printf("bench_scaling: %s MLP %s (%lld parameters), %d rank(s) x %d replica(s)%s%s on %s, batch %lld per replica (global %lld), "
               "%d steps after %d warm-up: %.0f samples/s, %.2f ms/step (first step %.2f s); replicas differ by %.3g\n",
               label, spec, (long long)em_module_num_params(m), world, R, rep ? ", all-reduce " : "", rep ? em_replicas_path(rep) : "",
               em_device_str(em_get_device(), dev, sizeof dev), (long long)batch, (long long)batch * world * R, steps, warmup, sps,
               t / steps * 1e3, init_s, div);
        printf("RESULT label=%s ranks=%d replicas=%d batch=%lld steps=%d params=%lld samples_per_s=%.1f ms_per_step=%.4f divergence=%.3g\n",
               label, world, R, (long long)batch, steps, (long long)em_module_num_params(m), sps, t / steps * 1e3, div);
        fflush(stdout);
    }
    free(params);
    em_replicas_free(rep);
    for (int r = 0; r < R; r++) {
        em_optim_free(opts[r]);
        em_module_free(models[r]);
    }
    if (devices) em_shutdown();
    else em_dist_shutdown();
    return div == 0 ? 0 : 3;
}
