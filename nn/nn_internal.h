/* Shared by the nn/ sources: internals (errors) and small helpers. */
#ifndef EMBER_NN_INTERNAL_H
#define EMBER_NN_INTERNAL_H

#include "ember/nn.h"
#include "ember/amp.h"
#include "tasks/tasks_internal.h"

/* Formats t's shape into a stack buffer (for error messages). */
#define NN_SHAPE(t, buf) em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), buf, sizeof buf)

/* Scope helper for functions built from several ops: open a scope, compute,
 * then NN_RETURN(r) keeps r for the caller (moved to the enclosing scope, or
 * caller-owned outside any scope) and closes the scope. */
static inline em_tensor *nn_return(em_tensor *r)
{
    if (r) em_keep(r);
    em_scope_end();
    return r;
}

/* The composed norms (layer, RMS, group, instance, batch norm in eval)
 * compute a 16-bit input in f32 (a recorded cast), as PyTorch's opmath, and
 * round the result once to its dtype: x's promoted with the float affine
 * parameters' (f32 inside an autocast region). In 16 bits the mean, the variance and x - mean would each be
 * rounded (off by the whole output scale for an input far from zero). */
static inline em_dtype nn_norm_dtype(const em_tensor *x, const em_tensor *w, const em_tensor *b)
{
    em_dtype d = em_tensor_dtype(x);
    if (w && em_dtype_is_float(em_tensor_dtype(w))) d = em__promote(d, em_tensor_dtype(w));
    if (b && em_dtype_is_float(em_tensor_dtype(b))) d = em__promote(d, em_tensor_dtype(b));
    /* inside an autocast region the norms are f32 ops (torch's list; their
     * reductions are F_AC_F32): the result stays f32 */
    if (em_autocast_dtype() != EM_F32 && em_dtype_size(d) == 2) d = EM_F32;
    return d;
}
/* x widened to f32 when it is 16-bit (inside the caller's scope), else x. */
static inline const em_tensor *nn_norm_input(const em_tensor *x)
{
    return em_dtype_size(em_tensor_dtype(x)) == 2 ? em_cast(x, EM_F32) : x;
}
/* y rounded to dt when they differ (y may be NULL). */
static inline em_tensor *nn_norm_output(em_tensor *y, em_dtype dt)
{
    return y && em_tensor_dtype(y) != dt ? em_cast(y, dt) : y;
}

/* The vtable a module was made with (nn/module.c). */
const em_module_vtable *em__module_vtable(const em_module *m);

/* A MultiheadAttention's settings (nn/transformer.c), for the forms built on
 * it in nn/transformer_decoder.c; false (nothing written) when m is not one. */
bool em__mha_settings(const em_module *m, int64_t *embed_dim, int64_t *num_heads, double *dropout, bool *batch_first);

/* ---- private data of the vision modules (nn/vision.c): the settings each
 * was built with, so a model can be described (type name + these). The
 * tensor pointers are borrowed from the module's parameter / buffer lists
 * (NULL when absent). ---------------------------------------------------- */

typedef struct em__conv_impl {
    int spatial;          /* 1: Conv1d, 2: Conv2d / ConvTranspose2d */
    bool transposed;      /* ConvTranspose2d */
    int64_t in_channels, out_channels;
    int64_t kernel[2];    /* (kH, kW); Conv1d: (k, 1) */
    em_conv_opts opts;
    em_tensor *weight, *bias;
} em__conv_impl;

typedef struct em__pool_impl {
    em_pool_opts opts;    /* MaxPool2d / AvgPool2d */
    int64_t out[2];       /* AdaptiveAvgPool2d: (oh, ow) */
} em__pool_impl;

typedef struct em__batch_norm_impl {
    int64_t num_features;
    double eps, momentum;
    bool affine, track_running_stats;
    em_tensor *weight, *bias, *running_mean, *running_var, *num_batches_tracked;
} em__batch_norm_impl;

typedef struct em__group_norm_impl {
    int64_t num_groups, num_channels;
    double eps;
    bool affine;
    em_tensor *weight, *bias;
} em__group_norm_impl;

typedef struct em__flatten_impl {
    int start_dim, end_dim;
} em__flatten_impl;

typedef struct em__upsample_impl {
    int64_t size[2];      /* (oh, ow) */
    em_interp_mode mode;
    bool align_corners;
} em__upsample_impl;

/* em_scaled_dot_product_attention's composed math path (nn/transformer.c):
 * matmul, masked_fill / add, softmax, dropout, matmul, with checked inputs
 * and the scale resolved (> 0). What the fused op (em__sdpa) is tested
 * against (tests/test_attention.c); EMBER_SDPA=math routes every call here. */
EM_TEST_API em_tensor *em__sdpa_math(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *mask,
                                     bool is_causal, double dropout_p, double scale, bool training);

/* The checks shared by the encoder and decoder layer configs (nn/transformer.c):
 * d_model a positive multiple of nhead, dim_feedforward > 0, dropout in
 * [0, 1], layer_norm_eps >= 0, activation relu (NULL) or gelu (*gelu set);
 * EM_ERR_INVALID naming the value, prefixed by fn. */
em_status em__tf_layer_check(int64_t d_model, int64_t nhead, int64_t dim_feedforward, double dropout, const char *activation,
                             double layer_norm_eps, const char *fn, bool *gelu);

/* Adds to m the "layers" ModuleList of num_layers layers made by make(cfg),
 * every layer starting with layer 0's values (torch's _get_clones deep-copies
 * one layer), and with final_norm "norm" = LayerNorm(d_model,
 * layer_norm_eps): the body of TransformerEncoder and TransformerDecoder
 * (nn/transformer.c). On an error (prefixed by fn) the caller frees m. */
em_status em__tf_add_layer_stack(em_module *m, em_module *(*make)(const void *cfg), const void *cfg, int64_t num_layers, bool final_norm,
                                int64_t d_model, double layer_norm_eps, const char *fn);

#endif
