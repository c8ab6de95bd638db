/* GPT training throughput: Hugging Face's GPT-2 architecture (em_gpt2_new:
 * pre-norm blocks, causal attention, GELU MLP, lm_head tied to wte) trained
 * on random token windows with AdamW (betas 0.9 / 0.99, weight decay 0.1),
 * cross-entropy over every position and gradient clipping to norm 1.0 — the
 * step of ../shared/anchors/gpt_char.py, whose PyTorch side (eager and
 * torch.compile, same sizes) is bench/gpt_torch.py. Prints tokens/s.
 *
 * Configurations:
 *   char  the anchor's char-level GPT: vocab 256, block 256, 6 layers,
 *         6 heads, width 384, dropout 0.2, batch 64 (10.8 M parameters)
 *   124m  GPT-2 124M: vocab 50257, block 1024, 12 layers, 12 heads,
 *         width 768, dropout 0, batch 16 (as llm.c's GPT-2 runs)
 *
 * Usage: bench_gpt [--device DEV] [--config char|124m] [--steps N] [--warmup N]
 *                  [--precision f32|tf32|bf16] [--batch B] [--block T]
 *        (default: cpu, char, 20 steps after 3 warm-up steps, f32;
 *        bf16 = the forward and the loss under em_autocast_begin(EM_BF16),
 *        f32 master weights, as torch.autocast; tf32 =
 *        em_set_float32_matmul_precision(EM_MATMUL_HIGH)) */
#include "bench/bench_util.h"
#include "ember/ember.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr, "usage: bench_gpt [--device DEV] [--config char|124m] [--steps N] [--warmup N] "
                    "[--precision f32|tf32|bf16] [--batch B] [--block T]\n");
    exit(2);
}

/* [B, T] int64 token ids, uniform in [0, V), from a 64-bit LCG (x) and the
 * same windows shifted by one (y): next-token targets of a random stream. */
static void batch_ids(int64_t B, int64_t T, int64_t V, uint64_t seed, em_tensor **x, em_tensor **y)
{
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * (T + 1)));
    CK(ids);
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < B * (T + 1); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int64_t)((s >> 33) % (uint64_t)V);
    }
    int64_t *xs = malloc(sizeof(int64_t) * (size_t)(B * T)), *ys = malloc(sizeof(int64_t) * (size_t)(B * T));
    CK(xs && ys);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            xs[b * T + t] = ids[b * (T + 1) + t];
            ys[b * T + t] = ids[b * (T + 1) + t + 1];
        }
    const int64_t shape[2] = {B, T};
    *x = em_from_host(xs, shape, 2, EM_I64);
    *y = em_from_host(ys, shape, 2, EM_I64);
    CK(*x && *y);
    free(ids);
    free(xs);
    free(ys);
}

int main(int argc, char **argv)
{
    const char *device = "cpu", *config = "char", *precision = "f32";
    int steps = 20, warmup = 3;
    int64_t batch = 0, block = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "--device"))
            device = argv[++i];
        else if (!strcmp(argv[i], "--config"))
            config = argv[++i];
        else if (!strcmp(argv[i], "--precision"))
            precision = argv[++i];
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup"))
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch"))
            batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--block"))
            block = atoll(argv[++i]);
        else
            usage();
    }
    em_gpt2_config c = em_gpt2_config_default();
    if (!strcmp(config, "char")) {
        c.vocab_size = 256;
        c.n_positions = 256;
        c.n_embd = 384;
        c.n_layer = 6;
        c.n_head = 6;
        c.dropout = 0.2;
        if (!batch) batch = 64;
    } else if (!strcmp(config, "124m")) {
        c.dropout = 0.0;
        if (!batch) batch = 16;
    } else {
        usage();
    }
    if (!block) block = c.n_positions;
    const bool bf16 = !strcmp(precision, "bf16"), tf32 = !strcmp(precision, "tf32");
    if (!bf16 && !tf32 && strcmp(precision, "f32")) usage();
    if (steps < 1 || warmup < 0 || batch < 1 || block < 1 || block > c.n_positions) usage();

    em_config cfg = em_config_default();
    cfg.device = device;
    if (em_init(&cfg) != EM_OK) {
        fprintf(stderr, "bench_gpt: %s\n", em_last_error());
        return 1;
    }
    if (tf32) em_set_float32_matmul_precision(EM_MATMUL_HIGH);
    em_manual_seed(1337);
    em_module *m = em_gpt2_new(&c);
    CK(m);
    em_module_train(m, true);
    const int np = em_module_num_param_tensors(m);
    em_tensor **params = malloc(sizeof *params * (size_t)np);
    CK(params && em_module_parameters(m, params, np) == np);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAMW);
    oc.lr = 1e-3;
    oc.beta2 = 0.99;
    oc.weight_decay = 0.1;
    em_optim *opt = em_optim_new(&oc, params, np);
    CK(opt);
    em_tensor *x, *y;
    batch_ids(batch, block, c.vocab_size, 1, &x, &y);
    const int64_t flat_logits[2] = {batch * block, c.vocab_size}, flat_y[1] = {batch * block};
    em_cross_entropy_opts ce = em_cross_entropy_opts_default();
    double t0 = 0, first_loss = 0, last_loss = 0;
    for (int s = 0; s < steps + warmup; s++) {
        if (s == warmup) {
            CK(em_sync() == EM_OK);
            t0 = now();
        }
        em_scope_begin();
        if (bf16) CK(em_autocast_begin(EM_BF16) == EM_OK);
        em_tensor *logits = em_module_forward(m, x);
        em_tensor *loss = em_cross_entropy(em_reshape(logits, flat_logits, 2), em_reshape(y, flat_y, 1), &ce);
        if (bf16) CK(em_autocast_end() == EM_OK);
        CK(loss);
        em_grads *g = em_backward(loss);
        CK(g);
        CK(em_clip_grad_norm_tensor(g, params, np, 1.0, 2.0)); /* the scope owns the total */
        CK(em_optim_step(opt, g) == EM_OK);
        em_grads_free(g);
        /* the loss is read only at the first and the last step (a read waits) */
        if (s == 0) CK(em_item(loss, &first_loss) == EM_OK);
        if (s == steps + warmup - 1) CK(em_item(loss, &last_loss) == EM_OK);
        em_scope_end();
    }
    CK(em_sync() == EM_OK);
    const double t = now() - t0, tok = (double)(batch * block) * steps;
    printf("GPT %s (%lld layers x %lld, %lld heads, vocab %lld, %lld params), B=%lld T=%lld %s: Ember %.0f tokens/s "
           "(%.2f ms/step; loss %.4f -> %.4f)\n",
           config, (long long)c.n_layer, (long long)c.n_embd, (long long)c.n_head, (long long)c.vocab_size,
           (long long)em_module_num_params(m), (long long)batch, (long long)block, precision, tok / t, t / steps * 1e3, first_loss,
           last_loss);
    fflush(stdout);
    em_tensor_release(x);
    em_tensor_release(y);
    em_optim_free(opt);
    free(params);
    em_module_free(m);
    em_shutdown();
    return 0;
}
