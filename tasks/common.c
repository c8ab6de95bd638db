/* Shared front-end helpers: broadcasting, dtype promotion, internal casts. */
#include "tasks/tasks_internal.h"

#include <string.h>

em_status em__broadcast_shapes(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out, int *nout, const char *op)
{
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t da = i < n - na ? 1 : a[i - (n - na)];
        int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
        if (da != db && da != 1 && db != 1) {
            char sa[160], sb[160];
            return em__set_error(EM_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)", op,
                                 em_shape_str(a, na, sa, sizeof sa), em_shape_str(b, nb, sb, sizeof sb), i,
                                 (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return EM_OK;
}

em_tensor *em__broadcast_view(const em_tensor *t, const int64_t *shape, int ndim)
{
    int64_t st[EM_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        if (i < lead) {
            st[i] = 0;
        } else {
            int64_t d = t->shape[i - lead];
            st[i] = (d == 1 && shape[i] != 1) ? 0 : t->strides[i - lead];
        }
    }
    return em__tensor_view(t, shape, st, ndim, t->offset);
}

static int rank_of(em_dtype d)
{
    switch (d) {
    case EM_BOOL: return 0;
    case EM_U8: return 1;
    case EM_I32: return 2;
    case EM_I64: return 3;
    case EM_F16:
    case EM_BF16: return 4;
    case EM_F32: return 5;
    case EM_F64: return 6;
    default: return -1;
    }
}

/* As PyTorch's result_type for two tensors: the higher category wins, and
 * float16 with bfloat16 gives float32 (neither holds the other). */
em_dtype em__promote(em_dtype a, em_dtype b)
{
    if (a != b && rank_of(a) == 4 && rank_of(b) == 4) return EM_F32;
    return rank_of(a) >= rank_of(b) ? a : b;
}

/* A contiguous copy of @p t as @p dt that autodiff does not see. Unscoped. */
static em_tensor *unrecorded_copy(const em_tensor *t, em_dtype dt)
{
    em_tensor *out = em__tensor_new(dt, t->shape, t->ndim);
    if (!out) return NULL;
    em_op op = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {(em_tensor *)t}, .out = {out}, .flags = EM_OPF_NO_RECORD};
    if (em__submit(&op) != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return out;
}

em_tensor *em__as_dtype(const em_tensor *t, em_dtype dt)
{
    if (t->dtype == dt) return em_tensor_retain((em_tensor *)t);
    return unrecorded_copy(t, dt);
}

/* A contiguous operand for a kernel that needs one (conv, pool, matmul's
 * BLAS path): t itself (retained) when it
 * is contiguous (an offset is fine), else a copy autodiff does not see (the
 * op records the user's tensor as orig_in). Unscoped. */
em_tensor *em__contiguous_operand(const em_tensor *t)
{
    if (em_tensor_is_contiguous(t)) return em_tensor_retain((em_tensor *)t);
    return unrecorded_copy(t, t->dtype);
}
