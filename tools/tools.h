/* Shared pieces of the `ember` program. */
#ifndef EMBER_TOOLS_H
#define EMBER_TOOLS_H

#include "ember/ember.h"
#include "ember/train.h"

#include <stddef.h>

int em_tool_train(int argc, char **argv);
int em_tool_eval(int argc, char **argv);
int em_tool_predict(int argc, char **argv);

/** Builds a model from a spec such as "mlp:784-256-128-10[:dropout=0.2]":
 *  Flatten, then Linear/ReLU(/Dropout) layers (PyTorch keys "1.weight", ...). */
em_module *em_tool_build_model(const char *spec, char *err, size_t nerr);
int em_tool_parse_optim(const char *name, em_optim_kind *out);
/** Scheduler by name for @p epochs epochs (stepped once per epoch). */
em_lr_scheduler *em_tool_make_scheduler(const char *name, double lr, int64_t epochs);

#endif
