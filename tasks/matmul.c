/* Matrix product: em_matmul (torch.matmul semantics) and the tiling submitter
 * that spreads one large product over every CPU worker.
 *
 * Front end (em_matmul):
 *   a [..., M, K] (or [K]), b [..., K, N] (or [K]) -> [..., M, N]
 *   - 1-D a is promoted to [1, K], 1-D b to [K, 1]; the added dim is removed
 *     from the result by a view (VIEW_RESHAPE, recorded for autodiff);
 *     1-D x 1-D is the dot product, a 0-d tensor.
 *   - batch dims ([...]) broadcast as in torch.broadcast_tensors: both inputs
 *     become [batch..., M, K] / [batch..., K, N] views with stride 0 on the
 *     stretched dims (no copy).
 *   - dtypes are promoted to a common dtype (em__promote); bool is refused.
 *   - f32/f64 matrices whose last two dims have one unit stride go to BLAS as
 *     they are (NoTrans or Trans, lda = the other stride): transposed views
 *     are never copied. Other layouts get one contiguous copy first.
 *   The op {EM_OP_MATMUL, in {a_view, b_view}, out} goes through em__submit,
 *   with orig_in = the user's a and b for autodiff.
 *
 * Submission (em__matmul_submit, hooked into the op table by tasks/funnel.c):
 *   one task, unless the placement is CPU-only, there is more than one CPU
 *   worker and the product is large (2*M*N*K*batch flops above
 *   EMBER_MATMUL_TILE_MIN_FLOPS, default 2e7). Then the output is cut into T
 *   tiles (EMBER_MATMUL_TILES, default one per CPU worker) along the first
 *   batch dim when it has at least T entries, else along the M rows, and one
 *   task per tile runs concurrently. See the comment above
 *   em__matmul_submit for why tiles are not StarPU partition children. */
#include "tasks/tasks_internal.h"

#include <starpu.h>
#include <stdlib.h>
#include <string.h>

#define SHAPE_STR(t, buf) em_shape_str((t)->shape, (t)->ndim, buf, sizeof buf)
#define MAX_TILES EM_MAX_TILES

/* ---- front end -------------------------------------------------------------- */

/* Same rule as the CPU kernel (devices/cpu/matmul.c): can row-major BLAS take
 * the strided [rows, cols] matrix as NoTrans or Trans without a copy? */
static bool blas_ok(int64_t rows, int64_t cols, int64_t sr, int64_t sc)
{
    int64_t c1 = cols > 1 ? cols : 1, r1 = rows > 1 ? rows : 1;
    return ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c1)) || ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r1));
}

/* The matrix part of t (its last two dims; a 1-D tensor is a [1, K] or
 * [K, 1] matrix, always fine) is BLAS-compatible. */
static bool matrix_blas_ok(const em_tensor *t)
{
    if (t->ndim == 1) return true;
    int n = t->ndim;
    return blas_ok(t->shape[n - 2], t->shape[n - 1], t->strides[n - 2], t->strides[n - 1]);
}

/* View of t (rank na, 1-D promoted as described above) as [batch..., R, C]
 * of rank nd, broadcasting its batch dims to batch[0..nd-2). Unscoped. */
static em_tensor *operand_view(const em_tensor *t, bool is_lhs, const int64_t *batch, int nd)
{
    int64_t shape[EM_MAX_DIMS], st[EM_MAX_DIMS];
    int nbt = nd - 2;
    int n = t->ndim;
    if (n == 1) {
        if (is_lhs) { /* [1, K] */
            shape[nbt] = 1, st[nbt] = 0;
            shape[nbt + 1] = t->shape[0], st[nbt + 1] = t->strides[0];
        } else { /* [K, 1] */
            shape[nbt] = t->shape[0], st[nbt] = t->strides[0];
            shape[nbt + 1] = 1, st[nbt + 1] = 0;
        }
    } else {
        shape[nbt] = t->shape[n - 2], st[nbt] = t->strides[n - 2];
        shape[nbt + 1] = t->shape[n - 1], st[nbt + 1] = t->strides[n - 1];
    }
    int tb = n > 2 ? n - 2 : 0; /* t's own batch dims, right-aligned */
    for (int i = 0; i < nbt; i++) {
        int j = i - (nbt - tb);
        shape[i] = batch[i];
        st[i] = (j < 0 || t->shape[j] != batch[i]) ? 0 : t->strides[j];
    }
    return em__tensor_view(t, shape, st, nd, t->offset);
}

em_tensor *em_matmul(const em_tensor *a, const em_tensor *b)
{
    if (!a || !b) return em__fail_null("em_matmul: input %s is NULL", !a ? "a" : "b");
    char sa[160], sb[160];
    if (a->ndim == 0 || b->ndim == 0)
        return em__fail(EM_ERR_SHAPE, "em_matmul: both arguments need at least 1 dimension, got shapes %s and %s",
                        SHAPE_STR(a, sa), SHAPE_STR(b, sb));
    const em_tensor *ab[2] = {a, b};
    em_tensor *acast[2]; /* autocast: matmul in the low dtype */
    EM_AUTOCAST_RERUN(EM_OP_MATMUL, ab, 2, acast, em_matmul(acast[0], acast[1]));
    em_dtype cdt = em__promote(a->dtype, b->dtype);
    if (cdt == EM_BOOL || (unsigned)cdt >= EM_DTYPE_COUNT)
        return em__fail(EM_ERR_DTYPE, "em_matmul: dtype %s is not supported (inputs %s and %s)", em_dtype_name(cdt),
                        em_dtype_name(a->dtype), em_dtype_name(b->dtype));
    const int na = a->ndim, nb = b->ndim;
    const int64_t M = na == 1 ? 1 : a->shape[na - 2];
    const int64_t K = a->shape[na - 1];
    const int kbdim = nb == 1 ? 0 : nb - 2;
    const int64_t N = nb == 1 ? 1 : b->shape[nb - 1];
    if (b->shape[kbdim] != K)
        return em__fail(EM_ERR_SHAPE, "em_matmul: shapes %s and %s are not aligned: %lld (dim %d) != %lld (dim %d)",
                        SHAPE_STR(a, sa), SHAPE_STR(b, sb), (long long)K, na - 1, (long long)b->shape[kbdim], kbdim);

    /* Broadcast batch dims. */
    const int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0;
    const int nbt = ba > bb ? ba : bb;
    const int nd = nbt + 2;
    if (nd > EM_MAX_DIMS || nd > EM_KARGS_MAX_DIMS)
        return em__fail(EM_ERR_SHAPE, "em_matmul: shapes %s and %s give a result of rank %d (max %d)", SHAPE_STR(a, sa),
                        SHAPE_STR(b, sb), nd, EM_KARGS_MAX_DIMS);
    int64_t batch[EM_MAX_DIMS];
    for (int i = 0; i < nbt; i++) {
        int ia = i - (nbt - ba), ib = i - (nbt - bb);
        int64_t da = ia < 0 ? 1 : a->shape[ia], db = ib < 0 ? 1 : b->shape[ib];
        if (da != db && da != 1 && db != 1)
            return em__fail(EM_ERR_SHAPE,
                            "em_matmul: batch dims of shapes %s and %s cannot be broadcast: %lld (dim %d) vs %lld (dim %d)",
                            SHAPE_STR(a, sa), SHAPE_STR(b, sb), (long long)da, ia, (long long)db, ib);
        batch[i] = da == 1 ? db : da;
    }

    em_tensor *ac = NULL, *bc = NULL, *av = NULL, *bv = NULL, *out = NULL, *res = NULL;
    ac = em__as_dtype(a, cdt);
    bc = ac ? em__as_dtype(b, cdt) : NULL;
    if (!bc) goto done;
    if (em_dtype_is_float(cdt)) { /* BLAS path: copy only layouts BLAS cannot take */
        if (!matrix_blas_ok(ac)) {
            em_tensor *c = em__contiguous_operand(ac);
            em_tensor_release(ac);
            if (!(ac = c)) goto done;
        }
        if (!matrix_blas_ok(bc)) {
            em_tensor *c = em__contiguous_operand(bc);
            em_tensor_release(bc);
            if (!(bc = c)) goto done;
        }
    }
    av = operand_view(ac, true, batch, nd);
    bv = av ? operand_view(bc, false, batch, nd) : NULL;
    if (!bv) goto done;

    int64_t oshape[EM_MAX_DIMS];
    memcpy(oshape, batch, sizeof(int64_t) * (size_t)nbt);
    oshape[nbt] = M;
    oshape[nbt + 1] = N;
    out = em__tensor_new(cdt, oshape, nd);
    if (!out) goto done;
    em_op op = {.kind = EM_OP_MATMUL, .n_in = 2, .n_out = 1, .in = {av, bv}, .out = {out}, .orig_in = {a, b}};
    if (em__submit(&op) != EM_OK) goto done;

    if (na > 1 && nb > 1) {
        res = out;
        out = NULL;
    } else {
        /* Drop the promoted dim(s): a view, recorded so gradients flow back. */
        int64_t rshape[EM_MAX_DIMS], rst[EM_MAX_DIMS];
        int rn = 0;
        for (int i = 0; i < nbt; i++) rshape[rn] = batch[i], rst[rn] = out->strides[i], rn++;
        if (na > 1) rshape[rn] = M, rst[rn] = out->strides[nbt], rn++;
        if (nb > 1) rshape[rn] = N, rst[rn] = out->strides[nbt + 1], rn++;
        em_tensor *v = em__tensor_view(out, rshape, rst, rn, out->offset);
        if (!v) goto done;
        em_op vop = {.kind = EM_OP_VIEW_RESHAPE, .n_in = 1, .n_out = 1, .in = {out}, .out = {v}};
        if (em__submit(&vop) != EM_OK) {
            em_tensor_release(v);
            goto done;
        }
        res = v;
    }
done:
    em_tensor_release(out);
    em_tensor_release(av);
    em_tensor_release(bv);
    em_tensor_release(ac);
    em_tensor_release(bc);
    return res ? em__publish(res) : NULL;
}

/* ---- tiling submitter -------------------------------------------------------- */

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double d = strtod(v, &end);
    return end != v ? d : dflt;
}

void em__tdesc_narrow(em_tdesc *d, int dim, int64_t start, int64_t len)
{
    d->offset += start * d->strides[dim];
    d->shape[dim] = len;
}

/* Number of CPU tiles for an op of @p flops (tasks_internal.h). */
int em__cpu_tiles(const em_op *op, double flops, const char *min_env, double min_dflt, const char *tiles_env)
{
    em_placement pl = em__placement();
    if (pl.worker >= 0) return 1;
    /* CPU-only: the CPU device, or "auto" on a machine without accelerators. */
    if (pl.where != STARPU_CPU &&
        em_worker_count(EM_DEVICE_CUDA) + em_worker_count(EM_DEVICE_OPENCL) + em_worker_count(EM_DEVICE_HIP) > 0)
        return 1;
    int nw = em__ncpu_workers();
    if (nw < 2) return 1;
    if (!em__covers_storage(op->out[0]) && !em__dense_storage(op->out[0])) return 1;
    if (flops <= env_double(min_env, min_dflt)) return 1;
    double t = env_double(tiles_env, (double)nw);
    return t < 1 ? 1 : t > EM_MAX_TILES ? EM_MAX_TILES : (int)t;
}

/* Number of tiles wanted for this product (em__cpu_tiles). */
static int tile_count(const em_op *op)
{
    const em_tensor *c = op->out[0];
    int nd = c->ndim;
    double flops = 2.0 * (double)op->in[0]->shape[nd - 1];
    for (int i = 0; i < nd; i++) flops *= (double)c->shape[i];
    return em__cpu_tiles(op, flops, "EMBER_MATMUL_TILE_MIN_FLOPS", 2e7, "EMBER_MATMUL_TILES");
}

/* Why tiles are not StarPU partition children of the output handle:
 * Ember's storages are byte vectors registered with home node -1 (StarPU
 * allocates them lazily, "automatically allocated" buffers). For such a
 * handle, starpu_data_partition_plan (1.4.10, src/datawizard/filters.c
 * _starpu_data_partition, inherit_state = 0) does not mark the children as
 * allocated, so the first task on a child allocates a separate buffer and
 * what the tiles write never reaches the parent (checked: the parent reads
 * back zeros/garbage after unpartition_submit; the same program with a
 * handle registered on STARPU_MAIN_RAM works). Synchronous starpu_data_partition
 * inherits the allocation but waits for pending tasks. So:
 *   - tile 0 writes its rows straight into the output (the task's output
 *     descriptor covers only those rows);
 *   - tile t >= 1 writes a temporary [.., rows_t, N] tensor (pooled storage),
 *     and a COPY task then places it in the output (RW: ordered after tile 0,
 *     runs as soon as tile t is done). The extra traffic is (T-1)/T of the
 *     output, against 2*K flops per output element. */
/* Sub-tasks go back through the door with EM_OPF_RAW (one task each, not
 * recorded: em__submit records the whole product once this returns), with
 * the product's priority and fence. */
em_status em__submit_tile(const em_op *op, em_tensor *out, const em_kargs *k)
{
    em_op sub = *op;
    sub.flags |= EM_OPF_RAW;
    sub.out[0] = out;
    sub.kargs = k;
    return em__submit(&sub);
}

em_status em__place_tiles(const em_op *op, em_tensor *const *tmp, const int64_t *starts, int T, int dim)
{
    const em_tensor *out = op->out[0];
    em_status st = EM_OK;
    for (int t = 1; t < T && st == EM_OK; t++) {
        if (!tmp[t]) continue;
        em_tensor *view = em__tensor_view(out, tmp[t]->shape, out->strides, out->ndim, out->offset + starts[t] * out->strides[dim]);
        if (!view) return em_last_status();
        em_op cop = {.kind = EM_OP_COPY, .n_in = 1, .n_out = 1, .in = {tmp[t]}, .out = {view},
                     .flags = EM_OPF_RAW, .priority = op->priority, .after = op->after};
        st = em__submit(&cop);
        em_tensor_release(view);
    }
    return st;
}

em_status em__matmul_submit(em_op *op)
{
    const em_tensor *out = op->out[0];
    const int nd = out->ndim;
    int T = tile_count(op);
    if (T <= 1) return em__submit_tile(op, op->out[0], NULL);
    /* Split along the first batch dim when it has >= T entries, else along M. */
    int dim = (nd > 2 && out->shape[0] >= T) ? 0 : nd - 2;
    if (T > out->shape[dim]) T = (int)out->shape[dim];
    if (T <= 1) return em__submit_tile(op, op->out[0], NULL);
    em_kargs k;
    em__kargs_from_op(op, &k);

    const int64_t len = out->shape[dim];
    /* All temporaries stay alive until every task is submitted: a released
     * temporary's handle would go back to the pool and be handed to the next
     * tile, which would then wait for the previous copy (pool reuse is safe
     * but serializes). Tiles first, then the copies. */
    em_tensor *tmp[MAX_TILES] = {0};
    int64_t s0s[MAX_TILES + 1];
    for (int t = 0; t <= T; t++) s0s[t] = len * t / T;
    em_status st = EM_OK;
    for (int t = 0; t < T && st == EM_OK; t++) {
        int64_t s0 = s0s[t], rows = s0s[t + 1] - s0s[t];
        if (rows == 0) continue;
        em_kargs tk = k;
        em__tdesc_narrow(&tk.in[0], dim, s0, rows);
        if (dim != nd - 2) em__tdesc_narrow(&tk.in[1], dim, s0, rows);
        if (t == 0) { /* straight into the output */
            em__tdesc_narrow(&tk.out[0], dim, s0, rows);
            st = em__submit_tile(op, op->out[0], &tk);
            continue;
        }
        int64_t tshape[EM_MAX_DIMS];
        memcpy(tshape, out->shape, sizeof(int64_t) * (size_t)nd);
        tshape[dim] = rows;
        tmp[t] = em__tensor_new(out->dtype, tshape, nd);
        if (!tmp[t]) {
            st = em_last_status();
            break;
        }
        em__tdesc(tmp[t], &tk.out[0]);
        st = em__submit_tile(op, tmp[t], &tk);
    }
    if (st == EM_OK) st = em__place_tiles(op, tmp, s0s, T, dim);
    for (int t = 0; t < T; t++) em_tensor_release(tmp[t]);
    return st;
}
