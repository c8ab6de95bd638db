/* Language-model training (issue #16 item 4): the Learner's iteration mode
 * (batch source, evaluations at 0 / every interval / the end, metrics rows,
 * stop flag, errors), the anchor's learning-rate schedule (gpt_char.py's
 * lr_at) through em_lr_warmup_cosine, per-parameter weight decay (the
 * anchor's two AdamW groups), em_clip_grad_norm_tensor against
 * em_clip_grad_norm, and a tiny GPT that learns on the CPU: always on a
 * synthetic repetitive text, and on the Shakespeare corpus when installed
 * ($EMBER_SHAKESPEARE, else /opt/ember-deps/share/ember/shakespeare.txt). */
#include "testutil.h"
#include "ember/text.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the schedule: gpt_char.py's lr_at, written out here ---- */

static double anchor_lr_at(int64_t i, int64_t iters)
{
    if (i < 100) return 1e-3 * (double)(i + 1) / 100;
    double r = (double)(i - 100) / (double)(iters - 100 > 1 ? iters - 100 : 1);
    return 1e-4 + 0.5 * (1 + cos(M_PI * r)) * (1e-3 - 1e-4);
}

static void test_schedule_is_the_anchors(void **state)
{
    (void)state;
    const int64_t runs[] = {5000, 1000, 101};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        const int64_t iters = runs[r];
        em_lr_scheduler *s = em_lr_warmup_cosine(1e-3, 100, iters, 1e-4);
        assert_non_null(s);
        double worst = 0;
        for (int64_t i = 0; i < iters; i++) {
            const double want = anchor_lr_at(i, iters), got = em_lr_scheduler_lr_at(s, i);
            const double rel = fabs(got - want) / want;
            if (rel > worst) worst = rel;
            if (rel > 1e-12) fail_msg("iters %lld: lr_at(%lld) = %.17g, the anchor's %.17g", (long long)iters, (long long)i, got, want);
        }
        /* spot values: the first step, the peak, the middle of the cosine, the last step */
        assert_true(fabs(em_lr_scheduler_lr_at(s, 0) - 1e-5) < 1e-18);
        assert_true(fabs(em_lr_scheduler_lr_at(s, 99) - 1e-3) < 1e-18);
        assert_true(fabs(em_lr_scheduler_lr_at(s, 100) - 1e-3) < 1e-18);
        if (iters == 5000) assert_true(fabs(em_lr_scheduler_lr_at(s, 2550) - 5.5e-4) < 1e-15);
        /* stepped as the Learner steps it (once per iteration), the counter gives the same */
        for (int64_t i = 0; i < iters; i++) {
            assert_true(fabs(em_lr_scheduler_get_lr(s) - em_lr_scheduler_lr_at(s, i)) == 0);
            em_lr_scheduler_step(s, NULL);
        }
        em_lr_scheduler_free(s);
    }
    /* warm-up as long as the run: refused (the CLI says so) */
    assert_null(em_lr_warmup_cosine(1e-3, 100, 100, 1e-4));
}

/* ---- per-parameter weight decay ---- */

static void test_param_weight_decay(void **state)
{
    (void)state;
    em_scope_begin();
    const float w0[4] = {1, -2, 3, -4}, b0[2] = {0.5f, -0.5f};
    em_tensor *w = em_test_f32(w0, (const int64_t[]){2, 2}, 2), *b = em_test_f32(b0, (const int64_t[]){2}, 1);
    em_set_requires_grad(w, true);
    em_set_requires_grad(b, true);
    em_tensor *ps[2] = {w, b};
    em_optim *o = em_adamw_new(ps, 2, 0.1, 0.5);
    assert_non_null(o);
    assert_true(em_optim_get_param_weight_decay(o, 0) == 0.5 && em_optim_get_param_weight_decay(o, 1) == 0.5);
    assert_int_equal(em_optim_set_param_weight_decay(o, 1, 0.0), EM_OK);
    assert_true(em_optim_get_param_weight_decay(o, 1) == 0.0);
    assert_true(isnan(em_optim_get_param_weight_decay(o, 2)));
    assert_int_equal(em_optim_set_param_weight_decay(o, 2, 0.0), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "index 2"));
    assert_int_equal(em_optim_set_param_weight_decay(o, -1, 0.0), EM_ERR_INVALID);
    assert_int_equal(em_optim_set_param_weight_decay(o, 0, -1.0), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "weight_decay"));
    assert_int_equal(em_optim_set_param_weight_decay(o, 0, NAN), EM_ERR_INVALID);
    assert_int_equal(em_optim_set_param_weight_decay(o, 0, INFINITY), EM_ERR_INVALID);
    assert_int_equal(em_optim_set_param_weight_decay(NULL, 0, 0.0), EM_ERR_INVALID);
    /* zero gradients: Adam's update is 0, so only the decoupled decay moves: p *= 1 - lr * wd */
    em_grads *g = em_grads_new();
    assert_int_equal(em_grads_set(g, w, em_zeros_like(w)), EM_OK);
    assert_int_equal(em_grads_set(g, b, em_zeros_like(b)), EM_OK);
    assert_int_equal(em_optim_step(o, g), EM_OK);
    em_grads_free(g);
    const double ww[4] = {1 * 0.95, -2 * 0.95, 3 * 0.95, -4 * 0.95}, bw[2] = {0.5, -0.5};
    em_test_assert_close(w, ww, 4, 1e-6, 0);
    em_test_assert_close(b, bw, 2, 0, 0); /* its own decay 0: untouched */
    em_optim_free(o);
    em_scope_end();
}

/* ---- clipping without a host read ---- */

static void test_clip_nowait(void **state)
{
    (void)state;
    em_scope_begin();
    const int64_t s1[2] = {3, 5}, s2[1] = {7};
    em_manual_seed(3);
    for (int round = 0; round < 3; round++) {
        /* round 0: clipped (norm above 1); round 1: not clipped (max_norm 100); round 2: a NaN gradient */
        em_tensor *p1 = em_zeros(s1, 2, EM_F32), *p2 = em_zeros(s2, 1, EM_F32);
        em_tensor *ps[2] = {p1, p2};
        em_tensor *g1 = em_rand_normal(s1, 2, EM_F32, 0, 1), *g2 = em_rand_normal(s2, 1, EM_F32, 0, 2);
        if (round == 2) {
            const float nan1[7] = {1, 2, NAN, 4, 5, 6, 7};
            g2 = em_test_f32(nan1, s2, 1);
        }
        em_grads *a = em_grads_new(), *b = em_grads_new();
        em_grads_set(a, p1, g1);
        em_grads_set(a, p2, g2);
        em_grads_set(b, p1, g1);
        em_grads_set(b, p2, g2);
        const double maxn = round == 1 ? 100.0 : 1.0;
        const double total = em_clip_grad_norm(a, ps, 2, maxn, 2.0);
        em_tensor *tn = em_clip_grad_norm_tensor(b, ps, 2, maxn, 2.0);
        assert_non_null(tn);
        assert_int_equal(em_tensor_ndim(tn), 0);
        double tv;
        assert_int_equal(em_item(tn, &tv), EM_OK);
        if (round == 2) {
            assert_true(isnan(total) && isnan(tv));
            double *v = em_test_values(em_grad(b, p1));
            for (int i = 0; i < 15; i++) assert_true(isnan(v[i])); /* a NaN norm propagates, as torch */
            free(v);
        } else {
            assert_true(fabs(tv - total) <= 1e-5 * total);
            double *va = em_test_values(em_grad(a, p1)), *vb = em_test_values(em_grad(b, p1));
            for (int i = 0; i < 15; i++) assert_true(fabs(va[i] - vb[i]) <= 1e-5 * fabs(va[i]) + 1e-7);
            free(va);
            free(vb);
            va = em_test_values(em_grad(a, p2));
            vb = em_test_values(em_grad(b, p2));
            double sq = 0;
            for (int i = 0; i < 7; i++) assert_true(fabs(va[i] - vb[i]) <= 1e-5 * fabs(va[i]) + 1e-7);
            free(va);
            free(vb);
            vb = em_test_values(em_grad(b, p1));
            for (int i = 0; i < 15; i++) sq += vb[i] * vb[i];
            free(vb);
            vb = em_test_values(em_grad(b, p2));
            for (int i = 0; i < 7; i++) sq += vb[i] * vb[i];
            free(vb);
            if (round == 0) assert_true(fabs(sqrt(sq) - 1.0) < 1e-4); /* clipped to the max norm */
            else assert_true(fabs(sqrt(sq) - total) < 1e-4 * total); /* untouched */
        }
        em_grads_free(a);
        em_grads_free(b);
    }
    /* no gradient: 0, nothing changes; bad arguments */
    em_tensor *p = em_zeros((const int64_t[]){2}, 1, EM_F32);
    em_grads *e = em_grads_new();
    double z = -1;
    em_tensor *t0 = em_clip_grad_norm_tensor(e, &p, 1, 1.0, 2.0);
    assert_non_null(t0);
    assert_int_equal(em_item(t0, &z), EM_OK);
    assert_true(z == 0);
    em_test_assert_error(em_clip_grad_norm_tensor(NULL, &p, 1, 1.0, 2.0), "grads", NULL);
    em_test_assert_error(em_clip_grad_norm_tensor(e, &p, 1, -1.0, 2.0), "max_norm", NULL);
    em_test_assert_error(em_clip_grad_norm_tensor(e, &p, 1, 1.0, 0.0), "norm_type", NULL);
    em_grads_free(e);
    em_scope_end();
}

/* ---- iteration mode with a tiny GPT ---- */

typedef struct src {
    em_text_dataset *ds;
    int64_t B, T;
    uint64_t seed;
    int64_t x[64 * 128], y[64 * 128];
    int64_t calls_train, calls_val, last_train_iter;
    bool fail_at_5;
} src;

static em_status text_source(em_batch_split split, int64_t iter, int64_t k, em_tensor **x, em_tensor **y, void *ctx)
{
    src *s = ctx;
    if (split == EM_BATCH_TRAIN) {
        assert_int_equal(k, 0);
        /* training batches come in order, once each */
        assert_int_equal(iter, s->last_train_iter + 1);
        s->last_train_iter = iter;
        s->calls_train++;
        if (s->fail_at_5 && iter == 5) return em_text_batch(NULL, EM_TEXT_TRAIN, 1, 1, NULL, NULL, NULL); /* an error */
    } else {
        s->calls_val++;
    }
    uint64_t rng = s->seed * 1000003u + (uint64_t)iter * 7919u + (uint64_t)k * 31u + (split == EM_BATCH_VAL ? 17u : 0u);
    em_status st = em_text_batch(s->ds, split == EM_BATCH_TRAIN ? EM_TEXT_TRAIN : EM_TEXT_VAL, s->B, s->T, &rng, s->x, s->y);
    if (st != EM_OK) return st;
    const int64_t shape[2] = {s->B, s->T};
    *x = em_from_host(s->x, shape, 2, EM_I64);
    *y = em_from_host(s->y, shape, 2, EM_I64);
    return EM_OK;
}

typedef struct seen {
    int n;
    int64_t iters[64];
    double val[64], train[64], tps[64];
} seen;

static void on_eval(const em_epoch_metrics *m, void *ctx)
{
    seen *s = ctx;
    if (s->n < 64) {
        s->iters[s->n] = m->iter;
        s->val[s->n] = m->val_loss;
        s->train[s->n] = m->train_loss;
        s->tps[s->n] = m->tokens_per_s;
        s->n++;
    }
}

/* Trains a GPT of @p cfg for @p iters iterations on @p s; returns the last val loss. */
static double train_gpt(const em_gpt2_config *mc, src *s, int64_t iters, int64_t interval, int64_t eval_iters, double lr,
                        int64_t warmup, const char *out_dir, seen *sn)
{
    em_manual_seed(s->seed);
    em_module *m = em_gpt2_new(mc);
    assert_non_null(m);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAMW);
    oc.lr = lr;
    oc.beta2 = 0.99;
    oc.weight_decay = 0.1;
    em_optim *o = em_optim_new_for_module(&oc, m);
    assert_non_null(o);
    for (int i = 0; i < em_optim_num_params(o); i++)
        if (em_tensor_ndim(em_optim_param(o, i)) < 2) assert_int_equal(em_optim_set_param_weight_decay(o, i, 0.0), EM_OK);
    em_lr_scheduler *sch = em_lr_warmup_cosine(lr, warmup, iters, lr / 10);
    em_learner_config c = em_learner_config_default();
    c.max_iters = iters;
    c.eval_interval = interval;
    c.eval_iters = eval_iters;
    c.batch_source = text_source;
    c.batch_source_ctx = s;
    c.clip_grad_norm = 1.0;
    c.progress = 0;
    c.out_dir = out_dir;
    FILE *devnull = fopen("/dev/null", "w");
    c.log = devnull;
    c.on_epoch = on_eval;
    c.on_epoch_ctx = sn;
    s->last_train_iter = -1;
    em_epoch_metrics h[16];
    int nh = 0;
    em_status st = em_learner_fit(m, o, sch, NULL, NULL, &c, h, 16, &nh);
    if (st != EM_OK) fail_msg("em_learner_fit: %s", em_last_error());
    fclose(devnull);
    assert_true(nh >= 2);
    const double v = h[nh - 1].val_loss;
    assert_int_equal(h[nh - 1].iter, iters);
    em_lr_scheduler_free(sch);
    em_optim_free(o);
    em_module_free(m);
    return v;
}

static em_gpt2_config tiny(int64_t block, int64_t width, double dropout)
{
    em_gpt2_config c = em_gpt2_config_default();
    c.vocab_size = 256;
    c.n_positions = block;
    c.n_embd = width;
    c.n_layer = 2;
    c.n_head = 4;
    c.dropout = dropout;
    return c;
}

/* A repetitive text: a tiny GPT must learn it almost by heart. */
static void test_tiny_gpt_learns_synthetic(void **state)
{
    (void)state;
    static const char verse[] = "to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n";
    const size_t vl = strlen(verse), reps = 400;
    char *text = malloc(vl * reps);
    for (size_t i = 0; i < reps; i++) memcpy(text + i * vl, verse, vl);
    em_tokenizer *tok = em_tokenizer_bytes();
    src *s = calloc(1, sizeof *s);
    s->ds = em_text_dataset_from_memory(text, vl * reps, tok, 0.9);
    assert_non_null(s->ds);
    s->B = 16;
    s->T = 32;
    s->seed = 11;
    const em_gpt2_config mc = tiny(32, 64, 0.0);
    seen sn = {0};
    const double t0 = now_s();
    const double v = train_gpt(&mc, s, 150, 50, 4, 3e-3, 10, em_test_tmp_path("syn"), &sn);
    print_message("synthetic text: val loss %.4f after 150 iterations (%.1fs)\n", v, now_s() - t0);
    /* evaluations at 0, 50, 100, 150; the loss starts at ln(256) = 5.55 and falls */
    assert_int_equal(sn.n, 4);
    assert_true(sn.iters[0] == 0 && sn.iters[1] == 50 && sn.iters[2] == 100 && sn.iters[3] == 150);
    assert_true(isnan(sn.train[0]) && isnan(sn.tps[0]) && sn.tps[3] > 0);
    assert_true(fabs(sn.val[0] - log(256.0)) < 0.3);
    assert_true(sn.val[1] < sn.val[0] && sn.val[3] < sn.val[1]);
    assert_int_equal(s->calls_train, 150);
    assert_int_equal(s->calls_val, 4 * 4);
    /* stated threshold: a memorisable text goes below 0.5 nats per byte (chance: 5.55) */
    assert_true(v < 0.5);
    /* metrics.csv: the iteration header and one row per evaluation */
    FILE *f = fopen(em_test_tmp_path("syn/metrics.csv"), "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "iter,train_loss,val_loss,lr,tokens_per_s,elapsed_s\n");
    int rows = 0;
    while (fgets(line, sizeof line, f)) rows++;
    fclose(f);
    assert_int_equal(rows, 4);
    struct stat sb;
    assert_int_equal(stat(em_test_tmp_path("syn/checkpoint.safetensors"), &sb), 0);
    assert_int_equal(stat(em_test_tmp_path("syn/best.safetensors"), &sb), 0);
    em_text_dataset_free(s->ds);
    em_tokenizer_free(tok);
    free(s);
    free(text);
}

/* The Shakespeare corpus when installed: a tiny GPT passes the unigram level. */
static void test_tiny_gpt_learns_shakespeare(void **state)
{
    (void)state;
    const char *path = getenv("EMBER_SHAKESPEARE");
    if (!path) path = "/opt/ember-deps/share/ember/shakespeare.txt";
    struct stat sb;
    if (stat(path, &sb) != 0) {
        print_message("the Shakespeare corpus %s is not installed (scripts/install-deps.sh): skipped\n", path);
        skip();
    }
    em_tokenizer *tok = em_tokenizer_bytes();
    src *s = calloc(1, sizeof *s);
    s->ds = em_text_dataset_from_file(path, tok, 0.9);
    assert_non_null(s->ds);
    s->B = 16;
    s->T = 64;
    s->seed = 1337;
    const em_gpt2_config mc = tiny(64, 64, 0.0);
    seen sn = {0};
    const double t0 = now_s();
    const double v = train_gpt(&mc, s, 250, 250, 8, 3e-3, 25, NULL, &sn);
    print_message("Shakespeare: val loss %.4f after 250 iterations of 16 x 64 (%.1fs)\n", v, now_s() - t0);
    /* stated threshold: below 2.75 nats per byte. The corpus' byte unigram entropy is 3.33 and
     * its bigram conditional entropy 2.50 (chance: ln 256 = 5.55): below 2.75 the model has learnt
     * far more than byte frequencies (measured here: 2.54) */
    assert_true(v < 2.75);
    em_text_dataset_free(s->ds);
    em_tokenizer_free(tok);
    free(s);
}

/* Errors, the stop flag, a failing batch source. */
static void test_iteration_mode_errors(void **state)
{
    (void)state;
    static const char verse[] = "abcdefghijklmnopqrstuvwxyz0123456789\n";
    char text[37 * 50];
    for (int i = 0; i < 50; i++) memcpy(text + i * 37, verse, 37);
    em_tokenizer *tok = em_tokenizer_bytes();
    src *s = calloc(1, sizeof *s);
    s->ds = em_text_dataset_from_memory(text, sizeof text, tok, 0.9);
    s->B = 2;
    s->T = 8;
    const em_gpt2_config mc = tiny(8, 16, 0.0);
    em_module *m = em_gpt2_new(&mc);
    em_optim *o = em_adamw_new((em_tensor *[]){em_module_get_param(m, "transformer.wte.weight")}, 1, 1e-3, 0);
    assert_non_null(o);
    em_learner_config c = em_learner_config_default();
    assert_int_equal(c.eval_iters, 100);
    assert_int_equal(c.max_iters, 0);
    c.max_iters = 10;
    c.eval_iters = 1;
    c.progress = 0;
    FILE *devnull = fopen("/dev/null", "w");
    c.log = devnull;
    /* no batch source */
    assert_int_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "batch_source"));
    c.batch_source = text_source;
    c.batch_source_ctx = s;
    /* negative fields */
    c.eval_interval = -1;
    assert_int_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "eval_interval"));
    c.eval_interval = 0;
    /* a failing source stops training with its error */
    s->fail_at_5 = true;
    s->last_train_iter = -1;
    assert_int_not_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_OK);
    assert_int_equal(s->last_train_iter, 5);
    s->fail_at_5 = false;
    em_sync();
    const em_stats s0 = em_get_stats(); /* after steps have made the optimizer's state */
    /* the stop flag: interrupted before the first iteration, no checkpoint yet */
    volatile sig_atomic_t flag = 1;
    c.stop_flag = &flag;
    s->last_train_iter = -1;
    assert_int_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_ERR_INTERRUPTED);
    assert_non_null(strstr(em_last_error(), "iteration 0"));
    c.stop_flag = NULL;
    /* eval_interval 0: evaluations at 0 and at the end only; stop_after_iter adds one and stops */
    seen sn = {0};
    c.on_epoch = on_eval;
    c.on_epoch_ctx = &sn;
    c.stop_after_iter = 4;
    s->last_train_iter = -1;
    assert_int_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_OK);
    assert_int_equal(sn.n, 2);
    assert_true(sn.iters[0] == 0 && sn.iters[1] == 4);
    c.stop_after_iter = 0;
    sn.n = 0;
    s->last_train_iter = -1;
    assert_int_equal(em_learner_fit(m, o, NULL, NULL, NULL, &c, NULL, 0, NULL), EM_OK);
    assert_true(sn.n == 2 && sn.iters[1] == 10);
    fclose(devnull);
    em_test_assert_no_leak(&s0); /* every step's tensors and the running sums are released */
    em_optim_free(o);
    em_module_free(m);
    em_text_dataset_free(s->ds);
    em_tokenizer_free(tok);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_is_the_anchors),
        cmocka_unit_test(test_param_weight_decay),
        cmocka_unit_test(test_clip_nowait),
        cmocka_unit_test(test_iteration_mode_errors),
        cmocka_unit_test(test_tiny_gpt_learns_synthetic),
        cmocka_unit_test(test_tiny_gpt_learns_shakespeare),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
