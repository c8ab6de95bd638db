/* libFuzzer target for the SafeTensors reader (store/safetensors.c).
 * Build: clang -fsanitize=fuzzer,address -Iinclude -I. tests/fuzz/fuzz_safetensors.c <libember or its sources>
 * The input is parsed from memory; on success every tensor's bytes and every
 * metadata string are read, so ASan sees any pointer or size the reader got wrong. */
#include "ember/store.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    em_st_file *f = em_safetensors_open_memory(data, size, "fuzz");
    if (!f) return 0;
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < em_safetensors_count(f); i++) {
        const em_st_tensor *t = em_safetensors_at(f, i);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) acc ^= p[k];
        if (em_safetensors_find(f, t->name) != t) __builtin_trap();
        if (t->nbytes != (size_t)t->numel * t->elem_size) __builtin_trap();
    }
    for (size_t i = 0; i < em_safetensors_metadata_count(f); i++) {
        const em_st_kv *kv = em_safetensors_metadata_at(f, i);
        acc ^= (uint8_t)(strlen(kv->key) + strlen(kv->value));
    }
    (void)acc;
    em_safetensors_close(f);
    return 0;
}
