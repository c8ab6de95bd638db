/* Attention and transformer modules (issue #16, part: attention modules):
 * em_scaled_dot_product_attention, MultiheadAttention, and Hugging Face's
 * GPT-2 (Conv1D, GPT2Block, GPT2LMHeadModel). Scaled-dot-product attention
 * runs the fused SDPA op (tasks/attention.c) where it can and otherwise the
 * composed math path (em__sdpa_math: matmul, masked_fill, softmax, dropout),
 * which the fused op is checked against; the rest is composed from ordinary
 * ops, so autodiff covers it. */
#include "nn/nn_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new float32 zero tensor owned by the caller whatever scope is open. */
static em_tensor *tf_new_param(const int64_t *shape, int ndim)
{
    em_scope_begin();
    em_tensor *t = em_zeros(shape, ndim, EM_F32);
    if (t) em_tensor_retain(t);
    em_scope_end();
    return t;
}

/* Registers a new zero parameter [shape] under name, N(0, std^2) when std > 0,
 * and returns it (borrowed from the module) or NULL. */
static em_tensor *tf_param(em_module *m, const char *name, const int64_t *shape, int ndim, double std)
{
    em_tensor *t = tf_new_param(shape, ndim);
    if (!t) return NULL;
    em_status st = std > 0 ? em_init_normal_(t, 0.0, std) : EM_OK;
    if (st == EM_OK) st = em_module_add_param(m, name, t);
    em_tensor_release(t);
    return st == EM_OK ? t : NULL;
}

/* ---- scaled dot-product attention ---------------------------------------------- */

/* EMBER_SDPA=math (read once): every call takes the composed math path. */
static bool sdpa_env_math(void)
{
    static int v = -1;
    int c = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (c < 0) {
        const char *e = getenv("EMBER_SDPA");
        c = e && !strcmp(e, "math");
        __atomic_store_n(&v, c, __ATOMIC_RELAXED);
    }
    return c != 0;
}

/* The fused op (tasks/attention.c) takes the call unless the mask needs a
 * gradient (the fused backward gives none), a head dim exceeds 256 (the
 * kernels' limit), q, k, v differ in dtype (the composed path promotes), a
 * dim is empty, or EMBER_SDPA=math. */
static bool sdpa_fused_ok(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask)
{
    if (sdpa_env_math()) return false;
    if (mask && em_requires_grad(mask)) return false;
    if (em_tensor_dtype(k) != em_tensor_dtype(q) || em_tensor_dtype(v) != em_tensor_dtype(q)) return false;
    if (em_tensor_dim(q, -1) > 256 || em_tensor_dim(v, -1) > 256) return false;
    return em_tensor_numel(q) > 0 && em_tensor_numel(k) > 0 && em_tensor_numel(v) > 0;
}

em_tensor *em_scaled_dot_product_attention(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask,
                                           bool is_causal, double dropout_p, double scale, bool training)
{
    static const char *fn = "em_scaled_dot_product_attention";
    if (!q || !k || !v) return em__fail(EM_ERR_INVALID, "%s: %s is NULL", fn, !q ? "query" : !k ? "key" : "value");
    char sq[160], sk[160], sv[160], sm[160];
    const int nd = em_tensor_ndim(q);
    if (nd < 2 || em_tensor_ndim(k) != nd || em_tensor_ndim(v) != nd)
        return em__fail(EM_ERR_SHAPE, "%s: query, key and value must have one rank >= 2, got query %s, key %s, value %s", fn,
                        NN_SHAPE(q, sq), NN_SHAPE(k, sk), NN_SHAPE(v, sv));
    for (int d = 0; d < nd - 2; d++)
        if (em_tensor_dim(q, d) != em_tensor_dim(k, d) || em_tensor_dim(q, d) != em_tensor_dim(v, d))
            return em__fail(EM_ERR_SHAPE, "%s: leading dims differ: query %s, key %s, value %s", fn, NN_SHAPE(q, sq), NN_SHAPE(k, sk),
                            NN_SHAPE(v, sv));
    if (em_tensor_dim(q, -1) != em_tensor_dim(k, -1))
        return em__fail(EM_ERR_SHAPE, "%s: query %s and key %s have different head dims", fn, NN_SHAPE(q, sq), NN_SHAPE(k, sk));
    if (em_tensor_dim(k, -2) != em_tensor_dim(v, -2))
        return em__fail(EM_ERR_SHAPE, "%s: key %s and value %s have different lengths", fn, NN_SHAPE(k, sk), NN_SHAPE(v, sv));
    if (!em_dtype_is_float(em_tensor_dtype(q)) || !em_dtype_is_float(em_tensor_dtype(k)) || !em_dtype_is_float(em_tensor_dtype(v)))
        return em__fail(EM_ERR_DTYPE, "%s: query, key and value must be float, got %s, %s, %s", fn, em_dtype_name(em_tensor_dtype(q)),
                        em_dtype_name(em_tensor_dtype(k)), em_dtype_name(em_tensor_dtype(v)));
    if (!(dropout_p >= 0 && dropout_p <= 1)) return em__fail(EM_ERR_INVALID, "%s: dropout_p must be in [0, 1], got %g", fn, dropout_p);
    const int64_t tq = em_tensor_dim(q, -2), tk = em_tensor_dim(k, -2);
    if (mask) {
        if (is_causal) return em__fail(EM_ERR_INVALID, "%s: an explicit mask together with is_causal (torch raises too)", fn);
        const em_dtype mdt = em_tensor_dtype(mask);
        if (mdt != EM_BOOL && !em_dtype_is_float(mdt))
            return em__fail(EM_ERR_DTYPE, "%s: mask must be bool (true = take part) or float (additive), got %s", fn, em_dtype_name(mdt));
        const int mnd = em_tensor_ndim(mask);
        bool ok = mnd <= nd;
        for (int i = 1; ok && i <= mnd; i++) {
            int64_t want = i == 1 ? tk : i == 2 ? tq : em_tensor_dim(q, nd - i);
            int64_t got = em_tensor_dim(mask, mnd - i);
            ok = got == 1 || got == want;
        }
        if (!ok) {
            int64_t ss[EM_MAX_DIMS];
            memcpy(ss, em_tensor_shape(q), sizeof(int64_t) * (size_t)nd);
            ss[nd - 1] = tk;
            return em__fail(EM_ERR_SHAPE, "%s: mask of shape %s does not broadcast to the scores %s", fn, NN_SHAPE(mask, sm),
                            em_shape_str(ss, nd, sk, sizeof sk));
        }
    }
    if (!(scale > 0)) scale = 1.0 / sqrt((double)em_tensor_dim(q, -1)); /* torch: scale=None */
    if (sdpa_fused_ok(q, k, v, mask)) return em__sdpa(q, k, v, mask, is_causal, dropout_p, scale, training);
    return em__sdpa_math(q, k, v, mask, is_causal, dropout_p, scale, training);
}

/* The composed math path (checked inputs, scale resolved). */
em_tensor *em__sdpa_math(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask, bool is_causal,
                         double dropout_p, double scale, bool training)
{
    const int64_t tq = em_tensor_dim(q, -2), tk = em_tensor_dim(k, -2);
    em_scope_begin();
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), scale);
    if (is_causal) {
        /* keep j <= i: torch.ones(L, S).tril(diagonal=0), top-left aligned */
        int64_t col[2] = {1, tk}, row[2] = {tq, 1};
        em_tensor *j = em_reshape(em_arange(0, (double)tk, 1, EM_I64), col, 2);
        em_tensor *i = em_reshape(em_arange(0, (double)tq, 1, EM_I64), row, 2);
        s = em_masked_fill(s, em_gt(j, i), -INFINITY);
    } else if (mask && em_tensor_dtype(mask) == EM_BOOL) {
        s = em_masked_fill(s, em_logical_not(mask), -INFINITY);
    } else if (mask) {
        s = em_add(s, mask);
    }
    em_tensor *p = em_softmax(s, -1);
    if (training && dropout_p > 0) p = em_dropout(p, dropout_p, true);
    return nn_return(em_matmul(p, v));
}

/* ---- MultiheadAttention ----------------------------------------------------------- */

typedef struct mha_impl {
    int64_t embed_dim, num_heads;
    double dropout;
    bool batch_first;
    em_tensor *in_w, *in_b; /* borrowed */
    em_module *out_proj;    /* borrowed child */
} mha_impl;

static em_tensor *mha_forward_self(em_module *m, const em_tensor *x) { return em_multihead_attention_forward(m, x, x, x, NULL, NULL); }

static const em_module_vtable MHA_VT = {"MultiheadAttention", mha_forward_self, free};

em_module *em_multihead_attention_new(int64_t embed_dim, int64_t num_heads, double dropout, bool bias, bool batch_first)
{
    if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads)
        return em__fail(EM_ERR_INVALID, "em_multihead_attention_new: embed_dim (%lld) must be a positive multiple of num_heads (%lld)",
                        (long long)embed_dim, (long long)num_heads);
    if (!(dropout >= 0 && dropout <= 1))
        return em__fail(EM_ERR_INVALID, "em_multihead_attention_new: dropout must be in [0, 1], got %g", dropout);
    mha_impl *a = calloc(1, sizeof *a);
    if (!a) return em__fail(EM_ERR_NOMEM, "em_multihead_attention_new: out of memory");
    a->embed_dim = embed_dim;
    a->num_heads = num_heads;
    a->dropout = dropout;
    a->batch_first = batch_first;
    em_module *m = em_module_new(&MHA_VT, a);
    if (!m) {
        free(a);
        return NULL;
    }
    int64_t ws[2] = {3 * embed_dim, embed_dim};
    /* torch MultiheadAttention._reset_parameters: xavier_uniform_(in_proj_weight),
     * in_proj_bias and out_proj.bias zero, out_proj.weight keeps Linear's init */
    a->in_w = tf_param(m, "in_proj_weight", ws, 2, 0);
    em_status st = a->in_w ? em_init_xavier_uniform_(a->in_w, 1.0) : em_last_status();
    if (st == EM_OK && bias) {
        a->in_b = tf_param(m, "in_proj_bias", ws, 1, 0);
        if (!a->in_b) st = em_last_status();
    }
    if (st == EM_OK) {
        em_module *op = em_linear_new(embed_dim, embed_dim, bias);
        st = op ? em_module_add_child(m, "out_proj", op) : em_last_status();
        if (st == EM_OK) {
            a->out_proj = op;
            if (bias) st = em_init_zeros_(em_module_get_param(op, "bias"));
        }
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* Checks a MHA mask's dtype (bool or float). */
static bool mha_mask_dtype_ok(const em_tensor *mk)
{
    return !mk || em_tensor_dtype(mk) == EM_BOOL || em_dtype_is_float(em_tensor_dtype(mk));
}

/* torch's MHA mask (bool: true = masked) as an additive float mask (inside a scope). */
static em_tensor *mha_additive(const em_tensor *mk, em_dtype dt)
{
    if (em_tensor_dtype(mk) != EM_BOOL) return (em_tensor *)mk;
    return em_masked_fill(em_zeros(em_tensor_shape(mk), em_tensor_ndim(mk), dt), mk, -INFINITY);
}

em_tensor *em_multihead_attention_forward(em_module *m, const em_tensor *query, const em_tensor *key, const em_tensor *value,
                                          const em_tensor *key_padding_mask, const em_tensor *attn_mask)
{
    static const char *fn = "MultiheadAttention";
    if (!m || em__module_vtable(m) != &MHA_VT)
        return em__fail(EM_ERR_INVALID, "em_multihead_attention_forward: module is %s, not a MultiheadAttention",
                        m ? em_module_type_name(m) : "NULL");
    if (!query) return em__fail(EM_ERR_INVALID, "%s: query is NULL", fn);
    if (!key) key = query;
    if (!value) value = key;
    mha_impl *a = em_module_impl(m);
    const int64_t E = a->embed_dim, H = a->num_heads, hd = E / H;
    char s1[160], s2[160], s3[160];
    if (em_tensor_ndim(query) != 3 || em_tensor_ndim(key) != 3 || em_tensor_ndim(value) != 3)
        return em__fail(EM_ERR_SHAPE, "%s: expected batched rank-3 query, key, value, got %s, %s, %s", fn, NN_SHAPE(query, s1),
                        NN_SHAPE(key, s2), NN_SHAPE(value, s3));
    const int bd = a->batch_first ? 0 : 1, td = 1 - bd;
    const int64_t B = em_tensor_dim(query, bd), L = em_tensor_dim(query, td), S = em_tensor_dim(key, td);
    if (em_tensor_dim(query, 2) != E || em_tensor_dim(key, 2) != E || em_tensor_dim(value, 2) != E)
        return em__fail(EM_ERR_SHAPE, "%s: query %s, key %s, value %s must end with embed_dim = %lld", fn, NN_SHAPE(query, s1),
                        NN_SHAPE(key, s2), NN_SHAPE(value, s3), (long long)E);
    if (em_tensor_dim(key, bd) != B || em_tensor_dim(value, bd) != B || em_tensor_dim(value, td) != S)
        return em__fail(EM_ERR_SHAPE, "%s: batch or length mismatch: query %s, key %s, value %s (batch_first %d)", fn,
                        NN_SHAPE(query, s1), NN_SHAPE(key, s2), NN_SHAPE(value, s3), (int)a->batch_first);
    if (!mha_mask_dtype_ok(key_padding_mask) || !mha_mask_dtype_ok(attn_mask))
        return em__fail(EM_ERR_DTYPE, "%s: masks must be bool or float", fn);
    if (key_padding_mask &&
        (em_tensor_ndim(key_padding_mask) != 2 || em_tensor_dim(key_padding_mask, 0) != B || em_tensor_dim(key_padding_mask, 1) != S))
        return em__fail(EM_ERR_SHAPE, "%s: key_padding_mask of shape %s, expected [%lld, %lld]", fn, NN_SHAPE(key_padding_mask, s1),
                        (long long)B, (long long)S);
    if (attn_mask) {
        const int an = em_tensor_ndim(attn_mask);
        bool ok = (an == 2 && em_tensor_dim(attn_mask, 0) == L && em_tensor_dim(attn_mask, 1) == S) ||
                  (an == 3 && em_tensor_dim(attn_mask, 0) == B * H && em_tensor_dim(attn_mask, 1) == L && em_tensor_dim(attn_mask, 2) == S);
        if (!ok)
            return em__fail(EM_ERR_SHAPE, "%s: attn_mask of shape %s, expected [%lld, %lld] or [%lld, %lld, %lld]", fn,
                            NN_SHAPE(attn_mask, s1), (long long)L, (long long)S, (long long)(B * H), (long long)L, (long long)S);
    }
    em_scope_begin();
    const em_tensor *qb = query, *kb = key, *vb = value;
    if (!a->batch_first) { /* [T, B, E] -> [B, T, E] */
        qb = em_transpose(query, 0, 1);
        kb = em_transpose(key, 0, 1);
        vb = em_transpose(value, 0, 1);
    }
    /* in projection: rows [0, E) of in_proj_weight for q, [E, 2E) k, [2E, 3E) v */
    const em_tensor *xs[3] = {qb, kb, vb};
    const int64_t lens[3] = {L, S, S};
    em_tensor *heads[3];
    static const int to_heads[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++) {
        em_tensor *w = em_narrow(a->in_w, 0, i * E, E);
        em_tensor *b = a->in_b ? em_narrow(a->in_b, 0, i * E, E) : NULL;
        int64_t hs[4] = {B, lens[i], H, hd};
        heads[i] = em_permute(em_reshape(em_contiguous(em_linear(xs[i], w, b)), hs, 4), to_heads, 4); /* [B, H, T, hd] */
    }
    em_tensor *bias = NULL; /* additive [B, H, L, S] pieces, broadcast */
    const em_dtype dt = em_tensor_dtype(query);
    if (attn_mask) {
        em_tensor *am = mha_additive(attn_mask, dt);
        if (em_tensor_ndim(am) == 3) {
            int64_t s4[4] = {B, H, L, S};
            am = em_reshape(em_contiguous(am), s4, 4);
        }
        bias = am;
    }
    if (key_padding_mask) {
        int64_t s4[4] = {B, 1, 1, S};
        em_tensor *kp = em_reshape(em_contiguous(mha_additive(key_padding_mask, dt)), s4, 4);
        bias = bias ? em_add(bias, kp) : kp;
    }
    em_tensor *o = em_scaled_dot_product_attention(heads[0], heads[1], heads[2], bias, false, a->dropout, 1.0 / sqrt((double)hd),
                                                   em_module_is_training(m));
    int64_t flat[3] = {B, L, E};
    o = em_reshape(em_contiguous(em_permute(o, to_heads, 4)), flat, 3); /* [B, L, E] */
    o = em_module_forward(a->out_proj, o);
    if (!a->batch_first) o = em_transpose(o, 0, 1);
    return nn_return(o);
}

bool em__mha_settings(const em_module *m, int64_t *embed_dim, int64_t *num_heads, double *dropout, bool *batch_first)
{
    if (!m || em__module_vtable(m) != &MHA_VT) return false;
    const mha_impl *a = em_module_impl(m);
    *embed_dim = a->embed_dim;
    *num_heads = a->num_heads;
    *dropout = a->dropout;
    *batch_first = a->batch_first;
    return true;
}

/* ---- GPT-2 (Hugging Face layouts) ---------------------------------------------------- */

typedef struct conv1d_impl {
    int64_t nx, nf;
    em_tensor *weight, *bias;
} conv1d_impl;

static em_tensor *conv1d_forward(em_module *m, const em_tensor *x)
{
    conv1d_impl *c = em_module_impl(m);
    char sx[160];
    if (!x) return em__fail(EM_ERR_INVALID, "Conv1D: input is NULL");
    if (em_tensor_ndim(x) < 1 || em_tensor_dim(x, -1) != c->nx)
        return em__fail(EM_ERR_SHAPE, "Conv1D: input of shape %s does not end with nx = %lld", NN_SHAPE(x, sx), (long long)c->nx);
    em_scope_begin();
    return nn_return(em_add(em_matmul(x, c->weight), c->bias)); /* HF: addmm(bias, x, weight) */
}

static const em_module_vtable CONV1D_VT = {"Conv1D", conv1d_forward, free};

em_module *em_gpt2_conv1d_new(int64_t nx, int64_t nf)
{
    if (nx < 0 || nf < 0)
        return em__fail(EM_ERR_INVALID, "em_gpt2_conv1d_new: nx (%lld) and nf (%lld) must be >= 0", (long long)nx, (long long)nf);
    conv1d_impl *c = calloc(1, sizeof *c);
    if (!c) return em__fail(EM_ERR_NOMEM, "em_gpt2_conv1d_new: out of memory");
    c->nx = nx;
    c->nf = nf;
    em_module *m = em_module_new(&CONV1D_VT, c);
    if (!m) {
        free(c);
        return NULL;
    }
    int64_t ws[2] = {nx, nf};
    c->weight = tf_param(m, "weight", ws, 2, 0.02);
    c->bias = c->weight ? tf_param(m, "bias", &ws[1], 1, 0) : NULL;
    if (!c->bias) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_gpt2_config em_gpt2_config_default(void)
{
    em_gpt2_config c = {50257, 1024, 768, 12, 12, 0.1, 1e-5};
    return c;
}

em_status em_gpt2_config_format(const em_gpt2_config *cfg, char *buf, size_t n)
{
    if (!cfg || !buf) return em__set_error(EM_ERR_INVALID, "em_gpt2_config_format: %s is NULL", !cfg ? "config" : "buffer");
    const int w = snprintf(buf, n, "gpt:vocab_size=%lld,n_positions=%lld,n_embd=%lld,n_layer=%lld,n_head=%lld,dropout=%.17g,"
                           "layer_norm_epsilon=%.17g", (long long)cfg->vocab_size, (long long)cfg->n_positions,
                           (long long)cfg->n_embd, (long long)cfg->n_layer, (long long)cfg->n_head, cfg->dropout,
                           cfg->layer_norm_epsilon);
    if (w < 0 || (size_t)w >= n) {
        if (n) buf[0] = 0;
        return em__set_error(EM_ERR_INVALID, "em_gpt2_config_format: buffer of %zu bytes is too small (%d needed)", n, w + 1);
    }
    return EM_OK;
}

em_status em_gpt2_config_parse(const char *s, em_gpt2_config *out)
{
    static const char *fn = "em_gpt2_config_parse";
    if (!s || !out) return em__set_error(EM_ERR_INVALID, "%s: %s is NULL", fn, !s ? "text" : "config");
    if (strncmp(s, "gpt:", 4) != 0) return em__set_error(EM_ERR_INVALID, "%s: '%.40s' does not start with 'gpt:'", fn, s);
    static const char *const keys[] = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "dropout", "layer_norm_epsilon"};
    em_gpt2_config c = em_gpt2_config_default();
    int64_t *ints[] = {&c.vocab_size, &c.n_positions, &c.n_embd, &c.n_layer, &c.n_head};
    double *dbls[] = {&c.dropout, &c.layer_norm_epsilon};
    unsigned seen = 0;
    const char *p = s + 4;
    while (*p) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        if (!eq || eq > end) return em__set_error(EM_ERR_INVALID, "%s: '%.*s' is not key=value", fn, (int)(end - p), p);
        int ki = -1;
        for (int i = 0; i < 7; i++)
            if ((size_t)(eq - p) == strlen(keys[i]) && !strncmp(p, keys[i], (size_t)(eq - p))) ki = i;
        if (ki < 0) return em__set_error(EM_ERR_INVALID, "%s: unknown key '%.*s'", fn, (int)(eq - p), p);
        if (seen & (1u << ki)) return em__set_error(EM_ERR_INVALID, "%s: key '%s' given twice", fn, keys[ki]);
        seen |= 1u << ki;
        char num[64];
        const size_t len = (size_t)(end - eq - 1);
        if (len == 0 || len >= sizeof num) return em__set_error(EM_ERR_INVALID, "%s: bad value for '%s'", fn, keys[ki]);
        memcpy(num, eq + 1, len);
        num[len] = 0;
        char *stop = NULL;
        errno = 0;
        if (ki < 5) {
            const long long v = strtoll(num, &stop, 10);
            if (*stop || errno || v < 0 || v > ((int64_t)1 << 40))
                return em__set_error(EM_ERR_INVALID, "%s: bad integer '%s' for '%s'", fn, num, keys[ki]);
            *ints[ki] = v;
        } else {
            const double v = strtod(num, &stop);
            if (*stop || errno || !isfinite(v)) return em__set_error(EM_ERR_INVALID, "%s: bad number '%s' for '%s'", fn, num, keys[ki]);
            *dbls[ki - 5] = v;
        }
        p = *end ? end + 1 : end;
    }
    *out = c;
    return EM_OK;
}

static em_status gpt2_check(const em_gpt2_config *c, const char *fn)
{
    if (!c) return em__set_error(EM_ERR_INVALID, "%s: config is NULL", fn);
    if (c->vocab_size <= 0 || c->n_positions <= 0 || c->n_embd <= 0 || c->n_layer < 0 || c->n_head <= 0 || c->n_embd % c->n_head)
        return em__set_error(EM_ERR_INVALID,
                             "%s: bad config: vocab_size %lld, n_positions %lld, n_embd %lld, n_layer %lld, n_head %lld (positive; "
                             "n_head divides n_embd)",
                             fn, (long long)c->vocab_size, (long long)c->n_positions, (long long)c->n_embd, (long long)c->n_layer,
                             (long long)c->n_head);
    if (!(c->dropout >= 0 && c->dropout <= 1) || !(c->layer_norm_epsilon >= 0))
        return em__set_error(EM_ERR_INVALID, "%s: dropout (%g) must be in [0, 1] and layer_norm_epsilon (%g) >= 0", fn, c->dropout,
                             c->layer_norm_epsilon);
    return EM_OK;
}

typedef struct gpt2_block_impl {
    em_gpt2_config cfg;
} gpt2_block_impl;

#define CHILD(m, key) em_module_get_child((m), (key))

static em_tensor *gpt2_block_forward(em_module *m, const em_tensor *x)
{
    gpt2_block_impl *bi = em_module_impl(m);
    const int64_t E = bi->cfg.n_embd, H = bi->cfg.n_head;
    char sx[160];
    if (!x) return em__fail(EM_ERR_INVALID, "GPT2Block: input is NULL");
    if (em_tensor_ndim(x) != 3 || em_tensor_dim(x, 2) != E)
        return em__fail(EM_ERR_SHAPE, "GPT2Block: input of shape %s, expected [B, T, %lld]", NN_SHAPE(x, sx), (long long)E);
    const bool tr = em_module_is_training(m);
    const double p = bi->cfg.dropout;
    const int64_t B = em_tensor_dim(x, 0), T = em_tensor_dim(x, 1);
    static const int to_heads[4] = {0, 2, 1, 3};
    em_scope_begin();
    /* attention: qkv = c_attn(ln_1(x)) split along the last dim as HF (q | k | v) */
    em_tensor *qkv = em_module_forward(CHILD(m, "attn.c_attn"), em_module_forward(CHILD(m, "ln_1"), x));
    em_tensor *hh[3];
    for (int i = 0; i < 3; i++) {
        int64_t hs[4] = {B, T, H, E / H};
        hh[i] = em_permute(em_reshape(em_contiguous(em_narrow(qkv, 2, i * E, E)), hs, 4), to_heads, 4);
    }
    em_tensor *o = em_scaled_dot_product_attention(hh[0], hh[1], hh[2], NULL, true, p, 0, tr);
    int64_t flat[3] = {B, T, E};
    o = em_reshape(em_contiguous(em_permute(o, to_heads, 4)), flat, 3);
    o = em_dropout(em_module_forward(CHILD(m, "attn.c_proj"), o), p, tr);
    em_tensor *h = em_add(x, o);
    /* MLP with HF's gelu_new (the tanh approximation) */
    em_tensor *f = em_gelu_tanh(em_module_forward(CHILD(m, "mlp.c_fc"), em_module_forward(CHILD(m, "ln_2"), h)));
    f = em_dropout(em_module_forward(CHILD(m, "mlp.c_proj"), f), p, tr);
    return nn_return(em_add(h, f));
}

static const em_module_vtable GPT2_BLOCK_VT = {"GPT2Block", gpt2_block_forward, free};
static const em_module_vtable GPT2_ATTN_VT = {"GPT2Attention", NULL, NULL};
static const em_module_vtable GPT2_MLP_VT = {"GPT2MLP", NULL, NULL};
static const em_module_vtable MODULE_LIST_VT = {"ModuleList", NULL, NULL};
static const em_module_vtable GPT2_MODEL_VT = {"GPT2Model", NULL, NULL};

/* Re-draws a Conv1D weight N(0, std^2). */
static em_status renormal(em_module *m, const char *key, double std)
{
    em_tensor *w = em_module_get_param(m, key);
    return w ? em_init_normal_(w, 0.0, std) : em_last_status();
}

static em_module *layer_norm_e(const em_gpt2_config *c) { return em_layer_norm_new(&c->n_embd, 1, c->layer_norm_epsilon, true); }

em_module *em_gpt2_block_new(const em_gpt2_config *cfg)
{
    if (gpt2_check(cfg, "em_gpt2_block_new") != EM_OK) return NULL;
    const int64_t E = cfg->n_embd;
    gpt2_block_impl *bi = calloc(1, sizeof *bi);
    if (!bi) return em__fail(EM_ERR_NOMEM, "em_gpt2_block_new: out of memory");
    bi->cfg = *cfg;
    em_module *m = em_module_new(&GPT2_BLOCK_VT, bi);
    if (!m) {
        free(bi);
        return NULL;
    }
    em_module *attn = em_module_new(&GPT2_ATTN_VT, NULL), *mlp = em_module_new(&GPT2_MLP_VT, NULL);
    em_status st = em_module_add_child(m, "ln_1", layer_norm_e(cfg));
    if (st == EM_OK) st = em_module_add_child(attn, "c_attn", em_gpt2_conv1d_new(E, 3 * E));
    if (st == EM_OK) st = em_module_add_child(attn, "c_proj", em_gpt2_conv1d_new(E, E));
    if (st == EM_OK) {
        st = em_module_add_child(m, "attn", attn);
        attn = NULL;
    }
    if (st == EM_OK) st = em_module_add_child(m, "ln_2", layer_norm_e(cfg));
    if (st == EM_OK) st = em_module_add_child(mlp, "c_fc", em_gpt2_conv1d_new(E, 4 * E));
    if (st == EM_OK) st = em_module_add_child(mlp, "c_proj", em_gpt2_conv1d_new(4 * E, E));
    if (st == EM_OK) {
        st = em_module_add_child(m, "mlp", mlp);
        mlp = NULL;
    }
    /* GPT-2 paper / HF _init_weights: residual projections scaled by 1/sqrt(2 n_layer) */
    const double sp = 0.02 / sqrt(2.0 * (double)(cfg->n_layer > 0 ? cfg->n_layer : 1));
    if (st == EM_OK) st = renormal(m, "attn.c_proj.weight", sp);
    if (st == EM_OK) st = renormal(m, "mlp.c_proj.weight", sp);
    em_module_free(attn);
    em_module_free(mlp);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

typedef struct gpt2_impl {
    em_gpt2_config cfg;
    em_tensor *wte, *wpe; /* borrowed */
} gpt2_impl;

static em_tensor *gpt2_forward(em_module *m, const em_tensor *idx)
{
    gpt2_impl *g = em_module_impl(m);
    char si[160];
    if (!idx) return em__fail(EM_ERR_INVALID, "GPT2LMHeadModel: input is NULL");
    const em_dtype dt = em_tensor_dtype(idx);
    if (dt != EM_I64 && dt != EM_I32)
        return em__fail(EM_ERR_DTYPE, "GPT2LMHeadModel: token ids must be int64 or int32, got %s", em_dtype_name(dt));
    if (em_tensor_ndim(idx) != 2 || em_tensor_dim(idx, 1) > g->cfg.n_positions)
        return em__fail(EM_ERR_SHAPE, "GPT2LMHeadModel: token ids of shape %s, expected [B, T] with T <= n_positions = %lld",
                        NN_SHAPE(idx, si), (long long)g->cfg.n_positions);
    const int64_t T = em_tensor_dim(idx, 1);
    const bool tr = em_module_is_training(m);
    em_module *tf = CHILD(m, "transformer");
    em_scope_begin();
    em_tensor *tok = em_module_forward(CHILD(tf, "wte"), idx);
    em_tensor *pos = em_module_forward(CHILD(tf, "wpe"), em_arange(0, (double)T, 1, EM_I64));
    em_tensor *h = em_dropout(em_add(tok, pos), g->cfg.dropout, tr);
    em_module *blocks = CHILD(tf, "h");
    for (int i = 0; i < em_module_num_children(blocks) && h; i++) h = em_module_forward(em_module_child_at(blocks, i, NULL), h);
    h = em_module_forward(CHILD(tf, "ln_f"), h);
    return nn_return(h ? em_matmul(h, em_transpose(g->wte, 0, 1)) : NULL); /* lm_head tied to wte */
}

static const em_module_vtable GPT2_VT = {"GPT2LMHeadModel", gpt2_forward, free};

em_module *em_gpt2_new(const em_gpt2_config *cfg)
{
    if (gpt2_check(cfg, "em_gpt2_new") != EM_OK) return NULL;
    gpt2_impl *g = calloc(1, sizeof *g);
    if (!g) return em__fail(EM_ERR_NOMEM, "em_gpt2_new: out of memory");
    g->cfg = *cfg;
    em_module *m = em_module_new(&GPT2_VT, g);
    if (!m) {
        free(g);
        return NULL;
    }
    em_module *tf = em_module_new(&GPT2_MODEL_VT, NULL);
    em_module *h = em_module_new(&MODULE_LIST_VT, NULL);
    em_status st = tf && h ? EM_OK : em_last_status();
    if (st == EM_OK) st = em_module_add_child(tf, "wte", em_embedding_new(cfg->vocab_size, cfg->n_embd));
    if (st == EM_OK) st = em_module_add_child(tf, "wpe", em_embedding_new(cfg->n_positions, cfg->n_embd));
    for (int64_t i = 0; st == EM_OK && i < cfg->n_layer; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        st = em_module_add_child(h, name, em_gpt2_block_new(cfg));
    }
    if (st == EM_OK) {
        st = em_module_add_child(tf, "h", h);
        h = NULL;
    }
    if (st == EM_OK) st = em_module_add_child(tf, "ln_f", layer_norm_e(cfg));
    if (st == EM_OK) {
        st = em_module_add_child(m, "transformer", tf);
        tf = NULL;
    }
    if (st == EM_OK) st = renormal(m, "transformer.wte.weight", 0.02);
    if (st == EM_OK) st = renormal(m, "transformer.wpe.weight", 0.02);
    if (st == EM_OK) {
        g->wte = em_module_get_param(m, "transformer.wte.weight");
        g->wpe = em_module_get_param(m, "transformer.wpe.weight");
    }
    em_module_free(tf);
    em_module_free(h);
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- TransformerEncoderLayer / TransformerEncoder (torch.nn, PyTorch 1.13) ------------------ */

em_transformer_encoder_layer_config em_transformer_encoder_layer_config_default(int64_t d_model, int64_t nhead)
{
    em_transformer_encoder_layer_config c = {d_model, nhead, 2048, 0.1, "relu", 1e-5, false, false};
    return c;
}

typedef struct enc_layer_impl {
    em_transformer_encoder_layer_config cfg;
    bool gelu; /* activation: false relu, true exact-erf gelu */
} enc_layer_impl;

em_status em__tf_layer_check(int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout, const char *activation,
                             double layer_norm_eps, const char *fn, bool *gelu)
{
    if (d_model <= 0 || nhead <= 0 || d_model % nhead)
        return em__set_error(EM_ERR_INVALID, "%s: d_model (%lld) must be a positive multiple of nhead (%lld)", fn, (long long)d_model,
                             (long long)nhead);
    if (dim_feedforward <= 0)
        return em__set_error(EM_ERR_INVALID, "%s: dim_feedforward must be > 0, got %lld", fn, (long long)dim_feedforward);
    if (!(dropout >= 0 && dropout <= 1) || !(layer_norm_eps >= 0))
        return em__set_error(EM_ERR_INVALID, "%s: dropout (%g) must be in [0, 1] and layer_norm_eps (%g) >= 0", fn, dropout,
                             layer_norm_eps);
    const char *a = activation ? activation : "relu";
    if (!strcmp(a, "relu"))
        *gelu = false;
    else if (!strcmp(a, "gelu"))
        *gelu = true;
    else
        return em__set_error(EM_ERR_INVALID, "%s: activation should be relu/gelu, not %s", fn, a); /* torch's words */
    return EM_OK;
}

static em_status enc_check(const em_transformer_encoder_layer_config *c, const char *fn, bool *gelu)
{
    if (!c) return em__set_error(EM_ERR_INVALID, "%s: config is NULL", fn);
    return em__tf_layer_check(c->d_model, c->nhead, c->dim_feedforward, c->dropout, c->activation, c->layer_norm_eps, fn, gelu);
}

static em_tensor *enc_layer_forward_plain(em_module *m, const em_tensor *x)
{
    return em_transformer_encoder_layer_forward(m, x, NULL, NULL, false);
}

static const em_module_vtable ENC_LAYER_VT = {"TransformerEncoderLayer", enc_layer_forward_plain, free};

em_module *em_transformer_encoder_layer_new(const em_transformer_encoder_layer_config *cfg)
{
    bool gelu = false;
    if (enc_check(cfg, "em_transformer_encoder_layer_new", &gelu) != EM_OK) return NULL;
    enc_layer_impl *li = calloc(1, sizeof *li);
    if (!li) return em__fail(EM_ERR_NOMEM, "em_transformer_encoder_layer_new: out of memory");
    li->cfg = *cfg;
    li->cfg.activation = gelu ? "gelu" : "relu"; /* static strings: the caller's may not live */
    li->gelu = gelu;
    em_module *m = em_module_new(&ENC_LAYER_VT, li);
    if (!m) {
        free(li);
        return NULL;
    }
    const int64_t d = cfg->d_model, f = cfg->dim_feedforward;
    /* torch's __init__ order (= state_dict order) */
    em_status st = em_module_add_child(m, "self_attn", em_multihead_attention_new(d, cfg->nhead, cfg->dropout, true, cfg->batch_first));
    if (st == EM_OK) st = em_module_add_child(m, "linear1", em_linear_new(d, f, true));
    if (st == EM_OK) st = em_module_add_child(m, "linear2", em_linear_new(f, d, true));
    if (st == EM_OK) st = em_module_add_child(m, "norm1", em_layer_norm_new(&d, 1, cfg->layer_norm_eps, true));
    if (st == EM_OK) st = em_module_add_child(m, "norm2", em_layer_norm_new(&d, 1, cfg->layer_norm_eps, true));
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* A float [T, T] causal mask (0 on and below the diagonal, -inf above), as
 * torch's Transformer.generate_square_subsequent_mask (inside a scope). */
static em_tensor *enc_causal_mask(int64_t T)
{
    int64_t col[2] = {1, T}, row[2] = {T, 1}, sq[2] = {T, T};
    em_tensor *j = em_reshape(em_arange(0, (double)T, 1, EM_I64), col, 2);
    em_tensor *i = em_reshape(em_arange(0, (double)T, 1, EM_I64), row, 2);
    return em_masked_fill(em_zeros(sq, 2, EM_F32), em_gt(j, i), -INFINITY);
}

em_tensor *em_transformer_encoder_layer_forward(em_module *m, const em_tensor *src, const em_tensor *src_mask,
                                                const em_tensor *src_key_padding_mask, bool is_causal)
{
    static const char *fn = "TransformerEncoderLayer";
    if (!m || em__module_vtable(m) != &ENC_LAYER_VT)
        return em__fail(EM_ERR_INVALID, "em_transformer_encoder_layer_forward: module is %s, not a TransformerEncoderLayer",
                        m ? em_module_type_name(m) : "NULL");
    if (!src) return em__fail(EM_ERR_INVALID, "%s: src is NULL", fn);
    enc_layer_impl *li = em_module_impl(m);
    char sx[160];
    if (em_tensor_ndim(src) != 3 || em_tensor_dim(src, 2) != li->cfg.d_model)
        return em__fail(EM_ERR_SHAPE, "%s: src of shape %s, expected %s with d_model = %lld", fn, NN_SHAPE(src, sx),
                        li->cfg.batch_first ? "[B, T, d_model]" : "[T, B, d_model]", (long long)li->cfg.d_model);
    const bool tr = em_module_is_training(m);
    const double p = li->cfg.dropout;
    em_module *sa = CHILD(m, "self_attn"), *l1 = CHILD(m, "linear1"), *l2 = CHILD(m, "linear2");
    em_module *n1 = CHILD(m, "norm1"), *n2 = CHILD(m, "norm2");
    em_scope_begin();
    /* is_causal is torch 2.x's hint that src_mask is the causal mask; without a
     * src_mask the causal mask is built here */
    const em_tensor *am = src_mask;
    if (is_causal && !am) am = enc_causal_mask(em_tensor_dim(src, li->cfg.batch_first ? 1 : 0));
    em_tensor *x = (em_tensor *)src, *y;
    /* _sa_block(y) = dropout1(self_attn(y, y, y, attn_mask, key_padding_mask)),
     * _ff_block(y) = dropout2(linear2(dropout(activation(linear1(y))))); every
     * step's failure is returned as it is (its message names the cause) */
    for (int blk = 0; blk < 2; blk++) {
        em_module *norm = blk == 0 ? n1 : n2;
        y = li->cfg.norm_first ? em_module_forward(norm, x) : x;
        if (!y) return nn_return(NULL);
        if (blk == 0) {
            y = em_multihead_attention_forward(sa, y, NULL, NULL, src_key_padding_mask, am);
        } else {
            y = em_module_forward(l1, y);
            if (y) y = li->gelu ? em_gelu(y) : em_relu(y);
            if (y) y = em_module_forward(l2, em_dropout(y, p, tr));
        }
        if (!y) return nn_return(NULL);
        x = em_add(x, em_dropout(y, p, tr));
        if (x && !li->cfg.norm_first) x = em_module_forward(norm, x);
        if (!x) return nn_return(NULL);
    }
    return nn_return(x);
}

typedef struct enc_impl {
    bool final_norm;
} enc_impl;

static em_tensor *enc_forward_plain(em_module *m, const em_tensor *x) { return em_transformer_encoder_forward(m, x, NULL, NULL, false); }

static const em_module_vtable ENC_VT = {"TransformerEncoder", enc_forward_plain, free};

em_status em__tf_add_layer_stack(em_module *m, em_module *(*make)(const void *cfg), const void *cfg, int64_t num_layers, bool final_norm,
                                int64_t d_model, double layer_norm_eps, const char *fn)
{
    em_module *layers = em_module_new(&MODULE_LIST_VT, NULL);
    em_status st = layers ? EM_OK : em_last_status();
    for (int64_t i = 0; i < num_layers && st == EM_OK; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        st = em_module_add_child(layers, name, make(cfg));
    }
    /* torch's _get_clones deep-copies one layer: every layer starts equal */
    em_tensor *p0[32], *pi[32];
    const int np = layers && st == EM_OK ? em_module_parameters(em_module_child_at(layers, 0, NULL), p0, 32) : 0;
    for (int64_t i = 1; i < num_layers && st == EM_OK; i++) {
        if (em_module_parameters(em_module_child_at(layers, (int)i, NULL), pi, 32) != np) {
            st = em__set_error(EM_ERR_RUNTIME, "%s: layers differ in parameter count", fn);
            break;
        }
        for (int j = 0; j < np && st == EM_OK; j++) st = em_copy_(pi[j], p0[j]);
    }
    if (st == EM_OK)
        st = em_module_add_child(m, "layers", layers);
    else if (layers)
        em_module_free(layers);
    if (st == EM_OK && final_norm) st = em_module_add_child(m, "norm", em_layer_norm_new(&d_model, 1, layer_norm_eps, true));
    return st;
}

static em_module *enc_layer_make(const void *cfg) { return em_transformer_encoder_layer_new(cfg); }

em_module *em_transformer_encoder_new(const em_transformer_encoder_layer_config *cfg, int64_t num_layers, bool final_norm)
{
    bool gelu = false;
    if (enc_check(cfg, "em_transformer_encoder_new", &gelu) != EM_OK) return NULL;
    if (num_layers < 1 || num_layers > 100000)
        return em__fail(EM_ERR_INVALID, "em_transformer_encoder_new: num_layers must be in [1, 100000], got %lld", (long long)num_layers);
    enc_impl *ei = calloc(1, sizeof *ei);
    if (!ei) return em__fail(EM_ERR_NOMEM, "em_transformer_encoder_new: out of memory");
    ei->final_norm = final_norm;
    em_module *m = em_module_new(&ENC_VT, ei);
    if (!m) {
        free(ei);
        return NULL;
    }
    const em_status st = em__tf_add_layer_stack(m, enc_layer_make, cfg, num_layers, final_norm, cfg->d_model, cfg->layer_norm_eps,
                                                "em_transformer_encoder_new");
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_tensor *em_transformer_encoder_forward(em_module *m, const em_tensor *src, const em_tensor *mask,
                                          const em_tensor *src_key_padding_mask, bool is_causal)
{
    if (!m || em__module_vtable(m) != &ENC_VT)
        return em__fail(EM_ERR_INVALID, "em_transformer_encoder_forward: module is %s, not a TransformerEncoder",
                        m ? em_module_type_name(m) : "NULL");
    enc_impl *ei = em_module_impl(m);
    em_module *layers = CHILD(m, "layers");
    em_scope_begin();
    em_tensor *x = (em_tensor *)src;
    for (int i = 0; i < em_module_num_children(layers) && x; i++)
        x = em_transformer_encoder_layer_forward(em_module_child_at(layers, i, NULL), x, mask, src_key_padding_mask, is_causal);
    if (x && ei->final_norm) x = em_module_forward(CHILD(m, "norm"), x);
    return nn_return(x);
}

/* ---- sinusoidal positional encoding ------------------------------------------------------ */

em_tensor *em_sinusoidal_positional_encoding(int64_t T, int64_t d)
{
    if (T <= 0 || d <= 0 || d % 2 || T > ((int64_t)1 << 24) || d > ((int64_t)1 << 20) || T * d > ((int64_t)1 << 31))
        return em__fail(EM_ERR_INVALID,
                        "em_sinusoidal_positional_encoding: T (%lld) and d (%lld) must be positive, d even, T <= 2^24, d <= 2^20, "
                        "T * d <= 2^31",
                        (long long)T, (long long)d);
    float *v = malloc(sizeof(float) * (size_t)(T * d));
    if (!v) return em__fail(EM_ERR_NOMEM, "em_sinusoidal_positional_encoding: out of memory");
    /* Vaswani et al. 2017, "Attention Is All You Need", section 3.5:
     * PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)),
     * in double, rounded to float32 once */
    for (int64_t i = 0; i < d / 2; i++) {
        const double inv = pow(10000.0, -(double)(2 * i) / (double)d);
        for (int64_t pos = 0; pos < T; pos++) {
            v[pos * d + 2 * i] = (float)sin((double)pos * inv);
            v[pos * d + 2 * i + 1] = (float)cos((double)pos * inv);
        }
    }
    int64_t s[2] = {T, d};
    em_tensor *t = em_from_host(v, s, 2, EM_F32);
    free(v);
    return t;
}

/* ---- the configuration of a GPT2LMHeadModel (for nn/gpt2_generate.c and callers) ---- */

em_status em_gpt2_get_config(const em_module *gpt, em_gpt2_config *out)
{
    if (!gpt || !out) return em__set_error(EM_ERR_INVALID, "em_gpt2_get_config: %s is NULL", !gpt ? "model" : "config");
    if (em__module_vtable(gpt) != &GPT2_VT)
        return em__set_error(EM_ERR_INVALID, "em_gpt2_get_config: module is %s, not a GPT2LMHeadModel", em_module_type_name(gpt));
    *out = ((const gpt2_impl *)em_module_impl(gpt))->cfg;
    return EM_OK;
}
