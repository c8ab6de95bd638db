/* MultiheadAttention's need_weights / unbatched forms, TransformerDecoderLayer
 * and TransformerDecoder (issue #16, item 2), torch.nn's keys and PyTorch 1.13's
 * forward. Built on the public MultiheadAttention / Linear / LayerNorm of
 * nn/transformer.c and nn/ from ordinary ops, so autodiff gives the backward. */
#include "nn/nn_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHILD(m, key) em_module_get_child((m), (key))

/* ---- MultiheadAttention: need_weights, unbatched input ------------------------------- */

em_mha_forward_opts em_mha_forward_opts_default(void)
{
    em_mha_forward_opts o = {NULL, NULL, true, true};
    return o;
}

static bool mask_dtype_ok(const em_tensor *mk) { return !mk || em_tensor_dtype(mk) == EM_BOOL || em_dtype_is_float(em_tensor_dtype(mk)); }

/* torch's MHA mask (bool: true = masked) as an additive float mask (inside a scope). */
static em_tensor *additive(const em_tensor *mk, em_dtype dt)
{
    if (em_tensor_dtype(mk) != EM_BOOL) return (em_tensor *)mk;
    return em_masked_fill(em_zeros(em_tensor_shape(mk), em_tensor_ndim(mk), dt), mk, -INFINITY);
}

/* torch 1.13's multi_head_attention_forward with need_weights (batched input,
 * shapes already checked): returns the output, the weights [B, H, L, S] (or
 * their head average [B, L, S]) in *w. Inside the caller's scope. */
static em_tensor *mha_with_weights(em_module *m, const em_tensor *query, const em_tensor *key, const em_tensor *value, int64_t E,
                                   int64_t H, double dropout, bool batch_first, const em_tensor *kpm, const em_tensor *am, bool average,
                                   em_tensor **w)
{
    const int bd = batch_first ? 0 : 1, td = 1 - bd;
    const int64_t B = em_tensor_dim(query, bd), L = em_tensor_dim(query, td), S = em_tensor_dim(key, td), hd = E / H;
    const bool bias = em_module_num_param_tensors(m) == 4; /* in_proj_weight, [in_proj_bias], out_proj.weight, [out_proj.bias] */
    em_tensor *in_w = em_module_get_param(m, "in_proj_weight"), *in_b = bias ? em_module_get_param(m, "in_proj_bias") : NULL;
    const em_tensor *xs[3] = {query, key, value};
    const int64_t lens[3] = {L, S, S};
    static const int to_heads[4] = {0, 2, 1, 3};
    em_tensor *h[3];
    for (int i = 0; i < 3; i++) {
        const em_tensor *xb = batch_first ? xs[i] : em_transpose(xs[i], 0, 1); /* [B, T, E] */
        /* _in_projection_packed: rows [0, E) of in_proj_weight for q, [E, 2E) k, [2E, 3E) v */
        em_tensor *y = em_linear(xb, em_narrow(in_w, 0, i * E, E), in_b ? em_narrow(in_b, 0, i * E, E) : NULL);
        int64_t hs[4] = {B, lens[i], H, hd};
        h[i] = em_permute(em_reshape(em_contiguous(y), hs, 4), to_heads, 4); /* [B, H, T, hd] */
    }
    const em_dtype dt = em_tensor_dtype(query);
    /* q_scaled = q / sqrt(head_dim); baddbmm(attn_mask, q_scaled, k^T) */
    em_tensor *s = em_matmul(em_div_scalar(h[0], sqrt((double)hd)), em_transpose(h[1], -2, -1)); /* [B, H, L, S] */
    if (am) {
        em_tensor *a = additive(am, dt);
        if (em_tensor_ndim(a) == 3) {
            int64_t s4[4] = {B, H, L, S};
            a = em_reshape(em_contiguous(a), s4, 4);
        }
        s = em_add(s, a);
    }
    if (kpm) {
        int64_t s4[4] = {B, 1, 1, S};
        s = em_add(s, em_reshape(em_contiguous(additive(kpm, dt)), s4, 4));
    }
    em_tensor *p = em_dropout(em_softmax(s, -1), dropout, em_module_is_training(m)); /* the weights torch returns */
    em_tensor *o = em_matmul(p, h[2]);
    int64_t flat[3] = {B, L, E};
    o = em_module_forward(CHILD(m, "out_proj"), em_reshape(em_contiguous(em_permute(o, to_heads, 4)), flat, 3));
    if (o && !batch_first) o = em_transpose(o, 0, 1);
    if (average) { /* torch 1.13: attn_output_weights.sum(dim=1) / num_heads (2.x: mean(dim=1)) */
        const int d1 = 1;
        p = em_div_scalar(em_sum(p, &d1, 1, false), (double)H);
    }
    *w = p;
    return o;
}

em_tensor *em_multihead_attention_forward_ex(em_module *m, const em_tensor *query, const em_tensor *key, const em_tensor *value,
                                             const em_mha_forward_opts *opts, em_tensor **attn_weights)
{
    static const char *fn = "MultiheadAttention";
    if (attn_weights) *attn_weights = NULL;
    int64_t E = 0, H = 0;
    double dropout = 0;
    bool bf = false;
    if (!em__mha_settings(m, &E, &H, &dropout, &bf))
        return em__fail(EM_ERR_INVALID, "em_multihead_attention_forward_ex: module is %s, not a MultiheadAttention",
                        m ? em_module_type_name(m) : "NULL");
    const em_mha_forward_opts o = opts ? *opts : em_mha_forward_opts_default();
    if (!query) return em__fail(EM_ERR_INVALID, "%s: query is NULL", fn);
    if (o.need_weights && !attn_weights)
        return em__fail(EM_ERR_INVALID, "%s: need_weights is set but attn_weights (where to return them) is NULL", fn);
    if (!key) key = query;
    if (!value) value = key;
    char s1[160], s2[160], s3[160];
    const int nd = em_tensor_ndim(query);
    if ((nd != 2 && nd != 3) || em_tensor_ndim(key) != nd || em_tensor_ndim(value) != nd)
        return em__fail(EM_ERR_SHAPE,
                        "%s: query, key and value must all be batched (rank 3) or all unbatched (rank 2), got %s, %s, %s", fn,
                        NN_SHAPE(query, s1), NN_SHAPE(key, s2), NN_SHAPE(value, s3));
    const em_tensor *kpm = o.key_padding_mask, *am = o.attn_mask;
    if (!mask_dtype_ok(kpm) || !mask_dtype_ok(am))
        return em__fail(EM_ERR_DTYPE, "%s: masks must be bool or float, got key_padding_mask %s, attn_mask %s", fn,
                        kpm ? em_dtype_name(em_tensor_dtype(kpm)) : "none", am ? em_dtype_name(em_tensor_dtype(am)) : "none");
    em_scope_begin();
    const em_tensor *q = query, *k = key, *v = value;
    int bdim = bf ? 0 : 1; /* the batch dim of the batched form */
    if (nd == 2) {
        /* torch's _mha_shape_check for unbatched input, then unsqueeze(1) of the
         * sequence-first form (batch_first does not apply to unbatched input) */
        const int64_t L = em_tensor_dim(query, 0), S = em_tensor_dim(key, 0);
        if (em_tensor_dim(query, 1) != E || em_tensor_dim(key, 1) != E || em_tensor_dim(value, 1) != E ||
            em_tensor_dim(value, 0) != S) {
            em_scope_end();
            return em__fail(EM_ERR_SHAPE, "%s: unbatched query %s, key %s, value %s, expected [L, %lld], [S, %lld], [S, %lld]", fn,
                            NN_SHAPE(query, s1), NN_SHAPE(key, s2), NN_SHAPE(value, s3), (long long)E, (long long)E, (long long)E);
        }
        if (kpm && (em_tensor_ndim(kpm) != 1 || em_tensor_dim(kpm, 0) != S)) {
            em_scope_end();
            return em__fail(EM_ERR_SHAPE, "%s: key_padding_mask of shape %s for unbatched input, expected [%lld]", fn, NN_SHAPE(kpm, s1),
                            (long long)S);
        }
        if (am) {
            const int an = em_tensor_ndim(am);
            const bool ok = (an == 2 && em_tensor_dim(am, 0) == L && em_tensor_dim(am, 1) == S) ||
                            (an == 3 && em_tensor_dim(am, 0) == H && em_tensor_dim(am, 1) == L && em_tensor_dim(am, 2) == S);
            if (!ok) {
                em_scope_end();
                return em__fail(EM_ERR_SHAPE, "%s: attn_mask of shape %s for unbatched input, expected [%lld, %lld] or [%lld, %lld, %lld]",
                                fn, NN_SHAPE(am, s1), (long long)L, (long long)S, (long long)H, (long long)L, (long long)S);
            }
        }
        q = em_unsqueeze(query, bdim);
        k = em_unsqueeze(key, bdim);
        v = em_unsqueeze(value, bdim);
        if (kpm) kpm = em_unsqueeze(kpm, 0);
        /* attn_mask [H, L, S] is [B * H, L, S] with B = 1 */
    }
    em_tensor *out, *w = NULL;
    if (!o.need_weights) {
        out = em_multihead_attention_forward(m, q, k, v, kpm, am);
    } else {
        /* em_multihead_attention_forward's shape checks, with its messages */
        const int td = 1 - bdim;
        const int64_t B = em_tensor_dim(q, bdim), L = em_tensor_dim(q, td), S = em_tensor_dim(k, td);
        out = NULL;
        if (em_tensor_dim(q, 2) != E || em_tensor_dim(k, 2) != E || em_tensor_dim(v, 2) != E)
            em__set_error(EM_ERR_SHAPE, "%s: query %s, key %s, value %s must end with embed_dim = %lld", fn, NN_SHAPE(q, s1),
                          NN_SHAPE(k, s2), NN_SHAPE(v, s3), (long long)E);
        else if (em_tensor_dim(k, bdim) != B || em_tensor_dim(v, bdim) != B || em_tensor_dim(v, td) != S)
            em__set_error(EM_ERR_SHAPE, "%s: batch or length mismatch: query %s, key %s, value %s (batch_first %d)", fn, NN_SHAPE(q, s1),
                          NN_SHAPE(k, s2), NN_SHAPE(v, s3), (int)bf);
        else if (kpm && (em_tensor_ndim(kpm) != 2 || em_tensor_dim(kpm, 0) != B || em_tensor_dim(kpm, 1) != S))
            em__set_error(EM_ERR_SHAPE, "%s: key_padding_mask of shape %s, expected [%lld, %lld]", fn, NN_SHAPE(kpm, s1), (long long)B,
                          (long long)S);
        else if (am && !((em_tensor_ndim(am) == 2 && em_tensor_dim(am, 0) == L && em_tensor_dim(am, 1) == S) ||
                         (em_tensor_ndim(am) == 3 && em_tensor_dim(am, 0) == B * H && em_tensor_dim(am, 1) == L &&
                          em_tensor_dim(am, 2) == S)))
            em__set_error(EM_ERR_SHAPE, "%s: attn_mask of shape %s, expected [%lld, %lld] or [%lld, %lld, %lld]", fn, NN_SHAPE(am, s1),
                          (long long)L, (long long)S, (long long)(B * H), (long long)L, (long long)S);
        else
            out = mha_with_weights(m, q, k, v, E, H, dropout, bf, kpm, am, o.average_attn_weights, &w);
    }
    if (out && nd == 2) {
        out = em_squeeze(out, bdim);
        if (w) w = em_squeeze(w, 0);
    }
    if (!out || (o.need_weights && !w)) return nn_return(NULL);
    if (o.need_weights) {
        em_keep(w); /* to the caller's scope, as the output */
        *attn_weights = w;
    }
    return nn_return(out);
}

/* ---- TransformerDecoderLayer / TransformerDecoder (torch.nn, PyTorch 1.13) ------------------ */

em_transformer_decoder_layer_config em_transformer_decoder_layer_config_default(int64_t d_model, int64_t nhead)
{
    em_transformer_decoder_layer_config c = {d_model, nhead, 2048, 0.1, "relu", 1e-5, false, false};
    return c;
}

typedef struct dec_layer_impl {
    em_transformer_decoder_layer_config cfg;
    bool gelu; /* activation: false relu, true exact-erf gelu */
} dec_layer_impl;

static em_status dec_check(const em_transformer_decoder_layer_config *c, const char *fn, bool *gelu)
{
    if (!c) return em__set_error(EM_ERR_INVALID, "%s: config is NULL", fn);
    return em__tf_layer_check(c->d_model, c->nhead, c->dim_feedforward, c->dropout, c->activation, c->layer_norm_eps, fn, gelu);
}

static em_tensor *dec_layer_forward_plain(em_module *m, const em_tensor *x)
{
    return em_transformer_decoder_layer_forward(m, x, x, NULL, NULL, NULL, NULL, false);
}

static const em_module_vtable DEC_LAYER_VT = {"TransformerDecoderLayer", dec_layer_forward_plain, free};

em_module *em_transformer_decoder_layer_new(const em_transformer_decoder_layer_config *cfg)
{
    bool gelu = false;
    if (dec_check(cfg, "em_transformer_decoder_layer_new", &gelu) != EM_OK) return NULL;
    dec_layer_impl *li = calloc(1, sizeof *li);
    if (!li) return em__fail(EM_ERR_NOMEM, "em_transformer_decoder_layer_new: out of memory");
    li->cfg = *cfg;
    li->cfg.activation = gelu ? "gelu" : "relu"; /* static strings: the caller's may not live */
    li->gelu = gelu;
    em_module *m = em_module_new(&DEC_LAYER_VT, li);
    if (!m) {
        free(li);
        return NULL;
    }
    const int64_t d = cfg->d_model, f = cfg->dim_feedforward;
    /* torch's __init__ order (= state_dict order) */
    em_status st = em_module_add_child(m, "self_attn", em_multihead_attention_new(d, cfg->nhead, cfg->dropout, true, cfg->batch_first));
    if (st == EM_OK)
        st = em_module_add_child(m, "multihead_attn", em_multihead_attention_new(d, cfg->nhead, cfg->dropout, true, cfg->batch_first));
    if (st == EM_OK) st = em_module_add_child(m, "linear1", em_linear_new(d, f, true));
    if (st == EM_OK) st = em_module_add_child(m, "linear2", em_linear_new(f, d, true));
    static const char *const norms[3] = {"norm1", "norm2", "norm3"};
    for (int i = 0; i < 3 && st == EM_OK; i++) st = em_module_add_child(m, norms[i], em_layer_norm_new(&d, 1, cfg->layer_norm_eps, true));
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* A float [T, T] causal mask (0 on and below the diagonal, -inf above), as
 * torch's Transformer.generate_square_subsequent_mask (inside a scope). */
static em_tensor *causal_mask(int64_t T)
{
    int64_t col[2] = {1, T}, row[2] = {T, 1}, sq[2] = {T, T};
    em_tensor *j = em_reshape(em_arange(0, (double)T, 1, EM_I64), col, 2);
    em_tensor *i = em_reshape(em_arange(0, (double)T, 1, EM_I64), row, 2);
    return em_masked_fill(em_zeros(sq, 2, EM_F32), em_gt(j, i), -INFINITY);
}

/* One attention block's MHA call (need_weights=False), batched or unbatched. */
static em_tensor *attend(em_module *a, const em_tensor *x, const em_tensor *mem, const em_tensor *kpm, const em_tensor *am)
{
    em_mha_forward_opts o = {kpm, am, false, true};
    return em_multihead_attention_forward_ex(a, x, mem, mem, &o, NULL);
}

em_tensor *em_transformer_decoder_layer_forward(em_module *m, const em_tensor *tgt, const em_tensor *memory, const em_tensor *tgt_mask,
                                                const em_tensor *memory_mask, const em_tensor *tgt_key_padding_mask,
                                                const em_tensor *memory_key_padding_mask, bool tgt_is_causal)
{
    static const char *fn = "TransformerDecoderLayer";
    if (!m || em__module_vtable(m) != &DEC_LAYER_VT)
        return em__fail(EM_ERR_INVALID, "em_transformer_decoder_layer_forward: module is %s, not a TransformerDecoderLayer",
                        m ? em_module_type_name(m) : "NULL");
    if (!tgt || !memory) return em__fail(EM_ERR_INVALID, "%s: %s is NULL", fn, !tgt ? "tgt" : "memory");
    dec_layer_impl *li = em_module_impl(m);
    const int64_t d = li->cfg.d_model;
    char s1[160], s2[160];
    const int nd = em_tensor_ndim(tgt);
    const char *want = nd == 2 ? "[T, d_model] and [S, d_model] (unbatched)"
                       : li->cfg.batch_first ? "[B, T, d_model] and [B, S, d_model]"
                                             : "[T, B, d_model] and [S, B, d_model]";
    const int bd = li->cfg.batch_first ? 0 : 1;
    if ((nd != 2 && nd != 3) || em_tensor_ndim(memory) != nd || em_tensor_dim(tgt, nd - 1) != d || em_tensor_dim(memory, nd - 1) != d ||
        (nd == 3 && em_tensor_dim(tgt, bd) != em_tensor_dim(memory, bd)))
        return em__fail(EM_ERR_SHAPE, "%s: tgt of shape %s and memory of shape %s, expected %s with d_model = %lld", fn, NN_SHAPE(tgt, s1),
                        NN_SHAPE(memory, s2), want, (long long)d);
    const bool tr = em_module_is_training(m);
    const double p = li->cfg.dropout;
    em_module *sa = CHILD(m, "self_attn"), *ca = CHILD(m, "multihead_attn"), *l1 = CHILD(m, "linear1"), *l2 = CHILD(m, "linear2");
    em_module *norm[3] = {CHILD(m, "norm1"), CHILD(m, "norm2"), CHILD(m, "norm3")};
    em_scope_begin();
    /* tgt_is_causal (torch 2.x's hint): without a tgt_mask the causal mask is built here */
    const em_tensor *tm = tgt_mask;
    if (tgt_is_causal && !tm) tm = causal_mask(em_tensor_dim(tgt, nd == 2 ? 0 : li->cfg.batch_first ? 1 : 0));
    em_tensor *x = (em_tensor *)tgt, *y;
    /* blocks: 0 _sa_block (dropout1), 1 _mha_block (dropout2), 2 _ff_block (dropout3);
     * each failure is returned as it is (its message names the cause) */
    for (int blk = 0; blk < 3; blk++) {
        y = li->cfg.norm_first ? em_module_forward(norm[blk], x) : x;
        if (!y) return nn_return(NULL);
        if (blk == 0) {
            y = attend(sa, y, y, tgt_key_padding_mask, tm);
        } else if (blk == 1) {
            y = attend(ca, y, memory, memory_key_padding_mask, memory_mask);
        } else {
            y = em_module_forward(l1, y);
            if (y) y = li->gelu ? em_gelu(y) : em_relu(y);
            if (y) y = em_module_forward(l2, em_dropout(y, p, tr));
        }
        if (!y) return nn_return(NULL);
        x = em_add(x, em_dropout(y, p, tr));
        if (x && !li->cfg.norm_first) x = em_module_forward(norm[blk], x);
        if (!x) return nn_return(NULL);
    }
    return nn_return(x);
}

typedef struct dec_impl {
    bool final_norm;
} dec_impl;

static em_tensor *dec_forward_plain(em_module *m, const em_tensor *x)
{
    return em_transformer_decoder_forward(m, x, x, NULL, NULL, NULL, NULL, false);
}

static const em_module_vtable DEC_VT = {"TransformerDecoder", dec_forward_plain, free};
static em_module *dec_layer_make(const void *cfg) { return em_transformer_decoder_layer_new(cfg); }

em_module *em_transformer_decoder_new(const em_transformer_decoder_layer_config *cfg, int64_t num_layers, bool final_norm)
{
    bool gelu = false;
    if (dec_check(cfg, "em_transformer_decoder_new", &gelu) != EM_OK) return NULL;
    if (num_layers < 1 || num_layers > 100000)
        return em__fail(EM_ERR_INVALID, "em_transformer_decoder_new: num_layers must be in [1, 100000], got %lld", (long long)num_layers);
    dec_impl *di = calloc(1, sizeof *di);
    if (!di) return em__fail(EM_ERR_NOMEM, "em_transformer_decoder_new: out of memory");
    di->final_norm = final_norm;
    em_module *m = em_module_new(&DEC_VT, di);
    if (!m) {
        free(di);
        return NULL;
    }
    const em_status st = em__tf_add_layer_stack(m, dec_layer_make, cfg, num_layers, final_norm, cfg->d_model, cfg->layer_norm_eps,
                                                "em_transformer_decoder_new");
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_tensor *em_transformer_decoder_forward(em_module *m, const em_tensor *tgt, const em_tensor *memory, const em_tensor *tgt_mask,
                                          const em_tensor *memory_mask, const em_tensor *tgt_key_padding_mask,
                                          const em_tensor *memory_key_padding_mask, bool tgt_is_causal)
{
    if (!m || em__module_vtable(m) != &DEC_VT)
        return em__fail(EM_ERR_INVALID, "em_transformer_decoder_forward: module is %s, not a TransformerDecoder",
                        m ? em_module_type_name(m) : "NULL");
    dec_impl *di = em_module_impl(m);
    em_module *layers = CHILD(m, "layers");
    em_scope_begin();
    em_tensor *x = (em_tensor *)tgt;
    /* torch 1.13: output = mod(output, memory, tgt_mask=..., ...) for every layer, then norm */
    for (int i = 0; i < em_module_num_children(layers) && x; i++)
        x = em_transformer_decoder_layer_forward(em_module_child_at(layers, i, NULL), x, memory, tgt_mask, memory_mask,
                                                 tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal);
    if (x && di->final_norm) x = em_module_forward(CHILD(m, "norm"), x);
    return nn_return(x);
}
