/* ResNet-18 training throughput at CIFAR size (32x32x3 inputs, 10 classes,
 * synthetic data): the CIFAR variant of ResNet-18 (3x3 stem conv 3->64 with
 * BatchNorm and ReLU, no max-pool; four stages of two BasicBlocks with 64,
 * 128, 256, 512 channels, stride 2 from the second stage on, 1x1 conv + BN
 * shortcuts where the shape changes; global average pool; fc 512->10),
 * SGD with momentum 0.9, cross-entropy, BatchNorm in training mode. The
 * PyTorch side is bench/resnet_torch.py (the same network, eager, with
 * cudnn.benchmark). Prints samples/s.
 *
 * Usage: bench_resnet [--device DEV] [--steps N] [--warmup N] [batch]
 *        (default cuda:0, 20 steps after 5 warm-up steps, batch 256) */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 128
static em_tensor *g_params[MAXP];
static int g_np;

static em_tensor *leaf(em_tensor *t)
{
    CK(t && em_set_requires_grad(t, true) == EM_OK && g_np < MAXP);
    g_params[g_np++] = t;
    return t;
}

typedef struct conv_bn {
    em_tensor *w, *gamma, *beta, *rm, *rv;
    em_conv_opts o;
} conv_bn;

static conv_bn make_conv_bn(int64_t cin, int64_t cout, int64_t k, int64_t stride)
{
    conv_bn c;
    double b = 1.0 / sqrt((double)(cin * k * k));
    c.w = leaf(em_rand_uniform((int64_t[]){cout, cin, k, k}, 4, EM_F32, -b, b));
    c.gamma = leaf(em_ones((int64_t[]){cout}, 1, EM_F32));
    c.beta = leaf(em_zeros((int64_t[]){cout}, 1, EM_F32));
    c.rm = em_zeros((int64_t[]){cout}, 1, EM_F32);
    c.rv = em_ones((int64_t[]){cout}, 1, EM_F32);
    CK(c.rm && c.rv);
    c.o = em_conv_opts_default();
    c.o.stride[0] = c.o.stride[1] = stride;
    c.o.padding[0] = c.o.padding[1] = k / 2;
    return c;
}

static em_tensor *conv_bn_fwd(const conv_bn *c, const em_tensor *x)
{
    return em_batch_norm(em_conv2d(x, c->w, NULL, &c->o), c->rm, c->rv, c->gamma, c->beta, true, 0.1, 1e-5);
}

typedef struct block {
    conv_bn a, b, sc;
    bool has_sc;
} block;

static block blocks[8];
static conv_bn stem;
static em_tensor *fc_w, *fc_b;

static void build(void)
{
    stem = make_conv_bn(3, 64, 3, 1);
    int64_t cin = 64;
    const int64_t widths[4] = {64, 128, 256, 512};
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 2; j++) {
            block *bl = &blocks[s * 2 + j];
            int64_t stride = (s > 0 && j == 0) ? 2 : 1;
            bl->a = make_conv_bn(cin, widths[s], 3, stride);
            bl->b = make_conv_bn(widths[s], widths[s], 3, 1);
            bl->has_sc = stride != 1 || cin != widths[s];
            if (bl->has_sc) bl->sc = make_conv_bn(cin, widths[s], 1, stride);
            cin = widths[s];
        }
    double b = 1.0 / sqrt(512.0);
    fc_w = leaf(em_rand_uniform((int64_t[]){10, 512}, 2, EM_F32, -b, b));
    fc_b = leaf(em_rand_uniform((int64_t[]){10}, 1, EM_F32, -b, b));
}

static em_tensor *forward(const em_tensor *x)
{
    em_tensor *h = em_relu(conv_bn_fwd(&stem, x));
    for (int i = 0; i < 8; i++) {
        const block *bl = &blocks[i];
        em_tensor *o = em_relu(conv_bn_fwd(&bl->a, h));
        o = conv_bn_fwd(&bl->b, o);
        h = em_relu(em_add(o, bl->has_sc ? conv_bn_fwd(&bl->sc, h) : h));
    }
    h = em_flatten(em_adaptive_avg_pool2d(h, 1, 1), 1, -1);
    return em_linear(h, fc_w, fc_b);
}

int main(int argc, char **argv)
{
    const char *device = "cuda:0";
    int steps = 20, warmup = 5;
    int64_t batch = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (atoll(argv[i]) > 0)
            batch = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench_resnet [--device DEV] [--steps N] [--warmup N] [batch]\n");
            return 2;
        }
    }
    em_config cfg = em_config_default();
    cfg.device = device;
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_resnet: %s\n", em_last_error());
        return 1;
    }
    em_manual_seed(0);
    build();
    em_optim_config oc = em_optim_config_default(EM_OPTIM_SGD);
    oc.lr = 0.1;
    oc.momentum = 0.9;
    em_optim *opt = em_optim_new(&oc, g_params, g_np);
    CK(opt);
    em_tensor *x = em_rand_normal((int64_t[]){batch, 3, 32, 32}, 4, EM_F32, 0, 1);
    em_tensor *y = em_cast(em_floor(em_rand_uniform((int64_t[]){batch}, 1, EM_F32, 0, 10)), EM_I64);
    CK(x && y);
    em_cross_entropy_opts ce = em_cross_entropy_opts_default();
    double t0 = 0;
    for (int s = 0; s < steps + warmup; s++) {
        if (s == warmup) {
            CK(em_sync() == EM_OK);
            t0 = now();
        }
        em_scope_begin();
        em_grads *g = em_backward(em_cross_entropy(forward(x), y, &ce));
        CK(g);
        CK(em_optim_step(opt, g) == EM_OK);
        em_grads_free(g);
        em_scope_end();
    }
    CK(em_sync() == EM_OK);
    double t = now() - t0;
    const char *tf = getenv("EMBER_TF32");
    printf("ResNet-18 (CIFAR, 32x32) training on %s, batch %lld: Ember %.0f samples/s (%.1f ms/step)%s\n", device, (long long)batch,
           (double)batch * steps / t, t / steps * 1e3, tf && atoi(tf) == 1 ? " [EMBER_TF32=1]" : "");
    em_optim_free(opt);
    em_shutdown();
    return 0;
}
