/* GPT-2 generation (issue #16, item 5): a KV cache for GPT2LMHeadModel
 * (em_gpt2_cache, em_gpt2_forward_cached), host-side sampling
 * (em_sample_logits: temperature, top-k, top-p) and the decoding loop
 * (em_gpt2_generate: prefill, then one token per step, stop string,
 * streaming). The layers' math is GPT2Block's (nn/transformer.c), run on the
 * new positions only; attention goes through the public
 * em_scaled_dot_product_attention, queries of the new tokens against the
 * cached keys. Contracts: include/ember/nn.h. */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct em_gpt2_cache {
    const em_module *gpt; /* borrowed: the one model this cache serves */
    em_gpt2_config cfg;
    int64_t batch, max_len, len;
    int64_t n_layer;
    em_tensor **k, **v; /* owned, per layer [batch, n_head, max_len, head_dim] */
};

/* A zero tensor owned by the caller whatever scope is open. */
static em_tensor *owned_zeros(const int64_t *shape, int nd, em_dtype dt)
{
    em_scope_begin();
    em_tensor *t = em_zeros(shape, nd, dt);
    if (t) em_tensor_retain(t);
    em_scope_end();
    return t;
}

void em_gpt2_cache_free(em_gpt2_cache *c)
{
    if (!c) return;
    for (int64_t i = 0; i < c->n_layer; i++) {
        if (c->k) em_tensor_release(c->k[i]);
        if (c->v) em_tensor_release(c->v[i]);
    }
    free(c->k);
    free(c->v);
    free(c);
}

em_gpt2_cache *em_gpt2_cache_new(const em_module *gpt, int64_t batch, int64_t max_len)
{
    static const char *fn = "em_gpt2_cache_new";
    em_gpt2_config cfg;
    if (!gpt) return em__fail(EM_ERR_INVALID, "%s: model is NULL", fn);
    if (em_gpt2_get_config(gpt, &cfg) != EM_OK)
        return em__fail(EM_ERR_INVALID, "%s: module is %s, not a GPT2LMHeadModel", fn, em_module_type_name(gpt));
    if (batch < 1 || batch > ((int64_t)1 << 24))
        return em__fail(EM_ERR_INVALID, "%s: batch must be in [1, 2^24], got %lld", fn, (long long)batch);
    if (max_len < 1 || max_len > cfg.n_positions)
        return em__fail(EM_ERR_INVALID, "%s: max_len must be in [1, n_positions = %lld], got %lld", fn, (long long)cfg.n_positions,
                        (long long)max_len);
    const em_tensor *wte = em_module_get_param(gpt, "transformer.wte.weight");
    if (!wte) return NULL;
    em_gpt2_cache *c = calloc(1, sizeof *c);
    if (!c) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    c->gpt = gpt;
    c->cfg = cfg;
    c->batch = batch;
    c->max_len = max_len;
    c->n_layer = cfg.n_layer;
    c->k = calloc((size_t)(cfg.n_layer ? cfg.n_layer : 1), sizeof *c->k);
    c->v = calloc((size_t)(cfg.n_layer ? cfg.n_layer : 1), sizeof *c->v);
    if (!c->k || !c->v) {
        em_gpt2_cache_free(c);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    }
    const int64_t shape[4] = {batch, cfg.n_head, max_len, cfg.n_embd / cfg.n_head};
    for (int64_t i = 0; i < cfg.n_layer; i++) {
        c->k[i] = owned_zeros(shape, 4, em_tensor_dtype(wte));
        c->v[i] = c->k[i] ? owned_zeros(shape, 4, em_tensor_dtype(wte)) : NULL;
        if (!c->v[i]) {
            em_gpt2_cache_free(c);
            return NULL; /* em_zeros's error (out of memory, too large) */
        }
    }
    return c;
}

int64_t em_gpt2_cache_length(const em_gpt2_cache *c) { return c ? c->len : -1; }
int64_t em_gpt2_cache_max_len(const em_gpt2_cache *c) { return c ? c->max_len : -1; }
void em_gpt2_cache_reset(em_gpt2_cache *c)
{
    if (c) c->len = 0;
}

#define CHILD(m, key) em_module_get_child((m), (key))

/* GPT2Block's forward (nn/transformer.c gpt2_block_forward, without dropout)
 * on the T new positions x [B, T, E] of layer @p li, whose keys and values
 * are written at positions [L, L + T) of the cache and attended with the L
 * before them. Inside the caller's scope; NULL on the first failure. */
static em_tensor *block_cached(em_module *blk, em_gpt2_cache *c, int64_t li, const em_tensor *x, const em_tensor *mask, int64_t L,
                               int64_t T)
{
    const int64_t B = c->batch, E = c->cfg.n_embd, H = c->cfg.n_head;
    static const int to_heads[4] = {0, 2, 1, 3};
    em_tensor *qkv = em_module_forward(CHILD(blk, "attn.c_attn"), em_module_forward(CHILD(blk, "ln_1"), x));
    if (!qkv) return NULL;
    em_tensor *hh[3];
    for (int i = 0; i < 3; i++) { /* q | k | v along the last dim, as HF */
        const int64_t hs[4] = {B, T, H, E / H};
        hh[i] = em_permute(em_reshape(em_contiguous(em_narrow(qkv, 2, i * E, E)), hs, 4), to_heads, 4); /* [B, H, T, D] */
        if (!hh[i]) return NULL;
    }
    /* append: positions [L, L + T) of the preallocated buffers, through views */
    if (em_copy_(em_narrow(c->k[li], 2, L, T), hh[1]) != EM_OK || em_copy_(em_narrow(c->v[li], 2, L, T), hh[2]) != EM_OK) return NULL;
    em_tensor *kk = em_narrow(c->k[li], 2, 0, L + T), *vv = em_narrow(c->v[li], 2, 0, L + T);
    /* without a mask: one query sees every key; L = 0 is the plain causal case */
    em_tensor *o = em_scaled_dot_product_attention(hh[0], kk, vv, mask, !mask && T > 1, 0.0, 0.0, false);
    if (!o) return NULL;
    const int64_t flat[3] = {B, T, E};
    o = em_module_forward(CHILD(blk, "attn.c_proj"), em_reshape(em_contiguous(em_permute(o, to_heads, 4)), flat, 3));
    em_tensor *h = em_add(x, o);
    if (!h) return NULL;
    em_tensor *f = em_gelu_tanh(em_module_forward(CHILD(blk, "mlp.c_fc"), em_module_forward(CHILD(blk, "ln_2"), h)));
    f = em_module_forward(CHILD(blk, "mlp.c_proj"), f);
    return f ? em_add(h, f) : NULL;
}

/* em_gpt2_forward_cached; with @p last_only the logits of the last new
 * position only ([B, 1, V]: the lm_head product of one row, what sampling
 * needs after a prefill). */
static em_tensor *forward_cached(em_module *gpt, em_gpt2_cache *c, const em_tensor *idx, bool last_only)
{
    static const char *fn = "em_gpt2_forward_cached";
    char si[160];
    if (!gpt || !c || !idx) return em__fail(EM_ERR_INVALID, "%s: %s is NULL", fn, !gpt ? "model" : !c ? "cache" : "token ids");
    if (c->gpt != gpt) return em__fail(EM_ERR_INVALID, "%s: the cache was made for another model", fn);
    const em_dtype dt = em_tensor_dtype(idx);
    if (dt != EM_I64 && dt != EM_I32)
        return em__fail(EM_ERR_DTYPE, "%s: token ids must be int64 or int32, got %s", fn, em_dtype_name(dt));
    if (em_tensor_ndim(idx) != 2 || em_tensor_dim(idx, 1) < 1)
        return em__fail(EM_ERR_SHAPE, "%s: token ids of shape %s, expected [batch, T_new] with T_new >= 1", fn, NN_SHAPE(idx, si));
    if (em_tensor_dim(idx, 0) != c->batch)
        return em__fail(EM_ERR_SHAPE, "%s: token ids of shape %s for a cache of batch %lld", fn, NN_SHAPE(idx, si), (long long)c->batch);
    const int64_t L = c->len, T = em_tensor_dim(idx, 1);
    if (L + T > c->max_len)
        return em__fail(EM_ERR_SHAPE, "%s: the cache holds %lld of max_len = %lld positions (n_positions %lld): %lld more do not fit", fn,
                        (long long)L, (long long)c->max_len, (long long)c->cfg.n_positions, (long long)T);
    em_module *tf = CHILD(gpt, "transformer");
    em_module *blocks = CHILD(tf, "h");
    const em_tensor *wte = em_module_get_param(gpt, "transformer.wte.weight");
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *tok = em_module_forward(CHILD(tf, "wte"), idx);
    em_tensor *pos = em_module_forward(CHILD(tf, "wpe"), em_arange((double)L, (double)(L + T), 1, EM_I64));
    em_tensor *h = em_add(tok, pos);
    em_tensor *mask = NULL;
    if (h && L > 0 && T > 1) { /* bottom-right-aligned causal mask [T, L + T]: query i sees keys j <= L + i (true = take part) */
        const int64_t col[2] = {1, L + T}, row[2] = {T, 1};
        mask = em_le(em_reshape(em_arange(0, (double)(L + T), 1, EM_I64), col, 2),
                     em_reshape(em_arange((double)L, (double)(L + T), 1, EM_I64), row, 2));
        if (!mask) h = NULL;
    }
    for (int64_t i = 0; h && i < c->n_layer; i++) h = block_cached(em_module_child_at(blocks, (int)i, NULL), c, i, h, mask, L, T);
    if (h && last_only && T > 1) h = em_narrow(h, 1, T - 1, 1);
    if (h) h = em_module_forward(CHILD(tf, "ln_f"), h);
    em_tensor *logits = h ? em_matmul(h, em_transpose(wte, 0, 1)) : NULL; /* lm_head tied to wte */
    em_tensor *r = nn_return(logits);
    em_no_grad_end();
    if (r) c->len = L + T;
    return r;
}

em_tensor *em_gpt2_forward_cached(em_module *gpt, em_gpt2_cache *c, const em_tensor *idx)
{
    return forward_cached(gpt, c, idx, false);
}

/* ---- sampling ------------------------------------------------------------------------------- */

em_sampling em_sampling_default(void)
{
    em_sampling s = {1.0, 0, 1.0};
    return s;
}

/* splitmix64 (Steele, Lea & Flood 2014), the constants of em_splitmix64 (data/loader.c) */
static uint64_t sm64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

typedef struct wid {
    double w;
    int64_t id;
} wid;

/* descending weight, then ascending id */
static int wid_desc(const void *a, const void *b)
{
    const wid *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int dbl_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

em_status em_sample_logits(const float *logits, int64_t batch, int64_t vocab, const em_sampling *s, uint64_t *rng, int64_t *out)
{
    static const char *fn = "em_sample_logits";
    if (!logits || !s || !rng || !out)
        return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !logits ? "logits" : !s ? "sampling" : !rng ? "rng" : "out");
    if (batch < 1 || vocab < 1)
        return em__set_error(EM_ERR_INVALID, "%s: batch (%lld) and vocab (%lld) must be >= 1", fn, (long long)batch, (long long)vocab);
    if (!(s->temperature >= 0) || !isfinite(s->temperature))
        return em__set_error(EM_ERR_INVALID, "%s: temperature must be a finite number >= 0 (0 = greedy), got %g", fn, s->temperature);
    if (s->top_k < 0) return em__set_error(EM_ERR_INVALID, "%s: top_k must be >= 0 (0 = off), got %lld", fn, (long long)s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return em__set_error(EM_ERR_INVALID, "%s: top_p must be in (0, 1] (1 = off), got %g", fn, s->top_p);
    for (int64_t b = 0; b < batch; b++) { /* every row checked before anything is written */
        const float *l = logits + b * vocab;
        bool any = false;
        for (int64_t i = 0; i < vocab; i++) {
            if (isnan(l[i]) || l[i] == INFINITY)
                return em__set_error(EM_ERR_INVALID, "%s: row %lld: logit of id %lld is %g (NaN and +inf cannot be sampled)", fn,
                                     (long long)b, (long long)i, (double)l[i]);
            any = any || l[i] != -INFINITY;
        }
        if (!any) return em__set_error(EM_ERR_INVALID, "%s: row %lld: every logit is -inf: nothing can be drawn", fn, (long long)b);
    }
    if (s->temperature == 0) { /* greedy: the first maximum, no draw */
        for (int64_t b = 0; b < batch; b++) {
            const float *l = logits + b * vocab;
            int64_t best = 0;
            for (int64_t i = 1; i < vocab; i++)
                if (l[i] > l[best]) best = i;
            out[b] = best;
        }
        return EM_OK;
    }
    const bool use_k = s->top_k > 0 && s->top_k < vocab, use_p = s->top_p < 1;
    double *w = malloc(sizeof(double) * (size_t)vocab);
    double *srt = use_k ? malloc(sizeof(double) * (size_t)vocab) : NULL;
    wid *ord = use_p ? malloc(sizeof(wid) * (size_t)vocab) : NULL;
    if (!w || (use_k && !srt) || (use_p && !ord)) {
        free(w);
        free(srt);
        free(ord);
        return em__set_error(EM_ERR_NOMEM, "%s: out of memory (vocab %lld)", fn, (long long)vocab);
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *l = logits + b * vocab;
        double mx = -INFINITY;
        for (int64_t i = 0; i < vocab; i++) mx = fmax(mx, (double)l[i]);
        /* TopKLogitsWarper: remove scores < the k-th largest (dividing by
         * temperature > 0 keeps the order, so compared on the logits) */
        double thr = -INFINITY;
        if (use_k) {
            for (int64_t i = 0; i < vocab; i++) srt[i] = (double)l[i];
            qsort(srt, (size_t)vocab, sizeof *srt, dbl_desc);
            thr = srt[s->top_k - 1];
        }
        /* weights exp(s_i - max s) with s = logit / temperature */
        double z = 0;
        for (int64_t i = 0; i < vocab; i++) {
            w[i] = (double)l[i] < thr ? 0.0 : exp(((double)l[i] - mx) / s->temperature);
            z += w[i];
        }
        if (use_p) { /* TopPLogitsWarper: keep rank r iff the ranks before it sum to < top_p */
            for (int64_t i = 0; i < vocab; i++) ord[i] = (wid){w[i], i};
            qsort(ord, (size_t)vocab, sizeof *ord, wid_desc);
            double cum = 0;
            for (int64_t r = 0; r < vocab; r++) {
                const bool keep = r == 0 || cum < s->top_p;
                cum += ord[r].w / z;
                if (!keep) w[ord[r].id] = 0.0;
            }
            z = 0;
            for (int64_t i = 0; i < vocab; i++) z += w[i];
        }
        /* multinomial: inverse CDF in id order */
        const double target = (double)(sm64(rng) >> 11) * 0x1.0p-53 * z;
        double acc = 0;
        int64_t pick = -1;
        for (int64_t i = 0; i < vocab; i++) {
            if (w[i] <= 0) continue;
            pick = i; /* the last id with weight when rounding leaves acc <= target */
            acc += w[i];
            if (acc > target) break;
        }
        out[b] = pick;
    }
    free(w);
    free(srt);
    free(ord);
    return EM_OK;
}

/* ---- the decoding loop ------------------------------------------------------------------------ */

em_generate_opts em_generate_opts_default(void)
{
    em_generate_opts o;
    memset(&o, 0, sizeof o);
    o.max_new_tokens = 1;
    o.sampling = em_sampling_default();
    return o;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The first position >= from where stop[0..sl) occurs in t[0..n), or -1. */
static int64_t find_stop(const char *t, size_t n, size_t from, const char *stop, size_t sl)
{
    for (size_t p = from; p + sl <= n; p++)
        if (t[p] == stop[0] && !memcmp(t + p, stop, sl)) return (int64_t)p;
    return -1;
}

/* The longest h < sl with t[n-h..n) == stop[0..h): bytes that may begin the stop string. */
static size_t stop_overlap(const char *t, size_t n, const char *stop, size_t sl)
{
    for (size_t h = sl - 1 < n ? sl - 1 : n; h > 0; h--)
        if (!memcmp(t + n - h, stop, h)) return h;
    return 0;
}

em_status em_gpt2_generate(em_module *gpt, const int64_t *prompt, int64_t n_prompt, const em_generate_opts *o, int64_t *out,
                           em_generate_result *res)
{
    static const char *fn = "em_gpt2_generate";
    em_generate_result rr = {.prompt_tokens = n_prompt, .stopped = EM_GENERATE_MAX_TOKENS};
    if (res) *res = rr;
    if (!gpt || !prompt || !o) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !gpt ? "model" : !prompt ? "prompt" : "opts");
    em_gpt2_config cfg;
    if (em_gpt2_get_config(gpt, &cfg) != EM_OK)
        return em__set_error(EM_ERR_INVALID, "%s: module is %s, not a GPT2LMHeadModel", fn, em_module_type_name(gpt));
    if (n_prompt < 1) return em__set_error(EM_ERR_INVALID, "%s: the prompt needs at least one token, got %lld", fn, (long long)n_prompt);
    if (o->max_new_tokens < 1)
        return em__set_error(EM_ERR_INVALID, "%s: max_new_tokens must be >= 1, got %lld", fn, (long long)o->max_new_tokens);
    if (n_prompt > cfg.n_positions || o->max_new_tokens > cfg.n_positions - n_prompt)
        return em__set_error(EM_ERR_INVALID,
                             "%s: prompt (%lld tokens) + max_new_tokens (%lld) exceeds the model's n_positions = %lld (at most %lld "
                             "new tokens after this prompt)",
                             fn, (long long)n_prompt, (long long)o->max_new_tokens, (long long)cfg.n_positions,
                             (long long)(cfg.n_positions - n_prompt > 0 ? cfg.n_positions - n_prompt : 0));
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
            return em__set_error(EM_ERR_INVALID, "%s: prompt token %lld is id %lld, outside the vocabulary [0, %lld)", fn, (long long)i,
                                 (long long)prompt[i], (long long)cfg.vocab_size);
    if (o->vocab_limit < 0 || o->vocab_limit > cfg.vocab_size)
        return em__set_error(EM_ERR_INVALID, "%s: vocab_limit must be in [0, vocab_size = %lld], got %lld", fn, (long long)cfg.vocab_size,
                             (long long)o->vocab_limit);
    { /* the sampling options, checked before anything runs (one dummy row: no draw is kept) */
        const float zero = 0.0f;
        uint64_t scratch = 0;
        int64_t dummy;
        if (em_sample_logits(&zero, 1, 1, &o->sampling, &scratch, &dummy) != EM_OK) return em_last_status();
    }
    const size_t sl = o->stop ? strlen(o->stop) : 0;
    if (sl && !o->token_bytes) return em__set_error(EM_ERR_INVALID, "%s: a stop string needs a token_bytes function", fn);
    const int64_t V = cfg.vocab_size, Vs = o->vocab_limit ? o->vocab_limit : V, max_new = o->max_new_tokens;
    em_gpt2_cache *c = em_gpt2_cache_new(gpt, 1, n_prompt + max_new);
    float *row = malloc(sizeof(float) * (size_t)V);
    if (!c || !row) {
        em_gpt2_cache_free(c);
        free(row);
        return c ? em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn) : em_last_status();
    }
    char *txt = NULL; /* the generated text so far (with token_bytes) */
    size_t tlen = 0, tcap = 0, emitted = 0;
    uint64_t rng = o->seed;
    em_status st = EM_OK;
    const double t0 = now_s();
    double t1 = t0;
    int64_t n = 0, id = -1;
    for (;;) {
        /* one forward: the prompt first (prefill), then the last token drawn */
        em_scope_begin();
        const int64_t T = n == 0 ? n_prompt : 1, shape[2] = {1, T};
        em_tensor *logits = forward_cached(gpt, c, em_from_host(n == 0 ? prompt : &id, shape, 2, EM_I64), true); /* [1, 1, V] */
        st = logits ? em_to_host(logits, row, sizeof(float) * (size_t)V) : em_last_status();
        em_scope_end();
        if (st == EM_OK) st = em_sample_logits(row, 1, Vs, &o->sampling, &rng, &id);
        if (st != EM_OK) break;
        if (out) out[n] = id;
        n++;
        if (n == 1) t1 = now_s();
        const char *piece = NULL;
        size_t plen = 0;
        int64_t at = -1;
        if (o->token_bytes) {
            size_t bl = 0;
            const char *by = o->token_bytes(id, &bl, o->token_bytes_ud);
            if (!by) {
                st = em_last_status() != EM_OK ? em_last_status() : em__set_error(EM_ERR_INVALID, "%s: no bytes for token %lld", fn,
                                                                                    (long long)id);
                break;
            }
            if (tlen + bl + 1 > tcap) {
                size_t nc = (tlen + bl + 1) * 2;
                char *nt = realloc(txt, nc);
                if (!nt) {
                    st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn);
                    break;
                }
                txt = nt;
                tcap = nc;
            }
            const size_t old = tlen;
            memcpy(txt + tlen, by, bl);
            tlen += bl;
            size_t upto = tlen; /* what is final now */
            if (sl) {
                /* not found before: a new occurrence ends after old */
                at = find_stop(txt, tlen, old >= sl - 1 ? old - (sl - 1) : 0, o->stop, sl);
                if (at >= 0) upto = (size_t)at;
                else if (n < max_new) upto = tlen - stop_overlap(txt, tlen, o->stop, sl);
            }
            if (upto < emitted) upto = emitted;
            piece = txt + emitted;
            plen = upto - emitted;
            emitted = upto;
        }
        const int r = o->on_token ? o->on_token(id, piece, plen, o->on_token_ud) : 0;
        if (at >= 0) {
            rr.stopped = EM_GENERATE_STOP_STRING;
            break;
        }
        if (r) {
            rr.stopped = EM_GENERATE_CALLBACK;
            break;
        }
        if (n == max_new) break;
    }
    const double t2 = now_s();
    rr.new_tokens = n;
    rr.prefill_s = (n ? t1 : t2) - t0;
    rr.decode_s = n ? t2 - t1 : 0;
    if (res) *res = rr;
    free(txt);
    free(row);
    em_gpt2_cache_free(c);
    return st;
}
