#include "fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fx_load(const char *fname, fx_block **out)
{
    const char *dir = getenv("EMBER_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/fixtures", fname);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open fixture file %s (set EMBER_TEST_DATA)", path);
    int n = 0, cap = 0;
    fx_block *bs = NULL, *b = NULL;
    static char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || !line[0]) continue;
        if (!strncmp(line, "config ", 7)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                bs = realloc(bs, sizeof *bs * (size_t)cap);
                assert_non_null(bs);
            }
            b = &bs[n++];
            memset(b, 0, sizeof *b);
            snprintf(b->config, sizeof b->config, "%.63s", line + 7);
        } else if (!b) {
            fail_msg("fixture %s: data before 'config'", path);
        } else if (!strncmp(line, "dtype ", 6)) {
            snprintf(b->dtype, sizeof b->dtype, "%.15s", line + 6);
        } else if (!strcmp(line, "end")) {
            b = NULL;
        } else if (!strstr(line, " : ")) {
            snprintf(b->head, sizeof b->head, "%.511s", line);
        } else {
            if (b->nt >= FX_MAX_T) fail_msg("fixture %s: too many tensors", b->config);
            fx_tensor *t = &b->t[b->nt++];
            char *save = NULL, *tok = strtok_r(line, " ", &save);
            snprintf(t->name, sizeof t->name, "%s", tok);
            t->ndim = atoi(strtok_r(NULL, " ", &save));
            t->n = 1;
            for (int i = 0; i < t->ndim; i++) t->n *= (t->shape[i] = atoll(strtok_r(NULL, " ", &save)));
            tok = strtok_r(NULL, " ", &save);
            if (!tok || strcmp(tok, ":")) fail_msg("fixture %s: tensor %s: expected ':'", b->config, t->name);
            t->v = malloc(sizeof(double) * (size_t)(t->n ? t->n : 1));
            for (int64_t i = 0; i < t->n; i++) {
                tok = strtok_r(NULL, " ", &save);
                if (!tok) fail_msg("fixture %s: tensor %s: %lld values expected", b->config, t->name, (long long)t->n);
                t->v[i] = strtod(tok, NULL);
            }
        }
    }
    fclose(f);
    *out = bs;
    return n;
}

void fx_free(fx_block *bs, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < bs[i].nt; j++) free(bs[i].t[j].v);
    free(bs);
}

const fx_tensor *fx_find(const fx_block *b, const char *name)
{
    for (int i = 0; i < b->nt; i++)
        if (!strcmp(b->t[i].name, name)) return &b->t[i];
    return NULL;
}

const fx_tensor *fx_get(const fx_block *b, const char *name)
{
    const fx_tensor *t = fx_find(b, name);
    if (!t) fail_msg("fixture %s has no tensor '%s'", b->config, name);
    return t;
}

void fx_op(const fx_block *b, char *out, size_t n)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", b->head);
    char *save = NULL;
    strtok_r(buf, " ", &save);
    char *op = strtok_r(NULL, " ", &save);
    snprintf(out, n, "%s", op ? op : "");
}

const char *fx_kw_str(const fx_block *b, const char *key, char *val, size_t n)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", b->head);
    char *save = NULL;
    strtok_r(buf, " ", &save);  /* kind */
    strtok_r(NULL, " ", &save); /* name */
    for (char *tok = strtok_r(NULL, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *v = strtok_r(NULL, " ", &save);
        if (!v) break;
        if (!strcmp(tok, key)) {
            snprintf(val, n, "%s", v);
            return val;
        }
    }
    return NULL;
}

double fx_kw(const fx_block *b, const char *key, double def)
{
    char v[256];
    return fx_kw_str(b, key, v, sizeof v) ? strtod(v, NULL) : def;
}

em_tensor *fx_new(const fx_tensor *t, em_dtype dt)
{
    em_tensor *f = em_from_host(t->v, t->shape, t->ndim, EM_F64);
    assert_non_null(f);
    if (dt == EM_F64) return f;
    em_tensor *c = em_cast(f, dt);
    em_tensor_release(f);
    assert_non_null(c);
    return c;
}

double fx_check_close(const em_tensor *t, const fx_tensor *want, double rtol, double stol, const char *what)
{
    if (!t) fail_msg("%s is NULL: %s", what, em_last_error());
    char s1[160], s2[160];
    if (em_tensor_ndim(t) != want->ndim || memcmp(em_tensor_shape(t), want->shape, sizeof(int64_t) * (size_t)want->ndim))
        fail_msg("%s has shape %s, PyTorch %s", what, em_shape_str(em_tensor_shape(t), em_tensor_ndim(t), s1, sizeof s1),
                 em_shape_str(want->shape, want->ndim, s2, sizeof s2));
    double *v = em_test_values(t), amax = 0, emax = 0;
    for (int64_t i = 0; i < want->n; i++) amax = fmax(amax, fabs(want->v[i]));
    for (int64_t i = 0; i < want->n; i++) {
        double e = fabs(v[i] - want->v[i]);
        emax = fmax(emax, e);
        if (!(e <= rtol * fabs(want->v[i]) + stol * amax)) {
            double got = v[i];
            free(v);
            fail_msg("%s[%lld] = %.9g, PyTorch %.9g (max |want| %.3g)", what, (long long)i, got, want->v[i], amax);
        }
    }
    free(v);
    return amax > 0 ? emax / amax : emax;
}

em_tensor *fx_leaf(const fx_block *b, const char *name, bool grad)
{
    em_tensor *t = fx_new(fx_get(b, name), EM_F32);
    if (grad) assert_int_equal(em_set_requires_grad(t, true), EM_OK);
    return t;
}

em_tensor *fx_mask(const fx_block *b, const char *name, const char *kind)
{
    if (!strcmp(kind, "none")) return NULL;
    em_tensor *m = fx_new(fx_get(b, name), EM_F32);
    return !strcmp(kind, "bool") ? em_ne_scalar(m, 0.0) : m;
}
