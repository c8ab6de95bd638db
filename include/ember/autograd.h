/* Ember reverse-mode automatic differentiation.
 *
 * A tensor that requires gradients makes every op that uses it record a node
 * (op kind, inputs, saved tensors). em_backward(loss) walks the nodes in
 * reverse topological order and applies each kind's backward rule, which is
 * made of ordinary ops, so gradients run as tasks on the same devices.
 * Gradients accumulate when a tensor is used more than once. After backward
 * the graph's saved tensors are released (as PyTorch with retain_graph=False).
 */
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_grads em_grads;

/** Marks a leaf tensor as requiring gradients. Fails (EM_ERR_DTYPE) for
 *  non-float dtypes and (EM_ERR_STATE) for non-leaf tensors. */
EM_API em_status em_set_requires_grad(em_tensor *t, bool requires_grad);
EM_API bool em_requires_grad(const em_tensor *t);
/** true when t was created by the user (no recorded producer). */
EM_API bool em_is_leaf(const em_tensor *t);
/** A view sharing t's data, cut from the graph (new reference). */
EM_API em_tensor *em_detach(const em_tensor *t);

/** No-grad scope (nestable, per thread): ops inside record nothing. */
EM_API void em_no_grad_begin(void);
EM_API void em_no_grad_end(void);
EM_API bool em_grad_enabled(void);

/** Back-propagates from @p loss (must require grad; non-scalar losses use a
 *  gradient of ones, as loss.sum().backward()). Returns a container of the
 *  gradients of every tensor that required grad and contributed to loss;
 *  NULL on error (e.g. loss needs no gradient). Caller frees with em_grads_free. */
EM_API em_grads *em_backward(em_tensor *loss);
/** Same with an explicit output gradient of loss's shape. */
EM_API em_grads *em_backward_with(em_tensor *loss, const em_tensor *grad_output);
/** An empty gradient container (fill with em_grads_set; free with
 *  em_grads_free), e.g. for a data-parallel replica that got no samples in a
 *  step and contributes no gradient. NULL when out of memory. */
EM_API em_grads *em_grads_new(void);
/** Gradient of @p t (borrowed, valid until em_grads_free), or NULL when t got none. */
EM_API em_tensor *em_grad(const em_grads *g, const em_tensor *t);
/** Replaces (or sets) the gradient of @p t; the container takes a new reference. */
EM_API em_status em_grads_set(em_grads *g, const em_tensor *t, em_tensor *grad);
EM_API int em_grads_count(const em_grads *g);
EM_API void em_grads_free(em_grads *g);

#ifdef __cplusplus
}
#endif
#endif
