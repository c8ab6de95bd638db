/* ONNX operators, vision group (see store/onnx_internal.h). */
#include "store/onnx_internal.h"

const onnx_op onnx_ops_vision[] = {
    {NULL, 0, NULL},
};
