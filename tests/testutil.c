#define _GNU_SOURCE
#include "testutil.h"

#include <ftw.h>
#include <sys/stat.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int em_test_setup(void **state)
{
    (void)state;
    em_config c = em_config_default();
    if (em_init(&c) != EM_OK) {
        fprintf(stderr, "em_init failed: %s\n", em_last_error());
        return -1;
    }
    return 0;
}

int em_test_teardown(void **state)
{
    (void)state;
    em_shutdown();
    return 0;
}

double *em_test_values(const em_tensor *t)
{
    assert_non_null(t);
    int64_t n = em_tensor_numel(t);
    size_t es = em_dtype_size(em_tensor_dtype(t));
    char *raw = malloc((size_t)(n ? n : 1) * es);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    assert_non_null(raw);
    assert_non_null(v);
    if (em_to_host(t, raw, (size_t)n * es) != EM_OK) fail_msg("em_to_host: %s", em_last_error());
    for (int64_t i = 0; i < n; i++) {
        const char *p = raw + i * (int64_t)es;
        switch (em_tensor_dtype(t)) {
        case EM_F32: v[i] = *(const float *)p; break;
        case EM_F64: v[i] = *(const double *)p; break;
        case EM_I32: v[i] = *(const int32_t *)p; break;
        case EM_I64: v[i] = (double)*(const int64_t *)p; break;
        default: v[i] = *(const uint8_t *)p; break;
        }
    }
    free(raw);
    return v;
}

void em_test_assert_shape(const em_tensor *t, int ndim, const int64_t *shape)
{
    assert_non_null(t);
    char a[200], b[200];
    if (em_tensor_ndim(t) != ndim || (ndim && memcmp(em_tensor_shape(t), shape, sizeof(int64_t) * (size_t)ndim)))
        fail_msg("shape %s, expected %s", em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), a, sizeof a),
                 em_shape_str(shape, ndim, b, sizeof b));
}

static bool close_enough(double got, double want, double rtol, double atol)
{
    return (isnan(want) && isnan(got)) || (isinf(want) && got == want) || fabs(got - want) <= atol + rtol * fabs(want);
}

static void check_values(const em_tensor *t, const double *want, int64_t n, double rtol, double atol, const char *what)
{
    if (em_tensor_numel(t) != n) fail_msg("%s: numel %lld, expected %lld", what, (long long)em_tensor_numel(t), (long long)n);
    double *v = em_test_values(t);
    for (int64_t i = 0; i < n; i++)
        if (!close_enough(v[i], want[i], rtol, atol)) {
            double got = v[i];
            free(v);
            fail_msg("%s: element %lld: got %.9g, expected %.9g", what, (long long)i, got, want[i]);
        }
    free(v);
}

void em_test_assert_close(const em_tensor *t, const double *want, int64_t n, double rtol, double atol)
{
    if (!t) fail_msg("tensor is NULL: %s", em_last_error());
    check_values(t, want, n, rtol, atol, "values");
}

void em_test_check_dtype(const em_tensor *t, em_dtype dt, const char *what)
{
    if (!t) fail_msg("%s: NULL (%s)", what, em_last_error());
    if (em_tensor_dtype(t) != dt)
        fail_msg("%s: dtype %s, expected %s", what, em_dtype_name(em_tensor_dtype(t)), em_dtype_name(dt));
}

void em_test_expect(em_tensor *r, em_dtype dt, const double *want, int64_t n, double rtol, double atol, const char *what)
{
    em_test_check_dtype(r, dt, what);
    check_values(r, want, n, rtol, atol, what);
    em_tensor_release(r);
}

void em_test_assert_error(const em_tensor *r, ...)
{
    if (r) fail_msg("expected an error, got a tensor");
    const char *msg = em_last_error();
    va_list ap;
    va_start(ap, r);
    const char *s;
    while ((s = va_arg(ap, const char *)))
        if (!strstr(msg, s)) {
            va_end(ap);
            fail_msg("error message '%s' does not contain '%s'", msg, s);
        }
    va_end(ap);
}

em_tensor *em_test_f32(const float *v, const int64_t *shape, int ndim)
{
    em_tensor *t = em_from_host(v, shape, ndim, EM_F32);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

em_tensor *em_test_f64(const double *v, const int64_t *shape, int ndim)
{
    em_tensor *t = em_from_host(v, shape, ndim, EM_F64);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

em_tensor *em_test_make(em_dtype dt, const double *v, const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    size_t es = em_dtype_size(dt);
    char *raw = calloc((size_t)(n ? n : 1), es);
    assert_non_null(raw);
    for (int64_t i = 0; i < n; i++) {
        char *p = raw + i * (int64_t)es;
        switch (dt) {
        case EM_F32: *(float *)p = (float)v[i]; break;
        case EM_F64: *(double *)p = v[i]; break;
        case EM_I32: *(int32_t *)p = (int32_t)v[i]; break;
        case EM_I64: *(int64_t *)p = (int64_t)v[i]; break;
        case EM_U8: *(uint8_t *)p = (uint8_t)v[i]; break;
        case EM_BOOL: *(uint8_t *)p = v[i] != 0; break;
        default: fail_msg("em_test_make: bad dtype");
        }
    }
    em_tensor *t = em_from_host(raw, shape, ndim, dt);
    free(raw);
    if (!t) fail_msg("em_from_host: %s", em_last_error());
    return t;
}

static char g_tmpdir[256];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

int em_test_setup_tmpdir(void **state)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/ember_test_XXXXXX");
    if (!mkdtemp(g_tmpdir)) return -1;
    return em_test_setup(state);
}

int em_test_teardown_tmpdir(void **state)
{
    nftw(g_tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return em_test_teardown(state);
}

const char *em_test_tmp_dir(void) { return g_tmpdir; }

char *em_test_tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", g_tmpdir, name);
    return p;
}

void em_test_class_batch(uint64_t seed, int64_t n, int64_t features, int64_t classes, float *x, int64_t *y)
{
    uint64_t s = seed;
#define NEXT() (s = s * 6364136223846793005ULL + 1442695040888963407ULL, (double)(s >> 11) / 9007199254740992.0)
    for (int64_t i = 0; i < n * features; i++) x[i] = (float)(NEXT() * 2 - 1);
    for (int64_t i = 0; i < n; i++) y[i] = (int64_t)(NEXT() * (double)classes) % classes;
#undef NEXT
}

double em_test_max_param_diff(const em_module *a, const em_module *b)
{
    em_tensor *pa[16], *pb[16];
    int na = em_module_parameters(a, pa, 16), nb = em_module_parameters(b, pb, 16);
    if (na != nb) return INFINITY;
    double worst = 0;
    for (int i = 0; i < na; i++) {
        double *va = em_test_values(pa[i]), *vb = em_test_values(pb[i]);
        for (int64_t j = 0; j < em_tensor_numel(pa[i]); j++) worst = fmax(worst, fabs(va[j] - vb[j]));
        free(va);
        free(vb);
    }
    return worst;
}

int em_test_list_devices(em_test_dev *devs, int max)
{
    int n = 0;
    devs[n].d = em_device_cpu();
    snprintf(devs[n++].name, sizeof devs[0].name, "cpu");
    const em_device_kind kinds[] = {EM_DEVICE_CUDA, EM_DEVICE_OPENCL};
    for (int k = 0; k < 2; k++) {
        if (em_worker_count(kinds[k]) <= 0) continue;
        for (int i = 0; i < 16 && n < max; i++) {
            em_device d = {kinds[k], i};
            if (em_set_device(d) != EM_OK) continue;
            devs[n].d = d;
            em_device_str(d, devs[n].name, sizeof devs[n].name);
            n++;
        }
    }
    em_set_device(em_device_cpu());
    return n;
}

void em_test_assert_no_leak(const em_stats *before)
{
    em_sync();
    em_stats now = em_get_stats();
    if (now.live_tensors != before->live_tensors || now.handles != before->handles)
        fail_msg("leak: live tensors %lld -> %lld, handles %lld -> %lld", (long long)before->live_tensors,
                 (long long)now.live_tensors, (long long)before->handles, (long long)now.handles);
}
