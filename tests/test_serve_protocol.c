/* The KServe v2 / Open Inference Protocol codec of `ember serve` (serve/protocol.c, issue #18):
 *   - datatype names and sizes;
 *   - the protocol docs' examples; every datatype in JSON (with its range
 *     limits) and in binary; flat and nested data;
 *   - round trips decode -> encode -> decode with JSON and binary outputs,
 *     every FP16 and BF16 value and random FP32 / FP64 bits included;
 *   - the response's fields, header length and binary layout; null for NaN / inf;
 *   - the request's id, parameters (binary_data_output, timeout) and outputs;
 *   - the limits (inputs, rank, elements per tensor and together, overflow);
 *   - the binary section's accounting, byte for byte;
 *   - every error path: -1, a zeroed request and a one-line message with the
 *     expected words. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "serve/protocol.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- helpers ------------------------------------------------------------------- */

/* A body of JSON header + binary bytes (malloc'd). */
static char *mk_body(const char *json, const void *bin, size_t nbin, size_t *len)
{
    size_t hl = strlen(json);
    char *b = malloc(hl + nbin + 1);
    assert_non_null(b);
    memcpy(b, json, hl);
    if (nbin) memcpy(b + hl, bin, nbin);
    *len = hl + nbin;
    return b;
}

static void decode_ok_lim(const char *body, size_t len, int64_t hl, const ems_limits *lim, ems_request *r)
{
    char err[256];
    if (ems_request_decode(body, len, hl, lim, r, err, sizeof err)) fail_msg("decode failed: %s", err);
}

static void decode_ok(const char *json, ems_request *r) { decode_ok_lim(json, strlen(json), -1, NULL, r); }

/* Decoding fails with a one-line message containing @p want, and leaves r zeroed. */
static void expect_bad_lim(const char *body, size_t len, int64_t hl, const ems_limits *lim, const char *want)
{
    ems_request r;
    memset(&r, 0xab, sizeof r);
    char err[256];
    int rc = ems_request_decode(body, len, hl, lim, &r, err, sizeof err);
    if (rc != -1) fail_msg("decode of '%.200s' returned %d, want -1 (%s)", body ? body : "(null)", rc, want);
    if (!strstr(err, want)) fail_msg("decode of '%.200s': message '%s' lacks '%s'", body ? body : "(null)", err, want);
    assert_null(strchr(err, '\n'));
    ems_request zero;
    memset(&zero, 0, sizeof zero);
    assert_memory_equal(&r, &zero, sizeof r);
}

static void expect_bad(const char *json, const char *want) { expect_bad_lim(json, strlen(json), -1, NULL, want); }

/* ---- datatypes --------------------------------------------------------------- */

static void test_dtypes(void **state)
{
    (void)state;
    static const char *names[] = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                  "INT32", "INT64", "FP16", "BF16", "FP32", "FP64", "BYTES"};
    static const size_t sizes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8, 0};
    assert_int_equal(NELEM(names), EMS_DTYPE_COUNT);
    for (int d = 0; d < EMS_DTYPE_COUNT; d++) {
        assert_string_equal(ems_dtype_name((ems_dtype)d), names[d]);
        assert_int_equal(ems_dtype_size((ems_dtype)d), sizes[d]);
        ems_dtype p = EMS_DTYPE_COUNT;
        assert_int_equal(ems_dtype_parse(names[d], &p), 0);
        assert_int_equal(p, d);
    }
    ems_dtype p;
    assert_int_equal(ems_dtype_parse("fp32", &p), -1);
    assert_int_equal(ems_dtype_parse("FP32 ", &p), -1);
    assert_int_equal(ems_dtype_parse("", &p), -1);
    assert_int_equal(ems_dtype_parse(NULL, &p), -1);
    assert_string_equal(ems_dtype_name(EMS_DTYPE_COUNT), "?");
    assert_string_equal(ems_dtype_name((ems_dtype)-1), "?");
    assert_int_equal(ems_dtype_size(EMS_DTYPE_COUNT), 0);
    ems_limits l = ems_limits_default();
    assert_int_equal(l.max_inputs, 64);
    assert_int_equal(l.max_rank, EMS_MAX_RANK);
    assert_int_equal(l.max_elements, (int64_t)1 << 26);
}

/* ---- decoding ------------------------------------------------------------------ */

/* The example of the KServe v2 docs (inference request, JSON). */
static void test_kserve_example(void **state)
{
    (void)state;
    ems_request r;
    decode_ok("{\"inputs\":[{\"name\":\"input0\",\"shape\":[2,2],\"datatype\":\"UINT32\",\"data\":[1,2,3,4]}]}", &r);
    assert_int_equal(r.ninputs, 1);
    const ems_tensor *t = &r.inputs[0];
    assert_string_equal(t->name, "input0");
    assert_int_equal(t->dtype, EMS_UINT32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 2);
    assert_int_equal(t->numel, 4);
    assert_int_equal(t->nbytes, 16);
    const uint32_t want[] = {1, 2, 3, 4};
    assert_memory_equal(t->data, want, sizeof want);
    assert_false(r.has_id);
    assert_int_equal(r.noutputs, 0);
    assert_null(r.outputs);
    assert_false(r.binary_data_output);
    assert_int_equal(r.timeout_us, 0);
    ems_request_free(&r);
    assert_null(r.inputs);
    assert_int_equal(r.ninputs, 0);
    ems_request_free(&r); /* twice is harmless */
    ems_request_free(NULL);

    /* the docs' fuller example (its input1 data, ["true"], is a string there: real booleans here) */
    decode_ok("{\"id\":\"42\",\"inputs\":[{\"name\":\"input0\",\"shape\":[2,2],\"datatype\":\"UINT32\",\"data\":[1,2,3,4]},"
              "{\"name\":\"input1\",\"shape\":[3],\"datatype\":\"BOOL\",\"data\":[true,false,true]}],"
              "\"outputs\":[{\"name\":\"output0\"}]}",
              &r);
    assert_true(r.has_id);
    assert_string_equal(r.id, "42");
    assert_int_equal(r.ninputs, 2);
    const uint8_t bools[] = {1, 0, 1};
    assert_memory_equal(r.inputs[1].data, bools, 3);
    assert_int_equal(r.noutputs, 1);
    assert_string_equal(r.outputs[0].name, "output0");
    assert_int_equal(r.outputs[0].binary, -1);
    ems_request_free(&r);
    expect_bad("{\"id\":\"42\",\"inputs\":[{\"name\":\"input1\",\"shape\":[3],\"datatype\":\"BOOL\",\"data\":[\"true\"]}]}",
               "shape [3] has 3 elements but data has 1 values");
}

/* The docs' example has input1 [3] with [true]: a count error that names the input. */
static void test_count_message(void **state)
{
    (void)state;
    ems_request r;
    char err[256];
    const char *j = "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[1,2,3,4,5]}]}";
    assert_int_equal(ems_request_decode(j, strlen(j), -1, NULL, &r, err, sizeof err), -1);
    assert_string_equal(err, "input 'x': shape [2,3] has 6 elements but data has 5 values");
    expect_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[[1,2,3],[4,5,6],[7]]}]}",
               "shape [2,3] has 6 elements but data has more than 6 values");
    expect_bad("{\"inputs\":[{\"name\":\"input1\",\"shape\":[3],\"datatype\":\"BOOL\",\"data\":[true]}]}",
               "input 'input1': shape [3] has 3 elements but data has 1 values");
    /* a small err buffer truncates, never overflows */
    char small[8];
    assert_int_equal(ems_request_decode(j, strlen(j), -1, NULL, &r, small, sizeof small), -1);
    assert_string_equal(small, "input '");
    assert_int_equal(ems_request_decode(j, strlen(j), -1, NULL, &r, NULL, 0), -1);
}

static void test_every_dtype_json(void **state)
{
    (void)state;
    ems_request r;
    decode_ok("{\"inputs\":["
              "{\"name\":\"b\",\"shape\":[3],\"datatype\":\"BOOL\",\"data\":[true,false,true]},"
              "{\"name\":\"u8\",\"shape\":[2],\"datatype\":\"UINT8\",\"data\":[0,255]},"
              "{\"name\":\"u16\",\"shape\":[2],\"datatype\":\"UINT16\",\"data\":[0,65535]},"
              "{\"name\":\"u32\",\"shape\":[2],\"datatype\":\"UINT32\",\"data\":[0,4294967295]},"
              "{\"name\":\"u64\",\"shape\":[2],\"datatype\":\"UINT64\",\"data\":[0,9223372036854775807]},"
              "{\"name\":\"i8\",\"shape\":[2],\"datatype\":\"INT8\",\"data\":[-128,127]},"
              "{\"name\":\"i16\",\"shape\":[2],\"datatype\":\"INT16\",\"data\":[-32768,32767]},"
              "{\"name\":\"i32\",\"shape\":[2],\"datatype\":\"INT32\",\"data\":[-2147483648,2147483647]},"
              "{\"name\":\"i64\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[-9223372036854775808,9223372036854775807]},"
              "{\"name\":\"f16\",\"shape\":[5],\"datatype\":\"FP16\",\"data\":[1.5,-2,65504,0.1,1e6]},"
              "{\"name\":\"bf16\",\"shape\":[4],\"datatype\":\"BF16\",\"data\":[1.5,-2,0.1,3]},"
              "{\"name\":\"f32\",\"shape\":[3],\"datatype\":\"FP32\",\"data\":[0.1,-3,1e30]},"
              "{\"name\":\"f64\",\"shape\":[3],\"datatype\":\"FP64\",\"data\":[0.1,1e300,7]}]}",
              &r);
    assert_int_equal(r.ninputs, 13);
    const uint8_t b[] = {1, 0, 1};
    const uint8_t u8[] = {0, 255};
    const uint16_t u16[] = {0, 65535};
    const uint32_t u32[] = {0, 4294967295u};
    const uint64_t u64[] = {0, 9223372036854775807ull};
    const int8_t i8[] = {-128, 127};
    const int16_t i16[] = {-32768, 32767};
    const int32_t i32[] = {INT32_MIN, INT32_MAX};
    const int64_t i64[] = {INT64_MIN, INT64_MAX};
    const uint16_t f16[] = {0x3e00, 0xc000, 0x7bff, 0x2e66, 0x7c00}; /* 1e6 rounds to infinity */
    const uint16_t bf16[] = {0x3fc0, 0xc000, 0x3dcd, 0x4040};
    const float f32[] = {0.1f, -3.0f, 1e30f};
    const double f64[] = {0.1, 1e300, 7.0};
    const void *want[] = {b, u8, u16, u32, u64, i8, i16, i32, i64, f16, bf16, f32, f64};
    const size_t wsize[] = {sizeof b,   sizeof u8,  sizeof u16, sizeof u32,  sizeof u64, sizeof i8, sizeof i16,
                            sizeof i32, sizeof i64, sizeof f16, sizeof bf16, sizeof f32, sizeof f64};
    for (int k = 0; k < 13; k++) {
        assert_int_equal(r.inputs[k].dtype, k);
        assert_int_equal(r.inputs[k].nbytes, wsize[k]);
        assert_memory_equal(r.inputs[k].data, want[k], wsize[k]);
    }
    ems_request_free(&r);

    /* one past each end of every integer type */
    static const struct {
        const char *dt, *lo, *hi;
    } ranges[] = {
        {"UINT8", "-1", "256"},           {"UINT16", "-1", "65536"},          {"UINT32", "-1", "4294967296"},
        {"UINT64", "-1", NULL},           {"INT8", "-129", "128"},            {"INT16", "-32769", "32768"},
        {"INT32", "-2147483649", "2147483648"},
    };
    for (int k = 0; k < NELEM(ranges); k++)
        for (int side = 0; side < 2; side++) {
            const char *v = side ? ranges[k].hi : ranges[k].lo;
            if (!v) continue;
            char j[256], want_msg[128];
            snprintf(j, sizeof j, "{\"inputs\":[{\"name\":\"v\",\"shape\":[2],\"datatype\":\"%s\",\"data\":[0,%s]}]}", ranges[k].dt,
                     v);
            snprintf(want_msg, sizeof want_msg, "input 'v': data[1] is %s, out of range for %s", v, ranges[k].dt);
            expect_bad(j, want_msg);
        }
    /* FP types take integers and reals; 2.0 is no integer for an integer type */
    decode_ok("{\"inputs\":[{\"name\":\"v\",\"shape\":[2],\"datatype\":\"FP64\",\"data\":[2,-9007199254740993]}]}", &r);
    assert_true(((double *)r.inputs[0].data)[0] == 2.0);
    ems_request_free(&r);
    expect_bad("{\"inputs\":[{\"name\":\"v\",\"shape\":[1],\"datatype\":\"INT64\",\"data\":[2.0]}]}", "is not an integer");
}

static void test_every_dtype_binary(void **state)
{
    (void)state;
    for (int d = 0; d < EMS_DTYPE_COUNT; d++) {
        if (d == EMS_BYTES) continue;
        size_t es = ems_dtype_size((ems_dtype)d), nb = 6 * es;
        uint8_t bytes[48];
        for (size_t i = 0; i < nb; i++) bytes[i] = d == EMS_BOOL ? (uint8_t)(i & 1) : (uint8_t)(37 * i + 11 * d + 1);
        char j[256];
        snprintf(j, sizeof j,
                 "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,3],\"datatype\":\"%s\",\"parameters\":{\"binary_data_size\":%zu}}]}",
                 ems_dtype_name((ems_dtype)d), nb);
        size_t len;
        char *body = mk_body(j, bytes, nb, &len);
        ems_request r;
        decode_ok_lim(body, len, (int64_t)strlen(j), NULL, &r);
        assert_int_equal(r.inputs[0].dtype, d);
        assert_int_equal(r.inputs[0].numel, 6);
        assert_int_equal(r.inputs[0].nbytes, nb);
        assert_memory_equal(r.inputs[0].data, bytes, nb);
        ems_request_free(&r);
        free(body);
    }
}

static void test_nested_and_flat(void **state)
{
    (void)state;
    ems_request r;
    const int32_t want[] = {1, 2, 3, 4, 5, 6};
    const char *forms[] = {"[1,2,3,4,5,6]", "[[1,2,3],[4,5,6]]", "[[[1],[2],[3]],[[4],[5],[6]]]", "[[1,[2,[3]]],[],4,[[5,6]]]"};
    for (int k = 0; k < NELEM(forms); k++) {
        char j[256];
        snprintf(j, sizeof j, "{\"inputs\":[{\"name\":\"n\",\"shape\":[2,3],\"datatype\":\"INT32\",\"data\":%s}]}", forms[k]);
        decode_ok(j, &r);
        assert_memory_equal(r.inputs[0].data, want, sizeof want);
        ems_request_free(&r);
    }
    /* scalars, empty tensors */
    decode_ok("{\"inputs\":[{\"name\":\"s\",\"shape\":[],\"datatype\":\"FP32\",\"data\":[2.5]},"
              "{\"name\":\"e\",\"shape\":[0,4],\"datatype\":\"FP32\",\"data\":[]},"
              "{\"name\":\"e2\",\"shape\":[3,0],\"datatype\":\"INT8\",\"data\":[[],[],[]]}]}",
              &r);
    assert_int_equal(r.inputs[0].ndim, 0);
    assert_int_equal(r.inputs[0].numel, 1);
    assert_true(*(float *)r.inputs[0].data == 2.5f);
    assert_int_equal(r.inputs[1].numel, 0);
    assert_null(r.inputs[1].data);
    assert_int_equal(r.inputs[1].nbytes, 0);
    assert_int_equal(r.inputs[2].numel, 0);
    ems_request_free(&r);
    /* nesting within the cap passes, beyond it fails */
    char deep[512], j[700];
    int depth = 64, k = 0;
    for (int i = 0; i < depth; i++) deep[k++] = '[';
    deep[k++] = '1';
    for (int i = 0; i < depth; i++) deep[k++] = ']';
    deep[k] = '\0';
    snprintf(j, sizeof j, "{\"inputs\":[{\"name\":\"d\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":%s}]}", deep);
    decode_ok(j, &r);
    ems_request_free(&r);
    snprintf(j, sizeof j, "{\"inputs\":[{\"name\":\"d\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[%s]}]}", deep);
    expect_bad(j, "input 'd': data is nested deeper than 64 levels");
}

static void test_request_fields(void **state)
{
    (void)state;
    ems_request r;
    decode_ok("{\"id\":\"req-1\",\"parameters\":{\"binary_data_output\":true,\"timeout\":5000,\"other\":\"ignored\"},"
              "\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}],"
              "\"outputs\":[{\"name\":\"out0\",\"parameters\":{\"binary_data\":true}},{\"name\":\"out1\"},"
              "{\"name\":\"out2\",\"parameters\":{\"binary_data\":false}},{\"name\":\"out3\",\"parameters\":{}}]}",
              &r);
    assert_true(r.has_id);
    assert_string_equal(r.id, "req-1");
    assert_true(r.binary_data_output);
    assert_int_equal(r.timeout_us, 5000);
    assert_int_equal(r.noutputs, 4);
    assert_string_equal(r.outputs[0].name, "out0");
    assert_int_equal(r.outputs[0].binary, 1);
    assert_string_equal(r.outputs[1].name, "out1");
    assert_int_equal(r.outputs[1].binary, -1);
    assert_int_equal(r.outputs[2].binary, 0);
    assert_int_equal(r.outputs[3].binary, -1);
    ems_request_free(&r);
    decode_ok("{\"id\":\"\",\"parameters\":{\"binary_data_output\":false,\"timeout\":0},\"outputs\":[],"
              "\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
              &r);
    assert_true(r.has_id);
    assert_string_equal(r.id, "");
    assert_false(r.binary_data_output);
    assert_int_equal(r.noutputs, 0);
    ems_request_free(&r);
    /* the longest id and name */
    char id[EMS_ID_MAX], name[EMS_NAME_MAX], j[1024];
    memset(id, 'i', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(j, sizeof j, "{\"id\":\"%s\",\"inputs\":[{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", id,
             name);
    decode_ok(j, &r);
    assert_string_equal(r.id, id);
    assert_string_equal(r.inputs[0].name, name);
    ems_request_free(&r);
    /* UTF-8 names are kept byte for byte */
    decode_ok("{\"inputs\":[{\"name\":\"\xc3\xa9t\\u00e9\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", &r);
    assert_string_equal(r.inputs[0].name, "\xc3\xa9t\xc3\xa9");
    ems_request_free(&r);
}

/* ---- limits ---------------------------------------------------------------------- */

static void test_limits(void **state)
{
    (void)state;
    char *j = malloc(65 * 80 + 64);
    assert_non_null(j);
    for (int n = 64; n <= 65; n++) {
        size_t k = (size_t)sprintf(j, "{\"inputs\":[");
        for (int i = 0; i < n; i++)
            k += (size_t)sprintf(j + k, "%s{\"name\":\"in%d\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}", i ? "," : "", i);
        sprintf(j + k, "]}");
        if (n == 64) {
            ems_request r;
            decode_ok(j, &r);
            assert_int_equal(r.ninputs, 64);
            ems_request_free(&r);
        } else {
            expect_bad(j, "the request has 65 inputs, the most allowed is 64");
        }
    }
    free(j);
    ems_limits lim = ems_limits_default();
    lim.max_inputs = 1;
    const char *two = "{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]},"
                      "{\"name\":\"b\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]}";
    expect_bad_lim(two, strlen(two), -1, &lim, "2 inputs, the most allowed is 1");

    /* rank */
    expect_bad("{\"inputs\":[{\"name\":\"r\",\"shape\":[1,1,1,1,1,1,1,1,1],\"datatype\":\"INT8\",\"data\":[1]}]}",
               "input 'r': shape has rank 9, the largest allowed is 8");
    ems_request r;
    decode_ok("{\"inputs\":[{\"name\":\"r\",\"shape\":[1,1,1,1,1,1,1,2],\"datatype\":\"INT8\",\"data\":[1,2]}]}", &r);
    assert_int_equal(r.inputs[0].ndim, 8);
    ems_request_free(&r);
    lim = ems_limits_default();
    lim.max_rank = 2;
    const char *r3 = "{\"inputs\":[{\"name\":\"r\",\"shape\":[1,1,1],\"datatype\":\"INT8\",\"data\":[1]}]}";
    expect_bad_lim(r3, strlen(r3), -1, &lim, "rank 3, the largest allowed is 2");
    lim.max_rank = 100; /* clamped to EMS_MAX_RANK */
    const char *r9 = "{\"inputs\":[{\"name\":\"r\",\"shape\":[1,1,1,1,1,1,1,1,1],\"datatype\":\"INT8\",\"data\":[1]}]}";
    expect_bad_lim(r9, strlen(r9), -1, &lim, "the largest allowed is 8");

    /* elements per tensor: 8193 * 8192 > 1 << 26, caught before any data is looked at or allocated */
    expect_bad("{\"inputs\":[{\"name\":\"big\",\"shape\":[8193,8192],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":0}}]}",
               "input 'big': shape [8193,8192] has more than the limit of 67108864 elements");
    expect_bad("{\"inputs\":[{\"name\":\"big\",\"shape\":[67108865],\"datatype\":\"FP32\",\"data\":[]}]}",
               "shape[0] is 67108865, more than the limit of 67108864 elements");
    /* overflow of the product with a huge limit */
    lim = ems_limits_default();
    lim.max_elements = INT64_MAX;
    const char *ov =
        "{\"inputs\":[{\"name\":\"ov\",\"shape\":[4294967296,4294967296,4294967296],\"datatype\":\"INT8\",\"data\":[]}]}";
    expect_bad_lim(ov, strlen(ov), -1, &lim, "has more than the limit of 9223372036854775807 elements");
    /* elements within that limit whose bytes are not addressable (2^62 FP32) */
    const char *nb = "{\"inputs\":[{\"name\":\"nb\",\"shape\":[4611686018427387904],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":0}}]}";
    expect_bad_lim(nb, strlen(nb), -1, &lim, "input 'nb': shape [4611686018427387904] of FP32 takes more bytes than can be addressed");
    /* binary sizes that overflow together: four FP64 inputs of 2^59 elements, 2^62 bytes each */
    char ovj[1024];
    size_t k = (size_t)sprintf(ovj, "{\"inputs\":[");
    for (int i = 0; i < 4; i++)
        k += (size_t)sprintf(ovj + k,
                             "%s{\"name\":\"p%d\",\"shape\":[576460752303423488],\"datatype\":\"FP64\","
                             "\"parameters\":{\"binary_data_size\":4611686018427387904}}",
                             i ? "," : "", i);
    sprintf(ovj + k, "]}");
    expect_bad_lim(ovj, strlen(ovj), (int64_t)strlen(ovj), &lim, "input 'p3': the binary inputs take more bytes than can be addressed");
    /* a zero dimension makes the tensor empty whatever the others say */
    const char *z = "{\"inputs\":[{\"name\":\"z\",\"shape\":[4294967296,0,4294967296],\"datatype\":\"INT8\",\"data\":[]}]}";
    decode_ok_lim(z, strlen(z), -1, &lim, &r);
    assert_int_equal(r.inputs[0].numel, 0);
    ems_request_free(&r);

    /* elements of all inputs together */
    lim = ems_limits_default();
    lim.max_elements = 10;
    const char *tot = "{\"inputs\":[{\"name\":\"a\",\"shape\":[6],\"datatype\":\"INT8\",\"data\":[1,2,3,4,5,6]},"
                      "{\"name\":\"b\",\"shape\":[5],\"datatype\":\"INT8\",\"data\":[1,2,3,4,5]}]}";
    expect_bad_lim(tot, strlen(tot), -1, &lim, "input 'b': the inputs have more than 10 elements together");
    const char *tot_ok = "{\"inputs\":[{\"name\":\"a\",\"shape\":[6],\"datatype\":\"INT8\",\"data\":[1,2,3,4,5,6]},"
                         "{\"name\":\"b\",\"shape\":[4],\"datatype\":\"INT8\",\"data\":[1,2,3,4]}]}";
    decode_ok_lim(tot_ok, strlen(tot_ok), -1, &lim, &r);
    ems_request_free(&r);
    const char *one = "{\"inputs\":[{\"name\":\"a\",\"shape\":[11],\"datatype\":\"INT8\",\"data\":[]}]}";
    expect_bad_lim(one, strlen(one), -1, &lim, "shape[0] is 11, more than the limit of 10 elements");
}

/* ---- the binary section ------------------------------------------------------------ */

static void test_binary_accounting(void **state)
{
    (void)state;
    /* two binary inputs around a JSON one: their bytes follow the header in input order */
    const char *j = "{\"inputs\":[{\"name\":\"a\",\"shape\":[2],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":8}},"
                    "{\"name\":\"j\",\"shape\":[1],\"datatype\":\"INT16\",\"data\":[-7]},"
                    "{\"name\":\"b\",\"shape\":[3],\"datatype\":\"UINT8\",\"parameters\":{\"binary_data_size\":3}},"
                    "{\"name\":\"e\",\"shape\":[0],\"datatype\":\"FP64\",\"parameters\":{\"binary_data_size\":0}}]}";
    const float a[2] = {1.25f, -8.0f};
    uint8_t bin[12];
    memcpy(bin, a, 8);
    bin[8] = 9, bin[9] = 8, bin[10] = 7, bin[11] = 0xee;
    size_t hl = strlen(j), len;
    char *body = mk_body(j, bin, 11, &len);
    ems_request r;
    decode_ok_lim(body, len, (int64_t)hl, NULL, &r);
    assert_memory_equal(r.inputs[0].data, a, 8);
    assert_int_equal(*(int16_t *)r.inputs[1].data, -7);
    assert_memory_equal(r.inputs[2].data, bin + 8, 3);
    assert_int_equal(r.inputs[3].nbytes, 0);
    ems_request_free(&r);
    /* one byte too few, one too many */
    expect_bad_lim(body, len - 1, (int64_t)hl, NULL, "the binary inputs take 11 bytes but the body has 10 bytes after the");
    free(body);
    body = mk_body(j, bin, 12, &len);
    expect_bad_lim(body, len, (int64_t)hl, NULL, "the binary inputs take 11 bytes but the body has 12 bytes after the");
    /* the header length must point at the JSON's end exactly */
    expect_bad_lim(body, len, (int64_t)hl - 1, NULL, "not valid JSON");
    expect_bad_lim(body, len, (int64_t)hl + 1, NULL, "not valid JSON");
    /* bytes without a header length are trailing garbage to the JSON parser */
    expect_bad_lim(body, len, -1, NULL, "not valid JSON");
    free(body);
    /* a header length with no binary inputs: the binary section must be empty */
    const char *pj = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}";
    body = mk_body(pj, "zz", 2, &len);
    expect_bad_lim(body, len, (int64_t)strlen(pj), NULL, "the binary inputs take 0 bytes but the body has 2 bytes");
    decode_ok_lim(body, len - 2, (int64_t)strlen(pj), NULL, &r);
    ems_request_free(&r);
    free(body);
    /* binary inputs without Inference-Header-Content-Length */
    const char *bj = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]},"
                     "{\"name\":\"y\",\"shape\":[1],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":4}}]}";
    expect_bad(bj, "input 'y' has binary_data_size but the request has no Inference-Header-Content-Length");
    /* zero-size binary input needs no header length */
    decode_ok("{\"inputs\":[{\"name\":\"x\",\"shape\":[0],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":0}}]}", &r);
    ems_request_free(&r);
    /* binary_data_size must match the shape */
    const char *mj = "{\"inputs\":[{\"name\":\"m\",\"shape\":[2,2],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":12}}]}";
    body = mk_body(mj, bin, 12, &len);
    expect_bad_lim(body, len, (int64_t)strlen(mj), NULL, "input 'm': binary_data_size is 12 but shape [2,2] of FP32 takes 16 bytes");
    free(body);
    /* BOOL bytes are 0 or 1 */
    const char *bb = "{\"inputs\":[{\"name\":\"q\",\"shape\":[3],\"datatype\":\"BOOL\",\"parameters\":{\"binary_data_size\":3}}]}";
    const uint8_t bools[3] = {1, 0, 2};
    body = mk_body(bb, bools, 3, &len);
    expect_bad_lim(body, len, (int64_t)strlen(bb), NULL, "input 'q': binary BOOL element 2 is 2, not 0 or 1");
    free(body);
    /* header lengths that cannot be */
    expect_bad_lim(pj, strlen(pj), -2, NULL, "Inference-Header-Content-Length is negative (-2)");
    expect_bad_lim(pj, strlen(pj), INT64_MIN, NULL, "is negative");
    expect_bad_lim(pj, strlen(pj), (int64_t)strlen(pj) + 1, NULL, "is larger than the body");
    expect_bad_lim(pj, strlen(pj), INT64_MAX, NULL, "is larger than the body");
    expect_bad_lim(pj, strlen(pj), 0, NULL, "the JSON header has 0 bytes");
    expect_bad_lim("", 0, -1, NULL, "the JSON header has 0 bytes");
    expect_bad_lim(NULL, 5, -1, NULL, "no request body");
}

/* ---- every other bad request ---------------------------------------------------------- */

static void test_bad_requests(void **state)
{
    (void)state;
#define IN(x) "{\"inputs\":[" x "]}"
#define OKIN "{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}"
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{", "the request is not valid JSON"},
        {"{\"inputs\":[]", "the request is not valid JSON"},
        {"nonsense", "the request is not valid JSON"},
        {"[1,2]", "the request is not a JSON object"},
        {"{\"inputs\":[" OKIN "],\"inputs\":[" OKIN "]}", "duplicate object key"},
        {"{\"inputs\":[" OKIN "]} {}", "the request is not valid JSON"},
        {"{}", "the request has no inputs"},
        {"{\"inputs\":{}}", "inputs is not an array"},
        {"{\"inputs\":[]}", "the request has no inputs (empty array)"},
        {IN("3"), "input 0 is not an object"},
        {IN(OKIN ",{\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}"), "input 1 has no name"},
        {IN("{\"name\":5,\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}"), "input 0: name is not a string"},
        {IN("{\"name\":\"\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}"), "input 0: name is empty"},
        {IN(OKIN "," OKIN), "input 'x' appears twice"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"data\":[1]}"), "input 'x' has no datatype"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":11,\"data\":[1]}"), "input 'x': datatype is not a string"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FLOAT32\",\"data\":[1]}"), "input 'x': unknown datatype 'FLOAT32'"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"fp32\",\"data\":[1]}"), "unknown datatype 'fp32'"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"abc\"]}"), "input 'x': BYTES inputs are not supported"},
        {IN("{\"name\":\"x\",\"datatype\":\"FP32\",\"data\":[1]}"), "input 'x' has no shape"},
        {IN("{\"name\":\"x\",\"shape\":2,\"datatype\":\"FP32\",\"data\":[1,2]}"), "input 'x': shape is not an array"},
        {IN("{\"name\":\"x\",\"shape\":[1,\"2\"],\"datatype\":\"FP32\",\"data\":[1,2]}"), "input 'x': shape[1] is not an integer"},
        {IN("{\"name\":\"x\",\"shape\":[2.0],\"datatype\":\"FP32\",\"data\":[1,2]}"), "input 'x': shape[0] is not an integer"},
        {IN("{\"name\":\"x\",\"shape\":[-1],\"datatype\":\"FP32\",\"data\":[1]}"), "input 'x': shape[0] is negative (-1)"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":5}"), "input 'x': data is not an array"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1,2],\"parameters\":{\"binary_data_size\":8}}"),
         "input 'x' has both data and binary_data_size"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\"}"), "input 'x' has neither data nor parameters.binary_data_size"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"parameters\":{}}"), "has neither data nor"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"parameters\":[]}"), "input 'x': parameters is not an object"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":-8}}"),
         "input 'x': binary_data_size is not a non-negative integer"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":\"8\"}}"),
         "binary_data_size is not a non-negative integer"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"UINT8\",\"data\":[1,300]}"), "input 'x': data[1] is 300, out of range for UINT8"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"INT32\",\"data\":[[1],[1.5]]}"),
         "input 'x': data[1] is not an integer (INT32 takes integers)"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"INT32\",\"data\":[1,true]}"), "data[1] is not an integer"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"BOOL\",\"data\":[true,1]}"),
         "input 'x': data[1] is not true or false (BOOL takes booleans)"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1,\"2\"]}"), "input 'x': data[1] is not a number (FP32 takes numbers)"},
        {IN("{\"name\":\"x\",\"shape\":[2],\"datatype\":\"FP16\",\"data\":[null,2]}"), "data[0] is not a number (FP16 takes numbers)"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"BF16\",\"data\":[{}]}"), "data[0] is not a number (BF16 takes numbers)"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"UINT64\",\"data\":[18446744073709551615]}"), "not valid JSON"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[1e999]}"), "not valid JSON"},
        {IN("{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[NaN]}"), "not valid JSON"},
        {IN("{\"name\":\"x\\u0000y\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[1]}"), "not valid JSON"},
        {IN("{\"name\":\"a\\nb\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[1]},"
            "{\"name\":\"a\\nb\",\"shape\":[1],\"datatype\":\"FP64\",\"data\":[1]}"),
         "input 'a?b' appears twice"},
        {"{\"id\":7,\"inputs\":[" OKIN "]}", "id is not a string"},
        {"{\"parameters\":[],\"inputs\":[" OKIN "]}", "request parameters is not an object"},
        {"{\"parameters\":{\"binary_data_output\":\"yes\"},\"inputs\":[" OKIN "]}", "parameters.binary_data_output is not true or false"},
        {"{\"parameters\":{\"timeout\":-1},\"inputs\":[" OKIN "]}", "parameters.timeout is not a non-negative integer"},
        {"{\"parameters\":{\"timeout\":1.5},\"inputs\":[" OKIN "]}", "parameters.timeout is not a non-negative integer"},
        {"{\"outputs\":{},\"inputs\":[" OKIN "]}", "outputs is not an array"},
        {"{\"outputs\":[\"y\"],\"inputs\":[" OKIN "]}", "output 0 is not an object"},
        {"{\"outputs\":[{\"name\":\"y\"},{}],\"inputs\":[" OKIN "]}", "output 1 has no name"},
        {"{\"outputs\":[{\"name\":\"\"}],\"inputs\":[" OKIN "]}", "output 0: name is empty"},
        {"{\"outputs\":[{\"name\":\"y\"},{\"name\":\"y\"}],\"inputs\":[" OKIN "]}", "output 'y' is requested twice"},
        {"{\"outputs\":[{\"name\":\"y\",\"parameters\":true}],\"inputs\":[" OKIN "]}", "output 'y': parameters is not an object"},
        {"{\"outputs\":[{\"name\":\"y\",\"parameters\":{\"binary_data\":1}}],\"inputs\":[" OKIN "]}",
         "output 'y': binary_data is not true or false"},
    };
#undef IN
#undef OKIN
    for (int k = 0; k < NELEM(cases); k++) expect_bad(cases[k].json, cases[k].want);

    /* lengths: one over the longest id and name */
    char id[EMS_ID_MAX + 1], name[EMS_NAME_MAX + 1], j[1024];
    memset(id, 'i', EMS_ID_MAX);
    id[EMS_ID_MAX] = '\0';
    memset(name, 'n', EMS_NAME_MAX);
    name[EMS_NAME_MAX] = '\0';
    snprintf(j, sizeof j, "{\"id\":\"%s\",\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", id);
    expect_bad(j, "id is 256 bytes long, the longest allowed is 255");
    snprintf(j, sizeof j, "{\"inputs\":[{\"name\":\"%s\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}", name);
    expect_bad(j, "input 0: name is 128 bytes long, the longest allowed is 127");
    snprintf(j, sizeof j, "{\"outputs\":[{\"name\":\"%s\"}],\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}",
             name);
    expect_bad(j, "output 0: name is 128 bytes long");
    /* raw bytes: NUL, invalid UTF-8, a control byte in the parser's message */
    const char raw[] = "{\"inputs\":\0[]}";
    expect_bad_lim(raw, sizeof raw - 1, -1, NULL, "not valid JSON");
    const char bad_utf8[] = "{\"inputs\":[{\"name\":\"\xff\xfe\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}";
    expect_bad_lim(bad_utf8, sizeof bad_utf8 - 1, -1, NULL, "not valid JSON");
    expect_bad("\n\n{\n", "line 4");
}

/* ---- encoding ---------------------------------------------------------------------------- */

/* The response header read back with jansson. */
static json_t *parse_header(const char *body, size_t len, int64_t hl)
{
    json_error_t e;
    json_t *j = json_loadb(body, hl < 0 ? len : (size_t)hl, 0, &e);
    if (!j) fail_msg("response is not JSON: %s", e.text);
    return j;
}

/* A response turned into a request (its "outputs" become "inputs") and decoded. */
static void response_as_request(const char *body, size_t len, int64_t hl, ems_request *r)
{
    const char *key = "\"outputs\":";
    size_t jl = hl < 0 ? len : (size_t)hl;
    char *p = memmem(body, jl, key, strlen(key));
    assert_non_null(p);
    size_t off = (size_t)(p - body);
    char *req = malloc(len);
    assert_non_null(req);
    memcpy(req, body, off);
    memcpy(req + off, "\"inputs\":", 9);
    memcpy(req + off + 9, body + off + 10, len - off - 10);
    decode_ok_lim(req, len - 1, hl < 0 ? -1 : hl - 1, NULL, r);
    free(req);
}

static void assert_same_tensor(const ems_tensor *a, const ems_tensor *b)
{
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    for (int d = 0; d < a->ndim; d++) assert_int_equal(a->shape[d], b->shape[d]);
    assert_int_equal(a->numel, b->numel);
    assert_int_equal(a->nbytes, b->nbytes);
    if (a->nbytes) assert_memory_equal(a->data, b->data, a->nbytes);
}

static void test_round_trip(void **state)
{
    (void)state;
    const char *j = "{\"id\":\"rt\",\"inputs\":["
                    "{\"name\":\"b\",\"shape\":[2,2],\"datatype\":\"BOOL\",\"data\":[[true,false],[false,true]]},"
                    "{\"name\":\"u64\",\"shape\":[2],\"datatype\":\"UINT64\",\"data\":[0,9223372036854775807]},"
                    "{\"name\":\"i64\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[-9223372036854775808,42]},"
                    "{\"name\":\"i8\",\"shape\":[1,1,3],\"datatype\":\"INT8\",\"data\":[-128,0,127]},"
                    "{\"name\":\"u32\",\"shape\":[1],\"datatype\":\"UINT32\",\"data\":[4294967295]},"
                    "{\"name\":\"f32\",\"shape\":[4],\"datatype\":\"FP32\",\"data\":[0.1,-1e-45,3.4028234663852886e38,1]},"
                    "{\"name\":\"f64\",\"shape\":[3],\"datatype\":\"FP64\",\"data\":[0.1,-5e-324,1.7976931348623157e308]},"
                    "{\"name\":\"h\",\"shape\":[3],\"datatype\":\"FP16\",\"data\":[0.1,6e-8,-65504]},"
                    "{\"name\":\"bf\",\"shape\":[2],\"datatype\":\"BF16\",\"data\":[0.1,-3e38]},"
                    "{\"name\":\"s\",\"shape\":[],\"datatype\":\"INT16\",\"data\":[-300]},"
                    "{\"name\":\"e\",\"shape\":[0,3],\"datatype\":\"FP32\",\"data\":[]}]}";
    ems_request r;
    decode_ok(j, &r);
    ems_response_output outs[16];
    for (int mode = 0; mode < 3; mode++) { /* all JSON, all binary, alternating */
        for (int k = 0; k < r.ninputs; k++) {
            outs[k].tensor = &r.inputs[k];
            outs[k].binary = mode == 1 || (mode == 2 && (k & 1));
        }
        size_t len;
        int64_t hl;
        char *body = ems_response_encode("model", "3", r.id, outs, r.ninputs, &len, &hl);
        assert_non_null(body);
        json_t *h = parse_header(body, len, hl);
        assert_string_equal(json_string_value(json_object_get(h, "model_name")), "model");
        assert_string_equal(json_string_value(json_object_get(h, "model_version")), "3");
        assert_string_equal(json_string_value(json_object_get(h, "id")), "rt");
        assert_int_equal(json_array_size(json_object_get(h, "outputs")), r.ninputs);
        json_decref(h);
        if (mode == 0) {
            assert_int_equal(hl, -1);
            assert_int_equal(strlen(body), len);
        } else {
            size_t bin = 0;
            for (int k = 0; k < r.ninputs; k++)
                if (outs[k].binary) bin += r.inputs[k].nbytes;
            assert_true(hl > 0);
            assert_int_equal((size_t)hl + bin, len);
        }
        ems_request back;
        response_as_request(body, len, hl, &back);
        assert_int_equal(back.ninputs, r.ninputs);
        for (int k = 0; k < r.ninputs; k++) assert_same_tensor(&r.inputs[k], &back.inputs[k]);
        ems_request_free(&back);
        free(body);
    }
    ems_request_free(&r);
}

/* Every finite FP16 and BF16 value, and random finite FP32 / FP64 bits, survive JSON. */
static void test_round_trip_floats(void **state)
{
    (void)state;
    enum { N = 65536, M = 20000 };
    ems_tensor t[4];
    memset(t, 0, sizeof t);
    uint16_t *h = malloc(N * 2), *bf = malloc(N * 2);
    float *f = malloc(M * sizeof *f);
    double *d = malloc(M * sizeof *d);
    assert_true(h && bf && f && d);
    int nh = 0, nbf = 0;
    for (uint32_t v = 0; v < N; v++) {
        if (((v >> 10) & 0x1f) != 0x1f) h[nh++] = (uint16_t)v;
        if (((v >> 7) & 0xff) != 0xff) bf[nbf++] = (uint16_t)v;
    }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < M; i++) {
        uint32_t w;
        uint64_t q;
        do {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            w = (uint32_t)s;
            memcpy(&f[i], &w, 4);
        } while (!isfinite(f[i]));
        do {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            q = s;
            memcpy(&d[i], &q, 8);
        } while (!isfinite(d[i]));
    }
    const struct {
        const char *name;
        ems_dtype dt;
        void *p;
        int n;
    } spec[4] = {{"h", EMS_FP16, h, nh}, {"bf", EMS_BF16, bf, nbf}, {"f", EMS_FP32, f, M}, {"d", EMS_FP64, d, M}};
    ems_response_output outs[4];
    for (int k = 0; k < 4; k++) {
        strcpy(t[k].name, spec[k].name);
        t[k].dtype = spec[k].dt;
        t[k].ndim = 1;
        t[k].shape[0] = t[k].numel = spec[k].n;
        t[k].data = spec[k].p;
        t[k].nbytes = (size_t)spec[k].n * ems_dtype_size(spec[k].dt);
        outs[k].tensor = &t[k];
        outs[k].binary = false;
    }
    size_t len;
    int64_t hl;
    char *body = ems_response_encode("m", NULL, NULL, outs, 4, &len, &hl);
    assert_non_null(body);
    assert_int_equal(hl, -1);
    assert_null(strstr(body, "model_version"));
    assert_null(strstr(body, "\"id\""));
    ems_request back;
    response_as_request(body, len, hl, &back);
    for (int k = 0; k < 4; k++) assert_same_tensor(&t[k], &back.inputs[k]);
    ems_request_free(&back);
    free(body);
    free(h);
    free(bf);
    free(f);
    free(d);
}

static void test_response_format(void **state)
{
    (void)state;
    float fv[4] = {NAN, INFINITY, -INFINITY, 1.5f};
    uint16_t hv[2] = {0x7c00, 0x7e00};
    int32_t iv[3] = {1, -2, 3};
    ems_tensor tf = {.name = "f", .dtype = EMS_FP32, .ndim = 2, .shape = {2, 2}, .numel = 4, .data = fv, .nbytes = 16};
    ems_tensor th = {.name = "h\"q", .dtype = EMS_FP16, .ndim = 1, .shape = {2}, .numel = 2, .data = hv, .nbytes = 4};
    ems_tensor ti = {.name = "i", .dtype = EMS_INT32, .ndim = 1, .shape = {3}, .numel = 3, .data = iv, .nbytes = 12};
    ems_response_output outs[3] = {{&tf, false}, {&th, false}, {&ti, false}};
    size_t len;
    int64_t hl;
    char *body = ems_response_encode("mlp", NULL, "id\n1", outs, 3, &len, &hl);
    assert_non_null(body);
    assert_string_equal(body, "{\"model_name\":\"mlp\",\"id\":\"id\\u000a1\",\"outputs\":["
                              "{\"name\":\"f\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[null,null,null,1.5]},"
                              "{\"name\":\"h\\\"q\",\"datatype\":\"FP16\",\"shape\":[2],\"data\":[null,null]},"
                              "{\"name\":\"i\",\"datatype\":\"INT32\",\"shape\":[3],\"data\":[1,-2,3]}]}");
    assert_int_equal(hl, -1);
    free(body);
    /* binary outputs: the header names their sizes, the bytes follow in output order */
    outs[0].binary = true;
    outs[2].binary = true;
    body = ems_response_encode("mlp", "1", NULL, outs, 3, &len, &hl);
    assert_non_null(body);
    const char *want = "{\"model_name\":\"mlp\",\"model_version\":\"1\",\"outputs\":["
                       "{\"name\":\"f\",\"datatype\":\"FP32\",\"shape\":[2,2],\"parameters\":{\"binary_data_size\":16}},"
                       "{\"name\":\"h\\\"q\",\"datatype\":\"FP16\",\"shape\":[2],\"data\":[null,null]},"
                       "{\"name\":\"i\",\"datatype\":\"INT32\",\"shape\":[3],\"parameters\":{\"binary_data_size\":12}}]}";
    assert_int_equal(hl, strlen(want));
    assert_int_equal(len, strlen(want) + 28);
    assert_memory_equal(body, want, strlen(want));
    assert_memory_equal(body + hl, fv, 16);
    assert_memory_equal(body + hl + 16, iv, 12);
    free(body);
    /* no outputs; invalid UTF-8 in a name is replaced, not passed on */
    body = ems_response_encode("m\xff", NULL, NULL, NULL, 0, &len, &hl);
    assert_non_null(body);
    assert_string_equal(body, "{\"model_name\":\"m\\ufffd\",\"outputs\":[]}");
    free(body);
    /* what cannot be encoded */
    ems_tensor tb = {.name = "s", .dtype = EMS_BYTES, .ndim = 1, .shape = {1}, .numel = 1};
    ems_response_output bad = {&tb, false};
    assert_null(ems_response_encode("m", NULL, NULL, &bad, 1, &len, &hl));
    ems_tensor tn = {.name = "n", .dtype = EMS_FP32, .ndim = 1, .shape = {1}, .numel = 1, .data = NULL};
    bad.tensor = &tn;
    assert_null(ems_response_encode("m", NULL, NULL, &bad, 1, &len, &hl));
    assert_null(ems_response_encode("m", NULL, NULL, NULL, 1, &len, &hl));
}

static void test_error_json(void **state)
{
    (void)state;
    size_t len;
    char *e = ems_error_json("input 'x': \"bad\"\\ \n\t\x01 caf\xc3\xa9", &len);
    assert_non_null(e);
    assert_int_equal(strlen(e), len);
    json_t *j = json_loadb(e, len, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_object_size(j), 1);
    assert_string_equal(json_string_value(json_object_get(j, "error")), "input 'x': \"bad\"\\ \n\t\x01 caf\xc3\xa9");
    json_decref(j);
    free(e);
    e = ems_error_json("", &len);
    assert_string_equal(e, "{\"error\":\"\"}");
    free(e);
    /* a decoder message goes straight into an error body */
    ems_request r;
    char err[256];
    assert_int_equal(ems_request_decode("{\"inputs\":5}", 12, -1, NULL, &r, err, sizeof err), -1);
    e = ems_error_json(err, &len);
    assert_string_equal(e, "{\"error\":\"inputs is not an array\"}");
    free(e);
}

static void test_conversions(void **state)
{
    (void)state;
    ems_request r;
    decode_ok("{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"BOOL\",\"data\":[true,false]},"
              "{\"name\":\"u8\",\"shape\":[2],\"datatype\":\"UINT8\",\"data\":[200,7]},"
              "{\"name\":\"i16\",\"shape\":[2],\"datatype\":\"INT16\",\"data\":[-300,5]},"
              "{\"name\":\"i64\",\"shape\":[2],\"datatype\":\"INT64\",\"data\":[16777217,-1]},"
              "{\"name\":\"h\",\"shape\":[2],\"datatype\":\"FP16\",\"data\":[0.5,-2]},"
              "{\"name\":\"bf\",\"shape\":[2],\"datatype\":\"BF16\",\"data\":[0.5,-2]},"
              "{\"name\":\"f64\",\"shape\":[2],\"datatype\":\"FP64\",\"data\":[0.1,3]},"
              "{\"name\":\"u64\",\"shape\":[2],\"datatype\":\"UINT64\",\"data\":[1,2]}]}",
              &r);
    float f[2];
    int64_t q[2];
    const float wf[8][2] = {{1, 0}, {200, 7}, {-300, 5}, {16777216.0f, -1}, {0.5f, -2}, {0.5f, -2}, {0.1f, 3}, {1, 2}};
    for (int k = 0; k < 8; k++) {
        assert_int_equal(ems_tensor_to_f32(&r.inputs[k], f), 0);
        assert_true(f[0] == wf[k][0] && f[1] == wf[k][1]);
    }
    const int64_t wq[4][2] = {{1, 0}, {200, 7}, {-300, 5}, {16777217, -1}};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(ems_tensor_to_i64(&r.inputs[k], q), 0);
        assert_true(q[0] == wq[k][0] && q[1] == wq[k][1]);
    }
    for (int k = 4; k < 7; k++) assert_int_equal(ems_tensor_to_i64(&r.inputs[k], q), -1);
    assert_int_equal(ems_tensor_to_i64(&r.inputs[7], q), 0);
    ((uint64_t *)r.inputs[7].data)[1] = (uint64_t)INT64_MAX + 1;
    assert_int_equal(ems_tensor_to_i64(&r.inputs[7], q), -1);
    assert_int_equal(ems_tensor_to_f32(&r.inputs[7], f), 0);
    assert_true(f[1] == 9223372036854775808.0f);
    ems_tensor tb = {.name = "s", .dtype = EMS_BYTES, .ndim = 1, .shape = {1}, .numel = 1};
    assert_int_equal(ems_tensor_to_f32(&tb, f), -1);
    assert_int_equal(ems_tensor_to_i64(&tb, q), -1);
    ems_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_kserve_example),
        cmocka_unit_test(test_count_message),
        cmocka_unit_test(test_every_dtype_json),
        cmocka_unit_test(test_every_dtype_binary),
        cmocka_unit_test(test_nested_and_flat),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_binary_accounting),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_round_trip_floats),
        cmocka_unit_test(test_response_format),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
