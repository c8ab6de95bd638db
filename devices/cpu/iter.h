/* Strided N-d iteration for CPU kernels: walks "rows" of the innermost dim
 * for up to 4 operands of one shape, after merging dims that are contiguous
 * in every operand (so contiguous tensors become a single long row). */
#ifndef EMBER_CPU_ITER_H
#define EMBER_CPU_ITER_H

#include "devices/collapse.h"
#include "devices/kargs.h"

#include <stdbool.h>
#include <string.h>

#define EM_ITER_MAX_OPS 4

typedef struct em_iter {
    int ndim, nops;
    int64_t shape[EM_KARGS_MAX_DIMS];
    int64_t st[EM_ITER_MAX_OPS][EM_KARGS_MAX_DIMS];
    int64_t base[EM_ITER_MAX_OPS];
    int64_t idx[EM_KARGS_MAX_DIMS];
    int64_t off[EM_ITER_MAX_OPS]; /* current row start, per operand */
    int64_t inner;                /* row length */
    int64_t inner_st[EM_ITER_MAX_OPS];
    bool done;
} em_iter;

/* shape: the common shape; strides[k]/offsets[k] per operand. */
static inline void em_iter_init(em_iter *it, int ndim, const int64_t *shape, int nops, const int64_t *const *strides,
                                const int64_t *offsets)
{
    memset(it, 0, sizeof *it);
    it->nops = nops;
    int64_t total = 1;
    for (int d = 0; d < ndim; d++) total *= shape[d];
    for (int k = 0; k < nops; k++) it->base[k] = it->off[k] = offsets[k];
    if (total == 0) {
        it->done = true;
        return;
    }
    /* drop size-1 dims, merge contiguous neighbours (devices/collapse.h) */
    int nd = em_collapse_dims(ndim, shape, nops, strides, it->shape, it->st);
    it->ndim = nd;
    it->inner = it->shape[nd - 1];
    for (int k = 0; k < nops; k++) it->inner_st[k] = it->st[k][nd - 1];
}

/* Advances to the next row; returns false when finished. Call after
 * processing the current row (the first row is ready after init). */
static inline bool em_iter_next(em_iter *it)
{
    for (int d = it->ndim - 2; d >= 0; d--) {
        if (++it->idx[d] < it->shape[d]) {
            for (int k = 0; k < it->nops; k++) it->off[k] += it->st[k][d];
            return true;
        }
        for (int k = 0; k < it->nops; k++) it->off[k] -= it->st[k][d] * (it->shape[d] - 1);
        it->idx[d] = 0;
    }
    it->done = true;
    return false;
}

#define EM_ITER_FOREACH_ROW(it) for (; !(it)->done; em_iter_next(it))

#endif
