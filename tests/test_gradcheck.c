/* Every backward rule against central finite differences in f64.
 *
 * For each case, loss = sum(f(x...) * W) with a fixed random W, so every
 * output element's gradient matters. The analytic gradient from em_backward
 * is compared with (L(x + h e_i) - L(x - h e_i)) / 2h for every input
 * element. */
#include "testutil.h"

#include "optable.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXIN 3

typedef em_tensor *(*fwd_fn)(em_tensor **x);

typedef struct gcase {
    const char *name;
    const char *op; /* the table kind whose backward it checks (tasks/ops.def name); NULL = name */
    fwd_fn f;
    int nin;
    int ndim[MAXIN];
    int64_t shape[MAXIN][4];
    double lo, hi; /* input range */
} gcase;

static uint64_t rng_state = 88172645463325252ull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static double loss_value(const gcase *c, double **vals, const double *w, int64_t nw)
{
    em_scope_begin();
    em_tensor *x[MAXIN];
    for (int i = 0; i < c->nin; i++) x[i] = em_test_f64(vals[i], c->shape[i], c->ndim[i]);
    em_tensor *y = c->f(x);
    if (!y) fail_msg("%s: forward failed: %s", c->name, em_last_error());
    if (em_tensor_numel(y) != nw) fail_msg("%s: output size changed", c->name);
    em_tensor *wt = em_test_f64(w, em_tensor_shape(y), em_tensor_ndim(y));
    em_tensor *l = em_sum_all(em_mul(em_cast(y, EM_F64), wt));
    double v;
    assert_int_equal(em_item(l, &v), EM_OK);
    em_scope_end();
    return v;
}

static void gradcheck(const gcase *c)
{
    double *vals[MAXIN];
    int64_t n[MAXIN];
    for (int i = 0; i < c->nin; i++) {
        n[i] = 1;
        for (int d = 0; d < c->ndim[i]; d++) n[i] *= c->shape[i][d];
        vals[i] = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
        for (int64_t j = 0; j < n[i]; j++) vals[i][j] = c->lo + (c->hi - c->lo) * urand();
    }
    em_scope_begin();
    em_tensor *x[MAXIN];
    for (int i = 0; i < c->nin; i++) {
        x[i] = em_test_f64(vals[i], c->shape[i], c->ndim[i]);
        assert_int_equal(em_set_requires_grad(x[i], true), EM_OK);
    }
    em_tensor *y = c->f(x);
    if (!y) fail_msg("%s: forward failed: %s", c->name, em_last_error());
    int64_t nw = em_tensor_numel(y);
    double *w = malloc(sizeof(double) * (size_t)(nw ? nw : 1));
    for (int64_t j = 0; j < nw; j++) w[j] = urand() * 2 - 1;
    em_tensor *wt = em_test_f64(w, em_tensor_shape(y), em_tensor_ndim(y));
    em_tensor *loss = em_sum_all(em_mul(em_cast(y, EM_F64), wt));
    em_grads *g = em_backward(loss);
    if (!g) fail_msg("%s: backward failed: %s", c->name, em_last_error());
    const double h = 1e-6;
    for (int i = 0; i < c->nin; i++) {
        em_tensor *gi = em_grad(g, x[i]);
        double *ga = NULL;
        if (gi) {
            em_test_assert_shape(gi, c->ndim[i], c->shape[i]);
            ga = em_test_values(gi);
        }
        for (int64_t j = 0; j < n[i]; j++) {
            double keep = vals[i][j];
            vals[i][j] = keep + h;
            double lp = loss_value(c, vals, w, nw);
            vals[i][j] = keep - h;
            double lm = loss_value(c, vals, w, nw);
            vals[i][j] = keep;
            double num = (lp - lm) / (2 * h);
            double ana = ga ? ga[j] : 0.0;
            if (fabs(num - ana) > 1e-5 + 1e-4 * fabs(num))
                fail_msg("%s: input %d element %lld: analytic %.9g, numeric %.9g", c->name, i, (long long)j, ana, num);
        }
        free(ga);
    }
    em_grads_free(g);
    em_scope_end();
    free(w);
    for (int i = 0; i < c->nin; i++) free(vals[i]);
}

/* ---- forward functions ---- */
#define U(fn, expr) \
    static em_tensor *fn(em_tensor **x) { return expr; }
U(f_neg, em_neg(x[0]))
U(f_abs, em_abs(x[0]))
U(f_sign, em_sign(x[0]))
U(f_exp, em_exp(x[0]))
U(f_log, em_log(x[0]))
U(f_log1p, em_log1p(x[0]))
U(f_sqrt, em_sqrt(x[0]))
U(f_rsqrt, em_rsqrt(x[0]))
U(f_recip, em_reciprocal(x[0]))
U(f_square, em_square(x[0]))
U(f_sin, em_sin(x[0]))
U(f_cos, em_cos(x[0]))
U(f_tanh, em_tanh(x[0]))
U(f_sigmoid, em_sigmoid(x[0]))
U(f_relu, em_relu(x[0]))
U(f_gelu, em_gelu(x[0]))
U(f_gelu_tanh, em_gelu_tanh(x[0]))
U(f_silu, em_silu(x[0]))
U(f_softplus, em_softplus(x[0]))
U(f_erf, em_erf(x[0]))
U(f_floor, em_floor(x[0]))
U(f_ceil, em_ceil(x[0]))
U(f_round, em_round(x[0]))
U(f_clamp, em_clamp(x[0], -0.5, 0.5))
U(f_pow3, em_pow_scalar(x[0], 3.0))
U(f_pow25, em_pow_scalar(x[0], 2.5))
U(f_leaky, em_leaky_relu(x[0], 0.1))
U(f_elu, em_elu(x[0], 1.3))
U(f_adds, em_add_scalar(x[0], 2.0))
U(f_subs, em_sub_scalar(x[0], 2.0))
U(f_rsubs, em_rsub_scalar(x[0], 2.0))
U(f_muls, em_mul_scalar(x[0], -3.0))
U(f_divs, em_div_scalar(x[0], 4.0))
U(f_maxs, em_maximum_scalar(x[0], 0.1))
U(f_mins, em_minimum_scalar(x[0], 0.1))
U(f_add, em_add(x[0], x[1]))
U(f_sub, em_sub(x[0], x[1]))
U(f_mul, em_mul(x[0], x[1]))
U(f_div, em_div(x[0], x[1]))
U(f_pow, em_pow(x[0], x[1]))
U(f_maximum, em_maximum(x[0], x[1]))
U(f_minimum, em_minimum(x[0], x[1]))
U(f_where, em_where(em_gt_scalar(x[0], 0.0), x[1], x[2]))
U(f_sum1, em_sum(x[0], (const int[]){1}, 1, false))
U(f_sum0k, em_sum(x[0], (const int[]){0}, 1, true))
U(f_sumall, em_sum_all(x[0]))
U(f_sum02, em_sum(x[0], (const int[]){0, 2}, 2, false))
U(f_mean, em_mean(x[0], (const int[]){-1}, 1, false))
U(f_prod, em_prod(x[0], (const int[]){1}, 1, false))
U(f_max, em_max(x[0], (const int[]){1}, 1, false))
U(f_min, em_min(x[0], (const int[]){0}, 1, true))
U(f_lse, em_logsumexp(x[0], (const int[]){1}, 1, false))
U(f_var, em_var(x[0], (const int[]){1}, 1, 1.0, false))
U(f_std, em_std(x[0], NULL, 0, 0.0, false))
U(f_softmax, em_softmax(x[0], 1))
U(f_logsoftmax, em_log_softmax(x[0], 0))
U(f_mm, em_matmul(x[0], x[1]))
U(f_mm_tt, em_matmul(em_transpose(x[0], 0, 1), em_transpose(x[1], 0, 1))) /* both operands stored transposed */
U(f_mm_bt, em_matmul(x[0], em_transpose(x[1], 0, 1))) /* x [.., M, K] @ W^T: Linear on a batch (folded dW, transposed) */
U(f_mm_pt, em_matmul(em_permute(x[0], (int[]){1, 0, 2}, 3), x[1])) /* a batch that is not contiguous */
U(f_reshape, em_reshape(x[0], SHAPE(3, 2), 2))
U(f_transpose, em_mul(em_transpose(x[0], 0, 1), em_arange(1, 3, 1, EM_F64)))
U(f_permute, em_contiguous(em_permute(x[0], (const int[]){2, 0, 1}, 3)))
U(f_expand, em_expand(x[0], SHAPE(2, 3, 4), 3))
U(f_slice, em_slice(x[0], 1, 1, 6, 2))
U(f_narrow, em_narrow(x[0], 0, 1, 2))
U(f_unsq, em_squeeze(em_unsqueeze(em_flatten(x[0], 0, 1), 1), 1))
U(f_cat, em_cat(x, 2, 1))
U(f_stack, em_stack(x, 2, 0))
U(f_pad, em_pad(x[0], (const int64_t[]){1, 2, 0, 1}, 4, 0.5))
U(f_contig, em_contiguous(em_transpose(x[0], 0, 1)))
static em_tensor *f_split(em_tensor **x)
{
    em_tensor *p[3];
    int n = em_split(x[0], 2, 1, p, 3);
    if (n != 3) return NULL;
    return em_add(em_mul_scalar(p[0], 2.0), em_add(p[1], em_mul_scalar(em_pad(p[2], (const int64_t[]){0, 1}, 2, 0), 3.0)));
}
static const int64_t idx_data[6] = {2, 0, 1, 1, 2, 0};
static em_tensor *f_gather(em_tensor **x)
{
    em_tensor *idx = em_from_host(idx_data, SHAPE(2, 3), 2, EM_I64);
    return em_gather(x[0], 1, idx);
}
static em_tensor *f_index_select(em_tensor **x)
{
    em_tensor *idx = em_from_host((const int64_t[]){2, 0, 2}, SHAPE(3), 1, EM_I64);
    return em_index_select(x[0], 0, idx);
}
static em_tensor *f_scatter(em_tensor **x)
{
    em_tensor *idx = em_from_host((const int64_t[]){2, 0, 1}, SHAPE(1, 3), 2, EM_I64);
    return em_scatter(x[0], 0, idx, x[1]);
}
static em_tensor *f_scatter_add(em_tensor **x)
{
    em_tensor *idx = em_from_host((const int64_t[]){2, 0, 2}, SHAPE(1, 3), 2, EM_I64);
    return em_scatter_add(x[0], 0, idx, x[1]);
}
static em_tensor *f_index_add(em_tensor **x)
{
    em_tensor *idx = em_from_host((const int64_t[]){2, 0, 2}, SHAPE(3), 1, EM_I64);
    return em_index_add(x[0], 0, idx, x[1]);
}
static em_tensor *f_index_add_mid(em_tensor **x)
{
    em_tensor *idx = em_from_host((const int64_t[]){1, 1}, SHAPE(2), 1, EM_I64);
    return em_mul(em_index_add(x[0], 1, idx, x[1]), x[0]); /* a non-constant gradient for self */
}
U(f_alias, em_contiguous(x[0])) /* already contiguous: an alias view */
U(f_remainder, em_remainder(em_add_scalar(x[0], 3.0), x[1]))
U(f_remainder_s, em_remainder_scalar(x[0], 0.7))
U(f_hardswish, em_hardswish(x[0]))
U(f_hardsigmoid, em_hardsigmoid(x[0]))
U(f_mish, em_mish(x[0]))
U(f_selu, em_selu(x[0]))
U(f_celu, em_celu(x[0], 0.5))
U(f_softsign, em_softsign(x[0]))
U(f_logsigmoid, em_logsigmoid(x[0]))
U(f_expm1, em_expm1(x[0]))
U(f_log2, em_log2(x[0]))
U(f_exp2, em_exp2(x[0]))
U(f_trunc, em_trunc(x[0]))
U(f_erfinv, em_erfinv(x[0]))
U(f_fmod, em_fmod(em_add_scalar(x[0], 3.0), x[1]))
U(f_fmod_neg, em_fmod(em_add_scalar(x[0], -3.0), x[1]))
U(f_floor_divide, em_floor_divide(em_add_scalar(x[0], 3.0), x[1]))
U(f_atan2, em_atan2(x[0], em_add_scalar(x[1], -1.0)))
/* a chain that reuses x: gradients must accumulate */
U(f_reuse, em_mul(em_add(x[0], em_exp(x[0])), em_sin(x[0])))

#define S1(a, b) .nin = 1, .ndim = {2}, .shape = {{a, b}}
#define R(l, h) .lo = l, .hi = h

/* convolution and pooling: the same settings as gen_grad_fixtures.py's cases of these names */
static em_tensor *f_conv2d(em_tensor **x)
{
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = 2, o.padding[0] = 1, o.dilation[1] = 2;
    return em_conv2d(x[0], x[1], x[2], &o);
}
static em_tensor *f_conv2d_groups(em_tensor **x)
{
    em_conv_opts o = em_conv_opts_default();
    o.padding[0] = o.padding[1] = 1, o.groups = 2;
    return em_conv2d(x[0], x[1], NULL, &o);
}
static em_tensor *f_conv_t(em_tensor **x)
{
    em_conv_opts o = em_conv_opts_default();
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1, o.output_padding[0] = o.output_padding[1] = 1;
    return em_conv_transpose2d(x[0], x[1], x[2], &o);
}
static em_tensor *f_max_pool(em_tensor **x)
{
    em_pool_opts o = em_pool_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1;
    return em_max_pool2d(x[0], &o, NULL);
}
static em_tensor *f_avg_pool(em_tensor **x)
{
    em_pool_opts o = em_pool_opts_default(3, 3);
    o.stride[0] = o.stride[1] = 2, o.padding[0] = o.padding[1] = 1, o.ceil_mode = true, o.count_include_pad = false;
    return em_avg_pool2d(x[0], &o);
}
/* training-mode batch norm (the fused BATCH_NORM op): the same settings as gen_grad_fixtures.py's cases of these names */
static em_tensor *f_batch_norm(em_tensor **x) { return em_batch_norm(x[0], NULL, NULL, x[1], x[2], true, 0.1, 1e-5); }
static em_tensor *f_batch_norm_nc(em_tensor **x) { return em_batch_norm(x[0], NULL, NULL, x[1], NULL, true, 0.1, 1e-3); }
/* layer norm with weight and bias (the fused LAYER_NORM op): over the last dim, and over the last two */
static em_tensor *f_layer_norm_fused(em_tensor **x) { return em_layer_norm(x[0], 1, x[1], x[2], 1e-5); }
static em_tensor *f_layer_norm_fused2(em_tensor **x) { return em_layer_norm(x[0], 2, x[1], x[2], 1e-3); }

/* fused scaled-dot-product attention (the SDPA op, tasks/attention.c): q, k, v
 * [1, 2, T, D]; the masks are constants (the fused op gives a mask no
 * gradient; one that requires grad takes the composed path) */
static em_tensor *f_sdpa(em_tensor **x) { return em_scaled_dot_product_attention(x[0], x[1], x[2], NULL, false, 0, 0, false); }
static em_tensor *f_sdpa_causal(em_tensor **x) { return em_scaled_dot_product_attention(x[0], x[1], x[2], NULL, true, 0, 0.7, false); }
static em_tensor *f_sdpa_bool(em_tensor **x)
{
    /* [Tq 3, Tk 4], every row keeps a key */
    const double m[12] = {1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1};
    return em_scaled_dot_product_attention(x[0], x[1], x[2], em_ne_scalar(em_test_f64(m, SHAPE(3, 4), 2), 0), false, 0, 0, false);
}
static em_tensor *f_sdpa_add(em_tensor **x)
{
    /* additive [H 2, 1, Tk 4] with -inf entries, broadcast over the rows */
    const double m[8] = {0.5, -INFINITY, -1, 0.25, -INFINITY, 0, 0.75, -0.5};
    return em_scaled_dot_product_attention(x[0], x[1], x[2], em_test_f64(m, SHAPE(2, 1, 4), 3), false, 0, 0, false);
}
#define SDPA_SHAPES(tq, tk, d, dv) .nin = 3, .ndim = {4, 4, 4}, .shape = {{1, 2, tq, d}, {1, 2, tk, d}, {1, 2, tk, dv}}

static const gcase cases[] = {
    {"sdpa", NULL, f_sdpa, SDPA_SHAPES(3, 4, 3, 2), R(-1, 1)},
    {"sdpa_causal", "sdpa", f_sdpa_causal, SDPA_SHAPES(4, 3, 2, 3), R(-1, 1)},
    {"sdpa_bool_mask", "sdpa", f_sdpa_bool, SDPA_SHAPES(3, 4, 3, 2), R(-1, 1)},
    {"sdpa_add_mask", "sdpa", f_sdpa_add, SDPA_SHAPES(3, 4, 2, 2), R(-1, 1)},
    {"neg", NULL, f_neg, S1(2, 3), R(-2, 2)},       {"abs", NULL, f_abs, S1(2, 3), R(0.1, 2)},
    {"sign", NULL, f_sign, S1(2, 3), R(0.1, 2)},    {"exp", NULL, f_exp, S1(2, 3), R(-2, 2)},
    {"log", NULL, f_log, S1(2, 3), R(0.5, 2)},      {"log1p", NULL, f_log1p, S1(2, 3), R(-0.5, 2)},
    {"sqrt", NULL, f_sqrt, S1(2, 3), R(0.5, 2)},    {"rsqrt", NULL, f_rsqrt, S1(2, 3), R(0.5, 2)},
    {"reciprocal", NULL, f_recip, S1(2, 3), R(0.5, 2)}, {"square", NULL, f_square, S1(2, 3), R(-2, 2)},
    {"sin", NULL, f_sin, S1(2, 3), R(-2, 2)},       {"cos", NULL, f_cos, S1(2, 3), R(-2, 2)},
    {"tanh", NULL, f_tanh, S1(2, 3), R(-2, 2)},     {"sigmoid", NULL, f_sigmoid, S1(2, 3), R(-3, 3)},
    {"relu", NULL, f_relu, S1(2, 3), R(0.1, 2)},    {"relu_neg", "relu", f_relu, S1(2, 3), R(-2, -0.1)},
    {"gelu", NULL, f_gelu, S1(2, 3), R(-3, 3)},     {"gelu_tanh", NULL, f_gelu_tanh, S1(2, 3), R(-3, 3)},
    {"silu", NULL, f_silu, S1(2, 3), R(-3, 3)},     {"softplus", NULL, f_softplus, S1(2, 3), R(-3, 3)},
    {"erf", NULL, f_erf, S1(2, 3), R(-2, 2)},       {"floor", NULL, f_floor, S1(2, 3), R(0.1, 0.9)},
    {"ceil", NULL, f_ceil, S1(2, 3), R(0.1, 0.9)},  {"round", NULL, f_round, S1(2, 3), R(0.1, 0.4)},
    {"clamp_in", "clamp", f_clamp, S1(2, 3), R(-0.4, 0.4)}, {"clamp_out", "clamp", f_clamp, S1(2, 3), R(0.6, 2)},
    {"pow_scalar3", "pow_scalar", f_pow3, S1(2, 3), R(-2, 2)}, {"pow_scalar2.5", "pow_scalar", f_pow25, S1(2, 3), R(0.5, 2)},
    {"leaky_relu", NULL, f_leaky, S1(2, 3), R(0.1, 2)}, {"leaky_relu_neg", "leaky_relu", f_leaky, S1(2, 3), R(-2, -0.1)},
    {"elu", NULL, f_elu, S1(2, 3), R(-2, -0.1)},    {"elu_pos", "elu", f_elu, S1(2, 3), R(0.1, 2)},
    {"add_scalar", NULL, f_adds, S1(2, 3), R(-2, 2)}, {"sub_scalar", NULL, f_subs, S1(2, 3), R(-2, 2)},
    {"rsub_scalar", NULL, f_rsubs, S1(2, 3), R(-2, 2)}, {"mul_scalar", NULL, f_muls, S1(2, 3), R(-2, 2)},
    {"div_scalar", NULL, f_divs, S1(2, 3), R(-2, 2)}, {"maximum_scalar", NULL, f_maxs, S1(2, 3), R(-2, 2)},
    {"minimum_scalar", NULL, f_mins, S1(2, 3), R(-2, 2)},
    {"add_broadcast", "add", f_add, .nin = 2, .ndim = {2, 1}, .shape = {{2, 3}, {3}}, R(-2, 2)},
    {"sub_broadcast", "sub", f_sub, .nin = 2, .ndim = {2, 2}, .shape = {{2, 1}, {1, 3}}, R(-2, 2)},
    {"mul_broadcast", "mul", f_mul, .nin = 2, .ndim = {3, 2}, .shape = {{2, 2, 3}, {2, 1}}, R(-2, 2)},
    {"div", NULL, f_div, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(0.5, 2)},
    {"pow", NULL, f_pow, .nin = 2, .ndim = {2, 1}, .shape = {{2, 3}, {3}}, R(0.5, 2)},
    {"maximum", NULL, f_maximum, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(-2, 2)},
    {"minimum", NULL, f_minimum, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(-2, 2)},
    {"where", NULL, f_where, .nin = 3, .ndim = {2, 2, 1}, .shape = {{2, 3}, {2, 3}, {3}}, R(-2, 2)},
    {"sum_dim1", "sum", f_sum1, S1(3, 4), R(-2, 2)}, {"sum_dim0_keepdim", "sum", f_sum0k, S1(3, 4), R(-2, 2)},
    {"sum_all", "sum", f_sumall, S1(3, 4), R(-2, 2)},
    {"sum_dims02", "sum", f_sum02, .nin = 1, .ndim = {3}, .shape = {{2, 3, 2}}, R(-2, 2)},
    {"mean", NULL, f_mean, S1(3, 4), R(-2, 2)},     {"prod", NULL, f_prod, S1(3, 4), R(0.5, 2)},
    {"max", NULL, f_max, S1(3, 4), R(-2, 2)},       {"min_keepdim", "min", f_min, S1(3, 4), R(-2, 2)},
    {"logsumexp", NULL, f_lse, S1(3, 4), R(-2, 2)}, {"var", NULL, f_var, S1(3, 4), R(-2, 2)},
    {"std", NULL, f_std, S1(3, 4), R(-2, 2)},       {"softmax", NULL, f_softmax, S1(3, 4), R(-2, 2)},
    {"log_softmax", NULL, f_logsoftmax, S1(3, 4), R(-2, 2)},
    {"matmul_2d", "matmul", f_mm, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {3, 4}}, R(-2, 2)},
    {"matmul_transposed_operands", NULL, f_mm_tt, .nin = 2, .ndim = {2, 2}, .shape = {{3, 2}, {4, 3}}, R(-2, 2)},
    {"matmul_batched", NULL, f_mm, .nin = 2, .ndim = {3, 2}, .shape = {{2, 2, 3}, {3, 2}}, R(-2, 2)},
    {"matmul_batched_wT", NULL, f_mm_bt, .nin = 2, .ndim = {3, 2}, .shape = {{2, 3, 4}, {2, 4}}, R(-2, 2)},
    {"matmul_batched_perm", NULL, f_mm_pt, .nin = 2, .ndim = {3, 2}, .shape = {{3, 2, 4}, {4, 2}}, R(-2, 2)},
    {"matmul_batched_vec", NULL, f_mm, .nin = 2, .ndim = {3, 1}, .shape = {{2, 2, 3}, {3}}, R(-2, 2)},
    {"matmul_bcast", NULL, f_mm, .nin = 2, .ndim = {4, 3}, .shape = {{2, 1, 2, 3}, {2, 3, 2}}, R(-2, 2)},
    {"matmul_vec_mat", NULL, f_mm, .nin = 2, .ndim = {1, 2}, .shape = {{3}, {3, 2}}, R(-2, 2)},
    {"matmul_mat_vec", NULL, f_mm, .nin = 2, .ndim = {2, 1}, .shape = {{2, 3}, {3}}, R(-2, 2)},
    {"matmul_dot", NULL, f_mm, .nin = 2, .ndim = {1, 1}, .shape = {{4}, {4}}, R(-2, 2)},
    {"reshape", NULL, f_reshape, S1(2, 3), R(-2, 2)}, {"transpose", NULL, f_transpose, S1(2, 3), R(-2, 2)},
    {"permute", NULL, f_permute, .nin = 1, .ndim = {3}, .shape = {{2, 3, 2}}, R(-2, 2)},
    {"expand", NULL, f_expand, .nin = 1, .ndim = {2}, .shape = {{3, 1}}, R(-2, 2)},
    {"slice_step", "slice", f_slice, S1(2, 6), R(-2, 2)}, {"narrow", NULL, f_narrow, S1(3, 2), R(-2, 2)},
    {"flatten_unsqueeze_squeeze", NULL, f_unsq, S1(2, 3), R(-2, 2)},
    {"cat", NULL, f_cat, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 2}}, R(-2, 2)},
    {"stack", NULL, f_stack, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(-2, 2)},
    {"split", NULL, f_split, S1(2, 5), R(-2, 2)},   {"pad", NULL, f_pad, S1(2, 3), R(-2, 2)},
    {"contiguous", "copy", f_contig, S1(2, 3), R(-2, 2)},
    {"gather", NULL, f_gather, S1(2, 3), R(-2, 2)}, {"index_select", NULL, f_index_select, S1(3, 2), R(-2, 2)},
    {"scatter", NULL, f_scatter, .nin = 2, .ndim = {2, 2}, .shape = {{3, 3}, {1, 3}}, R(-2, 2)},
    {"scatter_add", NULL, f_scatter_add, .nin = 2, .ndim = {2, 2}, .shape = {{3, 3}, {1, 3}}, R(-2, 2)},
    {"index_add", NULL, f_index_add, .nin = 2, .ndim = {2, 2}, .shape = {{3, 2}, {3, 2}}, R(-2, 2)},
    {"index_add_dim1", "index_add", f_index_add_mid, .nin = 2, .ndim = {3, 3}, .shape = {{2, 3, 2}, {2, 2, 2}}, R(-2, 2)},
    {"reuse_accumulates", NULL, f_reuse, S1(2, 3), R(-2, 2)},
    {"conv2d", NULL, f_conv2d, .nin = 3, .ndim = {4, 4, 1}, .shape = {{1, 2, 4, 5}, {3, 2, 3, 2}, {3}}, R(-2, 2)},
    {"conv2d_groups", "conv2d", f_conv2d_groups, .nin = 2, .ndim = {4, 4}, .shape = {{1, 4, 4, 4}, {4, 2, 3, 3}}, R(-2, 2)},
    {"conv_transpose2d", "conv2d_bwd_data", f_conv_t, .nin = 3, .ndim = {4, 4, 1}, .shape = {{1, 2, 3, 3}, {2, 3, 3, 3}, {3}},
     R(-2, 2)},
    {"max_pool2d", NULL, f_max_pool, .nin = 1, .ndim = {4}, .shape = {{1, 2, 5, 5}}, R(-2, 2)},
    {"avg_pool2d", NULL, f_avg_pool, .nin = 1, .ndim = {4}, .shape = {{1, 2, 5, 5}}, R(-2, 2)},
    {"alias", NULL, f_alias, S1(2, 3), R(-2, 2)},
    /* a + 3 in (3.1, 3.9) over b in (1.1, 1.9): floor(a / b) is 1, 2 or 3, away from its jumps at these seeds */
    {"remainder", NULL, f_remainder, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(1.1, 1.9)},
    {"remainder_scalar", NULL, f_remainder_s, S1(2, 3), R(-2, 2)},
    {"hardswish", NULL, f_hardswish, S1(3, 4), R(-5, 5)},
    {"hardsigmoid", NULL, f_hardsigmoid, S1(3, 4), R(-5, 5)},
    {"mish", NULL, f_mish, S1(2, 3), R(-3, 3)},
    {"selu", NULL, f_selu, S1(2, 3), R(-2, 2)},
    {"celu", NULL, f_celu, S1(2, 3), R(-2, 2)},
    {"softsign", NULL, f_softsign, S1(2, 3), R(-3, 3)},
    {"logsigmoid", NULL, f_logsigmoid, S1(2, 3), R(-4, 4)},
    {"expm1", NULL, f_expm1, S1(2, 3), R(-2, 2)},
    {"log2", NULL, f_log2, S1(2, 3), R(0.5, 2)},
    {"exp2", NULL, f_exp2, S1(2, 3), R(-2, 2)},
    {"trunc", NULL, f_trunc, S1(2, 3), R(0.1, 0.9)},
    {"erfinv", NULL, f_erfinv, S1(2, 3), R(-0.9, 0.9)},
    {"fmod", NULL, f_fmod, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(1.1, 1.9)},
    {"fmod_neg", "fmod", f_fmod_neg, .nin = 2, .ndim = {2, 1}, .shape = {{2, 3}, {3}}, R(0.1, 0.9)},
    {"floor_divide", NULL, f_floor_divide, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(1.1, 1.9)},
    {"atan2", NULL, f_atan2, .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 3}}, R(-2, 2)},
    {"batch_norm", NULL, f_batch_norm, .nin = 3, .ndim = {4, 1, 1}, .shape = {{3, 2, 2, 3}, {2}, {2}}, R(-2, 2)},
    {"batch_norm_nc", "batch_norm", f_batch_norm_nc, .nin = 2, .ndim = {2, 1}, .shape = {{5, 3}, {3}}, R(-2, 2)},
    {"layer_norm_fused", "layer_norm", f_layer_norm_fused, .nin = 3, .ndim = {3, 1, 1}, .shape = {{2, 3, 5}, {5}, {5}}, R(-2, 2)},
    {"layer_norm_fused2", "layer_norm", f_layer_norm_fused2, .nin = 3, .ndim = {3, 2, 2}, .shape = {{3, 2, 4}, {2, 4}, {2, 4}}, R(-2, 2)},
};

static void test_all_rules(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) gradcheck(&cases[i]);
}

static bool has_case(const char *name, void *ctx)
{
    (void)ctx;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(cases[i].op ? cases[i].op : cases[i].name, name)) return true;
    return false;
}

/* Every differentiable kind of the op table (tasks/ops.def) has a case above:
 * a new op cannot be added without its finite-difference check. */
static void test_cases_cover_op_table(void **state)
{
    (void)state;
    int missing = em_test_uncovered_diff_kinds(has_case, NULL, "gradcheck");
    if (missing) fail_msg("%d differentiable op kind(s) of tasks/ops.def have no gradcheck case", missing);
}

static void test_errors(void **state)
{
    (void)state;
    em_scope_begin();
    em_tensor *a = F64((2), 1, 2);
    assert_null(em_backward(em_sum_all(a)));
    assert_non_null(strstr(em_last_error(), "does not require"));
    em_tensor *i = em_from_host((const int64_t[]){1, 2}, SHAPE(2), 1, EM_I64);
    assert_int_equal(em_set_requires_grad(i, true), EM_ERR_DTYPE);
    assert_int_equal(em_set_requires_grad(a, true), EM_OK);
    em_tensor *l = em_sum_all(em_mul(a, a));
    em_grads *g = em_backward(l);
    assert_non_null(g);
    em_grads_free(g);
    /* second backward through a freed graph */
    assert_null(em_backward(l));
    assert_non_null(strstr(em_last_error(), "already freed"));
    /* no-grad scope records nothing */
    em_no_grad_begin();
    em_tensor *m = em_mul(a, a);
    em_no_grad_end();
    assert_false(em_requires_grad(m));
    /* detach cuts the graph */
    em_tensor *d = em_detach(em_mul(a, a));
    assert_false(em_requires_grad(d));
    assert_int_equal(em_set_requires_grad(em_mul(a, a), false), EM_ERR_STATE);
    em_scope_end();
}

static void test_graph_freed(void **state)
{
    (void)state;
    em_stats before = em_get_stats();
    for (int it = 0; it < 50; it++) {
        em_scope_begin();
        em_tensor *w = em_rand_normal(SHAPE(4, 3), 2, EM_F32, 0, 1);
        em_set_requires_grad(w, true);
        em_tensor *x = em_rand_normal(SHAPE(5, 4), 2, EM_F32, 0, 1);
        em_tensor *l = em_mean_all(em_square(em_tanh(em_matmul(x, w))));
        em_grads *g = em_backward(l);
        assert_non_null(g);
        assert_non_null(em_grad(g, w));
        em_grads_free(g);
        em_scope_end();
    }
    em_sync();
    em_stats after = em_get_stats();
    assert_int_equal(after.live_tensors, before.live_tensors);
    assert_int_equal(after.live_storages, before.live_storages);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_cover_op_table),
        cmocka_unit_test(test_all_rules),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_graph_freed),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
