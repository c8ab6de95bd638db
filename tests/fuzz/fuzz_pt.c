/* libFuzzer target for the PyTorch checkpoint reader (store/pt.c): the zip
 * reader, the pickle subset, the stride checks and the gather.
 * Build: scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
 * The input is parsed from memory; on success every tensor's bytes are read,
 * so ASan sees any pointer or size the reader got wrong. The seeds worth
 * starting from are tests/fixtures/pt_*.pt (fuzz.sh copies them in). */
#include "ember/store.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    em_pt_file *f = em_pt_open_memory(data, size, "fuzz");
    if (!f) return 0;
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < em_pt_count(f); i++) {
        const em_pt_entry *e = em_pt_at(f, i);
        const uint8_t *p = e->data;
        for (size_t k = 0; k < e->nbytes; k++) acc ^= p[k];
        if (em_pt_find(f, e->name) != e) __builtin_trap();
        if (e->nbytes != (size_t)e->numel * em_dtype_size(e->dtype)) __builtin_trap();
        acc ^= (uint8_t)strlen(e->storage_key);
    }
    (void)acc;
    em_pt_close(f);
    return 0;
}
