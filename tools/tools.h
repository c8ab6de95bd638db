/* Shared pieces of the `ember` program. */
#ifndef EMBER_TOOLS_H
#define EMBER_TOOLS_H

#include "ember/ember.h"
#include "ember/train.h"

#include <stddef.h>

int em_tool_train(int argc, char **argv);
int em_tool_eval(int argc, char **argv);
int em_tool_predict(int argc, char **argv);

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
/** Scheduler by name for @p epochs epochs (stepped once per epoch). */
em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs);

#endif
