/* CNN training throughput: the pytorch/examples MNIST network
 * (conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25,
 * flatten, fc 9216->128, ReLU, dropout 0.5, fc 128->10), Adam, cross-entropy,
 * random data of shape [B, 1, 28, 28] — exactly the CNN of
 * ../shared/anchors/torch_graphs.py, whose PyTorch side (eager and whole-step
 * CUDA graph) is bench/cnn_torch.py. Prints samples/s per batch size.
 *
 * Usage: bench_cnn [--device DEV] [--steps N] [--warmup N] [--bf16] [--capture] [batch ...]
 *        (default: cpu, 30 steps after 5 warm-up steps, batches 64 512;
 *        --bf16: the forward and loss under em_autocast_begin(EM_BF16), f32
 *        weights, as `cnn_torch.py --bf16`'s torch.autocast; --capture: the
 *        last warm-up step is captured (em_capture_begin / em_capture_end)
 *        and the timed steps are its replays, as cnn_torch.py's graph mode) */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A leaf parameter U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's default
 * bound for conv and linear weights and biases). */
static em_tensor *param(const int64_t *shape, int nd, int64_t fan_in)
{
    double b = 1.0 / sqrt((double)fan_in);
    em_tensor *t = em_rand_uniform(shape, nd, EM_F32, -b, b);
    CK(t && em_set_requires_grad(t, true) == EM_OK);
    return t;
}

enum { C1W, C1B, C2W, C2B, F1W, F1B, F2W, F2B, NP };

static em_tensor *forward(em_tensor **p, const em_tensor *x)
{
    em_tensor *h = em_relu(em_conv2d(x, p[C1W], p[C1B], NULL));
    h = em_relu(em_conv2d(h, p[C2W], p[C2B], NULL));
    em_pool_opts po = em_pool_opts_default(2, 2);
    h = em_dropout(em_max_pool2d(h, &po, NULL), 0.25, true);
    h = em_flatten(h, 1, -1);
    h = em_dropout(em_relu(em_linear(h, p[F1W], p[F1B])), 0.5, true);
    return em_linear(h, p[F2W], p[F2B]);
}

static bool g_bf16, g_capture;

static void run(int64_t batch, int steps, int warmup)
{
    em_manual_seed(0);
    em_tensor *p[NP];
    p[C1W] = param((int64_t[]){32, 1, 3, 3}, 4, 9);
    p[C1B] = param((int64_t[]){32}, 1, 9);
    p[C2W] = param((int64_t[]){64, 32, 3, 3}, 4, 288);
    p[C2B] = param((int64_t[]){64}, 1, 288);
    p[F1W] = param((int64_t[]){128, 9216}, 2, 9216);
    p[F1B] = param((int64_t[]){128}, 1, 9216);
    p[F2W] = param((int64_t[]){10, 128}, 2, 128);
    p[F2B] = param((int64_t[]){10}, 1, 128);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    em_optim *opt = em_optim_new(&oc, p, NP);
    CK(opt);
    em_tensor *x = em_rand_normal((int64_t[]){batch, 1, 28, 28}, 4, EM_F32, 0, 1);
    em_tensor *yf = em_rand_uniform((int64_t[]){batch}, 1, EM_F32, 0, 10);
    em_tensor *y = em_cast(em_floor(yf), EM_I64);
    CK(x && y);
    em_cross_entropy_opts ce = em_cross_entropy_opts_default();
    double t0 = 0;
    em_step *captured = NULL;
    for (int s = 0; s < steps + warmup; s++) {
        if (s == warmup) {
            CK(em_sync() == EM_OK);
            t0 = now();
        }
        if (captured) {
            CK(em_step_replay(captured) == EM_OK);
            continue;
        }
        const bool capturing = g_capture && s == (warmup > 1 ? warmup - 1 : 1);
        if (capturing) CK(em_capture_begin() == EM_OK);
        em_scope_begin();
        if (g_bf16) CK(em_autocast_begin(EM_BF16) == EM_OK);
        em_tensor *loss = em_cross_entropy(forward(p, x), y, &ce);
        if (g_bf16) CK(em_autocast_end() == EM_OK);
        em_grads *g = em_backward(loss);
        CK(g);
        CK(em_optim_step(opt, g) == EM_OK);
        em_grads_free(g);
        em_scope_end();
        if (capturing) CK((captured = em_capture_end()) != NULL);
    }
    CK(em_sync() == EM_OK);
    double t = now() - t0;
    if (captured) printf("(captured step: %lld tasks, replayed as one) ", (long long)em_step_task_count(captured));
    const char *tf = getenv("EMBER_TF32");
    printf("MNIST CNN training%s%s, batch %lld: Ember %.0f samples/s (%.1f us/step)%s\n", g_bf16 ? " bf16 autocast" : "",
           captured ? " captured" : "",
           (long long)batch, (double)batch * steps / t, t / steps * 1e6, tf && atoi(tf) == 1 ? " [EMBER_TF32=1]" : "");
    fflush(stdout);
    em_step_free(captured);
    em_optim_free(opt);
    for (int i = 0; i < NP; i++) em_tensor_release(p[i]);
    em_tensor_release(x);
    em_tensor_release(yf);
    em_tensor_release(y);
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    int steps = 30, warmup = 5;
    int64_t batches[8];
    int nb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bf16"))
            g_bf16 = true;
        else if (!strcmp(argv[i], "--capture"))
            g_capture = true;
        else if (nb < 8 && atoll(argv[i]) > 0)
            batches[nb++] = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench_cnn [--device DEV] [--steps N] [--warmup N] [--bf16] [--capture] [batch ...]\n");
            return 2;
        }
    }
    if (!nb) batches[nb++] = 64, batches[nb++] = 512;
    em_config cfg = em_config_default();
    cfg.device = device;
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_cnn: %s\n", em_last_error());
        return 1;
    }
    printf("device %s\n", device);
    for (int i = 0; i < nb; i++) run(batches[i], steps, warmup);
    em_shutdown();
    return 0;
}
