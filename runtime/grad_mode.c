/* Grad mode (ember/autograd.h): a per-thread switch read by the op front
 * ends (tasks/) and the tape (autodiff/), so it lives below both. */
#include "ember/autograd.h" /* the EM_API declarations: exported */
#include "runtime/runtime_internal.h"

static _Thread_local int tl_no_grad;

void em_no_grad_begin(void) { tl_no_grad++; }
void em_no_grad_end(void)
{
    if (tl_no_grad > 0) tl_no_grad--;
}
bool em_grad_enabled(void) { return tl_no_grad == 0; }
