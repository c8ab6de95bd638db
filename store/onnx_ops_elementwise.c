/* ONNX operators, elementwise group (see store/onnx_internal.h). */
#include "store/onnx_internal.h"

const onnx_op onnx_ops_elementwise[] = {
    {NULL, 0, NULL},
};
