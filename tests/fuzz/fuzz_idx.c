/* libFuzzer target for the IDX reader (data/idx.c), plain and gzip.
 * Build: clang -fsanitize=fuzzer,address -Iinclude -I. tests/fuzz/fuzz_idx.c <libember or its sources>
 * em_idx_read reads files (zlib's gzopen), so each input is written to one
 * temporary file (created once per process, removed at exit) and read back,
 * once accepting any magic and once as MNIST images. */
#define _GNU_SOURCE
#include "ember/data.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[64];

static void cleanup(void) { unlink(g_path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_path[0]) {
        snprintf(g_path, sizeof g_path, "/tmp/ember_fuzz_idx_XXXXXX");
        int fd = mkstemp(g_path);
        if (fd < 0) abort();
        close(fd);
        atexit(cleanup);
    }
    FILE *f = fopen(g_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);

    em_idx idx;
    if (em_idx_read(g_path, 0, &idx) == EM_OK) {
        int64_t numel = 1;
        for (int i = 0; i < idx.ndim; i++) numel *= idx.dims[i];
        if (numel != idx.numel || idx.nbytes != (size_t)numel * idx.elem_size) __builtin_trap();
        volatile uint8_t acc = 0;
        for (size_t k = 0; k < idx.nbytes; k++) acc ^= ((const uint8_t *)idx.data)[k];
        (void)acc;
        em_idx_free(&idx);
    }
    if (em_idx_read(g_path, EM_IDX_MAGIC_IMAGES, &idx) == EM_OK) em_idx_free(&idx);
    return 0;
}
