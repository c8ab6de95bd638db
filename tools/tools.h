/* Shared pieces of the `ember` program. */
#ifndef EMBER_TOOLS_H
#define EMBER_TOOLS_H

#include "ember/ember.h"
#include "ember/train.h"

#include <stdbool.h>
#include <stddef.h>

int em_tool_train(int argc, char **argv);
/** `ember train --model gpt` (tools/train_gpt.c): a GPT-2 language model on a text file. */
int em_tool_train_gpt(int argc, char **argv);
/** Whether `ember train ARGS` is a GPT run: --model gpt, or --resume of a
 *  checkpoint whose 'ember.model' is a GPT's ("gpt:..."). Reads that file's
 *  header only; a file it cannot read is not a GPT run (the classifier's
 *  path then reports the error). */
bool em_tool_train_wants_gpt(int argc, char **argv);
int em_tool_eval(int argc, char **argv);
int em_tool_predict(int argc, char **argv);
/** `ember generate` (tools/generate.c): text from a GPT checkpoint with a KV cache. */
int em_tool_generate(int argc, char **argv);
/** `ember serve` (tools/serve_cmd.c, serve/): the KServe v2 inference server. */
int em_tool_serve(int argc, char **argv);
/** `ember run` (tools/onnx_cmd.c): runs an ONNX model on .npy inputs. */
int em_tool_run(int argc, char **argv);
/** `ember convert IN OUT.safetensors` (tools/convert_cmd.c): PyTorch checkpoints to SafeTensors. */
int em_tool_convert(int argc, char **argv);

/** Default run folder of `ember train` (numbered -2, -3, ... when it holds a run). */
#define EM_TOOL_RUN_DIR "runs/fashion-mnist"

/** The CNN of `ember train --model cnn` (Fashion-MNIST). */
#define EM_TOOL_CNN_DEFAULT "cnn:1x28x28-32x2-64x2-fc128-10:dropout=0.25"

/** Builds a model from a spec; the result is an nn.Sequential whose keys are
 *  those of the PyTorch model written next to each form.
 *  - "mlp:784-256-128-10[:dropout=0.2]": Flatten, then Linear/ReLU(/Dropout)
 *    layers (keys "1.weight", ...).
 *  - "cnn:CxHxW-B1-B2-...[-fcF...]-K[:dropout=P]", e.g.
 *    "cnn:1x28x28-32x2-64x2-fc128-10:dropout=0.25": input images C x H x W
 *    ([N, C, H, W]); each conv block "N" or "NxR" is R (default 1) times
 *    [Conv2d(in, N, 3, padding=1, bias=False), BatchNorm2d(N), ReLU()]
 *    followed by MaxPool2d(2); then Flatten(); each "fcF" is Linear(in, F),
 *    ReLU() and Dropout(P) (when P > 0); last Linear(in, K). */
em_module *em_tool_build_model(const char *spec, char *err, size_t nerr);
/** Checks a spec's grammar without building it (no runtime needed): 0, or -1
 *  with the reason in err. */
int em_tool_check_spec(const char *spec, char *err, size_t nerr);
/** Checks that samples of @p ds fit the model's input: 0, or -1 and err. */
int em_tool_check_input(const char *spec, const em_dataset *ds, char *err, size_t nerr);
int em_tool_parse_optim(const char *name, em_optim_kind *out);
/** The schedulers of `ember train --scheduler NAME` for a run of @p epochs
 *  epochs of @p steps_per_epoch optimizer steps, from base lr @p lr:
 *  - constant: lr.
 *  - step: StepLR(step_size = max(1, epochs / 3), gamma = 0.1), per epoch.
 *  - cosine: CosineAnnealingLR(T_max = epochs, eta_min = 0), per epoch:
 *    epoch e (0-based) runs at lr (1 + cos(pi e / epochs)) / 2.
 *  - exponential: ExponentialLR(gamma = 0.9), per epoch.
 *  - warmup-cosine: em_lr_warmup_cosine over epochs x steps_per_epoch steps,
 *    stepped per optimizer step (*per_step = true), @p warmup warm-up steps
 *    (< 0: em_tool_default_warmup), eta_min 0.
 *  Returns NULL with the reason in @p err for an unknown name, @p warmup >= 0
 *  with another scheduler, or warmup >= the total steps. Caller owns the result. */
em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs, int64_t steps_per_epoch, int64_t warmup,
                                        bool *per_step, char *err, size_t nerr);
/** Checks a --scheduler name and whether --warmup (@p warmup >= 0) applies to
 *  it, without building anything: 0, or -1 with the reason in err. */
int em_tool_check_scheduler(const char *name, int64_t warmup, char *err, size_t nerr);
/** Default warm-up of warmup-cosine: min(ceil(0.1 x total_steps), total_steps - 1)
 *  (transformers' warmup_ratio 0.1; 0 for a one-step run). */
int64_t em_tool_default_warmup(int64_t total_steps);

/* ---- plots of metrics.csv (tools/plot.c) --------------------------------------
 * In the program rather than in libember, so that the library does not
 * depend on a drawing library: cairo is linked into `ember` when the build
 * finds it (pkg-config cairo), and without it plotting reports that it is
 * unavailable. */

/** The columns of one metrics.csv that the plots use (one entry per epoch row;
 *  NAN where the file has "nan", e.g. no validation set). */
typedef struct em_tool_metrics {
    int n;
    double *epoch, *train_loss, *train_accuracy, *val_loss, *val_accuracy;
    bool iterations; /**< an iteration-mode file: epoch[] holds the iterations (>= 0), the accuracies are NaN */
} em_tool_metrics;

/** Reads an `ember train` metrics.csv (train/learner.c append_metrics: a
 *  header naming at least epoch, train_loss, train_accuracy, val_loss,
 *  val_accuracy, in any order, then one row per epoch). Every row must have
 *  the header's field count, numbers in those columns ("nan" allowed) and
 *  strictly increasing whole epochs >= 1; at least one row. A header with
 *  no epoch column but an iter one is the Learner's iteration mode (`ember
 *  train --model gpt`: iter, train_loss, val_loss, ...): whole iterations
 *  >= 0, accuracies NaN, `iterations` set. 0, or -1 with the
 *  file, line and reason in @p err (@p out is then empty). Free with
 *  em_tool_metrics_free. */
int em_tool_read_metrics(const char *path, em_tool_metrics *out, char *err, size_t nerr);
void em_tool_metrics_free(em_tool_metrics *m);

enum {
    EM_TOOL_PLOT_MAX_RUNS = 10,     /**< one colour per run (matplotlib's tab10) */
    EM_TOOL_PLOT_BAD_METRICS = 1,   /**< a metrics.csv is unreadable or malformed: nothing written */
    EM_TOOL_PLOT_WRITE = 2,         /**< an image could not be written */
    EM_TOOL_PLOT_UNAVAILABLE = 3,   /**< built without cairo: nothing written */
};

/** Draws @p nruns (1..EM_TOOL_PLOT_MAX_RUNS) metrics.csv files as two figures,
 *  loss and accuracy against the epoch, train and validation curves of every
 *  run (one run: train and validation in two colours; several: one colour per
 *  run, train dashed, validation solid), with axes, ticks, labels, a legend and
 *  a title (@p title, or the run names: @p labels[i], or the folder of
 *  metrics_csv[i] when labels or labels[i] is NULL). Writes
 *  <out_prefix>loss.png, <out_prefix>loss.svg, <out_prefix>accuracy.png and
 *  <out_prefix>accuracy.svg (800 x 500 px; out_prefix "runs/a/" puts them in
 *  runs/a), each atomically (a .tmp file renamed over it). In the SVG each
 *  curve is one <path class="curve">. All files are read before anything is
 *  written, so a bad one writes nothing. Returns 0 or an EM_TOOL_PLOT_* code
 *  with the reason in @p err. */
/** After an epoch or an evaluation of `ember train`: redraws OUT/loss.png
 *  (and the others) from OUT/metrics.csv. A failure (or a build without
 *  cairo) is printed once, when *reported is false, and sets it; training
 *  goes on. */
void em_tool_plot_run_dir(const char *out, bool *reported);
int em_tool_plot_metrics(const char *const *metrics_csv, const char *const *labels, int nruns, const char *out_prefix,
                         const char *title, char *err, size_t nerr);
/** Whether this build can plot (cairo found at build time). */
bool em_tool_plot_available(void);
/** The figure's size and its plot area in pixels (x grows right, y down): the
 *  axes span left..right and top..bottom. */
void em_tool_plot_geometry(int *width, int *height, int *left, int *top, int *right, int *bottom);
/** `ember plot`. */
int em_tool_plot(int argc, char **argv);

/* ---- Command-line values, parsed strictly (the `ember` exit codes) ----
 * Every numeric flag is parsed whole (no trailing characters, no leading
 * blanks, no "1e3" for an integer), must be finite and within its range. On
 * a bad value the helpers print one line to stderr naming the command, the
 * flag, the value and the accepted range, e.g.
 *   ember train: --lr: 'abc' is not a number (expected a finite number > 0)
 *   ember train: --batch-size: 0 is out of range (expected an integer in [1, 1048576])
 * and return -1 without touching *out; the caller exits with
 * EM_TOOL_EXIT_USAGE. @p cmd is the subcommand ("train"), @p flag the option
 * as typed in the help ("--lr"). */
#define EM_TOOL_EXIT_RUNTIME 1 /**< runtime error: files, data, device, training */
#define EM_TOOL_EXIT_USAGE 2   /**< usage error: unknown option, missing or bad value */
/** The exit-status paragraph of every --help. */
#define EM_TOOL_EXIT_HELP                                                                                              \
    "Exit status: 0 success; 1 runtime error (unreadable or unwritable files, bad data,\n"                              \
    "device or training failure); 2 usage error (unknown option, missing or bad value,\n"                               \
    "conflicting options).\n"
/** Largest --batch-size (samples per replica and step): a batch of Fashion-MNIST
 *  images at this size is 3.3 GB, under the 4 GiB per-tensor limit. */
#define EM_TOOL_MAX_BATCH ((int64_t)1 << 20)

/** Integer in [lo, hi] (hi == INT64_MAX: no upper bound) into *out: 0, or -1
 *  after printing why. */
int em_tool_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
/** Finite number in the interval from lo to hi, each end open (excluded) or
 *  closed (included); hi == INFINITY: no upper bound. 0, or -1 after printing why. */
int em_tool_parse_f64(const char *cmd, const char *flag, const char *s, double lo, bool lo_open, double hi, bool hi_open,
                      double *out);
/** After getopt_long returned '?' (unknown option) or ':' (missing value; the
 *  option string must start with ':' and opterr be 0): prints the message
 *  naming the option and returns EM_TOOL_EXIT_USAGE. */
int em_tool_bad_option(const char *cmd, int c, int argc, char **argv);
/** 0 when getopt_long left no operands; else prints the first and returns
 *  EM_TOOL_EXIT_USAGE (no subcommand takes operands). */
int em_tool_no_operands(const char *cmd, int argc, char **argv);

/* ---- shared by the two training commands (tools/train_cmds.c) ---- */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
/** The flag the Ctrl-C handlers set (em_learner_config.stop_flag). */
volatile sig_atomic_t *em_tool_stop_flag(void);
/** SIGINT / SIGTERM: the first asks the Learner to stop between steps, a second quits. */
void em_tool_install_stop_handlers(void);
void em_tool_restore_stop_handlers(void);
/** A bad --device: prints why, returns EM_TOOL_EXIT_USAGE; 0 when fine or NULL. */
int em_tool_check_device(const char *cmd, const char *device);
/** em_init on @p device (NULL: the default): 0, or 1 after printing why. */
int em_tool_init_runtime(const char *device);
/** Copies a file atomically: 0, 1 when @p src is missing, -1 after printing why. */
int em_tool_copy_file(const char *src, const char *dst);
/** After a run interrupted by Ctrl-C (em_learner_fit returned EM_ERR_INTERRUPTED):
 *  prints the error and the command that resumes from OUT/checkpoint.safetensors
 *  (or from @p resume when the run wrote none), or that nothing can be resumed. */
void em_tool_report_interrupt(const char *out, const char *resume, int argc, char **argv, const char *shortopts,
                              const struct option *opts, int o_resume, int o_overwrite);
/** The run folder `ember train` writes (issue #20), chosen and claimed by
 *  em_tool_claim_run_dir. */
typedef struct em_tool_run_dir {
    const char *out;     /**< the folder (out as given, or in buf) */
    bool out_given;      /**< --out was given */
    bool in_place;       /**< --resume continues in its own folder */
    int lock;            /**< the lock held until exit, -1 when not locked */
    char buf[4096];      /**< the default folder chosen */
    char ckpt_dir[4096]; /**< --resume's folder ("" without --resume) */
    char note[4200];     /**< why that folder (" (the folder of --resume)", ...), or "" */
} em_tool_run_dir;
/** Chooses the run folder: @p out, else --resume's folder, else @p base or its
 *  first numbered sibling holding no run (--overwrite: @p base itself);
 *  refuses --overwrite of the folder --resume continues from and a folder
 *  that holds another run (unless --overwrite). With @p lock (not under MPI,
 *  where only rank 0 writes) it also checks that the folder is writable and
 *  claims it with em_run_dir_lock, moving a default folder in use to the next
 *  number. 0, or an exit status after printing why. */
int em_tool_claim_run_dir(em_tool_run_dir *rd, const char *base, const char *out, const char *resume, bool overwrite, bool lock);
/** Records a run folder this process created: removed at exit when the run wrote nothing into it. */
void em_tool_note_made_run_dir(const char *dir);

#endif
