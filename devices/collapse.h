/* Dimension collapsing for strided N-d iteration, shared by every backend:
 * devices/cpu/iter.h (em_iter_init), devices/cuda/emcuda.h (make_geom) and
 * devices/opencl/opencl.c (em_ocl_collapse). Plain C that also compiles as
 * C++ (nvcc host code): no designated initialisers, no compound literals, no
 * C-only headers. */
#ifndef EMBER_DEVICES_COLLAPSE_H
#define EMBER_DEVICES_COLLAPSE_H

#include "devices/kargs.h"

#include <stdint.h>
#include <string.h>

/* Collapses the common shape shape[0..ndim) of nops operands (strides[k] of
 * operand k, in elements): drops size-1 dims and merges a dim into its outer
 * neighbour when the pair is contiguous in every operand (outer stride ==
 * inner stride * inner size). Writes the collapsed shape to
 * oshape[0..EM_KARGS_MAX_DIMS) and the strides to ost[0..nops)[0..
 * EM_KARGS_MAX_DIMS), both zero beyond the collapsed rank, and returns that
 * rank. When every dim has size 1 (or ndim == 0) the result is one dim of
 * size 1 and stride 0, rank 1. A dim of size 0 is kept (the caller checks
 * for empty tensors). ost needs only nops rows. */
static inline int em_collapse_dims(int ndim, const int64_t *shape, int nops, const int64_t *const *strides,
                                   int64_t *oshape, int64_t ost[][EM_KARGS_MAX_DIMS])
{
    int nd = 0;
    for (int k = 0; k < nops; k++) memset(ost[k], 0, sizeof ost[k]);
    memset(oshape, 0, sizeof(int64_t) * EM_KARGS_MAX_DIMS);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (nd > 0) {
            int merge = 1;
            for (int k = 0; k < nops; k++)
                if (ost[k][nd - 1] != strides[k][d] * shape[d]) merge = 0;
            if (merge) {
                oshape[nd - 1] *= shape[d];
                for (int k = 0; k < nops; k++) ost[k][nd - 1] = strides[k][d];
                continue;
            }
        }
        oshape[nd] = shape[d];
        for (int k = 0; k < nops; k++) ost[k][nd] = strides[k][d];
        nd++;
    }
    if (nd == 0) {
        oshape[0] = 1;
        nd = 1;
    }
    return nd;
}

#endif
