/* Ember: a deep-learning framework in C on the StarPU task runtime.
 * Include this header to get the whole public API. */
#ifndef EMBER_H
#define EMBER_H
#include "ember/core.h"
#include "ember/tensor.h"
#include "ember/autograd.h"
#include "ember/nn.h"
#include "ember/optim.h"
#include "ember/data.h"
#include "ember/text.h"
#include "ember/store.h"
#include "ember/onnx.h"
#include "ember/train.h"
#include "ember/amp.h"
#include "ember/dist.h"
#endif
