/* OpenCL host function for the creation ops (FILL, ARANGE, EYE, RAND_*).
 * Kernel contracts: devices/opencl/fill.cl. out[0] is written as numel
 * contiguous elements from its element offset, like devices/cpu/fill.c. */
#include "devices/opencl/opencl.h"
#include "devices/cpu/cpu.h" /* em_cpu_half_store: the CPU's f16 / bf16 bits */

#include <math.h>
#include <string.h>

/* The bytes the CPU's store_elem writes for value v in dtype dt. */
static uint64_t pattern(int dt, double v)
{
    uint64_t p = 0;
    switch (dt) {
    case EM_F32: {
        float f = (float)v;
        memcpy(&p, &f, 4);
        break;
    }
    case EM_F64: memcpy(&p, &v, 8); break;
    case EM_I32: {
        int32_t x = isnan(v) ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        memcpy(&p, &x, 4);
        break;
    }
    case EM_I64: {
        int64_t x = isnan(v) ? 0 : v >= 9223372036854775807.0 ? INT64_MAX : v <= -9223372036854775808.0 ? INT64_MIN : (int64_t)v;
        memcpy(&p, &x, 8);
        break;
    }
    case EM_U8: {
        int64_t x = isnan(v) ? 0 : v >= 9223372036854775807.0 ? INT64_MAX : v <= -9223372036854775808.0 ? INT64_MIN : (int64_t)v;
        p = (uint8_t)x;
        break;
    }
    case EM_BOOL: p = v != 0; break;
    case EM_F16:
    case EM_BF16: p = em_cpu_half_store(dt, (float)v); break;
    default: em_ocl_error("fill: no byte pattern for dtype %d", dt); break;
    }
    return p;
}

void em_ocl_fill(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *o = &k->out[0];
    const int dt = o->dtype;
    const size_t es = em_ocl_dtsize(dt);
    if (es == 0 || k->kind < EM_OP_FILL || k->kind > EM_OP_RAND_BERNOULLI ||
        (k->kind == EM_OP_EYE && o->ndim != 2)) {
        em_ocl_error("fill: unsupported op %d / dtype %d", k->kind, dt);
        return;
    }
    em_ocl_ctx c;
    if (!em_ocl_enter(&c, k, "fill")) return;
    const int64_t n = em_ocl_numel(o);
    if (n == 0) return;
    switch (k->kind) {
    case EM_OP_FILL: {
        em_ocl_args a = em_ocl_args_begin(&c, EMK_fill_pattern);
        em_ocl_arg_buf(&a, buffers[0]);
        em_ocl_arg_i64(&a, o->offset);
        em_ocl_arg_i64(&a, n);
        em_ocl_arg_i32(&a, (int32_t)es);
        em_ocl_arg_u64(&a, pattern(dt, k->p.s.a));
        em_ocl_launch_1d(&a, n, "fill");
        break;
    }
    case EM_OP_EYE: {
        em_ocl_args a = em_ocl_args_begin(&c, EMK_eye);
        em_ocl_arg_buf(&a, buffers[0]);
        em_ocl_arg_i64(&a, o->offset);
        em_ocl_arg_i64(&a, n);
        em_ocl_arg_i64(&a, o->shape[1]);
        em_ocl_arg_i32(&a, (int32_t)es);
        em_ocl_arg_u64(&a, pattern(dt, 1.0));
        em_ocl_launch_1d(&a, n, "eye");
        break;
    }
    case EM_OP_ARANGE: {
        if (!c.d->k[EMK_arange]) {
            em_ocl_host_fallback(buffers, k);
            return;
        }
        em_ocl_args a = em_ocl_args_begin(&c, EMK_arange);
        em_ocl_arg_buf(&a, buffers[0]);
        em_ocl_arg_i64(&a, o->offset);
        em_ocl_arg_i64(&a, n);
        em_ocl_arg_i32(&a, dt);
        em_ocl_arg_real(&a, EM_F64, k->p.range.start);
        em_ocl_arg_real(&a, EM_F64, k->p.range.step);
        em_ocl_arg_real(&a, EM_F64, k->p.range.end);
        em_ocl_arg_i32(&a, k->p.range.linspace);
        em_ocl_launch_1d(&a, n, "arange");
        break;
    }
    case EM_OP_RAND_UNIFORM:
    case EM_OP_RAND_NORMAL:
    case EM_OP_RAND_BERNOULLI: {
        if (!c.d->k[EMK_rand]) {
            em_ocl_host_fallback(buffers, k);
            return;
        }
        em_ocl_args a = em_ocl_args_begin(&c, EMK_rand);
        em_ocl_arg_buf(&a, buffers[0]);
        em_ocl_arg_i64(&a, o->offset);
        em_ocl_arg_i64(&a, n);
        em_ocl_arg_i32(&a, dt);
        em_ocl_arg_i32(&a, k->kind);
        em_ocl_arg_u64(&a, k->p.rng.seed);
        em_ocl_arg_u64(&a, k->p.rng.offset);
        em_ocl_arg_real(&a, EM_F64, k->p.rng.a);
        em_ocl_arg_real(&a, EM_F64, k->p.rng.b);
        em_ocl_launch_1d(&a, n, "rand");
        break;
    }
    default: em_ocl_error("fill: unsupported op %d", k->kind); break;
    }
}
