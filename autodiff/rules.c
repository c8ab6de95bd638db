/* Backward rules, one per differentiable op kind, written with ordinary ops
 * so gradients run as tasks on the same devices. Formulas follow PyTorch's
 * tools/autograd/derivatives.yaml (e.g. GELU, ELU, maximum ties, clamp). */
#include "autodiff/autodiff.h"

#include <math.h>
#include <string.h>

em_tensor *em__sum_to(em_tensor *g, const int64_t *shape, int ndim)
{
    if (!g) return NULL;
    if (g->ndim == ndim && !memcmp(g->shape, shape, sizeof(int64_t) * (size_t)ndim)) return g;
    int dims[EM_MAX_DIMS], nd = 0, lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    em_tensor *s = nd ? em_sum(g, dims, nd, true) : g;
    return em_reshape(s, shape, ndim);
}

/* g of a reduction, reshaped to keepdim form and expanded to x's shape. */
static em_tensor *expand_red(const em_node *n, em_tensor *g, const em_tensor *x)
{
    int64_t kshape[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) kshape[i] = (n->p.red.mask >> i) & 1u ? 1 : x->shape[i];
    em_tensor *r = em_reshape(g, kshape, x->ndim);
    return em_expand(r, x->shape, x->ndim);
}

static em_tensor *mask_f(em_tensor *b, em_dtype dt) { return em_cast(b, dt); }

/* A 2-D matrix stored transposed: the transpose view of a contiguous matrix
 * (nn.Linear's weight.T is one). */
static bool stored_transposed(const em_tensor *t)
{
    return t->ndim == 2 && t->shape[0] > 1 && t->shape[1] > 1 && t->strides[0] == 1 && t->strides[1] == t->shape[0];
}

/* A parameter seen through views: a leaf that requires grad, or a transpose,
 * reshape or alias of one (nn.Linear's weight.T). */
static bool parameter_view(const em_tensor *t)
{
    while (t->node && (t->node->kind == EM_OP_VIEW_PERMUTE || t->node->kind == EM_OP_VIEW_RESHAPE ||
                       t->node->kind == EM_OP_VIEW_ALIAS))
        t = t->node->in[0];
    return t->requires_grad && !t->node;
}

/* Gradients of a (possibly batched / 1-D) matmul, as torch.matmul's backward.
 * For a 2-D operand stored transposed, the gradient is computed in that same
 * layout (as the transpose of a contiguous product): for y = x @ W.T the
 * gradient of W then comes out contiguous, and the optimizer and the
 * gradient all-reduce read it without a transposing copy (which cost about
 * 0.12 ms per 4096 x 4096 weight per step on an H200).
 *
 * Order: a parameter's gradient is submitted before the other operand's.
 * It is final at once, so its data-parallel all-reduce starts while the
 * input gradient's GEMM runs instead of after it (PyTorch's addmm backward
 * computes mat1's gradient, the input's, first). On one device the order
 * changes nothing but the timeline. */
static em_status bw_matmul(const em_node *n, em_tensor *g, em_tensor **gin)
{
    em_tensor *a = n->in[0], *b = n->in[1];
    em_tensor *a2 = a->ndim == 1 ? em_unsqueeze(a, 0) : a;
    em_tensor *b2 = b->ndim == 1 ? em_unsqueeze(b, -1) : b;
    /* g in the 2-D+ layout: [..., M, N] */
    int64_t gshape[EM_MAX_DIMS];
    int gnd = 0;
    int64_t bshape_a[EM_MAX_DIMS], bshape_b[EM_MAX_DIMS];
    int na = a2->ndim - 2, nb = b2->ndim - 2;
    memcpy(bshape_a, a2->shape, sizeof(int64_t) * (size_t)na);
    memcpy(bshape_b, b2->shape, sizeof(int64_t) * (size_t)nb);
    if (em__broadcast_shapes(bshape_a, na, bshape_b, nb, gshape, &gnd, "matmul backward") != EM_OK) return em_last_status();
    gshape[gnd++] = a2->shape[a2->ndim - 2];
    gshape[gnd++] = b2->shape[b2->ndim - 1];
    em_tensor *g2 = em_reshape(g, gshape, gnd);
    bool plain2d = a2->ndim == 2 && b2->ndim == 2;
    bool b_first = !(parameter_view(a) && !parameter_view(b));
    for (int pass = 0; pass < 2; pass++) {
        bool do_b = (pass == 0) == b_first;
        if (do_b && b->requires_grad && b2->ndim == 2 && a2->ndim > 2) {
            /* x [..., M, K] @ W [K, N] (W broadcast over the batch, as every
             * Linear / Conv1D on [B, T, C]): the batch folds into the rows, so
             * dW = x_flat^T @ g_flat is ONE GEMM with K = B*T*M, instead of a
             * batched product [..., K, N] summed over the batch (which wrote
             * and re-read batch x K x N values). */
            const int64_t K = a2->shape[a2->ndim - 1], N = b2->shape[1];
            const int64_t rows = K > 0 ? em_tensor_numel(a2) / K : 0;
            const int64_t as[2] = {rows, K}, gs[2] = {rows, N};
            em_tensor *af = em_reshape(a2, as, 2), *gf = em_reshape(g2, gs, 2);
            em_tensor *gb = b2 == b && stored_transposed(b) ? em_transpose(em_matmul(em_transpose(gf, -1, -2), af), 0, 1)
                                                            : em_matmul(em_transpose(af, -1, -2), gf);
            gin[1] = em_reshape(gb, b->shape, b->ndim);
            if (!gin[1]) return em_last_status();
        } else if (do_b && b->requires_grad) {
            em_tensor *gb = plain2d && b2 == b && stored_transposed(b)
                                ? em_transpose(em_matmul(em_transpose(g2, -1, -2), a2), 0, 1) /* (g^T a)^T = a^T g */
                                : em_matmul(em_transpose(a2, -1, -2), g2);
            gin[1] = em_reshape(em__sum_to(gb, b2->shape, b2->ndim), b->shape, b->ndim);
            if (!gin[1]) return em_last_status();
        }
        if (!do_b && a->requires_grad) {
            em_tensor *ga = plain2d && a2 == a && stored_transposed(a)
                                ? em_transpose(em_matmul(b2, em_transpose(g2, -1, -2)), 0, 1) /* (b g^T)^T = g b^T */
                                : em_matmul(g2, em_transpose(b2, -1, -2));
            gin[0] = em_reshape(em__sum_to(ga, a2->shape, a2->ndim), a->shape, a->ndim);
            if (!gin[0]) return em_last_status();
        }
    }
    return EM_OK;
}

/* ---- one backward function per kind (tasks/ops.def, last column) ---------
 * Each gets the node, the output gradient g (dtype dt) and sets gin[i] for the
 * inputs that require grad; x = in[0], y = the saved output (F_SAVE_OUT
 * kinds), sa / sb the op's scalars. */
#define BW(name) static em_status name(const em_node *n, em_tensor *g, em_tensor **gin)
#define BW_ARGS                                              \
    em_tensor *x = n->n_in > 0 ? n->in[0] : NULL;            \
    em_tensor *y = n->out_alias;                             \
    const double sa = n->p.s.a, sb = n->p.s.b;               \
    const em_dtype dt = g->dtype;                            \
    (void)x;                                                 \
    (void)y;                                                 \
    (void)sa;                                                \
    (void)sb;                                                \
    (void)dt
/* A unary rule: gin[0] = expr. */
#define BW1(name, expr)      \
    BW(name)                 \
    {                        \
        BW_ARGS;             \
        gin[0] = (expr);     \
        return EM_OK;        \
    }

/* ---- unary ---- */
BW1(bw_identity, g)
BW1(bw_neg, em_neg(g))
BW1(bw_zero, em_zeros(x->shape, x->ndim, dt))
BW1(bw_abs, em_mul(g, em_sign(x)))
BW1(bw_exp, em_mul(g, y))
BW1(bw_log, em_div(g, x))
BW1(bw_log1p, em_div(g, em_add_scalar(x, 1.0)))
/* sa = 1: em_std's sqrt, whose gradient is 0 where the std is 0 (PyTorch's std_backward) */
BW1(bw_sqrt, sa == 1.0 ? em_where(em_eq_scalar(y, 0.0), em_zeros(y->shape, y->ndim, dt), em_div(g, em_mul_scalar(y, 2.0)))
                       : em_div(g, em_mul_scalar(y, 2.0)))
BW1(bw_rsqrt, em_mul(g, em_mul_scalar(em_pow_scalar(y, 3.0), -0.5)))
BW1(bw_reciprocal, em_mul(em_neg(g), em_square(y)))
BW1(bw_square, em_mul(g, em_mul_scalar(x, 2.0)))
BW1(bw_sin, em_mul(g, em_cos(x)))
BW1(bw_cos, em_mul(g, em_neg(em_sin(x))))
BW1(bw_tanh, em_mul(g, em_rsub_scalar(em_square(y), 1.0)))
BW1(bw_sigmoid, em_mul(g, em_mul(y, em_rsub_scalar(y, 1.0))))
BW1(bw_relu, em_threshold_backward(g, x)) /* one kernel: g where x > 0 (and where x is NaN, as PyTorch) */
BW(bw_gelu)
{
    BW_ARGS;
    /* d/dx x*Phi(x) = Phi(x) + x*phi(x) */
    em_tensor *cdf = em_mul_scalar(em_add_scalar(em_erf(em_mul_scalar(x, M_SQRT1_2)), 1.0), 0.5);
    em_tensor *pdf = em_mul_scalar(em_exp(em_mul_scalar(em_square(x), -0.5)), 0.3989422804014327);
    gin[0] = em_mul(g, em_add(cdf, em_mul(x, pdf)));
    return EM_OK;
}
BW(bw_gelu_tanh)
{
    BW_ARGS;
    const double k0 = 0.7978845608028654, k1 = 0.044715;
    em_tensor *x2 = em_square(x);
    em_tensor *u = em_mul_scalar(em_mul(x, em_add_scalar(em_mul_scalar(x2, k1), 1.0)), k0);
    em_tensor *t = em_tanh(u);
    em_tensor *left = em_mul_scalar(em_add_scalar(t, 1.0), 0.5);
    em_tensor *du = em_mul_scalar(em_add_scalar(em_mul_scalar(x2, 3.0 * k1), 1.0), k0);
    em_tensor *right = em_mul(em_mul_scalar(x, 0.5), em_mul(em_rsub_scalar(em_square(t), 1.0), du));
    gin[0] = em_mul(g, em_add(left, right));
    return EM_OK;
}
BW(bw_silu)
{
    BW_ARGS;
    em_tensor *s = em_sigmoid(x);
    gin[0] = em_mul(g, em_mul(s, em_add_scalar(em_mul(x, em_rsub_scalar(s, 1.0)), 1.0)));
    return EM_OK;
}
/* above the forward's threshold (x > 20: softplus = x) the gradient is g, as PyTorch */
BW1(bw_softplus, em_where(em_gt_scalar(x, 20.0), g, em_mul(g, em_sigmoid(x))))
BW1(bw_erf, em_mul(g, em_mul_scalar(em_exp(em_neg(em_square(x))), 1.1283791670955126)))
BW1(bw_clamp, em_mul(g, mask_f(em_logical_and(em_ge_scalar(x, sa), em_le_scalar(x, sb)), dt)))
BW1(bw_pow_scalar, sa == 0 ? em_zeros(x->shape, x->ndim, dt) : em_mul(g, em_mul_scalar(em_pow_scalar(x, sa - 1.0), sa)))
BW1(bw_leaky_relu, em_mul(g, em_where(em_gt_scalar(x, 0.0), em_scalar(1.0, dt), em_scalar(sa, dt))))
BW1(bw_elu, em_mul(g, em_where(em_gt_scalar(x, 0.0), em_scalar(1.0, dt), em_add_scalar(y, sa))))
BW1(bw_mul_scalar, em_mul_scalar(g, sa))
BW1(bw_div_scalar, em_div_scalar(g, sa))
BW1(bw_maximum_scalar, em_mul(g, mask_f(em_ge_scalar(x, sa), dt)))
BW1(bw_minimum_scalar, em_mul(g, mask_f(em_le_scalar(x, sa), dt)))
/* hardswish: 0 for x < -3, x / 3 + 1/2 on [-3, 3], 1 for x > 3 (PyTorch's
 * hardswish_backward) */
BW1(bw_hardswish, em_mul(g, em_where(em_lt_scalar(x, -3.0), em_scalar(0.0, dt),
                                     em_where(em_le_scalar(x, 3.0), em_add_scalar(em_div_scalar(x, 3.0), 0.5),
                                              em_scalar(1.0, dt)))))
/* hardsigmoid: 1/6 on (-3, 3), else 0. PyTorch's hardsigmoid_backward
 * multiplies by the float constant 1.0f / 6.0f for every dtype (so an f64
 * gradient is off from g / 6 by 3e-8 relative); we use the same constant, so
 * results match PyTorch's. */
BW1(bw_hardsigmoid, em_mul_scalar(em_mul(g, mask_f(em_logical_and(em_gt_scalar(x, -3.0), em_lt_scalar(x, 3.0)), dt)),
                                  (double)(1.0f / 6.0f)))
BW(bw_mish)
{
    BW_ARGS;
    /* d/dx x tanh(sp(x)) = tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2) */
    em_tensor *t = em_tanh(em_softplus(x));
    em_tensor *d = em_add(t, em_mul(em_mul(x, em_sigmoid(x)), em_rsub_scalar(em_square(t), 1.0)));
    gin[0] = em_mul(g, d);
    return EM_OK;
}
BW(bw_selu)
{
    BW_ARGS;
    const double alpha = 1.6732632423543772848170429916717, scale = 1.0507009873554804934193349852946;
    em_tensor *neg = em_mul_scalar(em_exp(x), alpha * scale);
    gin[0] = em_mul(g, em_where(em_gt_scalar(x, 0.0), em_scalar(scale, dt), neg));
    return EM_OK;
}
/* celu: 1 for x > 0, else exp(x / alpha) (sb = 1 / alpha) */
BW1(bw_celu, em_mul(g, em_where(em_gt_scalar(x, 0.0), em_scalar(1.0, dt), em_exp(em_mul_scalar(x, sb)))))
/* softsign: 1 / (1 + |x|)^2 */
BW1(bw_softsign, em_div(g, em_square(em_add_scalar(em_abs(x), 1.0))))
/* logsigmoid: sigmoid(-x) = 1 - sigmoid(x) */
BW1(bw_logsigmoid, em_mul(g, em_sigmoid(em_neg(x))))
BW1(bw_expm1, em_mul(g, em_add_scalar(y, 1.0)))
BW1(bw_log2, em_div(g, em_mul_scalar(x, M_LN2)))
BW1(bw_exp2, em_mul(g, em_mul_scalar(y, M_LN2)))
/* erfinv: sqrt(pi) / 2 * exp(erfinv(x)^2) */
BW1(bw_erfinv, em_mul(g, em_mul_scalar(em_exp(em_square(y)), 0.88622692545275801365)))

/* ---- binary (broadcast: reduce back to each input's shape) ---- */

/* Sets gin from the full-shape gradients ga / gb of a binary op. */
static em_status binary_out(const em_node *n, em_tensor *ga, em_tensor *gb, em_tensor **gin)
{
    em_tensor *a = n->in[0], *b = n->in[1];
    if (a->requires_grad && !(gin[0] = em__sum_to(ga, a->shape, a->ndim))) return em_last_status();
    if (b->requires_grad && !(gin[1] = em__sum_to(gb, b->shape, b->ndim))) return em_last_status();
    return EM_OK;
}
#define BW2_ARGS                                                     \
    const em_dtype dt = g->dtype;                                    \
    em_tensor *af = em_cast(n->in[0], dt), *bf = em_cast(n->in[1], dt); \
    (void)af;                                                        \
    (void)bf
/* A binary rule: the full-shape gradients of a and b. */
#define BW2(name, ga, gb)                          \
    BW(name)                                       \
    {                                              \
        BW2_ARGS;                                  \
        return binary_out(n, (ga), (gb), gin);     \
    }

BW2(bw_add, g, g)
BW2(bw_sub, g, em_neg(g))
BW2(bw_mul, em_mul(g, bf), em_mul(g, af))
BW2(bw_div, em_div(g, bf), em_neg(em_div(em_mul(g, af), em_square(bf))))
BW(bw_pow)
{
    BW2_ARGS;
    /* d/da = b a^(b-1), 0 where b == 0 (so 0^0 gives 0, not 0 * inf; PyTorch's
     * pow_backward); d/db = a^b log(a), 0 where a == 0 and b >= 0 (PyTorch) */
    em_tensor *ga = em_where(em_eq_scalar(bf, 0.0), em_zeros(g->shape, g->ndim, dt),
                             em_mul(g, em_mul(bf, em_pow(af, em_sub_scalar(bf, 1.0))))),
              *gb = NULL;
    if (n->in[1]->requires_grad) {
        em_tensor *lg = em_mul(n->out_alias, em_log(af));
        em_tensor *zero_mask = em_logical_and(em_eq_scalar(af, 0.0), em_ge_scalar(bf, 0.0));
        gb = em_mul(g, em_where(zero_mask, em_scalar(0.0, dt), lg));
    }
    return binary_out(n, ga, gb, gin);
}
/* maximum / minimum, as PyTorch: ties split the gradient evenly, the operand
 * that loses the comparison gets 0, and where either is NaN (no comparison
 * holds) both get the whole gradient */
static em_status bw_extremum(const em_node *n, em_tensor *g, em_tensor **gin, bool is_max)
{
    BW2_ARGS;
    em_tensor *win = is_max ? em_gt(af, bf) : em_lt(af, bf);
    em_tensor *lose = is_max ? em_lt(af, bf) : em_gt(af, bf);
    em_tensor *half_tie = em_mul_scalar(mask_f(em_eq(af, bf), dt), 0.5);
    em_tensor *wa = em_rsub_scalar(em_add(mask_f(lose, dt), half_tie), 1.0);
    em_tensor *wb = em_rsub_scalar(em_add(mask_f(win, dt), half_tie), 1.0);
    return binary_out(n, em_mul(g, wa), em_mul(g, wb), gin);
}
BW(bw_maximum) { return bw_extremum(n, g, gin, true); }
BW(bw_minimum) { return bw_extremum(n, g, gin, false); }
BW2(bw_remainder, g, em_mul(em_neg(g), em_floor(em_div(af, bf))))
/* fmod: a - trunc(a / b) b */
BW2(bw_fmod, g, em_mul(em_neg(g), em_trunc(em_div(af, bf))))
/* floor_divide: piecewise constant */
BW2(bw_zero2, em_zeros(n->in[0]->shape, n->in[0]->ndim, dt), em_zeros(n->in[1]->shape, n->in[1]->ndim, dt))
BW(bw_atan2)
{
    BW2_ARGS;
    /* d/da atan2(a, b) = b / (a^2 + b^2); d/db = -a / (a^2 + b^2) */
    em_tensor *r = em_add(em_square(af), em_square(bf));
    return binary_out(n, em_mul(g, em_div(bf, r)), em_mul(g, em_neg(em_div(af, r))), gin);
}
BW(bw_where)
{
    em_tensor *m = n->in[0], *a = n->in[1], *b = n->in[2];
    em_tensor *z = em_scalar(0.0, g->dtype);
    if (a->requires_grad && !(gin[1] = em__sum_to(em_where(m, g, z), a->shape, a->ndim))) return em_last_status();
    if (b->requires_grad && !(gin[2] = em__sum_to(em_where(m, z, g), b->shape, b->ndim))) return em_last_status();
    return EM_OK;
}

/* ---- reductions ---- */

/* The dims a reduction node reduced. */
static int red_dims(const em_node *n, const em_tensor *x, int *dims)
{
    int nd = 0;
    for (int i = 0; i < x->ndim; i++)
        if ((n->p.red.mask >> i) & 1u) dims[nd++] = i;
    return nd;
}
BW1(bw_sum, em_contiguous(expand_red(n, g, x)))
BW(bw_prod)
{
    BW_ARGS;
    /* d prod / d x_i = product of the others: prod / x_i where x_i != 0;
     * where x_i == 0 it is the product of the non-zeros if x_i is the only
     * zero of its reduction, else 0 (as PyTorch's prod_backward). */
    int dims[EM_MAX_DIMS], nd = red_dims(n, x, dims);
    em_tensor *ge = expand_red(n, g, x);
    em_tensor *is0 = em_eq_scalar(x, 0.0);
    em_tensor *one = em_scalar(1.0, dt);
    em_tensor *safe_x = em_where(is0, one, x);
    em_tensor *nonzero = em_div(em_mul(ge, expand_red(n, y, x)), safe_x);
    em_tensor *p_nz = em_expand(em_prod(safe_x, dims, nd, true), x->shape, x->ndim);
    em_tensor *nzeros = em_expand(em_sum(em_cast(is0, dt), dims, nd, true), x->shape, x->ndim);
    em_tensor *at_zero = em_mul(ge, em_where(em_eq_scalar(nzeros, 1.0), p_nz, em_scalar(0.0, dt)));
    gin[0] = em_where(is0, at_zero, nonzero);
    return EM_OK;
}
BW(bw_max_min)
{
    BW_ARGS;
    /* evenly among the elements equal to the extremum (as torch.amax) */
    em_tensor *hit = mask_f(em_eq(x, expand_red(n, y, x)), dt);
    int dims[EM_MAX_DIMS], nd = red_dims(n, x, dims);
    em_tensor *cnt = em_sum(hit, dims, nd, true);
    gin[0] = em_div(em_mul(hit, expand_red(n, g, x)), em_expand(cnt, x->shape, x->ndim));
    return EM_OK;
}
BW1(bw_logsumexp, em_mul(expand_red(n, g, x), em_exp(em_sub(x, expand_red(n, y, x)))))
BW(bw_var)
{
    BW_ARGS;
    int dims[EM_MAX_DIMS], nd = red_dims(n, x, dims);
    int64_t cnt = 1;
    for (int i = 0; i < nd; i++) cnt *= x->shape[dims[i]];
    em_tensor *mean = em_mean(x, dims, nd, true);
    double scale = 2.0 / ((double)cnt - n->p.red.correction);
    gin[0] = em_mul(expand_red(n, g, x), em_mul_scalar(em_sub(x, mean), scale));
    return EM_OK;
}
BW(bw_softmax)
{
    BW_ARGS;
    int d = n->p.axis.dim;
    em_tensor *s = em_sum(em_mul(g, y), &d, 1, true);
    gin[0] = em_mul(y, em_sub(g, s));
    return EM_OK;
}
BW(bw_log_softmax)
{
    BW_ARGS;
    int d = n->p.axis.dim;
    gin[0] = em_sub(g, em_mul(em_exp(y), em_sum(g, &d, 1, true)));
    return EM_OK;
}

/* ---- indexing ---- */
BW1(bw_gather, em_scatter_add(em_zeros(x->shape, x->ndim, dt), n->p.axis.dim, n->in[1], g))
BW(bw_scatter)
{
    BW_ARGS;
    int d = n->p.axis.dim;
    em_tensor *idx = n->in[1], *src = n->in[2];
    if (x->requires_grad) {
        gin[0] = n->kind == EM_OP_SCATTER_ADD ? g : em_scatter(g, d, idx, em_zeros(src->shape, src->ndim, dt));
        if (!gin[0]) return em_last_status();
    }
    if (src->requires_grad && !(gin[2] = em_gather(g, d, idx))) return em_last_status();
    return EM_OK;
}
/* index_select's gradient: g's slices added at index (index_add sums
 * duplicates in ascending j on every device: deterministic, no expanded
 * index copy). */
BW1(bw_index_select, em_index_add(em_zeros(x->shape, x->ndim, dt), n->p.axis.dim, n->in[1], g))
/* index_add: self's gradient is g, src's the slices of g that it was added to */
BW(bw_index_add)
{
    BW_ARGS;
    em_tensor *src = n->in[2];
    if (x->requires_grad) gin[0] = g;
    if (src->requires_grad && !(gin[2] = em_index_select(g, n->p.axis.dim, n->in[1]))) return em_last_status();
    return EM_OK;
}

/* ---- convolution and pooling (tasks/conv.c, tasks/pool.c) ----
 * conv2d: dx = conv2d_bwd_data(g, w), dw = conv2d_bwd_weight(x, g) (the
 * weight's first, as matmul's: its all-reduce can start sooner).
 * conv2d_bwd_data is conv_transpose2d's forward y = T(x, w): dx = conv2d(g,
 * w) onto x's shape, dw = conv2d_bwd_weight(g, x) (g plays the image). */
BW(bw_conv2d)
{
    BW_ARGS;
    em_tensor *w = n->in[1];
    if (w->requires_grad && !(gin[1] = em__conv2d_bwd_weight(x, g, &n->p, w->shape))) return em_last_status();
    if (x->requires_grad && !(gin[0] = em__conv2d_bwd_data(g, w, &n->p, x->shape))) return em_last_status();
    return EM_OK;
}
BW(bw_conv2d_bwd_data)
{
    BW_ARGS;
    em_tensor *w = n->in[1];
    if (w->requires_grad && !(gin[1] = em__conv2d_bwd_weight(g, x, &n->p, w->shape))) return em_last_status();
    if (x->requires_grad && !(gin[0] = em__conv2d_raw(g, w, &n->p, x->shape))) return em_last_status();
    return EM_OK;
}
/* max_pool2d: g scattered (added) to the argmax of each window, saved as the
 * op's second output (F_SAVE_AUX); windows may overlap, so scatter_add. */
BW(bw_max_pool2d)
{
    BW_ARGS;
    const int64_t N = x->shape[0], C = x->shape[1];
    int64_t flat_x[3] = {N, C, x->shape[2] * x->shape[3]}, flat_g[3] = {N, C, g->shape[2] * g->shape[3]};
    em_tensor *gi = em_scatter_add(em_zeros(flat_x, 3, dt), 2, em_reshape(n->aux, flat_g, 3), em_reshape(g, flat_g, 3));
    gin[0] = em_reshape(gi, x->shape, 4);
    return EM_OK;
}
BW1(bw_avg_pool2d, em__avg_pool2d_bwd(g, &n->p, x->shape))

/* ---- batch norm (tasks/norm.c) ----
 * Training-mode batch norm: one BATCH_NORM_BWD task gives dx, dweight and
 * dbias from g, x, the saved batch statistics (n->aux, F_SAVE_AUX) and the
 * weight (ones when the caller had none); the gradients of the inputs that
 * require none are dropped. */
BW(bw_batch_norm)
{
    BW_ARGS;
    em_tensor *dx, *dw, *db;
    em_status st = em__batch_norm_bwd(g, x, n->aux, n->in[1], n->p.bn.eps, &dx, &dw, &db);
    if (st != EM_OK) return st;
    if (x->requires_grad) gin[0] = dx;
    if (n->in[1]->requires_grad) gin[1] = dw;
    if (n->in[2]->requires_grad) gin[2] = db;
    return EM_OK;
}
/* Layer norm (the fused LAYER_NORM op): one LAYER_NORM_BWD task gives dx,
 * dweight and dbias from g, x, the saved (mean, rstd) of each row (n->aux,
 * F_SAVE_AUX) and the weight; the gradients of the inputs that require
 * none are dropped. */
BW(bw_layer_norm)
{
    BW_ARGS;
    em_tensor *dx, *dw, *db;
    em_status st = em__layer_norm_bwd(g, x, n->aux, n->in[1], &dx, &dw, &db);
    if (st != EM_OK) return st;
    if (x->requires_grad) gin[0] = dx;
    if (n->in[1]->requires_grad) gin[1] = dw;
    if (n->in[2]->requires_grad) gin[2] = db;
    return EM_OK;
}

/* ---- fused attention (tasks/attention.c) ----
 * One SDPA_BWD task gives dq, dk and dv from g, the op's q, k, v, its output
 * (F_SAVE_OUT), its log-sum-exp rows (n->aux, F_SAVE_AUX), its additive mask
 * and its parameters (the same dropout seed and offset: the same keep mask).
 * The mask gets no gradient (the public function takes the composed path
 * when it requires one). */
BW(bw_sdpa)
{
    BW_ARGS;
    em_tensor *dq, *dk, *dv;
    em_status st = em__sdpa_bwd(g, n->in[0], n->in[1], n->in[2], y, n->aux, n->n_in > 3 ? n->in[3] : NULL, &n->p, &dq, &dk,
                                &dv);
    if (st != EM_OK) return st;
    if (n->in[0]->requires_grad) gin[0] = dq;
    if (n->in[1]->requires_grad) gin[1] = dk;
    if (n->in[2]->requires_grad) gin[2] = dv;
    return EM_OK;
}

/* ---- views ---- */
BW1(bw_reshape, em_reshape(em_contiguous(g), x->shape, x->ndim))
BW(bw_permute)
{
    BW_ARGS;
    int inv[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) inv[n->p.perm.perm[i]] = i;
    gin[0] = em_permute(g, inv, x->ndim);
    return EM_OK;
}
BW1(bw_expand, em__sum_to(g, x->shape, x->ndim))
BW(bw_slice)
{
    BW_ARGS;
    int d = n->p.slice.dim;
    em_tensor *z = em_zeros(x->shape, x->ndim, dt);
    int64_t len = g->shape[d];
    em_tensor *view = em_slice(z, d, n->p.slice.start, n->p.slice.start + len * n->p.slice.step, n->p.slice.step);
    if (!view || em_copy_(view, g) != EM_OK) return em_last_status();
    gin[0] = z;
    return EM_OK;
}
BW(bw_cat)
{
    int d = n->p.axis.dim;
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
        int64_t len = n->in[i]->shape[d];
        if (n->in[i]->requires_grad && !(gin[i] = em_narrow(g, d, off, len))) return em_last_status();
        off += len;
    }
    return EM_OK;
}

/* ---- the table ---- */

typedef em_status (*em_backward_fn)(const em_node *n, em_tensor *g, em_tensor **gin);
static const em_backward_fn g_backward[EM_OP_COUNT] = {
#define OP(E, nm, nin, nout, fl, fam, bw) [EM_OP_##E] = bw,
#include "tasks/ops.def"
};

em_status em__backward_check_table(void)
{
    for (int k = 0; k < EM_OP_COUNT; k++) {
        bool diff = (em__optab[k].flags & F_DIFF) != 0;
        if (diff && !g_backward[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s is differentiable but has no backward function", em__optab[k].name);
        if (!diff && g_backward[k])
            return em__set_error(EM_ERR_RUNTIME, "op %s has a backward function but is not marked F_DIFF", em__optab[k].name);
    }
    return EM_OK;
}

em_status em__backward_rule(em_node *n, em_tensor *g, em_tensor **gin)
{
    em_backward_fn fn = (unsigned)n->kind < EM_OP_COUNT ? g_backward[n->kind] : NULL;
    if (!fn) return em__set_error(EM_ERR_UNSUPPORTED, "em_backward: op %s has no backward rule", em__optab[n->kind].name);
    em_status st = fn(n, g, gin);
    if (st != EM_OK) return st;
    /* A rule that set no gradient for an input that requires one failed in
     * one of its ops (which recorded why). */
    bool optional = n->kind == EM_OP_WHERE || n->kind == EM_OP_SCATTER || n->kind == EM_OP_SCATTER_ADD ||
                    n->kind == EM_OP_GATHER || n->kind == EM_OP_INDEX_SELECT;
    for (int i = 0; i < n->n_in && !optional; i++)
        if (n->in[i] && n->in[i]->requires_grad && !gin[i])
            return em_last_status() != EM_OK ? em_last_status()
                                             : em__set_error(EM_ERR_RUNTIME, "em_backward: rule of %s failed", em__optab[n->kind].name);
    return EM_OK;
}
