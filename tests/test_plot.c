/* Plots of metrics.csv (tools/plot.c, compiled into this test; cairo reads
 * the PNGs back): a synthetic run drawn where its values say, the SVG
 * well-formed with one <path class="curve"> per curve, several runs
 * overlaid one colour per run, and malformed metrics.csv files rejected with
 * a clear error and nothing written. Without cairo at build time: plotting
 * reports that it is unavailable and writes nothing. */
#include "testutil.h"
#include "tools/tools.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef EMBER_HAVE_CAIRO
#include <cairo.h>
#endif

static const char *HEADER = "epoch,train_loss,train_accuracy,val_loss,val_accuracy,val_top5,lr,samples_per_s,epoch_time_s\n";

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A run of @p n epochs: losses falling, accuracies rising (distinct train / val values). */
static void write_run(const char *path, int n, double shift)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(HEADER, f);
    for (int e = 1; e <= n; e++)
        fprintf(f, "%d,%.6f,%.6f,%.6f,%.6f,0.99,0.001,1000.0,1.0\n", e, 2.0 / e + shift, 0.5 + 0.04 * e - shift / 10, 1.5 / e + 0.3 + shift,
                0.45 + 0.03 * e - shift / 10);
    assert_int_equal(fclose(f), 0);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* Entries of @p dir other than . and .. */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static const char *subdir(const char *name)
{
    static char path[4][1024];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 1024, "%s/%s", em_test_tmp_dir(), name);
    mkdir(p, 0755);
    return p;
}

static const char *join(const char *dir, const char *name)
{
    static char path[8][1024];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 1024, "%s/%s", dir, name);
    return p;
}

/* A well-formedness check of the XML we write: a prolog, then balanced
 * elements with quoted attributes, one root <svg>, text without raw '<' or '&'
 * outside entities. Returns NULL or what is wrong. */
static const char *xml_check(const char *s)
{
    static char why[256];
    char stack[64][32];
    int depth = 0, roots = 0;
    if (strncmp(s, "<?xml ", 6)) return "no <?xml prolog";
    const char *p = strstr(s, "?>");
    if (!p) return "unterminated prolog";
    p += 2;
    while (*p) {
        if (*p != '<') {
            if (*p == '&') {
                const char *semi = strchr(p, ';');
                if (!semi || semi - p > 6) return "a raw '&' in text";
            }
            if (depth == 0 && !(*p == ' ' || *p == '\n')) return "text outside the root element";
            p++;
            continue;
        }
        if (p[1] == '/') { /* end tag */
            const char *q = p + 2;
            size_t len = strcspn(q, ">");
            if (!q[len] || depth == 0 || strlen(stack[depth - 1]) != len || strncmp(stack[depth - 1], q, len)) {
                snprintf(why, sizeof why, "mismatched end tag at offset %ld", (long)(p - s));
                return why;
            }
            depth--;
            p = q + len + 1;
            continue;
        }
        const char *q = p + 1;
        size_t nlen = strspn(q, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_:0123456789");
        if (nlen == 0 || nlen >= 32) return "bad element name";
        char name[32];
        memcpy(name, q, nlen);
        name[nlen] = 0;
        q += nlen;
        for (;;) { /* attributes */
            while (*q == ' ' || *q == '\n') q++;
            if (*q == '/' && q[1] == '>') {
                q += 2;
                break;
            }
            if (*q == '>') {
                q++;
                if (depth == 64) return "too deep";
                snprintf(stack[depth++], 32, "%s", name);
                break;
            }
            size_t alen = strspn(q, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_:0123456789");
            if (alen == 0 || q[alen] != '=' || q[alen + 1] != '"') {
                snprintf(why, sizeof why, "bad attribute in <%s> at offset %ld", name, (long)(q - s));
                return why;
            }
            const char *end = strchr(q + alen + 2, '"');
            if (!end) return "unterminated attribute";
            for (const char *c = q + alen + 2; c < end; c++)
                if (*c == '<') return "'<' in an attribute";
            q = end + 1;
        }
        if (depth == 1 && !strcmp(name, "svg")) roots++;
        else if (depth == 0 && strcmp(name, "svg")) return "an element outside <svg>";
        p = q;
    }
    if (depth != 0) return "unclosed elements";
    if (roots != 1) return "not exactly one <svg> root";
    return NULL;
}

/* The points of the SVG curve named @p name ("train", "validation", "run-b train", ...). */
static int svg_curve_points(const char *svg, const char *name, double *x, double *y, int max)
{
    char key[256];
    snprintf(key, sizeof key, "<path class=\"curve\" data-name=\"%s\"", name);
    const char *p = strstr(svg, key);
    if (!p) fail_msg("no curve '%s' in the SVG", name);
    p = strstr(p, " d=\"");
    assert_non_null(p);
    p += 4;
    int n = 0;
    while (*p == 'M' || *p == 'L') {
        if (n == max || sscanf(p + 1, "%lf,%lf", &x[n], &y[n]) != 2) fail_msg("bad path data for '%s'", name);
        n++;
        p = strchr(p, ' ');
        assert_non_null(p);
        p++;
    }
    return n;
}

#ifdef EMBER_HAVE_CAIRO
static const double C_BLUE[3] = {0.122, 0.467, 0.706}, C_ORANGE[3] = {1.000, 0.498, 0.055}; /* tab10's first two */

typedef struct png {
    cairo_surface_t *s;
    int w, h, stride;
    const unsigned char *d;
} png;

static png png_open(const char *path)
{
    png p = {.s = cairo_image_surface_create_from_png(path)};
    if (cairo_surface_status(p.s) != CAIRO_STATUS_SUCCESS)
        fail_msg("cairo cannot read %s: %s", path, cairo_status_to_string(cairo_surface_status(p.s)));
    cairo_surface_flush(p.s);
    p.w = cairo_image_surface_get_width(p.s);
    p.h = cairo_image_surface_get_height(p.s);
    p.stride = cairo_image_surface_get_stride(p.s);
    p.d = cairo_image_surface_get_data(p.s);
    return p;
}

static void png_rgb(const png *p, int x, int y, double rgb[3])
{
    assert_true(x >= 0 && x < p->w && y >= 0 && y < p->h);
    uint32_t v = *(const uint32_t *)(p->d + (size_t)y * (size_t)p->stride + (size_t)x * 4);
    rgb[0] = ((v >> 16) & 255) / 255.0;
    rgb[1] = ((v >> 8) & 255) / 255.0;
    rgb[2] = (v & 255) / 255.0;
}

/* The pixel at (x, y) is (close to) colour c: on the curve, not background or grid. */
static void expect_color(const png *p, double x, double y, const double c[3], const char *what, int i)
{
    double px[3];
    png_rgb(p, (int)floor(x), (int)floor(y), px);
    double d = fabs(px[0] - c[0]) + fabs(px[1] - c[1]) + fabs(px[2] - c[2]);
    if (d > 0.45) fail_msg("%s point %d: pixel (%.1f, %.1f) is (%.2f %.2f %.2f), not the curve's colour (%.2f %.2f %.2f)", what, i, x, y,
                           px[0], px[1], px[2], c[0], c[1], c[2]);
}
#endif


/* The curve's pixel positions follow the data: x evenly spaced by epoch,
 * y linear in the value (larger value higher up), inside the plot area. */
static void check_mapping(const double *x, const double *y, int n, const double *vals, const char *what)
{
    int W, H, L, T, R, B;
    em_tool_plot_geometry(&W, &H, &L, &T, &R, &B);
    for (int i = 0; i < n; i++) {
        if (!(x[i] > L && x[i] < R && y[i] > T && y[i] < B)) fail_msg("%s point %d (%.1f, %.1f) outside the plot area", what, i, x[i], y[i]);
        if (i > 0 && fabs((x[i] - x[i - 1]) - (x[1] - x[0])) > 0.02) fail_msg("%s: epochs not evenly spaced", what);
        double want = (vals[i] - vals[0]) / (vals[n - 1] - vals[0]), got = (y[i] - y[0]) / (y[n - 1] - y[0]);
        if (fabs(want - got) > 2e-3) fail_msg("%s point %d at %.4f of the range, the value at %.4f", what, i, got, want);
    }
    if ((vals[n - 1] - vals[0]) * (y[n - 1] - y[0]) >= 0) fail_msg("%s: a larger value is not higher up", what);
}

static void one_run(void **state)
{
    const char *dir = subdir("one");
    write_run(join(dir, "metrics.csv"), 5, 0);
    const char *csv[1] = {join(dir, "metrics.csv")};
    char prefix[1100], err[512];
    snprintf(prefix, sizeof prefix, "%s/", dir);
    int rc = em_tool_plot_metrics(csv, NULL, 1, prefix, NULL, err, sizeof err);
    if (!em_tool_plot_available()) {
        assert_int_equal(rc, EM_TOOL_PLOT_UNAVAILABLE);
        assert_non_null(strstr(err, "plotting is unavailable"));
        assert_int_equal(dir_entries(dir), 1); /* metrics.csv only */
        skip();
    }
    if (rc != 0) fail_msg("em_tool_plot_metrics: %s", err);
    assert_int_equal(dir_entries(dir), 5); /* metrics.csv + 2 PNG + 2 SVG, no .tmp left */
    em_tool_metrics m;
    assert_int_equal(em_tool_read_metrics(csv[0], &m, err, sizeof err), 0);
    assert_int_equal(m.n, 5);
    for (int fig = 0; fig < 2; fig++) {
        const char *stem = fig ? "accuracy" : "loss";
        char name[64];
        snprintf(name, sizeof name, "%s.svg", stem);
        char *svg = read_all(join(dir, name));
        const char *bad = xml_check(svg);
        if (bad) fail_msg("%s: not well-formed: %s", name, bad);
        assert_int_equal(count(svg, "<path "), 2); /* train and validation: one path per curve, nothing else is a path */
        assert_int_equal(count(svg, "<path class=\"curve\""), 2);
        assert_non_null(strstr(svg, fig ? ">accuracy</text>" : ">loss</text>"));  /* y axis label */
        assert_non_null(strstr(svg, ">epoch</text>"));                            /* x axis label */
        assert_non_null(strstr(svg, ">validation</text>"));                       /* legend */
        char title[1200];
        snprintf(title, sizeof title, "%s: %s</text>", dir, stem); /* the title names the run */
        assert_non_null(strstr(svg, title));
        double tx[16], ty[16], vx[16], vy[16];
        assert_int_equal(svg_curve_points(svg, "train", tx, ty, 16), 5);
        assert_int_equal(svg_curve_points(svg, "validation", vx, vy, 16), 5);
        check_mapping(tx, ty, 5, fig ? m.train_accuracy : m.train_loss, "train");
        check_mapping(vx, vy, 5, fig ? m.val_accuracy : m.val_loss, "validation");
        for (int i = 0; i < 5; i++) assert_true(fabs(tx[i] - vx[i]) < 0.01); /* same epochs, same x */
#ifdef EMBER_HAVE_CAIRO
        snprintf(name, sizeof name, "%s.png", stem);
        png p = png_open(join(dir, name));
        assert_int_equal(p.w, 800);
        assert_int_equal(p.h, 500);
        double bg[3];
        png_rgb(&p, 3, 3, bg);
        assert_true(bg[0] > 0.99 && bg[1] > 0.99 && bg[2] > 0.99); /* white background */
        for (int i = 0; i < 5; i++) { /* every point, and the middle of every segment, is drawn in the curve's colour */
            if (fabs(ty[i] - vy[i]) > 6) { /* not where the curves meet */
                expect_color(&p, tx[i], ty[i], C_BLUE, "train", i);
                expect_color(&p, vx[i], vy[i], C_ORANGE, "validation", i);
            }
            if (i > 0 && fabs(ty[i] - vy[i]) > 6 && fabs(ty[i - 1] - vy[i - 1]) > 6) {
                expect_color(&p, (tx[i] + tx[i - 1]) / 2, (ty[i] + ty[i - 1]) / 2, C_BLUE, "train segment", i);
                expect_color(&p, (vx[i] + vx[i - 1]) / 2, (vy[i] + vy[i - 1]) / 2, C_ORANGE, "validation segment", i);
            }
        }
        /* the axes: the frame's left edge is dark halfway up */
        int W, H, L, T, R, B;
        em_tool_plot_geometry(&W, &H, &L, &T, &R, &B);
        double ax[3];
        png_rgb(&p, L, (T + B) / 2, ax);
        assert_true(ax[0] + ax[1] + ax[2] < 1.5);
        cairo_surface_destroy(p.s);
#endif
        free(svg);
    }
    em_tool_metrics_free(&m);
}

static void no_validation(void **state)
{
    if (!em_tool_plot_available()) skip();
    const char *dir = subdir("noval");
    char text[1024];
    snprintf(text, sizeof text, "%s1,2.0,0.5,nan,nan,nan,0.001,10.0,1.0\n2,1.0,0.7,nan,nan,nan,0.001,10.0,1.0\n", HEADER);
    write_file(join(dir, "metrics.csv"), text);
    const char *csv[1] = {join(dir, "metrics.csv")};
    char prefix[1100], err[512];
    snprintf(prefix, sizeof prefix, "%s/", dir);
    assert_int_equal(em_tool_plot_metrics(csv, NULL, 1, prefix, "no val", err, sizeof err), 0);
    char *svg = read_all(join(dir, "loss.svg"));
    assert_null(xml_check(svg));
    assert_int_equal(count(svg, "<path class=\"curve\""), 1); /* train only */
    assert_non_null(strstr(svg, ">no val: loss</text>"));
    free(svg);
}

/* An iteration-mode metrics.csv (ember train --model gpt): one loss figure
 * against the iteration (iter 0 has no train loss), no accuracy figure;
 * overlaying it with an epoch run, iterations that do not increase and a
 * negative iteration are refused. */
static void iteration_run(void **state)
{
    const char *dir = subdir("iters");
    write_file(join(dir, "metrics.csv"), "iter,train_loss,val_loss,lr,tokens_per_s,elapsed_s\n"
                                         "0,nan,5.5154,6e-05,nan,2.7\n100,3.4052,2.6481,0.00292,2697.0,43.6\n"
                                         "200,2.5751,2.5845,0.00233,2252.0,92.3\n");
    char p0[1024], p1[1024]; /* join()'s buffers rotate: keep copies */
    snprintf(p0, sizeof p0, "%s", join(dir, "metrics.csv"));
    const char *csv[2] = {p0, NULL};
    em_tool_metrics m;
    char err[512], prefix[1100];
    assert_int_equal(em_tool_read_metrics(csv[0], &m, err, sizeof err), 0);
    assert_true(m.iterations);
    assert_int_equal(m.n, 3);
    assert_true(m.epoch[0] == 0 && m.epoch[2] == 200);
    assert_true(isnan(m.train_loss[0]) && m.val_loss[1] == 2.6481 && isnan(m.val_accuracy[2]) && isnan(m.train_accuracy[0]));
    em_tool_metrics_free(&m);
    static const char *const bad[][2] = {
        {"iter,train_loss,val_loss\n100,1,2\n100,1,2\n", "iteration 100 after iteration 100"},
        {"iter,train_loss,val_loss\n-1,1,2\n", "whole number >= 0"},
        {"iter,train_loss\n0,1\n", "'val_loss'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(join(dir, "bad.csv"), bad[i][0]);
        assert_int_equal(em_tool_read_metrics(join(dir, "bad.csv"), &m, err, sizeof err), -1);
        if (!strstr(err, bad[i][1])) fail_msg("'%s' does not name '%s'", err, bad[i][1]);
    }
    if (!em_tool_plot_available()) return;
    snprintf(prefix, sizeof prefix, "%s/", dir);
    if (em_tool_plot_metrics(csv, NULL, 1, prefix, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    char *svg = read_all(join(dir, "loss.svg"));
    assert_null(xml_check(svg));
    assert_int_equal(count(svg, "<path class=\"curve\""), 2);
    assert_non_null(strstr(svg, ">iteration</text>"));
    free(svg);
    assert_int_equal(access(join(dir, "accuracy.svg"), F_OK), -1);
    const char *e = subdir("iters-epochs");
    snprintf(p1, sizeof p1, "%s", join(e, "metrics.csv"));
    write_run(p1, 3, 0);
    csv[1] = p1;
    assert_int_equal(em_tool_plot_metrics(csv, NULL, 2, prefix, NULL, err, sizeof err), EM_TOOL_PLOT_BAD_METRICS);
    assert_non_null(strstr(err, "cannot share a plot"));
}

static void several_runs(void **state)
{
    if (!em_tool_plot_available()) skip();
    const char *a = subdir("run-a"), *b = subdir("run-b"), *out = subdir("cmp");
    write_run(join(a, "metrics.csv"), 4, 0);
    write_run(join(b, "metrics.csv"), 6, 0.2);
    const char *csv[2] = {join(a, "metrics.csv"), join(b, "metrics.csv")};
    const char *labels[2] = {"run-a", "run-b"};
    char prefix[1100], err[512];
    snprintf(prefix, sizeof prefix, "%s/x-", out);
    if (em_tool_plot_metrics(csv, labels, 2, prefix, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(dir_entries(out), 4);
    char *svg = read_all(join(out, "x-loss.svg"));
    assert_null(xml_check(svg));
    assert_int_equal(count(svg, "<path class=\"curve\""), 4);
    assert_non_null(strstr(svg, ">run-a vs run-b: loss</text>"));
    double x[16], y[16];
    assert_int_equal(svg_curve_points(svg, "run-a train", x, y, 16), 4);
    assert_int_equal(svg_curve_points(svg, "run-b validation", x, y, 16), 6);
    /* one colour per run: run-a's two curves blue, run-b's orange; train dashed */
    const char *pa = strstr(svg, "data-name=\"run-a validation\""), *pb = strstr(svg, "data-name=\"run-b train\"");
    assert_non_null(pa);
    assert_non_null(pb);
    assert_true(strstr(pa, "stroke=\"#1f77b4\"") < strchr(pa, '\n'));
    assert_true(strstr(pb, "stroke=\"#ff7f0e\"") < strchr(pb, '\n'));
    assert_true(strstr(pb, "stroke-dasharray") && strstr(pb, "stroke-dasharray") < strchr(pb, '\n'));
    free(svg);
#ifdef EMBER_HAVE_CAIRO
    png p = png_open(join(out, "x-accuracy.png"));
    assert_int_equal(p.w, 800);
    cairo_surface_destroy(p.s);
#endif
}

static void bad_metrics(void **state)
{
    static const struct {
        const char *name, *body, *why;
    } cases[] = {
        {"empty", "", "is empty"},
        {"no_column", "epoch,train_loss,val_loss\n1,1.0,1.0\n", "no 'train_accuracy' column"},
        {"not_number", "@1,abc,0.5,1.0,0.5,0.9,0.001,10.0,1.0\n", "line 2: train_loss 'abc' is not a number"},
        {"fields", "@1,1.0,0.5,1.0,0.5\n", "line 2: 5 fields, the header has 9"},
        {"epochs", "@1,1.0,0.5,1.0,0.5,0.9,0.001,10.0,1.0\n2,1.0,0.5,1.0,0.5,0.9,0.001,10.0,1.0\n1,1.0,0.5,1.0,0.5,0.9,0.001,10.0,1.0\n",
         "line 4: epoch 1 after epoch 2"},
        {"epoch_frac", "@1.5,1.0,0.5,1.0,0.5,0.9,0.001,10.0,1.0\n", "epoch '1.5' is not a whole number"},
        {"no_rows", "@", "has no epoch rows"},
        {"binary", "\x89PNG\r\n\x1a\n\x01\x02", "no 'epoch' column"},
    };
    char out[1024];
    snprintf(out, sizeof out, "%s", subdir("bad-out"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024], path[1100], prefix[1100], err[512];
        if (cases[i].body[0] == '@') snprintf(body, sizeof body, "%s%s", HEADER, cases[i].body + 1);
        else snprintf(body, sizeof body, "%s", cases[i].body);
        snprintf(path, sizeof path, "%s/%s.csv", em_test_tmp_dir(), cases[i].name);
        write_file(path, body);
        em_tool_metrics m;
        assert_int_equal(em_tool_read_metrics(path, &m, err, sizeof err), -1);
        assert_int_equal(m.n, 0);
        /* a good run next to a bad one: still nothing is written */
        const char *good = subdir("good");
        write_run(join(good, "metrics.csv"), 3, 0);
        const char *csv[2] = {join(good, "metrics.csv"), path};
        snprintf(prefix, sizeof prefix, "%s/", out);
        assert_int_equal(em_tool_plot_metrics(csv, NULL, 2, prefix, NULL, err, sizeof err), EM_TOOL_PLOT_BAD_METRICS);
        if (!strstr(err, cases[i].why) || !strstr(err, path)) fail_msg("%s: error '%s' does not say '%s' and name the file", cases[i].name, err, cases[i].why);
        assert_int_equal(dir_entries(out), 0);
    }
    char err[512];
    em_tool_metrics m;
    assert_int_equal(em_tool_read_metrics(join(em_test_tmp_dir(), "missing.csv"), &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot open"));
    assert_non_null(strstr(err, "No such file"));
    /* an unwritable destination is a write error, not a crash */
    if (em_tool_plot_available()) {
        const char *good = subdir("good");
        const char *csv[1] = {join(good, "metrics.csv")};
        assert_int_equal(em_tool_plot_metrics(csv, NULL, 1, "/nonexistent-dir/x-", NULL, err, sizeof err), EM_TOOL_PLOT_WRITE);
        assert_non_null(strstr(err, "/nonexistent-dir/x-loss.png"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_run),
        cmocka_unit_test(no_validation),
        cmocka_unit_test(iteration_run),
        cmocka_unit_test(several_runs),
        cmocka_unit_test(bad_metrics),
    };
    return cmocka_run_group_tests(tests, em_test_setup_tmpdir, em_test_teardown_tmpdir);
}
