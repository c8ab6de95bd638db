/* Autodiff internals (autodiff/): the node recorded per differentiable op,
 * the rules, the gradient container's fence. Used by autodiff/ and the
 * layers above it (optim/, dist/); tasks/ and runtime/ never include it. */
#ifndef EMBER_AUTODIFF_INTERNAL_H
#define EMBER_AUTODIFF_INTERNAL_H

#include "tasks/tasks_internal.h"

typedef struct em_node {
    int refcount;            /* owned by the output tensor */
    enum em_op_kind kind;
    union em_op_params p;
    int n_in;
    em_tensor **in;          /* user-facing inputs (retained) */
    em_tensor *out_alias;    /* output saved for rules that need it (shares storage) */
    em_tensor *aux;          /* F_SAVE_AUX: the op's out[1] (retained), e.g. max_pool2d's indices */
    int out_ndim;
    int64_t out_shape[EM_MAX_DIMS];
    em_dtype out_dtype;
    uint64_t seq;            /* creation order */
    bool cleared;            /* saved tensors freed after backward */
} em_node;

/** Applies the backward rule of n->kind: given the output gradient g, sets
 *  gin[i] (a tensor of in[i]'s shape, owned by the current scope or g itself)
 *  for the inputs that require grad. Runs under no-grad. */
em_status em__backward_rule(em_node *n, em_tensor *g, em_tensor **gin);

/** Checks that every F_DIFF kind of tasks/ops.def has a backward function
 *  and no other kind has one (em_init runs it through em__autodiff_check). */
em_status em__backward_check_table(void);

/** Sums g over the broadcast dims so it gets @p shape (scoped result). */
em_tensor *em__sum_to(em_tensor *g, const int64_t *shape, int ndim);

/* The fence after which a gradient container's values are the whole
 * backward's (set by the gradient all-reduce; the optimizer waits for it
 * through em_op.after). The container keeps where its owner keeps the
 * handle, not the handle: once the owner frees the fence (dist shutdown sets
 * it to NULL), em__grads_fence returns NULL and the optimizer steps
 * without it. The slot itself must outlive the container's use. */
EM_TEST_API void em__grads_set_fence(em_grads *g, void *const *fence);
EM_TEST_API void *em__grads_fence(const em_grads *g);

#endif
