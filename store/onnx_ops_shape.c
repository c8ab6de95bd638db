/* ONNX operators, shape group (see store/onnx_internal.h): the data
 * movement operators (Shape, Size, Concat, Transpose, Unsqueeze, Squeeze,
 * Expand, ConstantOfShape, Slice, Range, Gather*, Scatter*, Split, Pad,
 * Trilu, Tile, OneHot, EyeLike, DepthToSpace, SpaceToDepth, NonZero,
 * Compress, CumSum, CumProd, ReverseSequence, TopK, Unique, CenterCropPad,
 * TensorScatter) and the signal ones (DFT, STFT, the
 * Hann / Hamming / Blackman windows, MelWeightMatrix).
 * Semantics from onnx/docs/Operators.md (onnx 1.23); each function names
 * the opsets whose differences it handles. Everything is composed from
 * Ember's tensor ops; only shapes, axes, pads and similar small integer
 * inputs are read to the host. */
#include "store/onnx_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

/* Integer values of an INTS attribute (before opset 13 / 10 / 11) or of
 * input @p in (later): count, 0 when both are absent, -1 + error. */
static int ints_attr_or_input(onnx_ctx *c, const char *attr, int in, int64_t *buf, int max)
{
    if (onnx_in(c, in)) return onnx_in_ints(c, in, buf, max);
    const int64_t *v;
    int n = onnx_attr_ints(c, attr, &v);
    if (n <= 0) return 0;
    if (n > max) {
        em_set_error(EM_ERR_SHAPE, "attribute %s has %d values, at most %d are allowed", attr, n, max);
        return -1;
    }
    memcpy(buf, v, (size_t)n * sizeof *buf);
    return n;
}

/* Negative indices counted from the end of a dim of size @p dim. */
static em_tensor *fix_neg(em_tensor *idx, int64_t dim)
{
    return em_where(em_lt_scalar(idx, 0), em_add_scalar(idx, (double)dim), idx);
}

/* 1-D i64 tensor [0, n). */
static em_tensor *iota(int64_t n) { return em_arange(0, (double)n, 1, EM_I64); }

/* A 1-D tensor reshaped to rank @p r with its values along @p axis. */
static em_tensor *along(em_tensor *v, int axis, int r)
{
    int64_t s[EM_MAX_DIMS];
    for (int d = 0; d < r; d++) s[d] = 1;
    s[axis] = em_tensor_numel(v);
    return em_reshape(v, s, r);
}

/* x reversed along axis. */
static em_tensor *flip(em_tensor *x, int axis)
{
    int64_t n = em_tensor_dim(x, axis);
    if (n <= 1) return em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x));
    return em_index_select(x, axis, em_arange((double)(n - 1), -1, -1, EM_I64));
}

/* x shifted by k >= 0 towards higher indices along axis, filled with @p fill. */
static em_tensor *shift(em_tensor *x, int axis, int64_t k, double fill)
{
    int r = em_tensor_ndim(x);
    int64_t n = em_tensor_dim(x, axis);
    if (k > n) k = n;
    int64_t pads[2 * EM_MAX_DIMS] = {0};
    pads[2 * (r - 1 - axis)] = k;
    return em_pad(em_narrow(x, axis, 0, n - k), pads, 2 * r, fill);
}

/* Inclusive prefix sum (or product) along axis by log2(n) doubling steps. */
static em_tensor *scan(em_tensor *x, int axis, bool mul)
{
    int64_t n = em_tensor_dim(x, axis);
    em_tensor *y = x;
    for (int64_t k = 1; k < n && y; k *= 2) {
        em_tensor *s = shift(y, axis, k, mul ? 1.0 : 0.0);
        y = mul ? em_mul(y, s) : em_add(y, s);
    }
    return y == x ? em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)) : y;
}

/* Flat positions (i64 [count]) of the true elements of 1-D bool @p mask,
 * ascending. */
static em_tensor *true_positions(em_tensor *mask)
{
    int64_t L = em_tensor_numel(mask);
    if (L == 0) {
        int64_t z = 0;
        return em_zeros(&z, 1, EM_I64);
    }
    em_tensor *m = em_cast(mask, EM_I64);
    double cnt;
    if (em_item(em_sum_all(m), &cnt) != EM_OK) return NULL;
    int64_t n = (int64_t)cnt;
    em_tensor *pos = em_where(mask, em_sub_scalar(scan(m, 0, false), 1), em_scalar((double)n, EM_I64));
    int64_t n1 = n + 1;
    em_tensor *out = em_scatter(em_zeros(&n1, 1, EM_I64), 0, pos, iota(L));
    return em_narrow(out, 0, 0, n);
}

/* ---- operators ---- */

/* Shape (1, 13, 15, 19, 21, 23, 24, 25): start / end (15) clamped. */
static em_status op_shape(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t r = em_tensor_ndim(x);
    int64_t start = onnx_attr_int(c, "start", 0), end = onnx_attr_int(c, "end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < 0 ? 0 : end > r ? r : end;
    int64_t n = end > start ? end - start : 0, s[EM_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) s[i] = em_tensor_dim(x, (int)(start + i));
    return onnx_out(c, 0, em_from_host(s, &n, 1, EM_I64), ONNX_INT64);
}

/* Size (1, 13, 19, 21, 23, 24, 25): 0-d int64. */
static em_status op_size(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t n = em_tensor_numel(x);
    return onnx_out(c, 0, em_from_host(&n, NULL, 0, EM_I64), ONNX_INT64);
}

/* Concat (1, 4, 11, 13): axis required from 4 (default 1 before). */
static em_status op_concat(onnx_ctx *c)
{
    if (c->nin < 1) return em_set_error(EM_ERR_INVALID, "Concat without inputs");
    em_tensor **ts = calloc((size_t)c->nin, sizeof *ts);
    if (!ts) return em_set_error(EM_ERR_NOMEM, "Concat: out of memory");
    int n = 0;
    for (int i = 0; i < c->nin; i++) {
        em_tensor *t = onnx_in_req(c, i);
        if (!t) {
            free(ts);
            return em_last_status();
        }
        ts[n++] = t;
    }
    int r = em_tensor_ndim(ts[0]), axis;
    if (onnx_axis(c, onnx_attr_int(c, "axis", c->opset < 4 ? 1 : 0), r, &axis) != EM_OK) {
        free(ts);
        return em_last_status();
    }
    em_tensor *y = em_cat(ts, n, axis);
    free(ts);
    return onnx_out(c, 0, y, 0);
}

/* Transpose (1, 13, 21, 23, 24, 25): perm defaults to the reversed dims. */
static em_status op_transpose(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), perm[EM_MAX_DIMS];
    const int64_t *p;
    int n = onnx_attr_ints(c, "perm", &p);
    if (n >= 0 && n != r) return em_set_error(EM_ERR_INVALID, "perm has %d entries for rank %d", n, r);
    bool seen[EM_MAX_DIMS] = {false};
    for (int d = 0; d < r; d++) {
        int a = r - 1 - d;
        if (n >= 0 && onnx_axis(c, p[d], r, &a) != EM_OK) return em_last_status();
        if (seen[a]) return em_set_error(EM_ERR_INVALID, "perm repeats axis %d", a);
        seen[a] = true;
        perm[d] = a;
    }
    if (r == 0) return onnx_out(c, 0, em_reshape(x, NULL, 0), 0);
    return onnx_out(c, 0, em_permute(x, perm, r), 0);
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Unsqueeze (1, 11, 13, 21, 23, 24, 25): axes attribute before 13, input
 * from 13; negative axes (11) count in the output's rank. */
static em_status op_unsqueeze(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t ax[EM_MAX_DIMS + 1];
    int n = ints_attr_or_input(c, "axes", 1, ax, EM_MAX_DIMS + 1);
    if (n < 0) return em_last_status();
    if (n == 0) {
        if (!onnx_in(c, 1) && !onnx_has_attr(c, "axes")) return em_set_error(EM_ERR_INVALID, "Unsqueeze without axes");
        return onnx_out(c, 0, em_reshape(x, em_tensor_shape(x), em_tensor_ndim(x)), 0); /* nothing inserted */
    }
    int r = em_tensor_ndim(x) + n, a[EM_MAX_DIMS + 1];
    if (r > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", r, EM_MAX_DIMS);
    for (int i = 0; i < n; i++)
        if (onnx_axis(c, ax[i], r, &a[i]) != EM_OK) return em_last_status();
    qsort(a, (size_t)n, sizeof *a, cmp_int);
    for (int i = 1; i < n; i++)
        if (a[i] == a[i - 1]) return em_set_error(EM_ERR_INVALID, "axes repeat axis %d", a[i]);
    em_tensor *y = x;
    for (int i = 0; i < n; i++) y = em_unsqueeze(y, a[i]);
    return onnx_out(c, 0, y, 0);
}

/* Squeeze (1, 11, 13, 21, 23, 24, 25): axes attribute before 13, input
 * from 13; without axes every size-1 dim goes. */
static em_status op_squeeze(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), a[EM_MAX_DIMS];
    int64_t ax[EM_MAX_DIMS];
    int n = ints_attr_or_input(c, "axes", 1, ax, EM_MAX_DIMS);
    if (n < 0) return em_last_status();
    if (n == 0) {
        int64_t s[EM_MAX_DIMS];
        int k = 0;
        for (int d = 0; d < r; d++)
            if (em_tensor_dim(x, d) != 1) s[k++] = em_tensor_dim(x, d);
        return onnx_out(c, 0, em_reshape(x, s, k), 0);
    }
    for (int i = 0; i < n; i++) {
        if (onnx_axis(c, ax[i], r, &a[i]) != EM_OK) return em_last_status();
        if (em_tensor_dim(x, a[i]) != 1)
            return em_set_error(EM_ERR_SHAPE, "axis %d has size %lld, not 1", a[i], (long long)em_tensor_dim(x, a[i]));
    }
    qsort(a, (size_t)n, sizeof *a, cmp_int);
    em_tensor *y = x;
    for (int i = n - 1; i >= 0; i--) {
        if (i + 1 < n && a[i] == a[i + 1]) return em_set_error(EM_ERR_INVALID, "axes repeat axis %d", a[i]);
        int64_t s[EM_MAX_DIMS];
        int k = 0, ry = em_tensor_ndim(y);
        for (int d = 0; d < ry; d++)
            if (d != a[i]) s[k++] = em_tensor_dim(y, d);
        y = em_reshape(y, s, k);
    }
    return onnx_out(c, 0, y, 0);
}

/* Expand (8, 13): bidirectional broadcast of x with the shape input. */
static em_status op_expand(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int64_t s[EM_MAX_DIMS + 1], o[EM_MAX_DIMS];
    int n = onnx_in_ints(c, 1, s, EM_MAX_DIMS + 1);
    if (n < 0) return em_last_status();
    int rx = em_tensor_ndim(x), r = n > rx ? n : rx;
    if (r > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", r, EM_MAX_DIMS);
    for (int d = 0; d < r; d++) {
        int dx = d - (r - rx), ds = d - (r - n);
        int64_t a = dx >= 0 ? em_tensor_dim(x, dx) : 1, b = ds >= 0 ? s[ds] : 1;
        if (a != b && a != 1 && b != 1)
            return em_set_error(EM_ERR_SHAPE, "input dim %lld does not broadcast with shape value %lld", (long long)a, (long long)b);
        o[d] = a == 1 ? b : a;
    }
    return onnx_out(c, 0, em_contiguous(em_expand(x, o, r)), 0);
}

/* ConstantOfShape (9, 20, 21, 23, 24, 25): value attribute (one element),
 * float 0 by default. */
static em_status op_constant_of_shape(onnx_ctx *c)
{
    int64_t s[EM_MAX_DIMS + 1];
    int n = onnx_in_ints(c, 0, s, EM_MAX_DIMS + 1);
    if (n < 0) return em_last_status();
    if (n > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", n, EM_MAX_DIMS);
    for (int i = 0; i < n; i++)
        if (s[i] < 0) return em_set_error(EM_ERR_SHAPE, "shape[%d] = %lld is negative", i, (long long)s[i]);
    int type = ONNX_FLOAT;
    em_tensor *v = onnx_attr_tensor(c, "value", &type);
    if (!v) {
        if (onnx_has_attr(c, "value")) return em_last_status();
        return onnx_out(c, 0, em_zeros(s, n, EM_F32), ONNX_FLOAT);
    }
    if (em_tensor_numel(v) != 1) return em_set_error(EM_ERR_SHAPE, "value must have one element, it has %lld", (long long)em_tensor_numel(v));
    return onnx_out(c, 0, em_contiguous(em_expand(em_reshape(v, NULL, 0), s, n)), type);
}

/* The numpy slice start:end:step of a dim of size n: the first index and
 * the count. */
static void slice_range(int64_t n, int64_t start, int64_t end, int64_t step, int64_t *first, int64_t *count)
{
    if (start < 0) start = start < -n ? -n - 1 : start + n;
    if (end < 0) end = end < -n ? -n - 1 : end + n;
    if (step > 0) {
        start = start < 0 ? 0 : start > n ? n : start;
        end = end < 0 ? 0 : end > n ? n : end;
        *first = start;
        *count = end > start ? (end - start + step - 1) / step : 0;
    } else {
        start = start < 0 ? -1 : start > n - 1 ? n - 1 : start;
        end = end < -1 ? -1 : end > n - 1 ? n - 1 : end;
        *first = start;
        *count = start > end ? (start - end + (-step) - 1) / (-step) : 0;
    }
}

/* Slice (1, 10, 11, 13): starts / ends / axes attributes before 10, inputs
 * (with steps) from 10; numpy clamping, negative steps. */
static em_status op_slice(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    int64_t st[EM_MAX_DIMS], en[EM_MAX_DIMS], ax[EM_MAX_DIMS], sp[EM_MAX_DIMS];
    int ns, ne, na, np = -1;
    if (c->opset < 10) {
        const int64_t *v;
        ns = onnx_attr_ints(c, "starts", &v);
        if (ns > EM_MAX_DIMS) return em_set_error(EM_ERR_SHAPE, "too many starts");
        if (ns > 0) memcpy(st, v, (size_t)ns * 8);
        ne = onnx_attr_ints(c, "ends", &v);
        if (ne > EM_MAX_DIMS) return em_set_error(EM_ERR_SHAPE, "too many ends");
        if (ne > 0) memcpy(en, v, (size_t)ne * 8);
        na = onnx_attr_ints(c, "axes", &v);
        if (na > EM_MAX_DIMS) return em_set_error(EM_ERR_SHAPE, "too many axes");
        if (na > 0) memcpy(ax, v, (size_t)na * 8);
        if (ns < 0 || ne < 0) return em_set_error(EM_ERR_INVALID, "Slice needs the starts and ends attributes");
    } else {
        if ((ns = onnx_in_ints(c, 1, st, EM_MAX_DIMS)) < 0) return em_last_status();
        if ((ne = onnx_in_ints(c, 2, en, EM_MAX_DIMS)) < 0) return em_last_status();
        na = -1;
        if (onnx_in(c, 3) && (na = onnx_in_ints(c, 3, ax, EM_MAX_DIMS)) < 0) return em_last_status();
        if (onnx_in(c, 4) && (np = onnx_in_ints(c, 4, sp, EM_MAX_DIMS)) < 0) return em_last_status();
    }
    if (ne != ns) return em_set_error(EM_ERR_SHAPE, "%d starts but %d ends", ns, ne);
    if (na >= 0 && na != ns) return em_set_error(EM_ERR_SHAPE, "%d starts but %d axes", ns, na);
    if (np >= 0 && np != ns) return em_set_error(EM_ERR_SHAPE, "%d starts but %d steps", ns, np);
    bool seen[EM_MAX_DIMS] = {false};
    em_tensor *y = x;
    for (int i = 0; i < ns; i++) {
        int a = i;
        if (na >= 0 && onnx_axis(c, ax[i], r, &a) != EM_OK) return em_last_status();
        if (a >= r) return em_set_error(EM_ERR_INVALID, "more starts (%d) than dims (%d)", ns, r);
        if (seen[a]) return em_set_error(EM_ERR_INVALID, "axes repeat axis %d", a);
        seen[a] = true;
        int64_t step = np >= 0 ? sp[i] : 1, first, count;
        if (step == 0) return em_set_error(EM_ERR_INVALID, "steps[%d] is 0", i);
        slice_range(em_tensor_dim(x, a), st[i], en[i], step, &first, &count);
        if (count == 0) y = em_narrow(y, a, 0, 0);
        else if (step > 0) y = em_slice(y, a, first, first + (count - 1) * step + 1, step);
        else y = em_index_select(y, a, em_add_scalar(em_mul_scalar(iota(count), (double)step), (double)first));
    }
    return onnx_out(c, 0, em_contiguous(y), 0);
}

/* Range (11): ceil((limit - start) / delta) elements start + i * delta. */
static em_status op_range(onnx_ctx *c)
{
    double start, limit, delta;
    if (onnx_in_scalar(c, 0, &start) != EM_OK || onnx_in_scalar(c, 1, &limit) != EM_OK || onnx_in_scalar(c, 2, &delta) != EM_OK)
        return em_last_status();
    if (delta == 0) return em_set_error(EM_ERR_INVALID, "delta is 0");
    double q = ceil((limit - start) / delta);
    int64_t n = q > 0 ? (int64_t)q : 0;
    em_dtype dt = em_tensor_dtype(onnx_in(c, 0));
    bool isf = dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
    em_tensor *y;
    if (n == 0) y = em_zeros(&n, 1, dt);
    else if (isf) y = em_cast(em_add_scalar(em_mul_scalar(em_arange(0, (double)n, 1, EM_F64), delta), start), dt);
    else y = em_cast(em_add_scalar(em_mul_scalar(iota(n), delta), start), dt);
    return onnx_out(c, 0, y, onnx_in_type(c, 0));
}

/* Gather (1, 11, 13): negative indices (11); output data.shape[:axis] +
 * indices.shape + data.shape[axis+1:]. */
static em_status op_gather(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *idx = onnx_in_req(c, 1);
    if (!x || !idx) return em_last_status();
    int r = em_tensor_ndim(x), ri = em_tensor_ndim(idx), axis;
    if (r < 1) return em_set_error(EM_ERR_SHAPE, "data must have rank >= 1");
    if (onnx_axis(c, onnx_attr_int(c, "axis", 0), r, &axis) != EM_OK) return em_last_status();
    if (r - 1 + ri > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", r - 1 + ri, EM_MAX_DIMS);
    int64_t n = em_tensor_numel(idx), s[EM_MAX_DIMS];
    em_tensor *g = em_index_select(x, axis, fix_neg(em_reshape(idx, &n, 1), em_tensor_dim(x, axis)));
    int k = 0;
    for (int d = 0; d < axis; d++) s[k++] = em_tensor_dim(x, d);
    for (int d = 0; d < ri; d++) s[k++] = em_tensor_dim(idx, d);
    for (int d = axis + 1; d < r; d++) s[k++] = em_tensor_dim(x, d);
    return onnx_out(c, 0, em_reshape(g, s, k), 0);
}

/* GatherElements (11, 13): negative indices. */
static em_status op_gather_elements(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *idx = onnx_in_req(c, 1);
    if (!x || !idx) return em_last_status();
    int axis;
    if (onnx_axis(c, onnx_attr_int(c, "axis", 0), em_tensor_ndim(x), &axis) != EM_OK) return em_last_status();
    return onnx_out(c, 0, em_gather(x, axis, fix_neg(idx, em_tensor_dim(x, axis))), 0);
}

/* Reductions mul / max / min of a scatter, dense: D [P, R] with the update
 * rows U [N, R] combined into rows T [N] (i64 in [0, P)) through a [P, N, R]
 * selection (so bounded in size). */
#define DENSE_SCATTER_MAX (1 << 24)
static em_tensor *scatter_reduce_dense(onnx_ctx *c, em_tensor *D, em_tensor *T, em_tensor *U, const char *red)
{
    int64_t P = em_tensor_dim(D, 0), R = em_tensor_dim(D, 1), N = em_tensor_dim(U, 0);
    if (N == 0) return em_contiguous(D);
    if ((double)P * (double)N * (double)R > DENSE_SCATTER_MAX) {
        onnx_unsupported(c, "reduction '%s' is composed densely (data x updates elements), too large here", red);
        return NULL;
    }
    int64_t ps[3] = {P, 1, 1}, ts[3] = {1, N, 1}, us[3] = {1, N, R}, ds[3] = {P, 1, R};
    em_tensor *E = em_eq(em_reshape(iota(P), ps, 3), em_reshape(T, ts, 3)); /* [P, N, 1] */
    em_tensor *u3 = em_reshape(U, us, 3);
    int one = 1;
    if (!strcmp(red, "mul")) return em_mul(D, em_prod(em_where(E, u3, em_scalar(1, em_tensor_dtype(D))), &one, 1, false));
    em_tensor *v = em_where(E, u3, em_reshape(D, ds, 3));
    /* rows no update targets keep D (selected where E is false); D joins
     * every other row's reduction once more */
    return !strcmp(red, "max") ? em_maximum(D, em_max(v, &one, 1, false)) : em_minimum(D, em_min(v, &one, 1, false));
}

/* ScatterElements (11, 13, 16, 18) and Scatter (9): reduction none / add
 * (16) / mul (16) / max, min (18); mul / max / min composed densely
 * (scatter_reduce_dense). */
static em_status op_scatter_elements(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *idx = onnx_in_req(c, 1), *u = onnx_in_req(c, 2);
    if (!x || !idx || !u) return em_last_status();
    int axis;
    if (onnx_axis(c, onnx_attr_int(c, "axis", 0), em_tensor_ndim(x), &axis) != EM_OK) return em_last_status();
    const char *red = onnx_attr_string(c, "reduction", "none");
    idx = fix_neg(idx, em_tensor_dim(x, axis));
    if (!strcmp(red, "none")) return onnx_out(c, 0, em_scatter(x, axis, idx, u), 0);
    if (!strcmp(red, "add")) return onnx_out(c, 0, onnx_wrap_int(em_scatter_add(x, axis, idx, u), onnx_in_type(c, 0)), 0);
    if (strcmp(red, "mul") && strcmp(red, "max") && strcmp(red, "min")) return em_set_error(EM_ERR_INVALID, "unknown reduction '%s'", red);
    /* the flat target of each update: its own coordinates but idx along axis */
    int r = em_tensor_ndim(x);
    if (em_tensor_ndim(idx) != r || em_tensor_numel(idx) != em_tensor_numel(u)) return em_set_error(EM_ERR_SHAPE, "indices and updates must have data's rank and one shape");
    em_tensor *lin = NULL;
    int64_t stride = 1;
    for (int d = r - 1; d >= 0; d--) {
        em_tensor *cd = d == axis ? em_cast(idx, EM_I64) : along(iota(em_tensor_dim(idx, d)), d, r);
        cd = em_mul_scalar(cd, (double)stride);
        lin = lin ? em_add(lin, cd) : cd;
        stride *= em_tensor_dim(x, d);
    }
    int64_t P = em_tensor_numel(x), N = em_tensor_numel(u), ds[2] = {P, 1}, us[2] = {N, 1};
    em_tensor *y = scatter_reduce_dense(c, em_reshape(x, ds, 2), em_reshape(em_contiguous(em_expand(lin, em_tensor_shape(idx), r)), &N, 1), em_reshape(u, us, 2), red);
    if (!y) return em_last_status();
    return onnx_out(c, 0, onnx_wrap_int(em_reshape(y, em_tensor_shape(x), r), onnx_in_type(c, 0)), 0);
}

/* Row-major linear index (i64, indices.shape[:-1]) of the index tuples in
 * the last dim of @p idx into the first m dims of shape @p s; negative
 * values count from the end. */
static em_tensor *linear_index(em_tensor *idx, const int64_t *s, int m)
{
    em_tensor *lin = NULL;
    int ri = em_tensor_ndim(idx);
    int64_t stride = 1;
    for (int k = m - 1; k >= 0; k--) {
        em_tensor *ik = em_squeeze(em_narrow(idx, ri - 1, k, 1), ri - 1);
        ik = em_mul_scalar(em_cast(fix_neg(ik, s[k]), EM_I64), (double)stride);
        lin = lin ? em_add(lin, ik) : ik;
        stride *= s[k];
    }
    return lin;
}

/* GatherND (11, 12, 13): batch_dims (12). */
static em_status op_gather_nd(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *idx = onnx_in_req(c, 1);
    if (!x || !idx) return em_last_status();
    int r = em_tensor_ndim(x), ri = em_tensor_ndim(idx);
    int64_t b = onnx_attr_int(c, "batch_dims", 0);
    if (ri < 1) return em_set_error(EM_ERR_SHAPE, "indices must have rank >= 1");
    int64_t m = em_tensor_dim(idx, -1);
    if (b < 0 || b >= ri || b >= r || b + m > r) return em_set_error(EM_ERR_SHAPE, "batch_dims %lld and index depth %lld do not fit data rank %d", (long long)b, (long long)m, r);
    const int64_t *xs = em_tensor_shape(x);
    int64_t B = 1, P = 1, s[EM_MAX_DIMS + 1];
    for (int d = 0; d < b; d++) B *= xs[d];
    for (int d = (int)b; d < b + m; d++) P *= xs[d];
    em_tensor *lin = m > 0 ? linear_index(idx, xs + b, (int)m) : em_zeros(em_tensor_shape(idx), ri - 1, EM_I64);
    if (b > 0) {
        for (int d = 0; d < ri - 1; d++) s[d] = d < b ? xs[d] : 1;
        em_tensor *off = em_reshape(em_mul_scalar(iota(B), (double)P), s, ri - 1);
        lin = em_add(lin, off);
    }
    int k = 0;
    s[k++] = B * P;
    for (int d = (int)(b + m); d < r; d++) s[k++] = xs[d];
    em_tensor *flat = em_reshape(x, s, k);
    int64_t nl = em_tensor_numel(idx) / (m > 0 ? m : 1);
    if (m == 0) nl = em_tensor_numel(lin);
    em_tensor *g = em_index_select(flat, 0, em_reshape(lin, &nl, 1));
    k = 0;
    for (int d = 0; d < ri - 1; d++) s[k++] = em_tensor_dim(idx, d);
    for (int d = (int)(b + m); d < r; d++) s[k++] = xs[d];
    if (k > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", k, EM_MAX_DIMS);
    return onnx_out(c, 0, em_reshape(g, s, k), 0);
}

/* ScatterND (11, 13, 16, 18): reduction none / add (16) / mul (16) / max,
 * min (18); mul / max / min composed densely (scatter_reduce_dense). */
static em_status op_scatter_nd(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *idx = onnx_in_req(c, 1), *u = onnx_in_req(c, 2);
    if (!x || !idx || !u) return em_last_status();
    const char *red = onnx_attr_string(c, "reduction", "none");
    bool add = !strcmp(red, "add");
    if (!add && strcmp(red, "none") && strcmp(red, "mul") && strcmp(red, "max") && strcmp(red, "min")) return em_set_error(EM_ERR_INVALID, "unknown reduction '%s'", red);
    int r = em_tensor_ndim(x), ri = em_tensor_ndim(idx);
    if (ri < 1) return em_set_error(EM_ERR_SHAPE, "indices must have rank >= 1");
    int64_t m = em_tensor_dim(idx, -1);
    if (m < 1 || m > r) return em_set_error(EM_ERR_SHAPE, "index depth %lld does not fit data rank %d", (long long)m, r);
    const int64_t *xs = em_tensor_shape(x);
    int64_t P = 1, R = 1, N = em_tensor_numel(idx) / m;
    for (int d = 0; d < m; d++) P *= xs[d];
    for (int d = (int)m; d < r; d++) R *= xs[d];
    if (em_tensor_numel(u) != N * R) return em_set_error(EM_ERR_SHAPE, "updates have %lld elements, %lld expected", (long long)em_tensor_numel(u), (long long)(N * R));
    int64_t fs[2] = {P, R}, us[2] = {N, R}, is[2] = {N, 1};
    em_tensor *lin = em_reshape(linear_index(idx, xs, (int)m), is, 2);
    em_tensor *index = em_contiguous(em_expand(lin, us, 2));
    em_tensor *flat = em_reshape(x, fs, 2), *uf = em_reshape(u, us, 2);
    em_tensor *y;
    if (add) y = em_scatter_add(flat, 0, index, uf);
    else if (!strcmp(red, "none")) y = em_scatter(flat, 0, index, uf);
    else y = scatter_reduce_dense(c, flat, em_reshape(lin, &N, 1), uf, red);
    if (!y) return em_last_status();
    return onnx_out(c, 0, onnx_wrap_int(em_reshape(y, xs, r), onnx_in_type(c, 0)), 0);
}

/* Split (1, 2, 11, 13, 18): split attribute (2) or input (1, 13), else
 * equal parts (num_outputs from 18; an uneven last part). */
static em_status op_split(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), axis;
    if (onnx_axis(c, onnx_attr_int(c, "axis", 0), r, &axis) != EM_OK) return em_last_status();
    int64_t n = em_tensor_dim(x, axis);
    int nout = c->nout;
    int64_t *sp = calloc((size_t)nout + 1, sizeof *sp);
    if (!sp) return em_set_error(EM_ERR_NOMEM, "Split: out of memory");
    int ns = ints_attr_or_input(c, "split", 1, sp, nout + 1);
    if (ns < 0) {
        free(sp);
        return em_last_status();
    }
    if (ns == 0) {
        int64_t parts = onnx_attr_int(c, "num_outputs", nout);
        if (parts != nout) {
            free(sp);
            return em_set_error(EM_ERR_INVALID, "num_outputs %lld but %d outputs", (long long)parts, nout);
        }
        int64_t chunk = (n + nout - 1) / nout;
        for (int i = 0; i < nout; i++) {
            int64_t left = n - chunk * i;
            sp[i] = left < 0 ? 0 : left < chunk ? left : chunk;
        }
        ns = nout;
    }
    int64_t total = 0;
    for (int i = 0; i < ns; i++) total += sp[i];
    if (ns != nout || total != n) {
        free(sp);
        return em_set_error(EM_ERR_SHAPE, "split sizes (%d, summing to %lld) do not fit %d outputs of a dim of %lld", ns, (long long)total, nout, (long long)n);
    }
    int64_t off = 0;
    em_status st = EM_OK;
    for (int i = 0; i < nout && st == EM_OK; i++) {
        st = onnx_out(c, i, em_contiguous(em_narrow(x, axis, off, sp[i])), 0);
        off += sp[i];
    }
    free(sp);
    return st;
}

/* Pad (1, 2, 11, 13, 18, 19, 21, 23, 24, 25): pads [x1_begin, ..., x1_end,
 * ...] attribute (paddings in 1) before 11, input from 11 (constant_value
 * input, axes input from 18); modes constant / reflect / edge / wrap (19). */
static em_status op_pad(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    int64_t p[2 * EM_MAX_DIMS], ax[EM_MAX_DIMS], beg[EM_MAX_DIMS] = {0}, end[EM_MAX_DIMS] = {0};
    int np, na = -1;
    double value = 0;
    if (c->opset < 11) {
        np = ints_attr_or_input(c, c->opset < 2 ? "paddings" : "pads", 99, p, 2 * EM_MAX_DIMS);
        value = onnx_attr_float(c, "value", 0.0);
    } else {
        np = onnx_in_ints(c, 1, p, 2 * EM_MAX_DIMS);
        if (onnx_in(c, 2) && em_tensor_numel(onnx_in(c, 2)) > 0 && onnx_in_scalar(c, 2, &value) != EM_OK) return em_last_status();
        if (onnx_in(c, 3) && (na = onnx_in_ints(c, 3, ax, EM_MAX_DIMS)) < 0) return em_last_status();
    }
    if (np < 0) return em_last_status();
    int k = na >= 0 ? na : r;
    if (np != 2 * k) return em_set_error(EM_ERR_SHAPE, "%d pads for %d axes", np, k);
    for (int i = 0; i < k; i++) {
        int a = i;
        if (na >= 0 && onnx_axis(c, ax[i], r, &a) != EM_OK) return em_last_status();
        beg[a] = p[i];
        end[a] = p[k + i];
    }
    const char *mode = onnx_attr_string(c, "mode", "constant");
    em_tensor *y = x;
    if (!strcmp(mode, "constant")) {
        int64_t tp[2 * EM_MAX_DIMS];
        for (int d = 0; d < r; d++) tp[2 * (r - 1 - d)] = beg[d], tp[2 * (r - 1 - d) + 1] = end[d];
        if (r == 0) return onnx_out(c, 0, em_reshape(x, NULL, 0), 0);
        return onnx_out(c, 0, em_pad(x, tp, 2 * r, value), 0);
    }
    int kind;
    if (!strcmp(mode, "reflect")) kind = 0;
    else if (!strcmp(mode, "edge")) kind = 1;
    else if (!strcmp(mode, "wrap")) kind = 2;
    else return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", mode);
    for (int d = 0; d < r; d++) {
        /* negative pads crop first */
        if (beg[d] < 0) y = em_narrow(y, d, -beg[d], em_tensor_dim(y, d) + beg[d]), beg[d] = 0;
        if (end[d] < 0) y = em_narrow(y, d, 0, em_tensor_dim(y, d) + end[d]), end[d] = 0;
        if (!y) return em_last_status();
        if (beg[d] == 0 && end[d] == 0) continue;
        /* output position q reads p = q - begin mapped into [0, n): an
         * index vector computed from the sizes only, then a gather */
        int64_t n = em_tensor_dim(y, d), m = n + beg[d] + end[d];
        if (n == 0) return em_set_error(EM_ERR_SHAPE, "mode '%s' cannot pad the empty dim %d", mode, d);
        int64_t *ix = malloc((size_t)m * sizeof *ix);
        if (!ix) return em_set_error(EM_ERR_NOMEM, "Pad: out of memory");
        for (int64_t q = 0; q < m; q++) {
            int64_t pp = q - beg[d];
            if (kind == 1) pp = pp < 0 ? 0 : pp >= n ? n - 1 : pp;
            else if (kind == 2) pp = ((pp % n) + n) % n;
            else if (n == 1) pp = 0;
            else {
                int64_t per = 2 * (n - 1);
                pp = ((pp % per) + per) % per;
                if (pp >= n) pp = per - pp;
            }
            ix[q] = pp;
        }
        em_tensor *it = em_from_host(ix, &m, 1, EM_I64);
        free(ix);
        y = em_index_select(y, d, it);
        if (!y) return em_last_status();
    }
    return onnx_out(c, 0, y == x ? em_reshape(x, em_tensor_shape(x), r) : y, 0);
}

/* The [rows, cols] bool mask of j - i >= k (upper) or j - i <= k. */
static em_tensor *band(int64_t rows, int64_t cols, int64_t k, bool upper)
{
    int64_t rs[2] = {rows, 1}, cs[2] = {1, cols};
    em_tensor *d = em_sub(em_reshape(iota(cols), cs, 2), em_reshape(iota(rows), rs, 2));
    return upper ? em_ge_scalar(d, (double)k) : em_le_scalar(d, (double)k);
}

/* Trilu (14): upper (default 1), k input. */
static em_status op_trilu(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (em_tensor_ndim(x) < 2) return em_set_error(EM_ERR_SHAPE, "input must have rank >= 2");
    int64_t k = 0;
    if (onnx_in(c, 1)) {
        int n = onnx_in_ints(c, 1, &k, 1);
        if (n < 0) return em_last_status();
    }
    bool upper = onnx_attr_int(c, "upper", 1) != 0;
    if (em_tensor_numel(x) == 0) return onnx_out(c, 0, em_contiguous(x), 0);
    em_tensor *m = band(em_tensor_dim(x, -2), em_tensor_dim(x, -1), k, upper);
    return onnx_out(c, 0, em_where(m, x, em_zeros_like(x)), 0);
}

/* EyeLike (9, 22): k, dtype (default the input's). */
static em_status op_eye_like(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (em_tensor_ndim(x) != 2) return em_set_error(EM_ERR_SHAPE, "input must be 2-D");
    int type = (int)onnx_attr_int(c, "dtype", onnx_in_type(c, 0));
    em_dtype dt;
    if (!onnx_type_to_dtype(type, &dt)) return onnx_unsupported(c, "dtype %d", type);
    int64_t k = onnx_attr_int(c, "k", 0);
    em_tensor *m = em_logical_and(band(em_tensor_dim(x, 0), em_tensor_dim(x, 1), k, true), band(em_tensor_dim(x, 0), em_tensor_dim(x, 1), k, false));
    return onnx_out(c, 0, em_cast(m, dt), type);
}

/* Tile (1, 6, 13): repeats input; each axis repeated by an expand of an
 * inserted dim. */
static em_status op_tile(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    int64_t rep[EM_MAX_DIMS];
    int n = onnx_in_ints(c, 1, rep, EM_MAX_DIMS);
    if (n < 0) return em_last_status();
    if (n != r) return em_set_error(EM_ERR_SHAPE, "%d repeats for rank %d", n, r);
    if (r >= EM_MAX_DIMS) return onnx_unsupported(c, "rank %d: Tile needs one more dim than Ember's %d", r, EM_MAX_DIMS);
    em_tensor *y = x;
    for (int d = 0; d < r; d++) {
        if (rep[d] < 0) return em_set_error(EM_ERR_INVALID, "repeats[%d] = %lld is negative", d, (long long)rep[d]);
        if (rep[d] == 1) continue;
        int64_t s[EM_MAX_DIMS];
        memcpy(s, em_tensor_shape(y), (size_t)r * sizeof *s);
        em_tensor *u = em_unsqueeze(y, d);
        int64_t e[EM_MAX_DIMS];
        for (int i = 0, j = 0; i <= r; i++) e[i] = i == d ? rep[d] : s[j++];
        if (s[d] && rep[d] > ((int64_t)1 << 48) / s[d])
            return em_set_error(EM_ERR_SHAPE, "repeats[%d] = %lld times dim %lld is too large", d, (long long)rep[d], (long long)s[d]);
        s[d] *= rep[d];
        y = em_reshape(em_contiguous(em_expand(u, e, r + 1)), s, r);
        if (!y) return em_last_status();
    }
    return onnx_out(c, 0, y == x ? em_contiguous(x) : y, 0);
}

/* OneHot (9, 11): out-of-range indices give all off values; negative ones
 * count from the end (11). */
static em_status op_one_hot(onnx_ctx *c)
{
    em_tensor *idx = onnx_in_req(c, 0), *vals = onnx_in_req(c, 2);
    double depthf;
    if (!idx || !vals || onnx_in_scalar(c, 1, &depthf) != EM_OK) return em_last_status();
    int64_t depth = (int64_t)depthf;
    if (depth < 1) return em_set_error(EM_ERR_INVALID, "depth %lld must be >= 1", (long long)depth);
    if (em_tensor_numel(vals) != 2) return em_set_error(EM_ERR_SHAPE, "values must have 2 elements");
    int r = em_tensor_ndim(idx) + 1, axis;
    if (r > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d is more than Ember's %d", r, EM_MAX_DIMS);
    if (onnx_axis(c, onnx_attr_int(c, "axis", -1), r, &axis) != EM_OK) return em_last_status();
    em_dtype it = em_tensor_dtype(idx);
    em_tensor *i64 = (it == EM_I64 || it == EM_I32) ? em_cast(idx, EM_I64) : em_cast(em_trunc(idx), EM_I64);
    i64 = fix_neg(i64, depth);
    em_tensor *m = em_eq(em_unsqueeze(i64, axis), along(iota(depth), axis, r));
    int64_t two = 2;
    em_tensor *v = em_reshape(vals, &two, 1);
    em_tensor *off = em_reshape(em_narrow(v, 0, 0, 1), NULL, 0), *on = em_reshape(em_narrow(v, 0, 1, 1), NULL, 0);
    return onnx_out(c, 0, em_where(m, on, off), onnx_in_type(c, 2));
}

/* DepthToSpace (1, 11, 13): DCR (default) / CRD (11). */
static em_status op_depth_to_space(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (em_tensor_ndim(x) != 4) return em_set_error(EM_ERR_SHAPE, "input must be 4-D");
    int64_t b = onnx_attr_int(c, "blocksize", 0), N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), H = em_tensor_dim(x, 2), W = em_tensor_dim(x, 3);
    if (b < 1 || C % (b * b)) return em_set_error(EM_ERR_INVALID, "blocksize %lld does not divide %lld channels", (long long)b, (long long)C);
    bool crd = !strcmp(onnx_attr_string(c, "mode", "DCR"), "CRD");
    int64_t s6[6], s4[4] = {N, C / (b * b), H * b, W * b};
    int pd[6] = {0, 3, 4, 1, 5, 2}, pc[6] = {0, 1, 4, 2, 5, 3};
    if (crd) s6[0] = N, s6[1] = C / (b * b), s6[2] = b, s6[3] = b, s6[4] = H, s6[5] = W;
    else s6[0] = N, s6[1] = b, s6[2] = b, s6[3] = C / (b * b), s6[4] = H, s6[5] = W;
    return onnx_out(c, 0, em_reshape(em_permute(em_reshape(x, s6, 6), crd ? pc : pd, 6), s4, 4), 0);
}

/* SpaceToDepth (1, 13, 28): DCR (default) / CRD (28). */
static em_status op_space_to_depth(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    if (em_tensor_ndim(x) != 4) return em_set_error(EM_ERR_SHAPE, "input must be 4-D");
    int64_t b = onnx_attr_int(c, "blocksize", 0), N = em_tensor_dim(x, 0), C = em_tensor_dim(x, 1), H = em_tensor_dim(x, 2), W = em_tensor_dim(x, 3);
    if (b < 1 || H % b || W % b) return em_set_error(EM_ERR_INVALID, "blocksize %lld does not divide %lldx%lld", (long long)b, (long long)H, (long long)W);
    bool crd = !strcmp(onnx_attr_string(c, "mode", "DCR"), "CRD");
    int64_t s6[6] = {N, C, H / b, b, W / b, b}, s4[4] = {N, C * b * b, H / b, W / b};
    int pd[6] = {0, 3, 5, 1, 2, 4}, pc[6] = {0, 1, 3, 5, 2, 4};
    return onnx_out(c, 0, em_reshape(em_permute(em_reshape(x, s6, 6), crd ? pc : pd, 6), s4, 4), 0);
}

/* CumSum (11, 14) / CumProd (26): exclusive, reverse. */
static em_status cumulative(onnx_ctx *c, bool mul)
{
    em_tensor *x = onnx_in_req(c, 0);
    int64_t a;
    if (!x || onnx_in_ints(c, 1, &a, 1) != 1) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_SHAPE, "axis must have one value");
    int axis;
    if (onnx_axis(c, a, em_tensor_ndim(x), &axis) != EM_OK) return em_last_status();
    bool excl = onnx_attr_int(c, "exclusive", 0) != 0, rev = onnx_attr_int(c, "reverse", 0) != 0;
    em_tensor *y = rev ? flip(x, axis) : x;
    if (excl) y = shift(y, axis, 1, mul ? 1.0 : 0.0);
    y = scan(y, axis, mul);
    if (rev) y = flip(y, axis);
    return onnx_out(c, 0, onnx_wrap_int(y, onnx_in_type(c, 0)), 0);
}
static em_status op_cumsum(onnx_ctx *c) { return cumulative(c, false); }
static em_status op_cumprod(onnx_ctx *c) { return cumulative(c, true); }

/* NonZero (9, 13): [rank, count] int64 coordinates in row-major order. */
static em_status op_nonzero(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r == 0) return onnx_unsupported(c, "NonZero of a 0-d tensor");
    int64_t L = em_tensor_numel(x);
    em_tensor *pos = true_positions(em_ne_scalar(em_reshape(x, &L, 1), 0));
    if (!pos) return em_last_status();
    em_tensor *rows[EM_MAX_DIMS];
    int64_t stride = 1;
    for (int d = r - 1; d >= 0; d--) {
        int64_t n = em_tensor_dim(x, d);
        em_tensor *q = em_floor_divide(pos, em_scalar((double)stride, EM_I64));
        rows[d] = em_remainder(q, em_scalar((double)(n ? n : 1), EM_I64));
        stride *= n;
    }
    return onnx_out(c, 0, em_stack(rows, r, 0), ONNX_INT64);
}

/* Compress (9, 11): the slices along axis (or of the flattened input)
 * where condition is true; a short condition selects from the first ones. */
static em_status op_compress(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *cond = onnx_in_req(c, 1);
    if (!x || !cond) return em_last_status();
    if (em_tensor_ndim(cond) != 1) return em_set_error(EM_ERR_SHAPE, "condition must be 1-D");
    int axis = 0;
    if (onnx_has_attr(c, "axis")) {
        if (onnx_axis(c, onnx_attr_int(c, "axis", 0), em_tensor_ndim(x), &axis) != EM_OK) return em_last_status();
    } else {
        int64_t L = em_tensor_numel(x);
        x = em_reshape(x, &L, 1);
    }
    int64_t n = em_tensor_dim(x, axis), lc = em_tensor_numel(cond);
    if (lc > n) return em_set_error(EM_ERR_SHAPE, "condition has %lld values for a dim of %lld", (long long)lc, (long long)n);
    em_tensor *pos = true_positions(em_ne_scalar(cond, 0));
    if (!pos) return em_last_status();
    return onnx_out(c, 0, em_index_select(x, axis, pos), 0);
}

/* ReverseSequence (10): the first seq_lens[b] elements along time_axis
 * reversed for each batch b. */
static em_status op_reverse_sequence(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *lens = onnx_in_req(c, 1);
    if (!x || !lens) return em_last_status();
    int r = em_tensor_ndim(x), ta, ba;
    if (r < 2) return em_set_error(EM_ERR_SHAPE, "input must have rank >= 2");
    if (onnx_axis(c, onnx_attr_int(c, "time_axis", 0), r, &ta) != EM_OK || onnx_axis(c, onnx_attr_int(c, "batch_axis", 1), r, &ba) != EM_OK)
        return em_last_status();
    if (ta == ba) return em_set_error(EM_ERR_INVALID, "time_axis and batch_axis are the same");
    if (em_tensor_numel(lens) != em_tensor_dim(x, ba)) return em_set_error(EM_ERR_SHAPE, "sequence_lens has %lld values for a batch of %lld", (long long)em_tensor_numel(lens), (long long)em_tensor_dim(x, ba));
    em_tensor *t = along(iota(em_tensor_dim(x, ta)), ta, r);
    /* lengths past the time dim reverse all of it (as numpy's slices) */
    em_tensor *l = along(em_minimum_scalar(em_cast(lens, EM_I64), (double)em_tensor_dim(x, ta)), ba, r);
    em_tensor *src = em_where(em_lt(t, l), em_sub(em_sub_scalar(l, 1), t), t);
    src = em_contiguous(em_expand(src, em_tensor_shape(x), r));
    return onnx_out(c, 0, em_gather(x, ta, src), 0);
}

/* TopK (1, 10, 11, 24): k attribute (1) or input (10), largest / sorted
 * (11); ties keep the lower index first. The rank of each element is
 * counted by pairwise comparisons (n^2 memory along the axis). */
static em_status op_topk(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), axis;
    if (r < 1) return em_set_error(EM_ERR_SHAPE, "input must have rank >= 1");
    if (r + 1 > EM_MAX_DIMS) return onnx_unsupported(c, "rank %d: TopK needs one more dim than Ember's %d", r, EM_MAX_DIMS);
    int64_t k;
    if (c->opset < 10) k = onnx_attr_int(c, "k", -1);
    else if (onnx_in_ints(c, 1, &k, 1) != 1) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_SHAPE, "K must have one value");
    if (onnx_axis(c, onnx_attr_int(c, "axis", -1), r, &axis) != EM_OK) return em_last_status();
    int64_t n = em_tensor_dim(x, axis);
    if (k < 0 || k > n) return em_set_error(EM_ERR_INVALID, "k = %lld for a dim of %lld", (long long)k, (long long)n);
    bool largest = onnx_attr_int(c, "largest", 1) != 0;
    if ((double)em_tensor_numel(x) * (double)n > DENSE_SCATTER_MAX)
        return onnx_unsupported(c, "TopK is composed of pairwise comparisons (Ember has no sort), too large here (%lld elements, axis of %lld)", (long long)em_tensor_numel(x), (long long)n);
    em_tensor *xt = em_contiguous(em_transpose(x, axis, r - 1));
    em_tensor *xi = em_unsqueeze(xt, r), *xj = em_unsqueeze(xt, r - 1); /* [..., n, 1], [..., 1, n] */
    int64_t ns[2] = {n, 1}, ms[2] = {1, n};
    em_tensor *jlti = em_lt(em_reshape(iota(n), ms, 2), em_reshape(iota(n), ns, 2)); /* [i][j] = j < i */
    em_tensor *before = em_logical_or(largest ? em_gt(xj, xi) : em_lt(xj, xi), em_logical_and(em_eq(xj, xi), jlti));
    int last = r;
    em_tensor *rank = em_sum(em_cast(before, EM_I64), &last, 1, false); /* [..., n] */
    int64_t ks[2] = {k, 1};
    em_tensor *sel = em_eq(em_unsqueeze(rank, r - 1), em_reshape(iota(k), ks, 2)); /* [..., k, n] */
    em_tensor *ind = k > 0 ? em_argmax(em_cast(sel, EM_I32), r, false) : NULL;
    if (k == 0) {
        int64_t s[EM_MAX_DIMS];
        memcpy(s, em_tensor_shape(xt), (size_t)r * sizeof *s);
        s[r - 1] = 0;
        ind = em_zeros(s, r, EM_I64);
    }
    em_tensor *val = em_gather(xt, r - 1, ind);
    em_status st = onnx_out(c, 0, em_contiguous(em_transpose(val, axis, r - 1)), 0);
    if (st != EM_OK) return st;
    return onnx_out(c, 1, em_contiguous(em_transpose(ind, axis, r - 1)), ONNX_INT64);
}

/* Unique (11, 28): sorted (default) or in first-occurrence order, of the
 * flattened input or of its slices along axis; outputs Y, indices (first
 * occurrences), inverse_indices, counts. Composed from pairwise
 * comparisons of the n slices ([n, n, R] memory). */
static em_status op_unique(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x), axis = -1;
    bool sorted = onnx_attr_int(c, "sorted", 1) != 0;
    em_tensor *rows;
    int64_t n, R;
    if (onnx_has_attr(c, "axis")) {
        if (onnx_axis(c, onnx_attr_int(c, "axis", 0), r, &axis) != EM_OK) return em_last_status();
        n = em_tensor_dim(x, axis);
        R = n ? em_tensor_numel(x) / n : 0;
        int64_t s2[2] = {n, R};
        rows = em_reshape(em_contiguous(em_transpose(x, 0, axis)), s2, 2);
    } else {
        n = em_tensor_numel(x), R = 1;
        int64_t s2[2] = {n, 1};
        rows = em_reshape(x, s2, 2);
    }
    if (n == 0 || R == 0) return onnx_unsupported(c, "Unique of an empty input");
    if ((double)n * (double)n * (double)R > DENSE_SCATTER_MAX) return onnx_unsupported(c, "Unique is composed of pairwise comparisons, too large here");
    int64_t si[3] = {n, 1, R}, sj[3] = {1, n, R}, ns[2] = {n, 1}, ms[2] = {1, n};
    em_tensor *xi = em_reshape(rows, si, 3), *xj = em_reshape(rows, sj, 3);
    int two = 2, one = 1;
    em_tensor *eqr = em_eq(xi, xj);                               /* [i, j, r] */
    em_tensor *same = em_all(eqr, &two, 1, false);                 /* [i, j] */
    em_tensor *jlti = em_lt(em_reshape(iota(n), ms, 2), em_reshape(iota(n), ns, 2)); /* j < i */
    /* row j before row i lexicographically: the first differing column */
    em_tensor *prefix = scan(shift(em_cast(eqr, EM_I32), 2, 1, 1.0), 2, true);
    em_tensor *less = em_any(em_logical_and(em_lt(xj, xi), em_ne_scalar(prefix, 0)), &two, 1, false); /* [i, j] */
    em_tensor *first = em_logical_not(em_any(em_logical_and(same, jlti), &one, 1, false)); /* [i] */
    double ud;
    if (em_item(em_sum_all(em_cast(first, EM_I64)), &ud) != EM_OK) return em_last_status();
    int64_t u = (int64_t)ud, us[2] = {u, 1};
    em_tensor *fj = em_reshape(first, ms, 2);
    em_tensor *rank = em_sum(em_cast(em_logical_and(fj, sorted ? less : jlti), EM_I64), &one, 1, false); /* [i] */
    em_tensor *sel = em_logical_and(em_eq(em_reshape(rank, ms, 2), em_reshape(iota(u), us, 2)), fj); /* [k, i] */
    em_tensor *idx = em_argmax(em_cast(sel, EM_I32), 1, false);   /* [u] */
    em_tensor *y = axis >= 0 ? em_index_select(x, axis, idx) : em_index_select(em_reshape(rows, &n, 1), 0, idx);
    em_tensor *firstocc = em_argmax(em_cast(same, EM_I32), 1, false); /* [i] */
    em_tensor *inv = em_index_select(rank, 0, firstocc);
    em_tensor *counts = em_sum(em_cast(em_index_select(same, 0, idx), EM_I64), &one, 1, false);
    em_status st;
    if ((st = onnx_out(c, 0, y, 0)) != EM_OK || (st = onnx_out(c, 1, idx, ONNX_INT64)) != EM_OK || (st = onnx_out(c, 2, inv, ONNX_INT64)) != EM_OK)
        return st;
    return onnx_out(c, 3, counts, ONNX_INT64);
}

/* TensorScatter (24): update written into a copy of past_cache along axis
 * from write_indices[batch] (0 when omitted), modulo the axis length in
 * circular mode. */
static em_status op_tensor_scatter(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *u = onnx_in_req(c, 1), *wi = onnx_in(c, 2);
    if (!x || !u) return em_last_status();
    int r = em_tensor_ndim(x), axis;
    if (onnx_axis(c, onnx_attr_int(c, "axis", -2), r, &axis) != EM_OK) return em_last_status();
    if (axis == 0) return em_set_error(EM_ERR_INVALID, "axis must not be the batch dim 0");
    if (em_tensor_ndim(u) != r) return em_set_error(EM_ERR_SHAPE, "update must have the cache's rank %d", r);
    int64_t L = em_tensor_dim(x, axis), S = em_tensor_dim(u, axis), B = em_tensor_dim(x, 0);
    for (int d = 0; d < r; d++)
        if (d != axis ? em_tensor_dim(u, d) != em_tensor_dim(x, d) : S > L)
            return em_set_error(EM_ERR_SHAPE, "update dim %d (%lld) does not fit the cache's (%lld)", d, (long long)em_tensor_dim(u, d), (long long)em_tensor_dim(x, d));
    const char *mode = onnx_attr_string(c, "mode", "linear");
    bool circ = !strcmp(mode, "circular");
    if (!circ && strcmp(mode, "linear")) return em_set_error(EM_ERR_INVALID, "unknown mode '%s'", mode);
    if (wi && em_tensor_numel(wi) != B) return em_set_error(EM_ERR_SHAPE, "write_indices has %lld values for a batch of %lld", (long long)em_tensor_numel(wi), (long long)B);
    em_tensor *w = wi ? along(em_cast(wi, EM_I64), 0, r) : em_zeros(NULL, 0, EM_I64);
    em_tensor *idx = em_add(along(iota(S), axis, r), w);
    if (circ) idx = em_remainder(idx, em_scalar((double)L, EM_I64));
    idx = em_contiguous(em_expand(idx, em_tensor_shape(u), r));
    if (S == 0) return onnx_out(c, 0, em_contiguous(x), 0);
    return onnx_out(c, 0, em_scatter(x, axis, idx, u), 0);
}


/* HannWindow / HammingWindow / BlackmanWindow (17): size input, periodic
 * (default 1), output_datatype (default float). */
static em_status window(onnx_ctx *c, double a0, double a1, double a2)
{
    double sz;
    if (onnx_in_scalar(c, 0, &sz) != EM_OK) return em_last_status();
    int64_t n = (int64_t)sz;
    if (n < 0) return em_set_error(EM_ERR_INVALID, "size %lld is negative", (long long)n);
    int type = (int)onnx_attr_int(c, "output_datatype", ONNX_FLOAT);
    em_dtype dt;
    if (!onnx_type_to_dtype(type, &dt)) return onnx_unsupported(c, "output_datatype %d", type);
    double N = onnx_attr_int(c, "periodic", 1) ? (double)n : (double)(n - 1);
    if (n == 0) return onnx_out(c, 0, em_zeros(&n, 1, dt), type);
    em_tensor *t = em_mul_scalar(em_arange(0, (double)n, 1, EM_F64), 2 * M_PI / N);
    em_tensor *w = em_sub(em_full(&n, 1, EM_F64, a0), em_mul_scalar(em_cos(t), a1));
    if (a2 != 0) w = em_add(w, em_mul_scalar(em_cos(em_mul_scalar(t, 2)), a2));
    return onnx_out(c, 0, em_cast(w, dt), type);
}
static em_status op_hann_window(onnx_ctx *c) { return window(c, 0.5, 0.5, 0); }
static em_status op_hamming_window(onnx_ctx *c) { return window(c, 25.0 / 46.0, 1 - 25.0 / 46.0, 0); }
static em_status op_blackman_window(onnx_ctx *c) { return window(c, 0.42, 0.5, 0.08); }

/* [n, K] matrix cos (or sin) of 2 pi (i k mod N) / N, in @p dt. */
static em_tensor *dft_mat(int64_t n, int64_t K, int64_t N, bool sine, em_dtype dt)
{
    int64_t ns[2] = {n, 1}, ks[2] = {1, K};
    em_tensor *ik = em_remainder(em_mul(em_reshape(iota(n), ns, 2), em_reshape(iota(K), ks, 2)), em_scalar((double)N, EM_I64));
    em_tensor *ang = em_mul_scalar(em_cast(ik, EM_F64), 2 * M_PI / (double)N);
    return em_cast(sine ? em_sin(ang) : em_cos(ang), dt);
}

/* Length of the last dim of @p t made @p n: cut or zero padded. */
static em_tensor *fit_last(em_tensor *t, int64_t n)
{
    int r = em_tensor_ndim(t);
    int64_t m = em_tensor_dim(t, -1);
    if (m >= n) return em_narrow(t, r - 1, 0, n);
    int64_t pads[2] = {0, n - m};
    return em_pad(t, pads, 2, 0);
}

/* The DFT of re + i im (im may be NULL) along the last dim (length N):
 * the first K bins; inverse divides by N. */
static void dft_last(em_tensor *re, em_tensor *im, int64_t N, int64_t K, bool inverse, em_tensor **ore, em_tensor **oim)
{
    em_dtype dt = em_tensor_dtype(re);
    em_tensor *C = dft_mat(N, K, N, false, dt), *S = dft_mat(N, K, N, true, dt);
    em_tensor *rc = em_matmul(re, C), *rs = em_matmul(re, S);
    em_tensor *ic = im ? em_matmul(im, C) : NULL, *is = im ? em_matmul(im, S) : NULL;
    if (!inverse) {
        *ore = im ? em_add(rc, is) : rc;
        *oim = im ? em_sub(ic, rs) : em_neg(rs);
    } else {
        *ore = em_div_scalar(im ? em_sub(rc, is) : rc, (double)N);
        *oim = em_div_scalar(im ? em_add(ic, rs) : rs, (double)N);
    }
}

/* DFT (17, 20): axis attribute (default 1) before 20, input (default -2)
 * from 20; dft_length input; inverse; onesided (RFFT forward, IRFFT
 * inverse). Composed as matmuls with cos / sin matrices (O(N^2)). */
static em_status op_dft(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    if (r < 2 || (em_tensor_dim(x, -1) != 1 && em_tensor_dim(x, -1) != 2)) return em_set_error(EM_ERR_SHAPE, "input must end in a dim of 1 (real) or 2 (complex)");
    em_dtype dt = em_tensor_dtype(x);
    if (dt != EM_F32 && dt != EM_F64 && dt != EM_F16 && dt != EM_BF16) return em_set_error(EM_ERR_DTYPE, "input must be floating point");
    int64_t a = c->opset < 20 ? onnx_attr_int(c, "axis", 1) : -2;
    if (c->opset >= 20 && onnx_in(c, 2) && onnx_in_ints(c, 2, &a, 1) != 1) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_SHAPE, "axis must be a scalar");
    if (a < 0) a += r;
    if (a < 0 || a > r - 2) return em_set_error(EM_ERR_INVALID, "axis out of range [-%d, -2] or [0, %d]", r, r - 2);
    bool inverse = onnx_attr_int(c, "inverse", 0) != 0, onesided = onnx_attr_int(c, "onesided", 0) != 0;
    bool cplx = em_tensor_dim(x, -1) == 2;
    if (onesided && !inverse && cplx) return em_set_error(EM_ERR_INVALID, "onesided forward DFT needs real input");
    if (onesided && inverse && !cplx) return em_set_error(EM_ERR_INVALID, "onesided inverse DFT needs complex input");
    int64_t len = em_tensor_dim(x, (int)a), N = onesided && inverse ? 2 * (len - 1) : len;
    if (onnx_in(c, 1) && em_tensor_numel(onnx_in(c, 1)) > 0 && onnx_in_ints(c, 1, &N, 1) != 1) return em_last_status();
    if (N < 1) return em_set_error(EM_ERR_INVALID, "dft_length %lld must be >= 1", (long long)N);
    int last = r - 2;
    em_tensor *re = em_transpose(em_squeeze(em_narrow(x, r - 1, 0, 1), r - 1), (int)a, last);
    em_tensor *im = cplx ? em_transpose(em_squeeze(em_narrow(x, r - 1, 1, 1), r - 1), (int)a, last) : NULL;
    em_tensor *yr, *yi;
    if (onesided && inverse) {
        /* the full spectrum from the first N / 2 + 1 bins (Hermitian) */
        int64_t h = N / 2 + 1;
        re = fit_last(re, h), im = fit_last(im, h);
        int64_t *ix = malloc((size_t)N * sizeof *ix);
        double *sg = malloc((size_t)N * sizeof *sg);
        if (!ix || !sg) {
            free(ix), free(sg);
            return em_set_error(EM_ERR_NOMEM, "DFT: out of memory");
        }
        for (int64_t k = 0; k < N; k++) ix[k] = k < h ? k : N - k, sg[k] = k < h ? 1 : -1;
        em_tensor *it = em_from_host(ix, &N, 1, EM_I64), *st = em_cast(em_from_host(sg, &N, 1, EM_F64), dt);
        free(ix), free(sg);
        re = em_index_select(re, last, it);
        im = em_mul(em_index_select(im, last, it), st);
        dft_last(re, im, N, N, true, &yr, &yi);
        if (!yr) return em_last_status();
        return onnx_out(c, 0, em_contiguous(em_unsqueeze(em_transpose(yr, (int)a, last), r - 1)), 0);
    }
    re = fit_last(re, N);
    if (im) im = fit_last(im, N);
    dft_last(re, im, N, onesided ? N / 2 + 1 : N, inverse, &yr, &yi);
    if (!yr || !yi) return em_last_status();
    em_tensor *pair[2] = {em_transpose(yr, (int)a, last), em_transpose(yi, (int)a, last)};
    return onnx_out(c, 0, em_stack(pair, 2, r - 1), 0);
}

/* STFT (17): frames of frame_length every frame_step samples, times the
 * window (all ones when omitted), DFT of each; onesided (default 1) for
 * real input. */
static em_status op_stft(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0), *win = onnx_in(c, 2);
    if (!x) return em_last_status();
    if (em_tensor_ndim(x) != 3 || (em_tensor_dim(x, 2) != 1 && em_tensor_dim(x, 2) != 2)) return em_set_error(EM_ERR_SHAPE, "signal must be [batch, length, 1 or 2]");
    int64_t step, fl = -1;
    if (onnx_in_ints(c, 1, &step, 1) != 1) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_SHAPE, "frame_step must be a scalar");
    if (onnx_in(c, 3) && onnx_in_ints(c, 3, &fl, 1) != 1) return em_last_status() != EM_OK ? em_last_status() : em_set_error(EM_ERR_SHAPE, "frame_length must be a scalar");
    int64_t B = em_tensor_dim(x, 0), L = em_tensor_dim(x, 1);
    if (fl < 0) fl = win ? em_tensor_numel(win) : L;
    if (win && em_tensor_numel(win) != fl) return em_set_error(EM_ERR_SHAPE, "window has %lld values for frame_length %lld", (long long)em_tensor_numel(win), (long long)fl);
    if (step < 1 || fl < 1 || fl > L) return em_set_error(EM_ERR_INVALID, "frame_step %lld / frame_length %lld do not fit a signal of %lld", (long long)step, (long long)fl, (long long)L);
    bool cplx = em_tensor_dim(x, 2) == 2, onesided = onnx_attr_int(c, "onesided", 1) != 0;
    if (cplx && onesided) return em_set_error(EM_ERR_INVALID, "onesided STFT needs real input");
    int64_t F = 1 + (L - fl) / step, FL = F * fl;
    int64_t *ix = malloc((size_t)FL * sizeof *ix);
    if (!ix) return em_set_error(EM_ERR_NOMEM, "STFT: out of memory");
    for (int64_t f = 0; f < F; f++)
        for (int64_t j = 0; j < fl; j++) ix[f * fl + j] = f * step + j;
    em_tensor *it = em_from_host(ix, &FL, 1, EM_I64);
    free(ix);
    int64_t s3[3] = {B, F, fl};
    em_tensor *fr = em_index_select(x, 1, it); /* [B, F*fl, 1|2] */
    em_tensor *re = em_reshape(em_contiguous(em_squeeze(em_narrow(fr, 2, 0, 1), 2)), s3, 3);
    em_tensor *im = cplx ? em_reshape(em_contiguous(em_squeeze(em_narrow(fr, 2, 1, 1), 2)), s3, 3) : NULL;
    if (win) {
        em_tensor *w = em_cast(win, em_tensor_dtype(x));
        re = em_mul(re, w);
        if (im) im = em_mul(im, w);
    }
    em_tensor *yr, *yi;
    dft_last(re, im, fl, onesided ? fl / 2 + 1 : fl, false, &yr, &yi);
    if (!yr || !yi) return em_last_status();
    em_tensor *pair[2] = {yr, yi};
    return onnx_out(c, 0, em_stack(pair, 2, 3), 0);
}

/* MelWeightMatrix (17): [dft_length / 2 + 1, num_mel_bins] triangular
 * filters between mel-spaced bins; the num_mel_bins + 2 bin edges come from
 * the scalar inputs on the host, the matrix from comparisons. */
static em_status op_mel_weight_matrix(onnx_ctx *c)
{
    double nm, dl, sr, lo, hi;
    if (onnx_in_scalar(c, 0, &nm) || onnx_in_scalar(c, 1, &dl) || onnx_in_scalar(c, 2, &sr) || onnx_in_scalar(c, 3, &lo) || onnx_in_scalar(c, 4, &hi))
        return em_last_status();
    int64_t M = (int64_t)nm, D = (int64_t)dl, S = D / 2 + 1;
    if (M < 1 || D < 1 || sr <= 0) return em_set_error(EM_ERR_INVALID, "num_mel_bins, dft_length and sample_rate must be positive");
    int type = (int)onnx_attr_int(c, "output_datatype", ONNX_FLOAT);
    em_dtype dt;
    if (!onnx_type_to_dtype(type, &dt)) return onnx_unsupported(c, "output_datatype %d", type);
    double lm = 2595 * log1p(lo / 700) / log(10), hm = 2595 * log1p(hi / 700) / log(10), step = (hm - lm) / (double)(M + 2);
    int64_t M2 = M + 2, *fb = malloc((size_t)M2 * sizeof *fb);
    if (!fb) return em_set_error(EM_ERR_NOMEM, "MelWeightMatrix: out of memory");
    for (int64_t i = 0; i < M2; i++) {
        double f = 700 * expm1(((double)i * step + lm) / 2595 * log(10));
        fb[i] = (int64_t)floor((double)(D + 1) * f / sr);
        if (fb[i] < 0 || fb[i] >= S) {
            free(fb);
            return em_set_error(EM_ERR_INVALID, "mel bin edge %lld falls outside the %lld spectrogram bins", (long long)fb[i], (long long)S);
        }
    }
    em_tensor *f = em_from_host(fb, &M2, 1, EM_I64);
    free(fb);
    int64_t rs[2] = {1, M}, js[2] = {S, 1};
    em_tensor *l = em_reshape(em_narrow(f, 0, 0, M), rs, 2), *ce = em_reshape(em_narrow(f, 0, 1, M), rs, 2), *h = em_reshape(em_narrow(f, 0, 2, M), rs, 2);
    em_tensor *j = em_reshape(iota(S), js, 2);
    em_tensor *up = em_where(em_eq(ce, l), em_scalar(1, EM_F64), em_div(em_cast(em_sub(j, l), EM_F64), em_cast(em_maximum_scalar(em_sub(ce, l), 1), EM_F64)));
    em_tensor *down = em_div(em_cast(em_sub(h, j), EM_F64), em_cast(em_maximum_scalar(em_sub(h, ce), 1), EM_F64));
    em_tensor *in_up = em_logical_and(em_ge(j, l), em_le(j, ce)), *in_down = em_logical_and(em_ge(j, ce), em_lt(j, h));
    em_tensor *w = em_where(in_down, down, em_where(in_up, up, em_scalar(0, EM_F64)));
    return onnx_out(c, 0, em_cast(w, dt), type);
}

/* CenterCropPad (18): each axis cropped or zero padded around its centre
 * (the odd element at the end). */
static em_status op_center_crop_pad(onnx_ctx *c)
{
    em_tensor *x = onnx_in_req(c, 0);
    if (!x) return em_last_status();
    int r = em_tensor_ndim(x);
    int64_t s[EM_MAX_DIMS];
    int n = onnx_in_ints(c, 1, s, EM_MAX_DIMS);
    if (n < 0) return em_last_status();
    const int64_t *ax;
    int na = onnx_attr_ints(c, "axes", &ax);
    if ((na >= 0 ? na : r) != n) return em_set_error(EM_ERR_SHAPE, "%d shape values for %d axes", n, na >= 0 ? na : r);
    em_tensor *y = x;
    for (int i = 0; i < n && y; i++) {
        int a = i;
        if (na >= 0 && onnx_axis(c, ax[i], r, &a) != EM_OK) return em_last_status();
        int64_t d = em_tensor_dim(y, a);
        if (s[i] < 0) return em_set_error(EM_ERR_INVALID, "shape[%d] = %lld is negative", i, (long long)s[i]);
        if (s[i] < d) y = em_narrow(y, a, (d - s[i]) / 2, s[i]);
        else if (s[i] > d) {
            int64_t pads[2 * EM_MAX_DIMS] = {0};
            pads[2 * (r - 1 - a)] = (s[i] - d) / 2;
            pads[2 * (r - 1 - a) + 1] = s[i] - d - (s[i] - d) / 2;
            y = em_pad(y, pads, 2 * r, 0);
        }
    }
    return onnx_out(c, 0, em_contiguous(y), 0);
}

const onnx_op onnx_ops_shape[] = {
    {"Shape", 1, op_shape},
    {"Size", 1, op_size},
    {"Concat", 1, op_concat},
    {"Transpose", 1, op_transpose},
    {"Unsqueeze", 1, op_unsqueeze},
    {"Squeeze", 1, op_squeeze},
    {"Expand", 8, op_expand},
    {"ConstantOfShape", 9, op_constant_of_shape},
    {"Slice", 1, op_slice},
    {"Range", 11, op_range},
    {"Gather", 1, op_gather},
    {"GatherElements", 11, op_gather_elements},
    {"GatherND", 11, op_gather_nd},
    {"Scatter", 9, op_scatter_elements},
    {"ScatterElements", 11, op_scatter_elements},
    {"ScatterND", 11, op_scatter_nd},
    {"Split", 1, op_split},
    {"Pad", 1, op_pad},
    {"Trilu", 14, op_trilu},
    {"EyeLike", 9, op_eye_like},
    {"Tile", 1, op_tile},
    {"OneHot", 9, op_one_hot},
    {"DepthToSpace", 1, op_depth_to_space},
    {"SpaceToDepth", 1, op_space_to_depth},
    {"CumSum", 11, op_cumsum},
    {"CumProd", 26, op_cumprod},
    {"NonZero", 9, op_nonzero},
    {"Compress", 9, op_compress},
    {"ReverseSequence", 10, op_reverse_sequence},
    {"TopK", 1, op_topk},
    {"CenterCropPad", 18, op_center_crop_pad},
    {"Unique", 11, op_unique},
    {"TensorScatter", 24, op_tensor_scatter},
    {"DFT", 17, op_dft},
    {"STFT", 17, op_stft},
    {"MelWeightMatrix", 17, op_mel_weight_matrix},
    {"HannWindow", 17, op_hann_window},
    {"HammingWindow", 17, op_hamming_window},
    {"BlackmanWindow", 17, op_blackman_window},
    {NULL, 0, NULL},
};
