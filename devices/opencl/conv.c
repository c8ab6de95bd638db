/* OpenCL host functions of the conv and pool families. Operand contracts:
 * tasks/conv.c and tasks/pool.c; kernel contracts: devices/opencl/conv.cl
 * and devices/opencl/pool.cl (direct kernels, one work-item per output
 * element, or for bwd_weight with few weights one work-group per weight
 * element; the backward kernels gather, no atomics).
 *
 * Every operand is f32 or f64 (one dtype per op; max_pool2d's indices i64),
 * 4-D and contiguous with an element offset; anything else is reported as a
 * kernel error, never skipped. f64 on a device without fp64 runs the CPU
 * kernel through em_ocl_host_fallback. */
#include "devices/opencl/opencl.h"

static bool contiguous4(const em_tdesc *t)
{
    if (t->ndim != 4) return false;
    int64_t s = 1;
    for (int d = 3; d >= 0; d--) {
        if (t->shape[d] < 0) return false;
        if (t->shape[d] != 1 && t->strides[d] != s) return false;
        s *= t->shape[d];
    }
    return true;
}

static bool float_dt(int dt) { return dt == EM_F32 || dt == EM_F64; }

static void arg_tensor(em_ocl_args *a, void *iface, const em_tdesc *t)
{
    em_ocl_arg_buf(a, iface);
    em_ocl_arg_i64(a, t->offset);
}

/* ---- convolution -------------------------------------------------------------- */

/* bwd_weight takes the work-group reduction below this many weight elements
 * when every one sums at least RED_MIN_SUM products (N * OH * OW). */
enum { RED_MAX_WEIGHTS = 4096, RED_MIN_SUM = 4096 };

void em_ocl_conv(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int kind = k->kind;
    /* x, w, y in the roles of the forward op */
    const em_tdesc *x, *w, *y;
    int kid32, kid64;
    if (kind == EM_OP_CONV2D) {
        x = &k->in[0], w = &k->in[1], y = &k->out[0];
        kid32 = EMK_conv2d_fwd_f32, kid64 = EMK_conv2d_fwd_f64;
    } else if (kind == EM_OP_CONV2D_BWD_DATA) {
        y = &k->in[0], w = &k->in[1], x = &k->out[0];
        kid32 = EMK_conv2d_bwd_data_f32, kid64 = EMK_conv2d_bwd_data_f64;
    } else if (kind == EM_OP_CONV2D_BWD_WEIGHT) {
        x = &k->in[0], y = &k->in[1], w = &k->out[0];
        kid32 = EMK_conv2d_bwd_weight_f32, kid64 = EMK_conv2d_bwd_weight_f64;
    } else {
        em_ocl_error("conv: unsupported op %d", kind);
        return;
    }
    const int dt = x->dtype;
    if (!float_dt(dt) || w->dtype != dt || y->dtype != dt) {
        em_ocl_error("conv (op %s): unsupported dtypes %d/%d/%d", em__kernel_info[kind].name, x->dtype, w->dtype,
                     y->dtype);
        return;
    }
    if (!contiguous4(x) || !contiguous4(w) || !contiguous4(y)) {
        em_ocl_error("conv (op %s): operands must be 4-D and contiguous (ranks %d/%d/%d)", em__kernel_info[kind].name,
                     x->ndim, w->ndim, y->ndim);
        return;
    }
    const int64_t G = k->p.conv.groups;
    const int64_t N = x->shape[0], C = x->shape[1], O = w->shape[0];
    const int32_t *st = k->p.conv.stride, *pd = k->p.conv.pad, *dl = k->p.conv.dilation;
    if (G <= 0 || C % G || O % G || w->shape[1] * G != C || y->shape[0] != N || y->shape[1] != O || st[0] <= 0 ||
        st[1] <= 0 || dl[0] <= 0 || dl[1] <= 0 || pd[0] < 0 || pd[1] < 0) {
        em_ocl_error("conv (op %s): inconsistent geometry (x [%lld, %lld], w [%lld, %lld], y [%lld, %lld], groups %lld, "
                     "stride %d/%d, pad %d/%d, dilation %d/%d)",
                     em__kernel_info[kind].name, (long long)N, (long long)C, (long long)O, (long long)w->shape[1],
                     (long long)y->shape[0], (long long)y->shape[1], (long long)G, st[0], st[1], pd[0], pd[1], dl[0],
                     dl[1]);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "conv")) return;
    const int kid = dt == EM_F32 ? kid32 : kid64;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const int64_t g0[8] = {N, C, x->shape[2], x->shape[3], O, y->shape[2], y->shape[3], w->shape[2]};
    const int64_t g1[8] = {w->shape[3], G, st[0], st[1], pd[0], pd[1], dl[0], dl[1]};
    const em_tdesc *out = &k->out[0];
    const int64_t n = em_ocl_numel(out);
    /* bwd_weight with few weights and long sums: one work-group per weight
     * element, its (n, oh) rows split over the group, a tree sum in local
     * memory (parallelism beyond n work-items) */
    if (kind == EM_OP_CONV2D_BWD_WEIGHT && n > 0 && n < RED_MAX_WEIGHTS && N * y->shape[2] * y->shape[3] >= RED_MIN_SUM) {
        const int rid = dt == EM_F32 ? EMK_conv2d_bwd_weight_red_f32 : EMK_conv2d_bwd_weight_red_f64;
        if (c.d->k[rid]) {
            /* a power-of-2 group of at most half the rows (N * OH) a weight sums over */
            const int64_t rows = N * y->shape[2];
            size_t l = c.d->kwg[rid] ? c.d->kwg[rid] : 64;
            while (l > 16 && (int64_t)l * 2 > rows) l /= 2;
            const size_t g = (size_t)(n < 65536 ? n : 65536) * l;
            em_ocl_args a = em_ocl_args_begin(&c, rid);
            arg_tensor(&a, buffers[0], &k->in[0]);
            arg_tensor(&a, buffers[1], &k->in[1]);
            arg_tensor(&a, buffers[2], out);
            em_ocl_arg_long8(&a, g0, 8);
            em_ocl_arg_long8(&a, g1, 8);
            em_ocl_arg_i64(&a, n);
            em_ocl_arg_local(&a, l * em_ocl_dtsize(dt));
            em_ocl_launch(&a, 1, &g, &l, em__kernel_info[kind].name);
            return;
        }
    }
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    arg_tensor(&a, buffers[0], &k->in[0]);
    arg_tensor(&a, buffers[1], &k->in[1]);
    arg_tensor(&a, buffers[2], out);
    em_ocl_arg_long8(&a, g0, 8);
    em_ocl_arg_long8(&a, g1, 8);
    em_ocl_arg_i64(&a, n);
    em_ocl_launch_1d(&a, n, em__kernel_info[kind].name);
}

/* ---- pooling ------------------------------------------------------------------ */

void em_ocl_pool(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int kind = k->kind;
    const bool bwd = kind == EM_OP_AVG_POOL2D_BWD;
    if (kind != EM_OP_MAX_POOL2D && kind != EM_OP_AVG_POOL2D && !bwd) {
        em_ocl_error("pool: unsupported op %d", kind);
        return;
    }
    const em_tdesc *x = bwd ? &k->out[0] : &k->in[0], *y = bwd ? &k->in[0] : &k->out[0];
    const bool is_max = kind == EM_OP_MAX_POOL2D;
    const int dt = x->dtype;
    bool ok = float_dt(dt) && y->dtype == dt && contiguous4(x) && contiguous4(y) && x->shape[0] == y->shape[0] &&
              x->shape[1] == y->shape[1];
    if (ok && is_max) {
        const em_tdesc *ix = &k->out[1];
        ok = k->n_out == 2 && ix->dtype == EM_I64 && contiguous4(ix);
        for (int d = 0; ok && d < 4; d++) ok = ix->shape[d] == y->shape[d];
    }
    const int adaptive = k->p.pool.adaptive;
    if (ok && !adaptive)
        for (int i = 0; i < 2; i++)
            ok = ok && k->p.pool.kernel[i] > 0 && k->p.pool.stride[i] > 0 && k->p.pool.pad[i] >= 0 &&
                 (!is_max || k->p.pool.dilation[i] > 0);
    if (ok && (x->shape[2] == 0 || x->shape[3] == 0) && y->shape[2] * y->shape[3] != 0)
        ok = false; /* windows over an empty plane (adaptive would divide by H = 0) */
    if (!ok) {
        em_ocl_error("pool (op %s): unsupported operands (dtypes %d/%d, ranks %d/%d) or parameters",
                     em__kernel_info[kind].name, x->dtype, y->dtype, x->ndim, y->ndim);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "pool")) return;
    const bool f32 = dt == EM_F32;
    const int kid = is_max ? (f32 ? EMK_max_pool_f32 : EMK_max_pool_f64)
                    : bwd  ? (f32 ? EMK_avg_pool_bwd_f32 : EMK_avg_pool_bwd_f64)
                           : (f32 ? EMK_avg_pool_f32 : EMK_avg_pool_f64);
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    const int64_t g0[8] = {x->shape[0] * x->shape[1], x->shape[2], x->shape[3], y->shape[2], y->shape[3], adaptive,
                           k->p.pool.count_include_pad, is_max ? 0 : k->p.pool.divisor};
    int64_t g1[8] = {1, 1, 1, 1, 0, 0, 1, 1};
    if (!adaptive) {
        for (int i = 0; i < 2; i++) {
            g1[i] = k->p.pool.kernel[i];
            g1[2 + i] = k->p.pool.stride[i];
            g1[4 + i] = k->p.pool.pad[i];
            g1[6 + i] = is_max ? k->p.pool.dilation[i] : 1;
        }
    }
    /* one work-item per output element (forward) or per dx element (backward) */
    const int64_t n = em_ocl_numel(bwd ? x : y);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    arg_tensor(&a, buffers[0], &k->in[0]);
    arg_tensor(&a, buffers[1], &k->out[0]);
    if (is_max) arg_tensor(&a, buffers[2], &k->out[1]);
    em_ocl_arg_long8(&a, g0, 8);
    em_ocl_arg_long8(&a, g1, 8);
    em_ocl_arg_i64(&a, n);
    em_ocl_launch_1d(&a, n, em__kernel_info[kind].name);
}
