/* OpenCL host functions: element-wise unary / tensor-scalar, binary, where,
 * copy+cast. Kernel contracts: devices/opencl/elementwise.cl. The kargs are
 * the CPU's (devices/cpu/elementwise.c): in[] strided (stride 0 for broadcast
 * dims), out[0] strided, all of out[0]'s shape. */
#include "devices/opencl/opencl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static bool is_float_dt(int dt) { return dt == EM_F32 || dt == EM_F64; }

/* Collapses the output shape over nops operands (ops[0] = output). */
typedef struct ew_geom {
    int nd;
    int64_t n;
    int64_t shape[EM_KARGS_MAX_DIMS];
    int64_t st[4][EM_KARGS_MAX_DIMS];
} ew_geom;

static void geom(ew_geom *g, const em_tdesc *out, int nops, const em_tdesc *const *ops)
{
    const int64_t *strides[4];
    for (int i = 0; i < nops; i++) strides[i] = ops[i]->strides;
    g->nd = em_ocl_collapse(out->ndim, out->shape, nops, strides, g->shape, g->st);
    g->n = em_ocl_numel(out);
}

static void arg_operand(em_ocl_args *a, void *iface, const em_tdesc *t, const int64_t *st)
{
    em_ocl_arg_buf(a, iface);
    em_ocl_arg_i64(a, t->offset);
    em_ocl_arg_long8(a, st, EM_KARGS_MAX_DIMS);
}

static void arg_geom(em_ocl_args *a, const ew_geom *g)
{
    em_ocl_arg_i32(a, g->nd);
    em_ocl_arg_long8(a, g->shape, EM_KARGS_MAX_DIMS);
    em_ocl_arg_i64(a, g->n);
}

/* The CPU's (T)x for an integer dtype, without undefined behaviour: NaN gives
 * 0, out-of-range values saturate. */
static int64_t sat_i64(double v)
{
    if (isnan(v)) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

static int64_t int_cast(int dt, double v)
{
    int64_t x = sat_i64(v);
    switch (dt) {
    case EM_I32: return x > INT32_MAX ? INT32_MAX : x < INT32_MIN ? INT32_MIN : (int32_t)x;
    case EM_I64: return x;
    default: return (uint8_t)x; /* u8 / bool: like the CPU's (uint8_t) of an in-range value */
    }
}

/* Integer scalar pack (see elementwise.cl). */
static void int_scalars(int dt, double a, double b, int64_t sv[8])
{
    memset(sv, 0, sizeof(int64_t) * 8);
    sv[0] = int_cast(dt, a);
    sv[1] = int_cast(dt, b);
    sv[2] = sat_i64(ceil(a));
    sv[3] = sat_i64(floor(a));
    sv[4] = sat_i64(floor(b));
    sv[5] = (isnan(a) ? 1 : 0) | (isnan(b) ? 2 : 0) | ((!isnan(a) && !isinf(a) && a == floor(a)) ? 4 : 0);
    /* +/-inf thresholds: saturation already gives the right answers for every
     * value of an i32/u8 tensor; for i64 only INT64_MAX/MIN themselves differ. */
}

/* Integer unary kinds the CPU implements (others are float-only: the front
 * end casts ints to f32 first). */
static bool int_unary_ok(int kind)
{
    switch (kind) {
    case EM_OP_NEG: case EM_OP_ABS: case EM_OP_SIGN: case EM_OP_SQUARE: case EM_OP_RELU: case EM_OP_FLOOR:
    case EM_OP_CEIL: case EM_OP_ROUND: case EM_OP_CLAMP: case EM_OP_POW_SCALAR: case EM_OP_LOGICAL_NOT:
    case EM_OP_ADD_SCALAR: case EM_OP_SUB_SCALAR: case EM_OP_RSUB_SCALAR: case EM_OP_MUL_SCALAR:
    case EM_OP_MAXIMUM_SCALAR: case EM_OP_MINIMUM_SCALAR: case EM_OP_REMAINDER_SCALAR: case EM_OP_EQ_SCALAR:
    case EM_OP_NE_SCALAR: case EM_OP_LT_SCALAR: case EM_OP_LE_SCALAR: case EM_OP_GT_SCALAR: case EM_OP_GE_SCALAR:
        return true;
    default: return false;
    }
}

static bool int_binary_ok(int kind)
{
    switch (kind) {
    case EM_OP_ADD: case EM_OP_SUB: case EM_OP_MUL: case EM_OP_MAXIMUM: case EM_OP_MINIMUM: case EM_OP_REMAINDER:
    case EM_OP_EQ: case EM_OP_NE: case EM_OP_LT: case EM_OP_LE: case EM_OP_GT: case EM_OP_GE:
    case EM_OP_LOGICAL_AND: case EM_OP_LOGICAL_OR:
        return true;
    default: return false;
    }
}

static bool same_family(int kind, int representative)
{
    return (unsigned)kind < EM_OP_COUNT && em__kernel_info[kind].cpu == em__kernel_info[representative].cpu;
}

/* Kernel id for a dtype: base + offset, in the order f32 f64 i32 i64 u8 of
 * EM_OCL_KERNEL_LIST (4 kernels per dtype). */
_Static_assert(EMK_unary_f64 == EMK_unary_f32 + 4 && EMK_bcmp_i32 == EMK_bcmp_f32 + 8 &&
                   EMK_unary_i64 == EMK_unary_f32 + 12 && EMK_bcmp_u8 == EMK_bcmp_f32 + 16,
               "EM_OCL_KERNEL_LIST: 4 element-wise kernels per dtype, in dtype order");
static int typed_kernel(int dt, int f32_id)
{
    switch (dt) {
    case EM_F32: return f32_id;
    case EM_F64: return f32_id + 4;
    case EM_I32: return f32_id + 8;
    case EM_I64: return f32_id + 12;
    case EM_U8:
    case EM_BOOL: return f32_id + 16;
    default: return -1;
    }
}

void em_ocl_unary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int dt = k->in[0].dtype, kind = k->kind;
    const bool cmp = (unsigned)kind < EM_OP_COUNT && (em__kernel_info[kind].flags & F_CMP);
    if (!same_family(kind, EM_OP_NEG) || (!is_float_dt(dt) && !int_unary_ok(kind))) {
        em_ocl_error("unary: op %d not supported for dtype %d", kind, dt);
        return;
    }
    const int kid = typed_kernel(dt, cmp ? EMK_ucmp_f32 : EMK_unary_f32);
    if (kid < 0) {
        em_ocl_error("unary: dtype %d not supported", dt);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "unary")) return;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    ew_geom g;
    const em_tdesc *ops[2] = {&k->out[0], &k->in[0]};
    geom(&g, &k->out[0], 2, ops);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    arg_operand(&a, buffers[0], &k->in[0], g.st[1]);
    arg_operand(&a, buffers[1], &k->out[0], g.st[0]);
    arg_geom(&a, &g);
    em_ocl_arg_i32(&a, kind);
    if (is_float_dt(dt)) {
        em_ocl_arg_real(&a, dt, k->p.s.a);
        if (!cmp) em_ocl_arg_real(&a, dt, k->p.s.b);
    } else {
        int64_t sv[8];
        int_scalars(dt, k->p.s.a, k->p.s.b, sv);
        em_ocl_arg_long8(&a, sv, 8);
    }
    em_ocl_launch_1d(&a, g.n, "unary");
}

void em_ocl_binary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int dt = k->in[0].dtype, kind = k->kind;
    const bool cmp = (unsigned)kind < EM_OP_COUNT && (em__kernel_info[kind].flags & F_CMP);
    if (!same_family(kind, EM_OP_ADD) || k->in[1].dtype != dt || (!is_float_dt(dt) && !int_binary_ok(kind))) {
        em_ocl_error("binary: op %d not supported for dtypes %d/%d", kind, dt, k->in[1].dtype);
        return;
    }
    int kid = typed_kernel(dt, cmp ? EMK_bcmp_f32 : EMK_binary_f32);
    if (dt == EM_BOOL && !cmp) kid = EMK_binary_bool;
    if (kid < 0) {
        em_ocl_error("binary: dtype %d not supported", dt);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "binary")) return;
    if (!c.d->k[kid]) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    ew_geom g;
    const em_tdesc *ops[3] = {&k->out[0], &k->in[0], &k->in[1]};
    geom(&g, &k->out[0], 3, ops);
    em_ocl_args a = em_ocl_args_begin(&c, kid);
    arg_operand(&a, buffers[0], &k->in[0], g.st[1]);
    arg_operand(&a, buffers[1], &k->in[1], g.st[2]);
    arg_operand(&a, buffers[2], &k->out[0], g.st[0]);
    arg_geom(&a, &g);
    em_ocl_arg_i32(&a, kind);
    em_ocl_launch_1d(&a, g.n, "binary");
}

void em_ocl_where(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const size_t es = em_ocl_dtsize(k->out[0].dtype);
    if (k->kind != EM_OP_WHERE || (es != 1 && es != 4 && es != 8) || em_ocl_dtsize(k->in[0].dtype) != 1) {
        em_ocl_error("where: unsupported dtypes (mask %d, out %d)", k->in[0].dtype, k->out[0].dtype);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "where")) return;
    ew_geom g;
    const em_tdesc *ops[4] = {&k->out[0], &k->in[0], &k->in[1], &k->in[2]};
    geom(&g, &k->out[0], 4, ops);
    em_ocl_args a = em_ocl_args_begin(&c, EMK_where);
    arg_operand(&a, buffers[0], &k->in[0], g.st[1]);
    arg_operand(&a, buffers[1], &k->in[1], g.st[2]);
    arg_operand(&a, buffers[2], &k->in[2], g.st[3]);
    arg_operand(&a, buffers[3], &k->out[0], g.st[0]);
    arg_geom(&a, &g);
    em_ocl_arg_i32(&a, (int32_t)es);
    em_ocl_launch_1d(&a, g.n, "where");
}

bool em_ocl_copy_enqueue(em_ocl_ctx *c, void *in_iface, const em_tdesc *in, void *out_iface, const em_tdesc *out)
{
    ew_geom g;
    const em_tdesc *ops[2] = {out, in};
    geom(&g, out, 2, ops);
    em_ocl_args a = em_ocl_args_begin(c, EMK_copy);
    arg_operand(&a, in_iface, in, g.st[1]);
    arg_operand(&a, out_iface, out, g.st[0]);
    arg_geom(&a, &g);
    em_ocl_arg_i32(&a, in->dtype);
    em_ocl_arg_i32(&a, out->dtype);
    return em_ocl_launch_1d(&a, g.n, "copy");
}

void em_ocl_copy(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int idt = k->in[0].dtype, odt = k->out[0].dtype;
    if (k->kind != EM_OP_COPY || em_ocl_dtsize(idt) == 0 || idt > EM_BOOL || odt > EM_BOOL || idt < 0 || odt < 0) {
        em_ocl_error("copy: unsupported dtypes %d -> %d", idt, odt);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "copy")) return;
    /* A conversion from/to f64 computes in double; a same-dtype f64 copy is a bit move. */
    if (!c.d->fp64 && idt != odt && (idt == EM_F64 || odt == EM_F64)) {
        em_ocl_host_fallback(buffers, k);
        return;
    }
    em_ocl_copy_enqueue(&c, buffers[0], &k->in[0], buffers[1], &k->out[0]);
}
