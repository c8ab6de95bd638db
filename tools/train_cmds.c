/* `ember train`, `ember eval`, `ember predict`. */
#include "tools/tools.h"
#include "ember/dist.h" /* [dist] */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *FMNIST_CLASSES[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                         "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/* Parses "256,128" into sizes, each in [minval, maxval]: the count, or -1
 * (not a comma-separated list of integers, a value out of range, more than
 * max values, an empty item). */
static int parse_list(const char *s, int64_t *out, int max, long long minval, long long maxval)
{
    int n = 0;
    while (s && *s) {
        char *end;
        if (*s < '0' || *s > '9') return -1; /* no sign, no blank, no empty item */
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < minval || v > maxval || n == max) return -1;
        out[n++] = v;
        if (*end && *end != ',') return -1;
        if (*end == ',' && !end[1]) return -1; /* trailing comma */
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* Appends @p child to @p seq; false (with the error in err) on failure. */
static bool append(em_module *seq, em_module *child, char *err, size_t nerr)
{
    if (child && em_sequential_append(seq, child) == EM_OK) return true;
    snprintf(err, nerr, "%s", em_last_error());
    return false;
}

/* Reads a positive integer at *p (advancing it); -1 when there is none. */
static long long read_pos(const char **p)
{
    char *end;
    if (**p < '0' || **p > '9') return -1;
    errno = 0;
    long long v = strtoll(*p, &end, 10);
    if (end == *p || v <= 0 || errno) return -1;
    *p = end;
    return v;
}

typedef struct cnn_spec {
    long long C, H, W;
    long long chans[32], reps[32], fcs[16], classes;
    int nb, nf;
    double dropout;
} cnn_spec;

/* Parses "cnn:CxHxW-B1-...-fcF...-K[:dropout=P]" (see em_tool_build_model);
 * 0, or -1 with the reason in err. Needs no runtime. */
static int parse_cnn(const char *spec, cnn_spec *cs, char *err, size_t nerr)
{
    const char *p = spec + 4;
    long long C = read_pos(&p), H = -1, W = -1;
    if (C > 0 && *p == 'x' && (p++, (H = read_pos(&p)) > 0) && *p == 'x') {
        p++;
        W = read_pos(&p);
    }
    if (C <= 0 || H <= 0 || W <= 0 || *p != '-') {
        snprintf(err, nerr, "bad model spec '%s': expected cnn:CxHxW-... (e.g. %s)", spec, EM_TOOL_CNN_DEFAULT);
        return -1;
    }
    /* tokens: conv blocks "N" / "NxR", then hidden layers "fcN", then the class count "N" */
    long long *chans = cs->chans, *reps = cs->reps, *fcs = cs->fcs, classes = -1;
    int nb = 0, nf = 0;
    double dropout = 0;
    while (*p == '-') {
        p++;
        if (classes > 0) { /* the class count was not the last token */
            snprintf(err, nerr, "bad model spec '%s': the class count must come last", spec);
            return -1;
        }
        if (!strncmp(p, "fc", 2)) {
            p += 2;
            long long f = read_pos(&p);
            if (f <= 0 || nf == 16) {
                snprintf(err, nerr, "bad model spec '%s': bad hidden layer 'fcN'", spec);
                return -1;
            }
            fcs[nf++] = f;
            continue;
        }
        long long v = read_pos(&p), r = 1;
        if (v <= 0) {
            snprintf(err, nerr, "bad model spec '%s': expected a number, NxR or fcN after '-'", spec);
            return -1;
        }
        if (*p == 'x') {
            p++;
            if ((r = read_pos(&p)) <= 0 || r > 16) {
                snprintf(err, nerr, "bad model spec '%s': bad repeat count in a block NxR (1 to 16)", spec);
                return -1;
            }
        } else if (*p != '-') { /* the last plain number: classes */
            classes = v;
            continue;
        }
        if (nf > 0 || nb == 32) {
            snprintf(err, nerr, "bad model spec '%s': %s", spec, nf > 0 ? "conv blocks must come before the fcN layers" : "too many blocks");
            return -1;
        }
        chans[nb] = v;
        reps[nb++] = r;
    }
    if (*p == ':') {
        if (strncmp(p, ":dropout=", 9) != 0) {
            snprintf(err, nerr, "bad model spec '%s': unknown option '%s' (expected :dropout=P)", spec, p);
            return -1;
        }
        char *end;
        dropout = strtod(p + 9, &end);
        if (end == p + 9 || *end || !(dropout >= 0 && dropout < 1)) {
            snprintf(err, nerr, "bad model spec '%s': dropout must be in [0, 1)", spec);
            return -1;
        }
        p = end;
    }
    if (*p || classes <= 0 || nb == 0) {
        snprintf(err, nerr, "bad model spec '%s': expected cnn:CxHxW-BLOCKS...-[fcN-]...CLASSES (e.g. %s)", spec, EM_TOOL_CNN_DEFAULT);
        return -1;
    }
    long long h = H, w = W;
    for (int b = 0; b < nb; b++) {
        if (h < 2 || w < 2) {
            snprintf(err, nerr, "bad model spec '%s': block %d pools a %lldx%lld map (too many blocks for the image)", spec, b + 1, h, w);
            return -1;
        }
        h /= 2;
        w /= 2;
    }
    cs->C = C;
    cs->H = H;
    cs->W = W;
    cs->nb = nb;
    cs->nf = nf;
    cs->classes = classes;
    cs->dropout = dropout;
    return 0;
}

static em_module *build_cnn(const char *spec, char *err, size_t nerr)
{
    cnn_spec cs;
    if (parse_cnn(spec, &cs, err, nerr) != 0) return NULL;
    const long long C = cs.C, H = cs.H, W = cs.W, *chans = cs.chans, *reps = cs.reps, *fcs = cs.fcs, classes = cs.classes;
    const int nb = cs.nb, nf = cs.nf;
    const double dropout = cs.dropout;
    em_module *seq = em_sequential_new(NULL, 0);
    if (!seq) {
        snprintf(err, nerr, "%s", em_last_error());
        return NULL;
    }
    em_conv_opts co = em_conv_opts_default();
    co.padding[0] = co.padding[1] = 1;
    em_pool_opts po = em_pool_opts_default(2, 2);
    long long cin = C, h = H, w = W;
    for (int b = 0; b < nb; b++) {
        for (long long r = 0; r < reps[b]; r++) {
            /* no conv bias: the BatchNorm after it has one */
            if (!append(seq, em_conv2d_new(cin, chans[b], 3, 3, &co, false), err, nerr) ||
                !append(seq, em_batch_norm2d_new(chans[b], 1e-5, 0.1, true, true), err, nerr) ||
                !append(seq, em_relu_new(), err, nerr))
                goto fail;
            cin = chans[b];
        }
        if (!append(seq, em_max_pool2d_new(&po), err, nerr)) goto fail;
        h /= 2;
        w /= 2;
    }
    if (!append(seq, em_flatten_new(1, -1), err, nerr)) goto fail;
    long long in = cin * h * w;
    for (int i = 0; i < nf; i++) {
        if (!append(seq, em_linear_new(in, fcs[i], true), err, nerr) || !append(seq, em_relu_new(), err, nerr)) goto fail;
        if (dropout > 0 && !append(seq, em_dropout_new(dropout), err, nerr)) goto fail;
        in = fcs[i];
    }
    if (!append(seq, em_linear_new(in, classes, true), err, nerr)) goto fail;
    return seq;
fail:
    em_module_free(seq);
    return NULL;
}

/* "mlp:IN-H1-...-OUT[:dropout=P]": 0, or -1 with the reason in err. */
static int check_mlp(const char *spec, char *err, size_t nerr)
{
    const char *p = spec + 4;
    int n = 0;
    for (;;) {
        long long v = read_pos(&p);
        if (v <= 0 || v > ((long long)1 << 24) || ++n > 16) {
            snprintf(err, nerr, "bad model spec '%s': expected mlp:IN-H1-...-OUT with 2 to 16 sizes in [1, 16777216]", spec);
            return -1;
        }
        if (*p != '-') break;
        p++;
    }
    if (n < 2) {
        snprintf(err, nerr, "model spec '%s' needs at least input and output sizes", spec);
        return -1;
    }
    if (*p == ':') {
        char *end;
        double d = strncmp(p, ":dropout=", 9) ? NAN : strtod(p + 9, &end);
        if (isnan(d) || end == p + 9 || *end || !(d >= 0 && d < 1)) {
            snprintf(err, nerr, "bad model spec '%s': expected :dropout=P with P in [0, 1) after the sizes", spec);
            return -1;
        }
        return 0;
    }
    if (*p) {
        snprintf(err, nerr, "bad model spec '%s': unexpected '%s'", spec, p);
        return -1;
    }
    return 0;
}

int em_tool_check_spec(const char *spec, char *err, size_t nerr)
{
    cnn_spec cs;
    if (!strncmp(spec, "cnn:", 4)) return parse_cnn(spec, &cs, err, nerr);
    if (!strncmp(spec, "mlp:", 4)) return check_mlp(spec, err, nerr);
    snprintf(err, nerr, "unknown model '%s' (expected mlp:IN-H1-...-OUT or cnn:CxHxW-...)", spec);
    return -1;
}

int em_tool_check_input(const char *spec, const em_dataset *ds, char *err, size_t nerr)
{
    if (!strncmp(spec, "cnn:", 4)) {
        cnn_spec cs;
        if (parse_cnn(spec, &cs, err, nerr) != 0) return -1;
        int nd = ds->feature_ndim;
        long long c = nd == 3 ? ds->feature_shape[0] : 1, h = nd >= 2 ? ds->feature_shape[nd - 2] : -1,
                  w = nd >= 2 ? ds->feature_shape[nd - 1] : -1;
        if ((nd != 2 && nd != 3) || c != cs.C || h != cs.H || w != cs.W) {
            snprintf(err, nerr, "model %s takes %lldx%lldx%lld images, the data has samples of %lld features (%s)", spec, cs.C, cs.H, cs.W,
                     (long long)ds->num_features, nd == 2 || nd == 3 ? "another image size" : "not images");
            return -1;
        }
        return 0;
    }
    long long in = strtoll(spec + 4, NULL, 10);
    if (!strncmp(spec, "mlp:", 4) && in != ds->num_features) {
        snprintf(err, nerr, "model %s takes %lld features, the data has %lld per sample", spec, in, (long long)ds->num_features);
        return -1;
    }
    return 0;
}

/* "mlp:784-256-128-10" (optionally ":dropout=0.2") or a CNN spec (build_cnn) */
em_module *em_tool_build_model(const char *spec, char *err, size_t nerr)
{
    int64_t sizes[16];
    int n = 0;
    double dropout = 0;
    if (!strncmp(spec, "cnn:", 4)) return build_cnn(spec, err, nerr);
    if (strncmp(spec, "mlp:", 4) != 0) {
        snprintf(err, nerr, "unknown model '%s' (expected mlp:IN-H1-...-OUT or cnn:CxHxW-...)", spec);
        return NULL;
    }
    const char *p = spec + 4;
    while (*p && *p != ':') {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0 || n == 16) {
            snprintf(err, nerr, "bad model spec '%s'", spec);
            return NULL;
        }
        sizes[n++] = v;
        p = end;
        if (*p == '-') p++;
    }
    if (!strncmp(p, ":dropout=", 9)) dropout = strtod(p + 9, NULL);
    if (n < 2) {
        snprintf(err, nerr, "model spec '%s' needs at least input and output sizes", spec);
        return NULL;
    }
    em_module *seq = em_sequential_new(NULL, 0);
    if (!seq || em_sequential_append(seq, em_flatten_new(1, -1)) != EM_OK) {
        snprintf(err, nerr, "%s", em_last_error());
        em_module_free(seq);
        return NULL;
    }
    for (int i = 0; i + 1 < n; i++) {
        em_module *lin = em_linear_new(sizes[i], sizes[i + 1], true);
        if (!lin || em_sequential_append(seq, lin) != EM_OK) goto fail;
        if (i + 2 < n) {
            if (em_sequential_append(seq, em_relu_new()) != EM_OK) goto fail;
            if (dropout > 0 && em_sequential_append(seq, em_dropout_new(dropout)) != EM_OK) goto fail;
        }
    }
    return seq;
fail:
    snprintf(err, nerr, "%s", em_last_error());
    em_module_free(seq);
    return NULL;
}

/* Input normalisation of a checkpoint's model, per channel. */
typedef struct tool_norm {
    int n;
    float mean[64], std[64];
} tool_norm;

/* Comma-separated floats into out (at most max); the count, or -1. */
static int parse_floats(const char *s, float *out, int max)
{
    int n = 0;
    while (s && *s) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || n == max) return -1;
        out[n++] = (float)v;
        if (*end && *end != ',') return -1;
        s = *end ? end + 1 : end;
    }
    return n;
}

/* Reads a checkpoint's normalisation metadata ('ember.norm_mean' /
 * 'ember.norm_std') into norm: 1 when present and valid, 0 when absent,
 * -1 when malformed. */
static int read_norm(const em_st_file *f, tool_norm *norm)
{
    const char *ms = em_safetensors_metadata(f, "ember.norm_mean"), *ss = em_safetensors_metadata(f, "ember.norm_std");
    if (!ms && !ss) return 0;
    int a = parse_floats(ms, norm->mean, 64), b = parse_floats(ss, norm->std, 64);
    bool ok = a >= 1 && a == b;
    for (int i = 0; ok && i < a; i++) ok = norm->std[i] != 0.0f && isfinite(norm->std[i]) && isfinite(norm->mean[i]);
    norm->n = a;
    return ok ? 1 : -1;
}

/* What `ember train --resume / --init-from` takes from a file's metadata. */
typedef struct ckpt_meta {
    bool is_ckpt;   /* 'ember.format' is an Ember checkpoint (tensors under model.*) */
    bool has_spec;  /* 'ember.model' */
    char spec[256];
    bool has_norm;  /* 'ember.norm_mean' / 'ember.norm_std' */
    tool_norm norm;
    int augment;    /* 'ember.augment': 1 crop+flip, 0 none, -1 not recorded */
    int64_t epoch;  /* 'ember.epoch': epochs completed */
    char train[512]; /* 'ember.train': the run's settings, "key=value ..." (empty: not recorded) */
    bool weights_only; /* 'ember.optim_kind' is "none": best.safetensors, no optimizer state */
} ckpt_meta;

/* Opens @p path (given as option @p flag of `ember train`) and reads its
 * metadata: 0, or 1 (runtime error: unreadable or malformed file) after
 * printing why. Needs no runtime. */
static int read_ckpt_meta(const char *flag, const char *path, ckpt_meta *cm)
{
    memset(cm, 0, sizeof *cm);
    cm->augment = -1;
    em_st_file *f = em_safetensors_open(path);
    if (!f) {
        fprintf(stderr, "ember train: %s: %s\n", flag, em_last_error());
        return 1;
    }
    int rc = 0;
    const char *fmt = em_safetensors_metadata(f, "ember.format"), *spec = em_safetensors_metadata(f, "ember.model");
    const char *aug = em_safetensors_metadata(f, "ember.augment"), *ep = em_safetensors_metadata(f, "ember.epoch");
    cm->is_ckpt = fmt && !strcmp(fmt, "checkpoint-1");
    if (spec && strlen(spec) < sizeof cm->spec) {
        snprintf(cm->spec, sizeof cm->spec, "%s", spec);
        cm->has_spec = true;
    } else if (spec) {
        fprintf(stderr, "ember train: %s: %s: model spec in 'ember.model' is too long\n", flag, path);
        rc = 1;
    }
    int nr = read_norm(f, &cm->norm);
    cm->has_norm = nr > 0;
    if (nr < 0) {
        fprintf(stderr, "ember train: %s: %s: bad normalisation metadata (ember.norm_mean '%s', ember.norm_std '%s')\n", flag, path,
                em_safetensors_metadata(f, "ember.norm_mean") ? em_safetensors_metadata(f, "ember.norm_mean") : "",
                em_safetensors_metadata(f, "ember.norm_std") ? em_safetensors_metadata(f, "ember.norm_std") : "");
        rc = 1;
    }
    if (aug) cm->augment = strcmp(aug, "none") != 0;
    if (ep) cm->epoch = strtoll(ep, NULL, 10);
    const char *ok_ = em_safetensors_metadata(f, "ember.optim_kind");
    cm->weights_only = ok_ && !strcmp(ok_, "none");
    const char *tr = em_safetensors_metadata(f, "ember.train");
    if (tr && strlen(tr) < sizeof cm->train) snprintf(cm->train, sizeof cm->train, "%s", tr);
    em_safetensors_close(f);
    return rc;
}

typedef struct key_list {
    const char *names[4096];
    em_tensor *ts[4096];
    char buf[4096][96];
    size_t n;
    bool overflow;
} key_list;

static void collect_key(const char *key, em_tensor *t, void *ud)
{
    key_list *k = ud;
    if (k->n == 4096 || strlen(key) >= sizeof k->buf[0]) {
        k->overflow = true;
        return;
    }
    snprintf(k->buf[k->n], sizeof k->buf[0], "%s", key);
    k->names[k->n] = k->buf[k->n];
    k->ts[k->n++] = em_tensor_retain(t); /* visitors may hand out temporaries */
}

/* --init-from: the weights (and buffers) of @p path into @p model, nothing
 * else. An Ember checkpoint (best.safetensors, checkpoint.safetensors: keys
 * model.<key>) or a weights-only file with the model's own keys (PyTorch's
 * safetensors.torch.save_file(model.state_dict())). Every key of the model
 * must be in the file with its shape and dtype, and the file must hold no
 * other model tensor; else an error naming the key, and the model is left
 * as it was. */
static em_status load_weights(const char *path, bool is_ckpt, em_module *model)
{
    if (is_ckpt) return em_checkpoint_load(path, model, NULL, NULL, NULL);
    key_list *k = calloc(1, sizeof *k);
    if (!k) return em_set_error(EM_ERR_NOMEM, "out of memory");
    em_status st = em_module_visit_params(model, collect_key, k);
    if (st == EM_OK) st = em_module_visit_buffers(model, collect_key, k);
    if (st == EM_OK && k->overflow) st = em_set_error(EM_ERR_INVALID, "%s: the model has too many or too long keys", path);
    if (st == EM_OK) st = em_safetensors_load_into(path, k->names, k->ts, k->n, true);
    for (size_t i = 0; i < k->n; i++) em_tensor_release(k->ts[i]);
    free(k);
    return st;
}

/* EMBER_DATA_DIR overrides the default MNIST-layout folder. */
static const char *default_data_dir(void)
{
    const char *d = getenv("EMBER_DATA_DIR");
    return d && *d ? d : EM_FASHION_MNIST_DIR;
}

/* Copies @p src to @p dst (dst.tmp.XXXXXX, then a rename): 0, or -1 with the
 * reason printed. A missing @p src is not an error (1). */
static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? 1 : (fprintf(stderr, "ember train: cannot read %s: %s\n", src, strerror(errno)), -1);
    char tmp[4200];
    int fd = snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", dst) < (int)sizeof tmp ? mkstemp(tmp) : -1;
    FILE *o = fd >= 0 ? fdopen(fd, "wb") : NULL;
    bool ok = o != NULL;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, o) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (o && fclose(o) != 0) ok = false;
    if (!o && fd >= 0) close(fd);
    if (ok) chmod(tmp, 0644);
    if (!ok || rename(tmp, dst) != 0) {
        fprintf(stderr, "ember train: cannot copy %s to %s: %s\n", src, dst, strerror(errno));
        if (fd >= 0) remove(tmp);
        return -1;
    }
    return 0;
}

/* A run folder this process made and locked: at exit, when the run wrote
 * nothing into it (it failed before its first epoch), the folder goes again,
 * so that a failed start leaves nothing behind. */
static char g_made_run_dir[4096];

static void remove_unused_run_dir(void)
{
    if (!g_made_run_dir[0] || em_run_dir_holds_run(g_made_run_dir, NULL, 0)) return;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/.ember-lock", g_made_run_dir);
    unlink(lock);
    rmdir(g_made_run_dir); /* only when empty */
}

/* --device checked before anything starts: a bad one is a usage error (2). */
static int check_device(const char *cmd, const char *device)
{
    em_device d;
    if (!device || em_device_parse(device, &d) == EM_OK) return 0;
    fprintf(stderr, "ember %s: --device: %s\n", cmd, em_last_error());
    return EM_TOOL_EXIT_USAGE;
}

static int init_runtime(const char *device)
{
    em_config c = em_config_default();
    if (device) c.device = device;
    if (em_init(&c) != EM_OK) {
        fprintf(stderr, "ember: %s\n", em_last_error());
        return 1;
    }
    return 0;
}

/* ---- Ctrl-C: the first SIGINT / SIGTERM asks the Learner to stop between steps;
 * the handler then restores the default action, so a second one ends the
 * process at once. Only async-signal-safe calls in the handler. */
static volatile sig_atomic_t g_stop;
static int g_stop_seen; /* set atomically: two signals may reach two threads at once */
static struct sigaction g_old_int, g_old_term;

static int g_stop_said; /* the first handler has written its message */

static void on_stop_signal(int sig)
{
    static const char msg_int[] = "\nember train: stopping after the current step (press Ctrl-C again to quit at once)\n";
    static const char msg_term[] = "\nember train: stopping after the current step (a second signal quits at once)\n";
    if (__atomic_exchange_n(&g_stop_seen, 1, __ATOMIC_SEQ_CST)) { /* the second one: at once */
        /* a second signal on another thread at the same moment: let the first
         * handler's message out first (a bounded wait, no calls) */
        for (long i = 0; i < 200000000L && !__atomic_load_n(&g_stop_said, __ATOMIC_SEQ_CST); i++) {
        }
        _exit(128 + sig);
    }
    ssize_t w = sig == SIGINT ? write(STDERR_FILENO, msg_int, sizeof msg_int - 1)
                              : write(STDERR_FILENO, msg_term, sizeof msg_term - 1);
    (void)w;
    __atomic_store_n(&g_stop_said, 1, __ATOMIC_SEQ_CST);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    g_stop = sig;
}

/* After em_init: StarPU installs its own SIGINT handler in starpu_init. */
static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* writes in progress (a checkpoint) complete */
    g_stop = 0;
    __atomic_store_n(&g_stop_seen, 0, __ATOMIC_SEQ_CST);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
}

static void restore_stop_handlers(void)
{
    if (g_stop) return; /* already the default: a second Ctrl-C during shutdown ends the process */
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
}

/* ---- run folders (issue #20): a run is never silently replaced ---- */

/* Folder of a file path ("." when it has none). */
static void dir_of(const char *path, char *out, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

static bool same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0) return !strcmp(a, b);
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The default folder: @p base when it holds no run, else the first of
 * base-2, base-3, ... that holds none (Ultralytics' numbering). */
static int next_run_dir(const char *base, char *out, size_t n)
{
    snprintf(out, n, "%s", base);
    for (int k = 2; em_run_dir_holds_run(out, NULL, 0); k++) {
        if (k > 100000) return -1;
        snprintf(out, n, "%s-%d", base, k);
    }
    return 0;
}

/* One argument for a shell, quoted when it needs to be. */
static void shell_word(FILE *f, const char *w)
{
    bool plain = *w != 0;
    for (const char *p = w; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,=+@%", *p)) plain = false;
    if (plain) {
        fputs(w, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = w; *p; p++) {
        if (*p == '\'') fputs("'\\''", f);
        else fputc(*p, f);
    }
    fputc('\'', f);
}

/* Prints "ember train ARGS --resume CKPT": the command line without its
 * --resume and --overwrite (re-parsed on a copy of argv, so every spelling
 * getopt accepts is found). */
static void print_resume_command(FILE *f, int argc, char **argv, const char *shortopts, const struct option *opts, int o_resume,
                                 int o_overwrite, const char *ckpt)
{
    char **av = malloc(sizeof *av * (size_t)(argc + 1));
    bool *skip = calloc((size_t)argc + 1, sizeof *skip);
    fputs("ember train", f);
    if (av && skip) {
        memcpy(av, argv, sizeof *av * (size_t)argc);
        av[argc] = NULL;
        int saved_opterr = opterr, c;
        opterr = 0;
        optind = 1;
        for (int prev = 1; (c = getopt_long(argc, av, shortopts, opts, NULL)) != -1; prev = optind)
            if (c == o_resume || c == o_overwrite)
                for (int i = prev; i < optind && i < argc; i++) skip[i] = true;
        opterr = saved_opterr;
        /* getopt_long may permute av; the command parsed without non-options, so av == argv */
        for (int i = 1; i < argc; i++)
            if (!skip[i]) {
                fputc(' ', f);
                shell_word(f, argv[i]);
            }
    }
    fputs(" --resume ", f);
    shell_word(f, ckpt);
    fputc('\n', f);
    free(av);
    free(skip);
}

/* ---- the pieces `ember train --model gpt` (tools/train_gpt.c) shares (tools.h) ---- */
volatile sig_atomic_t *em_tool_stop_flag(void) { return &g_stop; }
void em_tool_install_stop_handlers(void) { install_stop_handlers(); }
void em_tool_restore_stop_handlers(void) { restore_stop_handlers(); }
int em_tool_check_device(const char *cmd, const char *device) { return check_device(cmd, device); }
int em_tool_init_runtime(const char *device) { return init_runtime(device); }
int em_tool_copy_file(const char *src, const char *dst) { return copy_file(src, dst); }
void em_tool_report_interrupt(const char *out, const char *resume, int argc, char **argv, const char *shortopts,
                              const struct option *opts, int o_resume, int o_overwrite)
{
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoint.safetensors", out);
    if (access(ck, F_OK) != 0 && resume) snprintf(ck, sizeof ck, "%s", resume);
    fflush(stdout);
    fprintf(stderr, "ember train: %s\n", em_last_error());
    if (access(ck, F_OK) == 0) {
        fprintf(stderr, "interrupted: resume with: ");
        print_resume_command(stderr, argc, argv, shortopts, opts, o_resume, o_overwrite, ck);
    } else {
        fprintf(stderr, "interrupted: no checkpoint was written, nothing to resume\n");
    }
}

int em_tool_claim_run_dir(em_tool_run_dir *rd, const char *base, const char *out, const char *resume, bool overwrite, bool lock)
{
    memset(rd, 0, sizeof *rd);
    rd->lock = -1;
    const bool out_given = rd->out_given = out != NULL;
    char *out_buf = rd->buf, *ckpt_dir = rd->ckpt_dir, *run_note = rd->note;
    if (resume) dir_of(resume, ckpt_dir, sizeof rd->ckpt_dir);
    if (!out_given) {
        if (resume) {
            snprintf(out_buf, sizeof rd->buf, "%s", ckpt_dir);
            snprintf(run_note, sizeof rd->note, " (the folder of --resume)");
        } else if (overwrite) {
            snprintf(out_buf, sizeof rd->buf, "%s", base);
        } else {
            if (next_run_dir(base, out_buf, sizeof rd->buf) != 0) {
                fprintf(stderr, "ember train: no free run folder %s-N; give --out DIR\n", base);
                return EM_TOOL_EXIT_USAGE;
            }
            if (strcmp(out_buf, base) != 0)
                snprintf(run_note, sizeof rd->note, " (%s holds an earlier run)", base);
        }
        out = out_buf;
    }
    const bool in_place = rd->in_place = resume && same_dir(out, ckpt_dir);
    if (overwrite && in_place) {
        fprintf(stderr, "ember train: --overwrite would remove the checkpoint that --resume %s continues from; give one of them\n", resume);
        return EM_TOOL_EXIT_USAGE;
    }
    char found[64];
    if (!in_place && !overwrite && em_run_dir_holds_run(out, found, sizeof found)) {
        fprintf(stderr,
                "ember train: %s already holds a run (%s/%s); continue it with --resume %s/checkpoint.safetensors, "
                "replace it with --overwrite, or give another --out\n",
                out, out, found, out);
        return EM_TOOL_EXIT_USAGE;
    }
    /* an unwritable --out fails now, not after the first epoch */
    if (lock && em_check_output_dir(out) != EM_OK) {
        fprintf(stderr, "ember train: --out: %s\n", em_last_error());
        return EM_TOOL_EXIT_RUNTIME;
    }
    /* claim the folder now (a lock held until exit), so that two runs started
     * together never share one: a default folder taken by a running run moves
     * on to the next number, an explicit --out in use is refused */
    int run_lock = -1;
    while (lock && run_lock < 0) {
        struct stat ost;
        const bool existed = stat(out, &ost) == 0;
        run_lock = em_run_dir_lock(out);
        if (run_lock >= 0 && !existed) em_tool_note_made_run_dir(out);
        if (run_lock >= 0 && !in_place && !overwrite && em_run_dir_holds_run(out, found, sizeof found)) {
            close(run_lock); /* another run finished its first epoch there meanwhile */
            run_lock = -1;
            if (out_given) {
                fprintf(stderr, "ember train: %s already holds a run (%s/%s)\n", out, out, found);
                return EM_TOOL_EXIT_USAGE;
            }
        } else if (run_lock < 0 && (out_given || resume || overwrite || em_last_status() != EM_ERR_STATE)) {
            fprintf(stderr, "ember train: %s\n", em_last_error());
            return em_last_status() == EM_ERR_STATE ? EM_TOOL_EXIT_USAGE : EM_TOOL_EXIT_RUNTIME;
        }
        if (run_lock < 0) { /* the default folder is busy: the next numbered one */
            int k = 2;
            const size_t bl = strlen(base);
            if (!strncmp(out_buf, base, bl) && out_buf[bl] == '-') k = atoi(out_buf + bl + 1) + 1;
            do snprintf(out_buf, sizeof rd->buf, "%s-%d", base, k++);
            while (em_run_dir_holds_run(out_buf, NULL, 0) && k < 100000);
            snprintf(run_note, sizeof rd->note, " (%s is in use or holds an earlier run)", base);
        }
    }
    rd->out = out;
    rd->lock = run_lock;
    return 0;
}

void em_tool_note_made_run_dir(const char *dir)
{
    if (strlen(dir) >= sizeof g_made_run_dir) return;
    if (!g_made_run_dir[0]) atexit(remove_unused_run_dir);
    snprintf(g_made_run_dir, sizeof g_made_run_dir, "%s", dir);
}

static void train_help(void)
{
    printf("usage: ember train [options]\n"
           "       ember train --model gpt [options]   (a character-level language model: see\n"
           "                                           ember train --model gpt --help)\n\n"
           "Trains an MLP or CNN classifier on Fashion-MNIST (or any MNIST-layout folder)\n"
           "and prints per-epoch metrics; checkpoints and metrics.csv go to --out.\n\n"
           "  --data DIR             MNIST-layout folder (default $EMBER_DATA_DIR or %s)\n"
           "  --model NAME           mlp (default), cnn, or a full model spec (below); gpt: a language\n"
           "                         model with its own options (ember train --model gpt --help)\n"
           "  --hidden LIST          mlp: hidden layer sizes (default 256,128)\n"
           "  --dropout P            mlp: dropout after each hidden layer (default 0);\n"
           "                         cnn: dropout of the classifier's hidden layer (default 0.25)\n"
           "  --augment / --no-augment   random crop (padding 2) and horizontal flip of the\n"
           "                         training images (default: on for cnn, off for mlp)\n"
           "  --limit N              use the first N training and N test images (quick checks; N >= 1)\n"
           "  --epochs N             epochs, 1 to 1000000 (default 10; 15 for --model cnn)\n"
           "  --batch-size N         batch size, 1 to 1048576 (default 64)\n"
           "  --optimizer NAME       adam, adamw, sgd, rmsprop, adagrad (default adam)\n"
           "  --lr X                 learning rate, > 0 (default 1e-3; sgd 0.05)\n"
           "  --momentum X           SGD/RMSprop momentum in [0, 1] (default 0.9 for sgd, 0 for rmsprop)\n"
           "  --weight-decay X       weight decay, >= 0 (default 0)\n"
           "  --scheduler NAME       learning-rate schedule from the --lr value (default cosine); the lr\n"
           "                         printed for an epoch is the one its steps ran at (warmup-cosine:\n"
           "                         the epoch's last step's). As torch.optim.lr_scheduler:\n"
           "                           constant       the same lr throughout\n"
           "                           step           StepLR: x0.1 every max(1, epochs/3) epochs\n"
           "                           cosine         CosineAnnealingLR(T_max=epochs, eta_min=0), per epoch:\n"
           "                                          epoch 1 at lr, epoch e at lr*(1+cos(pi*(e-1)/epochs))/2\n"
           "                           exponential    ExponentialLR: x0.9 every epoch\n"
           "                           warmup-cosine  per optimizer step: linear warm-up, step t (0-based)\n"
           "                                          at lr*(t+1)/W for t < W, then cosine to 0 at the end\n"
           "                                          of the run (W = --warmup)\n"
           "  --warmup N             warmup-cosine's warm-up in optimizer steps (default 10%% of the\n"
           "                         run's steps, rounded up; must be below them)\n"
           "  --label-smoothing X    cross-entropy label smoothing in [0, 1] (default 0)\n"
           "  --clip-grad-norm X     clip gradients by global norm X >= 0 (default 0: off)\n"
           "  --patience N           early stopping after N epochs without val improvement (default 0: off)\n"
           "  --seed N               seed for initialisation, shuffling and dropout, 0 to 2^63-1 (default 0)\n"
           "  --precision P          f32 (default), tf32 (f32 with TF32 tensor-core matmuls/convs on\n"
           "                         CUDA), bf16 or f16: autocast as torch.autocast (matmul/conv in\n"
           "                         16 bits, softmax/loss/norms in f32, f32 weights and optimizer\n"
           "                         state); f16 adds dynamic loss scaling. Recorded in the checkpoint\n"
           "                         (--resume keeps it unless given)\n"
           "  --device DEV           cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n"
           "  --devices LIST         data-parallel replicas in this process, one per device:\n"
           "                         cuda:0,cuda:1, cuda:all (every GPU), opencl:0,opencl:1, or a mix\n"
           "                         such as cpu,opencl:0; --batch-size is per replica (see below)\n"
           "  --workers N            data-loader threads, 0 to 256 (default 1)\n"
           "  --out DIR              output directory (default runs/fashion-mnist, or the first of\n"
           "                         runs/fashion-mnist-2, -3, ... that holds no run; with --resume,\n"
           "                         the checkpoint's folder). A DIR holding a run is refused: give\n"
           "                         --resume DIR/checkpoint.safetensors or --overwrite. Checked before\n"
           "                         training: it must be writable, or creatable\n"
           "  --overwrite            replace the run in --out DIR (its run files are removed first);\n"
           "                         without --out, the run in runs/fashion-mnist\n"
           "  --resume FILE          continue a run from its checkpoint (e.g. runs/fashion-mnist/checkpoint.safetensors),\n"
           "                         in place (metrics.csv goes on from the checkpoint's epoch): model,\n"
           "                         normalisation and augmentation come from the checkpoint (no\n"
           "                         model options needed; one that disagrees is an error), and so do\n"
           "                         the training settings not given (optimizer, lr, batch, scheduler,\n"
           "                         seed, ...); --epochs\n"
           "                         is the total and must be above the epochs already done\n"
           "  --init-from FILE       a new run (fresh optimizer and schedule, epoch 1) starting from the\n"
           "                         weights of FILE: a checkpoint (e.g. best.safetensors; its model and\n"
           "                         normalisation are used unless model options are given) or a\n"
           "                         weights-only SafeTensors file with the model's keys (\"1.weight\", ...)\n"
           "  --stop-after-epoch N   stop after epoch N as if interrupted (resume later with --resume)\n"
           "  --progress / --no-progress   progress bar on / off (default: on when stdout is a terminal;\n"
           "                         it fits the terminal width, or $COLUMNS, or 80); off prints the\n"
           "                         epoch lines only\n"
           /* [dist] */
           "  --distributed          data-parallel over MPI ranks (automatic under mpirun with > 1 rank)\n"
           "  --global-batch N       total batch over all ranks and replicas (per-replica batch =\n"
           "                         N / (ranks x devices); overrides --batch-size)\n\n"
           "Ctrl-C (SIGINT) or SIGTERM stops between two steps: the rest of the epoch is\n"
           "abandoned, the files of the last finished epoch are kept, the command that\n"
           "resumes is printed, and the exit status is 130 (143 for SIGTERM); a second\n"
           "Ctrl-C quits at once. (Under mpirun, signals are left to mpirun.)\n\n"
           "Distributed: mpirun -np N ember train ... runs N replicas; each reads 1/N of every\n"
           "epoch (the same number of steps on every rank) and gradients are averaged\n"
           "across ranks before each step, so the effective batch is batch-size x N (the\n"
           "learning rate is not scaled). Rank 0 prints and writes --out; metrics cover\n"
           "all ranks. EMBER_DIST_TIMEOUT (s, default 120) bounds every collective.\n"
           "One process, several GPUs: ember train --devices cuda:all does the same with\n"
           "one replica per GPU and no mpirun (NCCL between the GPUs when available):\n"
           "each step splits a batch of batch-size x devices samples over the replicas\n"
           "(the learning rate is not scaled). Replicas on the same kind of CPU device\n"
           "(cpu,cpu) share its workers: useful for testing, not faster. A checkpoint\n"
           "holds replica 0; it can be resumed with any number of devices (the global\n"
           "batch then changes with it).\n\n"
           "Models: the spec is stored in the checkpoint (metadata ember.model) with the\n"
           "input normalisation (ember.norm_mean, ember.norm_std), so that eval and\n"
           "predict need no model options. Specs (keys as the PyTorch nn.Sequential):\n"
           "  mlp:IN-H1-...-OUT[:dropout=P]   Flatten, Linear-ReLU(-Dropout)..., Linear\n"
           "  cnn:CxHxW-B1-B2-...[-fcF...]-K[:dropout=P]   images C x H x W; a block N or\n"
           "      NxR is R times [Conv2d(in, N, 3, padding=1, bias=False), BatchNorm2d(N),\n"
           "      ReLU] then MaxPool2d(2); then Flatten; fcF is Linear(in, F), ReLU,\n"
           "      Dropout(P); last Linear(in, K). --model cnn is\n"
           "      %s\n"
           "Inputs are normalised with the Fashion-MNIST mean %.4f and std %.4f.\n\n"
           "Numeric options take plain decimal values (no '1e3' for an integer) within the\n"
           "ranges above; a bad value, an unknown option or a missing value is a usage error.\n"
           EM_TOOL_EXIT_HELP,
           EM_FASHION_MNIST_DIR, EM_TOOL_CNN_DEFAULT, EM_FASHION_MNIST_MEAN, EM_FASHION_MNIST_STD);
}

/* After each epoch (em_learner_config.on_epoch): redraw the run's plots next
 * to its metrics.csv. A failure (or a build without cairo) is reported once
 * and does not stop training. */
typedef struct plot_hook {
    const char *out;
    bool reported;
} plot_hook;

static void plot_after_epoch(const em_epoch_metrics *m, void *ctx)
{
    (void)m;
    plot_hook *h = ctx;
    em_tool_plot_run_dir(h->out, &h->reported);
}

/* The largest --epochs, --patience and --stop-after-epoch. */
#define TRAIN_MAX_EPOCHS 1000000

int em_tool_train(int argc, char **argv)
{
    if (em_tool_train_wants_gpt(argc, argv)) return em_tool_train_gpt(argc, argv); /* tools/train_gpt.c */
    const char *data = default_data_dir(), *hidden = "256,128", *optname = "adam", *schedname = "cosine";
    const char *device = NULL, *out = NULL, *resume = NULL, *init_from = NULL; /* out: NULL = the default run folder (below) */
    bool overwrite = false;
    int64_t epochs = 10, batch = 64, patience = 0; /* epochs: 10 for the MLP, 15 for the CNN unless given */
    bool epochs_given = false;
    double lr = NAN, momentum = NAN, wd = 0, smoothing = 0, clip = 0, dropout = NAN;
    const char *model_name = "mlp";
    const char *precision_s = "f32";
    char ck_precision[16];
    bool hidden_given = false, model_given = false;
    const char *dropout_s = "";
    int augment = -1; /* -1: the model's default */
    int64_t limit = 0, warmup = -1; /* warmup < 0: the scheduler's default */
    uint64_t seed = 0;
    int workers = 1, progress = -1;
    /* the training settings a checkpoint records ('ember.train') and --resume reuses unless given */
    bool opt_given = false, lr_given = false, mom_given = false, wd_given = false, batch_given = false, sched_given = false,
         warmup_given = false, ls_given = false, clip_given = false, seed_given = false, limit_given = false,
         precision_given = false;
    char ck_optname[16], ck_schedname[32];
    enum { O_HIDDEN = 256, O_LR, O_MOM, O_WD, O_SCHED, O_LS, O_CLIP, O_PAT, O_WORKERS, O_RESUME, O_PROG, O_NOPROG, O_DROP, O_STOP, O_DIST, O_GBATCH, O_DEVICES, O_MODEL, O_AUG, O_NOAUG, O_LIMIT, O_WARMUP, O_OVERWRITE, O_INIT, O_PREC };
    static const struct option opts[] = {
        {"data", required_argument, 0, 'd'},         {"hidden", required_argument, 0, O_HIDDEN},
        {"epochs", required_argument, 0, 'e'},       {"batch-size", required_argument, 0, 'b'},
        {"optimizer", required_argument, 0, 'o'},    {"lr", required_argument, 0, O_LR},
        {"momentum", required_argument, 0, O_MOM},   {"weight-decay", required_argument, 0, O_WD},
        {"scheduler", required_argument, 0, O_SCHED}, {"label-smoothing", required_argument, 0, O_LS},
        {"clip-grad-norm", required_argument, 0, O_CLIP}, {"patience", required_argument, 0, O_PAT},
        {"seed", required_argument, 0, 's'},         {"device", required_argument, 0, 'D'},
        {"workers", required_argument, 0, O_WORKERS}, {"out", required_argument, 0, 'O'},
        {"resume", required_argument, 0, O_RESUME},  {"progress", no_argument, 0, O_PROG},
        {"no-progress", no_argument, 0, O_NOPROG},   {"dropout", required_argument, 0, O_DROP},
        {"stop-after-epoch", required_argument, 0, O_STOP},
        {"distributed", no_argument, 0, O_DIST},     {"global-batch", required_argument, 0, O_GBATCH}, /* [dist] */
        {"devices", required_argument, 0, O_DEVICES},
        {"model", required_argument, 0, O_MODEL},    {"augment", no_argument, 0, O_AUG},
        {"no-augment", no_argument, 0, O_NOAUG},     {"limit", required_argument, 0, O_LIMIT},
        {"warmup", required_argument, 0, O_WARMUP},  {"overwrite", no_argument, 0, O_OVERWRITE},
        {"init-from", required_argument, 0, O_INIT}, {"precision", required_argument, 0, O_PREC},
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};
    static const char shortopts[] = ":d:e:b:o:s:D:O:h"; /* leading colon: we report missing values */
    int64_t stop_after = 0;
    bool distributed = false; /* [dist] */
    const char *devices = NULL;
    int64_t global_batch = 0;
    int c;
    optind = 1;
    opterr = 0; /* our own messages (em_tool_bad_option) */
    const char *T = "train";
    int64_t v;
    /* every numeric value strictly (tools.h): a bad one is a usage error, exit 2 */
#define I64(flag, lo, hi, dst) do { if (em_tool_parse_i64(T, flag, optarg, lo, hi, &v)) return EM_TOOL_EXIT_USAGE; dst = v; } while (0)
#define F64(flag, lo, lo_open, hi, hi_open, dst) do { if (em_tool_parse_f64(T, flag, optarg, lo, lo_open, hi, hi_open, &dst)) return EM_TOOL_EXIT_USAGE; } while (0)
    while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case O_HIDDEN: hidden = optarg; hidden_given = true; break;
        case O_MODEL: model_name = optarg; model_given = true; break;
        case O_AUG: augment = 1; break;
        case O_NOAUG: augment = 0; break;
        case O_LIMIT: I64("--limit", 1, INT64_MAX, limit); limit_given = true; break;
        case 'e': I64("--epochs", 1, TRAIN_MAX_EPOCHS, epochs); epochs_given = true; break;
        case 'b': I64("--batch-size", 1, EM_TOOL_MAX_BATCH, batch); batch_given = true; break;
        case 'o': optname = optarg; opt_given = true; break;
        case O_LR: F64("--lr", 0, true, INFINITY, false, lr); lr_given = true; break;
        case O_MOM: F64("--momentum", 0, false, 1, false, momentum); mom_given = true; break;
        case O_WD: F64("--weight-decay", 0, false, INFINITY, false, wd); wd_given = true; break;
        case O_SCHED: schedname = optarg; sched_given = true; break;
        case O_WARMUP: I64("--warmup", 0, INT64_MAX, warmup); warmup_given = true; break;
        case O_LS: F64("--label-smoothing", 0, false, 1, false, smoothing); ls_given = true; break;
        case O_CLIP: F64("--clip-grad-norm", 0, false, INFINITY, false, clip); clip_given = true; break;
        case O_PAT: I64("--patience", 0, TRAIN_MAX_EPOCHS, patience); break;
        case 's': I64("--seed", 0, INT64_MAX, seed); seed_given = true; break;
        case 'D': device = optarg; break;
        case O_WORKERS: I64("--workers", 0, 256, workers); break;
        case 'O':
            if (!*optarg) {
                fprintf(stderr, "ember train: --out: the folder name is empty\n");
                return EM_TOOL_EXIT_USAGE;
            }
            out = optarg;
            break;
        case O_RESUME: resume = optarg; break;
        case O_OVERWRITE: overwrite = true; break;
        case O_INIT: init_from = optarg; break;
        case O_PREC: {
            em_precision pp;
            if (em_precision_parse(optarg, &pp) != EM_OK) {
                fprintf(stderr, "ember train: --precision: unknown precision '%s' (f32, tf32, bf16, f16)\n", optarg);
                return EM_TOOL_EXIT_USAGE;
            }
            precision_s = em_precision_name(pp);
            precision_given = true;
            break;
        }
        case O_PROG: progress = 1; break;
        case O_NOPROG: progress = 0; break;
        case O_DROP: F64("--dropout", 0, false, 1, true, dropout); dropout_s = optarg; break;
        case O_STOP: I64("--stop-after-epoch", 1, TRAIN_MAX_EPOCHS, stop_after); break;
        case O_DIST: distributed = true; break;                                          /* [dist] */
        case O_GBATCH: I64("--global-batch", 1, INT64_MAX, global_batch); break; /* [dist] */
        case O_DEVICES: devices = optarg; break;                                          /* [dist] */
        case 'h': train_help(); return 0;
        default: return em_tool_bad_option(T, c, argc, argv);
        }
    }
#undef I64
#undef F64
    if (em_tool_no_operands(T, argc, argv)) return EM_TOOL_EXIT_USAGE;
    if (resume && init_from) {
        fprintf(stderr, "ember train: give --resume (continue a run) or --init-from (a new run from its weights), not both\n");
        return EM_TOOL_EXIT_USAGE;
    }
    /* --resume / --init-from: the model (when no model option is given), its
     * input normalisation and, for --resume, the augmentation come from the
     * file's metadata */
    ckpt_meta cm = {.augment = -1};
    const char *from = resume ? resume : init_from, *from_flag = resume ? "--resume" : "--init-from";
    if (from && read_ckpt_meta(from_flag, from, &cm)) return EM_TOOL_EXIT_RUNTIME;
    const bool model_flags = model_given || hidden_given || !isnan(dropout);
    char given[320]; /* the model options given, as typed */
    snprintf(given, sizeof given, "%s%s%s%s%s%s", model_given ? " --model " : "", model_given ? model_name : "",
             hidden_given ? " --hidden " : "", hidden_given ? hidden : "", !isnan(dropout) ? " --dropout " : "",
             !isnan(dropout) ? dropout_s : "");
    if (resume && !cm.is_ckpt) {
        fprintf(stderr, "ember train: --resume %s: not a checkpoint written by ember train (no 'ember.format' metadata; "
                        "a weights-only file starts a new run with --init-from)\n", resume);
        return EM_TOOL_EXIT_USAGE;
    }
    if (resume && cm.weights_only) {
        fprintf(stderr, "ember train: --resume %s: the file holds the model's weights but no optimizer state (best.safetensors "
                        "is such a file): resume from the run's checkpoint.safetensors, or start a new run from these "
                        "weights with --init-from %s\n", resume, resume);
        return EM_TOOL_EXIT_USAGE;
    }
    if (cm.has_spec && !model_flags) model_name = cm.spec;
    /* --resume: every training setting the checkpoint records and the command
     * line does not give comes from the checkpoint, so the run goes on as it
     * started (an explicit option wins: a new --lr, say) */
    char from_ckpt[512] = "";
    if (resume && cm.train[0]) {
        char buf[sizeof cm.train], *save = NULL;
        snprintf(buf, sizeof buf, "%s", cm.train);
        for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0;
            const char *k = tok, *v = eq + 1;
            bool took = true;
            if (!strcmp(k, "optimizer") && !opt_given && strlen(v) < sizeof ck_optname)
                optname = strcpy(ck_optname, v);
            else if (!strcmp(k, "scheduler") && !sched_given && strlen(v) < sizeof ck_schedname)
                schedname = strcpy(ck_schedname, v);
            else if (!strcmp(k, "lr") && !lr_given) lr = strtod(v, NULL);
            else if (!strcmp(k, "momentum") && !mom_given) momentum = strtod(v, NULL);
            else if (!strcmp(k, "weight_decay") && !wd_given) wd = strtod(v, NULL);
            else if (!strcmp(k, "batch") && !batch_given) batch = strtoll(v, NULL, 10);
            else if (!strcmp(k, "warmup") && !warmup_given) warmup = strtoll(v, NULL, 10);
            else if (!strcmp(k, "label_smoothing") && !ls_given) smoothing = strtod(v, NULL);
            else if (!strcmp(k, "clip_grad_norm") && !clip_given) clip = strtod(v, NULL);
            else if (!strcmp(k, "seed") && !seed_given) seed = strtoull(v, NULL, 10);
            else if (!strcmp(k, "limit") && !limit_given) limit = strtoll(v, NULL, 10);
            else if (!strcmp(k, "precision") && !precision_given && strlen(v) < sizeof ck_precision)
                precision_s = strcpy(ck_precision, v);
            else took = false;
            if (took && !(!strcmp(v, "nan") || (!strcmp(k, "warmup") && !strcmp(v, "-1")) || (!strcmp(k, "limit") && !strcmp(v, "0")) ||
                          (!strcmp(k, "precision") && !strcmp(v, "f32"))))
            {
                char shown[64]; /* real numbers as %g (they are stored with 17 digits) */
                const bool real = !strcmp(k, "lr") || !strcmp(k, "momentum") || !strcmp(k, "weight_decay") ||
                                  !strcmp(k, "label_smoothing") || !strcmp(k, "clip_grad_norm");
                if (real) snprintf(shown, sizeof shown, "%g", strtod(v, NULL));
                else snprintf(shown, sizeof shown, "%s", v);
                snprintf(from_ckpt + strlen(from_ckpt), sizeof from_ckpt - strlen(from_ckpt), "%s%s %s",
                         from_ckpt[0] ? ", " : "", k, shown);
            }
        }
        em_precision pchk;
        if (batch < 1 || batch > EM_TOOL_MAX_BATCH || !(isnan(lr) || lr > 0) || em_precision_parse(precision_s, &pchk) != EM_OK) {
            fprintf(stderr, "ember train: --resume %s: bad training settings in 'ember.train' ('%s')\n", resume, cm.train);
            return EM_TOOL_EXIT_RUNTIME;
        }
    }
    if (resume && augment < 0) augment = cm.augment;
    const bool is_mlp = !strcmp(model_name, "mlp") || !strncmp(model_name, "mlp:", 4);
    const bool is_cnn = !strcmp(model_name, "cnn") || !strncmp(model_name, "cnn:", 4);
    if (!is_mlp && !is_cnn) {
        fprintf(stderr, "ember train: unknown --model '%s' (mlp, cnn, or a spec mlp:... / cnn:...; see --help)\n", model_name);
        return 2;
    }
    if (strchr(model_name, ':') && (hidden_given || !isnan(dropout))) {
        fprintf(stderr, "ember train: --hidden and --dropout do not apply to a full model spec (put them in the spec)\n");
        return 2;
    }
    if (is_cnn && hidden_given) {
        fprintf(stderr, "ember train: --hidden applies to --model mlp (for the cnn, give a spec: --model cnn:...; see --help)\n");
        return 2;
    }
    if (augment < 0) augment = is_cnn;
    if (!epochs_given && is_cnn) epochs = 15;
    if (resume && cm.epoch >= epochs) {
        fprintf(stderr, "ember train: --resume %s: the checkpoint has done %lld epoch%s and --epochs is %lld%s (the total, not "
                        "the epochs to add): nothing to train; give --epochs above %lld\n", resume, (long long)cm.epoch,
                cm.epoch == 1 ? "" : "s", (long long)epochs, epochs_given ? "" : " (the default)", (long long)cm.epoch);
        return EM_TOOL_EXIT_USAGE;
    }
    if (!isnan(momentum) && strcmp(optname, "sgd") && strcmp(optname, "rmsprop")) {
        fprintf(stderr, "ember train: --momentum applies to --optimizer sgd and rmsprop, not %s\n", optname);
        return EM_TOOL_EXIT_USAGE;
    }
    char spec[256];
    char err[512];
    if (strchr(model_name, ':')) {
        snprintf(spec, sizeof spec, "%s", model_name);
    } else if (is_cnn) {
        snprintf(spec, sizeof spec, "%s", EM_TOOL_CNN_DEFAULT);
        if (!isnan(dropout)) { /* replace the default's dropout */
            char *c = strstr(spec, ":dropout=");
            if (c) *c = 0;
            if (dropout > 0) snprintf(spec + strlen(spec), sizeof spec - strlen(spec), ":dropout=%g", dropout);
        }
    }
    if (is_cnn || strchr(model_name, ':')) { /* a spec error is a usage error: check it before starting anything */
        if (em_tool_check_spec(spec, err, sizeof err) != 0) {
            fprintf(stderr, "ember train: %s\n", err);
            return 2;
        }
    }
    if (isnan(dropout)) dropout = 0;
    int64_t hs[16];
    int nh = parse_list(hidden, hs, 14, 1, (long long)1 << 24);
    if (nh < 0) {
        fprintf(stderr, "ember train: --hidden: '%s' is not a list of layer sizes (expected at most 14 integers in [1, 16777216], "
                        "comma-separated, e.g. 256,128)\n", hidden);
        return 2;
    }
    if (em_tool_check_scheduler(schedname, warmup, err, sizeof err) != 0) {
        fprintf(stderr, "ember train: %s\n", err);
        return 2;
    }
    em_optim_kind kind;
    if (em_tool_parse_optim(optname, &kind) != 0) {
        fprintf(stderr, "ember train: unknown optimizer '%s' (adam, adamw, sgd, rmsprop, adagrad)\n", optname);
        return 2;
    }
    if (devices && device) {
        fprintf(stderr, "ember train: give --device or --devices, not both\n");
        return 2;
    }
    if (check_device("train", device)) return EM_TOOL_EXIT_USAGE;
    if (devices && !strcmp(precision_s, "f16") && strchr(devices, ',') != NULL) {
        fprintf(stderr, "ember train: --precision f16 with several --devices is not supported yet (its loss scaler is per "
                        "process); use --precision bf16, which needs none\n");
        return EM_TOOL_EXIT_USAGE;
    }
    /* the run folder (issue #20): an earlier run is never silently replaced. Without --out: the
     * checkpoint's folder with --resume, else runs/fashion-mnist or its first numbered sibling that
     * holds no run (--overwrite: runs/fashion-mnist itself). With --out DIR holding a run: refused
     * unless it is --resume's folder or --overwrite is given. Checked before anything starts. */
    /* [dist] under mpirun (or --distributed): MPI first, then the runtime */
    bool dist = distributed || em_dist_launched();
    /* the run folder (issue #20): em_tool_claim_run_dir; under MPI only rank 0
     * writes, so nothing is checked or locked here (see below) */
    em_tool_run_dir rd;
    const int rd_rc = em_tool_claim_run_dir(&rd, EM_TOOL_RUN_DIR, out, resume, overwrite, !dist);
    if (rd_rc) return rd_rc;
    out = rd.out;
    const bool out_given = rd.out_given, in_place = rd.in_place;
    const char *ckpt_dir = rd.ckpt_dir, *run_note = rd.note;
    if (dist) {
        em_config dc = em_config_default();
        if (device) dc.device = device;
        if (em_dist_init(NULL, NULL, &dc) != EM_OK) {
            fprintf(stderr, "ember train: %s\n", em_last_error());
            return 1;
        }
    } else if (init_runtime(device)) {
        return 1;
    }
    /* --resume into another folder: the new folder gets the run's history up to
     * the checkpoint (metrics.csv, trimmed to its epoch by the Learner, and
     * best.safetensors), so that it holds a whole run */
    if (resume && !in_place && !dist) {
        const char *carry[] = {"metrics.csv", "best.safetensors"};
        for (int i = 0; i < 2; i++) {
            char src[4200], dst[4200];
            snprintf(src, sizeof src, "%s/%s", ckpt_dir, carry[i]);
            snprintf(dst, sizeof dst, "%s/%s", out, carry[i]);
            if (copy_file(src, dst) < 0) return EM_TOOL_EXIT_RUNTIME;
        }
    }
    const int rank = em_dist_rank(), world = em_dist_world_size();
    bool lead = rank == 0, clean_exit = false; /* clean_exit: every rank failed alike, no abort needed */
    if (dist && lead && em_check_output_dir(out) != EM_OK) { /* [dist] rank 0 writes --out */
        fprintf(stderr, "ember train: --out: %s\n", em_last_error());
        em_dist_abort(EM_TOOL_EXIT_RUNTIME, "ember train: rank 0 cannot write --out: ending the job");
        em_dist_shutdown();
        return EM_TOOL_EXIT_RUNTIME;
    }
    em_device devs[64]; /* [dist] replicas in this process */
    int ndev = 1;
    /* [dist] --devices: replica 0's device becomes the process's device */
    if (devices && (em_devices_parse(devices, devs, 64, &ndev) != EM_OK || em_set_device(devs[0]) != EM_OK)) {
        fprintf(stderr, "ember train: --devices %s: %s\n", devices, em_last_error());
        if (dist) em_dist_shutdown();
        else em_shutdown();
        return 2;
    }
    if (global_batch > 0) {
        if (global_batch % ((int64_t)world * ndev) != 0) {
            fprintf(stderr, "ember train: --global-batch %lld is not a multiple of %d ranks x %d devices\n", (long long)global_batch,
                    world, ndev);
            if (dist) em_dist_shutdown();
            else em_shutdown();
            return 2;
        }
        batch = global_batch / world / ndev;
        if (batch > EM_TOOL_MAX_BATCH) {
            fprintf(stderr, "ember train: --global-batch %lld is %lld per replica, above the largest batch %lld\n", (long long)global_batch,
                    (long long)batch, (long long)EM_TOOL_MAX_BATCH);
            if (dist) em_dist_shutdown();
            else em_shutdown();
            return 2;
        }
    }
    int rc = 1;
    em_dataset *tr = NULL, *te = NULL, *tr_full = NULL, *te_full = NULL;
    em_loader *ltr = NULL, *lte = NULL;
    em_module *model = NULL, *rmodels[64] = {0};
    em_optim *opt = NULL, *ropts[64] = {0};
    em_replicas *rep = NULL;
    em_lr_scheduler *sched = NULL;
    em_manual_seed(seed);
    tr = em_mnist_open(data, true);
    te = tr ? em_mnist_open(data, false) : NULL;
    if (!tr || !te) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    if (limit > 0) { /* --limit: the first N samples of each split */
        tr_full = tr;
        te_full = te;
        tr = em_dataset_subset(tr_full, 0, limit < em_dataset_length(tr_full) ? limit : em_dataset_length(tr_full));
        te = tr ? em_dataset_subset(te_full, 0, limit < em_dataset_length(te_full) ? limit : em_dataset_length(te_full)) : NULL;
        if (!tr || !te) {
            fprintf(stderr, "ember train: --limit: %s\n", em_last_error());
            goto done;
        }
    }
    if (!strchr(model_name, ':') && is_mlp) {
        int k = snprintf(spec, sizeof spec, "mlp:%lld", (long long)em_dataset_num_features(tr));
        for (int i = 0; i < nh; i++) k += snprintf(spec + k, sizeof spec - (size_t)k, "-%lld", (long long)hs[i]);
        k += snprintf(spec + k, sizeof spec - (size_t)k, "-%lld", (long long)(tr->num_classes > 0 ? tr->num_classes : 10));
        if (dropout > 0) snprintf(spec + k, sizeof spec - (size_t)k, ":dropout=%g", dropout);
    }
    if (resume && cm.has_spec && strcmp(spec, cm.spec) != 0) { /* model options given with --resume that disagree */
        fprintf(stderr, "ember train: --resume %s holds model %s, but the options (%s) give %s: --resume takes the model "
                        "from the checkpoint, leave out --model/--hidden/--dropout\n", resume, cm.spec, given + 1, spec);
        rc = 2;
        clean_exit = true; /* [dist] every rank sees the same options */
        goto done;
    }
    if (em_tool_check_input(spec, tr, err, sizeof err) != 0) {
        fprintf(stderr, "ember train: %s\n", err);
        rc = 2;
        clean_exit = true; /* [dist] every rank sees the same data */
        goto done;
    }
    model = em_tool_build_model(spec, err, sizeof err);
    if (!model) {
        fprintf(stderr, "ember train: %s\n", err);
        goto done;
    }
    if (init_from && load_weights(init_from, cm.is_ckpt, model) != EM_OK) { /* a new run from these weights */
        em_status st = em_last_status();
        fprintf(stderr, "ember train: --init-from: %s%s\n", em_last_error(),
                st == EM_ERR_FORMAT || st == EM_ERR_SHAPE || st == EM_ERR_DTYPE
                    ? (model_flags ? " (the file holds another model than the options give)"
                                   : " (the file holds another model: give the --model / --hidden it was trained with)")
                    : "");
        goto done;
    }
    em_optim_config oc = em_optim_config_default(kind);
    if (!isnan(lr)) oc.lr = lr;
    else if (kind == EM_OPTIM_SGD) oc.lr = 0.05;
    if (!isnan(momentum)) oc.momentum = momentum;
    else if (kind == EM_OPTIM_SGD) oc.momentum = 0.9;
    if (wd > 0) oc.weight_decay = wd;
    opt = em_optim_new_for_module(&oc, model);
    if (!opt) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    if (devices) { /* [dist] replicas 1.. are copies of replica 0 (em_replicas_new copies the parameters) */
        uint64_t rs, ro;
        em_rng_get_state(&rs, &ro); /* building them must not move the random stream (dropout) */
        rmodels[0] = model;
        ropts[0] = opt;
        for (int i = 1; i < ndev; i++) {
            rmodels[i] = em_tool_build_model(spec, err, sizeof err);
            ropts[i] = rmodels[i] ? em_optim_new_for_module(&oc, rmodels[i]) : NULL;
            if (!ropts[i]) {
                fprintf(stderr, "ember train: replica %d: %s\n", i, rmodels[i] ? em_last_error() : err);
                goto done;
            }
        }
        em_rng_set_state(rs, ro);
        rep = em_replicas_new(rmodels, ropts, devs, ndev);
        if (!rep) {
            fprintf(stderr, "ember train: --devices %s: %s\n", devices, em_last_error());
            clean_exit = true; /* [dist] fails alike on every rank: no abort needed */
            goto done;
        }
    }
    if (dist) { /* [dist] same model and settings everywhere, then identical replicas */
        char hp[1024];
        snprintf(hp, sizeof hp,
                 "model=%s optimizer=%s lr=%g momentum=%g weight_decay=%g batch=%lld epochs=%lld scheduler=%s "
                 "label_smoothing=%g clip=%g seed=%llu patience=%lld stop_after=%lld train_samples=%lld resume=%s augment=%d "
                 "precision=%s",
                 spec, optname, oc.lr, oc.momentum, oc.weight_decay, (long long)batch, (long long)epochs, schedname,
                 smoothing, clip, (unsigned long long)seed, (long long)patience, (long long)stop_after,
                 (long long)em_dataset_length(tr), resume ? "yes" : "no", augment, precision_s);
        if (em_dist_check_config(model, hp) != EM_OK) {
            fprintf(stderr, "ember train: rank %d: %s\n", rank, em_last_error());
            clean_exit = true;
            goto done;
        }
        if (em_dist_broadcast_params(model) != EM_OK) {
            fprintf(stderr, "ember train: rank %d: %s\n", rank, em_last_error());
            goto done;
        }
    }
    em_loader_options lo = em_loader_options_default();
    lo.batch_size = batch * ndev; /* [dist] split over the replicas */
    lo.shuffle = true;
    lo.seed = seed;
    lo.num_workers = workers;
    /* normalisation (and, with --augment, random crop and flip) on the loader threads */
    /* (--resume / --init-from: the file's normalisation, one value per channel) */
    tool_norm nm = {.n = 1, .mean = {EM_FASHION_MNIST_MEAN}, .std = {EM_FASHION_MNIST_STD}};
    const int64_t channels = tr->feature_ndim == 3 ? tr->feature_shape[0] : 1;
    if (cm.has_norm) {
        nm = cm.norm;
        if (nm.n != channels) {
            fprintf(stderr, "ember train: %s %s: its normalisation has %d values, the data has %lld channels\n", from_flag, from, nm.n,
                    (long long)channels);
            rc = 2;
            clean_exit = true; /* [dist] the same everywhere */
            goto done;
        }
    }
    const float *norm_mean = nm.mean, *norm_std = nm.std;
    lo.transform.mean = norm_mean;
    lo.transform.std = norm_std;
    if (augment) {
        lo.transform.crop_padding = 2;
        lo.transform.hflip_p = 0.5;
    }
    lo.rank = rank; /* [dist] each rank reads its shard; shard_even: equal step counts */
    lo.world_size = world;
    lo.shard_even = world > 1;
    ltr = em_loader_new(tr, &lo);
    lo.shard_even = false; /* [dist] test set: every sample once over all ranks */
    lo.shuffle = false;
    lo.batch_size = batch * ndev > 1000 ? batch * ndev : 1000;
    lo.transform = em_image_transform_eval(lo.transform); /* no random transforms on the test set */
    lte = em_loader_new(te, &lo);
    if (!ltr || !lte) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    bool sched_per_step = false; /* steps per epoch are known now (per rank, per replica group) */
    sched = em_tool_make_scheduler(schedname, oc.lr, epochs, em_loader_num_batches(ltr), warmup, &sched_per_step, err, sizeof err);
    if (!sched) {
        fprintf(stderr, "ember train: %s\n", err);
        rc = 2;
        clean_exit = true; /* [dist] same steps on every rank */
        goto done;
    }
    char dev[32];
    if (lead) printf("ember train: model %s (%lld parameters), %s lr %g, batch %lld, %lld epoch%s, device %s, %d CPU workers\n", spec,
           (long long)em_module_num_params(model), em_optim_kind_name(kind), oc.lr, (long long)batch, (long long)epochs,
           epochs == 1 ? "" : "s",
           em_device_str(em_get_device(), dev, sizeof dev), em_worker_count(EM_DEVICE_CPU));
    em_precision prec = EM_PRECISION_F32;
    em_precision_parse(precision_s, &prec); /* checked above */
    if (lead && prec == EM_PRECISION_TF32)
        printf("precision: tf32 (float32 matmuls and convolutions on CUDA may use TF32 tensor cores)\n");
    else if (lead && prec != EM_PRECISION_F32)
        printf("precision: %s autocast (matmul/conv in %s, the rest f32, f32 weights)%s\n", precision_s, precision_s,
               prec == EM_PRECISION_F16 ? ", loss scaling" : "");
    if (lead) printf("data: %s (%lld train, %lld test samples), normalised with mean %.4f std %.4f%s\n", data,
                     (long long)em_dataset_length(tr), (long long)em_dataset_length(te), norm_mean[0], norm_std[0],
                     augment ? "; training images randomly cropped (padding 2) and flipped" : "");
    if (lead && !out_given) printf("run folder: %s%s\n", out, run_note);
    if (lead && init_from) printf("weights from %s (a new run: fresh optimizer, epoch 1)\n", init_from);
    if (lead && from_ckpt[0]) printf("settings from the checkpoint: %s\n", from_ckpt);
    if (lead && rep) { /* [dist] */
        printf("replicas: %d in this process on", ndev);
        for (int i = 0; i < ndev; i++) printf("%s%s", i ? "," : " ", em_device_str(devs[i], dev, sizeof dev));
        printf(", batch %lld per replica = %lld per step, gradients averaged by %s\n", (long long)batch, (long long)(batch * ndev),
               em_replicas_path(rep));
    }
    if (lead && dist) /* [dist] */
        printf("distributed: %d ranks, batch %lld per rank = global batch %lld, %lld steps per epoch\n", world, (long long)batch,
               (long long)(batch * world), (long long)em_loader_num_batches(ltr));
    em_learner_config cfg = em_learner_config_default();
    cfg.epochs = epochs;
    cfg.out_dir = out;
    cfg.resume = resume;
    cfg.progress = progress;
    cfg.early_stopping_patience = patience;
    cfg.stop_after_epoch = stop_after;
    cfg.clip_grad_norm = clip;
    cfg.loss.label_smoothing = smoothing;
    cfg.sched_per_step = sched_per_step;
    cfg.precision = prec;
    plot_hook ph = {.out = out};
    cfg.on_epoch = plot_after_epoch; /* loss.png / accuracy.png (+ .svg) next to metrics.csv */
    cfg.on_epoch_ctx = &ph;
    cfg.replicas = rep; /* [dist] */
    cfg.stop_flag = dist ? NULL : &g_stop; /* Ctrl-C: install_stop_handlers; [dist] mpirun handles signals */
    char mean_s[64 * 18], std_s[64 * 18];
    for (int i = 0, km = 0, ks = 0; i < nm.n; i++) {
        km += snprintf(mean_s + km, sizeof mean_s - (size_t)km, "%s%.9g", i ? "," : "", (double)norm_mean[i]);
        ks += snprintf(std_s + ks, sizeof std_s - (size_t)ks, "%s%.9g", i ? "," : "", (double)norm_std[i]);
    }
    char train_s[512]; /* the settings --resume reuses; lr and momentum as given ("nan": the optimizer's default) */
    snprintf(train_s, sizeof train_s,
             "optimizer=%s lr=%.17g momentum=%.17g weight_decay=%.17g batch=%lld scheduler=%s warmup=%lld "
             "label_smoothing=%.17g clip_grad_norm=%.17g seed=%llu limit=%lld precision=%s",
             optname, lr, momentum, wd, (long long)batch, schedname, (long long)warmup, smoothing, clip,
             (unsigned long long)seed, (long long)limit, precision_s);
    em_st_kv meta[6] = {{.key = "ember.train", .value = train_s},
                        {.key = "ember.model", .value = spec},
                        {.key = "ember.data", .value = data},
                        {.key = "ember.norm_mean", .value = mean_s}, /* per channel, comma-separated */
                        {.key = "ember.norm_std", .value = std_s},
                        {.key = "ember.augment", .value = augment ? "crop2,hflip" : "none"}};
    cfg.meta = meta;
    cfg.n_meta = sizeof meta / sizeof meta[0];
    em_epoch_metrics hist[1024];
    int nhist = 0;
    if (lead && overwrite) { /* --overwrite: the old run's files go, so no stale row or best model survives */
        int removed = em_run_dir_clear(out);
        if (removed < 0) {
            fprintf(stderr, "ember train: --overwrite: %s\n", em_last_error());
            goto done;
        }
        if (removed > 0) printf("--overwrite: removed %d file%s of the earlier run in %s\n", removed, removed == 1 ? "" : "s", out);
    }
    if (!dist) install_stop_handlers();
    em_status fit = em_learner_fit(model, opt, sched, ltr, lte, &cfg, hist, 1024, &nhist);
    if (!dist) restore_stop_handlers();
    if (fit == EM_ERR_INTERRUPTED) { /* Ctrl-C: the files of the last finished epoch are kept */
        rc = 128 + (g_stop ? (int)g_stop : SIGINT); /* 130 for SIGINT, 143 for SIGTERM */
        if (lead) {
            em_tool_report_interrupt(out, resume, argc, argv, shortopts, opts, O_RESUME, O_OVERWRITE);
        }
        goto done;
    }
    if (fit != EM_OK) {
        if (dist) fprintf(stderr, "ember train: rank %d: %s\n", rank, em_last_error()); /* [dist] */
        else fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    if (nhist > 0 && lead) {
        const em_epoch_metrics *m = &hist[nhist - 1];
        double tsum = 0;
        for (int i = 0; i < nhist; i++) tsum += hist[i].epoch_time_s;
        const size_t ol = strlen(out);
        printf("final test accuracy %.4f (loss %.4f) after %lld epoch%s; mean epoch time %.2fs; checkpoints in %.*s/\n",
               m->val_accuracy, m->val_loss, (long long)m->epoch, m->epoch == 1 ? "" : "s", tsum / nhist,
               (int)(ol > 1 && out[ol - 1] == '/' ? ol - 1 : ol), out);
    }
    rc = 0;
done:
    em_replicas_free(rep); /* [dist] */
    for (int i = 1; i < 64; i++) {
        em_optim_free(ropts[i]);
        em_module_free(rmodels[i]);
    }
    em_lr_scheduler_free(sched);
    em_optim_free(opt);
    em_module_free(model);
    em_loader_free(ltr);
    em_loader_free(lte);
    em_dataset_free(tr);
    em_dataset_free(te);
    em_dataset_free(tr_full);
    em_dataset_free(te_full);
    if (dist) { /* [dist] a rank failing alone ends the whole job at once */
        if (rc != 0 && !clean_exit) em_dist_abort(rc, "ember train failed on this rank: ending the job");
        em_dist_shutdown();
    } else {
        em_shutdown();
    }
    return rc;
}


/* Opens a checkpoint, builds its model from the 'ember.model' metadata and
 * loads it; @p norm gets its input normalisation ('ember.norm_mean' /
 * 'ember.norm_std'; checkpoints written before these existed were all
 * trained with the Fashion-MNIST constants). */
static em_module *load_model(const char *ckpt, tool_norm *norm)
{
    em_st_file *f = em_safetensors_open(ckpt);
    if (!f) {
        fprintf(stderr, "ember: %s\n", em_last_error());
        return NULL;
    }
    const char *spec = em_safetensors_metadata(f, "ember.model");
    char err[512];
    em_module *m = spec ? em_tool_build_model(spec, err, sizeof err) : NULL;
    if (!spec) fprintf(stderr, "ember: %s: no 'ember.model' metadata: not a checkpoint written by ember train\n", ckpt);
    else if (!m) fprintf(stderr, "ember: %s: %s\n", ckpt, err);
    const char *ms = em_safetensors_metadata(f, "ember.norm_mean"), *ss = em_safetensors_metadata(f, "ember.norm_std");
    if (m && (ms || ss)) {
        int a = parse_floats(ms, norm->mean, 64), b = parse_floats(ss, norm->std, 64);
        bool ok = a >= 1 && a == b;
        for (int i = 0; ok && i < a; i++) ok = norm->std[i] != 0.0f && norm->std[i] == norm->std[i];
        if (!ok) {
            fprintf(stderr, "ember: %s: bad normalisation metadata (ember.norm_mean '%s', ember.norm_std '%s')\n", ckpt, ms ? ms : "",
                    ss ? ss : "");
            em_module_free(m);
            m = NULL;
        }
        norm->n = a;
    } else {
        norm->n = 1;
        norm->mean[0] = EM_FASHION_MNIST_MEAN;
        norm->std[0] = EM_FASHION_MNIST_STD;
    }
    em_safetensors_close(f);
    if (!m) return NULL;
    if (em_checkpoint_load(ckpt, m, NULL, NULL, NULL) != EM_OK) {
        fprintf(stderr, "ember: %s\n", em_last_error());
        em_module_free(m);
        return NULL;
    }
    return m;
}

int em_tool_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *data = default_data_dir(), *device = NULL;
    int64_t batch = 1000, limit = 0;
    static const struct option opts[] = {{"checkpoint", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'},
                                         {"batch-size", required_argument, 0, 'b'}, {"device", required_argument, 0, 'D'},
                                         {"limit", required_argument, 0, 'l'},      {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:d:b:D:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'b': if (em_tool_parse_i64("eval", "--batch-size", optarg, 1, EM_TOOL_MAX_BATCH, &batch)) return EM_TOOL_EXIT_USAGE; break;
        case 'D': device = optarg; break;
        case 'l': if (em_tool_parse_i64("eval", "--limit", optarg, 1, INT64_MAX, &limit)) return EM_TOOL_EXIT_USAGE; break;
        case 'h':
            printf("usage: ember eval --checkpoint FILE [--data DIR] [--batch-size N] [--limit N] [--device DEV]\n\n"
                   "Evaluates a checkpoint written by 'ember train' on the test split: loss,\n"
                   "accuracy, top-5 accuracy and the confusion matrix (rows: true class).\n"
                   "The model and its input normalisation come from the checkpoint's metadata.\n"
                   "--limit N evaluates the first N test images only.\n\n"
                   "  --checkpoint FILE   a checkpoint of 'ember train' (checkpoint.safetensors or best.safetensors)\n"
                   "  --data DIR          MNIST-layout folder (default $EMBER_DATA_DIR or %s)\n"
                   "  --batch-size N      evaluation batch, 1 to %lld (default 1000)\n"
                   "  --limit N           the first N test images, N >= 1 (default all)\n"
                   "  --device DEV        cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n\n" EM_TOOL_EXIT_HELP,
                   EM_FASHION_MNIST_DIR, (long long)EM_TOOL_MAX_BATCH);
            return 0;
        default: return em_tool_bad_option("eval", c, argc, argv);
        }
    }
    if (em_tool_no_operands("eval", argc, argv)) return EM_TOOL_EXIT_USAGE;
    if (!ckpt) {
        fprintf(stderr, "ember eval: --checkpoint FILE is required (see 'ember eval --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    if (check_device("eval", device)) return EM_TOOL_EXIT_USAGE;
    if (init_runtime(device)) return 1;
    int rc = 1;
    tool_norm norm;
    em_module *m = load_model(ckpt, &norm);
    em_dataset *te = m ? em_mnist_open(data, false) : NULL, *te_full = NULL;
    em_loader *l = NULL;
    if (m && !te) fprintf(stderr, "ember eval: %s\n", em_last_error());
    if (te && limit > 0) {
        te_full = te;
        te = em_dataset_subset(te_full, 0, limit < em_dataset_length(te_full) ? limit : em_dataset_length(te_full));
        if (!te) fprintf(stderr, "ember eval: --limit: %s\n", em_last_error());
    }
    if (te) {
        em_loader_options lo = em_loader_options_default();
        lo.batch_size = batch;
        lo.transform.mean = norm.mean; /* the training run's normalisation, no random transforms */
        lo.transform.std = norm.std;
        if (norm.n != (te->feature_ndim == 3 ? te->feature_shape[0] : 1)) {
            lo.transform.mean = lo.transform.std = NULL; /* one value for every channel */
            lo.mean = norm.mean[0];
            lo.std = norm.std[0];
        }
        l = em_loader_new(te, &lo);
    }
    int64_t C = te && te->num_classes > 0 ? te->num_classes : 10;
    int64_t *conf = calloc((size_t)(C * C), sizeof *conf);
    em_eval_result r;
    if (l && conf && em_evaluate(m, l, C, &r, conf) == EM_OK) {
        printf("checkpoint %s on %s (%lld samples)\n", ckpt, data, (long long)r.samples);
        printf("test loss %.4f  accuracy %.4f  top-5 accuracy %.4f\n", r.loss, r.accuracy, r.top5);
        printf("confusion matrix (rows: true class, columns: predicted)\n      ");
        for (int64_t j = 0; j < C; j++) printf("%6lld", (long long)j);
        printf("\n");
        for (int64_t i = 0; i < C; i++) {
            printf("%4lld  ", (long long)i);
            for (int64_t j = 0; j < C; j++) printf("%6lld", (long long)conf[i * C + j]);
            if (C == 10) printf("  %s", FMNIST_CLASSES[i]);
            printf("\n");
        }
        /* a sample with non-finite outputs has no predicted class: wrong for top-1 and top-5, not in the matrix */
        int64_t in_matrix = 0;
        for (int64_t i = 0; i < C * C; i++) in_matrix += conf[i];
        if (in_matrix < r.samples) {
            printf("%lld of %lld samples have non-finite outputs (NaN or inf): counted as wrong, not in the matrix\n",
                   (long long)(r.samples - in_matrix), (long long)r.samples);
            fflush(stdout);
            fprintf(stderr, "ember eval: the model's outputs are not finite (NaN or inf) for %lld of %lld samples: the checkpoint "
                            "has diverged\n", (long long)(r.samples - in_matrix), (long long)r.samples);
        }
        rc = 0;
    } else if (te) {
        fprintf(stderr, "ember eval: %s\n", em_last_error());
    }
    free(conf);
    em_loader_free(l);
    em_dataset_free(te);
    em_dataset_free(te_full);
    em_module_free(m);
    em_shutdown();
    return rc;
}

int em_tool_predict(int argc, char **argv)
{
    const char *ckpt = NULL, *data = default_data_dir(), *device = NULL, *idxs = "0,1,2,3,4", *tops = "3";
    int64_t topk = 3;
    static const struct option opts[] = {{"checkpoint", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'},
                                         {"index", required_argument, 0, 'i'},      {"top", required_argument, 0, 't'},
                                         {"device", required_argument, 0, 'D'},     {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:d:i:t:D:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 'i': idxs = optarg; break;
        case 't': tops = optarg; break; /* checked against the class count once the data is open */
        case 'D': device = optarg; break;
        case 'h':
            printf("usage: ember predict --checkpoint FILE [--index 0,1,2] [--top K] [--data DIR] [--device DEV]\n\n"
                   "Prints the predicted classes with probabilities for the chosen test images.\n"
                   "The model and its input normalisation come from the checkpoint's metadata.\n\n"
                   "  --checkpoint FILE   a checkpoint of 'ember train' (checkpoint.safetensors or best.safetensors)\n"
                   "  --index LIST        test image numbers, comma-separated, at most 256 (default 0,1,2,3,4)\n"
                   "  --top K             the K most probable classes, 1 to the model's class count (default 3)\n"
                   "  --data DIR          MNIST-layout folder (default $EMBER_DATA_DIR or %s)\n"
                   "  --device DEV        cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n\n" EM_TOOL_EXIT_HELP,
                   EM_FASHION_MNIST_DIR);
            return 0;
        default: return em_tool_bad_option("predict", c, argc, argv);
        }
    }
    if (em_tool_no_operands("predict", argc, argv)) return EM_TOOL_EXIT_USAGE;
    int64_t index[256];
    int n = parse_list(idxs, index, 256, 0, INT64_MAX);
    if (!ckpt) {
        fprintf(stderr, "ember predict: --checkpoint FILE is required (see 'ember predict --help')\n");
        return EM_TOOL_EXIT_USAGE;
    }
    if (n <= 0) {
        fprintf(stderr, "ember predict: --index: '%s' is not a list of image numbers (expected at most 256 integers >= 0, "
                        "comma-separated, e.g. 0,1,2)\n", idxs);
        return EM_TOOL_EXIT_USAGE;
    }
    if (check_device("predict", device)) return EM_TOOL_EXIT_USAGE;
    if (init_runtime(device)) return 1;
    int rc = 1;
    tool_norm norm;
    em_module *m = load_model(ckpt, &norm);
    em_dataset *te = m ? em_mnist_open(data, false) : NULL;
    if (m && !te) fprintf(stderr, "ember predict: %s\n", em_last_error());
    /* usage errors that need the data: --top in [1, the class count], every --index an image of the split */
    const int64_t ncls = te && te->num_classes > 0 ? te->num_classes : 10;
    bool bad_usage = te && em_tool_parse_i64("predict", "--top", tops, 1, ncls, &topk) != 0;
    for (int i = 0; te && !bad_usage && i < n; i++)
        if (index[i] >= em_dataset_length(te)) {
            const long long len = (long long)em_dataset_length(te);
            if (len > 0)
                fprintf(stderr, "ember predict: --index %lld is out of range: the test split has %lld image%s (0 to %lld)\n",
                        (long long)index[i], len, len == 1 ? "" : "s", len - 1);
            else fprintf(stderr, "ember predict: --index %lld is out of range: the test split has no images\n", (long long)index[i]);
            bad_usage = true;
        }
    if (bad_usage) {
        em_dataset_free(te);
        te = NULL;
        rc = EM_TOOL_EXIT_USAGE;
    }
    if (te) {
        em_module_train(m, false);
        em_no_grad_begin();
        int64_t F = em_dataset_num_features(te), C = te->num_classes > 0 ? te->num_classes : 10;
        float *x = malloc(sizeof(float) * (size_t)F);
        double *p = malloc(sizeof(double) * (size_t)C);
        bool *taken = malloc(sizeof(bool) * (size_t)C);
        int64_t nonfinite = 0; /* images whose probabilities are not all finite */
        rc = 0;
        if (!x || !p || !taken) {
            fprintf(stderr, "ember predict: out of memory\n");
            rc = 1;
        }
        for (int i = 0; i < n && x && p && taken; i++) {
            int64_t y;
            if (em_dataset_get(te, index[i], x, &y) != EM_OK) {
                fprintf(stderr, "ember predict: image %lld: %s\n", (long long)index[i], em_last_error());
                rc = 1;
                continue;
            }
            /* the training run's normalisation: per channel when it has one value per channel */
            const int64_t nch = norm.n > 1 && te->feature_ndim == 3 && te->feature_shape[0] == norm.n ? norm.n : 1;
            for (int64_t j = 0; j < F; j++) {
                const int64_t c = nch > 1 ? j / (F / nch) : 0;
                x[j] = (x[j] - norm.mean[c]) / norm.std[c];
            }
            em_scope_begin();
            int64_t shape[EM_MAX_DIMS] = {1}; /* [1, sample shape...]: [1, 1, 28, 28] for MNIST images */
            for (int d = 0; d < te->feature_ndim; d++) shape[d + 1] = te->feature_shape[d];
            em_tensor *probs = em_softmax(em_module_forward(m, em_from_host(x, shape, te->feature_ndim + 1, EM_F32)), 1);
            em_tensor *pd = em_cast(probs, EM_F64);
            if (!pd || em_to_host(pd, p, sizeof(double) * (size_t)C) != EM_OK) {
                fprintf(stderr, "ember predict: %s\n", em_last_error());
                rc = 1;
            } else {
                printf("image %lld (true: %s):", (long long)index[i], C == 10 && y >= 0 && y < C ? FMNIST_CLASSES[y] : "?");
                bool finite = true;
                for (int64_t j = 0; j < C; j++) {
                    taken[j] = false;
                    finite = finite && isfinite(p[j]);
                }
                nonfinite += !finite;
                /* the top K, NaN ranked last (so a partly NaN row still shows its finite classes first) */
                for (int64_t t = 0; t < topk && t < C; t++) {
                    int64_t best = -1;
                    for (int64_t j = 0; j < C; j++)
                        if (!taken[j] && (best < 0 || p[j] > p[best] || (isnan(p[best]) && !isnan(p[j])))) best = j;
                    if (best < 0) break;
                    taken[best] = true;
                    char v[32]; /* "nan", not glibc's "-nan" for a NaN with its sign bit set */
                    if (isnan(p[best])) snprintf(v, sizeof v, "nan");
                    else snprintf(v, sizeof v, "%.3f", p[best]);
                    if (C == 10) printf("  %s %s", FMNIST_CLASSES[best], v);
                    else printf("  class %lld %s", (long long)best, v);
                }
                printf("\n");
            }
            em_scope_end();
        }
        if (nonfinite > 0) {
            fflush(stdout);
            fprintf(stderr, "ember predict: the model's outputs are not finite (NaN or inf): the checkpoint has diverged\n");
            rc = 1;
        }
        free(x);
        free(p);
        free(taken);
        em_no_grad_end();
    }
    em_dataset_free(te);
    em_module_free(m);
    em_shutdown();
    return rc;
}
