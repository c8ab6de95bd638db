/* em_pad_mode: torch.nn.functional.pad with mode reflect / replicate /
 * circular (constant delegates to em_pad).
 *
 * Each padded dim is one em_index_select gather with a computed i64 index
 * of the padded length: output position q (0 <= q < l + n + r) reads input
 * element src(q - l), p = q - l in [-l, n + r):
 *   reflect    p < 0: -p;  p >= n: 2(n - 1) - p       (needs l, r < n)
 *   replicate  clamp(p, 0, n - 1)                      (needs n > 0)
 *   circular   p mod n (non-negative)                  (needs l, r <= n)
 * These are the index maps of ATen's ReflectionPad / ReplicationPad kernels
 * and of torch.nn.functional._pad_circular (which wraps at most once, hence
 * its limit pad <= size). The gathers are differentiable (the gradient of
 * index_select is an index_add), so the padding has gradients on every
 * device without a kernel of its own. Dims are padded from the last one,
 * as the pads are given. */
#include "tasks/tasks_internal.h"

#include <stdlib.h>
#include <string.h>

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)

static const char *mode_name(em_pad_mode_kind m)
{
    switch (m) {
    case EM_PAD_CONSTANT: return "constant";
    case EM_PAD_REFLECT: return "reflect";
    case EM_PAD_REPLICATE: return "replicate";
    case EM_PAD_CIRCULAR: return "circular";
    }
    return "?";
}

static const char *pads_str(const int64_t *pads, int npads, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "(");
    for (int i = 0; i < npads && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)pads[i]);
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

/* The source index of padded position p (p = q - left) for a dim of size n. */
static int64_t src_index(em_pad_mode_kind mode, int64_t p, int64_t n)
{
    switch (mode) {
    case EM_PAD_REFLECT:
        if (p < 0) return -p;
        if (p >= n) return 2 * (n - 1) - p;
        return p;
    case EM_PAD_REPLICATE: return p < 0 ? 0 : (p >= n ? n - 1 : p);
    default: { /* circular */
        int64_t r = p % n;
        return r < 0 ? r + n : r;
    }
    }
}

em_tensor *em_pad_mode(const em_tensor *a, const int64_t *pads, int npads, em_pad_mode_kind mode, double value)
{
    if (!a) return em__fail_null("em_pad_mode: input is NULL");
    if ((int)mode < EM_PAD_CONSTANT || mode > EM_PAD_CIRCULAR)
        return em__fail(EM_ERR_INVALID, "em_pad_mode: unknown padding mode %d", (int)mode);
    if (mode == EM_PAD_CONSTANT) return em_pad(a, pads, npads, value);
    char sa[200], sp[200];
    if (npads > 0 && !pads) return em__fail(EM_ERR_INVALID, "em_pad_mode: pads is NULL (npads = %d)", npads);
    if (npads < 2 || npads > 6 || npads % 2 != 0 || npads / 2 > a->ndim)
        return em__fail(EM_ERR_INVALID,
                        "em_pad_mode: %s padding takes 2, 4 or 6 pads (1 to 3 trailing dims) and at most 2 * ndim = %d; got %d pads for "
                        "an input of shape %s",
                        mode_name(mode), 2 * a->ndim, npads, SHAPE_STR(a, sa));
    pads_str(pads, npads, sp, sizeof sp);
    for (int k = 0; k < npads / 2; k++) {
        int d = a->ndim - 1 - k;
        int64_t l = pads[2 * k], r = pads[2 * k + 1], n = a->shape[d];
        if (l < 0 || r < 0)
            return em__fail(EM_ERR_INVALID, "em_pad_mode: %s padding takes non-negative pads, got %s for an input of shape %s",
                            mode_name(mode), sp, SHAPE_STR(a, sa));
        if (mode == EM_PAD_REFLECT && (l >= n || r >= n) && (l > 0 || r > 0))
            return em__fail(EM_ERR_SHAPE,
                            "em_pad_mode: reflect padding must be smaller than the padded dim: pads %lld, %lld on dim %d of size %lld "
                            "(shape %s, pads %s)",
                            (long long)l, (long long)r, d, (long long)n, SHAPE_STR(a, sa), sp);
        if (mode == EM_PAD_REPLICATE && n == 0 && (l > 0 || r > 0))
            return em__fail(EM_ERR_SHAPE, "em_pad_mode: replicate padding of the empty dim %d (shape %s, pads %s)", d, SHAPE_STR(a, sa),
                            sp);
        if (mode == EM_PAD_CIRCULAR && (l > n || r > n))
            return em__fail(EM_ERR_SHAPE,
                            "em_pad_mode: circular padding wraps around more than once: pads %lld, %lld on dim %d of size %lld "
                            "(shape %s, pads %s)",
                            (long long)l, (long long)r, d, (long long)n, SHAPE_STR(a, sa), sp);
    }
    em_scope_begin();
    em_tensor *cur = (em_tensor *)a;
    bool padded = false;
    for (int k = 0; k < npads / 2 && cur; k++) {
        int d = a->ndim - 1 - k;
        int64_t l = pads[2 * k], r = pads[2 * k + 1], n = a->shape[d];
        if (l == 0 && r == 0) continue;
        int64_t len = l + n + r;
        int64_t *idx = malloc(sizeof *idx * (size_t)len);
        if (!idx) {
            em_scope_end();
            return em__fail(EM_ERR_NOMEM, "em_pad_mode: out of memory");
        }
        for (int64_t q = 0; q < len; q++) idx[q] = src_index(mode, q - l, n);
        em_tensor *it = em_from_host(idx, &len, 1, EM_I64);
        free(idx);
        cur = it ? em_index_select(cur, d, it) : NULL;
        padded = true;
    }
    /* no padding at all: a new header, as em_pad gives */
    if (cur && !padded) cur = em_reshape(a, a->shape, a->ndim);
    if (cur) em_keep(cur);
    em_scope_end();
    return cur;
}
