/* libFuzzer target for the inference server's request decoder (serve/protocol.c).
 * Build: clang -fsanitize=fuzzer,address,undefined -std=gnu11 -I. -Iinclude tests/fuzz/fuzz_serve_request.c serve/protocol.c -ljansson
 * The first 4 input bytes choose the Inference-Header-Content-Length (-1,
 * or a value within the rest of the input, or one past it); the rest is the
 * body. On success every byte of every tensor is read, the tensors are
 * converted, and a response is encoded from them (half of them binary) and
 * checked: valid JSON, one output per input, the size accounting; a message must be one non-empty line. */
#include "serve/protocol.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    uint32_t sel;
    memcpy(&sel, data, 4);
    const char *body = (const char *)data + 4;
    size_t len = size - 4;
    int64_t header_len = (sel & 1) ? -1 : (int64_t)((sel >> 1) % (len + 2)); /* len + 1: one past the body, an error */
    ems_limits lim = ems_limits_default();
    lim.max_elements = 1 << 16; /* keep the allocations small */
    ems_request r;
    char err[256];
    if (ems_request_decode(body, len, header_len, &lim, &r, err, sizeof err)) {
        size_t n = strlen(err);
        if (n == 0 || memchr(err, '\n', n)) __builtin_trap();
        if (r.inputs || r.outputs || r.ninputs) __builtin_trap();
        return 0;
    }
    volatile uint8_t acc = 0;
    ems_response_output *outs = calloc((size_t)r.ninputs, sizeof *outs);
    if (!outs) __builtin_trap();
    size_t bin = 0;
    for (int i = 0; i < r.ninputs; i++) {
        const ems_tensor *t = &r.inputs[i];
        if (t->nbytes != (size_t)t->numel * ems_dtype_size(t->dtype)) __builtin_trap();
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) acc ^= p[k];
        float *f = malloc((size_t)t->numel * sizeof(float) + 1);
        int64_t *q = malloc((size_t)t->numel * sizeof(int64_t) + 1);
        if (!f || !q) __builtin_trap();
        if (ems_tensor_to_f32(t, f)) __builtin_trap();
        (void)ems_tensor_to_i64(t, q);
        free(f);
        free(q);
        outs[i].tensor = t;
        outs[i].binary = (i + (int)(sel >> 8)) & 1;
        if (outs[i].binary) bin += t->nbytes;
    }
    for (int i = 0; i < r.noutputs; i++) acc ^= (uint8_t)strlen(r.outputs[i].name);
    size_t rlen;
    int64_t rhl;
    char *resp = ems_response_encode("fuzz", "1", r.has_id ? r.id : NULL, outs, r.ninputs, &rlen, &rhl);
    if (!resp) __builtin_trap();
    if (bin > 0 || rhl >= 0) {
        if (rhl < 0 || (size_t)rhl + bin != rlen) __builtin_trap();
    }
    /* the header is valid JSON with one output per input */
    json_t *j = json_loadb(resp, rhl < 0 ? rlen : (size_t)rhl, 0, NULL);
    if (!j || json_array_size(json_object_get(j, "outputs")) != (size_t)r.ninputs) __builtin_trap();
    json_decref(j);
    free(resp);
    free(outs);
    (void)acc;
    ems_request_free(&r);
    return 0;
}
