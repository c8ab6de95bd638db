/* OpenCL host function for the indexing ops (GATHER, INDEX_SELECT, SCATTER,
 * SCATTER_ADD, INDEX_ADD, ONE_HOT). Operand contracts: tasks/index.c; kernel contracts:
 * devices/opencl/index.cl. Index operands are i64. */
#include "devices/opencl/opencl.h"

#include <string.h>

static void arg_operand(em_ocl_args *a, void *iface, const em_tdesc *t, const int64_t *st)
{
    em_ocl_arg_buf(a, iface);
    em_ocl_arg_i64(a, t->offset);
    em_ocl_arg_long8(a, st, EM_KARGS_MAX_DIMS);
}

static void gather(em_ocl_ctx *c, void *buffers[], const em_kargs *k, bool index_select)
{
    const em_tdesc *A = &k->in[0], *Ix = &k->in[1], *O = &k->out[0];
    const int dim = k->p.axis.dim;
    int64_t ist[EM_KARGS_MAX_DIMS] = {0}, ast[EM_KARGS_MAX_DIMS] = {0};
    for (int d = 0; d < O->ndim; d++) {
        ast[d] = d == dim ? 0 : A->strides[d];
        ist[d] = index_select ? (d == dim ? Ix->strides[0] : 0) : Ix->strides[d];
    }
    int64_t shape[EM_KARGS_MAX_DIMS], st[3][EM_KARGS_MAX_DIMS];
    const int64_t *sts[3] = {O->strides, ist, ast};
    int nd = em_ocl_collapse(O->ndim, O->shape, 3, sts, shape, st);
    const int64_t n = em_ocl_numel(O);
    em_ocl_args a = em_ocl_args_begin(c, EMK_gather);
    arg_operand(&a, buffers[0], A, st[2]);
    arg_operand(&a, buffers[1], Ix, st[1]);
    arg_operand(&a, buffers[2], O, st[0]);
    em_ocl_arg_i32(&a, nd);
    em_ocl_arg_long8(&a, shape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(&a, n);
    em_ocl_arg_i64(&a, A->shape[dim]);
    em_ocl_arg_i64(&a, A->strides[dim]);
    em_ocl_arg_i32(&a, (int32_t)em_ocl_dtsize(A->dtype));
    em_ocl_launch_1d(&a, n, "gather");
}

/* Ix: the index operand's descriptor (INDEX_ADD: its 1-D index broadcast to
 * src's shape, see em_ocl_index). */
static void scatter(em_ocl_ctx *c, void *buffers[], const em_kargs *k, const em_tdesc *Ix, bool add)
{
    const em_tdesc *Sf = &k->in[0], *Sr = &k->in[2], *O = &k->out[0];
    const int dim = k->p.axis.dim;
    /* out <- self, then the scatter on the same in-order queue */
    if (!em_ocl_copy_enqueue(c, buffers[0], Sf, buffers[3], O)) return;
    int64_t shp[EM_KARGS_MAX_DIMS] = {0}, ost[EM_KARGS_MAX_DIMS] = {0};
    for (int d = 0; d < Ix->ndim; d++) {
        shp[d] = d == dim ? 1 : Ix->shape[d];
        ost[d] = d == dim ? 0 : O->strides[d];
    }
    const bool has_dim = dim < Ix->ndim;
    const int64_t L = has_dim ? Ix->shape[dim] : 1;
    int64_t shape[EM_KARGS_MAX_DIMS], st[3][EM_KARGS_MAX_DIMS];
    const int64_t *sts[3] = {Ix->strides, Sr->strides, ost};
    int nd = em_ocl_collapse(Ix->ndim, shp, 3, sts, shape, st);
    int64_t n = 1;
    for (int d = 0; d < Ix->ndim; d++) n *= shp[d];
    if (L == 0) n = 0;
    em_ocl_args a = em_ocl_args_begin(c, EMK_scatter);
    arg_operand(&a, buffers[1], Ix, st[0]);
    arg_operand(&a, buffers[2], Sr, st[1]);
    arg_operand(&a, buffers[3], O, st[2]);
    em_ocl_arg_i32(&a, nd);
    em_ocl_arg_long8(&a, shape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(&a, n);
    em_ocl_arg_i64(&a, L);
    em_ocl_arg_i64(&a, has_dim ? Ix->strides[dim] : 0);
    em_ocl_arg_i64(&a, has_dim && dim < Sr->ndim ? Sr->strides[dim] : 0);
    em_ocl_arg_i64(&a, O->shape[dim]);
    em_ocl_arg_i64(&a, O->strides[dim]);
    em_ocl_arg_i32(&a, O->dtype);
    em_ocl_arg_i32(&a, add);
    em_ocl_launch_1d(&a, n, "scatter");
}

static void one_hot(em_ocl_ctx *c, void *buffers[], const em_kargs *k)
{
    const em_tdesc *Ix = &k->in[0], *O = &k->out[0];
    int64_t shape[EM_KARGS_MAX_DIMS], st[2][EM_KARGS_MAX_DIMS];
    const int64_t *sts[2] = {Ix->strides, O->strides};
    int nd = em_ocl_collapse(Ix->ndim, Ix->shape, 2, sts, shape, st);
    const int64_t n = em_ocl_numel(Ix);
    em_ocl_args a = em_ocl_args_begin(c, EMK_one_hot);
    arg_operand(&a, buffers[0], Ix, st[0]);
    arg_operand(&a, buffers[1], O, st[1]);
    em_ocl_arg_i32(&a, nd);
    em_ocl_arg_long8(&a, shape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(&a, n);
    em_ocl_arg_i64(&a, k->p.onehot.num_classes);
    em_ocl_arg_i64(&a, O->strides[Ix->ndim]);
    em_ocl_launch_1d(&a, n, "one_hot");
}

void em_ocl_index(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int kind = k->kind;
    const bool is_index_add = kind == EM_OP_INDEX_ADD;
    const bool is_scatter = kind == EM_OP_SCATTER || kind == EM_OP_SCATTER_ADD || is_index_add;
    const bool is_gather = kind == EM_OP_GATHER || kind == EM_OP_INDEX_SELECT;
    const em_tdesc *O = &k->out[0];
    bool ok = is_scatter || is_gather || kind == EM_OP_ONE_HOT;
    if (ok && kind == EM_OP_ONE_HOT)
        ok = k->in[0].dtype == EM_I64 && O->dtype == EM_I64 && O->ndim == k->in[0].ndim + 1;
    if (ok && (is_gather || is_scatter)) {
        const int dim = k->p.axis.dim, es = (int)em_ocl_dtsize(O->dtype);
        ok = dim >= 0 && dim < O->ndim && (es == 1 || es == 4 || es == 8) && O->dtype <= EM_BOOL &&
             k->in[1].dtype == EM_I64 && dim < k->in[0].ndim;
    }
    if (ok && is_index_add) ok = k->in[1].ndim == 1 && k->in[2].ndim == O->ndim;
    if (!ok) {
        em_ocl_error("index: unsupported op %d / operands", kind);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "index")) return;
    /* scatter_add on f64 adds doubles (scatter/gather just move bytes) */
    if (!c.d->fp64 && is_scatter && O->dtype == EM_F64) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    if (is_gather) gather(&c, buffers, k, kind == EM_OP_INDEX_SELECT);
    else if (is_index_add) {
        /* index_add is scatter_add with the 1-D index broadcast over src's
         * shape (stride 0 but along dim): the same fibre walk, j in order */
        em_tdesc ix = k->in[2];
        ix.dtype = EM_I64;
        ix.offset = k->in[1].offset;
        for (int d = 0; d < ix.ndim; d++) ix.strides[d] = d == k->p.axis.dim ? k->in[1].strides[0] : 0;
        scatter(&c, buffers, k, &ix, true);
    } else if (is_scatter)
        scatter(&c, buffers, k, &k->in[1], kind == EM_OP_SCATTER_ADD);
    else one_hot(&c, buffers, k);
}
