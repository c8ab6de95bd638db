/* CSV dataset: numeric columns, one integer label column, optional header. */
#define _GNU_SOURCE
#include "runtime/runtime_internal.h"
#include "ember/data.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

em_csv_options em_csv_options_default(void)
{
    em_csv_options o;
    o.label_column = -1;
    o.has_header = false;
    o.delimiter = ',';
    return o;
}

typedef struct csv_ds {
    em_dataset base;
    int64_t n;
    float *x;   /* [n, nf] */
    int64_t *y; /* [n] */
} csv_ds;

static int64_t csv_length(const em_dataset *ds) { return ((const csv_ds *)ds)->n; }

static em_status csv_get(const em_dataset *ds, int64_t i, float *x, int64_t *y)
{
    const csv_ds *c = (const csv_ds *)ds;
    memcpy(x, c->x + i * ds->num_features, (size_t)ds->num_features * sizeof(float));
    *y = c->y[i];
    return EM_OK;
}

static void csv_free(em_dataset *ds)
{
    csv_ds *c = (csv_ds *)ds;
    free(c->x);
    free(c->y);
    free(c);
}

static const em_dataset_vtable csv_vt = {csv_length, csv_get, csv_free};

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = 0;
    if (e - s >= 2 && s[0] == '"' && e[-1] == '"') {
        e[-1] = 0;
        s++;
    }
    return s;
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
    return true;
}

/* Splits line in place at delim; returns the number of cells (cells[] gets
 * up to max of them, the count goes on past max). */
static int64_t split(char *line, char delim, char **cells, int64_t max)
{
    int64_t n = 0;
    char *p = line;
    for (;;) {
        char *d = strchr(p, delim);
        if (d) *d = 0;
        if (n < max) cells[n] = trim(p);
        n++;
        if (!d) break;
        p = d + 1;
    }
    return n;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

em_dataset *em_csv_open(const char *path, const em_csv_options *opt)
{
    if (!path) return em__fail(EM_ERR_INVALID, "em_csv_open: path is NULL");
    em_csv_options o = opt ? *opt : em_csv_options_default();
    if (o.delimiter == 0 || o.delimiter == '\n' || o.delimiter == '\r' || o.delimiter == '"')
        return em__fail(EM_ERR_INVALID, "em_csv_open: bad delimiter 0x%02x", (unsigned char)o.delimiter);
    FILE *f = fopen(path, "r");
    if (!f) return em__fail(EM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));

    char *line = NULL;
    size_t linecap = 0;
    char **cells = NULL;
    float *xs = NULL;
    int64_t *ys = NULL;
    size_t xcap = 0, ycap = 0;
    int64_t ncols = -1, first_line = 0, label_col = -1, n = 0, lineno = 0, maxy = -1;
    bool neg = false, header_pending = o.has_header;
    em_status st = EM_OK;
    ssize_t len;
    errno = 0;
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            st = em__set_error(EM_ERR_FORMAT, "%s:%lld: NUL byte in line (not a text CSV file?)", path,
                               (long long)lineno);
            goto done;
        }
        if (blank(line)) continue;
        if (header_pending) {
            header_pending = false;
            continue;
        }
        if (ncols < 0) {
            /* first data row fixes the number of columns */
            char *copy = strdup(line);
            if (!copy) {
                st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            ncols = split(copy, o.delimiter, NULL, 0);
            free(copy);
            if (ncols < 2) {
                st = em__set_error(EM_ERR_FORMAT, "%s:%lld: %lld column(s): need at least one feature and a label",
                                   path, (long long)lineno, (long long)ncols);
                goto done;
            }
            label_col = o.label_column < 0 ? ncols + o.label_column : o.label_column;
            if (label_col < 0 || label_col >= ncols) {
                st = em__set_error(EM_ERR_FORMAT, "%s:%lld: label column %d outside the %lld columns", path,
                                   (long long)lineno, o.label_column, (long long)ncols);
                goto done;
            }
            first_line = lineno;
            cells = malloc((size_t)ncols * sizeof *cells);
            if (!cells) {
                st = em__set_error(EM_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
        }
        int64_t got = split(line, o.delimiter, cells, ncols);
        if (got != ncols) {
            st = em__set_error(EM_ERR_FORMAT, "%s:%lld: %lld cells, expected %lld (as on line %lld)", path,
                               (long long)lineno, (long long)got, (long long)ncols, (long long)first_line);
            goto done;
        }
        if (grow((void **)&xs, &xcap, (size_t)((n + 1) * (ncols - 1)), sizeof(float)) ||
            grow((void **)&ys, &ycap, (size_t)(n + 1), sizeof(int64_t))) {
            st = em__set_error(EM_ERR_NOMEM, "%s:%lld: out of memory", path, (long long)lineno);
            goto done;
        }
        float *row = xs + n * (ncols - 1);
        for (int64_t c = 0; c < ncols; c++) {
            char *end = NULL;
            errno = 0;
            double v = strtod(cells[c], &end);
            if (cells[c][0] == 0 || *end != 0) {
                st = em__set_error(EM_ERR_FORMAT, "%s:%lld: column %lld: '%.40s' is not a number", path,
                                   (long long)lineno, (long long)c + 1, cells[c]);
                goto done;
            }
            if (c == label_col) {
                if (!(v == floor(v)) || fabs(v) > 9.0e15) {
                    st = em__set_error(EM_ERR_FORMAT, "%s:%lld: column %lld: label '%.40s' is not an integer", path,
                                       (long long)lineno, (long long)c + 1, cells[c]);
                    goto done;
                }
                int64_t lab = (int64_t)v;
                ys[n] = lab;
                if (lab < 0) neg = true;
                if (lab > maxy) maxy = lab;
            } else {
                *row++ = (float)v;
            }
        }
        n++;
        errno = 0;
    }
    if (ferror(f)) {
        st = em__set_error(EM_ERR_IO, "%s: read error: %s", path, strerror(errno ? errno : EIO));
        goto done;
    }
    if (n == 0) {
        st = em__set_error(EM_ERR_FORMAT, "%s: no data rows", path);
        goto done;
    }
done:
    free(line);
    free(cells);
    fclose(f);
    if (st != EM_OK) {
        free(xs);
        free(ys);
        return NULL;
    }
    csv_ds *c = calloc(1, sizeof *c);
    if (!c) {
        free(xs);
        free(ys);
        return em__fail(EM_ERR_NOMEM, "%s: out of memory", path);
    }
    int64_t fshape[1] = {ncols - 1};
    em_dataset_init(&c->base, &csv_vt, fshape, 1, neg ? 0 : maxy + 1);
    c->n = n;
    c->x = xs;
    c->y = ys;
    return &c->base;
}
