/* Layers: Linear, Embedding, Dropout, LayerNorm, RMSNorm, Sequential and the
 * activation modules, plus their functional forms. Forward passes are made
 * of ordinary ops, so autodiff covers them; layer norm with weight and bias
 * is one fused op (LAYER_NORM, tasks/norm.c) with its own backward rule. */
#include "nn/nn_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A new float32 tensor of @p shape, owned by the caller whatever scope is
 * open (the scope's reference is dropped at em_scope_end). */
static em_tensor *new_param(const int64_t *shape, int ndim)
{
    em_scope_begin();
    em_tensor *t = em_zeros(shape, ndim, EM_F32);
    em_tensor_retain(t);
    em_scope_end();
    return t;
}

/* Registers t as parameter name of m and drops the local reference. */
static em_status give_param(em_module *m, const char *name, em_tensor *t)
{
    em_status st = em_module_add_param(m, name, t);
    em_tensor_release(t);
    return st;
}

/* ---- functional forms ------------------------------------------------------- */

em_tensor *em_linear(const em_tensor *x, const em_tensor *weight, const em_tensor *bias)
{
    if (!x || !weight) return em__fail(EM_ERR_INVALID, "em_linear: %s is NULL", !x ? "input" : "weight");
    char sx[160], sw[160], sb[160];
    if (em_tensor_ndim(weight) != 2)
        return em__fail(EM_ERR_SHAPE, "em_linear: weight must be [out_features, in_features], got %s", NN_SHAPE(weight, sw));
    if (em_tensor_ndim(x) < 1 || em_tensor_dim(x, -1) != em_tensor_dim(weight, 1))
        return em__fail(EM_ERR_SHAPE, "em_linear: input of shape %s does not end with in_features = %lld (weight %s)",
                        NN_SHAPE(x, sx), (long long)em_tensor_dim(weight, 1), NN_SHAPE(weight, sw));
    if (bias && (em_tensor_ndim(bias) != 1 || em_tensor_dim(bias, 0) != em_tensor_dim(weight, 0)))
        return em__fail(EM_ERR_SHAPE, "em_linear: bias of shape %s does not match out_features = %lld (weight %s)",
                        NN_SHAPE(bias, sb), (long long)em_tensor_dim(weight, 0), NN_SHAPE(weight, sw));
    {   /* autocast: x, weight and bias in the low dtype (torch's linear is on its low list, bias
         * included): the product and the bias add stay low, the output too */
        const em_tensor *ins[3] = {x, weight, bias};
        em_tensor *c[3];
        EM_AUTOCAST_RERUN(EM_OP_MATMUL, ins, 3, c, em_linear(c[0], c[1], c[2]));
    }
    em_scope_begin();
    em_tensor *y = em_matmul(x, em_transpose(weight, 0, 1));
    if (bias) y = em_add(y, bias);
    return nn_return(y);
}

em_tensor *em_dropout(const em_tensor *x, double p, bool training)
{
    if (!x) return em__fail(EM_ERR_INVALID, "em_dropout: input is NULL");
    if (!(p >= 0 && p <= 1)) return em__fail(EM_ERR_INVALID, "em_dropout: probability must be in [0, 1], got %g", p);
    if (!training || p == 0) return em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)); /* identity (a view) */
    if (!em_dtype_is_float(em_tensor_dtype(x)))
        return em__fail(EM_ERR_DTYPE, "em_dropout: input must be float, got %s", em_dtype_name(em_tensor_dtype(x)));
    em_scope_begin();
    em_tensor *y;
    if (p == 1) {
        y = em_mul_scalar(x, 0.0);
    } else {
        em_tensor *mask = em_rand_bernoulli(em_tensor_shape(x), em_tensor_ndim(x), em_tensor_dtype(x), 1.0 - p);
        y = em_mul(x, em_mul_scalar(mask, 1.0 / (1.0 - p)));
    }
    return nn_return(y);
}

/* Whether em_layer_norm runs the fused op (LAYER_NORM, tasks/norm.c): weight
 * and bias both given, float, and either of x's dtype (f32, f64, or one
 * 16-bit dtype: the door widens the op, rounding the result once as the
 * composed path does), or all f32 / 16-bit with the result f32 (odt: a
 * 16-bit x with f32 parameters, or any 16-bit operand inside an autocast
 * region), where the fused op runs on the widened operands. Mixed f32 / f64
 * and empty inputs stay composed. */
static bool ln_fused(const em_tensor *x, const em_tensor *weight, const em_tensor *bias, em_dtype odt)
{
    if (!weight || !bias || em_tensor_numel(x) == 0) return false;
    const em_dtype xd = em_tensor_dtype(x), wd = em_tensor_dtype(weight), bd = em_tensor_dtype(bias);
    if (!em_dtype_is_float(wd) || !em_dtype_is_float(bd)) return false;
    if (xd == wd && xd == bd && odt == xd) return true;
    const em_dtype d[3] = {xd, wd, bd};
    for (int i = 0; i < 3; i++)
        if (d[i] != EM_F32 && d[i] != EM_F16 && d[i] != EM_BF16) return false;
    return odt == EM_F32;
}

em_tensor *em_layer_norm(const em_tensor *x, int ndim, const em_tensor *weight, const em_tensor *bias, double eps)
{
    if (!x) return em__fail(EM_ERR_INVALID, "em_layer_norm: input is NULL");
    char sx[160], sw[160];
    int nd = em_tensor_ndim(x);
    if (ndim < 1 || ndim > nd)
        return em__fail(EM_ERR_SHAPE, "em_layer_norm: cannot normalize the last %d dims of an input of shape %s", ndim, NN_SHAPE(x, sx));
    if (!em_dtype_is_float(em_tensor_dtype(x)))
        return em__fail(EM_ERR_DTYPE, "em_layer_norm: input must be float, got %s", em_dtype_name(em_tensor_dtype(x)));
    const em_tensor *wb[2] = {weight, bias};
    for (int k = 0; k < 2; k++) {
        const em_tensor *w = wb[k];
        if (!w) continue;
        if (em_tensor_ndim(w) != ndim || memcmp(em_tensor_shape(w), em_tensor_shape(x) + nd - ndim, sizeof(int64_t) * (size_t)ndim))
            return em__fail(EM_ERR_SHAPE, "em_layer_norm: %s of shape %s does not match the last %d dims of the input %s",
                            k ? "bias" : "weight", NN_SHAPE(w, sw), ndim, NN_SHAPE(x, sx));
    }
    int dims[EM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = nd - ndim + i;
    em_scope_begin();
    const em_dtype odt = nn_norm_dtype(x, weight, bias);
    if (ln_fused(x, weight, bias, odt)) {
        /* one LAYER_NORM task forward, one LAYER_NORM_BWD backward (tasks/norm.c),
         * in odt: the operands of another dtype are widened to it by recorded
         * (exact) casts, as the composed path below widens x */
        const em_tensor *xs = em_tensor_dtype(x) == odt ? x : em_cast(x, odt);
        const em_tensor *ws = em_tensor_dtype(weight) == odt ? weight : em_cast(weight, odt);
        const em_tensor *bs = em_tensor_dtype(bias) == odt ? bias : em_cast(bias, odt);
        em_tensor *stats = NULL;
        return nn_return(xs && ws && bs ? em__layer_norm(xs, ndim, ws, bs, eps, &stats) : NULL);
    }
    const em_tensor *xf = nn_norm_input(x);
    em_tensor *mean = em_mean(xf, dims, ndim, true);
    em_tensor *xc = em_sub(xf, mean);
    em_tensor *var = em_mean(em_square(xc), dims, ndim, true); /* biased, as torch */
    em_tensor *y = em_mul(xc, em_rsqrt(em_add_scalar(var, eps)));
    if (weight) y = em_mul(y, weight);
    if (bias) y = em_add(y, bias);
    return nn_return(nn_norm_output(y, odt));
}

em_tensor *em_rms_norm(const em_tensor *x, const em_tensor *weight, double eps)
{
    if (!x) return em__fail(EM_ERR_INVALID, "em_rms_norm: input is NULL");
    char sx[160], sw[160];
    if (em_tensor_ndim(x) < 1) return em__fail(EM_ERR_SHAPE, "em_rms_norm: input must have at least 1 dim, got %s", NN_SHAPE(x, sx));
    if (!em_dtype_is_float(em_tensor_dtype(x)))
        return em__fail(EM_ERR_DTYPE, "em_rms_norm: input must be float, got %s", em_dtype_name(em_tensor_dtype(x)));
    if (weight && (em_tensor_ndim(weight) != 1 || em_tensor_dim(weight, 0) != em_tensor_dim(x, -1)))
        return em__fail(EM_ERR_SHAPE, "em_rms_norm: weight of shape %s does not match the last dim of the input %s", NN_SHAPE(weight, sw),
                        NN_SHAPE(x, sx));
    if (eps < 0) eps = em_tensor_dtype(x) == EM_F64 ? DBL_EPSILON : FLT_EPSILON;
    int last = -1;
    em_scope_begin();
    const em_dtype odt = nn_norm_dtype(x, weight, NULL);
    const em_tensor *xf = nn_norm_input(x);
    em_tensor *ms = em_mean(em_square(xf), &last, 1, true);
    em_tensor *y = em_mul(xf, em_rsqrt(em_add_scalar(ms, eps)));
    if (weight) y = em_mul(y, weight);
    return nn_return(nn_norm_output(y, odt));
}

/* ---- Linear ------------------------------------------------------------------- */

typedef struct linear_impl {
    int64_t in, out;
    em_tensor *weight, *bias; /* borrowed from the module's parameter list */
} linear_impl;

static em_tensor *linear_forward(em_module *m, const em_tensor *x)
{
    linear_impl *l = em_module_impl(m);
    return em_linear(x, l->weight, l->bias);
}

static const em_module_vtable LINEAR_VT = {"Linear", linear_forward, free};

em_module *em_linear_new(int64_t in_features, int64_t out_features, bool bias)
{
    if (in_features < 0 || out_features < 0)
        return em__fail(EM_ERR_INVALID, "em_linear_new: in_features (%lld) and out_features (%lld) must be >= 0", (long long)in_features,
                        (long long)out_features);
    linear_impl *l = calloc(1, sizeof *l);
    if (!l) return em__fail(EM_ERR_NOMEM, "em_linear_new: out of memory");
    l->in = in_features;
    l->out = out_features;
    em_module *m = em_module_new(&LINEAR_VT, l);
    if (!m) {
        free(l);
        return NULL;
    }
    int64_t ws[2] = {out_features, in_features};
    em_tensor *w = new_param(ws, 2);
    /* torch.nn.Linear.reset_parameters: kaiming_uniform_(weight, a=sqrt(5)),
     * bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
    em_status st = w ? EM_OK : em_last_status();
    if (st == EM_OK && in_features > 0) st = em_init_kaiming_uniform_(w, sqrt(5.0), EM_FAN_IN, EM_NONLIN_LEAKY_RELU);
    if (st == EM_OK) {
        l->weight = w;
        st = give_param(m, "weight", w);
    } else {
        em_tensor_release(w);
    }
    if (st == EM_OK && bias) {
        em_tensor *b = new_param(&ws[0], 1);
        double bound = in_features > 0 ? 1.0 / sqrt((double)in_features) : 0.0;
        st = b ? em_init_uniform_(b, -bound, bound) : em_last_status();
        if (st == EM_OK) {
            l->bias = b;
            st = give_param(m, "bias", b);
        } else {
            em_tensor_release(b);
        }
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Embedding ------------------------------------------------------------------ */

typedef struct embedding_impl {
    int64_t num, dim;
    em_tensor *weight;
} embedding_impl;

static em_tensor *embedding_forward(em_module *m, const em_tensor *idx)
{
    embedding_impl *e = em_module_impl(m);
    em_dtype dt = em_tensor_dtype(idx);
    if (dt != EM_I64 && dt != EM_I32)
        return em__fail(EM_ERR_DTYPE, "Embedding: indices must be int64 or int32, got %s", em_dtype_name(dt));
    int nd = em_tensor_ndim(idx);
    if (nd + 1 > EM_MAX_DIMS) return em__fail(EM_ERR_SHAPE, "Embedding: indices of rank %d give a result of rank > %d", nd, EM_MAX_DIMS);
    int64_t flat = -1, shape[EM_MAX_DIMS];
    memcpy(shape, em_tensor_shape(idx), sizeof(int64_t) * (size_t)nd);
    shape[nd] = e->dim;
    em_scope_begin();
    em_tensor *rows = em_index_select(e->weight, 0, em_reshape(idx, &flat, 1));
    return nn_return(em_reshape(rows, shape, nd + 1));
}

static const em_module_vtable EMBEDDING_VT = {"Embedding", embedding_forward, free};

em_module *em_embedding_new(int64_t num_embeddings, int64_t embedding_dim)
{
    if (num_embeddings < 0 || embedding_dim < 0)
        return em__fail(EM_ERR_INVALID, "em_embedding_new: num_embeddings (%lld) and embedding_dim (%lld) must be >= 0",
                        (long long)num_embeddings, (long long)embedding_dim);
    embedding_impl *e = calloc(1, sizeof *e);
    if (!e) return em__fail(EM_ERR_NOMEM, "em_embedding_new: out of memory");
    e->num = num_embeddings;
    e->dim = embedding_dim;
    em_module *m = em_module_new(&EMBEDDING_VT, e);
    if (!m) {
        free(e);
        return NULL;
    }
    int64_t ws[2] = {num_embeddings, embedding_dim};
    em_tensor *w = new_param(ws, 2);
    em_status st = w ? em_init_normal_(w, 0.0, 1.0) : em_last_status();
    if (st == EM_OK) {
        e->weight = w;
        st = give_param(m, "weight", w);
    } else {
        em_tensor_release(w);
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- Dropout -------------------------------------------------------------------- */

static em_tensor *dropout_forward(em_module *m, const em_tensor *x)
{
    double *p = em_module_impl(m);
    return em_dropout(x, *p, em_module_is_training(m));
}

static const em_module_vtable DROPOUT_VT = {"Dropout", dropout_forward, free};

em_module *em_dropout_new(double p)
{
    if (!(p >= 0 && p <= 1)) return em__fail(EM_ERR_INVALID, "em_dropout_new: probability must be in [0, 1], got %g", p);
    double *pp = malloc(sizeof *pp);
    if (!pp) return em__fail(EM_ERR_NOMEM, "em_dropout_new: out of memory");
    *pp = p;
    em_module *m = em_module_new(&DROPOUT_VT, pp);
    if (!m) free(pp);
    return m;
}

/* ---- LayerNorm / RMSNorm ------------------------------------------------------------ */

typedef struct norm_impl {
    int ndim;
    double eps;
    em_tensor *weight, *bias;
} norm_impl;

static em_tensor *layer_norm_forward(em_module *m, const em_tensor *x)
{
    norm_impl *n = em_module_impl(m);
    return em_layer_norm(x, n->ndim, n->weight, n->bias, n->eps);
}

static em_tensor *rms_norm_forward(em_module *m, const em_tensor *x)
{
    norm_impl *n = em_module_impl(m);
    return em_rms_norm(x, n->weight, n->eps);
}

static const em_module_vtable LAYER_NORM_VT = {"LayerNorm", layer_norm_forward, free};
static const em_module_vtable RMS_NORM_VT = {"RMSNorm", rms_norm_forward, free};

static em_module *norm_new(const em_module_vtable *vt, const int64_t *shape, int ndim, double eps, bool affine, bool bias,
                           const char *fn)
{
    if (ndim < 1 || ndim > EM_MAX_DIMS || !shape)
        return em__fail(EM_ERR_INVALID, "%s: normalized_shape must have 1..%d dims, got %d", fn, EM_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] <= 0) {
            char b[160];
            return em__fail(EM_ERR_INVALID, "%s: normalized_shape %s has a non-positive size", fn, em_shape_str(shape, ndim, b, sizeof b));
        }
    norm_impl *n = calloc(1, sizeof *n);
    if (!n) return em__fail(EM_ERR_NOMEM, "%s: out of memory", fn);
    n->ndim = ndim;
    n->eps = eps;
    em_module *m = em_module_new(vt, n);
    if (!m) {
        free(n);
        return NULL;
    }
    em_status st = EM_OK;
    if (affine) {
        em_tensor *w = new_param(shape, ndim);
        st = w ? em_init_ones_(w) : em_last_status();
        if (st == EM_OK) {
            n->weight = w;
            st = give_param(m, "weight", w);
        } else {
            em_tensor_release(w);
        }
        if (st == EM_OK && bias) {
            em_tensor *b = new_param(shape, ndim); /* zeros */
            st = b ? EM_OK : em_last_status();
            if (st == EM_OK) {
                n->bias = b;
                st = give_param(m, "bias", b);
            }
        }
    }
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_layer_norm_new(const int64_t *normalized_shape, int ndim, double eps, bool elementwise_affine)
{
    if (!(eps >= 0)) return em__fail(EM_ERR_INVALID, "em_layer_norm_new: eps must be >= 0, got %g", eps);
    return norm_new(&LAYER_NORM_VT, normalized_shape, ndim, eps, elementwise_affine, true, "em_layer_norm_new");
}

em_module *em_rms_norm_new(int64_t dim, double eps)
{
    return norm_new(&RMS_NORM_VT, &dim, 1, eps, true, false, "em_rms_norm_new");
}

/* ---- Sequential ---------------------------------------------------------------------- */

static em_tensor *sequential_forward(em_module *m, const em_tensor *x)
{
    int n = em_module_num_children(m);
    if (n == 0) return em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
    em_scope_begin();
    em_tensor *h = (em_tensor *)x;
    for (int i = 0; i < n && h; i++) h = em_module_forward(em_module_child_at(m, i, NULL), h);
    return nn_return(h);
}

static const em_module_vtable SEQUENTIAL_VT = {"Sequential", sequential_forward, NULL};

em_status em_sequential_append(em_module *seq, em_module *child)
{
    if (!seq || em__module_vtable(seq) != &SEQUENTIAL_VT) {
        em_module_free(child);
        return em__set_error(EM_ERR_INVALID, "em_sequential_append: module is %s, not a Sequential",
                             seq ? em_module_type_name(seq) : "NULL");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", em_module_num_children(seq));
    return em_module_add_child(seq, name, child);
}

em_module *em_sequential_new(em_module *const *mods, int n)
{
    if (n < 0 || (n > 0 && !mods)) return em__fail(EM_ERR_INVALID, "em_sequential_new: bad module list (n = %d)", n);
    em_module *seq = em_module_new(&SEQUENTIAL_VT, NULL);
    em_status st = seq ? EM_OK : em_last_status();
    for (int i = 0; i < n; i++) {
        if (st != EM_OK)
            em_module_free(mods[i]);
        else if (!mods[i])
            st = em__set_error(EM_ERR_INVALID, "em_sequential_new: module %d is NULL", i);
        else
            st = em_sequential_append(seq, mods[i]); /* takes ownership even on failure */
    }
    if (st != EM_OK) {
        em_module_free(seq);
        return NULL;
    }
    return seq;
}

/* ---- activations ------------------------------------------------------------------------ */

typedef struct act_impl {
    double a, b;
} act_impl;

static em_tensor *identity_fwd(em_module *m, const em_tensor *x)
{
    (void)m;
    return em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
}
static em_tensor *relu_fwd(em_module *m, const em_tensor *x)
{
    (void)m;
    return em_relu(x);
}
static em_tensor *silu_fwd(em_module *m, const em_tensor *x)
{
    (void)m;
    return em_silu(x);
}
static em_tensor *sigmoid_fwd(em_module *m, const em_tensor *x)
{
    (void)m;
    return em_sigmoid(x);
}
static em_tensor *tanh_fwd(em_module *m, const em_tensor *x)
{
    (void)m;
    return em_tanh(x);
}
static em_tensor *leaky_relu_fwd(em_module *m, const em_tensor *x)
{
    return em_leaky_relu(x, ((act_impl *)em_module_impl(m))->a);
}
static em_tensor *gelu_fwd(em_module *m, const em_tensor *x)
{
    return ((act_impl *)em_module_impl(m))->a != 0 ? em_gelu_tanh(x) : em_gelu(x);
}
static em_tensor *elu_fwd(em_module *m, const em_tensor *x) { return em_elu(x, ((act_impl *)em_module_impl(m))->a); }
static em_tensor *softplus_fwd(em_module *m, const em_tensor *x)
{
    act_impl *s = em_module_impl(m);
    double beta = s->a, threshold = s->b;
    if (beta == 1.0 && threshold == 20.0) return em_softplus(x);
    /* torch.nn.functional.softplus: x where beta x > threshold, else log1p(exp(beta x)) / beta */
    em_scope_begin();
    em_tensor *bx = em_mul_scalar(x, beta);
    em_tensor *soft = em_div_scalar(em_softplus(bx), beta);
    return nn_return(em_where(em_gt_scalar(bx, threshold), x, soft));
}

static const em_module_vtable IDENTITY_VT = {"Identity", identity_fwd, NULL};
static const em_module_vtable RELU_VT = {"ReLU", relu_fwd, NULL};
static const em_module_vtable SILU_VT = {"SiLU", silu_fwd, NULL};
static const em_module_vtable SIGMOID_VT = {"Sigmoid", sigmoid_fwd, NULL};
static const em_module_vtable TANH_VT = {"Tanh", tanh_fwd, NULL};
static const em_module_vtable LEAKY_RELU_VT = {"LeakyReLU", leaky_relu_fwd, free};
static const em_module_vtable GELU_VT = {"GELU", gelu_fwd, free};
static const em_module_vtable ELU_VT = {"ELU", elu_fwd, free};
static const em_module_vtable SOFTPLUS_VT = {"Softplus", softplus_fwd, free};

static em_module *act_new(const em_module_vtable *vt, double a, double b)
{
    act_impl *s = malloc(sizeof *s);
    if (!s) return em__fail(EM_ERR_NOMEM, "%s: out of memory", vt->type_name);
    s->a = a;
    s->b = b;
    em_module *m = em_module_new(vt, s);
    if (!m) free(s);
    return m;
}

em_module *em_identity_new(void) { return em_module_new(&IDENTITY_VT, NULL); }
em_module *em_relu_new(void) { return em_module_new(&RELU_VT, NULL); }
em_module *em_silu_new(void) { return em_module_new(&SILU_VT, NULL); }
em_module *em_sigmoid_new(void) { return em_module_new(&SIGMOID_VT, NULL); }
em_module *em_tanh_new(void) { return em_module_new(&TANH_VT, NULL); }
em_module *em_leaky_relu_new(double negative_slope) { return act_new(&LEAKY_RELU_VT, negative_slope, 0); }
em_module *em_gelu_new(bool tanh_approximate) { return act_new(&GELU_VT, tanh_approximate ? 1 : 0, 0); }
em_module *em_elu_new(double alpha) { return act_new(&ELU_VT, alpha, 0); }
em_module *em_softplus_new(double beta, double threshold)
{
    if (!(beta != 0)) return em__fail(EM_ERR_INVALID, "em_softplus_new: beta must be non-zero, got %g", beta);
    return act_new(&SOFTPLUS_VT, beta, threshold);
}
