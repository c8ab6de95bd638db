/* f16 and bf16 as storage types (issue #15, DESIGN.md §7):
 *   - casts to and from every dtype, bit for bit against PyTorch on every
 *     device present (tests/fixtures/half_fixtures.txt, made by
 *     gen_half_fixtures.py): subnormals, ties, overflow, +-inf; a NaN must
 *     stay a NaN (PyTorch's own NaN bits differ between its code paths, so
 *     they are not compared);
 *   - printing as PyTorch prints (the repr strings of the fixture);
 *   - a SafeTensors file with BF16 and F16 tensors written by PyTorch loads
 *     bit-exact, and Ember writes them back as BF16 / F16;
 *   - dtype promotion (PyTorch's result_type);
 *   - the door's widening (ops whose kernels do not take 16 bits: f32
 *     copies in, the f32 kernel, rounding copies out) gives exactly the
 *     f32 result rounded once, for an ordinary op (matmul), an op writing a
 *     view of a 16-bit tensor, and an in-place op (an optimizer step);
 *   - the native 16-bit element-wise kernels compute in f32: the result is
 *     the f32 op on the widened inputs, rounded once. */
#define _GNU_SOURCE
#include "testutil.h"

#include "ember/ember.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *data_path(const char *name, char *buf, size_t n)
{
    const char *dir = getenv("EMBER_TEST_DATA");
    snprintf(buf, n, "%s/%s", dir ? dir : "tests/fixtures", name);
    return buf;
}

static em_dtype dtype_of(const char *s)
{
    for (int d = 0; d < EM_DTYPE_COUNT; d++)
        if (!strcmp(s, em_dtype_name((em_dtype)d))) return (em_dtype)d;
    fail_msg("unknown dtype '%s' in the fixture", s);
    return EM_DTYPE_COUNT;
}

/* Parses n hexadecimal words of dtype dt's width from *s into buf. */
static void parse_bits(char **s, em_dtype dt, int64_t n, void *buf)
{
    size_t es = em_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        char *end;
        unsigned long long v = strtoull(*s, &end, 16);
        if (end == *s) fail_msg("fixture: expected %lld values", (long long)n);
        *s = end;
        memcpy((char *)buf + (size_t)i * es, &v, es); /* little-endian */
    }
}

static bool is_nan_bits(em_dtype dt, const void *p)
{
    uint64_t u = 0;
    memcpy(&u, p, em_dtype_size(dt));
    switch (dt) {
    case EM_F16: return (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
    case EM_BF16: return (u & 0x7f80) == 0x7f80 && (u & 0x7f);
    case EM_F32: return (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffff);
    case EM_F64: return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (u & 0xfffffffffffffull);
    default: return false;
    }
}


/* One cast line: src -> dst on device d; returns the number of mismatches (prints the first few). */
static int check_cast(em_dtype src, em_dtype dst, int64_t n, const void *in, const void *want, const char *dname)
{
    em_scope_begin();
    int64_t shape[1] = {n};
    em_tensor *x = em_from_host(in, shape, 1, src);
    em_tensor *y = x ? em_cast(x, dst) : NULL;
    if (!y) fail_msg("[%s] cast %s -> %s: %s", dname, em_dtype_name(src), em_dtype_name(dst), em_last_error());
    size_t es = em_dtype_size(dst), is = em_dtype_size(src);
    char *got = malloc((size_t)n * es);
    assert_int_equal(em_to_host(y, got, (size_t)n * es), EM_OK);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *g = got + (size_t)i * es, *w = (const char *)want + (size_t)i * es;
        bool ok = is_nan_bits(dst, w) ? is_nan_bits(dst, g) : !memcmp(g, w, es);
        if (!ok && bad++ < 5) {
            uint64_t a = 0, b = 0, s = 0;
            memcpy(&a, g, es);
            memcpy(&b, w, es);
            memcpy(&s, (const char *)in + (size_t)i * is, is);
            printf("MISMATCH [%s] cast %s -> %s: input bits %llx: got %llx, PyTorch %llx\n", dname, em_dtype_name(src),
                   em_dtype_name(dst), (unsigned long long)s, (unsigned long long)a, (unsigned long long)b);
        }
    }
    free(got);
    em_scope_end();
    return bad;
}

static char *tensor_repr(const em_tensor *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_int_equal(em_tensor_print(t, m), EM_OK);
    fclose(m);
    if (len && buf[len - 1] == '\n') buf[len - 1] = 0;
    return buf;
}

static void test_fixture(void **state)
{
    (void)state;
    char path[1024];
    FILE *f = fopen(data_path("half_fixtures.txt", path, sizeof path), "r");
    if (!f) fail_msg("cannot open %s (EMBER_TEST_DATA)", path);
    em_test_dev devs[17];
    const int nd = em_test_list_devices(devs, 17);
    char *line = NULL;
    size_t cap = 0;
    int ncast = 0, nbad = 0, nprint = 0, nfile = 0;
    em_st_file *st = em_safetensors_open(data_path("half_torch.safetensors", path, sizeof path));
    if (!st) fail_msg("%s", em_last_error());
    while (getline(&line, &cap, f) > 0) {
        char *s = line, kind[16], a[16], b[64];
        int adv = 0;
        if (line[0] == '#') continue;
        if (sscanf(s, "%15s%n", kind, &adv) != 1) continue;
        s += adv;
        if (!strcmp(kind, "cast")) {
            long long n;
            if (sscanf(s, "%15s %15s %lld%n", a, b, &n, &adv) != 3) fail_msg("bad cast line");
            s += adv;
            em_dtype src = dtype_of(a), dst = dtype_of(b);
            void *in = malloc((size_t)n * em_dtype_size(src) + 1), *want = malloc((size_t)n * em_dtype_size(dst) + 1);
            parse_bits(&s, src, n, in);
            s = strchr(s, ':');
            assert_non_null(s);
            s++;
            parse_bits(&s, dst, n, want);
            for (int di = 0; di < nd; di++) {
                assert_int_equal(em_set_device(devs[di].d), EM_OK);
                int bad = check_cast(src, dst, n, in, want, devs[di].name);
                if (bad) printf("[%s] cast %s -> %s: %d of %lld differ\n", devs[di].name, a, b, bad, n);
                nbad += bad;
                ncast += (int)n;
            }
            em_set_device(em_device_cpu());
            free(in);
            free(want);
        } else if (!strcmp(kind, "print")) {
            long long n;
            if (sscanf(s, "%15s %lld%n", a, &n, &adv) != 2) fail_msg("bad print line");
            s += adv;
            float *v = malloc((size_t)n * sizeof *v);
            parse_bits(&s, EM_F32, n, v);
            s = strstr(s, ": ");
            assert_non_null(s);
            s += 2;
            s[strcspn(s, "\n")] = 0;
            char want[1024];
            size_t w = 0; /* unescape \n */
            for (const char *p = s; *p && w + 1 < sizeof want; p++) {
                if (p[0] == '\\' && p[1] == 'n') {
                    want[w++] = '\n';
                    p++;
                } else {
                    want[w++] = *p;
                }
            }
            want[w] = 0;
            em_scope_begin();
            int64_t shape[1] = {n};
            em_tensor *t = em_cast(em_from_host(v, shape, 1, EM_F32), dtype_of(a));
            assert_non_null(t);
            char *got = tensor_repr(t);
            if (strcmp(got, want)) fail_msg("print %s:\n  Ember:   %s\n  PyTorch: %s", a, got, want);
            free(got);
            em_scope_end();
            free(v);
            nprint++;
        } else if (!strcmp(kind, "file")) {
            char name[64];
            long long n;
            if (sscanf(s, "%63s %15s %lld%n", name, a, &n, &adv) != 3) fail_msg("bad file line");
            s += adv;
            em_dtype dt = dtype_of(a);
            void *want = malloc((size_t)n * 2);
            parse_bits(&s, dt, n, want);
            const em_st_tensor *e = em_safetensors_find(st, name);
            if (!e) fail_msg("half_torch.safetensors has no tensor '%s'", name);
            assert_int_equal(e->dtype, dt);
            assert_int_equal(e->nbytes, (size_t)n * 2);
            assert_memory_equal(e->data, want, (size_t)n * 2);
            em_scope_begin();
            em_tensor *t = em_safetensors_tensor(st, name);
            if (!t) fail_msg("%s: %s", name, em_last_error());
            assert_int_equal(em_tensor_dtype(t), dt);
            void *got = malloc((size_t)n * 2);
            assert_int_equal(em_to_host(t, got, (size_t)n * 2), EM_OK);
            assert_memory_equal(got, want, (size_t)n * 2);
            /* written back by Ember: the same dtype string and bytes */
            char *out = em_test_tmp_path("half.safetensors");
            const char *names[1] = {name};
            em_tensor *ts[1] = {t};
            assert_int_equal(em_safetensors_save(out, names, ts, 1, NULL, 0), EM_OK);
            em_st_file *back = em_safetensors_open(out);
            assert_non_null(back);
            const em_st_tensor *eb = em_safetensors_find(back, name);
            assert_non_null(eb);
            assert_string_equal(eb->st_dtype, dt == EM_BF16 ? "BF16" : "F16");
            assert_memory_equal(eb->data, want, (size_t)n * 2);
            em_safetensors_close(back);
            free(got);
            em_scope_end();
            free(want);
            nfile++;
        } else {
            fail_msg("unknown fixture line kind '%s'", kind);
        }
    }
    free(line);
    fclose(f);
    em_safetensors_close(st);
    printf("half: %d cast values over %d device(s), %d mismatch; %d print cases, %d PyTorch file tensors\n", ncast, nd,
           nbad, nprint, nfile);
    assert_int_equal(nbad, 0);
    assert_true(ncast > 10000 && nprint >= 10 && nfile == 3);
}

static void test_promotion(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *h = em_ones((int64_t[]){2}, 1, EM_F16), *b = em_ones((int64_t[]){2}, 1, EM_BF16);
    em_tensor *f = em_ones((int64_t[]){2}, 1, EM_F32), *i = em_ones((int64_t[]){2}, 1, EM_I64);
    assert_int_equal(em_tensor_dtype(em_add(h, b)), EM_F32);
    assert_int_equal(em_tensor_dtype(em_add(b, f)), EM_F32);
    assert_int_equal(em_tensor_dtype(em_add(b, i)), EM_BF16);
    assert_int_equal(em_tensor_dtype(em_mul(i, h)), EM_F16);
    assert_int_equal(em_tensor_dtype(em_exp(b)), EM_BF16);
    assert_int_equal(em_tensor_dtype(em_matmul(em_reshape(h, (int64_t[]){1, 2}, 2), em_reshape(h, (int64_t[]){2, 1}, 2))),
                     EM_F16);
    assert_int_equal(em_tensor_dtype(em_sum(b, NULL, 0, false)), EM_BF16);
    assert_int_equal(em_tensor_dtype(em_softmax(h, 0)), EM_F16);
    double v = 0;
    assert_int_equal(em_item(em_scalar(-2.75, EM_BF16), &v), EM_OK);
    assert_true(v == -2.75);
    assert_int_equal(em_item(em_scalar(65519.0, EM_F16), &v), EM_OK);
    assert_true(v == 65504.0);
    em_scope_end();
}

/* Random f32 values of a moderate range, as a 16-bit tensor. */
static em_tensor *rand_half(const int64_t *shape, int nd, em_dtype dt, uint64_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    }
    em_tensor *t = em_cast(em_from_host(v, shape, nd, EM_F32), dt);
    free(v);
    return t;
}

static void assert_same_bits(const em_tensor *a, const em_tensor *b, const char *what)
{
    assert_int_equal(em_tensor_dtype(a), em_tensor_dtype(b));
    int64_t n = em_tensor_numel(a);
    assert_int_equal(n, em_tensor_numel(b));
    size_t nb = (size_t)n * em_dtype_size(em_tensor_dtype(a));
    char *x = malloc(nb), *y = malloc(nb);
    assert_int_equal(em_to_host(a, x, nb), EM_OK);
    assert_int_equal(em_to_host(b, y, nb), EM_OK);
    if (memcmp(x, y, nb)) fail_msg("%s: the 16-bit result is not the f32 result rounded once", what);
    free(x);
    free(y);
}

static void test_f32_rounded_once(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        em_dtype dt = dts[k];
        em_scope_begin();
        em_tensor *a = rand_half((int64_t[]){17, 33}, 2, dt, 1), *b = rand_half((int64_t[]){33, 9}, 2, dt, 2);
        em_tensor *c = rand_half((int64_t[]){17, 33}, 2, dt, 3);
        em_tensor *af = em_cast(a, EM_F32), *bf = em_cast(b, EM_F32), *cf = em_cast(c, EM_F32);
        /* widened (matmul, reductions, softmax) and native (element-wise) ops alike */
        assert_same_bits(em_matmul(a, b), em_cast(em_matmul(af, bf), dt), "matmul");
        assert_same_bits(em_sum(a, (int[]){1}, 1, false), em_cast(em_sum(af, (int[]){1}, 1, false), dt), "sum");
        assert_same_bits(em_softmax(a, 1), em_cast(em_softmax(af, 1), dt), "softmax");
        assert_same_bits(em_tanh(a), em_cast(em_tanh(af), dt), "tanh");
        assert_same_bits(em_div(a, c), em_cast(em_div(af, cf), dt), "div");
        assert_same_bits(em_add_scalar(a, 0.1), em_cast(em_add_scalar(af, (double)(float)0.1), dt), "add_scalar");
        /* a widened op into a view of a 16-bit tensor: only the view changes */
        em_tensor *dst = em_zeros((int64_t[]){4, 17}, 2, dt);
        em_tensor *view = em_slice(dst, 0, 1, 2, 1);
        em_tensor *src = em_sum(a, (int[]){1}, 1, false);
        assert_int_equal(em_copy_(view, em_reshape(src, (int64_t[]){1, 17}, 2)), EM_OK);
        float got[68];
        assert_int_equal(em_to_host(em_cast(dst, EM_F32), got, sizeof got), EM_OK);
        float want[17];
        assert_int_equal(em_to_host(em_cast(src, EM_F32), want, sizeof want), EM_OK);
        for (int i = 0; i < 68; i++) assert_true(got[i] == (i / 17 == 1 ? want[i % 17] : 0.0f));
        em_scope_end();
    }
}

/* An optimizer step on 16-bit parameters (an in-place op, widened): the
 * parameter is the f32 step of the widened parameter, rounded once. */
static void test_inplace_optimizer(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *p = rand_half((int64_t[]){5, 7}, 2, EM_BF16, 7);
    em_tensor *q = em_cast(p, EM_F32);
    em_set_requires_grad(p, true);
    em_set_requires_grad(q, true);
    em_optim *op = em_sgd_new(&p, 1, 0.125, 0.0, 0.0), *oq = em_sgd_new(&q, 1, 0.125, 0.0, 0.0);
    assert_non_null(op);
    assert_non_null(oq);
    em_tensor *w = rand_half((int64_t[]){5, 7}, 2, EM_BF16, 8);
    em_grads *gp = em_backward(em_sum(em_mul(p, w), NULL, 0, false));
    em_grads *gq = em_backward(em_sum(em_mul(q, em_cast(w, EM_F32)), NULL, 0, false));
    assert_non_null(gp);
    assert_non_null(gq);
    assert_int_equal(em_tensor_dtype(em_grad(gp, p)), EM_BF16);
    assert_int_equal(em_optim_step(op, gp), EM_OK);
    assert_int_equal(em_optim_step(oq, gq), EM_OK);
    assert_same_bits(p, em_cast(q, EM_BF16), "sgd step");
    em_grads_free(gp);
    em_grads_free(gq);
    em_optim_free(op);
    em_optim_free(oq);
    em_scope_end();
}

/* A 16-bit input into an f32 batch norm (an f32 model fed a bf16 tensor
 * outside autocast): the result is f32 and must be the f32 batch norm of
 * the widened input, running statistics included, not statistics rounded
 * to 16 bits (an input far from zero was off by ~0.2 in the output). The
 * gradient reaches the 16-bit input in its own dtype. */
static void test_batch_norm_mixed(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        em_scope_begin();
        em_manual_seed(3);
        int64_t sh[4] = {8, 2, 4, 4};
        em_tensor *x = em_cast(em_add_scalar(em_rand_normal(sh, 4, EM_F32, 0, 1), 100), dts[k]);
        em_set_requires_grad(x, true);
        em_module *bn = em_batch_norm2d_new(2, 1e-5, 0.1, true, true), *ref = em_batch_norm2d_new(2, 1e-5, 0.1, true, true);
        assert_non_null(bn);
        assert_non_null(ref);
        for (int train = 1; train >= 0; train--) {
            em_module_train(bn, train);
            em_module_train(ref, train);
            em_tensor *y = em_module_forward(bn, x), *yr = em_module_forward(ref, em_cast(em_detach(x), EM_F32));
            assert_non_null(y);
            assert_non_null(yr);
            assert_int_equal(em_tensor_dtype(y), EM_F32);
            assert_same_bits(y, yr, train ? "batch norm (training) of a 16-bit input" : "batch norm (eval) of a 16-bit input");
            assert_same_bits(em_module_get_buffer(bn, "running_mean"), em_module_get_buffer(ref, "running_mean"), "running_mean");
            assert_same_bits(em_module_get_buffer(bn, "running_var"), em_module_get_buffer(ref, "running_var"), "running_var");
            if (train) {
                em_grads *g = em_backward(em_sum(em_mul(y, y), NULL, 0, false));
                assert_non_null(g);
                assert_non_null(em_grad(g, x));
                assert_int_equal(em_tensor_dtype(em_grad(g, x)), dts[k]);
                em_grads_free(g);
            }
        }
        em_module_free(bn);
        em_module_free(ref);
        em_scope_end();
    }
}

/* The composed norms of a 16-bit input (outside autocast) compute in f32
 * and round once: with f32 affine parameters the result is the f32 norm of
 * the widened input; without (or with 16-bit ones) it is that rounded to the
 * input's dtype. In 16 bits the mean of an input near 100 was rounded to
 * 0.5, off by the whole output scale. */
static void test_norms_16bit(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        const em_dtype dt = dts[k];
        em_scope_begin();
        em_manual_seed(5);
        int64_t sh[4] = {3, 4, 2, 4};
        em_tensor *x = em_cast(em_add_scalar(em_rand_normal(sh, 4, EM_F32, 0, 1), 100), dt);
        em_tensor *xf = em_cast(x, EM_F32);
        em_tensor *w = em_rand_normal((int64_t[]){4}, 1, EM_F32, 1, 0.1), *b = em_rand_normal((int64_t[]){4}, 1, EM_F32, 0, 0.1);
        em_tensor *wl = em_cast(w, dt), *bl = em_cast(b, dt);
        /* f32 affine: f32 result */
        assert_same_bits(em_layer_norm(x, 1, w, b, 1e-5), em_layer_norm(xf, 1, w, b, 1e-5), "layer_norm, f32 affine");
        assert_same_bits(em_group_norm(x, 2, w, b, 1e-5), em_group_norm(xf, 2, w, b, 1e-5), "group_norm, f32 affine");
        assert_same_bits(em_instance_norm(x, w, b, 1e-5), em_instance_norm(xf, w, b, 1e-5), "instance_norm, f32 affine");
        assert_same_bits(em_rms_norm(x, w, 1e-5), em_rms_norm(xf, w, 1e-5), "rms_norm, f32 affine");
        /* no affine / 16-bit affine: the f32 result rounded once */
        assert_same_bits(em_layer_norm(x, 1, NULL, NULL, 1e-5), em_cast(em_layer_norm(xf, 1, NULL, NULL, 1e-5), dt), "layer_norm");
        assert_same_bits(em_layer_norm(x, 1, wl, bl, 1e-5), em_cast(em_layer_norm(xf, 1, em_cast(wl, EM_F32), em_cast(bl, EM_F32), 1e-5), dt),
                         "layer_norm, 16-bit affine");
        assert_same_bits(em_group_norm(x, 2, NULL, NULL, 1e-5), em_cast(em_group_norm(xf, 2, NULL, NULL, 1e-5), dt), "group_norm");
        assert_same_bits(em_rms_norm(x, NULL, 1e-5), em_cast(em_rms_norm(xf, NULL, 1e-5), dt), "rms_norm");
        /* batch norm in eval with 16-bit parameters and statistics (a bf16 model) */
        em_tensor *rm = em_cast(em_full((int64_t[]){4}, 1, EM_F32, 100.25), dt), *rv = em_cast(em_full((int64_t[]){4}, 1, EM_F32, 0.75), dt);
        assert_same_bits(em_batch_norm(x, rm, rv, wl, bl, false, 0.1, 1e-5),
                         em_cast(em_batch_norm(xf, em_cast(rm, EM_F32), em_cast(rv, EM_F32), em_cast(wl, EM_F32), em_cast(bl, EM_F32), false,
                                               0.1, 1e-5),
                                 dt),
                         "batch_norm eval, 16-bit model");
        /* inside autocast the norms stay f32 ops */
        em_autocast_begin(EM_BF16);
        assert_int_equal(em_tensor_dtype(em_layer_norm(x, 1, NULL, NULL, 1e-5)), EM_F32);
        assert_int_equal(em_tensor_dtype(em_group_norm(x, 2, NULL, NULL, 1e-5)), EM_F32);
        assert_int_equal(em_tensor_dtype(em_rms_norm(x, NULL, 1e-5)), EM_F32);
        em_autocast_end();
        /* gradients reach the 16-bit input */
        em_tensor *xl = em_detach(x);
        em_set_requires_grad(xl, true);
        em_grads *g = em_backward(em_sum(em_layer_norm(xl, 1, w, b, 1e-5), NULL, 0, false));
        assert_non_null(g);
        assert_int_equal(em_tensor_dtype(em_grad(g, xl)), dt);
        em_grads_free(g);
        em_scope_end();
    }
}

/* em_full / em_scalar of -0.0 keep the sign bit in every float dtype (as
 * torch.full; the CPU and CUDA fills memset +0 for f64 / f16 / bf16). */
static void test_fill_negative_zero(void **state)
{
    (void)state;
    const em_dtype dts[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int k = 0; k < 4; k++) {
        em_scope_begin();
        double v[3];
        assert_int_equal(em_to_host(em_cast(em_full((int64_t[]){3}, 1, dts[k], -0.0), EM_F64), v, sizeof v), EM_OK);
        for (int i = 0; i < 3; i++) assert_true(v[i] == 0 && signbit(v[i]));
        double s;
        assert_int_equal(em_item(em_scalar(-0.0, dts[k]), &s), EM_OK);
        assert_true(s == 0 && signbit(s));
        assert_int_equal(em_item(em_scalar(0.0, dts[k]), &s), EM_OK);
        assert_true(s == 0 && !signbit(s));
        em_scope_end();
    }
}

/* mean and std of a 16-bit tensor: the f32 result rounded once (the f16 sum
 * of four 65504 overflowed, so their mean was inf; std rounded the variance
 * to 16 bits before its root); f32 inside autocast. */
static void test_mean_std_rounded_once(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int k = 0; k < 2; k++) {
        const em_dtype dt = dts[k];
        em_scope_begin();
        em_tensor *a = rand_half((int64_t[]){17, 33}, 2, dt, 11), *af = em_cast(a, EM_F32);
        assert_same_bits(em_mean(a, (int[]){1}, 1, false), em_cast(em_mean(af, (int[]){1}, 1, false), dt), "mean");
        assert_same_bits(em_mean_all(a), em_cast(em_mean_all(af), dt), "mean_all");
        assert_same_bits(em_std(a, (int[]){0}, 1, 1.0, true), em_cast(em_std(af, (int[]){0}, 1, 1.0, true), dt), "std");
        double v;
        assert_int_equal(em_item(em_mean_all(em_full((int64_t[]){4}, 1, EM_F16, 65504)), &v), EM_OK);
        assert_true(v == 65504);
        em_autocast_begin(EM_BF16);
        assert_int_equal(em_tensor_dtype(em_mean_all(a)), EM_F32);
        assert_int_equal(em_tensor_dtype(em_std(a, NULL, 0, 1.0, false)), EM_F32);
        em_autocast_end();
        em_tensor *al = em_detach(a);
        em_set_requires_grad(al, true);
        em_grads *g = em_backward(em_add(em_mean_all(al), em_std(al, NULL, 0, 1.0, false)));
        assert_non_null(g);
        assert_int_equal(em_tensor_dtype(em_grad(g, al)), dt);
        em_grads_free(g);
        em_scope_end();
    }
}

/* em_clip_grad_norm of 16-bit gradients sums their powers in f32: the f16
 * square of 300 overflowed (norm inf, every gradient zeroed) and that of
 * 1e-4 flushed to 0 (norm 0). */
static void test_clip_grad_norm_16bit(void **state)
{
    (void)state;
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    const double vals[2] = {300, 1e-4};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 2; j++) {
            em_scope_begin();
            em_tensor *p = em_zeros((int64_t[]){3}, 1, dts[k]);
            assert_int_equal(em_set_requires_grad(p, true), EM_OK);
            em_tensor *gv = em_full((int64_t[]){3}, 1, dts[k], vals[j]);
            double gq;
            assert_int_equal(em_item(em_narrow(gv, 0, 0, 1), &gq), EM_OK);
            em_grads *g = em_grads_new();
            assert_int_equal(em_grads_set(g, p, gv), EM_OK);
            double norm = em_clip_grad_norm(g, &p, 1, 1.0, 2.0);
            const double want = sqrt(3.0) * gq;
            if (!(fabs(norm - want) <= 1e-6 * want)) fail_msg("%s grads of %g: norm %g, expected %g", em_dtype_name(dts[k]), vals[j], norm, want);
            float got[3];
            assert_int_equal(em_to_host(em_cast(em_grad(g, p), EM_F32), got, sizeof got), EM_OK);
            const double clipped = norm > 1.0 ? gq / (norm + 1e-6) : gq;
            for (int i = 0; i < 3; i++) assert_true(fabs(got[i] - clipped) <= 4e-3 * clipped);
            em_grads_free(g);
            em_scope_end();
        }
}

/* The element-wise losses of f16 inputs compute in f32: the f16 square of
 * a difference of 300 overflowed, so the mean of [300, 0, 0, 0]^2 (22500)
 * was inf, outside autocast and inside it when both inputs are f16. */
static void test_losses_16bit(void **state)
{
    (void)state;
    for (int ac = 0; ac < 2; ac++) {
        em_scope_begin();
        em_tensor *x = em_from_host((const float[]){300, 0, 0, 0}, (int64_t[]){4}, 1, EM_F32);
        em_tensor *xh = em_cast(x, EM_F16), *zh = em_zeros((int64_t[]){4}, 1, EM_F16);
        if (ac) assert_int_equal(em_autocast_begin(EM_F16), EM_OK);
        em_tensor *mse = em_mse_loss(xh, zh, EM_REDUCTION_MEAN);
        em_tensor *hub = em_huber_loss(xh, zh, 1.0, EM_REDUCTION_SUM);
        em_tensor *sl1 = em_smooth_l1_loss(xh, zh, 1.0, EM_REDUCTION_MEAN);
        if (ac) assert_int_equal(em_autocast_end(), EM_OK);
        assert_int_equal(em_tensor_dtype(mse), ac ? EM_F32 : EM_F16);
        double v;
        assert_int_equal(em_item(mse, &v), EM_OK);
        assert_true(fabs(v - 22500) <= 16); /* f16 ulp there: 16 */
        assert_int_equal(em_item(hub, &v), EM_OK);
        assert_true(v == 299.5);
        assert_int_equal(em_item(sl1, &v), EM_OK);
        assert_true(fabs(v - 299.5 / 4) <= 0.05);
        em_scope_end();
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_promotion),
        cmocka_unit_test(test_f32_rounded_once),
        cmocka_unit_test(test_inplace_optimizer),
        cmocka_unit_test(test_batch_norm_mixed),
        cmocka_unit_test(test_norms_16bit),
        cmocka_unit_test(test_fill_negative_zero),
        cmocka_unit_test(test_mean_std_rounded_once),
        cmocka_unit_test(test_clip_grad_norm_16bit),
        cmocka_unit_test(test_losses_16bit),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
