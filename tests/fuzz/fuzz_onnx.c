/* libFuzzer target for the ONNX reader (store/onnx_load.c: the nesting
 * check, protobuf-c's unpacking, tensors, the graph check) and, for small
 * models whose inputs all have small static shapes, one run of the graph on
 * zero inputs (the operators' attribute and shape checks).
 * Build: scripts/fuzz.sh. Seeds: the node tests' small model.onnx files
 * when BUILD/onnx-node-tests exists. Starts the runtime once (CPU only). */
#include "ember/ember.h"
#include "ember/onnx.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("EMBER_NCPU", "1", 0);
    setenv("EMBER_NCUDA", "0", 0);
    setenv("EMBER_NOPENCL", "0", 0);
    if (em_init(NULL) != EM_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *err = NULL;
    em_onnx_model *m = em_onnx_load_memory(data, size, NULL, "fuzz.onnx", &err);
    if (!m) {
        if (!err || !*err) __builtin_trap(); /* every refusal says why */
        return 0;
    }
    int nin = em_onnx_num_inputs(m);
    em_tensor *in[8] = {0}, *out[8] = {0};
    bool run = nin <= 8 && em_onnx_num_outputs(m) <= 8;
    for (int i = 0; i < nin && run; i++) {
        int64_t shape[EM_MAX_DIMS];
        int r = em_onnx_input_shape(m, i, shape);
        int64_t n = 1;
        if (r < 0 || r > EM_MAX_DIMS) run = false;
        for (int d = 0; run && d < r; d++) {
            if (shape[d] < 0 || shape[d] > 64) run = false;
            else n *= shape[d];
        }
        if (run && n > 4096) run = false;
        if (run && !(in[i] = em_zeros(shape, r, em_onnx_input_dtype(m, i)))) run = false;
    }
    if (run) {
        em_no_grad_begin();
        if (em_onnx_run(m, in, nin, out, em_onnx_num_outputs(m)) != EM_OK && !*em_last_error()) __builtin_trap();
        em_no_grad_end();
    }
    for (int i = 0; i < 8; i++) {
        em_tensor_release(in[i]);
        em_tensor_release(out[i]);
    }
    em_onnx_free(m);
    return 0;
}
