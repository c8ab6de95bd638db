/* File readers against the reference implementations' validation rules
 * (issue #20, item 10): SafeTensors against the Rust `safetensors` crate,
 * IDX against LeCun's format description. One test per rule, each checking
 * the exact em_status and that the message names the file and the field.
 * docs/file-formats.md lists the rules and what Ember does with each.
 *
 * The SafeTensors cases come from tests/fixtures/safetensors_cases.txt,
 * written by gen_safetensors_cases.py, which also records the crate's
 * verdict on each file: every case checks that Ember accepts exactly the
 * files the crate accepts, except the deviations marked DEV below (and in
 * the docs). */
#define _GNU_SOURCE
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

static const char *fixture_dir(void)
{
    const char *d = getenv("EMBER_TEST_DATA");
    return d && d[0] ? d : "tests/fixtures";
}

static uint8_t *read_whole(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void write_whole(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* ---- SafeTensors cases ----------------------------------------------------------------- */

/* Finds case @p name in safetensors_cases.txt: its bytes (malloc'd) and
 * whether the crate accepted it. */
static uint8_t *st_case_bytes(const char *name, size_t *n, bool *crate_ok)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/safetensors_cases.txt", fixture_dir());
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    uint8_t *out = NULL;
    while (getline(&line, &cap, f) > 0) {
        if (line[0] == '#') continue;
        char *sp1 = strchr(line, ' ');
        if (!sp1) continue;
        *sp1 = 0;
        if (strcmp(line, name)) continue;
        char *sp2 = strchr(sp1 + 1, ' ');
        assert_non_null(sp2);
        *crate_ok = strncmp(sp1 + 1, "ok ", 3) == 0;
        char *hex = sp2 + 1;
        size_t hl = strcspn(hex, "\r\n");
        out = malloc(hl / 2 + 1);
        assert_non_null(out);
        for (size_t i = 0; i < hl / 2; i++) {
            unsigned v;
            assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
            out[i] = (uint8_t)v;
        }
        *n = hl / 2;
        break;
    }
    free(line);
    fclose(f);
    if (!out) fail_msg("case '%s' not in %s (rerun gen_safetensors_cases.py?)", name, path);
    return out;
}

enum { AGREE = 0, DEV = 1 }; /* DEV: a deliberate difference from the crate's verdict (docs/file-formats.md) */

/* Opens case @p name from a file and from memory; EM_OK: must open (returned,
 * caller closes); else must fail with @p st and a message naming the file and
 * holding m1 and m2. */
static em_st_file *st_case(const char *name, em_status st, const char *m1, const char *m2, int dev)
{
    size_t n = 0;
    bool crate_ok = false;
    uint8_t *b = st_case_bytes(name, &n, &crate_ok);
    char fname[160];
    snprintf(fname, sizeof fname, "%s.safetensors", name);
    const char *path = em_test_tmp_path(fname);
    write_whole(path, b, n);
    if (!dev && crate_ok != (st == EM_OK))
        fail_msg("case %s: the crate %s it, the test expects Ember to %s it", name, crate_ok ? "accepts" : "rejects",
                 st == EM_OK ? "accept" : "reject");
    if (dev && crate_ok == (st == EM_OK)) fail_msg("case %s: marked DEV but Ember agrees with the crate", name);
    em_st_file *m = em_safetensors_open_memory(b, n, "mem");
    free(b);
    em_st_file *f = em_safetensors_open(path);
    if (st == EM_OK) {
        if (!m || !f) fail_msg("case %s: expected to open, got: %s", name, em_last_error());
        em_safetensors_close(m);
        return f;
    }
    if (f) fail_msg("case %s: opened, expected %s containing '%s'", name, em_status_str(st), m1 ? m1 : "");
    if (em_last_status() != st)
        fail_msg("case %s: status %s, expected %s: %s", name, em_status_str(em_last_status()), em_status_str(st),
                 em_last_error());
    assert_msg_has(path);
    if (m1) assert_msg_has(m1);
    if (m2) assert_msg_has(m2);
    if (m) fail_msg("case %s: opened from memory", name);
    assert_int_equal(em_last_status(), st);
    return NULL;
}

#define ST_REJECT(fn, st, m1, m2, dev)                                                                                 \
    static void fn(void **state)                                                                                       \
    {                                                                                                                  \
        (void)state;                                                                                                   \
        st_case(#fn + 3, st, m1, m2, dev);                                                                             \
    }

/* header length (8-byte little-endian u64) */
ST_REJECT(st_header_too_small, EM_ERR_FORMAT, "3 bytes, shorter than the 8-byte header length", NULL, AGREE)
ST_REJECT(st_header_len_beyond_file, EM_ERR_FORMAT, "header length 255 beyond the end of the file (10 bytes)", NULL,
          AGREE)
ST_REJECT(st_header_len_u64_max, EM_ERR_FORMAT, "header length 18446744073709551615 above the limit of 100000000", NULL,
          AGREE)
ST_REJECT(st_header_len_above_limit, EM_ERR_FORMAT, "header length 100000001 above the limit of 100000000", NULL, AGREE)
/* header text: UTF-8 JSON object */
ST_REJECT(st_header_not_utf8, EM_ERR_FORMAT, "header is not valid UTF-8", "byte 2", AGREE)
ST_REJECT(st_header_not_json, EM_ERR_FORMAT, "header is not valid JSON", NULL, AGREE)
ST_REJECT(st_header_empty, EM_ERR_FORMAT, "header is not valid JSON", NULL, AGREE)
ST_REJECT(st_header_not_object, EM_ERR_FORMAT, "header is JSON but not an object", NULL, AGREE)
ST_REJECT(st_header_trailing_nul, EM_ERR_FORMAT, "header is not valid JSON", NULL, AGREE)
ST_REJECT(st_header_trailing_junk, EM_ERR_FORMAT, "header is not valid JSON", NULL, AGREE)
/* keys */
ST_REJECT(st_duplicate_key, EM_ERR_FORMAT, "duplicate object key", "\"a\"", AGREE)
ST_REJECT(st_key_with_nul, EM_ERR_FORMAT, "header is not valid JSON", "NUL", DEV)
/* __metadata__: optional map of strings */
ST_REJECT(st_metadata_value_not_string, EM_ERR_FORMAT, "__metadata__ value of 'epoch' is not a string", NULL, AGREE)
ST_REJECT(st_metadata_not_object, EM_ERR_FORMAT, "__metadata__ is not an object", NULL, AGREE)
/* tensor entries: dtype, shape, data_offsets */
ST_REJECT(st_entry_not_object, EM_ERR_FORMAT, "tensor 'w'", "entry is not a JSON object", AGREE)
ST_REJECT(st_dtype_unknown, EM_ERR_FORMAT, "tensor 'w'", "unknown dtype \"F7\"", AGREE)
ST_REJECT(st_dtype_lowercase, EM_ERR_FORMAT, "tensor 'w'", "unknown dtype \"f32\"", AGREE)
ST_REJECT(st_dtype_missing, EM_ERR_FORMAT, "tensor 'w'", "missing or non-string \"dtype\"", AGREE)
ST_REJECT(st_shape_missing, EM_ERR_FORMAT, "tensor 'w'", "missing or non-list \"shape\"", AGREE)
ST_REJECT(st_shape_not_list, EM_ERR_FORMAT, "tensor 'w'", "missing or non-list \"shape\"", AGREE)
ST_REJECT(st_offsets_missing, EM_ERR_FORMAT, "tensor 'w'", "\"data_offsets\" is not [begin, end]", AGREE)
ST_REJECT(st_shape_negative, EM_ERR_FORMAT, "tensor 'w'", "shape entry 1 is not an integer >= 0", AGREE)
ST_REJECT(st_shape_float, EM_ERR_FORMAT, "tensor 'w'", "shape entry 0 is not an integer >= 0", AGREE)
ST_REJECT(st_offsets_three, EM_ERR_FORMAT, "tensor 'w'", "\"data_offsets\" is not [begin, end]", AGREE)
ST_REJECT(st_offsets_negative, EM_ERR_FORMAT, "tensor 'w'", "data_offsets [-4, 0]", AGREE)
ST_REJECT(st_offset_above_u64, EM_ERR_FORMAT, "header is not valid JSON", NULL, AGREE)
ST_REJECT(st_rank_9, EM_ERR_UNSUPPORTED, "tensor 'w'", "rank 9 above Ember's limit of 8", DEV)
/* validate(): offsets sorted, contiguous from 0, no hole, no overlap (InvalidOffset) */
ST_REJECT(st_offsets_end_before_begin, EM_ERR_FORMAT, "tensor 'w'", "bad data_offsets [4, 0]", AGREE)
ST_REJECT(st_offsets_hole_at_start, EM_ERR_FORMAT, "tensor 'w'", "bytes [0, 4) of the data buffer belong to no tensor",
          AGREE)
ST_REJECT(st_offsets_hole_between, EM_ERR_FORMAT, "tensor 'b'", "bytes [4, 8) of the data buffer belong to no tensor",
          AGREE)
ST_REJECT(st_offsets_overlap, EM_ERR_FORMAT, "'a' [0, 8] and 'b' [4, 12] overlap", NULL, AGREE)
/* validate(): numel * dtype size == end - begin (TensorInvalidInfo), no overflow (ValidationOverflow) */
ST_REJECT(st_size_mismatch, EM_ERR_FORMAT, "tensor 'w'",
          "shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] hold 12", AGREE)
ST_REJECT(st_shape_overflow, EM_ERR_FORMAT, "tensor 'w'", "shape [4294967296, 4294967296] of F32 overflows", AGREE)
ST_REJECT(st_nbytes_overflow, EM_ERR_FORMAT, "tensor 'w'", "shape [4611686018427387904] of F64 overflows", AGREE)
ST_REJECT(st_dtype_f4_odd, EM_ERR_FORMAT, "tensor 'w'", "3 elements of F4 do not fill whole bytes", AGREE)
/* the offsets must cover the whole buffer (MetadataIncompleteBuffer) */
ST_REJECT(st_buffer_trailing_bytes, EM_ERR_FORMAT, "4 bytes after the end of the last tensor's data", "'a'", AGREE)
ST_REJECT(st_buffer_truncated, EM_ERR_FORMAT, "tensor 'a'", "beyond the 4-byte data buffer (file truncated?)", AGREE)

/* Files the crate accepts: Ember opens them with the right contents. */
static void st_accepted(void **state)
{
    (void)state;
    static const char *const plain[] = {"header_leading_space", "header_trailing_spaces", "metadata_null",
                                        "entry_extra_field"};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        em_st_file *f = st_case(plain[i], EM_OK, NULL, NULL, AGREE);
        em_safetensors_close(f);
    }
    em_st_file *f = st_case("zero_size_tensors", EM_OK, NULL, NULL, AGREE);
    assert_int_equal(em_safetensors_count(f), 3);
    assert_int_equal(em_safetensors_find(f, "a")->numel, 0);
    assert_int_equal(em_safetensors_find(f, "c")->shape[1], 0);
    em_safetensors_close(f);
    f = st_case("scalar", EM_OK, NULL, NULL, AGREE);
    const em_st_tensor *t = em_safetensors_find(f, "s");
    assert_int_equal(t->ndim, 0);
    assert_true(*(const double *)t->data == 2.5);
    em_safetensors_close(f);
    f = st_case("unordered_offsets", EM_OK, NULL, NULL, AGREE);
    assert_int_equal(em_safetensors_find(f, "b")->data_begin, 4);
    em_safetensors_close(f);
    f = st_case("key_empty", EM_OK, NULL, NULL, AGREE);
    assert_non_null(em_safetensors_find(f, ""));
    em_safetensors_close(f);
}

/* dtypes Ember cannot hold: the file opens (it is valid), the bytes are
 * there, and making a tensor of one says which dtype and which tensor. */
static void st_unsupported_dtypes(void **state)
{
    (void)state;
    static const struct {
        const char *name, *dtype;
        size_t nbytes;
    } c[] = {{"dtype_i16", "I16", 4}, {"dtype_f8_e4m3", "F8_E4M3", 2}, {"dtype_f4", "F4", 1},
             {"dtype_c64", "C64", 8}};
    em_scope_begin();
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        em_st_file *f = st_case(c[i].name, EM_OK, NULL, NULL, AGREE);
        const em_st_tensor *t = em_safetensors_find(f, "w");
        assert_string_equal(t->st_dtype, c[i].dtype);
        assert_int_equal(t->nbytes, c[i].nbytes);
        assert_null(em_safetensors_tensor(f, "w"));
        assert_int_equal(em_last_status(), EM_ERR_DTYPE);
        char want[96];
        snprintf(want, sizeof want, "unsupported dtype %s for tensor 'w'", c[i].dtype);
        assert_msg_has(want);
        /* loading it into a model tensor says the same, and changes nothing */
        em_tensor *dst = em_full(t->shape, t->ndim, EM_F32, 7.0);
        const char *nm[1] = {"w"};
        assert_int_equal(em_safetensors_load_from(f, nm, &dst, 1, true), EM_ERR_DTYPE);
        assert_msg_has(want);
        float v0 = 0;
        assert_int_equal(em_to_host(em_narrow(em_reshape(dst, (int64_t[]){-1}, 1), 0, 0, 1), &v0, sizeof v0), EM_OK);
        assert_true(v0 == 7.0f);
        em_safetensors_close(f);
    }
    /* F16 is an Ember dtype: it loads as such, and into an f32 model tensor
     * it is refused by dtype (no silent conversion), changing nothing */
    em_st_file *f = st_case("dtype_f16", EM_OK, NULL, NULL, AGREE);
    const em_st_tensor *t = em_safetensors_find(f, "w");
    assert_string_equal(t->st_dtype, "F16");
    em_tensor *h = em_safetensors_tensor(f, "w");
    assert_non_null(h);
    assert_int_equal(em_tensor_dtype(h), EM_F16);
    assert_int_equal(em_tensor_numel(h), t->numel);
    em_tensor *dst = em_full(t->shape, t->ndim, EM_F32, 7.0);
    const char *nm[1] = {"w"};
    assert_int_equal(em_safetensors_load_from(f, nm, &dst, 1, true), EM_ERR_DTYPE);
    assert_msg_has("key 'w': dtype F16 in file, F32 in model");
    em_safetensors_close(f);
    em_scope_end();
}

/* Every case of the fixture file is one of the tests above. */
static const char *const ALL_CASES[] = {
    "header_too_small", "header_len_beyond_file", "header_len_u64_max", "header_len_above_limit", "header_not_utf8",
    "header_not_json", "header_empty", "header_not_object", "header_leading_space", "header_trailing_spaces",
    "header_trailing_nul", "header_trailing_junk", "duplicate_key", "metadata_null", "metadata_value_not_string",
    "metadata_not_object", "entry_not_object", "dtype_unknown", "dtype_lowercase", "dtype_missing", "shape_missing",
    "offsets_missing", "entry_extra_field", "shape_negative", "shape_float", "shape_not_list", "offsets_three",
    "offsets_negative", "offsets_end_before_begin", "offsets_hole_at_start", "offsets_hole_between", "offsets_overlap",
    "buffer_trailing_bytes", "buffer_truncated", "size_mismatch", "shape_overflow", "nbytes_overflow",
    "zero_size_tensors", "scalar", "rank_9", "dtype_i16", "dtype_f8_e4m3", "dtype_f4", "dtype_f4_odd", "dtype_c64",
    "dtype_f16", "key_empty", "key_with_nul", "offset_above_u64", "unordered_offsets",
};

static void st_cases_covered(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/safetensors_cases.txt", fixture_dir());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        if (line[0] == '#') continue;
        *strchr(line, ' ') = 0;
        bool known = false;
        for (size_t i = 0; i < sizeof ALL_CASES / sizeof *ALL_CASES && !known; i++) known = !strcmp(ALL_CASES[i], line);
        if (!known) fail_msg("case '%s' of %s has no test in test_readers.c", line, path);
        n++;
    }
    free(line);
    fclose(f);
    assert_int_equal(n, (int)(sizeof ALL_CASES / sizeof *ALL_CASES));
}

/* ---- files written by Python's safetensors --------------------------------------------- */

/* gen_safetensors_cases.py's pattern(). */
static uint64_t pattern(uint64_t i, int bits)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    x ^= x >> 29;
    return bits == 64 ? x : x & ((UINT64_C(1) << bits) - 1);
}

/* Expected little-endian bytes of the fixture's tensor @p name. */
static size_t expected_bytes(const char *name, uint8_t *out)
{
    static const struct {
        const char *name;
        int n, bits;
    } P[] = {{"f64", 12, 64}, {"f32", 24, 32}, {"f16", 6, 16}, {"bf16", 6, 16}, {"i64", 5, 64},
             {"i32", 7, 32},  {"i16", 3, 16},  {"i8", 9, 8},   {"u8", 10, 8}};
    for (size_t k = 0; k < sizeof P / sizeof *P; k++)
        if (!strcmp(P[k].name, name)) {
            size_t es = (size_t)P[k].bits / 8;
            for (int i = 0; i < P[k].n; i++) {
                uint64_t v = pattern((uint64_t)i, P[k].bits);
                for (size_t b = 0; b < es; b++) out[(size_t)i * es + b] = (uint8_t)(v >> (8 * b));
            }
            return (size_t)P[k].n * es;
        }
    if (!strcmp(name, "bool")) {
        for (int i = 0; i < 5; i++) out[i] = (uint8_t)pattern((uint64_t)i, 1);
        return 5;
    }
    if (!strcmp(name, "f32_specials")) {
        const float v[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -3.4028235e38f, 1.0f};
        memcpy(out, v, sizeof v);
        return sizeof v;
    }
    if (!strcmp(name, "scalar")) {
        double d = -1.5;
        memcpy(out, &d, 8);
        return 8;
    }
    if (!strcmp(name, "empty")) return 0;
    fail_msg("no expected bytes for '%s'", name);
    return 0;
}

/* A file from safetensors.torch.save_file loads bit-exact: every tensor's
 * bytes (all dtypes, Ember's or not), the tensors Ember holds through
 * em_safetensors_tensor, the metadata. */
static void st_python_file_bit_exact(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/safetensors_py.safetensors", fixture_dir());
    em_st_file *f = em_safetensors_open(path);
    if (!f) fail_msg("open: %s", em_last_error());
    assert_int_equal(em_safetensors_count(f), 13);
    uint8_t want[256], got[256];
    em_scope_begin();
    for (size_t i = 0; i < em_safetensors_count(f); i++) {
        const em_st_tensor *t = em_safetensors_at(f, i);
        size_t n = expected_bytes(t->name, want);
        assert_int_equal(t->nbytes, n);
        if (n && memcmp(t->data, want, n)) fail_msg("tensor '%s': bytes differ from the pattern", t->name);
        if (t->dtype == EM_DTYPE_COUNT) continue;
        em_tensor *e = em_safetensors_tensor(f, t->name);
        if (!e) fail_msg("tensor '%s': %s", t->name, em_last_error());
        assert_int_equal(em_tensor_numel(e), t->numel);
        assert_int_equal(em_to_host(e, got, n), EM_OK);
        if (n && memcmp(got, want, n)) fail_msg("tensor '%s': em_tensor bytes differ", t->name);
    }
    em_scope_end();
    assert_string_equal(em_safetensors_find(f, "f32")->st_dtype, "F32");
    assert_int_equal(em_safetensors_find(f, "f32")->ndim, 3);
    assert_int_equal(em_safetensors_find(f, "i8")->dtype, EM_DTYPE_COUNT);
    assert_int_equal(em_safetensors_find(f, "bf16")->dtype, EM_BF16);
    assert_string_equal(em_safetensors_metadata(f, "format"), "pt");
    assert_non_null(em_safetensors_metadata(f, "note"));
    em_safetensors_close(f);
}

/* Ember's writer gives the bytes the reference writer gives (same header,
 * layout order, padding), so what the crate accepts it accepts too. */
static void st_writer_matches_reference(void **state)
{
    (void)state;
    static const char *const names[] = {"f64", "f32", "i64", "i32", "u8", "bool", "scalar", "empty"};
    static const em_dtype dts[] = {EM_F64, EM_F32, EM_I64, EM_I32, EM_U8, EM_BOOL, EM_F64, EM_F32};
    const int64_t *shapes[] = {SHAPE(3, 4), SHAPE(2, 3, 4), SHAPE(5), SHAPE(7), SHAPE(2, 5), SHAPE(5), NULL, SHAPE(0, 3)};
    const int nds[] = {2, 3, 1, 1, 2, 1, 0, 2};
    em_scope_begin();
    em_tensor *t[8];
    uint8_t buf[256];
    for (int i = 0; i < 8; i++) {
        expected_bytes(names[i], buf);
        t[i] = em_from_host(buf, shapes[i], nds[i], dts[i]);
        assert_non_null(t[i]);
    }
    const char *p = em_test_tmp_path("ember_layout.safetensors");
    assert_int_equal(em_safetensors_save(p, names, t, 8, NULL, 0), EM_OK);
    em_scope_end();
    char ref[1024];
    snprintf(ref, sizeof ref, "%s/safetensors_py_layout.safetensors", fixture_dir());
    size_t na, nb;
    uint8_t *a = read_whole(p, &na), *b = read_whole(ref, &nb);
    if (na != nb || memcmp(a, b, na)) {
        a[na - 1] = 0;
        fail_msg("Ember's file (%zu bytes) differs from the reference writer's (%zu bytes); header %.300s", na, nb,
                 (const char *)a + 8);
    }
    free(a);
    free(b);
    /* with metadata the header starts with '{', is padded with spaces to a
     * multiple of 8 and the data still begins right after it */
    em_scope_begin();
    em_tensor *x = em_ones(SHAPE(3), 1, EM_F32);
    const char *nm[1] = {"x"};
    const em_st_kv meta[1] = {{"k", "v\xc3\xa9"}};
    assert_int_equal(em_safetensors_save(p, nm, &x, 1, meta, 1), EM_OK);
    em_scope_end();
    a = read_whole(p, &na);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | a[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(na, 8 + hl + 12);
    assert_int_equal(a[8], '{');
    size_t e = 8 + hl;
    while (a[e - 1] == ' ') e--;
    assert_int_equal(a[e - 1], '}');
    free(a);
    if (system("/usr/bin/python3 -c 'import safetensors' >/dev/null 2>&1") == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c \"import safetensors; d = open('%s','rb').read(); "
                 "r = dict(safetensors.deserialize(d)); assert r['x']['shape'] == [3], r\"",
                 p);
        assert_int_equal(system(cmd), 0);
    } else {
        print_message("python3 safetensors not installed: the crate's own check of the written file skipped\n");
    }
}

static void count_state(const char *key, em_tensor *t, void *ud)
{
    (void)key;
    (void)t;
    ++*(int *)ud;
}

/* A failed load changes nothing: em_safetensors_load_into / em_checkpoint_load
 * on a file that fails late (after the first keys would already fit) leave
 * every parameter, buffer and optimizer state as it was. */
static void st_failed_load_changes_nothing(void **state)
{
    (void)state;
    em_scope_begin();
    em_module *m = em_linear_new(3, 2, true);
    em_module *m2 = em_linear_new(3, 2, true);
    assert_non_null(m);
    assert_non_null(m2);
    assert_int_equal(em_copy_(em_module_get_param(m2, "weight"), em_full(SHAPE(2, 3), 2, EM_F32, 0.5)), EM_OK);
    em_optim *o = em_adam_new((em_tensor *[]){em_module_get_param(m, "weight"), em_module_get_param(m, "bias")}, 2,
                              1e-3);
    em_optim *o2 = em_sgd_new((em_tensor *[]){em_module_get_param(m2, "weight"), em_module_get_param(m2, "bias")}, 2,
                              0.1, 0.9, 0);
    assert_non_null(o);
    assert_non_null(o2);
    /* a checkpoint of m2 (other values) with SGD momentum state */
    em_tensor *gw = em_ones(SHAPE(2, 3), 2, EM_F32), *gb = em_ones(SHAPE(2), 1, EM_F32);
    assert_int_equal(em_optim_state_set(o2, "state.0.momentum_buffer", gw), EM_OK);
    assert_int_equal(em_optim_state_set(o2, "state.1.momentum_buffer", gb), EM_OK);
    const char *ck = em_test_tmp_path("other.safetensors");
    assert_int_equal(em_checkpoint_save(ck, m2, o2, NULL, NULL, NULL, 0), EM_OK);
    float before[8], after[8];
    assert_int_equal(em_to_host(em_module_get_param(m, "weight"), before, 6 * sizeof(float)), EM_OK);
    /* loading it with an Adam optimizer fails (optimizer kind): the model is untouched */
    assert_int_equal(em_checkpoint_load(ck, m, o, NULL, NULL), EM_ERR_FORMAT);
    assert_msg_has(ck);
    assert_msg_has("optimizer state is for SGD");
    assert_int_equal(em_to_host(em_module_get_param(m, "weight"), after, 6 * sizeof(float)), EM_OK);
    assert_memory_equal(before, after, 6 * sizeof(float));
    /* a checkpoint whose optimizer state has the wrong shape: model untouched, no state created */
    em_optim *o3 = em_sgd_new((em_tensor *[]){em_module_get_param(m, "weight"), em_module_get_param(m, "bias")}, 2,
                              0.1, 0.9, 0);
    const char *names[3] = {"model.weight", "model.bias", "optim.state.1.momentum_buffer"};
    em_tensor *ts[3] = {em_module_get_param(m2, "weight"), em_module_get_param(m2, "bias"), em_ones(SHAPE(5), 1, EM_F32)};
    const em_st_kv meta[2] = {{"ember.format", "checkpoint-1"}, {"ember.optim_kind", "SGD"}};
    const char *bad = em_test_tmp_path("badstate.safetensors");
    assert_int_equal(em_safetensors_save(bad, names, ts, 3, meta, 2), EM_OK);
    if (em_checkpoint_load(bad, m, o3, NULL, NULL) != EM_ERR_SHAPE) fail_msg("%s", em_last_error());
    assert_msg_has("optim.state.1.momentum_buffer");
    assert_int_equal(em_to_host(em_module_get_param(m, "weight"), after, 6 * sizeof(float)), EM_OK);
    assert_memory_equal(before, after, 6 * sizeof(float));
    int nstate = 0;
    assert_int_equal(em_optim_state_visit(o3, count_state, &nstate), EM_OK);
    assert_int_equal(nstate, 0);
    /* bad progress metadata is an error naming the key, before anything is loaded */
    const em_st_kv meta2[2] = {{"ember.format", "checkpoint-1"}, {"ember.epoch", "3x"}};
    assert_int_equal(em_safetensors_save(bad, names, ts, 2, meta2, 2), EM_OK);
    em_checkpoint_info info;
    assert_int_equal(em_checkpoint_load(bad, m, NULL, NULL, &info), EM_ERR_FORMAT);
    assert_msg_has("ember.epoch");
    assert_int_equal(em_to_host(em_module_get_param(m, "weight"), after, 6 * sizeof(float)), EM_OK);
    assert_memory_equal(before, after, 6 * sizeof(float));
    em_optim_free(o);
    em_optim_free(o2);
    em_optim_free(o3);
    em_module_free(m);
    em_module_free(m2);
    em_scope_end();
}

/* ---- IDX -------------------------------------------------------------------------------- */

/* Writes magic, dims (big-endian) and payload; gz: through the gzip program. */
static void write_idx(const char *path, bool gz, uint32_t magic, const uint32_t *dims, int ndim, const void *payload,
                      size_t payload_n)
{
    size_t n = 4 + 4 * (size_t)ndim + payload_n;
    uint8_t *b = malloc(n + 1);
    assert_non_null(b);
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(magic >> (24 - 8 * i));
    for (int d = 0; d < ndim; d++)
        for (int i = 0; i < 4; i++) b[4 + 4 * d + i] = (uint8_t)(dims[d] >> (24 - 8 * i));
    if (payload_n) memcpy(b + 4 + 4 * ndim, payload, payload_n);
    if (gz) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "gzip -n -c > '%s'", path);
        FILE *f = popen(cmd, "w");
        assert_non_null(f);
        assert_int_equal(fwrite(b, 1, n, f), n);
        assert_int_equal(pclose(f), 0);
    } else {
        write_whole(path, b, n);
    }
    free(b);
}

static void idx_expect(const char *path, uint32_t magic, em_status st, const char *m1, const char *m2)
{
    em_idx idx;
    memset(&idx, 0x55, sizeof idx);
    em_status got = em_idx_read(path, magic, &idx);
    if (got != st) fail_msg("%s: status %s, expected %s: %s", path, em_status_str(got), em_status_str(st), em_last_error());
    if (st == EM_OK) {
        em_idx_free(&idx);
        return;
    }
    assert_null(idx.data); /* nothing handed out */
    assert_msg_has(path);
    if (m1) assert_msg_has(m1);
    if (m2) assert_msg_has(m2);
}

static const uint8_t PIX[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* 2 images 2x2 */

static void idx_truncated(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("t.idx");
    write_whole(p, "\0\0\x08", 3);
    idx_expect(p, 0, EM_ERR_FORMAT, "truncated: 3 bytes, shorter than the 4-byte IDX magic", NULL);
    write_whole(p, "\0\0\x08\x03\0\0\0\x02\0\0", 10);
    idx_expect(p, 0, EM_ERR_FORMAT, "truncated header: expected 12 bytes of dimensions, got 6", NULL);
    write_idx(p, false, 0x00000803, (const uint32_t[]){2, 2, 2}, 3, PIX, 7);
    idx_expect(p, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "truncated: expected 8 bytes of pixels, got 7", NULL);
}

static void idx_wrong_magic(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("m.idx");
    write_idx(p, false, 0x00000801, (const uint32_t[]){2}, 1, PIX, 2);
    idx_expect(p, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "wrong magic number 0x00000801, expected 0x00000803", NULL);
    write_idx(p, false, 0x01000801, (const uint32_t[]){2}, 1, PIX, 2);
    idx_expect(p, 0, EM_ERR_FORMAT, "bad magic number 0x01000801", "first two bytes must be 0");
    write_idx(p, false, 0x00000A01, (const uint32_t[]){2}, 1, PIX, 2);
    idx_expect(p, 0, EM_ERR_FORMAT, "unknown IDX element type 0x0a", NULL);
}

static void idx_types(void **state)
{
    (void)state;
    /* every type code of the format, big-endian data turned into host order */
    static const struct {
        int code;
        size_t es;
    } T[] = {{0x08, 1}, {0x09, 1}, {0x0B, 2}, {0x0C, 4}, {0x0D, 4}, {0x0E, 8}};
    const char *p = em_test_tmp_path("types.idx");
    uint8_t be[16] = {0x3F, 0xF0, 0, 0, 0, 0, 0, 0, 0xC0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t k = 0; k < sizeof T / sizeof *T; k++) {
        write_idx(p, false, (uint32_t)(T[k].code << 8) | 1, (const uint32_t[]){2}, 1, be, 2 * T[k].es);
        em_idx idx;
        if (em_idx_read(p, 0, &idx) != EM_OK) fail_msg("type 0x%02x: %s", T[k].code, em_last_error());
        assert_int_equal(idx.elem_size, T[k].es);
        assert_int_equal(idx.numel, 2);
        const uint8_t *d = idx.data;
        for (size_t b = 0; b < T[k].es; b++) assert_int_equal(d[b], be[T[k].es - 1 - b]); /* byte order swapped */
        if (T[k].code == 0x0E) assert_true(((const double *)idx.data)[0] == 1.0);
        em_idx_free(&idx);
    }
}

static void idx_zero_dims(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("z.idx");
    write_whole(p, "\0\0\x08\0", 4);
    idx_expect(p, 0, EM_ERR_FORMAT, "IDX rank 0 outside [1, 8]", NULL);
    /* rank above Ember's limit */
    write_whole(p, "\0\0\x08\x09", 4);
    idx_expect(p, 0, EM_ERR_FORMAT, "IDX rank 9 outside [1, 8]", NULL);
    /* a dimension of size 0 is a valid, empty file */
    write_idx(p, false, 0x00000803, (const uint32_t[]){0, 28, 28}, 3, NULL, 0);
    em_idx idx;
    assert_int_equal(em_idx_read(p, EM_IDX_MAGIC_IMAGES, &idx), EM_OK);
    assert_int_equal(idx.numel, 0);
    assert_int_equal(idx.dims[1], 28);
    em_idx_free(&idx);
}

static void idx_size_overflow(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("o.idx");
    write_idx(p, false, 0x00000E04, (const uint32_t[]){0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 2}, 4, NULL, 0);
    idx_expect(p, 0, EM_ERR_FORMAT, "IDX sizes overflow", "dimension 1 (4294967295)");
    /* a product that fits but is far beyond the file: truncated, without allocating it */
    write_idx(p, false, 0x00000803, (const uint32_t[]){0xFFFFFFFFu, 0xFFFFu, 2}, 3, PIX, 8);
    idx_expect(p, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "truncated: expected 562941363355650 bytes of pixels, got 8", NULL);
}

static void idx_trailing_bytes(void **state)
{
    (void)state;
    /* extra bytes after the data are an error (torchvision's reader also
     * refuses them: its view() to the header's shape fails) */
    const char *p = em_test_tmp_path("x.idx");
    write_idx(p, false, 0x00000803, (const uint32_t[]){1, 2, 2}, 3, PIX, 5);
    idx_expect(p, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "1 bytes after the 4 bytes of data that the header announces", NULL);
}

static void idx_gzip(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("g.idx.gz"), *q = em_test_tmp_path("cut.idx.gz");
    write_idx(p, true, 0x00000803, (const uint32_t[]){2, 2, 2}, 3, PIX, 8);
    em_idx idx;
    assert_int_equal(em_idx_read(p, EM_IDX_MAGIC_IMAGES, &idx), EM_OK);
    assert_memory_equal(idx.data, PIX, 8);
    em_idx_free(&idx);
    size_t n;
    uint8_t *gz = read_whole(p, &n);
    /* cut inside the compressed data: the data are short */
    write_whole(q, gz, n / 2);
    idx_expect(q, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "truncated", "gzip");
    /* only the 8-byte trailer (CRC-32, length) missing: all data there, but unverified */
    write_whole(q, gz, n - 8);
    idx_expect(q, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "gzip stream ends before its end", "truncated");
    write_whole(q, gz, n - 1);
    idx_expect(q, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "gzip stream ends before its end", NULL);
    /* a flipped CRC byte */
    gz[n - 6] ^= 0xFF;
    write_whole(q, gz, n);
    idx_expect(q, EM_IDX_MAGIC_IMAGES, EM_ERR_FORMAT, "corrupt gzip stream", NULL);
    free(gz);
}

static void idx_pair_mismatch(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/pair", em_test_tmp_dir());
    mkdir(dir, 0755);
    char img[1100], lab[1100];
    snprintf(img, sizeof img, "%s/t10k-images-idx3-ubyte", dir);
    snprintf(lab, sizeof lab, "%s/t10k-labels-idx1-ubyte", dir);
    write_idx(img, false, 0x00000803, (const uint32_t[]){2, 2, 2}, 3, PIX, 8);
    write_idx(lab, false, 0x00000801, (const uint32_t[]){3}, 1, (const uint8_t[]){1, 2, 3}, 3);
    assert_null(em_mnist_open(dir, false));
    assert_int_equal(em_last_status(), EM_ERR_FORMAT);
    assert_msg_has("t10k-labels-idx1-ubyte has 3 labels but");
    assert_msg_has("t10k-images-idx3-ubyte has 2 images");
    /* labels given as images and images as labels: the magic says which is which */
    assert_null(em_mnist_open_files(lab, img));
    assert_int_equal(em_last_status(), EM_ERR_FORMAT);
    assert_msg_has("wrong magic number 0x00000801, expected 0x00000803");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(st_header_too_small),
        cmocka_unit_test(st_header_len_beyond_file),
        cmocka_unit_test(st_header_len_u64_max),
        cmocka_unit_test(st_header_len_above_limit),
        cmocka_unit_test(st_header_not_utf8),
        cmocka_unit_test(st_header_not_json),
        cmocka_unit_test(st_header_empty),
        cmocka_unit_test(st_header_not_object),
        cmocka_unit_test(st_header_trailing_nul),
        cmocka_unit_test(st_header_trailing_junk),
        cmocka_unit_test(st_duplicate_key),
        cmocka_unit_test(st_key_with_nul),
        cmocka_unit_test(st_metadata_value_not_string),
        cmocka_unit_test(st_metadata_not_object),
        cmocka_unit_test(st_entry_not_object),
        cmocka_unit_test(st_dtype_unknown),
        cmocka_unit_test(st_dtype_lowercase),
        cmocka_unit_test(st_dtype_missing),
        cmocka_unit_test(st_shape_missing),
        cmocka_unit_test(st_shape_not_list),
        cmocka_unit_test(st_offsets_missing),
        cmocka_unit_test(st_shape_negative),
        cmocka_unit_test(st_shape_float),
        cmocka_unit_test(st_offsets_three),
        cmocka_unit_test(st_offsets_negative),
        cmocka_unit_test(st_offset_above_u64),
        cmocka_unit_test(st_rank_9),
        cmocka_unit_test(st_offsets_end_before_begin),
        cmocka_unit_test(st_offsets_hole_at_start),
        cmocka_unit_test(st_offsets_hole_between),
        cmocka_unit_test(st_offsets_overlap),
        cmocka_unit_test(st_size_mismatch),
        cmocka_unit_test(st_shape_overflow),
        cmocka_unit_test(st_nbytes_overflow),
        cmocka_unit_test(st_dtype_f4_odd),
        cmocka_unit_test(st_buffer_trailing_bytes),
        cmocka_unit_test(st_buffer_truncated),
        cmocka_unit_test(st_accepted),
        cmocka_unit_test(st_unsupported_dtypes),
        cmocka_unit_test(st_cases_covered),
        cmocka_unit_test(st_python_file_bit_exact),
        cmocka_unit_test(st_writer_matches_reference),
        cmocka_unit_test(st_failed_load_changes_nothing),
        cmocka_unit_test(idx_truncated),
        cmocka_unit_test(idx_wrong_magic),
        cmocka_unit_test(idx_types),
        cmocka_unit_test(idx_zero_dims),
        cmocka_unit_test(idx_size_overflow),
        cmocka_unit_test(idx_trailing_bytes),
        cmocka_unit_test(idx_gzip),
        cmocka_unit_test(idx_pair_mismatch),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
