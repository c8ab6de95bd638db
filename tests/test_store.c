/* Tests of store/: SafeTensors read, write (atomic), load into tensors. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>


static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_raw(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A file from a header string and a data buffer (length prefix computed). */
static void write_st(const char *path, const char *json, const void *data, size_t n)
{
    size_t hl = strlen(json);
    uint8_t *b = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    if (n) memcpy(b + 8 + hl, data, n);
    write_raw(path, b, 8 + hl + n);
    free(b);
}

static int count_tmp_files(void)
{
    DIR *d = opendir(em_test_tmp_dir());
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* ---- round trip ----------------------------------------------------------------------- */

static void test_roundtrip(void **state)
{
    (void)state;
    em_scope_begin();
    const float f32[6] = {1.5f, -2, 3, 4, 5, 6.25f};
    const double f64[4] = {1e-300, -2.5, 3, 1e300};
    const int32_t i32[4] = {-1, 2, INT32_MAX, INT32_MIN};
    const int64_t i64[3] = {INT64_MIN, 0, INT64_MAX};
    const uint8_t u8[5] = {0, 1, 127, 128, 255};
    const uint8_t bl[4] = {1, 0, 0, 1};
    const float sc = 42.0f;
    em_tensor *t[9];
    t[0] = em_from_host(f32, SHAPE(2, 3), 2, EM_F32);
    t[1] = em_from_host(f64, SHAPE(4), 1, EM_F64);
    t[2] = em_from_host(i32, SHAPE(2, 2), 2, EM_I32);
    t[3] = em_from_host(i64, SHAPE(3), 1, EM_I64);
    t[4] = em_from_host(u8, SHAPE(5), 1, EM_U8);
    t[5] = em_from_host(bl, SHAPE(2, 2), 2, EM_BOOL);
    t[6] = em_scalar(sc, EM_F32);
    t[7] = em_zeros(SHAPE(0, 3), 2, EM_F32);
    t[8] = em_transpose(t[0], 0, 1); /* a view: stored in C order of its own shape [3, 2] */
    for (int i = 0; i < 9; i++)
        if (!t[i]) fail_msg("tensor %d: %s", i, em_last_error());
    const char *names[9] = {"fc1.weight", "d", "i", "l", "bytes", "mask", "scalar", "empty", "fc1.weight.T"};
    const em_st_kv meta[2] = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};
    const char *p = em_test_tmp_path("model.safetensors");
    if (em_safetensors_save(p, names, t, 9, meta, 2) != EM_OK) fail_msg("save: %s", em_last_error());
    assert_int_equal(count_tmp_files(), 0);

    size_t n;
    uint8_t *raw = read_file(p, &n);
    assert_non_null(raw);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | raw[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(raw[8], '{');
    size_t expect_data = 24 + 32 + 16 + 24 + 5 + 4 + 4 + 0 + 24;
    assert_int_equal(n, 8 + hl + expect_data); /* tensors back to back, nothing else */
    free(raw);

    em_st_file *f = em_safetensors_open(p);
    if (!f) fail_msg("open: %s", em_last_error());
    assert_int_equal(em_safetensors_count(f), 9);
    const em_st_tensor *e = em_safetensors_find(f, "fc1.weight");
    assert_non_null(e);
    assert_int_equal(e->dtype, EM_F32);
    assert_string_equal(e->st_dtype, "F32");
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->shape[0], 2);
    assert_int_equal(e->shape[1], 3);
    assert_int_equal(e->nbytes, 24);
    assert_memory_equal(e->data, f32, 24);
    e = em_safetensors_find(f, "d");
    assert_int_equal(e->dtype, EM_F64);
    assert_memory_equal(e->data, f64, 32);
    assert_int_equal((uintptr_t)e->data % 8, 0);
    e = em_safetensors_find(f, "i");
    assert_string_equal(e->st_dtype, "I32");
    assert_memory_equal(e->data, i32, 16);
    e = em_safetensors_find(f, "l");
    assert_string_equal(e->st_dtype, "I64");
    assert_memory_equal(e->data, i64, 24);
    e = em_safetensors_find(f, "bytes");
    assert_string_equal(e->st_dtype, "U8");
    assert_memory_equal(e->data, u8, 5);
    e = em_safetensors_find(f, "mask");
    assert_string_equal(e->st_dtype, "BOOL");
    assert_memory_equal(e->data, bl, 4);
    e = em_safetensors_find(f, "scalar");
    assert_int_equal(e->ndim, 0);
    assert_int_equal(e->numel, 1);
    assert_true(*(const float *)e->data == 42.0f);
    e = em_safetensors_find(f, "empty");
    assert_int_equal(e->ndim, 2);
    assert_int_equal(e->numel, 0);
    assert_int_equal(e->shape[0], 0);
    e = em_safetensors_find(f, "fc1.weight.T");
    assert_int_equal(e->shape[0], 3);
    assert_int_equal(e->shape[1], 2);
    const float tr[6] = {1.5f, 4, -2, 5, 3, 6.25f};
    assert_memory_equal(e->data, tr, 24);
    /* name order */
    for (size_t i = 1; i < em_safetensors_count(f); i++)
        assert_true(strcmp(em_safetensors_at(f, i - 1)->name, em_safetensors_at(f, i)->name) < 0);
    assert_null(em_safetensors_at(f, 9));
    /* metadata */
    assert_int_equal(em_safetensors_metadata_count(f), 2);
    assert_string_equal(em_safetensors_metadata(f, "format"), "pt");
    assert_string_equal(em_safetensors_metadata(f, "note"), "h\xc3\xa9llo \"quoted\"");
    assert_null(em_safetensors_metadata(f, "absent"));
    assert_string_equal(em_safetensors_metadata_at(f, 0)->key, "format");
    /* lookup errors */
    assert_null(em_safetensors_find(f, "nope"));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_msg_has("no tensor 'nope'");
    assert_msg_has(p);
    /* back to tensors */
    em_tensor *back = em_safetensors_tensor(f, "fc1.weight");
    em_test_assert_shape(back, 2, SHAPE(2, 3));
    em_test_assert_close(back, VALS(1.5, -2, 3, 4, 5, 6.25), 0, 0);
    back = em_safetensors_tensor(f, "l");
    assert_int_equal(em_tensor_dtype(back), EM_I64);
    em_safetensors_close(f);

    /* empty file (no tensors, no metadata) is valid */
    const char *p2 = em_test_tmp_path("empty.safetensors");
    assert_int_equal(em_safetensors_save(p2, NULL, NULL, 0, NULL, 0), EM_OK);
    f = em_safetensors_open(p2);
    assert_non_null(f);
    assert_int_equal(em_safetensors_count(f), 0);
    assert_int_equal(em_safetensors_metadata_count(f), 0);
    em_safetensors_close(f);
    em_scope_end();
}

/* ---- corrupt files ---------------------------------------------------------------------- */

static void expect_open_error(const char *path, em_status st, const char *m1, const char *m2)
{
    em_st_file *f = em_safetensors_open(path);
    if (f) {
        em_safetensors_close(f);
        fail_msg("%s: opened, expected an error containing '%s'", path, m1);
    }
    assert_int_equal(em_last_status(), st);
    assert_msg_has(path);
    if (m1) assert_msg_has(m1);
    if (m2) assert_msg_has(m2);
}

static void test_corrupt(void **state)
{
    (void)state;
    const char *p = em_test_tmp_path("bad.safetensors");
    uint8_t data[64] = {0};

    expect_open_error(em_test_tmp_path("missing.safetensors"), EM_ERR_IO, "cannot open", NULL);
    write_raw(p, "\x10\0\0", 3);
    expect_open_error(p, EM_ERR_FORMAT, "shorter than the 8-byte header length", NULL);
    /* header length beyond the file */
    write_raw(p, "\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
    expect_open_error(p, EM_ERR_FORMAT, "header length 255 beyond the end of the file (10 bytes)", NULL);
    write_raw(p, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    expect_open_error(p, EM_ERR_FORMAT, "above the limit of 100000000 bytes", NULL); /* the crate checks the limit first */
    /* header too large (but within the file) is refused before reading it: covered by the limit check */
    /* bad JSON */
    write_st(p, "{\"a\": {\"dtype\": \"F32\", ", data, 0);
    expect_open_error(p, EM_ERR_FORMAT, "header is not valid JSON", NULL);
    write_st(p, "[1, 2]", data, 0);
    expect_open_error(p, EM_ERR_FORMAT, "not an object", NULL);
    write_st(p, "{\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\": {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             data, 8);
    expect_open_error(p, EM_ERR_FORMAT, "duplicate", NULL);
    /* entry problems, each naming the tensor */
    write_st(p, "{\"w\": 3}", data, 0);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "not a JSON object");
    write_st(p, "{\"w\": {\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "unknown dtype \"F7\"");
    write_st(p, "{\"w\": {\"shape\":[1],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "dtype");
    write_st(p, "{\"w\": {\"dtype\":\"F32\",\"shape\":[1,-2],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "shape entry 1");
    write_st(p, "{\"w\": {\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", data, 4);
    expect_open_error(p, EM_ERR_UNSUPPORTED, "tensor 'w'", "rank 9 above Ember's limit"); /* a valid file Ember cannot hold */
    write_st(p, "{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", data, 8);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "data_offsets");
    write_st(p, "{\"w\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data, 8);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "bad data_offsets [8, 0]");
    /* shape / offsets mismatch */
    write_st(p, "{\"w\": {\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", data, 16);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12] hold 12");
    /* offsets out of range */
    write_st(p, "{\"w\": {\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", data, 8);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "beyond the 8-byte data buffer");
    /* overlapping */
    write_st(p, "{\"a\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\": {\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             data, 12);
    expect_open_error(p, EM_ERR_FORMAT, "'a' [0, 8] and 'b' [4, 12] overlap", NULL);
    /* metadata that is not strings */
    write_st(p, "{\"__metadata__\": {\"epoch\": 3}}", data, 0);
    expect_open_error(p, EM_ERR_FORMAT, "__metadata__ value of 'epoch' is not a string", NULL);

    /* truncated: a valid file cut short */
    em_scope_begin();
    em_tensor *t = em_ones(SHAPE(4, 4), 2, EM_F32);
    const char *names[1] = {"w"};
    const char *good = em_test_tmp_path("good.safetensors");
    assert_int_equal(em_safetensors_save(good, names, &t, 1, NULL, 0), EM_OK);
    size_t n;
    uint8_t *raw = read_file(good, &n);
    write_raw(p, raw, n - 3);
    expect_open_error(p, EM_ERR_FORMAT, "tensor 'w'", "file truncated?");
    write_raw(p, raw, 20); /* cut inside the header */
    expect_open_error(p, EM_ERR_FORMAT, "beyond the end of the file (20 bytes)", NULL);
    /* every prefix of a valid file fails cleanly, from memory */
    for (size_t k = 0; k < n; k++) {
        em_st_file *f = em_safetensors_open_memory(raw, k, "mem");
        assert_null(f);
        assert_true(em_last_status() == EM_ERR_FORMAT);
    }
    em_st_file *f = em_safetensors_open_memory(raw, n, NULL);
    assert_non_null(f);
    em_safetensors_close(f);
    free(raw);
    em_scope_end();

    /* unaligned data in a foreign file is handed out aligned */
    uint8_t buf[7] = {9, 8, 7, 0, 0, 0, 0};
    float v = 3.25f;
    memcpy(buf + 3, &v, 4);
    write_st(p, "{\"b\": {\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                "\"f\": {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[3,7]},"
                "\"z\": {\"dtype\":\"I16\",\"shape\":[0],\"data_offsets\":[3,3]}}",
             buf, 7);
    f = em_safetensors_open(p);
    if (!f) fail_msg("open: %s", em_last_error());
    const em_st_tensor *e = em_safetensors_find(f, "f");
    assert_int_equal((uintptr_t)e->data % 4, 0);
    assert_true(*(const float *)e->data == 3.25f);
    e = em_safetensors_find(f, "z");
    assert_int_equal(e->dtype, EM_DTYPE_COUNT);
    assert_string_equal(e->st_dtype, "I16");
    assert_null(em_safetensors_tensor(f, "z"));
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_safetensors_close(f);
}

/* ---- atomic save ---------------------------------------------------------------------- */

static void test_atomic_save(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = em_full(SHAPE(2, 2), 2, EM_F32, 1.0);
    em_tensor *b = em_full(SHAPE(1024), 1, EM_F64, 2.0);
    const char *p = em_test_tmp_path("ckpt.safetensors");
    const char *n1[1] = {"a"};
    assert_int_equal(em_safetensors_save(p, n1, &a, 1, NULL, 0), EM_OK);
    chmod(p, 0640);
    size_t n0;
    uint8_t *before = read_file(p, &n0);

    /* a NULL tensor: refused before touching the disk */
    em_tensor *bad[2] = {a, NULL};
    const char *n2[2] = {"a", "b"};
    assert_int_equal(em_safetensors_save(p, n2, bad, 2, NULL, 0), EM_ERR_INVALID);
    assert_msg_has("tensor 'b' is NULL");
    /* duplicate and reserved names */
    em_tensor *two[2] = {a, b};
    const char *dup[2] = {"x", "x"};
    assert_int_equal(em_safetensors_save(p, dup, two, 2, NULL, 0), EM_ERR_INVALID);
    assert_msg_has("duplicate tensor name 'x'");
    const char *res[1] = {"__metadata__"};
    assert_int_equal(em_safetensors_save(p, res, &a, 1, NULL, 0), EM_ERR_INVALID);
    /* invalid UTF-8 name */
    const char *utf[1] = {"bad\xff"};
    assert_int_equal(em_safetensors_save(p, utf, &a, 1, NULL, 0), EM_ERR_INVALID);
    assert_msg_has("UTF-8");
    /* a directory that does not exist */
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", em_test_tmp_dir());
    assert_int_equal(em_safetensors_save(nodir, n1, &a, 1, NULL, 0), EM_ERR_IO);
    assert_msg_has("cannot create temporary file");
    assert_msg_has(nodir);

    /* a failure in the middle of writing the data (file size limit: EFBIG) */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 512;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    em_status st = em_safetensors_save(p, n2, two, 2, NULL, 0);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(st, EM_ERR_IO);
    assert_msg_has("write error");

    /* after all these failures: the old file is intact and no temp file is left */
    size_t n1len;
    uint8_t *after = read_file(p, &n1len);
    assert_int_equal(n1len, n0);
    assert_memory_equal(after, before, n0);
    free(after);
    assert_int_equal(count_tmp_files(), 0);

    /* a successful save replaces it, keeping its permissions */
    assert_int_equal(em_safetensors_save(p, n2, two, 2, NULL, 0), EM_OK);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    em_st_file *f = em_safetensors_open(p);
    assert_non_null(f);
    assert_int_equal(em_safetensors_count(f), 2);
    assert_true(((const double *)em_safetensors_find(f, "b")->data)[1023] == 2.0);
    em_safetensors_close(f);
    assert_int_equal(count_tmp_files(), 0);
    free(before);
    em_scope_end();
}

/* ---- load into model tensors ------------------------------------------------------------ */

static void test_load_into(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *w = em_from_host((const float[]){1, 2, 3, 4, 5, 6}, SHAPE(2, 3), 2, EM_F32);
    em_tensor *bias = em_from_host((const int64_t[]){7, 8, 9}, SHAPE(3), 1, EM_I64);
    em_tensor *extra = em_zeros(SHAPE(1), 1, EM_F32);
    const char *p = em_test_tmp_path("model.safetensors");
    const char *names3[3] = {"fc1.weight", "fc1.bias", "extra"};
    em_tensor *src[3] = {w, bias, extra};
    assert_int_equal(em_safetensors_save(p, names3, src, 3, NULL, 0), EM_OK);

    em_tensor *mw = em_zeros(SHAPE(2, 3), 2, EM_F32);
    em_tensor *mb = em_zeros(SHAPE(3), 1, EM_I64);
    const char *names2[2] = {"fc1.weight", "fc1.bias"};
    em_tensor *dst[2] = {mw, mb};

    /* strict: the file's extra key is an error, nothing written */
    assert_int_equal(em_safetensors_load_into(p, names2, dst, 2, true), EM_ERR_FORMAT);
    assert_msg_has(p);
    assert_msg_has("1 unexpected key in the file (not in the model): 'extra'");
    em_test_assert_close(mw, VALS(0, 0, 0, 0, 0, 0), 0, 0);

    /* missing keys are listed */
    const char *names_m[3] = {"fc1.weight", "fc2.weight", "fc2.bias"};
    em_tensor *dst_m[3] = {mw, mw, mb};
    assert_int_equal(em_safetensors_load_into(p, names_m, dst_m, 3, false), EM_ERR_FORMAT);
    assert_msg_has("2 keys missing from the file: 'fc2.weight', 'fc2.bias'");

    /* shape mismatch */
    em_tensor *wrong = em_zeros(SHAPE(3, 3), 2, EM_F32);
    em_tensor *dst_s[2] = {wrong, mb};
    assert_int_equal(em_safetensors_load_into(p, names2, dst_s, 2, false), EM_ERR_SHAPE);
    char want[700];
    snprintf(want, sizeof want, "%s: key 'fc1.weight': shape [2, 3] in file, [3, 3] in model", p);
    assert_msg_has(want);
    /* dtype mismatch */
    em_tensor *wrong_dt = em_zeros(SHAPE(2, 3), 2, EM_F64);
    em_tensor *dst_d[2] = {wrong_dt, mb};
    assert_int_equal(em_safetensors_load_into(p, names2, dst_d, 2, false), EM_ERR_DTYPE);
    assert_msg_has("key 'fc1.weight': dtype F32 in file, F64 in model");
    em_test_assert_close(mb, VALS(0, 0, 0), 0, 0); /* untouched by the failures */

    /* non-strict load copies the values */
    if (em_safetensors_load_into(p, names2, dst, 2, false) != EM_OK) fail_msg("load: %s", em_last_error());
    em_test_assert_close(mw, VALS(1, 2, 3, 4, 5, 6), 0, 0);
    em_test_assert_close(mb, VALS(7, 8, 9), 0, 0);
    /* strict with every key */
    em_tensor *mx = em_ones(SHAPE(1), 1, EM_F32);
    em_tensor *dst3[3] = {mw, mb, mx};
    assert_int_equal(em_safetensors_load_into(p, names3, dst3, 3, true), EM_OK);
    em_test_assert_close(mx, VALS(0), 0, 0);
    /* into a view: a slice of a bigger tensor */
    em_tensor *big = em_zeros(SHAPE(2, 6), 2, EM_F32);
    em_tensor *view = em_slice(big, 1, 0, 6, 2);
    if (view) {
        em_tensor *dstv[1] = {view};
        assert_int_equal(em_safetensors_load_into(p, names2, dstv, 1, false), EM_OK);
        em_test_assert_close(big, VALS(1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0), 0, 0);
    }
    /* missing file */
    assert_int_equal(em_safetensors_load_into(em_test_tmp_path("absent.safetensors"), names2, dst, 2, false), EM_ERR_IO);
    em_scope_end();
}

/* Files written here are read by Python's safetensors, and the other way
 * round (skipped when python3 + safetensors + numpy are not installed). */
static void test_python_interop(void **state)
{
    (void)state;
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
        print_message("python3 safetensors/numpy not installed: skipped\n");
        skip();
    }
    em_scope_begin();
    em_tensor *t[3] = {em_from_host((const float[]){1, 2, 3, 4, 5, 6}, SHAPE(2, 3), 2, EM_F32),
                       em_from_host((const uint8_t[]){1, 2, 3}, SHAPE(3), 1, EM_U8),
                       em_from_host((const int64_t[]){-5}, SHAPE(1), 1, EM_I64)};
    const char *names[3] = {"w", "u", "i"};
    const em_st_kv meta[1] = {{"format", "np"}};
    const char *p = em_test_tmp_path("to_py.safetensors"), *q = em_test_tmp_path("from_py.safetensors");
    assert_int_equal(em_safetensors_save(p, names, t, 3, meta, 1), EM_OK);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c \"\n"
             "import numpy as np, safetensors.numpy as s\n"
             "from safetensors import safe_open\n"
             "d = s.load_file('%s')\n"
             "assert d['w'].dtype == np.float32 and d['w'].shape == (2, 3) and d['w'][1, 2] == 6, d\n"
             "assert list(d['u']) == [1, 2, 3] and d['i'][0] == -5\n"
             "with safe_open('%s', 'np') as f: assert f.metadata() == {'format': 'np'}\n"
             "s.save_file({'a': np.arange(6, dtype=np.float64).reshape(3, 2), 'b': np.array([True, False])},"
             " '%s', metadata={'k': 'v'})\n\"",
             p, p, q);
    assert_int_equal(system(cmd), 0);
    em_st_file *f = em_safetensors_open(q);
    if (!f) fail_msg("open: %s", em_last_error());
    em_tensor *a = em_safetensors_tensor(f, "a");
    em_test_assert_shape(a, 2, SHAPE(3, 2));
    em_test_assert_close(a, VALS(0, 1, 2, 3, 4, 5), 0, 0);
    assert_int_equal(em_safetensors_find(f, "b")->dtype, EM_BOOL);
    assert_string_equal(em_safetensors_metadata(f, "k"), "v");
    em_safetensors_close(f);
    em_scope_end();
}

/* Checkpoints hold module buffers (BatchNorm's running statistics) next to
 * the parameters, under the same "model." keys as PyTorch's state_dict. */
static const em_module_vtable BUFMOD_VT = {"BufMod", NULL, NULL};

static em_module *bufmod(double w, double rm)
{
    em_module *m = em_module_new(&BUFMOD_VT, NULL);
    em_module *child = em_module_new(&BUFMOD_VT, NULL);
    int64_t two = 2;
    em_tensor *p = em_full(&two, 1, EM_F32, w), *b = em_full(&two, 1, EM_F32, rm), *n = em_full(NULL, 0, EM_I64, 3);
    assert_int_equal(em_module_add_param(child, "weight", p), EM_OK);
    assert_int_equal(em_module_add_buffer(child, "running_mean", b), EM_OK);
    assert_int_equal(em_module_add_buffer(child, "num_batches_tracked", n), EM_OK);
    assert_int_equal(em_module_add_child(m, "1", child), EM_OK);
    em_tensor_release(p);
    em_tensor_release(b);
    em_tensor_release(n);
    return m;
}

static void test_checkpoint_buffers(void **state)
{
    (void)state;
    const char *path = em_test_tmp_path("bufs.safetensors");
    em_module *a = bufmod(1.5, 0.25);
    assert_int_equal(em_checkpoint_save(path, a, NULL, NULL, NULL, NULL, 0), EM_OK);
    em_st_file *f = em_safetensors_open(path);
    assert_non_null(f);
    assert_int_equal(em_safetensors_count(f), 3);
    const char *keys[3] = {"model.1.weight", "model.1.running_mean", "model.1.num_batches_tracked"};
    for (int i = 0; i < 3; i++) {
        bool found = false;
        for (int j = 0; j < 3; j++) found |= !strcmp(em_safetensors_at(f, j)->name, keys[i]);
        if (!found) fail_msg("checkpoint lacks %s", keys[i]);
    }
    em_safetensors_close(f);
    em_module *b = bufmod(0.0, 9.0);
    assert_int_equal(em_checkpoint_load(path, b, NULL, NULL, NULL), EM_OK);
    float v[2];
    int64_t nbt = 0;
    assert_int_equal(em_to_host(em_module_get_buffer(b, "1.running_mean"), v, sizeof v), EM_OK);
    assert_true(v[0] == 0.25f && v[1] == 0.25f);
    assert_int_equal(em_to_host(em_module_get_param(b, "1.weight"), v, sizeof v), EM_OK);
    assert_true(v[0] == 1.5f);
    assert_int_equal(em_to_host(em_module_get_buffer(b, "1.num_batches_tracked"), &nbt, sizeof nbt), EM_OK);
    assert_int_equal(nbt, 3);
    /* a model without those buffers does not load it (extra key), and vice versa */
    em_module *c = em_module_new(&BUFMOD_VT, NULL), *cc = em_module_new(&BUFMOD_VT, NULL);
    int64_t two = 2;
    em_tensor *p = em_zeros(&two, 1, EM_F32);
    assert_int_equal(em_module_add_param(cc, "weight", p), EM_OK);
    em_tensor_release(p);
    assert_int_equal(em_module_add_child(c, "1", cc), EM_OK);
    assert_int_equal(em_checkpoint_load(path, c, NULL, NULL, NULL), EM_ERR_FORMAT);
    const char *path2 = em_test_tmp_path("nobufs.safetensors");
    assert_int_equal(em_checkpoint_save(path2, c, NULL, NULL, NULL, NULL, 0), EM_OK);
    assert_true(em_checkpoint_load(path2, b, NULL, NULL, NULL) < 0);
    em_module_free(a);
    em_module_free(b);
    em_module_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),   cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_atomic_save), cmocka_unit_test(test_load_into),
        cmocka_unit_test(test_python_interop),    cmocka_unit_test(test_checkpoint_buffers),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
