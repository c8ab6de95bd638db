/* Shared by the nn/ sources: internals (errors) and small helpers. */
#ifndef EMBER_NN_INTERNAL_H
#define EMBER_NN_INTERNAL_H

#include "ember/nn.h"
#include "tasks/tasks_internal.h"

/* Formats t's shape into a stack buffer (for error messages). */
#define NN_SHAPE(t, buf) em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), buf, sizeof buf)

/* Scope helper for functions built from several ops: open a scope, compute,
 * then NN_RETURN(r) keeps r for the caller (moved to the enclosing scope, or
 * caller-owned outside any scope) and closes the scope. */
static inline em_tensor *nn_return(em_tensor *r)
{
    if (r) em_keep(r);
    em_scope_end();
    return r;
}

/* The vtable a module was made with (nn/module.c). */
const em_module_vtable *em__module_vtable(const em_module *m);

#endif
