/* Reverse-mode autodiff: the tape.
 *
 * When an op whose kind is differentiable sees an input that requires grad,
 * the funnel calls record(): the output gets a node holding the op kind, its
 * params, references to its (user-facing) inputs and, for rules that need it,
 * an alias of the output. Nodes are owned by their output tensor, so a graph
 * lives exactly as long as the tensors that can reach it. em_backward walks
 * the nodes in reverse creation order (a valid reverse topological order) and
 * applies each kind's rule (autodiff/rules.c), built from ordinary ops, under
 * no-grad. */
#include "autodiff/autodiff.h"

#include <stdlib.h>
#include <string.h>

static uint64_t g_seq; /* grad mode (em_no_grad_begin) lives in runtime/grad_mode.c */

bool em_requires_grad(const em_tensor *t) { return t && t->requires_grad; }
bool em_is_leaf(const em_tensor *t) { return t && !t->node; }

em_status em_set_requires_grad(em_tensor *t, bool rg)
{
    if (!t) return em__set_error(EM_ERR_INVALID, "em_set_requires_grad: tensor is NULL");
    if (t->node)
        return em__set_error(EM_ERR_STATE, "em_set_requires_grad: only leaf tensors can change requires_grad (use em_detach first)");
    if (rg && !em_dtype_is_float(t->dtype))
        return em__set_error(EM_ERR_DTYPE, "em_set_requires_grad: only float tensors can require gradients, got %s",
                             em_dtype_name(t->dtype));
    t->requires_grad = rg;
    return EM_OK;
}

em_tensor *em_detach(const em_tensor *t)
{
    if (!t) return em__fail(EM_ERR_INVALID, "em_detach: tensor is NULL");
    em_tensor *v = em__tensor_view(t, t->shape, t->strides, t->ndim, t->offset);
    return v ? em__publish(v) : NULL;
}

static em_node *node_new(enum em_op_kind kind, int n_in)
{
    bool fault = EM_FAULT(EM_FAULT_ALLOC);
    if (EM_FAULT(EM_FAULT_NODE)) fault = true; /* both counters see every node */
    em_node *n = fault ? NULL : calloc(1, sizeof *n);
    if (!n) return em__fail(EM_ERR_NOMEM, "op %s: out of memory recording its autodiff node (the gradient could not be tracked)",
                            em__optab[kind].name);
    n->in = calloc((size_t)(n_in ? n_in : 1), sizeof *n->in);
    if (!n->in) {
        free(n);
        return em__fail(EM_ERR_NOMEM, "op %s: out of memory recording its autodiff node (the gradient could not be tracked)",
                        em__optab[kind].name);
    }
    n->refcount = 1;
    n->kind = kind;
    n->n_in = n_in;
    n->seq = __atomic_add_fetch(&g_seq, 1, __ATOMIC_RELAXED);
    return n;
}

/* Drops what the node holds (inputs, saved output); the node itself stays
 * while its output tensor refers to it. */
static void node_clear(em_node *n)
{
    for (int i = 0; i < n->n_in; i++) {
        em_tensor_release(n->in[i]);
        n->in[i] = NULL;
    }
    em_tensor_release(n->out_alias);
    n->out_alias = NULL;
    em_tensor_release(n->aux);
    n->aux = NULL;
    n->cleared = true;
}

static void node_release(em_node *n)
{
    if (!n || __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    node_clear(n);
    free(n->in);
    free(n);
}

static bool needs_output(enum em_op_kind k) { return (em__optab[k].flags & F_SAVE_OUT) != 0; }

/* Takes over n (released on failure). */
static em_status attach(em_node *n, em_tensor *out)
{
    n->out_ndim = out->ndim;
    memcpy(n->out_shape, out->shape, sizeof out->shape);
    n->out_dtype = out->dtype;
    if (needs_output(n->kind)) {
        n->out_alias = em__tensor_view(out, out->shape, out->strides, out->ndim, out->offset);
        if (!n->out_alias) {
            const char *op = em__optab[n->kind].name;
            node_release(n);
            return em__set_error(EM_ERR_NOMEM, "op %s: out of memory saving its output for the backward pass", op);
        }
    }
    out->node = n;
    out->requires_grad = true;
    return EM_OK;
}

static em_status record(const em_op *op)
{
    if (!em_grad_enabled()) return EM_OK;
    bool any = false;
    for (int i = 0; i < op->n_in; i++) {
        const em_tensor *t = op->orig_in[i] ? op->orig_in[i] : op->in[i];
        if (t && t->requires_grad) any = true;
    }
    if (!any || op->n_out < 1 || !op->out[0]) return EM_OK;
    em_tensor *out = op->out[0];
    if (out->node) return EM_OK; /* already recorded (should not happen) */
    em_node *n = node_new(op->kind, op->n_in);
    if (!n) return em_last_status();
    n->p = op->p;
    for (int i = 0; i < op->n_in; i++)
        n->in[i] = em_tensor_retain((em_tensor *)(op->orig_in[i] ? op->orig_in[i] : op->in[i]));
    if ((em__optab[op->kind].flags & F_SAVE_AUX) && op->n_out > 1 && op->out[1]) n->aux = em_tensor_retain(op->out[1]);
    return attach(n, out);
}

static em_status record_cat(em_tensor *out, em_tensor *const *ins, int n_in, int dim)
{
    if (!em_grad_enabled() || !out) return EM_OK;
    bool any = false;
    for (int i = 0; i < n_in; i++)
        if (ins[i] && ins[i]->requires_grad) any = true;
    if (!any) return EM_OK;
    em_node *n = node_new(EM_OP_VIEW_CAT, n_in);
    if (!n) return em_last_status();
    n->p.axis.dim = dim;
    for (int i = 0; i < n_in; i++) n->in[i] = em_tensor_retain(ins[i]);
    return attach(n, out);
}

/* Autodiff plugs into the layers below at load time: the funnel's recorder
 * and cat's (tasks/), the node release of a freed tensor (runtime/). */
__attribute__((constructor)) static void register_hook(void)
{
    em__autodiff_record = record;
    em__autodiff_record_cat = record_cat;
    em__autodiff_check = em__backward_check_table;
    em__runtime_set_node_release(node_release);
}

/* ---- gradient container: open-addressing map from key pointer to tensor ---- */

struct em_grads {
    const void **keys;
    em_tensor **vals;
    int cap, n;
    void *const *fence; /* em__grads_set_fence: where the owner keeps the fence handle (borrowed) */
};

void em__grads_set_fence(em_grads *g, void *const *fence)
{
    if (g) g->fence = fence;
}

void *em__grads_fence(const em_grads *g) { return g && g->fence ? *g->fence : NULL; }

static em_grads *grads_new(int cap)
{
    em_grads *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->cap = 16;
    while (g->cap < cap * 2) g->cap *= 2;
    g->keys = calloc((size_t)g->cap, sizeof *g->keys);
    g->vals = calloc((size_t)g->cap, sizeof *g->vals);
    if (!g->keys || !g->vals) {
        free(g->keys);
        free(g->vals);
        free(g);
        return NULL;
    }
    return g;
}

static int slot(const em_grads *g, const void *key)
{
    uintptr_t h = (uintptr_t)key;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    int i = (int)(h & (uintptr_t)(g->cap - 1));
    while (g->keys[i] && g->keys[i] != key) i = (i + 1) & (g->cap - 1);
    return i;
}

static em_status grads_grow(em_grads *g)
{
    em_grads *bigger = grads_new(g->cap);
    if (!bigger) return em__set_error(EM_ERR_NOMEM, "out of memory");
    for (int i = 0; i < g->cap; i++)
        if (g->keys[i]) {
            int j = slot(bigger, g->keys[i]);
            bigger->keys[j] = g->keys[i];
            bigger->vals[j] = g->vals[i];
            bigger->n++;
        }
    free(g->keys);
    free(g->vals);
    bigger->fence = g->fence;
    *g = *bigger;
    free(bigger);
    return EM_OK;
}

/* Stores (taking over the caller's reference) or accumulates; the reference
 * is dropped on failure too. */
static em_status grads_accumulate(em_grads *g, const void *key, em_tensor *grad)
{
    if ((g->n + 1) * 2 > g->cap && grads_grow(g) != EM_OK) {
        em_tensor_release(grad);
        return EM_ERR_NOMEM;
    }
    int i = slot(g, key);
    if (!g->keys[i]) {
        g->keys[i] = key;
        g->vals[i] = grad;
        g->n++;
        return EM_OK;
    }
    em_tensor *sum = em_add(g->vals[i], grad);
    if (!sum) {
        em_tensor_release(grad);
        return em_last_status();
    }
    em__scope_remove(sum);
    em_tensor_release(g->vals[i]);
    em_tensor_release(grad);
    g->vals[i] = sum;
    return EM_OK;
}

static em_tensor *grads_take(em_grads *g, const void *key)
{
    int i = slot(g, key);
    if (!g->keys[i]) return NULL;
    return g->vals[i];
}

em_tensor *em_grad(const em_grads *g, const em_tensor *t)
{
    if (!g || !t) return NULL;
    int i = slot(g, t);
    return g->keys[i] ? g->vals[i] : NULL;
}

em_grads *em_grads_new(void)
{
    em_grads *g = grads_new(8);
    if (!g) em__set_error(EM_ERR_NOMEM, "em_grads_new: out of memory");
    return g;
}

em_status em_grads_set(em_grads *g, const em_tensor *t, em_tensor *grad)
{
    if (!g || !t || !grad) return em__set_error(EM_ERR_INVALID, "em_grads_set: NULL argument");
    if ((g->n + 1) * 2 > g->cap && grads_grow(g) != EM_OK) return EM_ERR_NOMEM;
    int i = slot(g, t);
    em_tensor_retain(grad);
    if (g->keys[i]) {
        em_tensor_release(g->vals[i]);
    } else {
        g->keys[i] = t;
        g->n++;
    }
    g->vals[i] = grad;
    return EM_OK;
}

int em_grads_count(const em_grads *g) { return g ? g->n : 0; }

void em_grads_free(em_grads *g)
{
    if (!g) return;
    for (int i = 0; i < g->cap; i++)
        if (g->keys[i]) em_tensor_release(g->vals[i]);
    free(g->keys);
    free(g->vals);
    free(g);
}

/* ---- backward ---------------------------------------------------------------- */

static int cmp_seq_desc(const void *a, const void *b)
{
    const em_node *x = *(em_node *const *)a, *y = *(em_node *const *)b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

/* Collects every node reachable from root through inputs that require grad. */
static em_status collect(em_node *root, em_node ***out, int *count)
{
    int cap = 64, n = 0, top = 0;
    em_node **nodes = malloc(sizeof *nodes * (size_t)cap);
    em_node **stack = malloc(sizeof *stack * (size_t)cap);
    int scap = cap;
    em_grads *seen = grads_new(64);
    if (!nodes || !stack || !seen) goto oom;
    stack[top++] = root;
    seen->keys[slot(seen, root)] = root, seen->n++;
    while (top) {
        em_node *nd = stack[--top];
        if (n == cap) {
            cap *= 2;
            em_node **p = realloc(nodes, sizeof *p * (size_t)cap);
            if (!p) goto oom;
            nodes = p;
        }
        nodes[n++] = nd;
        for (int i = 0; i < nd->n_in; i++) {
            em_tensor *t = nd->in[i];
            if (!t || !t->requires_grad || !t->node) continue;
            if ((seen->n + 1) * 2 > seen->cap && grads_grow(seen) != EM_OK) goto oom;
            int s = slot(seen, t->node);
            if (seen->keys[s]) continue;
            seen->keys[s] = t->node;
            seen->n++;
            if (top == scap) {
                scap *= 2;
                em_node **p = realloc(stack, sizeof *p * (size_t)scap);
                if (!p) goto oom;
                stack = p;
            }
            stack[top++] = t->node;
        }
    }
    free(stack);
    free(seen->keys);
    free(seen->vals);
    free(seen);
    qsort(nodes, (size_t)n, sizeof *nodes, cmp_seq_desc);
    *out = nodes;
    *count = n;
    return EM_OK;
oom:
    free(nodes);
    free(stack);
    if (seen) {
        free(seen->keys);
        free(seen->vals);
        free(seen);
    }
    return em__set_error(EM_ERR_NOMEM, "em_backward: out of memory");
}

static em_grads *backward(em_tensor *loss, const em_tensor *grad_output)
{
    if (!loss) return em__fail(EM_ERR_INVALID, "em_backward: loss is NULL");
    if (!loss->requires_grad)
        return em__fail(EM_ERR_STATE, "em_backward: the loss does not require a gradient (no input of it requires grad, or "
                                      "it was computed under no-grad)");
    if (loss->node && loss->node->cleared)
        return em__fail(EM_ERR_STATE, "em_backward: the graph of this loss was already freed by an earlier em_backward");
    if (grad_output && (grad_output->ndim != loss->ndim ||
                        memcmp(grad_output->shape, loss->shape, sizeof(int64_t) * (size_t)loss->ndim))) {
        char a[160], b[160];
        return em__fail(EM_ERR_SHAPE, "em_backward: grad_output shape %s does not match the loss shape %s",
                        em_shape_str(grad_output->shape, grad_output->ndim, a, sizeof a),
                        em_shape_str(loss->shape, loss->ndim, b, sizeof b));
    }
    em_grads *leaf = grads_new(64);
    if (!leaf) return em__fail(EM_ERR_NOMEM, "out of memory");
    em_no_grad_begin();
    em__autocast_suspend(); /* each backward op runs in its forward op's dtype (as PyTorch) */
    em_scope_begin();
    em_tensor *seed;
    if (grad_output) {
        seed = em_tensor_retain((em_tensor *)grad_output);
    } else {
        seed = em_ones_like(loss);
        if (!seed) goto fail;
        em__scope_remove(seed); /* ours now */
    }
    if (!loss->node) { /* a leaf loss: its gradient is the seed */
        if (grads_accumulate(leaf, loss, seed) != EM_OK) goto fail;
        goto done;
    }
    em_node **nodes = NULL;
    int count = 0;
    if (collect(loss->node, &nodes, &count) != EM_OK) {
        em_tensor_release(seed);
        goto fail;
    }
    em_grads *inner = grads_new(count);
    if (!inner) {
        free(nodes);
        em_tensor_release(seed);
        em__set_error(EM_ERR_NOMEM, "em_backward: out of memory");
        goto fail;
    }
    em_status st = grads_accumulate(inner, loss->node, seed);
    for (int k = 0; k < count && st == EM_OK; k++) {
        em_node *nd = nodes[k];
        em_tensor *g = grads_take(inner, nd);
        if (!g) continue;
        em_tensor *gin[nd->n_in ? nd->n_in : 1];
        memset(gin, 0, sizeof(em_tensor *) * (size_t)(nd->n_in ? nd->n_in : 1));
        em_scope_begin();
        st = em__backward_rule(nd, g, gin);
        for (int i = 0; i < nd->n_in && st == EM_OK; i++) {
            em_tensor *x = nd->in[i];
            if (!gin[i] || !x || !x->requires_grad) continue;
            em_tensor *gi = gin[i];
            if (gi->dtype != x->dtype) gi = em_cast(gi, x->dtype);
            if (!gi) {
                st = em_last_status();
                break;
            }
            /* one reference for the map; the rule's scope drops its own at the end */
            em_tensor_retain(gi);
            st = grads_accumulate(x->node ? inner : leaf, x->node ? (const void *)x->node : (const void *)x, gi);
        }
        em_scope_end();
    }
    /* free the graph's saved tensors (retain_graph = False) */
    /* Clearing a node can drop the last reference to a tensor whose own node
     * is later in the list: hold every node while clearing. */
    for (int k = 0; k < count; k++) __atomic_add_fetch(&nodes[k]->refcount, 1, __ATOMIC_RELAXED);
    for (int k = 0; k < count; k++) node_clear(nodes[k]);
    for (int k = 0; k < count; k++) node_release(nodes[k]);
    free(nodes);
    em_grads_free(inner);
    if (st != EM_OK) goto fail;
done:
    /* leaf gradients are handed out contiguous (optimizers and users expect it) */
    for (int i = 0; i < leaf->cap; i++)
        if (leaf->keys[i] && !em_tensor_is_contiguous(leaf->vals[i])) {
            em_tensor *c = em_contiguous(leaf->vals[i]);
            if (!c) goto fail; /* no gradient handed out half-made */
            em__scope_remove(c);
            em_tensor_release(leaf->vals[i]);
            leaf->vals[i] = c;
        }
    em_scope_end();
    em__autocast_resume();
    em_no_grad_end();
    return leaf;
fail:
    em_scope_end();
    em__autocast_resume();
    em_no_grad_end();
    em_grads_free(leaf);
    return NULL;
}

em_grads *em_backward(em_tensor *loss) { return backward(loss, NULL); }
em_grads *em_backward_with(em_tensor *loss, const em_tensor *grad_output)
{
    if (!grad_output) return em__fail(EM_ERR_INVALID, "em_backward_with: grad_output is NULL");
    return backward(loss, grad_output);
}
