/* Forward values and gradients of every differentiable op against PyTorch.
 *
 * tests/fixtures/grad_fixtures.txt (written by gen_grad_fixtures.py with
 * torch.autograd, found through EMBER_TEST_DATA) holds, per case, float64
 * inputs x0.., a weight W, out = f(x), loss = sum(out * W) and the gradients
 * g<i> = d loss / d x<i>. The cases are those of test_gradcheck.c's table
 * (same op, shapes and arguments) plus more: reductions over several dims,
 * matmul and view variants, the losses of nn.h and Linear / LayerNorm /
 * RMSNorm. Each is recomputed here in Ember (em_set_requires_grad,
 * em_backward, em_grad) and must agree to 1e-10 relative. */
#include "fixture.h"
#include "testutil.h"

#include "optable.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXIN 4

/* A required numeric keyword. */
static double kw_req(const fx_block *b, const char *key)
{
    char v[256];
    if (!fx_kw_str(b, key, v, sizeof v)) fail_msg("fixture %s: op line lacks '%s'", b->config, key);
    return strtod(v, NULL);
}

static int kw_int(const fx_block *b, const char *key) { return (int)kw_req(b, key); }

/* A comma-separated integer list; returns the count, -1 when absent. */
static int fx_kw_list(const fx_block *b, const char *key, int64_t *out, int max)
{
    char v[256];
    if (!fx_kw_str(b, key, v, sizeof v)) return -1;
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(v, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save)) out[n++] = atoll(tok);
    return n;
}

static em_reduction kw_reduction(const fx_block *b)
{
    char v[32];
    if (!fx_kw_str(b, "reduction", v, sizeof v) || !strcmp(v, "mean")) return EM_REDUCTION_MEAN;
    if (!strcmp(v, "sum")) return EM_REDUCTION_SUM;
    if (!strcmp(v, "none")) return EM_REDUCTION_NONE;
    fail_msg("fixture %s: bad reduction '%s'", b->config, v);
    return EM_REDUCTION_MEAN;
}

/* A pair keyword ("stride 2,1") into out[0..1]; a single value is used for
 * both; absent: def. */
static void kw_pair(const fx_block *b, const char *key, int64_t *out, int64_t def)
{
    int64_t v[2];
    int n = fx_kw_list(b, key, v, 2);
    out[0] = n >= 1 ? v[0] : def;
    out[1] = n == 2 ? v[1] : out[0];
}

/* em_conv_opts from a conv fixture (gen_grad_fixtures.py: _conv2d, _conv_t). */
static em_conv_opts kw_conv(const fx_block *b)
{
    em_conv_opts o = em_conv_opts_default();
    kw_pair(b, "stride", o.stride, 1);
    kw_pair(b, "padding", o.padding, 0);
    kw_pair(b, "dilation", o.dilation, 1);
    kw_pair(b, "output_padding", o.output_padding, 0);
    char buf[64];
    if (fx_kw_str(b, "pad_end", buf, sizeof buf)) kw_pair(b, "pad_end", o.padding_end, 0);
    o.groups = (int64_t)fx_kw(b, "groups", 1);
    o.padding_same = fx_kw(b, "same", 0) != 0;
    return o;
}

static em_pool_opts kw_pool(const fx_block *b)
{
    int64_t k[2];
    kw_pair(b, "kernel", k, 1);
    em_pool_opts o = em_pool_opts_default(k[0], k[1]);
    if (fx_kw_list(b, "stride", k, 2) > 0) kw_pair(b, "stride", o.stride, 1);
    kw_pair(b, "padding", o.padding, 0);
    kw_pair(b, "dilation", o.dilation, 1);
    o.ceil_mode = fx_kw(b, "ceil_mode", 0) != 0;
    o.count_include_pad = fx_kw(b, "count_include_pad", 1) != 0;
    o.divisor_override = (int64_t)fx_kw(b, "divisor", 0);
    return o;
}

/* Optional non-differentiable argument "name" (NULL when absent). */
static em_tensor *aux(const fx_block *b, const char *name, em_dtype dt)
{
    const fx_tensor *t = fx_find(b, name);
    return t ? fx_new(t, dt) : NULL;
}

static em_tensor *aux_req(const fx_block *b, const char *name, em_dtype dt)
{
    return fx_new(fx_get(b, name), dt);
}

/* ---- the forward functions ------------------------------------------------------ */

typedef em_tensor *(*unary_fn)(const em_tensor *);
typedef em_tensor *(*binary_fn)(const em_tensor *, const em_tensor *);
typedef em_tensor *(*scalar_fn)(const em_tensor *, double);
typedef em_tensor *(*red_fn)(const em_tensor *, const int *, int, bool);

/* The element-wise kinds of tasks/ops.def by their public functions
 * (em_test_ew*_fns, optable.h; an EWS line's scalar is the fixture's "s"),
 * plus a few composite forward functions. */
static const struct {
    const char *name;
    unary_fn f;
} UNARY[] = {
    {"sum_all", em_sum_all}, {"mean_all", em_mean_all}, {"squeeze_all", em_squeeze_all},
};

static const struct {
    const char *name;
    binary_fn f;
} BINARY[] = {
    {"matmul", em_matmul},
};

static const struct {
    const char *name;
    const char *key;
    scalar_fn f;
} SCALAR[] = {
    {"pow_scalar", "e", em_pow_scalar}, {"leaky_relu", "slope", em_leaky_relu}, {"elu", "alpha", em_elu},
    {"celu", "alpha", em_celu},
};

static const struct {
    const char *name;
    red_fn f;
} REDUCE[] = {
    {"sum", em_sum}, {"mean", em_mean}, {"prod", em_prod}, {"max", em_max}, {"min", em_min}, {"logsumexp", em_logsumexp},
};

/* dims from "dims" (absent: all dims, ndims = 0) */
static int kw_dims(const fx_block *b, int *dims)
{
    int64_t d[EM_MAX_DIMS];
    int n = fx_kw_list(b, "dims", d, EM_MAX_DIMS);
    for (int i = 0; i < n; i++) dims[i] = (int)d[i];
    return n < 0 ? 0 : n;
}

/* out = f(x[0..nin)); NULL with em_last_error() on failure. Scope-owned. */
static em_tensor *forward(const fx_block *b, em_tensor **x, int nin)
{
    char op[64];
    fx_op(b, op, sizeof op);
    for (size_t i = 0; i < sizeof em_test_ew1_fns / sizeof em_test_ew1_fns[0]; i++)
        if (!strcmp(op, em_test_ew1_fns[i].name)) return em_test_ew1_fns[i].f(x[0]);
    for (size_t i = 0; i < sizeof em_test_ew2_fns / sizeof em_test_ew2_fns[0]; i++)
        if (!strcmp(op, em_test_ew2_fns[i].name)) return em_test_ew2_fns[i].f(x[0], x[1]);
    for (size_t i = 0; i < sizeof em_test_ews_fns / sizeof em_test_ews_fns[0]; i++)
        if (!strcmp(op, em_test_ews_fns[i].name)) return em_test_ews_fns[i].f(x[0], kw_req(b, "s"));
    for (size_t i = 0; i < sizeof UNARY / sizeof UNARY[0]; i++)
        if (!strcmp(op, UNARY[i].name)) return UNARY[i].f(x[0]);
    for (size_t i = 0; i < sizeof BINARY / sizeof BINARY[0]; i++)
        if (!strcmp(op, BINARY[i].name)) return BINARY[i].f(x[0], x[1]);
    for (size_t i = 0; i < sizeof SCALAR / sizeof SCALAR[0]; i++)
        if (!strcmp(op, SCALAR[i].name)) return SCALAR[i].f(x[0], kw_req(b, SCALAR[i].key));
    for (size_t i = 0; i < sizeof REDUCE / sizeof REDUCE[0]; i++)
        if (!strcmp(op, REDUCE[i].name)) {
            int dims[EM_MAX_DIMS];
            int nd = kw_dims(b, dims);
            return REDUCE[i].f(x[0], nd ? dims : NULL, nd, fx_kw(b, "keepdim", 0) != 0);
        }
    if (!strcmp(op, "var") || !strcmp(op, "std")) {
        int dims[EM_MAX_DIMS];
        int nd = kw_dims(b, dims);
        return (op[0] == 'v' ? em_var : em_std)(x[0], nd ? dims : NULL, nd, kw_req(b, "correction"), fx_kw(b, "keepdim", 0) != 0);
    }
    if (!strcmp(op, "clamp")) return em_clamp(x[0], kw_req(b, "lo"), kw_req(b, "hi"));
    if (!strcmp(op, "softplus_mod")) {
        /* torch.nn.Softplus(beta, threshold) through the module */
        em_module *m = em_softplus_new(kw_req(b, "beta"), kw_req(b, "threshold"));
        assert_non_null(m);
        em_tensor *y = em_module_forward(m, x[0]);
        em_module_free(m);
        return y;
    }
    if (!strcmp(op, "where_gt0")) return em_where(em_gt_scalar(x[0], 0.0), x[1], x[2]);
    if (!strcmp(op, "where")) return em_where(aux_req(b, "mask", EM_BOOL), x[0], x[1]);
    if (!strcmp(op, "masked_fill")) return em_masked_fill(x[0], aux_req(b, "mask", EM_BOOL), kw_req(b, "value"));
    if (!strcmp(op, "softmax")) return em_softmax(x[0], kw_int(b, "dim"));
    if (!strcmp(op, "log_softmax")) return em_log_softmax(x[0], kw_int(b, "dim"));
    if (!strcmp(op, "matmul_tA")) return em_matmul(em_transpose(x[0], -1, -2), x[1]);
    if (!strcmp(op, "reshape") || !strcmp(op, "t_reshape") || !strcmp(op, "expand")) {
        int64_t shape[EM_MAX_DIMS];
        int nd = fx_kw_list(b, "shape", shape, EM_MAX_DIMS);
        if (nd < 0) fail_msg("%s: no shape", b->config);
        if (op[0] == 'e') return em_expand(x[0], shape, nd);
        return em_reshape(op[0] == 't' ? em_transpose(x[0], 0, 1) : x[0], shape, nd);
    }
    if (!strcmp(op, "transpose")) return em_transpose(x[0], kw_int(b, "d0"), kw_int(b, "d1"));
    if (!strcmp(op, "transpose_scale")) return em_mul(em_transpose(x[0], 0, 1), em_arange(1, 3, 1, EM_F64));
    if (!strcmp(op, "permute")) {
        int64_t p[EM_MAX_DIMS];
        int perm[EM_MAX_DIMS];
        int nd = fx_kw_list(b, "perm", p, EM_MAX_DIMS);
        for (int i = 0; i < nd; i++) perm[i] = (int)p[i];
        em_tensor *y = em_permute(x[0], perm, nd);
        return fx_kw(b, "contig", 0) != 0 ? em_contiguous(y) : y;
    }
    if (!strcmp(op, "slice"))
        return em_slice(x[0], kw_int(b, "dim"), (int64_t)kw_req(b, "start"), (int64_t)kw_req(b, "end"), (int64_t)kw_req(b, "step"));
    if (!strcmp(op, "narrow")) return em_narrow(x[0], kw_int(b, "dim"), (int64_t)kw_req(b, "start"), (int64_t)kw_req(b, "length"));
    if (!strcmp(op, "flatten")) return em_flatten(x[0], kw_int(b, "start"), kw_int(b, "end"));
    if (!strcmp(op, "flatten_unsq_sq")) return em_squeeze(em_unsqueeze(em_flatten(x[0], 0, 1), 1), 1);
    if (!strcmp(op, "contiguous_t")) return em_contiguous(em_transpose(x[0], 0, 1));
    if (!strcmp(op, "cat")) return em_cat(x, nin, kw_int(b, "dim"));
    if (!strcmp(op, "stack")) return em_stack(x, nin, kw_int(b, "dim"));
    if (!strcmp(op, "split_combo")) {
        em_tensor *p[3];
        if (em_split(x[0], 2, 1, p, 3) != 3) return NULL;
        return em_add(em_mul_scalar(p[0], 2.0), em_add(p[1], em_mul_scalar(em_pad(p[2], (const int64_t[]){0, 1}, 2, 0), 3.0)));
    }
    if (!strcmp(op, "split_rev") || !strcmp(op, "chunk_rev")) {
        em_tensor *p[16], *r[16];
        int dim = kw_int(b, "dim");
        int n = op[1] == 'p' ? em_split(x[0], (int64_t)kw_req(b, "size"), dim, p, 16) : em_chunk(x[0], kw_int(b, "chunks"), dim, p, 16);
        if (n < 0) return NULL;
        for (int i = 0; i < n; i++) r[i] = p[n - 1 - i];
        return em_cat(r, n, dim);
    }
    if (!strcmp(op, "pad")) {
        int64_t pads[2 * EM_MAX_DIMS];
        int np = fx_kw_list(b, "pads", pads, 2 * EM_MAX_DIMS);
        return em_pad(x[0], pads, np, kw_req(b, "value"));
    }
    if (!strcmp(op, "gather")) return em_gather(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64));
    if (!strcmp(op, "scatter")) return em_scatter(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64), x[1]);
    if (!strcmp(op, "scatter_add")) return em_scatter_add(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64), x[1]);
    if (!strcmp(op, "index_select")) return em_index_select(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64));
    if (!strcmp(op, "index_add")) return em_index_add(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64), x[1]);
    if (!strcmp(op, "index_add_mul"))
        return em_mul(em_index_add(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64), x[1]), x[0]);
    if (!strcmp(op, "reuse")) return em_mul(em_add(x[0], em_exp(x[0])), em_sin(x[0]));
    if (!strcmp(op, "masked_softmax"))
        return em_softmax(em_masked_fill(x[0], aux_req(b, "mask", EM_BOOL), -INFINITY), kw_int(b, "dim"));
    if (!strcmp(op, "slice_overlap_mul")) return em_mul(em_slice(x[0], 1, 0, 2, 1), em_slice(x[0], 1, 1, 3, 1));
    /* one operand is the constant "c" (no gradient) */
    if (!strcmp(op, "mul_c")) return em_mul(x[0], aux_req(b, "c", EM_F64));
    if (!strcmp(op, "matmul_c")) return em_matmul(aux_req(b, "c", EM_F64), x[0]);
    if (!strcmp(op, "cat_c")) {
        em_tensor *ts[2] = {aux_req(b, "c", EM_F64), x[0]};
        return em_cat(ts, 2, kw_int(b, "dim"));
    }
    if (!strcmp(op, "where_c")) return em_where(aux_req(b, "mask", EM_BOOL), aux_req(b, "c", EM_F64), x[0]);
    if (!strcmp(op, "scatter_add_c")) return em_scatter_add(x[0], kw_int(b, "dim"), aux_req(b, "index", EM_I64), aux_req(b, "c", EM_F64));
    if (!strcmp(op, "scatter_src")) return em_scatter(aux_req(b, "c", EM_F64), kw_int(b, "dim"), aux_req(b, "index", EM_I64), x[0]);
    /* nn.h functional layers */
    if (!strcmp(op, "linear")) return em_linear(x[0], x[1], nin > 2 ? x[2] : NULL);
    if (!strcmp(op, "layer_norm"))
        return em_layer_norm(x[0], kw_int(b, "ndim"), nin > 1 ? x[1] : NULL, nin > 2 ? x[2] : NULL, kw_req(b, "eps"));
    if (!strcmp(op, "rms_norm")) return em_rms_norm(x[0], nin > 1 ? x[1] : NULL, kw_req(b, "eps"));
    /* losses */
    if (!strcmp(op, "cross_entropy") || !strcmp(op, "nll_loss")) {
        em_cross_entropy_opts o = em_cross_entropy_opts_default();
        o.reduction = kw_reduction(b);
        o.ignore_index = (int64_t)fx_kw(b, "ignore_index", -100);
        o.label_smoothing = fx_kw(b, "label_smoothing", 0.0);
        o.weight = aux(b, "weight", EM_F64);
        em_tensor *tgt = aux_req(b, "target", EM_I64);
        return op[0] == 'c' ? em_cross_entropy(x[0], tgt, &o) : em_nll_loss(x[0], tgt, &o);
    }
    if (!strcmp(op, "mse_loss")) return em_mse_loss(x[0], x[1], kw_reduction(b));
    if (!strcmp(op, "l1_loss")) return em_l1_loss(x[0], x[1], kw_reduction(b));
    if (!strcmp(op, "smooth_l1_loss")) return em_smooth_l1_loss(x[0], x[1], kw_req(b, "beta"), kw_reduction(b));
    if (!strcmp(op, "huber_loss")) return em_huber_loss(x[0], x[1], kw_req(b, "delta"), kw_reduction(b));
    if (!strcmp(op, "bce_with_logits")) {
        em_bce_opts o = em_bce_opts_default();
        o.reduction = kw_reduction(b);
        o.weight = aux(b, "weight", EM_F64);
        o.pos_weight = aux(b, "pos_weight", EM_F64);
        return em_binary_cross_entropy_with_logits(x[0], x[1], &o);
    }
    if (!strcmp(op, "conv2d") || !strcmp(op, "conv1d") || !strcmp(op, "conv2d_bwd_data")) {
        em_conv_opts o = kw_conv(b);
        const em_tensor *bias = nin > 2 ? x[2] : NULL;
        if (!strcmp(op, "conv1d")) return em_conv1d(x[0], x[1], bias, &o);
        return !strcmp(op, "conv2d") ? em_conv2d(x[0], x[1], bias, &o) : em_conv_transpose2d(x[0], x[1], bias, &o);
    }
    if (!strcmp(op, "max_pool2d") || !strcmp(op, "avg_pool2d")) {
        em_pool_opts o = kw_pool(b);
        return !strcmp(op, "max_pool2d") ? em_max_pool2d(x[0], &o, NULL) : em_avg_pool2d(x[0], &o);
    }
    if (!strcmp(op, "adaptive_avg_pool2d") || !strcmp(op, "adaptive_max_pool2d")) {
        int64_t sz[2];
        kw_pair(b, "size", sz, 1);
        return !strcmp(op, "adaptive_avg_pool2d") ? em_adaptive_avg_pool2d(x[0], sz[0], sz[1])
                                                  : em_adaptive_max_pool2d(x[0], sz[0], sz[1], NULL);
    }
    if (!strcmp(op, "batch_norm")) /* training mode, no running statistics */
        return em_batch_norm(x[0], NULL, NULL, nin > 1 ? x[1] : NULL, nin > 2 ? x[2] : NULL, true, 0.1, kw_req(b, "eps"));
    fail_msg("fixture %s: unknown op '%s'", b->config, op);
    return NULL;
}

/* ---- comparison ------------------------------------------------------------------ */

#define RTOL 1e-10

static double worst_rel = 0; /* largest relative error among the agreeing values */
static char worst_where[160];

/* Compares t with the fixture tensor @p want: same shape, and every element
 * within RTOL relative. An absolute floor of RTOL * 1e-4 * max|want| (at least
 * 1e-16) lets exact zeros, and values that are the small difference of large
 * terms (gelu_tanh' at x = -5.2: 1 + tanh(u) ~ 2e-7), match the few ulps that
 * another evaluation order leaves; such values are printed as notes.
 * Returns 0 or prints the first mismatch and returns 1. */
static int compare(const char *cfg, const char *what, const em_tensor *t, const fx_tensor *want)
{
    char s1[160], s2[160];
    if (!t) {
        printf("  %s: %s: missing (%s)\n", cfg, what, em_last_error());
        return 1;
    }
    if (em_tensor_ndim(t) != want->ndim || memcmp(em_tensor_shape(t), want->shape, sizeof(int64_t) * (size_t)want->ndim)) {
        printf("  %s: %s: shape %s, expected %s\n", cfg, what, em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), s1, sizeof s1),
               em_shape_str(want->shape, want->ndim, s2, sizeof s2));
        return 1;
    }
    if (em_tensor_dtype(t) != EM_F64) {
        printf("  %s: %s: dtype %s, expected float64\n", cfg, what, em_dtype_name(em_tensor_dtype(t)));
        return 1;
    }
    double scale = 0;
    for (int64_t i = 0; i < want->n; i++) scale = fmax(scale, fabs(want->v[i]));
    double atol = fmax(RTOL * 1e-4 * scale, 1e-16);
    double *v = em_test_values(t);
    int bad = 0;
    for (int64_t i = 0; i < want->n && !bad; i++) {
        double d = fabs(v[i] - want->v[i]);
        if (!(d <= atol + RTOL * fabs(want->v[i]))) {
            printf("  %s: %s element %lld: got %.17g, expected %.17g (abs err %.3g, rel err %.3g)\n", cfg, what, (long long)i, v[i],
                   want->v[i], d, want->v[i] != 0 ? d / fabs(want->v[i]) : INFINITY);
            bad = 1;
        } else if (d > RTOL * fabs(want->v[i])) {
            /* within the absolute floor only: say so, so it stays visible */
            printf("  note: %s: %s element %lld: got %.17g, expected %.17g: rel err %.3g, accepted by the absolute floor %.3g\n", cfg,
                   what, (long long)i, v[i], want->v[i], d / fabs(want->v[i]), atol);
        } else if (want->v[i] != 0 && d / fabs(want->v[i]) > worst_rel) {
            worst_rel = d / fabs(want->v[i]);
            snprintf(worst_where, sizeof worst_where, "%s, %s element %lld", cfg, what, (long long)i);
        }
    }
    free(v);
    return bad;
}

/* Runs one case; returns the number of mismatching tensors (0 = pass). */
static int run_case(const fx_block *b)
{
    if (strcmp(b->dtype, "float64")) fail_msg("%s: dtype %s (float64 expected)", b->config, b->dtype);
    em_tensor *x[MAXIN] = {0};
    int nin = 0;
    em_scope_begin();
    for (; nin < MAXIN; nin++) {
        char nm[8];
        snprintf(nm, sizeof nm, "x%d", nin);
        const fx_tensor *t = fx_find(b, nm);
        if (!t) break;
        x[nin] = fx_new(t, EM_F64);
        assert_int_equal(em_set_requires_grad(x[nin], true), EM_OK);
    }
    assert_true(nin > 0);
    int bad = 0;
    em_tensor *y = forward(b, x, nin);
    if (!y) {
        printf("  %s: forward failed: %s\n", b->config, em_last_error());
        em_scope_end();
        return 1;
    }
    bad += compare(b->config, "forward", y, fx_get(b, "out"));
    em_tensor *w = fx_new(fx_get(b, "W"), EM_F64);
    em_tensor *loss = em_sum_all(em_mul(y, w));
    bad += compare(b->config, "loss", loss, fx_get(b, "loss"));
    em_grads *g = loss ? em_backward(loss) : NULL;
    if (!g) {
        printf("  %s: backward failed: %s\n", b->config, em_last_error());
        em_scope_end();
        return bad + 1;
    }
    for (int i = 0; i < nin; i++) {
        char nm[8], what[32];
        snprintf(nm, sizeof nm, "g%d", i);
        snprintf(what, sizeof what, "grad of x%d", i);
        em_tensor *gi = em_grad(g, x[i]);
        /* no gradient (e.g. the mask input of where) is a gradient of zeros */
        if (!gi) gi = em_zeros(em_tensor_shape(x[i]), em_tensor_ndim(x[i]), EM_F64);
        bad += compare(b->config, what, gi, fx_get(b, nm));
    }
    em_grads_free(g);
    em_scope_end();
    return bad;
}

static void test_grads_match_pytorch(void **state)
{
    (void)state;
    fx_block *bs;
    int n = fx_load("grad_fixtures.txt", &bs);
    assert_true(n >= 150);
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (run_case(&bs[i])) failed++;
    printf("[grad_pytorch] %d cases: %d agree with PyTorch to %g relative (largest relative error %.3g at %s), %d failures\n",
           n, n - failed, RTOL, worst_rel, worst_where, failed);
    fx_free(bs, n);
    if (failed) fail_msg("%d of %d cases differ from PyTorch (listed above)", failed, n);
}

/* Every op of test_gradcheck.c's table has its PyTorch reference. */
static void test_covers_gradcheck_table(void **state)
{
    (void)state;
    static const char *names[] = {
        "neg", "abs", "sign", "exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "square", "sin", "cos", "tanh", "sigmoid",
        "relu", "relu_neg", "gelu", "gelu_tanh", "silu", "softplus", "erf", "floor", "ceil", "round", "clamp_in", "clamp_out",
        "pow_scalar3", "pow_scalar2.5", "leaky_relu", "leaky_relu_neg", "elu", "elu_pos", "add_scalar", "sub_scalar",
        "rsub_scalar", "mul_scalar", "div_scalar", "maximum_scalar", "minimum_scalar", "add_broadcast", "sub_broadcast",
        "mul_broadcast", "div", "pow", "maximum", "minimum", "where", "sum_dim1", "sum_dim0_keepdim", "sum_all", "sum_dims02",
        "mean", "prod", "max", "min_keepdim", "logsumexp", "var", "std", "softmax", "log_softmax", "matmul_2d",
        "matmul_batched", "matmul_bcast", "matmul_vec_mat", "matmul_mat_vec", "matmul_dot", "reshape", "transpose", "permute",
        "expand", "slice_step", "narrow", "flatten_unsqueeze_squeeze", "cat", "stack", "split", "pad", "contiguous", "gather",
        "index_select", "scatter", "scatter_add", "index_add", "index_add_dim1", "reuse_accumulates",
    };
    fx_block *bs;
    int n = fx_load("grad_fixtures.txt", &bs);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = !strcmp(bs[i].config, names[k]);
        if (!found) fail_msg("grad_fixtures.txt lacks gradcheck case '%s' (rerun gen_grad_fixtures.py)", names[k]);
    }
    fx_free(bs, n);
}

typedef struct fixtures {
    fx_block *bs;
    int n;
    fx_block *tf; /* transformer_fixtures.txt */
    int ntf;
} fixtures;

/* A fixture whose op is the kind's name, or a composite forward function that
 * exercises it. */
static bool has_fixture(const char *name, void *ctx)
{
    static const char *const composite[][2] = {
        {"contiguous_t", "copy"}, /* em_contiguous of a transpose: a COPY task */
        {"squeeze_all", "alias"}, /* no size-1 dim to drop: an alias view */
    };
    const fixtures *f = ctx;
    /* the fused attention's PyTorch references are test_transformer's: the
     * sdpa_* blocks of transformer_fixtures.txt (output and the gradients
     * gq, gk, gv of torch's F.scaled_dot_product_attention, which
     * em_scaled_dot_product_attention runs through the SDPA op) */
    if (!strcmp(name, "sdpa")) {
        for (int i = 0; i < f->ntf; i++)
            if (!strncmp(f->tf[i].config, "sdpa_", 5) && fx_find(&f->tf[i], "gq") && fx_find(&f->tf[i], "gk") &&
                fx_find(&f->tf[i], "gv"))
                return true;
        return false;
    }
    for (int i = 0; i < f->n; i++) {
        char op[64];
        fx_op(&f->bs[i], op, sizeof op);
        if (!strcmp(op, name)) return true;
        for (size_t c = 0; c < sizeof composite / sizeof composite[0]; c++)
            if (!strcmp(op, composite[c][0]) && !strcmp(name, composite[c][1])) return true;
    }
    return false;
}

/* Every differentiable kind of the op table (tasks/ops.def) has a PyTorch
 * reference (gen_grad_fixtures.py). */
static void test_covers_op_table(void **state)
{
    (void)state;
    fixtures f;
    f.n = fx_load("grad_fixtures.txt", &f.bs);
    f.ntf = fx_load("transformer_fixtures.txt", &f.tf);
    int missing = em_test_uncovered_diff_kinds(has_fixture, &f, "grad_pytorch");
    fx_free(f.bs, f.n);
    fx_free(f.tf, f.ntf);
    if (missing) fail_msg("%d differentiable op kind(s) of tasks/ops.def have no PyTorch fixture", missing);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_covers_op_table),
        cmocka_unit_test(test_covers_gradcheck_table),
        cmocka_unit_test(test_grads_match_pytorch),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
