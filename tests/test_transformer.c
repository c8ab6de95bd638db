/* Attention modules against PyTorch (tests/fixtures/transformer_fixtures.txt,
 * gpt2_tiny*.safetensors, written by gen_transformer_fixtures.py):
 * em_scaled_dot_product_attention (causal with Tq = Tk, Tq < Tk, Tq > Tk,
 * bool and additive masks, broadcast masks, head dims 16 / 32 / 64, odd
 * lengths, explicit scale) forward and input gradients; MultiheadAttention
 * (self and cross, batch_first both ways, bool / float key_padding_mask and
 * attn_mask) forward, input and parameter gradients; a 2-layer GPT-2 (vocab
 * 64, block 16, width 32, 4 heads) loaded by key from a SafeTensors file in
 * Hugging Face's layout: logits, loss and every parameter's gradient; the
 * same weights in the hub's layout through em_gpt2_load_hf_safetensors.
 * References are float64 math on float32 inputs; Ember runs in float32.
 * Tolerance: |got - want| <= 1e-5 * |want| + 1e-5 * max|want| per tensor
 * (printed: the measured max errors). Dropout: eval mode is deterministic
 * and equals the dropout-free forward; training-mode attention dropout keeps
 * the mean of the weights (loose statistics). Errors name the shapes. A tiny
 * GPT-2 with dropout 0.1 memorises one batch in 40 AdamW steps (loss must
 * halve from ~ln 64) and its training steps leak no tensor or handle.
 * TransformerEncoderLayer (post-norm relu, pre-norm gelu, batch_first both
 * ways, key padding and causal masks, eval) and a 2-layer TransformerEncoder
 * with final norm: forward, input and parameter gradients against torch.nn;
 * the sinusoidal positional-encoding table against numpy / torch. */
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
    if (!BS) NBS = fx_load("transformer_fixtures.txt", &BS);
    assert_true(NBS >= 19);
}

static const fx_block *find_block(const char *name)
{
    load_fixtures();
    for (int i = 0; i < NBS; i++)
        if (!strcmp(BS[i].config, name)) return &BS[i];
    fail_msg("no fixture block %s", name);
    return NULL;
}

#define RTOL 1e-5
#define STOL 1e-5 /* times max |want| */
#define check_close(t, want, what) fx_check_close((t), (want), RTOL, STOL, (what))

static double check(const em_tensor *t, const fx_block *b, const char *name)
{
    char what[192];
    snprintf(what, sizeof what, "%s: %s", b->config, name);
    return check_close(t, fx_get(b, name), what);
}

static em_grads *backward_weighted(em_tensor *out, const fx_block *b)
{
    em_grads *g = em_backward(em_sum_all(em_mul(out, fx_new(fx_get(b, "W"), EM_F32))));
    if (!g) fail_msg("%s: backward: %s", b->config, em_last_error());
    return g;
}

static double worst_fwd, worst_grad;
static void note(double *w, double e) { *w = fmax(*w, e); }

/* ---- SDPA ------------------------------------------------------------------------- */

static void test_sdpa(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "sdpa_", 5)) continue;
        n++;
        char kind[16];
        assert_non_null(fx_kw_str(b, "mask", kind, sizeof kind));
        em_scope_begin();
        em_tensor *q = fx_leaf(b, "q", true), *k = fx_leaf(b, "k", true), *v = fx_leaf(b, "v", true);
        em_tensor *out = em_scaled_dot_product_attention(q, k, v, fx_mask(b, "mask", kind), fx_kw(b, "causal", 0) != 0, 0.0,
                                                         fx_kw(b, "scale", 0), true);
        note(&worst_fwd, check(out, b, "out"));
        em_grads *g = backward_weighted(out, b);
        note(&worst_grad, check(em_grad(g, q), b, "gq"));
        note(&worst_grad, check(em_grad(g, k), b, "gk"));
        note(&worst_grad, check(em_grad(g, v), b, "gv"));
        em_grads_free(g);
        em_scope_end();
    }
    assert_int_equal(n, 8);
}

static void test_sdpa_dropout(void **state)
{
    (void)state;
    /* q = k = 0: every weight is 1/Tk; v = 1: out = mean over keys of the kept
     * weights * Tk / (1 - p), whose expectation is 1 */
    em_scope_begin();
    int64_t sq[4] = {4, 4, 64, 8}, sv[4] = {4, 4, 64, 8};
    em_tensor *q = em_zeros(sq, 4, EM_F32), *v = em_ones(sv, 4, EM_F32);
    em_manual_seed(7);
    em_tensor *o = em_scaled_dot_product_attention(q, q, v, NULL, false, 0.25, 0, true);
    double *x = em_test_values(o);
    double mean = 0, dev = 0;
    int64_t nel = 4 * 4 * 64 * 8;
    for (int64_t i = 0; i < nel; i++) {
        mean += x[i];
        dev = fmax(dev, fabs(x[i] - 1.0));
    }
    mean /= (double)nel;
    free(x);
    assert_true(fabs(mean - 1.0) < 0.03); /* 64 keys per row: the mean of 8192 rows */
    assert_true(dev > 0.05);              /* dropout did something */
    /* eval: no dropout, exactly 1 */
    em_tensor *e = em_scaled_dot_product_attention(q, q, v, NULL, false, 0.25, 0, false);
    x = em_test_values(e);
    for (int64_t i = 0; i < nel; i++) assert_true(fabs(x[i] - 1.0) < 1e-6);
    free(x);
    em_scope_end();
}

static void test_sdpa_errors(void **state)
{
    (void)state;
    em_scope_begin();
    int64_t a[4] = {1, 2, 5, 8}, b[4] = {1, 2, 6, 4}, c[4] = {1, 2, 7, 8}, m[2] = {5, 6};
    em_tensor *q = em_zeros(a, 4, EM_F32), *k4 = em_zeros(b, 4, EM_F32), *k = em_zeros(c, 4, EM_F32);
    em_test_assert_error(em_scaled_dot_product_attention(q, k4, k4, NULL, false, 0, 0, false), "head dims", "[1, 2, 5, 8]", "[1, 2, 6, 4]",
                         NULL);
    em_test_assert_error(em_scaled_dot_product_attention(q, k, q, NULL, false, 0, 0, false), "different lengths", "[1, 2, 7, 8]", NULL);
    em_test_assert_error(em_scaled_dot_product_attention(q, k, k, em_zeros(m, 2, EM_F32), false, 0, 0, false), "mask of shape [5, 6]",
                         "[1, 2, 5, 7]", NULL);
    int64_t ok[2] = {5, 7};
    em_test_assert_error(em_scaled_dot_product_attention(q, k, k, em_zeros(ok, 2, EM_BOOL), true, 0, 0, false), "is_causal", NULL);
    em_test_assert_error(em_scaled_dot_product_attention(q, k, k, em_zeros(ok, 2, EM_I64), false, 0, 0, false), "mask must be bool",
                         NULL);
    em_test_assert_error(em_scaled_dot_product_attention(em_zeros(&a[3], 1, EM_F32), k, k, NULL, false, 0, 0, false), "rank >= 2",
                         NULL);
    em_scope_end();
}

/* ---- MultiheadAttention --------------------------------------------------------------- */

static void set_param(em_module *m, const char *key, const fx_block *b, const char *name)
{
    em_tensor *p = em_module_get_param(m, key);
    if (!p) fail_msg("no parameter %s: %s", key, em_last_error());
    em_scope_begin();
    if (em_copy_(p, fx_new(fx_get(b, name), EM_F32)) != EM_OK) fail_msg("copy %s: %s", key, em_last_error());
    em_scope_end();
}

static void test_mha(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "mha_", 4)) continue;
        n++;
        const bool bf = fx_kw(b, "batch_first", 0) != 0, self = fx_kw(b, "self", 0) != 0;
        em_module *m = em_multihead_attention_new((int64_t)fx_kw(b, "E", 0), (int64_t)fx_kw(b, "H", 0), 0.0, true, bf);
        assert_non_null(m);
        assert_string_equal(em_module_type_name(m), "MultiheadAttention");
        const char *keys[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
        const char *names[4] = {"ipw", "ipb", "opw", "opb"};
        em_tensor *ps[4];
        assert_int_equal(em_module_parameters(m, ps, 4), 4);
        for (int j = 0; j < 4; j++) {
            assert_ptr_equal(ps[j], em_module_get_param(m, keys[j])); /* torch's state_dict order */
            set_param(m, keys[j], b, names[j]);
        }
        char kk[16], ak[16];
        assert_non_null(fx_kw_str(b, "kpm", kk, sizeof kk));
        assert_non_null(fx_kw_str(b, "am", ak, sizeof ak));
        em_scope_begin();
        em_tensor *x = fx_leaf(b, "x", true), *key = self ? NULL : fx_leaf(b, "key", true), *val = self ? NULL : fx_leaf(b, "value", true);
        em_tensor *kpm = fx_mask(b, "kpm", kk), *am = fx_mask(b, "am", ak);
        em_tensor *out = em_multihead_attention_forward(m, x, key, val, kpm, am);
        note(&worst_fwd, check(out, b, "out"));
        if (self && !kpm && !am) note(&worst_fwd, check(em_module_forward(m, x), b, "out")); /* the module call */
        em_grads *g = backward_weighted(out, b);
        note(&worst_grad, check(em_grad(g, x), b, "gq"));
        if (!self) {
            note(&worst_grad, check(em_grad(g, key), b, "gk"));
            note(&worst_grad, check(em_grad(g, val), b, "gv"));
        }
        const char *gn[4] = {"gipw", "gipb", "gopw", "gopb"};
        for (int j = 0; j < 4; j++) note(&worst_grad, check(em_grad(g, ps[j]), b, gn[j]));
        em_grads_free(g);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(n, 4);
}

static void test_mha_errors(void **state)
{
    (void)state;
    assert_null(em_multihead_attention_new(30, 4, 0, true, true));
    assert_non_null(strstr(em_last_error(), "num_heads"));
    em_module *m = em_multihead_attention_new(8, 2, 0, true, true);
    assert_non_null(m);
    em_scope_begin();
    int64_t x3[3] = {2, 5, 8}, bad[3] = {2, 5, 6}, kp[2] = {2, 4};
    em_tensor *x = em_zeros(x3, 3, EM_F32);
    em_test_assert_error(em_multihead_attention_forward(m, em_zeros(bad, 3, EM_F32), NULL, NULL, NULL, NULL), "[2, 5, 6]",
                         "embed_dim = 8", NULL);
    em_test_assert_error(em_multihead_attention_forward(m, x, NULL, NULL, em_zeros(kp, 2, EM_BOOL), NULL), "key_padding_mask",
                         "[2, 4]", "[2, 5]", NULL);
    em_test_assert_error(em_multihead_attention_forward(m, x, NULL, NULL, NULL, em_zeros(kp, 2, EM_BOOL)), "attn_mask", "[5, 5]",
                         "[4, 5, 5]", NULL);
    em_scope_end();
    em_module_free(m);
}

/* ---- GPT-2 ------------------------------------------------------------------------------ */

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

static const char *data_path(const char *name)
{
    static char path[4][1024];
    static int r;
    const char *dir = getenv("EMBER_TEST_DATA");
    r = (r + 1) % 4;
    snprintf(path[r], sizeof path[r], "%s/%s", dir ? dir : "tests/fixtures", name);
    return path[r];
}

static em_gpt2_config tiny(void)
{
    em_gpt2_config c = em_gpt2_config_default();
    c.vocab_size = 64;
    c.n_positions = 16;
    c.n_embd = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.dropout = 0.0;
    return c;
}

static void test_gpt2_keys_and_init(void **state)
{
    (void)state;
    em_gpt2_config c = tiny();
    em_manual_seed(3);
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    assert_string_equal(em_module_type_name(m), "GPT2LMHeadModel");
    keylist l = {0};
    assert_int_equal(em_module_visit_params(m, collect, &l), EM_OK);
    assert_int_equal(l.n, 4 + 2 * 12);
    assert_string_equal(l.k[0], "transformer.wte.weight");
    assert_string_equal(l.k[1], "transformer.wpe.weight");
    assert_string_equal(l.k[2], "transformer.h.0.ln_1.weight");
    assert_string_equal(l.k[4], "transformer.h.0.attn.c_attn.weight");
    assert_string_equal(l.k[13], "transformer.h.0.mlp.c_proj.bias");
    assert_string_equal(l.k[27], "transformer.ln_f.bias");
    const int64_t want_ca[2] = {32, 96}, want_fc[2] = {32, 128}, want_mp[2] = {128, 32};
    em_test_assert_shape(em_module_get_param(m, "transformer.h.1.attn.c_attn.weight"), 2, want_ca);
    em_test_assert_shape(em_module_get_param(m, "transformer.h.1.mlp.c_fc.weight"), 2, want_fc);
    em_test_assert_shape(em_module_get_param(m, "transformer.h.1.mlp.c_proj.weight"), 2, want_mp);
    assert_null(em_module_get_param(m, "lm_head.weight")); /* tied: one tensor, wte */
    /* init: std 0.02 for matrices, 0.02 / sqrt(2 * 2) = 0.01 for c_proj, zero biases, LN ones */
    struct {
        const char *key;
        double std;
    } st[4] = {{"transformer.wte.weight", 0.02},
               {"transformer.h.0.attn.c_attn.weight", 0.02},
               {"transformer.h.0.attn.c_proj.weight", 0.01},
               {"transformer.h.1.mlp.c_proj.weight", 0.01}};
    for (int i = 0; i < 4; i++) {
        em_tensor *p = em_module_get_param(m, st[i].key);
        double *v = em_test_values(p), s2 = 0;
        int64_t n = em_tensor_numel(p);
        for (int64_t j = 0; j < n; j++) s2 += v[j] * v[j];
        free(v);
        double sd = sqrt(s2 / (double)n);
        if (fabs(sd / st[i].std - 1.0) > 0.1) fail_msg("%s: std %g, expected %g", st[i].key, sd, st[i].std);
    }
    double *v = em_test_values(em_module_get_param(m, "transformer.h.0.attn.c_attn.bias"));
    for (int j = 0; j < 96; j++) assert_true(v[j] == 0);
    free(v);
    v = em_test_values(em_module_get_param(m, "transformer.h.0.ln_2.weight"));
    for (int j = 0; j < 32; j++) assert_true(v[j] == 1);
    free(v);
    em_module_free(m);
}

static void test_gpt2_vs_pytorch(void **state)
{
    (void)state;
    const fx_block *b = find_block("gpt2");
    em_gpt2_config c = tiny();
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    keylist l = {0};
    assert_int_equal(em_module_visit_params(m, collect, &l), EM_OK);
    assert_int_equal(l.n, (int)fx_kw(b, "keys", 0));
    const char *names[64];
    for (int i = 0; i < l.n; i++) names[i] = l.k[i];
    /* strict: the file (HF names and layouts) holds exactly these keys */
    if (em_safetensors_load_into(data_path("gpt2_tiny.safetensors"), names, l.t, (size_t)l.n, true) != EM_OK)
        fail_msg("load: %s", em_last_error());
    em_module_train(m, false);
    em_scope_begin();
    em_tensor *idx = fx_new(fx_get(b, "idx"), EM_I64);
    em_tensor *logits = em_module_forward(m, idx);
    note(&worst_fwd, check(logits, b, "logits"));
    /* eval is deterministic, and the training forward with dropout 0 is the same function */
    em_tensor *again = em_module_forward(m, idx);
    double *a1 = em_test_values(logits), *a2 = em_test_values(again);
    for (int64_t i = 0; i < em_tensor_numel(logits); i++) assert_true(a1[i] == a2[i]);
    free(a1);
    free(a2);
    em_module_train(m, true);
    int64_t flat[2] = {-1, 64}, ft = -1;
    em_tensor *lt = em_module_forward(m, idx);
    em_tensor *loss = em_cross_entropy(em_reshape(lt, flat, 2), em_reshape(fx_new(fx_get(b, "targets"), EM_I64), &ft, 1), NULL);
    note(&worst_fwd, check(loss, b, "loss"));
    em_grads *g = em_backward(loss);
    assert_non_null(g);
    em_st_file *gf = em_safetensors_open(data_path("gpt2_tiny_grads.safetensors"));
    if (!gf) fail_msg("open grads: %s", em_last_error());
    for (int i = 0; i < l.n; i++) {
        em_tensor *want = em_safetensors_tensor(gf, l.k[i]);
        if (!want) fail_msg("grads file: %s: %s", l.k[i], em_last_error());
        fx_tensor ft2 = {{0}, em_tensor_ndim(want), {0}, em_tensor_numel(want), em_test_values(want)};
        memcpy(ft2.shape, em_tensor_shape(want), sizeof(int64_t) * (size_t)ft2.ndim);
        char what[128];
        snprintf(what, sizeof what, "gpt2: grad %s", l.k[i]);
        note(&worst_grad, check_close(em_grad(g, l.t[i]), &ft2, what));
        free(ft2.v);
    }
    em_safetensors_close(gf);
    em_grads_free(g);
    em_scope_end();
    em_module_free(m);
}

/* A file in the hub's layout (no "transformer." prefix, attn.bias / masked_bias
 * buffers, tied lm_head.weight) gives the same logits; a wrong file names the key. */
static void test_gpt2_hub_layout(void **state)
{
    (void)state;
    const fx_block *b = find_block("gpt2");
    em_gpt2_config c = tiny();
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    if (em_gpt2_load_hf_safetensors(m, data_path("gpt2_tiny_hub.safetensors")) != EM_OK) fail_msg("hub load: %s", em_last_error());
    em_module_train(m, false);
    em_scope_begin();
    note(&worst_fwd, check(em_module_forward(m, fx_new(fx_get(b, "idx"), EM_I64)), b, "logits"));
    em_scope_end();
    /* the prefixed file loads too */
    assert_int_equal(em_gpt2_load_hf_safetensors(m, data_path("gpt2_tiny.safetensors")), EM_OK);
    /* another model's file: the first missing key, both spellings */
    assert_int_equal(em_gpt2_load_hf_safetensors(m, data_path("vision_cnn.safetensors")), EM_ERR_FORMAT);
    assert_non_null(strstr(em_last_error(), "missing key 'transformer.wte.weight' (or 'wte.weight')"));
    /* a model of another width: shape error naming the key, nothing written */
    em_gpt2_config c2 = tiny();
    c2.n_embd = 16;
    em_module *m2 = em_gpt2_new(&c2);
    assert_non_null(m2);
    assert_int_equal(em_gpt2_load_hf_safetensors(m2, data_path("gpt2_tiny_hub.safetensors")), EM_ERR_SHAPE);
    assert_non_null(strstr(em_last_error(), "lm_head.weight"));
    em_module *mha = em_multihead_attention_new(8, 2, 0, true, true);
    assert_int_equal(em_gpt2_load_hf_safetensors(mha, data_path("gpt2_tiny.safetensors")), EM_ERR_INVALID);
    em_module_free(mha);
    em_module_free(m2);
    em_module_free(m);
}

/* A tiny GPT-2 with dropout memorises one batch with AdamW, and its steps
 * leak no tensor or handle (MHA steps too). */
static void test_gpt2_learns_without_leaks(void **state)
{
    (void)state;
    em_manual_seed(11);
    em_gpt2_config c = tiny();
    c.dropout = 0.1;
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    em_optim_config oc = em_optim_config_default(EM_OPTIM_ADAMW);
    oc.lr = 3e-3;
    em_optim *opt = em_optim_new_for_module(&oc, m);
    assert_non_null(opt);
    int64_t ids[2 * 12], tg[2 * 12], s2[2] = {2, 12}, flat[2] = {-1, 64}, f1 = -1;
    for (int i = 0; i < 24; i++) {
        ids[i] = (i * 7 + 3) % 64;
        tg[i] = (i * 5 + 1) % 64;
    }
    em_tensor *x = em_from_host(ids, s2, 2, EM_I64), *y = em_from_host(tg, s2, 2, EM_I64);
    em_stats s0 = {0};
    double first = 0, last = 0;
    const int steps = 40;
    for (int it = 0; it < steps; it++) {
        em_scope_begin();
        em_tensor *l = em_cross_entropy(em_reshape(em_module_forward(m, x), flat, 2), em_reshape(y, &f1, 1), NULL);
        if (!l) fail_msg("step %d: %s", it, em_last_error());
        em_grads *g = em_backward(l);
        if (!g) fail_msg("step %d: %s", it, em_last_error());
        assert_int_equal(em_grads_count(g), 28);
        assert_int_equal(em_optim_step(opt, g), EM_OK);
        em_grads_free(g);
        if (it == 0) assert_int_equal(em_item(l, &first), EM_OK);
        if (it == steps - 1) assert_int_equal(em_item(l, &last), EM_OK);
        em_scope_end();
        if (it == 4) {
            em_sync();
            s0 = em_get_stats();
        }
    }
    em_test_assert_no_leak(&s0);
    /* dropout 0.1: eval forwards are identical, training forwards differ */
    em_scope_begin();
    double d_eval = 0, d_train = 0;
    for (int mode = 0; mode < 2; mode++) {
        em_module_train(m, mode == 1);
        double *a = em_test_values(em_module_forward(m, x)), *b2 = em_test_values(em_module_forward(m, x));
        for (int64_t i = 0; i < 2 * 12 * 64; i++) *(mode ? &d_train : &d_eval) += fabs(a[i] - b2[i]);
        free(a);
        free(b2);
    }
    em_scope_end();
    assert_true(d_eval == 0);
    assert_true(d_train > 0);
    printf("tiny GPT-2, one batch, %d AdamW steps: loss %.4f -> %.4f\n", steps, first, last);
    if (!(first > 3.5 && last < 0.5 * first)) fail_msg("the tiny GPT-2 did not learn: loss %g -> %g", first, last);
    em_tensor_release(x);
    em_tensor_release(y);
    em_optim_free(opt);
    em_module_free(m);
}

static void test_gpt2_errors(void **state)
{
    (void)state;
    em_gpt2_config c = tiny();
    c.n_head = 5;
    assert_null(em_gpt2_new(&c));
    assert_non_null(strstr(em_last_error(), "n_head 5"));
    c = tiny();
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    em_scope_begin();
    int64_t s[2] = {1, 17};
    em_test_assert_error(em_module_forward(m, em_zeros(s, 2, EM_I64)), "[1, 17]", "n_positions = 16", NULL);
    em_test_assert_error(em_module_forward(m, em_zeros(s, 2, EM_F32)), "int64", NULL);
    em_scope_end();
    em_module_free(m);
}

/* The checkpoint text of a config: round trip to the bit, defaults for
 * missing keys, and every malformed form rejected with out untouched. */
static void test_gpt2_config_text(void **state)
{
    (void)state;
    em_gpt2_config c = tiny(), back;
    c.dropout = 0.1 + 1e-17; /* needs 17 digits */
    char buf[256];
    assert_int_equal(em_gpt2_config_format(&c, buf, sizeof buf), EM_OK);
    assert_non_null(strstr(buf, "gpt:vocab_size="));
    memset(&back, 0, sizeof back);
    assert_int_equal(em_gpt2_config_parse(buf, &back), EM_OK);
    assert_memory_equal(&c, &back, sizeof c);
    assert_int_equal(em_gpt2_config_parse("gpt:n_layer=3", &back), EM_OK);
    em_gpt2_config d = em_gpt2_config_default();
    d.n_layer = 3;
    assert_memory_equal(&d, &back, sizeof d);
    assert_int_equal(em_gpt2_config_format(&c, buf, 20), EM_ERR_INVALID);
    assert_string_equal(buf, "");
    static const char *const bad[][2] = {{"mlp:784-10", "gpt:"},          {"gpt:n_layer", "key=value"},
                                         {"gpt:n_layers=2", "n_layers"},  {"gpt:n_head=x", "'x'"},
                                         {"gpt:n_head=-1", "n_head"},     {"gpt:dropout=nan", "dropout"},
                                         {"gpt:n_head=2,n_head=2", "twice"}, {"gpt:n_embd=", "n_embd"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        back = d;
        assert_int_equal(em_gpt2_config_parse(bad[i][0], &back), EM_ERR_INVALID);
        assert_non_null(strstr(em_last_error(), bad[i][1]));
        assert_memory_equal(&d, &back, sizeof d);
    }
}

/* ---- TransformerEncoderLayer / TransformerEncoder -------------------------------------------- */

/* The fixture name of a parameter key: "layers." shortened to "L" (names < 32 characters). */
static const char *enc_name(const char *key, const char *prefix, char *out, size_t n)
{
    if (!strncmp(key, "layers.", 7))
        snprintf(out, n, "%sL%s", prefix, key + 7);
    else
        snprintf(out, n, "%s%s", prefix, key);
    return out;
}

static em_transformer_encoder_layer_config enc_cfg(const fx_block *b)
{
    const int64_t d = (int64_t)fx_kw(b, "d", 0), h = (int64_t)fx_kw(b, "H", 0);
    em_transformer_encoder_layer_config c = em_transformer_encoder_layer_config_default(d, h);
    c.dim_feedforward = (int64_t)fx_kw(b, "F", 0);
    c.dropout = 0.1; /* as the fixtures: off in eval mode */
    c.activation = fx_kw(b, "gelu", 0) != 0 ? "gelu" : "relu";
    c.batch_first = fx_kw(b, "batch_first", 0) != 0;
    c.norm_first = fx_kw(b, "norm_first", 0) != 0;
    return c;
}

static em_tensor *enc_fwd(em_module *m, bool layer, const em_tensor *x, const em_tensor *am, const em_tensor *kpm, bool causal)
{
    return layer ? em_transformer_encoder_layer_forward(m, x, am, kpm, causal) : em_transformer_encoder_forward(m, x, am, kpm, causal);
}

static void test_encoder_vs_pytorch(void **state)
{
    (void)state;
    load_fixtures();
    int n = 0;
    double ef = 0, eg = 0; /* this test's worst errors (also folded into the totals) */
    for (int i = 0; i < NBS; i++) {
        const fx_block *b = &BS[i];
        if (strncmp(b->config, "enc", 3)) continue;
        n++;
        const int layers = (int)fx_kw(b, "layers", 0);
        const bool layer = layers == 1;
        em_transformer_encoder_layer_config c = enc_cfg(b);
        em_module *m = layer ? em_transformer_encoder_layer_new(&c) : em_transformer_encoder_new(&c, layers, true);
        if (!m) fail_msg("%s: %s", b->config, em_last_error());
        assert_string_equal(em_module_type_name(m), layer ? "TransformerEncoderLayer" : "TransformerEncoder");
        keylist l = {0};
        assert_int_equal(em_module_visit_params(m, collect, &l), EM_OK);
        assert_int_equal(l.n, (int)fx_kw(b, "params", 0));
        /* torch's named_parameters order */
        assert_string_equal(l.k[0], layer ? "self_attn.in_proj_weight" : "layers.0.self_attn.in_proj_weight");
        assert_string_equal(l.k[3], layer ? "self_attn.out_proj.bias" : "layers.0.self_attn.out_proj.bias");
        assert_string_equal(l.k[4], layer ? "linear1.weight" : "layers.0.linear1.weight");
        assert_string_equal(l.k[11], layer ? "norm2.bias" : "layers.0.norm2.bias");
        if (!layer) {
            assert_string_equal(l.k[12], "layers.1.self_attn.in_proj_weight");
            assert_string_equal(l.k[l.n - 1], "norm.bias");
            /* torch's _get_clones: the layers start equal */
            double *a0 = em_test_values(l.t[4]), *a1 = em_test_values(l.t[16]);
            for (int64_t j = 0; j < em_tensor_numel(l.t[4]); j++) assert_true(a0[j] == a1[j]);
            free(a0);
            free(a1);
        }
        char nm[96];
        for (int j = 0; j < l.n; j++) set_param(m, l.k[j], b, enc_name(l.k[j], "", nm, sizeof nm));
        em_module_train(m, false);
        em_scope_begin();
        em_tensor *x = fx_leaf(b, "x", true), *kpm = fx_mask(b, "kpm", "bool"), *am = fx_new(fx_get(b, "am"), EM_F32);
        em_tensor *out = enc_fwd(m, layer, x, am, kpm, false);
        note(&ef, check(out, b, "out"));
        /* is_causal without a mask builds the same causal mask; a bool kpm equals its float form */
        note(&ef, check(enc_fwd(m, layer, x, NULL, kpm, true), b, "out"));
        int64_t kshape[2] = {em_tensor_dim(kpm, 0), em_tensor_dim(kpm, 1)};
        em_tensor *kadd = em_masked_fill(em_zeros(kshape, 2, EM_F32), kpm, -INFINITY);
        note(&ef, check(enc_fwd(m, layer, x, am, kadd, false), b, "out"));
        em_grads *g = backward_weighted(out, b);
        note(&eg, check(em_grad(g, x), b, "gx"));
        for (int j = 0; j < l.n; j++) note(&eg, check(em_grad(g, l.t[j]), b, enc_name(l.k[j], "g", nm, sizeof nm)));
        em_grads_free(g);
        /* training: dropout 0.1 changes the output, and two training forwards differ */
        em_module_train(m, true);
        em_manual_seed(5);
        double *t1 = em_test_values(enc_fwd(m, layer, x, am, kpm, false)), *t2 = em_test_values(enc_fwd(m, layer, x, am, kpm, false));
        double *e1 = em_test_values(out), d12 = 0, d1e = 0;
        for (int64_t j = 0; j < em_tensor_numel(out); j++) {
            d12 += fabs(t1[j] - t2[j]);
            d1e += fabs(t1[j] - e1[j]);
        }
        free(t1);
        free(t2);
        free(e1);
        if (!(d12 > 0 && d1e > 0)) fail_msg("%s: training-mode dropout had no effect (%g, %g)", b->config, d12, d1e);
        em_scope_end();
        em_module_free(m);
    }
    assert_int_equal(n, 5);
    printf("TransformerEncoderLayer x4 / TransformerEncoder: max error / max|want| forward %.3g, gradients %.3g\n", ef, eg);
    note(&worst_fwd, ef);
    note(&worst_grad, eg);
}

static void test_sinusoidal_pe(void **state)
{
    (void)state;
    const fx_block *b = find_block("sinusoidal_pe");
    em_scope_begin();
    em_tensor *pe = em_sinusoidal_positional_encoding((int64_t)fx_kw(b, "T", 0), (int64_t)fx_kw(b, "d", 0));
    assert_non_null(pe);
    assert_int_equal(em_tensor_dtype(pe), EM_F32);
    double e = check(pe, b, "pe");
    note(&worst_fwd, e);
    printf("sinusoidal table [12, 16]: max error / max|want| %.3g\n", e);
    em_test_assert_error(em_sinusoidal_positional_encoding(4, 7), "d (7)", "d even", NULL);
    em_test_assert_error(em_sinusoidal_positional_encoding(0, 8), "T (0)", NULL);
    em_scope_end();
}

static void test_encoder_errors(void **state)
{
    (void)state;
    em_transformer_encoder_layer_config c = em_transformer_encoder_layer_config_default(30, 4);
    assert_null(em_transformer_encoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "d_model (30) must be a positive multiple of nhead (4)"));
    assert_null(em_transformer_encoder_new(&c, 2, true));
    assert_non_null(strstr(em_last_error(), "d_model (30)"));
    c = em_transformer_encoder_layer_config_default(8, 2);
    c.activation = "tanh";
    assert_null(em_transformer_encoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "activation should be relu/gelu, not tanh"));
    c.activation = NULL; /* relu */
    c.dim_feedforward = 0;
    assert_null(em_transformer_encoder_layer_new(&c));
    assert_non_null(strstr(em_last_error(), "dim_feedforward"));
    c.dim_feedforward = 16;
    assert_null(em_transformer_encoder_new(&c, 0, false));
    assert_non_null(strstr(em_last_error(), "num_layers"));
    c.batch_first = true;
    em_module *m = em_transformer_encoder_layer_new(&c), *e = em_transformer_encoder_new(&c, 2, false);
    assert_non_null(m);
    assert_non_null(e);
    assert_null(em_module_get_param(e, "norm.weight")); /* no final norm */
    em_scope_begin();
    int64_t x3[3] = {2, 5, 8}, bad[3] = {2, 5, 6}, x2[2] = {5, 8}, kp[2] = {2, 4}, am[2] = {4, 4};
    em_tensor *x = em_zeros(x3, 3, EM_F32);
    em_test_assert_error(em_transformer_encoder_layer_forward(m, em_zeros(bad, 3, EM_F32), NULL, NULL, false), "[2, 5, 6]",
                         "d_model = 8", NULL);
    em_test_assert_error(em_transformer_encoder_layer_forward(m, em_zeros(x2, 2, EM_F32), NULL, NULL, false), "[5, 8]",
                         "[B, T, d_model]", NULL);
    em_test_assert_error(em_transformer_encoder_layer_forward(m, x, NULL, em_zeros(kp, 2, EM_BOOL), false), "key_padding_mask",
                         "[2, 4]", "[2, 5]", NULL);
    em_test_assert_error(em_transformer_encoder_layer_forward(m, x, em_zeros(am, 2, EM_F32), NULL, false), "attn_mask", "[4, 4]",
                         "[5, 5]", NULL);
    em_test_assert_error(em_transformer_encoder_forward(e, em_zeros(bad, 3, EM_F32), NULL, NULL, true), "[2, 5, 6]", NULL);
    em_test_assert_error(em_transformer_encoder_layer_forward(e, x, NULL, NULL, false), "not a TransformerEncoderLayer", NULL);
    em_test_assert_error(em_transformer_encoder_forward(m, x, NULL, NULL, false), "not a TransformerEncoder", NULL);
    /* the module call is the forward without masks */
    em_tensor *y = em_module_forward(e, x);
    assert_non_null(y);
    em_test_assert_shape(y, 3, x3);
    em_scope_end();
    em_module_free(e);
    em_module_free(m);
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
        cmocka_unit_test(test_sdpa),
        cmocka_unit_test(test_sdpa_dropout),
        cmocka_unit_test(test_sdpa_errors),
        cmocka_unit_test(test_mha),
        cmocka_unit_test(test_mha_errors),
        cmocka_unit_test(test_gpt2_keys_and_init),
        cmocka_unit_test(test_gpt2_vs_pytorch),
        cmocka_unit_test(test_gpt2_hub_layout),
        cmocka_unit_test(test_gpt2_learns_without_leaks),
        cmocka_unit_test(test_gpt2_errors),
        cmocka_unit_test(test_gpt2_config_text),
        cmocka_unit_test(test_encoder_vs_pytorch),
        cmocka_unit_test(test_sinusoidal_pe),
        cmocka_unit_test(test_encoder_errors),
        cmocka_unit_test(test_report),
    };
    return cmocka_run_group_tests(tests, em_test_setup, teardown);
}
