/* Tests of the core API: runtime lifecycle, devices, dtypes, tensor creation,
 * host I/O, random numbers, printing, error handling, scopes and leaks. */
#include "testutil.h"
#include "autodiff/autodiff.h"

#include <errno.h>
#include <starpu.h>
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------- */


static void assert_dtype(const em_tensor *t, em_dtype dt)
{
    assert_non_null(t);
    if (em_tensor_dtype(t) != dt)
        fail_msg("dtype %s, expected %s", em_dtype_name(em_tensor_dtype(t)), em_dtype_name(dt));
}

static void assert_msg_has(const char *needle)
{
    const char *m = em_last_error();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" does not contain \"%s\"", m, needle);
}

/* Asserts the printed form of t and releases t. */
static void expect_str(em_tensor *t, const char *want)
{
    assert_non_null(t);
    char *s = em_tensor_to_string(t);
    if (!s) fail_msg("em_tensor_to_string: %s", em_last_error());
    if (strcmp(s, want) != 0) {
        fprintf(stderr, "printed:\n%s\nexpected (PyTorch):\n%s\n", s, want);
        free(s);
        fail_msg("printed form differs from PyTorch's");
    }
    free(s);
    em_tensor_release(t);
}

static double mean_of(const double *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s / (double)n;
}

static double std_of(const double *v, int64_t n)
{
    double m = mean_of(v, n), s = 0;
    for (int64_t i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    return sqrt(s / (double)(n - 1));
}

/* Exact element-wise equality of two tensors (same dtype & numel). */
static void assert_same_values(const em_tensor *a, const em_tensor *b)
{
    assert_int_equal(em_tensor_numel(a), em_tensor_numel(b));
    assert_int_equal(em_tensor_dtype(a), em_tensor_dtype(b));
    int64_t n = em_tensor_numel(a);
    double *va = em_test_values(a), *vb = em_test_values(b);
    for (int64_t i = 0; i < n; i++)
        if (va[i] != vb[i]) {
            double x = va[i], y = vb[i];
            free(va);
            free(vb);
            fail_msg("element %lld differs: %.9g vs %.9g", (long long)i, x, y);
        }
    free(va);
    free(vb);
}

/* ---- runtime, devices, dtypes -------------------------------------------------- */

static void test_init_twice(void **state)
{
    (void)state;
    assert_true(em_is_initialized());
    em_clear_error();
    assert_int_equal(em_init(NULL), EM_ERR_STATE);
    assert_int_equal(em_last_status(), EM_ERR_STATE);
    assert_msg_has("already initialized");
    /* the runtime still works */
    assert_true(em_is_initialized());
    em_tensor *t = em_ones(SHAPE(3), 1, EM_F32);
    em_test_assert_close(t, VALS(1, 1, 1), 0, 0);
    em_tensor_release(t);
    assert_int_equal(em_sync(), EM_OK);
    assert_true(em_worker_count(EM_DEVICE_CPU) >= 1);
}

static void test_device_parse(void **state)
{
    (void)state;
    em_device d;
    assert_int_equal(em_device_parse("cpu", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_CPU);
    assert_int_equal(em_device_parse("cuda", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_CUDA);
    assert_int_equal(d.index, 0);
    assert_int_equal(em_device_parse("cuda:1", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_CUDA);
    assert_int_equal(d.index, 1);
    assert_int_equal(em_device_parse("opencl:0", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_OPENCL);
    assert_int_equal(d.index, 0);
    assert_int_equal(em_device_parse("opencl:3", &d), EM_OK);
    assert_int_equal(d.index, 3);
    assert_int_equal(em_device_parse("hip:2", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_HIP);
    assert_int_equal(d.index, 2);
    assert_int_equal(em_device_parse("auto", &d), EM_OK);
    assert_int_equal(d.kind, EM_DEVICE_AUTO);

    static const char *junk[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1", "cpux", "cuda:1x", "cuda1", ":0", "tpu:0"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        em_device keep = {EM_DEVICE_OPENCL, 7}, o = keep;
        em_clear_error();
        em_status st = em_device_parse(junk[i], &o);
        if (st != EM_ERR_INVALID) fail_msg("em_device_parse(\"%s\") returned %d, expected EM_ERR_INVALID", junk[i], st);
        if (junk[i][0]) assert_msg_has(junk[i]);
        assert_int_equal(o.kind, keep.kind); /* out untouched on error */
        assert_int_equal(o.index, keep.index);
    }
    assert_int_equal(em_device_parse(NULL, &d), EM_ERR_INVALID);
    assert_int_equal(em_device_parse("cpu", NULL), EM_ERR_INVALID);

    char buf[32];
    assert_string_equal(em_device_str(em_device_cuda(1), buf, sizeof buf), "cuda:1");
    assert_string_equal(em_device_str(em_device_cpu(), buf, sizeof buf), "cpu");
    assert_string_equal(em_device_str(em_device_opencl(0), buf, sizeof buf), "opencl:0");
    assert_string_equal(em_device_str(em_device_auto(), buf, sizeof buf), "auto");
}

static void test_set_device(void **state)
{
    (void)state;
    assert_int_equal(em_get_device().kind, EM_DEVICE_CPU);
    if (em_worker_count(EM_DEVICE_CUDA) == 0) {
        em_clear_error();
        assert_int_equal(em_set_device(em_device_cuda(0)), EM_ERR_DEVICE);
        assert_int_equal(em_last_status(), EM_ERR_DEVICE);
        assert_msg_has("cuda:0");
        assert_int_equal(em_get_device().kind, EM_DEVICE_CPU); /* unchanged */
    }
    /* an index beyond the available GPUs is always an error */
    assert_int_equal(em_set_device(em_device_cuda(200)), EM_ERR_DEVICE);
    assert_msg_has("cuda:200");
    if (em_worker_count(EM_DEVICE_OPENCL) == 0) {
        assert_int_equal(em_set_device(em_device_opencl(0)), EM_ERR_DEVICE);
        assert_msg_has("opencl:0");
    }
    assert_int_equal(em_get_device().kind, EM_DEVICE_CPU);
    assert_int_equal(em_set_device(em_device_cpu()), EM_OK);
    assert_int_equal(em_get_device().kind, EM_DEVICE_CPU);
    /* ops still run on the CPU after the failed calls */
    em_tensor *t = em_full(SHAPE(2), 1, EM_F32, 4.0);
    em_test_assert_close(t, VALS(4, 4), 0, 0);
    em_tensor_release(t);
}

static void test_dtypes(void **state)
{
    (void)state;
    static const struct { em_dtype dt; size_t size; const char *name; bool is_float; } tab[] = {
        {EM_F32, 4, "float32", true}, {EM_F64, 8, "float64", true}, {EM_I32, 4, "int32", false},
        {EM_I64, 8, "int64", false},  {EM_U8, 1, "uint8", false},   {EM_BOOL, 1, "bool", false},
        {EM_F16, 2, "float16", true}, {EM_BF16, 2, "bfloat16", true},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        assert_int_equal(em_dtype_size(tab[i].dt), tab[i].size);
        assert_string_equal(em_dtype_name(tab[i].dt), tab[i].name);
        assert_int_equal(em_dtype_is_float(tab[i].dt), tab[i].is_float);
    }
    assert_int_equal(em_dtype_size(EM_DTYPE_COUNT), 0);
    assert_int_equal(em_dtype_size((em_dtype)-1), 0);
    assert_non_null(em_dtype_name(EM_DTYPE_COUNT));
    /* the 16-bit float dtypes are real storage types */
    em_clear_error();
    em_tensor *h = em_zeros(SHAPE(2), 1, EM_F16);
    assert_non_null(h);
    assert_int_equal(em_tensor_dtype(h), EM_F16);
    em_tensor_release(h);
    em_test_assert_error(em_zeros(SHAPE(2), 1, EM_DTYPE_COUNT), "dtype", NULL);
    for (int s = EM_ERR_INTERRUPTED; s <= EM_OK; s++) {
        assert_string_not_equal(em_status_str((em_status)s), "unknown status");
        const char *str = em_status_str((em_status)s);
        assert_non_null(str);
        assert_true(strlen(str) > 0);
    }
}

/* ---- creation ----------------------------------------------------------------- */

static void test_zeros_ones_full(void **state)
{
    (void)state;
    em_tensor *z = em_zeros(SHAPE(2, 3), 2, EM_F32);
    em_test_assert_shape(z, 2, SHAPE(2, 3));
    assert_dtype(z, EM_F32);
    assert_true(em_tensor_is_contiguous(z));
    assert_int_equal(em_tensor_strides(z)[0], 3);
    assert_int_equal(em_tensor_strides(z)[1], 1);
    assert_int_equal(em_tensor_dim(z, -1), 3);
    assert_int_equal(em_tensor_dim(z, -2), 2);
    assert_int_equal(em_tensor_dim(z, 2), -1);
    em_test_assert_close(z, VALS(0, 0, 0, 0, 0, 0), 0, 0);

    em_tensor *o = em_ones(SHAPE(4), 1, EM_I64);
    assert_dtype(o, EM_I64);
    em_test_assert_close(o, VALS(1, 1, 1, 1), 0, 0);

    em_tensor *f = em_full(SHAPE(2, 2), 2, EM_F64, 2.5);
    assert_dtype(f, EM_F64);
    em_test_assert_close(f, VALS(2.5, 2.5, 2.5, 2.5), 0, 0);

    em_tensor *fi = em_full(SHAPE(3), 1, EM_I32, -4);
    assert_dtype(fi, EM_I32);
    em_test_assert_close(fi, VALS(-4, -4, -4), 0, 0);
    em_tensor *fu = em_full(SHAPE(2), 1, EM_U8, 255);
    em_test_assert_close(fu, VALS(255, 255), 0, 0);
    em_tensor *fb = em_full(SHAPE(2), 1, EM_BOOL, 3);
    assert_dtype(fb, EM_BOOL);
    uint8_t bb[2];
    assert_int_equal(em_to_host(fb, bb, sizeof bb), EM_OK);
    assert_int_equal(bb[0], 1); /* bools are stored as 0/1 */
    assert_int_equal(bb[1], 1);
    em_tensor *fz = em_zeros(SHAPE(3), 1, EM_BOOL);
    em_test_assert_close(fz, VALS(0, 0, 0), 0, 0);

    em_tensor *zl = em_zeros_like(f), *ol = em_ones_like(fi), *fl = em_full_like(z, -1.25);
    assert_dtype(zl, EM_F64);
    em_test_assert_shape(zl, 2, SHAPE(2, 2));
    em_test_assert_close(zl, VALS(0, 0, 0, 0), 0, 0);
    assert_dtype(ol, EM_I32);
    em_test_assert_close(ol, VALS(1, 1, 1), 0, 0);
    assert_dtype(fl, EM_F32);
    em_test_assert_shape(fl, 2, SHAPE(2, 3));
    em_test_assert_close(fl, VALS(-1.25, -1.25, -1.25, -1.25, -1.25, -1.25), 0, 0);

    em_tensor *e = em_empty(SHAPE(5, 0), 2, EM_F32);
    em_test_assert_shape(e, 2, SHAPE(5, 0));
    assert_int_equal(em_tensor_numel(e), 0);

    /* rank 8 (the maximum) works */
    em_tensor *r8 = em_ones(SHAPE(1, 2, 1, 2, 1, 1, 1, 2), 8, EM_F32);
    assert_int_equal(em_tensor_ndim(r8), 8);
    assert_int_equal(em_tensor_numel(r8), 8);

    em_tensor *all[] = {z, o, f, fi, fu, fb, fz, zl, ol, fl, e, r8};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_scalar_item(void **state)
{
    (void)state;
    em_tensor *s = em_scalar(3.5, EM_F32);
    assert_int_equal(em_tensor_ndim(s), 0);
    assert_int_equal(em_tensor_numel(s), 1);
    double v = 0;
    assert_int_equal(em_item(s, &v), EM_OK);
    assert_true(v == 3.5);
    em_tensor *si = em_scalar(-7, EM_I64);
    assert_int_equal(em_item(si, &v), EM_OK);
    assert_true(v == -7);
    em_tensor *sb = em_scalar(1, EM_BOOL);
    assert_int_equal(em_item(sb, &v), EM_OK);
    assert_true(v == 1);
    em_tensor *s11 = T(EM_F64, (1, 1), 0.125);
    assert_int_equal(em_item(s11, &v), EM_OK);
    assert_true(v == 0.125);

    em_tensor *m = em_zeros(SHAPE(2, 3), 2, EM_F32);
    em_clear_error();
    assert_int_equal(em_item(m, &v), EM_ERR_SHAPE);
    assert_msg_has("[2, 3]");
    em_tensor *e = em_zeros(SHAPE(0), 1, EM_F32);
    assert_int_equal(em_item(e, &v), EM_ERR_SHAPE);
    assert_msg_has("[0]");
    assert_int_equal(em_item(NULL, &v), EM_ERR_INVALID);
    assert_int_equal(em_item(s, NULL), EM_ERR_INVALID);

    /* em_to_host checks the buffer size */
    float small[5];
    assert_int_equal(em_to_host(m, small, sizeof small), EM_ERR_INVALID);
    assert_int_equal(em_to_host(m, NULL, 100), EM_ERR_INVALID);
    assert_int_equal(em_to_host(NULL, small, sizeof small), EM_ERR_INVALID);

    em_tensor *all[] = {s, si, sb, s11, m, e};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_arange(void **state)
{
    (void)state;
    em_tensor *a = em_arange(0, 5, 1, EM_I64);
    assert_dtype(a, EM_I64);
    em_test_assert_shape(a, 1, SHAPE(5));
    em_test_assert_close(a, VALS(0, 1, 2, 3, 4), 0, 0);
    em_tensor *b = em_arange(5, 0, -1.5, EM_F32); /* torch.arange(5, 0, -1.5) */
    em_test_assert_close(b, VALS(5, 3.5, 2, 0.5), 0, 0);
    em_tensor *c = em_arange(1, 2.5, 0.5, EM_F64);
    em_test_assert_close(c, VALS(1, 1.5, 2), 0, 0);
    em_tensor *d = em_arange(-3, 3, 2, EM_I32);
    assert_dtype(d, EM_I32);
    em_test_assert_close(d, VALS(-3, -1, 1), 0, 0);
    em_tensor *e = em_arange(0, 1, 0.1, EM_F32); /* 10 elements, end excluded */
    assert_int_equal(em_tensor_numel(e), 10);
    em_test_assert_close(e, VALS(0, .1, .2, .3, .4, .5, .6, .7, .8, .9), 1e-6, 1e-7);
    em_tensor *f = em_arange(0, 0, 1, EM_F32); /* empty */
    em_test_assert_shape(f, 1, SHAPE(0));
    em_tensor *g = em_arange(10, -10, -7, EM_I64);
    em_test_assert_close(g, VALS(10, 3, -4), 0, 0);

    em_clear_error();
    em_test_assert_error(em_arange(0, 1, 0, EM_F32), "step", NULL);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    em_test_assert_error(em_arange(0, 5, -1, EM_F32), "step", NULL);
    em_test_assert_error(em_arange(5, 0, 1, EM_F32), "step", NULL);
    em_test_assert_error(em_arange(0, INFINITY, 1, EM_F32), NULL);
    em_test_assert_error(em_arange(0, 5, NAN, EM_F32), NULL);

    em_tensor *all[] = {a, b, c, d, e, f, g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_linspace(void **state)
{
    (void)state;
    em_tensor *a = em_linspace(0, 1, 5, EM_F32);
    assert_dtype(a, EM_F32);
    em_test_assert_close(a, VALS(0, 0.25, 0.5, 0.75, 1), 0, 0);
    em_tensor *b = em_linspace(-1, 1, 4, EM_F64); /* torch: [-1.0000, -0.3333, 0.3333, 1.0000] */
    em_test_assert_close(b, VALS(-1, -1.0 / 3, 1.0 / 3, 1), 1e-15, 1e-15);
    em_tensor *c = em_linspace(3, 10, 5, EM_F32); /* torch: [3.0, 4.75, 6.5, 8.25, 10.0] */
    em_test_assert_close(c, VALS(3, 4.75, 6.5, 8.25, 10), 0, 0);
    em_tensor *d = em_linspace(2, 5, 1, EM_F32); /* torch.linspace(2, 5, 1) == tensor([2.]) */
    em_test_assert_shape(d, 1, SHAPE(1));
    em_test_assert_close(d, VALS(2), 0, 0);
    em_tensor *e = em_linspace(0, 1, 0, EM_F32); /* empty */
    em_test_assert_shape(e, 1, SHAPE(0));
    em_tensor *f = em_linspace(10, 0, 3, EM_F32);
    em_test_assert_close(f, VALS(10, 5, 0), 0, 0);
    em_tensor *g = em_linspace(0, 10, 4, EM_I64); /* torch: tensor([ 0,  3,  6, 10]) */
    assert_dtype(g, EM_I64);
    em_test_assert_close(g, VALS(0, 3, 6, 10), 0, 0);
    /* end points are exact (torch computes the second half from the end) */
    em_tensor *h = em_linspace(0.1, 0.7, 7, EM_F64);
    double *hv = em_test_values(h);
    assert_true(hv[0] == 0.1);
    assert_true(hv[6] == 0.7);
    for (int i = 0; i < 7; i++) assert_true(fabs(hv[i] - (0.1 + 0.1 * i)) < 1e-15);
    free(hv);
    em_tensor *s2 = em_linspace(-4, 4, 2, EM_F32);
    em_test_assert_close(s2, VALS(-4, 4), 0, 0);

    em_clear_error();
    em_test_assert_error(em_linspace(0, 1, -1, EM_F32), "steps", NULL);

    em_tensor *all[] = {a, b, c, d, e, f, g, h, s2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_eye(void **state)
{
    (void)state;
    em_tensor *a = em_eye(3, 0, EM_F32);
    em_test_assert_shape(a, 2, SHAPE(3, 3));
    em_test_assert_close(a, VALS(1, 0, 0, 0, 1, 0, 0, 0, 1), 0, 0);
    em_tensor *b = em_eye(2, 3, EM_I64);
    assert_dtype(b, EM_I64);
    em_test_assert_shape(b, 2, SHAPE(2, 3));
    em_test_assert_close(b, VALS(1, 0, 0, 0, 1, 0), 0, 0);
    em_tensor *c = em_eye(3, 2, EM_F64);
    em_test_assert_shape(c, 2, SHAPE(3, 2));
    em_test_assert_close(c, VALS(1, 0, 0, 1, 0, 0), 0, 0);
    em_tensor *d = em_eye(1, 1, EM_BOOL);
    em_test_assert_close(d, VALS(1), 0, 0);
    em_tensor *e = em_eye(0, 0, EM_F32);
    em_test_assert_shape(e, 2, SHAPE(0, 0));
    em_tensor *f = em_eye(2, -1, EM_U8); /* m <= 0 means m = n */
    em_test_assert_shape(f, 2, SHAPE(2, 2));
    em_test_assert_close(f, VALS(1, 0, 0, 1), 0, 0);
    em_test_assert_error(em_eye(-1, 2, EM_F32), "-1", NULL);
    em_tensor *all[] = {a, b, c, d, e, f};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_from_host_roundtrip(void **state)
{
    (void)state;
    const float f32[6] = {1.5f, -2.25f, 0.0f, 3.0e38f, -1e-30f, 7.0f};
    const double f64[6] = {1.0 / 3, -2.5e300, 0.0, 1e-300, -0.0, 42.0};
    const int32_t i32[6] = {INT32_MIN, -1, 0, 1, 12345, INT32_MAX};
    const int64_t i64[6] = {INT64_MIN, -1, 0, 1, ((int64_t)1 << 53) + 1, INT64_MAX};
    const uint8_t u8[6] = {0, 1, 127, 128, 200, 255};
    const uint8_t bl[6] = {1, 0, 0, 1, 1, 0};
    const struct { em_dtype dt; const void *data; } cases[] = {
        {EM_F32, f32}, {EM_F64, f64}, {EM_I32, i32}, {EM_I64, i64}, {EM_U8, u8}, {EM_BOOL, bl},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        em_tensor *t = em_from_host(cases[c].data, SHAPE(2, 3), 2, cases[c].dt);
        if (!t) fail_msg("em_from_host %s: %s", em_dtype_name(cases[c].dt), em_last_error());
        assert_dtype(t, cases[c].dt);
        em_test_assert_shape(t, 2, SHAPE(2, 3));
        size_t nb = 6 * em_dtype_size(cases[c].dt);
        char back[64];
        memset(back, 0xAB, sizeof back);
        assert_int_equal(em_to_host(t, back, sizeof back), EM_OK);
        if (memcmp(back, cases[c].data, nb) != 0) fail_msg("round trip of %s changed the bytes", em_dtype_name(cases[c].dt));
        assert_int_equal((unsigned char)back[nb], 0xAB); /* nothing written past numel */
        /* 1-D and 0-d views of the same data */
        em_tensor *t1 = em_from_host(cases[c].data, SHAPE(6), 1, cases[c].dt);
        em_tensor *t0 = em_from_host(cases[c].data, NULL, 0, cases[c].dt);
        assert_int_equal(em_tensor_ndim(t0), 0);
        memset(back, 0, sizeof back);
        assert_int_equal(em_to_host(t0, back, sizeof back), EM_OK);
        assert_memory_equal(back, cases[c].data, em_dtype_size(cases[c].dt));
        assert_int_equal(em_to_host(t1, back, nb), EM_OK);
        assert_memory_equal(back, cases[c].data, nb);
        em_tensor_release(t);
        em_tensor_release(t1);
        em_tensor_release(t0);
    }
    /* empty tensor: data may be NULL */
    em_tensor *e = em_from_host(NULL, SHAPE(0, 4), 2, EM_F32);
    assert_non_null(e);
    assert_int_equal(em_tensor_numel(e), 0);
    float dummy;
    assert_int_equal(em_to_host(e, &dummy, 0), EM_OK);
    em_tensor_release(e);
    em_test_assert_error(em_from_host(NULL, SHAPE(2), 1, EM_F32), "NULL", NULL);
}

/* ---- random ------------------------------------------------------------------- */

static void test_rand_reproducible(void **state)
{
    (void)state;
    em_manual_seed(1234);
    em_tensor *a = em_rand_uniform(SHAPE(64), 1, EM_F32, 0, 1);
    em_tensor *a2 = em_rand_uniform(SHAPE(64), 1, EM_F32, 0, 1); /* next draw: different */
    em_manual_seed(1234);
    em_tensor *b = em_rand_uniform(SHAPE(64), 1, EM_F32, 0, 1);
    assert_same_values(a, b);
    em_manual_seed(1235);
    em_tensor *c = em_rand_uniform(SHAPE(64), 1, EM_F32, 0, 1);
    double *va = em_test_values(a), *va2 = em_test_values(a2), *vc = em_test_values(c);
    int same_c = 0, same_a2 = 0;
    for (int i = 0; i < 64; i++) {
        same_c += va[i] == vc[i];
        same_a2 += va[i] == va2[i];
    }
    free(va);
    free(va2);
    free(vc);
    assert_true(same_c < 4);
    assert_true(same_a2 < 4);

    /* normal + bernoulli are reproducible too */
    em_manual_seed(99);
    em_tensor *n1 = em_rand_normal(SHAPE(3, 7), 2, EM_F64, 0, 1);
    em_tensor *k1 = em_rand_bernoulli(SHAPE(50), 1, EM_F32, 0.5);
    em_manual_seed(99);
    em_tensor *n2 = em_rand_normal(SHAPE(3, 7), 2, EM_F64, 0, 1);
    em_tensor *k2 = em_rand_bernoulli(SHAPE(50), 1, EM_F32, 0.5);
    assert_same_values(n1, n2);
    assert_same_values(k1, k2);

    em_tensor *all[] = {a, a2, b, c, n1, k1, n2, k2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_rand_state(void **state)
{
    (void)state;
    uint64_t seed = 0, off = 0;
    em_manual_seed(7);
    em_rng_get_state(&seed, &off);
    assert_true(seed == 7);
    assert_true(off == 0);
    em_tensor *a = em_rand_uniform(SHAPE(10), 1, EM_F32, 0, 1);
    em_rng_get_state(&seed, &off);
    assert_true(seed == 7);
    assert_true(off == 10); /* offset advances by numel */
    em_tensor *b = em_rand_normal(SHAPE(4, 5), 2, EM_F32, 0, 1);
    em_rng_get_state(NULL, &off);
    assert_true(off == 30);
    em_rng_set_state(7, 10);
    em_tensor *c = em_rand_normal(SHAPE(4, 5), 2, EM_F32, 0, 1);
    assert_same_values(b, c);
    em_rng_set_state(7, 0);
    em_tensor *d = em_rand_uniform(SHAPE(10), 1, EM_F32, 0, 1);
    assert_same_values(a, d);
    /* a failing draw does not consume numbers */
    em_rng_get_state(&seed, &off);
    assert_null(em_rand_uniform(SHAPE(10), 1, EM_I32, 0, 1));
    uint64_t seed2, off2;
    em_rng_get_state(&seed2, &off2);
    assert_true(seed2 == seed && off2 == off);
    em_tensor *all[] = {a, b, c, d};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_rand_counter_based(void **state)
{
    (void)state;
    em_manual_seed(2024);
    em_tensor *whole = em_rand_uniform(SHAPE(1000), 1, EM_F32, -1, 1);
    em_manual_seed(2024);
    em_tensor *p1 = em_rand_uniform(SHAPE(500), 1, EM_F32, -1, 1);
    em_tensor *p2 = em_rand_uniform(SHAPE(500), 1, EM_F32, -1, 1);
    double *w = em_test_values(whole), *v1 = em_test_values(p1), *v2 = em_test_values(p2);
    for (int i = 0; i < 500; i++) {
        if (w[i] != v1[i]) fail_msg("element %d: whole %.9g vs first half %.9g", i, w[i], v1[i]);
        if (w[500 + i] != v2[i]) fail_msg("element %d: whole %.9g vs second half %.9g", 500 + i, w[500 + i], v2[i]);
    }
    free(w);
    free(v1);
    free(v2);
    /* same for normal, in a 2-D shape vs two 1-D draws */
    em_manual_seed(5);
    em_tensor *nw = em_rand_normal(SHAPE(2, 300), 2, EM_F64, 1, 2);
    em_manual_seed(5);
    em_tensor *n1 = em_rand_normal(SHAPE(300), 1, EM_F64, 1, 2);
    em_tensor *n2 = em_rand_normal(SHAPE(300), 1, EM_F64, 1, 2);
    double *a = em_test_values(nw), *b1 = em_test_values(n1), *b2 = em_test_values(n2);
    for (int i = 0; i < 300; i++) {
        assert_true(a[i] == b1[i]);
        assert_true(a[300 + i] == b2[i]);
    }
    free(a);
    free(b1);
    free(b2);
    em_tensor *all[] = {whole, p1, p2, nw, n1, n2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_rand_distributions(void **state)
{
    (void)state;
    const int64_t N = 100000;
    em_manual_seed(42);
    /* uniform [-2, 3): in range, mean 0.5, std 5/sqrt(12) */
    em_tensor *u = em_rand_uniform(&N, 1, EM_F32, -2, 3);
    assert_dtype(u, EM_F32);
    double *v = em_test_values(u);
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < N; i++) {
        if (!(v[i] >= -2 && v[i] < 3)) fail_msg("uniform sample %lld = %.9g outside [-2, 3)", (long long)i, v[i]);
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
    }
    assert_true(fabs(mean_of(v, N) - 0.5) < 0.02);
    assert_true(fabs(std_of(v, N) - 5 / sqrt(12.0)) < 0.02);
    assert_true(lo < -1.99 && hi > 2.99);
    free(v);
    /* f64 uniform [0, 1) */
    em_tensor *u64 = em_rand_uniform(&N, 1, EM_F64, 0, 1);
    assert_dtype(u64, EM_F64);
    v = em_test_values(u64);
    for (int64_t i = 0; i < N; i++)
        if (!(v[i] >= 0 && v[i] < 1)) fail_msg("uniform sample %.17g outside [0, 1)", v[i]);
    assert_true(fabs(mean_of(v, N) - 0.5) < 0.01);
    free(v);

    /* normal: mean 0, std 1; and mean 3, std 2 */
    em_tensor *n = em_rand_normal(&N, 1, EM_F32, 0, 1);
    v = em_test_values(n);
    for (int64_t i = 0; i < N; i++)
        if (!isfinite(v[i])) fail_msg("normal sample %lld not finite", (long long)i);
    double m = mean_of(v, N), s = std_of(v, N);
    if (fabs(m) > 0.02 || fabs(s - 1) > 0.02) fail_msg("normal: mean %g std %g", m, s);
    /* roughly 68.3% within one std */
    int64_t within = 0;
    for (int64_t i = 0; i < N; i++) within += fabs(v[i]) < 1;
    assert_true(fabs((double)within / (double)N - 0.6827) < 0.01);
    free(v);
    em_tensor *n2 = em_rand_normal(SHAPE(200, 500), 2, EM_F64, 3, 2);
    v = em_test_values(n2);
    m = mean_of(v, N), s = std_of(v, N);
    if (fabs(m - 3) > 0.04 || fabs(s - 2) > 0.04) fail_msg("normal(3, 2): mean %g std %g", m, s);
    free(v);

    /* bernoulli: 0/1 values with mean p */
    em_tensor *b = em_rand_bernoulli(&N, 1, EM_F32, 0.3);
    v = em_test_values(b);
    for (int64_t i = 0; i < N; i++)
        if (v[i] != 0 && v[i] != 1) fail_msg("bernoulli sample %g", v[i]);
    assert_true(fabs(mean_of(v, N) - 0.3) < 0.01);
    free(v);
    em_tensor *b0 = em_rand_bernoulli(SHAPE(1000), 1, EM_F32, 0), *b1 = em_rand_bernoulli(SHAPE(1000), 1, EM_F64, 1);
    v = em_test_values(b0);
    assert_true(mean_of(v, 1000) == 0);
    free(v);
    v = em_test_values(b1);
    assert_true(mean_of(v, 1000) == 1);
    free(v);

    em_tensor *all[] = {u, u64, n, n2, b, b0, b1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static void test_rand_errors(void **state)
{
    (void)state;
    const em_dtype bad[] = {EM_I32, EM_I64, EM_U8, EM_BOOL};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        em_clear_error();
        em_test_assert_error(em_rand_uniform(SHAPE(4), 1, bad[i], 0, 1), em_dtype_name(bad[i]), NULL);
        assert_int_equal(em_last_status(), EM_ERR_DTYPE);
        em_clear_error();
        em_test_assert_error(em_rand_normal(SHAPE(4), 1, bad[i], 0, 1), em_dtype_name(bad[i]), NULL);
        assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    }
    em_test_assert_error(em_rand_uniform(SHAPE(4), 1, EM_F32, 2, 1), NULL);
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    em_test_assert_error(em_rand_normal(SHAPE(4), 1, EM_F32, 0, -1), NULL);
    em_test_assert_error(em_rand_bernoulli(SHAPE(4), 1, EM_F32, 1.5), NULL);
    em_test_assert_error(em_rand_bernoulli(SHAPE(4), 1, EM_F32, NAN), NULL);
    em_test_assert_error(em_rand_uniform(SHAPE(2, -1), 2, EM_F32, 0, 1), "negative", NULL);
    em_test_assert_error(em_rand_uniform(NULL, 2, EM_F32, 0, 1), "NULL", NULL); /* NULL shape: no crash */
    em_test_assert_error(em_rand_normal(NULL, 1, EM_F32, 0, 1), "NULL", NULL);
}

/* ---- printing ------------------------------------------------------------------ */

/* Expected strings are what PyTorch (torch.set_printoptions defaults) prints. */
static void test_print_basic(void **state)
{
    (void)state;
    expect_str(F32((2, 2), 1, 2, 3, 4), "tensor([[1., 2.],\n        [3., 4.]])");
    expect_str(T(EM_I64, (3), 1, 2, 3), "tensor([1, 2, 3])");
    expect_str(T(EM_BOOL, (2), 1, 0), "tensor([ True, False])");
    expect_str(F64((2), 1.5, 2), "tensor([1.5000, 2.0000], dtype=torch.float64)");
    expect_str(em_scalar(3.5, EM_F32), "tensor(3.5000)");
    expect_str(em_scalar(3, EM_F32), "tensor(3.)");
    expect_str(em_scalar(7, EM_I64), "tensor(7)");
    expect_str(em_scalar(1, EM_BOOL), "tensor(True)");
    expect_str(em_scalar(-2, EM_I32), "tensor(-2, dtype=torch.int32)");
    expect_str(em_scalar(0.5, EM_F64), "tensor(0.5000, dtype=torch.float64)");
    expect_str(T(EM_I32, (3), 1, 2, 3), "tensor([1, 2, 3], dtype=torch.int32)");
    expect_str(T(EM_U8, (2), 0, 255), "tensor([  0, 255], dtype=torch.uint8)");
    expect_str(T(EM_I64, (2), -10, 5), "tensor([-10,   5])");
    expect_str(F32((2), -1.5, 2.25), "tensor([-1.5000,  2.2500])");
    expect_str(F32((2), 0.1, 0.25), "tensor([0.1000, 0.2500])");
    expect_str(F32((3), -1, 2, 0), "tensor([-1.,  2.,  0.])");
    expect_str(F32((3), 0, 100, 0), "tensor([  0., 100.,   0.])");
    expect_str(F32((2), 0, 0), "tensor([0., 0.])");
    expect_str(F32((2), 1, 1000), "tensor([   1., 1000.])");
    expect_str(F32((3), 0.5, 0, 12.125), "tensor([ 0.5000,  0.0000, 12.1250])");
    expect_str(F32((2), 1e-5, 1.0), "tensor([1.0000e-05, 1.0000e+00])");
    expect_str(F32((2), -1e-5, 1.0), "tensor([-1.0000e-05,  1.0000e+00])");
    expect_str(F32((1), 123456789.0f), "tensor([1.2346e+08])");
    expect_str(F32((2), 0.5, 2000), "tensor([5.0000e-01, 2.0000e+03])");
    expect_str(F32((2), NAN, 1.5), "tensor([   nan, 1.5000])");
    expect_str(F32((3), -INFINITY, 1.5, INFINITY), "tensor([  -inf, 1.5000,    inf])");
    expect_str(F32((2, 1, 2), 1, 2, 3, 4), "tensor([[[1., 2.]],\n\n        [[3., 4.]]])");
    expect_str(T(EM_I64, (2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8),
               "tensor([[[1, 2],\n         [3, 4]],\n\n        [[5, 6],\n         [7, 8]]])");
    expect_str(T(EM_BOOL, (2, 2), 1, 0, 0, 1), "tensor([[ True, False],\n        [False,  True]])");
    /* views print their own elements, in their own order */
    em_scope_begin();
    em_tensor *m = F32((2, 3), 1, 2, 3, 4, 5, 6);
    expect_str(em_tensor_retain(em_transpose(m, 0, 1)), "tensor([[1., 4.],\n        [2., 5.],\n        [3., 6.]])");
    expect_str(em_tensor_retain(em_slice(m, 1, 1, 3, 1)), "tensor([[2., 3.],\n        [5., 6.]])");
    expect_str(em_tensor_retain(em_slice(em_reshape(m, SHAPE(6), 1), 0, 1, 6, 2)), "tensor([2., 4., 6.])");
    em_scope_end();
}

static void test_print_summarized(void **state)
{
    (void)state;
    /* torch.zeros(1000, 2) */
    expect_str(em_zeros(SHAPE(1000, 2), 2, EM_F32),
               "tensor([[0., 0.],\n        [0., 0.],\n        [0., 0.],\n        ...,\n"
               "        [0., 0.],\n        [0., 0.],\n        [0., 0.]])");
    /* 3-D: the middle dim is summarised too */
    em_tensor *big = em_zeros(SHAPE(2, 300, 2), 3, EM_I64);
    char *s = em_tensor_to_string(big);
    assert_non_null(s);
    assert_non_null(strstr(s, "tensor([[[0, 0],\n         [0, 0],\n         [0, 0],\n         ...,\n"));
    free(s);
    em_tensor_release(big);
}

/* Cases where the printed form is easy to get subtly different from PyTorch:
 * every mismatch is listed, then the test fails once. */
static int soft_str(em_tensor *t, const char *want)
{
    char *s = em_tensor_to_string(t);
    int bad = !s || strcmp(s, want) != 0;
    if (bad) fprintf(stderr, "  printed:  %s\n  PyTorch:  %s\n", s ? s : "(NULL)", want);
    free(s);
    em_tensor_release(t);
    return bad;
}

static void test_print_pytorch_edge_cases(void **state)
{
    (void)state;
    int bad = 0;
    /* summarised 1-D: PyTorch's " ..." element gives two spaces before "..." */
    bad += soft_str(em_arange(0, 2000, 1, EM_I64), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
    /* width comes from the non-zero finite values only */
    bad += soft_str(F32((2), 1, INFINITY), "tensor([1., inf])");
    bad += soft_str(F32((2), 1, NAN), "tensor([1., nan])");
    bad += soft_str(F32((2), -0.0, 1), "tensor([-0., 1.])");
    /* integral floats also switch to scientific when max/min > 1000 */
    bad += soft_str(F32((2), 1, 1001), "tensor([1.0000e+00, 1.0010e+03])");
    /* empty tensors: size only when not 1-D, as a tuple; dtype always unless float32 */
    bad += soft_str(em_zeros(SHAPE(0), 1, EM_F32), "tensor([])");
    bad += soft_str(em_zeros(SHAPE(0, 3), 2, EM_F32), "tensor([], size=(0, 3))");
    bad += soft_str(em_zeros(SHAPE(0), 1, EM_I64), "tensor([], dtype=torch.int64)");
    /* long 1-D tensors wrap at 80 columns */
    bad += soft_str(em_arange(0, 30, 1, EM_I64),
                    "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
                    "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
    /* when summarised, the width comes from the elements shown only */
    float *hidden = calloc(2000, sizeof(float));
    assert_non_null(hidden);
    hidden[1000] = 12345;
    bad += soft_str(em_from_host(hidden, SHAPE(2000), 1, EM_F32), "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
    free(hidden);
    /* int64 printed exactly, beyond 2^53 */
    const int64_t big = ((int64_t)1 << 53) + 1;
    bad += soft_str(em_from_host(&big, SHAPE(1), 1, EM_I64), "tensor([9007199254740993])");
    /* summarised outer dim of a 3-D tensor: "..." separated like the slices (blank lines) */
    bad += soft_str(em_zeros(SHAPE(7, 1, 200), 3, EM_I64),
                    "tensor([[[0, 0, 0,  ..., 0, 0, 0]],\n\n        [[0, 0, 0,  ..., 0, 0, 0]],\n\n"
                    "        [[0, 0, 0,  ..., 0, 0, 0]],\n\n        ...,\n\n        [[0, 0, 0,  ..., 0, 0, 0]],\n\n"
                    "        [[0, 0, 0,  ..., 0, 0, 0]],\n\n        [[0, 0, 0,  ..., 0, 0, 0]]])");
    /* a suffix that would pass 80 columns goes on its own line */
    bad += soft_str(F64((5), 1.5e9, 1.5e9, 1.5e9, 1.5e9, 1.5e9),
                    "tensor([1.5000e+09, 1.5000e+09, 1.5000e+09, 1.5000e+09, 1.5000e+09],\n"
                    "       dtype=torch.float64)");
    /* sci mode pads nan/inf to the width */
    bad += soft_str(F32((4), NAN, -INFINITY, 0.5, 1e-5), "tensor([       nan,       -inf, 5.0000e-01, 1.0000e-05])");
    if (bad) fail_msg("%d printed form(s) differ from PyTorch's (listed above)", bad);
}

static void test_print_file(void **state)
{
    (void)state;
    em_tensor *t = T(EM_I64, (2), 4, 5);
    char buf[128] = {0};
    FILE *f = fmemopen(buf, sizeof buf, "w");
    assert_non_null(f);
    assert_int_equal(em_tensor_print(t, f), EM_OK);
    fclose(f);
    assert_string_equal(buf, "tensor([4, 5])\n");
    em_tensor_release(t);
    assert_null(em_tensor_to_string(NULL));
    assert_int_not_equal(em_tensor_print(NULL, stderr), EM_OK);
}

/* ---- errors ------------------------------------------------------------------- */

static void test_rank_and_size_errors(void **state)
{
    (void)state;
    const int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const float data[4] = {0};
    em_clear_error();
    em_test_assert_error(em_zeros(s9, 9, EM_F32), "rank 9", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_full(s9, 9, EM_I64, 1), "rank 9", NULL);
    em_test_assert_error(em_from_host(data, s9, 9, EM_F32), "rank 9", NULL);
    em_test_assert_error(em_rand_uniform(s9, 9, EM_F32, 0, 1), "rank 9", NULL);
    em_test_assert_error(em_zeros(s9, -1, EM_F32), "rank -1", NULL);

    em_clear_error();
    em_test_assert_error(em_zeros(SHAPE(2, -3), 2, EM_F32), "negative", "[2, -3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_ones(SHAPE(-1), 1, EM_I32), "negative", "[-1]", NULL);
    em_test_assert_error(em_from_host(data, SHAPE(-2, -2), 2, EM_F32), "negative", NULL);
    em_test_assert_error(em_rand_normal(SHAPE(3, -1), 2, EM_F32, 0, 1), "negative", NULL);
    em_test_assert_error(em_zeros(NULL, 2, EM_F32), "NULL", NULL);
    em_test_assert_error(em_from_host(NULL, NULL, 2, EM_F32), NULL); /* no crash */
    em_test_assert_error(em_from_host(data, NULL, 2, EM_F32), NULL);

    char buf[64];
    assert_string_equal(em_shape_str(SHAPE(2, 3), 2, buf, sizeof buf), "[2, 3]");
    assert_string_equal(em_shape_str(NULL, 0, buf, sizeof buf), "[]");
    char tiny[4];
    em_shape_str(SHAPE(123, 456), 2, tiny, sizeof tiny); /* truncates, never overflows */
    assert_true(strlen(tiny) < sizeof tiny);
}

static void test_null_inputs(void **state)
{
    (void)state;
    em_tensor *x = F32((2), 1, 2);
    em_tensor *m = T(EM_BOOL, (2), 1, 0);
    int dim0 = 0;
    double v;
#define NULL_CASE(expr)                                                     \
    do {                                                                    \
        em_clear_error();                                                   \
        em_tensor *r_ = (expr);                                             \
        if (r_) fail_msg("%s returned a tensor for a NULL input", #expr);   \
        if (!em_last_error()[0]) fail_msg("%s set no error message", #expr); \
        if (em_last_status() == EM_OK) fail_msg("%s set no error status", #expr); \
    } while (0)
    NULL_CASE(em_neg(NULL));
    NULL_CASE(em_exp(NULL));
    NULL_CASE(em_relu(NULL));
    NULL_CASE(em_clamp(NULL, 0, 1));
    NULL_CASE(em_pow_scalar(NULL, 2));
    NULL_CASE(em_logical_not(NULL));
    NULL_CASE(em_add(NULL, x));
    NULL_CASE(em_add(x, NULL));
    NULL_CASE(em_mul(NULL, NULL));
    NULL_CASE(em_eq(x, NULL));
    NULL_CASE(em_add_scalar(NULL, 1));
    NULL_CASE(em_where(NULL, x, x));
    NULL_CASE(em_where(m, NULL, x));
    NULL_CASE(em_where(m, x, NULL));
    NULL_CASE(em_masked_fill(NULL, m, 0));
    NULL_CASE(em_masked_fill(x, NULL, 0));
    NULL_CASE(em_sum(NULL, NULL, 0, false));
    NULL_CASE(em_mean(NULL, &dim0, 1, false));
    NULL_CASE(em_max(NULL, NULL, 0, false));
    NULL_CASE(em_argmax(NULL, 0, false));
    NULL_CASE(em_var(NULL, NULL, 0, 1, false));
    NULL_CASE(em_std(NULL, NULL, 0, 1, false));
    NULL_CASE(em_logsumexp(NULL, NULL, 0, false));
    NULL_CASE(em_sum_all(NULL));
    NULL_CASE(em_mean_all(NULL));
    NULL_CASE(em_softmax(NULL, 0));
    NULL_CASE(em_log_softmax(NULL, -1));
    NULL_CASE(em_zeros_like(NULL));
    NULL_CASE(em_ones_like(NULL));
    NULL_CASE(em_full_like(NULL, 2));
    /* a chain fails once, cleanly */
    NULL_CASE(em_exp(em_add(x, NULL)));
    NULL_CASE(em_sum(em_mul(em_exp(NULL), x), NULL, 0, false));
#undef NULL_CASE
    assert_int_equal(em_item(NULL, &v), EM_ERR_INVALID);
    assert_null(em_keep(NULL));
    em_tensor_release(NULL); /* no-op */
    assert_int_equal(em_tensor_numel(NULL), -1);
    assert_int_equal(em_tensor_ndim(NULL), -1);
    assert_null(em_tensor_shape(NULL));
    assert_false(em_tensor_is_contiguous(NULL));
    assert_false(em_tensor_shares_storage(x, NULL));
    em_tensor_release(x);
    em_tensor_release(m);
}

/* ---- scopes and leaks ---------------------------------------------------------- */

static void test_scope_releases(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_scope_begin();
    em_tensor *a = em_ones(SHAPE(4), 1, EM_F32);
    em_tensor *b = em_add(a, a);
    em_tensor *c = em_exp(b);
    em_tensor *d = em_sum_all(c);
    em_test_assert_close(d, VALS(4 * exp(2.0)), 1e-6, 0);
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 4);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages + 4);
    em_scope_end();
    em_stats s1 = em_get_stats();
    assert_int_equal(s1.live_tensors, s0.live_tensors);
    assert_int_equal(s1.live_storages, s0.live_storages);
}

static void test_scope_keep(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_scope_begin();
    em_tensor *a = em_arange(0, 3, 1, EM_F32);
    em_tensor *b = em_mul_scalar(a, 2);
    em_tensor *kept = em_keep(em_add_scalar(b, 1));
    assert_ptr_not_equal(kept, NULL);
    em_scope_end();
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 1);
    em_test_assert_close(kept, VALS(1, 3, 5), 0, 0); /* still alive and readable */
    em_tensor_release(kept);
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages);

    /* keep of a tensor made outside any scope is a no-op */
    em_tensor *o = em_zeros(SHAPE(2), 1, EM_F32);
    em_scope_begin();
    assert_ptr_equal(em_keep(o), o);
    em_scope_end();
    em_test_assert_close(o, VALS(0, 0), 0, 0);
    em_tensor_release(o);

    /* a retained scope tensor outlives the scope with one reference */
    em_scope_begin();
    em_tensor *r = em_tensor_retain(em_ones(SHAPE(3), 1, EM_I32));
    em_scope_end();
    em_test_assert_close(r, VALS(1, 1, 1), 0, 0);
    em_tensor_release(r);
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
}

static void test_scope_nested(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_scope_begin();
    em_tensor *outer = em_ones(SHAPE(2), 1, EM_F32);
    em_tensor *mid_kept = NULL;
    em_scope_begin();
    em_tensor *in1 = em_add(outer, outer);
    em_tensor *in2 = em_mul(in1, in1);
    (void)in2;
    em_scope_begin();
    em_tensor *deep = em_add_scalar(in1, 10);
    em_tensor *up2 = em_keep(em_keep(em_neg(deep))); /* two levels up: to the outer scope */
    em_keep(deep);                                    /* one level up: to the middle scope */
    em_scope_end();
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 5);
    mid_kept = em_keep(em_sub(deep, in1)); /* to the outer scope */
    em_scope_end();
    /* outer scope: outer, up2, mid_kept */
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 3);
    em_test_assert_close(up2, VALS(-12, -12), 0, 0);
    em_test_assert_close(mid_kept, VALS(10, 10), 0, 0);
    em_test_assert_close(outer, VALS(1, 1), 0, 0);
    em_scope_end();
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages);
}

static void test_scope_early_release(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_scope_begin();
    em_tensor *a = em_ones(SHAPE(8), 1, EM_F32);
    em_tensor *b = em_exp(a);
    em_tensor *c = em_add(a, b);
    em_tensor_release(b); /* early, while c's task may still read it */
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 2);
    em_test_assert_close(c, VALS(1 + M_E, 1 + M_E, 1 + M_E, 1 + M_E, 1 + M_E, 1 + M_E, 1 + M_E, 1 + M_E), 1e-6, 0);
    em_tensor_release(a);
    em_tensor_release(c);
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    em_tensor *d = em_zeros(SHAPE(3), 1, EM_F32);
    (void)d;
    em_scope_end(); /* releases d only; no double release of a, b, c */
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages);
    assert_int_equal(em_sync(), EM_OK);
}

static void test_scope_unbalanced(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_log_level lvl = em_get_log_level();
    em_set_log_level(EM_LOG_ERROR); /* the warning is expected */
    em_scope_end();                 /* no open scope: warns, does not crash */
    em_set_log_level(lvl);
    em_scope_begin();
    em_tensor *a = em_ones(SHAPE(2), 1, EM_F32);
    em_scope_end();
    (void)a;
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    /* deep nesting (beyond the initial scope stack capacity) */
    for (int i = 0; i < 40; i++) {
        em_scope_begin();
        em_tensor_release(em_tensor_retain(em_zeros(SHAPE(1), 1, EM_F32)));
    }
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 40);
    for (int i = 0; i < 40; i++) em_scope_end();
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    /* many tensors in one scope (beyond the initial item capacity) */
    em_scope_begin();
    for (int i = 0; i < 300; i++) em_scalar(i, EM_F32);
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 300);
    em_scope_end();
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages);
}

static void test_scope_views(void **state)
{
    (void)state;
    em_stats s0 = em_get_stats();
    em_scope_begin();
    em_tensor *a = em_arange(0, 6, 1, EM_F32);
    em_tensor *v = em_keep(em_reshape(a, SHAPE(2, 3), 2));
    assert_true(em_tensor_shares_storage(a, v));
    em_scope_end();
    /* the view keeps the storage alive */
    assert_int_equal(em_get_stats().live_tensors, s0.live_tensors + 1);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages + 1);
    em_test_assert_close(v, VALS(0, 1, 2, 3, 4, 5), 0, 0);
    em_tensor_release(v);
    assert_int_equal(em_get_stats().live_storages, s0.live_storages);
}

static void leak_iteration(int i)
{
    em_scope_begin();
    float host[6] = {(float)i, 1, 2, 3, 4, 5};
    em_tensor *x = em_from_host(host, SHAPE(2, 3), 2, EM_F32);
    em_tensor *z = em_zeros(SHAPE(2, 3), 2, EM_F32);
    em_tensor *r = em_arange(0, 3, 1, EM_F32);
    em_tensor *y = em_add(em_mul(x, z), r);            /* broadcast */
    em_tensor *e = em_exp(em_mul_scalar(y, 0.01));
    em_tensor *s = em_sum(e, (const int[]){1}, 1, true);
    em_tensor *m = em_mean_all(e);
    em_tensor *mx = em_max(x, (const int[]){0}, 1, false);
    em_tensor *am = em_argmax(x, 1, false);
    em_tensor *sm = em_softmax(x, -1);
    em_tensor *w = em_where(em_gt(x, z), x, z);
    em_tensor *mf = em_masked_fill(x, em_lt_scalar(x, 2), 0);
    em_tensor *l = em_linspace(0, 1, 4, EM_F64);
    em_tensor *rnd = em_rand_uniform(SHAPE(5), 1, EM_F32, 0, 1);
    em_tensor *inner_keep = NULL;
    em_scope_begin();
    inner_keep = em_keep(em_add(s, s));
    em_tensor_release(em_tensor_retain(inner_keep));
    em_scope_end();
    em_tensor *early = em_neg(inner_keep);
    em_tensor_release(early);
    (void)m, (void)mx, (void)am, (void)sm, (void)w, (void)mf, (void)l, (void)rnd;
    em_scope_end();
}

/* A step fence (tasks/tasks_internal.h, used by dist/): an op whose `after` is
 * the fence waits for every tensor the fence was signalled after. The
 * optimizer sets it on its updates when the gradients carry a fence (as the
 * all-reduce leaves them). The test holds x (starpu_data_acquire), so the
 * fence cannot be signalled, and the SGD update of w, which reads the fence,
 * cannot have run, whatever the timing; once x is released, w gets its
 * value. */
static void test_step_fence_orders_tasks(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *x = em_zeros(SHAPE(4), 1, EM_F32);
    em_tensor *w = em_full(SHAPE(4), 1, EM_F32, 8.0);
    em_tensor *gw = em_full(SHAPE(4), 1, EM_F32, 1.0);
    em_grads *g = em_grads_new();
    assert_non_null(g);
    assert_int_equal(em_grads_set(g, w, gw), EM_OK);
    em_optim *opt = em_sgd_new(&w, 1, 1.0, 0.0, 0.0);
    assert_non_null(opt);
    assert_int_equal(em_sync(), EM_OK);
    starpu_data_handle_t hx = x->storage->handle;
    assert_int_equal(starpu_data_acquire(hx, STARPU_RW), 0);
    void *fence = NULL;
    assert_int_equal(em__fence_signal(&fence, &x, 1), EM_OK);
    assert_non_null(fence);
    em__grads_set_fence(g, &fence);
    assert_int_equal(em_optim_step(opt, g), EM_OK); /* w -= 1 * gw, after the fence, priority -1 */
    em_tensor *z = em_full(SHAPE(4), 1, EM_F32, 1.0); /* submitted after, without the fence: not held back */
    double v = 0;
    assert_int_equal(em_item(em_sum_all(z), &v), EM_OK);
    assert_true(v == 4.0);
    usleep(20000); /* time enough for an unfenced update to run: a broken fence fails below */
    int held = starpu_data_acquire_try(w->storage->handle, STARPU_R); /* -EAGAIN: w's update still waits for the fence */
    if (held == 0) starpu_data_release(w->storage->handle);
    starpu_data_release(hx); /* before any assertion: a failed one must not leave x held at shutdown */
    assert_int_equal(held, -EAGAIN);
    assert_int_equal(em_item(em_sum_all(w), &v), EM_OK);
    assert_true(v == 28.0);
    em_optim_free(opt);
    em_grads_free(g);
    em_scope_end();
    em__fence_free(&fence);
    assert_null(fence);
}

/* A gradient container keeps its fence when it grows (the all-reduce
 * replaces entries after attaching it), and forgets it once the owner's
 * slot is cleared (dist shutdown). */
static void test_step_fence_in_grads(void **state)
{
    (void)state;
    em_scope_begin();
    em_grads *g = em_grads_new();
    assert_non_null(g);
    void *slot = (void *)&slot; /* any non-NULL handle value */
    em__grads_set_fence(g, &slot);
    em_tensor *keys[40];
    for (int i = 0; i < 40; i++) { /* grows the container twice */
        keys[i] = em_zeros(SHAPE(1), 1, EM_F32);
        assert_int_equal(em_grads_set(g, keys[i], em_zeros(SHAPE(1), 1, EM_F32)), EM_OK);
    }
    assert_ptr_equal(em__grads_fence(g), slot);
    slot = NULL;
    assert_null(em__grads_fence(g));
    em_grads_free(g);
    em_scope_end();
}

static void test_leak_check(void **state)
{
    (void)state;
    const int iters = 2000, warmup = 5;
    for (int i = 0; i < warmup; i++) leak_iteration(i);
    assert_int_equal(em_sync(), EM_OK);
    em_stats s0 = em_get_stats();
    int bad_iter = -1;
    em_stats bad = {0};
    for (int i = warmup; i < iters; i++) {
        leak_iteration(i);
        em_stats s = em_get_stats();
        if (bad_iter < 0 && (s.live_tensors != s0.live_tensors || s.live_storages != s0.live_storages ||
                             s.handles != s0.handles || s.pooled != s0.pooled)) {
            bad_iter = i;
            bad = s;
        }
    }
    assert_int_equal(em_sync(), EM_OK);
    if (bad_iter >= 0)
        fail_msg("iteration %d: live_tensors %lld (was %lld), live_storages %lld (was %lld), handles %lld (was %lld), "
                 "pooled %lld (was %lld)",
                 bad_iter, (long long)bad.live_tensors, (long long)s0.live_tensors, (long long)bad.live_storages,
                 (long long)s0.live_storages, (long long)bad.handles, (long long)s0.handles, (long long)bad.pooled,
                 (long long)s0.pooled);
    em_stats s1 = em_get_stats();
    assert_int_equal(s1.live_tensors, s0.live_tensors);
    assert_int_equal(s1.live_storages, s0.live_storages);
    assert_int_equal(s1.handles, s0.handles);
    assert_true(s1.tasks_submitted > s0.tasks_submitted + (int64_t)(iters - warmup) * 10);
    /* the last iteration's results were right (the loop did real work) */
    em_scope_begin();
    em_tensor *x = F32((2, 3), 5, 1, 2, 3, 4, 5);
    double z0 = exp(5.0) + exp(1.0) + exp(2.0), z1 = exp(3.0) + exp(4.0) + exp(5.0);
    em_test_assert_close(em_softmax(x, 1),
                         VALS(exp(5.0) / z0, exp(1.0) / z0, exp(2.0) / z0, exp(3.0) / z1, exp(4.0) / z1, exp(5.0) / z1),
                         1e-6, 1e-7);
    em_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_twice),
        cmocka_unit_test(test_device_parse),
        cmocka_unit_test(test_set_device),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_zeros_ones_full),
        cmocka_unit_test(test_scalar_item),
        cmocka_unit_test(test_arange),
        cmocka_unit_test(test_linspace),
        cmocka_unit_test(test_eye),
        cmocka_unit_test(test_from_host_roundtrip),
        cmocka_unit_test(test_rand_reproducible),
        cmocka_unit_test(test_rand_state),
        cmocka_unit_test(test_rand_counter_based),
        cmocka_unit_test(test_rand_distributions),
        cmocka_unit_test(test_rand_errors),
        cmocka_unit_test(test_print_basic),
        cmocka_unit_test(test_print_summarized),
        cmocka_unit_test(test_print_pytorch_edge_cases),
        cmocka_unit_test(test_print_file),
        cmocka_unit_test(test_rank_and_size_errors),
        cmocka_unit_test(test_null_inputs),
        cmocka_unit_test(test_scope_releases),
        cmocka_unit_test(test_scope_keep),
        cmocka_unit_test(test_scope_nested),
        cmocka_unit_test(test_scope_early_release),
        cmocka_unit_test(test_scope_unbalanced),
        cmocka_unit_test(test_scope_views),
        cmocka_unit_test(test_step_fence_orders_tasks),
        cmocka_unit_test(test_step_fence_in_grads),
        cmocka_unit_test(test_leak_check),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
