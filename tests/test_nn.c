/* Tests of nn: the module tree and PyTorch parameter keys, initializers,
 * layers (Linear, Embedding, Dropout, LayerNorm, RMSNorm, Sequential,
 * activations), losses against PyTorch fixtures (tests/fixtures/
 * loss_fixtures.txt, from gen_optim_fixtures.py) and hand values, errors, and
 * small end-to-end trainings (XOR, a regression, a 1000-step leak check). */
#include "fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------------- */

static void set_values(em_tensor *t, const double *v)
{
    em_scope_begin();
    em_tensor *src = em_from_host(v, em_tensor_shape(t), em_tensor_ndim(t), EM_F64);
    assert_non_null(src);
    if (em_copy_(t, src) != EM_OK) fail_msg("em_copy_: %s", em_last_error());
    em_scope_end();
}
#define SET(t, ...) set_values(t, (const double[]){__VA_ARGS__})

static void stats(const em_tensor *t, double *mean, double *std, double *amax)
{
    int64_t n = em_tensor_numel(t);
    double *v = em_test_values(t);
    double s = 0, s2 = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        if (fabs(v[i]) > m) m = fabs(v[i]);
    }
    double mu = s / (double)n;
    for (int64_t i = 0; i < n; i++) s2 += (v[i] - mu) * (v[i] - mu);
    free(v);
    if (mean) *mean = mu;
    if (std) *std = sqrt(s2 / (double)n);
    if (amax) *amax = m;
}

typedef struct keys {
    char k[32][64];
    int64_t numel[32];
    int n;
} keys;

static void key_cb(const char *key, em_tensor *t, void *ud)
{
    keys *k = ud;
    assert_true(k->n < 32);
    snprintf(k->k[k->n], sizeof k->k[0], "%s", key);
    k->numel[k->n] = em_tensor_numel(t);
    k->n++;
}

/* A user-defined module with two children, as in the nn.h example. */
static em_tensor *mlp_forward(em_module *m, const em_tensor *x)
{
    em_scope_begin();
    em_tensor *h = em_relu(em_module_forward(em_module_get_child(m, "fc1"), x));
    em_tensor *y = em_keep(em_module_forward(em_module_get_child(m, "fc2"), h));
    em_scope_end();
    return y;
}
static const em_module_vtable MLP_VT = {"MLP", mlp_forward, NULL};

static em_module *mlp_new(int64_t in, int64_t hidden, int64_t out)
{
    em_module *m = em_module_new(&MLP_VT, NULL);
    assert_non_null(m);
    assert_int_equal(em_module_add_child(m, "fc1", em_linear_new(in, hidden, true)), EM_OK);
    assert_int_equal(em_module_add_child(m, "fc2", em_linear_new(hidden, out, true)), EM_OK);
    return m;
}

/* ---- module tree --------------------------------------------------------------------- */

static void test_linear_forward(void **state)
{
    (void)state;
    em_module *lin = em_linear_new(3, 2, true);
    assert_non_null(lin);
    assert_string_equal(em_module_type_name(lin), "Linear");
    em_tensor *w = em_module_get_param(lin, "weight");
    em_tensor *b = em_module_get_param(lin, "bias");
    em_test_assert_shape(w, 2, SHAPE(2, 3));
    em_test_assert_shape(b, 1, SHAPE(2));
    assert_true(em_requires_grad(w));
    assert_true(em_is_leaf(w));
    SET(w, 1, 2, 3, 4, 5, 6);
    SET(b, 0.5, -1);
    em_scope_begin();
    em_tensor *x = F32((2, 3), 1, 0, -1, 2, 1, 0);
    em_tensor *y = em_module_forward(lin, x);
    em_test_assert_shape(y, 2, SHAPE(2, 2));
    em_test_assert_close(y, VALS(-1.5, -3, 4.5, 12), 1e-6, 0);
    /* batched input [2, 1, 3] -> [2, 1, 2] */
    em_tensor *y3 = em_module_forward(lin, em_reshape(x, SHAPE(2, 1, 3), 3));
    em_test_assert_shape(y3, 3, SHAPE(2, 1, 2));
    em_test_assert_close(y3, VALS(-1.5, -3, 4.5, 12), 1e-6, 0);
    /* no bias */
    em_module *nb = em_linear_new(3, 2, false);
    assert_int_equal(em_module_num_param_tensors(nb), 1);
    assert_null(em_module_get_param(nb, "bias"));
    em_module_free(nb);
    /* wrong feature count: error naming the shapes */
    em_test_assert_error(em_module_forward(lin, F32((1, 4), 1, 2, 3, 4)), "[1, 4]", "[2, 3]", NULL);
    em_scope_end();
    em_module_free(lin);
}

static void test_param_keys_and_count(void **state)
{
    (void)state;
    em_module *seq = em_sequential_new((em_module *[]){em_linear_new(2, 3, true), em_relu_new(), em_linear_new(3, 1, true)}, 3);
    assert_non_null(seq);
    keys k = {0};
    assert_int_equal(em_module_visit_params(seq, key_cb, &k), EM_OK);
    assert_int_equal(k.n, 4);
    assert_string_equal(k.k[0], "0.weight");
    assert_string_equal(k.k[1], "0.bias");
    assert_string_equal(k.k[2], "2.weight");
    assert_string_equal(k.k[3], "2.bias");
    assert_int_equal(em_module_num_params(seq), 2 * 3 + 3 + 3 * 1 + 1);
    assert_int_equal(em_module_num_param_tensors(seq), 4);
    em_test_assert_shape(em_module_get_param(seq, "2.weight"), 2, SHAPE(1, 3));
    assert_null(em_module_get_param(seq, "1.weight"));
    assert_non_null(strstr(em_last_error(), "1.weight"));
    assert_string_equal(em_module_type_name(em_module_get_child(seq, "1")), "ReLU");
    em_tensor *ps[4];
    assert_int_equal(em_module_parameters(seq, ps, 4), 4);
    assert_ptr_equal(ps[2], em_module_get_param(seq, "2.weight"));

    /* a user module with named children, nested containers and a buffer */
    em_module *mlp = mlp_new(4, 5, 2);
    em_module *enc = em_module_new(&MLP_VT, NULL);
    assert_int_equal(em_module_add_child(enc, "layers", seq), EM_OK);
    assert_int_equal(em_module_add_child(enc, "head", mlp), EM_OK);
    em_tensor *rm = em_zeros(SHAPE(3), 1, EM_F32);
    assert_int_equal(em_module_add_buffer(em_module_get_child(enc, "layers"), "running_mean", rm), EM_OK);
    em_tensor_release(rm);
    memset(&k, 0, sizeof k);
    em_module_visit_params(enc, key_cb, &k);
    const char *want[] = {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias",
                          "head.fc1.weight", "head.fc1.bias",  "head.fc2.weight", "head.fc2.bias"};
    assert_int_equal(k.n, 8);
    for (int i = 0; i < 8; i++) assert_string_equal(k.k[i], want[i]);
    assert_int_equal(k.numel[4], 20);
    memset(&k, 0, sizeof k);
    em_module_visit_buffers(enc, key_cb, &k);
    assert_int_equal(k.n, 1);
    assert_string_equal(k.k[0], "layers.running_mean");
    assert_non_null(em_module_get_buffer(enc, "layers.running_mean"));
    em_test_assert_shape(em_module_get_param(enc, "head.fc1.weight"), 2, SHAPE(5, 4));
    assert_int_equal(em_module_num_params(enc), 13 + 4 * 5 + 5 + 5 * 2 + 2);

    /* the custom forward runs through the children */
    em_scope_begin();
    em_tensor *y = em_module_forward(em_module_get_child(enc, "head"), em_ones(SHAPE(3, 4), 2, EM_F32));
    em_test_assert_shape(y, 2, SHAPE(3, 2));
    em_scope_end();

    /* naming errors */
    em_tensor *t = em_zeros(SHAPE(2), 1, EM_F32);
    assert_int_equal(em_module_add_param(mlp, "fc1", t), EM_ERR_INVALID); /* clashes with a child */
    assert_int_equal(em_module_add_param(mlp, "a.b", t), EM_ERR_INVALID);
    assert_int_equal(em_module_add_param(mlp, "", t), EM_ERR_INVALID);
    em_tensor *it = em_zeros(SHAPE(2), 1, EM_I64);
    assert_int_equal(em_module_add_param(mlp, "idx", it), EM_ERR_DTYPE);
    em_tensor_release(it);
    assert_int_equal(em_module_add_param(mlp, "scale", t), EM_OK);
    assert_true(em_requires_grad(t));
    em_tensor_release(t);
    assert_int_equal(em_module_add_child(mlp, "fc2", em_relu_new()), EM_ERR_INVALID); /* freed */
    em_module_free(enc);
}

static void test_train_eval_freeze(void **state)
{
    (void)state;
    em_module *m = em_sequential_new((em_module *[]){em_linear_new(2, 2, true), em_dropout_new(0.5), mlp_new(2, 3, 1)}, 3);
    assert_true(em_module_is_training(m));
    em_module_train(m, false);
    assert_false(em_module_is_training(em_module_get_child(m, "1")));
    assert_false(em_module_is_training(em_module_get_child(m, "2.fc1")));
    em_module_train(m, true);
    assert_true(em_module_is_training(em_module_get_child(m, "2.fc2")));
    assert_int_equal(em_module_freeze(m), EM_OK);
    assert_false(em_requires_grad(em_module_get_param(m, "2.fc2.bias")));
    em_scope_begin();
    em_tensor *x = F32((1, 2), 1, 2);
    em_tensor *y = em_module_forward(m, x);
    assert_non_null(y);
    assert_false(em_requires_grad(y));
    em_scope_end();
    assert_int_equal(em_module_unfreeze(m), EM_OK);
    assert_true(em_requires_grad(em_module_get_param(m, "0.weight")));
    em_module_free(m);
}

/* ---- initializers -------------------------------------------------------------------------- */

static void test_init(void **state)
{
    (void)state;
    em_manual_seed(42);
    double mean, std, amax;
    /* Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias */
    em_module *lin = em_linear_new(256, 128, true);
    stats(em_module_get_param(lin, "weight"), &mean, &std, &amax);
    assert_true(amax <= 1.0 / 16.0);
    assert_true(amax > 0.99 / 16.0);
    assert_true(fabs(mean) < 0.002);
    assert_true(fabs(std - (1.0 / 16.0) / sqrt(3.0)) < 0.002);
    stats(em_module_get_param(lin, "bias"), &mean, &std, &amax);
    assert_true(amax <= 1.0 / 16.0 && amax > 0.8 / 16.0);
    em_module_free(lin);

    em_tensor *t = em_zeros(SHAPE(200, 300), 2, EM_F32);
    int64_t fi, fo;
    assert_int_equal(em_init_fans(t, &fi, &fo), EM_OK);
    assert_int_equal(fi, 300);
    assert_int_equal(fo, 200);
    /* kaiming uniform, relu, fan_in: bound = sqrt(2) * sqrt(3 / 300) */
    assert_int_equal(em_init_kaiming_uniform_(t, 0, EM_FAN_IN, EM_NONLIN_RELU), EM_OK);
    double bound = sqrt(6.0 / 300.0);
    stats(t, &mean, &std, &amax);
    assert_true(amax <= bound && amax > 0.99 * bound);
    assert_true(fabs(std - bound / sqrt(3.0)) < 0.02 * bound);
    /* kaiming normal, fan_out: std = sqrt(2 / 200) */
    assert_int_equal(em_init_kaiming_normal_(t, 0, EM_FAN_OUT, EM_NONLIN_RELU), EM_OK);
    stats(t, &mean, &std, NULL);
    assert_true(fabs(std - sqrt(2.0 / 200.0)) < 0.02 * sqrt(2.0 / 200.0));
    assert_true(fabs(mean) < 0.003);
    /* xavier uniform: a = gain * sqrt(6 / (fan_in + fan_out)) */
    assert_int_equal(em_init_xavier_uniform_(t, 2.0), EM_OK);
    stats(t, NULL, NULL, &amax);
    bound = 2.0 * sqrt(6.0 / 500.0);
    assert_true(amax <= bound && amax > 0.99 * bound);
    assert_int_equal(em_init_xavier_normal_(t, 1.0), EM_OK);
    stats(t, NULL, &std, NULL);
    assert_true(fabs(std - sqrt(2.0 / 500.0)) < 0.02 * sqrt(2.0 / 500.0));
    assert_int_equal(em_init_normal_(t, 3.0, 0.5), EM_OK);
    stats(t, &mean, &std, NULL);
    assert_true(fabs(mean - 3.0) < 0.01 && fabs(std - 0.5) < 0.01);
    assert_int_equal(em_init_uniform_(t, -2, -1), EM_OK);
    stats(t, &mean, NULL, &amax);
    assert_true(amax <= 2.0 && fabs(mean + 1.5) < 0.01);
    assert_int_equal(em_init_constant_(t, 0.25), EM_OK);
    stats(t, &mean, &std, NULL);
    assert_true(mean == 0.25 && std == 0);
    assert_int_equal(em_init_ones_(t), EM_OK);
    stats(t, &mean, NULL, NULL);
    assert_true(mean == 1.0);
    assert_int_equal(em_init_zeros_(t), EM_OK);
    stats(t, NULL, NULL, &amax);
    assert_true(amax == 0.0);
    /* reproducible with the global seed */
    em_manual_seed(7);
    em_init_uniform_(t, 0, 1);
    double *a = em_test_values(t);
    em_manual_seed(7);
    em_init_uniform_(t, 0, 1);
    em_test_assert_close(t, a, 200 * 300, 0, 0);
    free(a);
    /* gains (torch.nn.init.calculate_gain) */
    assert_true(fabs(em_init_calculate_gain(EM_NONLIN_RELU, 0) - sqrt(2.0)) < 1e-15);
    assert_true(fabs(em_init_calculate_gain(EM_NONLIN_TANH, 0) - 5.0 / 3.0) < 1e-15);
    assert_true(fabs(em_init_calculate_gain(EM_NONLIN_LEAKY_RELU, -1) - sqrt(2.0 / (1 + 1e-4))) < 1e-15);
    assert_true(fabs(em_init_calculate_gain(EM_NONLIN_LEAKY_RELU, sqrt(5.0)) - sqrt(1.0 / 3.0)) < 1e-15);
    assert_true(em_init_calculate_gain(EM_NONLIN_SELU, 0) == 0.75);
    assert_true(em_init_calculate_gain(EM_NONLIN_LINEAR, 0) == 1.0);
    em_tensor_release(t);
    /* errors */
    em_tensor *v = em_zeros(SHAPE(5), 1, EM_F32);
    assert_int_equal(em_init_xavier_uniform_(v, 1.0), EM_ERR_SHAPE);
    assert_non_null(strstr(em_last_error(), "[5]"));
    em_tensor_release(v);
    em_tensor *iv = em_zeros(SHAPE(2, 2), 2, EM_I32);
    assert_int_equal(em_init_normal_(iv, 0, 1), EM_ERR_DTYPE);
    em_tensor_release(iv);
}

/* ---- layers ------------------------------------------------------------------------------------ */

static void test_dropout(void **state)
{
    (void)state;
    em_manual_seed(1);
    em_module *d = em_dropout_new(0.3);
    assert_non_null(d);
    assert_int_equal(em_module_num_param_tensors(d), 0);
    em_scope_begin();
    const int64_t n = 20000;
    em_tensor *x = em_ones(&n, 1, EM_F32);
    em_tensor *y = em_module_forward(d, x);
    double *v = em_test_values(y);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] == 0)
            zeros++;
        else if (fabs(v[i] - 1.0 / 0.7) > 1e-6)
            fail_msg("kept element %lld = %g, expected 1/(1-p)", (long long)i, v[i]);
    }
    free(v);
    assert_true(fabs((double)zeros / (double)n - 0.3) < 0.02);
    /* a second call draws a different mask */
    em_tensor *y2 = em_module_forward(d, x);
    double *a = em_test_values(y), *b = em_test_values(y2);
    assert_true(memcmp(a, b, sizeof(double) * (size_t)n) != 0);
    free(a);
    free(b);
    /* eval: the identity */
    em_module_train(d, false);
    em_tensor *xe = F32((2, 2), 1, -2, 3, 4);
    em_tensor *ye = em_module_forward(d, xe);
    em_test_assert_shape(ye, 2, SHAPE(2, 2));
    em_test_assert_close(ye, VALS(1, -2, 3, 4), 0, 0);
    /* p = 1 zeroes everything; p = 0 is the identity */
    em_test_assert_close(em_dropout(xe, 1.0, true), VALS(0, 0, 0, 0), 0, 0);
    em_test_assert_close(em_dropout(xe, 0.0, true), VALS(1, -2, 3, 4), 0, 0);
    em_test_assert_error(em_dropout(xe, 1.5, true), "[0, 1]", NULL);
    em_scope_end();
    assert_null(em_dropout_new(-0.1));
    em_module_free(d);
}

static void test_layer_norm(void **state)
{
    (void)state;
    em_module *ln = em_layer_norm_new(SHAPE(4), 1, 1e-5, true);
    assert_non_null(ln);
    keys k = {0};
    em_module_visit_params(ln, key_cb, &k);
    assert_int_equal(k.n, 2);
    assert_string_equal(k.k[0], "weight");
    assert_string_equal(k.k[1], "bias");
    em_test_assert_close(em_module_get_param(ln, "weight"), VALS(1, 1, 1, 1), 0, 0);
    em_test_assert_close(em_module_get_param(ln, "bias"), VALS(0, 0, 0, 0), 0, 0);
    em_scope_begin();
    em_tensor *x = F64((2, 4), 1, 2, 3, 4, 2, 2, 2, 2);
    /* row 1: mean 2.5, biased var 1.25 */
    double s = 1.0 / sqrt(1.25 + 1e-5);
    em_tensor *y = em_module_forward(ln, em_cast(x, EM_F32));
    em_test_assert_close(y, VALS(-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s, 0, 0, 0, 0), 1e-5, 1e-6);
    SET(em_module_get_param(ln, "weight"), 1, 2, 1, 2);
    SET(em_module_get_param(ln, "bias"), 0, 0, 1, 1);
    y = em_module_forward(ln, em_cast(x, EM_F32));
    em_test_assert_close(y, VALS(-1.5 * s, -1.0 * s, 0.5 * s + 1, 3.0 * s + 1, 0, 0, 1, 1), 1e-5, 1e-6);
    /* normalized over the last two dims, f64, no affine */
    em_tensor *y2 = em_layer_norm(em_reshape(x, SHAPE(2, 2, 2), 3), 2, NULL, NULL, 0.0);
    double t = 1.0 / sqrt(1.25);
    em_test_assert_close(y2, VALS(-1.5 * t, -0.5 * t, 0.5 * t, 1.5 * t, NAN, NAN, NAN, NAN), 1e-12, 0);
    em_test_assert_error(em_module_forward(ln, F32((2, 3), 1, 2, 3, 4, 5, 6)), "[2, 3]", "[4]", NULL);
    em_scope_end();
    em_module_free(ln);
    em_module *ln2 = em_layer_norm_new(SHAPE(2, 3), 2, 1e-5, false);
    assert_int_equal(em_module_num_param_tensors(ln2), 0);
    em_module_free(ln2);
}

static void test_rms_norm(void **state)
{
    (void)state;
    em_module *rn = em_rms_norm_new(4, 1e-6);
    assert_non_null(rn);
    assert_int_equal(em_module_num_params(rn), 4);
    em_scope_begin();
    em_tensor *x = F64((2, 4), 1, 2, 3, 4, -1, 1, -1, 1);
    double r1 = 1.0 / sqrt(30.0 / 4.0 + 1e-6), r2 = 1.0 / sqrt(1.0 + 1e-6);
    em_tensor *y = em_module_forward(rn, em_cast(x, EM_F32));
    em_test_assert_close(y, VALS(r1, 2 * r1, 3 * r1, 4 * r1, -r2, r2, -r2, r2), 1e-6, 0);
    em_tensor *w = F64((4), 1, 0.5, 2, 1);
    em_test_assert_close(em_rms_norm(x, w, 0.0), VALS(1 / sqrt(7.5), 1 / sqrt(7.5), 6 / sqrt(7.5), 4 / sqrt(7.5), -1, 0.5, -2, 1), 1e-12, 0);
    /* default eps (dtype epsilon) */
    em_test_assert_close(em_rms_norm(x, NULL, -1), VALS(1 / sqrt(7.5), 2 / sqrt(7.5), 3 / sqrt(7.5), 4 / sqrt(7.5), -1, 1, -1, 1), 1e-12, 0);
    em_test_assert_error(em_rms_norm(x, F64((3), 1, 1, 1), 1e-6), "[3]", "[2, 4]", NULL);
    em_scope_end();
    em_module_free(rn);
}

static void test_embedding(void **state)
{
    (void)state;
    em_manual_seed(3);
    em_module *e = em_embedding_new(10, 3);
    assert_non_null(e);
    em_tensor *w = em_module_get_param(e, "weight");
    em_test_assert_shape(w, 2, SHAPE(10, 3));
    double *wv = em_test_values(w);
    em_scope_begin();
    int64_t idx[6] = {0, 9, 2, 2, 5, 1};
    em_tensor *ix = em_from_host(idx, SHAPE(2, 3), 2, EM_I64);
    em_tensor *y = em_module_forward(e, ix);
    em_test_assert_shape(y, 3, SHAPE(2, 3, 3));
    double want[18];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++) want[i * 3 + j] = wv[idx[i] * 3 + j];
    em_test_assert_close(y, want, 18, 0, 0);
    em_test_assert_error(em_module_forward(e, F32((2), 1, 2)), "int64", NULL);
    em_scope_end();
    free(wv);
    /* N(0, 1) init */
    em_module *big = em_embedding_new(1000, 50);
    double mean, std;
    stats(em_module_get_param(big, "weight"), &mean, &std, NULL);
    assert_true(fabs(mean) < 0.02 && fabs(std - 1.0) < 0.02);
    em_module_free(big);
    em_module_free(e);
}

static void test_activation_modules(void **state)
{
    (void)state;
    const double xs[5] = {-2, -0.5, 0, 0.5, 2};
    struct {
        em_module *m;
        const char *name;
        double (*f)(double);
    } cases[] = {
        {em_relu_new(), "ReLU", NULL}, {em_sigmoid_new(), "Sigmoid", NULL}, {em_tanh_new(), "Tanh", tanh},
        {em_silu_new(), "SiLU", NULL}, {em_gelu_new(false), "GELU", NULL}, {em_identity_new(), "Identity", NULL},
    };
    em_scope_begin();
    em_tensor *x = em_from_host(xs, SHAPE(5), 1, EM_F64);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_non_null(cases[c].m);
        assert_string_equal(em_module_type_name(cases[c].m), cases[c].name);
        double want[5];
        for (int i = 0; i < 5; i++) {
            double v = xs[i];
            switch (c) {
            case 0: want[i] = v > 0 ? v : 0; break;
            case 1: want[i] = 1 / (1 + exp(-v)); break;
            case 2: want[i] = tanh(v); break;
            case 3: want[i] = v / (1 + exp(-v)); break;
            case 4: want[i] = 0.5 * v * (1 + erf(v / sqrt(2.0))); break;
            default: want[i] = v; break;
            }
        }
        em_test_assert_close(em_module_forward(cases[c].m, x), want, 5, 1e-12, 1e-15);
        em_module_free(cases[c].m);
    }
    em_module *lr = em_leaky_relu_new(0.01), *elu = em_elu_new(1.0), *sp = em_softplus_new(1.0, 20.0), *sp2 = em_softplus_new(2.0, 1.0);
    em_test_assert_close(em_module_forward(lr, x), VALS(-0.02, -0.005, 0, 0.5, 2), 1e-12, 0);
    em_test_assert_close(em_module_forward(elu, x), VALS(expm1(-2), expm1(-0.5), 0, 0.5, 2), 1e-12, 0);
    em_test_assert_close(em_module_forward(sp, x), VALS(log1p(exp(-2)), log1p(exp(-0.5)), log(2), log1p(exp(0.5)), log1p(exp(2))), 1e-12, 0);
    /* beta 2, threshold 1: x where 2x > 1 */
    em_test_assert_close(em_module_forward(sp2, x), VALS(log1p(exp(-4)) / 2, log1p(exp(-1)) / 2, log(2) / 2, log1p(exp(1)) / 2, 2), 1e-12, 0);
    em_module_free(lr);
    em_module_free(elu);
    em_module_free(sp);
    em_module_free(sp2);
    em_scope_end();
}

/* ---- losses ------------------------------------------------------------------------------------- */

static em_reduction reduction_of(const fx_block *b)
{
    char r[16];
    if (!fx_kw_str(b, "reduction", r, sizeof r)) return EM_REDUCTION_MEAN;
    return !strcmp(r, "sum") ? EM_REDUCTION_SUM : !strcmp(r, "none") ? EM_REDUCTION_NONE : EM_REDUCTION_MEAN;
}

static void test_losses_match_pytorch(void **state)
{
    (void)state;
    fx_block *bs;
    int n = fx_load("loss_fixtures.txt", &bs);
    assert_true(n >= 20);
    for (int i = 0; i < n; i++) {
        const fx_block *b = &bs[i];
        char kind[64];
        sscanf(b->head, "lossfn %63s", kind);
        em_scope_begin();
        em_tensor *x = fx_new(fx_find(b, "input"), EM_F64);
        em_set_requires_grad(x, true);
        em_tensor *tgt_f = fx_new(fx_find(b, "target"), EM_F64);
        em_reduction red = reduction_of(b);
        em_tensor *loss = NULL;
        if (!strcmp(kind, "cross_entropy") || !strcmp(kind, "nll_loss")) {
            em_cross_entropy_opts o = em_cross_entropy_opts_default();
            o.reduction = red;
            o.label_smoothing = fx_kw(b, "label_smoothing", 0);
            o.ignore_index = (int64_t)fx_kw(b, "ignore_index", -100);
            const fx_tensor *w = fx_find(b, "weight");
            if (w) o.weight = fx_new(w, EM_F64);
            em_tensor *tgt = em_cast(tgt_f, EM_I64);
            loss = kind[0] == 'c' ? em_cross_entropy(x, tgt, &o) : em_nll_loss(x, tgt, &o);
        } else if (!strcmp(kind, "mse_loss")) {
            loss = em_mse_loss(x, tgt_f, red);
        } else if (!strcmp(kind, "l1_loss")) {
            loss = em_l1_loss(x, tgt_f, red);
        } else if (!strcmp(kind, "smooth_l1_loss")) {
            loss = em_smooth_l1_loss(x, tgt_f, fx_kw(b, "beta", 1.0), red);
        } else if (!strcmp(kind, "huber_loss")) {
            loss = em_huber_loss(x, tgt_f, fx_kw(b, "delta", 1.0), red);
        } else if (!strcmp(kind, "binary_cross_entropy_with_logits")) {
            em_bce_opts o = em_bce_opts_default();
            o.reduction = red;
            const fx_tensor *pw = fx_find(b, "pos_weight");
            if (pw) o.pos_weight = fx_new(pw, EM_F64);
            loss = em_binary_cross_entropy_with_logits(x, tgt_f, &o);
        } else {
            fail_msg("unknown loss kind %s", kind);
        }
        if (!loss) fail_msg("%s: %s", b->config, em_last_error());
        const fx_tensor *want = fx_find(b, "loss");
        char what[128];
        snprintf(what, sizeof what, "%s loss", b->config);
        if (em_tensor_numel(loss) != want->n) fail_msg("%s: numel %lld, expected %lld", what, (long long)em_tensor_numel(loss), (long long)want->n);
        double *v = em_test_values(loss);
        for (int64_t j = 0; j < want->n; j++)
            if (!(fabs(v[j] - want->v[j]) <= 1e-10 * fabs(want->v[j]) + 1e-12))
                fail_msg("%s: element %lld: got %.15g, expected %.15g", what, (long long)j, v[j], want->v[j]);
        free(v);
        /* gradient w.r.t. the input, as loss.sum().backward() */
        em_grads *g = em_backward(em_sum_all(loss));
        if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
        const fx_tensor *gw = fx_find(b, "grad");
        em_tensor *gx = em_grad(g, x);
        assert_non_null(gx);
        v = em_test_values(gx);
        for (int64_t j = 0; j < gw->n; j++)
            if (!(fabs(v[j] - gw->v[j]) <= 1e-9 * fabs(gw->v[j]) + 1e-12))
                fail_msg("%s grad: element %lld: got %.15g, expected %.15g", b->config, (long long)j, v[j], gw->v[j]);
        free(v);
        em_grads_free(g);
        em_scope_end();
    }
    fx_free(bs, n);
}

static void test_losses_by_hand(void **state)
{
    (void)state;
    em_scope_begin();
    /* uniform logits: CE = log(C) */
    em_tensor *logits = F32((2, 4), 0, 0, 0, 0, 1, 1, 1, 1);
    int64_t t[2] = {1, 3};
    em_tensor *tgt = em_from_host(t, SHAPE(2), 1, EM_I64);
    em_test_assert_close(em_cross_entropy(logits, tgt, NULL), VALS(log(4.0)), 1e-6, 0);
    /* ignore_index: ignored rows add nothing and leave the mean's denominator */
    em_tensor *l2 = F64((2, 2), 0, 0, 0, 10);
    int64_t t2[2] = {0, -100};
    em_test_assert_close(em_cross_entropy(l2, em_from_host(t2, SHAPE(2), 1, EM_I64), NULL), VALS(log(2.0)), 1e-12, 0);
    /* all ignored: NaN, as PyTorch */
    int64_t t3[2] = {-100, -100};
    em_test_assert_close(em_cross_entropy(l2, em_from_host(t3, SHAPE(2), 1, EM_I64), NULL), VALS(NAN), 0, 0);
    /* class weights: weighted mean = sum(w_i * nll_i) / sum(w_i) */
    em_cross_entropy_opts o = em_cross_entropy_opts_default();
    o.weight = F64((2), 1, 3);
    int64_t t4[2] = {0, 1};
    double nll1 = log(2.0), nll2 = log1p(exp(-10.0));
    em_test_assert_close(em_cross_entropy(l2, em_from_host(t4, SHAPE(2), 1, EM_I64), &o), VALS((nll1 + 3 * nll2) / 4), 1e-12, 0);
    o.reduction = EM_REDUCTION_SUM;
    em_test_assert_close(em_cross_entropy(l2, em_from_host(t4, SHAPE(2), 1, EM_I64), &o), VALS(nll1 + 3 * nll2), 1e-12, 0);
    /* regression losses */
    em_tensor *a = F64((4), 0, 1, 2, 5), *b = F64((4), 0, 0.5, 4, 1);
    em_test_assert_close(em_mse_loss(a, b, EM_REDUCTION_MEAN), VALS((0 + 0.25 + 4 + 16) / 4.0), 1e-12, 0);
    em_test_assert_close(em_l1_loss(a, b, EM_REDUCTION_SUM), VALS(0 + 0.5 + 2 + 4), 1e-12, 0);
    em_test_assert_close(em_smooth_l1_loss(a, b, 1.0, EM_REDUCTION_NONE), VALS(0, 0.125, 1.5, 3.5), 1e-12, 0);
    em_test_assert_close(em_smooth_l1_loss(a, b, 0.0, EM_REDUCTION_NONE), VALS(0, 0.5, 2, 4), 1e-12, 0);
    em_test_assert_close(em_huber_loss(a, b, 2.0, EM_REDUCTION_NONE), VALS(0, 0.125, 2, 6), 1e-12, 0);
    /* BCE with logits, stable at large |x| */
    em_tensor *z = F64((3), 0, 100, -100), *y = F64((3), 1, 1, 0);
    em_test_assert_close(em_binary_cross_entropy_with_logits(z, y, &(em_bce_opts){.reduction = EM_REDUCTION_NONE}),
                         VALS(log(2.0), exp(-100.0), exp(-100.0)), 1e-9, 1e-300);
    em_scope_end();
}

static void test_loss_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F32((2, 3), 1, 2, 3, 4, 5, 6), *b = F32((3, 2), 1, 2, 3, 4, 5, 6);
    em_test_assert_error(em_mse_loss(a, b, EM_REDUCTION_MEAN), "em_mse_loss", "[2, 3]", "[3, 2]", NULL);
    em_test_assert_error(em_l1_loss(a, b, EM_REDUCTION_MEAN), "[2, 3]", "[3, 2]", NULL);
    em_test_assert_error(em_huber_loss(a, b, 1.0, EM_REDUCTION_MEAN), "[2, 3]", "[3, 2]", NULL);
    em_test_assert_error(em_smooth_l1_loss(a, b, 1.0, EM_REDUCTION_MEAN), "[2, 3]", "[3, 2]", NULL);
    em_test_assert_error(em_binary_cross_entropy_with_logits(a, b, NULL), "[2, 3]", "[3, 2]", NULL);
    em_test_assert_error(em_mse_loss(a, a, (em_reduction)7), "reduction", NULL);
    /* cross-entropy: float targets, wrong length, wrong rank, bad weight */
    em_test_assert_error(em_cross_entropy(a, F32((2), 0, 1), NULL), "int64", "float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    int64_t t3[3] = {0, 1, 2};
    em_tensor *tg3 = em_from_host(t3, SHAPE(3), 1, EM_I64);
    em_test_assert_error(em_cross_entropy(a, tg3, NULL), "[3]", "[2, 3]", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_cross_entropy(F32((3), 1, 2, 3), tg3, NULL), "[N, C]", "[3]", NULL);
    em_cross_entropy_opts o = em_cross_entropy_opts_default();
    o.weight = F32((2), 1, 1);
    int64_t t2[2] = {0, 1};
    em_tensor *tg2 = em_from_host(t2, SHAPE(2), 1, EM_I64);
    em_test_assert_error(em_cross_entropy(a, tg2, &o), "weight", "[2]", "[2, 3]", NULL);
    o.weight = NULL;
    o.label_smoothing = 1.5;
    em_test_assert_error(em_cross_entropy(a, tg2, &o), "label_smoothing", NULL);
    o.label_smoothing = 0.1;
    em_test_assert_error(em_nll_loss(a, tg2, &o), "label_smoothing", NULL);
    em_bce_opts bo = em_bce_opts_default();
    bo.pos_weight = F32((2), 1, 1);
    em_test_assert_error(em_binary_cross_entropy_with_logits(a, a, &bo), "pos_weight", "[2]", "[2, 3]", NULL);
    em_test_assert_error(em_mse_loss(NULL, a, EM_REDUCTION_MEAN), "NULL", NULL);
    em_scope_end();
}

/* ---- training --------------------------------------------------------------------------------- */

static void test_xor(void **state)
{
    (void)state;
    em_manual_seed(0);
    em_module *m = em_sequential_new((em_module *[]){em_linear_new(2, 8, true), em_tanh_new(), em_linear_new(8, 1, true)}, 3);
    em_optim *opt = em_adam_new(NULL, 0, 0.05); /* error path first */
    assert_null(opt);
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAM);
    c.lr = 0.05;
    opt = em_optim_new_for_module(&c, m);
    assert_non_null(opt);
    em_tensor *x = F32((4, 2), 0, 0, 0, 1, 1, 0, 1, 1);
    em_tensor *y = F32((4, 1), 0, 1, 1, 0);
    double loss = 1e9;
    for (int it = 0; it < 400; it++) {
        em_scope_begin();
        em_tensor *l = em_binary_cross_entropy_with_logits(em_module_forward(m, x), y, NULL);
        em_grads *g = em_backward(l);
        if (!g) fail_msg("backward: %s", em_last_error());
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        if (it == 399) em_item(l, &loss);
        em_scope_end();
    }
    if (!(loss < 0.05)) fail_msg("XOR loss after 400 Adam steps: %g", loss);
    em_scope_begin();
    em_tensor *p = em_sigmoid(em_module_forward(m, x));
    double *pv = em_test_values(p);
    assert_true(pv[0] < 0.5 && pv[1] > 0.5 && pv[2] > 0.5 && pv[3] < 0.5);
    free(pv);
    em_scope_end();
    em_tensor_release(x);
    em_tensor_release(y);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_regression(void **state)
{
    (void)state;
    /* y = 2 x0 - 3 x1 + 0.5 |x0| fitted by Linear-ReLU-Linear with SGD + momentum */
    em_manual_seed(5);
    const int N = 64;
    em_tensor *x = em_rand_uniform(SHAPE(64, 2), 2, EM_F32, -1, 1);
    double *xv = em_test_values(x);
    float yv[64];
    for (int i = 0; i < N; i++) yv[i] = (float)(2 * xv[2 * i] - 3 * xv[2 * i + 1] + 0.5 * fabs(xv[2 * i]));
    free(xv);
    em_tensor *y = em_from_host(yv, SHAPE(64, 1), 2, EM_F32);
    em_module *m = mlp_new(2, 32, 1);
    em_optim_config c = em_optim_config_default(EM_OPTIM_SGD);
    c.lr = 0.05;
    c.momentum = 0.9;
    em_optim *opt = em_optim_new_for_module(&c, m);
    assert_non_null(opt);
    double first = 0, last = 0;
    for (int it = 0; it < 600; it++) {
        em_scope_begin();
        em_tensor *l = em_mse_loss(em_module_forward(m, x), y, EM_REDUCTION_MEAN);
        em_grads *g = em_backward(l);
        assert_non_null(g);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        if (it == 0) em_item(l, &first);
        if (it == 599) em_item(l, &last);
        em_scope_end();
    }
    if (!(last < 2e-3 && last < first / 100)) fail_msg("regression MSE %g (first %g)", last, first);
    em_tensor_release(x);
    em_tensor_release(y);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_no_leak_1000_steps(void **state)
{
    (void)state;
    em_manual_seed(11);
    em_module *m = em_sequential_new(
        (em_module *[]){em_linear_new(6, 16, true), em_layer_norm_new(SHAPE(16), 1, 1e-5, true), em_gelu_new(false), em_dropout_new(0.1),
                        em_linear_new(16, 3, true)},
        5);
    assert_non_null(m);
    em_optim_config c = em_optim_config_default(EM_OPTIM_ADAMW);
    c.lr = 1e-3;
    em_optim *opt = em_optim_new_for_module(&c, m);
    em_lr_scheduler *sched = em_lr_warmup_cosine(1e-3, 50, 1000, 1e-5);
    em_tensor *x = em_rand_normal(SHAPE(8, 6), 2, EM_F32, 0, 1);
    int64_t t[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    em_tensor *y = em_from_host(t, SHAPE(8), 1, EM_I64);
    em_stats s0 = {0};
    for (int it = 0; it < 1000; it++) {
        em_scope_begin();
        em_tensor *l = em_cross_entropy(em_module_forward(m, x), y, NULL);
        em_grads *g = em_backward(l);
        if (!g) fail_msg("step %d: %s", it, em_last_error());
        em_tensor *ps[8];
        int np = em_module_parameters(m, ps, 8);
        /* max_norm small enough that every step clips: the same op stream each step */
        assert_true(em_clip_grad_norm(g, ps, np, 1e-2, 2.0) > 1e-2);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_lr_scheduler_step(sched, opt);
        em_grads_free(g);
        em_scope_end();
        if (it == 9) {
            em_sync();
            s0 = em_get_stats();
        }
        if (getenv("EMBER_TEST_VERBOSE") && it % 100 == 99) {
            em_sync();
            em_stats s = em_get_stats();
            fprintf(stderr, "step %d: live tensors %lld, storages %lld, handles %lld, pooled %lld\n", it + 1, (long long)s.live_tensors,
                    (long long)s.live_storages, (long long)s.handles, (long long)s.pooled);
        }
    }
    em_test_assert_no_leak(&s0);
    em_tensor_release(x);
    em_tensor_release(y);
    em_lr_scheduler_free(sched);
    em_optim_free(opt);
    em_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_forward),
        cmocka_unit_test(test_param_keys_and_count),
        cmocka_unit_test(test_train_eval_freeze),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_activation_modules),
        cmocka_unit_test(test_losses_match_pytorch),
        cmocka_unit_test(test_losses_by_hand),
        cmocka_unit_test(test_loss_errors),
        cmocka_unit_test(test_xor),
        cmocka_unit_test(test_regression),
        cmocka_unit_test(test_no_leak_1000_steps),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
