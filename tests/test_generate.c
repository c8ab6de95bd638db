/* GPT-2 generation (issue #16, items 5 and 6): the KV cache against the full
 * forward (prefill of several tokens, one token at a time, chunks after a
 * non-empty cache), the cache's errors, the sampler's semantics (greedy,
 * top-k, top-p on hand-made distributions, temperature, seeds) and
 * em_gpt2_generate (against greedy decoding without a cache, the stop
 * string, streaming, its errors). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static em_gpt2_config tiny(void)
{
    em_gpt2_config c = em_gpt2_config_default();
    c.vocab_size = 64;
    c.n_positions = 16;
    c.n_embd = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.dropout = 0.1; /* the cached forward never drops: compared with the eval forward */
    return c;
}

/* A tiny GPT whose weights are larger than GPT-2's init (std 0.02 makes
 * every logit nearly equal, which would hide a wrong attention). */
static em_module *tiny_model(uint64_t seed)
{
    em_manual_seed(seed);
    em_gpt2_config c = tiny();
    em_module *m = em_gpt2_new(&c);
    assert_non_null(m);
    em_tensor *ps[64];
    int np = em_module_parameters(m, ps, 64);
    assert_true(np > 0 && np <= 64);
    for (int i = 0; i < np; i++)
        if (em_tensor_ndim(ps[i]) == 2) assert_int_equal(em_init_normal_(ps[i], 0.0, 0.3), EM_OK);
    return m;
}

static double g_worst; /* largest |cached - full| over the test */

/* Compares the cached logits r [B, Tn, V] with the rows [t0, t0 + Tn) of the
 * full forward's values full [B, Tf, V]; releases r. */
static void expect_rows(em_tensor *r, const double *full, int64_t B, int64_t Tf, int64_t V, int64_t t0, const char *what)
{
    if (!r) fail_msg("%s: %s", what, em_last_error());
    assert_int_equal(em_tensor_ndim(r), 3);
    const int64_t Tn = em_tensor_dim(r, 1);
    assert_int_equal(em_tensor_dim(r, 0), B);
    assert_int_equal(em_tensor_dim(r, 2), V);
    assert_false(em_requires_grad(r)); /* nothing recorded */
    double *got = em_test_values(r);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Tn; t++)
            for (int64_t v = 0; v < V; v++) {
                const double w = full[(b * Tf + t0 + t) * V + v], g = got[(b * Tn + t) * V + v], e = fabs(g - w);
                if (e > g_worst) g_worst = e;
                if (e > 2e-5 + 2e-5 * fabs(w))
                    fail_msg("%s: batch %lld position %lld id %lld: cached %.9g, full forward %.9g", what, (long long)b,
                             (long long)(t0 + t), (long long)v, g, w);
            }
    free(got);
    em_tensor_release(r);
}

static em_tensor *ids_tensor(const int64_t *ids, int64_t B, int64_t Tf, int64_t t0, int64_t n)
{
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(B * n));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < n; t++) v[b * n + t] = ids[b * Tf + t0 + t];
    const int64_t s[2] = {B, n};
    em_tensor *x = em_from_host(v, s, 2, EM_I64);
    free(v);
    return x;
}

/* Decoding with the cache gives the full forward's logits at every step:
 * prefill of 5 tokens, 4 single tokens, a chunk of 3 after the non-empty
 * cache (the bottom-right causal mask); then after a reset the whole
 * context at once and a chunk up to n_positions. */
static void test_cache_equals_full_forward(void **state)
{
    (void)state;
    em_module *m = tiny_model(5);
    const int64_t B = 2, Tf = 16, V = 64;
    int64_t ids[2 * 16];
    for (int i = 0; i < 2 * 16; i++) ids[i] = (i * 37 + 11) % 64;
    em_module_train(m, false);
    em_tensor *xf = ids_tensor(ids, B, Tf, 0, Tf);
    em_tensor *lf = em_module_forward(m, xf);
    double *full = em_test_values(lf); /* [2, 16, 64] */
    em_tensor_release(lf);
    em_module_train(m, true); /* the cached forward ignores the training mode (dropout 0.1) */
    em_gpt2_cache *c = em_gpt2_cache_new(m, B, Tf);
    assert_non_null(c);
    assert_int_equal(em_gpt2_cache_length(c), 0);
    assert_int_equal(em_gpt2_cache_max_len(c), 16);
    em_tensor *x = ids_tensor(ids, B, Tf, 0, 5);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 0, "prefill of 5");
    em_tensor_release(x);
    assert_int_equal(em_gpt2_cache_length(c), 5);
    for (int64_t t = 5; t < 9; t++) {
        x = ids_tensor(ids, B, Tf, t, 1);
        expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, t, "one token");
        em_tensor_release(x);
        assert_int_equal(em_gpt2_cache_length(c), t + 1);
    }
    x = ids_tensor(ids, B, Tf, 9, 3);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 9, "chunk of 3 after 9 cached");
    em_tensor_release(x);
    assert_int_equal(em_gpt2_cache_length(c), 12);
    /* a reset cache: the whole prefix at once, then a chunk to the end (n_positions) */
    em_gpt2_cache_reset(c);
    assert_int_equal(em_gpt2_cache_length(c), 0);
    x = ids_tensor(ids, B, Tf, 0, 11);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 0, "prefill of 11 after reset");
    em_tensor_release(x);
    x = ids_tensor(ids, B, Tf, 11, 5);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 11, "chunk of 5 to n_positions");
    em_tensor_release(x);
    assert_int_equal(em_gpt2_cache_length(c), 16);
    /* int32 ids are accepted too */
    em_gpt2_cache_reset(c);
    int32_t i32[2] = {(int32_t)ids[0], (int32_t)ids[16]};
    const int64_t s21[2] = {2, 1};
    x = em_from_host(i32, s21, 2, EM_I32);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 0, "int32 ids");
    em_tensor_release(x);
    /* a full cache: one more token is an error naming the lengths */
    em_gpt2_cache_reset(c);
    x = ids_tensor(ids, B, Tf, 0, 16);
    expect_rows(em_gpt2_forward_cached(m, c, x), full, B, Tf, V, 0, "the whole context");
    em_tensor_release(x);
    x = ids_tensor(ids, B, Tf, 0, 1);
    em_test_assert_error(em_gpt2_forward_cached(m, c, x), "holds 16 of max_len = 16", "n_positions 16", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    assert_int_equal(em_gpt2_cache_length(c), 16);
    em_tensor_release(x);
    printf("KV cache vs full forward: max |diff| %.3g over prefill, single tokens and chunks\n", g_worst);
    em_gpt2_cache_free(c);
    em_tensor_release(xf);
    free(full);
    em_module_free(m);
}

/* Decoding steps leak no tensor or handle (the cache's buffers are reused). */
static void test_cache_no_leak(void **state)
{
    (void)state;
    em_module *m = tiny_model(6);
    em_gpt2_cache *c = em_gpt2_cache_new(m, 1, 16);
    assert_non_null(c);
    em_stats s0 = {0};
    for (int round = 0; round < 3; round++) {
        em_gpt2_cache_reset(c);
        for (int t = 0; t < 16; t++) {
            em_scope_begin();
            const int64_t id = (t * 5 + round) % 64, s[2] = {1, 1};
            em_tensor *r = em_gpt2_forward_cached(m, c, em_from_host(&id, s, 2, EM_I64));
            if (!r) fail_msg("step %d: %s", t, em_last_error());
            double v;
            assert_int_equal(em_item(em_narrow(em_narrow(r, 2, 0, 1), 1, 0, 1), &v), EM_OK);
            em_scope_end();
        }
        if (round == 0) {
            em_sync();
            s0 = em_get_stats();
        }
    }
    em_test_assert_no_leak(&s0);
    em_gpt2_cache_free(c);
    em_module_free(m);
}

static void test_cache_errors(void **state)
{
    (void)state;
    em_module *m = tiny_model(7), *other = tiny_model(8);
    em_module *lin = em_linear_new(4, 4, true);
    assert_null(em_gpt2_cache_new(NULL, 1, 4));
    assert_int_equal(em_last_status(), EM_ERR_INVALID);
    assert_null(em_gpt2_cache_new(lin, 1, 4));
    assert_non_null(strstr(em_last_error(), "module is Linear, not a GPT2LMHeadModel"));
    assert_null(em_gpt2_cache_new(m, 0, 4));
    assert_non_null(strstr(em_last_error(), "batch must be in [1, 2^24], got 0"));
    assert_null(em_gpt2_cache_new(m, 1, 0));
    assert_non_null(strstr(em_last_error(), "max_len must be in [1, n_positions = 16], got 0"));
    assert_null(em_gpt2_cache_new(m, 1, 17));
    assert_non_null(strstr(em_last_error(), "got 17"));
    em_gpt2_config cfg;
    assert_int_equal(em_gpt2_get_config(m, &cfg), EM_OK);
    assert_int_equal(cfg.n_positions, 16);
    assert_int_equal(cfg.n_head, 4);
    assert_true(cfg.dropout == 0.1);
    assert_int_equal(em_gpt2_get_config(lin, &cfg), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "Linear"));
    assert_int_equal(em_gpt2_cache_length(NULL), -1);
    em_gpt2_cache_reset(NULL);
    em_gpt2_cache_free(NULL);

    em_gpt2_cache *c = em_gpt2_cache_new(m, 2, 8);
    assert_non_null(c);
    em_scope_begin();
    const int64_t s23[2] = {2, 3}, s13[2] = {1, 3}, s20[2] = {2, 0}, s3[1] = {3}, s26[2] = {2, 6};
    em_test_assert_error(em_gpt2_forward_cached(m, c, em_zeros(s13, 2, EM_I64)), "[1, 3]", "cache of batch 2", NULL);
    assert_int_equal(em_last_status(), EM_ERR_SHAPE);
    em_test_assert_error(em_gpt2_forward_cached(m, c, em_zeros(s20, 2, EM_I64)), "[2, 0]", "T_new >= 1", NULL);
    em_test_assert_error(em_gpt2_forward_cached(m, c, em_zeros(s3, 1, EM_I64)), "[3]", NULL);
    em_test_assert_error(em_gpt2_forward_cached(m, c, em_zeros(s23, 2, EM_F32)), "int64 or int32, got float32", NULL);
    assert_int_equal(em_last_status(), EM_ERR_DTYPE);
    em_test_assert_error(em_gpt2_forward_cached(other, c, em_zeros(s23, 2, EM_I64)), "made for another model", NULL);
    em_test_assert_error(em_gpt2_forward_cached(m, NULL, em_zeros(s23, 2, EM_I64)), "cache is NULL", NULL);
    em_test_assert_error(em_gpt2_forward_cached(m, c, NULL), "token ids is NULL", NULL);
    assert_int_equal(em_gpt2_cache_length(c), 0); /* every failure left it empty */
    em_tensor *r = em_gpt2_forward_cached(m, c, em_zeros(s23, 2, EM_I64));
    assert_non_null(r);
    assert_int_equal(em_gpt2_cache_length(c), 3);
    em_test_assert_error(em_gpt2_forward_cached(m, c, em_zeros(s26, 2, EM_I64)), "holds 3 of max_len = 8", "6 more do not fit", NULL);
    assert_int_equal(em_gpt2_cache_length(c), 3);
    /* an id outside the vocabulary: the Embedding's kernel error, reported when the logits are read */
    const int64_t bad[6] = {1, 2, 3, 4, 64, 5};
    double tmp[2 * 3 * 64];
    em_tensor *rb = em_gpt2_forward_cached(m, c, em_from_host(bad, s23, 2, EM_I64));
    if (rb) assert_int_not_equal(em_to_host(rb, tmp, sizeof tmp), EM_OK);
    em_clear_error();
    em_scope_end();
    em_gpt2_cache_free(c);
    em_module_free(lin);
    em_module_free(other);
    em_module_free(m);
}

/* ---- sampling ---------------------------------------------------------------------- */

/* logits = log(p): softmax gives p back */
static void log_probs(const double *p, int n, float *out)
{
    for (int i = 0; i < n; i++) out[i] = p[i] > 0 ? (float)log(p[i]) : -INFINITY;
}

/* Frequencies of ids over @p draws draws of one row. */
static void freqs(const float *l, int64_t V, const em_sampling *s, uint64_t seed, int draws, double *f)
{
    uint64_t rng = seed;
    for (int64_t i = 0; i < V; i++) f[i] = 0;
    for (int d = 0; d < draws; d++) {
        int64_t id;
        assert_int_equal(em_sample_logits(l, 1, V, s, &rng, &id), EM_OK);
        assert_true(id >= 0 && id < V);
        f[id] += 1.0 / draws;
    }
}

static void test_sampling_greedy_and_topk(void **state)
{
    (void)state;
    /* two rows: greedy is the argmax of each, the first maximum on ties, and draws nothing */
    const float l[2 * 5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, -INFINITY, -3.0f, -2.5f, -INFINITY, -2.9f};
    em_sampling g = em_sampling_default();
    g.temperature = 0;
    uint64_t rng = 99;
    int64_t out[2] = {-1, -1};
    assert_int_equal(em_sample_logits(l, 2, 5, &g, &rng, out), EM_OK);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
    assert_true(rng == 99);
    /* top_k = 1 is greedy whatever the seed and temperature */
    em_sampling k1 = em_sampling_default();
    k1.top_k = 1;
    k1.temperature = 5.0;
    const double p[6] = {0.1, 0.25, 0.05, 0.3, 0.2, 0.1};
    float lp[6];
    log_probs(p, 6, lp);
    for (uint64_t seed = 0; seed < 200; seed++) {
        int64_t id;
        rng = seed;
        assert_int_equal(em_sample_logits(lp, 1, 6, &k1, &rng, &id), EM_OK);
        assert_int_equal(id, 3);
    }
    /* top_k = 2 keeps {3, 1} and renormalises: 0.3 / 0.55, 0.25 / 0.55 */
    em_sampling k2 = em_sampling_default();
    k2.top_k = 2;
    double f[6];
    freqs(lp, 6, &k2, 1, 20000, f);
    assert_true(f[0] == 0 && f[2] == 0 && f[4] == 0 && f[5] == 0);
    assert_true(fabs(f[3] - 0.3 / 0.55) < 0.015);
    assert_true(fabs(f[1] - 0.25 / 0.55) < 0.015);
    /* ties with the k-th value stay (HF's scores < kth-value rule): top_k 2 of {5, 3, 3, 1} keeps ids 0, 1 and 2 */
    const float tie[4] = {5.0f, 3.0f, 3.0f, 1.0f};
    freqs(tie, 4, &k2, 2, 20000, f);
    const double e2 = exp(2.0);
    assert_true(f[3] == 0 && fabs(f[0] - e2 / (e2 + 2)) < 0.015 && fabs(f[1] - 1 / (e2 + 2)) < 0.015 && fabs(f[2] - 1 / (e2 + 2)) < 0.015);
    /* top_k >= vocab: no filter */
    em_sampling k9 = em_sampling_default();
    k9.top_k = 9;
    freqs(lp, 6, &k9, 3, 20000, f);
    for (int i = 0; i < 6; i++)
        if (fabs(f[i] - p[i]) > 0.015) fail_msg("plain sampling: id %d frequency %g, probability %g", i, f[i], p[i]);
}

static void test_sampling_top_p(void **state)
{
    (void)state;
    /* p = 0.5, 0.3, 0.15, 0.05 shuffled over ids: sorted 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1) */
    const double p[4] = {0.3, 0.05, 0.5, 0.15};
    float l[4];
    log_probs(p, 4, l);
    struct {
        double top_p;
        bool keep[4];
    } cases[] = {
        {0.45, {false, false, true, false}}, /* 0.5 alone reaches 0.45 */
        {0.5 + 1e-4, {true, false, true, false}},
        {0.75, {true, false, true, false}},  /* 0.5 + 0.3 = 0.8 >= 0.75 */
        {0.81, {true, false, true, true}},   /* needs 0.15 too */
        {0.96, {true, true, true, true}},
        {0.01, {false, false, true, false}}, /* at least one token */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        em_sampling s = em_sampling_default();
        s.top_p = cases[c].top_p;
        double f[4], kept = 0;
        for (int i = 0; i < 4; i++) kept += cases[c].keep[i] ? p[i] : 0;
        freqs(l, 4, &s, 10 + c, 20000, f);
        for (int i = 0; i < 4; i++) {
            const double want = cases[c].keep[i] ? p[i] / kept : 0;
            if (cases[c].keep[i] ? fabs(f[i] - want) > 0.015 : f[i] != 0)
                fail_msg("top_p %g: id %d frequency %g, expected %g", cases[c].top_p, i, f[i], want);
        }
    }
    /* top_k then top_p (HF's order): top_k 3 renormalises 0.5, 0.3, 0.15 to 0.526, 0.316, 0.158; top_p 0.8 then keeps 2 */
    em_sampling s = em_sampling_default();
    s.top_k = 3;
    s.top_p = 0.8;
    double f[4];
    freqs(l, 4, &s, 20, 20000, f);
    assert_true(f[1] == 0 && f[3] == 0);
    assert_true(fabs(f[2] - 0.625) < 0.015 && fabs(f[0] - 0.375) < 0.015);
}

static void test_sampling_temperature_and_seeds(void **state)
{
    (void)state;
    const double p[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float l[5];
    log_probs(p, 5, l);
    /* temperature t: probabilities p^(1/t) renormalised */
    const double temps[3] = {0.5, 1.0, 2.0};
    for (int k = 0; k < 3; k++) {
        em_sampling s = em_sampling_default();
        s.temperature = temps[k];
        double w[5], z = 0, f[5];
        for (int i = 0; i < 5; i++) z += w[i] = pow(p[i], 1.0 / temps[k]);
        freqs(l, 5, &s, 30 + (uint64_t)k, 30000, f);
        for (int i = 0; i < 5; i++)
            if (fabs(f[i] - w[i] / z) > 0.012) fail_msg("temperature %g: id %d frequency %g, expected %g", temps[k], i, f[i], w[i] / z);
    }
    /* the same state gives the same ids, rows in order; another seed other ids; -inf never drawn */
    float u[3 * 50];
    for (int i = 0; i < 150; i++) u[i] = (i % 50 == 7) ? -INFINITY : (float)((i * 13) % 7) * 0.1f;
    em_sampling s = em_sampling_default();
    int64_t a[3], b[3], c2[3], seq1[40], seq2[40], seq3[40];
    uint64_t r1 = 1234, r2 = 1234, r3 = 1235;
    for (int d = 0; d < 40; d++) {
        assert_int_equal(em_sample_logits(u, 3, 50, &s, &r1, a), EM_OK);
        assert_int_equal(em_sample_logits(u, 3, 50, &s, &r2, b), EM_OK);
        assert_int_equal(em_sample_logits(u, 3, 50, &s, &r3, c2), EM_OK);
        assert_memory_equal(a, b, sizeof a);
        for (int i = 0; i < 3; i++) assert_true(a[i] != 7 && c2[i] != 7);
        seq1[d] = a[0];
        seq2[d] = b[0];
        seq3[d] = c2[0];
    }
    assert_memory_equal(seq1, seq2, sizeof seq1);
    assert_memory_not_equal(seq1, seq3, sizeof seq1);
    assert_true(r1 == r2 && r1 == 1234 + 120 * UINT64_C(0x9E3779B97F4A7C15)); /* one draw per row */
    /* the stream is fixed: seed 42, uniform over 10 ids (a regression pin, the same on every machine) */
    float flat[10] = {0};
    uint64_t r = 42;
    int64_t pin[12];
    for (int d = 0; d < 12; d++) assert_int_equal(em_sample_logits(flat, 1, 10, &s, &r, &pin[d]), EM_OK);
    printf("seed 42, 10 equal logits: ");
    for (int d = 0; d < 12; d++) printf("%lld ", (long long)pin[d]);
    printf("\n");
    /* the ids are floor(10 * u) of splitmix64's first 12 outputs from state 42 */
    uint64_t st = 42;
    for (int d = 0; d < 12; d++) {
        uint64_t z = (st += UINT64_C(0x9E3779B97F4A7C15));
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        z ^= z >> 31;
        assert_int_equal(pin[d], (int64_t)floor((double)(z >> 11) * 0x1.0p-53 * 10.0));
        assert_int_equal(em_splitmix64(&(uint64_t){st - UINT64_C(0x9E3779B97F4A7C15)}), z);
    }
}

static void test_sampling_errors(void **state)
{
    (void)state;
    const float l[3] = {0, 1, 2};
    em_sampling s = em_sampling_default();
    uint64_t rng = 5;
    int64_t out[2] = {-7, -7};
    assert_int_equal(em_sample_logits(NULL, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_int_equal(em_sample_logits(l, 0, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_int_equal(em_sample_logits(l, 1, 0, &s, &rng, out), EM_ERR_INVALID);
    s.temperature = -1;
    assert_int_equal(em_sample_logits(l, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "temperature must be a finite number >= 0 (0 = greedy), got -1"));
    s.temperature = NAN;
    assert_int_equal(em_sample_logits(l, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    s = em_sampling_default();
    s.top_k = -1;
    assert_int_equal(em_sample_logits(l, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "top_k must be >= 0"));
    s = em_sampling_default();
    s.top_p = 0;
    assert_int_equal(em_sample_logits(l, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "top_p must be in (0, 1]"));
    s.top_p = 1.5;
    assert_int_equal(em_sample_logits(l, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    s = em_sampling_default();
    const float bad[6] = {0, 1, 2, 0, NAN, 1};
    assert_int_equal(em_sample_logits(bad, 2, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "row 1: logit of id 1 is nan"));
    const float pinf[3] = {0, INFINITY, 1};
    assert_int_equal(em_sample_logits(pinf, 1, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "id 1 is inf"));
    const float ninf[6] = {0, 1, 2, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(em_sample_logits(ninf, 2, 3, &s, &rng, out), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "row 1: every logit is -inf"));
    assert_true(out[0] == -7 && out[1] == -7 && rng == 5); /* nothing written, no draw */
}

/* ---- em_gpt2_generate ------------------------------------------------------------------ */

/* id -> two bytes: "<hex digit of id / 8><letter of id % 8>" (a 2-byte-per-token vocabulary) */
static const char *two_bytes(int64_t id, size_t *len, void *ud)
{
    static char b[2];
    (void)ud;
    if (id < 0 || id >= 64) return NULL;
    b[0] = "0123456789abcdef"[id / 8];
    b[1] = "ABCDEFGH"[id % 8];
    *len = 2;
    return b;
}

typedef struct stream {
    char text[4096];
    size_t n;
    int calls;
    int64_t ids[64];
    int stop_after; /* 0: never */
} stream;

static int on_token(int64_t id, const char *text, size_t n, void *ud)
{
    stream *s = ud;
    s->ids[s->calls++] = id;
    assert_true(s->n + n < sizeof s->text);
    if (n) memcpy(s->text + s->n, text, n);
    s->n += n;
    s->text[s->n] = 0;
    return s->stop_after && s->calls >= s->stop_after;
}

/* Greedy em_gpt2_generate = argmax of the full forward of the growing sequence (no cache). */
static void test_generate_equals_uncached_greedy(void **state)
{
    (void)state;
    em_module *m = tiny_model(9);
    em_module_train(m, false);
    const int64_t prompt[3] = {5, 17, 42};
    em_generate_opts o = em_generate_opts_default();
    o.max_new_tokens = 10;
    o.sampling.temperature = 0;
    int64_t out[10];
    em_generate_result res;
    assert_int_equal(em_gpt2_generate(m, prompt, 3, &o, out, &res), EM_OK);
    assert_int_equal(res.prompt_tokens, 3);
    assert_int_equal(res.new_tokens, 10);
    assert_int_equal(res.stopped, EM_GENERATE_MAX_TOKENS);
    assert_true(res.prefill_s > 0 && res.decode_s > 0);
    int64_t seq[16];
    memcpy(seq, prompt, sizeof prompt);
    for (int t = 0; t < 10; t++) {
        em_scope_begin();
        const int64_t s[2] = {1, 3 + t};
        double *l = em_test_values(em_module_forward(m, em_from_host(seq, s, 2, EM_I64)));
        int64_t best = 0;
        for (int v = 1; v < 64; v++)
            if (l[(2 + t) * 64 + v] > l[(2 + t) * 64 + best]) best = v;
        free(l);
        em_scope_end();
        assert_int_equal(out[t], best);
        seq[3 + t] = best;
    }
    /* sampled: the same seed twice gives the same ids, another seed others (13 tokens fill n_positions) */
    o.sampling = em_sampling_default();
    o.max_new_tokens = 13;
    int64_t a[13], b[13], c[13];
    o.seed = 77;
    assert_int_equal(em_gpt2_generate(m, prompt, 3, &o, a, NULL), EM_OK);
    assert_int_equal(em_gpt2_generate(m, prompt, 3, &o, b, NULL), EM_OK);
    o.seed = 78;
    assert_int_equal(em_gpt2_generate(m, prompt, 3, &o, c, NULL), EM_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    /* vocab_limit: only ids below it */
    o.vocab_limit = 4;
    assert_int_equal(em_gpt2_generate(m, prompt, 3, &o, a, NULL), EM_OK);
    for (int i = 0; i < 13; i++) assert_true(a[i] >= 0 && a[i] < 4);
    em_module_free(m);
}

static void test_generate_stop_and_stream(void **state)
{
    (void)state;
    em_module *m = tiny_model(10);
    const int64_t prompt[2] = {1, 2};
    em_generate_opts o = em_generate_opts_default();
    o.max_new_tokens = 14;
    o.seed = 3;
    o.token_bytes = two_bytes;
    o.on_token = on_token;
    /* no stop: one call per token, the text is the tokens' bytes */
    stream all = {0};
    o.on_token_ud = &all;
    int64_t ids[14];
    em_generate_result res;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids, &res), EM_OK);
    assert_int_equal(res.new_tokens, 14);
    assert_int_equal(all.calls, 14);
    assert_memory_equal(all.ids, ids, sizeof ids);
    assert_int_equal(all.n, 28);
    for (int t = 0; t < 14; t++) {
        size_t bl;
        const char *by = two_bytes(ids[t], &bl, NULL);
        assert_memory_equal(all.text + 2 * t, by, 2);
    }
    /* a stop string over a token boundary (bytes 5..7: the end of token 2 and token 3) */
    char stop[4];
    memcpy(stop, all.text + 5, 3);
    stop[3] = 0;
    const size_t first = (size_t)(strstr(all.text, stop) - all.text); /* may be earlier than 5 */
    const int64_t last_tok = (int64_t)(first + 2) / 2;                /* the token that completes it */
    stream st = {0};
    o.on_token_ud = &st;
    o.stop = stop;
    int64_t ids2[14];
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_OK);
    assert_int_equal(res.stopped, EM_GENERATE_STOP_STRING);
    assert_int_equal(res.new_tokens, last_tok + 1);
    assert_memory_equal(ids2, ids, sizeof(int64_t) * (size_t)res.new_tokens);
    assert_int_equal(st.n, first); /* the text before the stop string, nothing of it or after it */
    assert_memory_equal(st.text, all.text, first);
    assert_null(strstr(st.text, stop));
    /* a stop string that never comes: held-back bytes are flushed at max_new_tokens */
    char tail[3] = {all.text[27], '!', 0}; /* the last byte, then a byte no token has */
    stream nv = {0};
    o.on_token_ud = &nv;
    o.stop = tail;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_OK);
    assert_int_equal(res.stopped, EM_GENERATE_MAX_TOKENS);
    assert_int_equal(nv.n, 28);
    assert_memory_equal(nv.text, all.text, 28);
    /* the callback stops it */
    stream cb = {.stop_after = 3};
    o.on_token_ud = &cb;
    o.stop = NULL;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_OK);
    assert_int_equal(res.stopped, EM_GENERATE_CALLBACK);
    assert_int_equal(res.new_tokens, 3);
    /* errors, nothing run */
    o = em_generate_opts_default();
    o.max_new_tokens = 15;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "prompt (2 tokens) + max_new_tokens (15) exceeds the model's n_positions = 16 (at most 14"));
    assert_int_equal(res.new_tokens, 0);
    o.max_new_tokens = 0;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    o.max_new_tokens = 1;
    assert_int_equal(em_gpt2_generate(m, prompt, 0, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "at least one token"));
    const int64_t badp[2] = {1, 64};
    assert_int_equal(em_gpt2_generate(m, badp, 2, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "prompt token 1 is id 64, outside the vocabulary [0, 64)"));
    o.stop = "x";
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "needs a token_bytes"));
    o.stop = NULL;
    o.vocab_limit = 65;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    o.vocab_limit = 0;
    o.sampling.top_p = 2;
    assert_int_equal(em_gpt2_generate(m, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "top_p"));
    em_module *lin = em_linear_new(2, 2, false);
    o.sampling = em_sampling_default();
    assert_int_equal(em_gpt2_generate(lin, prompt, 2, &o, ids2, &res), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "not a GPT2LMHeadModel"));
    em_module_free(lin);
    em_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_equals_full_forward),
        cmocka_unit_test(test_cache_no_leak),
        cmocka_unit_test(test_cache_errors),
        cmocka_unit_test(test_sampling_greedy_and_topk),
        cmocka_unit_test(test_sampling_top_p),
        cmocka_unit_test(test_sampling_temperature_and_seeds),
        cmocka_unit_test(test_sampling_errors),
        cmocka_unit_test(test_generate_equals_uncached_greedy),
        cmocka_unit_test(test_generate_stop_and_stream),
    };
    return cmocka_run_group_tests(tests, em_test_setup, em_test_teardown);
}
