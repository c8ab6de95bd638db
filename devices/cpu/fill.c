/* CPU kernels that create data: fill, arange/linspace, eye, random. */
#include "devices/cpu/cpu.h"
#include "devices/philox.h"

#include <math.h>

static void store_elem(int dt, void *base, int64_t i, double v)
{
    switch (dt) {
    case EM_F32: ((float *)base)[i] = (float)v; break;
    case EM_F64: ((double *)base)[i] = v; break;
    case EM_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case EM_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case EM_U8: ((uint8_t *)base)[i] = (uint8_t)(int64_t)v; break;
    case EM_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    case EM_F16:
    case EM_BF16: ((uint16_t *)base)[i] = em_cpu_half_store(dt, (float)v); break;
    default: em_cpu_bad_kind("fill dtype", dt);
    }
}

void em_cpu_fill(void *buffers[], void *cl_arg)
{
    const em_kargs *k = cl_arg;
    const em_tdesc *o = &k->out[0];
    char *Y = (char *)em_cpu_ptr(buffers[0]) + o->offset * (int64_t)em_cpu_dtype_size(o->dtype);
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++) n *= o->shape[d];
    if ((unsigned)o->dtype >= EM_DTYPE_COUNT) { /* once here, not per element in store_elem */
        em_cpu_bad_kind("fill dtype", o->dtype);
        return;
    }
    switch (k->kind) {
    case EM_OP_FILL: {
        double v = k->p.s.a;
        if (o->dtype == EM_F32) {
            float f = (float)v;
            for (int64_t i = 0; i < n; i++) ((float *)Y)[i] = f;
        } else if (v == 0 && !signbit(v)) { /* -0.0 keeps its sign bit (as torch.full and the OpenCL fill) */
            memset(Y, 0, (size_t)n * em_cpu_dtype_size(o->dtype));
        } else {
            for (int64_t i = 0; i < n; i++) store_elem(o->dtype, Y, i, v);
        }
        break;
    }
    case EM_OP_ARANGE: {
        double start = k->p.range.start, step = k->p.range.step, end = k->p.range.end;
        if (k->p.range.linspace) {
            /* as torch.linspace: first half from start, second half from end */
            int64_t half = n / 2;
            if (n == 1) store_elem(o->dtype, Y, 0, start); /* torch.linspace(a, b, 1) == [a] */
            else
                for (int64_t i = 0; i < n; i++)
                    store_elem(o->dtype, Y, i, i < half ? start + step * (double)i : end - step * (double)(n - 1 - i));
        } else {
            for (int64_t i = 0; i < n; i++) store_elem(o->dtype, Y, i, start + step * (double)i);
        }
        break;
    }
    case EM_OP_EYE: {
        int64_t rows = o->shape[0], cols = o->shape[1];
        memset(Y, 0, (size_t)n * em_cpu_dtype_size(o->dtype));
        for (int64_t i = 0; i < rows && i < cols; i++) store_elem(o->dtype, Y, i * cols + i, 1.0);
        break;
    }
    case EM_OP_RAND_UNIFORM:
    case EM_OP_RAND_NORMAL:
    case EM_OP_RAND_BERNOULLI: {
        uint64_t seed = k->p.rng.seed, off = k->p.rng.offset;
        double a = k->p.rng.a, b = k->p.rng.b;
        for (int64_t i = 0; i < n; i++) {
            uint32_t r[4];
            em_philox4x32_10(off + (uint64_t)i, seed, r);
            double v;
            if (k->kind == EM_OP_RAND_UNIFORM) {
                v = a + (b - a) * em_philox_u01(r[0]);
            } else if (k->kind == EM_OP_RAND_NORMAL) {
                double u1 = em_philox_u01_open0(r[0]), u2 = em_philox_u01(r[1]);
                v = a + b * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
            } else {
                v = em_philox_u01(r[0]) < a ? 1.0 : 0.0;
            }
            store_elem(o->dtype, Y, i, v);
        }
        break;
    }
    default: em_cpu_bad_kind("fill", k->kind);
    }
}
