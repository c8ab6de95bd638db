/* Tokenizers: bytes and GPT-2's byte-level BPE (vocab.json + merges.txt).
 *
 * GPT-2's scheme, as its encoder is described: every byte is shown as one
 * code point (bytes_to_unicode), the text is cut into pieces by the
 * pre-tokenization pattern, each piece starts as its bytes and adjacent
 * pairs are merged, lowest merge rank first, every occurrence of the chosen
 * pair left to right, until no pair of the piece is a merge. Here tokens are
 * kept as their raw bytes (the code-point alphabet is only the file format),
 * pairs as id pairs. */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/text.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/unicode_classes.h"

#define MAX_ID (1 << 24) /* ids of vocab.json must be below this (bounds the id table) */

struct em_tokenizer {
    bool bpe;
    int64_t n_ids;      /* max id + 1 */
    char *arena;        /* token bytes, back to back */
    size_t *off;        /* [n_ids] start in arena */
    int32_t *len;       /* [n_ids] byte count, -1 for an id not in the vocabulary */
    int32_t byte_id[256];
    /* token bytes -> id (open addressing, -1 = empty) */
    size_t hcap;
    int32_t *hslot;
    /* (left id, right id) -> merge rank and result id (res -1 = empty) */
    size_t mcap;
    uint64_t *mkey;
    int32_t *mrank, *mres;
};

/* ---- GPT-2's byte alphabet ------------------------------------------------- */

static bool shown_as_itself(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); }

uint32_t em_gpt2_byte_to_unicode(uint8_t b)
{
    if (shown_as_itself(b)) return b;
    unsigned k = 0; /* rank of b among the bytes that are not shown as themselves */
    for (unsigned c = 0; c < b; c++)
        if (!shown_as_itself(c)) k++;
    return 0x100u + k;
}

/* code point -> byte, -1 when it is not in the alphabet (built once per load) */
static void unicode_to_byte_table(int16_t t[0x100 + 68])
{
    for (int i = 0; i < 0x100 + 68; i++) t[i] = -1;
    for (int b = 0; b < 256; b++) t[em_gpt2_byte_to_unicode((uint8_t)b)] = (int16_t)b;
}

/* ---- UTF-8 and classes ------------------------------------------------------ */

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };

/* Length of the code point at s[i] (1 for an invalid byte, *cp = UINT32_MAX).
 * Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_at(const uint8_t *s, size_t n, size_t i, uint32_t *cp)
{
    uint8_t b = s[i];
    *cp = UINT32_MAX;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        v = b & 0x1Fu;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        v = b & 0x0Fu;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        v = b & 0x07u;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    if (need >= n - i) return 1; /* truncated */
    for (size_t k = 1; k <= need; k++) {
        uint8_t c = s[i + k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) return 1;
        v = (v << 6) | (c & 0x3Fu);
    }
    *cp = v;
    return need + 1;
}

static int cp_class(uint32_t cp)
{
    if (cp == UINT32_MAX) return C_OTHER;
    size_t lo = 0, hi = sizeof em_ucls / sizeof em_ucls[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < em_ucls[mid].lo)
            hi = mid;
        else if (cp > em_ucls[mid].hi)
            lo = mid + 1;
        else
            return em_ucls[mid].cls;
    }
    return C_OTHER;
}

static int class_at(const uint8_t *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    *len = utf8_at(s, n, i, &cp);
    return cp_class(cp);
}

/* end of the run of class k starting at i */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int k)
{
    while (i < n) {
        size_t l;
        if (class_at(s, n, i, &l) != k) break;
        i += l;
    }
    return i;
}

/* End of the piece that starts at p < n, by the alternatives of
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * tried in order (leftmost alternative that matches, each greedy). */
static size_t piece_end(const uint8_t *s, size_t n, size_t p)
{
    if (s[p] == '\'' && p + 1 < n) {
        uint8_t a = s[p + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
        if (p + 2 < n) {
            uint8_t b = s[p + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
        }
    }
    size_t l;
    int k = class_at(s, n, p, &l);
    if (s[p] == ' ' && p + 1 < n) {
        size_t l2;
        int k2 = class_at(s, n, p + 1, &l2);
        if (k2 != C_SPACE) return run_end(s, n, p + 1, k2); /* " ?X+" with the space */
    }
    if (k != C_SPACE) return run_end(s, n, p, k);
    /* whitespace: \s+(?!\S) takes the run, less its last code point when a
     * non-space follows and the run has two or more; else \s+ takes it all */
    size_t q = p, last = p;
    while (q < n) {
        size_t lq;
        if (class_at(s, n, q, &lq) != C_SPACE) break;
        last = q;
        q += lq;
    }
    if (q == n) return q;
    return last > p ? last : q;
}

size_t em_gpt2_pretokenize(const void *text, size_t n, size_t *ends, size_t cap)
{
    const uint8_t *s = text;
    size_t count = 0;
    if (!s) return 0;
    for (size_t p = 0; p < n;) {
        size_t e = piece_end(s, n, p);
        if (ends && count < cap) ends[count] = e;
        count++;
        p = e;
    }
    return count;
}

/* ---- hash tables ------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int64_t em_tokenizer_lookup(const em_tokenizer *t, const void *bytes, size_t len)
{
    if (!t || (!bytes && len)) return -1;
    if (!t->bpe) return len == 1 ? ((const uint8_t *)bytes)[0] : -1;
    for (size_t h = hash_bytes(bytes, len) & (t->hcap - 1);; h = (h + 1) & (t->hcap - 1)) {
        int32_t id = t->hslot[h];
        if (id < 0) return -1;
        if ((size_t)t->len[id] == len && memcmp(t->arena + t->off[id], bytes, len) == 0) return id;
    }
}

/* 1 inserted, 0 already there */
static int tok_insert(em_tokenizer *t, int32_t id)
{
    const char *b = t->arena + t->off[id];
    size_t len = (size_t)t->len[id];
    for (size_t h = hash_bytes(b, len) & (t->hcap - 1);; h = (h + 1) & (t->hcap - 1)) {
        int32_t o = t->hslot[h];
        if (o < 0) {
            t->hslot[h] = id;
            return 1;
        }
        if ((size_t)t->len[o] == len && memcmp(t->arena + t->off[o], b, len) == 0) return 0;
    }
}

static size_t merge_slot(const em_tokenizer *t, uint64_t key)
{
    size_t h = mix64(key) & (t->mcap - 1);
    while (t->mres[h] >= 0 && t->mkey[h] != key) h = (h + 1) & (t->mcap - 1);
    return h;
}

/* ---- construction ----------------------------------------------------------- */

void em_tokenizer_free(em_tokenizer *t)
{
    if (!t) return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->hslot);
    free(t->mkey);
    free(t->mrank);
    free(t->mres);
    free(t);
}

em_tokenizer *em_tokenizer_bytes(void)
{
    em_tokenizer *t = calloc(1, sizeof *t);
    if (t) {
        t->arena = malloc(256);
        t->off = malloc(256 * sizeof *t->off);
        t->len = malloc(256 * sizeof *t->len);
    }
    if (!t || !t->arena || !t->off || !t->len) {
        em_tokenizer_free(t);
        em__set_error(EM_ERR_NOMEM, "em_tokenizer_bytes: out of memory");
        return NULL;
    }
    t->n_ids = 256;
    for (int b = 0; b < 256; b++) {
        t->arena[b] = (char)b;
        t->off[b] = (size_t)b;
        t->len[b] = 1;
        t->byte_id[b] = b;
    }
    return t;
}

/* Converts a token written in the byte alphabet (UTF-8 in @p s) to raw bytes
 * in @p out (at most strlen(s) bytes). Returns the byte count, or -1 and the
 * offending code point in *bad (UINT32_MAX for invalid UTF-8). */
static long alphabet_to_bytes(const int16_t *inv, const char *s, size_t n, char *out, uint32_t *bad)
{
    long k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_at((const uint8_t *)s, n, i, &cp);
        if (cp == UINT32_MAX || cp >= 0x100 + 68 || inv[cp] < 0) {
            *bad = cp;
            return -1;
        }
        out[k++] = (char)inv[cp];
    }
    return k;
}

static em_tokenizer *bpe_fail(em_tokenizer *t, json_t *root, FILE *f, char *line)
{
    em_tokenizer_free(t);
    if (root) json_decref(root);
    if (f) fclose(f);
    free(line);
    return NULL;
}

static em_status load_vocab(em_tokenizer *t, json_t *root, const char *path, const int16_t *inv)
{
    size_t count = json_object_size(root), total = 0;
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!json_is_integer(v))
            return em__set_error(EM_ERR_FORMAT, "%s: the id of token \"%s\" is not an integer", path, key);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= MAX_ID)
            return em__set_error(EM_ERR_FORMAT, "%s: token \"%s\" has id %lld outside [0, %d)", path, key,
                                 (long long)id, MAX_ID);
        if (id > max_id) max_id = id;
        total += strlen(key);
    }
    if (count == 0) return em__set_error(EM_ERR_FORMAT, "%s: the vocabulary is empty", path);
    t->n_ids = max_id + 1;
    t->arena = malloc(total ? total : 1);
    t->off = calloc((size_t)t->n_ids, sizeof *t->off);
    t->len = malloc((size_t)t->n_ids * sizeof *t->len);
    t->hcap = pow2_at_least(2 * count);
    t->hslot = malloc(t->hcap * sizeof *t->hslot);
    if (!t->arena || !t->off || !t->len || !t->hslot)
        return em__set_error(EM_ERR_NOMEM, "%s: out of memory for %zu tokens", path, count);
    for (int64_t i = 0; i < t->n_ids; i++) t->len[i] = -1;
    for (size_t i = 0; i < t->hcap; i++) t->hslot[i] = -1;
    size_t at = 0;
    json_object_foreach(root, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->len[id] >= 0)
            return em__set_error(EM_ERR_FORMAT, "%s: id %d is given to two tokens (\"%s\" and another)", path,
                                 (int)id, key);
        uint32_t bad = 0;
        long k = alphabet_to_bytes(inv, key, strlen(key), t->arena + at, &bad);
        if (k < 0) {
            if (bad == UINT32_MAX)
                return em__set_error(EM_ERR_FORMAT, "%s: token \"%s\" (id %d) is not valid UTF-8", path, key, (int)id);
            return em__set_error(EM_ERR_FORMAT,
                                 "%s: token \"%s\" (id %d) has U+%04X, which is not in GPT-2's byte alphabet", path,
                                 key, (int)id, (unsigned)bad);
        }
        if (k == 0) return em__set_error(EM_ERR_FORMAT, "%s: id %d is the empty token", path, (int)id);
        t->off[id] = at;
        t->len[id] = (int32_t)k;
        at += (size_t)k;
        if (!tok_insert(t, id))
            return em__set_error(EM_ERR_FORMAT, "%s: token \"%s\" (id %d) has the bytes of another token", path, key,
                                 (int)id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int64_t id = em_tokenizer_lookup(t, &c, 1);
        if (id < 0)
            return em__set_error(EM_ERR_FORMAT, "%s: no token for byte 0x%02X (U+%04X): every byte must have one",
                                 path, b, (unsigned)em_gpt2_byte_to_unicode((uint8_t)b));
        t->byte_id[b] = (int32_t)id;
    }
    return EM_OK;
}

static em_status add_merge(em_tokenizer *t, const char *path, long lineno, char *line, const int16_t *inv,
                           int32_t rank, char *buf)
{
    char *sp = strchr(line, ' ');
    if (!sp || sp == line || !sp[1] || strchr(sp + 1, ' '))
        return em__set_error(EM_ERR_FORMAT, "%s:%ld: expected two tokens separated by one space, got \"%s\"", path,
                             lineno, line);
    *sp = 0;
    const char *part[2] = {line, sp + 1};
    int64_t id[2];
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        uint32_t bad = 0;
        long k = alphabet_to_bytes(inv, part[i], strlen(part[i]), buf + at, &bad);
        if (k < 0) {
            *sp = ' ';
            if (bad == UINT32_MAX) return em__set_error(EM_ERR_FORMAT, "%s:%ld: not valid UTF-8", path, lineno);
            return em__set_error(EM_ERR_FORMAT, "%s:%ld: U+%04X is not in GPT-2's byte alphabet", path, lineno,
                                 (unsigned)bad);
        }
        id[i] = em_tokenizer_lookup(t, buf + at, (size_t)k);
        if (id[i] < 0) {
            em__set_error(EM_ERR_FORMAT, "%s:%ld: token \"%s\" of the merge is not in the vocabulary", path, lineno,
                          part[i]);
            *sp = ' ';
            return EM_ERR_FORMAT;
        }
        at += (size_t)k;
    }
    int64_t res = em_tokenizer_lookup(t, buf, at);
    if (res < 0) {
        em__set_error(EM_ERR_FORMAT, "%s:%ld: the merge result \"%s%s\" is not in the vocabulary", path, lineno,
                      part[0], part[1]);
        *sp = ' ';
        return EM_ERR_FORMAT;
    }
    uint64_t key = ((uint64_t)id[0] << 32) | (uint64_t)id[1];
    size_t h = merge_slot(t, key);
    if (t->mres[h] >= 0) {
        em__set_error(EM_ERR_FORMAT, "%s:%ld: merge \"%s %s\" repeats the one of rank %d", path, lineno, part[0],
                      part[1], (int)t->mrank[h]);
        *sp = ' ';
        return EM_ERR_FORMAT;
    }
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mres[h] = (int32_t)res;
    *sp = ' ';
    return EM_OK;
}

em_tokenizer *em_bpe_load(const char *vocab_json_path, const char *merges_txt_path)
{
    if (!vocab_json_path || !merges_txt_path) {
        em__set_error(EM_ERR_INVALID, "em_bpe_load: a path is NULL");
        return NULL;
    }
    int16_t inv[0x100 + 68];
    unicode_to_byte_table(inv);
    em_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        em__set_error(EM_ERR_NOMEM, "em_bpe_load: out of memory");
        return NULL;
    }
    t->bpe = true;
    FILE *probe = fopen(vocab_json_path, "rb");
    if (!probe) {
        em__set_error(EM_ERR_IO, "%s: cannot open: %s", vocab_json_path, strerror(errno));
        return bpe_fail(t, NULL, NULL, NULL);
    }
    fclose(probe);
    json_error_t jerr;
    json_t *root = json_load_file(vocab_json_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        em__set_error(EM_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", vocab_json_path, jerr.line, jerr.column, jerr.text);
        return bpe_fail(t, NULL, NULL, NULL);
    }
    if (!json_is_object(root)) {
        em__set_error(EM_ERR_FORMAT, "%s: expected a JSON object {token: id}", vocab_json_path);
        return bpe_fail(t, root, NULL, NULL);
    }
    if (load_vocab(t, root, vocab_json_path, inv) != EM_OK) return bpe_fail(t, root, NULL, NULL);
    json_decref(root);

    FILE *f = fopen(merges_txt_path, "rb");
    if (!f) {
        em__set_error(EM_ERR_IO, "%s: cannot open: %s", merges_txt_path, strerror(errno));
        return bpe_fail(t, NULL, NULL, NULL);
    }
    /* every merge makes a vocabulary token from two: at most n_tokens of them */
    size_t n_tokens = 0;
    for (int64_t i = 0; i < t->n_ids; i++) n_tokens += t->len[i] >= 0;
    t->mcap = pow2_at_least(2 * n_tokens);
    t->mkey = malloc(t->mcap * sizeof *t->mkey);
    t->mrank = malloc(t->mcap * sizeof *t->mrank);
    t->mres = malloc(t->mcap * sizeof *t->mres);
    if (!t->mkey || !t->mrank || !t->mres) {
        em__set_error(EM_ERR_NOMEM, "%s: out of memory", merges_txt_path);
        return bpe_fail(t, NULL, f, NULL);
    }
    for (size_t i = 0; i < t->mcap; i++) t->mres[i] = -1;
    char *line = NULL, *buf = NULL;
    size_t cap = 0, bufcap = 0;
    ssize_t got;
    long lineno = 0;
    int32_t rank = 0;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (memchr(line, 0, (size_t)got)) {
            em__set_error(EM_ERR_FORMAT, "%s:%ld: NUL byte in the line", merges_txt_path, lineno);
            free(buf);
            return bpe_fail(t, NULL, f, line);
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (lineno == 1 && strncmp(line, "#version", 8) == 0) continue;
        if (got == 0) continue;
        if ((size_t)rank >= n_tokens) {
            em__set_error(EM_ERR_FORMAT, "%s:%ld: more merges than vocabulary tokens (%zu)", merges_txt_path, lineno,
                          n_tokens);
            free(buf);
            return bpe_fail(t, NULL, f, line);
        }
        if ((size_t)got > bufcap) {
            char *nb = realloc(buf, (size_t)got);
            if (!nb) {
                em__set_error(EM_ERR_NOMEM, "%s:%ld: out of memory", merges_txt_path, lineno);
                free(buf);
                return bpe_fail(t, NULL, f, line);
            }
            buf = nb;
            bufcap = (size_t)got;
        }
        if (add_merge(t, merges_txt_path, lineno, line, inv, rank, buf) != EM_OK) {
            free(buf);
            return bpe_fail(t, NULL, f, line);
        }
        rank++;
    }
    bool rerr = ferror(f);
    free(buf);
    if (rerr) {
        em__set_error(EM_ERR_IO, "%s: read error after line %ld", merges_txt_path, lineno);
        return bpe_fail(t, NULL, f, line);
    }
    fclose(f);
    free(line);
    return t;
}

/* ---- encode / decode -------------------------------------------------------- */

int64_t em_tokenizer_vocab_size(const em_tokenizer *t)
{
    if (!t) {
        em__set_error(EM_ERR_INVALID, "em_tokenizer_vocab_size: tokenizer is NULL");
        return -1;
    }
    return t->n_ids;
}

/* merges the symbols sym[0..n) of one piece; returns the new count */
static size_t bpe_piece(const em_tokenizer *t, int32_t *sym, size_t n)
{
    while (n >= 2) {
        int32_t best = INT32_MAX, first = -1, second = -1, res = -1;
        for (size_t i = 0; i + 1 < n; i++) {
            uint64_t key = ((uint64_t)(uint32_t)sym[i] << 32) | (uint32_t)sym[i + 1];
            size_t h = merge_slot(t, key);
            if (t->mres[h] >= 0 && t->mrank[h] < best) {
                best = t->mrank[h];
                first = sym[i];
                second = sym[i + 1];
                res = t->mres[h];
            }
        }
        if (res < 0) break;
        size_t w = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && sym[i] == first && sym[i + 1] == second) {
                sym[w++] = res;
                i += 2;
            } else {
                sym[w++] = sym[i++];
            }
        }
        n = w;
    }
    return n;
}

em_status em_tokenizer_encode(const em_tokenizer *t, const void *text, size_t n, int64_t **ids, size_t *n_ids)
{
    if (!t || !ids || !n_ids || (!text && n))
        return em__set_error(EM_ERR_INVALID, "em_tokenizer_encode: NULL tokenizer, text or output");
    *ids = NULL;
    *n_ids = 0;
    if (n == 0) return EM_OK;
    const uint8_t *s = text;
    int64_t *out = malloc(n * sizeof *out);
    if (!out) return em__set_error(EM_ERR_NOMEM, "em_tokenizer_encode: out of memory for %zu bytes", n);
    size_t k = 0;
    if (!t->bpe) {
        for (size_t i = 0; i < n; i++) out[i] = s[i];
        k = n;
    } else {
        int32_t *sym = NULL;
        size_t symcap = 0;
        for (size_t p = 0; p < n;) {
            size_t e = piece_end(s, n, p), m = e - p;
            if (m > symcap) {
                int32_t *ns = realloc(sym, m * sizeof *sym);
                if (!ns) {
                    free(sym);
                    free(out);
                    return em__set_error(EM_ERR_NOMEM, "em_tokenizer_encode: out of memory (piece of %zu bytes)", m);
                }
                sym = ns;
                symcap = m;
            }
            for (size_t i = 0; i < m; i++) sym[i] = t->byte_id[s[p + i]];
            m = bpe_piece(t, sym, m);
            for (size_t i = 0; i < m; i++) out[k++] = sym[i];
            p = e;
        }
        free(sym);
        int64_t *shrunk = realloc(out, k * sizeof *out);
        if (shrunk) out = shrunk;
    }
    *ids = out;
    *n_ids = k;
    return EM_OK;
}

const char *em_tokenizer_token(const em_tokenizer *t, int64_t id, size_t *len)
{
    if (!t || !len) {
        em__set_error(EM_ERR_INVALID, "em_tokenizer_token: NULL tokenizer or length");
        return NULL;
    }
    if (id < 0 || id >= t->n_ids || t->len[id] < 0) {
        em__set_error(EM_ERR_INVALID, "em_tokenizer_token: id %lld is not in the vocabulary (%lld ids)",
                      (long long)id, (long long)t->n_ids);
        return NULL;
    }
    *len = (size_t)t->len[id];
    return t->arena + t->off[id];
}

em_status em_tokenizer_decode(const em_tokenizer *t, const int64_t *ids, size_t n, char **bytes, size_t *n_bytes)
{
    if (!t || !bytes || !n_bytes || (!ids && n))
        return em__set_error(EM_ERR_INVALID, "em_tokenizer_decode: NULL tokenizer, ids or output");
    *bytes = NULL;
    *n_bytes = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->len[id] < 0)
            return em__set_error(EM_ERR_INVALID, "em_tokenizer_decode: id %lld at position %zu is not in the vocabulary",
                                 (long long)id, i);
        total += (size_t)t->len[id];
    }
    char *out = malloc(total + 1);
    if (!out) return em__set_error(EM_ERR_NOMEM, "em_tokenizer_decode: out of memory for %zu bytes", total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(out + at, t->arena + t->off[ids[i]], (size_t)t->len[ids[i]]);
        at += (size_t)t->len[ids[i]];
    }
    out[at] = 0;
    *bytes = out;
    *n_bytes = at;
    return EM_OK;
}
