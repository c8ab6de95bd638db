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
static em_status matmul_backward(const em_node *n, em_tensor *g, em_tensor **gin)
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
        if (do_b && b->requires_grad) {
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

em_status em__backward_rule(em_node *n, em_tensor *g, em_tensor **gin)
{
    em_tensor *x = n->n_in > 0 ? n->in[0] : NULL;
    em_tensor *y = n->out_alias;
    double sa = n->p.s.a, sb = n->p.s.b;
    em_dtype dt = g->dtype;
    switch (n->kind) {
    /* ---- unary ---- */
    case EM_OP_NEG: gin[0] = em_neg(g); break;
    case EM_OP_ABS: gin[0] = em_mul(g, em_sign(x)); break;
    case EM_OP_SIGN: case EM_OP_FLOOR: case EM_OP_CEIL: case EM_OP_ROUND:
        gin[0] = em_zeros(x->shape, x->ndim, dt);
        break;
    case EM_OP_EXP: gin[0] = em_mul(g, y); break;
    case EM_OP_LOG: gin[0] = em_div(g, x); break;
    case EM_OP_LOG1P: gin[0] = em_div(g, em_add_scalar(x, 1.0)); break;
    case EM_OP_SQRT: gin[0] = em_div(g, em_mul_scalar(y, 2.0)); break;
    case EM_OP_RSQRT: gin[0] = em_mul(g, em_mul_scalar(em_pow_scalar(y, 3.0), -0.5)); break;
    case EM_OP_RECIPROCAL: gin[0] = em_mul(em_neg(g), em_square(y)); break;
    case EM_OP_SQUARE: gin[0] = em_mul(g, em_mul_scalar(x, 2.0)); break;
    case EM_OP_SIN: gin[0] = em_mul(g, em_cos(x)); break;
    case EM_OP_COS: gin[0] = em_mul(g, em_neg(em_sin(x))); break;
    case EM_OP_TANH: gin[0] = em_mul(g, em_rsub_scalar(em_square(y), 1.0)); break;
    case EM_OP_SIGMOID: gin[0] = em_mul(g, em_mul(y, em_rsub_scalar(y, 1.0))); break;
    case EM_OP_RELU: gin[0] = em_mul(g, mask_f(em_gt_scalar(x, 0.0), dt)); break;
    case EM_OP_GELU: {
        /* d/dx x*Phi(x) = Phi(x) + x*phi(x) */
        em_tensor *cdf = em_mul_scalar(em_add_scalar(em_erf(em_mul_scalar(x, M_SQRT1_2)), 1.0), 0.5);
        em_tensor *pdf = em_mul_scalar(em_exp(em_mul_scalar(em_square(x), -0.5)), 0.3989422804014327);
        gin[0] = em_mul(g, em_add(cdf, em_mul(x, pdf)));
        break;
    }
    case EM_OP_GELU_TANH: {
        const double k0 = 0.7978845608028654, k1 = 0.044715;
        em_tensor *x2 = em_square(x);
        em_tensor *u = em_mul_scalar(em_mul(x, em_add_scalar(em_mul_scalar(x2, k1), 1.0)), k0);
        em_tensor *t = em_tanh(u);
        em_tensor *left = em_mul_scalar(em_add_scalar(t, 1.0), 0.5);
        em_tensor *du = em_mul_scalar(em_add_scalar(em_mul_scalar(x2, 3.0 * k1), 1.0), k0);
        em_tensor *right = em_mul(em_mul_scalar(x, 0.5), em_mul(em_rsub_scalar(em_square(t), 1.0), du));
        gin[0] = em_mul(g, em_add(left, right));
        break;
    }
    case EM_OP_SILU: {
        em_tensor *s = em_sigmoid(x);
        gin[0] = em_mul(g, em_mul(s, em_add_scalar(em_mul(x, em_rsub_scalar(s, 1.0)), 1.0)));
        break;
    }
    case EM_OP_SOFTPLUS: gin[0] = em_mul(g, em_sigmoid(x)); break;
    case EM_OP_ERF:
        gin[0] = em_mul(g, em_mul_scalar(em_exp(em_neg(em_square(x))), 1.1283791670955126));
        break;
    case EM_OP_CLAMP:
        gin[0] = em_mul(g, mask_f(em_logical_and(em_ge_scalar(x, sa), em_le_scalar(x, sb)), dt));
        break;
    case EM_OP_POW_SCALAR:
        gin[0] = sa == 0 ? em_zeros(x->shape, x->ndim, dt) : em_mul(g, em_mul_scalar(em_pow_scalar(x, sa - 1.0), sa));
        break;
    case EM_OP_LEAKY_RELU: {
        em_tensor *pos = em_gt_scalar(x, 0.0);
        em_tensor *slope = em_where(pos, em_scalar(1.0, dt), em_scalar(sa, dt));
        gin[0] = em_mul(g, slope);
        break;
    }
    case EM_OP_ELU:
        gin[0] = em_mul(g, em_where(em_gt_scalar(x, 0.0), em_scalar(1.0, dt), em_add_scalar(y, sa)));
        break;
    case EM_OP_ADD_SCALAR: case EM_OP_SUB_SCALAR: case EM_OP_REMAINDER_SCALAR: gin[0] = g; break;
    case EM_OP_RSUB_SCALAR: gin[0] = em_neg(g); break;
    case EM_OP_MUL_SCALAR: gin[0] = em_mul_scalar(g, sa); break;
    case EM_OP_DIV_SCALAR: gin[0] = em_div_scalar(g, sa); break;
    case EM_OP_MAXIMUM_SCALAR: gin[0] = em_mul(g, mask_f(em_ge_scalar(x, sa), dt)); break;
    case EM_OP_MINIMUM_SCALAR: gin[0] = em_mul(g, mask_f(em_le_scalar(x, sa), dt)); break;

    /* ---- binary (broadcast: reduce back to each input's shape) ---- */
    case EM_OP_ADD: case EM_OP_SUB: case EM_OP_MUL: case EM_OP_DIV: case EM_OP_POW:
    case EM_OP_MAXIMUM: case EM_OP_MINIMUM: case EM_OP_REMAINDER: {
        em_tensor *a = n->in[0], *b = n->in[1];
        em_tensor *ga = NULL, *gb = NULL;
        em_tensor *af = em_cast(a, dt), *bf = em_cast(b, dt);
        switch (n->kind) {
        case EM_OP_ADD: ga = g; gb = g; break;
        case EM_OP_SUB: ga = g; gb = em_neg(g); break;
        case EM_OP_MUL: ga = em_mul(g, bf); gb = em_mul(g, af); break;
        case EM_OP_DIV:
            ga = em_div(g, bf);
            gb = em_neg(em_div(em_mul(g, af), em_square(bf)));
            break;
        case EM_OP_POW:
            /* d/da = b a^(b-1); d/db = a^b log(a), 0 where a == 0 and b >= 0 (PyTorch) */
            ga = em_mul(g, em_mul(bf, em_pow(af, em_sub_scalar(bf, 1.0))));
            if (b->requires_grad) {
                em_tensor *lg = em_mul(y, em_log(af));
                em_tensor *zero_mask = em_logical_and(em_eq_scalar(af, 0.0), em_ge_scalar(bf, 0.0));
                gb = em_mul(g, em_where(zero_mask, em_scalar(0.0, dt), lg));
            }
            break;
        case EM_OP_MAXIMUM: case EM_OP_MINIMUM: {
            /* ties split the gradient evenly */
            em_tensor *win = n->kind == EM_OP_MAXIMUM ? em_gt(af, bf) : em_lt(af, bf);
            em_tensor *tie = em_eq(af, bf);
            em_tensor *wa = em_add(mask_f(win, dt), em_mul_scalar(mask_f(tie, dt), 0.5));
            ga = em_mul(g, wa);
            gb = em_mul(g, em_rsub_scalar(wa, 1.0));
            break;
        }
        case EM_OP_REMAINDER:
            ga = g;
            gb = em_mul(em_neg(g), em_floor(em_div(af, bf)));
            break;
        default: break;
        }
        if (a->requires_grad) gin[0] = em__sum_to(ga, a->shape, a->ndim);
        if (b->requires_grad) gin[1] = em__sum_to(gb, b->shape, b->ndim);
        break;
    }
    case EM_OP_WHERE: {
        em_tensor *m = n->in[0], *a = n->in[1], *b = n->in[2];
        em_tensor *z = em_scalar(0.0, dt);
        if (a->requires_grad) gin[1] = em__sum_to(em_where(m, g, z), a->shape, a->ndim);
        if (b->requires_grad) gin[2] = em__sum_to(em_where(m, z, g), b->shape, b->ndim);
        break;
    }

    /* ---- reductions ---- */
    case EM_OP_SUM: gin[0] = em_contiguous(expand_red(n, g, x)); break;
    case EM_OP_PROD: {
        /* d prod / d x_i = product of the others: prod / x_i where x_i != 0;
         * where x_i == 0 it is the product of the non-zeros if x_i is the only
         * zero of its reduction, else 0 (as PyTorch's prod_backward). */
        int dims[EM_MAX_DIMS], nd = 0;
        for (int i = 0; i < x->ndim; i++)
            if ((n->p.red.mask >> i) & 1u) dims[nd++] = i;
        em_tensor *ge = expand_red(n, g, x);
        em_tensor *is0 = em_eq_scalar(x, 0.0);
        em_tensor *one = em_scalar(1.0, dt);
        em_tensor *safe_x = em_where(is0, one, x);
        em_tensor *nonzero = em_div(em_mul(ge, expand_red(n, y, x)), safe_x);
        em_tensor *p_nz = em_expand(em_prod(safe_x, dims, nd, true), x->shape, x->ndim);
        em_tensor *nzeros = em_expand(em_sum(em_cast(is0, dt), dims, nd, true), x->shape, x->ndim);
        em_tensor *at_zero = em_mul(ge, em_where(em_eq_scalar(nzeros, 1.0), p_nz, em_scalar(0.0, dt)));
        gin[0] = em_where(is0, at_zero, nonzero);
        break;
    }
    case EM_OP_MAX: case EM_OP_MIN: {
        /* evenly among the elements equal to the extremum (as torch.amax) */
        em_tensor *hit = mask_f(em_eq(x, expand_red(n, y, x)), dt);
        int dims[EM_MAX_DIMS], nd = 0;
        for (int i = 0; i < x->ndim; i++)
            if ((n->p.red.mask >> i) & 1u) dims[nd++] = i;
        em_tensor *cnt = em_sum(hit, dims, nd, true);
        gin[0] = em_div(em_mul(hit, expand_red(n, g, x)), em_expand(cnt, x->shape, x->ndim));
        break;
    }
    case EM_OP_LOGSUMEXP: gin[0] = em_mul(expand_red(n, g, x), em_exp(em_sub(x, expand_red(n, y, x)))); break;
    case EM_OP_VAR: {
        int dims[EM_MAX_DIMS], nd = 0;
        int64_t cnt = 1;
        for (int i = 0; i < x->ndim; i++)
            if ((n->p.red.mask >> i) & 1u) {
                dims[nd++] = i;
                cnt *= x->shape[i];
            }
        em_tensor *mean = em_mean(x, dims, nd, true);
        double scale = 2.0 / ((double)cnt - n->p.red.correction);
        gin[0] = em_mul(expand_red(n, g, x), em_mul_scalar(em_sub(x, mean), scale));
        break;
    }
    case EM_OP_SOFTMAX: {
        int d = n->p.axis.dim;
        em_tensor *s = em_sum(em_mul(g, y), &d, 1, true);
        gin[0] = em_mul(y, em_sub(g, s));
        break;
    }
    case EM_OP_LOG_SOFTMAX: {
        int d = n->p.axis.dim;
        gin[0] = em_sub(g, em_mul(em_exp(y), em_sum(g, &d, 1, true)));
        break;
    }
    case EM_OP_MATMUL: return matmul_backward(n, g, gin);
    case EM_OP_COPY: gin[0] = g; break; /* contiguous / cast: the tape casts back */

    /* ---- indexing ---- */
    case EM_OP_GATHER: {
        int d = n->p.axis.dim;
        gin[0] = em_scatter_add(em_zeros(x->shape, x->ndim, dt), d, n->in[1], g);
        break;
    }
    case EM_OP_SCATTER: case EM_OP_SCATTER_ADD: {
        int d = n->p.axis.dim;
        em_tensor *idx = n->in[1], *src = n->in[2];
        if (x->requires_grad)
            gin[0] = n->kind == EM_OP_SCATTER_ADD ? g : em_scatter(g, d, idx, em_zeros(src->shape, src->ndim, dt));
        if (src->requires_grad) gin[2] = em_gather(g, d, idx);
        break;
    }
    case EM_OP_INDEX_SELECT: {
        int d = n->p.axis.dim;
        em_tensor *idx = n->in[1];
        int64_t ishape[EM_MAX_DIMS];
        for (int i = 0; i < g->ndim; i++) ishape[i] = i == d ? g->shape[d] : 1;
        em_tensor *ie = em_expand(em_reshape(em_cast(idx, EM_I64), ishape, g->ndim), g->shape, g->ndim);
        gin[0] = em_scatter_add(em_zeros(x->shape, x->ndim, dt), d, em_contiguous(ie), g);
        break;
    }

    /* ---- views ---- */
    case EM_OP_VIEW_RESHAPE: gin[0] = em_reshape(em_contiguous(g), x->shape, x->ndim); break;
    case EM_OP_VIEW_PERMUTE: {
        int inv[EM_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) inv[n->p.perm.perm[i]] = i;
        gin[0] = em_permute(g, inv, x->ndim);
        break;
    }
    case EM_OP_VIEW_EXPAND: gin[0] = em__sum_to(g, x->shape, x->ndim); break;
    case EM_OP_VIEW_SLICE: {
        int d = n->p.slice.dim;
        em_tensor *z = em_zeros(x->shape, x->ndim, dt);
        int64_t len = g->shape[d];
        em_tensor *view = em_slice(z, d, n->p.slice.start, n->p.slice.start + len * n->p.slice.step, n->p.slice.step);
        if (!view || em_copy_(view, g) != EM_OK) return em_last_status();
        gin[0] = z;
        break;
    }
    case EM_OP_VIEW_ALIAS: gin[0] = g; break;
    case EM_OP_VIEW_CAT: {
        int d = n->p.axis.dim;
        int64_t off = 0;
        for (int i = 0; i < n->n_in; i++) {
            int64_t len = n->in[i]->shape[d];
            if (n->in[i]->requires_grad) {
                gin[i] = em_narrow(g, d, off, len);
                if (!gin[i]) return em_last_status();
            }
            off += len;
        }
        return EM_OK;
    }
    default:
        return em__set_error(EM_ERR_UNSUPPORTED, "em_backward: op %s has no backward rule", em__optab[n->kind].name);
    }
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && n->in[i]->requires_grad && !gin[i] && n->kind != EM_OP_WHERE && n->kind != EM_OP_SCATTER &&
            n->kind != EM_OP_SCATTER_ADD && n->kind != EM_OP_GATHER && n->kind != EM_OP_INDEX_SELECT)
            return em_last_status() != EM_OK ? em_last_status()
                                             : em__set_error(EM_ERR_RUNTIME, "em_backward: rule of %s failed", em__optab[n->kind].name);
    (void)sb;
    return EM_OK;
}
