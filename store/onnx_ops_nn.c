/* ONNX operators, nn group (see store/onnx_internal.h). */
#include "store/onnx_internal.h"

const onnx_op onnx_ops_nn[] = {
    {NULL, 0, NULL},
};
