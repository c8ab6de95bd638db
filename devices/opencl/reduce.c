/* OpenCL host functions: reductions and softmax / log_softmax. Kernel
 * contracts: devices/opencl/reduce.cl. kargs as for devices/cpu/reduce.c:
 * in[0] has its p.red.nkeep kept dims first and the reduced dims last; out[0]
 * is contiguous over the kept dims. */
#include "devices/opencl/opencl.h"

#include <string.h>

/* Work-group size of a reduction over n elements: 32 for short rows, the
 * kernel's full size (<= 256) otherwise. Two sizes only: PoCL compiles a
 * work-group function per distinct local size, and a GPU wastes little
 * with a 32-wide group on a short row. */
static size_t red_wg(int64_t n, size_t kwg)
{
    size_t small = kwg < 32 ? kwg : 32;
    return n <= (int64_t)small ? small : kwg;
}

static bool dt_ok(int dt) { return dt >= EM_F32 && dt <= EM_BOOL; }

void em_ocl_reduce(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *in = &k->in[0], *out = &k->out[0];
    const int nk = k->p.red.nkeep;
    if (k->kind < EM_OP_SUM || k->kind > EM_OP_VAR || nk < 0 || nk > in->ndim || !dt_ok(in->dtype) ||
        !dt_ok(out->dtype)) {
        em_ocl_error("reduce: unsupported op %d / dtypes %d -> %d / nkeep %d", k->kind, in->dtype, out->dtype, nk);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "reduce")) return;
    if (!c.d->fp64 && (in->dtype == EM_F64 || out->dtype == EM_F64)) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const int nr = in->ndim - nk;
    int64_t kshape[EM_KARGS_MAX_DIMS], kst[1][EM_KARGS_MAX_DIMS], rshape[EM_KARGS_MAX_DIMS],
        rst[1][EM_KARGS_MAX_DIMS];
    const int64_t *ks[1] = {in->strides}, *rs[1] = {in->strides + nk};
    int nkc = em_ocl_collapse(nk, in->shape, 1, ks, kshape, kst);
    int nrc = em_ocl_collapse(nr, in->shape + nk, 1, rs, rshape, rst);
    int64_t nout = 1, nred = 1;
    for (int i = 0; i < nk; i++) nout *= in->shape[i];
    for (int i = nk; i < in->ndim; i++) nred *= in->shape[i];
    if (nout == 0) return;
    const size_t wg = red_wg(nred, c.d->kwg[EMK_reduce]);
    const size_t accsz = c.d->fp64 ? sizeof(cl_double) : sizeof(cl_float);
    em_ocl_args a = em_ocl_args_begin(&c, EMK_reduce);
    em_ocl_arg_buf(&a, buffers[0]);
    em_ocl_arg_i64(&a, in->offset);
    em_ocl_arg_i32(&a, nkc);
    em_ocl_arg_long8(&a, kshape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, kst[0], EM_KARGS_MAX_DIMS);
    em_ocl_arg_i32(&a, nrc);
    em_ocl_arg_long8(&a, rshape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, rst[0], EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(&a, nred);
    em_ocl_arg_buf(&a, buffers[1]);
    em_ocl_arg_i64(&a, out->offset);
    em_ocl_arg_i32(&a, in->dtype);
    em_ocl_arg_i32(&a, out->dtype);
    em_ocl_arg_i32(&a, k->kind);
    em_ocl_arg_acc(&a, k->p.red.correction);
    em_ocl_arg_local(&a, wg * accsz);
    em_ocl_arg_local(&a, wg * sizeof(cl_long));
    em_ocl_arg_local(&a, wg * sizeof(cl_long));
    size_t g = (size_t)nout * wg;
    em_ocl_launch(&a, 1, &g, &wg, "reduce");
}

void em_ocl_softmax(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *in = &k->in[0], *out = &k->out[0];
    const int nd = in->ndim, d = k->p.axis.dim;
    if ((k->kind != EM_OP_SOFTMAX && k->kind != EM_OP_LOG_SOFTMAX) || (in->dtype != EM_F32 && in->dtype != EM_F64) ||
        out->dtype != in->dtype || out->ndim != nd || (nd > 0 && (d < 0 || d >= nd))) {
        em_ocl_error("softmax: unsupported op %d / dtype %d / dim %d", k->kind, in->dtype, d);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "softmax")) return;
    const int kid = in->dtype == EM_F32 ? EMK_softmax_f32 : EMK_softmax_f64;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const int64_t L = nd ? in->shape[d] : 1, sx = nd ? in->strides[d] : 1, sy = nd ? out->strides[d] : 1;
    int64_t shp[EM_KARGS_MAX_DIMS], stx[EM_KARGS_MAX_DIMS], sty[EM_KARGS_MAX_DIMS];
    int no = 0;
    for (int i = 0; i < nd; i++)
        if (i != d) {
            shp[no] = in->shape[i];
            stx[no] = in->strides[i];
            sty[no] = out->strides[i];
            no++;
        }
    int64_t oshape[EM_KARGS_MAX_DIMS], ost[2][EM_KARGS_MAX_DIMS];
    const int64_t *sts[2] = {stx, sty};
    int noc = em_ocl_collapse(no, shp, 2, sts, oshape, ost);
    int64_t rows = 1;
    for (int i = 0; i < no; i++) rows *= shp[i];
    if (rows == 0 || L == 0) return;
    const size_t wg = red_wg(L, c.d->kwg[kid]);
    const size_t accsz = c.d->fp64 ? sizeof(cl_double) : sizeof(cl_float);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    em_ocl_arg_buf(&a, buffers[0]);
    em_ocl_arg_i64(&a, in->offset);
    em_ocl_arg_buf(&a, buffers[1]);
    em_ocl_arg_i64(&a, out->offset);
    em_ocl_arg_i32(&a, noc);
    em_ocl_arg_long8(&a, oshape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, ost[0], EM_KARGS_MAX_DIMS);
    em_ocl_arg_long8(&a, ost[1], EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(&a, L);
    em_ocl_arg_i64(&a, sx);
    em_ocl_arg_i64(&a, sy);
    em_ocl_arg_i32(&a, k->kind == EM_OP_LOG_SOFTMAX);
    em_ocl_arg_local(&a, wg * accsz);
    size_t g = (size_t)rows * wg;
    em_ocl_launch(&a, 1, &g, &wg, "softmax");
}
