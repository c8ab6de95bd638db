/* Text dataset: token ids, a train/val split by fraction, random windows
 * (gpt_char.py's batch()). */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/text.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct em_text_dataset {
    int32_t *ids;
    int64_t n, n_train, vocab;
};

void em_text_dataset_free(em_text_dataset *ds)
{
    if (!ds) return;
    free(ds->ids);
    free(ds);
}

static em_text_dataset *make(size_t n, double frac, const char *who)
{
    if (!(frac >= 0.0 && frac <= 1.0)) {
        em__set_error(EM_ERR_INVALID, "%s: train fraction %g outside [0, 1]", who, frac);
        return NULL;
    }
    em_text_dataset *ds = calloc(1, sizeof *ds);
    if (ds) ds->ids = malloc((n ? n : 1) * sizeof *ds->ids);
    if (!ds || !ds->ids) {
        em_text_dataset_free(ds);
        em__set_error(EM_ERR_NOMEM, "%s: out of memory for %zu ids", who, n);
        return NULL;
    }
    ds->n = (int64_t)n;
    ds->n_train = (int64_t)(frac * (double)n); /* Python's int(0.9 * len(data)) */
    if (ds->n_train > ds->n) ds->n_train = ds->n;
    return ds;
}

em_text_dataset *em_text_dataset_from_ids(const int64_t *ids, size_t n, double train_fraction)
{
    if (!ids && n) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_from_ids: ids is NULL");
        return NULL;
    }
    em_text_dataset *ds = make(n, train_fraction, "em_text_dataset_from_ids");
    if (!ds) return NULL;
    int64_t mx = -1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > INT32_MAX) {
            em__set_error(EM_ERR_INVALID, "em_text_dataset_from_ids: id %lld at position %zu outside [0, 2^31)",
                          (long long)ids[i], i);
            em_text_dataset_free(ds);
            return NULL;
        }
        ds->ids[i] = (int32_t)ids[i];
        if (ids[i] > mx) mx = ids[i];
    }
    ds->vocab = mx + 1;
    return ds;
}

em_text_dataset *em_text_dataset_from_memory(const void *bytes, size_t n, const em_tokenizer *tok,
                                             double train_fraction)
{
    if (!tok || (!bytes && n)) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_from_memory: NULL tokenizer or bytes");
        return NULL;
    }
    int64_t vocab = em_tokenizer_vocab_size(tok);
    if (vocab > (int64_t)INT32_MAX + 1) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_from_memory: vocabulary of %lld ids does not fit int32",
                      (long long)vocab);
        return NULL;
    }
    int64_t *ids = NULL;
    size_t k = 0;
    if (em_tokenizer_encode(tok, bytes, n, &ids, &k) != EM_OK) return NULL;
    em_text_dataset *ds = em_text_dataset_from_ids(ids, k, train_fraction);
    free(ids);
    if (ds) ds->vocab = vocab;
    return ds;
}

em_text_dataset *em_text_dataset_from_file(const char *path, const em_tokenizer *tok, double train_fraction)
{
    if (!path) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_from_file: path is NULL");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        em__set_error(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            em__set_error(EM_ERR_NOMEM, "%s: out of memory after %zu bytes", path, n);
            return NULL;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    if (ferror(f)) {
        fclose(f);
        free(buf);
        em__set_error(EM_ERR_IO, "%s: read error after %zu bytes", path, n);
        return NULL;
    }
    fclose(f);
    em_text_dataset *ds = em_text_dataset_from_memory(buf, n, tok, train_fraction);
    free(buf);
    return ds;
}

static bool range_of(const em_text_dataset *ds, em_text_split split, int64_t *start, int64_t *len)
{
    switch (split) {
    case EM_TEXT_TRAIN: *start = 0; *len = ds->n_train; return true;
    case EM_TEXT_VAL: *start = ds->n_train; *len = ds->n - ds->n_train; return true;
    case EM_TEXT_ALL: *start = 0; *len = ds->n; return true;
    }
    return false;
}

int64_t em_text_dataset_length(const em_text_dataset *ds, em_text_split split)
{
    int64_t s, l;
    if (!ds) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_length: dataset is NULL");
        return -1;
    }
    if (!range_of(ds, split, &s, &l)) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_length: unknown split %d", (int)split);
        return -1;
    }
    return l;
}

const int32_t *em_text_dataset_ids(const em_text_dataset *ds)
{
    if (!ds) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_ids: dataset is NULL");
        return NULL;
    }
    return ds->ids;
}

int64_t em_text_dataset_vocab_size(const em_text_dataset *ds)
{
    if (!ds) {
        em__set_error(EM_ERR_INVALID, "em_text_dataset_vocab_size: dataset is NULL");
        return -1;
    }
    return ds->vocab;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [0, m), m >= 1: draws below 2^64 mod m are rejected */
static uint64_t uniform(uint64_t *s, uint64_t m)
{
    uint64_t reject = (0 - m) % m;
    for (;;) {
        uint64_t r = splitmix64(s);
        if (r >= reject) return r % m;
    }
}

em_status em_text_batch(const em_text_dataset *ds, em_text_split split, int64_t batch, int64_t block,
                        uint64_t *rng, int64_t *x, int64_t *y)
{
    if (!ds || !rng || !x || !y) return em__set_error(EM_ERR_INVALID, "em_text_batch: NULL dataset, rng, x or y");
    if (batch < 1 || block < 1)
        return em__set_error(EM_ERR_INVALID, "em_text_batch: batch %lld and block %lld must be >= 1",
                             (long long)batch, (long long)block);
    int64_t start, len;
    if (!range_of(ds, split, &start, &len))
        return em__set_error(EM_ERR_INVALID, "em_text_batch: unknown split %d", (int)split);
    if (len < block + 2)
        return em__set_error(EM_ERR_INVALID,
                             "em_text_batch: the split has %lld ids, a window of block %lld needs at least %lld",
                             (long long)len, (long long)block, (long long)(block + 2));
    const int32_t *src = ds->ids + start;
    for (int64_t b = 0; b < batch; b++) {
        int64_t off = (int64_t)uniform(rng, (uint64_t)(len - block - 1));
        for (int64_t t = 0; t < block; t++) {
            x[b * block + t] = src[off + t];
            y[b * block + t] = src[off + t + 1];
        }
    }
    return EM_OK;
}
