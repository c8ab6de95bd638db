/* The ONNX backend node tests as Ember's conformance suite (issue #19).
 *
 *   onnx_node_runner [--device cpu|cuda[:N]|opencl[:N]] [--filter SUBSTR]
 *                    [--min-pass N] [--results FILE] [--exceptions FILE] DIR
 *
 * DIR holds one folder per test, as scripts/onnx_node_tests.py writes them
 * (model.onnx, tolerance.txt, test_data_set_N/{input,output}_K.pb). Each test
 * is loaded with em_onnx_load, run on the device under no-grad for every
 * data set, and its outputs compared with the expected ones:
 * |got - want| <= atol + rtol * |want| with onnx's own rtol / atol for the
 * case (tolerance.txt; onnx's defaults are 1e-3 and 1e-7), NaN equal to NaN,
 * integers and booleans exactly, shapes and Ember dtypes exactly.
 * --exceptions FILE lists cases that need other tolerances, one per line:
 * "test_name rtol atol  # reason" (tests/onnx_tolerance_exceptions.txt; each
 * applied exception is printed).
 *
 * A test is
 *   PASS         every output of every data set matches;
 *   UNSUPPORTED  the model uses an operator, attribute value, element type or
 *                value kind (sequence, optional) Ember does not implement
 *                (EM_ERR_UNSUPPORTED at load or run);
 *   FAIL         anything else: a wrong value, shape or dtype, or an error.
 * One line per test ("PASS test_abs", "FAIL test_x: reason"), then the
 * totals. Exit status: 0, or 1 when fewer than --min-pass tests pass (CI's
 * guard against regressions), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/ember.h"
#include "ember/onnx.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

typedef enum { R_PASS, R_FAIL, R_UNSUP } result;

/* Compares got with want; writes the reason into msg on a mismatch. */
static bool compare(const em_tensor *got, const em_tensor *want, double rtol, double atol, char *msg, size_t n)
{
    char a[128], b[128];
    if (em_tensor_ndim(got) != em_tensor_ndim(want) ||
        memcmp(em_tensor_shape(got), em_tensor_shape(want), sizeof(int64_t) * (size_t)em_tensor_ndim(got))) {
        snprintf(msg, n, "shape %s, expected %s", em_shape_str(em_tensor_shape(got), em_tensor_ndim(got), a, sizeof a),
                 em_shape_str(em_tensor_shape(want), em_tensor_ndim(want), b, sizeof b));
        return false;
    }
    if (em_tensor_dtype(got) != em_tensor_dtype(want)) {
        snprintf(msg, n, "dtype %s, expected %s", em_dtype_name(em_tensor_dtype(got)), em_dtype_name(em_tensor_dtype(want)));
        return false;
    }
    int64_t ne = em_tensor_numel(got);
    if (ne == 0) return true;
    bool is_float = em_dtype_is_float(em_tensor_dtype(want));
    bool ok = true;
    em_scope_begin();
    if (is_float) {
        double *g = malloc(sizeof(double) * (size_t)ne), *w = malloc(sizeof(double) * (size_t)ne);
        if (!g || !w || em_to_host(em_cast(got, EM_F64), g, sizeof(double) * (size_t)ne) != EM_OK ||
            em_to_host(em_cast(want, EM_F64), w, sizeof(double) * (size_t)ne) != EM_OK) {
            snprintf(msg, n, "reading the values: %s", em_last_error());
            ok = false;
        } else {
            int64_t bad = 0, first = -1;
            double worst = 0;
            for (int64_t i = 0; i < ne; i++) {
                bool same;
                if (isnan(w[i]) || isnan(g[i])) same = isnan(w[i]) && isnan(g[i]);
                else if (isinf(w[i]) || isinf(g[i])) same = g[i] == w[i];
                else same = fabs(g[i] - w[i]) <= atol + rtol * fabs(w[i]);
                if (!same) {
                    if (first < 0) first = i;
                    bad++;
                    double d = fabs(g[i] - w[i]);
                    if (d > worst || isnan(d)) worst = d;
                }
            }
            if (bad) {
                snprintf(msg, n, "%lld of %lld values differ (first at %lld: %.9g, expected %.9g; max |diff| %.3g; rtol %g atol %g)",
                         (long long)bad, (long long)ne, (long long)first, g[first], w[first], worst, rtol, atol);
                ok = false;
            }
        }
        free(g);
        free(w);
    } else {
        int64_t *g = malloc(sizeof(int64_t) * (size_t)ne), *w = malloc(sizeof(int64_t) * (size_t)ne);
        if (!g || !w || em_to_host(em_cast(got, EM_I64), g, sizeof(int64_t) * (size_t)ne) != EM_OK ||
            em_to_host(em_cast(want, EM_I64), w, sizeof(int64_t) * (size_t)ne) != EM_OK) {
            snprintf(msg, n, "reading the values: %s", em_last_error());
            ok = false;
        } else {
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < ne; i++)
                if (g[i] != w[i]) {
                    if (first < 0) first = i;
                    bad++;
                }
            if (bad) {
                snprintf(msg, n, "%lld of %lld values differ (first at %lld: %lld, expected %lld)", (long long)bad, (long long)ne,
                         (long long)first, (long long)g[first], (long long)w[first]);
                ok = false;
            }
        }
        free(g);
        free(w);
    }
    em_scope_end();
    return ok;
}

static void one_line(char *s)
{
    for (char *p = s; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
}

/* --exceptions: per-test tolerances */
typedef struct tol_exception {
    char name[256];
    double rtol, atol;
} tol_exception;
static tol_exception *g_exc;
static int g_nexc;

static int read_exceptions(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "onnx_node_runner: %s: cannot open\n", path);
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        tol_exception e;
        char extra[8];
        int k = sscanf(line, "%255s %lf %lf %7s", e.name, &e.rtol, &e.atol, extra);
        if (k <= 0) continue;
        if (k != 3) {
            fprintf(stderr, "onnx_node_runner: %s: bad line (want: test_name rtol atol # reason): %s", path, line);
            fclose(f);
            return -1;
        }
        g_exc = realloc(g_exc, sizeof *g_exc * (size_t)(g_nexc + 1));
        g_exc[g_nexc++] = e;
    }
    fclose(f);
    return 0;
}

static result run_test(const char *dir, char *msg, size_t n)
{
    char path[8192];
    double rtol = 1e-3, atol = 1e-7;
    snprintf(path, sizeof path, "%s/tolerance.txt", dir);
    FILE *tf = fopen(path, "r");
    if (tf) {
        if (fscanf(tf, "%lf %lf", &rtol, &atol) != 2) rtol = 1e-3, atol = 1e-7;
        fclose(tf);
    }
    const char *base = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    for (int i = 0; i < g_nexc; i++)
        if (!strcmp(g_exc[i].name, base)) {
            printf("tolerance exception %s: rtol %g atol %g (onnx's: rtol %g atol %g)\n", base, g_exc[i].rtol, g_exc[i].atol,
                   rtol, atol);
            rtol = g_exc[i].rtol;
            atol = g_exc[i].atol;
        }
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    const char *err = NULL;
    em_onnx_model *m = em_onnx_load(path, &err);
    if (!m) {
        snprintf(msg, n, "load: %s", err ? err : "?");
        return em_last_status() == EM_ERR_UNSUPPORTED ? R_UNSUP : R_FAIL;
    }
    result r = R_PASS;
    int nin = em_onnx_num_inputs(m), nout = em_onnx_num_outputs(m);
    int sets = 0;
    for (int s = 0; r == R_PASS; s++) {
        char sd[6144];
        snprintf(sd, sizeof sd, "%s/test_data_set_%d", dir, s);
        if (!exists(sd)) break;
        sets++;
        for (int k = 0; k < 64; k++) {
            snprintf(path, sizeof path, "%s/input_%d.unsupported", sd, k);
            char p2[8192];
            snprintf(p2, sizeof p2, "%s/output_%d.unsupported", sd, k);
            if (exists(path) || exists(p2)) {
                snprintf(msg, n, "a non-tensor input or output (sequence, optional or map)");
                r = R_UNSUP;
                break;
            }
        }
        if (r != R_PASS) break;
        em_tensor *in[64] = {0}, *want[64] = {0}, *got[64] = {0};
        int nwant = 0;
        if (nin > 64 || nout > 64) {
            snprintf(msg, n, "more than 64 inputs or outputs");
            r = R_FAIL;
            break;
        }
        em_scope_begin();
        for (int k = 0; k < nin && r == R_PASS; k++) {
            snprintf(path, sizeof path, "%s/input_%d.pb", sd, k);
            if (!exists(path)) {
                in[k] = NULL; /* an optional input left out */
                continue;
            }
            in[k] = em_onnx_read_tensor(path, NULL);
            if (!in[k]) {
                snprintf(msg, n, "input_%d.pb: %s", k, em_last_error());
                r = em_last_status() == EM_ERR_UNSUPPORTED ? R_UNSUP : R_FAIL;
            }
        }
        for (int k = 0; k < 64 && r == R_PASS; k++) {
            snprintf(path, sizeof path, "%s/output_%d.pb", sd, k);
            if (!exists(path)) break;
            want[k] = em_onnx_read_tensor(path, NULL);
            if (!want[k]) {
                snprintf(msg, n, "output_%d.pb: %s", k, em_last_error());
                r = em_last_status() == EM_ERR_UNSUPPORTED ? R_UNSUP : R_FAIL;
            }
            nwant = k + 1;
        }
        if (r == R_PASS && nwant > nout) {
            snprintf(msg, n, "%d expected outputs, the model has %d", nwant, nout);
            r = R_FAIL;
        }
        if (r == R_PASS) {
            em_no_grad_begin();
            em_status st = em_onnx_run(m, in, nin, got, nwant);
            em_no_grad_end();
            if (st != EM_OK) {
                snprintf(msg, n, "run: %s", em_last_error());
                r = st == EM_ERR_UNSUPPORTED ? R_UNSUP : R_FAIL;
            } else {
                for (int k = 0; k < nwant && r == R_PASS; k++) {
                    char why[1024];
                    if (!compare(got[k], want[k], rtol, atol, why, sizeof why)) {
                        snprintf(msg, n, "set %d output %d (%s): %s", s, k, em_onnx_output_name(m, k), why);
                        r = R_FAIL;
                    }
                }
            }
        }
        for (int k = 0; k < nout && k < 64; k++) em_tensor_release(got[k]);
        em_scope_end();
    }
    if (r == R_PASS && sets == 0) {
        snprintf(msg, n, "no test data set");
        r = R_FAIL;
    }
    em_onnx_free(m);
    one_line(msg);
    return r;
}

int main(int argc, char **argv)
{
    const char *dev = "cpu", *filter = NULL, *results = NULL, *dir = NULL;
    long min_pass = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--min-pass") && i + 1 < argc) min_pass = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--results") && i + 1 < argc) results = argv[++i];
        else if (!strcmp(argv[i], "--exceptions") && i + 1 < argc) {
            if (read_exceptions(argv[++i]) != 0) return 2;
        }
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else {
            fprintf(stderr, "usage: onnx_node_runner [--device D] [--filter S] [--min-pass N] [--results FILE] [--exceptions FILE] DIR\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: onnx_node_runner [--device D] [--filter S] [--min-pass N] [--results FILE] [--exceptions FILE] DIR\n");
        return 2;
    }
    em_device d;
    if (em_device_parse(dev, &d) != EM_OK) {
        fprintf(stderr, "onnx_node_runner: %s\n", em_last_error());
        return 2;
    }
    em_config cfg = em_config_default();
    if (em_init(&cfg) != EM_OK || em_set_device(d) != EM_OK) {
        fprintf(stderr, "onnx_node_runner: %s\n", em_last_error());
        return 1;
    }
    DIR *dp = opendir(dir);
    if (!dp) {
        fprintf(stderr, "onnx_node_runner: %s: cannot open\n", dir);
        return 2;
    }
    char **names = NULL;
    size_t nn = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strncmp(e->d_name, "test_", 5)) continue;
        if (filter && !strstr(e->d_name, filter)) continue;
        if (nn == cap) {
            cap = cap ? cap * 2 : 256;
            names = realloc(names, cap * sizeof *names);
        }
        names[nn++] = strdup(e->d_name);
    }
    closedir(dp);
    qsort(names, nn, sizeof *names, cmp_str);
    FILE *rf = results ? fopen(results, "w") : NULL;
    long np = 0, nf = 0, nu = 0;
    for (size_t i = 0; i < nn; i++) {
        char td[4096], msg[2048] = "";
        snprintf(td, sizeof td, "%s/%s", dir, names[i]);
        em_clear_error();
        result r = run_test(td, msg, sizeof msg);
        const char *tag = r == R_PASS ? "PASS" : r == R_FAIL ? "FAIL" : "UNSUPPORTED";
        if (r == R_PASS) np++;
        else if (r == R_FAIL) nf++;
        else nu++;
        if (r == R_PASS) printf("%s %s\n", tag, names[i]);
        else printf("%s %s: %s\n", tag, names[i], msg);
        if (rf) {
            if (r == R_PASS) fprintf(rf, "%s %s\n", tag, names[i]);
            else fprintf(rf, "%s %s: %s\n", tag, names[i], msg);
        }
        fflush(stdout);
        free(names[i]);
    }
    free(names);
    if (rf) fclose(rf);
    long total = np + nf + nu;
    printf("onnx node tests on %s: %ld passed, %ld failed, %ld unsupported, of %ld (%.1f %% pass)\n", dev, np, nf, nu, total,
           total ? 100.0 * (double)np / (double)total : 0.0);
    em_shutdown();
    if (min_pass >= 0 && np < min_pass) {
        fprintf(stderr, "onnx_node_runner: %ld tests passed, fewer than the recorded %ld\n", np, min_pass);
        return 1;
    }
    return 0;
}
