/* Autocast (include/ember/amp.h): the per-thread region stack and the one
 * helper every front end asks, em__autocast_dtype, which reads the F_AC_LOW /
 * F_AC_F32 column of tasks/ops.def. */
#include "tasks/tasks_internal.h"
#include "ember/amp.h"

/* The calling thread's regions: stack[0..depth) (EM_F32 = a region with
 * autocast off); suspended > 0 inside em_backward (autodiff/tape.c). */
static _Thread_local struct {
    int depth;
    int suspended;
    em_dtype stack[EM_AUTOCAST_MAX_DEPTH];
} g_ac;

em_status em_autocast_begin(em_dtype dt)
{
    if (dt != EM_BF16 && dt != EM_F16 && dt != EM_F32)
        return em__set_error(EM_ERR_DTYPE, "em_autocast_begin: dtype %s (%d) is not an autocast dtype (bfloat16, float16, or "
                             "float32 for a region with autocast off)", em_dtype_name(dt), (int)dt);
    if (g_ac.depth >= EM_AUTOCAST_MAX_DEPTH)
        return em__set_error(EM_ERR_STATE, "em_autocast_begin: %d autocast regions are already open on this thread (the most)",
                             g_ac.depth);
    g_ac.stack[g_ac.depth++] = dt;
    return EM_OK;
}

em_status em_autocast_end(void)
{
    if (g_ac.depth <= 0) return em__set_error(EM_ERR_STATE, "em_autocast_end: no autocast region is open on this thread");
    g_ac.depth--;
    return EM_OK;
}

em_dtype em_autocast_dtype(void)
{
    if (g_ac.depth == 0 || g_ac.suspended > 0) return EM_F32;
    return g_ac.stack[g_ac.depth - 1];
}

void em__autocast_suspend(void) { g_ac.suspended++; }
void em__autocast_resume(void)
{
    if (g_ac.suspended > 0) g_ac.suspended--;
}

/* float32, float16 and bfloat16: what autocast casts (torch's is_eligible:
 * floating point and not float64). */
static bool eligible(em_dtype dt) { return dt == EM_F32 || dt == EM_F16 || dt == EM_BF16; }

em_dtype em__autocast_dtype(enum em_op_kind k, em_dtype natural)
{
    em_dtype low = em_autocast_dtype();
    if (low == EM_F32 || !eligible(natural) || (unsigned)k >= EM_OP_COUNT) return natural;
    unsigned fl = em__optab[k].flags;
    if (fl & F_AC_LOW) return low;
    if (fl & F_AC_F32) return EM_F32;
    return natural;
}

int em__autocast_inputs(enum em_op_kind k, const em_tensor *const *ins, int n, em_tensor **cast)
{
    if (em_autocast_dtype() == EM_F32) return 0; /* the common case: one thread-local read */
    bool any = false;
    em_dtype natural = EM_BOOL;
    for (int i = 0; i < n; i++)
        if (ins[i]) {
            natural = any ? em__promote(natural, ins[i]->dtype) : ins[i]->dtype;
            any = true;
        }
    if (!any) return 0;
    em_dtype want = em__autocast_dtype(k, natural);
    bool need = false;
    for (int i = 0; i < n; i++)
        if (ins[i] && eligible(ins[i]->dtype) && ins[i]->dtype != want) need = true;
    if (!need || !eligible(want)) return 0;
    for (int i = 0; i < n; i++) cast[i] = NULL;
    for (int i = 0; i < n; i++) {
        if (!ins[i]) continue;
        if (!eligible(ins[i]->dtype) || ins[i]->dtype == want) {
            cast[i] = em_tensor_retain((em_tensor *)ins[i]);
            continue;
        }
        em_scope_begin();
        em_tensor *c = em_cast(ins[i], want); /* recorded: the gradient goes back through it */
        if (c) em_tensor_retain(c);
        em_scope_end();
        if (!c) {
            for (int j = 0; j < i; j++) em_tensor_release(cast[j]);
            return -1;
        }
        cast[i] = c;
    }
    return 1;
}
