/* Learning-rate schedulers against torch.optim.lr_scheduler: the schedulers
 * of `ember train --scheduler NAME` exactly as the CLI builds them
 * (tools/common.c, compiled into this test) at 1 and several epochs (and
 * several steps per epoch for the per-step warmup-cosine), the library's
 * others, and the Learner: each epoch's reported lr is the lr its steps ran at.
 * Fixtures: tests/fixtures/sched_fixtures.txt, written by
 * tests/fixtures/gen_sched_fixtures.py (found through EMBER_TEST_DATA). */
#include "fixture.h"
#include "testutil.h"
#include "tools/tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL 1e-12

static void expect_lr(const char *what, int64_t i, double got, double want)
{
    if (!(fabs(got - want) <= REL * fabs(want)))
        fail_msg("%s: lr[%lld] = %.17g, PyTorch %.17g", what, (long long)i, got, want);
}

/* The lr each step runs at when a loop calls em_lr_scheduler_step after every
 * step (as the Learner does), read from the optimizer. */
static void check_trajectory(const char *what, em_lr_scheduler *s, const fx_tensor *lr)
{
    em_tensor *p = F32((1), 0);
    em_set_requires_grad(p, true);
    em_optim *opt = em_sgd_new(&p, 1, em_lr_scheduler_get_lr(s), 0, 0);
    assert_non_null(opt);
    for (int64_t i = 0; i < lr->n; i++) {
        expect_lr(what, i, em_lr_scheduler_lr_at(s, i), lr->v[i]);
        expect_lr(what, i, em_optim_get_lr(opt), lr->v[i]);
        em_lr_scheduler_step(s, opt);
    }
    em_optim_free(opt);
    em_tensor_release(p);
}

static void cli_schedulers(void **state)
{
    fx_block *bs;
    int n = fx_load("sched_fixtures.txt", &bs), seen = 0, seen_1epoch = 0, seen_steps = 0;
    for (int i = 0; i < n; i++) {
        char kind[32];
        fx_op(&bs[i], kind, sizeof kind);
        if (!strcmp(kind, "multistep") || !strcmp(kind, "noam")) continue;
        const int64_t E = (int64_t)fx_kw(&bs[i], "epochs", 0), S = (int64_t)fx_kw(&bs[i], "steps_per_epoch", 0);
        const int64_t W = (int64_t)fx_kw(&bs[i], "warmup", -1);
        const bool want_per_step = fx_kw(&bs[i], "per_step", 0) != 0;
        char err[256];
        bool per_step = !want_per_step;
        em_lr_scheduler *s = em_tool_make_scheduler(kind, fx_kw(&bs[i], "base", 0), E, S, W, &per_step, err, sizeof err);
        if (!s) fail_msg("%s: %s", bs[i].config, err);
        assert_int_equal(per_step, want_per_step);
        const fx_tensor *lr = fx_get(&bs[i], "lr");
        assert_int_equal(lr->n, per_step ? E * S : E); /* one value per step / per epoch of the run */
        if (per_step && W < 0) assert_int_equal(em_tool_default_warmup(E * S), (int64_t)fx_kw(&bs[i], "warmup_used", -1));
        check_trajectory(bs[i].config, s, lr);
        em_lr_scheduler_free(s);
        seen++;
        seen_1epoch += E == 1;
        seen_steps += per_step && S > 1 && E > 1;
    }
    fx_free(bs, n);
    assert_true(seen >= 25);       /* 4 per-epoch kinds x 5 epoch counts + warmup-cosine cases */
    assert_true(seen_1epoch >= 7); /* every kind at 1 epoch */
    assert_true(seen_steps >= 3);
}

static void library_schedulers(void **state)
{
    fx_block *bs;
    int n = fx_load("sched_fixtures.txt", &bs), seen = 0;
    for (int i = 0; i < n; i++) {
        char kind[32];
        fx_op(&bs[i], kind, sizeof kind);
        double base = fx_kw(&bs[i], "base", 0);
        em_lr_scheduler *s = NULL;
        if (!strcmp(kind, "multistep")) s = em_lr_multistep(base, (const int64_t[]){2, 5}, 2, fx_kw(&bs[i], "gamma", 0));
        else if (!strcmp(kind, "noam")) /* LambdaLR(noam) multiplies the base lr: Noam's factor is the base */
            s = em_lr_noam(base, (int64_t)fx_kw(&bs[i], "d_model", 0), (int64_t)fx_kw(&bs[i], "warmup", 0));
        else continue;
        assert_non_null(s);
        check_trajectory(bs[i].config, s, fx_get(&bs[i], "lr"));
        em_lr_scheduler_free(s);
        seen++;
    }
    fx_free(bs, n);
    assert_int_equal(seen, 2);
}

static void cli_errors(void **state)
{
    char err[256];
    bool ps;
    assert_null(em_tool_make_scheduler("bogus", 1e-3, 3, 5, -1, &ps, err, sizeof err));
    assert_non_null(strstr(err, "unknown scheduler 'bogus'"));
    assert_null(em_tool_make_scheduler("cosine", 1e-3, 3, 5, 2, &ps, err, sizeof err));
    assert_non_null(strstr(err, "--warmup applies to --scheduler warmup-cosine only"));
    assert_null(em_tool_make_scheduler("warmup-cosine", 1e-3, 1, 5, 5, &ps, err, sizeof err));
    assert_non_null(strstr(err, "must be below the run's 5 optimizer steps"));
    assert_int_equal(em_tool_check_scheduler("warmup-cosine", 3, err, sizeof err), 0);
    assert_int_equal(em_tool_check_scheduler("step", 3, err, sizeof err), -1);
    assert_int_equal(em_tool_check_scheduler("steps", -1, err, sizeof err), -1);
    /* the library's own check: 0 <= warmup < total */
    assert_null(em_lr_warmup_cosine(1.0, 4, 4, 0.0));
    assert_null(em_lr_warmup_cosine(1.0, -1, 4, 0.0));
}

typedef struct seen_epochs {
    int n;
    double lr[16];
    int64_t epoch[16];
} seen_epochs;

static void on_epoch(const em_epoch_metrics *m, void *ctx)
{
    seen_epochs *s = ctx;
    if (s->n < 16) {
        s->lr[s->n] = m->lr;
        s->epoch[s->n] = m->epoch;
    }
    s->n++;
}

static const fx_tensor *fixture_lr(fx_block *bs, int n, const char *config)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(bs[i].config, config)) return fx_get(&bs[i], "lr");
    fail_msg("no fixture %s", config);
    return NULL;
}

/* em_learner_fit with the CLI's schedulers: the lr in each epoch's metrics
 * (printed and written to metrics.csv) is the lr its steps used. */
static void learner_reports_lr_used(void **state)
{
    enum { N = 30, F = 3, B = 6 }; /* 5 steps per epoch, as warmup_cosine_e3_s5 */
    float x[N * F];
    int64_t y[N];
    em_test_class_batch(7, N, F, 2, x, y);
    em_dataset *ds = em_dataset_from_arrays(x, y, N, SHAPE(F), 1);
    assert_non_null(ds);
    fx_block *bs;
    int nb = fx_load("sched_fixtures.txt", &bs);
    const char *names[3] = {"cosine", "step", "warmup-cosine"};
    const char *configs[3] = {"cosine_e3", "step_e3", "warmup_cosine_e3_s5_w-1"};
    for (int k = 0; k < 3; k++) {
        em_manual_seed(1);
        em_module *m = em_linear_new(F, 2, true);
        em_optim_config oc = em_optim_config_default(EM_OPTIM_SGD);
        oc.lr = 1e-3;
        em_optim *opt = em_optim_new_for_module(&oc, m);
        em_loader_options lo = em_loader_options_default();
        lo.batch_size = B;
        em_loader *ld = em_loader_new(ds, &lo);
        assert_non_null(ld);
        assert_int_equal(em_loader_num_batches(ld), 5);
        char err[256];
        bool per_step;
        em_lr_scheduler *s = em_tool_make_scheduler(names[k], 1e-3, 3, em_loader_num_batches(ld), -1, &per_step, err, sizeof err);
        assert_non_null(s);
        em_learner_config cfg = em_learner_config_default();
        cfg.epochs = 3;
        cfg.progress = 0;
        cfg.sched_per_step = per_step;
        FILE *devnull = fopen("/dev/null", "w");
        cfg.log = devnull;
        seen_epochs se = {0};
        cfg.on_epoch = on_epoch;
        cfg.on_epoch_ctx = &se;
        em_epoch_metrics hist[3];
        int nh = 0;
        assert_int_equal(em_learner_fit(m, opt, s, ld, NULL, &cfg, hist, 3, &nh), EM_OK);
        fclose(devnull);
        assert_int_equal(nh, 3);
        assert_int_equal(se.n, 3);
        const fx_tensor *want = fixture_lr(bs, nb, configs[k]);
        for (int e = 0; e < 3; e++) {
            assert_int_equal(se.epoch[e], e + 1);
            double w = per_step ? want->v[(e + 1) * 5 - 1] : want->v[e]; /* per step: the epoch's last step */
            expect_lr(configs[k], e, hist[e].lr, w);
            expect_lr(configs[k], e, se.lr[e], w);
        }
        em_lr_scheduler_free(s);
        em_loader_free(ld);
        em_optim_free(opt);
        em_module_free(m);
    }
    fx_free(bs, nb);
    em_dataset_free(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cli_schedulers),
        cmocka_unit_test(library_schedulers),
        cmocka_unit_test(cli_errors),
        cmocka_unit_test(learner_reports_lr_used),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
