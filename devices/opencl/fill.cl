/* Creation kernels (semantics of devices/cpu/fill.c). The output is written
 * as numel contiguous elements from element offset ye (strides are ignored,
 * as on the CPU: creation ops always get a fresh contiguous tensor).
 *
 * fill_pattern(y, yboff, ye, long n, int es, ulong pattern)
 *     every element = the low es bytes of pattern (the host converts the
 *     fill value to the dtype exactly as the CPU's store_elem);
 * eye(y, yboff, ye, long n, long cols, int es, ulong one)
 *     element i = one when i / cols == i % cols, else 0;
 * arange(y, yboff, ye, long n, int dt, double start, double step, double end, int linspace)
 * rand(y, yboff, ye, long n, int dt, int op, ulong seed, ulong offset, double a, double b)
 *     Philox4x32-10 exactly as devices/philox.h: element i uses counter
 *     offset + i under key seed; uniform a + (b - a) * u, normal
 *     a + b * sqrt(-2 log u1) cos(2 pi u2) (Box-Muller), bernoulli u < a.
 *     The arithmetic is in double, FP_CONTRACT off, so uniform and bernoulli
 *     are bit-identical to the CPU; normal differs only where OpenCL's log/cos
 *     (<= 3-4 ulp in double) round differently, invisible after a cast to f32.
 * arange and rand exist only with fp64 (the host falls back otherwise).
 * f16 / bf16: the value rounded to float, then to 16 bits (devices/half.h),
 * as the CPU's store_elem; fill and eye get that pattern from the host. */

inline void em_store_pat(__global uchar *Y, long i, int es, ulong pat)
{
    if (es == 4) ((__global uint *)Y)[i] = (uint)pat;
    else if (es == 8) ((__global ulong *)Y)[i] = pat;
    else if (es == 2) ((__global ushort *)Y)[i] = (ushort)pat;
    else Y[i] = (uchar)pat;
}

__kernel void em_fill_pattern(__global uchar *yb, long yboff, long ye, long n, int es, ulong pat)
{
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(i, n) em_store_pat(Y, ye + i, es, pat);
}

__kernel void em_eye(__global uchar *yb, long yboff, long ye, long n, long cols, int es, ulong one)
{
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(i, n) em_store_pat(Y, ye + i, es, (i / cols == i % cols) ? one : 0);
}

/* em_philox4x32_10: common.cl (shared with attention.cl's dropout) */

#ifdef EM_FP64
/* As the CPU's store_elem. */
inline void em_store_d(int dt, __global uchar *Y, long i, double v)
{
    switch (dt) {
    case EM_DT_F32: ((__global float *)Y)[i] = (float)v; break;
    case EM_DT_F64: ((__global double *)Y)[i] = v; break;
    case EM_DT_I32: ((__global int *)Y)[i] = (int)v; break;
    case EM_DT_I64: ((__global long *)Y)[i] = (long)v; break;
    case EM_DT_U8: Y[i] = (uchar)(long)v; break;
    case EM_DT_F16:
    case EM_DT_BF16: ((__global ushort *)Y)[i] = em_half_st(dt, (float)v); break;
    default: Y[i] = v != 0; break;
    }
}

inline double em_u01(uint x) { return (double)(x >> 8) * (1.0 / 16777216.0); }
inline double em_u01_open0(uint x) { return ((double)(x >> 8) + 1.0) * (1.0 / 16777216.0); }

__kernel void em_arange(__global uchar *yb, long yboff, long ye, long n, int dt, double start, double step, double end,
                        int linspace)
{
    __global uchar *Y = yb + yboff;
    const long hn = n / 2;
    EM_GRID_LOOP(i, n)
    {
        const double v = (linspace && n > 1 && i >= hn) ? end - step * (double)(n - 1 - i) : start + step * (double)i;
        em_store_d(dt, Y, ye + i, v);
    }
}

__kernel void em_rand(__global uchar *yb, long yboff, long ye, long n, int dt, int op, ulong seed, ulong offset, double a,
                      double b)
{
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(i, n)
    {
        uint r[4];
        em_philox4x32_10(offset + (ulong)i, seed, r);
        double v;
        if (op == EM_OP_RAND_UNIFORM) {
            v = a + (b - a) * em_u01(r[0]);
        } else if (op == EM_OP_RAND_NORMAL) {
            const double u1 = em_u01_open0(r[0]), u2 = em_u01(r[1]);
            v = a + b * sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
        } else {
            v = em_u01(r[0]) < a ? 1.0 : 0.0;
        }
        em_store_d(dt, Y, ye + i, v);
    }
}
#endif
