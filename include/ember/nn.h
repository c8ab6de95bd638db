/* Ember neural-network modules, parameter initializers and loss functions.
 *
 * Modules
 * -------
 * A module (em_module) is a node of a named tree, as torch.nn.Module:
 *   - parameters: named leaf tensors that require gradients ("weight", "bias");
 *   - buffers: named tensors that are state but not parameters (running stats);
 *   - children: named sub-modules ("fc1", "0", "layers").
 * Parameter keys are the dotted paths PyTorch uses ("fc1.weight",
 * "layers.0.bias"), so SafeTensors files written by either side line up.
 * Visiting order is registration order, depth first (own parameters before
 * children's), as torch.nn.Module.named_parameters().
 *
 * Behaviour comes from a vtable (type name, forward, free of the private
 * data). Built-in layers (Linear, Embedding, ...) are modules made with
 * em_module_new; users write their own modules the same way:
 *
 *     static em_tensor *mlp_forward(em_module *m, const em_tensor *x) {
 *         em_scope_begin();
 *         em_tensor *h = em_relu(em_module_forward(em_module_get_child(m, "fc1"), x));
 *         em_tensor *y = em_keep(em_module_forward(em_module_get_child(m, "fc2"), h));
 *         em_scope_end();
 *         return y;
 *     }
 *     static const em_module_vtable MLP = {"MLP", mlp_forward, NULL};
 *     em_module *m = em_module_new(&MLP, NULL);
 *     em_module_add_child(m, "fc1", em_linear_new(2, 8, true));
 *     em_module_add_child(m, "fc2", em_linear_new(8, 1, true));
 *
 * Ownership: a module owns its parameters, buffers, children and private
 * data; em_module_free releases them all. Tensors a module hands out
 * (em_module_get_param, visitors) are borrowed. Forward returns a NEW
 * reference with the usual tensor.h rules (owned by the current scope, or by
 * the caller outside any scope).
 *
 * Built-in layers create their parameters as float32 leaves with
 * requires_grad set, owned by the module alone (not by any scope), whatever
 * scope is open when the module is built: building a model inside a
 * training step's scope is safe.
 *
 * Errors: NULL / negative em_status plus em_last_error(), never an abort.
 */
#ifndef EMBER_NN_H
#define EMBER_NN_H

#include "ember/autograd.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_module em_module;

/** Resampling modes of em_interpolate. */
typedef enum em_interp_mode {
    EM_INTERP_NEAREST = 0,  /**< PyTorch mode='nearest': source index floor(dst * in / out) */
    EM_INTERP_BILINEAR = 1, /**< mode='bilinear' */
} em_interp_mode;

/** What makes a module kind. forward returns a new reference (see above) or
 *  NULL with an error set; free_impl releases the private data passed to
 *  em_module_new (NULL = nothing to free / free()). */
typedef struct em_module_vtable {
    const char *type_name;                                     /**< "Linear", "MLP", ... */
    em_tensor *(*forward)(em_module *m, const em_tensor *x);   /**< NULL: module cannot be called */
    void (*free_impl)(void *impl);                             /**< NULL: impl is left alone */
} em_module_vtable;

/** Visitor over named tensors: @p key is the full dotted key ("fc1.weight"),
 *  valid during the call only; @p t is borrowed. */
typedef void (*em_tensor_visitor)(const char *key, em_tensor *t, void *ud);

/** New empty module (training mode) of kind @p vt (must outlive the module),
 *  with private data @p impl (owned: released by vt->free_impl). */
EM_API em_module *em_module_new(const em_module_vtable *vt, void *impl);
/** Frees the module, its children, private data, and releases its tensors.
 *  NULL is a no-op. */
EM_API void em_module_free(em_module *m);
EM_API void *em_module_impl(const em_module *m);
EM_API const char *em_module_type_name(const em_module *m);

/** Registers parameter @p name (no '.', unique among this module's
 *  parameters, buffers and children). The module takes its own reference
 *  (em_tensor_retain: the caller's reference, scoped or not, is unaffected)
 *  and sets requires_grad (float dtypes only: EM_ERR_DTYPE otherwise;
 *  non-leaf: EM_ERR_STATE). */
EM_API em_status em_module_add_param(em_module *m, const char *name, em_tensor *param);
/** Registers buffer @p name (a new reference; requires_grad untouched). */
EM_API em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *buf);
/** Registers child @p name; the parent takes ownership of @p child (also when
 *  this fails: then the child is freed). */
EM_API em_status em_module_add_child(em_module *m, const char *name, em_module *child);

/** Parameter by dotted key relative to @p m ("weight", "fc1.weight",
 *  "layers.0.bias"); borrowed; NULL + EM_ERR_INVALID naming the key when absent. */
EM_API em_tensor *em_module_get_param(const em_module *m, const char *key);
EM_API em_tensor *em_module_get_buffer(const em_module *m, const char *key);
/** Child by dotted key ("encoder.layers.0"); borrowed; NULL when absent. */
EM_API em_module *em_module_get_child(const em_module *m, const char *key);
EM_API int em_module_num_children(const em_module *m);
/** i-th child in registration order (borrowed), its name in *name when non-NULL. */
EM_API em_module *em_module_child_at(const em_module *m, int i, const char **name);

/** Calls @p cb for every parameter, own first then children recursively, in
 *  registration order, with PyTorch keys. */
EM_API em_status em_module_visit_params(const em_module *m, em_tensor_visitor cb, void *ud);
/** Same for buffers. */
EM_API em_status em_module_visit_buffers(const em_module *m, em_tensor_visitor cb, void *ud);
/** Number of parameters (tensors), recursively. */
EM_API int em_module_num_param_tensors(const em_module *m);
/** Writes up to @p max parameters (borrowed) in visiting order into @p out
 *  (may be NULL to count); returns the total count, or < 0 on error. */
EM_API int em_module_parameters(const em_module *m, em_tensor **out, int max);
/** Number of scalars in all parameters (torch: sum(p.numel() for p in m.parameters())). */
EM_API int64_t em_module_num_params(const em_module *m);

/** Sets training mode on @p m and all its children (torch Module.train(mode));
 *  em_module_train(m, false) is eval(). */
EM_API void em_module_train(em_module *m, bool training);
EM_API bool em_module_is_training(const em_module *m);
/** Turns requires_grad off (freeze) / on (unfreeze) for every parameter. */
EM_API em_status em_module_freeze(em_module *m);
EM_API em_status em_module_unfreeze(em_module *m);
/** Runs the module: vt->forward(m, x). NULL input -> NULL. */
EM_API em_tensor *em_module_forward(em_module *m, const em_tensor *x);

/* ---- initializers (in place; formulas as torch.nn.init) ------------------
 * All run under no-grad and overwrite @p t (float dtype) with em_copy_ from a
 * draw of the global seeded generator (em_manual_seed), so they are
 * reproducible. They return EM_OK or a negative status. */

/** Fan mode for Kaiming init: preserve the variance of the forward (fan_in)
 *  or backward (fan_out) pass. */
typedef enum em_fan_mode { EM_FAN_IN = 0, EM_FAN_OUT = 1 } em_fan_mode;

/** Non-linearities for em_init_calculate_gain. */
typedef enum em_nonlinearity {
    EM_NONLIN_LINEAR = 0,  /**< also conv*d, sigmoid: gain 1 */
    EM_NONLIN_SIGMOID,     /**< 1 */
    EM_NONLIN_TANH,        /**< 5/3 */
    EM_NONLIN_RELU,        /**< sqrt(2) */
    EM_NONLIN_LEAKY_RELU,  /**< sqrt(2 / (1 + negative_slope^2)) */
    EM_NONLIN_SELU,        /**< 3/4 */
} em_nonlinearity;

/** torch.nn.init.calculate_gain(nonlinearity, param); @p param is the
 *  leaky_relu negative slope (ignored otherwise; a negative value means the
 *  PyTorch default 0.01). */
EM_API double em_init_calculate_gain(em_nonlinearity nl, double param);
/** torch.nn.init._calculate_fan_in_and_fan_out: for shape [out, in, k...]
 *  fan_in = in * prod(k), fan_out = out * prod(k). Rank < 2: EM_ERR_SHAPE. */
EM_API em_status em_init_fans(const em_tensor *t, int64_t *fan_in, int64_t *fan_out);
EM_API em_status em_init_constant_(em_tensor *t, double value);
EM_API em_status em_init_zeros_(em_tensor *t);
EM_API em_status em_init_ones_(em_tensor *t);
/** U(a, b). */
EM_API em_status em_init_uniform_(em_tensor *t, double a, double b);
/** N(mean, std^2). */
EM_API em_status em_init_normal_(em_tensor *t, double mean, double std);
/** U(-bound, bound), bound = gain * sqrt(3 / fan), gain =
 *  calculate_gain(nl, a) (He et al. 2015; torch.nn.init.kaiming_uniform_). */
EM_API em_status em_init_kaiming_uniform_(em_tensor *t, double a, em_fan_mode mode, em_nonlinearity nl);
/** N(0, std^2), std = gain / sqrt(fan) (torch.nn.init.kaiming_normal_). */
EM_API em_status em_init_kaiming_normal_(em_tensor *t, double a, em_fan_mode mode, em_nonlinearity nl);
/** U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010;
 *  torch.nn.init.xavier_uniform_). */
EM_API em_status em_init_xavier_uniform_(em_tensor *t, double gain);
/** N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)) (torch.nn.init.xavier_normal_). */
EM_API em_status em_init_xavier_normal_(em_tensor *t, double gain);

/* ---- layers ---------------------------------------------------------------
 * Constructors return a new module (free with em_module_free, or hand it to a
 * parent) or NULL with an error. Parameters are float32. */

/** torch.nn.Linear: y = x W^T + b. x [..., in_features] -> [..., out_features].
 *  weight [out_features, in_features] ~ kaiming_uniform(a = sqrt(5)) i.e.
 *  U(-1/sqrt(in), 1/sqrt(in)); bias [out_features] ~ U(-1/sqrt(in), 1/sqrt(in)).
 *  Keys: "weight", "bias". */
EM_API em_module *em_linear_new(int64_t in_features, int64_t out_features, bool bias);
/** torch.nn.Embedding: integer (i64/i32) indices of any shape S -> S +
 *  [embedding_dim]; weight [num_embeddings, embedding_dim] ~ N(0, 1). */
EM_API em_module *em_embedding_new(int64_t num_embeddings, int64_t embedding_dim);
/** torch.nn.Dropout(p): in training, zeroes each element with probability p
 *  and scales the rest by 1/(1-p); in eval mode the identity. 0 <= p <= 1. */
EM_API em_module *em_dropout_new(double p);
/** torch.nn.LayerNorm over the last @p ndim dims of shape @p normalized_shape:
 *  y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias (biased variance).
 *  elementwise_affine adds weight (ones) and bias (zeros) of that shape.
 *  PyTorch default eps = 1e-5. */
EM_API em_module *em_layer_norm_new(const int64_t *normalized_shape, int ndim, double eps, bool elementwise_affine);
/** torch.nn.RMSNorm over the last dim of size @p dim: y = x / sqrt(mean(x^2) +
 *  eps) * weight, weight [dim] = ones. eps < 0 means PyTorch's default
 *  (eps=None: the machine epsilon of x's dtype). */
EM_API em_module *em_rms_norm_new(int64_t dim, double eps);
/** torch.nn.Sequential: children named "0", "1", ...; forward chains them.
 *  Takes ownership of the @p n modules (also on failure). */
EM_API em_module *em_sequential_new(em_module *const *mods, int n);
/** Appends @p child (ownership taken) as the next numbered child. */
EM_API em_status em_sequential_append(em_module *seq, em_module *child);

/* activation modules (no parameters) */
EM_API em_module *em_identity_new(void);
EM_API em_module *em_relu_new(void);
/** negative_slope: PyTorch default 0.01. */
EM_API em_module *em_leaky_relu_new(double negative_slope);
/** tanh_approximate = false: exact erf form (PyTorch approximate='none'). */
EM_API em_module *em_gelu_new(bool tanh_approximate);
EM_API em_module *em_silu_new(void);
EM_API em_module *em_sigmoid_new(void);
EM_API em_module *em_tanh_new(void);
/** torch.nn.Softplus(beta=1, threshold=20): log(1 + exp(beta x)) / beta, and
 *  x where beta x > threshold. */
EM_API em_module *em_softplus_new(double beta, double threshold);
/** alpha: PyTorch default 1.0. */
EM_API em_module *em_elu_new(double alpha);

/* vision layers (NCHW; see the functional forms below for shapes, settings
 * and errors). Keys and initialisation as PyTorch: conv weight
 * [out, in/groups, k...] and bias [out] ~ kaiming_uniform(a = sqrt(5)), i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in/groups * prod(k);
 * ConvTranspose2d weight [in, out/groups, kH, kW], fan_in computed from that
 * shape as PyTorch does ((out/groups) * kH * kW). o NULL = defaults (conv) /
 * an error (pooling: the kernel size has no default). Type names are
 * PyTorch's ("Conv2d", "BatchNorm2d", ...); each module keeps its settings
 * in its private data. Constructors check what PyTorch's do (channels
 * divisible by groups, kernel > 0, padding='same' only with stride 1,
 * ConvTranspose2d output_padding < stride or dilation, pooling padding <=
 * kernel / 2, ...): EM_ERR_INVALID naming the values. Shape errors of the
 * input are reported by forward (the functional forms' messages). */
EM_API em_module *em_conv1d_new(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const em_conv_opts *o, bool bias);
EM_API em_module *em_conv2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw, const em_conv_opts *o, bool bias);
EM_API em_module *em_conv_transpose2d_new(int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw, const em_conv_opts *o,
                                          bool bias);
EM_API em_module *em_max_pool2d_new(const em_pool_opts *o);
EM_API em_module *em_avg_pool2d_new(const em_pool_opts *o);
EM_API em_module *em_adaptive_avg_pool2d_new(int64_t oh, int64_t ow);
/** torch.nn.BatchNorm1d ([N, C] or [N, C, L]) / BatchNorm2d ([N, C, H, W]):
 *  keys "weight" (ones), "bias" (zeros) when affine; buffers "running_mean"
 *  (zeros), "running_var" (ones), "num_batches_tracked" (i64 0-d) when
 *  track_running_stats. Training mode uses batch statistics and updates the
 *  buffers; em_module_train(m, false) switches to the running statistics.
 *  Without track_running_stats batch statistics are used in eval mode too
 *  (PyTorch). num_batches_tracked counts successful training forwards.
 *  BatchNorm1d takes rank 2 or 3, BatchNorm2d rank 4, with C = num_features
 *  (EM_ERR_SHAPE otherwise). momentum in [0, 1] (PyTorch's momentum=None,
 *  a cumulative average, is not supported).
 *  PyTorch defaults: eps 1e-5, momentum 0.1, affine, track_running_stats. */
EM_API em_module *em_batch_norm1d_new(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats);
EM_API em_module *em_batch_norm2d_new(int64_t num_features, double eps, double momentum, bool affine, bool track_running_stats);
/** torch.nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True). */
EM_API em_module *em_group_norm_new(int64_t num_groups, int64_t num_channels, double eps, bool affine);
/** torch.nn.Flatten(start_dim=1, end_dim=-1): em_flatten(x, start_dim, end_dim). */
EM_API em_module *em_flatten_new(int start_dim, int end_dim);
/** torch.nn.Dropout2d(p): zeroes whole channels (x [N, C, H, W]; another
 *  rank is EM_ERR_SHAPE) with probability p in training, scaling the rest by
 *  1/(1-p); the identity in eval mode. 0 <= p <= 1. */
EM_API em_module *em_dropout2d_new(double p);
/** torch.nn.Upsample(size=(oh, ow), mode, align_corners): em_interpolate.
 *  align_corners with NEAREST is EM_ERR_INVALID (PyTorch raises too). */
EM_API em_module *em_upsample_new(int64_t oh, int64_t ow, em_interp_mode mode, bool align_corners);

/* ---- attention and transformers (issue #16) ---------------------------------
 * Scaled-dot-product attention is one fused op (SDPA / SDPA_BWD,
 * tasks/attention.c), with the composed math path (matmul, masked_fill,
 * softmax, dropout) as its reference and fallback; the modules are composed
 * from existing ops (and that attention). Any float dtype; differentiable
 * by autodiff. */

/** torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x documented
 *  reference implementation):
 *    S = q @ k^T * scale                      [..., Tq, Tk]
 *    is_causal: S[i, j] = -inf where j > i     (tril(ones(Tq, Tk)), top-left
 *               aligned also when Tq != Tk, as torch)
 *    mask bool (EM_BOOL): S = -inf where mask is false (true = take part)
 *    mask float: S = S + mask                  (additive)
 *    P = softmax(S, -1); P = dropout(P, dropout_p) when @p training
 *    out = P @ v                               [..., Tq, Dv]
 *  q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] of one rank >= 2 with
 *  equal leading dims (typically [B, H, T, D]); mask broadcastable to
 *  [..., Tq, Tk] (rank <= q's). scale <= 0 or NaN means torch's default
 *  1 / sqrt(D). A row every key of which is masked gives NaN, as torch's math
 *  path. torch applies dropout whenever dropout_p > 0; here only when
 *  @p training is true too (modules pass their mode), 0 <= dropout_p <= 1.
 *  Computed by the fused SDPA op (one task; online softmax over key tiles,
 *  no [Tq, Tk] tensor; FlashAttention-2's backward; the contract at the top
 *  of tasks/attention.c) when q, k, v have one dtype, D and Dv are at most
 *  256 and the mask does not require grad (the fused op gives it no
 *  gradient); otherwise, or with the environment variable EMBER_SDPA=math
 *  (read once), by the composed math path. Dropout draws B*H*Tq*Tk
 *  counters of the global generator (em_manual_seed) per call. Autocast
 *  computes it in the region's low dtype (as matmul). For 4-D inputs the
 *  result is a [B, H, Tq, Dv] view of [B, Tq, H, Dv] memory.
 *  Returns a new reference (tensor.h rules). Errors: NULL q/k/v
 *  (EM_ERR_INVALID); rank < 2, unequal ranks or leading dims, D or Tk
 *  mismatch, a mask that does not broadcast (EM_ERR_SHAPE naming the
 *  shapes); mask together with is_causal (EM_ERR_INVALID, as torch);
 *  non-float q/k/v or an integer mask (EM_ERR_DTYPE). */
EM_API em_tensor *em_scaled_dot_product_attention(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask,
                                                  bool is_causal, double dropout_p, double scale, bool training);

/** torch.nn.MultiheadAttention(embed_dim, num_heads, dropout, bias,
 *  batch_first) with kdim = vdim = embed_dim. Keys and shapes as PyTorch:
 *  "in_proj_weight" [3E, E] ~ xavier_uniform, "in_proj_bias" [3E] = 0 (with
 *  bias), "out_proj.weight" [E, E] (Linear's init), "out_proj.bias" [E] = 0.
 *  embed_dim divisible by num_heads (EM_ERR_INVALID otherwise), 0 <= dropout
 *  <= 1 (on the attention weights, training mode only). Type "MultiheadAttention".
 *  em_module_forward(m, x) is self-attention with no masks. */
EM_API em_module *em_multihead_attention_new(int64_t embed_dim, int64_t num_heads, double dropout, bool bias, bool batch_first);
/** MultiheadAttention.forward(query, key, value, key_padding_mask,
 *  need_weights=False, attn_mask): returns the output only (a new
 *  reference), [B, L, E] with batch_first, else [L, B, E]; query [B, L, E],
 *  key/value [B, S, E] (or [L, B, E] / [S, B, E]). Batched inputs only
 *  (rank 3). key/value NULL mean the query (self-attention).
 *  key_padding_mask [B, S]: EM_BOOL (true = IGNORE that key, torch's MHA
 *  convention, opposite to em_scaled_dot_product_attention) or float
 *  (added). attn_mask [L, S] or [B * num_heads, L, S], bool (true = not
 *  allowed) or float (added). Scores scaled by 1 / sqrt(E / num_heads).
 *  Errors: EM_ERR_SHAPE naming the shapes (rank, E, batch or length
 *  mismatch, bad mask shapes), EM_ERR_DTYPE (integer masks), EM_ERR_INVALID
 *  (not a MultiheadAttention module). */
EM_API em_tensor *em_multihead_attention_forward(em_module *m, const em_tensor *query, const em_tensor *key, const em_tensor *value,
                                                 const em_tensor *key_padding_mask, const em_tensor *attn_mask);

/** torch.nn.TransformerEncoderLayer's arguments (names as PyTorch's). */
typedef struct em_transformer_encoder_layer_config {
    int64_t d_model;         /**< model width; divisible by nhead */
    int64_t nhead;           /**< attention heads */
    int64_t dim_feedforward; /**< 2048 */
    double dropout;          /**< 0.1: attention weights, dropout, dropout1, dropout2 (training only) */
    const char *activation;  /**< "relu" (default; NULL = "relu") or "gelu" (exact erf form, torch's "gelu") */
    double layer_norm_eps;   /**< 1e-5 */
    bool batch_first;        /**< false: src [T, B, d_model]; true: [B, T, d_model] */
    bool norm_first;         /**< false: post-norm (torch's default); true: pre-norm */
} em_transformer_encoder_layer_config;
/** PyTorch's defaults for d_model and nhead: (d_model, nhead, 2048, 0.1,
 *  "relu", 1e-5, false, false). */
EM_API em_transformer_encoder_layer_config em_transformer_encoder_layer_config_default(int64_t d_model, int64_t nhead);
/** torch.nn.TransformerEncoderLayer (PyTorch 1.13 semantics). Children and
 *  keys in torch's state_dict order: "self_attn.in_proj_weight" [3d, d],
 *  "self_attn.in_proj_bias" [3d], "self_attn.out_proj.weight" [d, d],
 *  "self_attn.out_proj.bias" [d] (em_multihead_attention_new's init),
 *  "linear1.weight" [f, d], "linear1.bias" [f], "linear2.weight" [d, f],
 *  "linear2.bias" [d] (Linear's init), "norm1.weight/bias", "norm2.weight/bias"
 *  [d] (ones / zeros). The config is copied (activation too). Type
 *  "TransformerEncoderLayer"; em_module_forward(m, src) is the forward with
 *  no masks. Errors: NULL config, d_model not a positive multiple of nhead
 *  ("d_model (30) must be a positive multiple of nhead (4)"),
 *  dim_feedforward <= 0, dropout outside [0, 1], layer_norm_eps < 0, an
 *  activation other than relu / gelu (all EM_ERR_INVALID naming the value). */
EM_API em_module *em_transformer_encoder_layer_new(const em_transformer_encoder_layer_config *cfg);
/** TransformerEncoderLayer.forward(src, src_mask, src_key_padding_mask),
 *  torch's non-fast path, with sa(x) = dropout1(self_attn(x, x, x,
 *  src_mask, src_key_padding_mask)) and ff(x) = dropout2(linear2(dropout(
 *  activation(linear1(x))))):
 *    norm_first:  x = x + sa(norm1(x)); x = x + ff(norm2(x))
 *    post-norm:   x = norm1(x + sa(x)); x = norm2(x + ff(x))
 *  src [B, T, d] (batch_first) or [T, B, d], float; returns a new reference
 *  of src's shape. src_mask and src_key_padding_mask as
 *  em_multihead_attention_forward's attn_mask ([T, T] or [B * nhead, T, T])
 *  and key_padding_mask ([B, T]): bool (true = masked) or float (added).
 *  is_causal (torch 2.x's hint): with src_mask NULL, the causal float mask
 *  (-inf above the diagonal, torch's generate_square_subsequent_mask) is used;
 *  with a src_mask, that mask is used as given (torch: the hint says it is
 *  causal). Dropout only in training mode. Errors: not a
 *  TransformerEncoderLayer or NULL src (EM_ERR_INVALID); rank != 3 or last
 *  dim != d_model (EM_ERR_SHAPE naming the shape); mask errors as
 *  em_multihead_attention_forward. */
EM_API em_tensor *em_transformer_encoder_layer_forward(em_module *m, const em_tensor *src, const em_tensor *src_mask,
                                                       const em_tensor *src_key_padding_mask, bool is_causal);
/** torch.nn.TransformerEncoder(encoder_layer, num_layers, norm): num_layers
 *  layers built from @p cfg under "layers.{i}.<layer keys>" (type
 *  "ModuleList"), every layer starting with layer 0's values (torch's
 *  _get_clones deep-copies one layer), and with @p final_norm a
 *  LayerNorm(d_model, layer_norm_eps) under "norm.weight/bias". Type
 *  "TransformerEncoder"; em_module_forward(m, src) has no masks. Errors:
 *  as em_transformer_encoder_layer_new, and num_layers outside [1, 100000]
 *  (EM_ERR_INVALID). */
EM_API em_module *em_transformer_encoder_new(const em_transformer_encoder_layer_config *cfg, int64_t num_layers, bool final_norm);
/** TransformerEncoder.forward(src, mask, src_key_padding_mask): every layer
 *  with the same masks and is_causal, then the final norm if any. Shapes,
 *  ownership and errors as em_transformer_encoder_layer_forward (not a
 *  TransformerEncoder: EM_ERR_INVALID). */
EM_API em_tensor *em_transformer_encoder_forward(em_module *m, const em_tensor *src, const em_tensor *mask,
                                                 const em_tensor *src_key_padding_mask, bool is_causal);
/** The sinusoidal positional-encoding table of Vaswani et al. 2017,
 *  "Attention Is All You Need", section 3.5, as a new float32 tensor [T, d]:
 *    PE[pos, 2i]     = sin(pos / 10000^(2i / d))
 *    PE[pos, 2i + 1] = cos(pos / 10000^(2i / d))
 *  computed in double and rounded once. Add it to [B, T, d] embeddings (it
 *  broadcasts) or narrow it for shorter sequences. No gradient (a constant).
 *  Errors: T or d <= 0, odd d, T > 2^24, d > 2^20 or T * d > 2^31
 *  (EM_ERR_INVALID naming them). */
EM_API em_tensor *em_sinusoidal_positional_encoding(int64_t T, int64_t d);

/** Hugging Face's GPT2Config subset (names as HF's). */
typedef struct em_gpt2_config {
    int64_t vocab_size;        /**< 50257 for GPT-2 */
    int64_t n_positions;       /**< block size, 1024 */
    int64_t n_embd;            /**< 768 */
    int64_t n_layer;           /**< 12 */
    int64_t n_head;            /**< 12; divides n_embd */
    double dropout;            /**< embd_pdrop = attn_pdrop = resid_pdrop (HF 0.1) */
    double layer_norm_epsilon; /**< 1e-5 */
} em_gpt2_config;
/** The GPT-2 124M configuration (50257, 1024, 768, 12, 12, 0.1, 1e-5). */
EM_API em_gpt2_config em_gpt2_config_default(void);

/** The configuration as the text a checkpoint carries (metadata
 *  "ember.model", written by `ember train --model gpt`, read by `ember
 *  generate`): "gpt:vocab_size=V,n_positions=P,n_embd=E,n_layer=L,n_head=H,
 *  dropout=D,layer_norm_epsilon=EPS" (doubles in %.17g, so a parse gives
 *  the same bits). Writes at most @p n bytes with the NUL. Errors: NULL
 *  arguments, or @p n too small (EM_ERR_INVALID; @p buf then holds "").
 *  The config is not checked (em_gpt2_new checks it). */
EM_API em_status em_gpt2_config_format(const em_gpt2_config *cfg, char *buf, size_t n);
/** Parses em_gpt2_config_format's text into @p out. Keys may come in any
 *  order; a missing key keeps em_gpt2_config_default's value. Errors:
 *  a text not starting with "gpt:", an unknown key, a malformed or
 *  out-of-range number, a repeated key (EM_ERR_INVALID naming it); @p out
 *  is left unchanged then. */
EM_API em_status em_gpt2_config_parse(const char *s, em_gpt2_config *out);

/** HF Conv1D(nf, nx): y = x @ weight + bias, x [..., nx] -> [..., nf];
 *  keys "weight" [nx, nf] ~ N(0, 0.02^2) (HF _init_weights), "bias" [nf] = 0.
 *  Type "Conv1D". Errors: negative sizes (EM_ERR_INVALID). */
EM_API em_module *em_gpt2_conv1d_new(int64_t nx, int64_t nf);
/** HF GPT2Block (pre-norm): x = x + drop(c_proj(attn(ln_1(x)))) with causal
 *  attention; x = x + drop(mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))).
 *  Keys "ln_1.*", "attn.c_attn.*" ([E, 3E], [3E]), "attn.c_proj.*"
 *  ([E, E]), "ln_2.*", "mlp.c_fc.*" ([E, 4E]), "mlp.c_proj.*" ([4E, E]).
 *  Forward x [B, T, E] -> [B, T, E]. Initialised as the whole model's blocks
 *  (see em_gpt2_new). Errors: a bad config (EM_ERR_INVALID naming it). */
EM_API em_module *em_gpt2_block_new(const em_gpt2_config *cfg);
/** HF GPT2LMHeadModel: forward(idx [B, T] int64/int32 token ids, T <=
 *  n_positions) -> logits [B, T, vocab_size]:
 *    h = drop(wte[idx] + wpe[0..T-1]); h = block_i(h) ...; h = ln_f(h);
 *    logits = h @ wte^T  (lm_head tied to wte: ONE tensor).
 *  Parameter keys, in HF's order: "transformer.wte.weight" [V, E],
 *  "transformer.wpe.weight" [P, E], "transformer.h.{i}.<block keys>",
 *  "transformer.ln_f.{weight,bias}". "lm_head.weight" is not a separate
 *  parameter (as HF's named_parameters(), which skips the tied tensor): a
 *  state dict / SafeTensors file saved from this model has no lm_head key,
 *  and loading a file that has one (HF's state_dict() lists it as the same
 *  tensor) is done with strict = false, or by dropping that key.
 *  Initialisation as HF / the anchor (nanoGPT): every matrix and embedding
 *  ~ N(0, 0.02^2), the c_proj weights (attention and MLP) ~ N(0, (0.02 /
 *  sqrt(2 n_layer))^2), biases 0, LayerNorm weight 1 / bias 0. Type
 *  "GPT2LMHeadModel". Errors: NULL or bad config (EM_ERR_INVALID); forward:
 *  non-integer ids (EM_ERR_DTYPE), rank != 2 or T > n_positions
 *  (EM_ERR_SHAPE naming them). */
EM_API em_module *em_gpt2_new(const em_gpt2_config *cfg);

/* ---- decoder, rotary embeddings, MultiheadAttention extras (issue #16, item 2;
 * nn/transformer_decoder.c, nn/rotary.c) ----------------------------------------
 * Composed from the functions above and ordinary ops, so autodiff gives every
 * backward. Semantics are PyTorch 1.13's (the fixtures' version); where torch
 * 2.x differs it is said. */

/** Options of em_multihead_attention_forward_ex (the keyword arguments of
 *  torch.nn.MultiheadAttention.forward other than query / key / value). */
typedef struct em_mha_forward_opts {
    const em_tensor *key_padding_mask; /**< NULL, or as em_multihead_attention_forward ([S] for unbatched input) */
    const em_tensor *attn_mask;        /**< NULL, [L, S] or [B * num_heads, L, S] ([num_heads, L, S] unbatched) */
    bool need_weights;                 /**< torch's default true: also return the attention weights */
    bool average_attn_weights;         /**< torch's default true: weights averaged over heads */
} em_mha_forward_opts;
/** torch's defaults: no masks, need_weights = true, average_attn_weights = true. */
EM_API em_mha_forward_opts em_mha_forward_opts_default(void);
/** MultiheadAttention.forward(query, key, value, key_padding_mask,
 *  need_weights, attn_mask, average_attn_weights) of torch 1.13, batched or
 *  unbatched:
 *    batched:   query [B, L, E] (batch_first) or [L, B, E], key / value
 *               [B, S, E] or [S, B, E]; key_padding_mask [B, S]; attn_mask
 *               [L, S] or [B * num_heads, L, S]; output as query.
 *    unbatched: query [L, E], key / value [S, E] (batch_first does not
 *               apply, as torch); key_padding_mask [S]; attn_mask [L, S] or
 *               [num_heads, L, S]; output [L, E].
 *  key / value NULL mean the query. Masks: bool (true = masked) or float
 *  (added), as em_multihead_attention_forward; the two masks are each made
 *  additive and summed, in any combination of kinds (torch 2.x does the same;
 *  1.13 merges a float key_padding_mask into a bool attn_mask with
 *  logical_or, i.e. "non-zero = masked", and cannot combine it with a float
 *  attn_mask at all). @p opts NULL means
 *  em_mha_forward_opts_default().
 *  With need_weights the attention weights P = softmax(q k^T / sqrt(E / H) +
 *  masks) [B, H, L, S] — after dropout in training mode, as torch returns
 *  them — are written to *attn_weights as a new reference (tensor.h rules,
 *  like the output): averaged over heads ([B, L, S]: torch's sum(dim=1) /
 *  num_heads) with average_attn_weights, else per head ([B, H, L, S]);
 *  unbatched without the batch dim ([L, S] / [H, L, S]). Whatever
 *  batch_first, the weights are batch-major, as torch's. Without
 *  need_weights *attn_weights (when @p attn_weights is non-NULL) is set to
 *  NULL and a batched call is exactly em_multihead_attention_forward (the
 *  path a fused attention kernel takes); with need_weights the weights are
 *  computed by the composed math path (torch computes them that way too).
 *  Returns the output (a new reference) or NULL. Errors: not a
 *  MultiheadAttention, NULL query, need_weights with a NULL @p attn_weights
 *  (EM_ERR_INVALID); key / value rank differing from the query's, rank not 2
 *  or 3, and the shape errors of em_multihead_attention_forward, stated for
 *  the unbatched shapes when the input is unbatched (EM_ERR_SHAPE); integer
 *  masks (EM_ERR_DTYPE). On an error *attn_weights is NULL. */
EM_API em_tensor *em_multihead_attention_forward_ex(em_module *m, const em_tensor *query, const em_tensor *key, const em_tensor *value,
                                                    const em_mha_forward_opts *opts, em_tensor **attn_weights);

/** torch.nn.TransformerDecoderLayer's arguments (names as PyTorch's; the same
 *  fields as em_transformer_encoder_layer_config). */
typedef struct em_transformer_decoder_layer_config {
    int64_t d_model;         /**< model width; divisible by nhead */
    int64_t nhead;           /**< attention heads (self and cross attention) */
    int64_t dim_feedforward; /**< 2048 */
    double dropout;          /**< 0.1: both attentions' weights, dropout, dropout1/2/3 (training only) */
    const char *activation;  /**< "relu" (default; NULL = "relu") or "gelu" (exact erf form, torch's "gelu") */
    double layer_norm_eps;   /**< 1e-5 */
    bool batch_first;        /**< false: tgt [T, B, d_model], memory [S, B, d_model]; true: [B, T, d] / [B, S, d] */
    bool norm_first;         /**< false: post-norm (torch's default); true: pre-norm */
} em_transformer_decoder_layer_config;
/** PyTorch's defaults for d_model and nhead: (d_model, nhead, 2048, 0.1,
 *  "relu", 1e-5, false, false). */
EM_API em_transformer_decoder_layer_config em_transformer_decoder_layer_config_default(int64_t d_model, int64_t nhead);
/** torch.nn.TransformerDecoderLayer (PyTorch 1.13). Children and keys in
 *  torch's state_dict order: "self_attn.{in_proj_weight [3d, d],
 *  in_proj_bias [3d], out_proj.weight [d, d], out_proj.bias [d]}",
 *  "multihead_attn.{...}" (the same four), "linear1.weight" [f, d],
 *  "linear1.bias" [f], "linear2.weight" [d, f], "linear2.bias" [d],
 *  "norm1/2/3.{weight,bias}" [d]; initialised as torch's (MultiheadAttention's
 *  xavier_uniform in_proj and zero biases, Linear's init, LayerNorm ones /
 *  zeros; not nn.Transformer's xavier re-initialisation). The config is
 *  copied (activation too). Type "TransformerDecoderLayer";
 *  em_module_forward(m, tgt) is self-decoding: memory = tgt, no masks.
 *  Errors: NULL config, d_model not a positive multiple of nhead,
 *  dim_feedforward <= 0, dropout outside [0, 1], layer_norm_eps < 0 or NaN,
 *  an activation other than relu / gelu (EM_ERR_INVALID naming the value). */
EM_API em_module *em_transformer_decoder_layer_new(const em_transformer_decoder_layer_config *cfg);
/** TransformerDecoderLayer.forward(tgt, memory, tgt_mask, memory_mask,
 *  tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal), torch
 *  1.13's code with
 *    sa(x)  = dropout1(self_attn(x, x, x, tgt_mask, tgt_key_padding_mask))
 *    mha(x) = dropout2(multihead_attn(x, memory, memory, memory_mask,
 *                                     memory_key_padding_mask))
 *    ff(x)  = dropout3(linear2(dropout(activation(linear1(x)))))
 *    norm_first:  x = x + sa(norm1(x)); x = x + mha(norm2(x)); x = x + ff(norm3(x))
 *    post-norm:   x = norm1(x + sa(x)); x = norm2(x + mha(x)); x = norm3(x + ff(x))
 *  (the memory is not normalised by the layer). tgt [B, T, d] (batch_first)
 *  or [T, B, d], memory [B, S, d] or [S, B, d]; unbatched tgt [T, d] with
 *  memory [S, d] works too (torch 1.13 takes it: MultiheadAttention's
 *  unbatched form, masks without the batch dim). Float; returns a new
 *  reference of tgt's shape. Masks as em_multihead_attention_forward:
 *  tgt_mask [T, T] or [B * nhead, T, T], memory_mask [T, S] or
 *  [B * nhead, T, S], tgt_key_padding_mask [B, T], memory_key_padding_mask
 *  [B, S]; bool (true = masked) or float (added). tgt_is_causal (torch 2.x's
 *  hint; 1.13 has no such argument): with tgt_mask NULL the causal float
 *  mask (-inf above the diagonal, generate_square_subsequent_mask) is used —
 *  torch 2.x raises "Need attn_mask if specifying the is_causal hint" there;
 *  with a tgt_mask, the mask is used as given (the hint says it is causal).
 *  Dropout only in training mode. Errors: not a TransformerDecoderLayer, NULL
 *  tgt or memory (EM_ERR_INVALID); a rank other than 3 (or 2, unbatched), tgt
 *  and memory of different ranks, batch or width mismatch (EM_ERR_SHAPE
 *  naming the shapes); mask errors as em_multihead_attention_forward. */
EM_API em_tensor *em_transformer_decoder_layer_forward(em_module *m, const em_tensor *tgt, const em_tensor *memory,
                                                       const em_tensor *tgt_mask, const em_tensor *memory_mask,
                                                       const em_tensor *tgt_key_padding_mask, const em_tensor *memory_key_padding_mask,
                                                       bool tgt_is_causal);
/** torch.nn.TransformerDecoder(decoder_layer, num_layers, norm): num_layers
 *  layers built from @p cfg under "layers.{i}.<layer keys>" (type
 *  "ModuleList"), every layer starting with layer 0's values (torch's
 *  _get_clones deep-copies one layer), and with @p final_norm a
 *  LayerNorm(d_model, layer_norm_eps) under "norm.weight/bias" (nn.Transformer
 *  gives its decoder one). Type "TransformerDecoder"; em_module_forward(m,
 *  tgt) is self-decoding without masks. Errors: as
 *  em_transformer_decoder_layer_new, and num_layers outside [1, 100000]
 *  (EM_ERR_INVALID). */
EM_API em_module *em_transformer_decoder_new(const em_transformer_decoder_layer_config *cfg, int64_t num_layers, bool final_norm);
/** TransformerDecoder.forward(tgt, memory, tgt_mask, memory_mask,
 *  tgt_key_padding_mask, memory_key_padding_mask, tgt_is_causal): every
 *  layer with the same memory, masks and hint, then the final norm if any.
 *  Shapes, ownership and errors as em_transformer_decoder_layer_forward (not
 *  a TransformerDecoder: EM_ERR_INVALID). */
EM_API em_tensor *em_transformer_decoder_forward(em_module *m, const em_tensor *tgt, const em_tensor *memory, const em_tensor *tgt_mask,
                                                 const em_tensor *memory_mask, const em_tensor *tgt_key_padding_mask,
                                                 const em_tensor *memory_key_padding_mask, bool tgt_is_causal);

/** Rotary positional embedding (RoPE; Su et al. 2021, "RoFormer: Enhanced
 *  Transformer with Rotary Position Embedding", eq. 34) in the rotate-half
 *  convention of GPT-NeoX and Hugging Face's LLaMA (apply_rotary_pos_emb):
 *  with r = rotary_dim (0 means D), i in [0, r/2) and position p,
 *    theta_i = base^(-2i / r),  a = p * theta_i,
 *    y[i]       = x[i] cos a - x[i + r/2] sin a
 *    y[i + r/2] = x[i + r/2] cos a + x[i] sin a
 *    y[j]       = x[j] for j >= r        (GPT-NeoX's partial rotary, rotary_pct)
 *  i.e. y = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)
 *  and the table cat(a, a). Eq. 34 rotates the adjacent pairs (x_{2i},
 *  x_{2i+1}); rotate-half rotates (x_i, x_{i+r/2}): the same rotation of a
 *  permuted feature order (GPT-J / Mesh-TF's interleaved form is not
 *  offered). Rotating q by position m and k by n makes q . k depend on
 *  m - n only (RoFormer section 3.4.2).
 *  x [..., T, D], any float dtype, T the second-to-last dim (e.g. [B, H, T,
 *  head_dim] or [B, T, D]); r even, 0 < r <= D. Positions: @p positions NULL
 *  means p_t = offset + t; else an int64 / int32 tensor [T] (shared by every
 *  row), or [B, T] for x [B, T, D] or [B, H, T, D] (per batch row, broadcast
 *  over heads, HF's position_ids), to which @p offset is added. The angles,
 *  cos and sin are computed in double on the host (the positions tensor is
 *  read back: a wait) and rounded once to x's dtype (HF computes inv_freq
 *  and p * inv_freq in float32, whose angles are off by up to 7e-5 rad at
 *  p = 3000..3004 for r = 32, measured with torch 1.13). base > 0 and finite (10000 in RoFormer, GPT-NeoX, LLaMA 1/2;
 *  500000 in LLaMA 3). Differentiable in x (the tables are constants; the
 *  backward is autodiff's of the narrows, cat, multiplies and add). Returns
 *  a new reference of x's shape and dtype. Errors: NULL x (EM_ERR_INVALID);
 *  non-float x or non-integer positions (EM_ERR_DTYPE); rank < 2, r odd,
 *  r > D or r < 0, positions of another shape (EM_ERR_SHAPE naming them);
 *  base <= 0 or not finite (EM_ERR_INVALID). */
EM_API em_tensor *em_rotary_embedding(const em_tensor *x, const em_tensor *positions, int64_t offset, double base, int64_t rotary_dim);
/* ---- GPT-2 generation: KV cache, sampling, the decoding loop (issue #16,
 * item 5; nn/gpt2_generate.c) ------------------------------------------------ */

/** Copies the configuration @p gpt was built with into @p out. Errors: NULL
 *  arguments, or @p gpt not a GPT2LMHeadModel (EM_ERR_INVALID naming its
 *  type). */
EM_API em_status em_gpt2_get_config(const em_module *gpt, em_gpt2_config *out);

/** The keys and values of every layer of one GPT2LMHeadModel for a batch of
 *  sequences, so that decoding one more token costs one token's forward. */
typedef struct em_gpt2_cache em_gpt2_cache;

/** A cache for @p gpt (borrowed: it must outlive the cache, and the cache
 *  serves that model only), @p batch sequences of up to @p max_len tokens.
 *  It preallocates, per layer, a key and a value tensor [batch, n_head,
 *  max_len, n_embd / n_head] of wte's dtype (float32 for em_gpt2_new's
 *  models), zero-filled: 2 * n_layer * batch * max_len * n_embd elements.
 *  Its length starts at 0. The cache owns these tensors whatever scope is
 *  open. Errors: NULL or not a GPT2LMHeadModel (EM_ERR_INVALID naming the
 *  type), batch < 1, max_len < 1 or max_len > n_positions (EM_ERR_INVALID
 *  naming the values), EM_ERR_NOMEM. Free with em_gpt2_cache_free. */
EM_API em_gpt2_cache *em_gpt2_cache_new(const em_module *gpt, int64_t batch, int64_t max_len);
/** The forward of @p gpt on T_new new tokens @p idx [batch, T_new] (int64 or
 *  int32 ids in [0, vocab_size)) that continue the L = em_gpt2_cache_length
 *  tokens the cache holds: positions L .. L + T_new - 1 (wpe rows), every
 *  new query attends to the L cached keys and to the new keys up to its own
 *  position (causal, the mask aligned to the bottom right: query i sees keys
 *  j <= L + i; an explicit boolean mask when L > 0 and T_new > 1, is_causal
 *  when L = 0). Returns the logits of the new positions, a new reference
 *  [batch, T_new, vocab_size] (wte's dtype), equal to the matching rows of
 *  em_module_forward(gpt, all L + T_new tokens) up to rounding, and appends
 *  the new keys and values (written into the preallocated buffers through
 *  views, em_copy_; attention reads the first L + T_new keys through views,
 *  via em_scaled_dot_product_attention). The cache length becomes L + T_new.
 *  Inference only: dropout is off whatever the module's training mode, and
 *  nothing is recorded for autodiff (the result does not require grad).
 *  Errors, with the cache left unchanged: NULL arguments or a cache made for
 *  another model (EM_ERR_INVALID), non-integer ids (EM_ERR_DTYPE), rank != 2,
 *  T_new < 1, a batch other than the cache's, or L + T_new above the cache's
 *  max_len (EM_ERR_SHAPE naming the lengths; max_len <= n_positions, so
 *  n_positions is never exceeded). Ids out of range are reported as the
 *  Embedding reports them (the sticky kernel error on the CPU, when the
 *  logits are read: tensor.h); the length has advanced then, and the
 *  cache must be reset. */
EM_API em_tensor *em_gpt2_forward_cached(em_module *gpt, em_gpt2_cache *cache, const em_tensor *idx);
/** Tokens the cache holds (0 after em_gpt2_cache_new / reset; -1 for NULL). */
EM_API int64_t em_gpt2_cache_length(const em_gpt2_cache *cache);
/** The max_len the cache was made with (-1 for NULL). */
EM_API int64_t em_gpt2_cache_max_len(const em_gpt2_cache *cache);
/** Empties the cache (length 0) for a new sequence; the buffers are kept
 *  (not cleared: positions past the length are never read). NULL: no-op. */
EM_API void em_gpt2_cache_reset(em_gpt2_cache *cache);
/** Frees the cache and releases its tensors (NULL: no-op). */
EM_API void em_gpt2_cache_free(em_gpt2_cache *cache);

/** How the next token is drawn from logits (names as Hugging Face's
 *  GenerationConfig). */
typedef struct em_sampling {
    double temperature; /**< 1.0; 0 = greedy (argmax); > 0 divides the logits */
    int64_t top_k;      /**< 0 = off; else keep the top_k most likely (ties with the k-th kept) */
    double top_p;       /**< 1.0 = off; in (0, 1]: nucleus sampling */
} em_sampling;
/** {temperature 1, top_k 0, top_p 1}: sampling from softmax(logits). */
EM_API em_sampling em_sampling_default(void);

/** Draws one token id per row of @p logits, host float32 [batch, vocab] row
 *  major (e.g. the last position's logits, copied with em_to_host), into
 *  @p out [batch]. With temperature 0: the argmax (the first on ties), no
 *  draw. Else, per row, as Hugging Face's sampling (transformers'
 *  TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, applied in
 *  that order, then softmax and a multinomial draw), in double precision:
 *    1. s_i = logit_i / temperature;
 *    2. top_k > 0: tokens with s_i below the top_k-th largest s are removed
 *       (s_i = -inf; ties with it stay: more than top_k tokens may remain);
 *    3. top_p < 1: with p_i = softmax(s)_i and the tokens sorted by p
 *       descending (ties: lower id first), token number r (0-based) is kept
 *       iff the tokens before it sum to less than top_p: the smallest set of
 *       most likely tokens whose cumulative probability reaches top_p, at
 *       least one token (HF removes cumsum of the ascending order <= 1 -
 *       top_p: the same set, up to rounding at the boundary, HF's in float32);
 *    4. one uniform u in [0, 1) from @p rng, and the first id (in id order)
 *       whose cumulative weight exp(s_i - max s) exceeds u times their sum.
 *  The generator: splitmix64 on the 64-bit state *@p rng (Steele, Lea &
 *  Flood 2014; em_splitmix64's constants), u = (next >> 11) * 2^-53, one
 *  draw per row, rows in order, *rng advanced. So the same state and the
 *  same logits give the same ids on every run and machine (sampling is host
 *  arithmetic; logits computed on different devices may differ in the last
 *  bits, which can change a draw that falls at a boundary). Not torch's
 *  stream: the same seed does not give PyTorch's tokens. -inf logits are
 *  never drawn. Errors (EM_ERR_INVALID, nothing written): NULL arguments,
 *  batch or vocab < 1, temperature < 0 or not finite, top_k < 0, top_p not
 *  in (0, 1], a NaN or +inf logit, or a row whose logits are all -inf (each
 *  naming the row and id). */
EM_API em_status em_sample_logits(const float *logits, int64_t batch, int64_t vocab, const em_sampling *s, uint64_t *rng,
                                  int64_t *out);

/** The bytes of token @p id (not NUL-terminated, valid until the next call)
 *  and their count in *@p len, or NULL (an error recorded) when @p id has no
 *  bytes; e.g. a wrapper of em_tokenizer_token (ember/text.h). */
typedef const char *(*em_token_bytes_fn)(int64_t id, size_t *len, void *ud);
/** Called once per generated token, in order: @p id the token (also in
 *  out[]), @p text[0..n) the generated text that is now final (see
 *  em_gpt2_generate; NULL, 0 without a token_bytes function). Return 0 to go
 *  on, anything else to stop after this token. */
typedef int (*em_generate_cb)(int64_t id, const char *text, size_t n, void *ud);

/** Options of em_gpt2_generate. */
typedef struct em_generate_opts {
    int64_t max_new_tokens;       /**< >= 1; n_prompt + max_new_tokens <= n_positions */
    em_sampling sampling;         /**< em_sampling_default() */
    uint64_t seed;                /**< the sampler's splitmix64 state starts here (0) */
    int64_t vocab_limit;          /**< 0: every id is drawn; else only ids < vocab_limit (e.g. the
                                       tokenizer's vocabulary when the model's is padded) */
    const char *stop;             /**< NULL or "": none; else stop when the generated text contains it */
    em_token_bytes_fn token_bytes; /**< needed for stop and for the text of on_token; NULL: ids only */
    void *token_bytes_ud;
    em_generate_cb on_token;      /**< NULL: none */
    void *on_token_ud;
} em_generate_opts;
/** {max_new_tokens 1, em_sampling_default(), seed 0, the rest 0 / NULL}. */
EM_API em_generate_opts em_generate_opts_default(void);

/** Why em_gpt2_generate stopped. */
typedef enum em_generate_stop {
    EM_GENERATE_MAX_TOKENS = 0,  /**< max_new_tokens generated */
    EM_GENERATE_STOP_STRING = 1, /**< the generated text contains opts.stop */
    EM_GENERATE_CALLBACK = 2,    /**< on_token returned non-zero */
} em_generate_stop;

/** What em_gpt2_generate did. */
typedef struct em_generate_result {
    int64_t prompt_tokens;    /**< n_prompt */
    int64_t new_tokens;       /**< ids written to out */
    double prefill_s;         /**< seconds: the prompt's forward and the first draw (time to first token) */
    double decode_s;          /**< seconds from then to the end: the new_tokens - 1 one-token forwards and
                                   draws (and the on_token calls) */
    em_generate_stop stopped;
} em_generate_result;

/** Autoregressive generation for ONE sequence (batch 1) with a KV cache:
 *  the prompt @p prompt[0..n_prompt) (ids, n_prompt >= 1) goes through
 *  em_gpt2_forward_cached at once (prefill), a token is drawn from the last
 *  position's logits with em_sample_logits (state seeded with opts.seed),
 *  then each drawn token is fed alone (one position per step) until
 *  max_new_tokens tokens, the stop string or the callback ends it. The ids go
 *  to @p out (max_new_tokens entries, may be NULL) and a summary to @p res
 *  (may be NULL).
 *  Stop string: checked on the generated text only (the bytes of the new
 *  tokens, concatenated, as em_tokenizer_decode gives them; the prompt is not
 *  searched, so a stop string that starts in the prompt is not seen). When
 *  it appears, generation stops after the token that completed it; that
 *  token is in out[] and counted, but the text handed to on_token ends just
 *  before the stop string: the stop string and whatever followed it in that
 *  token are never passed on. To make that possible on_token's text lags:
 *  bytes that could be the start of the stop string are held back until the
 *  next tokens decide (at most strlen(stop) - 1 bytes); at max_new_tokens
 *  the last call gets everything left. So the concatenated text of the
 *  calls is the generated text cut before the stop string (whole when it
 *  never appears), except after an on_token stop, which drops what was held.
 *  The model is run as em_gpt2_forward_cached does (inference, no dropout,
 *  nothing recorded). Errors: NULL gpt / prompt / opts, not a
 *  GPT2LMHeadModel, n_prompt < 1, max_new_tokens < 1, n_prompt +
 *  max_new_tokens > n_positions ("prompt (P tokens) + max_new_tokens (N) =
 *  ... exceeds n_positions ..."; a KV cache holds n_positions positions, and
 *  this function does not crop the context as nanoGPT's generate does), a
 *  prompt id outside [0, vocab_size), vocab_limit < 0 or > vocab_size, a
 *  stop string without token_bytes, bad sampling options (as
 *  em_sample_logits) (all EM_ERR_INVALID, nothing run), and then the
 *  errors of the forward, of em_sample_logits and of token_bytes
 *  (out[] then holds the ids drawn so far, res->new_tokens their count). */
EM_API em_status em_gpt2_generate(em_module *gpt, const int64_t *prompt, int64_t n_prompt, const em_generate_opts *opts,
                                  int64_t *out, em_generate_result *res);

/* ---- functional forms ----------------------------------------------------- */

/** y = x W^T + b; x [..., in], weight [out, in], bias [out] or NULL. */
EM_API em_tensor *em_linear(const em_tensor *x, const em_tensor *weight, const em_tensor *bias);
/** Dropout with probability @p p when @p training (else a view of x). */
EM_API em_tensor *em_dropout(const em_tensor *x, double p, bool training);
/** torch.nn.functional.layer_norm over the last @p ndim dims of x (float,
 *  rank >= ndim >= 1): per row of those dims' N values, y = (x - mean) /
 *  sqrt(var + eps) * weight + bias, with var the biased variance (as torch).
 *  weight / bias: the shape of the last @p ndim dims, or NULL (no scale /
 *  shift). Result dtype: x's promoted with the float weight / bias (a
 *  16-bit x computes in f32 and is rounded once; f32 inside an autocast
 *  region). With weight and bias both given (of x's dtype, or f32 / 16-bit)
 *  it runs as one fused task forward and one backward (LAYER_NORM,
 *  LAYER_NORM_BWD: mean and rstd in double on CPU and CUDA, 16-bit inputs in
 *  f32), otherwise as ordinary ops. Errors: NULL x (EM_ERR_INVALID), ndim
 *  out of range or weight / bias of another shape (EM_ERR_SHAPE), a
 *  non-float x (EM_ERR_DTYPE). */
EM_API em_tensor *em_layer_norm(const em_tensor *x, int ndim, const em_tensor *weight, const em_tensor *bias, double eps);
/** RMS norm over the last dim; weight [D] or NULL; eps < 0: dtype epsilon. */
EM_API em_tensor *em_rms_norm(const em_tensor *x, const em_tensor *weight, double eps);

/* ---- normalization and resampling (NCHW; convolution and pooling are tensor
 * ops: include/ember/tensor.h) ------------------------------------------ */

/** torch.nn.functional.batch_norm on x [N, C, ...] (rank 2 to 5) with
 *  per-channel statistics over every dim but 1. Training: normalises with
 *  the batch mean and biased variance, and (when running_mean/running_var
 *  are given) updates them in place, running = (1 - momentum) * running +
 *  momentum * batch, the variance unbiased (n / (n - 1)), as PyTorch. Eval
 *  (training false): normalises with running_mean/running_var (required).
 *  weight/bias [C] or NULL. PyTorch defaults: momentum 0.1, eps 1e-5.
 *  Computed as mean / biased variance reductions and element-wise ops, so it
 *  is differentiable (the running statistics get no gradient: they are
 *  updated under no-grad, cast to their own dtype). Errors: training with
 *  one value per channel (EM_ERR_SHAPE "expected more than 1 value per
 *  channel when training, got input size [1, 3]", as PyTorch); rank outside
 *  2..5, weight/bias/running stats not [C] (EM_ERR_SHAPE naming both
 *  shapes); only one of running_mean / running_var, eval without them,
 *  momentum outside [0, 1], eps < 0 (EM_ERR_INVALID); non-float input
 *  (EM_ERR_DTYPE). */
EM_API em_tensor *em_batch_norm(const em_tensor *x, em_tensor *running_mean, em_tensor *running_var, const em_tensor *weight,
                                const em_tensor *bias, bool training, double momentum, double eps);
/** torch.nn.functional.group_norm: x [N, C, ...], C divisible by num_groups;
 *  mean and biased variance over each group's channels and spatial dims
 *  (x viewed as [N, G, C/G * prod(spatial)]), y = (x - mean) / sqrt(var +
 *  eps) * weight + bias; weight/bias [C] or NULL. Errors: num_groups <= 0 or
 *  not dividing C, rank < 2, weight/bias not [C] (EM_ERR_SHAPE naming the
 *  shapes); non-float input (EM_ERR_DTYPE). */
EM_API em_tensor *em_group_norm(const em_tensor *x, int64_t num_groups, const em_tensor *weight, const em_tensor *bias, double eps);
/** torch.nn.functional.instance_norm without running statistics: group_norm
 *  with one group per channel; x [N, C, L, ...] (rank >= 3, EM_ERR_SHAPE
 *  otherwise). */
EM_API em_tensor *em_instance_norm(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, double eps);

/** torch.nn.functional.interpolate on x [N, C, H, W] (float) to [N, C, oh,
 *  ow] (size=(oh, ow)); align_corners as PyTorch (bilinear only; false is
 *  the default). Source indices as ATen/native/UpSample.h, per dim of
 *  input size I and output size O:
 *    nearest: src = min(floor(dst * s), I - 1) with s = (float)I / O in
 *             float32 (so float rounding picks the same pixels as PyTorch);
 *    bilinear: s = (I - 1) / (O - 1) with align_corners (0 when O = 1), else
 *             I / O (in x's dtype); src = s * dst with align_corners, else
 *             max(s * (dst + 0.5) - 0.5, 0); out = (1 - l) x[i0] + l x[i1]
 *             with i0 = floor(src), i1 = min(i0 + 1, I - 1), l = src - i0.
 *  Same size is the identity. Separable (H, then W); differentiable
 *  (index_select gathers and weighted sums). Errors: rank != 4 or an empty
 *  input / output size (EM_ERR_SHAPE), align_corners with NEAREST
 *  (EM_ERR_INVALID), non-float input (EM_ERR_DTYPE). */
EM_API em_tensor *em_interpolate(const em_tensor *x, int64_t oh, int64_t ow, em_interp_mode mode, bool align_corners);

/* ---- losses ----------------------------------------------------------------
 * Written with ordinary differentiable ops, so em_backward covers them.
 * Shapes are checked: mismatches are EM_ERR_SHAPE errors that name the
 * shapes; class targets must be int64 (EM_ERR_DTYPE otherwise). Results are
 * 0-d for MEAN/SUM, per-element for NONE. */

typedef enum em_reduction {
    EM_REDUCTION_MEAN = 0, /**< PyTorch default */
    EM_REDUCTION_SUM = 1,
    EM_REDUCTION_NONE = 2,
} em_reduction;

/** Options of em_cross_entropy / em_nll_loss (torch.nn.functional names). */
typedef struct em_cross_entropy_opts {
    em_reduction reduction;   /**< MEAN */
    int64_t ignore_index;     /**< -100: targets equal to it add nothing (loss 0) */
    double label_smoothing;   /**< 0.0; in [0, 1]; cross-entropy only */
    const em_tensor *weight;  /**< NULL, or [C] class weights (borrowed) */
} em_cross_entropy_opts;
/** The PyTorch defaults above. */
EM_API em_cross_entropy_opts em_cross_entropy_opts_default(void);

/** torch.nn.functional.cross_entropy from @p logits [N, C] (float) and class
 *  indices @p target [N] (i64); opts NULL = defaults. With w_i = weight[y_i]
 *  (1 without weights) and 0 for ignored targets, lp = log_softmax(logits):
 *    nll_i    = -w_i * lp[i, y_i]
 *    smooth_i = -sum_c weight[c] * lp[i, c]   (0 for ignored targets)
 *    loss_i   = (1 - ls) * nll_i + ls / C * smooth_i
 *  MEAN divides the sum by sum_i w_i over non-ignored targets (PyTorch's
 *  weighted mean: NaN when every target is ignored), SUM sums, NONE returns
 *  [N]. (ATen cross_entropy_loss_label_smoothing.) */
EM_API em_tensor *em_cross_entropy(const em_tensor *logits, const em_tensor *target, const em_cross_entropy_opts *opts);
/** torch.nn.functional.nll_loss on log-probabilities [N, C]: the nll_i term
 *  above (label_smoothing must be 0). */
EM_API em_tensor *em_nll_loss(const em_tensor *log_probs, const em_tensor *target, const em_cross_entropy_opts *opts);
/** (x - y)^2, shapes equal. */
EM_API em_tensor *em_mse_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction);
/** |x - y|. */
EM_API em_tensor *em_l1_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction);
/** z = |x - y|: 0.5 z^2 / beta if z < beta else z - 0.5 beta (beta = 0: L1).
 *  PyTorch default beta = 1.0. */
EM_API em_tensor *em_smooth_l1_loss(const em_tensor *input, const em_tensor *target, double beta, em_reduction reduction);
/** z = |x - y|: 0.5 z^2 if z < delta else delta (z - 0.5 delta). delta > 0,
 *  PyTorch default 1.0. */
EM_API em_tensor *em_huber_loss(const em_tensor *input, const em_tensor *target, double delta, em_reduction reduction);

/** Options of em_binary_cross_entropy_with_logits. */
typedef struct em_bce_opts {
    em_reduction reduction;      /**< MEAN */
    const em_tensor *weight;     /**< NULL or per-element weight broadcast to the input */
    const em_tensor *pos_weight; /**< NULL or weight of positive examples, broadcast
                                      to the input (typically [C] for [N, C]) */
} em_bce_opts;
EM_API em_bce_opts em_bce_opts_default(void);
/** torch.nn.functional.binary_cross_entropy_with_logits:
 *    loss = (1 - y) x + lw * log(1 + exp(-x)),  lw = 1 + (pos_weight - 1) y
 *  (without pos_weight: max(x, 0) - x y + log1p(exp(-|x|))), then * weight.
 *  Computed as (1 - y) softplus(x) + pos_weight y softplus(-x), which is the
 *  same function without cancellation at large |x| (exact for y in {0, 1}).
 *  input and target (float, values in [0, 1]) of one shape. */
EM_API em_tensor *em_binary_cross_entropy_with_logits(const em_tensor *input, const em_tensor *target, const em_bce_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
