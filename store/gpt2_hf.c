/* Loading a Hugging Face GPT-2 SafeTensors file into em_gpt2_new's model,
 * whatever prefix convention the file uses (issue #16, part: attention
 * modules). See em_gpt2_load_hf_safetensors in include/ember/store.h. */
#include "ember/nn.h"
#include "ember/store.h"
#include "runtime/runtime_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_PREFIX "transformer."

typedef struct hf_keys {
    int n, cap;
    char **k;
    em_tensor **t;
    em_status st;
} hf_keys;

static void hf_collect(const char *key, em_tensor *t, void *ud)
{
    hf_keys *l = ud;
    if (l->st != EM_OK) return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **k = realloc(l->k, sizeof *k * (size_t)cap);
        if (k) l->k = k;
        em_tensor **tt = k ? realloc(l->t, sizeof *tt * (size_t)cap) : NULL;
        if (tt) l->t = tt;
        if (!k || !tt) {
            l->st = em__set_error(EM_ERR_NOMEM, "em_gpt2_load_hf_safetensors: out of memory");
            return;
        }
        l->cap = cap;
    }
    l->k[l->n] = strdup(key);
    if (!l->k[l->n]) {
        l->st = em__set_error(EM_ERR_NOMEM, "em_gpt2_load_hf_safetensors: out of memory");
        return;
    }
    l->t[l->n++] = t;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

em_status em_gpt2_load_hf_safetensors(em_module *m, const char *path)
{
    static const char *fn = "em_gpt2_load_hf_safetensors";
    if (!m || strcmp(em_module_type_name(m), "GPT2LMHeadModel"))
        return em__set_error(EM_ERR_INVALID, "%s: module is %s, not a GPT2LMHeadModel (em_gpt2_new)", fn, m ? em_module_type_name(m) : "NULL");
    if (!path) return em__set_error(EM_ERR_INVALID, "%s: path is NULL", fn);
    em_st_file *f = em_safetensors_open(path);
    if (!f) return em_last_status();
    hf_keys l = {0, 0, NULL, NULL, EM_OK};
    em_status st = em_module_visit_params(m, hf_collect, &l);
    if (st == EM_OK) st = l.st;
    const char **names = st == EM_OK ? calloc((size_t)l.n + 1, sizeof *names) : NULL;
    if (st == EM_OK && !names) st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", fn);
    /* each parameter under its own key, or without the "transformer." prefix (HF's
     * base-model files, e.g. the hub's gpt2/model.safetensors) */
    for (int i = 0; st == EM_OK && i < l.n; i++) {
        const char *k = l.k[i];
        const char *bare = strncmp(k, HF_PREFIX, strlen(HF_PREFIX)) ? NULL : k + strlen(HF_PREFIX);
        if (em_safetensors_find(f, k))
            names[i] = k;
        else if (bare && em_safetensors_find(f, bare))
            names[i] = bare;
        else
            st = em__set_error(EM_ERR_FORMAT, "%s: %s: missing key '%s'%s%s%s", fn, path, k, bare ? " (or '" : "", bare ? bare : "",
                               bare ? "')" : "");
    }
    /* every other tensor of the file must be one HF writes that is no parameter here */
    for (size_t j = 0; st == EM_OK && j < em_safetensors_count(f); j++) {
        const em_st_tensor *e = em_safetensors_at(f, j);
        bool used = false;
        for (int i = 0; i < l.n && !used; i++) used = !strcmp(names[i], e->name);
        if (used) continue;
        if (!strcmp(e->name, "lm_head.weight")) {
            /* tied to wte: the model's one tensor is loaded from wte; the shape must agree */
            em_tensor *wte = em_module_get_param(m, HF_PREFIX "wte.weight");
            if (e->ndim != 2 || e->shape[0] != em_tensor_dim(wte, 0) || e->shape[1] != em_tensor_dim(wte, 1)) {
                char a[160], b[160];
                st = em__set_error(EM_ERR_SHAPE, "%s: %s: key 'lm_head.weight': shape %s in file, tied wte %s in model", fn, path,
                                   em_shape_str(e->shape, e->ndim, a, sizeof a),
                                   em_shape_str(em_tensor_shape(wte), em_tensor_ndim(wte), b, sizeof b));
            }
            continue;
        }
        if (ends_with(e->name, ".attn.bias") || ends_with(e->name, ".attn.masked_bias")) continue; /* HF's causal-mask buffers */
        st = em__set_error(EM_ERR_FORMAT, "%s: %s: unexpected key '%s' (not a GPT-2 parameter)", fn, path, e->name);
    }
    if (st == EM_OK) st = em_safetensors_load_from(f, names, l.t, (size_t)l.n, false);
    for (int i = 0; i < l.n; i++) free(l.k[i]);
    free(l.k);
    free(l.t);
    free(names);
    em_safetensors_close(f);
    return st;
}
