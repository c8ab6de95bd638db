/* libFuzzer target for the PyTorch checkpoint reader (store/pt.c): the zip
 * reader, the pickle subset, the stride checks and the gather.
 * Build: scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined, -lz).
 * Each input is read twice from memory: as a whole file (the zip layer; the
 * seeds are tests/fixtures/pt_*.pt), and as data.pkl inside a valid archive
 * built here with storage records "0" and "1" of 64 bytes (so mutations of
 * the pickle get past the zip CRCs to the pickle machine). On success every
 * tensor's bytes are read, so ASan sees any pointer or size the reader got
 * wrong. */
#include "ember/store.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(em_pt_file *f)
{
    if (!f) return;
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
}

static uint8_t *le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

/* A STORED zip of data.pkl = the input and two 64-byte storages. */
static em_pt_file *open_wrapped(const uint8_t *pkl, size_t n)
{
    static const char *names[3] = {"archive/data.pkl", "archive/data/0", "archive/data/1"};
    static uint8_t storage[64];
    for (int i = 0; i < 64; i++) storage[i] = (uint8_t)(i * 37 + 1);
    const uint8_t *d[3] = {pkl, storage, storage};
    size_t len[3] = {n, 64, 64}, total = 22;
    for (int i = 0; i < 3; i++) total += 30 + 46 + 2 * strlen(names[i]) + len[i];
    uint8_t *z = malloc(total), *p = z, *cd = NULL;
    if (!z) return NULL;
    uint32_t off[3], crc[3];
    for (int i = 0; i < 3; i++) {
        size_t nl = strlen(names[i]);
        off[i] = (uint32_t)(p - z);
        crc[i] = (uint32_t)crc32(crc32(0L, Z_NULL, 0), d[i], (uInt)len[i]);
        p = le(p, 0x04034b50, 4), p = le(p, 20, 2), p = le(p, 0, 2), p = le(p, 0, 2), p = le(p, 0, 4);
        p = le(p, crc[i], 4), p = le(p, len[i], 4), p = le(p, len[i], 4), p = le(p, nl, 2), p = le(p, 0, 2);
        memcpy(p, names[i], nl), p += nl;
        if (len[i]) memcpy(p, d[i], len[i]);
        p += len[i];
    }
    cd = p;
    for (int i = 0; i < 3; i++) {
        size_t nl = strlen(names[i]);
        p = le(p, 0x02014b50, 4), p = le(p, 20, 2), p = le(p, 20, 2), p = le(p, 0, 2), p = le(p, 0, 2), p = le(p, 0, 4);
        p = le(p, crc[i], 4), p = le(p, len[i], 4), p = le(p, len[i], 4), p = le(p, nl, 2), p = le(p, 0, 4);
        p = le(p, 0, 4), p = le(p, 0, 4), p = le(p, off[i], 4);
        memcpy(p, names[i], nl), p += nl;
    }
    uint64_t cdsize = (uint64_t)(p - cd), cdoff = (uint64_t)(cd - z);
    p = le(p, 0x06054b50, 4), p = le(p, 0, 4), p = le(p, 3, 2), p = le(p, 3, 2), p = le(p, cdsize, 4);
    p = le(p, cdoff, 4), p = le(p, 0, 2);
    em_pt_file *f = em_pt_open_memory(z, (size_t)(p - z), "fuzz-wrapped");
    free(z);
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(em_pt_open_memory(data, size, "fuzz"));
    check(open_wrapped(data, size));
    return 0;
}
