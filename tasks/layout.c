/* Layout ops: views (reshape, flatten, squeeze, unsqueeze, transpose, permute,
 * expand, slice, narrow, split, chunk), contiguous, cast, cat, stack, pad and
 * the in-place copy_.
 *
 * What autodiff sees (em__submit records F_DIFF ops):
 *   - recorded directly, one node per call:
 *       VIEW_RESHAPE  reshape (viewable case), flatten, squeeze, squeeze_all, unsqueeze
 *       VIEW_PERMUTE  transpose, permute (p.perm.perm[i] = input dim of output dim i)
 *       VIEW_EXPAND   expand
 *       VIEW_SLICE    slice, narrow, split, chunk (p.slice {start, step, dim})
 *       VIEW_ALIAS    squeeze of a non-1 dim, cast to the same dtype
 *       COPY          contiguous (when a copy is made), cast
 *       VIEW_CAT      cat (recorded by em__autodiff_record_cat after the copies; the
 *                     copies are plain COPY tasks into strided views of the
 *                     output, submitted with EM_OPF_NO_RECORD so the tape
 *                     does not see them)
 *   - composites of recorded ops: reshape of a non-viewable tensor (COPY then
 *     VIEW_RESHAPE), split / chunk (VIEW_SLICE per piece), stack (VIEW_RESHAPE
 *     unsqueezes then VIEW_CAT), pad of an input that requires grad (VIEW_SLICE
 *     crops, then per padded dim a VIEW_CAT of [fill, x, fill]).
 *   - NOT recorded: pad of an input that needs no gradient (em__pad_impl: one
 *     FILL task + one COPY task into the interior view), and copy_ (not
 *     differentiable by contract).
 * em__cat_impl / em__pad_impl (below) do the unrecorded work; their results
 * are unscoped (caller owns).
 */
#include "tasks/tasks_internal.h"

#include <stdlib.h>
#include <string.h>

em_tensor *em__cat_impl(em_tensor *const *ts, int n, int dim);
em_tensor *em__pad_impl(const em_tensor *a, const int64_t *pads, int npads, double value);

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)

/* ---- helpers ----------------------------------------------------------------- */

/* A view of a with the given geometry, submitted as a view op (no task) so
 * autodiff can record it. Unscoped: the caller owns the result. */
static em_tensor *view_op(enum em_op_kind kind, const em_tensor *a, const int64_t *shape, const int64_t *strides, int nd,
                          int64_t offset, const union em_op_params *p)
{
    em_tensor *v = em__tensor_view(a, shape, strides, nd, offset);
    if (!v) return NULL;
    em_op op = {.kind = kind, .n_in = 1, .n_out = 1, .in = {(em_tensor *)a}, .out = {v}};
    if (p) op.p = *p;
    if (em__submit(&op) != EM_OK) {
        em_tensor_release(v);
        return NULL;
    }
    return v;
}

/* Contiguous copy of a in dtype dt through a COPY op. record: go through the
 * funnel (autodiff sees it) or submit the task only. Unscoped. */
static em_tensor *copy_new(const em_tensor *a, em_dtype dt, bool record)
{
    em_tensor *out = em__tensor_new(dt, a->shape, a->ndim);
    if (!out) return NULL;
    em_op op = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {(em_tensor *)a}, .out = {out},
                .flags = record ? 0 : EM_OPF_NO_RECORD};
    em_status st = em__submit(&op);
    if (st != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return out;
}

/* "[2, *, 4]": shape with dim `star` shown as '*'. */
static const char *shape_star(const int64_t *shape, int nd, int star, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "[");
    for (int i = 0; i < nd; i++) {
        if (i == star)
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, i ? ", *" : "*");
        else
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    snprintf(buf + k, k < n ? n - k : 0, "]");
    return buf;
}

static em_status check_rank(int nd, const char *op)
{
    if (nd < 0 || nd > EM_MAX_DIMS)
        return em__set_error(EM_ERR_SHAPE, "%s: result rank %d is out of range (0..%d)", op, nd, EM_MAX_DIMS);
    return EM_OK;
}

/* PyTorch's computeStride: strides that let a tensor of (oshape, ostride) be
 * viewed as nshape without copying; false when impossible. */
static bool view_strides(const int64_t *oshape, const int64_t *ostride, int ond, const int64_t *nshape, int nnd,
                         int64_t *nstride)
{
    if (ond == 0) {
        for (int i = 0; i < nnd; i++) nstride[i] = 1;
        return true;
    }
    int64_t numel = em__numel(oshape, ond);
    if (numel == 0) {
        if (ond == nnd && memcmp(oshape, nshape, sizeof(int64_t) * (size_t)ond) == 0) {
            memcpy(nstride, ostride, sizeof(int64_t) * (size_t)ond);
            return true;
        }
        em__contiguous_strides(nshape, nnd, nstride);
        return true;
    }
    int view_d = nnd - 1;
    int64_t chunk_base = ostride[ond - 1];
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = ond - 1; td >= 0; td--) {
        tensor_numel *= oshape[td];
        if (td == 0 || (oshape[td - 1] != 1 && ostride[td - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || nshape[view_d] == 1)) {
                nstride[view_d] = view_numel * chunk_base;
                view_numel *= nshape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base = ostride[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* Reshape to a fully known shape (numel already checked): a view when the
 * strides allow, else a recorded contiguous copy viewed. Unscoped. */
static em_tensor *reshape_known(const em_tensor *a, const int64_t *shape, int nd)
{
    int64_t st[EM_MAX_DIMS];
    if (view_strides(a->shape, a->strides, a->ndim, shape, nd, st))
        return view_op(EM_OP_VIEW_RESHAPE, a, shape, st, nd, a->offset, NULL);
    em_tensor *c = copy_new(a, a->dtype, true);
    if (!c) return NULL;
    em__contiguous_strides(shape, nd, st);
    em_tensor *v = view_op(EM_OP_VIEW_RESHAPE, c, shape, st, nd, c->offset, NULL);
    em_tensor_release(c);
    return v;
}

/* ---- reshape family -------------------------------------------------------------- */

em_tensor *em_reshape(const em_tensor *a, const int64_t *shape, int ndim)
{
    if (!a) return em__fail_null("em_reshape: input is NULL");
    if (check_rank(ndim, "em_reshape") != EM_OK) return NULL;
    if (ndim > 0 && !shape) return em__fail_null("em_reshape: shape is NULL");
    int64_t ns[EM_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    char sa[200], sb[200];
    for (int i = 0; i < ndim; i++) {
        ns[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0)
                return em__fail(EM_ERR_SHAPE, "em_reshape: only one dim can be -1, shape %s has several (input shape %s)",
                                em_shape_str(shape, ndim, sb, sizeof sb), SHAPE_STR(a, sa));
            infer = i;
        } else if (shape[i] < 0) {
            return em__fail(EM_ERR_SHAPE, "em_reshape: invalid size %lld at dim %d of shape %s (input shape %s)",
                            (long long)shape[i], i, em_shape_str(shape, ndim, sb, sizeof sb), SHAPE_STR(a, sa));
        } else {
            known *= shape[i];
        }
    }
    int64_t numel = em__numel(a->shape, a->ndim);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return em__fail(EM_ERR_SHAPE, "em_reshape: shape %s is invalid for input of shape %s (%lld elements)",
                            em_shape_str(shape, ndim, sb, sizeof sb), SHAPE_STR(a, sa), (long long)numel);
        ns[infer] = numel / known;
    } else if (known != numel) {
        return em__fail(EM_ERR_SHAPE, "em_reshape: cannot reshape tensor of shape %s (%lld elements) into shape %s (%lld elements)",
                        SHAPE_STR(a, sa), (long long)numel, em_shape_str(shape, ndim, sb, sizeof sb), (long long)known);
    }
    return em__publish(reshape_known(a, ns, ndim));
}

em_tensor *em_flatten(const em_tensor *a, int start_dim, int end_dim)
{
    if (!a) return em__fail_null("em_flatten: input is NULL");
    if (a->ndim == 0) {
        if ((start_dim != 0 && start_dim != -1) || (end_dim != 0 && end_dim != -1))
            return em__fail(EM_ERR_INVALID, "em_flatten: dims %d..%d are out of range for a 0-d tensor", start_dim, end_dim);
        int64_t one = 1;
        return em__publish(reshape_known(a, &one, 1));
    }
    int s = em__norm_dim(a, start_dim, 0, "em_flatten");
    if (s < 0) return NULL;
    int e = em__norm_dim(a, end_dim, 0, "em_flatten");
    if (e < 0) return NULL;
    if (s > e) {
        char sa[200];
        return em__fail(EM_ERR_INVALID, "em_flatten: start_dim %d comes after end_dim %d (shape %s)", start_dim, end_dim,
                        SHAPE_STR(a, sa));
    }
    int64_t ns[EM_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < s; i++) ns[nd++] = a->shape[i];
    ns[nd++] = em__numel(a->shape + s, e - s + 1);
    for (int i = e + 1; i < a->ndim; i++) ns[nd++] = a->shape[i];
    return em__publish(reshape_known(a, ns, nd));
}

static em_tensor *alias(const em_tensor *a)
{
    return view_op(EM_OP_VIEW_ALIAS, a, a->shape, a->strides, a->ndim, a->offset, NULL);
}

em_tensor *em_squeeze(const em_tensor *a, int dim)
{
    if (!a) return em__fail_null("em_squeeze: input is NULL");
    if (a->ndim == 0 && (dim == 0 || dim == -1)) return em__publish(alias(a));
    int d = em__norm_dim(a, dim, 0, "em_squeeze");
    if (d < 0) return NULL;
    if (a->shape[d] != 1) return em__publish(alias(a));
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < a->ndim; i++)
        if (i != d) {
            ns[nd] = a->shape[i];
            st[nd++] = a->strides[i];
        }
    return em__publish(view_op(EM_OP_VIEW_RESHAPE, a, ns, st, nd, a->offset, NULL));
}

em_tensor *em_squeeze_all(const em_tensor *a)
{
    if (!a) return em__fail_null("em_squeeze_all: input is NULL");
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != 1) {
            ns[nd] = a->shape[i];
            st[nd++] = a->strides[i];
        }
    return em__publish(view_op(EM_OP_VIEW_RESHAPE, a, ns, st, nd, a->offset, NULL));
}

static em_tensor *unsqueeze_unscoped(const em_tensor *a, int dim, const char *op)
{
    if (a->ndim >= EM_MAX_DIMS) {
        char sa[200];
        return em__fail(EM_ERR_SHAPE, "%s: cannot add a dim to a tensor of shape %s: rank %d would exceed the maximum %d", op,
                        SHAPE_STR(a, sa), a->ndim + 1, EM_MAX_DIMS);
    }
    int d = em__norm_dim(a, dim, 1, op);
    if (d < 0) return NULL;
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i <= a->ndim; i++) {
        if (i == d) {
            ns[nd] = 1;
            st[nd++] = d < a->ndim ? a->shape[d] * a->strides[d] : 1;
        }
        if (i < a->ndim) {
            ns[nd] = a->shape[i];
            st[nd++] = a->strides[i];
        }
    }
    return view_op(EM_OP_VIEW_RESHAPE, a, ns, st, nd, a->offset, NULL);
}

em_tensor *em_unsqueeze(const em_tensor *a, int dim)
{
    if (!a) return em__fail_null("em_unsqueeze: input is NULL");
    return em__publish(unsqueeze_unscoped(a, dim, "em_unsqueeze"));
}

/* ---- permutations ------------------------------------------------------------------ */

static em_tensor *permute_view(const em_tensor *a, const int *perm)
{
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    union em_op_params p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < a->ndim; i++) {
        ns[i] = a->shape[perm[i]];
        st[i] = a->strides[perm[i]];
        p.perm.perm[i] = perm[i];
    }
    return view_op(EM_OP_VIEW_PERMUTE, a, ns, st, a->ndim, a->offset, &p);
}

em_tensor *em_transpose(const em_tensor *a, int dim0, int dim1)
{
    if (!a) return em__fail_null("em_transpose: input is NULL");
    int perm[EM_MAX_DIMS];
    if (a->ndim == 0) {
        if ((dim0 != 0 && dim0 != -1) || (dim1 != 0 && dim1 != -1))
            return em__fail(EM_ERR_INVALID, "em_transpose: dims %d, %d are out of range for a 0-d tensor", dim0, dim1);
        return em__publish(alias(a));
    }
    int d0 = em__norm_dim(a, dim0, 0, "em_transpose");
    if (d0 < 0) return NULL;
    int d1 = em__norm_dim(a, dim1, 0, "em_transpose");
    if (d1 < 0) return NULL;
    for (int i = 0; i < a->ndim; i++) perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return em__publish(permute_view(a, perm));
}

em_tensor *em_permute(const em_tensor *a, const int *perm, int ndim)
{
    if (!a) return em__fail_null("em_permute: input is NULL");
    char sa[200], sp[200];
    if (ndim != a->ndim)
        return em__fail(EM_ERR_INVALID, "em_permute: got %d dims for a tensor of shape %s (rank %d)", ndim, SHAPE_STR(a, sa), a->ndim);
    if (ndim > 0 && !perm) return em__fail_null("em_permute: perm is NULL");
    int np[EM_MAX_DIMS];
    bool seen[EM_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        int d = perm[i] < 0 ? perm[i] + ndim : perm[i];
        if (d < 0 || d >= ndim || seen[d]) {
            size_t k = 0;
            k += (size_t)snprintf(sp + k, sizeof sp - k, "[");
            for (int j = 0; j < ndim && k < sizeof sp; j++) k += (size_t)snprintf(sp + k, sizeof sp - k, j ? ", %d" : "%d", perm[j]);
            if (k < sizeof sp) snprintf(sp + k, sizeof sp - k, "]");
            return em__fail(EM_ERR_INVALID, "em_permute: %s is not a permutation of the %d dims of shape %s (dim %d %s)", sp, ndim,
                            SHAPE_STR(a, sa), perm[i], (d < 0 || d >= ndim) ? "is out of range" : "is repeated");
        }
        seen[d] = true;
        np[i] = d;
    }
    return em__publish(permute_view(a, np));
}

em_tensor *em_expand(const em_tensor *a, const int64_t *shape, int ndim)
{
    if (!a) return em__fail_null("em_expand: input is NULL");
    if (check_rank(ndim, "em_expand") != EM_OK) return NULL;
    if (ndim > 0 && !shape) return em__fail_null("em_expand: shape is NULL");
    char sa[200], sb[200];
    if (ndim < a->ndim)
        return em__fail(EM_ERR_SHAPE, "em_expand: target shape %s has fewer dims than the input shape %s",
                        em_shape_str(shape, ndim, sb, sizeof sb), SHAPE_STR(a, sa));
    int lead = ndim - a->ndim;
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        if (i < lead) {
            if (shape[i] < 0)
                return em__fail(EM_ERR_SHAPE, "em_expand: size %lld at new leading dim %d of %s is invalid (input shape %s)",
                                (long long)shape[i], i, em_shape_str(shape, ndim, sb, sizeof sb), SHAPE_STR(a, sa));
            ns[i] = shape[i];
            st[i] = 0;
            continue;
        }
        int64_t have = a->shape[i - lead];
        int64_t want = shape[i] == -1 ? have : shape[i];
        if (want < 0 || (have != want && have != 1))
            return em__fail(EM_ERR_SHAPE, "em_expand: cannot expand shape %s to %s (dim %d: size %lld to %lld, only size-1 dims expand)",
                            SHAPE_STR(a, sa), em_shape_str(shape, ndim, sb, sizeof sb), i, (long long)have, (long long)shape[i]);
        ns[i] = want;
        st[i] = (have == want) ? a->strides[i - lead] : 0;
    }
    return em__publish(view_op(EM_OP_VIEW_EXPAND, a, ns, st, ndim, a->offset, NULL));
}

em_tensor *em_contiguous(const em_tensor *a)
{
    if (!a) return em__fail_null("em_contiguous: input is NULL");
    /* Already contiguous: a new header over the same storage (an alias view,
     * recorded for autodiff), never the same object published twice. */
    if (em_tensor_is_contiguous(a))
        return em__publish(view_op(EM_OP_VIEW_ALIAS, a, a->shape, a->strides, a->ndim, a->offset, NULL));
    return em__publish(copy_new(a, a->dtype, true));
}

/* ---- slicing ----------------------------------------------------------------------- */

static em_tensor *slice_view(const em_tensor *a, int d, int64_t start, int64_t len, int64_t step)
{
    int64_t ns[EM_MAX_DIMS], st[EM_MAX_DIMS];
    memcpy(ns, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    memcpy(st, a->strides, sizeof(int64_t) * (size_t)a->ndim);
    ns[d] = len;
    st[d] = a->strides[d] * step;
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.slice.start = start;
    p.slice.step = step;
    p.slice.dim = d;
    return view_op(EM_OP_VIEW_SLICE, a, ns, st, a->ndim, a->offset + start * a->strides[d], &p);
}

em_tensor *em_slice(const em_tensor *a, int dim, int64_t start, int64_t end, int64_t step)
{
    if (!a) return em__fail_null("em_slice: input is NULL");
    int d = em__norm_dim(a, dim, 0, "em_slice");
    if (d < 0) return NULL;
    if (step < 1) return em__fail(EM_ERR_INVALID, "em_slice: step must be >= 1, got %lld", (long long)step);
    int64_t n = a->shape[d];
    if (start < 0) start = start < -n ? 0 : start + n;
    if (start > n) start = n;
    if (end < 0) end = end < -n ? 0 : end + n;
    if (end > n) end = n;
    int64_t len = end > start ? (end - start + step - 1) / step : 0;
    return em__publish(slice_view(a, d, start, len, step));
}

static em_tensor *narrow_unscoped(const em_tensor *a, int dim, int64_t start, int64_t length, const char *op)
{
    int d = em__norm_dim(a, dim, 0, op);
    if (d < 0) return NULL;
    int64_t n = a->shape[d];
    char sa[200];
    if (start < -n || start > n)
        return em__fail(EM_ERR_INVALID, "%s: start %lld is out of range for dim %d of size %lld (shape %s)", op, (long long)start, dim,
                        (long long)n, SHAPE_STR(a, sa));
    if (start < 0) start += n;
    if (length < 0 || start + length > n)
        return em__fail(EM_ERR_INVALID, "%s: start %lld + length %lld exceeds dim %d of size %lld (shape %s)", op, (long long)start,
                        (long long)length, dim, (long long)n, SHAPE_STR(a, sa));
    return slice_view(a, d, start, length, 1);
}

em_tensor *em_narrow(const em_tensor *a, int dim, int64_t start, int64_t length)
{
    if (!a) return em__fail_null("em_narrow: input is NULL");
    return em__publish(narrow_unscoped(a, dim, start, length, "em_narrow"));
}

/* Pieces of sizes[i] along d (all valid); publishes them into out. */
static int split_sizes(const em_tensor *a, int d, const int64_t *sizes, int count, em_tensor **out, const char *op)
{
    int64_t pos = 0;
    for (int i = 0; i < count; i++) {
        em_tensor *v = slice_view(a, d, pos, sizes[i], 1);
        if (!v) {
            for (int j = 0; j < i; j++) {
                em_tensor_release(out[j]);
                out[j] = NULL;
            }
            return em_last_status() != EM_OK ? em_last_status() : EM_ERR_RUNTIME;
        }
        out[i] = v;
        pos += sizes[i];
    }
    for (int i = 0; i < count; i++) em__publish(out[i]);
    (void)op;
    return count;
}

int em_split(const em_tensor *a, int64_t split_size, int dim, em_tensor **out, int max_out)
{
    if (!a) return em__set_error(EM_ERR_INVALID, "em_split: input is NULL");
    int d = em__norm_dim(a, dim, 0, "em_split");
    if (d < 0) return EM_ERR_INVALID;
    int64_t n = a->shape[d];
    if (split_size < 0 || (split_size == 0 && n != 0))
        return em__set_error(EM_ERR_INVALID, "em_split: split_size must be >= 1, got %lld (dim %d of size %lld)", (long long)split_size,
                             dim, (long long)n);
    int64_t count = n == 0 ? 1 : (n + split_size - 1) / split_size;
    if (!out || count > max_out)
        return em__set_error(EM_ERR_INVALID, "em_split: splitting dim %d of size %lld into pieces of %lld needs %lld outputs, max_out is %d%s",
                             dim, (long long)n, (long long)split_size, (long long)count, max_out, out ? "" : " (out is NULL)");
    int64_t *sizes = malloc(sizeof(int64_t) * (size_t)count);
    if (!sizes) return em__set_error(EM_ERR_NOMEM, "em_split: out of memory");
    for (int64_t i = 0; i < count; i++) sizes[i] = (n - i * split_size) < split_size ? n - i * split_size : split_size;
    int r = split_sizes(a, d, sizes, (int)count, out, "em_split");
    free(sizes);
    return r;
}

int em_chunk(const em_tensor *a, int chunks, int dim, em_tensor **out, int max_out)
{
    if (!a) return em__set_error(EM_ERR_INVALID, "em_chunk: input is NULL");
    int d = em__norm_dim(a, dim, 0, "em_chunk");
    if (d < 0) return EM_ERR_INVALID;
    if (chunks < 1) return em__set_error(EM_ERR_INVALID, "em_chunk: chunks must be >= 1, got %d", chunks);
    int64_t n = a->shape[d];
    int64_t ss = (n + chunks - 1) / chunks;
    int64_t count = n == 0 ? chunks : (n + ss - 1) / ss;
    if (!out || count > max_out)
        return em__set_error(EM_ERR_INVALID, "em_chunk: %d chunks of dim %d (size %lld) need %lld outputs, max_out is %d%s", chunks,
                             dim, (long long)n, (long long)count, max_out, out ? "" : " (out is NULL)");
    int64_t *sizes = malloc(sizeof(int64_t) * (size_t)count);
    if (!sizes) return em__set_error(EM_ERR_NOMEM, "em_chunk: out of memory");
    for (int64_t i = 0; i < count; i++) sizes[i] = n == 0 ? 0 : ((n - i * ss) < ss ? n - i * ss : ss);
    int r = split_sizes(a, d, sizes, (int)count, out, "em_chunk");
    free(sizes);
    return r;
}

/* ---- cat / stack ------------------------------------------------------------------- */

/* Not recorded by autodiff (see the top of this file). Unscoped result. */
em_tensor *em__cat_impl(em_tensor *const *ts, int n, int dim)
{
    if (!ts) return em__fail_null("em_cat: tensor list is NULL");
    if (n < 1) return em__fail(EM_ERR_INVALID, "em_cat: needs at least one tensor, got %d", n);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return em__fail_null("em_cat: tensor %d is NULL", i);
    const em_tensor *t0 = ts[0];
    char s0[200], si[200], sx[200];
    if (t0->ndim == 0) return em__fail(EM_ERR_SHAPE, "em_cat: tensor 0 is 0-d and cannot be concatenated");
    int d = em__norm_dim(t0, dim, 0, "em_cat");
    if (d < 0) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof(int64_t) * (size_t)t0->ndim);
    em_dtype dt = t0->dtype;
    for (int i = 1; i < n; i++) {
        const em_tensor *t = ts[i];
        bool ok = t->ndim == t0->ndim;
        for (int k = 0; ok && k < t0->ndim; k++)
            if (k != d && t->shape[k] != t0->shape[k]) ok = false;
        if (!ok)
            return em__fail(EM_ERR_SHAPE, "em_cat: tensor %d has shape %s, expected %s matching tensor 0 %s except along dim %d", i,
                            SHAPE_STR(t, si), shape_star(t0->shape, t0->ndim, d, sx, sizeof sx), SHAPE_STR(t0, s0), d);
        shape[d] += t->shape[d];
        dt = em__promote(dt, t->dtype);
    }
    em_tensor *out = em__tensor_new(dt, shape, t0->ndim);
    if (!out) return NULL;
    /* The copies write views of out with RW access, which needs defined
     * contents: a fresh handle is filled first, unless a single input covers
     * the whole output (its copy then has W access). */
    int nonempty = 0;
    for (int i = 0; i < n; i++) nonempty += em__numel(ts[i]->shape, ts[i]->ndim) > 0;
    if (nonempty != 1) {
        em_op op = {.kind = EM_OP_FILL, .n_in = 0, .n_out = 1, .out = {out}, .flags = EM_OPF_NO_RECORD};
        if (em__submit(&op) != EM_OK) {
            em_tensor_release(out);
            return NULL;
        }
    }
    int64_t pos = 0;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = ts[i];
        int64_t len = t->shape[d];
        if (em__numel(t->shape, t->ndim) > 0) {
            int64_t vs[EM_MAX_DIMS];
            memcpy(vs, shape, sizeof vs);
            vs[d] = len;
            em_tensor *v = em__tensor_view(out, vs, out->strides, out->ndim, pos * out->strides[d]);
            if (!v) {
                em_tensor_release(out);
                return NULL;
            }
            em_op op = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {(em_tensor *)t}, .out = {v}, .flags = EM_OPF_NO_RECORD};
            em_status st = em__submit(&op);
            em_tensor_release(v);
            if (st != EM_OK) {
                em_tensor_release(out);
                return NULL;
            }
        }
        pos += len;
    }
    return out;
}

/* cat + the autodiff record. Unscoped. */
static em_tensor *cat_recorded(em_tensor *const *ts, int n, int dim)
{
    em_tensor *out = em__cat_impl(ts, n, dim);
    if (out && em__autodiff_record_cat && em__autodiff_record_cat(out, ts, n, em__norm_dim(ts[0], dim, 0, "em_cat")) != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em_cat(em_tensor *const *ts, int n, int dim)
{
    return em__publish(cat_recorded(ts, n, dim));
}

em_tensor *em_stack(em_tensor *const *ts, int n, int dim)
{
    if (!ts) return em__fail_null("em_stack: tensor list is NULL");
    if (n < 1) return em__fail(EM_ERR_INVALID, "em_stack: needs at least one tensor, got %d", n);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return em__fail_null("em_stack: tensor %d is NULL", i);
    char s0[200], si[200];
    for (int i = 1; i < n; i++)
        if (ts[i]->ndim != ts[0]->ndim ||
            memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)ts[0]->ndim) != 0)
            return em__fail(EM_ERR_SHAPE, "em_stack: tensor %d has shape %s, expected %s like tensor 0", i, SHAPE_STR(ts[i], si),
                            SHAPE_STR(ts[0], s0));
    em_tensor **u = calloc((size_t)n, sizeof *u);
    if (!u) return em__fail(EM_ERR_NOMEM, "em_stack: out of memory");
    em_tensor *r = NULL;
    int i;
    for (i = 0; i < n; i++) {
        u[i] = unsqueeze_unscoped(ts[i], dim, "em_stack");
        if (!u[i]) break;
    }
    if (i == n) r = em_cat(u, n, dim);
    for (int j = 0; j < n; j++) em_tensor_release(u[j]);
    free(u);
    return r;
}

/* ---- cast, pad, copy_ ---------------------------------------------------------------- */

em_tensor *em_cast(const em_tensor *a, em_dtype dt)
{
    if (!a) return em__fail_null("em_cast: input is NULL");
    if ((int)dt < 0 || dt >= EM_DTYPE_COUNT) return em__fail(EM_ERR_DTYPE, "em_cast: invalid dtype %d", (int)dt);
    if (dt == a->dtype) return em__publish(alias(a));
    return em__publish(copy_new(a, dt, true));
}

/* Validates pad arguments; fills the output shape, the cropped input shape,
 * the cropped input's offset and where it lands in the output. */
static em_status pad_geometry(const em_tensor *a, const int64_t *pads, int npads, int64_t *os, int64_t *cs, int64_t *in_off,
                              int64_t *out_start)
{
    if (!a) return em__set_error(EM_ERR_INVALID, "em_pad: input is NULL");
    char sa[200];
    if (npads < 0 || npads % 2 != 0 || npads > 2 * a->ndim)
        return em__set_error(EM_ERR_INVALID, "em_pad: npads must be even and <= 2*ndim = %d for shape %s, got %d", 2 * a->ndim,
                             SHAPE_STR(a, sa), npads);
    if (npads > 0 && !pads) return em__set_error(EM_ERR_INVALID, "em_pad: pads is NULL");
    *in_off = a->offset;
    for (int d = 0; d < a->ndim; d++) {
        int k = a->ndim - 1 - d; /* pads[2k], pads[2k+1] pad dim d */
        int64_t l = 2 * k < npads ? pads[2 * k] : 0, r = 2 * k + 1 < npads ? pads[2 * k + 1] : 0;
        int64_t n = a->shape[d];
        int64_t cl = l < 0 ? -l : 0, cr = r < 0 ? -r : 0;
        if (n - cl - cr < 0)
            return em__set_error(EM_ERR_SHAPE, "em_pad: pads %lld, %lld on dim %d crop more than its %lld elements (shape %s)",
                                 (long long)l, (long long)r, d, (long long)n, SHAPE_STR(a, sa));
        os[d] = n + l + r;
        cs[d] = n - cl - cr;
        *in_off += cl * a->strides[d];
        out_start[d] = l > 0 ? l : 0;
    }
    return EM_OK;
}

/* Not recorded by autodiff (see the top of this file). Unscoped result. */
em_tensor *em__pad_impl(const em_tensor *a, const int64_t *pads, int npads, double value)
{
    int64_t os[EM_MAX_DIMS], cs[EM_MAX_DIMS]; /* output shape, cropped input shape */
    int64_t in_off, out_start[EM_MAX_DIMS];
    if (pad_geometry(a, pads, npads, os, cs, &in_off, out_start) != EM_OK) return NULL;
    em_tensor *out = em__tensor_new(a->dtype, os, a->ndim);
    if (!out) return NULL;
    union em_op_params p;
    memset(&p, 0, sizeof p);
    p.s.a = value;
    em_op fill = {.kind = EM_OP_FILL, .n_in = 0, .n_out = 1, .out = {out}, .p = p, .flags = EM_OPF_NO_RECORD};
    if (em__submit(&fill) != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    if (em__numel(cs, a->ndim) > 0) {
        int64_t ooff = 0;
        for (int d = 0; d < a->ndim; d++) ooff += out_start[d] * out->strides[d];
        em_tensor *src = em__tensor_view(a, cs, a->strides, a->ndim, in_off);
        em_tensor *dst = src ? em__tensor_view(out, cs, out->strides, out->ndim, ooff) : NULL;
        em_status st = EM_ERR_NOMEM;
        if (src && dst) {
            em_op op = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {src}, .out = {dst}, .flags = EM_OPF_NO_RECORD};
            st = em__submit(&op);
        }
        em_tensor_release(src);
        em_tensor_release(dst);
        if (st != EM_OK) {
            em_tensor_release(out);
            return NULL;
        }
    }
    return out;
}

/* Differentiable pad: recorded crops (VIEW_SLICE), then for each padded dim
 * a recorded cat of [fill, x, fill]. Arguments already validated. Unscoped. */
static em_tensor *pad_recorded(const em_tensor *a, const int64_t *pads, int npads, double value)
{
    em_tensor *cur = em_tensor_retain((em_tensor *)a);
    for (int d = 0; d < a->ndim && cur; d++) {
        int k = a->ndim - 1 - d;
        int64_t l = 2 * k < npads ? pads[2 * k] : 0, r = 2 * k + 1 < npads ? pads[2 * k + 1] : 0;
        if (l >= 0 && r >= 0) continue;
        int64_t cl = l < 0 ? -l : 0, cr = r < 0 ? -r : 0, n = cur->shape[d];
        em_tensor *v = slice_view(cur, d, cl, n - cl - cr, 1);
        em_tensor_release(cur);
        cur = v;
    }
    for (int d = 0; d < a->ndim && cur; d++) {
        int k = a->ndim - 1 - d;
        int64_t l = 2 * k < npads ? pads[2 * k] : 0, r = 2 * k + 1 < npads ? pads[2 * k + 1] : 0;
        if (l <= 0 && r <= 0) continue;
        em_tensor *parts[3] = {NULL, NULL, NULL};
        int np = 0;
        int64_t shape[EM_MAX_DIMS];
        memcpy(shape, cur->shape, sizeof shape);
        em_tensor *fl = NULL, *fr = NULL;
        if (l > 0) {
            shape[d] = l;
            fl = em__tensor_new(a->dtype, shape, a->ndim);
        }
        if (r > 0) {
            shape[d] = r;
            fr = em__tensor_new(a->dtype, shape, a->ndim);
        }
        em_tensor *fills[2] = {fl, fr};
        bool ok = (l <= 0 || fl) && (r <= 0 || fr);
        for (int i = 0; i < 2 && ok; i++) {
            if (!fills[i]) continue;
            em_op op = {.kind = EM_OP_FILL, .n_in = 0, .n_out = 1, .out = {fills[i]}, .flags = EM_OPF_NO_RECORD};
            op.p.s.a = value;
            if (em__submit(&op) != EM_OK) ok = false;
        }
        if (fl) parts[np++] = fl;
        parts[np++] = cur;
        if (fr) parts[np++] = fr;
        em_tensor *next = ok ? cat_recorded(parts, np, d) : NULL;
        em_tensor_release(fl);
        em_tensor_release(fr);
        em_tensor_release(cur);
        cur = next;
    }
    if (cur == a) { /* nothing to pad: a new header, as the other paths give */
        em_tensor_release(cur);
        cur = alias(a);
    }
    return cur;
}

em_tensor *em_pad(const em_tensor *a, const int64_t *pads, int npads, double value)
{
    if (!a || !a->requires_grad || !em_grad_enabled()) return em__publish(em__pad_impl(a, pads, npads, value));
    int64_t os[EM_MAX_DIMS], cs[EM_MAX_DIMS], in_off, out_start[EM_MAX_DIMS];
    if (pad_geometry(a, pads, npads, os, cs, &in_off, out_start) != EM_OK) return NULL;
    return em__publish(pad_recorded(a, pads, npads, value));
}

em_status em_copy_(em_tensor *dst, const em_tensor *src)
{
    if (!dst || !src) return em__set_error(EM_ERR_INVALID, "em_copy_: %s is NULL", !dst ? "dst" : "src");
    char sd[200], ss[200];
    int64_t bs[EM_MAX_DIMS];
    int nb;
    if (em__broadcast_shapes(dst->shape, dst->ndim, src->shape, src->ndim, bs, &nb, "em_copy_") != EM_OK) return em_last_status();
    if (nb != dst->ndim || memcmp(bs, dst->shape, sizeof(int64_t) * (size_t)nb) != 0)
        return em__set_error(EM_ERR_SHAPE, "em_copy_: source of shape %s does not broadcast to the destination shape %s",
                             SHAPE_STR(src, ss), SHAPE_STR(dst, sd));
    for (int i = 0; i < dst->ndim; i++)
        if (dst->strides[i] == 0 && dst->shape[i] > 1)
            return em__set_error(EM_ERR_INVALID, "em_copy_: destination of shape %s has stride 0 on dim %d (an expanded view): "
                                 "several elements share one memory location", SHAPE_STR(dst, sd), i);
    if (em__numel(dst->shape, dst->ndim) == 0) return EM_OK;
    em_tensor *s = em_tensor_shares_storage(dst, src) ? copy_new(src, src->dtype, false) : em_tensor_retain((em_tensor *)src);
    if (!s) return em_last_status();
    em_tensor *b = em__broadcast_view(s, dst->shape, dst->ndim);
    em_tensor_release(s);
    if (!b) return em_last_status();
    em_op op = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {b}, .out = {dst}, .flags = EM_OPF_NO_RECORD};
    em_status st = em__submit(&op);
    em_tensor_release(b);
    return st;
}
