/* Shared pieces of the `ember` program. */
#ifndef EMBER_TOOLS_H
#define EMBER_TOOLS_H

#include "ember/ember.h"
#include "ember/train.h"

#include <stddef.h>

int em_tool_train(int argc, char **argv);
int em_tool_eval(int argc, char **argv);
int em_tool_predict(int argc, char **argv);

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
/** Scheduler by name for @p epochs epochs (stepped once per epoch). */
em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs);

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

#endif
