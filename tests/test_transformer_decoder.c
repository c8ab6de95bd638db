/* TransformerDecoderLayer / TransformerDecoder, MultiheadAttention's
 * need_weights and unbatched forms, and the rotary positional embedding,
 * against PyTorch 1.13 (tests/fixtures/decoder_fixtures.txt, written by
 * gen_decoder_fixtures.py):
 *  - 5 decoder-layer cases (post-norm relu, pre-norm gelu, batch_first both
 *    ways, unbatched; causal float tgt_mask, bool / float memory_mask, bool
 *    tgt / memory key padding, float memory key padding) and a 2-layer
 *    pre-norm TransformerDecoder with final norm, eval mode: output, the
 *    gradients of tgt, memory and every parameter; tgt_is_causal without a
 *    mask equals the causal mask; training-mode dropout changes the output;
 *  - MultiheadAttention with need_weights (averaged and per head, batched
 *    and unbatched, masks): output, weights, and the gradients of a loss that
 *    uses both; need_weights=false equals em_multihead_attention_forward;
 *  - RoPE (offset, large offset, [B, T] and [T] positions, partial rotary,
 *    base 500000): values and gradient against the float64 formula; q . k
 *    after rotating q by m and k by n depends on m - n only; norms kept;
 *  - training steps through all three leak no tensor or handle.
 * References are float64 math on float32 inputs; Ember runs in float32.
 * Tolerance: |got - want| <= 1e-5 * |want| + 1e-5 * max|want| per tensor. */
#include "fixture.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fx_block *BS;
static int NBS;

static void load_fixtures(void)
{
    if (!BS) NBS = fx_load("decoder_fixtures.txt", &BS);
    assert_int_equal(NBS, 15);
}

#define RTOL 1e-5
#define STOL 1e-5 /* times max |want| */
#define check_close(t, want, what) fx_check_close((t), (want), RTOL, STOL, (what))

/* The fixture tensor @p name of block b, or of its companion block "grads_<b>"
 * (gen_decoder_fixtures.py moves the parameter gradients there when a block
 * would hold more than FX_MAX_T tensors). */
static const fx_tensor *fx_get2(const fx_block *b, const char *name)
{
    const fx_tensor *t = fx_find(b, name);
    if (t) return t;
    char g[160];
    snprintf(g, sizeof g, "grads_%s", b->config);
    for (int i = 0; i < NBS; i++)
        if (!strcmp(BS[i].config, g)) return fx_get(&BS[i], name);
    return fx_get(b, name); /* fails naming it */
}

static double check(const em_tensor *t, const fx_block *b, const char *name)
{
    char what[192];
    snprintf(what, sizeof what, "%s: %s", b->config, name);
    return check_close(t, fx_get2(b, name), what);
}

/* A mask fixture (stored as 0/1 or floats) as bool or f32, per the head's "name kind". */
static em_tensor *mask_kw(const fx_block *b, const char *name)
{
    char kind[16];
    assert_non_null(fx_kw_str(b, name, kind, sizeof kind));
    return fx_mask(b, name, kind);
}

static double max_abs_diff(const em_tensor *a, const em_tensor *b)
{
    double *x = em_test_values(a), *y = em_test_values(b), d = 0;
    for (int64_t i = 0; i < em_tensor_numel(a); i++) d = fmax(d, fabs(x[i] - y[i]));
    free(x);
    free(y);
    return d;
}

static void set_param(em_module *m, const char *key, const fx_block *b, const char *name)
{
    em_tensor *p = em_module_get_param(m, key);
    if (!p) fail_msg("no parameter %s: %s", key, em_last_error());
    em_scope_begin();
    if (em_copy_(p, fx_new(fx_get(b, name), EM_F32)) != EM_OK) fail_msg("copy %s: %s", key, em_last_error());
    em_scope_end();
}

typedef struct keylist {
    int n;
    char k[64][96];
    em_tensor *t[64];
} keylist;

static void collect(const char *key, em_tensor *t, void *ud)
{
    keylist *l = ud;
    assert_true(l->n < 64);
    snprintf(l->k[l->n], sizeof l->k[0], "%s", key);
    l->t[l->n++] = t;
}

static double worst_fwd, worst_grad;
static void note(double *w, double e) { *w = fmax(*w, e); }

/* ---- TransformerDecoderLayer / TransformerDecoder ------------------------------------------ */

/* The fixture name of a key: "layers." -> "L", "self_attn." -> "sa.", "multihead_attn." -> "ca.". */
static const char *abbr(const char *key, const char *prefix, char *out, size_t n)
{
    char tmp[96];
    size_t o = 0;
    for (const char *p = key; *p && o < sizeof tmp - 8;) {
        if (!strncmp(p, "layers.", 7)) {
            tmp[o++] = 'L';
            p += 7;
        } else if (!strncmp(p, "self_attn.", 10)) {
            memcpy(tmp + o, "sa.", 3);
            o += 3;
            p += 10;
        } else if (!strncmp(p, "multihead_attn.", 15)) {
            memcpy(tmp + o, "ca.", 3);
            o += 3;
            p += 15;
        } else {
            tmp[o++] = *p++;
        }
    }
    tmp[o] = 0;
    snprintf(out, n, "%.2s%.90s", prefix, tmp);
    return out;
}

static em_transformer_decoder_layer_config dec_cfg(const fx_block *b)
{
    em_transformer_decoder_layer_config c = em_transformer_decoder_layer_config_default((int64_t)fx_kw(b, "d", 0), (int64_t)fx_kw(b, "H", 0));
    c.dim_feedforward = (int64_t)fx_kw(b, "F", 0);
    c.dropout = 0.1; /* as the fixtures: off in eval mode */
    c.activation = fx_kw(b, "gelu", 0) != 0 ? "gelu" : "relu";
    c.batch_first = fx_kw(b, "batch_first", 0) != 0;
    c.norm_first = fx_kw(b, "norm_first", 0) != 0;
    return c;
}

static em_tensor *dec_fwd(em_module *m, bool layer, const em_tensor *t, const em_tensor *mem, const em_tensor *tm, const em_tensor *mm,
                          const em_tensor *tk, const em_tensor *mk, bool causal)
{
    return layer ? em_transformer_decoder_layer_forward(m, t, mem, tm, mm, tk, mk, causal)
                 : em_transformer_decoder_forward(m, t, mem, tm, mm, tk, mk, causal);
}

static void test_decoder_vs_pytorch(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    double ef = 0, eg = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "dec", 3)) continue;
        n++;
        const int layers = (int)fx_kw(b, "layers", 0);
        const bool layer = layers == 1;
        em_transformer_decoder_layer_config c = dec_cfg(b);
        em_module *m = layer ? em_transformer_decoder_layer_new(&c) : em_transformer_decoder_new(&c, layers, true);
        if (!m) fail_msg("%s: %s", b->config, em_last_error());
        assert_string_equal(em_module_type_name(m), layer ? "TransformerDecoderLayer" : "TransformerDecoder");
        keylist l = {0};
        assert_int_equal(em_module_visit_params(m, collect, &l), EM_OK);
        assert_int_equal(l.n, (int)fx_kw(b, "params", 0));
        /* torch's named_parameters order */
        const char *pre = layer ? "" : "layers.0.";
        static const struct {
            int i;
            const char *k;
        } order[] = {{0, "self_attn.in_proj_weight"},  {3, "self_attn.out_proj.bias"}, {4, "multihead_attn.in_proj_weight"},
                     {7, "multihead_attn.out_proj.bias"}, {8, "linear1.weight"},        {11, "linear2.bias"},
                     {12, "norm1.weight"},                {17, "norm3.bias"}};
        for (size_t j = 0; j < sizeof order / sizeof order[0]; j++) {
            char want[96];
            snprintf(want, sizeof want, "%s%s", pre, order[j].k);
            assert_string_equal(l.k[order[j].i], want);
        }
        if (!layer) {
            assert_string_equal(l.k[18], "layers.1.self_attn.in_proj_weight");
            assert_string_equal(l.k[l.n - 1], "norm.bias");
            /* torch's _get_clones: the layers start equal */
            double *a0 = em_test_values(l.t[8]), *a1 = em_test_values(l.t[26]);
            for (int64_t j = 0; j < em_tensor_numel(l.t[8]); j++) assert_true(a0[j] == a1[j]);
            free(a0);
            free(a1);
        }
        char nm[96];
        for (int j = 0; j < l.n; j++) set_param(m, l.k[j], b, abbr(l.k[j], "", nm, sizeof nm));
        em_module_train(m, false);
        em_scope_begin();
        em_tensor *tgt = fx_leaf(b, "tgt", true), *mem = fx_leaf(b, "mem", true);
        em_tensor *tm = mask_kw(b, "tm"), *mm = mask_kw(b, "mm"), *tk = mask_kw(b, "tk"), *mk = mask_kw(b, "mk");
        em_tensor *out = dec_fwd(m, layer, tgt, mem, tm, mm, tk, mk, false);
        note(&ef, check(out, b, "out"));
        /* every fixture's tgt_mask is the causal one: tgt_is_causal without it is the same */
        assert_non_null(tm);
        note(&ef, check(dec_fwd(m, layer, tgt, mem, NULL, mm, tk, mk, true), b, "out"));
        /* and the hint with the mask uses the mask */
        note(&ef, check(dec_fwd(m, layer, tgt, mem, tm, mm, tk, mk, true), b, "out"));
        em_grads *g = em_backward(em_sum_all(em_mul(out, fx_new(fx_get(b, "W"), EM_F32))));
        if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
        note(&eg, check(em_grad(g, tgt), b, "gtgt"));
        note(&eg, check(em_grad(g, mem), b, "gmem"));
        for (int j = 0; j < l.n; j++) note(&eg, check(em_grad(g, l.t[j]), b, abbr(l.k[j], "g", nm, sizeof nm)));
        em_grads_free(g);
        /* training: dropout 0.1 changes the output, and two training forwards differ */
        em_module_train(m, true);
        em_manual_seed(5);
        em_tensor *t1 = dec_fwd(m, layer, tgt, mem, tm, mm, tk, mk, false), *t2 = dec_fwd(m, layer, tgt, mem, tm, mm, tk, mk, false);
        assert_non_null(t1);
        assert_non_null(t2);
        const double d12 = max_abs_diff(t1, t2), d1e = max_abs_diff(t1, out);
        if (!(d12 > 0 && d1e > 0)) fail_msg("%s: training-mode dropout had no effect (%g, %g)", b->config, d12, d1e);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(n, 6);
    printf("TransformerDecoderLayer x5 / TransformerDecoder: max error / max|want| forward %.3g, gradients %.3g\n", ef, eg);
    note(&worst_fwd, ef);
    note(&worst_grad, eg);
}

static void test_decoder_errors(void **state)
{
    (void)state;
    em_transformer_decoder_layer_config c = em_transformer_decoder_layer_config_default(30, 4);
    assert_null(em_transformer_decoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "d_model (30) must be a positive multiple of nhead (4)"));
    assert_null(em_transformer_decoder_new(&c, 2, true));
    assert_non_null(strstr(em_last_error(), "d_model (30)"));
    assert_null(em_transformer_decoder_layer_new(NULL));
    assert_non_null(strstr(em_last_error(), "config is NULL"));
    c = em_transformer_decoder_layer_config_default(8, 2);
    c.activation = "tanh";
    assert_null(em_transformer_decoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "activation should be relu/gelu, not tanh"));
    c.activation = NULL; /* relu */
    c.dropout = 1.5;
    assert_null(em_transformer_decoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "dropout (1.5)"));
    c.dropout = 0.1;
    c.dim_feedforward = 0;
    assert_null(em_transformer_decoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "dim_feedforward"));
    c.dim_feedforward = 16;
    assert_null(em_transformer_decoder_new(&c, 0, false));
    assert_non_null(strstr(em_last_error(), "num_layers"));
    c.batch_first = true;
    em_module *m = em_transformer_decoder_layer_new(&c), *d = em_transformer_decoder_new(&c, 2, false);
    assert_non_null(m);
    assert_non_null(d);
    assert_null(em_module_get_param(d, "norm.weight")); /* no final norm */
    assert_non_null(em_module_get_param(d, "layers.1.multihead_attn.in_proj_weight"));
    em_scope_begin();
    int64_t t3[3] = {2, 5, 8}, m3[3] = {2, 6, 8}, bad[3] = {2, 5, 6}, mb[3] = {3, 6, 8}, x2[2] = {5, 8}, kp[2] = {2, 4}, am[2] = {5, 4};
    em_tensor *tgt = em_zeros(t3, 3, EM_F32), *mem = em_zeros(m3, 3, EM_F32);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, em_zeros(bad, 3, EM_F32), mem, NULL, NULL, NULL, NULL, false),
                         "[2, 5, 6]", "d_model = 8", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, em_zeros(mb, 3, EM_F32), NULL, NULL, NULL, NULL, false),
                         "memory of shape [3, 6, 8]", "[B, S, d_model]", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, em_zeros(x2, 2, EM_F32), NULL, NULL, NULL, NULL, false),
                         "memory of shape [5, 8]", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, NULL, NULL, NULL, NULL, NULL, false), "memory is NULL", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, mem, NULL, NULL, em_zeros(kp, 2, EM_BOOL), NULL, false),
                         "key_padding_mask", "[2, 4]", "[2, 5]", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, mem, NULL, NULL, NULL, em_zeros(kp, 2, EM_BOOL), false),
                         "key_padding_mask", "[2, 4]", "[2, 6]", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, mem, NULL, em_zeros(am, 2, EM_F32), NULL, NULL, false),
                         "attn_mask", "[5, 4]", "[5, 6]", NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(m, tgt, mem, em_zeros(am, 2, EM_I64), NULL, NULL, NULL, false),
                         "masks must be bool or float", NULL);
    em_test_assert_error(em_transformer_decoder_forward(d, em_zeros(bad, 3, EM_F32), mem, NULL, NULL, NULL, NULL, true), "[2, 5, 6]",
                         NULL);
    em_test_assert_error(em_transformer_decoder_layer_forward(d, tgt, mem, NULL, NULL, NULL, NULL, false),
                         "not a TransformerDecoderLayer", NULL);
    em_test_assert_error(em_transformer_decoder_forward(m, tgt, mem, NULL, NULL, NULL, NULL, false), "not a TransformerDecoder", NULL);
    /* the module call is self-decoding (memory = tgt) without masks */
    em_tensor *y = em_module_forward(d, tgt);
    assert_non_null(y);
    em_test_assert_shape(y, 3, t3);
    em_scope_end();
    em_module_free(d);
    em_module_free(m);
}

/* ---- MultiheadAttention: need_weights, unbatched -------------------------------------------- */

static void test_mha_weights(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    double ef = 0, eg = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "mhaw_", 5)) continue;
        n++;
        const bool bf = fx_kw(b, "batch_first", 0) != 0, avg = fx_kw(b, "average", 0) != 0, unbatched = fx_kw(b, "B", 0) == 0;
        em_module *m = em_multihead_attention_new((int64_t)fx_kw(b, "E", 0), (int64_t)fx_kw(b, "H", 0), 0.1, true, bf);
        assert_non_null(m);
        const char *keys[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
        const char *names[4] = {"ipw", "ipb", "opw", "opb"};
        em_tensor *ps[4];
        assert_int_equal(em_module_parameters(m, ps, 4), 4);
        for (int j = 0; j < 4; j++) set_param(m, keys[j], b, names[j]);
        em_module_train(m, false);
        em_scope_begin();
        em_tensor *x = fx_leaf(b, "x", true), *key = fx_leaf(b, "key", true), *val = fx_leaf(b, "value", true);
        em_mha_forward_opts o = em_mha_forward_opts_default();
        assert_true(o.need_weights && o.average_attn_weights && !o.key_padding_mask && !o.attn_mask); /* torch's defaults */
        o.key_padding_mask = mask_kw(b, "kpm");
        o.attn_mask = mask_kw(b, "am");
        o.average_attn_weights = avg;
        em_tensor *w = NULL;
        em_tensor *out = em_multihead_attention_forward_ex(m, x, key, val, &o, &w);
        note(&ef, check(out, b, "out"));
        note(&ef, check(w, b, "weights"));
        /* without need_weights: the same output, no weights; batched, exactly em_multihead_attention_forward */
        em_mha_forward_opts o2 = o;
        o2.need_weights = false;
        em_tensor *w2 = (em_tensor *)1;
        em_tensor *out2 = em_multihead_attention_forward_ex(m, x, key, val, &o2, &w2);
        assert_null(w2);
        note(&ef, check(out2, b, "out"));
        if (!unbatched) {
            em_tensor *out3 = em_multihead_attention_forward(m, x, key, val, o.key_padding_mask, o.attn_mask);
            assert_true(max_abs_diff(out2, out3) == 0);
        }
        em_tensor *loss = em_add(em_sum_all(em_mul(out, fx_new(fx_get(b, "W"), EM_F32))),
                                 em_sum_all(em_mul(w, fx_new(fx_get(b, "W2"), EM_F32))));
        em_grads *g = em_backward(loss);
        if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
        note(&eg, check(em_grad(g, x), b, "gq"));
        note(&eg, check(em_grad(g, key), b, "gk"));
        note(&eg, check(em_grad(g, val), b, "gv"));
        const char *gn[4] = {"gipw", "gipb", "gopw", "gopb"};
        for (int j = 0; j < 4; j++) note(&eg, check(em_grad(g, ps[j]), b, gn[j]));
        em_grads_free(g);
        /* training mode: the weights returned are the dropped-out ones (torch returns them so):
         * some zeros, the rest scaled by 1 / (1 - p); per-head rows then no longer sum to 1 */
        em_module_train(m, true);
        em_manual_seed(9);
        o.average_attn_weights = false;
        o.key_padding_mask = o.attn_mask = NULL;
        em_tensor *wt = NULL;
        assert_non_null(em_multihead_attention_forward_ex(m, x, key, val, &o, &wt));
        assert_non_null(wt);
        double *v = em_test_values(wt);
        int64_t zeros = 0;
        for (int64_t j = 0; j < em_tensor_numel(wt); j++) zeros += v[j] == 0;
        free(v);
        if (!(zeros > 0 && zeros < em_tensor_numel(wt))) fail_msg("%s: training weights have %lld zeros", b->config, (long long)zeros);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(n, 4);
    printf("MultiheadAttention need_weights x4 (2 unbatched): max error / max|want| forward %.3g, gradients %.3g\n", ef, eg);
    note(&worst_fwd, ef);
    note(&worst_grad, eg);
}

static void test_mha_ex_errors(void **state)
{
    (void)state;
    em_module *m = em_multihead_attention_new(8, 2, 0, true, true);
    assert_non_null(m);
    em_scope_begin();
    int64_t x3[3] = {2, 5, 8}, x2[2] = {5, 8}, k2[2] = {6, 8}, bad2[2] = {6, 4}, kp1 = 5, am2[2] = {5, 5}, am3[3] = {3, 5, 6};
    em_tensor *x = em_zeros(x3, 3, EM_F32), *u = em_zeros(x2, 2, EM_F32), *ku = em_zeros(k2, 2, EM_F32), *w = NULL;
    em_mha_forward_opts o = em_mha_forward_opts_default();
    /* need_weights (the default) without a place for them */
    em_test_assert_error(em_multihead_attention_forward_ex(m, x, NULL, NULL, NULL, NULL), "need_weights", "attn_weights", NULL);
    em_test_assert_error(em_multihead_attention_forward_ex(m, x, ku, ku, &o, &w), "all be batched", "[2, 5, 8]", "[6, 8]", NULL);
    assert_null(w);
    em_test_assert_error(em_multihead_attention_forward_ex(m, u, em_zeros(bad2, 2, EM_F32), NULL, &o, &w), "unbatched", "[6, 4]",
                         "[S, 8]", NULL);
    o.key_padding_mask = em_zeros(&kp1, 1, EM_BOOL);
    em_test_assert_error(em_multihead_attention_forward_ex(m, u, ku, ku, &o, &w), "key_padding_mask of shape [5]", "expected [6]",
                         NULL);
    o.key_padding_mask = NULL;
    o.attn_mask = em_zeros(am3, 3, EM_BOOL);
    em_test_assert_error(em_multihead_attention_forward_ex(m, u, ku, ku, &o, &w), "attn_mask of shape [3, 5, 6]", "[2, 5, 6]", NULL);
    o.attn_mask = em_zeros(am2, 2, EM_F32);
    em_test_assert_error(em_multihead_attention_forward_ex(m, u, ku, ku, &o, &w), "attn_mask of shape [5, 5]", "[5, 6]", NULL);
    o.attn_mask = em_zeros(am2, 2, EM_I64);
    em_test_assert_error(em_multihead_attention_forward_ex(m, x, NULL, NULL, &o, &w), "masks must be bool or float", NULL);
    o.attn_mask = NULL;
    int64_t kb[2] = {2, 4};
    o.key_padding_mask = em_zeros(kb, 2, EM_BOOL);
    em_test_assert_error(em_multihead_attention_forward_ex(m, x, NULL, NULL, &o, &w), "key_padding_mask of shape [2, 4]", "[2, 5]",
                         NULL);
    o.need_weights = false; /* the batched path of em_multihead_attention_forward, its message */
    em_test_assert_error(em_multihead_attention_forward_ex(m, x, NULL, NULL, &o, &w), "key_padding_mask", "[2, 4]", NULL);
    em_module *lin = em_linear_new(8, 8, true);
    em_test_assert_error(em_multihead_attention_forward_ex(lin, x, NULL, NULL, &o, NULL), "not a MultiheadAttention", NULL);
    em_module_free(lin);
    /* no bias: the weights path takes MultiheadAttention(bias=False) too */
    em_module *nb = em_multihead_attention_new(8, 2, 0, false, true);
    o = em_mha_forward_opts_default();
    em_tensor *y = em_multihead_attention_forward_ex(nb, x, NULL, NULL, &o, &w);
    assert_non_null(y);
    assert_non_null(w);
    int64_t ws[3] = {2, 5, 5};
    em_test_assert_shape(w, 3, ws);
    assert_true(max_abs_diff(y, em_multihead_attention_forward(nb, x, NULL, NULL, NULL, NULL)) < 1e-6);
    em_module_free(nb);
    em_scope_end();
    em_module_free(m);
}

/* ---- rotary positional embedding ------------------------------------------------------------ */

static void test_rope_vs_reference(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    double ef = 0, eg = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "rope_", 5)) continue;
        n++;
        em_scope_begin();
        em_tensor *x = fx_leaf(b, "x", true);
        em_tensor *pos = fx_kw(b, "positions", 0) != 0 ? fx_new(fx_get(b, "positions"), EM_I64) : NULL;
        const int64_t off = (int64_t)fx_kw(b, "offset", 0), rd = (int64_t)fx_kw(b, "rotary_dim", 0);
        const double base = fx_kw(b, "base", 0);
        em_tensor *y = em_rotary_embedding(x, pos, off, base, rd == em_tensor_dim(x, -1) ? 0 : rd);
        note(&ef, check(y, b, "out"));
        assert_int_equal(em_tensor_dtype(y), EM_F32);
        if (rd == em_tensor_dim(x, -1)) note(&ef, check(em_rotary_embedding(x, pos, off, base, rd), b, "out")); /* 0 = D */
        if (pos) note(&ef, check(em_rotary_embedding(x, em_cast(pos, EM_I32), off, base, rd), b, "out"));      /* int32 ids */
        em_grads *g = em_backward(em_sum_all(em_mul(y, fx_new(fx_get(b, "W"), EM_F32))));
        if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
        note(&eg, check(em_grad(g, x), b, "gx"));
        em_grads_free(g);
        /* float64 input: the table in double, result float64 and within 1e-12 of the reference */
        em_tensor *y64 = em_rotary_embedding(em_cast(x, EM_F64), pos, off, base, rd);
        assert_int_equal(em_tensor_dtype(y64), EM_F64);
        double *v = em_test_values(y64);
        const fx_tensor *want = fx_get(b, "out");
        for (int64_t j = 0; j < want->n; j++)
            if (fabs(v[j] - want->v[j]) > 1e-9) fail_msg("%s: float64 [%lld] %.15g vs %.15g", b->config, (long long)j, v[j], want->v[j]);
        free(v);
        em_scope_end();
    }
    assert_int_equal(n, 4);
    printf("rotary embedding x4: max error / max|want| forward %.3g, gradient %.3g\n", ef, eg);
    note(&worst_fwd, ef);
    note(&worst_grad, eg);
}

/* RoFormer section 3.4.2: <R(m) q, R(n) k> depends on m - n only; rotations keep norms. */
static void test_rope_relative(void **state)
{
    (void)state;
    enum { D = 32, NP = 8 };
    /* position pairs (m, n): three with m - n = 3, two with 0, one with -5, and two far apart */
    static const int64_t mp[NP] = {3, 10, 1003, 0, 700, 2, 57, 2000}, np_[NP] = {0, 7, 1000, 0, 700, 7, 0, 0};
    float qv[D], kv[D];
    uint64_t s = 12345;
    for (int i = 0; i < D; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        qv[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        kv[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    em_scope_begin();
    int64_t one[2] = {1, D}, rep[2] = {NP, D};
    em_tensor *q = em_contiguous(em_expand(em_from_host(qv, one, 2, EM_F32), rep, 2));
    em_tensor *k = em_contiguous(em_expand(em_from_host(kv, one, 2, EM_F32), rep, 2));
    int64_t npn = NP;
    em_tensor *rq = em_rotary_embedding(q, em_from_host(mp, &npn, 1, EM_I64), 0, 10000.0, 0);
    em_tensor *rk = em_rotary_embedding(k, em_from_host(np_, &npn, 1, EM_I64), 0, 10000.0, 0);
    assert_non_null(rq);
    assert_non_null(rk);
    const int last = 1;
    double dots[NP], nq[NP], q0 = 0;
    double *dv = em_test_values(em_sum(em_mul(rq, rk), &last, 1, false)), *nv = em_test_values(em_sum(em_mul(rq, rq), &last, 1, false));
    for (int i = 0; i < NP; i++) {
        dots[i] = dv[i];
        nq[i] = nv[i];
    }
    free(dv);
    free(nv);
    for (int i = 0; i < D; i++) q0 += (double)qv[i] * qv[i];
    for (int i = 0; i < NP; i++) assert_true(fabs(nq[i] - q0) < 1e-5 * q0); /* |R q| = |q| */
    const double scale = sqrt(q0) * 0.6;                                   /* ~ |q| |k| */
    printf("RoPE q.k: m-n=3: %.7f %.7f %.7f; m-n=0: %.7f %.7f; -5: %.7f; 57: %.7f; 2000: %.7f\n", dots[0], dots[1], dots[2], dots[3],
           dots[4], dots[5], dots[6], dots[7]);
    assert_true(fabs(dots[0] - dots[1]) < 1e-5 * scale && fabs(dots[0] - dots[2]) < 1e-5 * scale);
    assert_true(fabs(dots[3] - dots[4]) < 1e-5 * scale);
    /* ...and does change with m - n (the test could fail) */
    assert_true(fabs(dots[0] - dots[3]) > 1e-3 * scale && fabs(dots[0] - dots[5]) > 1e-3 * scale && fabs(dots[3] - dots[6]) > 1e-3 * scale);
    /* m - n = 0: the plain dot product */
    double d0 = 0;
    for (int i = 0; i < D; i++) d0 += (double)qv[i] * kv[i];
    assert_true(fabs(dots[3] - d0) < 1e-6 * scale);
    /* the same through offsets: q at offset 1000 + t against k at 997 + t */
    em_tensor *oq = em_rotary_embedding(q, NULL, 1000, 10000.0, 0), *ok = em_rotary_embedding(k, NULL, 997, 10000.0, 0);
    double *ov = em_test_values(em_sum(em_mul(oq, ok), &last, 1, false));
    for (int i = 0; i < NP; i++) assert_true(fabs(ov[i] - dots[0]) < 1e-5 * scale);
    free(ov);
    em_scope_end();
}

static void test_rope_errors(void **state)
{
    (void)state;
    em_scope_begin();
    int64_t s4[4] = {2, 3, 7, 16}, s1 = 16, odd[4] = {2, 3, 7, 15}, p1 = 6, p2[2] = {3, 7}, p2ok[2] = {2, 7};
    em_tensor *x = em_zeros(s4, 4, EM_F32);
    em_test_assert_error(em_rotary_embedding(NULL, NULL, 0, 10000, 0), "x is NULL", NULL);
    em_test_assert_error(em_rotary_embedding(em_zeros(&s1, 1, EM_F32), NULL, 0, 10000, 0), "[16]", "rank >= 2", NULL);
    em_test_assert_error(em_rotary_embedding(em_zeros(odd, 4, EM_F32), NULL, 0, 10000, 0), "rotary_dim 0", "D = 15", NULL);
    em_test_assert_error(em_rotary_embedding(x, NULL, 0, 10000, 18), "rotary_dim 18", "D = 16", NULL);
    em_test_assert_error(em_rotary_embedding(x, NULL, 0, 10000, 5), "rotary_dim 5", NULL);
    em_test_assert_error(em_rotary_embedding(x, NULL, 0, 10000, -2), "rotary_dim -2", NULL);
    em_test_assert_error(em_rotary_embedding(x, NULL, 0, 0, 0), "base", NULL);
    em_test_assert_error(em_rotary_embedding(x, NULL, 0, INFINITY, 0), "base", NULL);
    em_test_assert_error(em_rotary_embedding(em_zeros(s4, 4, EM_I64), NULL, 0, 10000, 0), "x must be float", NULL);
    em_test_assert_error(em_rotary_embedding(x, em_zeros(&p1, 1, EM_I64), 0, 10000, 0), "positions of shape [6]", "[T] = [7]", NULL);
    em_test_assert_error(em_rotary_embedding(x, em_zeros(p2, 2, EM_I64), 0, 10000, 0), "positions of shape [3, 7]", NULL);
    em_test_assert_error(em_rotary_embedding(x, em_zeros(p2ok, 2, EM_F32), 0, 10000, 0), "int64 or int32", NULL);
    /* positions [B, T] need a batch dim */
    int64_t s2[2] = {7, 16};
    em_test_assert_error(em_rotary_embedding(em_zeros(s2, 2, EM_F32), em_zeros(p2ok, 2, EM_I64), 0, 10000, 0), "[B, T]", NULL);
    /* position 0 is the identity */
    em_tensor *r = em_rand_normal(s4, 4, EM_F32, 0, 1);
    int64_t zs = 7;
    assert_true(max_abs_diff(em_rotary_embedding(r, em_zeros(&zs, 1, EM_I64), 0, 10000, 0), r) == 0);
    em_scope_end();
}

/* Training steps through the decoder, the weights path and RoPE leak no tensor
 * or handle, inside a scope and outside any (the caller then owns the output
 * and the weights). */
static void test_no_leaks(void **state)
{
    (void)state;
    em_manual_seed(21);
    em_transformer_decoder_layer_config c = em_transformer_decoder_layer_config_default(8, 2);
    c.dim_feedforward = 16;
    c.batch_first = true;
    c.norm_first = true;
    em_module *d = em_transformer_decoder_new(&c, 2, true), *a = em_multihead_attention_new(8, 2, 0.1, true, true);
    assert_non_null(d);
    assert_non_null(a);
    int64_t ts[3] = {2, 5, 8}, ms[3] = {2, 6, 8}, ps = 5;
    em_tensor *tgt = em_rand_normal(ts, 3, EM_F32, 0, 1), *mem = em_rand_normal(ms, 3, EM_F32, 0, 1);
    int64_t pv[5] = {4, 3, 2, 1, 0};
    em_tensor *pos = em_from_host(pv, &ps, 1, EM_I64);
    em_stats s0 = {0};
    for (int it = 0; it < 6; it++) {
        em_scope_begin();
        em_tensor *y = em_transformer_decoder_forward(d, em_rotary_embedding(tgt, pos, it, 10000, 0), mem, NULL, NULL, NULL, NULL, true);
        em_mha_forward_opts o = em_mha_forward_opts_default();
        em_tensor *w = NULL, *z = em_multihead_attention_forward_ex(a, y, mem, mem, &o, &w);
        assert_non_null(z);
        em_grads *g = em_backward(em_add(em_sum_all(z), em_sum_all(em_mul(w, w))));
        assert_non_null(g);
        assert_int_equal(em_grads_count(g), 38 + 4);
        em_grads_free(g);
        em_scope_end();
        em_tensor *w2 = NULL, *z2 = em_multihead_attention_forward_ex(a, tgt, NULL, NULL, NULL, &w2); /* outside any scope */
        assert_non_null(z2);
        assert_non_null(w2);
        em_tensor_release(z2);
        em_tensor_release(w2);
        if (it == 1) {
            em_sync();
            s0 = em_get_stats();
        }
    }
    em_test_assert_no_leak(&s0);
    em_tensor_release(tgt);
    em_tensor_release(mem);
    em_tensor_release(pos);
    em_module_free(d);
    em_module_free(a);
}

static void test_report(void **state)
{
    (void)state;
    printf("max error / max|want| over all fixtures: forward %.3g, gradients %.3g\n", worst_fwd, worst_grad);
}

static int teardown(void **state)
{
    fx_free(BS, NBS);
    BS = NULL;
    NBS = 0;
    return em_test_teardown(state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoder_vs_pytorch), cmocka_unit_test(test_decoder_errors), cmocka_unit_test(test_mha_weights),
        cmocka_unit_test(test_mha_ex_errors),      cmocka_unit_test(test_rope_vs_reference), cmocka_unit_test(test_rope_relative),
        cmocka_unit_test(test_rope_errors),        cmocka_unit_test(test_no_leaks),          cmocka_unit_test(test_report),
    };
    return cmocka_run_group_tests(tests, em_test_setup, teardown);
}
