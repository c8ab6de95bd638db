/* The module tree: named parameters, buffers and children, visitors with
 * PyTorch dotted keys, train/eval, freeze, forward, free. */
#include "nn/nn_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct named_tensor {
    char *name;
    em_tensor *t;
} named_tensor;

typedef struct named_child {
    char *name;
    em_module *m;
} named_child;

struct em_module {
    const em_module_vtable *vt;
    void *impl;
    bool training;
    named_tensor *params;
    int nparams, cap_params;
    named_tensor *buffers;
    int nbuffers, cap_buffers;
    named_child *children;
    int nchildren, cap_children;
};

#define KEY_MAX 1024

em_module *em_module_new(const em_module_vtable *vt, void *impl)
{
    if (!vt) return em__fail(EM_ERR_INVALID, "em_module_new: vtable is NULL");
    em_module *m = calloc(1, sizeof *m);
    if (!m) return em__fail(EM_ERR_NOMEM, "em_module_new: out of memory");
    m->vt = vt;
    m->impl = impl;
    m->training = true;
    return m;
}

void em_module_free(em_module *m)
{
    if (!m) return;
    for (int i = 0; i < m->nparams; i++) {
        em_tensor_release(m->params[i].t);
        free(m->params[i].name);
    }
    for (int i = 0; i < m->nbuffers; i++) {
        em_tensor_release(m->buffers[i].t);
        free(m->buffers[i].name);
    }
    for (int i = 0; i < m->nchildren; i++) {
        em_module_free(m->children[i].m);
        free(m->children[i].name);
    }
    free(m->params);
    free(m->buffers);
    free(m->children);
    if (m->vt->free_impl) m->vt->free_impl(m->impl);
    free(m);
}

const em_module_vtable *em__module_vtable(const em_module *m) { return m ? m->vt : NULL; }
void *em_module_impl(const em_module *m) { return m ? m->impl : NULL; }
const char *em_module_type_name(const em_module *m) { return m && m->vt->type_name ? m->vt->type_name : "Module"; }

/* Checks a local name: non-empty, no '.', not already used in m. */
static em_status check_name(const em_module *m, const char *name, const char *fn)
{
    if (!m) return em__set_error(EM_ERR_INVALID, "%s: module is NULL", fn);
    if (!name || !*name) return em__set_error(EM_ERR_INVALID, "%s: name is NULL or empty", fn);
    if (strchr(name, '.')) return em__set_error(EM_ERR_INVALID, "%s: name '%s' must not contain '.'", fn, name);
    if (strlen(name) >= KEY_MAX / 4) return em__set_error(EM_ERR_INVALID, "%s: name '%.40s...' is too long", fn, name);
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name))
            return em__set_error(EM_ERR_INVALID, "%s: '%s' is already a parameter of this %s", fn, name, em_module_type_name(m));
    for (int i = 0; i < m->nbuffers; i++)
        if (!strcmp(m->buffers[i].name, name))
            return em__set_error(EM_ERR_INVALID, "%s: '%s' is already a buffer of this %s", fn, name, em_module_type_name(m));
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i].name, name))
            return em__set_error(EM_ERR_INVALID, "%s: '%s' is already a child of this %s", fn, name, em_module_type_name(m));
    return EM_OK;
}

static bool grow(void **arr, int *cap, int n, size_t elem)
{
    if (n < *cap) return true;
    int nc = *cap ? *cap * 2 : 4;
    void *p = realloc(*arr, elem * (size_t)nc);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

static em_status add_tensor(em_module *m, named_tensor **arr, int *n, int *cap, const char *name, em_tensor *t, bool param,
                            const char *fn)
{
    em_status st = check_name(m, name, fn);
    if (st != EM_OK) return st;
    if (!t) return em__set_error(EM_ERR_INVALID, "%s: tensor for '%s' is NULL", fn, name);
    if (param) {
        if (!em_dtype_is_float(em_tensor_dtype(t)))
            return em__set_error(EM_ERR_DTYPE, "%s: parameter '%s' must be a float tensor, got %s", fn, name,
                                 em_dtype_name(em_tensor_dtype(t)));
        st = em_set_requires_grad(t, true);
        if (st != EM_OK) return st;
    }
    char *nm = strdup(name);
    if (!nm || !grow((void **)arr, cap, *n, sizeof **arr)) {
        free(nm);
        return em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn);
    }
    (*arr)[*n].name = nm;
    (*arr)[*n].t = em_tensor_retain(t);
    (*n)++;
    return EM_OK;
}

em_status em_module_add_param(em_module *m, const char *name, em_tensor *param)
{
    if (!m) return em__set_error(EM_ERR_INVALID, "em_module_add_param: module is NULL");
    return add_tensor(m, &m->params, &m->nparams, &m->cap_params, name, param, true, "em_module_add_param");
}

em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *buf)
{
    if (!m) return em__set_error(EM_ERR_INVALID, "em_module_add_buffer: module is NULL");
    return add_tensor(m, &m->buffers, &m->nbuffers, &m->cap_buffers, name, buf, false, "em_module_add_buffer");
}

em_status em_module_add_child(em_module *m, const char *name, em_module *child)
{
    if (!child) {
        /* A failed constructor: keep its message when there is one. */
        if (em_last_status() != EM_OK) return em_last_status();
        return em__set_error(EM_ERR_INVALID, "em_module_add_child: child '%s' is NULL", name ? name : "(null)");
    }
    if (child == m) {
        return em__set_error(EM_ERR_INVALID, "em_module_add_child: a module cannot be its own child");
    }
    em_status st = check_name(m, name, "em_module_add_child");
    if (st != EM_OK) {
        em_module_free(child);
        return st;
    }
    char *nm = strdup(name);
    if (!nm || !grow((void **)&m->children, &m->cap_children, m->nchildren, sizeof *m->children)) {
        free(nm);
        em_module_free(child);
        return em__set_error(EM_ERR_NOMEM, "em_module_add_child: out of memory");
    }
    m->children[m->nchildren].name = nm;
    m->children[m->nchildren].m = child;
    m->nchildren++;
    child->training = m->training;
    return EM_OK;
}

int em_module_num_children(const em_module *m) { return m ? m->nchildren : 0; }

em_module *em_module_child_at(const em_module *m, int i, const char **name)
{
    if (!m || i < 0 || i >= m->nchildren) return em__fail(EM_ERR_INVALID, "em_module_child_at: index %d out of range", i);
    if (name) *name = m->children[i].name;
    return m->children[i].m;
}

static em_module *child_named(const em_module *m, const char *name, size_t len)
{
    for (int i = 0; i < m->nchildren; i++)
        if (strlen(m->children[i].name) == len && !strncmp(m->children[i].name, name, len)) return m->children[i].m;
    return NULL;
}

/* Walks "a.b.c": returns the module holding the last component and sets *leaf. */
static const em_module *walk(const em_module *m, const char *key, const char **leaf)
{
    const char *s = key;
    const char *dot;
    while ((dot = strchr(s, '.'))) {
        m = child_named(m, s, (size_t)(dot - s));
        if (!m) return NULL;
        s = dot + 1;
    }
    *leaf = s;
    return m;
}

em_tensor *em_module_get_param(const em_module *m, const char *key)
{
    if (!m || !key) return em__fail(EM_ERR_INVALID, "em_module_get_param: %s is NULL", !m ? "module" : "key");
    const char *leaf;
    const em_module *o = walk(m, key, &leaf);
    if (o)
        for (int i = 0; i < o->nparams; i++)
            if (!strcmp(o->params[i].name, leaf)) return o->params[i].t;
    return em__fail(EM_ERR_INVALID, "em_module_get_param: %s has no parameter '%s'", em_module_type_name(m), key);
}

em_tensor *em_module_get_buffer(const em_module *m, const char *key)
{
    if (!m || !key) return em__fail(EM_ERR_INVALID, "em_module_get_buffer: %s is NULL", !m ? "module" : "key");
    const char *leaf;
    const em_module *o = walk(m, key, &leaf);
    if (o)
        for (int i = 0; i < o->nbuffers; i++)
            if (!strcmp(o->buffers[i].name, leaf)) return o->buffers[i].t;
    return em__fail(EM_ERR_INVALID, "em_module_get_buffer: %s has no buffer '%s'", em_module_type_name(m), key);
}

em_module *em_module_get_child(const em_module *m, const char *key)
{
    if (!m || !key) return em__fail(EM_ERR_INVALID, "em_module_get_child: %s is NULL", !m ? "module" : "key");
    const char *leaf;
    const em_module *o = walk(m, key, &leaf);
    em_module *c = o ? child_named(o, leaf, strlen(leaf)) : NULL;
    if (!c) return em__fail(EM_ERR_INVALID, "em_module_get_child: %s has no child '%s'", em_module_type_name(m), key);
    return c;
}

/* Depth-first visit with a growing key prefix in buf[0..len). */
static em_status visit(const em_module *m, bool buffers, char *buf, size_t len, em_tensor_visitor cb, void *ud)
{
    const named_tensor *arr = buffers ? m->buffers : m->params;
    int n = buffers ? m->nbuffers : m->nparams;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(arr[i].name);
        if (len + l + 1 > KEY_MAX) return em__set_error(EM_ERR_INVALID, "module visit: key longer than %d characters", KEY_MAX);
        memcpy(buf + len, arr[i].name, l + 1);
        cb(buf, arr[i].t, ud);
    }
    for (int i = 0; i < m->nchildren; i++) {
        size_t l = strlen(m->children[i].name);
        if (len + l + 2 > KEY_MAX) return em__set_error(EM_ERR_INVALID, "module visit: key longer than %d characters", KEY_MAX);
        memcpy(buf + len, m->children[i].name, l);
        buf[len + l] = '.';
        buf[len + l + 1] = 0;
        em_status st = visit(m->children[i].m, buffers, buf, len + l + 1, cb, ud);
        if (st != EM_OK) return st;
    }
    buf[len] = 0;
    return EM_OK;
}

em_status em_module_visit_params(const em_module *m, em_tensor_visitor cb, void *ud)
{
    if (!m || !cb) return em__set_error(EM_ERR_INVALID, "em_module_visit_params: %s is NULL", !m ? "module" : "callback");
    char buf[KEY_MAX];
    buf[0] = 0;
    return visit(m, false, buf, 0, cb, ud);
}

em_status em_module_visit_buffers(const em_module *m, em_tensor_visitor cb, void *ud)
{
    if (!m || !cb) return em__set_error(EM_ERR_INVALID, "em_module_visit_buffers: %s is NULL", !m ? "module" : "callback");
    char buf[KEY_MAX];
    buf[0] = 0;
    return visit(m, true, buf, 0, cb, ud);
}

typedef struct collect_ud {
    em_tensor **out;
    int max, n;
    int64_t scalars;
} collect_ud;

static void collect_cb(const char *key, em_tensor *t, void *ud)
{
    (void)key;
    collect_ud *c = ud;
    if (c->out && c->n < c->max) c->out[c->n] = t;
    c->n++;
    c->scalars += em_tensor_numel(t);
}

int em_module_parameters(const em_module *m, em_tensor **out, int max)
{
    collect_ud c = {.out = out, .max = out ? max : 0};
    em_status st = em_module_visit_params(m, collect_cb, &c);
    return st != EM_OK ? st : c.n;
}

int em_module_num_param_tensors(const em_module *m) { return em_module_parameters(m, NULL, 0); }

int64_t em_module_num_params(const em_module *m)
{
    collect_ud c = {0};
    em_status st = em_module_visit_params(m, collect_cb, &c);
    return st != EM_OK ? st : c.scalars;
}

void em_module_train(em_module *m, bool training)
{
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) em_module_train(m->children[i].m, training);
}

bool em_module_is_training(const em_module *m) { return m ? m->training : false; }

typedef struct rg_ud {
    bool on;
    em_status st;
} rg_ud;

static void rg_cb(const char *key, em_tensor *t, void *ud)
{
    (void)key;
    rg_ud *r = ud;
    em_status st = em_set_requires_grad(t, r->on);
    if (st != EM_OK && r->st == EM_OK) r->st = st;
}

em_status em_module_freeze(em_module *m)
{
    rg_ud r = {false, EM_OK};
    em_status st = em_module_visit_params(m, rg_cb, &r);
    return st != EM_OK ? st : r.st;
}

em_status em_module_unfreeze(em_module *m)
{
    rg_ud r = {true, EM_OK};
    em_status st = em_module_visit_params(m, rg_cb, &r);
    return st != EM_OK ? st : r.st;
}

em_tensor *em_module_forward(em_module *m, const em_tensor *x)
{
    if (!m) return em__fail(EM_ERR_INVALID, "em_module_forward: module is NULL");
    if (!x) {
        if (em_last_status() != EM_OK) return NULL; /* keep the upstream message */
        return em__fail(EM_ERR_INVALID, "em_module_forward: input of %s is NULL", em_module_type_name(m));
    }
    if (!m->vt->forward) return em__fail(EM_ERR_UNSUPPORTED, "em_module_forward: %s has no forward", em_module_type_name(m));
    return m->vt->forward(m, x);
}
