/* The Learner's run-folder behaviour (issue #20): the stop flag (Ctrl-C)
 * abandons the epoch and keeps the last finished epoch's files, a resume from
 * there ends byte-identical to an uninterrupted run with every metrics row
 * once; metrics rows follow their checkpoint; stale Ember tmp files go at
 * start; --resume drops rows after the checkpoint's epoch; em_run_dir_*. */
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N 64
#define F 6
#define K 3
#define BS 8

static float g_x[N * F];
static int64_t g_y[N];

/* A dataset that raises the stop flag when sample number g_trip is read. */
typedef struct trip_ds {
    em_dataset base;
    volatile sig_atomic_t *flag;
    int64_t reads, trip; /* trip < 0: never */
} trip_ds;

static int64_t trip_len(const em_dataset *ds)
{
    (void)ds;
    return N;
}

static em_status trip_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    trip_ds *t = (trip_ds *)ds;
    memcpy(x, g_x + i * F, sizeof(float) * F);
    *y = g_y[i];
    if (t->trip >= 0 && ++t->reads == t->trip) *t->flag = 1;
    return EM_OK;
}

static void trip_free(em_dataset *ds) { free(ds); }

static const em_dataset_vtable TRIP_VT = {trip_len, trip_get, trip_free};

static trip_ds *trip_new(volatile sig_atomic_t *flag, int64_t trip)
{
    trip_ds *t = calloc(1, sizeof *t);
    assert_non_null(t);
    assert_int_equal(em_dataset_init(&t->base, &TRIP_VT, (const int64_t[]){F}, 1, K), EM_OK);
    t->flag = flag;
    t->trip = trip;
    return t;
}

/* Trains a fresh seeded model into @p dir for @p epochs (resuming from
 * @p resume when non-NULL); the stop flag trips at train-sample read number
 * @p trip (< 0: never), or validation-sample read number @p vtrip. Returns
 * em_learner_fit's status. */
static em_status fit_v(const char *dir, int64_t epochs, const char *resume, int64_t trip, int64_t vtrip, volatile sig_atomic_t *flag)
{
    em_manual_seed(11);
    em_module *m = em_sequential_new(NULL, 0);
    assert_non_null(m);
    assert_int_equal(em_sequential_append(m, em_linear_new(F, 8, true)), EM_OK);
    assert_int_equal(em_sequential_append(m, em_relu_new()), EM_OK);
    assert_int_equal(em_sequential_append(m, em_linear_new(8, K, true)), EM_OK);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAM);
    oc.lr = 0.01;
    em_optim *opt = em_optim_new_for_module(&oc, m);
    assert_non_null(opt);
    trip_ds *tr = trip_new(flag, trip);
    em_dataset *va = &trip_new(flag, vtrip)->base;
    em_loader_options lo = em_loader_options_default();
    lo.batch_size = BS;
    lo.shuffle = true;
    lo.seed = 3;
    em_loader *ltr = em_loader_new(&tr->base, &lo);
    lo.shuffle = false;
    em_loader *lva = em_loader_new(va, &lo);
    assert_non_null(ltr);
    assert_non_null(lva);
    em_learner_config cfg = em_learner_config_default();
    cfg.epochs = epochs;
    cfg.out_dir = dir;
    cfg.resume = resume;
    cfg.progress = 0;
    cfg.stop_flag = flag;
    FILE *devnull = fopen("/dev/null", "w");
    cfg.log = devnull;
    em_status st = em_learner_fit(m, opt, NULL, ltr, lva, &cfg, NULL, 0, NULL);
    fclose(devnull);
    em_loader_free(ltr);
    em_loader_free(lva);
    em_dataset_free(&tr->base);
    em_dataset_free(va);
    em_optim_free(opt);
    em_module_free(m);
    return st;
}

static em_status fit(const char *dir, int64_t epochs, const char *resume, int64_t trip, volatile sig_atomic_t *flag)
{
    return fit_v(dir, epochs, resume, trip, -1, flag);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 20);
    assert_non_null(b);
    *n = fread(b, 1, (1 << 20) - 1, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static bool same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* The epochs of dir/metrics.csv as "1 2 3 ". */
static void metrics_epochs(const char *dir, char *out, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    bool header = true;
    while (fgets(line, sizeof line, f)) {
        if (header) {
            header = false;
            continue;
        }
        snprintf(out + strlen(out), n - strlen(out), "%lld ", strtoll(line, NULL, 10));
    }
    fclose(f);
}

static void touch(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static char *path2(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static void test_stop_flag_and_resume(void **state)
{
    (void)state;
    volatile sig_atomic_t flag = 0;
    char full[512], cut[512], ep[256];
    snprintf(full, sizeof full, "%s", em_test_tmp_path("full"));
    snprintf(cut, sizeof cut, "%s", em_test_tmp_path("cut"));
    assert_int_equal(fit(full, 4, NULL, -1, &flag), EM_OK);
    assert_int_equal(flag, 0);
    metrics_epochs(full, ep, sizeof ep);
    assert_string_equal(ep, "1 2 3 4 ");

    /* the flag rises while batch 3 of epoch 2 is read: that step runs, then the epoch is abandoned */
    assert_int_equal(fit(cut, 4, NULL, N + 2 * BS + 1, &flag), EM_ERR_INTERRUPTED);
    assert_int_equal(em_last_status(), EM_ERR_INTERRUPTED);
    const char *msg = em_last_error();
    assert_non_null(strstr(msg, "interrupted in epoch 2 (training, after 3 of 8 batches)"));
    assert_non_null(strstr(msg, "the last checkpoint is"));
    assert_non_null(strstr(msg, "cut/checkpoint.safetensors (epoch 1)"));
    metrics_epochs(cut, ep, sizeof ep);
    assert_string_equal(ep, "1 "); /* nothing of epoch 2 */
    em_checkpoint_info info = {0};
    em_module *probe = em_sequential_new(NULL, 0);
    assert_int_equal(em_sequential_append(probe, em_linear_new(F, 8, true)), EM_OK);
    assert_int_equal(em_sequential_append(probe, em_relu_new()), EM_OK);
    assert_int_equal(em_sequential_append(probe, em_linear_new(8, K, true)), EM_OK);
    assert_int_equal(em_checkpoint_load(path2(cut, "checkpoint.safetensors"), probe, NULL, NULL, &info), EM_OK);
    assert_int_equal(info.epoch, 1);
    em_module_free(probe);

    /* resumed: the same bytes as the uninterrupted run, each epoch's row once */
    flag = 0;
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", path2(cut, "checkpoint.safetensors"));
    assert_int_equal(fit(cut, 4, ck, -1, &flag), EM_OK);
    assert_true(same_file(path2(full, "checkpoint.safetensors"), path2(cut, "checkpoint.safetensors")));
    assert_true(same_file(path2(full, "best.safetensors"), path2(cut, "best.safetensors")));
    metrics_epochs(cut, ep, sizeof ep);
    assert_string_equal(ep, "1 2 3 4 ");

    /* raised before anything: no checkpoint, no metrics row */
    char none[512];
    snprintf(none, sizeof none, "%s", em_test_tmp_path("none"));
    flag = 1;
    assert_int_equal(fit(none, 4, NULL, -1, &flag), EM_ERR_INTERRUPTED);
    assert_non_null(strstr(em_last_error(), "interrupted in epoch 1 (training, after 0 of 8 batches); no checkpoint was written yet"));
    assert_false(exists(path2(none, "checkpoint.safetensors")));
    assert_false(exists(path2(none, "metrics.csv")));
    /* during validation (first batch of epoch 3's): epoch 3 is not saved */
    flag = 0;
    char val[512];
    snprintf(val, sizeof val, "%s", em_test_tmp_path("val"));
    assert_int_equal(fit_v(val, 4, NULL, -1, 2 * N + 1, &flag), EM_ERR_INTERRUPTED);
    assert_non_null(strstr(em_last_error(), "interrupted in epoch 3 (validation, after 1 of 8 batches)"));
    metrics_epochs(val, ep, sizeof ep);
    assert_string_equal(ep, "1 2 ");
}

static void test_resume_trims_metrics(void **state)
{
    (void)state;
    volatile sig_atomic_t flag = 0;
    char full[512], m[512], ep[256];
    snprintf(full, sizeof full, "%s", em_test_tmp_path("tfull"));
    snprintf(m, sizeof m, "%s", em_test_tmp_path("tm"));
    assert_int_equal(fit(full, 3, NULL, -1, &flag), EM_OK);
    assert_int_equal(fit(m, 1, NULL, -1, &flag), EM_OK); /* checkpoint of epoch 1 */
    /* rows of epochs 2 and 3 the checkpoint does not hold (a run killed after them, before its checkpoint) */
    FILE *f = fopen(path2(m, "metrics.csv"), "a");
    assert_non_null(f);
    fputs("2,1,0.5,1,0.5,1,0.01,100.0,0.100\n3,1,0.5,1,0.5,1,0.01,100.0,0.100\n", f);
    fclose(f);
    char ck[1024];
    snprintf(ck, sizeof ck, "%s", path2(m, "checkpoint.safetensors"));
    assert_int_equal(fit(m, 3, ck, -1, &flag), EM_OK);
    metrics_epochs(m, ep, sizeof ep);
    assert_string_equal(ep, "1 2 3 ");
    assert_true(same_file(path2(full, "checkpoint.safetensors"), path2(m, "checkpoint.safetensors")));
    /* nothing to drop: the file is left as it is */
    size_t n1, n2;
    char *before = slurp(path2(m, "metrics.csv"), &n1);
    assert_int_equal(fit(m, 3, ck, -1, &flag), EM_OK); /* already at epoch 3: trains nothing */
    char *after = slurp(path2(m, "metrics.csv"), &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    free(before);
    free(after);
}

/* A checkpoint that cannot be written: the error names it, and no metrics row
 * describes the unsaved epoch (rows are written after their checkpoint). */
static void test_metrics_row_after_checkpoint(void **state)
{
    (void)state;
    volatile sig_atomic_t flag = 0;
    char d[512];
    snprintf(d, sizeof d, "%s", em_test_tmp_path("rowafter"));
    assert_int_equal(mkdir(d, 0755), 0);
    assert_int_equal(mkdir(path2(d, "checkpoint.safetensors"), 0755), 0); /* the rename onto it fails */
    assert_int_equal(fit(d, 2, NULL, -1, &flag), EM_ERR_IO);
    assert_non_null(strstr(em_last_error(), "checkpoint.safetensors"));
    assert_false(exists(path2(d, "metrics.csv")));
}

static void test_run_dir_helpers(void **state)
{
    (void)state;
    const char *const *files = em_run_files();
    int nf = 0;
    while (files[nf]) nf++;
    assert_int_equal(nf, 7);
    char d[512], found[64];
    snprintf(d, sizeof d, "%s", em_test_tmp_path("rd"));
    assert_false(em_run_dir_holds_run(d, found, sizeof found)); /* missing folder */
    assert_int_equal(mkdir(d, 0755), 0);
    touch(path2(d, "notes.txt"), "mine");
    assert_false(em_run_dir_holds_run(d, found, sizeof found));
    for (int i = 0; files[i]; i++) {
        touch(path2(d, files[i]), "x");
        assert_true(em_run_dir_holds_run(d, found, sizeof found));
        assert_string_equal(found, files[i]);
        assert_int_equal(unlink(path2(d, files[i])), 0);
    }
    /* stale tmp files: exactly <run file>.tmp.XXXXXX */
    touch(path2(d, "checkpoint.safetensors.tmp.aB3dE9"), "stale");
    touch(path2(d, "loss.png.tmp.ZZZZZZ"), "stale");
    const char *keep[] = {"checkpoint.safetensors.tmp", "checkpoint.safetensors.tmp.aB3dE", "checkpoint.safetensors.tmp.aB3dE9x",
                          "checkpoint.safetensors.tmp.aB-dE9", "model.safetensors.tmp.aB3dE9", "xcheckpoint.safetensors.tmp.aB3dE9"};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) touch(path2(d, keep[i]), "mine");
    assert_int_equal(mkdir(path2(d, "metrics.csv.tmp.dir123"), 0755), 0); /* not a regular file */
    assert_false(em_run_dir_holds_run(d, NULL, 0)); /* tmp files are not a run */
    assert_int_equal(em_run_dir_remove_stale_tmp(d, NULL), 2);
    assert_false(exists(path2(d, "checkpoint.safetensors.tmp.aB3dE9")));
    assert_false(exists(path2(d, "loss.png.tmp.ZZZZZZ")));
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) assert_true(exists(path2(d, keep[i])));
    assert_true(exists(path2(d, "metrics.csv.tmp.dir123")));
    /* the Learner removes them at start */
    volatile sig_atomic_t flag = 0;
    touch(path2(d, "best.safetensors.tmp.q1w2e3"), "stale");
    assert_int_equal(fit(d, 1, NULL, -1, &flag), EM_OK);
    assert_false(exists(path2(d, "best.safetensors.tmp.q1w2e3")));
    assert_true(em_run_dir_holds_run(d, found, sizeof found));
    /* clear: the run files and Ember's tmp files go, nothing else */
    touch(path2(d, "accuracy.svg"), "old plot");
    touch(path2(d, "metrics.csv.tmp.r4t5y6"), "stale");
    assert_int_equal(em_run_dir_clear(d), 5); /* checkpoint, best, metrics, accuracy.svg, the tmp */
    assert_false(em_run_dir_holds_run(d, NULL, 0));
    assert_true(exists(path2(d, "notes.txt")));
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) assert_true(exists(path2(d, keep[i])));
    assert_int_equal(em_run_dir_clear(em_test_tmp_path("missing")), 0);
    assert_int_equal(em_run_dir_remove_stale_tmp(em_test_tmp_path("missing"), NULL), 0);
    assert_true(em_run_dir_clear(NULL) < 0);
    assert_false(em_run_dir_holds_run(NULL, NULL, 0));
}

/* A dataset of g_x / g_y whose even samples have a NaN (i % 4 == 0) or an inf (i % 4 == 2) feature:
 * their logits are not all finite. */
static em_status bad_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    (void)ds;
    memcpy(x, g_x + i * F, sizeof(float) * F);
    if (i % 4 == 0) x[1] = NAN;
    if (i % 4 == 2) x[2] = INFINITY;
    *y = g_y[i];
    return EM_OK;
}

static const em_dataset_vtable BAD_VT = {trip_len, bad_get, trip_free};

/* Samples with non-finite logits are wrong for top-1 and top-5 (K = 3 < 5: every finite sample is a
 * top-5 hit, so top-5 is exactly the finite half) and not in the confusion matrix; a fit whose loss
 * is NaN warns once. */
static void test_nonfinite_outputs(void **state)
{
    (void)state;
    em_manual_seed(11);
    em_module *m = em_sequential_new(NULL, 0);
    assert_non_null(m);
    assert_int_equal(em_sequential_append(m, em_linear_new(F, K, true)), EM_OK);
    em_dataset *ds = calloc(1, sizeof(trip_ds));
    assert_non_null(ds);
    assert_int_equal(em_dataset_init(ds, &BAD_VT, (const int64_t[]){F}, 1, K), EM_OK);
    em_loader_options lo = em_loader_options_default();
    lo.batch_size = BS;
    lo.shuffle = false;
    em_loader *l = em_loader_new(ds, &lo);
    assert_non_null(l);
    em_eval_result r;
    int64_t conf[K * K];
    assert_int_equal(em_evaluate(m, l, K, &r, conf), EM_OK);
    assert_int_equal(r.samples, N);
    assert_true(isnan(r.loss));
    assert_true(r.top5 == 0.5);
    assert_true(r.accuracy <= 0.5);
    int64_t in_matrix = 0, diag = 0;
    for (int i = 0; i < K * K; i++) in_matrix += conf[i];
    for (int i = 0; i < K; i++) diag += conf[i * K + i];
    assert_int_equal(in_matrix, N / 2);
    assert_true(r.accuracy == (double)diag / N);

    /* training on it: the loss is NaN from epoch 1, one warning in 3 epochs */
    em_optim_config oc = em_optim_config_default(EM_OPTIM_SGD);
    oc.lr = 0.01;
    em_optim *opt = em_optim_new_for_module(&oc, m);
    assert_non_null(opt);
    em_learner_config cfg = em_learner_config_default();
    cfg.epochs = 3;
    cfg.progress = 0;
    const char *logp = em_test_tmp_path("nan.log");
    FILE *log = fopen(logp, "w");
    assert_non_null(log);
    cfg.log = log;
    assert_int_equal(em_learner_fit(m, opt, NULL, l, l, &cfg, NULL, 0, NULL), EM_OK);
    fclose(log);
    size_t n;
    char *text = slurp(logp, &n);
    assert_non_null(text);
    const char *w = strstr(text, "warning: the training loss is nan in epoch 1: the run has diverged (lower --lr?)\n");
    assert_non_null(w);
    assert_null(strstr(w + 1, "warning:"));
    assert_non_null(strstr(text, "epoch 3/3")); /* still trains every epoch */
    free(text);
    em_optim_free(opt);
    em_loader_free(l);
    em_dataset_free(ds);
    em_module_free(m);
}

int main(void)
{
    em_test_class_batch(5, N, F, K, g_x, g_y);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_flag_and_resume),
        cmocka_unit_test(test_resume_trims_metrics),
        cmocka_unit_test(test_metrics_row_after_checkpoint),
        cmocka_unit_test(test_run_dir_helpers),
        cmocka_unit_test(test_nonfinite_outputs),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
