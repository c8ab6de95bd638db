/* Indexing kernels (semantics of devices/cpu/index.c; contracts in
 * tasks/index.c). Index operands are i64. An out-of-range index reads 0
 * (gather, index_select), is skipped (scatter, scatter_add) or gives an
 * all-zero row (one_hot); nothing is read or written out of bounds.
 *
 * gather(a, index, y, nd, shape, n, long dimn, long sd, int es)
 *     operand groups as in elementwise.cl; over y's (collapsed) shape with
 *     a's dim stride zeroed (and, for index_select, index strides 0 except
 *     along dim): y = a[... + v * sd] when 0 <= v < dimn;
 * scatter(index, src, y, nd, shape, n, long L, long isd, long ssd, long dimn,
 *         long ysd, int dt, int add)
 *     one work-item per index position with dim removed (shape = index
 *     shape with dim set to 1, y's dim stride zeroed); it walks the L
 *     positions along dim in order, so duplicate indices give exactly the
 *     CPU's result (last write wins; sums in the same order);
 * one_hot(index, y, nd, shape, n, long C, long sc)
 *     one work-item per index element, writes its C classes (i64). */

__kernel void em_gather(EM_OPND(a), EM_OPND(i), EM_OPND_W(y), int nd, long8 shape, long n, long dimn, long sd, int es)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, yst);
    EM_UNPACK(s1, ist);
    EM_UNPACK(s2, ast);
    __global const uchar *A = ab + aboff;
    __global const long *I = (__global const long *)(ib + iboff);
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(t, n)
    {
        EM_OFFS3(t, nd, sh, s0, ye, o0, s1, ie, o1, s2, ae, o2)
        const long v = I[o1];
        const int ok = v >= 0 && v < dimn;
        const long src = o2 + v * sd;
        if (es == 4) ((__global uint *)Y)[o0] = ok ? ((__global const uint *)A)[src] : 0;
        else if (es == 8) ((__global ulong *)Y)[o0] = ok ? ((__global const ulong *)A)[src] : 0;
        else Y[o0] = ok ? A[src] : 0;
    }
}

__kernel void em_scatter(EM_OPND(i), EM_OPND(s), EM_OPND_W(y), int nd, long8 shape, long n, long L, long isd, long ssd,
                         long dimn, long ysd, int dt, int add)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, ist);
    EM_UNPACK(s1, sst);
    EM_UNPACK(s2, yst);
    __global const long *I = (__global const long *)(ib + iboff);
    __global const uchar *S = sb + sboff;
    __global uchar *Y = yb + yboff;
    EM_GRID_LOOP(t, n)
    {
        EM_OFFS3(t, nd, sh, s0, ie, oi, s1, se, os, s2, ye, oy)
        for (long p = 0; p < L; p++) {
            const long v = I[oi + p * isd];
            if (v < 0 || v >= dimn) continue;
            const long dst = oy + v * ysd, src = os + p * ssd;
            switch (dt) {
            case EM_DT_F32:
                if (add) ((__global float *)Y)[dst] += ((__global const float *)S)[src];
                else ((__global float *)Y)[dst] = ((__global const float *)S)[src];
                break;
#ifdef EM_FP64
            case EM_DT_F64:
                if (add) ((__global double *)Y)[dst] += ((__global const double *)S)[src];
                else ((__global double *)Y)[dst] = ((__global const double *)S)[src];
                break;
#endif
            case EM_DT_I32:
                if (add) ((__global int *)Y)[dst] = (int)((uint)((__global int *)Y)[dst] + (uint)((__global const int *)S)[src]);
                else ((__global int *)Y)[dst] = ((__global const int *)S)[src];
                break;
            case EM_DT_I64:
                if (add) ((__global long *)Y)[dst] = (long)((ulong)((__global long *)Y)[dst] + (ulong)((__global const long *)S)[src]);
                else ((__global long *)Y)[dst] = ((__global const long *)S)[src];
                break;
            case EM_DT_BOOL:
                if (add) Y[dst] = (uchar)(Y[dst] || S[src]);
                else Y[dst] = S[src];
                break;
            default:
                if (add) Y[dst] = (uchar)(Y[dst] + S[src]);
                else Y[dst] = S[src];
                break;
            }
        }
    }
}

__kernel void em_one_hot(EM_OPND(i), EM_OPND_W(y), int nd, long8 shape, long n, long C, long sc)
{
    EM_UNPACK(sh, shape);
    EM_UNPACK(s0, ist);
    EM_UNPACK(s1, yst);
    __global const long *I = (__global const long *)(ib + iboff);
    __global long *Y = (__global long *)(yb + yboff);
    EM_GRID_LOOP(t, n)
    {
        EM_OFFS2(t, nd, sh, s0, ie, oi, s1, ye, oy)
        const long v = I[oi];
        for (long c = 0; c < C; c++) Y[oy + c * sc] = (v == c) ? 1 : 0;
    }
}
