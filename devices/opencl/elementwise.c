/* OpenCL host functions: element-wise unary / tensor-scalar, binary, where,
 * copy+cast. Kernel contracts: devices/opencl/elementwise.cl. The kargs are
 * the CPU's (devices/cpu/elementwise.c): in[] strided (stride 0 for broadcast
 * dims), out[0] strided, all of out[0]'s shape. */
#include "devices/opencl/opencl.h"

#include <stdint.h>

/* the helper list (EM_EW_FLOAT_HELPER_LIST) of the shared expressions */
#define EW_FN static inline
typedef int64_t em_i64;
typedef uint64_t em_u64;
#include "devices/ew_math.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

/* The float dtypes (f16 / bf16: stored in 16 bits, computed in float). */
static bool is_float_dt(int dt) { return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16; }

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
    /* a beyond every long (+-inf, or >= 2^63, < -2^63): the saturated
     * thresholds alone would be wrong for x = INT64_MAX / INT64_MIN (x < inf
     * with x = INT64_MAX), so these flags decide the comparisons outright. */
    sv[5] |= (a >= 9223372036854775808.0 ? 8 : 0) | (a < -9223372036854775808.0 ? 16 : 0);
}

/* ---- the element-wise functions, generated from tasks/ops.def ------------ */

typedef struct ew_row {
    int kind;
    unsigned flags;
    int arity;
    const char *name, *fx, *ix;
} ew_row;

/* Every element-wise kind with its expressions as text. */
static const ew_row g_rows[] = {
#define EW1(E, nm, fl, fx, ix, bw) {EM_OP_##E, (fl), 1, #nm, #fx, #ix},
#define EW2(E, nm, fl, fx, ix, bw) {EM_OP_##E, (fl), 2, #nm, #fx, #ix},
#include "tasks/ops.def"
};

/* Does expression text e use the identifier id? */
static bool uses_ident(const char *e, const char *id)
{
    size_t n = strlen(id);
    for (const char *p = strstr(e, id); p; p = strstr(p + 1, id)) {
        bool before = p == e || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        bool after = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (before && after) return true;
    }
    return false;
}

/* The integer kinds that elementwise.cl's em_iun_da / em_icmp1_da compute. */
static bool has_da_override(int kind)
{
    return kind == EM_OP_CLAMP || kind == EM_OP_EQ_SCALAR || kind == EM_OP_NE_SCALAR || kind == EM_OP_LT_SCALAR ||
           kind == EM_OP_LE_SCALAR || kind == EM_OP_GT_SCALAR || kind == EM_OP_GE_SCALAR;
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* One switch function: the cases of every row of @p arity whose F_CMP flag is
 * @p cmp, from the float or the integer expression. */
static void gen_fn(sbuf *b, const char *sig, const char *pre, int arity, bool cmp, bool integer, const char *ret,
                   const char *dflt)
{
    sb_add(b, "%s\n{\n%s    switch (op) {\n", sig, pre);
    for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++) {
        const ew_row *r = &g_rows[i];
        if (r->arity != arity || ((r->flags & F_CMP) != 0) != cmp) continue;
        if (integer && (r->flags & F_FLOAT)) continue;
        const char *e = integer ? r->ix : r->fx;
        if (integer && (uses_ident(e, "da") || uses_ident(e, "db"))) continue; /* em_iun_da / em_icmp1_da */
        sb_add(b, "    case %d: return (%s)(%s); /* %s */\n", r->kind, ret, e, r->name);
    }
    sb_add(b, "    default: return %s;\n    }\n}\n", dflt);
}

char *em_ocl_ew_source(bool fp64, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++) {
        const ew_row *r = &g_rows[i];
        if ((r->flags & F_FLOAT) || has_da_override(r->kind)) continue;
        if (uses_ident(r->ix, "da") || uses_ident(r->ix, "db")) {
            snprintf(err, errlen, "op %s: its integer expression uses da/db, which OpenCL cannot compute "
                                  "(add it to em_iun_da / em_icmp1_da in devices/opencl/elementwise.cl)", r->name);
            return NULL;
        }
    }
    sbuf b = {malloc(32768), 0, 32768, false};
    if (!b.p) return NULL;
    sb_add(&b, "/* generated by devices/opencl/elementwise.c from tasks/ops.def */\n");
    const char *types[2][2] = {{"float", "f32"}, {"double", "f64"}};
    for (int t = 0; t < (fp64 ? 2 : 1); t++) {
        const char *T = types[t][0], *S = types[t][1];
        sb_add(&b, "#define T %s\n", T);
#define EW_HELPER_DEFINE(nm, arity) sb_add(&b, "#define em_" #nm " em_" #nm "_%s\n", S);
        EM_EW_FLOAT_HELPER_LIST(EW_HELPER_DEFINE)
#undef EW_HELPER_DEFINE
        char sig[160];
        snprintf(sig, sizeof sig, "T em_fun_%s(int op, T x, T sa, T sb)", S);
        gen_fn(&b, sig, "", 1, false, false, "T", "(T)NAN");
        snprintf(sig, sizeof sig, "uchar em_fcmp1_%s(int op, T x, T sa)", S);
        gen_fn(&b, sig, "    const T sb = (T)0;\n    (void)sb;\n", 1, true, false, "uchar", "0");
        snprintf(sig, sizeof sig, "T em_fbin_%s(int op, T a, T b)", S);
        gen_fn(&b, sig, "", 2, false, false, "T", "(T)NAN");
        snprintf(sig, sizeof sig, "uchar em_fcmp2_%s(int op, T a, T b)", S);
        gen_fn(&b, sig, "", 2, true, false, "uchar", "0");
#define EW_HELPER_UNDEF(nm, arity) sb_add(&b, "#undef em_" #nm "\n");
        EM_EW_FLOAT_HELPER_LIST(EW_HELPER_UNDEF)
#undef EW_HELPER_UNDEF
        sb_add(&b, "#undef T\n");
    }
    sb_add(&b, "#define T long\n");
    gen_fn(&b, "long em_iun(int op, long x, long8 sv)", "    const long sa = sv.s0, sb = sv.s1;\n", 1, false, true,
           "long", "em_iun_da(op, x, sv)");
    gen_fn(&b, "uchar em_icmp1(int op, long x, long8 sv)", "    const long sa = sv.s0;\n", 1, true, true, "uchar",
           "em_icmp1_da(op, x, sv)");
    gen_fn(&b, "long em_ibin(int op, long a, long b)", "", 2, false, true, "long", "a");
    gen_fn(&b, "uchar em_icmp2(int op, long a, long b)", "", 2, true, true, "uchar", "0");
    sb_add(&b, "#undef T\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* kind is an element-wise op of @p arity, computable for dtype dt. */
static bool ew_ok(int kind, int arity, int dt)
{
    if ((unsigned)kind >= EM_OP_COUNT || !(em__kernel_info[kind].flags & F_EW) || em__kernel_info[kind].n_in != arity ||
        kind == EM_OP_WHERE)
        return false;
    return is_float_dt(dt) || !(em__kernel_info[kind].flags & F_FLOAT);
}

/* Kernel id for a dtype: base + offset, in the order f32 f64 i32 i64 u8 f16
 * bf16 of EM_OCL_KERNEL_LIST (4 kernels per dtype). */
_Static_assert(EMK_unary_f64 == EMK_unary_f32 + 4 && EMK_bcmp_i32 == EMK_bcmp_f32 + 8 &&
                   EMK_unary_i64 == EMK_unary_f32 + 12 && EMK_bcmp_u8 == EMK_bcmp_f32 + 16 &&
                   EMK_ucmp_f16 == EMK_ucmp_f32 + 20 && EMK_binary_bf16 == EMK_binary_f32 + 24,
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
    case EM_F16: return f32_id + 20;
    case EM_BF16: return f32_id + 24;
    default: return -1;
    }
}

void em_ocl_unary(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const int dt = k->in[0].dtype, kind = k->kind;
    const bool cmp = (unsigned)kind < EM_OP_COUNT && (em__kernel_info[kind].flags & F_CMP);
    if (!ew_ok(kind, 1, dt)) {
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
    if (!ew_ok(kind, 2, dt) || k->in[1].dtype != dt) {
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
    if (k->kind != EM_OP_WHERE || (es != 1 && es != 2 && es != 4 && es != 8) || em_ocl_dtsize(k->in[0].dtype) != 1) {
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
    if (k->kind != EM_OP_COPY || em_ocl_dtsize(idt) == 0 || em_ocl_dtsize(odt) == 0) {
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
